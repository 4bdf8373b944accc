/*
 * admit.c: see admit.h.  Each connection is common/runtime/pgconn.c's machine in
 * pipeline mode; the pool hands queued admissions to whichever connection
 * is idle (admit_kick).
 *
 * Why pipelines rather than many connections: under fsync every commit
 * costs a WAL flush, and a pipeline of N calls with one Sync commits all N
 * with one flush and one round trip, while the backend does no more work
 * per message than for a single call.  A few connections keep the next
 * batch filling while one is flushing (bench/ingress measures the choice).
 *
 * The known clients' light admissions go into an open pipeline: each call
 * is sent as its message arrives, so the server runs it while another
 * batch's commit is flushing, and the Sync that commits them goes out
 * when the flush can take it at once (admit_gather).  PostgreSQL flushes
 * one commit at a time and, once a flush ends, the next covers every
 * commit that came in meanwhile (its group commit): so the open batch
 * commits at once when no gathered commit is in flight (the disk would
 * stand idle), and while one is, as soon as the sessions the last one
 * answered are back, its Sync then waiting behind that flush for the next
 * one.  At most ADMIT_GATHERED_MAX gathered commits are in flight, one
 * flushing and one waiting for it; the batch after them gathers.  A
 * burst's sessions then split into two cohorts whose flushes follow each
 * other with no gap, each cohort's round trips made during the other's
 * flush.  Measured (bench/ingress's burst, 20 sessions, 20,000 messages,
 * Pepsi alone, see the script's header): one gathered commit at a time,
 * which waited for the sessions it answered, carried 13-15 messages a
 * flush but left the disk idle 60% of the run while the sessions made
 * their round trips.
 */
#include "admit.h"
#include "admit_clients.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "dmarc_tally.h"
#include "runtime/db.h"
#include "runtime/pgconn.h"

#define ADMIT_STATEMENT "pepsi_ingress_admit"
#define ADMIT_SQL "SELECT pepsi.workqueue_add($1, $2::text[], $3, $4, $5::jsonb, $6::inet, $7, $8)"
/* With [pepsi] MAIL_LOG: the same, and the mail log's "received" row. */
#define ADMIT_LOGGED_STATEMENT "pepsi_ingress_admit_logged"
#define ADMIT_LOGGED_SQL \
	"SELECT pepsi.workqueue_add_logged($1, $2::text[], $3, $4, $5::jsonb, $6::inet, $7, $8, $9::jsonb)"
#define ADMIT_WAKE_SQL "SELECT pepsi.notify_workqueue()"
#define ADMIT_NICE_SQL "SELECT pepsi.session_nice($1::integer)"
#define ADMIT_REPORT_SQL \
	"SELECT pepsi.ingress_report($1, $2::integer, $3::bigint, $4::bigint, $5::boolean, $6::jsonb)"
/* The DMARC verdicts counted since the last report, in its transaction (dmarc_tally.c). */
#define ADMIT_DMARC_SQL "SELECT pepsi.dmarc_tally($1::jsonb)"
/* The first connection also hears configuration changes (config_set, config_unset). */
#define ADMIT_LISTEN_SQL "LISTEN pepsi_config_changed"
/* Changes often come in bursts (a script setting several options): one reload for all. */
#define ADMIT_CONFIG_CHANGED_DELAY 1.0
#define ADMIT_BATCH_BYTES (16 * 1024 * 1024)
#define ADMIT_BACKOFF_MIN 0.1
#define ADMIT_BACKOFF_MAX 10.0
/* Gathered commits in flight at once: one flushing, one waiting behind it (admit_gather). */
#define ADMIT_GATHERED_MAX 2
/*
 * The dispatcher is woken at most once per DISPATCH_WAKE_INTERVAL for
 * the clients already admitted in the interval: the first commit after a
 * quiet interval wakes it at once (a lone message must not wait the
 * interval out), and the commits after it share one wake at the
 * interval's end.  But a client admitted neither in this interval nor in
 * the one before waits for no other client's wake: a light sender's
 * message during a burst wakes the dispatcher at once, where the fair
 * claim takes it ahead of the burst, while the burst's own client, seen
 * in every interval, adds no wake to the interval's
 * (admit_clients_record).  Clients are told apart by address or
 * account (admit_clients.c); ADMIT_CLIENTS_KEPT of them are kept per interval, and the
 * wakes new clients cause are at least 1/ADMIT_WAKE_SPLIT of the interval
 * apart, so that many clients at once cost a bounded rate.
 */
