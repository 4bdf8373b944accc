/*
 * milter_gate_pool.c: the threads that take the conversations' steps,
 * and their answers back to the event loop.
 *
 * The conversation is common/message/milter_client.c's, which waits on
 * the filter's socket with poll() under its own deadlines: it cannot run
 * on the loop, which must never wait.  Why a pool of kept threads rather
 * than a thread per session or per transaction: a step is a few packets
 * and a round trip, far cheaper than starting a thread, and a busy
 * listener has every session filtered.  Threads are started only when a
 * step finds none idle, up to MILTER_THREADS, and then kept, so a host
 * starts them once for its busiest moment.  A conversation's steps are
 * a queue taken one step at a time, in order (its session waits for each
 * MAIL and RCPT answer anyway), so a conversation is never on two
 * threads and needs no lock of its own.  A filter that hangs holds the
 * thread taking its step for at most its timeouts, and only its own
 * session waits for that answer; the others wait only when MILTER_THREADS
 * steps hang at once, the bound that keeps the threads' stacks in check.
 * A session that closes drops its waiting steps; its QUIT comes after
 * the step being taken, if any, and frees the conversation.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "milter_gate_internal.h"

/* A thread reads a message and a few replies: a small stack is plenty. */
#define POOL_STACK (512 * 1024)

static pthread_mutex_t	   pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t	   pool_wake = PTHREAD_COND_INITIALIZER;
static struct milter_gate *ready_head; /* conversations with a step to take */
static struct milter_gate *ready_tail;
static size_t			   ready_count;
static size_t			   pool_threads;
static size_t			   pool_idle;
static size_t			   pool_max = 1;
static struct gate_step	  *answered_head; /* taken steps for the loop, oldest first */
static struct gate_step	  *answered_tail;
static struct ev_loop	  *pool_loop;
static ev_async			   pool_async;

static void
step_free(struct gate_step *step)
{
	json_decref(step->origin);
	free(step->text);
	free(step->queue_id);
	if (step->has_message)
		milter_message_free(&step->m);
	milter_gate_result_free(&step->result);
	free(step);
}

static void *pool_thread(void *arg);

/* g has steps waiting (under the lock): on the ready list, with a thread to take it. */
static void
pool_schedule(struct milter_gate *g)
{
	if (g->scheduled || g->steps == NULL)
		return;
	g->scheduled = true;
	g->next_ready = NULL;
	if (ready_tail)
		ready_tail->next_ready = g;
	else
		ready_head = g;
	ready_tail = g;
	ready_count++;
	if (ready_count > pool_idle && pool_threads < pool_max)
	{
		pthread_attr_t attr;
		pthread_t	   thread;
		int			   rc;

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&attr, POOL_STACK);
		rc = pthread_create(&thread, &attr, pool_thread, NULL);
		pthread_attr_destroy(&attr);
		if (rc == 0)
			pool_threads++;
		else if (pool_threads == 0)
		{
			errno = rc;
			fatal("cannot start a thread to talk to the milters");
		}
		else
			log_warnx("milters: no thread started (%s): %zu take the steps", strerror(rc), pool_threads);
	}
	pthread_cond_signal(&pool_wake);
}

static void *
pool_thread(void *arg)
{
	pthread_mutex_lock(&pool_lock);
	for (;;)
	{
		struct milter_gate *g;
		struct gate_step   *step;
		bool				to_loop;

		pool_idle++;
		while (ready_head == NULL)
			pthread_cond_wait(&pool_wake, &pool_lock);
		pool_idle--;
		g = ready_head;
		ready_head = g->next_ready;
		if (ready_head == NULL)
			ready_tail = NULL;
		ready_count--;
		step = g->steps; /* never NULL: steps are only ever replaced by a QUIT */
		g->steps = step->next;
		if (g->steps == NULL)
			g->steps_tail = NULL;
		pthread_mutex_unlock(&pool_lock);

		gate_step_run(g, step);

		to_loop = step->answered || step->kind == GATE_STEP_QUIT;
		pthread_mutex_lock(&pool_lock);
		g->scheduled = false;
		pool_schedule(g); /* its next step, behind the others waiting */
		if (to_loop)
		{
			/* after a QUIT, g is the loop's to free: not touched again here */
			step->next = NULL;
			if (answered_tail)
				answered_tail->next = step;
			else
				answered_head = step;
			answered_tail = step;
		}
		pthread_mutex_unlock(&pool_lock);
		if (to_loop)
			ev_async_send(pool_loop, &pool_async);
		else
			step_free(step);
		pthread_mutex_lock(&pool_lock);
	}
	return NULL;
}

