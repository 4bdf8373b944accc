/*
 * auth_throttle.c: see auth_throttle.h.  A hash table of the clients with
 * recent failures; it holds at most AUTH_THROTTLE_MAX_CLIENTS, so a
 * spread of addresses cannot exhaust memory (past it, expired entries go
 * first, and then new clients go uncounted until some expire: each of
 * their failures is still answered slowly by its own session).
 */
#include "auth_throttle.h"

#include <stdlib.h>
#include <string.h>

#include "base/xalloc.h"

#define AUTH_THROTTLE_BUCKETS 4096
#define AUTH_THROTTLE_MAX_CLIENTS 100000
#define AUTH_THROTTLE_MAX_DOUBLINGS 5

struct auth_failures
{
	char				 *client;
	unsigned			  count;
	double				  last;
	struct auth_failures *next;
};

struct auth_throttle
{
	unsigned			  limit;
	double				  window;
	double				  delay;
	size_t				  clients;
	struct auth_failures *buckets[AUTH_THROTTLE_BUCKETS];
};

struct auth_throttle *
auth_throttle_new(unsigned limit, double window, double delay)
{
	struct auth_throttle *t = xcalloc(1, sizeof(*t));

	auth_throttle_configure(t, limit, window, delay);
	return t;
}

void
auth_throttle_configure(struct auth_throttle *t, unsigned limit, double window, double delay)
{
	t->limit = limit;
	t->window = window;
	t->delay = delay;
}

static unsigned
auth_throttle_hash(const char *client)
{
	unsigned h = 5381;

	for (const char *p = client; *p; p++)
		h = h * 33 + (unsigned char) *p;
	return h % AUTH_THROTTLE_BUCKETS;
}

/* The client's entry, forgotten first if its window has passed; NULL when none. */
static struct auth_failures *
auth_throttle_find(struct auth_throttle *t, const char *client, double now)
{
	struct auth_failures **p = &t->buckets[auth_throttle_hash(client)];

	for (; *p; p = &(*p)->next)
		if (strcmp((*p)->client, client) == 0)
		{
			struct auth_failures *f = *p;

			if (now - f->last < t->window)
				return f;
			*p = f->next;
			free(f->client);
			free(f);
			t->clients--;
			return NULL;
		}
	return NULL;
}

bool
auth_throttle_blocked(struct auth_throttle *t, const char *client, double now)
{
	struct auth_failures *f = auth_throttle_find(t, client, now);

	return t->limit > 0 && f != NULL && f->count >= t->limit;
}

unsigned
auth_throttle_failures(struct auth_throttle *t, const char *client, double now)
{
	struct auth_failures *f = auth_throttle_find(t, client, now);

	return f ? f->count : 0;
}

double
auth_throttle_failed(struct auth_throttle *t, const char *client, double now, bool *close)
{
	struct auth_failures *f = auth_throttle_find(t, client, now);
	unsigned			  doublings;

	if (f == NULL && t->clients >= AUTH_THROTTLE_MAX_CLIENTS)
		auth_throttle_expire(t, now);
	if (f == NULL && t->clients < AUTH_THROTTLE_MAX_CLIENTS)
	{
		unsigned h = auth_throttle_hash(client);

		f = xcalloc(1, sizeof(*f));
		f->client = xstrdup(client);
		f->next = t->buckets[h];
		t->buckets[h] = f;
		t->clients++;
	}
	if (f == NULL)
	{
		*close = false;
		return t->delay;
	}
	f->count++;
	f->last = now;
	*close = t->limit > 0 && f->count >= t->limit;
	doublings = f->count - 1 < AUTH_THROTTLE_MAX_DOUBLINGS ? f->count - 1 : AUTH_THROTTLE_MAX_DOUBLINGS;
	return t->delay * (double) (1u << doublings);
}

size_t
auth_throttle_expire(struct auth_throttle *t, double now)
{
	for (size_t i = 0; i < AUTH_THROTTLE_BUCKETS; i++)
		for (struct auth_failures **p = &t->buckets[i]; *p;)
		{
			struct auth_failures *f = *p;

			if (now - f->last < t->window)
			{
				p = &f->next;
				continue;
			}
			*p = f->next;
			free(f->client);
			free(f);
			t->clients--;
		}
	return t->clients;
}

void
auth_throttle_free(struct auth_throttle *t)
{
	if (t == NULL)
		return;
	auth_throttle_expire(t, 1e300);
	free(t);
}
