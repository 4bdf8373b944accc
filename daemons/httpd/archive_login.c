/*
 * archive_login.c: the members' login to a list's archive and the owners'
 * pages (/archive/LIST/login, /members, /moderation).
 *
 * A member (or owner, or moderator) gives an address; if it is one, the
 * extension queues a mail to it with a single-use link
 * (pepsi.archive_login_request), and the page says the same either way,
 * so it tells no one who is subscribed.  The link's GET shows a button
 * (scanners fetch links); its POST starts a session: a random cookie,
 * HttpOnly, SameSite=Strict, Secure under TLS, scoped to the list's pages,
 * kept in the database as its SHA-256.  Owners see the members and the
 * moderation queue; a decision is a POST carrying the session's CSRF
 * token, which the extension checks with the session (archive_owner_decide).
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "archive.h"
#include "base/buf.h"
#include "base/log.h"
#include "runtime/db.h"

#define ARCHIVE_COOKIE "pepsi_archive"
/* How long a mailed login link stays good. */
#define ARCHIVE_LINK_LIFETIME "1 hour"

/* The value of name in an urlencoded form body, decoded into out; false when absent or too long. */
static bool
archive_form_value(const struct buf *body, const char *name, char *out, size_t outlen)
{
	size_t		namelen = strlen(name);
	const char *p = body->data;
	const char *end = body->data ? body->data + body->len : NULL;

	while (p && p < end)
	{
		const char *amp = memchr(p, '&', (size_t) (end - p));
		const char *stop = amp ? amp : end;

		if ((size_t) (stop - p) > namelen && strncmp(p, name, namelen) == 0 && p[namelen] == '=')
		{
			size_t n = 0;

			for (p += namelen + 1; p < stop; p++)
			{
				int c = *p;

				if (c == '+')
					c = ' ';
				else if (c == '%' && stop - p > 2 && isxdigit((unsigned char) p[1]) && isxdigit((unsigned char) p[2]))
				{
					char hex[3] = {p[1], p[2], '\0'};

					c = (int) strtol(hex, NULL, 16);
					p += 2;
				}
				if (n + 1 >= outlen || c == '\0')
					return false;
				out[n++] = (char) c;
			}
			out[n] = '\0';
			return true;
		}
		p = stop + 1;
	}
	return false;
}

void
archive_reader_identify(struct request *req, struct archive_request *ar)
{
	const char	   *cookie = MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, ARCHIVE_COOKIE);
	const char	   *values[2] = {ar->list_id, cookie};
	enum MHD_Result ignored;
	PGresult	   *res;

	ar->reader[0] = '\0';
	if (cookie == NULL || strlen(cookie) != 64)
		return;
	res = archive_query(req,
						"SELECT s->>'address', s->>'csrf', s->>'owner'"
						" FROM pepsi.archive_session_check($1::bigint, $2) AS s WHERE s IS NOT NULL",
						2, values, &ignored);
	if (res && PQntuples(res) == 1)
	{
		snprintf(ar->reader, sizeof(ar->reader), "%s", PQgetvalue(res, 0, 0));
		snprintf(ar->csrf, sizeof(ar->csrf), "%s", PQgetvalue(res, 0, 1));
		ar->owner = strcmp(PQgetvalue(res, 0, 2), "true") == 0;
	}
	PQclear(res);
}

/* A 303 to this list's archive, starting the session whose cookie is session. */
static enum MHD_Result
archive_session_start(struct request *req, const struct archive_request *ar, const char *session)
{
	struct MHD_Response *response = MHD_create_response_from_buffer(0, (void *) (uintptr_t) "", MHD_RESPMEM_PERSISTENT);
	struct buf			 cookie = BUF_INIT;
	struct buf			 location = BUF_INIT;
	enum MHD_Result		 result;

	if (response == NULL)
		return MHD_NO;
	buf_printf(&cookie, ARCHIVE_COOKIE "=%s; Path=/archive/%s/; Max-Age=%ld; HttpOnly; SameSite=Strict%s", session,
			   ar->address, httpd.session_lifetime_s, httpd.tls ? "; Secure" : "");
	buf_printf(&location, "/archive/%s/", ar->address);
	reply_add_security_headers(response);
	MHD_add_response_header(response, "Set-Cookie", cookie.data);
	MHD_add_response_header(response, "Location", location.data);
	result = MHD_queue_response(req->connection, MHD_HTTP_SEE_OTHER, response);
	MHD_destroy_response(response);
	buf_free(&cookie);
	buf_free(&location);
	return result;
}

