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

/*
 * A concurrency slot of domain (*slot >= 0), or the wait (*slot = -1,
 * *wait seconds, reason) when it is backing off or at a limit.
 */
bool destination_begin(PGconn *conn, const char *domain, long long default_concurrency, int *slot,
					   double *wait, char *reason, size_t reason_len, char *err, size_t errlen);

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
};
/* *contended: the destination has more takers than connections (close the session). */
bool destination_end(PGconn *conn, const char *domain, int slot, const struct destination_end *e,
					 bool *contended, char *err, size_t errlen);

#endif
