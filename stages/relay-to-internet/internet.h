/*
 * internet.h: what the files of pepsi-stage-relay-to-internet share.
 * internet.c runs a row (split by destination, MX lookup, fusion);
 * schedule.c takes and gives back the destination's slot and keeps the
 * memo of slow destinations; addresses.c finds the addresses of an MX
 * host and of this host; transaction.c tries the hosts and sends the
 * message; session.c keeps the SMTP sessions open across messages;
 * outcome.c maps the replies to each recipient's outcome.
 */
#ifndef PEPSI_INTERNET_H
#define PEPSI_INTERNET_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "delivery/delivery.h"
#include "destination.h"
#include "dns/dns.h"
#include "mx.h"
#include "runtime/stage.h"
#include "smtp/smtp_client.h"

/* The stage's resolver (internet.c makes it) and what identifies this host (addresses.c). */
extern struct dns_resolver *internet_resolver;
extern struct mx_self		internet_self;

/* In the order of ADDRESS_PREFERENCE's choices. */
enum internet_family
{
	FAMILY_IPV6_FIRST,
	FAMILY_IPV4_FIRST,
	FAMILY_IPV4_ONLY,
	FAMILY_IPV6_ONLY
};

/* session.c: the open sessions of this worker. */
struct smtp_client *internet_session_for(const struct smtp_client_options *o, long long cache_size);
void				internet_session_close(const struct smtp_client *client);
void				internet_close_all(void);
/* The session of the delivery whose destination slot is kept (destination_keep), or NULL. */
struct smtp_client *internet_session_kept(void);
void				internet_session_keep(struct smtp_client *client);

/* schedule.c: the destination's slot, and the domains this process saw to be slow. */
bool internet_destination_begin(struct pepsi_ctx *ctx, const char *domain, const struct mx_route *route,
								struct destination_start *start, char *err, size_t errlen);
int	 internet_idle(PGconn *conn, double idle_seconds);
void internet_slow_note(struct pepsi_ctx *ctx, const char *domain, double seconds);
bool internet_slow_recently(const char *domain);
/*
 * Is this TLS result (policy NULL: none to record) the one recorded for
 * domain in pepsi.destination, as far as this worker knows?
 * internet_tls_note: it is now (written, or read by destination_begin).
 */
bool internet_tls_recorded(const char *domain, const char *policy, const char *outcome);
void internet_tls_note(const char *domain, const char *policy, const char *outcome);

/* addresses.c */
void internet_self_load(struct pepsi_ctx *ctx);
bool internet_self_loaded(void);
bool internet_family_allowed(enum internet_family family, const char *address);
bool internet_host_addresses(struct pepsi_ctx *ctx, const char *host, enum internet_family family,
							 struct cached_host *out, char *err, size_t errlen);

/* transaction.c: deliver the row to domain, whose MX hosts are route's. */
int internet_deliver(struct pepsi_ctx *ctx, const char *domain, const struct mx_route *route);

/* outcome.c */
/* Every recipient of the row fared alike, with status and reason (a routing or connection outcome). */
int internet_refuse(struct pepsi_ctx *ctx, enum delivery_class class, const char *status, const char *reason);
int internet_conclude_all(struct pepsi_ctx *ctx, enum delivery_class class, const struct delivery_report *r);
/* Each recipient's outcome of a transaction that reached a host. */
int internet_conclude_transaction(struct pepsi_ctx *ctx, const struct smtp_result *result);

#endif
