/*
 * split.c: rows spawned server-side from a running row.
 *
 * Fan-out siblings (workqueue_split and its two shorthands) and side clones
 * (the DSNs of workqueue_pause and workqueue_finish_with_clones) are both a
 * JSON array of specs turned into rows by one INSERT ... SELECT from the
 * source row: sender, headers and body are copied inside the server (the
 * body by reference), so nothing large round-trips through the client.
 * Recipient indices are 1-based positions in the source's rcpt_to, and the
 * per-recipient DSN parameters (state.dsn.rcpt) follow their recipients.
 */
#include "pepsi.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"

PG_FUNCTION_INFO_V1(workqueue_split);
PG_FUNCTION_INFO_V1(workqueue_split_off);
PG_FUNCTION_INFO_V1(workqueue_split_one_per_row);

static const char *const spawn_keys[] = {
	"token", "stage", "state", "status", "retry_seconds", "rcpt_indices", "rcpt_to", "mail_from",
	"prepend_headers"};

static JsonbValue *
spawn_get(JsonbContainer *object, const char *key, JsonbValue *buffer)
{
	return getKeyJsonValueFromContainer(object, key, strlen(key), buffer);
}

static const char *
spawn_string(JsonbValue *value, const char *name, int element, const char *key, bool allow_empty)
{
	if (value->type != jbvString)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s[%d].%s must be a JSON string", name, element, key)));
	if (!allow_empty && value->val.string.len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s[%d].%s must not be empty", name, element, key)));
	return pnstrdup(value->val.string.val, value->val.string.len);
}

static void
spawn_check_known_keys(JsonbContainer *object, const char *name, int element)
{
	JsonbIterator	  *it = JsonbIteratorInit(object);
	JsonbValue		   v;
	JsonbIteratorToken token;

	while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		bool known = false;

		if (token != WJB_KEY)
			continue;
		for (size_t k = 0; k < lengthof(spawn_keys) && !known; k++)
			known = strlen(spawn_keys[k]) == (size_t) v.val.string.len
					&& memcmp(spawn_keys[k], v.val.string.val, v.val.string.len) == 0;
		if (!known)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d] has an unknown key \"%.*s\"", name, element,
							v.val.string.len, v.val.string.val),
					 errhint("Known keys: token, stage, state, status, retry_seconds, rcpt_indices, rcpt_to, mail_from, "
							 "prepend_headers.")));
	}
}

/* rcpt_indices of one spec: integers within 1..nrcpt, none taken before. */
static void
spawn_check_indices(JsonbValue *value, const char *name, int element, int nrcpt, bool *taken)
{
	JsonbContainer *array;
	int				count;
	int			   *indices;
	bool		   *local_taken = taken;
	char		   *where = psprintf("%s[%d].rcpt_indices", name, element);

	if (value->type != jbvBinary || !JsonContainerIsArray(value->val.binary.data))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON array of recipient numbers", where)));
	array = value->val.binary.data;
	count = JsonContainerSize(array);
	if (count == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must name at least one recipient", where)));
	indices = palloc(sizeof(int) * count);
	for (int i = 0; i < count; i++)
	{
		JsonbValue *index = getIthJsonbValueFromContainer(array, i);

		double number = 0.5;

		if (index->type == jbvNumeric)
			number = DatumGetFloat8(DirectFunctionCall1(numeric_float8,
														NumericGetDatum(index->val.numeric)));
		if (number != floor(number) || number < 0 || number > INT_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d] is not a recipient number", where, i + 1),
					 errdetail("Recipients are numbered from 1 in the order of rcpt_to.")));
		indices[i] = (int) number;
	}
	/* Clones may report on recipients other rows also carry: check ranges only. */
	if (local_taken == NULL)
		local_taken = palloc0(sizeof(bool) * (nrcpt + 1));
	check_indices(indices, count, nrcpt, where, local_taken);
}

/*
 * prepend_headers: header fields the spawned row gets before the source's
 * (a list's per-subscriber List-Unsubscribe): whole CRLF-terminated lines,
 * no other control character, each line a field or its continuation.
 */
