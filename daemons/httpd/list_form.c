/*
 * list_form.c: the mailing lists' web forms (pepsi-httpd(8), issue 40):
 *
 *   GET  /list/form/subscribe?l=LIST     a form asking for an address
 *   GET  /list/form/unsubscribe?l=LIST   the same, to leave
 *   POST /list/form/subscribe|unsubscribe  the request: a confirmation mail
 *        goes to the address (pepsi.list_web_request; nothing changes yet)
 *   GET  /list/form/confirm?l=ID&a=ADDRESS&t=TOKEN  the link of that mail:
 *        a button only (link scanners fetch links: a GET changes nothing)
 *   POST /list/form/confirm               carries the request out, once
 *                                         (pepsi.list_confirm)
 *
 * Double opt-in: only the owner of the mailbox sees the token.  Each form
 * carries a CSRF token equal to a random cookie set with the form
 * (HttpOnly, SameSite=Strict, Path=/list/form/): a POST from another
 * site's page has neither, and one whose Sec-Fetch-Site says cross-site is
 * refused as well.  The pages load nothing and run no script; their CSP
 * (reply.c) allows forms to post to this server only.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "httpd.h"
#include "runtime/db.h"

#define FORM_COOKIE "pepsi_list_form"
#define FORM_CSRF_LEN 64

static void
form_escape(struct buf *out, const char *text)
{
	for (const char *p = text; *p; p++)
		if (*p == '<')
			buf_append_str(out, "&lt;");
		else if (*p == '>')
			buf_append_str(out, "&gt;");
		else if (*p == '&')
			buf_append_str(out, "&amp;");
		else if (*p == '"')
			buf_append_str(out, "&quot;");
		else if (*p == '\'')
			buf_append_str(out, "&#39;");
		else
			buf_append_char(out, *p);
}

/* The value of field name in an x-www-form-urlencoded body, decoded (the caller frees it), or NULL. */
static char *
form_field(const struct buf *body, const char *name)
{
	const char *p = body->data;
	const char *end = body->data + body->len;
	size_t		nlen = strlen(name);

	while (p && p < end)
	{
		const char *amp = memchr(p, '&', (size_t) (end - p));
		size_t		len = amp ? (size_t) (amp - p) : (size_t) (end - p);

		if (len > nlen && strncmp(p, name, nlen) == 0 && p[nlen] == '=')
		{
			struct buf out = BUF_INIT;
			char	  *value;

			for (const char *v = p + nlen + 1; v < p + len; v++)
				if (*v == '+')
					buf_append_char(&out, ' ');
				else if (*v == '%' && v + 2 < p + len && isxdigit((unsigned char) v[1])
						 && isxdigit((unsigned char) v[2]))
				{
					char hex[3] = {v[1], v[2], 0};

					buf_append_char(&out, (char) strtol(hex, NULL, 16));
					v += 2;
				}
				else
					buf_append_char(&out, *v);
			buf_append_char(&out, '\0');
			/* (a NUL inside, or an overlong value: no field of ours) */
			value = strlen(out.data) + 1 == out.len && out.len <= 513 ? xstrdup(out.data) : NULL;
			buf_free(&out);
			return value;
		}
		p = amp ? amp + 1 : NULL;
	}
	return NULL;
}

/* A page; csrf non-NULL: set the cookie the page's form must echo. */
static enum MHD_Result
form_page(struct request *req, unsigned status, const char *title, const char *html, const char *csrf)
{
	struct buf			 page = BUF_INIT;
	struct MHD_Response *response;
	enum MHD_Result		 result;

	buf_printf(&page,
			   "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title></head>\n"
			   "<body><h1>%s</h1>\n%s</body></html>\n",
			   title, title, html);
	response = MHD_create_response_from_buffer(page.len, page.data, MHD_RESPMEM_MUST_COPY);
	buf_free(&page);
	if (response == NULL)
		return MHD_NO;
	MHD_add_response_header(response, "Content-Type", "text/html; charset=utf-8");
	reply_add_form_security_headers(response);
	if (csrf)
	{
		char cookie[160];

		snprintf(cookie, sizeof(cookie), FORM_COOKIE "=%s; Path=/list/form/; HttpOnly; SameSite=Strict%s", csrf,
				 httpd.tls ? "; Secure" : "");
		MHD_add_response_header(response, "Set-Cookie", cookie);
	}
	result = MHD_queue_response(req->connection, status, response);
	MHD_destroy_response(response);
	return result;
}

