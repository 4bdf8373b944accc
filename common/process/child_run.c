/*
 * child_run.c: see child_run.h.
 */
#include "process/child_run.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/xalloc.h"

_Static_assert(CHILD_RUN_INPUT_MAX <= PIPE_BUF, "a child's input must fit a pipe before the child runs");

/* How often a child whose output has ended is asked whether it exited. */
#define CHILD_RUN_REAP_STEP_MS 5

static long long
child_run_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Keep what fits of n bytes of output. */
static void
child_run_keep(struct child_result *result, size_t max, const char *buf, size_t n)
{
	size_t room = max - result->len;

	if (n > room)
	{
		result->truncated = true;
		n = room;
	}
	memcpy(result->output + result->len, buf, n);
	result->len += n;
}

/*
 * A pipe whose read end (returned) holds input and then ends: written
 * whole before the child runs, which PIPE_BUF bytes always fit.  -1 with
 * err when it cannot be.
 */
static int
child_run_input(const char *input, size_t len, char *err, size_t errlen)
{
	int fds[2];

	if (len > CHILD_RUN_INPUT_MAX)
	{
		snprintf(err, errlen, "an input of %zu bytes is more than a child is given (%d)", len, CHILD_RUN_INPUT_MAX);
		return -1;
	}
	if (pipe2(fds, O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		return -1;
	}
	for (size_t done = 0; done < len;)
	{
		ssize_t n = write(fds[1], input + done, len - done);

		if (n < 0 && errno != EINTR)
		{
			snprintf(err, errlen, "writing the child's input: %s", strerror(errno));
			close(fds[0]);
			close(fds[1]);
			return -1;
		}
		done += n > 0 ? (size_t) n : 0;
	}
	close(fds[1]);
	return fds[0];
}

bool
child_run(const struct child_spec *spec, struct child_result *result, char *err, size_t errlen)
{
	long long start = child_run_now_ms();
	long long deadline = start + spec->timeout_ms;
	bool	  open = true;
	bool	  reaped = false;
	bool	  lost = false;
	bool	  timed_out = false;
	int		  status = 0;
	int		  out[2];
	int		  in = -1;
	pid_t	  pid;

	memset(result, 0, sizeof(*result));
	if (spec->input != NULL && (in = child_run_input(spec->input, spec->input_len, err, errlen)) < 0)
		return false;
	if (pipe2(out, O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		if (in >= 0)
			close(in);
		return false;
	}
	if ((pid = fork()) < 0)
	{
		snprintf(err, errlen, "fork: %s", strerror(errno));
		close(out[0]);
		close(out[1]);
		if (in >= 0)
			close(in);
		return false;
	}
	if (pid == 0)
	{
		setsid();
		if (dup2(out[1], STDOUT_FILENO) < 0 || dup2(out[1], STDERR_FILENO) < 0)
			_exit(127);
		if (in >= 0 && dup2(in, STDIN_FILENO) < 0)
			_exit(127);
		spec->start(spec->arg);
		_exit(127);
	}
	close(out[1]);
	if (in >= 0)
		close(in);
	result->output = xmalloc(spec->output_max + 1);
	while (open || !reaped)
	{
		long long left = deadline - child_run_now_ms();

		if (left <= 0)
		{
			timed_out = true;
			break;
		}
		if (open)
		{
			struct pollfd p = {.fd = out[0], .events = POLLIN};
			char		  buf[4096];
			ssize_t		  n;
			int			  ready = poll(&p, 1, left > 1000 ? 1000 : (int) left);

			if (ready < 0 && errno != EINTR)
				break;
			if (ready <= 0)
				continue;
			n = read(out[0], buf, sizeof(buf));
			if (n > 0)
				child_run_keep(result, spec->output_max, buf, (size_t) n);
			else if (n == 0 || errno != EINTR)
				open = false;
		}
		else
		{
			pid_t r = waitpid(pid, &status, WNOHANG);

			/* Gone without its status (SIGCHLD ignored, or reaped elsewhere): never taken for an exit 0. */
			if (r == pid || (r < 0 && errno != EINTR))
			{
				reaped = true;
				lost = r != pid;
			}
			else
			{
				struct timespec step = {0, CHILD_RUN_REAP_STEP_MS * 1000000L};

				nanosleep(&step, NULL);
			}
		}
	}
	if (timed_out || open)
	{
		/* The whole group, and the child itself should its setsid have failed. */
		kill(-pid, SIGKILL);
		kill(pid, SIGKILL);
	}
	while (!reaped && waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	close(out[0]);
	result->output[result->len] = '\0';
	result->elapsed_ms = child_run_now_ms() - start;
	if (timed_out || open)
	{
		result->end = CHILD_TIMED_OUT;
		result->code = SIGKILL;
	}
	else if (lost)
	{
		result->end = CHILD_LOST;
		result->code = -1;
	}
	else if (WIFEXITED(status))
	{
		result->end = CHILD_EXITED;
		result->code = WEXITSTATUS(status);
	}
	else
	{
		result->end = CHILD_SIGNALED;
		result->code = WTERMSIG(status);
	}
	return true;
}

void
child_result_free(struct child_result *result)
{
	free(result->output);
	result->output = NULL;
}
