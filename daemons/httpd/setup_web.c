/*
 * setup_web.c: the first-run setup page (docs/pepsi-httpd.8.md, "The
 * setup page").
 *
 *   GET /setup?token=T    takes the one-time link of pepsi-setup init --web
 *                         (common/setup/setup_link.h) and answers with a
 *                         setup session's cookie and the page
 *   GET /setup            the page (www/setup.html, www/setup.js)
 *   GET /api/setup        the interview's questions (common/setup/setup_model.h)
 *                         and the session's CSRF token
 *   POST /api/setup       the answers: checked by the model, then the plan's
 *                         tasks enqueued in pepsi.setup_task, once
 *   GET /api/setup/log    those tasks, their status and setup_task_log lines
 *
 * pepsi-httpd never acts here: it writes rows through the configuration
 * connection ([database] CONFIG_CONNINFO, a member of pepsi_config: its own
 * role may only read them), and pepsi-setup apply, as root, carries them
 * out.  The setup session lives in this process only (there is at most
 * one: a new link replaces it); a restart ends it, and pepsi-setup init
 * --web makes a new link.  Changes need the session's X-CSRF-Token and a
 * same-origin request, as the administrators' sessions do (session.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "httpd.h"
#include "runtime/db.h"
#include "setup/setup_link.h"
#include "setup/setup_model.h"
#include "setup/setup_task.h"

#define SETUP_COOKIE "pepsi_setup"

static struct
{
	bool		  active;
	unsigned char cookie_digest[SHA256_DIGEST_LENGTH];
	char		  csrf[65];
	time_t		  expires;
	char		 *root; /* the layout the link was made for */
	bool		  as_root;
	json_t		 *tasks; /* the ids enqueued; NULL until the answers are */
} setup_session;

static enum MHD_Result
setup_text(struct request *req, unsigned status, const char *message)
{
	int len = (int) strcspn(message, "\n");

	if (status >= 500)
		log_warnx("%s %s: %u %.*s", req->method, req->path, status, len, message);
	else
		log_info("%s %s from %s: %u %.*s", req->method, req->path, req->client, status, len, message);
	return reply_bytes(req, status, "text/plain; charset=utf-8", message, strlen(message), true);
}

static void
setup_session_end(void)
{
	free(setup_session.root);
	json_decref(setup_session.tasks);
	memset(&setup_session, 0, sizeof(setup_session));
}

/* Does the request carry the live setup session's cookie? */
static bool
setup_session_valid(struct request *req)
{
	const char	 *cookie = MHD_lookup_connection_value(req->connection, MHD_COOKIE_KIND, SETUP_COOKIE);
	unsigned char digest[SHA256_DIGEST_LENGTH];

	if (!setup_session.active || cookie == NULL || strlen(cookie) != 64)
		return false;
	if (setup_session.expires <= time(NULL))
	{
		setup_session_end();
		return false;
	}
	SHA256((const unsigned char *) cookie, strlen(cookie), digest);
	return CRYPTO_memcmp(digest, setup_session.cookie_digest, sizeof(digest)) == 0;
}

/*
 * The page, with the session's cookie when it starts.  (Not a redirect:
 * a link followed from another site would not send a SameSite=Strict
 * cookie along it.  The page's script takes the token out of the address
 * bar.)
 */
static enum MHD_Result
setup_page(struct request *req, const char *cookie)
{
	const char			*html;
	size_t				 len;
	struct MHD_Response *response;
	enum MHD_Result		 result;

	www_setup_page(&html, &len);
	response = MHD_create_response_from_buffer(len, (void *) (uintptr_t) html, MHD_RESPMEM_PERSISTENT);
	if (response == NULL)
		return MHD_NO;
	if (cookie)
		MHD_add_response_header(response, MHD_HTTP_HEADER_SET_COOKIE, cookie);
	MHD_add_response_header(response, "Content-Type", "text/html; charset=utf-8");
	reply_add_security_headers(response);
	result = MHD_queue_response(req->connection, MHD_HTTP_OK, response);
	MHD_destroy_response(response);
	return result;
}

