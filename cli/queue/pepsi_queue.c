/*
 * pepsi-queue: look at the queue and act on it (the mailq/postsuper of Pepsi).
 *
 *   pepsi-queue [-C config] [--json] list [--limit N] [--stage S] [--status S]
 *   pepsi-queue [-C config] [--json] show ID [--body]
 *   pepsi-queue [-C config] retry|hold|release|delete ID... | SELECTOR
 *   pepsi-queue [-C config] bounce ID... | SELECTOR [--reason TEXT] [--bounce-stage S]
 *   pepsi-queue [-C config] [--json] shape | summary
 *
 * SELECTOR: --all-failed (failed and timed out), --all-paused, --all,
 * optionally narrowed with --stage S.  Every action goes through the SQL
 * functions pepsi.queue_* (the same a DBA calls), which check each row,
 * change all of them or none, and write one pepsi.event_log row.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_queue_main(int argc, char **argv);

struct queue_options
{
	const char *config_path;
	bool		as_json;
	long		limit;
	bool		limit_given;
	const char *stage;
	const char *status;
	bool		body;
	const char *reason;
	const char *bounce_stage;
	const char *selector; /* failed / paused / all */
};

static void
queue_usage(FILE *out)
{
	fprintf(out,
			"usage: pepsi-queue [-C CONFIG] [--json] COMMAND ...\n"
			"  list [--limit N] [--stage S] [--status S]   the queue, oldest first (like mailq)\n"
			"  show ID [--body]                            one message: envelope, state, headers\n"
			"  retry|hold|release|delete ID...|SELECTOR    act on messages\n"
			"  bounce ID...|SELECTOR [--reason TEXT] [--bounce-stage S]\n"
			"  shape                                       recipient domains by age (like qshape)\n"
			"  summary                                     stages by status\n"
			"  log ID|QUEUE_ID|ADDRESS                     a message's history (pepsi.mail_log,\n"
			"                                              with [pepsi] MAIL_LOG = yes)\n"
			"  SELECTOR: --all-failed | --all-paused | --all, narrowed by --stage S\n");
}

static bool
queue_valid_status(const char *status)
{
	static const char *const statuses[] = {"pending", "running", "paused", "failed", "timeout"};

	for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++)
		if (strcmp(status, statuses[i]) == 0)
			return true;
	return false;
}

/* One selector at most: "--all-failed --all-paused" is not a union. */
static bool
queue_set_selector(struct queue_options *o, const char *selector)
{
	if (o->selector && strcmp(o->selector, selector) != 0)
	{
		fprintf(stderr, "pepsi-queue: give one selector: --all-failed, --all-paused or --all\n");
		return false;
	}
	o->selector = selector;
	return true;
}

static bool
queue_is_action(const char *command)
{
	return strcmp(command, "retry") == 0 || strcmp(command, "hold") == 0
		   || strcmp(command, "release") == 0 || strcmp(command, "delete") == 0
		   || strcmp(command, "bounce") == 0;
}

/*
 * Refuse an option the command does not take, rather than ignore it: a
 * "delete 12 --all-failed" must not be read as either half.
 */
static bool
queue_options_fit(const char *command, const struct queue_options *o, int nargs)
{
	const char *misplaced = NULL;

	if (o->selector && !queue_is_action(command))
		misplaced = strcmp(o->selector, "failed") == 0	 ? "--all-failed"
					: strcmp(o->selector, "paused") == 0 ? "--all-paused"
														 : "--all";
	else if ((o->reason || o->bounce_stage) && strcmp(command, "bounce") != 0)
		misplaced = o->reason ? "--reason" : "--bounce-stage";
	else if (o->body && strcmp(command, "show") != 0)
		misplaced = "--body";
	else if ((o->status || o->limit_given) && strcmp(command, "list") != 0)
		misplaced = o->status ? "--status" : "--limit";
	else if (o->stage && !queue_is_action(command) && strcmp(command, "list") != 0)
		misplaced = "--stage";
	else if (o->stage && queue_is_action(command) && !o->selector)
		misplaced = "--stage (it narrows a selector)";
	if (misplaced)
	{
		fprintf(stderr, "pepsi-queue: %s does not take %s\n", command, misplaced);
		return false;
	}
	if (o->selector && nargs > 0)
	{
		fprintf(stderr, "pepsi-queue: name the messages by id or by a selector, not both\n");
		return false;
	}
	return true;
}

