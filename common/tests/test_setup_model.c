/*
 * test_setup_model.c: the setup interview (common/setup/setup_model.h) and
 * the task kinds' checks (setup_task.h): an answer that is not of its
 * form is refused with the reason, every task of a plan passes the check
 * the applier makes, its pepsi.conf loads, and a task with a parameter
 * missing, unknown or malformed is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "setup/setup_model.h"
#include "setup/setup_task.h"

static char why[1024];

static void
answer_refused(enum setup_question_id q, const char *value, const char *want)
{
	struct setup_answers answers = {0};

	why[0] = '\0';
	if (setup_answer(&answers, q, value, why, sizeof(why)))
		fail_msg("--%s %s accepted", setup_questions[q].name, value);
	if (strstr(why, want) == NULL)
		fail_msg("\"%s\" does not say \"%s\"", why, want);
	assert_null(answers.value[q]);
}

static void
test_answers_checked(void **state)
{
	answer_refused(SETUP_Q_DOMAINS, "not_a_domain", "is not a domain");
	answer_refused(SETUP_Q_DOMAINS, "example.org bad..name", "bad..name");
	answer_refused(SETUP_Q_DOMAINS, "  ", "no mail domain");
	answer_refused(SETUP_Q_HOSTNAME, "localhost", "is not a domain");
	answer_refused(SETUP_Q_DELIVERY, "mbox", "lmtp:HOST:PORT");
	answer_refused(SETUP_Q_DELIVERY, "lmtp:dovecot.example:0", "lmtp:HOST:PORT");
	answer_refused(SETUP_Q_RELAY, "smarthost:relay.example", "smarthost:HOST:PORT");
	answer_refused(SETUP_Q_SMTP_PORT, "65536", "is not a port");
	answer_refused(SETUP_Q_LISTEN, "example.org", "is not an IPv4 or IPv6 address");
	answer_refused(SETUP_Q_CONNINFO, "host=a =b", "conninfo");
	answer_refused(SETUP_Q_USER, "Root;", "is not an account name");
}

static void
test_answers_complete(void **state)
{
	struct setup_answers answers = {0};

	assert_false(setup_answers_complete(&answers, why, sizeof(why)));
	assert_non_null(strstr(why, "--domains"));
	assert_true(setup_answer(&answers, SETUP_Q_DOMAINS, "example.org", why, sizeof(why)));
	assert_true(setup_answer(&answers, SETUP_Q_HOSTNAME, "mx.example.org", why, sizeof(why)));
	assert_true(setup_answers_complete(&answers, why, sizeof(why)));
	assert_string_equal(setup_answer_value(&answers, SETUP_Q_RELAY), "direct");
	assert_int_equal(setup_question_find("smtp-port"), SETUP_Q_SMTP_PORT);
	assert_int_equal(setup_question_find("nothing"), -1);
	setup_answers_free(&answers);
}

/* Every task of a plan is one the applier accepts, and its pepsi.conf loads with the graph it says. */
static void
test_plan_checks(void **state)
{
	struct setup_answers answers = {0};
	struct setup_layout	 layout = {"/srv/root", true};
	json_t				*plan;
	json_t				*task;
	size_t				 i;
	int					 kinds[SETUP_KIND_COUNT] = {0};
	char				*text;
	struct pepsi_config *cfg;

	assert_true(setup_answer(&answers, SETUP_Q_DOMAINS, "example.org,example.net", why, sizeof(why)));
	assert_true(setup_answer(&answers, SETUP_Q_HOSTNAME, "mx.example.org", why, sizeof(why)));
	assert_true(setup_answer(&answers, SETUP_Q_DELIVERY, "lmtp:127.0.0.1:24", why, sizeof(why)));
	assert_true(setup_answer(&answers, SETUP_Q_RELAY, "smarthost:[::1]:587", why, sizeof(why)));
	plan = setup_plan(&answers, &layout);
	json_array_foreach (plan, i, task)
	{
		enum setup_kind kind;

		assert_true(setup_kind_parse(json_string_value(json_object_get(task, "kind")), &kind));
		if (!setup_task_check(kind, json_object_get(task, "params"), why, sizeof(why)))
			fail_msg("task %zu (%s) refused: %s", i, setup_kind_name(kind), why);
		kinds[kind]++;
	}
	assert_int_equal(kinds[SETUP_DATABASE_ROLE], 5);
	assert_int_equal(kinds[SETUP_DKIM_KEY], 2);
	assert_int_equal(kinds[SETUP_CONFIG_FILE], 1);
	assert_int_equal(kinds[SETUP_SRS_SECRET], 1);
	json_decref(plan);

	text = setup_config_text(&answers, &layout);
	cfg = config_parse_string(text, "pepsi.conf", why, sizeof(why));
	if (cfg == NULL)
		fail_msg("the plan's pepsi.conf is refused: %s", why);
	assert_string_equal(config_get(cfg, "stage-local", "SERVER"), "127.0.0.1:24");
	assert_string_equal(config_get(cfg, "stage-remote", "SMARTHOST"), "[::1]:587");
	assert_string_equal(config_get(cfg, "dkim-key-example-net", "KEY_FILE"),
						"/srv/root/etc/pepsi/dkim/pepsi.example.net.pem");
	assert_string_equal(config_get(cfg, "ingress", "USER"), "pepsi");
	assert_null(config_get(cfg, "srs", "SECRET"));
	config_free(cfg);
	free(text);
	setup_answers_free(&answers);
}

