/*
 * dns.h: the resolver every part of Pepsi asks, over libunbound.
 *
 * Daemons use it asynchronously: the resolver's descriptor sits in their
 * libev loop, answers come back by callback, and every lookup has its own
 * timeout, so a name whose servers never answer costs one timer, never a
 * stalled loop.  Answers are also kept in the loop's own cache for their
 * TTL (at most five minutes), so the names every message asks for again
 * (a sender domain's SPF, DKIM key and DMARC policy) cost no round trip to
 * libunbound's thread.  Stage workers, which handle one message at a time, use
 * the blocking form, which keeps its answers in the same way.  Answers carry their DNSSEC status (secure, bogus)
 * for the relay stage's DANE.  Configuration is in [pepsi]: the system
 * resolver by default, DNS_FORWARDER to send every query to one server,
 * DNS_TRUST_ANCHOR to validate.
 *
 * A test can replace libunbound with a backend of its own (struct
 * dns_backend) that answers from data it holds; the timeouts and the
 * budgets stay the real ones.
 */
#ifndef PEPSI_DNS_H
#define PEPSI_DNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>

#include "config/config.h"

enum dns_type
{
	DNS_TYPE_A = 1,
	DNS_TYPE_NS = 2,
	DNS_TYPE_CNAME = 5,
	DNS_TYPE_PTR = 12,
	DNS_TYPE_MX = 15,
	DNS_TYPE_TXT = 16,
	DNS_TYPE_AAAA = 28,
	DNS_TYPE_TLSA = 52
};

enum dns_status
{
	DNS_OK,		  /* an answer; it may hold no record (NODATA) */
	DNS_NXDOMAIN, /* the name does not exist */
	DNS_TEMPFAIL, /* SERVFAIL, REFUSED, unreachable servers, bogus */
	DNS_TIMEOUT	  /* no answer within the lookup's timeout or budget */
};

struct dns_record
{
	uint16_t	   type;
	uint16_t	   preference; /* MX */
	size_t		   len;		   /* of rdata, and of text for TXT */
	size_t		   rdata_len;  /* of rdata, always */
	unsigned char *rdata;	   /* wire format (A: 4 octets, AAAA: 16) */
	/*
	 * TXT: the character-strings concatenated (RFC 7208 3.3), NUL
	 * terminated though it may hold a NUL of its own (len says).
	 * PTR, CNAME, MX: the name, dotted, without the final dot; NULL if
	 * it holds a character no host name has (a hostile answer).
	 */
	char *text;
};

struct dns_answer
{
	enum dns_status	   status;
	bool			   secure; /* DNSSEC validated */
	bool			   bogus;  /* DNSSEC validation failed (status is TEMPFAIL) */
	unsigned		   ttl;
	size_t			   count;
	struct dns_record *records;
};

struct dns_config
{
	char  *forwarder;	 /* "addr" or "addr@port"; NULL: the system resolver */
	char  *trust_anchor; /* a file of trust anchors; NULL: no validation */
	double timeout;		 /* seconds per lookup */
};

/* [pepsi] DNS_FORWARDER, DNS_TRUST_ANCHOR and DNS_TIMEOUT; false with err. */
bool dns_config_load(const struct pepsi_config *cfg, struct dns_config *out,
					 char *err, size_t errlen);
void dns_config_free(struct dns_config *c);

struct dns_resolver;
struct dns_query;

/* Called once per lookup, unless it was cancelled; a is freed after it returns. */
typedef void (*dns_callback)(void *arg, const struct dns_answer *a);

/*
 * A resolver; loop is where its answers and timers run (NULL for one used
 * only with dns_resolve_sync).  NULL with err if libunbound refuses the
 * configuration.
 */
struct dns_resolver *dns_resolver_new(struct ev_loop *loop, const struct dns_config *c,
									  char *err, size_t errlen);
void				 dns_resolver_free(struct dns_resolver *r);
struct ev_loop		*dns_resolver_loop(const struct dns_resolver *r);

/*
 * A per-message budget: the lookups of one message together may take no
 * longer than until deadline (ev_now time) and no more than lookups_left
 * queries.  A lookup that would overrun it is answered DNS_TIMEOUT.
 */
struct dns_budget
{
	ev_tstamp deadline;
	unsigned  lookups_left;
};

/*
 * Look name up; cb is called from the loop, never from here.  budget may
 * be NULL.  The result identifies the lookup for dns_cancel until cb runs.
 */
struct dns_query *dns_resolve(struct dns_resolver *r, const char *name, enum dns_type type,
							  struct dns_budget *budget, dns_callback cb, void *arg);
/* cb will not be called. */
void dns_cancel(struct dns_query *q);
/*
 * The circuit breaker, for a daemon's resolver: when a lookup waits out
 * its whole timeout and the resolver answered nothing meanwhile, lookups
 * not in the cache are answered DNS_TEMPFAIL at once, and the root's NS
 * asked every probe_interval seconds, until the resolver answers again.
 */
void dns_resolver_breaker(struct dns_resolver *r, double probe_interval);
/* Is the breaker open (the resolver taken to be down)? */
bool dns_resolver_down(const struct dns_resolver *r);
/* Lookups started and not yet answered. */
size_t dns_in_flight(const struct dns_resolver *r);
/* Lookups the resolver's own cache answered (either form), for the tests. */
size_t dns_cache_answered(const struct dns_resolver *r);

/* The blocking form, for stage workers: a must be freed with dns_answer_free. */
void dns_resolve_sync(struct dns_resolver *r, const char *name, enum dns_type type,
					  struct dns_answer *a);
void dns_answer_free(struct dns_answer *a);

/* "4.3.2.1.in-addr.arpa" or the ip6.arpa nibbles for an address; false if ip is not one. */
bool dns_reverse_name(const char *ip, char *out, size_t outlen);

/*
 * A backend instead of libunbound (tests): start begins a lookup and
 * answers it later (from the loop) with dns_query_answer; cancel forgets
 * one.  The resolver keeps the timeouts and the budgets.
 */
struct dns_backend
{
	void (*start)(void *data, struct dns_query *q, const char *name, enum dns_type type);
	void (*cancel)(void *data, struct dns_query *q);
	void *data;
};
struct dns_resolver *dns_resolver_new_backend(struct ev_loop *loop, const struct dns_backend *b,
											  double timeout);
/* Deliver q's answer (the backend keeps ownership of a). */
void dns_query_answer(struct dns_query *q, const struct dns_answer *a);
/* Helpers for a backend building answers. */
void dns_answer_add(struct dns_answer *a, enum dns_type type, const void *rdata, size_t len);

/*
 * Make libunbound context ub ask forwarder ("ADDRESS[@PORT]") alone, a
 * loopback one allowed, the special-use names (test., invalid., ...) left
 * to it.  0, or libunbound's error code.
 */
struct ub_ctx;
int dns_ub_forward(struct ub_ctx *ub, const char *forwarder);

#endif
