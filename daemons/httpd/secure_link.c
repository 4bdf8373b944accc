/*
 * secure_link.c: the secure-link portal's pages (/secure/SECRET/...;
 * pepsi-secure-link(8), pepsi-httpd(8)).
 *
 * pepsi-stage-encrypt sealed a message for a recipient without a key and
 * mailed the recipient a link carrying a secret; only the link opens the
 * message (common/message/securelink.h): the database has its identifier
 * and the ciphertext.  The pages:
 *
 *   GET  /secure/S           what waits, and a button to mail a code
 *   POST /secure/S/code      mail a one-time code to the recipient
 *   POST /secure/S/session   the code: a session (cookie, bound to the link)
 *   GET  /secure/S/message   the message, opened in memory, and a reply form
 *   GET  /secure/S/part/N    an attachment, as a download
 *   POST /secure/S/reply     the reply (the session's CSRF token, used once)
 *
 * A GET never mails or spends anything (scanners fetch links).  A link
 * unknown, expired or revoked, a code wrong, used or expired, a session
 * missing: each refused with the reason, never the clear text.  A link
 * that started its PORTAL_OPENS sessions (the limit is the link's row's,
 * set when it was made) starts no other: its page, a code asked for and a
 * code checked are refused with when it was used (410; the two POSTs
 * audited by the extension as secure_link_reused, and counted against the
 * client), while a session it started goes on until it ends.  A client
 * whose links or codes are refused SECURE_LINK_CLIENT_FAILURES times in
 * ten minutes gets 429 until then (in memory: a restart forgives); the
 * database counts each code's tries and each link's codes an hour.
 * Nothing here logs the secret, and the clear text is wiped after use.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "httpd.h"
#include "message/header.h"
#include "message/mime.h"
#include "message/securelink.h"

#define SECURE_LINK_COOKIE "pepsi_secure"
#define SECURE_LINK_CODE_LIFETIME "10 minutes"
#define SECURE_LINK_CODES_PER_HOUR "5"
#define SECURE_LINK_CODE_ATTEMPTS "5"
#define SECURE_LINK_SESSION_SECONDS 900
#define SECURE_LINK_MAX_REPLIES "20"
#define SECURE_LINK_CLIENT_FAILURES 20
#define SECURE_LINK_WINDOW 600
#define SECURE_LINK_TRACKED 256

/* Refusals by client (its client_key), for the 429. */
static struct
{
	char   key[CLIENT_KEY_SIZE];
	int	   count;
	time_t first;
} secure_link_refused[SECURE_LINK_TRACKED];

static int *
secure_link_failures(const char *client, bool create)
{
	time_t now = time(NULL);
	size_t oldest = 0;

	for (size_t i = 0; i < SECURE_LINK_TRACKED; i++)
	{
		if (secure_link_refused[i].key[0] && now - secure_link_refused[i].first > SECURE_LINK_WINDOW)
			secure_link_refused[i].key[0] = '\0';
		if (secure_link_refused[i].key[0] && strcmp(secure_link_refused[i].key, client) == 0)
			return &secure_link_refused[i].count;
		if (secure_link_refused[i].key[0] == '\0' || secure_link_refused[i].first < secure_link_refused[oldest].first)
			oldest = i;
	}
	if (!create)
		return NULL;
	snprintf(secure_link_refused[oldest].key, sizeof(secure_link_refused[oldest].key), "%s", client);
	secure_link_refused[oldest].count = 0;
	secure_link_refused[oldest].first = now;
	return &secure_link_refused[oldest].count;
}

/*
 * The value of field name of an urlencoded form body, decoded, into out
 * (at most max bytes); false when absent, too long or holding a NUL.
 */
