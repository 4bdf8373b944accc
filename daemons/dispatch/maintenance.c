/*
 * maintenance.c: no queue without maintenance.
 *
 * Paused rows go back to pending only when the extension's maintenance
 * worker requeues them.  Without shared_preload_libraries that worker runs
 * only once someone calls pepsi.start_maintenance(), and one started so is
 * gone after a PostgreSQL restart: the rows would wait for ever.  So the
 * dispatcher asks who serves the database (pepsi.maintenance_pid()) when it
 * connects and every MAINTENANCE_CHECK_INTERVAL; if nobody does it starts a
 * worker, and if its role may not, it requeues the due rows itself every
 * MAINTENANCE_REQUEUE_INTERVAL, and tells the DBA once how to fix it.
 */
#include <stdlib.h>

#include "base/log.h"
#include "dispatch.h"
#include "runtime/db.h"

#define MAINTENANCE_CHECK_INTERVAL 10.0
#define MAINTENANCE_REQUEUE_INTERVAL 1.0
/* Rows requeued per statement, as the worker's pass does. */
#define MAINTENANCE_REQUEUE_SQL "SELECT pepsi.workqueue_requeue_due(10000)"

enum maintenance_state
{
	MAINTENANCE_UNKNOWN,	/* not asked yet */
	MAINTENANCE_SERVED,		/* a worker serves the database */
	MAINTENANCE_STARTING,	/* pepsi.start_maintenance() is on its way */
	MAINTENANCE_STANDING_IN /* none, and we may not start one: we requeue */
};

static struct
{
	enum maintenance_state state;
	bool				   busy; /* a statement of ours is queued or in flight */
	double				   next_check;
	double				   next_requeue;
} watch;

static void
maintenance_on_requeued(PGresult *res, void *arg)
{
	watch.busy = false;
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_warnx("cannot requeue the paused rows that are due: %s", db_error(res, NULL));
	else if (atoi(PQgetvalue(res, 0, 0)) > 0)
		log_debug("requeued %s paused rows that were due", PQgetvalue(res, 0, 0));
}

static void
maintenance_on_started(PGresult *res, void *arg)
{
	watch.busy = false;
	if (PQresultStatus(res) == PGRES_TUPLES_OK)
	{
		log_warnx("no maintenance worker served the database, so paused rows would never be "
				  "retried: started one (pid %s).  It does not survive a PostgreSQL restart: add "
				  "pepsi to shared_preload_libraries (with pepsi.database) to have one always",
				  PQgetvalue(res, 0, 0));
		watch.state = MAINTENANCE_SERVED;
		return;
	}
	log_warnx("no maintenance worker serves the database and this role may not start one (%s): "
			  "pepsi-dispatch requeues the paused rows that are due itself.  To fix it, add pepsi "
			  "to shared_preload_libraries (with pepsi.database), or have the owner of the "
			  "extension run SELECT pepsi.start_maintenance() after every PostgreSQL start",
			  PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY));
	watch.state = MAINTENANCE_STANDING_IN;
	watch.next_requeue = 0;
}

static void
maintenance_on_pid(PGresult *res, void *arg)
{
	int pid;

	watch.busy = false;
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("cannot tell whether a maintenance worker serves the database: %s",
				  db_error(res, NULL));
		return;
	}
	pid = atoi(PQgetvalue(res, 0, 0));
	if (pid > 0)
	{
		if (watch.state == MAINTENANCE_STANDING_IN)
			log_info("a maintenance worker (pid %d) serves the database again; pepsi-dispatch "
					 "no longer requeues paused rows itself",
					 pid);
		watch.state = MAINTENANCE_SERVED;
	}
	else if (watch.state != MAINTENANCE_STANDING_IN)
	{
		/* Gone (a restart) or never there: start one, if this role may. */
		watch.state = MAINTENANCE_STARTING;
		watch.busy = true;
		dbconn_submit("SELECT pepsi.start_maintenance()", maintenance_on_started, NULL);
	}
}

/* Ask again at once: on a new connection, the server may have restarted. */
void
maintenance_check_soon(void)
{
	watch.next_check = 0;
}

/* Called from the housekeeping timer. */
void
maintenance_watch(double now)
{
	if (watch.busy || dispatcher.shutting_down)
		return;
	if (now >= watch.next_check)
	{
		watch.next_check = now + MAINTENANCE_CHECK_INTERVAL;
		watch.busy = true;
		dbconn_submit("SELECT pepsi.maintenance_pid()", maintenance_on_pid, NULL);
	}
	else if (watch.state == MAINTENANCE_STANDING_IN && now >= watch.next_requeue)
	{
		watch.next_requeue = now + MAINTENANCE_REQUEUE_INTERVAL;
		watch.busy = true;
		dbconn_submit(MAINTENANCE_REQUEUE_SQL, maintenance_on_requeued, NULL);
	}
}