#define ADMIT_WAKE_SPLIT 10

struct admission
{
	struct envelope	  envelope;
	admit_done_fn	  done; /* NULL once detached */
	void			 *arg;
	bool			  alone;   /* its batch failed: retry it in its own transaction */
	bool			  express; /* a new client's: ahead of the queue, in a batch of its own kind */
	bool			  heavy;   /* SMTP_HEAVY_MESSAGE octets or more: the first connection's lane */
	bool			  ok;
	long long		  id;
	double			  queued_at; /* when it was first queued (ev_now) */
	struct admission *next;
};

/* Admissions waiting for a connection, oldest first. */
struct admit_queue
{
	struct admission *head;
	struct admission *tail;
};

enum dbconn_work
{
	DBCONN_WORK_PREPARE,
	DBCONN_WORK_ADMIT,
	DBCONN_WORK_WAKE,
	DBCONN_WORK_REPORT
};

struct dbconn
{
	int			   index;
	bool		   express; /* new clients' admissions and wakes only */
	struct pgconn *pg;
	/* The pipeline in flight: the batch's calls (or one), then the Sync. */
	enum dbconn_work   work;
	struct admission **batch;
	size_t			   nbatch;
	bool			   carries_wake; /* the batch's transaction also wakes the dispatcher */
	bool			   open;		 /* the batch's calls are sent, its Sync not yet (admit_gather) */
	bool			   gathered;	 /* a batch from the open pipeline is committing */
	size_t			   bytes;		 /* the batch's headers and bodies */
	double			   sent_at;		 /* when the pipeline in flight was sent */
	bool			   failed;		 /* a call or the commit failed */
	char			   error[512];
	char			  *dmarc; /* the report's DMARC counts (dmarc_tally_take), given back if it fails */
};

static struct
{
	struct ev_loop			  *loop;
	const struct pepsi_config *cfg;
	struct admit_options	   options;
	struct dbconn			  *conns;
	int						   nconns;		/* DATABASE_CONNECTIONS and the express one */
	struct dbconn			  *express;		/* the last of conns */
	struct admit_queue		   queue;		/* the known clients' admissions */
	struct admit_queue		   new_queue;	/* new clients' (express) */
	struct admit_queue		   heavy_queue; /* the known clients' heavy admissions */
	size_t					   queued;
	size_t					   in_flight;
	ev_timer				   wake_timer;
	ev_timer				   config_changed_timer;
	char					   report[4][32];	/* the counters of the report waiting, as text */
	char					  *report_refusals; /* JSON */
	const char				  *report_instance;
	bool					   report_due;
	ev_prepare				   kick_watcher; /* batches what a loop iteration submitted */
	/*
	 * The open batch (admit_gather), and the sessions the last gathered
	 * commit answered that have not submitted their next message yet
	 * (the done callbacks' args).
	 */
	struct dbconn		*open;
	void			   **returning;
	size_t				 nreturning;
	bool				 kick_due;
	bool				 wake_due;
	double				 woken_at;		  /* when the last wake was sent */
	double				 wake_owed_since; /* the first commit no wake sent covers, or 0 */
	struct admit_clients clients;		  /* who is new to the wakes (admit_clients.c) */
	bool				 shutting_down;
} admit;

static void admit_kick(void);
static bool admit_client_is_new(const struct admission *a);

/*
 * The queue
 */

/* The queue a's kind of admission waits in. */
static struct admit_queue *
admit_queue_of(const struct admission *a)
{
	return a->express ? &admit.new_queue : a->heavy ? &admit.heavy_queue
													: &admit.queue;
}

/*
 * A new client's admission (admit_client_is_new) waits in a queue of its
 * own, served first by the express connection, and goes into a batch of
 * new clients' admissions only (dbconn_start_batch).  During a burst a
 * light sender's message then neither waits for the burst's admissions
 * queued before it nor commits with them: its batch is a small
 * transaction.  It costs the burst one small commit per new client, and
 * there are at most ADMIT_CLIENTS_KEPT new clients an interval.
 */
static void
admit_enqueue(struct admission *a, bool front)
{
	struct admit_queue *q = admit_queue_of(a);

	a->next = NULL;
	if (q->head == NULL)
		q->head = q->tail = a;
	else if (front)
	{
		a->next = q->head;
		q->head = a;
	}
	else
	{
		q->tail->next = a;
		q->tail = a;
	}
	admit.queued++;
}