static enum MHD_Result
form_message(struct request *req, unsigned status, const char *title, const char *text)
{
	struct buf		html = BUF_INIT;
	enum MHD_Result result;

	buf_append_str(&html, "<p>");
	form_escape(&html, text);
	buf_append_str(&html, "</p>\n");
	result = form_page(req, status, title, html.data, NULL);
	buf_free(&html);
	return result;
}

static bool
form_new_csrf(char out[FORM_CSRF_LEN + 1])
{
	unsigned char bytes[FORM_CSRF_LEN / 2];

	if (RAND_bytes(bytes, sizeof(bytes)) != 1)
		return false;
	for (size_t i = 0; i < sizeof(bytes); i++)
		snprintf(out + 2 * i, 3, "%02x", bytes[i]);
	return true;
}

/* Does the POST carry the form's CSRF token, equal to its cookie, from this site?  NULL, else why not. */
static const char *
form_csrf_refused(struct request *req)
{
	const char *cookie = MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, FORM_COOKIE);
	const char *site = MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, "Sec-Fetch-Site");
	char	   *given = form_field(&req->body, "csrf");
	const char *why = NULL;

	if (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
		why = "Sec-Fetch-Site is not same-origin";
	else if (cookie == NULL || strlen(cookie) != FORM_CSRF_LEN)
		why = "no form cookie";
	else if (given == NULL || strlen(given) != FORM_CSRF_LEN)
		why = "no csrf field";
	else if (CRYPTO_memcmp(cookie, given, FORM_CSRF_LEN) != 0)
		why = "the csrf field is not the cookie's";
	free(given);
	return why;
}

/* The form asking for the address (GET /list/form/subscribe|unsubscribe). */
static enum MHD_Result
form_ask(struct request *req, const char *action)
{
	const char	   *list = MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, "l");
	char			csrf[FORM_CSRF_LEN + 1];
	struct buf		html = BUF_INIT;
	enum MHD_Result result;

	if (list == NULL || *list == '\0' || strlen(list) > 254)
		return form_message(req, MHD_HTTP_BAD_REQUEST, "No list", "The link names no list (l=).");
	if (!form_new_csrf(csrf))
		return form_message(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later", "The server is busy.");
	buf_printf(&html, "<form method=\"post\" action=\"/list/form/%s\">\n<p>", action);
	buf_append_str(&html, strcmp(action, "subscribe") == 0 ? "Subscribe to " : "Unsubscribe from ");
	form_escape(&html, list);
	buf_append_str(&html, ": we will mail you a link to confirm.</p>\n<input type=\"hidden\" name=\"l\" value=\"");
	form_escape(&html, list);
	buf_printf(&html,
			   "\">\n<input type=\"hidden\" name=\"csrf\" value=\"%s\">\n"
			   "<label for=\"address\">Your address</label>\n"
			   "<input id=\"address\" name=\"address\" type=\"email\" required autocomplete=\"email\">\n"
			   "<button id=\"submit\" type=\"submit\">%s</button>\n</form>\n",
			   csrf, strcmp(action, "subscribe") == 0 ? "Subscribe" : "Unsubscribe");
	result = form_page(req, MHD_HTTP_OK, strcmp(action, "subscribe") == 0 ? "Subscribe" : "Unsubscribe", html.data,
					   csrf);
	buf_free(&html);
	return result;
}

