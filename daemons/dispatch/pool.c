/*
 * pool.c: the stage worker pools.
 *
 * A pool grows on demand up to PARALLELISM workers ("PROGRAM worker" with
 * pipes on its stdin and stdout) and packs ids onto the fewest of them, up
 * to QUEUE_LIMIT in flight each, so a surplus worker goes idle and is
 * reaped after WORKER_IDLE_TIMEOUT.  A worker that takes one id at a time
 * is written only the next few of its ids; the rest wait here, where a
 * light sender's row claimed later goes ahead of a heavier sender's.
 * Each status line answers the oldest
 * id in flight: its worker time (from the later of its hand-over and the
 * previous answer, shared evenly by answers that arrive together, as a
 * batch does) is charged to its sender.  A worker that answers
 * non-zero has that row failed and is replaced.  One that crashes has its
 * current row paused for a retry and the ids it never started put back to
 * pending; one that takes longer than MAX_RUNTIME is killed, and one that
 * writes what is not a status line is killed, with the same retry of that
 * row.  A row that ends its worker CRASH_LIMIT times is isolated (failed,
 * or timeout), so a poison message cannot keep a stage busy dying.  A worker is retired after MAX_MESSAGES.  A PROGRAM that cannot
 * be started, or that dies before reading its input, holds its stage off
 * for SPAWN_COOLDOWN and fails no row.
 *
 * This file sizes the pools and their light lanes, spawns workers and
 * hands them ids; reading a worker's answers and ending it (crashes,
 * timeouts, retirement) are worker.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "dispatch.h"
#include "pool_internal.h"
#include "process/privilege.h"
#include "runtime/stage.h"

static void pools_drop_removed(void);

struct pool *
pool_find(const char *stage)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		if (!p->removed && strcmp(p->spec.name, stage) == 0)
			return p;
	return NULL;
}

/* How many ids a worker may hold: its pool's depth (depth.c), within QUEUE_LIMIT. */
static int
pool_depth(const struct pool *pool)
{
	return depth_limit(&pool->depth, pool->spec.queue_limit);
}

/* Whether a worker may take one more id at all: its queue limit and MAX_MESSAGES. */
static bool
worker_has_room(const struct pool_worker *w)
{
	return w->state == WORKER_RUNNING && w->count < w->ring
		   && w->handled + w->count < w->pool->spec.max_messages;
}

/*
 * How many more ids a worker can take: up to its depth (within its queue
 * limit), and never more than MAX_MESSAGES over its life, so that it
 * recycles on time (a fresh worker would otherwise be handed a whole
 * queue limit at once).
 */
static int
worker_slots(const struct pool_worker *w)
{
	long left = w->pool->spec.max_messages - w->handled - w->count;
	int	 depth = pool_depth(w->pool);
	int	 room = (depth < w->ring ? depth : w->ring) - w->count;

	if (w->state != WORKER_RUNNING || left <= 0 || room <= 0)
		return 0;
	return left < room ? (int) left : room;
}

/*
 * The light lane.  A batching worker runs what it was written as one
 * batch, so a row of a light sender claimed while every worker is deep in
 * a burst's batches waits for one of them to end (worker_batch_limit then
 * gives it a batch of its own, which costs the burst a short batch, an
 * extra commit and fsync, each time).  Instead a batching stage with
 * LIGHT_LANE runs one worker beyond PARALLELISM that is written only rows
 * of senders far lighter (fair_outweighs) than the ones every worker of
 * the stage holds: the light row runs at once, beside the burst, whose
 * batches go on whole.  The lane costs a process only while it is used:
 * it is started for its first row and reaped when idle like any worker.
 * The claim asks for one row more while the lane is free and a NOTIFY or
 * the heartbeat has come since the last claim (pool_lane_capacity); the
 * fair pick gives that row to the lightest sender with pending rows, so
 * it is the light row when there is one, and otherwise one of the
 * burst's, which waits in a worker's ring, one row deeper (worker_spawn).
 * One row at a time: a lane the light senders could fill would be a
 * second pool.
 */