static struct admission *
admit_dequeue(struct admit_queue *q)
{
	struct admission *a = q->head;

	if (a)
	{
		q->head = a->next;
		if (q->head == NULL)
			q->tail = NULL;
		admit.queued--;
	}
	return a;
}

static void
admit_complete(struct admission *a, bool ok, long long id)
{
	if (a->done)
		a->done(a->arg, ok, id);
	envelope_free(&a->envelope);
	free(a);
}

/* With no connection up, nothing queued can be stored: say so now. */
static void
admit_fail_queue(void)
{
	struct admission *a;

	while ((a = admit_dequeue(&admit.new_queue)) != NULL || (a = admit_dequeue(&admit.queue)) != NULL
		   || (a = admit_dequeue(&admit.heavy_queue)) != NULL)
		admit_complete(a, false, 0);
}

bool
admit_available(void)
{
	for (int i = 0; i < admit.nconns; i++)
		if (admit.conns[i].pg && pgconn_state(admit.conns[i].pg) != PGCONN_DOWN
			&& pgconn_state(admit.conns[i].pg) != PGCONN_CLOSED)
			return true;
	return false;
}

struct admission *
admit_submit(struct envelope *e, admit_done_fn done, void *arg)
{
	struct admission *a = xcalloc(1, sizeof(*a));

	a->envelope = *e;
	memset(e, 0, sizeof(*e));
	a->done = done;
	a->arg = arg;
	a->express = admit_client_is_new(a);
	a->heavy = a->envelope.headers.len + a->envelope.body.len >= SMTP_HEAVY_MESSAGE;
	a->queued_at = ev_now(admit.loop);
	admit_forget(arg);
	admit_enqueue(a, false);
	admit.kick_due = true;
	return a;
}

void
admit_forget(void *arg)
{
	for (size_t i = 0; i < admit.nreturning; i++)
		if (admit.returning[i] == arg)
		{
			admit.returning[i] = admit.returning[--admit.nreturning];
			admit.kick_due = true; /* the open batch may have waited for it alone */
			break;
		}
}

void
admit_detach(struct admission *a)
{
	a->done = NULL;
}

size_t
admit_pending(void)
{
	return admit.queued + admit.in_flight;
}

/*
 * One connection
 */

/* The connection is lost (pgconn logged why): fail what it carried. */
static void
dbconn_on_lost(struct pgconn *pg, const char *reason)
{
	struct dbconn *c = pgconn_arg(pg);

	for (size_t i = 0; i < c->nbatch; i++)
	{
		/* Sent but not known to be committed: the client must retry. */
		admit_complete(c->batch[i], false, 0);
		admit.in_flight--;
	}
	c->nbatch = 0;
	c->open = c->gathered = false;
	if (admit.open == c)
		admit.open = NULL;
	if (admit.shutting_down)
		pgconn_close(pg);
	if (!admit_available())
		admit_fail_queue();
}

/* Start a pipeline: the calls are queued by the caller, then this Sync. */
static bool
dbconn_send_sync(struct dbconn *c, enum dbconn_work work)
{
	c->work = work;
	c->sent_at = ev_now(admit.loop);
	c->failed = false;
	c->error[0] = '\0';
	return pgconn_sync(c->pg);
}

static bool
dbconn_send_admission(struct dbconn *c, struct admission *a)
{
	const struct envelope *e = &a->envelope;
	/* The logged statement takes one more parameter, the mail log's detail. */
	const char		*values[9] = {e->mail_from, e->rcpt_array, e->headers.data ? e->headers.data : "",
							  e->body.data ? e->body.data : "", e->state, e->client_ip,
								  e->auth_account, admit.options.stage, e->log_detail};
	int				 lengths[9] = {0, 0, (int) e->headers.len, (int) e->body.len, 0, 0, 0, 0, 0};
	static const int formats[9] = {0, 0, 1, 1, 0, 0, 0, 0, 0};

	return pgconn_send_prepared(c->pg, e->log_detail ? ADMIT_LOGGED_STATEMENT : ADMIT_STATEMENT,
								e->log_detail ? 9 : 8, values, lengths, formats);
}

