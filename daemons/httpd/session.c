/*
 * session.c: who a request comes from, and whether it may change anything.
 *
 * Two kinds of credential: an API token (Authorization: Bearer, for
 * automation) and a browser session (a cookie set at login, HttpOnly,
 * SameSite=Strict, Secure under TLS).  The database holds only SHA-256
 * digests of both (pepsi.api_token, pepsi.admin_session) and Argon2id
 * hashes of the passwords (pepsi.admin_account), so a backup holds no
 * usable credential.
 *
 * A browser sends its cookie with any request, including one a hostile
 * page makes it send, so a session may change something only with the
 * session's CSRF token in X-CSRF-Token (derived from the cookie's secret,
 * which another origin cannot read) and, when the browser says where the
 * request comes from (Origin, Sec-Fetch-Site), only from this origin.  A
 * bearer token is never sent by a browser on its own and needs neither.
 *
 * Password guessing is slowed per client (an IPv4 address, an IPv6 /64)
 * and per account name.  A login the database cannot check answers 503
 * and counts as nothing: an outage must not lock administrators out.
 */
#include <string.h>
#include <time.h>

#include <argon2.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "auth/password.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "httpd.h"
#include "runtime/db.h"

#define SESSION_COOKIE "pepsi_session"
#define SESSION_SECRET_BYTES 32
/* Passwords longer than this are refused before hashing (a cheap DoS otherwise). */
#define PASSWORD_MAX_LENGTH 256
/*
 * Failed logins before a client (an IPv4 address or an IPv6 /64) or an
 * account name (from anywhere: many clients guessing one password) must
 * wait LOGIN_WINDOW seconds from its first failure.
 */
#define LOGIN_MAX_CLIENT_FAILURES 5
#define LOGIN_MAX_ACCOUNT_FAILURES 10
#define LOGIN_WINDOW 600
#define LOGIN_TRACKED 128

static void
hex_encode(const unsigned char *in, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < len; i++)
	{
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * len] = '\0';
}

/* The bytea literal of SHA-256(secret), "\x..." for a text parameter. */
static void
digest_literal(const char *secret, size_t len, char out[2 + 2 * SHA256_DIGEST_LENGTH + 1])
{
	unsigned char digest[SHA256_DIGEST_LENGTH];

	SHA256((const unsigned char *) secret, len, digest);
	out[0] = '\\';
	out[1] = 'x';
	hex_encode(digest, sizeof(digest), out + 2);
}

/* The CSRF token of a session: HMAC-SHA256(secret, "pepsi-csrf"), in hex. */
static void
session_csrf(const char *secret, char out[65])
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int  maclen = 0;

	HMAC(EVP_sha256(), secret, (int) strlen(secret), (const unsigned char *) "pepsi-csrf", 10, mac,
		 &maclen);
	hex_encode(mac, 32, out);
}

static const char *
header(struct request *req, const char *name)
{
	return MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, name);
}

enum lookup_result
{
	LOOKUP_FOUND,
	LOOKUP_NONE,
	LOOKUP_FAILED /* the database did not answer: nothing is known */
};

/*
 * A one-row query's first value, copied into out when found; with viewer,
 * whether its second value (a role) is "viewer".
 */
static enum lookup_result
lookup_one(const char *sql, int nparams, const char *const *values, char *out, size_t outlen,
		   bool *viewer)
{
	PGconn			  *conn = httpd_db();
	PGresult		  *res;
	enum lookup_result result = LOOKUP_NONE;

	if (conn == NULL)
		return LOOKUP_FAILED;
	res = db_exec(conn, sql, nparams, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("authentication: %s", db_error(res, conn));
		result = LOOKUP_FAILED;
	}
	else if (PQntuples(res) == 1)
	{
		snprintf(out, outlen, "%s", PQgetvalue(res, 0, 0));
		if (viewer)
			*viewer = strcmp(PQgetvalue(res, 0, 1), "admin") != 0;
		result = LOOKUP_FOUND;
	}
	PQclear(res);
	return result;
}