static bool
light_lane_open(const struct pool *pool, double now)
{
	const struct pool_worker *lane = pool->light_lane;

	if (!pool->spec.light_lane || pool->intake != INTAKE_BATCH || pool->removed
		|| dispatcher.shutting_down || pool->nworkers < pool->spec.parallelism)
		return false;
	for (const struct pool_worker *w = pool->workers; w; w = w->next)
		if (!w->light_lane && w->state == WORKER_RUNNING && w->count == 0)
			return false; /* an idle worker takes it as soon */
	if (lane == NULL)
		return now >= pool->cooldown_until;
	return lane->count == 0 && worker_slots(lane) > 0;
}

/*
 * How many more ids the pool can take now.  While the stage is held off
 * after a failed start, no worker is spawned, but the workers it has keep
 * being fed; and the free light lane's row (pool_lane_capacity).
 */
int
pool_capacity(const struct pool *pool, double now)
{
	int	 capacity = 0;
	long per_worker = pool_depth(pool) < pool->spec.max_messages
						  ? pool_depth(pool)
						  : pool->spec.max_messages;

	if (pool->removed || dispatcher.shutting_down)
		return 0;
	for (const struct pool_worker *w = pool->workers; w; w = w->next)
		if (!w->light_lane)
			capacity += worker_slots(w);
	if (now >= pool->cooldown_until && pool->nworkers < pool->spec.parallelism)
		capacity += (int) (pool->spec.parallelism - pool->nworkers) * (int) per_worker;
	return capacity + pool_lane_capacity(pool, now);
}

/*
 * Which stages a claim asks: only those that may have pending rows.  A
 * stage may have them when a claim came back full from it, when a NOTIFY
 * or the heartbeat came (every stage), when a status line said its pass
 * left rows pending there (pool_note_queued), or when the dispatcher put
 * rows of its back itself (dbconn_recover).  A claim that names a stage
 * with nothing pending costs the database a read of that stage's oldest
 * rows and its sender cache's check, for nothing; with fifteen stages in
 * the graph and one busy, that was most of a claim after a light
 * sender's message.  A signal that comes while a claim is in flight is
 * kept: the claim may have read the stage before the rows committed.
 */
void
pool_may_have_work(struct pool *pool)
{
	if (pool->work < POOL_SIGNALLED)
		pool->work = POOL_SIGNALLED;
}

/* Work may have come for every stage (a NOTIFY, the heartbeat). */
void
pools_may_have_work(void)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		p->work = POOL_WOKEN;
}

/* A claim is going out: what woke the pools is answered by it. */
void
pools_claim_sent(void)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
	{
		if (p->work == POOL_WOKEN)
			p->work = POOL_SIGNALLED;
		if (p->work == POOL_SIGNALLED && p->claim_asked > 0)
			p->work = POOL_MAY_HAVE_WORK;
	}
}

/* A claim that asked this pool for claim_asked rows got rows. */
void
pool_claimed(struct pool *pool, int rows)
{
	/* Rows signalled since the claim went out stay signalled: it may have missed them. */
	if (pool->claim_asked <= 0 || pool->work >= POOL_SIGNALLED)
		return;
	pool->work = rows >= pool->claim_asked ? POOL_MAY_HAVE_WORK : POOL_DRAINED;
}

/*
 * A worker of pool answered a row: where may its pass have left rows
 * pending?  The runtime says, when asked to (STAGE_STATUS_QUEUED_ENV,
 * set for every worker; common/runtime/stage.c: "queued", the stages it committed
 * rows to, [] for none).  A status line that does not say (a worker not
 * of our runtime, a failure, a pass the runtime cannot vouch for) may
 * have left them anywhere.
 *
 * The pool itself is not marked: rows come to it from ingress, whose
 * every commit is followed by a wake within DISPATCH_WAKE_INTERVAL
 * (ingress's admit.c), from other stages' passes (their "queued"), or
 * from a claim that came back full (pool_claimed keeps the pool marked).
 * Marking it after every answer made a claim after each light sender's
 * lone row that found nothing: half the claims of a light message, and
 * CPU a busy machine takes from the burst.  What it bought was rows that
 * ingress committed since the last claim taken a few milliseconds
 * before the interval's wake: while a stage keeps up with a burst, its
 * claims come back short and its next batch waits for that wake, bigger.
 */
