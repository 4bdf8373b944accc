/*
 * worker.c: a worker of a pool from its first answer to its end.  Each
 * status line answers the oldest id in flight and is charged to its
 * sender, with what the line reports (fused hops, a delivery, the stages
 * it queued rows at) folded into the pool's statistics; a worker that
 * crashes, times out or breaks the protocol has its rows accounted for
 * (retried, put back, or isolated after CRASH_LIMIT) and is closed.
 * Apart from pool.c, which sizes the pools, spawns workers and decides
 * which worker each id goes to.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "dispatch.h"
#include "pool_internal.h"

/* ---------------------------------------------------------------------------
 * Answers
 * ------------------------------------------------------------------------- */

static struct inflight
worker_pop(struct pool_worker *w)
{
	struct inflight entry = w->queue[w->head];

	w->head = (w->head + 1) % w->ring;
	w->count--;
	if (w->handed > 0)
		w->handed--;
	if (w->count == 0)
		w->idle_since = now_seconds();
	return entry;
}

/*
 * The one function that moves a worker along.  A retiring worker's stdin
 * closes once it has answered everything, so this is called again after
 * each answer; the killed states are final, and a retire leaves them be.
 */
void
worker_transition(struct pool_worker *w, enum worker_state to)
{
	switch (to)
	{
		case WORKER_RUNNING:
			fatalx("stage %s: worker %d cannot go back to running", w->pool->spec.name,
				   (int) w->pid);
		case WORKER_RETIRING:
			if (w->state == WORKER_RUNNING)
				w->state = WORKER_RETIRING;
			if (w->state == WORKER_RETIRING && w->count == 0 && w->to_child >= 0
				&& w->out.len == 0)
			{
				close(w->to_child);
				w->to_child = -1;
			}
			break;
		case WORKER_KILLED_FOR_TIMEOUT:
		case WORKER_KILLED_FOR_PROTOCOL:
			if (w->state == WORKER_KILLED_FOR_TIMEOUT || w->state == WORKER_KILLED_FOR_PROTOCOL)
				break;
			w->state = to;
			w->pool->stats.kills++;
			kill(w->pid, SIGKILL);
			break;
	}
}

const char *const delivery_statuses[DELIVERY_STATUSES] = {"sent", "deferred", "bounced", "expired"};

/* A delivery attempt the pass reported, counted at the stage that made it. */
static void
pool_fold_delivery(struct pool *pool, json_t *report)
{
	json_t		*delivery = json_object_get(report, "delivery");
	const char	*stage = json_string_value(json_object_get(delivery, "stage"));
	const char	*status = json_string_value(json_object_get(delivery, "status"));
	struct pool *at = stage ? pool_find(stage) : NULL;

	json_t *delay = json_object_get(delivery, "delay");

	if (status == NULL)
		return;
	for (int i = 0; i < DELIVERY_STATUSES; i++)
		if (strcmp(status, delivery_statuses[i]) == 0)
			(at ? at : pool)->stats.deliveries[i]++;
	if (strcmp(status, "sent") == 0 && json_is_number(delay))
		histogram_observe(&(at ? at : pool)->stats, HISTOGRAM_DELIVERY_DELAY, json_number_value(delay));
}

/*
 * Count the stages a worker ran fused into its pass, each at its own
 * stage.  Returns the time they took (their part of the pass), which is
 * then not counted again at the stage that ran the pass.
 */
static double
pool_fold_fused(struct pool *pool, json_t *report)
{
	size_t	i;
	json_t *hop;
	double	fused_us = 0;

	json_array_foreach (json_object_get(report, "fused"), i, hop)
	{
		const char	*stage = json_string_value(json_object_get(hop, "stage"));
		struct pool *fused = stage ? pool_find(stage) : NULL;
		double		 us = (double) json_integer_value(json_object_get(hop, "us"));

		pool->stats.fused_hops++;
		dispatcher.stages_run++;
		if (fused)
		{
			fused->stats.messages++;
			fused->stats.processing_us += us;
			histogram_observe(&fused->stats, HISTOGRAM_RUN, us / 1e6);
			fused_us += us;
		}
	}
	return fused_us;
}