/*
 * Whether the known clients' admission a waits for the new clients'
 * batch the express connection is storing: it does when it was queued
 * after that batch went out.  Meanwhile the other connections start no
 * batch of it (dbconn_queue): the batches already in flight finish, and
 * the light sender's small transaction then has the database's CPU and
 * WAL flush to itself rather than sharing them with the burst's next
 * batches.  This is how the pool ranks a light sender's message ahead of
 * a burst: by the order of Pepsi's own work, which costs nothing against
 * the host's other processes.  A nice value on the bulk sessions
 * (BULK_NICE) ranks them against every other process on the machine as
 * well (the kernel's autogroups weigh each backend's session against all
 * the others, see extension/src/session.c): on a host with other work it
 * gave the burst's admissions a tenth of a CPU's share, so it is off by
 * default.  Only the batch in flight when a arrived is waited for, never
 * the next: a steady stream of new clients (an MX's usual traffic, where
 * most senders are new) cannot hold the known clients' messages back for
 * more than one small transaction, and the other connections still take
 * new clients' messages when the express connection is busy.
 */
static bool
admit_waits_for_express(const struct admission *a)
{
	return pgconn_state(admit.express->pg) == PGCONN_BUSY && admit.express->work == DBCONN_WORK_ADMIT
		   && a->queued_at >= admit.express->sent_at;
}

/*
 * The queue an idle connection c takes its next batch from, or NULL.  The
 * express connection serves the new clients only; the others serve the
 * known clients, and the new clients too when the express connection
 * cannot take them now (busy, or not connected) and they have nothing
 * else to do: while a burst keeps them busy, they never do.  A known
 * client's batch waits while the express connection stores the new
 * clients' batch that went out before it was queued
 * (admit_waits_for_express).
 */
static struct admit_queue *
dbconn_queue(const struct dbconn *c)
{
	if (c->express)
		return admit.new_queue.head ? &admit.new_queue : NULL;
	/*
	 * Heavy admissions go to the first connection, first, and to the
	 * others only while it is down: they never share a batch with light
	 * ones nor take more than one connection from them, so the light
	 * ones' transactions stay small and quick beside a client storing
	 * the biggest messages it may, in a loop.
	 */
	if (admit.heavy_queue.head && (c->index == 0 || pgconn_state(admit.conns[0].pg) == PGCONN_DOWN)
		&& !admit_waits_for_express(admit.heavy_queue.head))
		return &admit.heavy_queue;
	if (admit.queue.head && !admit_waits_for_express(admit.queue.head))
		return &admit.queue;
	if (admit.new_queue.head && pgconn_state(admit.express->pg) != PGCONN_IDLE)
		return &admit.new_queue;
	return NULL;
}

/* Whether c's batch has room for a: BATCH_SIZE calls, ADMIT_BATCH_BYTES, and alone means alone. */
static bool
dbconn_has_room(const struct dbconn *c, const struct admission *a)
{
	size_t size = a->envelope.headers.len + a->envelope.body.len;

	if (c->nbatch == 0)
		return true;
	return c->nbatch < (size_t) admit.options.batch_size && !a->alone && !c->batch[c->nbatch - 1]->alone
		   && c->bytes + size <= ADMIT_BATCH_BYTES;
}

/*
 * Move queued admissions of q into c's batch while it has room, sending
 * each one's call.  An open batch takes none that must wait for the new
 * clients' batch in flight (admit_waits_for_express).  False if a call
 * could not be sent: the connection is dropped, and its lost handler
 * failed the batch.
 */
static bool
dbconn_take(struct dbconn *c, struct admit_queue *q)
{
	struct admission *a;

	while ((a = q->head) != NULL && dbconn_has_room(c, a) && !(c->open && admit_waits_for_express(a)))
	{
		admit_dequeue(q);
		if (a->done == NULL)
		{
			/* Its client left before an answer: it need not be stored. */
			admit_complete(a, false, 0);
			continue;
		}
		c->batch[c->nbatch++] = a;
		c->bytes += a->envelope.headers.len + a->envelope.body.len;
		admit.in_flight++;
		if (!dbconn_send_admission(c, a))
			return false;
	}
	return true;
}

