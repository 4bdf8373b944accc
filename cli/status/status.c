/*
 * pepsi-status: the pipeline's health at a glance.
 *
 *   pepsi-status [-C config] [--json] [--watch [SECONDS]]
 *
 * Per stage: messages processed and their mean worker time, kills,
 * timeouts and crashes, fused hops (from pepsi.stage_stats, which the
 * dispatcher flushes about once a minute and when idle), and the live
 * counts in the queue: pending, in flight (running), paused, failed,
 * timed out.  Then the dispatcher's totals (pepsi.dispatch_stats), and an
 * alert when in the last day the dispatcher isolated a message that kept
 * ending its worker (CRASH_LIMIT): a poison message, or a stage bug; and
 * one while a transaction has held back the xmin horizon for
 * pepsi.snapshot_warning or longer (pepsi.held_horizon(), the condition the
 * maintenance worker logs): no dead version of a queue row can be removed
 * while it lasts.
 *
 * The exit status is 1 when an ALERT is printed (in JSON too: "alerts"),
 * so that a cron job or a monitoring check can act on it; 0 otherwise.
 * A WARNING does not change it: one when the connections the
 * configuration may open at once (the stage workers, pepsi-ingress,
 * pepsi-httpd, the dispatcher) are more than the server's max_connections
 * leaves to ordinary roles.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_status_main(int argc, char **argv);

/*
 * The live counts come from the view pepsi.queue_summary, not the queue
 * itself: the monitoring role (pepsi_monitor) reads the views and the
 * statistics and never a message, and the view is an index-only scan.
 */
static const char status_stages_sql[] =
	"WITH live AS ("
	"  SELECT stage, sum(messages) FILTER (WHERE status = 'pending') AS pending,"
	"         sum(messages) FILTER (WHERE status = 'running') AS running,"
	"         sum(messages) FILTER (WHERE status = 'paused') AS paused,"
	"         sum(held) AS held,"
	"         sum(messages) FILTER (WHERE status = 'failed') AS failed,"
	"         sum(messages) FILTER (WHERE status = 'timeout') AS timeout"
	"  FROM pepsi.queue_summary GROUP BY stage)"
	" SELECT coalesce(s.stage, l.stage),"
	"        coalesce(s.messages, 0),"
	"        round(coalesce(extract(epoch FROM s.processing_time) * 1000"
	"                       / nullif(s.messages, 0), 0)::numeric, 3),"
	"        coalesce(s.kills, 0), coalesce(s.timeouts, 0), coalesce(s.crashes, 0),"
	"        coalesce(s.fused_hops, 0),"
	"        coalesce(l.pending, 0), coalesce(l.running, 0), coalesce(l.paused, 0),"
	"        coalesce(l.held, 0), coalesce(l.failed, 0), coalesce(l.timeout, 0)"
	" FROM pepsi.stage_stats s FULL JOIN live l ON l.stage = s.stage"
	" ORDER BY 1";

static const char status_global_sql[] =
	"SELECT stages_run, messages, messages_failed, serialization_failures,"
	"       crash_retries, crash_failures,"
	"       coalesce(to_char(started_at, 'YYYY-MM-DD HH24:MI:SS TZ'), ''),"
	"       coalesce(to_char(updated_at, 'YYYY-MM-DD HH24:MI:SS TZ'), ''),"
	"       coalesce(to_char(last_crash_failure_at, 'YYYY-MM-DD HH24:MI:SS TZ'), ''),"
	"       last_crash_failure_at > now() - interval '1 day'"
	" FROM pepsi.dispatch_stats";

/* Who holds back the xmin horizon (pepsi--0.1--0.2.sql); not its statement. */
static const char status_horizon_sql[] =
	"SELECT pid, program, state, usename, client,"
	"       to_char(xact_start, 'YYYY-MM-DD HH24:MI:SS TZ'), seconds"
	" FROM pepsi.held_horizon()";

/* The columns of status_global_sql: the integers, then the times. */
#define GLOBAL_INTEGERS 6
#define GLOBAL_COLUMNS 9
#define GLOBAL_CRASH_ALERT 9

