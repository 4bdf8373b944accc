/*
 * tls_tally.h: the relay's TLS sessions, counted in memory per recipient
 * domain, policy and result and handed to the database in batches for
 * TLS reports (RFC 8460, pepsi.tls_aggregate, pepsi-tlsrpt(8)): no round
 * trip per message.  The counts ride on pepsi.destination_begin, which
 * each delivery calls anyway (destination.c), at most every
 * TLS_TALLY_SECONDS; and a worker that goes idle adds what it holds
 * after a second (internet_tls_tally_idle).
 */
#ifndef PEPSI_INTERNET_TLS_TALLY_H
#define PEPSI_INTERNET_TLS_TALLY_H

#include <libpq-fe.h>
#include <stdbool.h>

#define TLS_TALLY_SECONDS 10

struct internet_tls_policy;

/*
 * Count sessions under policy for domain: result_type "" for successful
 * ones, else the RFC 8460 result type, with the MX host and the address
 * that failed, and local_address, ours ("" when no connection was made).
 */
void internet_tls_tally_add(const char *domain, const struct internet_tls_policy *policy,
							const char *result_type, const char *mx_host, const char *address,
							const char *local_address, int sessions);
/*
 * The counts as the JSON array pepsi.tls_tally() takes, when there are
 * some and (unless now) they are TLS_TALLY_SECONDS old; else NULL.  The
 * caller frees it, and calls internet_tls_tally_clear once the database
 * has them (a failed call keeps them for the next).
 */
char *internet_tls_tally_due(bool now);
void  internet_tls_tally_clear(void);
/*
 * Did res (of a call with the counts) fail because the extension has no
 * pepsi.tls_tally (older than 0.6)?  Then, logged once, this worker
 * counts no more sessions.
 */
bool internet_tls_tally_refused(const PGresult *res);
/* The idle callback (pepsi_when_idle): add the counts after a second idle. */
int internet_tls_tally_idle(PGconn *conn, double idle_seconds);

#endif
