/*
 * config_schema.c: the option schema in the database.
 *
 * The options are declared once, in schema/options.def; schema/options.c
 * turns them into a table and checks values against it.  That file is
 * compiled into this module too (included below), so that
 * pepsi.config_option (a view of pepsi.config_option_schema()) lists
 * exactly the options the programs know, and pepsi.config_validate checks
 * a value with exactly the code the programs use (config_value_problem).
 */
#include "pepsi.h"

#include "funcapi.h"
#include "utils/builtins.h"

/* The programs' table and checks: plain C, no allocation, no logging. */
#include "../../schema/options.c"

PG_FUNCTION_INFO_V1(config_option_schema);
PG_FUNCTION_INFO_V1(config_value_problem);

/*
 * One row per line of options.def: section ("stage-*" for a stage
 * program's option, with program set), option, kind, scope, default,
 * range (milliseconds for a duration, bytes for a size, characters for a
 * name), choices and description.
 */
Datum
config_option_schema(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);
	for (size_t i = 0; i < option_count; i++)
	{
		const struct option_def *def = &option_table[i];
		bool					 program = strncmp(def->where, "pepsi-", 6) == 0;
		bool					 numeric = def->type == OPTION_INT || def->type == OPTION_DURATION
					   || def->type == OPTION_SIZE || def->type == OPTION_NAME;
		Datum values[10];
		bool  nulls[10] = {false};

		values[0] = CStringGetTextDatum(program ? "stage-*" : def->where);
		values[1] = program ? CStringGetTextDatum(def->where) : (Datum) 0;
		nulls[1] = !program;
		values[2] = CStringGetTextDatum(def->name);
		values[3] = CStringGetTextDatum(option_type_name(def->type));
		values[4] = CStringGetTextDatum(option_scope_name(def->scope));
		values[5] = def->default_value ? CStringGetTextDatum(def->default_value) : (Datum) 0;
		nulls[5] = def->default_value == NULL;
		values[6] = Int64GetDatum(def->min);
		nulls[6] = !numeric;
		values[7] = Int64GetDatum(def->max);
		nulls[7] = !numeric || def->max == 0;
		values[8] = def->choices ? CStringGetTextDatum(def->choices) : (Datum) 0;
		nulls[8] = def->choices == NULL;
		values[9] = CStringGetTextDatum(def->description);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * Why value is not valid for the option (a sentence), or NULL when it is
 * or when the schema does not know the option (a third-party stage's).
 * program names the stage program whose option it is, if known.
 */
Datum
config_value_problem(PG_FUNCTION_ARGS)
{
	char					*section;
	char					*option;
	char					*value;
	char					*program = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	const struct option_def *def;
	char					 problem[512];

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		PG_RETURN_NULL();
	section = text_to_cstring(PG_GETARG_TEXT_PP(0));
	option = text_to_cstring(PG_GETARG_TEXT_PP(1));
	value = text_to_cstring(PG_GETARG_TEXT_PP(2));
	def = option_find(section, program, option);
	if (def == NULL || option_value_check(def, value, true, problem, sizeof(problem)))
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(problem));
}

PG_FUNCTION_INFO_V1(settings_option_problem);

/*
 * Why an address's owner may not set option to value (a sentence), or
 * NULL when they may (schema/options.def OWNER and the value's check);
 * a NULL value asks about removing it, which only needs the option.
 */
Datum
settings_option_problem(PG_FUNCTION_ARGS)
{
	char *option;
	char *value;
	char  problem[512];

	if (PG_ARGISNULL(0))
		PG_RETURN_TEXT_P(cstring_to_text("an option name is required"));
	option = text_to_cstring(PG_GETARG_TEXT_PP(0));
	value = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (option_owner_value_check(option, value, problem, sizeof(problem)))
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(problem));
}