/* One call answering NULL (done) or why not; its outcome as a page. */
static enum MHD_Result
form_call(struct request *req, const char *sql, int n, const char *const *values, const char *done_title,
		  const char *done_text, const char *what)
{
	PGconn		   *conn = httpd_db();
	PGresult	   *res;
	enum MHD_Result result;

	if (conn == NULL)
		return form_message(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later", "The server is busy.");
	res = db_exec(conn, sql, n, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		log_warnx("%s: %s: %s", req->client, what, db_error(res, conn));
		result = form_message(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later", "The server is busy.");
	}
	else if (!PQgetisnull(res, 0, 0))
	{
		log_info("%s: %s refused: %s", req->client, what, PQgetvalue(res, 0, 0));
		result = form_message(req, MHD_HTTP_BAD_REQUEST, "Nothing was done", PQgetvalue(res, 0, 0));
	}
	else
	{
		log_info("%s: %s", req->client, what);
		result = form_message(req, MHD_HTTP_OK, done_title, done_text);
	}
	PQclear(res);
	return result;
}

/* The confirmation page of the mailed link: a button that POSTs it. */
static enum MHD_Result
form_confirm_ask(struct request *req)
{
	const char	   *fields[3] = {"l", "a", "t"};
	const char	   *values[3];
	char			csrf[FORM_CSRF_LEN + 1];
	struct buf		html = BUF_INIT;
	enum MHD_Result result;

	for (int i = 0; i < 3; i++)
		if ((values[i] = MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, fields[i])) == NULL
			|| *values[i] == '\0' || strlen(values[i]) > 254)
			return form_message(req, MHD_HTTP_BAD_REQUEST, "Unknown link", "The link lacks its l, a or t.");
	if (!form_new_csrf(csrf))
		return form_message(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later", "The server is busy.");
	buf_append_str(&html, "<form method=\"post\" action=\"/list/form/confirm\">\n<p>Confirm the request for ");
	form_escape(&html, values[1]);
	buf_append_str(&html, "?</p>\n");
	for (int i = 0; i < 3; i++)
	{
		buf_printf(&html, "<input type=\"hidden\" name=\"%s\" value=\"", fields[i]);
		form_escape(&html, values[i]);
		buf_append_str(&html, "\">\n");
	}
	buf_printf(&html,
			   "<input type=\"hidden\" name=\"csrf\" value=\"%s\">\n"
			   "<button id=\"confirm\" type=\"submit\">Confirm</button>\n</form>\n",
			   csrf);
	result = form_page(req, MHD_HTTP_OK, "Confirm", html.data, csrf);
	buf_free(&html);
	return result;
}

static enum MHD_Result
form_post(struct request *req, const char *action)
{
	enum MHD_Result result;
	char		   *f[3] = {NULL, NULL, NULL};
	const char	   *refused = req->body_too_large ? "the body is too large" : form_csrf_refused(req);

	if (refused)
	{
		log_info("%s: a list form POST refused: %s", req->client, refused);
		return form_message(req, MHD_HTTP_FORBIDDEN, "Refused",
							"The form is stale or came from another site: open it again.");
	}
	if (strcmp(action, "confirm") == 0)
	{
		f[0] = form_field(&req->body, "l");
		f[1] = form_field(&req->body, "a");
		f[2] = form_field(&req->body, "t");
		if (f[0] == NULL || f[1] == NULL || f[2] == NULL || *f[0] == '\0' || strspn(f[0], "0123456789") != strlen(f[0]))
			result = form_message(req, MHD_HTTP_BAD_REQUEST, "Unknown link", "The form lacks its l, a or t.");
		else
			result = form_call(req, "SELECT pepsi.list_confirm($1::bigint, $2, $3)", 3, (const char *const *) f,
							   "Done", "Your request is carried out.", "a list request confirmed on the web");
	}
	else
	{
		f[0] = form_field(&req->body, "l");
		f[1] = form_field(&req->body, "address");
		f[2] = xstrdup(action);
		if (f[0] == NULL || f[1] == NULL)
			result = form_message(req, MHD_HTTP_BAD_REQUEST, "Nothing was done", "The form lacks the list or the address.");
		else
			result = form_call(req, "SELECT pepsi.list_web_request($1, $2, $3)", 3, (const char *const *) f,
							   "Check your mail",
							   "We sent a message to that address: follow its link (or reply to it) to confirm.",
							   "a list request from the web form");
	}
	for (int i = 0; i < 3; i++)
		free(f[i]);
	return result;
}

enum MHD_Result
list_form_route(struct request *req)
{
	const char *action = req->path + strlen("/list/form/");
	bool		get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;

	if (strcmp(action, "subscribe") != 0 && strcmp(action, "unsubscribe") != 0 && strcmp(action, "confirm") != 0)
		return form_message(req, MHD_HTTP_NOT_FOUND, "Not found", "There is no such page.");
	if (get)
		return strcmp(action, "confirm") == 0 ? form_confirm_ask(req) : form_ask(req, action);
	if (strcmp(req->method, "POST") == 0)
		return form_post(req, action);
	return form_message(req, MHD_HTTP_METHOD_NOT_ALLOWED, "Not allowed", "This page takes GET or POST.");
}