/* One status line, answering the oldest id in flight, which took us of worker time. */
static void
worker_on_line(struct pool_worker *w, const char *line, double now, double us)
{
	struct pool	   *pool = w->pool;
	struct inflight entry;
	bool			ok = line[0] == '0' && (line[1] == '\0' || line[1] == ' ');
	bool			wellformed = line[0] >= '0' && line[0] <= '9'
					  && (line[1] == '\0' || line[1] == ' ' || (line[1] >= '0' && line[1] <= '9'));
	json_t	   *report = NULL;
	const char *space = strchr(line, ' ');

	if (w->state == WORKER_KILLED_FOR_PROTOCOL)
		return; /* it is being killed; what it says no longer counts */
	if (w->handed == 0)
	{
		log_warnx("stage %s: worker %d answered an id it was not given: \"%.80s\"; replacing it",
				  pool->spec.name, (int) w->pid, line);
		worker_transition(w, WORKER_KILLED_FOR_PROTOCOL);
		return;
	}
	entry = worker_pop(w);
	w->last_done = now;
	w->handled++;
	pool->stats.messages++;
	pool->stats.processing_us += us;
	pool->row_cost_us = 0.9 * pool->row_cost_us + 0.1 * us;
	dispatcher.messages++;
	dispatcher.stages_run++;
	dispatcher.last_activity = now;
	fair_charge(pool->fair, entry.sender, us, now, dispatcher.fair_half_life);
	if (space)
		report = json_loads(space + 1, 0, NULL);

	if (ok)
	{
		double fused_us = pool_fold_fused(pool, report);

		pool->stats.processing_us -= fused_us < us ? fused_us : us;
		histogram_observe(&pool->stats, HISTOGRAM_RUN, (us - (fused_us < us ? fused_us : us)) / 1e6);
		pool_fold_delivery(pool, report);
	}
	else
	{
		histogram_observe(&pool->stats, HISTOGRAM_RUN, us / 1e6);
		const char *error = json_string_value(json_object_get(report, "error"));
		char	   *reason = wellformed
								 ? xasprintf("stage %s: %s", pool->spec.name, error ? error : line)
								 : xasprintf("stage %s: worker wrote a malformed status line: \"%.200s\"",
											 pool->spec.name, line);

		if (wellformed)
		{
			/* The stage itself says the message failed: that stands. */
			log_warnx("row %lld failed: %s", entry.id, reason);
			dbconn_recover(pool->spec.name, &entry, 1, "failed", reason);
			dispatcher.messages_failed++;
		}
		else
		{
			log_warnx("row %lld: %s", entry.id, reason);
			dbconn_crashed(pool->spec.name, &entry, reason, "failed");
		}
		free(reason);
		/* A worker that failed a message, or lost the protocol, is replaced. */
		worker_transition(w, wellformed ? WORKER_RETIRING : WORKER_KILLED_FOR_PROTOCOL);
	}
	pool_note_queued(pool, ok ? report : NULL);
	json_decref(report);
	free(entry.sender);
	if (w->handled + w->count >= pool->spec.max_messages || w->state == WORKER_RETIRING)
		worker_transition(w, WORKER_RETIRING);
	dbconn_want_claim(false);
}

/*
 * Read what the worker wrote and act on each complete status line.
 * Returns whether to read again: false once the pipe is empty or closed.
 */
