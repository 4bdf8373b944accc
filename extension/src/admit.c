/*
 * admit.c: new messages enter the queue.
 *
 * workqueue_add is ingress's admission: the body and the row in one
 * statement and, on purpose, no NOTIFY (a pending notification takes a
 * database-wide lock until commit, which would serialize concurrent SMTP
 * sessions that should group-commit).  workqueue_inject is for writers
 * outside the dispatcher's loop, so it does notify.
 */
#include "pepsi.h"

#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(workqueue_add);
PG_FUNCTION_INFO_V1(workqueue_add_logged);
PG_FUNCTION_INFO_V1(workqueue_inject);

static bytea *
admit_arg_bytes(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name),
				 errhint("An empty %s is an empty bytea, not NULL.", name)));
	return PG_GETARG_BYTEA_PP(argno);
}

static Jsonb *
admit_arg_state(FunctionCallInfo fcinfo, int argno)
{
	Jsonb *state = arg_json_object_or_null(fcinfo, argno, "state");

	if (state == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("state must not be null"),
				 errhint("Pass '{}' for a message with no state yet.")));
	return state;
}

/*
 * The admission roles face the outside world (pepsi-ingress, pepsi-sendmail):
 * they may start a message only where the pipeline starts
 * (pepsi.admission_stage), never put it straight at a delivery stage past
 * the checks.  The pipeline itself (pepsi_stage) and superusers may admit
 * anywhere.  The caller is the role outside these SECURITY DEFINER
 * functions.
 */
static bool
admit_caller_restricted(void)
{
	Oid caller = GetOuterUserId();
	Oid pipeline = get_role_oid("pepsi_stage", true);
	Oid admission = get_role_oid("pepsi_ingress", true);

	if (superuser_arg(caller) || (OidIsValid(pipeline) && has_privs_of_role(caller, pipeline))
		|| !OidIsValid(admission) || !has_privs_of_role(caller, admission))
		return false;
	return true;
}

static void
admit_check_stage(const text *stage)
{
	Oid	  caller = GetOuterUserId();
	char *wanted;

	if (!admit_caller_restricted())
		return;
	wanted = text_to_cstring(stage);
	if (pepsi_admission_stage == NULL || strcmp(wanted, pepsi_admission_stage) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" may admit messages only at stage \"%s\", not \"%s\"",
						GetUserNameFromId(caller, false),
						pepsi_admission_stage ? pepsi_admission_stage : "", wanted),
				 errdetail("Members of pepsi_ingress start a message where the pipeline starts (pepsi.admission_stage)."),
				 errhint("If [ingress] INIT_STAGE is another stage, a superuser sets it: ALTER DATABASE ... SET pepsi.admission_stage = '%s'.",
						 wanted)));
}

/* Does one item of pepsi.admission_accounts ("*", "@domain", an account) allow account? */
static bool
admit_account_item_allows(const char *item, size_t item_len, const char *account)
{
	size_t account_len = strlen(account);

	if (item_len == 1 && item[0] == '*')
		return true;
	if (item[0] == '@')
		return account_len > item_len
			   && pg_strncasecmp(account + account_len - item_len, item, item_len) == 0;
	return account_len == item_len && memcmp(account, item, item_len) == 0;
}

/*
 * The authenticated account of an admitted message: its sender_key (whom
 * the fair share charges, whose DSN budget is spent), the smtp.auth of
 * its Authentication-Results, and the reason a relay or NOTIFY=SUCCESS was
 * allowed.
 *
 * The threat: the admission role is the internet-facing process's.  The
 * database never sees the SMTP AUTH exchange (the credentials are a file
 * of ingress's), so it cannot tell which account a session proved; a
 * compromised ingress holding the role can claim an account as it can
 * write any header.  What is enforced here, whatever the caller:
 *  - the account is one line of at most 255 octets (RFC 4616's limit for
 *    an authentication identity), never empty: it becomes a header field
 *    and a key, and "" would be an account nobody has;
 *  - a member of pepsi_ingress may claim only the accounts that
 *    pepsi.admission_accounts allows it, which a superuser sets per login
 *    role and the role cannot change: an MX ingress that offers no AUTH is
 *    given none (a compromise of port 25 then cannot pass mail off as a
 *    user's), a submission ingress its own domains.
 * The pipeline and superusers, which may admit anywhere, are not limited.
 */
#define ADMIT_ACCOUNT_MAX 255

