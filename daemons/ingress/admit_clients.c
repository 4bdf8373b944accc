/*
 * admit_clients.c: see admit_clients.h.
 *
 * The intervals begin at the first admission after the last one's end.  A
 * client that keeps sending is never new after its first admission (its
 * wakes are the interval's), one that sends less often than every other
 * interval always is; past ADMIT_CLIENTS_KEPT clients in an interval, none
 * is, so that many clients at once cost a bounded rate of wakes.  The
 * tables turn over only when a client is recorded: until then an interval
 * that has passed is read as it will be once they have.
 */
#include "admit_clients.h"

#include <stdio.h>
#include <string.h>

/* Whether client was admitted in this interval (0) or the one before (1). */
static bool
admit_clients_seen(const struct admit_clients *t, int interval, const char *client)
{
	for (size_t i = 0; i < t->count[interval]; i++)
		if (strncmp(t->names[interval][i], client, ADMIT_CLIENT_NAME_MAX - 1) == 0)
			return true;
	return false;
}

bool
admit_clients_is_new(const struct admit_clients *t, const char *client, double now, double interval)
{
	double age = now - t->since;

	if (age >= 2 * interval)
		return true; /* both intervals recorded have passed */
	if (age >= interval)
		return !admit_clients_seen(t, 0, client); /* [0] is the interval before */
	return t->count[0] < ADMIT_CLIENTS_KEPT && !admit_clients_seen(t, 0, client)
		   && !admit_clients_seen(t, 1, client);
}

bool
admit_clients_record(struct admit_clients *t, const char *client, double now, double interval)
{
	bool new_client;

	if (now - t->since >= interval)
	{
		bool consecutive = now - t->since < 2 * interval;

		memcpy(t->names[1], t->names[0], sizeof(t->names[0]));
		t->count[1] = consecutive ? t->count[0] : 0;
		t->count[0] = 0;
		t->since = now;
	}
	new_client = admit_clients_is_new(t, client, now, interval);
	/* Many clients at once: the interval's wake serves those past the table. */
	if (t->count[0] < ADMIT_CLIENTS_KEPT && !admit_clients_seen(t, 0, client))
		snprintf(t->names[0][t->count[0]++], ADMIT_CLIENT_NAME_MAX, "%s", client);
	return new_client;
}
