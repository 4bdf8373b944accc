/*
 * archive_pages.c: a mailing list's web archive (pepsi-archive(8)) under
 * /archive/LIST/: the months, the threads a month started, a thread, a
 * message, an attachment, and search.  Server-built HTML with no script
 * (the strict CSP of every page); every text shown is escaped, addresses
 * come obfuscated by the list's policy (the extension's archive_*
 * functions), and an attachment is only ever a download: its stored type,
 * Content-Disposition: attachment, nosniff and a sandboxing CSP, so an
 * HTML attachment never runs as a page of this server.  A private list's
 * pages need a member's login (archive_login.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "archive.h"
#include "base/buf.h"
#include "base/log.h"
#include "runtime/db.h"

enum MHD_Result
archive_page(struct request *req, unsigned status, const struct archive_request *ar, const char *title,
			 const struct buf *content)
{
	struct buf		page = BUF_INIT;
	enum MHD_Result result;

	buf_append_str(&page, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
	reply_html_escape(&page, title);
	buf_append_str(&page, "</title></head><body>\n<nav><a href=\"/archive/");
	reply_html_escape(&page, ar->address);
	buf_append_str(&page, "/\">");
	reply_html_escape(&page, ar->address);
	buf_append_str(&page, "</a></nav>\n<h1>");
	reply_html_escape(&page, title);
	buf_append_str(&page, "</h1>\n");
	if (content->len)
		buf_append(&page, content->data, content->len);
	buf_append_str(&page, "</body></html>\n");
	result = reply_form_page(req, status, page.data);
	buf_free(&page);
	return result;
}

/* A statement's rows, or NULL after replying 503 (*result set). */
PGresult *
archive_query(struct request *req, const char *sql, int nparams, const char *const *values, enum MHD_Result *result)
{
	PGconn	 *conn = httpd_db();
	PGresult *res;

	if (conn == NULL)
	{
		*result = reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database is not answering");
		return NULL;
	}
	res = db_exec(conn, sql, nparams, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("%s: %s: %s", req->client, req->path, PQresultErrorMessage(res));
		PQclear(res);
		*result = reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database refused the request");
		return NULL;
	}
	return res;
}

/* A link: <a href="/archive/LIST/PATH">TEXT</a>. */
void
archive_link(struct buf *out, const struct archive_request *ar, const char *path, const char *text)
{
	buf_append_str(out, "<a href=\"/archive/");
	reply_html_escape(out, ar->address);
	buf_append_str(out, "/");
	reply_html_escape(out, path);
	buf_append_str(out, "\">");
	reply_html_escape(out, text && *text ? text : "(no subject)");
	buf_append_str(out, "</a>");
}

static void
archive_search_form(struct buf *out, const struct archive_request *ar, const char *query)
{
	buf_append_str(out, "<form method=\"get\" action=\"/archive/");
	reply_html_escape(out, ar->address);
	buf_append_str(out, "/search\"><input type=\"search\" name=\"q\" id=\"q\" value=\"");
	reply_html_escape(out, query ? query : "");
	buf_append_str(out, "\"> <button type=\"submit\" id=\"search\">Search</button></form>\n");
}

static enum MHD_Result
archive_months(struct request *req, const struct archive_request *ar)
{
	const char	   *values[1] = {ar->list_id};
	enum MHD_Result result;
	PGresult	   *res = archive_query(req,
										"SELECT to_char(month, 'YYYY-MM'), to_char(month, 'FMMonth YYYY'), messages"
											  " FROM pepsi.archive_months($1::bigint)",
										1, values, &result);
	struct buf		out = BUF_INIT;

	if (res == NULL)
		return result;
	archive_search_form(&out, ar, NULL);
	buf_append_str(&out, "<ul id=\"months\">\n");
	for (int i = 0; i < PQntuples(res); i++)
	{
		char path[32];

		snprintf(path, sizeof(path), "month/%s", PQgetvalue(res, i, 0));
		buf_append_str(&out, "<li>");
		archive_link(&out, ar, path, PQgetvalue(res, i, 1));
		buf_printf(&out, " (%s messages)</li>\n", PQgetvalue(res, i, 2));
	}
	buf_append_str(&out, "</ul>\n");
	PQclear(res);
	result = archive_page(req, MHD_HTTP_OK, ar, "The archive", &out);
	buf_free(&out);
	return result;
}