static bool
secure_link_field(const struct buf *body, const char *name, size_t max, struct buf *out)
{
	size_t		nlen = strlen(name);
	const char *p = body->data;
	const char *end = body->data ? body->data + body->len : NULL;

	buf_reset(out);
	while (p && p < end)
	{
		const char *amp = memchr(p, '&', (size_t) (end - p));
		const char *stop = amp ? amp : end;

		if ((size_t) (stop - p) > nlen && strncmp(p, name, nlen) == 0 && p[nlen] == '=')
		{
			for (p += nlen + 1; p < stop; p++)
			{
				int c = *p == '+' ? ' ' : *p;

				if (c == '%' && stop - p > 2 && isxdigit((unsigned char) p[1]) && isxdigit((unsigned char) p[2]))
				{
					char hex[3] = {p[1], p[2], '\0'};

					c = (int) strtol(hex, NULL, 16);
					p += 2;
				}
				if (c == '\0' || out->len >= max)
					return false;
				buf_append_char(out, (char) c);
			}
			return true;
		}
		p = stop + 1;
	}
	return false;
}

/* A page of the portal (html is its body's inside). */
static enum MHD_Result
secure_link_page(struct request *req, unsigned status, const char *title, const char *html)
{
	struct buf		page = BUF_INIT;
	enum MHD_Result result;

	buf_printf(&page,
			   "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
			   "<meta name=\"viewport\" content=\"width=device-width\">"
			   "<link rel=\"stylesheet\" href=\"/style.css\"><title>%s</title></head>\n"
			   "<body class=\"secure-link\"><h1>%s</h1>\n%s</body></html>\n",
			   title, title, html);
	result = reply_form_page(req, status, page.data);
	securelink_buf_wipe(&page);
	return result;
}

/* A refusal: the reason, escaped, as the page; counted against the client when it could be a guess. */
static enum MHD_Result
secure_link_refuse(struct request *req, unsigned status, const char *reason, bool count)
{
	struct buf html = BUF_INIT;

	enum MHD_Result result;

	if (count)
		(*secure_link_failures(req->client_key, true))++;
	log_info("%s: secure link refused (%u): %s", req->client, status, reason);
	buf_append_str(&html, "<p id=\"refused\">Refused: ");
	reply_html_escape(&html, reason);
	buf_append_str(&html, ".</p>\n");
	result = secure_link_page(req, status, "Refused", html.data);
	buf_free(&html);
	return result;
}

/* SQL on the server's connection with the link's identifier as $1 (values[0] is set here); NULL: replied 503. */
static PGresult *
secure_link_query(struct request *req, const struct securelink *link, const char *sql, int n, const char **values,
				  enum MHD_Result *result)
{
	PGconn		  *conn = httpd_db();
	size_t		   id_len;
	unsigned char *id = conn ? PQescapeByteaConn(conn, link->id, sizeof(link->id), &id_len) : NULL;
	PGresult	  *res;

	if (id == NULL)
	{
		*result = secure_link_page(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later",
								   "<p>The server cannot reach its database.</p>\n");
		return NULL;
	}
	values[0] = (const char *) id;
	res = PQexecParams(conn, sql, n, NULL, values, NULL, NULL, 0);
	PQfreemem(id);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		log_warnx("%s: secure link: %s", req->client, PQresultErrorMessage(res));
		PQclear(res);
		*result = secure_link_page(req, MHD_HTTP_SERVICE_UNAVAILABLE, "Try again later",
								   "<p>The server could not answer; try again in a moment.</p>\n");
		return NULL;
	}
	return res;
}

/* GET /secure/S: what waits for whom, and the two forms (mail a code, enter it). */
static enum MHD_Result
secure_link_show(struct request *req, const struct securelink *link, const char *recipient)
{
	struct buf		html = BUF_INIT;
	enum MHD_Result result;

	buf_append_str(&html, "<p id=\"waiting\">An encrypted message for <b>");
	reply_html_escape(&html, recipient);
	buf_append_str(&html, "</b> is waiting.  To read it, prove that this address is yours: "
						  "a one-time code will be mailed to it.</p>\n");
	buf_printf(&html,
			   "<form method=\"post\" action=\"/secure/%s/code\">"
			   "<button type=\"submit\" id=\"send-code\">Mail me a code</button></form>\n"
			   "<form method=\"post\" action=\"/secure/%s/session\">"
			   "<label>Code <input name=\"code\" id=\"code\" inputmode=\"numeric\" autocomplete=\"one-time-code\" "
			   "maxlength=\"8\" required></label> <button type=\"submit\" id=\"enter\">Read the message</button></form>\n",
			   link->token, link->token);
	result = secure_link_page(req, MHD_HTTP_OK, "An encrypted message", html.data);
	buf_free(&html);
	return result;
}

