/*
 * args.c: argument checks for the SQL-callable queue functions.
 *
 * Every entry point is CALLED ON NULL INPUT so that a NULL where a value is
 * required gets an error naming the argument, instead of a silent NULL
 * result that a client might take for success.
 */
#include "pepsi.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

int64
arg_int64(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	return PG_GETARG_INT64(argno);
}

text *
arg_text(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	return PG_GETARG_TEXT_PP(argno);
}

void
check_stage_name(text *stage, const char *name)
{
	if (VARSIZE_ANY_EXHDR(stage) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name),
				 errdetail("A stage is named by its [stage-<name>] section.")));
}

/* A stage name: required and non-empty. */
text *
arg_stage(FunctionCallInfo fcinfo, int argno, const char *name)
{
	text *stage = arg_text(fcinfo, argno, name);

	check_stage_name(stage, name);
	return stage;
}

Jsonb *
arg_json_object_or_null(FunctionCallInfo fcinfo, int argno, const char *name)
{
	Jsonb *json;

	if (PG_ARGISNULL(argno))
		return NULL;
	json = PG_GETARG_JSONB_P(argno);
	if (!JB_ROOT_IS_OBJECT(json))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON object", name),
				 errdetail("The message state is an object whose keys stages merge into.")));
	return json;
}

/*
 * An envelope address never holds a control character: a CR or LF in one
 * would forge SMTP commands or header lines at the next hop (RCPT TO, the
 * Return-Path and Delivered-To a delivery writes).
 */
void
check_address_chars(const char *p, int len, const char *name, int index)
{
	for (int i = 0; i < len; i++)
		if ((unsigned char) p[i] < 0x20 || (unsigned char) p[i] == 0x7f)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 index > 0 ? errmsg("%s[%d] has a control character", name, index)
							   : errmsg("%s has a control character", name),
					 errdetail("Octet 0x%02x at position %d: a line break or another control "
							   "character in an envelope address could forge SMTP commands or "
							   "header lines.",
							   (unsigned char) p[i], i + 1)));
}

void
check_address(const text *address, const char *name, int index)
{
	check_address_chars(VARDATA_ANY(address), VARSIZE_ANY_EXHDR(address), name, index);
}

/* An envelope sender: required ("" is the null reverse-path), no control character. */
text *
arg_address(FunctionCallInfo fcinfo, int argno, const char *name)
{
	text *address = arg_text(fcinfo, argno, name);

	check_address(address, name, 0);
	return address;
}

/* A recipient list: one dimension, at least one address, no NULL or empty one. */
void
check_recipients(ArrayType *rcpt, const char *name)
{
	Datum *elems;
	bool  *nulls;
	int	   n;

	if (ARR_NDIM(rcpt) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	deconstruct_array(rcpt, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must name at least one recipient", name)));
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] is null", name, i + 1)));
		if (VARSIZE_ANY_EXHDR(DatumGetPointer(elems[i])) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d] is an empty address", name, i + 1)));
		check_address((const text *) DatumGetPointer(elems[i]), name, i + 1);
	}
}

ArrayType *
arg_recipients(FunctionCallInfo fcinfo, int argno, const char *name)
{
	ArrayType *rcpt;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	rcpt = PG_GETARG_ARRAYTYPE_P(argno);
	check_recipients(rcpt, name);
	return rcpt;
}

/* A delay in seconds: required, finite and not negative. */
double
arg_seconds(FunctionCallInfo fcinfo, int argno, const char *name)
{
	double seconds;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name),
				 errdetail("A paused row needs the time after which it is retried.")));
	seconds = PG_GETARG_FLOAT8(argno);
	if (isnan(seconds) || isinf(seconds) || seconds < 0 || seconds > PEPSI_MAX_RETRY_SECONDS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between 0 and %d seconds, not %g", name,
						PEPSI_MAX_RETRY_SECONDS, seconds),
				 errdetail("A retry is at most ten years away.")));
	return seconds;
}

/*
 * A pause's retry time, or +Infinity: a hold, as pepsi.queue_hold makes
 * (paused with timeout 'infinity', until an operator releases it).  A
 * stage holds a row it must not send on without a person's decision
 * (a milter's quarantine).
 */
double
arg_seconds_or_hold(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (!PG_ARGISNULL(argno) && isinf(PG_GETARG_FLOAT8(argno)) && PG_GETARG_FLOAT8(argno) > 0)
		return PG_GETARG_FLOAT8(argno);
	return arg_seconds(fcinfo, argno, name);
}

/* The elements of an int4[] with no NULLs, as a palloc'd C array. */
int *
array_to_ints(ArrayType *array, const char *name, int *count)
{
	Datum *elems;
	bool  *nulls;
	int	  *ints;

	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	deconstruct_array(array, INT4OID, 4, true, TYPALIGN_INT, &elems, &nulls, count);
	ints = palloc(sizeof(int) * (*count + 1));
	for (int i = 0; i < *count; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] is null", name, i + 1)));
		ints[i] = DatumGetInt32(elems[i]);
	}
	return ints;
}

/*
 * Recipient indices are 1-based positions in rcpt_to.  taken[] (nrcpt + 1
 * entries, shared across the lists of one call) catches a recipient named
 * twice, which would deliver it twice.
 */
void
check_indices(const int *indices, int count, int nrcpt, const char *name, bool *taken)
{
	for (int i = 0; i < count; i++)
	{
		int index = indices[i];

		if (index < 1 || index > nrcpt)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("recipient index %d in %s is out of range", index, name),
					 errdetail("The row has %d recipient%s, numbered from 1.",
							   nrcpt, nrcpt == 1 ? "" : "s")));
		if (taken[index])
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("recipient index %d is named more than once", index),
					 errdetail("Each recipient may go to one row only (%s names it again).", name)));
		taken[index] = true;
	}
}

/* A parallel array must match the length of its model array. */
void
check_same_length(ArrayType *array, int expected, const char *name, const char *model)
{
	int n;

	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	n = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
	if (n != expected)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s has %d element%s but %s has %d", name, n, n == 1 ? "" : "s",
						model, expected),
				 errdetail("The arrays are parallel: element i of each describes the same row.")));
}
