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
 */
#include "pepsi.h"

#include <errno.h>
#include <sys/resource.h>

PG_FUNCTION_INFO_V1(session_nice);

/* The nice values a process may take (setpriority(2)); 20 and above are not. */
#define SESSION_NICE_MAX 19

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
		PG_RETURN_INT32(current);
	if (setpriority(PRIO_PROCESS, 0, wanted) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_SYSTEM_ERROR), errmsg("cannot set this session's nice value to %d: %m", wanted)));
	PG_RETURN_INT32(wanted);
}