static const char *const stage_columns[] = {
	"stage", "messages", "mean_ms", "kills", "timeouts", "crashes", "fused_hops",
	"pending", "running", "paused", "held", "failed", "timeout"};
#define STAGE_COLUMNS ((int) (sizeof(stage_columns) / sizeof(stage_columns[0])))
static const char *const global_columns[GLOBAL_COLUMNS] = {
	"stages_run", "messages", "messages_failed", "serialization_failures", "crash_retries",
	"crash_failures", "started_at", "updated_at", "last_crash_failure_at"};

/* The operator alert, or NULL: messages isolated for killing their worker. */
static char *
status_crash_alert(PGresult *global)
{
	if (PQntuples(global) != 1 || strcmp(PQgetvalue(global, 0, GLOBAL_CRASH_ALERT), "t") != 0)
		return NULL;
	return xasprintf("%s message(s) isolated after ending their stage worker CRASH_LIMIT times, "
					 "the last at %s: pepsi-queue shows them failed or timed out with the reason "
					 "(state.crash), pepsi.event_log has a crash_limit entry for each",
					 PQgetvalue(global, 0, 5), PQgetvalue(global, 0, 8));
}

/* The operator alert, or NULL: a transaction holding back the xmin horizon. */
static char *
status_horizon_alert(PGresult *horizon)
{
	if (PQresultStatus(horizon) != PGRES_TUPLES_OK || PQntuples(horizon) != 1)
		return NULL;
	return xasprintf("pid %s (%s, %s, user %s from %s) has held back the xmin horizon since %s "
					 "(%s s): the queue's dead row versions cannot be removed while it lasts; "
					 "end that transaction",
					 PQgetvalue(horizon, 0, 0), PQgetvalue(horizon, 0, 1), PQgetvalue(horizon, 0, 2),
					 PQgetvalue(horizon, 0, 3), PQgetvalue(horizon, 0, 4), PQgetvalue(horizon, 0, 5),
					 PQgetvalue(horizon, 0, 6));
}

/* The exit status when an ALERT was printed. */
#define STATUS_EX_ALERT 1

/* What the server leaves to roles that are not superusers. */
static const char status_connections_sql[] =
	"SELECT current_setting('max_connections')::int"
	"       - current_setting('superuser_reserved_connections')::int"
	"       - coalesce(current_setting('reserved_connections', true)::int, 0),"
	"       current_setting('max_connections')";

/*
 * The warning, or NULL: the configuration may open more connections at
 * once than max_connections allows.  Each stage worker holds one (up to
 * PARALLELISM, and one more with LIGHT_LANE), the dispatcher one,
 * pepsi-ingress DATABASE_CONNECTIONS, its express connection and the one
 * that refreshes LOCAL_DOMAINS (when a [listener-*] is configured),
 * pepsi-httpd one (when [httpd] is).
 */
static char *
status_connections_warning(PGconn *conn, const struct pepsi_config *cfg)
{
	const char *sections[1024];
	size_t		n = config_sections(cfg, "stage-", sections, 1024);
	long long	workers = 0, ingress = 0, httpd = 0, need;
	PGresult   *res;
	char	   *warning = NULL;

	for (size_t i = 0; i < n; i++)
		workers += config_int(cfg, sections[i], "PARALLELISM")
				   + (config_bool(cfg, sections[i], "LIGHT_LANE") ? 1 : 0);
	if (config_sections(cfg, "listener-", sections, 1) > 0)
		ingress = config_int(cfg, "ingress", "DATABASE_CONNECTIONS") + 2;
	if (config_sections(cfg, "httpd", sections, 1) > 0)
		httpd = 1;
	need = workers + 1 + ingress + httpd;
	res = db_exec(conn, status_connections_sql, 0, NULL);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1
		&& need > atoll(PQgetvalue(res, 0, 0)))
		warning = xasprintf("the configuration may open %lld database connections at once (%lld "
							"stage workers: [stage-*] PARALLELISM and LIGHT_LANE; pepsi-dispatch 1; "
							"pepsi-ingress %lld: [ingress] DATABASE_CONNECTIONS + 2; pepsi-httpd "
							"%lld), more than the %s the server leaves to ordinary roles: raise "
							"max_connections (now %s) or lower PARALLELISM",
							need, workers, ingress, httpd, PQgetvalue(res, 0, 0),
							PQgetvalue(res, 0, 1));
	PQclear(res);
	return warning;
}