static void
spawn_check_header_lines(JsonbValue *value, const char *name, int element)
{
	const char *text = spawn_string(value, name, element, "prepend_headers", false);
	size_t		len = value->val.string.len;
	bool		line_start = true;

	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) text[i];

		if (c == '\r' && i + 1 < len && text[i + 1] == '\n' && !line_start)
		{
			i++;
			line_start = true;
			continue;
		}
		if ((c < 0x20 && c != '\t') || c == 0x7f || (line_start && c == ':'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d].prepend_headers has a malformed header line at byte %zu", name, element, i + 1),
					 errdetail("Header fields end in CRLF and hold no other control character.")));
		line_start = false;
	}
	if (!line_start)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s[%d].prepend_headers does not end in CRLF", name, element)));
}

/* A new address of a spawned row: never a control character (see check_address). */
static void
spawn_check_chars(JsonbValue *address, const char *name, int element, const char *key, int index)
{
	char *what = psprintf("%s[%d].%s", name, element, key);

	check_address_chars(address->val.string.val, address->val.string.len, what, index);
	pfree(what);
}

static void
spawn_check_addresses(JsonbValue *value, const char *name, int element)
{
	JsonbContainer *array;
	int				count;

	if (value->type != jbvBinary || !JsonContainerIsArray(value->val.binary.data))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s[%d].rcpt_to must be a JSON array of addresses", name, element)));
	array = value->val.binary.data;
	count = JsonContainerSize(array);
	if (count == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s[%d].rcpt_to must name at least one recipient", name, element)));
	for (int i = 0; i < count; i++)
	{
		JsonbValue *address = getIthJsonbValueFromContainer(array, i);

		if (address->type != jbvString || address->val.string.len == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d].rcpt_to[%d] must be a non-empty string", name, element, i + 1)));
		spawn_check_chars(address, name, element, "rcpt_to", i + 1);
	}
}

/*
 * Check a spec array before anything is written, so a bad element leaves
 * the queue untouched.  taken (nrcpt + 1 flags, or NULL for clones) is
 * shared with the caller's keep list: one recipient, one row.
 */
void
spawn_validate(Jsonb *spec, SpawnKind kind, int nrcpt, bool *taken, const char *name)
{
	int	   count;
	char **tokens;
	int	   ntokens = 0;

	if (!JB_ROOT_IS_ARRAY(spec) || JB_ROOT_IS_SCALAR(spec))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON array", name)));
	count = JB_ROOT_COUNT(spec);
	tokens = palloc(sizeof(char *) * (count + 1));
	for (int i = 0; i < count; i++)
	{
		JsonbValue	   *element = getIthJsonbValueFromContainer(&spec->root, i);
		JsonbContainer *object;
		JsonbValue		buffer;
		JsonbValue	   *v;
		const char	   *status = "pending";
		bool			has_indices;
		bool			has_addresses;
		int				n = i + 1;

		if (element->type != jbvBinary || !JsonContainerIsObject(element->val.binary.data))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d] must be a JSON object", name, n)));
		object = element->val.binary.data;
		spawn_check_known_keys(object, name, n);

		if ((v = spawn_get(object, "token", &buffer)) != NULL && v->type != jbvNull)
		{
			const char *token = spawn_string(v, name, n, "token", false);

			for (int t = 0; t < ntokens; t++)
				if (strcmp(tokens[t], token) == 0)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("%s[%d] repeats the token \"%s\"", name, n, token),
							 errdetail("A token names one row; two rows in one call cannot share it.")));
			tokens[ntokens++] = (char *) token;
		}
		else if (kind == SPAWN_CLONES)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] has no token", name, n),
					 errdetail("A clone's token is what makes it at-most-once when its stage runs again."),
					 errhint("Derive it from the row and the event, e.g. \"dsn-delay-<id>\".")));
		if ((v = spawn_get(object, "stage", &buffer)) != NULL)
			spawn_string(v, name, n, "stage", false);
		if ((v = spawn_get(object, "mail_from", &buffer)) != NULL)
		{
			spawn_string(v, name, n, "mail_from", true);
			spawn_check_chars(v, name, n, "mail_from", 0);
		}
		if ((v = spawn_get(object, "prepend_headers", &buffer)) != NULL)
			spawn_check_header_lines(v, name, n);
		if ((v = spawn_get(object, "state", &buffer)) != NULL
			&& (v->type != jbvBinary || !JsonContainerIsObject(v->val.binary.data)))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d].state must be a JSON object", name, n)));
		if ((v = spawn_get(object, "status", &buffer)) != NULL)
		{
			status = spawn_string(v, name, n, "status", false);
			if (strcmp(status, "pending") != 0 && strcmp(status, "retry") != 0
				&& strcmp(status, "failed") != 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("%s[%d].status \"%s\" is not pending, retry or failed", name, n, status)));
		}
		v = spawn_get(object, "retry_seconds", &buffer);
		if (strcmp(status, "retry") == 0)
		{
			double seconds;

			if (v == NULL || v->type != jbvNumeric)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("%s[%d] has status retry but no numeric retry_seconds", name, n)));
			seconds = DatumGetFloat8(DirectFunctionCall1(numeric_float8,
														 NumericGetDatum(v->val.numeric)));
			if (isnan(seconds) || isinf(seconds) || seconds < 0 || seconds > PEPSI_MAX_RETRY_SECONDS)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("%s[%d].retry_seconds must be between 0 and %d seconds, not %g",
								name, n, PEPSI_MAX_RETRY_SECONDS, seconds)));
		}
		else if (v != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d].retry_seconds is meaningless with status %s", name, n, status)));

		has_indices = (v = spawn_get(object, "rcpt_indices", &buffer)) != NULL;
		if (has_indices)
			spawn_check_indices(v, name, n, nrcpt, taken);
		has_addresses = (v = spawn_get(object, "rcpt_to", &buffer)) != NULL;
		if (has_addresses)
			spawn_check_addresses(v, name, n);
		if (has_indices && has_addresses)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d] has both rcpt_indices and rcpt_to", name, n),
					 errhint("rcpt_indices picks recipients of the row; rcpt_to gives new addresses.")));
		if (kind == SPAWN_SPLIT_GROUPS && !has_indices && !has_addresses)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d] has neither rcpt_indices nor rcpt_to", name, n),
					 errdetail("Every group of a split carries its own recipients.")));
	}
}

