/*
 * child_run.h: run a child with a deadline, collect its output up to a
 * cap, and kill its whole process group when the deadline passes.
 *
 * The one wait-and-kill of the programs that run a command
 * (pepsi-helper-auto-pay runs a wallet, pepsi-helper-dot-forward a
 * .forward pipe command, pepsi-stage-check-whitelist a payment
 * verifier): the child is the leader of a process group of its own
 * (setsid), its standard output and error go to one pipe that is read
 * until its end, and at the deadline (a monotonic clock, no SIGALRM) the
 * group is killed with SIGKILL, so what the child started dies with it,
 * and nothing of its output is read after that.  Output past the cap is
 * read and dropped, so a child that writes a lot neither blocks nor grows
 * our memory.  A small input (a proof, a token: what must not go on a
 * command line, which other users see) may be given the child on its
 * standard input, which then ends.  A child whose status someone else
 * collected (SIGCHLD ignored) ends CHILD_LOST, never as an exit 0.  Libc
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
	CHILD_LOST,		 /* its status could not be collected (reaped by someone else): code is -1, never a success */
};

/*
 * The most input a child is given: at most PIPE_BUF bytes, which a pipe
 * takes whole before the child runs, so writing it never blocks (and a
 * child that does not read it is no matter).
 */
#define CHILD_RUN_INPUT_MAX 4096

struct child_spec
{
	/* Run in the child, after setsid and with stdout and stderr on the pipe: exec, or _exit. */
	void (*start)(void *arg);
	void	 *arg;
	long long timeout_ms;
	size_t	  output_max;
	/*
	 * What the child reads on its standard input, which then ends (at most
	 * CHILD_RUN_INPUT_MAX bytes); NULL: it inherits ours.
	 */
	const char *input;
	size_t		input_len;
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