/*
 * POST /secure/S/code: mail a code (the extension's limits), then the code
 * form.  used: the link's status said its opens are spent (the extension
 * refuses, and audits, either way).
 */
static enum MHD_Result
secure_link_code(struct request *req, const struct securelink *link, const char *recipient, bool used)
{
	const char	   *values[3] = {NULL, SECURE_LINK_CODE_LIFETIME, SECURE_LINK_CODES_PER_HOUR};
	enum MHD_Result result;
	PGresult	   *res = secure_link_query(
			  req, link, "SELECT pepsi.secure_link_code_request($1::bytea, $2::interval, $3::integer)", 3, values, &result);
	struct buf html = BUF_INIT;

	if (res == NULL)
		return result;
	if (!PQgetisnull(res, 0, 0))
	{
		result = secure_link_refuse(req, used ? MHD_HTTP_GONE : MHD_HTTP_TOO_MANY_REQUESTS, PQgetvalue(res, 0, 0), used);
		PQclear(res);
		return result;
	}
	PQclear(res);
	log_info("%s: secure link: a code mailed", req->client);
	buf_append_str(&html, "<p id=\"mailed\">A code is on its way to ");
	reply_html_escape(&html, recipient);
	buf_printf(&html,
			   "; it is good for " SECURE_LINK_CODE_LIFETIME ", once.</p>\n"
			   "<form method=\"post\" action=\"/secure/%s/session\">"
			   "<label>Code <input name=\"code\" id=\"code\" inputmode=\"numeric\" autocomplete=\"one-time-code\" "
			   "maxlength=\"8\" required></label> <button type=\"submit\" id=\"enter\">Read the message</button></form>\n",
			   link->token);
	result = secure_link_page(req, MHD_HTTP_OK, "Enter the code", html.data);
	buf_free(&html);
	return result;
}

/* POST /secure/S/session: the code; a session cookie and a 303 to the message, or the reason (used: as for the code). */
static enum MHD_Result
secure_link_session(struct request *req, const struct securelink *link, bool used)
{
	struct buf			 code = BUF_INIT, cookie = BUF_INIT, location = BUF_INIT;
	char				 lifetime[32];
	const char			*values[4] = {NULL, NULL, lifetime, SECURE_LINK_CODE_ATTEMPTS};
	enum MHD_Result		 result;
	PGresult			*res;
	struct MHD_Response *response;

	if (!secure_link_field(&req->body, "code", 16, &code))
	{
		buf_free(&code);
		return secure_link_refuse(req, MHD_HTTP_BAD_REQUEST, "the form gives no code (code)", false);
	}
	values[1] = code.data;
	snprintf(lifetime, sizeof(lifetime), "%d seconds", SECURE_LINK_SESSION_SECONDS);
	res = secure_link_query(
		req, link,
		"SELECT s->>'session', s->>'refused' FROM pepsi.secure_link_code_check($1::bytea, $2, $3::interval, $4::integer) s",
		4, values, &result);
	buf_free(&code);
	if (res == NULL)
		return result;
	if (PQgetisnull(res, 0, 0))
	{
		result = secure_link_refuse(req, used ? MHD_HTTP_GONE : MHD_HTTP_FORBIDDEN, PQgetvalue(res, 0, 1), true);
		PQclear(res);
		return result;
	}
	response = MHD_create_response_from_buffer(0, (void *) (uintptr_t) "", MHD_RESPMEM_PERSISTENT);
	if (response == NULL)
	{
		PQclear(res);
		return MHD_NO;
	}
	buf_printf(&cookie, SECURE_LINK_COOKIE "=%s; Path=/secure/%s/; Max-Age=%d; HttpOnly; SameSite=Strict%s",
			   PQgetvalue(res, 0, 0), link->token, SECURE_LINK_SESSION_SECONDS, httpd.tls ? "; Secure" : "");
	buf_printf(&location, "/secure/%s/message", link->token);
	PQclear(res);
	log_info("%s: secure link: the code was right, a session started", req->client);
	reply_add_security_headers(response);
	MHD_add_response_header(response, "Set-Cookie", cookie.data);
	MHD_add_response_header(response, "Location", location.data);
	result = MHD_queue_response(req->connection, MHD_HTTP_SEE_OTHER, response);
	MHD_destroy_response(response);
	buf_free(&cookie);
	buf_free(&location);
	return result;
}

