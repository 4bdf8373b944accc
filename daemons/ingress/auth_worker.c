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

#include "log.h"
#include "xalloc.h"

/* Two threads: the machine's other cores serve the database and the stages. */
#define AUTH_WORKER_THREADS 2

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

static pthread_mutex_t	 auth_worker_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t	 auth_worker_wake = PTHREAD_COND_INITIALIZER;
static struct auth_job	*auth_worker_todo;
static struct auth_job **auth_worker_todo_tail = &auth_worker_todo;
static struct auth_job	*auth_worker_done;
static struct ev_loop	*auth_worker_loop;
static ev_async			 auth_worker_async;
static bool				 auth_worker_started;

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
auth_worker_thread(void *unused)
{
	(void) unused;
	for (;;)
	{
		struct auth_job *job;

		pthread_mutex_lock(&auth_worker_lock);
		while (auth_worker_todo == NULL)
			pthread_cond_wait(&auth_worker_wake, &auth_worker_lock);
		job = auth_worker_todo;
		auth_worker_todo = job->next;
		if (auth_worker_todo == NULL)
			auth_worker_todo_tail = &auth_worker_todo;
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
	for (int i = 0; i < AUTH_WORKER_THREADS; i++)
	{
		pthread_t	   thread;
		pthread_attr_t attr;
		int			   rc;

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if ((rc = pthread_create(&thread, &attr, auth_worker_thread, NULL)) != 0)
		{
			errno = rc;
			fatal("cannot start a thread to check AUTH passwords");
		}
		pthread_attr_destroy(&attr);
	}
	auth_worker_started = true;
}

static struct auth_job *
auth_worker_queue(struct ev_loop *loop, struct auth_job *job)
{
	if (!auth_worker_started)
		auth_worker_start(loop);
	pthread_mutex_lock(&auth_worker_lock);
	*auth_worker_todo_tail = job;
	auth_worker_todo_tail = &job->next;
	pthread_cond_signal(&auth_worker_wake);
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
	return auth_worker_queue(loop, job);
}

struct auth_job *
auth_worker_run(struct ev_loop *loop, auth_work_fn work, auth_work_fn done, void *arg)
{
	struct auth_job *job = xcalloc(1, sizeof(*job));

	job->work = work;
	job->done = done;
	job->arg = arg;
	return auth_worker_queue(loop, job);
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
