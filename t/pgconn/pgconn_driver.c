/*
 * pgconn_driver.c: common/runtime/pgconn.c driven from a TAP test (t/132_pgconn.pl),
 * against a real cluster.  Usage: pepsi-test-pgconn CONF plain|pipeline
 * BACKOFF_MAX.  It connects with [database] CONNINFO of CONF, LISTENs on
 * pgconn_test and raises a notice in its set-up, then every 0.2 s asks the
 * server its backend pid (in pipeline mode: with a second statement and a
 * Sync).  What it is told goes to stdout, one line per event, for the test
 * to read; pgconn's own log lines go to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>
#include <libpq-fe.h>

#include "base/log.h"
#include "config/config.h"
#include "runtime/pgconn.h"

#define DRIVER_SETUP_SQL "LISTEN pgconn_test"
#define DRIVER_NOTICE_SQL "DO $$BEGIN RAISE NOTICE 'hello from the set-up'; END$$"
#define DRIVER_PID_SQL "SELECT pg_backend_pid()"
#define DRIVER_SECOND_SQL "SELECT 2"

static struct
{
	struct pgconn *conn;
	bool		   pipeline;
	int			   setup_step;
	ev_timer	   tick;
} driver;

static void
driver_on_setup(struct pgconn *c)
{
	driver.setup_step = 0;
	pgconn_send(c, DRIVER_SETUP_SQL, 0, NULL, NULL, NULL);
	if (driver.pipeline)
		pgconn_sync(c);
}

static void
driver_on_result(struct pgconn *c, int item, PGresult *res)
{
	ExecStatusType status = PQresultStatus(res);

	if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK)
		printf("error %d: %s\n", item, PQresultErrorMessage(res));
	else if (pgconn_state(c) == PGCONN_SETUP)
		printf("setup %d: %s\n", driver.setup_step, PQcmdStatus(res));
	else if (item == 0)
		printf("pid %s\n", PQgetvalue(res, 0, 0));
	else
		printf("item %d: %s\n", item, PQgetvalue(res, 0, 0));
}

static void
driver_on_done(struct pgconn *c)
{
	if (pgconn_state(c) == PGCONN_SETUP)
	{
		/* The second set-up statement: a notice, which goes to the log. */
		if (driver.setup_step++ == 0)
		{
			pgconn_send(c, DRIVER_NOTICE_SQL, 0, NULL, NULL, NULL);
			if (driver.pipeline)
				pgconn_sync(c);
		}
		return;
	}
	printf("done\n");
}

static void
driver_on_ready(struct pgconn *c)
{
	printf("ready\n");
}

static void
driver_on_notify(struct pgconn *c, const PGnotify *notify)
{
	printf("notify %s %s\n", notify->relname, notify->extra);
}

static void
driver_on_lost(struct pgconn *c, const char *reason)
{
	printf("lost %.1f\n", pgconn_backoff(c));
}

static void
driver_on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	if (pgconn_state(driver.conn) != PGCONN_IDLE)
		return;
	if (!pgconn_send(driver.conn, DRIVER_PID_SQL, 0, NULL, NULL, NULL))
		return;
	if (driver.pipeline && pgconn_send(driver.conn, DRIVER_SECOND_SQL, 0, NULL, NULL, NULL))
		pgconn_sync(driver.conn);
}

int
main(int argc, char **argv)
{
	static const struct pgconn_handlers handlers = {
		.setup = driver_on_setup,
		.result = driver_on_result,
		.done = driver_on_done,
		.ready = driver_on_ready,
		.notify = driver_on_notify,
		.lost = driver_on_lost,
	};
	struct pgconn_options options = {
		.section = "database",
		.option = "CONNINFO",
		.application_name = "pepsi-test-pgconn",
		.name = "test connection",
	};
	struct ev_loop		*loop = EV_DEFAULT;
	struct pepsi_config *cfg;
	char				 err[1024];

	if (argc != 4)
	{
		fprintf(stderr, "usage: %s CONF plain|pipeline BACKOFF_MAX\n", argv[0]);
		return 2;
	}
	log_init("pepsi-test-pgconn", false);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((cfg = config_load(argv[1], err, sizeof(err))) == NULL)
		fatalx("%s", err);
	options.cfg = cfg;
	driver.pipeline = strcmp(argv[2], "pipeline") == 0;
	options.pipeline = driver.pipeline;
	options.backoff_max = atof(argv[3]);
	driver.conn = pgconn_start(loop, &options, &handlers);
	ev_timer_init(&driver.tick, driver_on_tick, 0.2, 0.2);
	ev_timer_start(loop, &driver.tick);
	ev_run(loop, 0);
	return 0;
}
