/*
 * list_rcpt.c: the mailing lists' addresses at RCPT (pepsi-stage-list(8)).
 * list@, list-request@, -owner@, -subscribe@, -unsubscribe@, -bounces@
 * and list-bounces+anything@ exist although no mailbox has their name.
 * The addresses (pepsi.list_addresses()) are read with the virtual
 * mailboxes, on local_refresh.c's connection and schedule; until they
 * are, the resolver's own verdict stands.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "ingress.h"

const char list_rcpt_query[] = "SELECT a FROM pepsi.list_addresses() a";

static struct
{
	char **address; /* sorted, lower case */
	size_t count;
	bool   warned;
} lists;

static int
list_rcpt_compare(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

void
list_rcpt_set(const PGresult *res)
{
	int rows;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (!lists.warned)
			log_warnx("mailing lists: cannot read pepsi.list_addresses(): %.*s; keeping what was read before",
					  (int) strcspn(PQresultErrorMessage(res), "\n"), PQresultErrorMessage(res));
		lists.warned = true;
		return;
	}
	lists.warned = false;
	for (size_t i = 0; i < lists.count; i++)
		free(lists.address[i]);
	free(lists.address);
	rows = PQntuples(res);
	lists.address = xcalloc((size_t) rows + 1, sizeof(char *));
	lists.count = 0;
	for (int i = 0; i < rows; i++)
	{
		char *a = xstrdup(PQgetvalue(res, i, 0));

		for (char *p = a; *p; p++)
			*p = (char) (*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
		lists.address[lists.count++] = a;
	}
	qsort(lists.address, lists.count, sizeof(char *), list_rcpt_compare);
}

/* Is address (lower case) one of the lists' addresses, a -bounces+ address by its base? */
static bool
list_rcpt_known(char *address)
{
	char *at = strrchr(address, '@');
	char *plus;

	if (lists.count == 0 || at == NULL)
		return false;
	if (bsearch(&address, lists.address, lists.count, sizeof(char *), list_rcpt_compare))
		return true;
	/* list-bounces+user=domain@: the base list-bounces@ */
	plus = strstr(address, "-bounces+");
	if (plus == NULL || plus > at)
		return false;
	memmove(plus + 8, at, strlen(at) + 1);
	return bsearch(&address, lists.address, lists.count, sizeof(char *), list_rcpt_compare) != NULL;
}

enum smtp_rcpt_verdict
list_rcpt_check(const char *address, enum smtp_rcpt_verdict verdict)
{
	char *lower;
	bool  known;

	if (verdict != SMTP_RCPT_UNKNOWN_USER)
		return verdict;
	lower = xstrdup(address);
	for (char *p = lower; *p; p++)
		*p = (char) (*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
	known = list_rcpt_known(lower);
	free(lower);
	return known ? SMTP_RCPT_ACCEPT : verdict;
}
