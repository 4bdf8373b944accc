/*
 * mta_sts.h: SMTP MTA Strict Transport Security (RFC 8461) for
 * pepsi-stage-relay-to-internet, whose TLS policy (common/smtp/tls_policy.h)
 * enforces what this finds.
 *
 * A domain announces a policy with a TXT record at _mta-sts.<domain>
 * ("v=STSv1; id=..."); the policy itself is fetched over HTTPS (libcurl)
 * from https://mta-sts.<domain>/.well-known/mta-sts.txt, the server's
 * certificate verified, redirects refused (RFC 8461 3.3), the body capped.
 * A policy is cached in the database (pepsi.mta_sts_policy, through the
 * extension's functions mta_sts_policy_get and mta_sts_policy_put) for its
 * max_age, shared by every relay worker; the TXT record's id says when to
 * fetch it again, and a cached policy outlives a vanished TXT record or a
 * failed fetch until it expires (RFC 8461 5.1).
 */
#ifndef PEPSI_MTA_STS_H
#define PEPSI_MTA_STS_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "base/buf.h"
#include "dns/dns.h"

/* A policy body larger than this is refused (RFC 8461 sets no limit; real ones are tiny). */
#define MTA_STS_MAX_BODY (64 * 1024)
/* RFC 8461 3.2: max_age at most 31557600 seconds (a year). */
#define MTA_STS_MAX_AGE 31557600L

enum mta_sts_mode
{
	MTA_STS_NONE,
	MTA_STS_TESTING,
	MTA_STS_ENFORCE
};

struct mta_sts_policy
{
	enum mta_sts_mode mode;
	char			  id[33]; /* the TXT record's id (1*32 alphanumerics) */
	char			**mx;	  /* the mx patterns, "*.example.net" or "mx.example.net" */
	size_t			  nmx;
	long			  max_age; /* seconds */
};

/* How a domain's policy was found. */
enum mta_sts_status
{
	MTA_STS_NO_POLICY, /* no TXT record and nothing cached */
	MTA_STS_FOUND,	   /* out holds the policy (fresh, or cached and still valid) */
	MTA_STS_FAILED	   /* a TXT record but no usable policy: err says why, result the RFC 8460 type */
};

struct mta_sts_options
{
	struct dns_resolver *resolver;
	PGconn				*db;		 /* the cache; NULL: no cache */
	const char			*ca_file;	 /* trust anchors for the HTTPS fetch (NULL: the system's) */
	unsigned			 https_port; /* 443 (tests use another) */
	long				 timeout_ms; /* of the whole fetch */
	/*
	 * Fetch from a policy host on a loopback, private, link-local... address
	 * (public_address.h) too; off, such a fetch is refused with the reason.
	 */
	bool allow_private;
	/*
	 * The cache's answer for the domain, when the caller read it already
	 * (in a round trip it made anyway): then db is only written to.
	 */
	bool		cache_given;
	const char *cached_id; /* NULL: no policy cached */
	const char *cached_policy;
};

/* The domain's policy: TXT, cache, fetch, store. */
enum mta_sts_status mta_sts_lookup(const struct mta_sts_options *o, const char *domain,
								   struct mta_sts_policy *out, char *result, size_t result_len,
								   char *err, size_t errlen);

/* Parse a policy body (RFC 8461 3.2); false with err naming the problem. */
bool mta_sts_parse(const char *text, size_t len, struct mta_sts_policy *out, char *err, size_t errlen);
/* Parse a TXT record "v=STSv1; id=..." (RFC 8461 3.1); false when it is not one. */
bool mta_sts_parse_txt(const char *txt, size_t len, char *id, size_t idlen);
/* Does the policy list this MX host (RFC 8461 4.1: "*." matches one leftmost label)? */
bool		mta_sts_mx_matches(const struct mta_sts_policy *p, const char *mx_host);
void		mta_sts_policy_free(struct mta_sts_policy *p);
const char *mta_sts_mode_name(enum mta_sts_mode mode);

/* Fetch the policy body over HTTPS into body; false with err. */
bool mta_sts_fetch(const struct mta_sts_options *o, const char *domain, struct buf *body, char *err,
				   size_t errlen);

#endif
