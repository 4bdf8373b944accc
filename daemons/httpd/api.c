/*
 * api.c: the JSON API over the operator functions of the extension
 * (docs/pepsi-admin.7.md): the queue's summary and shape, a page of the
 * queue, one message, the actions retry/hold/release/delete/bounce, and
 * the configuration overlay.
 *
 * The SQL functions do the work and the checking; this file maps HTTP
 * onto them.  The server builds the JSON of a listing (json_agg), so no
 * value is reformatted here.  An action runs in a transaction that names
 * the administrator (pepsi.admin_account), so that pepsi.event_log records
 * who acted, not only that pepsi-httpd did.  The reads (GET) go through
 * httpd_db_read(), which may be a standby ([httpd] READ_CONNINFO); the
 * actions always through the primary's connection.
 *
 * A viewer (an account's or a token's role) may read, not act: every
 * action goes through api_act, which refuses it with 403.  The database
 * refuses it as well (pepsi.admin_role_check, from the event log write
 * every action makes), so a route added without api_act cannot let a
 * viewer change anything either.
 */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "httpd.h"
#include "runtime/db.h"

/* The most ids one action takes: a bigger selection is a job for SQL. */
#define API_MAX_IDS 10000

static const char *
api_param(struct request *req, const char *name)
{
	const char *value = MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, name);

	return value && value[0] ? value : NULL;
}

/*
 * The HTTP status for a statement the server refused: what the caller got
 * wrong is 4xx with the server's message (which names the problem), the
 * rest 5xx.
 */
static enum MHD_Result
api_db_error(struct request *req, PGresult *res, PGconn *conn)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *message = db_error(res, conn);
	unsigned	status = MHD_HTTP_INTERNAL_SERVER_ERROR;

	if (state == NULL)
		status = MHD_HTTP_SERVICE_UNAVAILABLE;
	else if (strcmp(state, "42501") == 0)
		status = MHD_HTTP_FORBIDDEN;
	else if (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0
			 || strcmp(state, "P0001") == 0 || strcmp(state, "P0002") == 0
			 || strcmp(state, "42704") == 0 || strcmp(state, "42P01") == 0
			 || strcmp(state, "55P02") == 0) /* an option the database may not set */
		status = MHD_HTTP_BAD_REQUEST;
	return reply_error(req, status, "%s", message);
}

static enum MHD_Result
api_json_on(PGconn *conn, struct request *req, const char *sql, int nparams, const char *const *values,
			bool not_found_on_null)
{
	PGresult	   *res;
	enum MHD_Result result;

	if (conn == NULL)
		return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database is not answering");
	res = db_exec(conn, sql, nparams, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		result = api_db_error(req, res, conn);
	else if (PQntuples(res) == 0 || PQgetisnull(res, 0, 0))
		result = not_found_on_null ? reply_error(req, MHD_HTTP_NOT_FOUND, "no such message")
								   : reply_json_text(req, MHD_HTTP_OK, "[]");
	else
		result = reply_json_text(req, MHD_HTTP_OK, PQgetvalue(res, 0, 0));
	PQclear(res);
	return result;
}

enum MHD_Result
api_json_query(struct request *req, const char *sql, int nparams, const char *const *values,
			   bool not_found_on_null)
{
	return api_json_on(httpd_db(), req, sql, nparams, values, not_found_on_null);
}

enum MHD_Result
api_json_read(struct request *req, const char *sql, int nparams, const char *const *values,
			  bool not_found_on_null)
{
	return api_json_on(httpd_db_read(), req, sql, nparams, values, not_found_on_null);
}

/*
 * One administrative call in a transaction that names who acts.  Returns
 * the call's first value (NULL on failure, with the error sent).
 */
static PGresult *
api_act(struct request *req, const struct principal *who, const char *sql, int nparams,
		const char *const *values, enum MHD_Result *result)
{
	PGconn	   *conn = httpd_db();
	PGresult   *res;
	const char *account[1] = {who->name};

	if (who->viewer)
	{
		*result = reply_error(req, MHD_HTTP_FORBIDDEN, "%s \"%s\" is a viewer: it may read, not act",
							  who->kind == PRINCIPAL_TOKEN ? "API token" : "account",
							  who->kind == PRINCIPAL_TOKEN ? who->name + 6 : who->name);
		return NULL;
	}
	if (conn == NULL)
	{
		*result = reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database is not answering");
		return NULL;
	}
	PQclear(PQexec(conn, "BEGIN"));
	res = PQexecParams(conn, "SELECT set_config('pepsi.admin_account', $1, true)", 1, NULL, account,
					   NULL, NULL, 0);
	if (PQresultStatus(res) == PGRES_TUPLES_OK)
	{
		PQclear(res);
		res = PQexecParams(conn, sql, nparams, NULL, values, NULL, NULL, 0);
	}
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		*result = api_db_error(req, res, conn);
		PQclear(res);
		PQclear(PQexec(conn, "ROLLBACK"));
		return NULL;
	}
	{
		PGresult *commit = PQexec(conn, "COMMIT");

		if (PQresultStatus(commit) != PGRES_COMMAND_OK)
		{
			*result = api_db_error(req, commit, conn);
			PQclear(commit);
			PQclear(res);
			return NULL;
		}
		PQclear(commit);
	}
	return res;
}

