/*
 * admin.c: the native part of the administrative surface.
 *
 * The queue actions and configuration functions of the administrative
 * surface are SQL (the end of pepsi--0.1.sql): they are not hot paths.  What
 * SQL cannot say is who is acting when a SECURITY DEFINER function runs,
 * since current_user is then the function's owner; the audit log needs the
 * caller.
 */
#include "pepsi.h"

#include "miscadmin.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(event_principal);

/*
 * event_principal(): the role the session acts as outside any SECURITY
 * DEFINER function, that is current_user at the top level (the login role,
 * or the one chosen with SET ROLE).  Inside an ordinary function it equals
 * current_user; inside a SECURITY DEFINER one it is still the caller, which
 * is what pepsi.event_log must record.
 */
Datum
event_principal(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text(GetUserNameFromId(GetOuterUserId(), false)));
}
