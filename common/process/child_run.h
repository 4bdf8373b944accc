/*
 * child_run.h: run a child with a deadline, collect its output up to a
 * cap, and kill its whole process group when the deadline passes.
 *
 * The one wait-and-kill of the set-user-id helpers (pepsi-helper-auto-pay
 * runs a wallet, pepsi-helper-dot-forward a .forward pipe command): the
 * child is the leader of a process group of its own (setsid), its standard
 * output and error go to one pipe that is read until its end, and at the
 * deadline (a monotonic clock, no SIGALRM) the group is killed with
 * SIGKILL, so what the child started dies with it, and nothing of its
 * output is read after that.  Output past the cap is read and dropped, so
 * a child that writes a lot neither blocks nor grows our memory.  Libc
 * only (and xalloc): linked into the set-user-id helpers.
 */
#ifndef PEPSI_CHILD_RUN_H
#define PEPSI_CHILD_RUN_H

#include <stdbool.h>
#include <stddef.h>

/* How the child ended. */
enum child_end
{
	CHILD_EXITED,	 /* exited, with status code */
	CHILD_SIGNALED,	 /* killed by signal code (not ours) */
	CHILD_TIMED_OUT, /* still running (or its output still open) at the deadline: its group was killed */
};

struct child_spec
{
	/* Run in the child, after setsid and with stdout and stderr on the pipe: exec, or _exit. */
	void (*start)(void *arg);
	void	 *arg;
	long long timeout_ms;
	size_t	  output_max;
};

struct child_result
{
	enum child_end end;
	int			   code;   /* the exit status, or the signal */
	char		  *output; /* what it wrote, at most output_max bytes, NUL-terminated; allocated */
	size_t		   len;
	bool		   truncated; /* it wrote more than output_max */
	long long	   elapsed_ms;
};

/*
 * Run spec's child to its end or its deadline; false (with err, nothing
 * to free) only when it could not be started.
 */
bool child_run(const struct child_spec *spec, struct child_result *result, char *err, size_t errlen);

void child_result_free(struct child_result *result);

#endif