/*
 * A split group skipped because a live row carries its token would drop
 * its recipients: the source row is reduced to keep_indices all the same,
 * and no sibling carries them.  Called after the INSERT (RETURNING id,
 * clone_token) made fewer rows than spec has; raises for the first group
 * whose token is not among the rows made.
 */
static void
spawn_refuse_skipped_group(Jsonb *spec)
{
	for (int i = 0; i < (int) JB_ROOT_COUNT(spec); i++)
	{
		JsonbValue *element = getIthJsonbValueFromContainer(&spec->root, i);
		JsonbValue	buffer;
		JsonbValue *token = spawn_get(element->val.binary.data, "token", &buffer);
		bool		made = false;

		if (token == NULL || token->type != jbvString)
			continue;
		for (uint64 r = 0; r < SPI_processed && !made; r++)
		{
			char *carried = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2);

			made = carried != NULL && strlen(carried) == (size_t) token->val.string.len
				   && memcmp(carried, token->val.string.val, token->val.string.len) == 0;
		}
		if (!made)
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("groups[%d].token \"%.*s\" is carried by a live row", i + 1,
							token->val.string.len, token->val.string.val),
					 errdetail("Skipping the group would drop its recipients: the row keeps only keep_indices."),
					 errhint("A split group needs no token; give it a fresh one if its sibling must be at-most-once.")));
	}
	elog(ERROR, "split made %llu rows for %d groups", (unsigned long long) SPI_processed,
		 (int) JB_ROOT_COUNT(spec));
}