/* One leaf of the message's MIME tree. */
struct secure_link_part
{
	const char *headers;
	size_t		hlen;
	const char *body;
	size_t		blen;
	char		type[128];
	char	   *name;		 /* its file name, or NULL */
	bool		inline_text; /* text/plain and no attachment: shown on the page */
};

struct secure_link_parts
{
	struct secure_link_part *part;
	size_t					 n, cap;
};

static void
secure_link_walk(struct secure_link_parts *parts, const char *s, size_t len, int depth)
{
	size_t hlen, body_start;
	char  *content_type, *disposition, *boundary;
	char   type[128];

	if (depth > MIME_MAX_DEPTH || parts->n >= 1000)
		return;
	mime_entity_split(s, len, &hlen, &body_start);
	content_type = header_get(s, hlen, "Content-Type");
	disposition = header_get(s, hlen, "Content-Disposition");
	mime_media_type(content_type, type, sizeof(type));
	boundary = strncmp(type, "multipart/", 10) == 0 ? mime_boundary(content_type) : NULL;
	if (boundary != NULL)
	{
		char	   *d = xasprintf("--%s", boundary);
		size_t		dlen = strlen(d);
		bool		closing;
		size_t		at = mime_next_delimiter(s + body_start, len - body_start, 0, d, dlen, &closing);
		const char *b = s + body_start;
		size_t		blen = len - body_start;

		while (at < blen && !closing)
		{
			size_t start = mime_line_end(b, blen, at);
			size_t next = mime_next_delimiter(b, blen, start, d, dlen, &closing);
			size_t part_end = next;

			if (next < blen && part_end > start && b[part_end - 1] == '\n')
				part_end--;
			if (next < blen && part_end > start && b[part_end - 1] == '\r')
				part_end--;
			secure_link_walk(parts, b + start, part_end - start, depth + 1);
			at = next;
		}
		free(d);
	}
	else
	{
		struct secure_link_part *p;

		if (parts->n == parts->cap)
		{
			parts->cap = parts->cap ? parts->cap * 2 : 8;
			parts->part = xrealloc(parts->part, parts->cap * sizeof(*parts->part));
		}
		p = &parts->part[parts->n++];
		memset(p, 0, sizeof(*p));
		p->headers = s;
		p->hlen = hlen;
		p->body = s + body_start;
		p->blen = len - body_start;
		snprintf(p->type, sizeof(p->type), "%s", type);
		p->name = disposition ? mime_parameter(disposition, "filename") : NULL;
		if (p->name == NULL && content_type)
			p->name = mime_parameter(content_type, "name");
		p->inline_text = strcmp(type, "text/plain") == 0 && p->name == NULL
						 && (disposition == NULL
							 || strncasecmp(disposition + strspn(disposition, " \t"), "attachment", 10) != 0);
	}
	free(boundary);
	free(content_type);
	free(disposition);
}