static bool
worker_read(struct pool_worker *w)
{
	char	chunk[8192];
	ssize_t n = read(w->from_child, chunk, sizeof(chunk));
	char   *nl;
	int		answers = 0;
	double	now = now_seconds();
	double	share_us = 0;

	if (n < 0 && errno == EINTR)
		return true;
	if (n < 0 && errno == EAGAIN)
		return false;
	if (n <= 0)
	{
		/* End of its stdout: the exit handler does the accounting. */
		ev_io_stop(dispatcher.loop, &w->reader);
		return false;
	}
	if (w->state == WORKER_KILLED_FOR_PROTOCOL)
		return true; /* being killed: drop whatever else it says */
	buf_append(&w->in, chunk, (size_t) n);

	/*
	 * The answers that arrive together were worked on together (a batch):
	 * they share the time since the oldest of them was started, rather
	 * than the first being charged all of it and its sender looking
	 * heavier than it is.
	 */
	for (const char *p = w->in.data; (p = memchr(p, '\n', w->in.len - (size_t) (p - w->in.data))) != NULL; p++)
		answers++;
	if (answers > w->handed)
		answers = w->handed; /* the rest break the protocol */
	if (answers > 0)
	{
		const struct inflight *head = &w->queue[w->head];
		double				   started = head->sent_at > w->last_done ? head->sent_at : w->last_done;

		share_us = (now - started) * 1e6 / answers;

		/*
		 * The depth sizes the workers' pipelines from their batches.  The
		 * light lane's are one light row each, run beside a burst and
		 * timed by the wall clock: in bench/fairness 557 of them at 11.5 ms
		 * against the workers' 7 to 9 rows in 20 ms, and fitted with the
		 * workers' they made the depth a few rows.
		 */
		if (!w->light_lane)
			depth_record_batch(&w->pool->depth, answers, share_us * answers);
		if (answers >= HAND_AHEAD && w->pool->intake == INTAKE_UNKNOWN)
		{
			w->pool->intake = INTAKE_BATCH;
			/* Learnt now: its workers started at full priority. */
			for (struct pool_worker *bulk = w->pool->workers; bulk != NULL; bulk = bulk->next)
				if (worker_is_bulk(w->pool, bulk->light_lane))
					worker_lower_priority(bulk->pid, w->pool->spec.bulk_nice);
		}
	}
	while ((nl = memchr(w->in.data, '\n', w->in.len)) != NULL)
	{
		*nl = '\0';
		worker_on_line(w, w->in.data, now, share_us);
		buf_consume(&w->in, (size_t) (nl - w->in.data) + 1);
	}
	worker_hand(w);
	if (w->in.len > 65536 && w->state != WORKER_KILLED_FOR_PROTOCOL)
	{
		log_warnx("stage %s: worker %d wrote a line longer than 64 KB; replacing it",
				  w->pool->spec.name, (int) w->pid);
		if (w->count > 0)
		{
			/* That line was the oldest row's answer: blame it like a malformed one. */
			struct inflight entry = worker_pop(w);
			char		   *reason = xasprintf("stage %s: worker wrote a status line longer than 64 KB",
											   w->pool->spec.name);

			dbconn_crashed(w->pool->spec.name, &entry, reason, "failed");
			free(reason);
			free(entry.sender);
		}
		worker_transition(w, WORKER_KILLED_FOR_PROTOCOL);
	}
	return true;
}

void
worker_on_readable(struct ev_loop *loop, ev_io *watcher, int revents)
{
	worker_read(watcher->data);
}

/* ---------------------------------------------------------------------------
 * Exits
 * ------------------------------------------------------------------------- */

/*
 * Whether the worker read none of the ids written to it: they are all
 * still in its stdin pipe (which outlives the reader for as long as we
 * hold the other end).  A program that dies before reading its input never
 * got as far as a message: it did not start.
 */
static bool
worker_read_nothing(const struct pool_worker *w)
{
	int unread = 0;

	if (w->to_child < 0 || ioctl(w->to_child, FIONREAD, &unread) != 0)
		return false;
	return (size_t) unread == w->written;
}

/*
 * A worker went with ids unanswered.  The first was being worked on: it
 * is paused for a retry, its attempt counted, and isolated once it has
 * ended its worker CRASH_LIMIT times (as timeout if we killed the worker
 * for MAX_RUNTIME, failed if it crashed); the rest it never started go
 * back to pending.  (A batching stage works on several at once: the
 * oldest is the one blamed, and a retry gives the others a fresh chance.)
 * All go back to pending when we stopped the worker (shutdown) or killed
 * it for breaking the protocol (its malformed line was blamed already),
 * and when the worker read none of its input: that is a program that does
 * not start (a refused configuration, no database), held off like one
 * that cannot be executed, and no reason to blame a message.
 */