/* {"ids": [1, 2, ...]} as a PostgreSQL array literal, or NULL with why. */
static char *
api_ids(json_t *body, const char **why)
{
	json_t	  *ids = json_object_get(body, "ids");
	struct buf literal = BUF_INIT;
	size_t	   i;
	json_t	  *id;

	if (!json_is_array(ids) || json_array_size(ids) == 0)
	{
		*why = "expected \"ids\": a non-empty array of message ids";
		return NULL;
	}
	if (json_array_size(ids) > API_MAX_IDS)
	{
		*why = "too many ids in one request (at most 10000)";
		return NULL;
	}
	buf_append_char(&literal, '{');
	json_array_foreach (ids, i, id)
	{
		if (!json_is_integer(id) || json_integer_value(id) <= 0)
		{
			buf_free(&literal);
			*why = "every id must be a positive whole number";
			return NULL;
		}
		buf_printf(&literal, "%s%" JSON_INTEGER_FORMAT, i ? "," : "", json_integer_value(id));
	}
	buf_append_char(&literal, '}');
	return literal.data;
}

static enum MHD_Result
api_queue_action(struct request *req, const struct principal *who, const char *action)
{
	json_error_t	error;
	json_t		   *body = json_loadb(req->body.data, req->body.len, 0, &error);
	const char	   *why = NULL;
	char		   *ids;
	PGresult	   *res;
	enum MHD_Result result = MHD_NO;

	if (body == NULL)
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "bad JSON: %s", error.text);
	if ((ids = api_ids(body, &why)) == NULL)
	{
		json_decref(body);
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "%s", why);
	}
	if (strcmp(action, "bounce") == 0)
	{
		json_t	   *reason = json_object_get(body, "reason");
		const char *values[2] = {ids, json_is_string(reason) ? json_string_value(reason)
															 : "deleted by the postmaster"};

		res = api_act(req, who, "SELECT pepsi.queue_bounce($1::int8[], $2)", 2, values, &result);
	}
	else
	{
		char	   *sql = xasprintf("SELECT pepsi.queue_%s($1::int8[])", action);
		const char *values[1] = {ids};

		res = api_act(req, who, sql, 1, values, &result);
		free(sql);
	}
	if (res)
	{
		log_info("%s: %s %s", who->name, action, ids);
		result = reply_json(req, MHD_HTTP_OK,
							json_pack("{sssi}", "action", action, "count", atoi(PQgetvalue(res, 0, 0))));
		PQclear(res);
	}
	free(ids);
	json_decref(body);
	return result;
}

static enum MHD_Result
api_config_change(struct request *req, const struct principal *who, bool unset)
{
	json_error_t	error;
	json_t		   *body = json_loadb(req->body.data, req->body.len, 0, &error);
	const char	   *scope = "global", *section = NULL, *option = NULL, *value = NULL;
	PGresult	   *res;
	enum MHD_Result result = MHD_NO;

	if (body == NULL)
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "bad JSON: %s", error.text);
	if (json_unpack(body, unset ? "{s?s, s:s, s:s}" : "{s?s, s:s, s:s, s:s}", "scope", &scope,
					"section", &section, "option", &option, "value", &value)
		!= 0)
	{
		json_decref(body);
		return reply_error(req, MHD_HTTP_BAD_REQUEST,
						   unset ? "expected {\"scope\", \"section\", \"option\"}"
								 : "expected {\"scope\", \"section\", \"option\", \"value\"} (strings)");
	}
	{
		const char *values[4] = {scope, section, option, value};

		res = unset ? api_act(req, who, "SELECT pepsi.config_unset($1, $2, $3)", 3, values, &result)
					: api_act(req, who, "SELECT pepsi.config_set($1, $2, $3, $4)", 4, values, &result);
	}
	if (res)
	{
		log_info("%s: config %s [%s] %s at %s", who->name, unset ? "unset" : "set", section, option, scope);
		result = reply_json(req, MHD_HTTP_OK,
							json_pack("{s:s, s:s, s:s, s:s?}", "scope", scope, "section", section, "option", option,
									  "previous", PQgetisnull(res, 0, 0) ? NULL : PQgetvalue(res, 0, 0)));
		PQclear(res);
	}
	json_decref(body);
	return result;
}