/*
 * Insert the rows of a validated spec array, copying what the spec leaves
 * out from the source row.  Returns the new ids in spec order.  A clone
 * whose token a live row already carries is skipped (at-most-once); a split
 * group in that case is an error (see spawn_refuse_skipped_group).
 *
 * rcpt_indices are read as numeric[] because spawn_check_indices accepts
 * any integral JSON number (2.0 as well as 2), which int[] input would not.
 *
 * received_at: a clone is a new message (a DSN), so it starts now; a sibling
 * is the same message and keeps the arrival time, except a pending group of
 * brand-new addresses (a forward), which starts afresh.  Siblings parked
 * retry or failed keep it, so MAX_LIFETIME counts from arrival.
 */
ArrayType *
spawn_rows(int64 source_id, Jsonb *spec, SpawnKind kind)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {INT8OID, JSONBOID, BOOLOID};
	Datum			  values[3] = {Int64GetDatum(source_id), PointerGetDatum(spec),
								   BoolGetDatum(kind == SPAWN_CLONES)};
	Datum			 *ids;
	int64			 *sorted;

	if (JB_ROOT_COUNT(spec) == 0)
		return construct_empty_array(INT8OID);
	queue_exec(queue_plan(&plan,
						  "INSERT INTO pepsi.workqueue (stage, status, state, timeout, received_at,"
						  "  mail_from, rcpt_to, headers, body_id, client_address, auth_account, clone_token)"
						  " SELECT coalesce(g.stage, w.stage),"
						  "  (CASE g.status WHEN 'retry' THEN 'paused' WHEN 'failed' THEN 'failed'"
						  "   ELSE 'pending' END)::pepsi.status,"
						  "  (CASE WHEN g.rcpt_to IS NOT NULL THEN w.state #- '{dsn,rcpt}'"
						  "        WHEN g.rcpt_indices IS NOT NULL"
						  "          THEN pepsi.state_for_recipients(w.state, cardinality(w.rcpt_to), g.rcpt_indices::int[])"
						  "        ELSE w.state END) || coalesce(g.state, '{}'),"
						  "  CASE WHEN g.status = 'retry' THEN now() + g.retry_seconds * interval '1 second' END,"
						  "  CASE WHEN $3 THEN now()"
						  "       WHEN g.rcpt_to IS NOT NULL AND coalesce(g.status, 'pending') = 'pending' THEN now()"
						  "       ELSE w.received_at END,"
						  "  coalesce(g.mail_from, w.mail_from),"
						  "  coalesce(g.rcpt_to, pepsi.recipients_subset(w.rcpt_to, g.rcpt_indices::int[]), w.rcpt_to),"
						  "  coalesce(convert_to(g.prepend_headers, 'UTF8'), '') || w.headers,"
						  "  w.body_id, w.client_address, w.auth_account, g.token"
						  " FROM pepsi.workqueue w,"
						  "  jsonb_to_recordset($2) AS g(token text, stage text, state jsonb, status text,"
						  "   retry_seconds float8, rcpt_indices numeric[], rcpt_to text[], mail_from text,"
						  "   prepend_headers text)"
						  " WHERE w.id = $1"
						  " ON CONFLICT (clone_token) WHERE clone_token IS NOT NULL"
						  " DO NOTHING RETURNING id, clone_token",
						  3, argtypes),
			   values, NULL, false, 0);
	if (kind == SPAWN_SPLIT_GROUPS && SPI_processed < (uint64) JB_ROOT_COUNT(spec))
		spawn_refuse_skipped_group(spec);

	/* Identity values are drawn in insertion order, so sorting restores spec order. */
	sorted = palloc(sizeof(int64) * (SPI_processed + 1));
	for (uint64 i = 0; i < SPI_processed; i++)
		sorted[i] = queue_result_int64(i, 1);
	for (uint64 i = 1; i < SPI_processed; i++)
		for (uint64 j = i; j > 0 && sorted[j - 1] > sorted[j]; j--)
		{
			int64 swap = sorted[j];

			sorted[j] = sorted[j - 1];
			sorted[j - 1] = swap;
		}
	ids = palloc(sizeof(Datum) * (SPI_processed + 1));
	for (uint64 i = 0; i < SPI_processed; i++)
		ids[i] = Int64GetDatum(sorted[i]);
	return construct_array(ids, (int) SPI_processed, INT8OID, 8, true, TYPALIGN_DOUBLE);
}

