/*
 * session.c: the calling session's own backend process.
 *
 * pepsi.session_nice(n): raise this backend's nice value to n (0..19).
 * A stage worker that the dispatcher runs at a lower CPU priority (a
 * batching stage's bulk workers, BULK_NICE in pepsi-dispatch(8)) spends
 * most of a row's CPU in its database session, so it passes its own nice
 * value on; the light lane's session keeps the server's.  Only ever
 * raised: lowering a nice value takes a privilege the server does not
 * have, and a role must not be able to take CPU from the others.  The
 * value lasts as long as the backend; pepsi-dispatch's workers hold their
 * connection for their life (behind a pooler that hands server
 * connections to other clients, set BULK_NICE = 0).
 *
 * The value goes to the backend's autogroup as well (session_autogroup_nice).
 */
#include "pepsi.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#include "miscadmin.h"

PG_FUNCTION_INFO_V1(session_nice);

/* The nice values a process may take (setpriority(2)); 20 and above are not. */
#define SESSION_NICE_MAX 19
/* The kernel's limit on autogroup changes (EAGAIN): tries 20 ms apart. */
#define SESSION_AUTOGROUP_TRIES 50
#define SESSION_AUTOGROUP_PATH "/proc/self/autogroup"

/*
 * With the kernel's autogroups (CONFIG_SCHED_AUTOGROUP: Debian's kernels,
 * on by default) the scheduler first shares the CPU between sessions, and
 * a nice value only weighs against the processes of its own session.
 * PostgreSQL makes every backend the leader of a session of its own
 * (InitPostmasterChild calls setsid), so a backend's nice value alone
 * changes nothing: each backend competes at full weight with every other
 * session, the light lane's whole dispatcher among them.  Measured on a
 * 2-core machine: a commit (pgbench, one client) took 0.15 ms alone and
 * 2.4 ms beside two busy loops at nice 19 started from another session;
 * a pipe round trip with an fdatasync took 0.28 ms beside the same loops
 * in its own session and 3.5 ms with them in another.  So the backend's
 * autogroup takes the value too (sched(7), /proc/self/autogroup), when
 * the backend leads its session, so that the group is its own; only ever
 * raised, as the nice value is.  The kernel lets an unprivileged process
 * change an autogroup's value once per 100 ms, machine-wide (EAGAIN):
 * tried again for up to SESSION_AUTOGROUP_TRIES times 20 ms (a second:
 * ingress's bulk connections and a stage's bulk workers each ask once, at
 * about the same time), once in a session's life.  A kernel without autogroups has no such file, and
 * nothing to do; a failure is a warning, the nice value stands.
 */
static void
session_autogroup_nice(int wanted)
{
	char text[128];
	char value[16];
	int	 fd;
	int	 current = 0;
	int	 length;

	if (getsid(0) != getpid())
		return; /* the group would be shared with other processes */
	if ((fd = open(SESSION_AUTOGROUP_PATH, O_RDONLY | O_CLOEXEC)) < 0)
	{
		if (errno != ENOENT)
			ereport(WARNING, (errmsg("cannot open %s: %m", SESSION_AUTOGROUP_PATH)));
		return;
	}
	length = (int) read(fd, text, sizeof(text) - 1);
	close(fd);
	text[length > 0 ? length : 0] = '\0';
	/* "/autogroup-123 nice 0" */
	if (length <= 0 || sscanf(text, "%*s nice %d", &current) != 1)
	{
		ereport(WARNING, (errmsg("cannot read the nice value in %s: \"%s\"", SESSION_AUTOGROUP_PATH, text)));
		return;
	}
	if (current >= wanted)
		return;
	/* The file has no offset to write at: each try is a write of its own. */
	length = snprintf(value, sizeof(value), "%d", wanted);
	for (int tries = 1;; tries++)
	{
		bool written = false;

		if ((fd = open(SESSION_AUTOGROUP_PATH, O_WRONLY | O_CLOEXEC)) >= 0)
		{
			written = write(fd, value, length) == length;
			close(fd);
		}
		if (written)
			return;
		if (errno != EAGAIN || tries == SESSION_AUTOGROUP_TRIES)
		{
			ereport(WARNING,
					(errmsg("cannot set this session's autogroup nice value to %d: %m", wanted),
					 errdetail("Its nice value is set; on a kernel with autogroups it only weighs against "
							   "the processes of its own session.")));
			return;
		}
		pg_usleep(20 * 1000L);
		CHECK_FOR_INTERRUPTS();
	}
}

Datum
session_nice(PG_FUNCTION_ARGS)
{
	int32 wanted = PG_GETARG_INT32(0);
	int	  current;

	if (wanted < 0 || wanted > SESSION_NICE_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("nice value %d is out of range", wanted),
				 errdetail("A session's nice value can be raised to 0 to %d.", SESSION_NICE_MAX)));
	errno = 0;
	current = getpriority(PRIO_PROCESS, 0);
	if (errno != 0)
		ereport(ERROR, (errcode(ERRCODE_SYSTEM_ERROR), errmsg("cannot read this session's nice value: %m")));
	if (current >= wanted)
		wanted = current;
	else if (setpriority(PRIO_PROCESS, 0, wanted) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_SYSTEM_ERROR), errmsg("cannot set this session's nice value to %d: %m", wanted)));
	session_autogroup_nice(wanted);
	PG_RETURN_INT32(wanted);
}
