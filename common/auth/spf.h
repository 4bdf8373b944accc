/*
 * spf.h: the Sender Policy Framework (RFC 7208): check_host() for one
 * identity (MAIL FROM, or HELO as postmaster@helo), evaluated as a state
 * machine over the asynchronous resolver (common/dns/dns.h), so pepsi-ingress
 * checks the SPF of many sessions at once on one event loop.
 *
 * Why not a library: Debian's libspf2 resolves through its own blocking
 * resolver calls (SPF_dns_resolv), which would stall every session of the
 * loop for as long as the slowest domain's servers take; pyspf and
 * Mail::SPF are not C.  So the evaluator is ours, and it is held to the
 * OpenSPF RFC 7208 test suite (t/071_spf_suite.pl).
 */
#ifndef PEPSI_AUTH_SPF_H
#define PEPSI_AUTH_SPF_H

#include <stdbool.h>

#include "dns/dns.h"

enum spf_result
{
	SPF_NONE,
	SPF_NEUTRAL,
	SPF_PASS,
	SPF_FAIL,
	SPF_SOFTFAIL,
	SPF_TEMPERROR,
	SPF_PERMERROR
};

struct spf_verdict
{
	enum spf_result result;
	/* fail: the domain's explanation (exp=), NULL for the default one */
	const char *explanation;
	/* What decided it: the matching mechanism, or the error, for logs and comments */
	const char *reason;
	const char *domain; /* the domain checked (the identity's) */
};

struct spf_check;

/* Called once, from the loop, unless the check was cancelled first. */
typedef void (*spf_done_fn)(void *arg, const struct spf_verdict *v);

/*
 * Check ip (text, IPv4 or IPv6) against sender's domain; sender is the
 * MAIL FROM address, or "postmaster@<helo>" for the HELO identity (an
 * empty local part becomes "postmaster").  helo and receiver (our host
 * name) serve the %{h} and %{r} macros.  budget may be NULL.
 */
struct spf_check *spf_check_start(struct dns_resolver *r, struct dns_budget *budget,
								  const char *ip, const char *sender, const char *helo,
								  const char *receiver, spf_done_fn done, void *arg);
void			  spf_check_cancel(struct spf_check *c);

/* "pass", "fail"... as RFC 8601 spells them. */
const char *spf_result_name(enum spf_result r);

/*
 * The record parser and the macro expander, exposed for the fuzz target:
 * does text parse as an SPF record (false with the reason), and expand a
 * macro-string against fixed values.
 */
bool  spf_record_valid(const char *text, char *reason, size_t reasonlen);
char *spf_expand_for_test(const char *macro_string, bool explanation);

#endif