/* Take queued admissions of one kind as one batch (one transaction). */
static void
dbconn_start_batch(struct dbconn *c, struct admit_queue *q)
{
	c->nbatch = 0;
	c->bytes = 0;
	if (!dbconn_take(c, q) || c->nbatch == 0)
		return;
	/*
	 * A batch of new clients' messages would wake the dispatcher as soon
	 * as it commits (admit_wake_for): the wake rides in its transaction
	 * instead, so the dispatcher hears of the rows as they commit, not a
	 * round trip later, and the wake costs no transaction of its own.
	 * Unless the last wake was too recent (ADMIT_WAKE_SPLIT): the
	 * timer's wake then serves them, as before.
	 */
	c->carries_wake = c->batch[0]->express
					  && ev_now(admit.loop) - admit.woken_at
							 >= admit.options.wake_interval / ADMIT_WAKE_SPLIT;
	if (c->carries_wake && !pgconn_send(c->pg, ADMIT_WAKE_SQL, 0, NULL, NULL, NULL))
		return;
	dbconn_send_sync(c, DBCONN_WORK_ADMIT);
}

/* Open a batch of the known clients' admissions on the idle connection c (admit_gather). */
static void
dbconn_open_batch(struct dbconn *c)
{
	c->nbatch = 0;
	c->bytes = 0;
	c->open = true;
	admit.open = c;
	if (!dbconn_take(c, &admit.queue))
		return;
	if (c->nbatch == 0)
	{
		c->open = false;
		admit.open = NULL;
		return;
	}
	(void) pgconn_push(c->pg); /* false: dropped, and the lost handler closed the batch */
}

/*
 * The open batch takes what the known clients queued, its calls going
 * out as they come, and commits (see the top of the file):
 *   - when it is full, at once, as a batch of the old kind would;
 *   - when no gathered commit is in flight, at once: waiting would leave
 *     the disk idle;
 *   - when one is, as soon as the sessions the last one answered are all
 *     back (they made their round trips during its flush), its commit
 *     then queued behind that flush, or else when the one in flight
 *     completes (a session that left never comes back);
 *   - never while ADMIT_GATHERED_MAX are: their completion kicks.
 * The calls are run by the server as they arrive, so the Sync carries no
 * work but the commit itself.
 */
static void
admit_gather(void)
{
	struct dbconn *c = admit.open;
	size_t		   before;
	int			   committing = 0;

	if (c == NULL)
		return;
	before = c->nbatch;
	if (!dbconn_take(c, &admit.queue) || (c->nbatch > before && !pgconn_push(c->pg)))
		return;
	if (admit.queue.head == NULL || dbconn_has_room(c, admit.queue.head))
	{
		for (int i = 0; i < admit.nconns; i++)
			committing += admit.conns[i].gathered;
		if (committing >= ADMIT_GATHERED_MAX || (committing > 0 && admit.nreturning > 0))
			return; /* a completion, or the last of the sessions awaited, kicks */
	}
	admit.open = NULL;
	c->open = false;
	c->gathered = true;
	c->carries_wake = false;
	dbconn_send_sync(c, DBCONN_WORK_ADMIT);
}

/*
 * c's gathered batch committed: its sessions are the ones the open batch
 * awaits (admit_gather), in place of the ones an earlier commit answered
 * that have not come back.
 */
static void
admit_gathered(struct dbconn *c)
{
	admit.nreturning = 0;
	for (size_t i = 0; i < c->nbatch; i++)
		if (c->batch[i]->done)
			admit.returning[admit.nreturning++] = c->batch[i]->arg;
}

static void
dbconn_start_wake(struct dbconn *c)
{
	admit.wake_due = false;
	admit.woken_at = ev_now(admit.loop);
	admit.wake_owed_since = 0; /* it commits after every commit it is owed for */
	ev_timer_stop(admit.loop, &admit.wake_timer);
	if (pgconn_send(c->pg, ADMIT_WAKE_SQL, 0, NULL, NULL, NULL))
		dbconn_send_sync(c, DBCONN_WORK_WAKE);
}

static void
dbconn_start_report(struct dbconn *c)
{
	const char *values[6] = {admit.report_instance, admit.report[0], admit.report[1], admit.report[2],
							 "false", admit.report_refusals};

	char *dmarc = dmarc_tally_take();

	admit.report_due = false;
	if (pgconn_send(c->pg, ADMIT_REPORT_SQL, 6, values, NULL, NULL)
		&& (dmarc == NULL || pgconn_send(c->pg, ADMIT_DMARC_SQL, 1, (const char *const *) &dmarc, NULL, NULL)))
	{
		c->dmarc = dmarc;
		dbconn_send_sync(c, DBCONN_WORK_REPORT);
		return;
	}
	dmarc_tally_return(dmarc);
	free(dmarc);
}