static void
secure_link_parts_free(struct secure_link_parts *parts)
{
	for (size_t i = 0; i < parts->n; i++)
		free(parts->part[i].name);
	free(parts->part);
}

/* A part's content, its transfer encoding undone. */
static void
secure_link_decode(const struct secure_link_part *p, struct buf *out)
{
	char *encoding = header_get(p->headers, p->hlen, "Content-Transfer-Encoding");
	char  trimmed[64] = "";

	if (encoding)
		sscanf(encoding, " %63[^ \t;(]", trimmed);
	if (strcasecmp(trimmed, "quoted-printable") == 0)
		mime_decode_quoted_printable(p->body, p->blen, out);
	else if (strcasecmp(trimmed, "base64") == 0)
		mime_decode_base64(p->body, p->blen, out);
	else
		buf_append(out, p->body, p->blen);
	free(encoding);
}

/*
 * The message of a session (cookie) of this link, opened into plain; the
 * row's recipient, sender and CSRF token.  false: replied already (the
 * reason, or 503).
 */
static bool
secure_link_opened(struct request *req, const struct securelink *link, struct buf *plain, char *recipient,
				   char *sender, char *csrf, enum MHD_Result *result)
{
	const char	  *values[2] = {NULL, MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, SECURE_LINK_COOKIE)};
	PGresult	  *res = secure_link_query(req, link,
										   "SELECT refusal, recipient, sender, nonce, sealed, csrf"
												" FROM pepsi.secure_link_open($1::bytea, $2)",
										   2, values, result);
	unsigned char *nonce = NULL, *sealed = NULL;
	size_t		   nonce_len = 0, sealed_len = 0;
	bool		   ok;

	if (res == NULL)
		return false;
	if (!PQgetisnull(res, 0, 0))
	{
		*result = secure_link_refuse(req, MHD_HTTP_FORBIDDEN, PQgetvalue(res, 0, 0), false);
		PQclear(res);
		return false;
	}
	snprintf(recipient, 321, "%s", PQgetvalue(res, 0, 1));
	snprintf(sender, 321, "%s", PQgetvalue(res, 0, 2));
	snprintf(csrf, 65, "%s", PQgetvalue(res, 0, 5));
	nonce = PQunescapeBytea((const unsigned char *) PQgetvalue(res, 0, 3), &nonce_len);
	sealed = PQunescapeBytea((const unsigned char *) PQgetvalue(res, 0, 4), &sealed_len);
	PQclear(res);
	ok = nonce && sealed && nonce_len == SECURELINK_NONCE_LEN
		 && securelink_open(link, recipient, nonce, sealed, sealed_len, plain);
	PQfreemem(nonce);
	PQfreemem(sealed);
	if (!ok)
	{
		log_warnx("%s: secure link: the stored message does not open under its link", req->client);
		*result = secure_link_refuse(req, MHD_HTTP_INTERNAL_SERVER_ERROR,
									 "the stored message does not open (it was altered): tell the sender", false);
	}
	return ok;
}

static void
secure_link_header_row(struct buf *html, const char *headers, size_t hlen, const char *name, const char *id)
{
	char *value = header_get(headers, hlen, name);

	if (value == NULL)
		return;
	buf_printf(html, "<tr><th>%s</th><td id=\"%s\">", name, id);
	reply_html_escape(html, value);
	buf_append_str(html, "</td></tr>\n");
	free(value);
}

