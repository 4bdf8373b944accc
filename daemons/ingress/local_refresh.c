/*
 * local_refresh.c: keeps the virtual mailboxes of ingress's local-recipient
 * resolver current.  A connection of its own (common/runtime/pgconn.c, driven by
 * the event loop) reads pepsi.virtual_mailbox at start, after every
 * reconnect, and every LOCAL_RECIPIENTS_REFRESH; a session never waits for
 * it.  Until the first read succeeds, recipients only that table could
 * confirm get 451.
 */
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "ingress.h"
#include "runtime/pgconn.h"

static struct
{
	struct pgconn *conn;
	ev_timer	   tick;
	bool		   due;			  /* a read is wanted: the tick came, or (re)connected */
	bool		   warned;		  /* one warning per outage, not one per tick */
	bool		   lists;		  /* the mailing lists' addresses are to be read next */
	bool		   reading_lists; /* ... and this is their read */
} refresh;

static void
refresh_warn(const char *why)
{
	if (!refresh.warned)
		log_warnx("local recipients: cannot read pepsi.virtual_mailbox: %.*s; keeping what "
				  "was read before",
				  (int) strcspn(why, "\n"), why);
	refresh.warned = true;
}

/* Read the table if due and the connection is free; else when it is (on_ready). */
static void
refresh_query(void)
{
	if (!refresh.due || pgconn_state(refresh.conn) != PGCONN_IDLE)
		return;
	refresh.due = false;
	refresh.lists = true;
	pgconn_send(refresh.conn, local_virtual_query, 0, NULL, NULL, NULL);
}

static void
refresh_on_setup(struct pgconn *c)
{
	refresh.due = true; /* what changed while we were away */
}

static void
refresh_on_ready(struct pgconn *c)
{
	if (refresh.lists)
	{
		refresh.lists = false;
		refresh.reading_lists = true;
		pgconn_send(refresh.conn, list_rcpt_query, 0, NULL, NULL, NULL);
		return;
	}
	refresh_query();
}

static void
refresh_on_result(struct pgconn *c, int item, PGresult *res)
{
	char err[1024];

	if (refresh.reading_lists)
	{
		refresh.reading_lists = false;
		list_rcpt_set(res);
		return;
	}
	if (!local_resolver_set_virtual(ingress.local_recipients, res, err, sizeof(err)))
	{
		refresh_warn(err);
		return;
	}
	if (refresh.warned)
		log_info("local recipients: pepsi.virtual_mailbox read again");
	refresh.warned = false;
}

static void
refresh_on_lost(struct pgconn *c, const char *reason)
{
	refresh.reading_lists = false;
	refresh_warn(reason);
}

static void
refresh_on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	/* A read still out (a slow server) is left to finish; the next tick tries again. */
	if (pgconn_state(refresh.conn) != PGCONN_IDLE)
		return;
	refresh.due = true;
	refresh_query();
}

void
local_refresh_start(double interval)
{
	static const struct pgconn_handlers handlers = {
		.setup = refresh_on_setup,
		.result = refresh_on_result,
		.ready = refresh_on_ready,
		.lost = refresh_on_lost,
	};
	struct pgconn_options options = {
		.cfg = ingress.cfg,
		.section = "ingress",
		.option = "CONNINFO",
		.application_name = "pepsi-ingress",
		.name = "local recipients",
		/* Never wait longer to reconnect than to refresh. */
		.backoff_max = interval,
	};

	refresh.conn = pgconn_start(ingress.loop, &options, &handlers);
	ev_timer_init(&refresh.tick, refresh_on_tick, interval, interval);
	ev_timer_start(ingress.loop, &refresh.tick);
}

void
local_refresh_stop(void)
{
	if (ingress.loop == NULL || refresh.conn == NULL)
		return;
	ev_timer_stop(ingress.loop, &refresh.tick);
	pgconn_free(refresh.conn);
	refresh.conn = NULL;
}