void
admit_report(const struct admit_report *r)
{
	admit.report_instance = r->instance;
	snprintf(admit.report[0], sizeof(admit.report[0]), "%llu", r->sessions);
	snprintf(admit.report[1], sizeof(admit.report[1]), "%llu", r->sessions_total);
	snprintf(admit.report[2], sizeof(admit.report[2]), "%llu", r->messages);
	free(admit.report_refusals);
	admit.report_refusals = r->refusals ? xstrdup(r->refusals) : NULL;
	admit.report_due = true;
	admit.kick_due = true;
}

/* The client of a, for the wakes and the queue: its account, else its address. */
static const char *
admit_client(const struct admission *a)
{
	const char *client = a->envelope.auth_account ? a->envelope.auth_account
												  : a->envelope.client_ip;

	return client ? client : "";
}

/* Whether the client of a is new (admit_clients.h), recording nothing. */
static bool
admit_client_is_new(const struct admission *a)
{
	return admit_clients_is_new(&admit.clients, admit_client(a), ev_now(admit.loop), admit.options.wake_interval);
}

/*
 * A batch that carried a wake committed: the wake also covers the commits
 * owed one that were seen before the batch was sent, which committed
 * before it did, as a wake of its own would have.  A commit seen in the
 * same loop iteration is not counted as before: it keeps its own wake.
 */
static void
admit_wake_carried(double sent_at)
{
	if (admit.wake_owed_since == 0 || admit.wake_owed_since >= sent_at)
		return;
	admit.wake_owed_since = 0;
	admit.wake_due = false;
	ev_timer_stop(admit.loop, &admit.wake_timer);
}

/*
 * c's batch was committed: wake the dispatcher now, or at the interval's
 * end (see ADMIT_CLIENTS_KEPT); or it was, by the batch's own transaction
 * (carries_wake, dbconn_start_batch).
 */
static void
admit_wake_for(const struct dbconn *c)
{
	double since = ev_now(admit.loop) - admit.woken_at;
	double wait = admit.options.wake_interval - since;
	bool   new_client = false;

	for (size_t i = 0; i < c->nbatch; i++)
		new_client |= admit_clients_record(&admit.clients, admit_client(c->batch[i]), ev_now(admit.loop),
										   admit.options.wake_interval);
	if (c->carries_wake)
	{
		admit.woken_at = ev_now(admit.loop);
		admit_wake_carried(c->sent_at);
		return;
	}
	if (admit.wake_owed_since == 0)
		admit.wake_owed_since = ev_now(admit.loop);
	if (admit.wake_due)
		return;
	if (new_client)
		wait = admit.options.wake_interval / ADMIT_WAKE_SPLIT - since;
	if (wait <= 0)
	{
		admit.wake_due = true;
		admit.kick_due = true;
		return;
	}
	/* A new client's wake comes sooner than the interval's end a timer may be set for. */
	if (ev_is_active(&admit.wake_timer) && ev_timer_remaining(admit.loop, &admit.wake_timer) > wait)
		ev_timer_stop(admit.loop, &admit.wake_timer);
	if (!ev_is_active(&admit.wake_timer))
	{
		ev_timer_set(&admit.wake_timer, wait, 0);
		ev_timer_start(admit.loop, &admit.wake_timer);
	}
}

/* The pipeline's results are all in: answer the sessions. */
static void
dbconn_on_done(struct pgconn *pg)
{
	struct dbconn *c = pgconn_arg(pg);

	if (c->failed)
		log_warnx("database connection %d: %s", c->index, c->error);
	switch (c->work)
	{
		case DBCONN_WORK_PREPARE:
			if (c->failed)
			{
				pgconn_reset(pg, "cannot prepare the admission statements or set the session's nice value");
				return;
			}
			log_info("database connection %d ready%s", c->index,
					 c->express ? " (new clients' admissions)" : "");
			break;
		case DBCONN_WORK_WAKE:
			if (c->failed)
			{
				admit.wake_due = true;
				if (admit.wake_owed_since == 0)
					admit.wake_owed_since = c->sent_at;
			}
			break;
		case DBCONN_WORK_REPORT:
			/* A failure is logged above; the next report tries again, with these counts. */
			if (c->failed)
				dmarc_tally_return(c->dmarc);
			free(c->dmarc);
			c->dmarc = NULL;
			break;
		case DBCONN_WORK_ADMIT:
			if (c->gathered && !c->failed)
				admit_gathered(c);
			c->gathered = false;
			if (!c->failed)
			{
				admit_wake_for(c);
				for (size_t i = 0; i < c->nbatch; i++)
					admit_complete(c->batch[i], true, c->batch[i]->id);
			}
			else if (c->nbatch > 1)
			{
				/* One bad call sank the batch: each goes again on its own. */
				for (size_t i = c->nbatch; i-- > 0;)
				{
					c->batch[i]->alone = true;
					admit_enqueue(c->batch[i], true);
				}
			}
			else
				admit_complete(c->batch[0], false, 0);
			admit.in_flight -= c->nbatch;
			c->nbatch = 0;
			break;
	}
}