/* Reduce row id to the recipients at keep (int4[]), their DSN parameters with them. */
void
split_reduce_recipients(int64 id, ArrayType *keep)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {INT8OID, INT4ARRAYOID};
	Datum			  values[2] = {Int64GetDatum(id), PointerGetDatum(keep)};

	queue_exec(queue_plan(&plan,
						  "UPDATE pepsi.workqueue SET"
						  " rcpt_to = pepsi.recipients_subset(rcpt_to, $2),"
						  " state = pepsi.state_for_recipients(state, cardinality(rcpt_to), $2)"
						  " WHERE id = $1",
						  2, argtypes),
			   values, NULL, false, 0);
}

/* Check keep (the recipients the row itself keeps) into taken[]. */
static void
split_check_keep(ArrayType *keep, int nrcpt, bool *taken)
{
	int	 count;
	int *indices = array_to_ints(keep, "keep_indices", &count);

	if (count == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("keep_indices must name at least one recipient"),
				 errdetail("The row goes on with the recipients it keeps."),
				 errhint("To hand every recipient on, keep one and finish the row after the split.")));
	check_indices(indices, count, nrcpt, "keep_indices", taken);
}

static ArrayType *
split_rows(int64 id, const char *expected_stage, ArrayType *keep, Jsonb *groups, pg_uuid_t *token)
{
	int		   nrcpt = queue_lock_running_row(id, expected_stage, token);
	bool	  *taken = palloc0(sizeof(bool) * (nrcpt + 1));
	ArrayType *ids;

	split_check_keep(keep, nrcpt, taken);
	spawn_validate(groups, SPAWN_SPLIT_GROUPS, nrcpt, taken, "groups");
	if (JB_ROOT_COUNT(groups) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("groups must not be empty"),
				 errdetail("A split makes at least one sibling row.")));
	ids = spawn_rows(id, groups, SPAWN_SPLIT_GROUPS);
	split_reduce_recipients(id, keep);
	return ids;
}

static ArrayType *
split_int_array(const int *values, int count)
{
	Datum *datums = palloc(sizeof(Datum) * (count + 1));

	for (int i = 0; i < count; i++)
		datums[i] = Int32GetDatum(values[i]);
	return construct_array(datums, count, INT4OID, 4, true, TYPALIGN_INT);
}

static Jsonb *
split_json(StringInfo json)
{
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(json->data)));
}

/* workqueue_split(id, expected_stage, keep_indices, groups) returns the sibling ids. */
Datum
workqueue_split(PG_FUNCTION_ARGS)
{
	int64	   id = arg_int64(fcinfo, 0, "id");
	char	  *expected_stage = text_to_cstring(arg_stage(fcinfo, 1, "expected_stage"));
	ArrayType *keep;
	Jsonb	  *groups;
	ArrayType *ids;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("keep_indices must not be null"),
				 errdetail("A split says which recipients stay on the row.")));
	keep = PG_GETARG_ARRAYTYPE_P(2);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("groups must not be null")));
	groups = PG_GETARG_JSONB_P(3);

	SPI_connect();
	ids = split_rows(id, expected_stage, keep, groups, arg_claim_token(fcinfo, 4));
	ids = (ArrayType *) SPI_datumTransfer(PointerGetDatum(ids), false, -1);
	SPI_finish();
	PG_RETURN_ARRAYTYPE_P(ids);
}

/*
 * workqueue_split_off(id, expected_stage, rcpt_indices, target_stage):
 * the recipients at rcpt_indices move to one sibling, pending at
 * target_stage (default: this stage); the row keeps the others.
 */