void
pool_note_queued(struct pool *pool, json_t *report)
{
	json_t *queued = json_object_get(report, "queued");
	size_t	i;
	json_t *stage;

	if (!json_is_array(queued))
	{
		for (struct pool *p = dispatcher.pools; p; p = p->next)
			pool_may_have_work(p);
		return;
	}
	json_array_foreach (queued, i, stage)
	{
		struct pool *at = json_is_string(stage) ? pool_find(json_string_value(stage)) : NULL;

		if (at != NULL)
			pool_may_have_work(at);
	}
}

/*
 * Whether the claim should go at once rather than be coalesced with the
 * answers of the next few milliseconds (CLAIM_NOW): a stage that may have
 * pending rows has a worker with nothing to do, or room and no worker at
 * all.  Or only a claim for the light lanes (CLAIM_LANES): a NOTIFY came
 * (it may be a light sender's row) while a stage's lane is free.  That
 * claim asks only for the lanes' rows (pool_lane_capacity): had it taken
 * the slots the workers' answers freed meanwhile, it would hand each
 * worker a row or two as its next batch, where the coalesced claim hands
 * it a batch of the burst's.
 */
enum claim_urgency
pools_claim_urgency(double now)
{
	enum claim_urgency urgency = CLAIM_LATER;

	for (struct pool *p = dispatcher.pools; p; p = p->next)
	{
		if (p->work == POOL_DRAINED || pool_capacity(p, now) <= 0)
			continue;
		if (p->nworkers == 0)
			return CLAIM_NOW;
		for (const struct pool_worker *w = p->workers; w; w = w->next)
			if (!w->light_lane && w->count == 0 && worker_slots(w) > 0)
				return CLAIM_NOW;
		if (pool_lane_capacity(p, now) > 0)
			urgency = CLAIM_LANES;
	}
	return urgency;
}

/*
 * The row a claim asks of pool for its free light lane, in any claim
 * (pool_capacity) or in one for the lanes alone (pools_claim_urgency):
 * only after a NOTIFY or the heartbeat.  A light sender's row comes with
 * one (ingress wakes the dispatcher at once for a new client), and
 * otherwise the fair pick brings it first among the slots of the claim an
 * answer causes.  Asked after every answer, the lane's row was mostly the
 * burst's, with every pipeline full, and went back to pending: one claim
 * in eight during bench/fairness's burst with light senders.
 */
int
pool_lane_capacity(const struct pool *pool, double now)
{
	return pool->work == POOL_WOKEN && light_lane_open(pool, now) ? 1 : 0;
}

size_t
pools_inflight(void)
{
	size_t n = 0;

	for (struct pool *p = dispatcher.pools; p; p = p->next)
		for (struct pool_worker *w = p->workers; w; w = w->next)
			n += (size_t) w->count;
	return n;
}

/* ---------------------------------------------------------------------------
 * Starting a worker
 * ------------------------------------------------------------------------- */

/*
 * What to exec for PROGRAM: a path as given (only the file can give one:
 * config.c refuses a path from the database); else, when this is the
 * multi-call binary, this binary itself under the program's name (so the
 * workers can fuse stages), unless the program is a set-id file of its
 * own beside it or in $PREFIX/bin (a privileged stage, which must run as
 * its own file);
 * else the program beside this binary, Pepsi's program directory.  Never a search of PATH: a name must not reach a
 * program Pepsi did not install.  NULL if there is none.
 */
