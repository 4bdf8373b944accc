/*
 * admin.c: the native part of the administrative surface.
 *
 * The queue views, actions and configuration functions of the
 * administrative surface are SQL (the end of pepsi--0.1.sql): they are not
 * hot paths.  Here are the two things SQL does badly: say who is acting when
 * a SECURITY DEFINER function runs (current_user is then the function's
 * owner; the audit log needs the caller), and take the domain of every
 * recipient of a big queue cheaply enough for pepsi.queue_shape.
 */
#include "pepsi.h"

#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(event_principal);
PG_FUNCTION_INFO_V1(recipient_domain);

/*
 * event_principal(): the role the session acts as outside any SECURITY
 * DEFINER function, that is current_user at the top level (the login role,
 * or the one chosen with SET ROLE).  Inside an ordinary function it equals
 * current_user; inside a SECURITY DEFINER one it is still the caller, which
 * is what pepsi.event_log must record.
 *
 * pepsi-httpd acts for the administrator it authenticated: it sets
 * pepsi.admin_account for the transaction, and the principal becomes
 * "role:account".  Only a member of pepsi_httpd can name an account this
 * way; for any other role the setting is ignored, so nobody else can put
 * an administrator's name on an action.
 */
Datum
event_principal(PG_FUNCTION_ARGS)
{
	Oid	  outer = GetOuterUserId();
	char *role = GetUserNameFromId(outer, false);
	Oid	  httpd_role = get_role_oid("pepsi_httpd", true);

	if (pepsi_admin_account != NULL && pepsi_admin_account[0] != '\0'
		&& OidIsValid(httpd_role) && has_privs_of_role(outer, httpd_role))
		PG_RETURN_TEXT_P(cstring_to_text(psprintf("%s:%s", role, pepsi_admin_account)));
	PG_RETURN_TEXT_P(cstring_to_text(role));
}

/*
 * recipient_domain(address): the part after the last "@", lower-cased (ASCII
 * only, as DNS compares names), or NULL for an address without one, such as
 * "postmaster".  One call per recipient of the queue in pepsi.queue_shape:
 * the SQL equivalent (strpos, split_part, lower and a CASE) costs several
 * times as much and names its argument twice, which a set-returning
 * argument cannot afford.
 */
Datum
recipient_domain(PG_FUNCTION_ARGS)
{
	text	   *address = PG_GETARG_TEXT_PP(0);
	const char *start = VARDATA_ANY(address);
	int			length = VARSIZE_ANY_EXHDR(address);
	const char *at = NULL;
	text	   *domain;
	char	   *out;

	for (int i = length - 1; i >= 0; i--)
		if (start[i] == '@')
		{
			at = start + i;
			break;
		}
	if (at == NULL)
		PG_RETURN_NULL();

	length -= at + 1 - start;
	domain = (text *) palloc(VARHDRSZ + length);
	SET_VARSIZE(domain, VARHDRSZ + length);
	out = VARDATA(domain);
	for (int i = 0; i < length; i++)
		out[i] = pg_ascii_tolower((unsigned char) at[1 + i]);
	PG_RETURN_TEXT_P(domain);
}