Datum
workqueue_split_off(PG_FUNCTION_ARGS)
{
	int64		   id = arg_int64(fcinfo, 0, "id");
	char		  *expected_stage = text_to_cstring(arg_stage(fcinfo, 1, "expected_stage"));
	ArrayType	  *moving;
	int			   nmoving;
	int			  *indices;
	int			   nrcpt;
	bool		  *taken;
	int			  *keep;
	int			   nkeep = 0;
	StringInfoData json;
	ArrayType	  *ids;
	int64		   sibling;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("rcpt_indices must not be null")));
	moving = PG_GETARG_ARRAYTYPE_P(2);
	indices = array_to_ints(moving, "rcpt_indices", &nmoving);
	if (nmoving == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rcpt_indices must name at least one recipient")));
	if (!PG_ARGISNULL(3))
		check_stage_name(PG_GETARG_TEXT_PP(3), "target_stage");

	SPI_connect();
	nrcpt = queue_lock_running_row(id, expected_stage, arg_claim_token(fcinfo, 4));
	taken = palloc0(sizeof(bool) * (nrcpt + 1));
	check_indices(indices, nmoving, nrcpt, "rcpt_indices", taken);
	keep = palloc(sizeof(int) * (nrcpt + 1));
	for (int i = 1; i <= nrcpt; i++)
		if (!taken[i])
			keep[nkeep++] = i;
	if (nkeep == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rcpt_indices names every recipient of workqueue row %lld", (long long) id),
				 errdetail("Splitting off all recipients would leave the row with none."),
				 errhint("Advance the row to the target stage instead.")));

	initStringInfo(&json);
	appendStringInfoString(&json, "[{\"rcpt_indices\": [");
	for (int i = 0; i < nmoving; i++)
		appendStringInfo(&json, "%s%d", i ? ", " : "", indices[i]);
	appendStringInfoChar(&json, ']');
	if (!PG_ARGISNULL(3))
	{
		appendStringInfoString(&json, ", \"stage\": ");
		escape_json(&json, text_to_cstring(PG_GETARG_TEXT_PP(3)));
	}
	appendStringInfoString(&json, "}]");

	ids = spawn_rows(id, split_json(&json), SPAWN_SPLIT_GROUPS);
	split_reduce_recipients(id, split_int_array(keep, nkeep));
	{
		Datum *made;
		int	   nmade;

		deconstruct_array(ids, INT8OID, 8, true, TYPALIGN_DOUBLE, &made, NULL, &nmade);
		if (nmade != 1)
			elog(ERROR, "split_off made %d rows instead of one", nmade);
		sibling = DatumGetInt64(made[0]);
	}
	SPI_finish();
	PG_RETURN_INT64(sibling);
}

/*
 * workqueue_split_one_per_row(id, expected_stage): recipients 2..n each go
 * to a sibling of their own at this stage; the row keeps the first.  The
 * SMTP relays deliver one envelope recipient per attempt this way.
 */
Datum
workqueue_split_one_per_row(PG_FUNCTION_ARGS)
{
	int64		   id = arg_int64(fcinfo, 0, "id");
	char		  *expected_stage = text_to_cstring(arg_stage(fcinfo, 1, "expected_stage"));
	int			   nrcpt;
	int			   first = 1;
	StringInfoData json;
	ArrayType	  *ids;

	SPI_connect();
	nrcpt = queue_lock_running_row(id, expected_stage, arg_claim_token(fcinfo, 2));
	if (nrcpt == 1)
		ids = construct_empty_array(INT8OID);
	else
	{
		initStringInfo(&json);
		appendStringInfoChar(&json, '[');
		for (int i = 2; i <= nrcpt; i++)
			appendStringInfo(&json, "%s{\"rcpt_indices\": [%d]}", i > 2 ? ", " : "", i);
		appendStringInfoChar(&json, ']');
		ids = spawn_rows(id, split_json(&json), SPAWN_SPLIT_GROUPS);
		split_reduce_recipients(id, split_int_array(&first, 1));
	}
	ids = (ArrayType *) SPI_datumTransfer(PointerGetDatum(ids), false, -1);
	SPI_finish();
	PG_RETURN_ARRAYTYPE_P(ids);
}
