/*
 * test_fair.c: the decay of the dispatcher's fair-share accounting
 * (fair.c) against data/fair_decay.txt, one sender's history per line:
 * usage halves every FAIR_HALF_LIFE, charges add to the decayed total,
 * and a sender that decays below the floor is forgotten; fair_used reads
 * the same decayed total as the export, and 0 for a sender never charged.
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

#include "base/buf.h"
#include "dispatch.h"

static void
test_decay(void **state)
{
	const struct data_case *c = *state;
	double					half_life = strtod(data_case_field(c, 0), NULL);
	char				   *charges = strdup(data_case_field(c, 1));
	double					export_at = strtod(data_case_field(c, 2), NULL);
	double					floor = strtod(data_case_field(c, 3), NULL);
	const char			   *want = data_case_field(c, 4);
	struct fair_account	   *account = fair_create();
	struct buf				stages = BUF_INIT;
	struct buf				senders = BUF_INIT;
	struct buf				used = BUF_INIT;
	char				   *save = NULL;
	char					now_used[64];

	for (char *charge = strtok_r(charges, " ", &save); charge; charge = strtok_r(NULL, " ", &save))
	{
		char *at = strchr(charge, '@');

		if (at == NULL)
			fail_msg("%s: charge \"%s\" is not us@seconds", c->name, charge);
		fair_charge(account, "sender@example.org", strtod(charge, NULL), strtod(at + 1, NULL),
					half_life);
	}
	snprintf(now_used, sizeof(now_used), "%.1f",
			 fair_used(account, "sender@example.org", export_at, half_life));
	if (fair_used(account, "other@example.org", export_at, half_life) != 0)
		fail_msg("%s: a sender never charged has used worker time", c->name);
	buf_append_str(&used, "{");
	fair_export(account, "delivery", export_at, half_life, floor, &stages, &senders, &used);
	if (strcmp(want, "dropped") == 0)
	{
		if (strcmp(used.data, "{") != 0)
			fail_msg("%s: exported \"%s\", should be dropped", c->name, used.data + 1);
	}
	else if (strcmp(used.data + 1, want) != 0 || strcmp(senders.data, "\"sender@example.org\"") != 0)
		fail_msg("%s: exported \"%s\" for [%s], want \"%s\"", c->name, used.data + 1,
				 senders.data ? senders.data : "", want);
	else if (strcmp(now_used, want) != 0)
		fail_msg("%s: fair_used says %s, the export %s", c->name, now_used, want);
	fair_free(account);
	buf_free(&stages);
	buf_free(&senders);
	buf_free(&used);
	free(charges);
}

int
main(void)
{
	size_t			  count;
	struct data_case *cases = data_cases_load(__FILE__, "fair_decay.txt", &count);

	return data_cases_run("fair_decay.txt", cases, count, test_decay);
}
