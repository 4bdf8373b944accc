/*
 * auth_worker.c: see auth_worker.h.  Jobs go to the threads through one
 * queue under a mutex and come back through another; the threads are
 * started on the first job (an AUTH, a message to verify), after
 * privileges were dropped, and live as long as the process.
 */
#include "auth_worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"

/*
 * Two threads for the light lane (the machine's other cores serve the
 * database and the stages), one for the heavy lane, AUTH_WORKER_HEAVY_NICE
 * nicer than the process: under load the light lane gets the CPU first.
 */
#define AUTH_WORKER_THREADS 2
#define AUTH_WORKER_HEAVY_NICE 10

/* A lane's jobs, oldest first. */
struct auth_worker_lane
{
	struct auth_job	 *head;
	struct auth_job **tail;
	pthread_cond_t	  wake;
};

struct auth_job
{
	/* A password check (work is NULL) */
	char		 *hash;
	char		 *password;
	bool		  known;
	bool		  ok;
	auth_job_done password_done;
	/* Any other work */
	auth_work_fn	 work;
	auth_work_fn	 done;
	auth_work_fn	 release;	/* abandoned: instead of done */
	bool			 cancelled; /* read and written on the loop only */
	void			*arg;
	struct auth_job *next;
};

static pthread_mutex_t		   auth_worker_lock = PTHREAD_MUTEX_INITIALIZER;
static struct auth_worker_lane auth_worker_lanes[2] = {
	{NULL, &auth_worker_lanes[0].head, PTHREAD_COND_INITIALIZER},
	{NULL, &auth_worker_lanes[1].head, PTHREAD_COND_INITIALIZER},
};
static struct auth_job *auth_worker_done;
static struct ev_loop  *auth_worker_loop;
static ev_async			auth_worker_async;
static bool				auth_worker_started;

static void
auth_job_free(struct auth_job *job)
{
	if (job->hash)
		explicit_bzero(job->hash, strlen(job->hash));
	free(job->hash);
	if (job->password)
	{
		explicit_bzero(job->password, strlen(job->password));
		free(job->password);
	}
	free(job);
}

static void *
auth_worker_thread(void *arg)
{
	struct auth_worker_lane *lane = arg;

	/* Linux gives each thread its own nice value: the heavy lane's yields to the rest. */
	if (lane == &auth_worker_lanes[AUTH_LANE_HEAVY])
	{
		errno = 0;
		int nice = getpriority(PRIO_PROCESS, 0);

		if (errno == 0)
			setpriority(PRIO_PROCESS, (id_t) gettid(), nice + AUTH_WORKER_HEAVY_NICE);
	}
	for (;;)
	{
		struct auth_job *job;

		pthread_mutex_lock(&auth_worker_lock);
		while (lane->head == NULL)
			pthread_cond_wait(&lane->wake, &auth_worker_lock);
		job = lane->head;
		lane->head = job->next;
		if (lane->head == NULL)
			lane->tail = &lane->head;
		pthread_mutex_unlock(&auth_worker_lock);

		if (job->work)
			job->work(job->arg);
		else
		{
			job->ok = credentials_verify(job->hash, job->password) && job->known;
			explicit_bzero(job->password, strlen(job->password));
			free(job->password);
			job->password = NULL;
		}

		pthread_mutex_lock(&auth_worker_lock);
		job->next = auth_worker_done;
		auth_worker_done = job;
		pthread_mutex_unlock(&auth_worker_lock);
		ev_async_send(auth_worker_loop, &auth_worker_async);
	}
	return NULL;
}

/* On the loop: hand each finished job to its session. */
static void
auth_worker_on_done(struct ev_loop *loop, ev_async *w, int revents)
{
	struct auth_job *jobs;
	struct auth_job *reversed = NULL;

	(void) loop;
	(void) w;
	(void) revents;
	pthread_mutex_lock(&auth_worker_lock);
	jobs = auth_worker_done;
	auth_worker_done = NULL;
	pthread_mutex_unlock(&auth_worker_lock);
	while (jobs) /* oldest first */
	{
		struct auth_job *next = jobs->next;

		jobs->next = reversed;
		reversed = jobs;
		jobs = next;
	}
	while (reversed)
	{
		struct auth_job *job = reversed;

		reversed = job->next;
		if (job->release)
			job->release(job->arg);
		else if (!job->cancelled && job->work)
			job->done(job->arg);
		else if (!job->cancelled)
			job->password_done(job->arg, job->ok);
		auth_job_free(job);
	}
}

static void
auth_worker_start(struct ev_loop *loop)
{
	auth_worker_loop = loop;
	ev_async_init(&auth_worker_async, auth_worker_on_done);
	ev_async_start(loop, &auth_worker_async);
	/* The loop must not stay alive for the watcher alone (shutdown waits for sessions). */
	ev_unref(loop);
	for (int i = 0; i <= AUTH_WORKER_THREADS; i++)
	{
		pthread_t	   thread;
		pthread_attr_t attr;
		int			   rc;
		void		  *lane = &auth_worker_lanes[i < AUTH_WORKER_THREADS ? AUTH_LANE_LIGHT : AUTH_LANE_HEAVY];

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if ((rc = pthread_create(&thread, &attr, auth_worker_thread, lane)) != 0)
		{
			errno = rc;
			fatal("cannot start a thread to check AUTH passwords");
		}
		pthread_attr_destroy(&attr);
	}
	auth_worker_started = true;
}

static struct auth_job *
auth_worker_queue(struct ev_loop *loop, enum auth_lane which, struct auth_job *job)
{
	struct auth_worker_lane *lane = &auth_worker_lanes[which];

	if (!auth_worker_started)
		auth_worker_start(loop);
	pthread_mutex_lock(&auth_worker_lock);
	*lane->tail = job;
	lane->tail = &job->next;
	pthread_cond_signal(&lane->wake);
	pthread_mutex_unlock(&auth_worker_lock);
	return job;
}

struct auth_job *
auth_worker_submit(struct ev_loop *loop, const struct credentials *c, const char *user,
				   const char *password, auth_job_done done, void *arg)
{
	struct auth_job *job = xcalloc(1, sizeof(*job));

	job->hash = credentials_hash_for(c, user, &job->known);
	job->password = xstrdup(password);
	job->password_done = done;
	job->arg = arg;
	return auth_worker_queue(loop, AUTH_LANE_LIGHT, job);
}

struct auth_job *
auth_worker_run(struct ev_loop *loop, enum auth_lane lane, auth_work_fn work, auth_work_fn done,
				void *arg)
{
	struct auth_job *job = xcalloc(1, sizeof(*job));

	job->work = work;
	job->done = done;
	job->arg = arg;
	return auth_worker_queue(loop, lane, job);
}

void
auth_worker_abandon(struct auth_job *job, auth_work_fn release)
{
	job->release = release;
}

void
auth_worker_cancel(struct auth_job *job)
{
	if (job)
		job->cancelled = true;
}