static void
worker_account_unanswered(struct pool_worker *w, const char *how)
{
	struct pool		*pool = w->pool;
	struct inflight *rows = xcalloc((size_t) w->count, sizeof(*rows));
	int				 nrows = 0;
	int				 first = 0; /* rows[0] is settled apart, or left with the rest */
	char			*reason = NULL;

	while (w->count > 0)
		rows[nrows++] = worker_pop(w);
	if (dispatcher.shutting_down || w->state == WORKER_KILLED_FOR_PROTOCOL)
		;
	else if (w->state == WORKER_KILLED_FOR_TIMEOUT)
	{
		reason = xasprintf("stage %s: no answer within MAX_RUNTIME (%ld ms); worker killed",
						   pool->spec.name, pool->spec.max_runtime_ms);
		log_warnx("row %lld timed out: %s", rows[0].id, reason);
		dbconn_crashed(pool->spec.name, &rows[0], reason, "timeout");
		pool->stats.timeouts++;
		first = 1;
	}
	else if (worker_read_nothing(w))
	{
		pool->stats.crashes++;
		pool->cooldown_until = now_seconds() + dispatcher.spawn_cooldown;
		log_warnx("stage %s: worker %d %s before reading its input; holding the stage off "
				  "for %.1f s",
				  pool->spec.name, (int) w->pid, how, dispatcher.spawn_cooldown);
	}
	else
	{
		reason = xasprintf("stage %s: worker %s while processing the row", pool->spec.name, how);
		log_warnx("row %lld: %s", rows[0].id, reason);
		dbconn_crashed(pool->spec.name, &rows[0], reason, "failed");
		pool->stats.crashes++;
		first = 1;
	}
	if (nrows > first)
	{
		log_info("stage %s: %d row%s worker %d had not answered go%s back to pending",
				 pool->spec.name, nrows - first, nrows - first == 1 ? "" : "s", (int) w->pid,
				 nrows - first == 1 ? "es" : "");
		dbconn_recover(pool->spec.name, rows + first, nrows - first, "pending", NULL);
	}
	for (int i = 0; i < nrows; i++)
		free(rows[i].sender);
	free(rows);
	free(reason);
}

void
worker_on_exit(struct ev_loop *loop, ev_child *watcher, int revents)
{
	struct pool_worker *w = watcher->data;
	struct pool		   *pool = w->pool;
	int					status = watcher->rstatus;
	char			   *how = WIFSIGNALED(status) ? xasprintf("killed by signal %d", WTERMSIG(status))
												  : xasprintf("exited with status %d", WEXITSTATUS(status));
	int					guard = 64; /* 512 KB, more than a pipe holds */

	ev_child_stop(loop, &w->child);
	/* Read what it wrote before it went: those answers stand. */
	while (ev_is_active(&w->reader) && guard-- > 0 && worker_read(w))
		;
	if (w->count > 0)
		worker_account_unanswered(w, how);
	else if (w->state == WORKER_RUNNING && !dispatcher.shutting_down)
	{
		log_warnx("stage %s: worker %d %s while idle", pool->spec.name, (int) w->pid, how);
		pool->stats.crashes++;
		if (w->handled == 0)
			pool->cooldown_until = now_seconds() + dispatcher.spawn_cooldown;
	}
	free(how);
	worker_close(w);
	dbconn_want_claim(false);
}

void
worker_close(struct pool_worker *w)
{
	struct pool			*pool = w->pool;
	struct pool_worker **link;

	ev_io_stop(dispatcher.loop, &w->reader);
	ev_io_stop(dispatcher.loop, &w->writer);
	ev_child_stop(dispatcher.loop, &w->child);
	if (w->to_child >= 0)
		close(w->to_child);
	if (w->from_child >= 0)
		close(w->from_child);
	for (link = &pool->workers; *link; link = &(*link)->next)
		if (*link == w)
		{
			*link = w->next;
			break;
		}
	if (w->light_lane)
		pool->light_lane = NULL;
	else
		pool->nworkers--;
	buf_free(&w->in);
	buf_free(&w->out);
	free(w->queue);
	free(w);
}