void
principal_identify(struct request *req, struct principal *who)
{
	const char *authorization = header(req, MHD_HTTP_HEADER_AUTHORIZATION);
	const char *cookie = MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, SESSION_COOKIE);
	char		digest[2 + 2 * SHA256_DIGEST_LENGTH + 1];
	char		name[sizeof(who->name) - 6];
	const char *values[1] = {digest};

	memset(who, 0, sizeof(*who));
	if (authorization && strncasecmp(authorization, "Bearer ", 7) == 0)
	{
		const char *token = authorization + 7;

		digest_literal(token, strlen(token), digest);
		enum lookup_result found = lookup_one(
			"SELECT name, role FROM pepsi.api_token WHERE digest = $1::bytea AND revoked_at IS NULL",
			1, values, name, sizeof(name), &who->viewer);

		who->unknown = found == LOOKUP_FAILED;
		if (found == LOOKUP_FOUND)
		{
			who->kind = PRINCIPAL_TOKEN;
			snprintf(who->name, sizeof(who->name), "token:%s", name);
		}
		/* A wrong token is no credential, even with a valid cookie beside it. */
		return;
	}
	if (cookie && strlen(cookie) < 128)
	{
		enum lookup_result found;

		digest_literal(cookie, strlen(cookie), digest);
		found = lookup_one("SELECT s.account, a.role FROM pepsi.admin_session s"
						   " JOIN pepsi.admin_account a ON a.name = s.account"
						   " WHERE s.digest = $1::bytea AND s.expires_at > now() AND NOT a.disabled",
						   1, values, who->name, sizeof(who->name), &who->viewer);
		who->unknown = found == LOOKUP_FAILED;
		if (found == LOOKUP_FOUND)
		{
			who->kind = PRINCIPAL_SESSION;
			session_csrf(cookie, who->csrf);
		}
	}
}

/*
 * Whether the browser says the request comes from another origin: a
 * Sec-Fetch-Site other than same-origin, or an Origin other than ours
 * (scheme and Host).  A client that sends neither (curl, an old browser)
 * is judged by the CSRF token alone.
 */