/* GET /setup?token=T: take the link, start the session, and serve the page. */
static enum MHD_Result
setup_take_link(struct request *req, const char *token)
{
	const char			  *path = config_text(httpd.cfg, "httpd", "SETUP_TOKEN");
	unsigned char		   secret_bytes[32];
	unsigned char		   csrf_bytes[32];
	char				   secret[65];
	char				   cookie[256];
	char				   err[512] = "";
	char				  *root;
	bool				   as_root;
	enum MHD_Result		   result;
	enum setup_link_result taken = setup_link_take(path, token, &root, &as_root, err, sizeof(err));

	switch (taken)
	{
		case SETUP_LINK_INVALID:
			return setup_text(req, MHD_HTTP_FORBIDDEN,
							  "This setup link is not valid: it is wrong, or it was used already. "
							  "pepsi-setup init --web makes a new one.\n");
		case SETUP_LINK_EXPIRED:
			return setup_text(req, MHD_HTTP_FORBIDDEN,
							  "This setup link has expired. pepsi-setup init --web makes a new one.\n");
		case SETUP_LINK_ERROR:
			log_warnx("[httpd] SETUP_TOKEN: %s", err);
			return setup_text(req, MHD_HTTP_INTERNAL_SERVER_ERROR,
							  "The setup link cannot be checked: the server's log says why.\n");
		case SETUP_LINK_TAKEN:
			break;
	}
	if (RAND_bytes(secret_bytes, sizeof(secret_bytes)) != 1 || RAND_bytes(csrf_bytes, sizeof(csrf_bytes)) != 1)
	{
		free(root);
		return setup_text(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "no randomness\n");
	}
	setup_session_end();
	setup_link_hex(secret_bytes, sizeof(secret_bytes), secret);
	explicit_bzero(secret_bytes, sizeof(secret_bytes));
	SHA256((const unsigned char *) secret, strlen(secret), setup_session.cookie_digest);
	setup_link_hex(csrf_bytes, sizeof(csrf_bytes), setup_session.csrf);
	setup_session.active = true;
	setup_session.expires = time(NULL) + httpd.session_lifetime_s;
	setup_session.root = root;
	setup_session.as_root = as_root;
	log_info("the setup link was used from %s: a setup session starts", req->client);

	snprintf(cookie, sizeof(cookie), "%s=%s; Path=/; Max-Age=%ld; HttpOnly; SameSite=Strict%s", SETUP_COOKIE,
			 secret, httpd.session_lifetime_s, httpd.tls ? "; Secure" : "");
	explicit_bzero(secret, sizeof(secret));
	result = setup_page(req, cookie);
	explicit_bzero(cookie, sizeof(cookie));
	return result;
}

/* GET /api/setup: the questions, as the model has them. */
static enum MHD_Result
setup_describe(struct request *req)
{
	json_t *questions = json_array();

	for (int i = 0; i < SETUP_Q_COUNT; i++)
		json_array_append_new(questions, json_pack("{ss ss so}", "name", setup_questions[i].name, "prompt",
												   setup_questions[i].prompt, "default",
												   setup_questions[i].default_value
													   ? json_string(setup_questions[i].default_value)
													   : json_null()));
	return reply_json(req, MHD_HTTP_OK,
					  json_pack("{so ss sb}", "questions", questions, "csrf", setup_session.csrf, "submitted",
								setup_session.tasks != NULL));
}

/* The plan's tasks in one transaction, through the configuration connection; the ids, or NULL with why. */
static json_t *
setup_enqueue(json_t *plan, char *why, size_t whylen)
{
	PGconn	 *conn = db_connect_as(httpd.cfg, "database", "CONFIG_CONNINFO", "pepsi-httpd setup", why, whylen);
	PGresult *res;
	json_t	 *ids = json_array();
	json_t	 *task;
	size_t	  i;

	if (conn == NULL)
	{
		json_decref(ids);
		return NULL;
	}
	res = PQexec(conn, "BEGIN");
	PQclear(res);
	json_array_foreach (plan, i, task)
	{
		char	   *params = json_dumps(json_object_get(task, "params"), JSON_COMPACT);
		const char *values[2] = {json_string_value(json_object_get(task, "kind")), params};

		res = db_exec(conn, "INSERT INTO pepsi.setup_task (kind, params) VALUES ($1, $2::jsonb) RETURNING id", 2,
					  values);
		free(params);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			snprintf(why, whylen, "%s", db_error(res, conn));
			PQclear(res);
			PQfinish(conn);
			json_decref(ids);
			return NULL;
		}
		json_array_append_new(ids, json_integer(strtoll(PQgetvalue(res, 0, 0), NULL, 10)));
		PQclear(res);
	}
	res = PQexec(conn, "COMMIT");
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		snprintf(why, whylen, "COMMIT: %s", PQerrorMessage(conn));
		json_decref(ids);
		ids = NULL;
	}
	PQclear(res);
	PQfinish(conn);
	return ids;
}

