/*
 * test_auth_worker.c: the worker threads of auth_worker.c on a real libev
 * loop: work runs on a thread other than the loop's and its done on the
 * loop, after the call that queued it; a job abandoned while its work runs
 * calls release instead of done, only once the work is over; a heavy job
 * holds up no light one; a password check still answers.
 */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "auth_worker.h"

static struct ev_loop *loop;
static pthread_t	   loop_thread;

struct probe
{
	pthread_t work_thread;
	pthread_t done_thread;
	int		  works;
	int		  dones;
	int		  releases;
	bool	  password_ok;
	sem_t	  go; /* the work waits for it when hold is set */
	bool	  hold;
};

static void
probe_work(void *arg)
{
	struct probe *p = arg;

	p->work_thread = pthread_self();
	if (p->hold)
		sem_wait(&p->go);
	p->works++;
}

static void
probe_done(void *arg)
{
	struct probe *p = arg;

	p->done_thread = pthread_self();
	p->dones++;
	ev_break(loop, EVBREAK_ALL);
}

static void
probe_release(void *arg)
{
	struct probe *p = arg;

	p->done_thread = pthread_self();
	p->releases++;
	ev_break(loop, EVBREAK_ALL);
}

static void
probe_password(void *arg, bool ok)
{
	struct probe *p = arg;

	p->password_ok = ok;
	p->dones++;
	ev_break(loop, EVBREAK_ALL);
}

static void
on_give_up(struct ev_loop *l, ev_timer *w, int revents)
{
	ev_break(l, EVBREAK_ALL);
}

/* Run the loop until a callback breaks it, 30 s at most (the watcher alone keeps no loop alive). */
static void
run_loop(void)
{
	ev_timer give_up;

	ev_timer_init(&give_up, on_give_up, 30.0, 0.0);
	ev_timer_start(loop, &give_up);
	ev_run(loop, 0);
	ev_timer_stop(loop, &give_up);
}

static void
test_work_off_the_loop(void **state)
{
	struct probe p = {0};

	(void) state;
	assert_non_null(auth_worker_run(loop, AUTH_LANE_LIGHT, probe_work, probe_done, &p));
	assert_int_equal(p.dones, 0); /* never from within the call */
	run_loop();
	assert_int_equal(p.works, 1);
	assert_int_equal(p.dones, 1);
	assert_false(pthread_equal(p.work_thread, loop_thread));
	assert_true(pthread_equal(p.done_thread, loop_thread));
}

static void
test_abandoned_while_working(void **state)
{
	struct probe	 p = {.hold = true};
	struct auth_job *job;

	(void) state;
	sem_init(&p.go, 0, 0);
	job = auth_worker_run(loop, AUTH_LANE_LIGHT, probe_work, probe_done, &p);
	/* The owner goes while the work has not finished: release, not done, and only after it. */
	auth_worker_abandon(job, probe_release);
	assert_int_equal(p.releases, 0);
	sem_post(&p.go);
	run_loop();
	assert_int_equal(p.works, 1);
	assert_int_equal(p.dones, 0);
	assert_int_equal(p.releases, 1);
	assert_true(pthread_equal(p.done_thread, loop_thread));
	sem_destroy(&p.go);
}

/* A heavy job that does not finish holds up no light one. */
static void
test_heavy_lane_apart(void **state)
{
	struct probe heavy = {.hold = true};
	struct probe light = {0};

	(void) state;
	sem_init(&heavy.go, 0, 0);
	assert_non_null(auth_worker_run(loop, AUTH_LANE_HEAVY, probe_work, probe_done, &heavy));
	assert_non_null(auth_worker_run(loop, AUTH_LANE_LIGHT, probe_work, probe_done, &light));
	run_loop();
	assert_int_equal(light.dones, 1);
	assert_int_equal(heavy.works, 0);
	sem_post(&heavy.go);
	run_loop();
	assert_int_equal(heavy.dones, 1);
	assert_false(pthread_equal(heavy.work_thread, light.work_thread));
	sem_destroy(&heavy.go);
}

static void
test_password_check(void **state)
{
	struct probe p = {.password_ok = true};

	(void) state;
	/* No credentials: the dummy hash is checked, and the answer is no. */
	assert_non_null(auth_worker_submit(loop, NULL, "nobody", "secret", probe_password, &p));
	run_loop();
	assert_int_equal(p.dones, 1);
	assert_false(p.password_ok);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_work_off_the_loop),
		cmocka_unit_test(test_abandoned_while_working),
		cmocka_unit_test(test_heavy_lane_apart),
		cmocka_unit_test(test_password_check),
	};

	loop = ev_loop_new(EVFLAG_AUTO);
	loop_thread = pthread_self();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
