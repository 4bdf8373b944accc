/*
 * local_refresh.c: keeps the virtual mailboxes of ingress's local-recipient
 * resolver current.  A connection of its own, non-blocking and driven by
 * the event loop like admit.c's, reads pepsi.virtual_mailbox at start and
 * every LOCAL_RECIPIENTS_REFRESH; a session never waits for it.  Until the
 * first read succeeds, recipients only that table could confirm get 451.
 */
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "db.h"
#include "ingress.h"
#include "log.h"

enum refresh_state
{
	REFRESH_DOWN,		/* no connection: the next tick connects */
	REFRESH_CONNECTING, /* PQconnectPoll until CONNECTION_OK */
	REFRESH_QUERYING,	/* the SELECT is out */
	REFRESH_IDLE		/* waiting for the next tick */
};

static struct
{
	enum refresh_state		  state;
	PGconn					 *conn;
	PostgresPollingStatusType poll;
	ev_io					  io;
	ev_timer				  tick;
	bool					  warned; /* one warning per outage, not one per tick */
} refresh;

static void refresh_advance(int revents);

static void
refresh_watch(int events)
{
	ev_io_stop(ingress.loop, &refresh.io);
	ev_io_set(&refresh.io, PQsocket(refresh.conn), events);
	ev_io_start(ingress.loop, &refresh.io);
}

static void
refresh_fail(const char *why)
{
	if (!refresh.warned)
		log_warnx("local recipients: cannot read pepsi.virtual_mailbox: %.*s; keeping what "
				  "was read before",
				  (int) strcspn(why, "\n"), why);
	refresh.warned = true;
	ev_io_stop(ingress.loop, &refresh.io);
	if (refresh.conn)
		PQfinish(refresh.conn);
	refresh.conn = NULL;
	refresh.state = REFRESH_DOWN;
}

static void
refresh_connect(void)
{
	const char *keywords[] = {"dbname", "application_name", NULL};
	const char *values[] = {db_conninfo(ingress.cfg, "ingress", "CONNINFO"), "pepsi-ingress", NULL};

	refresh.conn = PQconnectStartParams(keywords, values, 1);
	if (refresh.conn == NULL || PQstatus(refresh.conn) == CONNECTION_BAD)
	{
		refresh_fail(refresh.conn ? PQerrorMessage(refresh.conn) : "out of memory");
		return;
	}
	refresh.state = REFRESH_CONNECTING;
	refresh.poll = PGRES_POLLING_WRITING;
	refresh_watch(EV_WRITE);
}

static void
refresh_query(void)
{
	if (PQsetnonblocking(refresh.conn, 1) != 0
		|| !PQsendQuery(refresh.conn, local_virtual_query) || PQflush(refresh.conn) < 0)
	{
		refresh_fail(PQerrorMessage(refresh.conn));
		return;
	}
	refresh.state = REFRESH_QUERYING;
	refresh_watch(EV_READ);
}

static void
refresh_read(void)
{
	PGresult *res;
	char	  err[1024];

	if (!PQconsumeInput(refresh.conn))
	{
		refresh_fail(PQerrorMessage(refresh.conn));
		return;
	}
	while (!PQisBusy(refresh.conn))
	{
		if ((res = PQgetResult(refresh.conn)) == NULL)
		{
			refresh.state = REFRESH_IDLE;
			refresh_watch(EV_READ);
			return;
		}
		if (!local_resolver_set_virtual(ingress.local_recipients, res, err, sizeof(err)))
		{
			PQclear(res);
			refresh_fail(err);
			return;
		}
		if (refresh.warned)
			log_info("local recipients: pepsi.virtual_mailbox read again");
		refresh.warned = false;
		PQclear(res);
	}
}

static void
refresh_advance(int revents)
{
	switch (refresh.state)
	{
		case REFRESH_DOWN:
			refresh_connect();
			break;
		case REFRESH_CONNECTING:
			refresh.poll = PQconnectPoll(refresh.conn);
			if (refresh.poll == PGRES_POLLING_FAILED)
				refresh_fail(PQerrorMessage(refresh.conn));
			else if (refresh.poll == PGRES_POLLING_READING)
				refresh_watch(EV_READ);
			else if (refresh.poll == PGRES_POLLING_WRITING)
				refresh_watch(EV_WRITE);
			else
				refresh_query();
			break;
		case REFRESH_QUERYING:
			refresh_read();
			break;
		case REFRESH_IDLE:
			if (revents == 0)
				refresh_query(); /* the tick */
			else if (!PQconsumeInput(refresh.conn) || PQstatus(refresh.conn) != CONNECTION_OK)
				refresh_fail(PQerrorMessage(refresh.conn));
			break;
	}
}

static void
refresh_on_readable(struct ev_loop *loop, ev_io *w, int revents)
{
	refresh_advance(revents);
}

static void
refresh_on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	/* A query still out (a slow server) is left to finish; the next tick tries again. */
	if (refresh.state == REFRESH_DOWN || refresh.state == REFRESH_IDLE)
		refresh_advance(0);
}

void
local_refresh_start(double interval)
{
	ev_init(&refresh.io, refresh_on_readable);
	ev_timer_init(&refresh.tick, refresh_on_tick, 0, interval);
	ev_timer_start(ingress.loop, &refresh.tick);
}

void
local_refresh_stop(void)
{
	if (ingress.loop == NULL)
		return;
	ev_timer_stop(ingress.loop, &refresh.tick);
	ev_io_stop(ingress.loop, &refresh.io);
	if (refresh.conn)
		PQfinish(refresh.conn);
	refresh.conn = NULL;
	refresh.state = REFRESH_DOWN;
}