static int
queue_list(PGconn *conn, const struct queue_options *o)
{
	char		limit[32];
	const char *values[3] = {limit, o->stage, o->status};
	PGresult   *res;
	int			rc = CLI_EX_OK;

	snprintf(limit, sizeof(limit), "%ld", o->limit);
	res = db_exec(conn, o->as_json ? "SELECT w.id, coalesce(w.state ->> 'queue_id', w.id::text) AS queue_id,"
									 " extract(epoch FROM now() - w.received_at)::bigint AS age_seconds,"
									 " octet_length(w.headers) + 2 + octet_length(b.body) AS size, w.mail_from AS sender,"
									 " array_to_json(w.rcpt_to) AS recipients, w.stage, w.status::text AS status,"
									 " coalesce(w.state->>'last_error', w.state->>'dispatch_error') AS last_error"
									 " FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
									 " WHERE ($2::text IS NULL OR w.stage = $2)"
									 "   AND ($3::text IS NULL OR w.status = $3::pepsi.status)"
									 " ORDER BY w.id LIMIT $1"
								   : "SELECT w.id, coalesce(w.state ->> 'queue_id', w.id::text) AS queue_id,"
									 " justify_interval(date_trunc('second', now() - w.received_at))::text AS age,"
									 " octet_length(w.headers) + 2 + octet_length(b.body) AS size,"
									 " CASE w.mail_from WHEN '' THEN '<>' ELSE w.mail_from END AS sender,"
									 " array_to_string(w.rcpt_to, ', ') AS recipients, w.stage, w.status::text AS status,"
									 " coalesce(w.state->>'last_error', w.state->>'dispatch_error', '') AS last_error"
									 " FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
									 " WHERE ($2::text IS NULL OR w.stage = $2)"
									 "   AND ($3::text IS NULL OR w.status = $3::pepsi.status)"
									 " ORDER BY w.id LIMIT $1",
				  3, values);
	rc = cli_show_result("pepsi-queue", res, conn, o->as_json);
	return rc;
}