static bool
request_cross_site(struct request *req)
{
	const char *site = header(req, "Sec-Fetch-Site");
	const char *origin = header(req, "Origin");
	const char *host = header(req, MHD_HTTP_HEADER_HOST);
	char		ours[300];

	if (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
		return true;
	if (origin == NULL)
		return false;
	if (host == NULL)
		return true;
	snprintf(ours, sizeof(ours), "%s://%s", httpd.tls ? "https" : "http", host);
	return strcmp(origin, ours) != 0;
}

bool
principal_may_change(struct request *req, const struct principal *who, const char **why)
{
	const char *token;

	if (who->kind == PRINCIPAL_TOKEN)
		return true;
	if (request_cross_site(req))
	{
		*why = "cross-site request refused";
		return false;
	}
	token = header(req, "X-CSRF-Token");
	if (token == NULL || strlen(token) != 64 || CRYPTO_memcmp(token, who->csrf, 64) != 0)
	{
		*why = "missing or wrong X-CSRF-Token";
		return false;
	}
	return true;
}

/*
 * Failed logins are counted in two small tables, by client and by account
 * name; the entry whose first failure is oldest makes room.  In memory
 * only: a restart forgives.  (pepsi-ingress counts failed AUTH the same
 * way in its auth_throttle.c, with delays an SMTP session can wait out; a
 * browser's login gets its answer at once.)
 */
struct login_failures
{
	char   key[80]; /* a client_key or an account name (at most 64 bytes) */
	int	   count;
	time_t first;
};
static struct login_failures login_by_client[LOGIN_TRACKED];
static struct login_failures login_by_account[LOGIN_TRACKED];

/* The entry of key in table (a new one when create), or NULL. */
static struct login_failures *
login_failures_of(struct login_failures *table, const char *key, bool create)
{
	struct login_failures *oldest = &table[0];
	time_t				   now = time(NULL);

	for (size_t i = 0; i < LOGIN_TRACKED; i++)
	{
		struct login_failures *f = &table[i];

		if (f->key[0] && now - f->first > LOGIN_WINDOW)
			f->key[0] = '\0';
		if (f->key[0] && strcmp(f->key, key) == 0)
			return f;
		if (f->key[0] == '\0' || f->first < oldest->first)
			oldest = f;
	}
	if (!create)
		return NULL;
	snprintf(oldest->key, sizeof(oldest->key), "%s", key);
	oldest->count = 0;
	oldest->first = now;
	return oldest;
}

static bool
login_blocked(struct login_failures *table, const char *key, int limit)
{
	struct login_failures *f = login_failures_of(table, key, false);

	return f && f->count >= limit;
}

static void
login_failed(const char *client, const char *account)
{
	login_failures_of(login_by_client, client, true)->count++;
	login_failures_of(login_by_account, account, true)->count++;
}

/* A login that succeeded forgives both its client's failures and its account's. */
static void
login_forgive(const char *client, const char *account)
{
	struct login_failures *f;

	if ((f = login_failures_of(login_by_client, client, false)) != NULL)
		f->key[0] = '\0';
	if ((f = login_failures_of(login_by_account, account, false)) != NULL)
		f->key[0] = '\0';
}

static enum MHD_Result
session_set_cookie(struct request *req, unsigned status, json_t *body, const char *value, long max_age)
{
	char				*text = json_dumps(body, JSON_COMPACT | JSON_ENSURE_ASCII);
	char				 cookie[256];
	struct MHD_Response *response;
	enum MHD_Result		 result;

	json_decref(body);
	if (text == NULL)
		return MHD_NO;
	response = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	snprintf(cookie, sizeof(cookie), "%s=%s; Path=/; Max-Age=%ld; HttpOnly; SameSite=Strict%s",
			 SESSION_COOKIE, value, max_age, httpd.tls ? "; Secure" : "");
	MHD_add_response_header(response, MHD_HTTP_HEADER_SET_COOKIE, cookie);
	MHD_add_response_header(response, "Content-Type", "application/json");
	reply_add_security_headers(response);
	result = MHD_queue_response(req->connection, status, response);
	MHD_destroy_response(response);
	return result;
}

enum MHD_Result
session_login(struct request *req)
{
	const char		  *content_type = header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
	static char		  *dummy_hash;
	json_error_t	   error;
	json_t			  *body;
	const char		  *name = NULL, *password = NULL;
	char			   stored[256] = "";
	unsigned char	   secret_bytes[SESSION_SECRET_BYTES];
	char			   secret[2 * SESSION_SECRET_BYTES + 1];
	char			   digest[2 + 2 * SHA256_DIGEST_LENGTH + 1];
	char			   lifetime[32];
	char			   csrf[65];
	enum lookup_result known;
	bool			   verified;
	PGresult		  *res;

	if (request_cross_site(req))
		return reply_error(req, MHD_HTTP_FORBIDDEN, "cross-site request refused");
	/* A form of another site cannot send this type without asking first. */
	if (content_type == NULL || strncasecmp(content_type, "application/json", 16) != 0)
		return reply_error(req, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, "send the credentials as application/json");
	if (login_blocked(login_by_client, req->client_key, LOGIN_MAX_CLIENT_FAILURES))
		return reply_error(req, MHD_HTTP_TOO_MANY_REQUESTS,
						   "too many failed logins from %s: wait ten minutes", req->client_key);
	if ((body = json_loadb(req->body.data, req->body.len, 0, &error)) == NULL)
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "bad JSON: %s", error.text);
	if (json_unpack(body, "{s:s, s:s}", "name", &name, "password", &password) != 0)
	{
		json_decref(body);
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "expected {\"name\": ..., \"password\": ...}");
	}
	if (strlen(password) > PASSWORD_MAX_LENGTH || strlen(name) > 64)
	{
		json_decref(body);
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "name or password too long");
	}
	/* Counted for any name, known or not: the answer tells nothing of which. */
	if (login_blocked(login_by_account, name, LOGIN_MAX_ACCOUNT_FAILURES))
	{
		json_decref(body);
		return reply_error(req, MHD_HTTP_TOO_MANY_REQUESTS,
						   "too many failed logins for this account: wait ten minutes");
	}
	known = lookup_one("SELECT password_hash FROM pepsi.admin_account WHERE name = $1 AND NOT disabled",
					   1, &name, stored, sizeof(stored), NULL);
	/* Not a wrong password, and not counted as one: nothing was checked. */
	if (known == LOOKUP_FAILED)
	{
		json_decref(body);
		return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database is not answering");
	}
	/* An unknown name costs what a wrong password costs: no user probing. */
	if (known == LOOKUP_NONE && dummy_hash == NULL)
		dummy_hash = password_hash("no such account");
	verified = argon2id_verify(known == LOOKUP_FOUND ? stored : dummy_hash, password,
							   strlen(password))
				   == ARGON2_OK
			   && known == LOOKUP_FOUND;
	if (!verified)
	{
		login_failed(req->client_key, name);
		log_info("failed login for \"%s\" from %s", name, req->client);
		json_decref(body);
		return reply_error(req, MHD_HTTP_UNAUTHORIZED, "wrong name or password");
	}

	if (RAND_bytes(secret_bytes, sizeof(secret_bytes)) != 1)
	{
		json_decref(body);
		return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "no randomness");
	}
	hex_encode(secret_bytes, sizeof(secret_bytes), secret);
	digest_literal(secret, strlen(secret), digest);
	snprintf(lifetime, sizeof(lifetime), "%ld", httpd.session_lifetime_s);
	{
		const char *values[3] = {digest, name, lifetime};

		/* Expired sessions go as new ones come: the table stays small. */
		PQclear(db_exec(httpd.conn, "DELETE FROM pepsi.admin_session WHERE expires_at < now()", 0, NULL));
		res = db_exec(httpd.conn, "INSERT INTO pepsi.admin_session (digest, account, expires_at)"
								  " VALUES ($1::bytea, $2, now() + make_interval(secs => $3::float8))",
					  3, values);
	}
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		log_warnx("login: %s", db_error(res, httpd.conn));
		PQclear(res);
		json_decref(body);
		return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the session could not be stored");
	}
	PQclear(res);
	login_forgive(req->client_key, name);
	log_info("%s logged in from %s", name, req->client);
	session_csrf(secret, csrf);
	{
		json_t		   *reply = json_pack("{sssssI}", "account", name, "csrf", csrf, "expires_in",
										  (json_int_t) httpd.session_lifetime_s);
		enum MHD_Result result = session_set_cookie(req, MHD_HTTP_OK, reply, secret,
													httpd.session_lifetime_s);

		explicit_bzero(secret, sizeof(secret));
		json_decref(body);
		return result;
	}
}

enum MHD_Result
session_logout(struct request *req, const struct principal *who)
{
	const char *cookie = MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, SESSION_COOKIE);
	char		digest[2 + 2 * SHA256_DIGEST_LENGTH + 1];
	const char *values[1] = {digest};

	if (who->kind != PRINCIPAL_SESSION || cookie == NULL)
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "not a browser session");
	digest_literal(cookie, strlen(cookie), digest);
	PQclear(db_exec(httpd.conn, "DELETE FROM pepsi.admin_session WHERE digest = $1::bytea", 1, values));
	log_info("%s logged out", who->name);
	return session_set_cookie(req, MHD_HTTP_OK, json_pack("{sb}", "logged_out", 1), "", 0);
}

enum MHD_Result
session_describe(struct request *req, const struct principal *who)
{
	json_t *reply = json_pack("{ssssss}", "account", who->name, "kind",
							  who->kind == PRINCIPAL_TOKEN ? "token" : "session", "role",
							  who->viewer ? "viewer" : "admin");

	if (who->kind == PRINCIPAL_SESSION)
		json_object_set_new(reply, "csrf", json_string(who->csrf));
	return reply_json(req, MHD_HTTP_OK, reply);
}