static enum MHD_Result
archive_month(struct request *req, const struct archive_request *ar)
{
	char			month[16];
	const char	   *values[2] = {ar->list_id, month};
	enum MHD_Result result;
	PGresult	   *res;
	struct buf		out = BUF_INIT;

	if (strlen(ar->arg) != 7 || strspn(ar->arg, "0123456789") != 4 || ar->arg[4] != '-'
		|| strspn(ar->arg + 5, "0123456789") != 2)
		return reply_error(req, MHD_HTTP_NOT_FOUND, "a month is YYYY-MM");
	snprintf(month, sizeof(month), "%s-01", ar->arg);
	res = archive_query(req,
						"SELECT id, subject, message_count, to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')"
						" FROM pepsi.archive_threads($1::bigint, $2::date)",
						2, values, &result);
	if (res == NULL)
		return result;
	buf_append_str(&out, "<ul id=\"threads\">\n");
	for (int i = 0; i < PQntuples(res); i++)
	{
		char path[48];

		snprintf(path, sizeof(path), "thread/%s", PQgetvalue(res, i, 0));
		buf_append_str(&out, "<li>");
		archive_link(&out, ar, path, PQgetvalue(res, i, 1));
		buf_printf(&out, " (%s messages, %s)</li>\n", PQgetvalue(res, i, 2), PQgetvalue(res, i, 3));
	}
	buf_append_str(&out, "</ul>\n");
	PQclear(res);
	result = archive_page(req, MHD_HTTP_OK, ar, ar->arg, &out);
	buf_free(&out);
	return result;
}

static bool
archive_is_number(const char *text)
{
	return *text && strlen(text) < 19 && strspn(text, "0123456789") == strlen(text);
}

/* A thread as nested lists, in tree order (each row's depth). */
static enum MHD_Result
archive_thread(struct request *req, const struct archive_request *ar)
{
	const char	   *values[2] = {ar->list_id, ar->arg};
	enum MHD_Result result;
	PGresult	   *res;
	struct buf		out = BUF_INIT;
	int				open = 0;

	if (!archive_is_number(ar->arg))
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no such thread");
	res = archive_query(req,
						"SELECT id, depth, subject, from_name, to_char(sent_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')"
						" FROM pepsi.archive_thread_messages($1::bigint, $2::bigint)",
						2, values, &result);
	if (res == NULL)
		return result;
	if (PQntuples(res) == 0)
	{
		PQclear(res);
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no such thread");
	}
	buf_append_str(&out, "<div id=\"thread\">\n");
	for (int i = 0; i < PQntuples(res); i++)
	{
		int	 depth = atoi(PQgetvalue(res, i, 1)) + 1;
		char path[48];

		for (; open < depth; open++)
			buf_append_str(&out, "<ul>\n");
		for (; open > depth; open--)
			buf_append_str(&out, "</ul>\n");
		snprintf(path, sizeof(path), "message/%s", PQgetvalue(res, i, 0));
		buf_append_str(&out, "<li>");
		archive_link(&out, ar, path, PQgetvalue(res, i, 2));
		buf_append_str(&out, " — ");
		reply_html_escape(&out, PQgetvalue(res, i, 3));
		buf_append_str(&out, ", ");
		reply_html_escape(&out, PQgetvalue(res, i, 4));
		buf_append_str(&out, "</li>\n");
	}
	for (; open > 0; open--)
		buf_append_str(&out, "</ul>\n");
	buf_append_str(&out, "</div>\n");
	result = archive_page(req, MHD_HTTP_OK, ar, PQgetvalue(res, 0, 2), &out);
	PQclear(res);
	buf_free(&out);
	return result;
}

static enum MHD_Result
archive_message(struct request *req, const struct archive_request *ar)
{
	const char	   *values[2] = {ar->list_id, ar->arg};
	enum MHD_Result result;
	PGresult	   *res;
	struct buf		out = BUF_INIT;

	if (!archive_is_number(ar->arg))
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no such message");
	res = archive_query(req,
						"SELECT m->>'subject', m->>'from', m->>'date', m->>'text', m->>'thread',"
						" a->>'position', a->>'filename', a->>'content_type', a->>'size', a->>'withheld'"
						" FROM pepsi.archive_message_show($1::bigint, $2::bigint) AS m"
						" LEFT JOIN LATERAL jsonb_array_elements(m->'attachments') AS a ON true"
						" WHERE m IS NOT NULL",
						2, values, &result);
	if (res == NULL)
		return result;
	if (PQntuples(res) == 0)
	{
		PQclear(res);
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no such message");
	}
	buf_append_str(&out, "<dl id=\"headers\"><dt>From</dt><dd id=\"from\">");
	reply_html_escape(&out, PQgetvalue(res, 0, 1));
	buf_append_str(&out, "</dd><dt>Date</dt><dd>");
	reply_html_escape(&out, PQgetvalue(res, 0, 2));
	buf_append_str(&out, "</dd><dt>Thread</dt><dd>");
	{
		char path[48];

		snprintf(path, sizeof(path), "thread/%s", PQgetvalue(res, 0, 4));
		archive_link(&out, ar, path, "the whole thread");
	}
	buf_append_str(&out, "</dd></dl>\n<pre id=\"text\">");
	reply_html_escape(&out, PQgetvalue(res, 0, 3));
	buf_append_str(&out, "</pre>\n<ul id=\"attachments\">\n");
	for (int i = 0; i < PQntuples(res) && !PQgetisnull(res, i, 5); i++)
	{
		char path[64];

		snprintf(path, sizeof(path), "attachment/%s/%s", ar->arg, PQgetvalue(res, i, 5));
		buf_append_str(&out, "<li>");
		if (PQgetisnull(res, i, 9))
			archive_link(&out, ar, path, PQgetisnull(res, i, 6) ? "attachment" : PQgetvalue(res, i, 6));
		else
			reply_html_escape(&out, PQgetisnull(res, i, 6) ? "attachment" : PQgetvalue(res, i, 6));
		buf_append_str(&out, " (");
		reply_html_escape(&out, PQgetvalue(res, i, 7));
		buf_printf(&out, ", %s bytes", PQgetvalue(res, i, 8));
		if (!PQgetisnull(res, i, 9))
		{
			buf_append_str(&out, "; not kept: ");
			reply_html_escape(&out, PQgetvalue(res, i, 9));
		}
		buf_append_str(&out, ")</li>\n");
	}
	buf_append_str(&out, "</ul>\n");
	result = archive_page(req, MHD_HTTP_OK, ar, PQgetvalue(res, 0, 0), &out);
	PQclear(res);
	buf_free(&out);
	return result;
}