static char *
worker_executable(const char *program, bool *as_self)
{
	char *dir;
	char *candidate;
	char *slash;

	*as_self = false;
	if (strchr(program, '/'))
		return xstrdup(program);
	dir = xstrdup(dispatcher.self_exe);
	slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	if (dispatcher.self_multicall)
	{
		/*
		 * A set-id program installed as a file of its own (a set-group-id
		 * stage: the bit lives on that file, see make install-privileged),
		 * beside this binary or in the bin/ that links to it
		 * ($PREFIX/libexec/pepsi/../../bin), runs as that file, not as us;
		 * only those make install installs (PEPSI_SETID_PROGRAMS), never
		 * another set-id file of that name.
		 */
		candidate = privilege_setid_program(program, dispatcher.self_exe);
		if (candidate)
		{
			free(dir);
			return candidate;
		}
		/*
		 * A stage this binary does not hold (one built standalone only, as
		 * the privileged stages are, or a third party's) is the file beside.
		 */
		if (pepsi_registry_has(program))
		{
			free(dir);
			*as_self = true;
			return xstrdup(dispatcher.self_exe);
		}
	}
	candidate = xasprintf("%s/%s", dir, program);
	free(dir);
	if (privilege_setid_file(candidate) && !privilege_is_setid_program(program))
		log_warnx("%s is set-id but not a set-id program Pepsi installs: not run", candidate);
	else if (access(candidate, X_OK) == 0)
		return candidate;
	free(candidate);
	return NULL;
}

static void worker_on_writable(struct ev_loop *loop, ev_io *watcher, int revents);

/*
 * The CPU for the light lane (BULK_NICE).  On a machine the burst keeps
 * busy, the lane's row waits for a CPU at every hop: its worker, its
 * database session and its helpers each queue behind the burst's runnable
 * processes.  So the pool's other workers run at a higher nice value, and
 * their database sessions with them (the stage runtime passes its own
 * nice value on, pepsi.session_nice): the scheduler then runs the lane's
 * processes first whenever they are ready.  With nothing else to run the
 * bulk workers get every cycle, so a burst alone goes no slower.  pid is
 * 0 in the child before exec, or a running worker's once the pool is
 * found to batch.  Never lowers a worker's value (that would need
 * privilege); a failure leaves the worker as it was.
 */
void
worker_lower_priority(pid_t pid, int bulk_nice)
{
	int current;

	errno = 0;
	current = getpriority(PRIO_PROCESS, (id_t) pid);
	if (errno == 0 && current < bulk_nice)
		(void) setpriority(PRIO_PROCESS, (id_t) pid, bulk_nice);
}

/* Whether a worker of pool (its lane's or not) runs at BULK_NICE: a batching pool's with a lane, but the lane. */
bool
worker_is_bulk(const struct pool *pool, bool light_lane)
{
	return !light_lane && pool->intake == INTAKE_BATCH && pool->spec.light_lane;
}

