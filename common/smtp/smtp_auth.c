/*
 * smtp_auth.c: the client side of SMTP AUTH (RFC 4954), after STARTTLS.
 *
 * A password goes as PLAIN (RFC 4616) or, where the server offers only
 * that, LOGIN.  An OAuth 2.0 access token goes as OAUTHBEARER (RFC 7628)
 * or XOAUTH2, the mechanism Google's and Microsoft's submission servers
 * took before it; both carry "auth=Bearer <token>" (RFC 6750).  The token
 * is whatever the options hold: reading it from its file (and refreshing
 * it: pepsi-helper-token-refresh) is the caller's business.
 *
 * A server that refuses a token does not answer 535 at once: it sends a
 * 334 challenge holding a JSON error (RFC 7628 3.2.2, XOAUTH2 alike), to
 * which the client must answer (OAUTHBEARER: the single byte 0x01;
 * XOAUTH2: an empty line) before it gets the final reply.  That JSON
 * ("status": "invalid_token", ...) is added to the final reply's text, so
 * that the deferral names it.
 *
 * Credentials are never sent in the clear unless the options say TLS =
 * none, and every buffer that held one is cleansed.
 */
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "base/base64.h"
#include "base/buf.h"
#include "smtp/smtp_client_internal.h"

void
smtp_auth_offered(struct smtp_client *c, const char *name, size_t m)
{
	if (m == 5 && strncasecmp(name, "PLAIN", 5) == 0)
		c->auth_plain = true;
	else if (m == 5 && strncasecmp(name, "LOGIN", 5) == 0)
		c->auth_login = true;
	else if (m == 7 && strncasecmp(name, "XOAUTH2", 7) == 0)
		c->auth_xoauth2 = true;
	else if (m == 11 && strncasecmp(name, "OAUTHBEARER", 11) == 0)
		c->auth_oauthbearer = true;
}

/* AUTH PLAIN with the initial response (RFC 4954 4: saves a round trip). */
static bool
smtp_auth_plain(struct smtp_client *c, struct smtp_result *res, const char *user, const char *pass,
				struct buf *scratch, struct buf *token)
{
	buf_append_char(scratch, '\0');
	buf_append_str(scratch, user);
	buf_append_char(scratch, '\0');
	buf_append_str(scratch, pass);
	base64_append(token, scratch->data, scratch->len);
	return smtp_io_command(c, &res->reply, "AUTH PLAIN %s", token->data);
}

static bool
smtp_auth_login(struct smtp_client *c, struct smtp_result *res, const char *user, const char *pass,
				struct buf *token)
{
	bool ok = smtp_io_command(c, &res->reply, "AUTH LOGIN");

	if (ok && res->reply.code == 334)
	{
		base64_append(token, user, strlen(user));
		ok = smtp_io_command(c, &res->reply, "%s", token->data);
		if (ok && res->reply.code == 334)
		{
			OPENSSL_cleanse(token->data, token->len);
			buf_reset(token);
			base64_append(token, pass, strlen(pass));
			ok = smtp_io_command(c, &res->reply, "%s", token->data);
		}
	}
	return ok;
}

/*
 * XOAUTH2 or OAUTHBEARER with the initial response.  OAUTHBEARER's GS2
 * header names the user ("n,a=user,") and its key/value list the host and
 * port we connected to (RFC 7628 3.1); XOAUTH2's is "user=...".  A 334
 * answer is the server's error: acknowledged, and its final reply (535,
 * or 454 for a temporary failure) is the outcome.
 */
static bool
smtp_auth_bearer(struct smtp_client *c, struct smtp_result *res, const char *user,
				 const char *access_token, struct buf *scratch, struct buf *token)
{
	bool		oauthbearer = c->opt.auth_mechanism == SMTP_AUTH_OAUTHBEARER;
	const char *mechanism = oauthbearer ? "OAUTHBEARER" : "XOAUTH2";
	bool		ok;

	if (oauthbearer)
		buf_printf(scratch, "n,a=%s,\001host=%s\001port=%s\001auth=Bearer %s\001\001", user,
				   c->opt.host ? c->opt.host : "", c->opt.port ? c->opt.port : "25", access_token);
	else
		buf_printf(scratch, "user=%s\001auth=Bearer %s\001\001", user, access_token);
	base64_append(token, scratch->data, scratch->len);
	ok = smtp_io_command(c, &res->reply, "AUTH %s %s", mechanism, token->data);
	if (ok && res->reply.code == 334)
	{
		struct buf why = BUF_INIT;
		char	   challenge[512];

		/* The challenge is base64 JSON ("status": "invalid_token"...): keep it for the diagnostic. */
		if (res->reply.text.data)
			buf_append_str(&why, res->reply.text.data);
		ok = oauthbearer ? smtp_io_command(c, &res->reply, "AQ==") : smtp_io_command(c, &res->reply, "%s", "");
		if (ok && why.len > 0 && res->reply.code / 100 != 2)
		{
			long n = base64_decode(why.data, why.len, (unsigned char *) challenge, sizeof(challenge) - 1,
								   BASE64_STRICT);

			/* Only printable JSON goes into the diagnostic: the server is not trusted to send text. */
			if (n > 0)
			{
				challenge[n] = '\0';
				for (long i = 0; i < n; i++)
					if ((unsigned char) challenge[i] < 0x20 || (unsigned char) challenge[i] > 0x7e)
						challenge[i] = '?';
				/* The final reply says only 535: the diagnostic gets the reason the challenge gave. */
				buf_printf(&res->reply.text, " (%s token refused: %s)", mechanism, challenge);
			}
		}
		buf_free(&why);
	}
	return ok;
}

bool
smtp_auth(struct smtp_client *c, struct smtp_result *res)
{
	const char *user = c->opt.auth_user;
	const char *secret = c->opt.auth_password ? c->opt.auth_password : "";
	struct buf	token = BUF_INIT;
	struct buf	scratch = BUF_INIT;
	bool		ok = false;

	res->phase = SMTP_PHASE_AUTH;
	if (c->ssl == NULL && c->opt.tls != SMTP_TLS_NONE)
	{
		smtp_io_set_error(c, "%s offered no STARTTLS; credentials are not sent in the clear "
							 "(TLS = none allows it)",
						  c->peer);
		return false;
	}
	switch (c->opt.auth_mechanism)
	{
		case SMTP_AUTH_PASSWORD:
			if (c->auth_plain)
				ok = smtp_auth_plain(c, res, user, secret, &scratch, &token);
			else if (c->auth_login)
				ok = smtp_auth_login(c, res, user, secret, &token);
			else
				smtp_io_set_error(c, "%s offers neither AUTH PLAIN nor AUTH LOGIN", c->peer);
			break;
		case SMTP_AUTH_XOAUTH2:
		case SMTP_AUTH_OAUTHBEARER:
			if (c->opt.auth_mechanism == SMTP_AUTH_XOAUTH2 ? c->auth_xoauth2 : c->auth_oauthbearer)
				ok = smtp_auth_bearer(c, res, user, secret, &scratch, &token);
			else
				smtp_io_set_error(c, "%s does not offer AUTH %s (AUTH_MECHANISM)", c->peer,
								  c->opt.auth_mechanism == SMTP_AUTH_XOAUTH2 ? "XOAUTH2" : "OAUTHBEARER");
			break;
	}
	if (scratch.data)
		OPENSSL_cleanse(scratch.data, scratch.len);
	if (token.data)
		OPENSSL_cleanse(token.data, token.len);
	buf_free(&scratch);
	buf_free(&token);
	return ok && res->reply.code == 235;
}