static int
queue_show(PGconn *conn, long long id, const struct queue_options *o)
{
	char		idtext[32];
	const char *values[1] = {idtext};
	PGresult   *res;
	PGresult   *raw;
	int			format = 1;

	snprintf(idtext, sizeof(idtext), "%lld", id);
	res = db_exec(conn, "SELECT w.id, coalesce(w.state ->> 'queue_id', w.id::text) AS queue_id, w.stage,"
						" w.status::text AS status, w.received_at::text AS received_at,"
						" w.timeout::text AS timeout, w.mail_from, array_to_json(w.rcpt_to) AS rcpt_to,"
						" w.sender_key, host(w.client_address) AS client_address, w.auth_account,"
						" octet_length(w.headers) + 2 + octet_length(b.body) AS size,"
						" w.state AS state, jsonb_pretty(w.state) AS state_pretty"
						" FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
						" WHERE w.id = $1",
				  1, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		int rc = cli_db_exit_code(res, conn);

		cli_db_error("pepsi-queue", res, conn);
		PQclear(res);
		return rc;
	}
	if (PQntuples(res) == 0)
	{
		fprintf(stderr, "pepsi-queue: no message %lld in the queue\n", id);
		PQclear(res);
		return CLI_EX_DATAERR;
	}
	raw = PQexecParams(conn, o->body ? "SELECT w.headers || '\\x0d0a'::bytea || b.body FROM pepsi.workqueue w"
									   "  JOIN pepsi.workqueue_body b ON b.id = w.body_id WHERE w.id = $1"
									 : "SELECT headers FROM pepsi.workqueue WHERE id = $1",
					   1, NULL, values, NULL, NULL, format);
	if (PQresultStatus(raw) != PGRES_TUPLES_OK || PQntuples(raw) != 1)
	{
		/* (no row: it went between the two statements) */
		int rc = PQresultStatus(raw) == PGRES_TUPLES_OK ? CLI_EX_DATAERR
														: cli_db_exit_code(raw, conn);

		if (PQresultStatus(raw) == PGRES_TUPLES_OK)
			fprintf(stderr, "pepsi-queue: message %lld left the queue\n", id);
		else
			cli_db_error("pepsi-queue", raw, conn);
		PQclear(res);
		PQclear(raw);
		return rc;
	}
	if (o->as_json)
	{
		json_t *object = json_object();
		json_t *state = json_loads(PQgetvalue(res, 0, PQfnumber(res, "state")), 0, NULL);

		for (int c = 0; c < PQfnumber(res, "state"); c++)
		{
			const char *name = PQfname(res, c);

			if (PQgetisnull(res, 0, c))
				json_object_set_new(object, name, json_null());
			else if (strcmp(name, "id") == 0 || strcmp(name, "size") == 0)
				json_object_set_new(object, name, json_integer(atoll(PQgetvalue(res, 0, c))));
			else if (strcmp(name, "rcpt_to") == 0)
				json_object_set_new(object, name, json_loads(PQgetvalue(res, 0, c), 0, NULL));
			else
				json_object_set_new(object, name, json_string(PQgetvalue(res, 0, c)));
		}
		json_object_set_new(object, "state", state ? state : json_object());
		{
			/* JSON strings are UTF-8: a message that is not goes out hex-encoded. */
			const char *data = PQgetvalue(raw, 0, 0);
			size_t		len = (size_t) PQgetlength(raw, 0, 0);
			json_t	   *text = json_stringn(data, len);
			const char *key = o->body ? "message" : "headers";

			if (text == NULL)
			{
				struct buf hex = BUF_INIT;

				for (size_t i = 0; i < len; i++)
					buf_printf(&hex, "%02x", (unsigned char) data[i]);
				text = json_string(hex.data ? hex.data : "");
				key = o->body ? "message_hex" : "headers_hex";
				buf_free(&hex);
			}
			json_object_set_new(object, key, text);
		}
		json_dumpf(object, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(object);
	}
	else if (o->body && !isatty(STDOUT_FILENO))
	{
		/* Into a file or a pipe: the message exactly as stored. */
		fwrite(PQgetvalue(raw, 0, 0), 1, (size_t) PQgetlength(raw, 0, 0), stdout);
	}
	else if (o->body)
		cli_write_escaped(PQgetvalue(raw, 0, 0), (size_t) PQgetlength(raw, 0, 0), stdout);
	else
	{
		const char *pretty = PQgetvalue(res, 0, PQfnumber(res, "state_pretty"));

		/* What a sender wrote is shown, never obeyed by the terminal. */
		for (int c = 0; c < PQfnumber(res, "state"); c++)
		{
			const char *value = PQgetisnull(res, 0, c) ? "" : PQgetvalue(res, 0, c);

			printf("%-15s ", PQfname(res, c));
			cli_write_escaped(value, strlen(value), stdout);
			putchar('\n');
		}
		fputs("state\n", stdout);
		cli_write_escaped(pretty, strlen(pretty), stdout);
		fputs("\nheaders\n", stdout);
		cli_write_escaped(PQgetvalue(raw, 0, 0), (size_t) PQgetlength(raw, 0, 0), stdout);
	}
	PQclear(res);
	PQclear(raw);
	return CLI_EX_OK;
}

/* The ids to act on: the arguments, or the rows a selector picks. */
static bool
queue_collect_ids(PGconn *conn, int argc, char **argv, const struct queue_options *o,
				  struct buf *ids, int *rc)
{
	buf_append_char(ids, '{');
	if (o->selector)
	{
		const char *values[2] = {o->selector, o->stage};
		PGresult   *res = db_exec(conn, "SELECT coalesce(array_agg(id ORDER BY id), '{}')::text,"
										  " count(*) FROM pepsi.workqueue"
										  " WHERE (($1 = 'failed' AND status IN ('failed', 'timeout'))"
										  "     OR ($1 = 'paused' AND status = 'paused')"
										  "     OR ($1 = 'all' AND status <> 'running'))"
										  "   AND ($2::text IS NULL OR stage = $2)",
								  2, values);

		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			cli_db_error("pepsi-queue", res, conn);
			*rc = cli_db_exit_code(res, conn);
			PQclear(res);
			return false;
		}
		buf_reset(ids);
		buf_append_str(ids, PQgetvalue(res, 0, 0));
		if (atoll(PQgetvalue(res, 0, 1)) == 0)
		{
			printf("no message matches\n");
			PQclear(res);
			*rc = CLI_EX_OK;
			return false;
		}
		PQclear(res);
		return true;
	}
	if (argc == 0)
	{
		fprintf(stderr, "pepsi-queue: name the messages: ids, or --all-failed, --all-paused, --all\n");
		*rc = CLI_EX_USAGE;
		return false;
	}
	for (int i = 0; i < argc; i++)
	{
		long long id;

		if (!cli_parse_id(argv[i], &id))
		{
			fprintf(stderr, "pepsi-queue: \"%s\" is not a message id (a positive whole number)\n",
					argv[i]);
			*rc = CLI_EX_USAGE;
			return false;
		}
		buf_printf(ids, "%s%lld", i ? "," : "", id);
	}
	buf_append_char(ids, '}');
	return true;
}