/* Start a worker of pool: one of its PARALLELISM, or its light lane's. */
static struct pool_worker *
worker_spawn(struct pool *pool, bool light_lane)
{
	int					in_pipe[2] = {-1, -1};
	int					out_pipe[2] = {-1, -1};
	int					exec_pipe[2] = {-1, -1};
	bool				as_self;
	char			   *exe = worker_executable(pool->spec.program, &as_self);
	const char		   *program_name = strrchr(pool->spec.program, '/');
	struct pool_worker *w = NULL;
	pid_t				pid;
	int					exec_errno = 0;
	ssize_t				n;

	program_name = program_name ? program_name + 1 : pool->spec.program;
	if (exe == NULL)
	{
		log_warnx("stage %s: PROGRAM %s is not in Pepsi's program directory (beside %s); "
				  "holding the stage off for %.1f s",
				  pool->spec.name, pool->spec.program,
				  dispatcher.self_exe, dispatcher.spawn_cooldown);
		goto err;
	}
	if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0
		|| pipe2(exec_pipe, O_CLOEXEC) != 0)
	{
		log_warn("stage %s: pipe", pool->spec.name);
		goto err;
	}
	pid = fork();
	if (pid < 0)
	{
		log_warn("stage %s: fork", pool->spec.name);
		goto err;
	}
	if (pid == 0)
	{
		char *argv[5];

		argv[0] = xstrdup(program_name);
		argv[1] = xstrdup("worker");
		argv[2] = xstrdup("-c");
		argv[3] = dispatcher.config_path;
		argv[4] = NULL;
		dup2(in_pipe[0], 0);
		dup2(out_pipe[1], 1);
		/* This dispatcher reads "queued" on the status lines (pool_note_queued). */
		setenv(STAGE_STATUS_QUEUED_ENV, "1", 1);
		if (worker_is_bulk(pool, light_lane))
			worker_lower_priority(0, pool->spec.bulk_nice);
		execv(exe, argv);
		exec_errno = errno;
		(void) !write(exec_pipe[1], &exec_errno, sizeof(exec_errno));
		_exit(127);
	}
	close(in_pipe[0]);
	close(out_pipe[1]);
	close(exec_pipe[1]);
	in_pipe[0] = out_pipe[1] = exec_pipe[1] = -1;
	/* The exec pipe closes on a successful exec; an errno arrives if it failed. */
	do
		n = read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
	while (n < 0 && errno == EINTR);
	close(exec_pipe[0]);
	exec_pipe[0] = -1;
	if (n == sizeof(exec_errno))
	{
		log_warnx("stage %s: cannot start %s: %s; holding the stage off for %.1f s",
				  pool->spec.name, pool->spec.program, strerror(exec_errno),
				  dispatcher.spawn_cooldown);
		waitpid(pid, NULL, 0);
		goto err;
	}

	w = xcalloc(1, sizeof(*w));
	w->pool = pool;
	w->pid = pid;
	w->to_child = in_pipe[1];
	w->from_child = out_pipe[0];
	/*
	 * One id more than QUEUE_LIMIT, which is never written to the worker
	 * (worker_hand): where a row waits that a claim brought beyond the
	 * workers' slots, such as the one the free light lane adds to a claim
	 * (pool_capacity) when the fair pick makes it a heavy sender's and
	 * every pipeline is full.  It stays claimed here until the worker's
	 * next answer, instead of going back to pending at the cost of a
	 * transaction, a claim again and its place in the queue.
	 */
	w->ring = (int) pool->spec.queue_limit + 1;
	w->queue = xcalloc((size_t) w->ring, sizeof(struct inflight));
	w->idle_since = w->last_done = now_seconds();
	fcntl(w->to_child, F_SETFL, O_NONBLOCK);
	fcntl(w->from_child, F_SETFL, O_NONBLOCK);
	ev_io_init(&w->reader, worker_on_readable, w->from_child, EV_READ);
	w->reader.data = w;
	ev_io_start(dispatcher.loop, &w->reader);
	ev_io_init(&w->writer, worker_on_writable, w->to_child, EV_WRITE);
	w->writer.data = w;
	ev_child_init(&w->child, worker_on_exit, pid, 0);
	w->child.data = w;
	ev_child_start(dispatcher.loop, &w->child);
	w->next = pool->workers;
	pool->workers = w;
	w->light_lane = light_lane;
	if (!light_lane)
		pool->nworkers++;
	free(exe);
	if (!light_lane)
		log_debug("stage %s: started worker %d (%d of %ld)", pool->spec.name, (int) pid,
				  pool->nworkers, pool->spec.parallelism);
	return w;

err:
	for (int i = 0; i < 2; i++)
	{
		if (in_pipe[i] >= 0)
			close(in_pipe[i]);
		if (out_pipe[i] >= 0)
			close(out_pipe[i]);
		if (exec_pipe[i] >= 0)
			close(exec_pipe[i]);
	}
	free(exe);
	pool->cooldown_until = now_seconds() + dispatcher.spawn_cooldown;
	return NULL;
}

/* ---------------------------------------------------------------------------
 * Handing out ids
 * ------------------------------------------------------------------------- */

