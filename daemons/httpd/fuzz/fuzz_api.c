/*
 * fuzz_api.c: libFuzzer target for the request bodies of pepsi-httpd's
 * JSON API (daemons/httpd/api.c): the ids of a queue action, the reason
 * of a bounce, the scope, section, option and value of a configuration
 * change, and the message id of GET /api/queue/<id>.  Every route then
 * needs the database, which this target has not (httpd_db answers NULL
 * here, as when the database is down, so the request ends in a 503 after
 * its body was read); it includes api.c to reach api_ids, and replaces
 * the replies of reply.c, which need a libmicrohttpd connection.  The
 * login body (session.c) needs the database before it is judged: not
 * reached.  "make fuzz" runs it.
 *
 * Input: one byte choosing the route (retry, hold, release, delete,
 * bounce, config, config/unset, or GET queue/<id>, the id being the body
 * up to a NUL), then the request body.  An ids array api_ids accepts must
 * come out as a PostgreSQL array literal of positive integers: anything
 * else is a bug, and abort() makes libFuzzer keep the input.
 */
#include <stdarg.h>
#include <stdio.h>

#include "../api.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

PGconn *
httpd_db(void)
{
	return NULL;
}

PGconn *
httpd_db_read(void)
{
	return NULL;
}

/* (views.c's routes take no body.) */
enum MHD_Result
views_route(struct request *req, const struct principal *who, bool *handled)
{
	*handled = false;
	return MHD_NO;
}

const char *
db_error(const PGresult *res, PGconn *conn)
{
	return "no database";
}

PGresult *
db_exec(PGconn *conn, const char *sql, int nparams, const char *const *values)
{
	abort(); /* never reached without a connection */
}

enum MHD_Result
reply_error(struct request *req, unsigned status, const char *fmt, ...)
{
	char	message[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	return status >= 400 ? MHD_YES : MHD_NO;
}

enum MHD_Result
reply_json(struct request *req, unsigned status, json_t *body)
{
	free(json_dumps(body, 0));
	json_decref(body);
	return MHD_YES;
}

enum MHD_Result
reply_json_text(struct request *req, unsigned status, const char *json)
{
	return MHD_YES;
}

static void
fuzz_ids(const char *body, size_t len)
{
	json_error_t error;
	json_t		*json = json_loadb(body, len, 0, &error);
	const char	*why = NULL;
	char		*ids;

	if (json == NULL)
		return;
	if ((ids = api_ids(json, &why)) != NULL)
	{
		size_t n = strlen(ids);

		if (n < 3 || ids[0] != '{' || ids[n - 1] != '}' || ids[1] == '0'
			|| strspn(ids + 1, "0123456789,") != n - 2)
			abort();
		free(ids);
	}
	else if (why == NULL)
		abort();
	json_decref(json);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const paths[] = {"/api/queue/retry", "/api/queue/hold", "/api/queue/release",
										"/api/queue/delete", "/api/queue/bounce", "/api/config",
										"/api/config/unset"};
	struct principal		 who = {.kind = PRINCIPAL_SESSION, .name = "admin"};
	struct request			 req;
	char					*path = NULL;

	if (size < 1)
		return 0;
	memset(&req, 0, sizeof(req));
	req.method = "POST";
	buf_append(&req.body, (const char *) data + 1, size - 1);
	if (data[0] % 8 < 7)
		req.path = paths[data[0] % 8];
	else
	{
		path = xasprintf("/api/queue/%.*s", (int) strnlen((const char *) data + 1, size - 1),
						 (const char *) data + 1);
		req.method = "GET";
		req.path = path;
	}
	if (data[0] % 8 < 5)
		fuzz_ids((const char *) data + 1, size - 1);
	api_route(&req, &who);
	buf_free(&req.body);
	free(path);
	return 0;
}
