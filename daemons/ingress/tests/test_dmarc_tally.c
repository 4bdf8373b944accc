/*
 * test_dmarc_tally.c: dmarc_tally.c's counts, and their return after a
 * report that failed: the counts a failed report took come back and add
 * to those counted since, so the next report carries them all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "dmarc_tally.h"

static const struct dmarc_verdict verdict = {
	.result = "fail", .from_domain = "example.org", .policy_domain = "example.org", .dkim_reported = -1};

/* The count of the record of source_ip in the JSON of dmarc_tally_take (0: none). */
static long long
count_of(const char *text, const char *source_ip)
{
	json_t	 *rows = json_loads(text, 0, NULL);
	size_t	  i;
	json_t	 *row;
	long long found = 0;

	assert_non_null(rows);
	json_array_foreach (rows, i, row)
	{
		if (strcmp(json_string_value(json_object_get(row, "source_ip")), source_ip) == 0)
			found = json_integer_value(json_object_get(row, "count"));
	}
	json_decref(rows);
	return found;
}

static void
test_counts_and_return(void **state)
{
	char *first;
	char *second;

	assert_null(dmarc_tally_take());
	dmarc_tally_add(&verdict, "none", "192.0.2.1", "example.org", "mfrom", SPF_FAIL, NULL, 0);
	dmarc_tally_add(&verdict, "none", "192.0.2.1", "example.org", "mfrom", SPF_FAIL, NULL, 0);
	dmarc_tally_add(&verdict, "none", "192.0.2.2", "example.org", "mfrom", SPF_FAIL, NULL, 0);
	first = dmarc_tally_take();
	assert_non_null(first);
	assert_int_equal(count_of(first, "192.0.2.1"), 2);
	assert_int_equal(count_of(first, "192.0.2.2"), 1);
	assert_null(dmarc_tally_take());

	/* The report failed: its counts come back, and add to the new ones. */
	dmarc_tally_add(&verdict, "none", "192.0.2.1", "example.org", "mfrom", SPF_FAIL, NULL, 0);
	dmarc_tally_return(first);
	second = dmarc_tally_take();
	assert_non_null(second);
	assert_int_equal(count_of(second, "192.0.2.1"), 3);
	assert_int_equal(count_of(second, "192.0.2.2"), 1);
	assert_null(dmarc_tally_take());
	dmarc_tally_return(NULL); /* nothing to give back */
	assert_null(dmarc_tally_take());
	free(first);
	free(second);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_counts_and_return)};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