static void
worker_flush(struct pool_worker *w)
{
	while (w->out.len > 0)
	{
		ssize_t n = write(w->to_child, w->out.data, w->out.len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
		{
			ev_io_start(dispatcher.loop, &w->writer);
			return;
		}
		if (n <= 0)
		{
			/* The worker is gone; its exit handler accounts for its rows. */
			buf_reset(&w->out);
			break;
		}
		buf_consume(&w->out, (size_t) n);
		w->written += (size_t) n;
	}
	ev_io_stop(dispatcher.loop, &w->writer);
}

static void
worker_on_writable(struct ev_loop *loop, ev_io *watcher, int revents)
{
	worker_flush(watcher->data);
}

/*
 * How many of its ids, from the oldest, a batching worker is written now:
 * all of them, except that an id of a sender far ahead (fair_outweighs)
 * of a sender whose id is before it and not answered yet waits until that
 * one is answered.  The worker takes all that is written as one batch,
 * so a light sender's row (put ahead of the heavier ids not written, see
 * pool_assign) then runs in a batch without the heavy sender's, instead
 * of waiting for a whole pipeline of them; the heavy rows wait for one
 * short batch.  With one sender, or senders alike, all are written.
 */
static int
worker_batch_limit(const struct pool_worker *w)
{
	const struct inflight *lightest = NULL;

	for (int i = 0; i < w->count; i++)
	{
		const struct inflight *entry = &w->queue[(w->head + i) % w->ring];

		if (i >= w->handed && lightest != NULL
			&& fair_outweighs(entry->sender_use, lightest->sender_use, w->pool->row_cost_us)
			&& strcmp(entry->sender, lightest->sender) != 0)
			return i;
		if (lightest == NULL || entry->sender_use < lightest->sender_use)
			lightest = entry;
	}
	return w->count;
}

/*
 * Write the worker the ids it should hold now (see HAND_AHEAD and
 * worker_batch_limit), in ring order, which is the order it will answer
 * them in.
 */
void
worker_hand(struct pool_worker *w)
{
	int limit = w->pool->intake == INTAKE_BATCH ? worker_batch_limit(w) : HAND_AHEAD;

	if (limit > w->pool->spec.queue_limit)
		limit = (int) w->pool->spec.queue_limit; /* the ring's spare id waits (worker_spawn) */

	/* Stopping: what it was not written goes back to pending when it exits. */
	if ((w->state != WORKER_RUNNING && w->state != WORKER_RETIRING) || dispatcher.shutting_down)
		return;
	for (; w->handed < w->count && w->handed < limit; w->handed++)
	{
		struct inflight *entry = &w->queue[(w->head + w->handed) % w->ring];

		entry->sent_at = now_seconds();
		/* the claim token after the id: the row's transitions must name it */
		buf_printf(&w->out, "%lld %s\n", entry->id, entry->token);
	}
	if (w->out.len > 0 && !ev_is_active(&w->writer))
		worker_flush(w);
}

/*
 * A worker that takes one id at a time and has been on its current one
 * far longer than the stage's rows take (a slow destination's delivery):
 * an id given to it would wait for that one to end, so it is given one
 * only when no other worker can take it (nor a new one be started).  A
 * batching worker's pass is as long as its batch: never stalled so.
 */
#define STALL_FLOOR_SECONDS 0.25
#define STALL_ROW_COSTS 4

static bool
worker_stalled(const struct pool_worker *w, double now)
{
	const struct inflight *head;
	double				   started;
	double				   limit = STALL_ROW_COSTS * w->pool->row_cost_us / 1e6;

	if (w->pool->intake == INTAKE_BATCH || w->handed == 0)
		return false;
	head = &w->queue[w->head];
	started = head->sent_at > w->last_done ? head->sent_at : w->last_done;
	return now - started > (limit > STALL_FLOOR_SECONDS ? limit : STALL_FLOOR_SECONDS);
}

/* The least loaded worker with room in its queue, passing over stalled ones if asked; or NULL. */
static struct pool_worker *
pool_least_loaded(struct pool *pool, double now, bool skip_stalled)
{
	struct pool_worker *best = NULL;

	for (struct pool_worker *w = pool->workers; w; w = w->next)
		if (!w->light_lane && worker_has_room(w) && (best == NULL || w->count < best->count)
			&& !(skip_stalled && worker_stalled(w, now)))
			best = w;
	return best;
}

/*
 * Whether any id w holds is of another sender far ahead of one that had
 * used use of worker time (fair_outweighs): an id of that lighter sender
 * put there would wait for them.
 */
static bool
worker_holds_heavier(const struct pool_worker *w, const char *sender, double use)
{
	for (int i = 0; i < w->count; i++)
	{
		const struct inflight *entry = &w->queue[(w->head + i) % w->ring];

		if (fair_outweighs(entry->sender_use, use, w->pool->row_cost_us)
			&& strcmp(entry->sender, sender) != 0)
			return true;
	}
	return false;
}

/*
 * Whether a row of sender, which had used use of worker time, goes to
 * the light lane: it is open, and every worker of the pool holds rows of
 * a sender far heavier.  The lane is started here when not running.
 */
static struct pool_worker *
light_lane_takes(struct pool *pool, const char *sender, double use, double now)
{
	if (!light_lane_open(pool, now))
		return NULL;
	for (struct pool_worker *w = pool->workers; w; w = w->next)
		if (!w->light_lane && w->state == WORKER_RUNNING && !worker_holds_heavier(w, sender, use))
			return NULL;
	if (pool->light_lane == NULL && (pool->light_lane = worker_spawn(pool, true)) != NULL)
		log_debug("stage %s: started the light lane, worker %d, for sender %s", pool->spec.name,
				  (int) pool->light_lane->pid, sender);
	return pool->light_lane;
}

/*
 * Pack onto the busiest worker with room, so surplus workers go idle,
 * passing over a stalled one (worker_stalled).  But a row of a sender
 * lighter than one whose rows that worker holds goes to the worker with
 * the fewest ids, an idle one if there is: a batching worker runs what it
 * was written as its next batch, so there the light row would wait for
 * the batch in progress and then run in a batch of the heavy sender's
 * depth, while a worker beside it idles (the heavy sender's rows keep
 * packing).  In
 * its ring the id goes ahead of the ids not yet written whose senders
 * had used more worker time (a sender's own rows keep their order).  It
 * is written by the next pools_flush, or when its turn comes.
 */
bool
pool_assign(struct pool *pool, long long id, const char *token, const char *sender)
{
	struct pool_worker *best = NULL;
	struct inflight	   *slot;
	double				now = now_seconds();
	double				use = fair_used(pool->fair, sender, now, dispatcher.fair_half_life);
	int					at;

	for (struct pool_worker *w = pool->workers; w; w = w->next)
		if (!w->light_lane && worker_slots(w) > 0 && (best == NULL || w->count > best->count)
			&& !worker_stalled(w, now))
			best = w;
	if (best != NULL && best->count > 0 && worker_holds_heavier(best, sender, use))
		for (struct pool_worker *w = pool->workers; w; w = w->next)
			if (!w->light_lane && worker_slots(w) > 0 && w->count < best->count
				&& !worker_stalled(w, now))
				best = w;
	if (best == NULL || best->count > 0)
	{
		struct pool_worker *lane = light_lane_takes(pool, sender, use, now);

		if (lane != NULL)
			best = lane;
	}

	/*
	 * The claim was sized by the depth of its moment; answers since may
	 * have made the rows dearer and the depth shallower.  What was claimed
	 * is taken all the same, within the queue limits, on the least loaded
	 * worker: putting it back would cost a write and a claim again.
	 */
	if (best == NULL)
		best = pool_least_loaded(pool, now, true);
	if (dispatcher.shutting_down)
		return false; /* claimed as we stopped: the caller puts it back */
	if (best == NULL && pool->nworkers < pool->spec.parallelism && now >= pool->cooldown_until)
		best = worker_spawn(pool, false);
	/* Only a stalled worker has room: the id waits there rather than go back. */
	if (best == NULL)
		best = pool_least_loaded(pool, now, false);
	if (best == NULL)
		return false;
	for (at = best->count; at > best->handed; at--)
	{
		struct inflight *before = &best->queue[(best->head + at - 1) % best->ring];

		if (before->sender_use <= use || strcmp(before->sender, sender) == 0)
			break;
		best->queue[(best->head + at) % best->ring] = *before;
	}
	slot = &best->queue[(best->head + at) % best->ring];
	slot->id = id;
	snprintf(slot->token, sizeof(slot->token), "%s", token);
	slot->sender = xstrdup(sender);
	slot->sender_use = use;
	slot->sent_at = now;
	best->count++;
	return true;
}

/*
 * Write the ids assigned since the last call, one write per worker: a
 * worker that wakes to a single id would run a batch of one, where its
 * whole share of a claim can be loaded and committed together.
 */
void
pools_flush(void)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		for (struct pool_worker *w = p->workers; w; w = w->next)
			worker_hand(w);
}

