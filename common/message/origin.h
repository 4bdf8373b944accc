/*
 * origin.h: state.origin.trust, whether a message came from inside the
 * trust boundary (docs/architecture.md 2.4).  Written in one place per
 * writer, never from anything a client sends:
 *
 *   authenticated     pepsi-ingress: the session authenticated (SMTP AUTH)
 *   trusted-network   pepsi-ingress: the client is in TRUSTED_NETWORKS
 *   untrusted         pepsi-ingress: anyone else
 *   local             pepsi-sendmail: local submission
 *   pepsi             mail Pepsi makes itself: DSNs, vacation replies
 *   list              pepsi-stage-list: a post it accepted and sends as the
 *                     list's own mail (state.origin.domain: the list's domain)
 *
 * A row without the field, or with another value, is untrusted.  What
 * trusts it: pepsi-stage-dkim-sign signs only trusted mail (or an
 * untrusted message whose inbound DMARC passed for its From: domain).
 */
#ifndef PEPSI_ORIGIN_H
#define PEPSI_ORIGIN_H

#include <stdbool.h>

#include <jansson.h>

#define ORIGIN_TRUST_AUTHENTICATED "authenticated"
#define ORIGIN_TRUST_TRUSTED_NETWORK "trusted-network"
#define ORIGIN_TRUST_UNTRUSTED "untrusted"
#define ORIGIN_TRUST_LOCAL "local"
#define ORIGIN_TRUST_PEPSI "pepsi"
#define ORIGIN_TRUST_LIST "list"

/* state.origin.trust of state as written, or NULL when there is none. */
const char *origin_trust(const json_t *state);

/* Is the message of state from inside the trust boundary? */
bool origin_trusted(const json_t *state);

/* The list's domain of a list post (trust "list"), which signs it; else NULL. */
const char *origin_list_domain(const json_t *state);

/*
 * The state.origin of a message Pepsi makes itself ("pepsi", and the
 * program that made it): a new reference.
 */
json_t *origin_generated(const char *program);

#endif
