/*
 * test_condition.c: the CONDITION of pepsi-stage-if against the vectors in
 * data/ (one case per line): what parses to what, what is refused and
 * why, and which values satisfy a parsed condition.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/data_cases.h"

#include "condition.h"

static const char *
op_token(enum if_op op)
{
	static const char *const tokens[] = {
		[IF_EQ] = "=", [IF_NE] = "!=", [IF_MATCH] = "~", [IF_NOMATCH] = "!~", [IF_LT] = "<", [IF_GT] = ">", [IF_EXISTS] = "exists", [IF_MISSING] = "missing"};

	return tokens[op];
}

static void
test_parse(void **state)
{
	const struct data_case *c = *state;
	const char			   *expect = data_case_field(c, 0);
	const char			   *text = c->nfields > 1 ? c->field[1] : "";
	struct if_condition		cond;
	char					err[512] = "";
	bool					ok = if_condition_parse(text, &cond, err, sizeof(err));

	if (strcmp(expect, "ok") == 0)
	{
		const char *value = c->nfields > 4 ? c->field[4] : "";

		if (!ok)
			fail_msg("%s: \"%s\" refused: %s", c->name, text, err);
		if (strcmp(cond.subject, data_case_field(c, 2)) != 0
			|| strcmp(op_token(cond.op), data_case_field(c, 3)) != 0
			|| strcmp(cond.value, value) != 0)
			fail_msg("%s: \"%s\" parsed as [%s] [%s] [%s]", c->name, text, cond.subject,
					 op_token(cond.op), cond.value);
		if_condition_free(&cond);
	}
	else if (strcmp(expect, "error") == 0)
	{
		if (ok)
		{
			if_condition_free(&cond);
			fail_msg("%s: \"%s\" accepted", c->name, text);
		}
		if (strstr(err, data_case_field(c, 2)) == NULL)
			fail_msg("%s: refusal \"%s\" does not say \"%s\"", c->name, err, c->field[2]);
	}
	else
		fail_msg("%s: expect \"ok\" or \"error\", not \"%s\"", c->name, expect);
}

static void
test_compare(void **state)
{
	const struct data_case *c = *state;
	const char			   *text = data_case_field(c, 0);
	const char			   *value = data_case_field(c, 1);
	bool					want = strcmp(data_case_field(c, 2), "true") == 0;
	struct if_condition		cond;
	char					err[512];

	if (!if_condition_parse(text, &cond, err, sizeof(err)))
		fail_msg("%s: \"%s\" refused: %s", c->name, text, err);
	if (if_compare(&cond, strcmp(value, "(absent)") == 0 ? NULL : value) != want)
	{
		if_condition_free(&cond);
		fail_msg("%s: \"%s\" against \"%s\" should be %s", c->name, text, value,
				 want ? "true" : "false");
	}
	if_condition_free(&cond);
}

int
main(void)
{
	size_t			  nparse;
	size_t			  ncompare;
	struct data_case *parse = data_cases_load(__FILE__, "parse.txt", &nparse);
	struct data_case *compare = data_cases_load(__FILE__, "compare.txt", &ncompare);

	return data_cases_run("parse.txt", parse, nparse, test_parse)
		   + data_cases_run("compare.txt", compare, ncompare, test_compare);
}