/* GET /secure/S/message: the headers, the text, the attachments, the reply form. */
static enum MHD_Result
secure_link_message(struct request *req, const struct securelink *link)
{
	struct buf				 plain = BUF_INIT, html = BUF_INIT, text = BUF_INIT, utf8 = BUF_INIT;
	struct secure_link_parts parts = {0};
	char					 recipient[321], sender[321], csrf[65];
	size_t					 hlen, body_start;
	char					*subject;
	enum MHD_Result			 result;

	if (!secure_link_opened(req, link, &plain, recipient, sender, csrf, &result))
		return result;
	mime_entity_split(plain.data, plain.len, &hlen, &body_start);
	buf_append_str(&html, "<table id=\"headers\">\n");
	secure_link_header_row(&html, plain.data, hlen, "From", "from");
	secure_link_header_row(&html, plain.data, hlen, "To", "to");
	secure_link_header_row(&html, plain.data, hlen, "Cc", "cc");
	secure_link_header_row(&html, plain.data, hlen, "Date", "date");
	secure_link_header_row(&html, plain.data, hlen, "Subject", "subject");
	buf_append_str(&html, "</table>\n");
	secure_link_walk(&parts, plain.data, plain.len, 0);
	for (size_t i = 0; i < parts.n; i++)
		if (parts.part[i].inline_text)
		{
			char *ct = header_get(parts.part[i].headers, parts.part[i].hlen, "Content-Type");
			char *charset = ct ? mime_parameter(ct, "charset") : NULL;

			buf_reset(&text);
			buf_reset(&utf8);
			secure_link_decode(&parts.part[i], &text);
			buf_append_str(&html, "<pre class=\"body\">");
			if (mime_text_to_utf8(text.data ? text.data : "", text.len, charset, &utf8))
				reply_html_escape(&html, utf8.data ? utf8.data : "");
			buf_append_str(&html, "</pre>\n");
			free(ct);
			free(charset);
		}
	buf_append_str(&html, "<ul id=\"attachments\">\n");
	for (size_t i = 0; i < parts.n; i++)
		if (!parts.part[i].inline_text)
		{
			buf_printf(&html, "<li><a download href=\"/secure/%s/part/%zu\">", link->token, i);
			reply_html_escape(&html, parts.part[i].name ? parts.part[i].name : "(no name)");
			buf_append_str(&html, "</a> (");
			reply_html_escape(&html, parts.part[i].type);
			buf_append_str(&html, ")</li>\n");
		}
	buf_append_str(&html, "</ul>\n");
	subject = header_get(plain.data, hlen, "Subject");
	buf_printf(&html,
			   "<h2>Reply</h2>\n<form method=\"post\" action=\"/secure/%s/reply\" id=\"reply\">"
			   "<input type=\"hidden\" name=\"csrf\" value=\"%s\">"
			   "<p>To ",
			   link->token, csrf);
	reply_html_escape(&html, sender);
	buf_append_str(&html, ", from the portal, with your address to reply to.</p>"
						  "<label>Subject <input name=\"subject\" id=\"reply-subject\" value=\"");
	if (subject && strncasecmp(subject, "Re:", 3) != 0)
		buf_append_str(&html, "Re: ");
	reply_html_escape(&html, subject ? subject : "");
	buf_append_str(&html, "\"></label>\n<label>Message <textarea name=\"body\" id=\"reply-body\" rows=\"10\" "
						  "required></textarea></label>\n"
						  "<button type=\"submit\" id=\"send-reply\">Send the reply</button></form>\n");
	free(subject);
	result = secure_link_page(req, MHD_HTTP_OK, "Your encrypted message", html.data);
	secure_link_parts_free(&parts);
	securelink_buf_wipe(&plain);
	securelink_buf_wipe(&html);
	securelink_buf_wipe(&text);
	securelink_buf_wipe(&utf8);
	return result;
}

