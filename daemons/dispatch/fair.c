/*
 * fair.c: the dispatcher's fair-share accounting, per stage.
 *
 * Each sender accrues the worker time its messages use; the total decays
 * with FAIR_HALF_LIFE, so a sender's lead fades and past bursts are
 * forgiven.  Decay is applied lazily when an entry is read or charged.
 * The accounting lives only here, in memory, and is forgotten on a
 * restart; the claim (in the extension) is handed it as arrays.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "dispatch.h"
#include "runtime/db.h"

struct fair_entry
{
	char			  *sender;
	double			   used_us;
	double			   at;
	struct fair_entry *next;
};

struct fair_account
{
	struct fair_entry **buckets;
	size_t				nbuckets;
	size_t				count;
};

static size_t
fair_hash(const char *s, size_t nbuckets)
{
	size_t h = 1469598103934665603ULL;

	for (; *s; s++)
		h = (h ^ (unsigned char) *s) * 1099511628211ULL;
	return h % nbuckets;
}

struct fair_account *
fair_create(void)
{
	struct fair_account *account = xcalloc(1, sizeof(*account));

	account->nbuckets = 1024;
	account->buckets = xcalloc(account->nbuckets, sizeof(*account->buckets));
	return account;
}

void
fair_free(struct fair_account *account)
{
	if (account == NULL)
		return;
	for (size_t b = 0; b < account->nbuckets; b++)
		for (struct fair_entry *e = account->buckets[b], *next; e; e = next)
		{
			next = e->next;
			free(e->sender);
			free(e);
		}
	free(account->buckets);
	free(account);
}

static double
fair_decayed(const struct fair_entry *e, double now, double half_life)
{
	return e->used_us * exp2(-(now - e->at) / half_life);
}

void
fair_charge(struct fair_account *account, const char *sender, double us, double now,
			double half_life)
{
	size_t			   b = fair_hash(sender, account->nbuckets);
	struct fair_entry *e;

	for (e = account->buckets[b]; e; e = e->next)
		if (strcmp(e->sender, sender) == 0)
			break;
	if (e == NULL)
	{
		e = xcalloc(1, sizeof(*e));
		e->sender = xstrdup(sender);
		e->next = account->buckets[b];
		account->buckets[b] = e;
		account->count++;
	}
	else
		e->used_us = fair_decayed(e, now, half_life);
	e->used_us += us;
	e->at = now;
}

/* A sender's worker time at the stage now, decayed; 0 for one never charged. */
double
fair_used(struct fair_account *account, const char *sender, double now, double half_life)
{
	for (struct fair_entry *e = account->buckets[fair_hash(sender, account->nbuckets)]; e;
		 e = e->next)
		if (strcmp(e->sender, sender) == 0)
			return fair_decayed(e, now, half_life);
	return 0;
}

/*
 * Whether a sender that had used heavy_us of worker time is far ahead of
 * one that had used light_us: by more than twice, and by more than
 * FAIR_OUTWEIGH_ROWS rows of the stage (row_us each), so that two light
 * senders a message or two apart, or newcomers, are never told apart.
 */
#define FAIR_OUTWEIGH_ROWS 4

bool
fair_outweighs(double heavy_us, double light_us, double row_us)
{
	return heavy_us > 2 * light_us + FAIR_OUTWEIGH_ROWS * row_us;
}

/*
 * Export the senders whose decayed usage is above floor (smaller leads are
 * noise; such a sender is then treated as a newcomer, level with the
 * least-served), dropping the ones that decayed below it.
 */
void
fair_export(struct fair_account *account, const char *stage, double now, double half_life,
			double floor, struct buf *stages, struct buf *senders, struct buf *used)
{
	for (size_t b = 0; b < account->nbuckets; b++)
	{
		struct fair_entry **link = &account->buckets[b];

		while (*link)
		{
			struct fair_entry *e = *link;
			double			   value = fair_decayed(e, now, half_life);

			if (value < floor)
			{
				*link = e->next;
				free(e->sender);
				free(e);
				account->count--;
				continue;
			}
			db_array_append(stages, stage);
			db_array_append(senders, e->sender);
			if (used->len > 1)
				buf_append_char(used, ',');
			buf_printf(used, "%.1f", value);
			link = &e->next;
		}
	}
}