static int
queue_act(PGconn *conn, const char *action, int argc, char **argv, const struct queue_options *o)
{
	struct buf ids = BUF_INIT;
	PGresult  *res;
	int		   rc = CLI_EX_OK;

	if (!queue_collect_ids(conn, argc, argv, o, &ids, &rc))
	{
		buf_free(&ids);
		return rc;
	}
	if (strcmp(action, "bounce") == 0)
	{
		const char *values[3] = {ids.data, o->reason ? o->reason : "5.0.0 returned by the postmaster",
								 o->bounce_stage ? o->bounce_stage : "bounce"};

		res = db_exec(conn, "SELECT pepsi.queue_bounce($1::int8[], $2, $3)", 3, values);
	}
	else
	{
		const char *values[1] = {ids.data};
		char	   *sql = xasprintf("SELECT pepsi.queue_%s($1::int8[])", action);

		res = db_exec(conn, sql, 1, values);
		free(sql);
	}
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		cli_db_error("pepsi-queue", res, conn);
		rc = cli_db_exit_code(res, conn);
	}
	else
		printf("%s: %s message%s\n", action, PQgetvalue(res, 0, 0),
			   strcmp(PQgetvalue(res, 0, 0), "1") == 0 ? "" : "s");
	PQclear(res);
	buf_free(&ids);
	return rc;
}

/*
 * The mail log of one row (by id), of a message (by queue id: every row
 * split from it), or of an address: the deliveries to it and the messages
 * from it, newest last.  Needs [pepsi] MAIL_LOG = yes.
 */
static int
queue_log(PGconn *conn, const char *what, const struct queue_options *o)
{
	long long	id;
	const char *values[1] = {what};
	PGresult   *res;

	if (cli_parse_id(what, &id))
		res = db_exec(conn, "SELECT l.at, l.queue_id, l.workqueue_id AS id, l.event, l.detail ->> 'status' AS status,"
							" l.detail ->> 'to' AS to, l.detail ->> 'relay' AS relay, l.detail ->> 'reply' AS reply"
							" FROM pepsi.mail_log l WHERE l.workqueue_id = $1::bigint ORDER BY l.id",
					  1, values);
	else if (strchr(what, '@') == NULL)
		res = db_exec(conn, "SELECT l.at, l.queue_id, l.workqueue_id AS id, l.event, l.detail ->> 'status' AS status,"
							" l.detail ->> 'to' AS to, l.detail ->> 'relay' AS relay, l.detail ->> 'reply' AS reply"
							" FROM pepsi.mail_log l WHERE l.queue_id = $1 ORDER BY l.id",
					  1, values);
	else
		res = db_exec(conn, "SELECT * FROM (SELECT l.id AS seq, l.at, l.queue_id, l.workqueue_id AS id, l.event,"
							" l.detail ->> 'status' AS status, l.detail ->> 'to' AS to,"
							" l.detail ->> 'relay' AS relay, l.detail ->> 'reply' AS reply"
							" FROM pepsi.mail_log l"
							" WHERE lower(l.detail ->> 'to') = lower($1) OR lower(l.detail ->> 'orig_to') = lower($1)"
							" OR lower(l.detail ->> 'from') = lower($1)"
							" ORDER BY l.id DESC LIMIT 1000) AS recent ORDER BY seq",
					  1, values);
	return cli_show_result("pepsi-queue", res, conn, o->as_json);
}

static int
queue_view(PGconn *conn, const char *view, const struct queue_options *o)
{
	char	 *sql = xasprintf("SELECT * FROM pepsi.queue_%s", view);
	PGresult *res = db_exec(conn, sql, 0, NULL);
	int		  rc = CLI_EX_OK;

	free(sql);
	rc = cli_show_result("pepsi-queue", res, conn, o->as_json);
	return rc;
}

