/*
 * claim.c: when the dispatcher claims, and what.  A claim is wanted when
 * capacity is freed or work may wait (dbconn_want_claim); it goes out when
 * the connection is free (dbconn.c sends it between jobs) and it is due
 * (claim_due: at once when workers idle, else coalesced with the answers
 * of the next few milliseconds).  It asks every stage with spare capacity
 * that may have pending rows, and its answer is handed to the pools.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "dispatch.h"
#include "runtime/db.h"

/*
 * How long the claim a worker's answer asks for may wait for the answers
 * that follow: one claim then serves them all.  Each claim costs the
 * server milliseconds with many senders, and one per answer kept it
 * claiming without pause under load.
 */
#define DBCONN_CLAIM_COALESCE 0.005

/* Whether a claim is wanted, and how soon. */
enum claim_want
{
	CLAIM_NOT_WANTED,
	CLAIM_WANTED,		 /* since wanted_since: due once coalesced, or urgent */
	CLAIM_WANTED_AT_ONCE /* (re)connected: nothing to coalesce with */
};

static struct
{
	enum claim_want want;
	double			wanted_since;
	ev_idle			idle;  /* the claim waits for the loop's other events */
	ev_timer		timer; /* ... and, unless urgent, for DBCONN_CLAIM_COALESCE */
} claim;

/* ---------------------------------------------------------------------------
 * The claim's answer, and building the claim
 * ------------------------------------------------------------------------- */

void
claim_done(PGresult *res)
{
	int rows;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("claim failed: %s", db_error(res, dbconn_pq()));
		return;
	}
	rows = PQntuples(res);
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		if (p->claim_asked > 0)
		{
			int count = 0;

			for (int i = 0; i < rows; i++)
				count += strcmp(PQgetvalue(res, i, 1), p->spec.name) == 0;
			pool_claimed(p, count);
		}
	for (int i = 0; i < rows; i++)
	{
		long long		id = atoll(PQgetvalue(res, i, 0));
		const char	   *stage = PQgetvalue(res, i, 1);
		struct pool	   *pool = pool_find(stage);
		struct inflight row = {.id = id};

		snprintf(row.token, sizeof(row.token), "%s", PQgetvalue(res, i, 3));

		if (pool && pool_assign(pool, id, PQgetvalue(res, i, 3), PQgetvalue(res, i, 2)))
			continue;

		/*
		 * No worker could take it (the program will not start, we are
		 * stopping, or a reload removed the stage meanwhile): back to
		 * pending, or it would stay running until the next start.
		 */
		dbconn_recover(stage, &row, 1, "pending", NULL);
	}
	pools_flush();
}

/*
 * Build and send the claim, if any stage has room (for lanes_only, room
 * in a light lane: pools_claim_urgency).  Returns whether sent.
 */
static bool
claim_send(bool lanes_only)
{
	double		now = now_seconds();
	struct buf	stages = BUF_INIT;
	struct buf	capacities = BUF_INIT;
	struct buf	costs = BUF_INIT;
	struct buf	acct_stages = BUF_INIT;
	struct buf	acct_senders = BUF_INIT;
	struct buf	acct_used = BUF_INIT;
	char		fifo[16];
	const char *values[7];
	int			nstages = 0;
	bool		sent;

	buf_append_char(&stages, '{');
	buf_append_char(&capacities, '{');
	buf_append_char(&costs, '{');
	buf_append_char(&acct_stages, '{');
	buf_append_char(&acct_senders, '{');
	buf_append_char(&acct_used, '{');
	for (struct pool *p = dispatcher.pools; p; p = p->next)
	{
		/* Only the stages that may have pending rows (pool_may_have_work). */
		int capacity = p->work == POOL_DRAINED ? 0
					   : lanes_only			   ? pool_lane_capacity(p, now)
											   : pool_capacity(p, now);

		p->claim_asked = capacity > 0 ? capacity : 0;
		if (capacity <= 0)
			continue;
		db_array_append(&stages, p->spec.name);
		buf_printf(&capacities, "%s%d", nstages ? "," : "", capacity);
		buf_printf(&costs, "%s%.1f", nstages ? "," : "", p->row_cost_us);
		fair_export(p->fair, p->spec.name, now, dispatcher.fair_half_life,
					p->row_cost_us * 0.01, &acct_stages, &acct_senders, &acct_used);
		nstages++;
	}
	buf_append_char(&stages, '}');
	buf_append_char(&capacities, '}');
	buf_append_char(&costs, '}');
	buf_append_char(&acct_stages, '}');
	buf_append_char(&acct_senders, '}');
	buf_append_char(&acct_used, '}');
	snprintf(fifo, sizeof(fifo), "%d", dispatcher.fair_fifo_percent);
	values[0] = stages.data;
	values[1] = capacities.data;
	values[2] = acct_stages.data;
	values[3] = acct_senders.data;
	values[4] = acct_used.data;
	values[5] = fifo;
	values[6] = costs.data;
	/* A claim that cannot be sent drops the connection, which logs why. */
	sent = nstages > 0 && dbconn_send_claim(7, values);
	if (sent)
		pools_claim_sent();
	buf_free(&stages);
	buf_free(&capacities);
	buf_free(&costs);
	buf_free(&acct_stages);
	buf_free(&acct_senders);
	buf_free(&acct_used);
	return sent;
}