/* GET /secure/S/part/N: attachment N, as a download (never rendered here). */
static enum MHD_Result
secure_link_attachment(struct request *req, const struct securelink *link, const char *n)
{
	struct buf				 plain = BUF_INIT, data = BUF_INIT, disposition = BUF_INIT;
	struct secure_link_parts parts = {0};
	char					 recipient[321], sender[321], csrf[65];
	char					*end;
	unsigned long			 i = strtoul(n, &end, 10);
	enum MHD_Result			 result;
	struct MHD_Response		*response;

	if (!secure_link_opened(req, link, &plain, recipient, sender, csrf, &result))
		return result;
	secure_link_walk(&parts, plain.data, plain.len, 0);
	if (*n == '\0' || *end != '\0' || i >= parts.n || parts.part[i].inline_text)
	{
		result = secure_link_refuse(req, MHD_HTTP_NOT_FOUND, "the message has no such attachment", false);
		goto done;
	}
	secure_link_decode(&parts.part[i], &data);
	buf_append_str(&disposition, "attachment; filename=\"");
	for (const char *c = parts.part[i].name ? parts.part[i].name : "attachment"; *c; c++)
		buf_append_char(&disposition, (*c >= 0x20 && *c < 0x7f && *c != '"' && *c != '\\') ? *c : '_');
	buf_append_str(&disposition, "\"");
	response = MHD_create_response_from_buffer(data.len, data.data, MHD_RESPMEM_MUST_COPY);
	if (response == NULL)
	{
		result = MHD_NO;
		goto done;
	}
	reply_add_security_headers(response);
	MHD_add_response_header(response, "Content-Type", "application/octet-stream");
	MHD_add_response_header(response, "Content-Disposition", disposition.data);
	result = MHD_queue_response(req->connection, MHD_HTTP_OK, response);
	MHD_destroy_response(response);
done:
	secure_link_parts_free(&parts);
	securelink_buf_wipe(&plain);
	securelink_buf_wipe(&data);
	buf_free(&disposition);
	return result;
}

/* POST /secure/S/reply: queue the reply (from the portal, Reply-To the recipient). */
static enum MHD_Result
secure_link_reply(struct request *req, const struct securelink *link)
{
	struct buf		plain = BUF_INIT, csrf = BUF_INIT, subject = BUF_INIT, body = BUF_INIT, html = BUF_INIT;
	char			recipient[321], sender[321], session_csrf[65];
	char		   *message_id = NULL;
	size_t			hlen, body_start;
	const char	   *values[8];
	enum MHD_Result result;
	PGresult	   *res;

	if (!secure_link_field(&req->body, "csrf", 64, &csrf) || !secure_link_field(&req->body, "body", HTTPD_MAX_BODY, &body))
	{
		result = secure_link_refuse(req, MHD_HTTP_BAD_REQUEST, "the form gives no reply (body) or CSRF token (csrf)",
									false);
		goto done;
	}
	if (!secure_link_field(&req->body, "subject", 200, &subject))
		buf_reset(&subject);
	/* The session and the message, again: the reply is In-Reply-To its Message-ID. */
	if (!secure_link_opened(req, link, &plain, recipient, sender, session_csrf, &result))
		goto done;
	mime_entity_split(plain.data, plain.len, &hlen, &body_start);
	message_id = header_get(plain.data, hlen, "Message-ID");
	values[1] = MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, SECURE_LINK_COOKIE);
	values[2] = csrf.data ? csrf.data : "";
	values[3] = "init"; /* a reply enters at admission, as any other mail does */
	values[4] = subject.data ? subject.data : "";
	values[5] = message_id;
	values[6] = body.data;
	values[7] = SECURE_LINK_MAX_REPLIES;
	res = secure_link_query(req, link,
							"SELECT pepsi.secure_link_reply($1::bytea, $2, $3, $4, $5, btrim($6), $7, $8::integer)", 8,
							values, &result);
	if (res == NULL)
		goto done;
	if (!PQgetisnull(res, 0, 0))
	{
		result = secure_link_refuse(req, MHD_HTTP_FORBIDDEN, PQgetvalue(res, 0, 0), false);
		PQclear(res);
		goto done;
	}
	PQclear(res);
	log_info("%s: secure link: a reply queued", req->client);
	buf_append_str(&html, "<p id=\"replied\">Your reply is on its way to ");
	reply_html_escape(&html, sender);
	buf_printf(&html, ".</p>\n<p><a href=\"/secure/%s/message\">Back to the message</a></p>\n", link->token);
	result = secure_link_page(req, MHD_HTTP_OK, "Reply sent", html.data);