/* One call's result (item: its place in the pipeline; past the calls, the commit). */
static void
dbconn_on_result(struct pgconn *pg, int item, PGresult *res)
{
	struct dbconn *c = pgconn_arg(pg);
	ExecStatusType status = PQresultStatus(res);

	if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK)
	{
		if (c->work == DBCONN_WORK_ADMIT && (size_t) item < c->nbatch && PQntuples(res) == 1)
			c->batch[item]->id = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	}
	else if (!c->failed)
	{
		c->failed = true;
		snprintf(c->error, sizeof(c->error), "%s", db_error(res, pgconn_conn(pg)));
	}
}

/* pepsi_config_changed: a reload a moment later, however many arrive meanwhile. */
static void
dbconn_on_notify(struct pgconn *pg, const PGnotify *notify)
{
	if (strcmp(notify->relname, "pepsi_config_changed") == 0 && admit.options.config_changed
		&& !ev_is_active(&admit.config_changed_timer) && !admit.shutting_down)
	{
		ev_timer_set(&admit.config_changed_timer, ADMIT_CONFIG_CHANGED_DELAY, 0);
		ev_timer_start(admit.loop, &admit.config_changed_timer);
	}
}

/*
 * A new session: the statements, the first one's LISTEN, and a bulk
 * connection's nice value (BULK_NICE, see the top of the file), in one
 * pipeline.  A server that refuses the nice value (an extension older
 * than the program) fails the connection with the server's words, as a
 * failed PREPARE does: set BULK_NICE = 0 or update the extension.
 */
static void
dbconn_on_setup(struct pgconn *pg)
{
	struct dbconn *c = pgconn_arg(pg);
	char		   nice[16];

	if (!pgconn_send_prepare(pg, ADMIT_STATEMENT, ADMIT_SQL, 0)
		|| !pgconn_send_prepare(pg, ADMIT_LOGGED_STATEMENT, ADMIT_LOGGED_SQL, 0))
		return;
	if (c->index == 0 && !pgconn_send(pg, ADMIT_LISTEN_SQL, 0, NULL, NULL, NULL))
		return;
	if (!c->express && admit.options.bulk_nice > 0)
	{
		const char *values[1] = {nice};

		snprintf(nice, sizeof(nice), "%d", admit.options.bulk_nice);
		if (!pgconn_send(pg, ADMIT_NICE_SQL, 1, values, NULL, NULL))
			return;
	}
	dbconn_send_sync(c, DBCONN_WORK_PREPARE);
}

static void
dbconn_on_ready(struct pgconn *pg)
{
	admit_kick();
}

/*
 * The pool
 */

/* Give work to the idle connections. */
static void
admit_kick(void)
{
	static bool running;
	static bool again;

	if (running)
	{
		again = true; /* a completion inside the loop below: go round again */
		return;
	}
	running = true;
	do
	{
		again = false;
		/*
		 * The express connection, the last, takes what the others leave
		 * it; but when new clients' messages wait it goes first, so that
		 * the known clients' messages queued after it then wait for it
		 * (admit_waits_for_express).
		 */
		int first = admit.new_queue.head ? admit.nconns - 1 : 0;

		for (int i = 0; i < admit.nconns; i++)
		{
			struct dbconn	   *c = &admit.conns[(first + i) % admit.nconns];
			struct admit_queue *q;

			if (pgconn_state(c->pg) != PGCONN_IDLE)
				continue;
			if (admit.wake_due)
				dbconn_start_wake(c);
			else if (admit.report_due && !c->express)
				dbconn_start_report(c);
			else if ((q = dbconn_queue(c)) != NULL)
			{
				/* The known clients' admissions go into the open batch while it has room. */
				if (q == &admit.queue && !q->head->alone && admit.open == NULL)
					dbconn_open_batch(c);
				else if (!(q == &admit.queue && admit.open && dbconn_has_room(admit.open, q->head)))
					dbconn_start_batch(c, q);
			}
		}
		admit_gather();
	} while (again);
	running = false;
}

