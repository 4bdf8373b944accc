/*
 * test_child_run.c: child_run, the one wait-and-kill of the set-user-id
 * helpers and the stages, on real children (/bin/sh): how each ended,
 * what they wrote, the cap on it, the deadline that kills the child's
 * whole process group, the input given on its standard input, and a
 * status lost to someone else's reaping, which is never an exit 0.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "process/child_run.h"

int main(void);

static void
run_sh(void *arg)
{
	execl("/bin/sh", "sh", "-c", (const char *) arg, (char *) NULL);
	_exit(127);
}

/* Run script under sh with a deadline and a cap. */
static void
run(const char *script, long long timeout_ms, size_t cap, struct child_result *r)
{
	char			  copy[512];
	struct child_spec spec = {run_sh, copy, timeout_ms, cap, NULL, 0};
	char			  err[256];

	snprintf(copy, sizeof(copy), "%s", script);

	assert_true(child_run(&spec, r, err, sizeof(err)));
}

static void
test_exit_status_and_output(void **state)
{
	struct child_result r;

	run("echo proof; echo oops >&2; exit 3", 10000, 1000, &r);
	assert_int_equal(r.end, CHILD_EXITED);
	assert_int_equal(r.code, 3);
	assert_string_equal(r.output, "proof\noops\n");
	assert_int_equal(r.len, 11);
	assert_false(r.truncated);
	child_result_free(&r);

	run("exit 0", 10000, 1000, &r);
	assert_int_equal(r.end, CHILD_EXITED);
	assert_int_equal(r.code, 0);
	assert_int_equal(r.len, 0);
	assert_string_equal(r.output, "");
	child_result_free(&r);
}

static void
test_killed_by_a_signal(void **state)
{
	struct child_result r;

	run("kill -TERM $$", 10000, 1000, &r);
	assert_int_equal(r.end, CHILD_SIGNALED);
	assert_int_equal(r.code, SIGTERM);
	child_result_free(&r);
}

/* A child that hangs is killed at the deadline with what it started, and its output after that is not read. */
static void
test_timeout_kills_the_group(void **state)
{
	struct child_result r;
	char				pidfile[] = "/tmp/pepsi-child-run-XXXXXX";
	char				script[256];
	int					fd = mkstemp(pidfile);
	FILE			   *f;
	long				grandchild = 0;

	assert_true(fd >= 0);
	close(fd);
	/* The grandchild keeps the output open and would write after the deadline. */
	snprintf(script, sizeof(script), "(sleep 30; echo late) & echo $! > %s; echo early; wait", pidfile);
	run(script, 300, 1000, &r);
	assert_int_equal(r.end, CHILD_TIMED_OUT);
	assert_string_equal(r.output, "early\n");
	assert_true(r.elapsed_ms >= 300);
	assert_true(r.elapsed_ms < 20000);
	f = fopen(pidfile, "r");
	assert_non_null(f);
	assert_int_equal(fscanf(f, "%ld", &grandchild), 1);
	fclose(f);
	unlink(pidfile);
	/* Killed with the group: gone once init reaps it (bounded poll). */
	for (int i = 0; i < 500 && kill((pid_t) grandchild, 0) == 0; i++)
	{
		struct timespec step = {0, 10 * 1000000L};

		nanosleep(&step, NULL);
	}
	assert_int_equal(kill((pid_t) grandchild, 0), -1);
	assert_int_equal(errno, ESRCH);
	child_result_free(&r);
}

/* Output past the cap is read and dropped: the child is not blocked and ends normally. */
static void
test_output_cap(void **state)
{
	struct child_result r;

	run("head -c 1000000 /dev/zero | tr '\\000' x; exit 4", 20000, 100, &r);
	assert_int_equal(r.end, CHILD_EXITED);
	assert_int_equal(r.code, 4);
	assert_int_equal(r.len, 100);
	assert_true(r.truncated);
	assert_int_equal(strspn(r.output, "x"), 100);
	assert_int_equal(r.output[100], '\0');
	child_result_free(&r);

	run("printf 12345", 10000, 5, &r);
	assert_int_equal(r.len, 5);
	assert_false(r.truncated);
	assert_string_equal(r.output, "12345");
	child_result_free(&r);
}

/* A child that cannot exec is an exit status, not a hang. */
static void
test_exec_fails(void **state)
{
	struct child_result r;

	run("exec /nonexistent/program", 10000, 1000, &r);
	assert_int_equal(r.end, CHILD_EXITED);
	assert_int_equal(r.code, 127);
	child_result_free(&r);
}

/* The input is the child's standard input, which then ends; it is on no command line. */
static void
test_input_on_stdin(void **state)
{
	static const char	proof[] = "a-proof-of-payment";
	char				script[] = "read -r line; echo \"got $line\"; cat; echo \"args $#\"; exit 0";
	struct child_spec	spec = {run_sh, script, 10000, 1000, proof, sizeof(proof) - 1};
	struct child_result r;
	char				err[256];

	assert_true(child_run(&spec, &r, err, sizeof(err)));
	assert_int_equal(r.end, CHILD_EXITED);
	assert_int_equal(r.code, 0);
	/* read saw the whole input, then cat its end at once: no hang until the deadline. */
	assert_string_equal(r.output, "got a-proof-of-payment\nargs 0\n");
	child_result_free(&r);

	/* An empty input is an empty standard input. */
	spec.input = "";
	spec.input_len = 0;
	snprintf(script, sizeof(script), "%s", "cat; echo end");
	assert_true(child_run(&spec, &r, err, sizeof(err)));
	assert_string_equal(r.output, "end\n");
	child_result_free(&r);

	/* A child that never reads it ends as it would. */
	spec.input = proof;
	spec.input_len = sizeof(proof) - 1;
	snprintf(script, sizeof(script), "%s", "exit 1");
	assert_true(child_run(&spec, &r, err, sizeof(err)));
	assert_int_equal(r.end, CHILD_EXITED);
	assert_int_equal(r.code, 1);
	child_result_free(&r);
}

/* More input than a pipe takes at once is refused before anything runs. */
static void
test_input_too_large(void **state)
{
	static char			big[CHILD_RUN_INPUT_MAX + 1];
	char				script[] = "exit 0";
	struct child_spec	spec = {run_sh, script, 10000, 1000, big, sizeof(big)};
	struct child_result r;
	char				err[256] = "";

	assert_false(child_run(&spec, &r, err, sizeof(err)));
	assert_non_null(strstr(err, "more than a child is given"));
}

/* With SIGCHLD ignored the kernel reaps the child: its status is lost, and that is no exit 0. */
static void
test_lost_status_is_no_success(void **state)
{
	struct child_result r;
	void (*was)(int) = signal(SIGCHLD, SIG_IGN);

	run("exit 0", 10000, 1000, &r);
	signal(SIGCHLD, was);
	assert_int_equal(r.end, CHILD_LOST);
	assert_int_equal(r.code, -1);
	child_result_free(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exit_status_and_output),
		cmocka_unit_test(test_killed_by_a_signal),
		cmocka_unit_test(test_timeout_kills_the_group),
		cmocka_unit_test(test_output_cap),
		cmocka_unit_test(test_exec_fails),
		cmocka_unit_test(test_input_on_stdin),
		cmocka_unit_test(test_input_too_large),
		cmocka_unit_test(test_lost_status_is_no_success),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
