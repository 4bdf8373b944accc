/*
 * test_options.c: the option schema itself (schema/options.def): every
 * line is reachable and consistent, and every default passes its own
 * line's check, so a program never reads a default it would refuse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "options.h"

static void
test_defaults_pass_their_check(void **state)
{
	char problem[512];

	for (size_t i = 0; i < option_count; i++)
	{
		const struct option_def *def = &option_table[i];

		if (def->default_value && !option_value_check(def, def->default_value, false, problem, sizeof(problem)))
			fail_msg("%s %s: the default \"%s\" is refused: %s", def->where, def->name,
					 def->default_value, problem);
		/* A default is also what an override may set back. */
		if (def->default_value && !option_value_check(def, def->default_value, true, problem, sizeof(problem)))
			fail_msg("%s %s: the default \"%s\" is refused from the database: %s", def->where,
					 def->name, def->default_value, problem);
	}
}

static void
test_every_line_is_found(void **state)
{
	for (size_t i = 0; i < option_count; i++)
	{
		const struct option_def *def = &option_table[i];
		bool					 program = strncmp(def->where, "pepsi-", 6) == 0;
		char					 section[128];
		const char				*star = strchr(def->where, '*');

		if (program)
			snprintf(section, sizeof(section), "stage-x");
		else if (star)
			snprintf(section, sizeof(section), "%.*sx", (int) (star - def->where), def->where);
		else
			snprintf(section, sizeof(section), "%s", def->where);
		/* Found, and not shadowed by an earlier line (a stage program's by every stage's). */
		if (option_find(section, program ? def->where : NULL, def->name) != def)
			fail_msg("%s %s: option_find finds another line, or none", def->where, def->name);
		if (!program && !option_section_known(section))
			fail_msg("%s: not a known section", def->where);
		for (size_t j = 0; j < i; j++)
			if (strcmp(option_table[j].where, def->where) == 0
				&& strcmp(option_table[j].name, def->name) == 0)
				fail_msg("%s %s is declared twice", def->where, def->name);
		if (def->type == OPTION_ENUM && (def->choices == NULL || def->choices[0] == '\0'))
			fail_msg("%s %s: an ENUM needs its choices", def->where, def->name);
		if (def->type != OPTION_ENUM && def->choices)
			fail_msg("%s %s: choices on a non-ENUM", def->where, def->name);
		if (def->type == OPTION_PATH && def->scope != OPTION_SCOPE_FILE)
			fail_msg("%s %s: a path is read from pepsi.conf only", def->where, def->name);
	}
}

static void
test_scope_check(void **state)
{
	const struct option_def *global = option_find("dispatch", NULL, "POLL_INTERVAL");
	const struct option_def *address = option_find("stage-x", NULL, "MAX_LIFETIME");
	const struct option_def *file = option_find("ingress", NULL, "USER");
	char					 problem[512];

	assert_true(option_scope_check(global, "global", problem, sizeof(problem)));
	assert_false(option_scope_check(global, "domain:example.org", problem, sizeof(problem)));
	assert_true(option_scope_check(address, "domain:example.org", problem, sizeof(problem)));
	assert_true(option_scope_check(address, "address:a@example.org", problem, sizeof(problem)));
	assert_false(option_scope_check(file, "global", problem, sizeof(problem)));
	assert_null(option_find("stage-x", NULL, "SMARTHOST"));
	assert_non_null(option_find("stage-x", "/usr/libexec/pepsi-stage-relay-to-smarthost", "SMARTHOST"));
	assert_true(option_program_declared("pepsi-stage-bounce"));
	assert_false(option_program_declared("someone-elses-stage"));
}

/* What an owner may set (options.def OWNER): every mark names an ADDRESS option; values checked. */
static void
test_owner_options(void **state)
{
	char		problem[512];
	const char *name;
	bool		lines = true;
	char		big[OPTION_OWNER_VALUE_MAX + 2];

	(void) state;
	for (size_t i = 0; (name = option_owner_name(i)) != NULL; i++)
		assert_non_null(option_owner_find(name, NULL));
	assert_non_null(option_owner_find("VACATION_SUBJECT", &lines));
	assert_false(lines);
	assert_non_null(option_owner_find("VACATION_MESSAGE", &lines));
	assert_true(lines);
	assert_null(option_owner_find("QUEUE_LIMIT", NULL));
	assert_true(option_owner_value_check("VACATION", "yes", problem, sizeof(problem)));
	assert_true(option_owner_value_check("VACATION", NULL, problem, sizeof(problem)));
	assert_false(option_owner_value_check("VACATION", "maybe", problem, sizeof(problem)));
	assert_false(option_owner_value_check("QUEUE_LIMIT", "5", problem, sizeof(problem)));
	assert_string_equal(problem, "QUEUE_LIMIT is not an option an address's owner may set");
	assert_true(option_owner_value_check("VACATION_MESSAGE", "Away.\r\n\tBack soon.", problem, sizeof(problem)));
	assert_false(option_owner_value_check("VACATION_MESSAGE", "Away\x1b[2J", problem, sizeof(problem)));
	assert_false(option_owner_value_check("VACATION_SUBJECT", "two\nlines", problem, sizeof(problem)));
	assert_false(option_owner_value_check("BLOCK_ACTION", "shred", problem, sizeof(problem)));
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_false(option_owner_value_check("VACATION_MESSAGE", big, problem, sizeof(problem)));
	assert_non_null(strstr(problem, "longer than 10000 bytes"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_pass_their_check),
		cmocka_unit_test(test_every_line_is_found),
		cmocka_unit_test(test_scope_check),
		cmocka_unit_test(test_owner_options),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
