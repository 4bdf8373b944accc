/*
 * dmarc.h: DMARC (RFC 7489): the policy of the RFC5322.From domain (or of
 * its organizational domain, by the public suffix list of libpsl), and the
 * verdict from SPF and DKIM results with relaxed or strict alignment,
 * p/sp and pct.
 *
 * Why not libopendmarc: its policy lookup (opendmarc_policy_query_dmarc)
 * is a blocking res_query, and its alignment needs a public suffix file of
 * its own loaded; the record grammar and the alignment rules are small.
 * So the record is fetched on our loop, parsed here (fuzzed), and the
 * organizational domain comes from libpsl for both the lookup and the
 * alignment, so the two can never disagree.
 */
#ifndef PEPSI_AUTH_DMARC_H
#define PEPSI_AUTH_DMARC_H

#include <stdbool.h>
#include <stddef.h>

#include "auth/dkim_verify.h"
#include "auth/spf.h"
#include "dns/dns.h"

enum dmarc_disposition
{
	DMARC_NONE,
	DMARC_QUARANTINE,
	DMARC_REJECT
};

struct dmarc_record
{
	enum dmarc_disposition p;
	enum dmarc_disposition sp;
	bool				   strict_spf;	/* aspf=s */
	bool				   strict_dkim; /* adkim=s */
	int					   pct;
};

struct dmarc_verdict
{
	const char			  *result;		/* pass fail none temperror permerror */
	const char			  *from_domain; /* header.from */
	const char			  *policy;		/* the applicable p or sp: none quarantine reject */
	enum dmarc_disposition disposition; /* what the policy asks for this message (pct applied) */
	const char			  *reason;
	/* Each mechanism on its own, for aggregate reports (RFC 7489 7.2): */
	const char *policy_domain; /* where the record was found: from_domain or its organization's */
	bool		spf_aligned;   /* SPF passed for a domain aligned with from_domain */
	bool		dkim_aligned;  /* a signature of an aligned domain passed */
	int			dkim_reported; /* the signature to report: the aligned one, else the first; -1: none */
};

struct dmarc_check;

typedef void (*dmarc_done_fn)(void *arg);

/*
 * The domain of the message's one From address, lower case; NULL (with
 * why) when there is no From, more than one, or no domain to read.
 */
char *dmarc_from_domain(const char *headers, size_t len, const char **why);

/* Fetch the policy for from_domain; done is called from the loop. */
struct dmarc_check *dmarc_check_start(struct dns_resolver *r, struct dns_budget *budget,
									  const char *from_domain, dmarc_done_fn done, void *arg);
/* Once done: the verdict for these SPF and DKIM results (valid until dmarc_check_free). */
void dmarc_check_evaluate(struct dmarc_check *c, enum spf_result spf,
						  const char						 *spf_domain,
						  const struct dkim_signature_result *sigs, size_t nsigs,
						  struct dmarc_verdict *out);
void dmarc_check_free(struct dmarc_check *c);

/* The record parser (exposed for the fuzz target): false with why. */
bool dmarc_record_parse(const char *text, size_t len, struct dmarc_record *r,
						const char **why);
/* The organizational domain (RFC 7489 3.2); a new string. */
char *dmarc_organizational_domain(const char *domain);

#endif