static void
task_refused(enum setup_kind kind, const char *params, const char *want)
{
	json_error_t error;
	json_t		*p = json_loads(params, 0, &error);

	assert_non_null(p);
	why[0] = '\0';
	if (setup_task_check(kind, p, why, sizeof(why)))
		fail_msg("%s %s accepted", setup_kind_name(kind), params);
	if (strstr(why, want) == NULL)
		fail_msg("\"%s\" does not say \"%s\"", why, want);
	json_decref(p);
}

static void
test_task_params_strict(void **state)
{
	enum setup_kind kind;

	assert_false(setup_kind_parse("format_disk", &kind));
	assert_true(setup_kind_parse("dns_check", &kind));
	assert_int_equal(kind, SETUP_DNS_CHECK);
	task_refused(SETUP_DNS_CHECK, "{}", "needs the parameter domain");
	task_refused(SETUP_DNS_CHECK, "{\"domain\": \"example.org\", \"shell\": \"x\"}", "takes no parameter \"shell\"");
	task_refused(SETUP_DNS_CHECK, "{\"domain\": 3}", "is not a string");
	task_refused(SETUP_DNS_CHECK, "{\"domain\": \"no_domain\"}", "is not a domain");
	task_refused(SETUP_DATABASE_ROLE, "{\"name\": \"x\", \"member_of\": \"postgres\"}", "is not one of");
	task_refused(SETUP_DATABASE_ROLE, "{\"name\": \"x; DROP\", \"member_of\": \"pepsi_stage\"}", "is not a name");
	task_refused(SETUP_CONFIG_FILE, "{\"name\": \"../shadow\", \"content\": \"\"}", "is not one of");
	/* pepsi.conf is the package's conffile: a task may not name it. */
	task_refused(SETUP_CONFIG_FILE, "{\"name\": \"pepsi.conf\", \"content\": \"[pepsi]\\nHOSTNAME = a.example\\n\"}",
				 "is not one of pepsi.conf.d/setup.conf");
	task_refused(SETUP_CONFIG_FILE, "{\"name\": \"pepsi.conf.d/setup.conf\", \"content\": \"[nowhere]\\nX = 1\\n\"}",
				 "does not load");
	task_refused(SETUP_SECRET,
				 "{\"name\": \"a\", \"group\": \"pepsi\", \"section\": \"srs\", \"option\": \"MAX_AGE\", "
				 "\"value\": \"3\"}",
				 "is not a secret option");
	task_refused(SETUP_PG_HBA_LINE,
				 "{\"type\": \"host\", \"database\": \"pepsi\", \"user\": \"u\", \"method\": \"peer\"}",
				 "needs the parameter address");
	task_refused(SETUP_RELOAD, "[]", "not a JSON object");
	{
		json_t *ok = json_pack("{s:s, s:s, s:s, s:s, s:s}", "name", "srs", "group", "pepsi", "section", "srs",
							   "option", "SECRET", "value", "s3cret");

		assert_true(setup_task_check(SETUP_SECRET, ok, why, sizeof(why)));
		json_decref(ok);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_answers_checked),
		cmocka_unit_test(test_answers_complete),
		cmocka_unit_test(test_plan_checks),
		cmocka_unit_test(test_task_params_strict),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