done:
	free(message_id);
	securelink_buf_wipe(&plain);
	securelink_buf_wipe(&body);
	buf_free(&subject);
	buf_free(&csrf);
	buf_free(&html);
	return result;
}

enum MHD_Result
secure_link_route(struct request *req)
{
	const char		 *rest = req->path + strlen("/secure/");
	const char		 *slash = strchr(rest, '/');
	char			  token[SECURELINK_TOKEN_LEN + 1];
	const char		 *view = slash ? slash + 1 : "";
	bool			  get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
	bool			  post = strcmp(req->method, "POST") == 0;
	struct securelink link;
	const char		 *values[1];
	PGresult		 *res;
	enum MHD_Result	  result;
	int				 *failures = secure_link_failures(req->client_key, false);
	char			  recipient[321];
	bool			  used;
	size_t			  len = slash ? (size_t) (slash - rest) : strlen(rest);

	if (failures && *failures >= SECURE_LINK_CLIENT_FAILURES)
		return secure_link_refuse(req, MHD_HTTP_TOO_MANY_REQUESTS,
								  "too many refused links and codes from your address: wait ten minutes", false);
	if (req->body_too_large)
		return secure_link_refuse(req, MHD_HTTP_CONTENT_TOO_LARGE, "the form is too large", false);
	if (len != SECURELINK_TOKEN_LEN)
		return secure_link_refuse(req, MHD_HTTP_NOT_FOUND,
								  "unknown: this server sent no such link (check that it was copied whole)", true);
	memcpy(token, rest, len);
	token[len] = '\0';
	if (!securelink_from_token(token, &link))
		return secure_link_refuse(req, MHD_HTTP_NOT_FOUND,
								  "unknown: this server sent no such link (check that it was copied whole)", true);
	res = secure_link_query(req, &link,
							"SELECT s->>'state', coalesce(s->>'reason', ''), coalesce(s->>'recipient', ''),"
							" coalesce(s->>'used', '') FROM pepsi.secure_link_status($1::bytea) s",
							1, values, &result);
	if (res == NULL)
		goto done;
	if (strcmp(PQgetvalue(res, 0, 0), "open") != 0)
	{
		bool unknown = strncmp(PQgetvalue(res, 0, 1), "unknown", 7) == 0;

		result = secure_link_refuse(req, unknown ? MHD_HTTP_NOT_FOUND : MHD_HTTP_GONE, PQgetvalue(res, 0, 1), unknown);
		PQclear(res);
		goto done;
	}
	snprintf(recipient, sizeof(recipient), "%s", PQgetvalue(res, 0, 2));
	/*
	 * A link whose opens are spent: its page says so (a GET writes nothing);
	 * the code and session POSTs still reach the extension, which refuses
	 * them and audits the attempt; a session's pages go on.
	 */
	used = *PQgetvalue(res, 0, 3) != '\0';
	if (used && *view == '\0' && get)
	{
		result = secure_link_refuse(req, MHD_HTTP_GONE, PQgetvalue(res, 0, 3), false);
		PQclear(res);
		goto done;
	}
	PQclear(res);
	if (*view == '\0' && get)
		result = secure_link_show(req, &link, recipient);
	else if (strcmp(view, "code") == 0 && post)
		result = secure_link_code(req, &link, recipient, used);
	else if (strcmp(view, "session") == 0 && post)
		result = secure_link_session(req, &link, used);
	else if (strcmp(view, "message") == 0 && get)
		result = secure_link_message(req, &link);
	else if (strncmp(view, "part/", 5) == 0 && get)
		result = secure_link_attachment(req, &link, view + 5);
	else if (strcmp(view, "reply") == 0 && post)
		result = secure_link_reply(req, &link);
	else
		result = secure_link_refuse(req, MHD_HTTP_NOT_FOUND, "no such page of the link (or not with this method)",
									false);
done:
	securelink_wipe(&link);
	return result;
}
