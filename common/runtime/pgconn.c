/*
 * pgconn.c: see pgconn.h.  The machine is the state enum advanced by
 * pgconn_advance on socket events and the reconnect timer, the way pg_cron
 * drives its libpq tasks: connect (PQconnectStart, PQconnectPoll), the
 * owner's set-up statements, then idle and busy in turn.  Its owners used
 * to carry a copy each, and the copies had drifted apart in how they
 * logged a loss and how long they waited before trying again.
 *
 * Reentrancy: a handler may drop or close the connection it was called
 * for, so after every handler the code checks the generation (bumped on
 * each drop) and stops if it moved.
 */
#include "runtime/pgconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "runtime/db.h"

#define PGCONN_BACKOFF_MIN 0.1
#define PGCONN_BACKOFF_MAX 30.0
/*
 * No wait is longer than this share of the outage so far: once the
 * server is back (a standby promoted), a client finds it within a tenth of
 * the time it was away, where a wait grown to backoff_max over a 12 s
 * failover could add up to backoff_max.  A long outage still costs a
 * logarithmic number of attempts until waits reach backoff_max.
 */
#define PGCONN_BACKOFF_OUTAGE_SHARE 0.1
#define PGCONN_READ_ONLY_SQLSTATE "25006"
#define PGCONN_STANDBY_REASON "the server is a standby (in recovery)"

struct pgconn
{
	struct ev_loop		  *loop;
	enum pgconn_state	   state;
	PGconn				  *conn;
	ev_io				   io;
	ev_timer			   retry;
	struct pgconn_handlers handlers;
	char				  *conninfo;
	char				  *application_name;
	char				  *name;
	bool				   pipeline;
	bool				   may_be_standby;
	double				   backoff_min;
	double				   backoff_max;
	double				   backoff;
	double				   down_since; /* ev_now when the outage began; < 0 while set up */
	void				  *arg;
	char				   server[256]; /* "pepsi on /run/postgresql port 5432", for the log */
	bool				   ever_up;		/* the next set-up is a reconnect */
	unsigned			   generation;	/* bumped when the connection is dropped */
	/* What is in flight: statements sent since the connection was last idle. */
	int		  sent;
	int		  item;		  /* the statement whose results come next */
	bool	  synced;	  /* pipeline mode: its Sync went out */
	int		  stray_ends; /* pipeline mode: end-of-result markers after the last statement */
	PGresult *result;	  /* the current statement's result so far */
	PGresult *sync_error; /* pipeline mode: the commit's failure */
};

static void pgconn_advance(struct pgconn *c, int revents);
static void pgconn_drop(struct pgconn *c, const char *why);

enum pgconn_state
pgconn_state(const struct pgconn *c)
{
	return c->state;
}

bool
pgconn_is_up(const struct pgconn *c)
{
	return c->state == PGCONN_SETUP || c->state == PGCONN_IDLE || c->state == PGCONN_BUSY;
}

PGconn *
pgconn_conn(const struct pgconn *c)
{
	return c->conn;
}

void *
pgconn_arg(const struct pgconn *c)
{
	return c->arg;
}

const char *
pgconn_name(const struct pgconn *c)
{
	return c->name;
}

double
pgconn_backoff(const struct pgconn *c)
{
	return c->backoff;
}

static void
pgconn_watch(struct pgconn *c, int events)
{
	int fd = c->conn ? PQsocket(c->conn) : -1;

	if (ev_is_active(&c->io) && (c->io.fd != fd || (c->io.events & (EV_READ | EV_WRITE)) != events))
		ev_io_stop(c->loop, &c->io);
	if (fd < 0 || events == 0 || ev_is_active(&c->io))
		return;
	ev_io_set(&c->io, fd, events);
	ev_io_start(c->loop, &c->io);
}

/* Send what libpq has buffered; watch for writability if it could not. */
static bool
pgconn_flush(struct pgconn *c)
{
	int rc = PQflush(c->conn);

	if (rc < 0)
	{
		pgconn_drop(c, PQerrorMessage(c->conn));
		return false;
	}
	pgconn_watch(c, EV_READ | (rc == 1 ? EV_WRITE : 0));
	return true;
}

static void
pgconn_forget_results(struct pgconn *c)
{
	PQclear(c->result);
	PQclear(c->sync_error);
	c->result = c->sync_error = NULL;
	c->sent = c->item = c->stray_ends = 0;
	c->synced = false;
}

