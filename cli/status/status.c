/*
 * pepsi-status: the pipeline's health at a glance.
 *
 *   pepsi-status [-C config] [--json] [--watch [SECONDS]]
 *
 * Per stage: messages processed and their mean worker time, kills,
 * timeouts and crashes, fused hops (from pepsi.stage_stats, which the
 * dispatcher flushes about once a minute and when idle), and the live
 * counts in the queue: pending, in flight (running), paused, failed,
 * timed out.  Then the dispatcher's totals (pepsi.dispatch_stats).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "config.h"
#include "db.h"
#include "log.h"

int			pepsi_status_main(int argc, char **argv);

static const char status_stages_sql[] =
"WITH live AS ("
"  SELECT stage, count(*) FILTER (WHERE status = 'pending') AS pending,"
"         count(*) FILTER (WHERE status = 'running') AS running,"
"         count(*) FILTER (WHERE status = 'paused') AS paused,"
"         count(*) FILTER (WHERE status = 'failed') AS failed,"
"         count(*) FILTER (WHERE status = 'timeout') AS timeout"
"  FROM pepsi.workqueue GROUP BY stage)"
" SELECT coalesce(s.stage, l.stage),"
"        coalesce(s.messages, 0),"
"        coalesce(round((extract(epoch FROM s.processing_time) * 1000"
"                 / nullif(s.messages, 0))::numeric, 3), 0),"
"        coalesce(s.kills, 0), coalesce(s.timeouts, 0), coalesce(s.crashes, 0),"
"        coalesce(s.fused_hops, 0),"
"        coalesce(l.pending, 0), coalesce(l.running, 0), coalesce(l.paused, 0),"
"        coalesce(l.failed, 0), coalesce(l.timeout, 0)"
" FROM pepsi.stage_stats s FULL JOIN live l ON l.stage = s.stage"
" ORDER BY 1";

static const char status_global_sql[] =
"SELECT stages_run, messages, messages_failed, serialization_failures,"
"       coalesce(to_char(started_at, 'YYYY-MM-DD HH24:MI:SS TZ'), ''),"
"       coalesce(to_char(updated_at, 'YYYY-MM-DD HH24:MI:SS TZ'), '')"
" FROM pepsi.dispatch_stats";

static const char *const stage_columns[] = {
	"stage", "messages", "mean_ms", "kills", "timeouts", "crashes", "fused_hops",
	"pending", "running", "paused", "failed", "timeout"
};
static const char *const global_columns[] = {
	"stages_run", "messages", "messages_failed", "serialization_failures", "started_at", "updated_at"
};

static void
status_usage(void)
{
	fprintf(stderr, "usage: pepsi-status [-C CONFIG] [--json] [--watch [SECONDS]]\n");
}

static int
status_show(PGconn *conn, bool as_json)
{
	PGresult   *stages = db_exec(conn, status_stages_sql, 0, NULL);
	PGresult   *global = db_exec(conn, status_global_sql, 0, NULL);
	int			rc = 0;

	if (PQresultStatus(stages) != PGRES_TUPLES_OK || PQresultStatus(global) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "pepsi-status: %s\n",
				db_error(PQresultStatus(stages) != PGRES_TUPLES_OK ? stages : global, conn));
		rc = 1;
	}
	else if (as_json)
	{
		json_t	   *out = json_object();
		json_t	   *list = json_array();

		for (int r = 0; r < PQntuples(stages); r++)
		{
			json_t	   *row = json_object();

			json_object_set_new(row, "stage", json_string(PQgetvalue(stages, r, 0)));
			for (int c = 1; c < 12; c++)
				json_object_set_new(row, stage_columns[c],
									c == 2 ? json_real(atof(PQgetvalue(stages, r, c)))
									: json_integer(atoll(PQgetvalue(stages, r, c))));
			json_array_append_new(list, row);
		}
		json_object_set_new(out, "stages", list);
		if (PQntuples(global) == 1)
		{
			json_t	   *g = json_object();

			for (int c = 0; c < 6; c++)
				json_object_set_new(g, global_columns[c],
									c < 4 ? json_integer(atoll(PQgetvalue(global, 0, c)))
									: json_string(PQgetvalue(global, 0, c)));
			json_object_set_new(out, "dispatch", g);
		}
		json_dumpf(out, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
		putchar('\n');
		json_decref(out);
	}
	else
	{
		printf("%-16s %10s %9s %6s %8s %7s %7s %9s %8s %7s %7s %7s\n",
			   "STAGE", "MESSAGES", "MEAN ms", "KILLS", "TIMEOUTS", "CRASHES", "FUSED",
			   "PENDING", "RUNNING", "PAUSED", "FAILED", "TIMEOUT");
		for (int r = 0; r < PQntuples(stages); r++)
			printf("%-16s %10s %9s %6s %8s %7s %7s %9s %8s %7s %7s %7s\n",
				   PQgetvalue(stages, r, 0), PQgetvalue(stages, r, 1), PQgetvalue(stages, r, 2),
				   PQgetvalue(stages, r, 3), PQgetvalue(stages, r, 4), PQgetvalue(stages, r, 5),
				   PQgetvalue(stages, r, 6), PQgetvalue(stages, r, 7), PQgetvalue(stages, r, 8),
				   PQgetvalue(stages, r, 9), PQgetvalue(stages, r, 10), PQgetvalue(stages, r, 11));
		if (PQntuples(global) == 1)
			printf("\ndispatcher: %s stage passes, %s messages, %s failed by the dispatcher, "
				   "%s serialization retries\n            started %s, statistics as of %s\n",
				   PQgetvalue(global, 0, 0), PQgetvalue(global, 0, 1), PQgetvalue(global, 0, 2),
				   PQgetvalue(global, 0, 3),
				   *PQgetvalue(global, 0, 4) ? PQgetvalue(global, 0, 4) : "never",
				   PQgetvalue(global, 0, 5));
	}
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
		{NULL, 0, NULL, 0}
	};
	const char *config_path = getenv("PEPSI_CONFIG");
	bool		as_json = false;
	double		watch = 0;
	char		err[1024];
	struct pepsi_config *cfg;
	PGconn	   *conn;
	int			opt;
	int			rc;

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
				watch = optarg ? atof(optarg) : 2;
				if (watch <= 0)
				{
					fprintf(stderr, "pepsi-status: --watch takes a positive number of seconds\n");
					return 64;
				}
				break;
			case 'h':
				status_usage();
				return 0;
			default:
				status_usage();
				return 64;
		}
	if (optind < argc)
	{
		fprintf(stderr, "pepsi-status: unexpected argument \"%s\"\n", argv[optind]);
		status_usage();
		return 64;
	}
	if ((cfg = config_load(config_path ? config_path : PEPSI_CONFIG_DEFAULT_PATH, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "pepsi-status: %s\n", err);
		return 78;
	}
	if ((conn = db_connect(cfg, "pepsi-status", err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "pepsi-status: %s\n", err);
		return 75;
	}
	do
	{
		if (watch > 0 && !as_json)
			printf("\033[H\033[2J");
		rc = status_show(conn, as_json);
		if (watch > 0)
			usleep((useconds_t) (watch * 1e6));
	} while (watch > 0 && rc == 0);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
