/*
 * test_origin.c: state.origin.trust (origin.h).  The four trusted values
 * are trusted; untrusted, a missing field, another value, a value of
 * another JSON type, legacy keys alone (origin.auth, origin.local) and a
 * trust written outside state.origin are not; origin_generated makes a
 * trusted origin that names its program.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>

#include "message/origin.h"

static bool
trusted(const char *text)
{
	json_t *state = json_loads(text, 0, NULL);
	bool	answer;

	assert_non_null(state);
	answer = origin_trusted(state);
	json_decref(state);
	return answer;
}

static void
test_trusted_values(void **unused)
{
	assert_true(trusted("{\"origin\": {\"trust\": \"authenticated\"}}"));
	assert_true(trusted("{\"origin\": {\"trust\": \"trusted-network\"}}"));
	assert_true(trusted("{\"origin\": {\"trust\": \"local\"}}"));
	assert_true(trusted("{\"origin\": {\"trust\": \"pepsi\"}}"));
}

static void
test_everything_else_is_untrusted(void **unused)
{
	assert_false(trusted("{\"origin\": {\"trust\": \"untrusted\"}}"));
	assert_false(trusted("{}"));
	assert_false(trusted("{\"origin\": {}}"));
	assert_false(trusted("{\"origin\": {\"trust\": \"Pepsi\"}}"));
	assert_false(trusted("{\"origin\": {\"trust\": \"local \"}}"));
	assert_false(trusted("{\"origin\": {\"trust\": true}}"));
	assert_false(trusted("{\"origin\": {\"trust\": [\"local\"]}}"));
	assert_false(trusted("{\"origin\": \"local\"}"));
	assert_false(trusted("{\"origin\": {\"auth\": \"alice@example.org\", \"local\": true}}"));
	assert_false(trusted("{\"trust\": \"local\", \"dsn\": {\"trust\": \"local\"}}"));
	assert_false(origin_trusted(NULL));
	assert_null(origin_trust(NULL));
}

static void
test_generated(void **unused)
{
	json_t *origin = origin_generated("pepsi-stage-bounce");
	json_t *state = json_pack("{s:o}", "origin", origin);

	assert_string_equal(origin_trust(state), ORIGIN_TRUST_PEPSI);
	assert_string_equal(json_string_value(json_object_get(origin, "program")), "pepsi-stage-bounce");
	assert_true(origin_trusted(state));
	json_decref(state);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_trusted_values),
		cmocka_unit_test(test_everything_else_is_untrusted),
		cmocka_unit_test(test_generated),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