/*
 * Whether the claim wanted should go now: a stage's workers idle with
 * work perhaps waiting, or it has waited DBCONN_CLAIM_COALESCE for the
 * answers after the first that asked for it; or a claim for the light
 * lanes only should (pools_claim_urgency).  Otherwise the timer is set
 * for when it may.
 */
static enum claim_urgency
claim_due(void)
{
	double			   now = now_seconds();
	double			   wait = claim.want == CLAIM_WANTED_AT_ONCE
								  ? 0
								  : claim.wanted_since + DBCONN_CLAIM_COALESCE - now;
	enum claim_urgency urgency = wait <= 0 ? CLAIM_NOW : pools_claim_urgency(now);

	if (urgency == CLAIM_NOW)
	{
		ev_timer_stop(dispatcher.loop, &claim.timer);
		return CLAIM_NOW;
	}
	if (!ev_is_active(&claim.timer))
	{
		ev_timer_set(&claim.timer, wait, 0);
		ev_timer_start(dispatcher.loop, &claim.timer);
	}
	return urgency;
}

/*
 * Ask for a claim: capacity was freed (an answer, a worker's exit), or
 * new_work may wait (a NOTIFY, the heartbeat, a new configuration).
 */
void
dbconn_want_claim(bool new_work)
{
	if (dispatcher.shutting_down)
		return;
	if (new_work)
		pools_may_have_work();
	if (claim.want == CLAIM_NOT_WANTED)
	{
		claim.wanted_since = now_seconds();
		claim.want = CLAIM_WANTED;
	}
	if (dbconn_idle() && claim_due() != CLAIM_LATER)
		ev_idle_start(dispatcher.loop, &claim.idle);
}

static void
claim_on_idle(struct ev_loop *loop, ev_idle *watcher, int revents)
{
	ev_idle_stop(loop, watcher);
	dbconn_send_work();
}

static void
claim_on_timer(struct ev_loop *loop, ev_timer *watcher, int revents)
{
	dbconn_send_work();
}


/* Send the claim if one is wanted and due; the rest stays wanted, for its timer. */
void
claim_send_if_due(void)
{
	enum claim_urgency urgency;

	if (claim.want == CLAIM_NOT_WANTED || dispatcher.shutting_down
		|| (urgency = claim_due()) == CLAIM_LATER)
		return;
	/* A claim for the lanes leaves the rest wanted, for its timer. */
	if (urgency != CLAIM_LANES)
		claim.want = CLAIM_NOT_WANTED;
	claim_send(urgency == CLAIM_LANES);
}

/* (Re)connected: every stage may have work, and the claim is due at once. */
void
claim_after_connect(void)
{
	claim.want = CLAIM_WANTED_AT_ONCE;
	pools_may_have_work();
}

/* A claim in flight is lost with the connection: the next one is due at once. */
void
claim_connection_lost(void)
{
	claim.want = CLAIM_WANTED_AT_ONCE;
}

void
claim_init(void)
{
	ev_idle_init(&claim.idle, claim_on_idle);
	ev_timer_init(&claim.timer, claim_on_timer, 0, 0);
}
