/*
 * test_db_pad.c: db_pad_int_array (common/runtime/db.h) pads an array
 * literal of ids to a length with its last id repeated, as the stage
 * loads of a batch send it (stage.c, STAGE_LOAD_PLANNED_IDS), and refuses
 * what it cannot pad: a buffer too small, a text that is not a literal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/db.h"

static void
pads_with_the_last_id(void **state)
{
	char out[256];

	assert_true(db_pad_int_array("{1,22,333}", 3, 5, out, sizeof(out)));
	assert_string_equal(out, "{1,22,333,333,333}");
	assert_true(db_pad_int_array("{7}", 1, 3, out, sizeof(out)));
	assert_string_equal(out, "{7,7,7}");
	/* already as long: as it is */
	assert_true(db_pad_int_array("{4,5}", 2, 2, out, sizeof(out)));
	assert_string_equal(out, "{4,5}");
	assert_true(db_pad_int_array("{9223372036854775807,1}", 2, 10, out, sizeof(out)));
	assert_string_equal(out, "{9223372036854775807,1,1,1,1,1,1,1,1,1}");
}

static void
refuses_what_it_cannot_pad(void **state)
{
	char out[12];

	/* "{1,2,2,2,2}" needs 12 bytes with its NUL: fits; one more does not */
	assert_true(db_pad_int_array("{1,2}", 2, 5, out, sizeof(out)));
	assert_string_equal(out, "{1,2,2,2,2}");
	assert_false(db_pad_int_array("{1,2}", 2, 6, out, sizeof(out)));
	assert_false(db_pad_int_array("{}", 0, 3, out, sizeof(out)));
	assert_false(db_pad_int_array("1,2", 2, 3, out, sizeof(out)));
	assert_false(db_pad_int_array("{1,2", 2, 3, out, sizeof(out)));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(pads_with_the_last_id),
		cmocka_unit_test(refuses_what_it_cannot_pad),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
