/*
 * results.h: the verdicts of message authentication as they travel with
 * the message (state.auth, spec 22.6) and the Authentication-Results
 * header (RFC 8601) written from exactly that state, nothing else.
 *
 * state.auth holds one object per method, each {"result": ..., and the
 * RFC 8601 properties by their names ("smtp.mailfrom", "header.d",
 * "policy.iprev"...), "reason": why}: "auth" (SMTP AUTH), "iprev", "spf"
 * (the MAIL FROM identity, or HELO's for a null sender), "spf_helo",
 * "dkim" (a list, one per signature), "dmarc" (with its "policy" and the
 * "action" taken) and "arc".  Every value may come from a hostile peer;
 * the header writer makes each a token or a quoted string.
 */
#ifndef PEPSI_AUTH_RESULTS_H
#define PEPSI_AUTH_RESULTS_H

#include <jansson.h>

#include "base/buf.h"

/* Append "Authentication-Results: id;\r\n\t...\r\n" for auth to h. */
void auth_results_header(struct buf *h, const char *authserv_id, const json_t *auth);
/*
 * Append only the results, "\t...;\r\n\t...\r\n" (or "\tnone\r\n"): the
 * lines after the authserv-id, which an ARC-Authentication-Results
 * (common/auth/arc.c) carries too.
 */
void auth_results_resinfo(struct buf *h, const json_t *auth);

/* {"result": result} with the given property (NULL: none); for building state.auth. */
json_t *auth_result(const char *result, const char *property, const char *value);

#endif
