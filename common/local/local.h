/*
 * local.h: which domains are ours, and which of their recipients exist
 * (docs/architecture.md 1.1, "the local-recipient resolver").  pepsi-ingress asks at RCPT
 * time, so that mail for a user who does not exist is refused with 550
 * 5.1.1 instead of bounced after acceptance; the route stage uses the same
 * domain list, so ingress and routing never disagree about what is local.
 *
 * The sources ([pepsi] LOCAL_RECIPIENTS, any of):
 *   aliases   a name of [pepsi] ALIASES_FILE (aliases(5))
 *   maildir   a mailbox directory [pepsi] MAILDIR_ROOT/<address, lower case>
 *   virtual   a row of pepsi.virtual_mailbox (pepsi.virtual_mailbox_add)
 * With no source every address of a local domain is taken as existing.
 * postmaster (RFC 5321 4.5.1) and abuse (RFC 2142) always exist.
 */
#ifndef PEPSI_LOCAL_H
#define PEPSI_LOCAL_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "config/config.h"

struct local_resolver;

/*
 * The local domains of section: its own LOCAL_DOMAINS if it has one, else
 * [pepsi] LOCAL_DOMAINS, else [pepsi] HOSTNAME and localhost.  section may
 * be NULL.  The string lives as long as cfg (or is static).
 */
const char *local_domains(const struct pepsi_config *cfg, const char *section);
/* Is domain one of the comma/space separated domains?  An empty domain is. */
bool local_domain_listed(const char *domains, const char *domain);
/* Is the address's domain local (a bare local part such as "postmaster" is)? */
bool local_address_is_local(const char *domains, const char *address);

/* From [pepsi] LOCAL_RECIPIENTS and its sources; NULL with err (file:line) if refused. */
struct local_resolver *local_resolver_new(const struct pepsi_config *cfg, char *err, size_t errlen);
void				   local_resolver_free(struct local_resolver *r);
/* Does the resolver know any source (else every local address exists)? */
bool local_resolver_validates(const struct local_resolver *r);
bool local_resolver_uses_virtual(const struct local_resolver *r);
/* The SQL that lists the virtual mailboxes, and taking its result in. */
extern const char local_virtual_query[];
bool			  local_resolver_set_virtual(struct local_resolver *r, const PGresult *res,
											 char *err, size_t errlen);
/* Blocking load of the virtual mailboxes (stage workers, start-up). */
bool local_resolver_load_virtual(struct local_resolver *r, PGconn *conn,
								 char *err, size_t errlen);
/* For the tests and the fuzz target: the virtual mailboxes from a list. */
void local_resolver_set_virtual_list(struct local_resolver *r, const char *const *addresses,
									 size_t count);

enum local_lookup
{
	LOCAL_RECIPIENT_EXISTS,
	LOCAL_RECIPIENT_UNKNOWN,
	LOCAL_RECIPIENT_UNVERIFIED /* a source it needs could not be read: try later */
};

/*
 * Does the local address exist?  (Its domain is taken to be local.)  Not
 * const: a changed aliases file is read again on the way.
 */
enum local_lookup local_recipient_lookup(struct local_resolver *r, const char *address);

#endif
