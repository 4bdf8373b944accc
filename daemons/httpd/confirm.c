/*
 * confirm.c: /confirm, the page a challenge of the confirm-to-send
 * secretary links to (pepsi-stage-check-whitelist's CONFIRM_URL).
 *
 * Anyone holding the link may use it: the token is the credential, so
 * there is no login.  GET only shows what waits (pepsi.secretary_challenge_show)
 * and a button, because mail scanners and link previews fetch links: a
 * GET must never release.  The button POSTs the token back, which
 * releases the held mail and whitelists its sender, once
 * (pepsi.secretary_release).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "httpd.h"
#include "runtime/db.h"

/* A token as pepsi.secretary_decide makes it: 64 hexadecimal digits. */
#define CONFIRM_TOKEN_LEN 64

static bool
confirm_is_token(const char *text, size_t len)
{
	return len == CONFIRM_TOKEN_LEN && strspn(text, "0123456789abcdef") >= CONFIRM_TOKEN_LEN;
}

/* The token of a POST's form body (token=...), copied into out; false when there is none. */
static bool
confirm_form_token(const struct buf *body, char *out)
{
	const char *p = body->data;
	const char *end = body->data + body->len;

	while (p < end)
	{
		const char *amp = memchr(p, '&', (size_t) (end - p));
		size_t		len = amp ? (size_t) (amp - p) : (size_t) (end - p);

		if (len > 6 && strncmp(p, "token=", 6) == 0 && len - 6 == CONFIRM_TOKEN_LEN)
		{
			memcpy(out, p + 6, CONFIRM_TOKEN_LEN);
			out[CONFIRM_TOKEN_LEN] = '\0';
			return confirm_is_token(out, CONFIRM_TOKEN_LEN);
		}
		p += len + 1;
	}
	return false;
}

static enum MHD_Result
confirm_page(struct request *req, unsigned status, const char *title, const char *text_html)
{
	struct buf		page = BUF_INIT;
	enum MHD_Result result;

	buf_printf(&page,
			   "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
			   "<title>%s</title></head>\n<body><h1>%s</h1>\n%s</body></html>\n",
			   title, title, text_html);
	result = reply_form_page(req, status, page.data);
	buf_free(&page);
	return result;
}

static enum MHD_Result
confirm_show(struct request *req, const char *token)
{
	const char	   *values[1] = {token};
	PGconn		   *conn = httpd_db();
	PGresult	   *res;
	struct buf		text = BUF_INIT;
	const char	   *state;
	enum MHD_Result result;

	if (conn == NULL)
		return confirm_page(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later", "<p>The server is busy.</p>\n");
	res = db_exec(conn, "SELECT state, owner, sender, held FROM pepsi.secretary_challenge_show($1)", 1, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		log_warnx("httpd: %s: /confirm: %s", req->client, db_error(res, conn));
		PQclear(res);
		return confirm_page(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later", "<p>The server is busy.</p>\n");
	}
	state = PQgetvalue(res, 0, 0);
	if (strcmp(state, "open") == 0)
	{
		buf_append_str(&text, "<p>");
		reply_html_escape(&text, PQgetvalue(res, 0, 1));
		buf_append_str(&text, " takes mail only from senders it knows.  ");
		buf_printf(&text, "%s message(s) from ", PQgetvalue(res, 0, 3));
		reply_html_escape(&text, PQgetvalue(res, 0, 2));
		buf_append_str(&text, " wait for your confirmation.</p>\n"
							  "<form method=\"post\" action=\"/confirm\">"
							  "<input type=\"hidden\" name=\"token\" value=\"");
		buf_append_str(&text, token); /* 64 hexadecimal digits: nothing to escape */
		buf_append_str(&text, "\"><button type=\"submit\">I sent it: deliver my mail</button></form>\n");
		result = confirm_page(req, MHD_HTTP_OK, "Confirm your message", text.data);
	}
	else if (strcmp(state, "released") == 0)
		result = confirm_page(req, MHD_HTTP_GONE, "Already confirmed",
							  "<p>This link was used already: the mail was delivered.</p>\n");
	else if (strcmp(state, "expired") == 0)
		result = confirm_page(req, MHD_HTTP_GONE, "Expired", "<p>This link has expired, and the mail with it.</p>\n");
	else
		result = confirm_page(req, MHD_HTTP_NOT_FOUND, "Unknown link", "<p>This link is not one this server sent.</p>\n");
	PQclear(res);
	buf_free(&text);
	return result;
}

static enum MHD_Result
confirm_release(struct request *req, const char *token)
{
	const char	   *values[1] = {token};
	PGconn		   *conn = httpd_db();
	PGresult	   *res;
	struct buf		text = BUF_INIT;
	enum MHD_Result result;

	if (conn == NULL)
		return confirm_page(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later", "<p>The server is busy.</p>\n");
	res = db_exec(conn, "SELECT pepsi.secretary_release($1)", 1, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		log_warnx("httpd: %s: /confirm: %s", req->client, db_error(res, conn));
		PQclear(res);
		return confirm_page(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later", "<p>The server is busy.</p>\n");
	}
	if (PQgetisnull(res, 0, 0))
	{
		log_info("httpd: %s: /confirm: a challenge confirmed: its mail released", req->client);
		result = confirm_page(req, MHD_HTTP_OK, "Confirmed",
							  "<p>Thank you: your mail is delivered, and later mail from you will be too.</p>\n");
	}
	else
	{
		buf_append_str(&text, "<p>Nothing was released: ");
		reply_html_escape(&text, PQgetvalue(res, 0, 0));
		buf_append_str(&text, ".</p>\n");
		result = confirm_page(req, MHD_HTTP_GONE, "Not confirmed", text.data);
	}
	PQclear(res);
	buf_free(&text);
	return result;
}

enum MHD_Result
confirm_route(struct request *req)
{
	char token[CONFIRM_TOKEN_LEN + 1];

	if (strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0)
	{
		const char *given = MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, "token");

		if (given == NULL || !confirm_is_token(given, strlen(given)))
			return confirm_page(req, MHD_HTTP_NOT_FOUND, "Unknown link", "<p>This link is not one this server sent.</p>\n");
		return confirm_show(req, given);
	}
	if (strcmp(req->method, "POST") == 0)
	{
		if (req->body_too_large || !confirm_form_token(&req->body, token))
			return confirm_page(req, MHD_HTTP_BAD_REQUEST, "Unknown link", "<p>The form carried no token.</p>\n");
		return confirm_release(req, token);
	}
	return confirm_page(req, MHD_HTTP_METHOD_NOT_ALLOWED, "Not allowed", "<p>/confirm takes GET or POST.</p>\n");
}