static void
gate_free(struct milter_gate *g)
{
	free(g->ip);
	free(g->listener);
	free(g->hostname);
	free(g->mail_from);
	free(g->discard_filter);
	free(g);
}

/* The taken steps: answered to their sessions, in order; a QUIT frees its conversation. */
static void
pool_on_answers(struct ev_loop *loop, ev_async *w, int revents)
{
	struct gate_step *list;

	pthread_mutex_lock(&pool_lock);
	list = answered_head;
	answered_head = answered_tail = NULL;
	pthread_mutex_unlock(&pool_lock);
	while (list)
	{
		struct gate_step   *step = list;
		struct milter_gate *g = step->gate;

		list = step->next;
		if (step->kind == GATE_STEP_QUIT)
			gate_free(g);
		else if (!g->closed)
			g->answer(g->arg, &step->result);
		step_free(step);
	}
}

void
milter_gate_init(struct ev_loop *loop, size_t threads)
{
	pool_max = threads ? threads : 1;
	if (pool_loop)
		return;
	pool_loop = loop;
	ev_async_init(&pool_async, pool_on_answers);
	ev_async_start(loop, &pool_async);
	/* Not a reason to keep the loop running by itself. */
	ev_unref(loop);
}

static struct gate_step *
step_new(struct milter_gate *g, enum gate_step_kind kind, const struct smtp_session *smtp, const char *text)
{
	struct gate_step *step = xcalloc(1, sizeof(*step));

	step->kind = kind;
	step->gate = g;
	step->origin = gate_origin(g, smtp);
	step->text = text ? xstrdup(text) : NULL;
	return step;
}

static void
step_queue(struct milter_gate *g, struct gate_step *step)
{
	pthread_mutex_lock(&pool_lock);
	if (g->closed && step->kind != GATE_STEP_QUIT)
	{
		pthread_mutex_unlock(&pool_lock);
		step_free(step);
		return;
	}
	if (g->steps_tail)
		g->steps_tail->next = step;
	else
		g->steps = step;
	g->steps_tail = step;
	pool_schedule(g);
	pthread_mutex_unlock(&pool_lock);
}

struct milter_gate *
milter_gate_open(const struct milter_gate_list *list, const struct milter_gate_client *client,
				 milter_gate_answer answer, void *arg)
{
	struct milter_gate *g = xcalloc(1, sizeof(*g));

	if (pool_loop == NULL)
		fatalx("milter_gate_open before milter_gate_init");
	g->ip = xstrdup(client->ip);
	g->listener = xstrdup(client->listener);
	g->hostname = xstrdup(client->hostname);
	g->answer = answer;
	g->arg = arg;
	snprintf(g->name, sizeof(g->name), "%s", client->ip);
	gate_filters_new(g, list);
	step_queue(g, step_new(g, GATE_STEP_CONNECT, NULL, NULL));
	return g;
}

void
milter_gate_helo(struct milter_gate *g, const struct smtp_session *smtp)
{
	step_queue(g, step_new(g, GATE_STEP_HELO, smtp, smtp->helo ? smtp->helo : ""));
}

void
milter_gate_envelope(struct milter_gate *g, const struct smtp_session *smtp, const char *address, bool mail)
{
	struct gate_step *step = step_new(g, mail ? GATE_STEP_MAIL : GATE_STEP_RCPT, smtp, address);

	step->answered = true;
	step_queue(g, step);
}

void
milter_gate_message(struct milter_gate *g, const struct smtp_session *smtp, const char *queue_id)
{
	struct gate_step *step = step_new(g, GATE_STEP_MESSAGE, smtp, NULL);

	step->answered = true;
	step->queue_id = xstrdup(queue_id);
	gate_message_copy(step, smtp);
	step_queue(g, step);
}

void
milter_gate_close(struct milter_gate *g)
{
	struct gate_step *quit;
	struct gate_step *dropped;

	if (g == NULL)
		return;
	quit = step_new(g, GATE_STEP_QUIT, NULL, NULL);
	pthread_mutex_lock(&pool_lock);
	g->closed = true;
	dropped = g->steps;
	g->steps = g->steps_tail = quit;
	pool_schedule(g);
	pthread_mutex_unlock(&pool_lock);
	while (dropped)
	{
		struct gate_step *next = dropped->next;

		step_free(dropped);
		dropped = next;
	}
}
