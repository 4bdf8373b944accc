/*
 * db_query.c: see db_query.h.  A FIFO of statements on one pgconn
 * (common/runtime/pgconn.h), sent one at a time when the connection is
 * idle; a query whose session went away is answered to nobody.
 */
#include "db_query.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "runtime/pgconn.h"

#define DB_QUERY_MAX_PARAMS 8
#define DB_QUERY_MAX_WAITING 10000

struct db_query
{
	char			*sql;
	int				 nparams;
	char			*values[DB_QUERY_MAX_PARAMS];
	db_query_fn		 fn; /* NULL: cancelled */
	void			*arg;
	bool			 answered;
	ev_timer		 notify; /* an answer without the database, from the loop */
	struct db_query *next;
};

static struct
{
	struct ev_loop	*loop;
	struct pgconn	*conn;
	struct db_query *head; /* the first is in flight when the connection is busy */
	struct db_query *tail;
	size_t			 waiting;
	bool			 in_flight;
} db;

static void
db_query_free(struct db_query *q)
{
	ev_timer_stop(db.loop, &q->notify);
	for (int i = 0; i < q->nparams; i++)
		free(q->values[i]);
	free(q->sql);
	free(q);
}

static struct db_query *
db_query_pop(void)
{
	struct db_query *q = db.head;

	db.head = q->next;
	if (db.head == NULL)
		db.tail = NULL;
	db.waiting--;
	return q;
}

static void
db_query_answer(struct db_query *q, const PGresult *res)
{
	if (q->fn)
		q->fn(q->arg, res);
	db_query_free(q);
}

/* handler: called from done or ready, where a send is allowed whatever the state says. */
static void
db_send_next(struct pgconn *c, bool handler)
{
	struct db_query *q = db.head;

	if (q == NULL || db.in_flight || (!handler && pgconn_state(c) != PGCONN_IDLE))
		return;
	db.in_flight = true;
	if (!pgconn_send(c, q->sql, q->nparams, (const char *const *) q->values, NULL, NULL))
		db.in_flight = false; /* lost: the handler answered the queue */
}

static void
db_on_result(struct pgconn *c, int item, PGresult *res)
{
	struct db_query *q;

	if (!db.in_flight || db.head == NULL || item != 0)
		return;
	q = db_query_pop();
	db.in_flight = false;
	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		log_warnx("database: %s", PQresultErrorMessage(res));
		db_query_answer(q, NULL);
	}
	else
		db_query_answer(q, res);
}

static void
db_on_ready(struct pgconn *c)
{
	db_send_next(c, true);
}

static void
db_on_lost(struct pgconn *c, const char *reason)
{
	/* Nothing waits for a database that is not there: every query is answered NULL. */
	db.in_flight = false;
	while (db.head)
		db_query_answer(db_query_pop(), NULL);
}

void
db_query_init(struct ev_loop *loop, const struct pepsi_config *cfg)
{
	static const struct pgconn_handlers handlers = {
		.result = db_on_result,
		.done = db_on_ready,
		.ready = db_on_ready,
		.lost = db_on_lost,
	};
	struct pgconn_options options = {
		.cfg = cfg,
		.section = "ingress",
		.option = "CONNINFO",
		.application_name = "pepsi-ingress",
		.name = "session checks",
	};

	db.loop = loop;
	db.conn = pgconn_start(loop, &options, &handlers);
}

bool
db_query_available(void)
{
	return db.conn != NULL;
}

void
db_query_shutdown(void)
{
	if (db.conn == NULL)
		return;
	pgconn_free(db.conn);
	db.conn = NULL;
	db.in_flight = false;
	while (db.head)
		db_query_answer(db_query_pop(), NULL);
}

static void
db_on_notify(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct db_query *q = w->data;

	db_query_answer(q, NULL);
}

struct db_query *
db_query_send(const char *sql, int nparams, const char *const *values, db_query_fn fn, void *arg)
{
	struct db_query *q = xcalloc(1, sizeof(*q));

	q->sql = xstrdup(sql);
	q->nparams = nparams < DB_QUERY_MAX_PARAMS ? nparams : DB_QUERY_MAX_PARAMS;
	for (int i = 0; i < q->nparams; i++)
		q->values[i] = values[i] ? xstrdup(values[i]) : NULL;
	q->fn = fn;
	q->arg = arg;
	ev_timer_init(&q->notify, db_on_notify, 0, 0);
	q->notify.data = q;
	/* Down, or too far behind: answered NULL at once (from the loop). */
	if (db.conn == NULL || pgconn_state(db.conn) == PGCONN_DOWN
		|| pgconn_state(db.conn) == PGCONN_CLOSED || db.waiting >= DB_QUERY_MAX_WAITING)
	{
		q->answered = true;
		ev_timer_start(db.loop, &q->notify);
		return q;
	}
	if (db.tail)
		db.tail->next = q;
	else
		db.head = q;
	db.tail = q;
	db.waiting++;
	db_send_next(db.conn, false);
	return q;
}

void
db_query_cancel(struct db_query *q)
{
	if (q == NULL)
		return;
	if (q->answered)
	{
		db_query_free(q);
		return;
	}
	/* Still queued or in flight: its answer goes to nobody. */
	q->fn = NULL;
}