static void
admit_check_account(const text *account_text)
{
	const char *list = pepsi_admission_accounts ? pepsi_admission_accounts : "";
	char	   *account;
	int			len = VARSIZE_ANY_EXHDR(account_text);

	check_address(account_text, "auth_account", 0);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("auth_account must not be empty"),
				 errhint("Pass NULL for a session that did not authenticate.")));
	if (len > ADMIT_ACCOUNT_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("auth_account is %d octets long, more than %d", len, ADMIT_ACCOUNT_MAX),
				 errdetail("An authentication identity has at most 255 octets (RFC 4616).")));
	if (!admit_caller_restricted())
		return;
	account = text_to_cstring(account_text);
	for (const char *p = list; *p;)
	{
		size_t n;

		while (*p == ',' || *p == ' ' || *p == '\t')
			p++;
		n = strcspn(p, ", \t");
		if (n > 0 && admit_account_item_allows(p, n, account))
			return;
		p += n;
	}
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("role \"%s\" may not admit messages for account \"%s\"",
					GetUserNameFromId(GetOuterUserId(), false), account),
			 errdetail("pepsi.admission_accounts for this role is \"%s\".", list),
			 errhint("A superuser allows it: ALTER ROLE ... SET pepsi.admission_accounts = '*', "
					 "or a list of accounts and @domains.")));
}

/*
 * The admission: the body and the row in one statement, and with
 * log_detail the mail log's "received" row in the same transaction.  A
 * row a before-queue milter quarantined (state.milter.verdict, written by
 * pepsi-ingress) is stored held, as pepsi.queue_hold leaves a row: no
 * worker sees it before the operator releases it.
 * Arguments 0 to 7 are workqueue_add's.
 */
static int64
admit_store(FunctionCallInfo fcinfo, Jsonb *log_detail)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr log_plan;
	static const Oid  argtypes[] = {TEXTOID, TEXTARRAYOID, BYTEAOID, BYTEAOID,
									JSONBOID, INETOID, TEXTOID, TEXTOID};
	static const Oid  log_argtypes[] = {INT8OID, JSONBOID, JSONBOID};
	Datum			  values[8];
	char			  nulls[8] = "        ";
	int64			  id;

	values[0] = PointerGetDatum(arg_address(fcinfo, 0, "mail_from"));
	values[1] = PointerGetDatum(arg_recipients(fcinfo, 1, "rcpt_to"));
	values[2] = PointerGetDatum(admit_arg_bytes(fcinfo, 2, "headers"));
	values[3] = PointerGetDatum(admit_arg_bytes(fcinfo, 3, "body"));
	values[4] = PointerGetDatum(admit_arg_state(fcinfo, 4));
	values[5] = PG_ARGISNULL(5) ? (Datum) 0 : PG_GETARG_DATUM(5);
	nulls[5] = PG_ARGISNULL(5) ? 'n' : ' ';
	values[6] = PG_ARGISNULL(6) ? (Datum) 0 : PG_GETARG_DATUM(6);
	nulls[6] = PG_ARGISNULL(6) ? 'n' : ' ';
	if (!PG_ARGISNULL(6))
		admit_check_account((const text *) PG_GETARG_TEXT_PP(6));
	values[7] = PointerGetDatum(arg_stage(fcinfo, 7, "stage"));
	admit_check_stage((const text *) DatumGetPointer(values[7]));

	SPI_connect();
	queue_exec(queue_plan(&plan,
						  "WITH body AS (INSERT INTO pepsi.workqueue_body (body) VALUES ($4) RETURNING id)"
						  " INSERT INTO pepsi.workqueue"
						  " (stage, state, mail_from, rcpt_to, headers, body_id, client_address, auth_account,"
						  " status, timeout)"
						  " SELECT $8, $5, $1, $2, $3, body.id, $6, $7,"
						  " CASE WHEN q.held THEN 'paused'::pepsi.status ELSE 'pending'::pepsi.status END,"
						  " CASE WHEN q.held THEN 'infinity'::timestamptz END"
						  " FROM body, (SELECT coalesce($5 -> 'milter' ->> 'verdict' = 'quarantine', false) AS held) q"
						  " RETURNING id",
						  8, argtypes),
			   values, nulls, false, 0);
	id = queue_result_int64(0, 1);
	if (log_detail)
	{
		Datum log_values[3] = {Int64GetDatum(id), PointerGetDatum(log_detail), values[4]};

		queue_exec(queue_plan(&log_plan,
							  "INSERT INTO pepsi.mail_log (workqueue_id, event, detail, queue_id)"
							  " VALUES ($1, 'received', $2, $3 ->> 'queue_id')",
							  3, log_argtypes),
				   log_values, NULL, false, 0);
	}
	SPI_finish();
	return id;
}