/* POST with the mailed link's token: a session, or 403. */
static enum MHD_Result
archive_login_redeem(struct request *req, const struct archive_request *ar, const char *token)
{
	char			lifetime[32];
	const char	   *values[3] = {ar->list_id, token, lifetime};
	enum MHD_Result result;
	PGresult	   *res;
	struct buf		out = BUF_INIT;

	snprintf(lifetime, sizeof(lifetime), "%ld seconds", httpd.session_lifetime_s);
	res = archive_query(req, "SELECT pepsi.archive_login_redeem($1::bigint, $2, $3::interval) ->> 'session'", 3,
						values, &result);
	if (res == NULL)
		return result;
	if (!PQgetisnull(res, 0, 0))
	{
		log_info("%s: a reader logged in to the archive of %s", req->client, ar->address);
		result = archive_session_start(req, ar, PQgetvalue(res, 0, 0));
		PQclear(res);
		return result;
	}
	PQclear(res);
	buf_append_str(&out, "<p id=\"refused\">This link is not valid: it was used, or it expired. ");
	archive_link(&out, ar, "login", "Ask for a new one");
	buf_append_str(&out, ".</p>\n");
	result = archive_page(req, MHD_HTTP_FORBIDDEN, ar, "Log in", &out);
	buf_free(&out);
	return result;
}

/* POST with an address: mail it a link if it may read (the page says the same either way). */
static enum MHD_Result
archive_login_request(struct request *req, const struct archive_request *ar, const char *address)
{
	const char	   *host = MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, "Host");
	struct buf		link = BUF_INIT;
	struct buf		out = BUF_INIT;
	const char	   *values[4] = {ar->list_id, address, NULL, ARCHIVE_LINK_LIFETIME};
	enum MHD_Result result;
	PGresult	   *res;

	if (host == NULL || strpbrk(host, "/\\@<>\"' \r\n") != NULL)
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "the request has no usable Host");
	buf_printf(&link, "%s://%s/archive/%s/login?token=", httpd.tls ? "https" : "http", host, ar->address);
	values[2] = link.data;
	/* Mail enters at the admission stage, init, as any other does. */
	res = archive_query(req, "SELECT pepsi.archive_login_request($1::bigint, $2, $3, 'init', $4::interval)", 4, values,
						&result);
	buf_free(&link);
	if (res == NULL)
		return result;
	PQclear(res);
	buf_append_str(&out, "<p id=\"mailed\">If ");
	reply_html_escape(&out, address);
	buf_append_str(&out, " may read this archive, a link to log in is on its way to it.</p>\n");
	result = archive_page(req, MHD_HTTP_OK, ar, "Log in", &out);
	buf_free(&out);
	return result;
}

enum MHD_Result
archive_login_route(struct request *req, const struct archive_request *ar)
{
	const char	   *token = MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, "token");
	char			value[321];
	struct buf		out = BUF_INIT;
	enum MHD_Result result;

	if (strcmp(req->method, "POST") == 0)
	{
		if (req->body_too_large)
			return reply_error(req, MHD_HTTP_CONTENT_TOO_LARGE, "the form is too large");
		if (archive_form_value(&req->body, "token", value, sizeof(value)))
			return archive_login_redeem(req, ar, value);
		if (archive_form_value(&req->body, "address", value, sizeof(value)) && strchr(value, '@'))
			return archive_login_request(req, ar, value);
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "the form gives no address (address) or link (token)");
	}
	if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0)
		return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/login takes GET or POST");
	buf_append_str(&out, "<form method=\"post\" action=\"/archive/");
	reply_html_escape(&out, ar->address);
	buf_append_str(&out, "/login\">\n");
	if (token && strlen(token) == 64 && strspn(token, "0123456789abcdef") == 64)
	{
		buf_printf(&out, "<input type=\"hidden\" name=\"token\" value=\"%s\">\n", token);
		buf_append_str(&out, "<button type=\"submit\" id=\"enter\">Enter the archive</button>\n");
	}
	else
		buf_append_str(&out, "<label>Your address <input type=\"email\" name=\"address\" id=\"address\" required></label>\n"
							 "<button type=\"submit\" id=\"send-link\">Mail me a link</button>\n");
	buf_append_str(&out, "</form>\n");
	result = archive_page(req, MHD_HTTP_OK, ar, "Log in", &out);
	buf_free(&out);
	return result;
}

static enum MHD_Result
archive_members(struct request *req, const struct archive_request *ar)
{
	const char	   *values[2] = {ar->list_id,
								 MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, ARCHIVE_COOKIE)};
	enum MHD_Result result;
	PGresult	   *res = archive_query(req,
										"SELECT address, coalesce(display_name, ''), delivery, coalesce(disabled, ''),"
											  " bounce_score FROM pepsi.archive_owner_members($1::bigint, $2)",
										2, values, &result);
	struct buf		out = BUF_INIT;

	if (res == NULL)
		return result;
	buf_append_str(&out, "<table id=\"members\"><thead><tr><th>Address</th><th>Name</th><th>Delivery</th>"
						 "<th>Stopped</th><th>Bounce score</th></tr></thead><tbody>\n");
	for (int i = 0; i < PQntuples(res); i++)
	{
		buf_append_str(&out, "<tr>");
		for (int c = 0; c < 5; c++)
		{
			buf_append_str(&out, "<td>");
			reply_html_escape(&out, PQgetvalue(res, i, c));
			buf_append_str(&out, "</td>");
		}
		buf_append_str(&out, "</tr>\n");
	}
	buf_append_str(&out, "</tbody></table>\n");
	PQclear(res);
	result = archive_page(req, MHD_HTTP_OK, ar, "Members", &out);
	buf_free(&out);
	return result;
}

