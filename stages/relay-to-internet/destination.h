/*
 * destination.h: the database side of pepsi-stage-relay-to-internet's
 * scheduling, over the extension's functions (extension/sql, "Relay to
 * the internet"): pepsi.dns_address, the MX hosts' addresses with their
 * TTL and health, and pepsi.destination, a recipient domain's concurrency
 * slots, rate limit and backoff.  Every worker reads and writes the same
 * rows, so what one worker learns steers the others.
 */
#ifndef PEPSI_INTERNET_DESTINATION_H
#define PEPSI_INTERNET_DESTINATION_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

struct cached_address
{
	char  *address;
	int	   failures;
	double retry_in; /* seconds before it may be tried again (0: now) */
};

struct cached_host
{
	size_t				   count;
	struct cached_address *addresses;
};

/*
 * The current (not expired) addresses of host, as pepsi.dns_address had
 * them at most a second ago; false on a database error.
 */
bool destination_cached_addresses(PGconn *conn, const char *host, struct cached_host *out,
								  char *err, size_t errlen);
void destination_cached_free(struct cached_host *h);
/* Read host afresh next time (this worker saw it fail). */
void destination_forget(const char *host);
/* The host's addresses as the DNS just gave them, for ttl seconds. */
bool destination_store_addresses(PGconn *conn, const char *host, char *const *addresses,
								 size_t count, unsigned ttl, char *err, size_t errlen);

/* Seconds on the monotonic clock (the memos' ages). */
double destination_now(void);

/* What destination_begin answers. */
struct destination_start
{
	int	   slot;		  /* >= 0: deliver now, holding it; -1: wait */
	double wait;		  /* then: seconds */
	char   reason[512];	  /* and why */
	bool   contended;	  /* more takers than connections: no idle session there */
	bool   sts_cached;	  /* the database's MTA-STS cache was read for the domain: */
	char  *sts_policy_id; /* its policy, or NULL when it has none */
	char  *sts_policy;
	char  *tls_policy; /* the TLS result recorded for the domain (NULL: none) */
	char  *tls_outcome;
	bool   per_message; /* must each message ask (a rate limit, a slow destination's share)? */
};

/* How a worker's stage shares its workers among destinations (destination_begin). */
struct destination_share
{
	long long	default_concurrency; /* DESTINATION_CONCURRENCY */
	double		slow_seconds;		 /* a destination this slow (0: none is slow) ... */
	long long	slow_limit;			 /* ... gets at most this many slots */
	double		handoff_seconds;	 /* the longest wait in place for a slot (0: none) */
	const char *stage;				 /* its name: are other domains' rows waiting there? */
};

/*
 * A concurrency slot of domain, or the wait when it is backing off or at
 * a limit (at a limit whose next turn is near, it waits for a slot up to
 * share->handoff_seconds; a slow destination's limit is share->slow_limit
 * while other domains' mail waits).  The same round trip refreshes the memos of
 * hosts (the domain's MX hosts: destination_cached_addresses then reads
 * none), reads the domain's cached MTA-STS policy, and ends the delivery
 * whose slot this worker kept (its slot carried over when it is to the
 * same domain).
 */
bool destination_begin(PGconn *conn, const char *domain, const struct destination_share *share,
					   const char *const *hosts, size_t nhosts, struct destination_start *out,
					   char *err, size_t errlen);
void destination_start_free(struct destination_start *s);

/*
 * A delivery that reached its destination keeps its slot, recorded as
 * destination_end's 'connected' by the next destination_begin (or
 * destination_release), which is the round trip the worker makes anyway;
 * to the same domain, its session is then used again under that slot.
 */
void destination_keep(const char *domain, int slot, const char *ok_host, const char *ok_address,
					  double seconds, bool contended);
/*
 * The slot kept for domain, taken over by the next delivery there without
 * a destination_begin (the kept delivery then goes unrecorded: the next
 * one's end or keep stands for both); -1 when none is kept for domain.
 */
int destination_carry_on(const char *domain);
/* The domain whose slot is kept (NULL: none), and whether it was contended. */
const char *destination_kept_domain(bool *contended);
/* Free a slot with nothing recorded (the delivery could not start). */
void destination_unlock(PGconn *conn, const char *domain, int slot);
/* The worker has nothing to do: end the kept delivery now, freeing its slot. */
bool destination_release(PGconn *conn, char *err, size_t errlen);

struct destination_end
{
	const char *outcome; /* "connected", "unreachable", "busy" */
	const char *error;	 /* why, when not connected */
	const char *ok_host;
	const char *ok_address;
	struct buf *failed_hosts;	  /* PostgreSQL array literals, or NULL */
	struct buf *failed_addresses; /* (each built with db_array_append) */
	long long	backoff_after;
	double		backoff_base;
	double		backoff_max;
	double		seconds; /* the delivery's duration */
	/* The TLS policy the delivery was made under and what it gave (NULL: nothing to record). */
	const char *tls_policy;
	const char *tls_outcome;
};
/* *contended: the destination has more takers than connections (close the session). */
bool destination_end(PGconn *conn, const char *domain, int slot, const struct destination_end *e,
					 bool *contended, char *err, size_t errlen);

#endif