int
pepsi_queue_main(int argc, char **argv)
{
	static const struct option long_options[] = {
		{"config", required_argument, NULL, 'C'},
		{"json", no_argument, NULL, 'j'},
		{"limit", required_argument, NULL, 'n'},
		{"stage", required_argument, NULL, 's'},
		{"status", required_argument, NULL, 'S'},
		{"body", no_argument, NULL, 'b'},
		{"reason", required_argument, NULL, 'r'},
		{"bounce-stage", required_argument, NULL, 'B'},
		{"all-failed", no_argument, NULL, 'F'},
		{"all-paused", no_argument, NULL, 'P'},
		{"all", no_argument, NULL, 'A'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	struct queue_options o = {.limit = 100};
	struct pepsi_config *cfg = NULL;
	const char			*command;
	PGconn				*conn;
	int					 opt;
	int					 rc = CLI_EX_OK;

	log_init("pepsi-queue", false);
	while ((opt = getopt_long(argc, argv, "C:jn:h", long_options, NULL)) != -1)
		switch (opt)
		{
			case 'C':
				o.config_path = optarg;
				break;
			case 'j':
				o.as_json = true;
				break;
			case 'n':
				o.limit_given = true;
				if (!cli_parse_int_range(optarg, 1, LONG_MAX, &o.limit))
				{
					fprintf(stderr, "pepsi-queue: --limit takes a positive whole number, not \"%s\"\n", optarg);
					return CLI_EX_USAGE;
				}
				break;
			case 's':
				o.stage = optarg;
				break;
			case 'S':
				if (!queue_valid_status(optarg))
				{
					fprintf(stderr, "pepsi-queue: --status is one of pending, running, paused, failed, "
									"timeout, not \"%s\"\n",
							optarg);
					return CLI_EX_USAGE;
				}
				o.status = optarg;
				break;
			case 'b':
				o.body = true;
				break;
			case 'r':
				o.reason = optarg;
				break;
			case 'B':
				o.bounce_stage = optarg;
				break;
			case 'F':
				if (!queue_set_selector(&o, "failed"))
					return CLI_EX_USAGE;
				break;
			case 'P':
				if (!queue_set_selector(&o, "paused"))
					return CLI_EX_USAGE;
				break;
			case 'A':
				if (!queue_set_selector(&o, "all"))
					return CLI_EX_USAGE;
				break;
			case 'h':
				queue_usage(stdout);
				return CLI_EX_OK;
			default:
				queue_usage(stderr);
				return CLI_EX_USAGE;
		}
	if (optind >= argc)
	{
		queue_usage(stderr);
		return CLI_EX_USAGE;
	}
	command = argv[optind++];
	if (strcmp(command, "list") != 0 && strcmp(command, "show") != 0 && strcmp(command, "shape") != 0
		&& strcmp(command, "summary") != 0 && strcmp(command, "retry") != 0
		&& strcmp(command, "hold") != 0 && strcmp(command, "release") != 0
		&& strcmp(command, "delete") != 0 && strcmp(command, "bounce") != 0
		&& strcmp(command, "log") != 0)
	{
		fprintf(stderr, "pepsi-queue: unknown command \"%s\"\n", command);
		queue_usage(stderr);
		return CLI_EX_USAGE;
	}
	if (strcmp(command, "show") == 0 && argc - optind != 1)
	{
		fprintf(stderr, "pepsi-queue: show takes one message id\n");
		return CLI_EX_USAGE;
	}
	if (strcmp(command, "log") == 0 && argc - optind != 1)
	{
		fprintf(stderr, "pepsi-queue: log takes one message id, one queue id or one address\n");
		return CLI_EX_USAGE;
	}
	if ((strcmp(command, "list") == 0 || strcmp(command, "shape") == 0
		 || strcmp(command, "summary") == 0)
		&& optind < argc)
	{
		fprintf(stderr, "pepsi-queue: %s takes no argument, not \"%s\"\n", command, argv[optind]);
		return CLI_EX_USAGE;
	}
	if (!queue_options_fit(command, &o, argc - optind))
		return CLI_EX_USAGE;
	/* The aggregates need no message: those two connect as a monitor. */
	if ((conn = cli_connect("pepsi-queue", o.config_path,
							strcmp(command, "shape") == 0 || strcmp(command, "summary") == 0
								? CLI_ROLE_MONITOR
								: CLI_ROLE_CONFIG,
							&cfg, &rc))
		== NULL)
		return rc;

	if (strcmp(command, "list") == 0)
		rc = queue_list(conn, &o);
	else if (strcmp(command, "show") == 0)
	{
		long long id;

		if (!cli_parse_id(argv[optind], &id))
		{
			fprintf(stderr, "pepsi-queue: \"%s\" is not a message id (a positive whole number)\n",
					argv[optind]);
			rc = CLI_EX_USAGE;
		}
		else
			rc = queue_show(conn, id, &o);
	}
	else if (strcmp(command, "shape") == 0 || strcmp(command, "summary") == 0)
		rc = queue_view(conn, command, &o);
	else if (strcmp(command, "log") == 0)
		rc = queue_log(conn, argv[optind], &o);
	else
		rc = queue_act(conn, command, argc - optind, argv + optind, &o);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
