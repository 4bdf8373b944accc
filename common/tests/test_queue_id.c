/*
 * test_queue_id.c: queue ids (common/message/queue_id.h) are Postfix-shaped (the
 * 52 symbols of its long ids, so that pflogsumm's \w+ takes them), sort by
 * time, differ between hosts and between calls, and a row without one
 * goes by its row id; and the log tags' services (common/base/log.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/log.h"
#include "message/queue_id.h"

#define MANY 20000

static int
compare_ids(const void *a, const void *b)
{
	return strcmp((const char *) a, (const char *) b);
}

static void
ids_are_postfix_shaped_and_unique(void **state)
{
	static char ids[MANY][QUEUE_ID_LEN + 1];

	for (int i = 0; i < MANY; i++)
	{
		queue_id_make(17, ids[i]);
		assert_true(queue_id_valid(ids[i]));
		/* no vowel: no word forms, as in Postfix's long ids */
		assert_null(strpbrk(ids[i], "AEIOUaeiou_"));
	}
	qsort(ids, MANY, sizeof(ids[0]), compare_ids);
	for (int i = 1; i < MANY; i++)
		assert_string_not_equal(ids[i - 1], ids[i]);
}

static void
hosts_differ(void **state)
{
	char a[QUEUE_ID_LEN + 1];
	char b[QUEUE_ID_LEN + 1];

	queue_id_make(1, a);
	queue_id_make(2, b);
	/* the host's two characters follow the six of the time */
	assert_memory_not_equal(a + 6, b + 6, 2);
	assert_false(queue_id_valid("12345"));
	assert_false(queue_id_valid("4Yj3Rb0Wg1p900a"));
	assert_true(queue_id_valid("4Yj3Rb0Wg1p9000"));
}

static void
row_without_one_goes_by_row_id(void **state)
{
	char	buf[32];
	json_t *with = json_pack("{s:s}", "queue_id", "4Yj3Rb0Wg1p9000");
	json_t *without = json_object();

	assert_string_equal(queue_id_of(with, 42, buf, sizeof(buf)), "4Yj3Rb0Wg1p9000");
	assert_string_equal(queue_id_of(without, 42, buf, sizeof(buf)), "42");
	assert_string_equal(queue_id_of(NULL, 7, buf, sizeof(buf)), "7");
	json_decref(with);
	json_decref(without);
}

static void
services_are_postfix_names(void **state)
{
	assert_string_equal(log_service_of("pepsi-ingress"), "smtpd");
	assert_string_equal(log_service_of("/usr/sbin/pepsi-stage-relay-to-smarthost"), "smtp");
	assert_string_equal(log_service_of("pepsi-stage-relay-to-internet"), "smtp");
	assert_string_equal(log_service_of("pepsi-stage-relay-to-lmtp"), "lmtp");
	assert_string_equal(log_service_of("pepsi-stage-relay-to-maildir"), "local");
	assert_string_equal(log_service_of("pepsi-stage-route"), "route");
	assert_string_equal(log_service_of("pepsi-dispatch"), "dispatch");
	assert_string_equal(log_service_of("my-stage"), "my-stage");
	assert_true(log_syslog_name_valid("pepsi-mx.2"));
	assert_false(log_syslog_name_valid(""));
	assert_false(log_syslog_name_valid("pepsi/mx"));
	assert_false(log_syslog_name_valid("pepsi mx"));
	assert_false(log_set_syslog_name("a:b"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(ids_are_postfix_shaped_and_unique),
		cmocka_unit_test(hosts_differ),
		cmocka_unit_test(row_without_one_goes_by_row_id),
		cmocka_unit_test(services_are_postfix_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