/*
 * Decorrelated jitter: a random wait between the minimum and three times
 * the last one, so that many clients of a restarted server do not come
 * back in step, capped by backoff_max (a long outage costs an attempt per
 * backoff_max) and by PGCONN_BACKOFF_OUTAGE_SHARE of the outage so far.
 */
static void
pgconn_draw_backoff(struct pgconn *c)
{
	double upper = c->backoff * 3 > c->backoff_min ? c->backoff * 3 : c->backoff_min * 3;
	double cap = (ev_now(c->loop) - c->down_since) * PGCONN_BACKOFF_OUTAGE_SHARE;

	if (cap < c->backoff_min)
		cap = c->backoff_min;
	if (cap > c->backoff_max)
		cap = c->backoff_max;
	c->backoff = c->backoff_min + (upper - c->backoff_min) * ((double) random() / RAND_MAX);
	if (c->backoff > cap)
		c->backoff = cap;
}

/* The connection is gone, or set-up refused it: drop it and try again later. */
static void
pgconn_drop(struct pgconn *c, const char *why)
{
	char			  reason[512];
	size_t			  len;
	enum pgconn_state was = c->state;

	if (was == PGCONN_DOWN || was == PGCONN_CLOSED)
		return;
	/* why may be PQerrorMessage's, freed with the connection: copy it first. */
	snprintf(reason, sizeof(reason), "%s", why && *why ? why : "connection lost");
	/* libpq's messages run over lines (newline, tab): one line, one space each. */
	len = 0;
	for (const char *p = reason; *p; p++)
		if (!(*p == '\n' || *p == '\t' || *p == ' ') || (len > 0 && reason[len - 1] != ' '))
			reason[len++] = *p == '\n' || *p == '\t' ? ' ' : *p;
	reason[len] = '\0';
	while (len > 0 && reason[len - 1] == ' ')
		reason[--len] = '\0';
	pgconn_watch(c, 0);
	pgconn_forget_results(c);
	PQfinish(c->conn);
	c->conn = NULL;
	c->generation++;
	c->state = PGCONN_DOWN;
	if (c->down_since < 0)
		c->down_since = ev_now(c->loop);
	pgconn_draw_backoff(c);
	if (was == PGCONN_IDLE || was == PGCONN_BUSY)
		log_warnx("%s: lost the database connection to %s (%s); reconnecting in %.1f s", c->name,
				  c->server, reason, c->backoff);
	else
		log_warnx("%s: cannot connect to the database %s (%s)%s; trying again in %.1f s", c->name,
				  c->server, reason, db_connect_hint(reason), c->backoff);
	if (c->handlers.lost)
		c->handlers.lost(c, reason);
	if (c->state == PGCONN_DOWN)
	{
		ev_timer_set(&c->retry, c->backoff, 0);
		ev_timer_start(c->loop, &c->retry);
	}
}

void
pgconn_reset(struct pgconn *c, const char *reason)
{
	pgconn_drop(c, reason);
}

/*
 * What the server says outside a result (a notice, the FATAL it sends an
 * idle session as it shuts down) goes to the log, not raw to stderr.
 */
static void
pgconn_notice(void *arg, const char *message)
{
	const struct pgconn *c = arg;
	size_t				 len = strlen(message);

	while (len > 0 && message[len - 1] == '\n')
		len--;
	log_warnx("%s: the server says: %.*s", c->name, (int) len, message);
}

static void
pgconn_describe_server(struct pgconn *c)
{
	const char *host = PQhost(c->conn);
	const char *port = PQport(c->conn);
	const char *db = PQdb(c->conn);

	snprintf(c->server, sizeof(c->server), "%s on %s port %s", db && *db ? db : "?",
			 host && *host ? host : "?", port && *port ? port : "?");
}

static void
pgconn_connect(struct pgconn *c)
{
	/* Before dbname: a default the conninfo's own target_session_attrs overrides (db.h). */
	const char *keywords[] = {"target_session_attrs", "dbname", "application_name", NULL};
	const char *values[] = {db_default_session_attrs(c->may_be_standby), c->conninfo,
							c->application_name, NULL};

	c->conn = PQconnectStartParams(keywords, values, 1);
	c->state = PGCONN_CONNECTING;
	if (c->conn == NULL || PQstatus(c->conn) == CONNECTION_BAD)
	{
		pgconn_drop(c, c->conn ? PQerrorMessage(c->conn) : "out of memory");
		return;
	}
	pgconn_describe_server(c);
	PQsetNoticeProcessor(c->conn, pgconn_notice, c);
	pgconn_watch(c, EV_WRITE);
}