static enum MHD_Result
archive_moderation(struct request *req, const struct archive_request *ar)
{
	const char	   *values[2] = {ar->list_id,
								 MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, ARCHIVE_COOKIE)};
	enum MHD_Result result;
	PGresult	   *res = archive_query(req,
										"SELECT id, sender, coalesce(subject, ''), reason,"
											  " to_char(held_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')"
											  " FROM pepsi.archive_owner_held($1::bigint, $2)",
										2, values, &result);
	struct buf		out = BUF_INIT;

	if (res == NULL)
		return result;
	buf_printf(&out, "<p id=\"held-count\">%d held</p>\n<ul id=\"held\">\n", PQntuples(res));
	for (int i = 0; i < PQntuples(res); i++)
	{
		buf_append_str(&out, "<li>");
		reply_html_escape(&out, PQgetvalue(res, i, 2));
		buf_append_str(&out, " — ");
		reply_html_escape(&out, PQgetvalue(res, i, 1));
		buf_append_str(&out, " (");
		reply_html_escape(&out, PQgetvalue(res, i, 3));
		buf_append_str(&out, ")");
		for (int d = 0; d < 2; d++)
		{
			buf_append_str(&out, " <form method=\"post\" action=\"/archive/");
			reply_html_escape(&out, ar->address);
			buf_printf(&out,
					   "/moderation\"><input type=\"hidden\" name=\"held\" value=\"%s\">"
					   "<input type=\"hidden\" name=\"decision\" value=\"%s\">"
					   "<input type=\"hidden\" name=\"csrf\" value=\"%s\">"
					   "<button type=\"submit\" class=\"%s\">%s</button></form>",
					   PQgetvalue(res, i, 0), d ? "reject" : "approve", ar->csrf, d ? "reject" : "approve",
					   d ? "Reject" : "Approve");
		}
		buf_append_str(&out, "</li>\n");
	}
	buf_append_str(&out, "</ul>\n");
	PQclear(res);
	result = archive_page(req, MHD_HTTP_OK, ar, "Moderation", &out);
	buf_free(&out);
	return result;
}

/* POST /moderation: approve or reject a held post (the session's CSRF token required). */
static enum MHD_Result
archive_moderate(struct request *req, const struct archive_request *ar)
{
	char			held[24], decision[16], csrf[80];
	const char	   *values[5] = {ar->list_id, MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, ARCHIVE_COOKIE),
								 csrf, held, decision};
	enum MHD_Result result;
	PGresult	   *res;

	if (!archive_form_value(&req->body, "held", held, sizeof(held)) || strspn(held, "0123456789") != strlen(held)
		|| !*held || !archive_form_value(&req->body, "decision", decision, sizeof(decision)))
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "the form gives no held post (held) or decision");
	if (!archive_form_value(&req->body, "csrf", csrf, sizeof(csrf)))
		csrf[0] = '\0';
	res = archive_query(req, "SELECT pepsi.archive_owner_decide($1::bigint, $2, $3, $4::bigint, $5)", 5, values,
						&result);
	if (res == NULL)
		return result;
	if (!PQgetisnull(res, 0, 0))
	{
		log_info("%s: a moderation decision on %s refused: %s", req->client, ar->address, PQgetvalue(res, 0, 0));
		result = reply_error(req, MHD_HTTP_FORBIDDEN, "%s", PQgetvalue(res, 0, 0));
		PQclear(res);
		return result;
	}
	PQclear(res);
	log_info("%s: held post %s of %s: %s by %s", req->client, held, ar->address, decision, ar->reader);
	return archive_moderation(req, ar);
}

enum MHD_Result
archive_owner_route(struct request *req, const struct archive_request *ar, const char *view)
{
	bool get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;

	if (!ar->owner)
		return reply_error(req, MHD_HTTP_FORBIDDEN, "only an owner of the list who logged in sees this page");
	if (strcmp(view, "members") == 0)
		return get ? archive_members(req, ar)
				   : reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "the members page takes GET");
	if (get)
		return archive_moderation(req, ar);
	if (strcmp(req->method, "POST") != 0)
		return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "the moderation page takes GET or POST");
	if (req->body_too_large)
		return reply_error(req, MHD_HTTP_CONTENT_TOO_LARGE, "the form is too large");
	return archive_moderate(req, ar);
}