/* ---------------------------------------------------------------------------
 * Time limits, reaping, reconfiguration, shutdown
 * ------------------------------------------------------------------------- */

void
pools_housekeeping(double now)
{
	pools_drop_removed();
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		for (struct pool_worker *w = p->workers; w; w = w->next)
		{
			if (w->count > 0 && (w->state == WORKER_RUNNING || w->state == WORKER_RETIRING))
			{
				const struct inflight *head = &w->queue[w->head];
				double				   started = head->sent_at > w->last_done ? head->sent_at : w->last_done;

				if ((now - started) * 1000 > p->spec.max_runtime_ms)
					worker_transition(w, WORKER_KILLED_FOR_TIMEOUT);
			}
			else if (w->count == 0 && w->state == WORKER_RUNNING
					 && now - w->idle_since > dispatcher.idle_timeout)
			{
				log_debug("stage %s: worker %d idle; reaping it", p->spec.name, (int) w->pid);
				worker_transition(w, WORKER_RETIRING);
			}
		}
}

static void
pool_free(struct pool *pool)
{
	fair_free(pool->fair);
	free(pool->spec.name);
	free(pool->spec.program);
	free(pool);
}

/*
 * Free the pools a reload removed once their last worker is gone and
 * their statistics are flushed.
 */
static void
pools_drop_removed(void)
{
	struct pool **link = &dispatcher.pools;

	while (*link)
	{
		struct pool *p = *link;

		if (p->removed && p->workers == NULL && p->stats.messages == 0 && p->stats.kills == 0
			&& p->stats.crashes == 0 && p->stats.timeouts == 0 && p->stats.fused_hops == 0)
		{
			log_debug("stage %s: removed from the configuration and drained; dropped",
					  p->spec.name);
			*link = p->next;
			pool_free(p);
		}
		else
			link = &p->next;
	}
}