/* Set-up is over: ready for work. */
static void
pgconn_set_up(struct pgconn *c)
{
	c->state = PGCONN_IDLE;
	c->backoff = 0;
	c->down_since = -1;
	log_info("%s: %sconnected to the database %s", c->name, c->ever_up ? "re" : "", c->server);
	c->ever_up = true;
	if (c->handlers.ready)
		c->handlers.ready(c);
}

static void
pgconn_connected(struct pgconn *c)
{
	unsigned generation = c->generation;

	if (PQsetnonblocking(c->conn, 1) != 0 || (c->pipeline && !PQenterPipelineMode(c->conn)))
	{
		pgconn_drop(c, PQerrorMessage(c->conn));
		return;
	}
	pgconn_describe_server(c); /* the host that answered, of several */
	if (!c->may_be_standby && db_is_standby(c->conn))
	{
		pgconn_drop(c, PGCONN_STANDBY_REASON);
		return;
	}
	c->state = PGCONN_SETUP;
	pgconn_watch(c, EV_READ);
	if (c->handlers.setup)
		c->handlers.setup(c);
	if (c->generation == generation && c->state == PGCONN_SETUP && c->sent == 0)
		pgconn_set_up(c);
}

static void
pgconn_poll_connect(struct pgconn *c)
{
	PostgresPollingStatusType status = PQconnectPoll(c->conn);

	/*
	 * With several hosts (host=a,b,c) libpq closes a refused host's socket
	 * and opens the next one's, often under the same number; the backend
	 * (epoll) forgot the closed one, so the watcher is set afresh.
	 */
	if (ev_is_active(&c->io))
		ev_io_stop(c->loop, &c->io);
	switch (status)
	{
		case PGRES_POLLING_FAILED:
			pgconn_drop(c, PQerrorMessage(c->conn));
			break;
		case PGRES_POLLING_READING:
			pgconn_watch(c, EV_READ);
			break;
		case PGRES_POLLING_WRITING:
			pgconn_watch(c, EV_WRITE);
			break;
		default:
			pgconn_connected(c);
			break;
	}
}

/*
 * A statement's result is complete: hand it over.  But a write refused
 * because the server is read-only (SQLSTATE 25006) means the primary moved
 * under a session that survived (a server demoted without a restart, or a
 * conninfo without target_session_attrs=read-write): the statement did
 * nothing, so the connection is dropped as lost, and the owner's lost
 * handler treats it as in flight at a loss; the reconnect finds the
 * primary.  False then.
 */
static bool
pgconn_deliver(struct pgconn *c, int item, PGresult **res)
{
	PGresult   *r = *res;
	const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;

	*res = NULL;
	if (state && strcmp(state, PGCONN_READ_ONLY_SQLSTATE) == 0 && !c->may_be_standby)
	{
		PQclear(r);
		pgconn_drop(c, "the server is read-only now (SQLSTATE 25006): the primary moved");
		return false;
	}
	if (r)
		c->handlers.result(c, item, r);
	PQclear(r);
	return true;
}

/* Keep the first error of a statement's results, else its last result. */
static void
pgconn_fold(PGresult **kept, PGresult *res)
{
	ExecStatusType kept_status = *kept ? PQresultStatus(*kept) : PGRES_COMMAND_OK;
	ExecStatusType status = PQresultStatus(res);
	bool		   kept_ok = kept_status == PGRES_COMMAND_OK || kept_status == PGRES_TUPLES_OK;

	if (*kept && !kept_ok && (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK))
	{
		PQclear(res);
		return;
	}
	PQclear(*kept);
	*kept = res;
}

/* Everything sent is answered: the owner may send again. */
static void
pgconn_complete(struct pgconn *c)
{
	unsigned		  generation = c->generation;
	enum pgconn_state was = c->state;

	pgconn_forget_results(c);
	if (c->state == PGCONN_BUSY)
		c->state = PGCONN_IDLE;
	if (c->handlers.done)
		c->handlers.done(c);
	if (c->generation != generation)
		return;
	if (was == PGCONN_SETUP)
	{
		if (c->state == PGCONN_SETUP && c->sent == 0)
			pgconn_set_up(c);
	}
	else if (c->state == PGCONN_IDLE && c->handlers.ready)
		c->handlers.ready(c);
}