/* A type as a token/token, else application/octet-stream: nothing else goes into the header. */
static const char *
archive_safe_type(const char *type)
{
	size_t slash = strcspn(type, "/");

	if (type[slash] != '/' || slash == 0 || strlen(type) > 100
		|| strspn(type, "abcdefghijklmnopqrstuvwxyz0123456789.+-/") != strlen(type) || strchr(type + slash + 1, '/'))
		return "application/octet-stream";
	return type;
}

/* An attachment, always as a download of its own type (never rendered as a page of ours). */
static enum MHD_Result
archive_attachment(struct request *req, const struct archive_request *ar)
{
	char				 message[24], position[24];
	const char			*slash = strchr(ar->arg, '/');
	const char			*values[3] = {ar->list_id, message, position};
	enum MHD_Result		 result;
	PGresult			*res;
	struct MHD_Response *response;
	struct buf			 disposition = BUF_INIT;

	if (slash == NULL || (size_t) (slash - ar->arg) >= sizeof(message) || !archive_is_number(slash + 1))
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no such attachment");
	snprintf(message, sizeof(message), "%.*s", (int) (slash - ar->arg), ar->arg);
	snprintf(position, sizeof(position), "%s", slash + 1);
	if (!archive_is_number(message) || strlen(position) > 9)
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no such attachment");
	res = archive_query(req,
						"SELECT filename, content_type, content"
						" FROM pepsi.archive_attachment_get($1::bigint, $2::bigint, $3::integer)",
						3, values, &result);
	if (res == NULL)
		return result;
	if (PQntuples(res) == 0)
	{
		PQclear(res);
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no such attachment (or it was not kept)");
	}
	{
		size_t		   len;
		unsigned char *bytes = PQunescapeBytea((const unsigned char *) PQgetvalue(res, 0, 2), &len);

		response = bytes ? MHD_create_response_from_buffer(len, bytes, MHD_RESPMEM_MUST_COPY) : NULL;
		PQfreemem(bytes);
	}
	if (response == NULL)
	{
		PQclear(res);
		return MHD_NO;
	}
	buf_append_str(&disposition, "attachment; filename=\"");
	for (const char *p = PQgetisnull(res, 0, 0) ? "attachment" : PQgetvalue(res, 0, 0); *p; p++)
		buf_append_char(&disposition, (*p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\') ? *p : '_');
	buf_append_str(&disposition, "\"");
	/* reply_add_security_headers' but a CSP that sandboxes whatever a browser makes of it */
	MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
	MHD_add_response_header(response, "X-Frame-Options", "DENY");
	MHD_add_response_header(response, "Referrer-Policy", "no-referrer");
	MHD_add_response_header(response, "Cache-Control", "no-store");
	MHD_add_response_header(response, "Content-Type", archive_safe_type(PQgetvalue(res, 0, 1)));
	MHD_add_response_header(response, "Content-Disposition", disposition.data);
	MHD_add_response_header(response, "Content-Security-Policy", "sandbox; default-src 'none'");
	result = MHD_queue_response(req->connection, MHD_HTTP_OK, response);
	MHD_destroy_response(response);
	buf_free(&disposition);
	PQclear(res);
	return result;
}

static enum MHD_Result
archive_search(struct request *req, const struct archive_request *ar)
{
	const char	   *query = MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, "q");
	const char	   *values[2] = {ar->list_id, query};
	enum MHD_Result result;
	PGresult	   *res;
	struct buf		out = BUF_INIT;

	archive_search_form(&out, ar, query);
	if (query == NULL || *query == '\0' || strlen(query) > 500)
	{
		result = archive_page(req, MHD_HTTP_OK, ar, "Search", &out);
		buf_free(&out);
		return result;
	}
	/* The total (archive_search_count), then the newest 100 beside it: a
	 * row with the total and no message when nothing matches. */
	res = archive_query(req,
						"SELECT s.id, s.subject, s.from_name, to_char(s.sent_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),"
						" s.excerpt, c.total"
						" FROM pepsi.archive_search_count($1::bigint, $2) AS c(total)"
						" LEFT JOIN pepsi.archive_search($1::bigint, $2, 100) AS s ON true ORDER BY s.sent_at DESC, s.id DESC",
						2, values, &result);
	if (res == NULL)
	{
		buf_free(&out);
		return result;
	}
	buf_printf(&out, "<p id=\"found\">%s found</p>\n<ol id=\"results\">\n",
			   PQntuples(res) > 0 ? PQgetvalue(res, 0, 5) : "0");
	for (int i = 0; i < PQntuples(res); i++)
	{
		char path[48];

		if (PQgetisnull(res, i, 0))
			continue;

		snprintf(path, sizeof(path), "message/%s", PQgetvalue(res, i, 0));
		buf_append_str(&out, "<li>");
		archive_link(&out, ar, path, PQgetvalue(res, i, 1));
		buf_append_str(&out, " — ");
		reply_html_escape(&out, PQgetvalue(res, i, 2));
		buf_append_str(&out, ", ");
		reply_html_escape(&out, PQgetvalue(res, i, 3));
		buf_append_str(&out, "<blockquote>");
		reply_html_escape(&out, PQgetvalue(res, i, 4));
		buf_append_str(&out, "</blockquote></li>\n");
	}
	buf_append_str(&out, "</ol>\n");
	PQclear(res);
	result = archive_page(req, MHD_HTTP_OK, ar, "Search", &out);
	buf_free(&out);
	return result;
}

enum MHD_Result
archive_route(struct request *req)
{
	struct archive_request ar = {0};
	const char			  *rest = req->path + strlen("/archive/");
	size_t				   len = strcspn(rest, "/");
	const char			  *values[1] = {ar.address};
	enum MHD_Result		   result;
	PGresult			  *res;

	if (len == 0 || len > ARCHIVE_ADDRESS_MAX || rest[len] != '/')
		return reply_error(req, MHD_HTTP_NOT_FOUND, "the archive's pages are /archive/LIST/");
	memcpy(ar.address, rest, len);
	res = archive_query(req, "SELECT a->>'id', a->>'private' FROM pepsi.archive_list($1) AS a", 1, values, &result);
	if (res == NULL)
		return result;
	if (PQgetisnull(res, 0, 0))
	{
		PQclear(res);
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no archive of %s", ar.address);
	}
	snprintf(ar.list_id, sizeof(ar.list_id), "%s", PQgetvalue(res, 0, 0));
	ar.private_list = strcmp(PQgetvalue(res, 0, 1), "true") == 0;
	PQclear(res);
	rest += len + 1;
	if (strcmp(rest, "login") == 0)
		return archive_login_route(req, &ar);
	archive_reader_identify(req, &ar);
	if (strcmp(rest, "members") == 0 || strcmp(rest, "moderation") == 0)
		return archive_owner_route(req, &ar, rest);
	if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0)
		return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "the archive takes GET");
	if (ar.private_list && ar.reader[0] == '\0')
	{
		struct buf out = BUF_INIT;

		buf_append_str(&out, "<p id=\"private\">This list's archive is for its members. ");
		archive_link(&out, &ar, "login", "Log in");
		buf_append_str(&out, " with a link mailed to you.</p>\n");
		result = archive_page(req, MHD_HTTP_FORBIDDEN, &ar, "Members only", &out);
		buf_free(&out);
		return result;
	}
	if (*rest == '\0')
		return archive_months(req, &ar);
	if (strncmp(rest, "month/", 6) == 0)
		return ar.arg = rest + 6, archive_month(req, &ar);
	if (strncmp(rest, "thread/", 7) == 0)
		return ar.arg = rest + 7, archive_thread(req, &ar);
	if (strncmp(rest, "message/", 8) == 0)
		return ar.arg = rest + 8, archive_message(req, &ar);
	if (strncmp(rest, "attachment/", 11) == 0)
		return ar.arg = rest + 11, archive_attachment(req, &ar);
	if (strcmp(rest, "search") == 0)
		return archive_search(req, &ar);
	return reply_error(req, MHD_HTTP_NOT_FOUND, "no such page of the archive");
}