static void
status_usage(FILE *out)
{
	fprintf(out, "usage: pepsi-status [-C CONFIG] [--json] [--watch [SECONDS]]\n"
				 "  per stage: messages, mean worker time, kills, timeouts, crashes, fused hops\n"
				 "  (pepsi.stage_stats) and the live counts of the queue (pepsi.queue_summary)\n");
}

static int
status_show(PGconn *conn, const struct pepsi_config *cfg, bool as_json)
{
	PGresult *stages = db_exec(conn, status_stages_sql, 0, NULL);
	PGresult *global = db_exec(conn, status_global_sql, 0, NULL);
	/* A database still at 0.1 has no pepsi.held_horizon(): no alert then. */
	PGresult *horizon = db_exec(conn, status_horizon_sql, 0, NULL);
	int		  rc = CLI_EX_OK;
	char	 *alert = NULL;
	char	 *horizon_alert = status_horizon_alert(horizon);
	char	 *warning = status_connections_warning(conn, cfg);
	/* [database] MONITOR_CONNINFO may name a standby: then how far behind it is. */
	char *lag = db_standby_lag(conn);

	if (PQresultStatus(stages) == PGRES_TUPLES_OK && PQresultStatus(global) == PGRES_TUPLES_OK)
		alert = status_crash_alert(global);
	if (PQresultStatus(stages) != PGRES_TUPLES_OK || PQresultStatus(global) != PGRES_TUPLES_OK)
	{
		PGresult *failed = PQresultStatus(stages) != PGRES_TUPLES_OK ? stages : global;

		cli_db_error("pepsi-status", failed, conn);
		rc = cli_db_exit_code(failed, conn);
	}
	else if (as_json)
	{
		json_t *out = json_object();
		json_t *list = json_array();

		for (int r = 0; r < PQntuples(stages); r++)
		{
			json_t *row = json_object();

			json_object_set_new(row, "stage", json_string(PQgetvalue(stages, r, 0)));
			for (int c = 1; c < STAGE_COLUMNS; c++)
				json_object_set_new(row, stage_columns[c],
									c == 2 ? json_real(atof(PQgetvalue(stages, r, c)))
										   : json_integer(atoll(PQgetvalue(stages, r, c))));
			json_array_append_new(list, row);
		}
		json_object_set_new(out, "stages", list);
		if (PQntuples(global) == 1)
		{
			json_t *g = json_object();

			for (int c = 0; c < GLOBAL_COLUMNS; c++)
				json_object_set_new(g, global_columns[c],
									c < GLOBAL_INTEGERS ? json_integer(atoll(PQgetvalue(global, 0, c)))
														: json_string(PQgetvalue(global, 0, c)));
			json_object_set_new(out, "dispatch", g);
		}
		if (lag)
			json_object_set_new(out, "standby_replication_lag_seconds", json_real(atof(lag)));
		json_object_set_new(out, "alerts", json_array());
		if (alert)
			json_array_append_new(json_object_get(out, "alerts"), json_string(alert));
		if (horizon_alert)
			json_array_append_new(json_object_get(out, "alerts"), json_string(horizon_alert));
		json_object_set_new(out, "warnings", json_array());
		if (warning)
			json_array_append_new(json_object_get(out, "warnings"), json_string(warning));
		json_dumpf(out, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
		putchar('\n');
		json_decref(out);
	}
	else
	{
		printf("%-16s %10s %9s %6s %8s %7s %7s %9s %8s %7s %7s %7s %7s\n",
			   "STAGE", "MESSAGES", "MEAN ms", "KILLS", "TIMEOUTS", "CRASHES", "FUSED",
			   "PENDING", "RUNNING", "PAUSED", "HELD", "FAILED", "TIMEOUT");
		for (int r = 0; r < PQntuples(stages); r++)
			printf("%-16s %10s %9s %6s %8s %7s %7s %9s %8s %7s %7s %7s %7s\n",
				   PQgetvalue(stages, r, 0), PQgetvalue(stages, r, 1), PQgetvalue(stages, r, 2),
				   PQgetvalue(stages, r, 3), PQgetvalue(stages, r, 4), PQgetvalue(stages, r, 5),
				   PQgetvalue(stages, r, 6), PQgetvalue(stages, r, 7), PQgetvalue(stages, r, 8),
				   PQgetvalue(stages, r, 9), PQgetvalue(stages, r, 10), PQgetvalue(stages, r, 11),
				   PQgetvalue(stages, r, 12));
		if (PQntuples(global) == 1)
			printf("\ndispatcher: %s stage passes, %s messages, %s failed by the dispatcher, "
				   "%s serialization retries\n            %s retried and %s isolated after their "
				   "worker died\n            started %s, statistics as of %s\n",
				   PQgetvalue(global, 0, 0), PQgetvalue(global, 0, 1), PQgetvalue(global, 0, 2),
				   PQgetvalue(global, 0, 3), PQgetvalue(global, 0, 4), PQgetvalue(global, 0, 5),
				   *PQgetvalue(global, 0, 6) ? PQgetvalue(global, 0, 6) : "never",
				   PQgetvalue(global, 0, 7));
		if (lag)
			printf("\nread from a standby: replication lag %s s (since the last transaction it replayed)\n", lag);
		if (alert)
			printf("\nALERT: %s\n", alert);
		if (horizon_alert)
			printf("\nALERT: %s\n", horizon_alert);
		if (warning)
			printf("\nWARNING: %s\n", warning);
	}
	if (rc == CLI_EX_OK && (alert || horizon_alert))
		rc = STATUS_EX_ALERT;
	free(warning);
	free(lag);
	free(alert);
	free(horizon_alert);
	PQclear(horizon);
	PQclear(stages);
	PQclear(global);
	fflush(stdout);
	return rc;
}

int
pepsi_status_main(int argc, char **argv)
{
	static const struct option long_options[] = {
		{"json", no_argument, NULL, 'j'},
		{"watch", optional_argument, NULL, 'w'},
		{"config", required_argument, NULL, 'C'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	const char			*config_path = NULL;
	bool				 as_json = false;
	double				 watch = 0;
	struct pepsi_config *cfg = NULL;
	PGconn				*conn;
	int					 opt;
	int					 rc = CLI_EX_OK;
	char				*end;

	log_init("pepsi-status", false);
	while ((opt = getopt_long(argc, argv, "C:jw::h", long_options, NULL)) != -1)
		switch (opt)
		{
			case 'C':
				config_path = optarg;
				break;
			case 'j':
				as_json = true;
				break;
			case 'w':
				/* "--watch 5" as well as "--watch=5": a number after it is its argument */
				if (optarg == NULL && optind < argc && argv[optind][0] >= '0' && argv[optind][0] <= '9')
					optarg = argv[optind++];
				watch = 2;
				if (optarg)
				{
					watch = strtod(optarg, &end);
					if (*end || end == optarg || !(watch > 0) || watch > 86400)
					{
						fprintf(stderr, "pepsi-status: --watch takes a positive number of seconds, "
										"not \"%s\"\n",
								optarg);
						return CLI_EX_USAGE;
					}
				}
				break;
			case 'h':
				status_usage(stdout);
				return CLI_EX_OK;
			default:
				status_usage(stderr);
				return CLI_EX_USAGE;
		}
	if (optind < argc)
	{
		fprintf(stderr, "pepsi-status: unexpected argument \"%s\"\n", argv[optind]);
		status_usage(stderr);
		return CLI_EX_USAGE;
	}
	if ((conn = cli_connect("pepsi-status", config_path, CLI_ROLE_MONITOR, &cfg, &rc)) == NULL)
		return rc;
	do
	{
		if (watch > 0 && !as_json)
			printf("\033[H\033[2J");
		rc = status_show(conn, cfg, as_json);
		if (watch > 0 && (rc == CLI_EX_OK || rc == STATUS_EX_ALERT))
		{
			struct timespec pause = {(time_t) watch, (long) ((watch - (double) (time_t) watch) * 1e9)};

			nanosleep(&pause, NULL);
		}
	} while (watch > 0 && (rc == CLI_EX_OK || rc == STATUS_EX_ALERT));
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