/* One return of PQgetResult (NULL included) while something is in flight. */
static void
pgconn_collect(struct pgconn *c, PGresult *res)
{
	if (!c->pipeline)
	{
		if (res)
			pgconn_fold(&c->result, res);
		else if (pgconn_deliver(c, 0, &c->result))
			pgconn_complete(c);
		return;
	}
	if (res == NULL)
	{
		/* The end of one statement's results, or of a failed commit's. */
		if (c->item < c->sent)
			(void) pgconn_deliver(c, c->item++, &c->result);
		else if (++c->stray_ends > 1)
			pgconn_drop(c, "protocol confusion in the pipeline");
		return;
	}
	if (PQresultStatus(res) == PGRES_PIPELINE_SYNC)
	{
		PQclear(res);
		if (c->sync_error && !pgconn_deliver(c, c->sent, &c->sync_error))
			return;
		pgconn_complete(c);
		return;
	}
	if (c->item < c->sent)
		pgconn_fold(&c->result, res);
	else if (c->sync_error == NULL)
		c->sync_error = res; /* the commit itself failed */
	else
		PQclear(res);
}

/* Whether results are expected: something sent (and, in a pipeline, synced). */
static bool
pgconn_in_flight(const struct pgconn *c)
{
	return c->sent > 0 && (!c->pipeline || c->synced);
}

/* Read what the server sent: notifications, and results of what is in flight. */
static void
pgconn_read(struct pgconn *c)
{
	unsigned  generation = c->generation;
	PGnotify *notify;

	if (!PQconsumeInput(c->conn))
	{
		pgconn_drop(c, PQerrorMessage(c->conn));
		return;
	}
	while ((notify = PQnotifies(c->conn)) != NULL)
	{
		if (c->handlers.notify)
			c->handlers.notify(c, notify);
		PQfreemem(notify);
		if (c->generation != generation)
			return;
	}
	if (c->sent == 0)
	{
		/* Nothing in flight: the server closing on us shows here. */
		if (PQstatus(c->conn) != CONNECTION_OK)
			pgconn_drop(c, PQerrorMessage(c->conn));
		return;
	}
	while (c->generation == generation && pgconn_in_flight(c) && !PQisBusy(c->conn))
		pgconn_collect(c, PQgetResult(c->conn));
}

/* The one function that moves the connection along. */
static void
pgconn_advance(struct pgconn *c, int revents)
{
	switch (c->state)
	{
		case PGCONN_DOWN:
			pgconn_connect(c);
			break;
		case PGCONN_CONNECTING:
			pgconn_poll_connect(c);
			break;
		case PGCONN_SETUP:
		case PGCONN_IDLE:
		case PGCONN_BUSY:
			if ((revents & EV_WRITE) && !pgconn_flush(c))
				break;
			if (revents & EV_READ)
				pgconn_read(c);
			break;
		case PGCONN_CLOSED:
			break;
	}
}

static void
pgconn_on_io(struct ev_loop *loop, ev_io *w, int revents)
{
	pgconn_advance(w->data, revents);
}

static void
pgconn_on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
	pgconn_advance(w->data, 0);
}

struct pgconn *
pgconn_start(struct ev_loop *loop, const struct pgconn_options *options,
			 const struct pgconn_handlers *handlers)
{
	struct pgconn *c = xcalloc(1, sizeof(*c));

	c->loop = loop;
	c->handlers = *handlers;
	c->conninfo = xstrdup(db_conninfo(options->cfg, options->section ? options->section : "database",
									  options->option ? options->option : "CONNINFO"));
	c->application_name = xstrdup(options->application_name ? options->application_name : "pepsi");
	c->name = xstrdup(options->name ? options->name : "database connection");
	c->pipeline = options->pipeline;
	c->may_be_standby = options->may_be_standby;
	c->backoff_min = options->backoff_min > 0 ? options->backoff_min : PGCONN_BACKOFF_MIN;
	c->backoff_max = options->backoff_max > 0 ? options->backoff_max : PGCONN_BACKOFF_MAX;
	if (c->backoff_max < c->backoff_min)
		c->backoff_max = c->backoff_min;
	c->arg = options->arg;
	snprintf(c->server, sizeof(c->server), "(not yet known)");
	ev_io_init(&c->io, pgconn_on_io, -1, EV_READ);
	c->io.data = c;
	ev_timer_init(&c->retry, pgconn_on_retry, 0, 0);
	c->retry.data = c;
	c->state = PGCONN_DOWN;
	c->down_since = ev_now(loop);
	pgconn_connect(c);
	return c;
}