static enum MHD_Result
api_queue_message(struct request *req, const char *id_text)
{
	char	   *end;
	long long	id = strtoll(id_text, &end, 10);
	const char *values[1] = {id_text};

	if (*id_text == '\0' || *end != '\0' || id <= 0)
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "\"%.40s\" is not a message id", id_text);
	/*
	 * Headers may hold any bytes: base64, decoded by the page as UTF-8.  A
	 * message no longer queued (delivered, bounced, deleted) that
	 * pepsi.mail_log remembers is its history alone, "gone".
	 */
	return api_json_read(req, "SELECT coalesce((SELECT row_to_json(m) FROM (SELECT id, coalesce(state ->> 'queue_id', id::text) AS queue_id, stage, status, held,"
							  " received_at, retry_at, mail_from, rcpt_to, sender_key, state,"
							  " translate(encode(headers, 'base64'), E'\\n', '') AS headers_base64, body_size,"
							  " (SELECT json_agg(l ORDER BY l.id) FROM pepsi.mail_log_read($1::int8) l) AS log"
							  " FROM pepsi.queue_message($1::int8)) m),"
							  " (SELECT json_build_object('id', $1::int8, 'gone', true, 'log', json_agg(l ORDER BY l.id))"
							  " FROM pepsi.mail_log_read($1::int8) l HAVING count(*) > 0))",
						 1, values, true);
}

enum MHD_Result
api_route(struct request *req, const struct principal *who)
{
	const char	   *path = req->path + 5; /* after "/api/" */
	bool			get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
	bool			post = strcmp(req->method, "POST") == 0;
	bool			handled;
	enum MHD_Result result = views_route(req, who, &handled);

	if (handled)
		return result;

	/*
	 * The summary is /metrics' gauges (live for a small queue, else the
	 * maintenance worker's snapshot, as_of saying when): queue_summary
	 * counts every row, a quarter of a second for a million.
	 */
	if (strcmp(path, "summary") == 0 && get)
		return api_json_read(req, "SELECT json_agg(g) FROM pepsi.queue_gauges() g", 0, NULL, false);
	if (strcmp(path, "shape") == 0 && get)
		return api_json_read(req, "SELECT json_agg(s) FROM pepsi.queue_shape s", 0, NULL, false);
	if (strcmp(path, "stages") == 0 && get)
		return api_json_read(req, "SELECT json_agg(s ORDER BY s.stage) FROM (SELECT stage, messages,"
								  " extract(epoch FROM processing_time) AS processing_seconds, kills, timeouts,"
								  " crashes, fused_hops, updated_at FROM pepsi.stage_stats) s",
							 0, NULL, false);
	if (strcmp(path, "queue") == 0 && get)
	{
		const char *values[5] = {api_param(req, "stage"), api_param(req, "status"),
								 api_param(req, "search"), api_param(req, "limit"), api_param(req, "before")};

		return api_json_read(req, "SELECT json_agg(q) FROM pepsi.queue_list($1, $2::pepsi.status, $3,"
								  " coalesce($4::int, 100), $5::int8) q",
							 5, values, false);
	}
	if (strncmp(path, "queue/", 6) == 0 && get)
		return api_queue_message(req, path + 6);
	if (strncmp(path, "queue/", 6) == 0 && post)
	{
		static const char *const actions[] = {"retry", "hold", "release", "delete", "bounce", NULL};

		for (int i = 0; actions[i]; i++)
			if (strcmp(path + 6, actions[i]) == 0)
				return api_queue_action(req, who, actions[i]);
		return reply_error(req, MHD_HTTP_NOT_FOUND, "no such action: %.40s", path + 6);
	}
	if (strcmp(path, "config") == 0 && get)
	{
		const char *values[3] = {api_param(req, "scope") ? api_param(req, "scope") : "global",
								 api_param(req, "section"), api_param(req, "option")};

		if (values[1] == NULL || values[2] == NULL)
			return reply_error(req, MHD_HTTP_BAD_REQUEST, "section and option are required");
		return api_json_read(req, "SELECT json_build_object('scope', $1::text, 'section', $2::text,"
								  " 'option', $3::text, 'value', pepsi.config_get($1, $2, $3))",
							 3, values, false);
	}
	if (strcmp(path, "config") == 0 && post)
		return api_config_change(req, who, false);
	if (strcmp(path, "config/unset") == 0 && post)
		return api_config_change(req, who, true);

	if (strcmp(path, "summary") == 0 || strcmp(path, "shape") == 0 || strcmp(path, "stages") == 0
		|| strcmp(path, "queue") == 0 || strncmp(path, "queue/", 6) == 0 || strcmp(path, "config") == 0
		|| strcmp(path, "config/unset") == 0)
		return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "%s does not take %s", req->path, req->method);
	return reply_error(req, MHD_HTTP_NOT_FOUND, "no such API: %.80s", req->path);
}