/* POST /api/setup {"answers": {"domains": ..., ...}}: checked, then enqueued, once. */
static enum MHD_Result
setup_submit(struct request *req)
{
	struct setup_answers answers = {0};
	struct setup_layout	 layout = {setup_session.root, setup_session.as_root};
	json_error_t		 error;
	json_t				*body = json_loadb(req->body.data, req->body.len, 0, &error);
	json_t				*given = json_object_get(body, "answers");
	json_t				*problems = json_object();
	json_t				*plan;
	json_t				*task;
	json_t				*ids;
	const char			*name;
	json_t				*value;
	char				 why[1024];
	size_t				 i;

	if (setup_session.tasks)
	{
		json_decref(body);
		json_decref(problems);
		return reply_error(req, MHD_HTTP_CONFLICT,
						   "this setup session has enqueued its tasks already (pepsi-setup init --web makes a "
						   "new link for another)");
	}
	if (!json_is_object(given))
	{
		json_decref(body);
		json_decref(problems);
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "the body must be JSON: {\"answers\": {\"domains\": ...}}");
	}
	json_object_foreach (given, name, value)
	{
		int q = setup_question_find(name);

		if (q < 0)
			json_object_set_new(problems, name, json_string("no such question"));
		else if (!json_is_string(value))
			json_object_set_new(problems, name, json_string("the answer must be a string"));
		else if (json_string_value(value)[0] == '\0')
			; /* the default, if there is one */
		else if (!setup_answer(&answers, q, json_string_value(value), why, sizeof(why)))
			json_object_set_new(problems, name, json_string(why));
	}
	for (int q = 0; q < SETUP_Q_COUNT; q++)
		if (setup_answer_value(&answers, q) == NULL && json_object_get(problems, setup_questions[q].name) == NULL)
			json_object_set_new(problems, setup_questions[q].name, json_string("an answer is required"));
	json_decref(body);
	if (json_object_size(problems) > 0)
	{
		setup_answers_free(&answers);
		return reply_json(req, MHD_HTTP_UNPROCESSABLE_CONTENT,
						  json_pack("{ss so}", "error", "the answers are not all valid; nothing was enqueued",
									"fields", problems));
	}
	json_decref(problems);
	plan = setup_plan(&answers, &layout);
	setup_answers_free(&answers);
	json_array_foreach (plan, i, task)
	{
		enum setup_kind kind;

		if (!setup_kind_parse(json_string_value(json_object_get(task, "kind")), &kind)
			|| !setup_task_check(kind, json_object_get(task, "params"), why, sizeof(why)))
		{
			json_decref(plan);
			return reply_error(req, MHD_HTTP_UNPROCESSABLE_CONTENT,
							   "the plan's task %zu is refused: %s; nothing was enqueued", i + 1, why);
		}
	}
	ids = setup_enqueue(plan, why, sizeof(why));
	json_decref(plan);
	if (ids == NULL)
		return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE,
						   "the tasks cannot be enqueued through [database] CONFIG_CONNINFO (a member of "
						   "pepsi_config): %s; nothing was enqueued",
						   why);
	setup_session.tasks = ids;
	log_info("setup: %zu tasks enqueued from %s; pepsi-setup apply carries them out", json_array_size(ids),
			 req->client);
	return reply_json(req, MHD_HTTP_CREATED, json_pack("{sO}", "tasks", ids));
}

/* GET /api/setup/log: the session's tasks, each with its status and lines. */
static enum MHD_Result
setup_log(struct request *req)
{
	struct buf		ids = BUF_INIT;
	json_t		   *id;
	size_t			i;
	const char	   *values[1];
	enum MHD_Result result;

	buf_printf(&ids, "{");
	json_array_foreach (setup_session.tasks, i, id)
		buf_printf(&ids, "%s%lld", i ? "," : "", (long long) json_integer_value(id));
	buf_printf(&ids, "}");
	values[0] = ids.data;
	result = api_json_query(
		req,
		"SELECT coalesce(json_agg(json_build_object('id', t.id, 'kind', t.kind, 'status', t.status,"
		"  'lines', (SELECT coalesce(json_agg(l.line ORDER BY l.id), '[]') FROM pepsi.setup_task_log l"
		"            WHERE l.task_id = t.id)) ORDER BY t.id), '[]')::text"
		" FROM pepsi.setup_task t WHERE t.id = ANY ($1::bigint[])",
		1, values, false);
	buf_free(&ids);
	return result;
}

enum MHD_Result
setup_web_route(struct request *req)
{
	bool			 get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
	struct principal who = {.kind = PRINCIPAL_SESSION};
	const char		*why;

	if (strcmp(req->path, "/setup") == 0)
	{
		const char *token = MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, "token");

		if (!get)
			return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/setup takes GET");
		/* (Not a HEAD: that would use the link up and show nothing.) */
		if (token && strcmp(req->method, "GET") == 0)
			return setup_take_link(req, token);
		if (token)
			return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "the setup link takes GET");
		if (!setup_session_valid(req))
			return setup_text(req, MHD_HTTP_FORBIDDEN,
							  "No setup session: open the link pepsi-setup init --web printed.\n");
		return setup_page(req, NULL);
	}
	if (req->body_too_large)
		return reply_error(req, MHD_HTTP_CONTENT_TOO_LARGE, "the request body is larger than %d bytes",
						   HTTPD_MAX_BODY);
	if (!setup_session_valid(req))
		return reply_error(req, MHD_HTTP_FORBIDDEN, "no setup session: open the link pepsi-setup init --web printed");
	if (strcmp(req->path, "/api/setup/log") == 0)
	{
		if (!get)
			return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/api/setup/log takes GET");
		return setup_log(req);
	}
	if (get)
		return setup_describe(req);
	if (strcmp(req->method, "POST") != 0)
		return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/api/setup takes GET or POST");
	memcpy(who.csrf, setup_session.csrf, sizeof(who.csrf));
	if (!principal_may_change(req, &who, &why))
		return reply_error(req, MHD_HTTP_FORBIDDEN, "%s", why);
	return setup_submit(req);
}