void
pgconn_close(struct pgconn *c)
{
	if (c == NULL)
		return;
	pgconn_watch(c, 0);
	ev_timer_stop(c->loop, &c->retry);
	pgconn_forget_results(c);
	PQfinish(c->conn);
	c->conn = NULL;
	c->generation++;
	c->state = PGCONN_CLOSED;
}

void
pgconn_free(struct pgconn *c)
{
	if (c == NULL)
		return;
	pgconn_close(c);
	free(c->conninfo);
	free(c->application_name);
	free(c->name);
	free(c);
}

PGconn *
pgconn_detach(struct pgconn *c)
{
	unsigned generation = c->generation;
	PGconn	*conn;

	if (c->state != PGCONN_IDLE && c->state != PGCONN_BUSY)
	{
		pgconn_close(c);
		return NULL;
	}
	pgconn_watch(c, 0);
	ev_timer_stop(c->loop, &c->retry);
	/* Closed from here: the handlers run for what is in flight, but nothing new is sent. */
	c->state = PGCONN_CLOSED;
	if (PQsetnonblocking(c->conn, 0) != 0)
	{
		pgconn_close(c);
		return NULL;
	}
	while (c->generation == generation && pgconn_in_flight(c))
		pgconn_collect(c, PQgetResult(c->conn));
	if (c->generation != generation || c->conn == NULL
		|| (c->pipeline && PQpipelineStatus(c->conn) != PQ_PIPELINE_OFF && !PQexitPipelineMode(c->conn)))
	{
		pgconn_close(c);
		return NULL;
	}
	conn = c->conn;
	c->conn = NULL;
	pgconn_forget_results(c);
	return conn;
}

/* Whether a statement may be sent now. */
static bool
pgconn_may_send(struct pgconn *c)
{
	if (!pgconn_is_up(c))
		return false;
	if (c->sent > 0 && (!c->pipeline || c->synced))
		fatalx("%s: a statement sent while another is in flight", c->name);
	return true;
}

/* A statement went to libpq (rc from PQsend*): count it, and send it now unless pipelining. */
static bool
pgconn_sent(struct pgconn *c, int rc)
{
	if (rc != 1)
	{
		pgconn_drop(c, PQerrorMessage(c->conn));
		return false;
	}
	c->sent++;
	if (c->state == PGCONN_IDLE)
		c->state = PGCONN_BUSY;
	return c->pipeline || pgconn_flush(c);
}

bool
pgconn_send(struct pgconn *c, const char *sql, int nparams, const char *const *values,
			const int *lengths, const int *formats)
{
	if (!pgconn_may_send(c))
		return false;
	/* PQsendQuery takes several commands, but is refused in pipeline mode. */
	if (nparams == 0 && !c->pipeline)
		return pgconn_sent(c, PQsendQuery(c->conn, sql));
	return pgconn_sent(c, PQsendQueryParams(c->conn, sql, nparams, NULL, values, lengths, formats, 0));
}

bool
pgconn_send_prepared(struct pgconn *c, const char *name, int nparams, const char *const *values,
					 const int *lengths, const int *formats)
{
	if (!pgconn_may_send(c))
		return false;
	return pgconn_sent(c, PQsendQueryPrepared(c->conn, name, nparams, values, lengths, formats, 0));
}

bool
pgconn_send_prepare(struct pgconn *c, const char *name, const char *sql, int nparams)
{
	if (!pgconn_may_send(c))
		return false;
	return pgconn_sent(c, PQsendPrepare(c->conn, name, sql, nparams, NULL));
}

bool
pgconn_sync(struct pgconn *c)
{
	if (!pgconn_is_up(c) || !c->pipeline || c->sent == 0)
		return false;
	if (PQpipelineSync(c->conn) != 1)
	{
		pgconn_drop(c, PQerrorMessage(c->conn));
		return false;
	}
	c->synced = true;
	return pgconn_flush(c);
}

bool
pgconn_push(struct pgconn *c)
{
	if (!pgconn_is_up(c) || !c->pipeline || c->sent == 0 || c->synced)
		return false;
	return pgconn_flush(c);
}