/*
 * Before the loop sleeps: everything the sessions submitted during this
 * iteration goes out together, which is what fills a batch.
 */
static void
admit_on_prepare(struct ev_loop *loop, ev_prepare *w, int revents)
{
	if (admit.kick_due)
	{
		admit.kick_due = false;
		admit_kick();
	}
}

static void
admit_on_config_changed(struct ev_loop *loop, ev_timer *w, int revents)
{
	admit.options.config_changed();
}

static void
admit_on_wake(struct ev_loop *loop, ev_timer *w, int revents)
{
	admit.wake_due = true;
	admit_kick();
}

void
admit_init(struct ev_loop *loop, const struct pepsi_config *cfg, const struct admit_options *options)
{
	admit.loop = loop;
	admit.cfg = cfg;
	admit.options = *options;
	admit.nconns = options->connections + 1;
	admit.conns = xcalloc((size_t) admit.nconns, sizeof(*admit.conns));
	admit.express = &admit.conns[options->connections];
	admit.express->express = true;
	admit.returning = xcalloc((size_t) options->batch_size, sizeof(*admit.returning));
	ev_timer_init(&admit.wake_timer, admit_on_wake, 0, 0);
	ev_timer_init(&admit.config_changed_timer, admit_on_config_changed, 0, 0);
	ev_prepare_init(&admit.kick_watcher, admit_on_prepare);
	ev_prepare_start(loop, &admit.kick_watcher);
	for (int i = 0; i < admit.nconns; i++)
	{
		static const struct pgconn_handlers handlers = {
			.setup = dbconn_on_setup,
			.result = dbconn_on_result,
			.done = dbconn_on_done,
			.ready = dbconn_on_ready,
			.notify = dbconn_on_notify,
			.lost = dbconn_on_lost,
		};
		struct dbconn		 *c = &admit.conns[i];
		char				  name[64];
		struct pgconn_options pg = {
			.cfg = cfg,
			.section = "ingress",
			.option = "CONNINFO",
			.application_name = c->express ? "pepsi-ingress-express" : "pepsi-ingress",
			.name = name,
			.pipeline = true,
			.backoff_min = ADMIT_BACKOFF_MIN,
			.backoff_max = ADMIT_BACKOFF_MAX,
			.arg = c,
		};

		snprintf(name, sizeof(name), "database connection %d", i);
		c->index = i;
		c->batch = xcalloc((size_t) options->batch_size, sizeof(*c->batch));
		c->pg = pgconn_start(loop, &pg, &handlers);
	}
}

void
admit_shutdown(void)
{
	bool wake = admit.wake_due || ev_is_active(&admit.wake_timer);
	bool report_removed = false;

	admit.shutting_down = true;
	ev_timer_stop(admit.loop, &admit.wake_timer);
	ev_timer_stop(admit.loop, &admit.config_changed_timer);
	ev_prepare_stop(admit.loop, &admit.kick_watcher);
	for (int i = 0; i < admit.nconns; i++)
	{
		struct dbconn *c = &admit.conns[i];
		/* Only an idle connection: what is in flight on the others is abandoned. */
		PGconn *conn = pgconn_state(c->pg) == PGCONN_IDLE ? pgconn_detach(c->pg) : NULL;

		if (conn)
		{
			/* Rows committed in the last interval still deserve their wake. */
			if (wake)
			{
				PQclear(PQexec(conn, ADMIT_WAKE_SQL));
				wake = false;
			}
			/* The instance's statistics row goes with it. */
			if (admit.report_instance && !report_removed)
			{
				const char *values[6] = {admit.report_instance, "0", "0", "0", "true", NULL};

				PQclear(PQexecParams(conn, ADMIT_REPORT_SQL, 6, NULL, values, NULL, NULL, 0));
				report_removed = true;
			}
			PQfinish(conn);
		}
		pgconn_free(c->pg);
		free(c->batch);
	}
	free(admit.conns);
	free(admit.returning);
	admit.returning = NULL; /* a session closed after this awaits nothing (admit_forget) */
	admit.nreturning = 0;
}