/* How PROGRAM's workers take their ids, if the stage registry knows it. */
static enum pool_intake
pool_intake_of(const char *program)
{
	if (strchr(program, '/') != NULL || !pepsi_registry_has(program))
		return INTAKE_UNKNOWN;
	return pepsi_registry_one_at_a_time(program) ? INTAKE_ONE : INTAKE_BATCH;
}

/* Replace the pools' specs; workers of changed or removed stages retire. */
void
pools_configure(struct stage_spec *specs, size_t count)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
	{
		p->removed = true;
		for (struct pool_worker *w = p->workers; w; w = w->next)
			worker_transition(w, WORKER_RETIRING);
	}
	for (size_t i = 0; i < count; i++)
	{
		struct pool *p;

		for (p = dispatcher.pools; p; p = p->next)
			if (strcmp(p->spec.name, specs[i].name) == 0)
				break;
		if (p == NULL)
		{
			p = xcalloc(1, sizeof(*p));
			p->fair = fair_create();
			p->row_cost_us = 1000;
			depth_init(&p->depth);
			p->next = dispatcher.pools;
			dispatcher.pools = p;
			p->spec.name = xstrdup(specs[i].name);
		}
		p->spec.queue_limit = specs[i].queue_limit;
		if (p->spec.program == NULL || strcmp(p->spec.program, specs[i].program) != 0)
			p->intake = pool_intake_of(specs[i].program);
		free(p->spec.program);
		p->spec.program = xstrdup(specs[i].program);
		p->spec.parallelism = specs[i].parallelism;
		p->spec.max_messages = specs[i].max_messages;
		p->spec.max_runtime_ms = specs[i].max_runtime_ms;
		p->spec.light_lane = specs[i].light_lane;
		p->spec.bulk_nice = specs[i].bulk_nice;
		p->cooldown_until = 0;
		p->removed = false;
	}
	pools_drop_removed();
}

void
pools_retire_all(void)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		for (struct pool_worker *w = p->workers; w; w = w->next)
			worker_transition(w, WORKER_RETIRING);
}

void
pools_stop_all(void)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		for (struct pool_worker *w = p->workers; w; w = w->next)
			kill(w->pid, SIGTERM);
}

/* At shutdown, for the workers that outlived the grace period. */
void
pools_kill_all(void)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		for (struct pool_worker *w = p->workers; w; w = w->next)
			kill(w->pid, SIGKILL);
}

bool
pools_all_stopped(void)
{
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		if (p->workers)
			return false;
	return true;
}