/*
 * workqueue_add(mail_from, rcpt_to, headers, body, state, client_address,
 *               auth_account, stage) returns the new row's id.
 */
Datum
workqueue_add(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(admit_store(fcinfo, NULL));
}

/*
 * workqueue_add_logged(..., stage, log_detail): workqueue_add, and with a
 * log_detail object (NULL: none) the mail log's "received" row.
 */
Datum
workqueue_add_logged(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(admit_store(fcinfo, arg_json_object_or_null(fcinfo, 8, "log_detail")));
}

/*
 * workqueue_inject(stage, mail_from, rcpt_to, headers, body, state, token)
 * returns the new row's id, or NULL when a live row already carries token.
 *
 * state.origin.trust (common/message/origin.h) says whether pepsi-stage-dkim-sign
 * may sign the message, so an admission role does not choose it: for a
 * caller admit_caller_restricted() names (pepsi_ingress without
 * pepsi_stage: pepsi-sendmail, or whoever holds its login), it becomes
 * "local", whatever was passed, and the rest of state.origin is kept.  The
 * pipeline's own mail (DSNs, vacation replies: pepsi_stage) keeps the
 * "pepsi" it says.  The caller is GetOuterUserId(), the role outside this
 * SECURITY DEFINER function (session_user, or the role SET ROLE chose):
 * current_user here is the extension's owner.
 */
Datum
workqueue_inject(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr insert_plan;
	static const Oid  argtypes[] = {TEXTOID, TEXTOID, TEXTARRAYOID, BYTEAOID,
									JSONBOID, INT8OID, TEXTOID, BOOLOID};
	Datum			  values[8];
	char			  nulls[8] = "        ";
	int64			  body_id;
	int64			  id = 0;
	bool			  inserted;

	values[0] = PointerGetDatum(arg_stage(fcinfo, 0, "stage"));
	admit_check_stage((const text *) DatumGetPointer(values[0]));
	values[1] = PointerGetDatum(arg_address(fcinfo, 1, "mail_from"));
	values[2] = PointerGetDatum(arg_recipients(fcinfo, 2, "rcpt_to"));
	values[3] = PointerGetDatum(admit_arg_bytes(fcinfo, 3, "headers"));
	values[4] = PointerGetDatum(admit_arg_state(fcinfo, 5));
	values[6] = PG_ARGISNULL(6) ? (Datum) 0 : PG_GETARG_DATUM(6);
	nulls[6] = PG_ARGISNULL(6) ? 'n' : ' ';
	values[7] = BoolGetDatum(admit_caller_restricted());
	if (!PG_ARGISNULL(6) && VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(6)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("token must not be empty"),
				 errhint("Pass NULL for a side message that needs no at-most-once guarantee.")));

	SPI_connect();
	body_id = body_store(admit_arg_bytes(fcinfo, 4, "body"));
	values[5] = Int64GetDatum(body_id);
	queue_exec(queue_plan(&insert_plan,
						  "INSERT INTO pepsi.workqueue"
						  " (stage, mail_from, rcpt_to, headers, state, body_id, clone_token)"
						  " VALUES ($1, $2, $3, $4,"
						  " CASE WHEN $8 THEN $5 || jsonb_build_object('origin',"
						  " CASE WHEN jsonb_typeof($5->'origin') = 'object' THEN $5->'origin' ELSE '{}' END"
						  " || '{\"trust\": \"local\"}') ELSE $5 END,"
						  " $6, $7)"
						  " ON CONFLICT (clone_token) WHERE clone_token IS NOT NULL"
						  " DO NOTHING RETURNING id",
						  8, argtypes),
			   values, nulls, false, 0);
	inserted = SPI_processed > 0;
	if (inserted)
	{
		id = queue_result_int64(0, 1);
		queue_notify_workqueue();
	}
	else
		body_release_if_unreferenced(body_id);
	SPI_finish();

	if (!inserted)
		PG_RETURN_NULL();
	PG_RETURN_INT64(id);
}
