/*
 * dmarc_tally.h: ingress's DMARC verdicts, counted in memory and handed to
 * the database in batches for aggregate reports (RFC 7489 7.2,
 * pepsi.dmarc_aggregate, pepsi-dmarc-report(8)): no round trip per
 * message.
 */
#ifndef PEPSI_INGRESS_DMARC_TALLY_H
#define PEPSI_INGRESS_DMARC_TALLY_H

#include <stddef.h>

#include "auth/dkim_verify.h"
#include "auth/dmarc.h"
#include "auth/spf.h"

/*
 * Count one verdict (pass or fail: a policy was found).  action: the
 * disposition applied (none, quarantine, reject); spf_scope: "mfrom" or
 * "helo", as spf_domain is the MAIL FROM's or the HELO's.
 */
void dmarc_tally_add(const struct dmarc_verdict *d, const char *action, const char *client_ip,
					 const char *spf_domain, const char *spf_scope, enum spf_result spf,
					 const struct dkim_signature_result *sigs, size_t nsigs);
/*
 * The counts since the last call, as the JSON array pepsi.dmarc_tally()
 * takes, and forget them; NULL when there is none.  The caller frees it.
 */
char *dmarc_tally_take(void);
/* Add back what dmarc_tally_take gave, when the report that carried it failed. */
void dmarc_tally_return(const char *counts);

#endif
