/*
 * quota_gate.c: over quota at RCPT (pepsi-quota(8)).  A local recipient
 * whose mailbox the database knows to be at or over its limit
 * (pepsi.quota_full: the use the maildir stage last recorded against the
 * limits of pepsi.quota, or the day's messages against max_daily) gets
 * 452 4.2.2 at RCPT, so the client keeps the message and the other
 * recipients of the transaction are accepted.  A connection of its own
 * (common/runtime/pgconn.c) LISTENs on pepsi_quota, which the quota
 * functions notify when an address becomes full or stops being, and
 * reads the list at start, after every reconnect, on a notification and
 * every LOCAL_RECIPIENTS_REFRESH; a session never waits for it, and
 * until the first read (or with the database down) nobody is refused.
 * What ingress cannot know (a message that would push a mailbox over)
 * is the delivery's: the writer refuses it, and OVER_QUOTA_STATUS says
 * whether the message is retried or bounced.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "ingress.h"
#include "runtime/pgconn.h"

static struct
{
	struct pgconn *conn;
	ev_timer	   tick;
	bool		   due;
	bool		   warned; /* one warning per outage, not one per read */
	char		 **full;   /* sorted, lower case */
	size_t		   nfull;
} gate;

static int
quota_gate_compare(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

static void
quota_gate_query(void)
{
	if (!gate.due || pgconn_state(gate.conn) != PGCONN_IDLE)
		return;
	gate.due = false;
	pgconn_send(gate.conn, "SELECT a FROM pepsi.quota_full() a", 0, NULL, NULL, NULL);
}

static void
quota_gate_on_setup(struct pgconn *c)
{
	gate.due = true;
	pgconn_send(c, "LISTEN pepsi_quota", 0, NULL, NULL, NULL);
}

static void
quota_gate_on_ready(struct pgconn *c)
{
	quota_gate_query();
}

static void
quota_gate_on_result(struct pgconn *c, int item, PGresult *res)
{
	size_t n;

	if (PQresultStatus(res) == PGRES_COMMAND_OK)
		return; /* the LISTEN */
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (!gate.warned)
			log_warnx("quotas: cannot read pepsi.quota_full: %.*s; keeping what was read before",
					  (int) strcspn(PQresultErrorMessage(res), "\n"), PQresultErrorMessage(res));
		gate.warned = true;
		return;
	}
	if (gate.warned)
		log_info("quotas: pepsi.quota_full read again");
	gate.warned = false;
	for (size_t i = 0; i < gate.nfull; i++)
		free(gate.full[i]);
	free(gate.full);
	n = (size_t) PQntuples(res);
	gate.full = n ? xcalloc(n, sizeof(*gate.full)) : NULL;
	gate.nfull = n;
	for (size_t i = 0; i < n; i++)
		gate.full[i] = xstrdup(PQgetvalue(res, (int) i, 0));
	if (n)
		qsort(gate.full, n, sizeof(*gate.full), quota_gate_compare);
}

static void
quota_gate_on_notify(struct pgconn *c, const PGnotify *notify)
{
	gate.due = true;
	quota_gate_query();
}

static void
quota_gate_on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
	gate.due = true;
	quota_gate_query();
}

bool
quota_gate_full(const char *address)
{
	char	   *key;
	const char *k;
	bool		found;

	if (gate.nfull == 0)
		return false;
	key = xstrdup(address);
	for (char *p = key; *p; p++)
		if (*p >= 'A' && *p <= 'Z')
			*p = (char) (*p - 'A' + 'a');
	k = key;
	found = bsearch(&k, gate.full, gate.nfull, sizeof(*gate.full), quota_gate_compare) != NULL;
	free(key);
	return found;
}

void
quota_gate_start(double interval)
{
	static const struct pgconn_handlers handlers = {
		.setup = quota_gate_on_setup,
		.result = quota_gate_on_result,
		.ready = quota_gate_on_ready,
		.notify = quota_gate_on_notify,
	};
	struct pgconn_options options = {
		.cfg = ingress.cfg,
		.section = "ingress",
		.option = "CONNINFO",
		.application_name = "pepsi-ingress-quota",
		.name = "quotas",
		.backoff_max = interval,
	};

	gate.conn = pgconn_start(ingress.loop, &options, &handlers);
	ev_timer_init(&gate.tick, quota_gate_on_tick, interval, interval);
	ev_timer_start(ingress.loop, &gate.tick);
}

void
quota_gate_stop(void)
{
	if (ingress.loop == NULL || gate.conn == NULL)
		return;
	ev_timer_stop(ingress.loop, &gate.tick);
	pgconn_free(gate.conn);
	gate.conn = NULL;
	for (size_t i = 0; i < gate.nfull; i++)
		free(gate.full[i]);
	free(gate.full);
	gate.full = NULL;
	gate.nfull = 0;
}
