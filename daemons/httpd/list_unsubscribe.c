/*
 * list_unsubscribe.c: RFC 8058 one-click unsubscribe for the mailing
 * lists (pepsi-stage-list(8)): the List-Unsubscribe URL of a subscriber's
 * copy is /list/unsubscribe?l=LIST&a=ADDRESS&t=TOKEN.  A POST (the mail
 * client's, body "List-Unsubscribe=One-Click") unsubscribes at once; a
 * GET, which link scanners and prefetchers send, only shows a button that
 * POSTs, and changes nothing (RFC 8058 3.2).  The token is the list's
 * keyed hash of the address (pepsi.list_unsubscribe_one_click checks it).
 */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "httpd.h"
#include "runtime/db.h"

static const char *
list_argument(struct request *req, const char *name)
{
	return MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, name);
}

/* Only what a URL of ours holds: no markup can come back out of the page. */
static bool
list_argument_plain(const char *value)
{
	return value && *value && strpbrk(value, "<>\"'&\\ \r\n") == NULL && strlen(value) < 320;
}

enum MHD_Result
list_unsubscribe_route(struct request *req)
{
	const char	   *list = list_argument(req, "l");
	const char	   *address = list_argument(req, "a");
	const char	   *token = list_argument(req, "t");
	PGconn		   *conn;
	PGresult	   *res;
	const char	   *values[3] = {list, address, token};
	enum MHD_Result result;

	if (!list_argument_plain(list) || strspn(list, "0123456789") != strlen(list) || !list_argument_plain(address)
		|| !list_argument_plain(token))
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "the link lacks its list (l), address (a) or token (t)");
	if (strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0)
	{
		struct buf page = BUF_INIT;

		buf_printf(&page,
				   "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Unsubscribe</title></head><body>\n"
				   "<form method=\"post\" action=\"/list/unsubscribe?l=%s&amp;a=%s&amp;t=%s\">\n"
				   "<input type=\"hidden\" name=\"List-Unsubscribe\" value=\"One-Click\">\n"
				   "<p>Unsubscribe %s from the list?</p><button type=\"submit\">Unsubscribe</button>\n"
				   "</form></body></html>\n",
				   list, address, token, address);
		result = reply_bytes(req, MHD_HTTP_OK, "text/html; charset=utf-8", page.data, page.len, true);
		buf_free(&page);
		return result;
	}
	if (strcmp(req->method, "POST") != 0)
		return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/list/unsubscribe takes POST (GET shows a button)");
	if ((conn = httpd_db()) == NULL)
		return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database is not answering");
	res = db_exec(conn, "SELECT pepsi.list_unsubscribe_one_click($1::bigint, $2, $3)", 3, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("%s: one-click unsubscribe of <%s> from list %s: %s", req->client, address, list,
				  PQresultErrorMessage(res));
		result = reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database refused the request");
	}
	else if (!PQgetisnull(res, 0, 0))
	{
		log_info("%s: one-click unsubscribe of <%s> from list %s refused: %s", req->client, address, list,
				 PQgetvalue(res, 0, 0));
		result = reply_error(req, MHD_HTTP_FORBIDDEN, "%s", PQgetvalue(res, 0, 0));
	}
	else
	{
		static const char done[] = "You are unsubscribed.\n";

		log_info("%s: one-click unsubscribe of <%s> from list %s", req->client, address, list);
		result = reply_bytes(req, MHD_HTTP_OK, "text/plain; charset=utf-8", done, sizeof(done) - 1, false);
	}
	PQclear(res);
	return result;
}
