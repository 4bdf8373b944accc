/*
 * pepsi-stage-relay-to-internet: deliver remote mail to the MX hosts of
 * its recipients' domains (RFC 5321 section 5).
 *
 * A row's recipients are first split by domain (and into transactions of
 * at most MAX_RECIPIENTS): each row then goes to one destination, in one
 * transaction whose per-recipient replies are mapped back with split
 * (common/delivery/delivery.h, delivery_each).  Where it goes is mx.h's; which
 * address of which MX host is tried is read from pepsi.dns_address, and
 * whether the destination may be tried now (its concurrency slots, rate
 * limit and backoff) from pepsi.destination (destination.h), so that a
 * destination that is slow or down holds only its own messages, never
 * every worker.  The TLS a connection must have is asked of the policy
 * seam (tls_policy_seam.h) before connecting.  Sessions are kept open
 * across messages, a few per worker, keyed by MX host and address.
 *
 * It runs fused after route (body-free) in route's pass, its body loaded
 * late (common/runtime/stage.h late_load): a message relayed costs one claim, one
 * load and one commit, not two of each.  A domain this process saw to be
 * slow (a delivery there took DESTINATION_SLOW) is not fused for a while:
 * its rows go to this stage's own workers, so that a pass of route's,
 * whose other rows wait for it, is never held by a slow destination.
 *
 * Options: schema/options.def, "pepsi-stage-relay-to-internet".
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "delivery/delivery.h"
#include "destination.h"
#include "dns/dns.h"
#include "mx.h"
#include "runtime/db.h"
#include "runtime/stage.h"
#include "smtp/smtp_client.h"
#include "tls_policy_seam.h"

int pepsi_stage_relay_to_internet_main(int argc, char **argv);

#define INTERNET_SESSIONS_MAX 64

/* The open sessions of this worker, most recently used last. */
struct internet_session
{
	struct smtp_client *client;
	char			   *key;
};
static struct internet_session internet_sessions[INTERNET_SESSIONS_MAX];
static size_t				   internet_nsessions;
/* The session of the delivery whose destination slot is kept (destination_keep), or NULL. */
static struct smtp_client *internet_kept_client;

/* internet_close_all registered with atexit: the worker that ran us may be another stage's. */
static bool internet_close_at_exit;

static struct dns_resolver *internet_resolver;
static struct mx_self		internet_self;
static bool					internet_self_loaded;

/* In the order of ADDRESS_PREFERENCE's choices. */
enum internet_family
{
	FAMILY_IPV6_FIRST,
	FAMILY_IPV4_FIRST,
	FAMILY_IPV4_ONLY,
	FAMILY_IPV6_ONLY
};

/* ---------------------------------------------------------------------------
 * Sessions
 * ------------------------------------------------------------------------- */

static void
internet_close_all(void)
{
	for (size_t i = 0; i < internet_nsessions; i++)
	{
		smtp_client_free(internet_sessions[i].client);
		free(internet_sessions[i].key);
	}
	internet_nsessions = 0;
	internet_kept_client = NULL;
}

/* The session for these options: an open one, or a new one (the oldest goes when full). */
static struct smtp_client *
internet_session_for(const struct smtp_client_options *o, long long cache_size)
{
	char				   *key = xasprintf("%s|%s|%s|%d|%s|%s|%d|%d|%d|%d", o->host, o->address, o->port, (int) o->tls,
							o->tls_name ? o->tls_name : "", o->helo_name, o->connect_timeout_ms,
											o->command_timeout_ms, o->max_messages_per_connection, o->max_idle_ms);
	size_t					limit = cache_size < 1 ? 1 : cache_size > INTERNET_SESSIONS_MAX ? INTERNET_SESSIONS_MAX
																							: (size_t) cache_size;
	struct internet_session found;

	for (size_t i = 0; i < internet_nsessions; i++)
		if (strcmp(internet_sessions[i].key, key) == 0)
		{
			found = internet_sessions[i];
			memmove(&internet_sessions[i], &internet_sessions[i + 1],
					(internet_nsessions - i - 1) * sizeof(found));
			internet_sessions[internet_nsessions - 1] = found;
			free(key);
			return found.client;
		}
	while (internet_nsessions >= limit)
	{
		if (internet_sessions[0].client == internet_kept_client)
			internet_kept_client = NULL;
		smtp_client_free(internet_sessions[0].client);
		free(internet_sessions[0].key);
		memmove(&internet_sessions[0], &internet_sessions[1], (internet_nsessions - 1) * sizeof(found));
		internet_nsessions--;
	}
	if (!internet_close_at_exit)
		internet_close_at_exit = atexit(internet_close_all) == 0;
	found.client = smtp_client_new(o);
	found.key = key;
	internet_sessions[internet_nsessions++] = found;
	return found.client;
}

/* Close and forget a session (its destination is contended: no idle session to it). */
static void
internet_session_close(const struct smtp_client *client)
{
	if (client == internet_kept_client)
		internet_kept_client = NULL;
	for (size_t i = 0; i < internet_nsessions; i++)
		if (internet_sessions[i].client == client)
		{
			smtp_client_free(internet_sessions[i].client);
			free(internet_sessions[i].key);
			memmove(&internet_sessions[i], &internet_sessions[i + 1],
					(internet_nsessions - i - 1) * sizeof(internet_sessions[0]));
			internet_nsessions--;
			return;
		}
}

/* ---------------------------------------------------------------------------
 * Destinations this process saw to be slow: not fused (see the top)
 * ------------------------------------------------------------------------- */

#define INTERNET_SLOW_DOMAINS 16
#define INTERNET_SLOW_MEMO_SECONDS 60.0

static struct
{
	char  *domain; /* in A-labels */
	double seen_at;
} internet_slow[INTERNET_SLOW_DOMAINS];

/* A delivery to domain took seconds: remember it if that is slow (the oldest entry goes). */
static void
internet_slow_note(struct pepsi_ctx *ctx, const char *domain, double seconds)
{
	double slow = pepsi_option_seconds(ctx, "DESTINATION_SLOW");
	size_t at = 0;

	if (slow <= 0 || seconds < slow)
		return;
	for (size_t i = 0; i < INTERNET_SLOW_DOMAINS; i++)
	{
		if (internet_slow[i].domain && strcasecmp(internet_slow[i].domain, domain) == 0)
		{
			at = i;
			break;
		}
		if (internet_slow[i].seen_at < internet_slow[at].seen_at)
			at = i;
	}
	if (internet_slow[at].domain == NULL || strcasecmp(internet_slow[at].domain, domain) != 0)
	{
		free(internet_slow[at].domain);
		internet_slow[at].domain = xstrdup(domain);
	}
	internet_slow[at].seen_at = destination_now();
}

static bool
internet_slow_recently(const char *domain)
{
	double now = destination_now();

	for (size_t i = 0; i < INTERNET_SLOW_DOMAINS; i++)
		if (internet_slow[i].domain && now - internet_slow[i].seen_at < INTERNET_SLOW_MEMO_SECONDS
			&& strcasecmp(internet_slow[i].domain, domain) == 0)
			return true;
	return false;
}

/* ---------------------------------------------------------------------------
 * What is this host: its name and the addresses it takes mail on
 * ------------------------------------------------------------------------- */

static void
internet_self_add(char ***list, size_t *n, const char *address)
{
	*list = xrealloc(*list, (*n + 2) * sizeof(char *));
	(*list)[(*n)++] = xstrdup(address);
	(*list)[*n] = NULL;
}

/*
 * The addresses of the listeners on SMTP_PORT: an MX host at one of them
 * is this host.  A listener on every address contributes the interfaces'.
 */
static void
internet_self_load(struct pepsi_ctx *ctx)
{
	const struct pepsi_config *cfg = pepsi_config(ctx);
	long long				   port = pepsi_option_int(ctx, "SMTP_PORT");
	char					 **list = NULL;
	size_t					   n = 0;
	bool					   wildcard = false;
	const char				  *listeners[64];
	size_t					   nlisteners = config_sections(cfg, "listener-", listeners, 64);

	internet_self.hostname = config_hostname(cfg);
	for (size_t s = 0; s < nlisteners; s++)
	{
		const char *section = listeners[s];
		const char *address;
		const char *listen_port;

		address = config_get(cfg, section, "ADDRESS");
		listen_port = config_get(cfg, section, "PORT");
		if ((listen_port ? atoll(listen_port) : 25) != port)
			continue;
		if (address == NULL || strcmp(address, "*") == 0 || strcmp(address, "0.0.0.0") == 0
			|| strcmp(address, "::") == 0)
			wildcard = true;
		else
			internet_self_add(&list, &n, address);
	}
	if (wildcard)
	{
		struct ifaddrs *ifs;

		if (getifaddrs(&ifs) == 0)
		{
			for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
			{
				char text[INET6_ADDRSTRLEN];

				if (i->ifa_addr == NULL)
					continue;
				if (i->ifa_addr->sa_family == AF_INET
					&& inet_ntop(AF_INET, &((struct sockaddr_in *) i->ifa_addr)->sin_addr, text, sizeof(text)))
					internet_self_add(&list, &n, text);
				else if (i->ifa_addr->sa_family == AF_INET6
						 && inet_ntop(AF_INET6, &((struct sockaddr_in6 *) i->ifa_addr)->sin6_addr, text,
									  sizeof(text)))
					internet_self_add(&list, &n, text);
			}
			freeifaddrs(ifs);
		}
	}
	internet_self.addresses = list;
	internet_self_loaded = true;
}

/* ---------------------------------------------------------------------------
 * Recipients: one destination per row
 * ------------------------------------------------------------------------- */

static const char *
internet_domain_of(const char *address)
{
	const char *at = strrchr(address, '@');

	return at ? at + 1 : "";
}

/*
 * Split the row so that it keeps the recipients of its first recipient's
 * domain (at most max of them); the others go to sibling rows here, one
 * per domain and transaction.  0 when nothing had to move.
 */
static int
internet_split_by_destination(struct pepsi_ctx *ctx, long long max)
{
	size_t	n = pepsi_rcpt_count(ctx);
	int	   *group_of = xcalloc(n, sizeof(int)); /* 0: unassigned */
	int	   *keep = xcalloc(n, sizeof(int));
	size_t	nkeep = 0;
	json_t *groups = json_array();
	int		rc = 0;

	for (size_t i = 0; i < n; i++)
	{
		json_t *indices;
		size_t	in_group = 0;

		if (group_of[i])
			continue;
		indices = json_array();
		for (size_t j = i; j < n; j++)
			if (!group_of[j]
				&& strcasecmp(internet_domain_of(pepsi_rcpt(ctx, i)), internet_domain_of(pepsi_rcpt(ctx, j))) == 0)
			{
				if ((long long) in_group == max)
					break;
				group_of[j] = 1;
				in_group++;
				if (i == 0)
					keep[nkeep++] = (int) j + 1;
				else
					json_array_append_new(indices, json_integer((json_int_t) j + 1));
			}
		/* (recipients of the domain beyond max start a group of their own further on) */
		if (i == 0)
			json_decref(indices);
		else
			json_array_append_new(groups, json_pack("{s:o}", "rcpt_indices", indices));
	}
	if (json_array_size(groups) > 0)
		rc = pepsi_fan_out(ctx, keep, nkeep, groups);
	json_decref(groups);
	free(keep);
	free(group_of);
	return rc < 0 ? -1 : 0;
}

/* ---------------------------------------------------------------------------
 * Outcomes
 * ------------------------------------------------------------------------- */

/* Every recipient of the row fared alike (a routing or connection outcome). */
static int
internet_conclude_all(struct pepsi_ctx *ctx, enum delivery_class class, const struct delivery_report *r)
{
	size_t					 n = pepsi_rcpt_count(ctx);
	struct delivery_outcome *outcomes = xcalloc(n, sizeof(*outcomes));
	int						 rc;

	for (size_t i = 0; i < n; i++)
	{
		outcomes[i].class = class;
		outcomes[i].report = *r;
	}
	rc = delivery_each(ctx, outcomes, "relayed", false);
	free(outcomes);
	return rc;
}

static int
internet_refuse(struct pepsi_ctx *ctx, enum delivery_class class, const char *status, const char *reason)
{
	char				  *diagnostic = xasprintf("X-Pepsi; %s", reason);
	struct delivery_report r = {.status = status, .diagnostic = diagnostic};
	int					   rc = internet_conclude_all(ctx, class, &r);

	free(diagnostic);
	return rc;
}

static enum delivery_class
internet_class_of(int code)
{
	return code / 100 == 2 ? DELIVERY_SENT : code / 100 == 5 ? DELIVERY_BOUNCED
															 : DELIVERY_DEFERRED;
}

/* Each recipient's outcome of a transaction that reached a host. */
static int
internet_conclude_transaction(struct pepsi_ctx *ctx, const struct smtp_result *result)
{
	size_t					 n = pepsi_rcpt_count(ctx);
	struct delivery_outcome *outcomes = xcalloc(n, sizeof(*outcomes));
	struct buf				*diagnostics = xcalloc(n + 1, sizeof(struct buf));
	char(*statuses)[16] = xcalloc(n + 1, sizeof(*statuses));
	enum delivery_class overall = result->outcome == SMTP_DELIVERED	  ? DELIVERY_SENT
								  : result->outcome == SMTP_PERMANENT ? DELIVERY_BOUNCED
																	  : DELIVERY_DEFERRED;
	int					rc;

	for (size_t i = 0; i < n; i++)
	{
		const struct smtp_reply *rcpt = i < result->nrcpt ? &result->rcpt_replies[i] : NULL;

		if (rcpt && rcpt->code > 0 && rcpt->code / 100 != 2)
		{
			/* Its own RCPT reply decided. */
			outcomes[i].class = internet_class_of(rcpt->code);
			delivery_report_from_smtp(result, rcpt, &outcomes[i].report, statuses[i], sizeof(statuses[i]),
									  &diagnostics[i]);
		}
		else
		{
			outcomes[i].class = overall;
			delivery_report_from_smtp(result, NULL, &outcomes[i].report, statuses[i], sizeof(statuses[i]),
									  &diagnostics[i]);
		}
	}
	rc = delivery_each(ctx, outcomes, result->dsn_passed ? "delivered" : "relayed", result->dsn_passed);
	for (size_t i = 0; i < n; i++)
		buf_free(&diagnostics[i]);
	free(diagnostics);
	free(statuses);
	free(outcomes);
	return rc;
}

/* ---------------------------------------------------------------------------
 * Addresses of an MX host: pepsi.dns_address, refreshed from the DNS
 * ------------------------------------------------------------------------- */

static bool
internet_family_allowed(enum internet_family family, const char *address)
{
	bool v6 = strchr(address, ':') != NULL;

	return !(family == FAMILY_IPV4_ONLY && v6) && !(family == FAMILY_IPV6_ONLY && !v6);
}

/* Resolve host's A and AAAA records and store them; false when the DNS gave none. */
static bool
internet_resolve_host(struct pepsi_ctx *ctx, const char *host, enum internet_family family, char *err,
					  size_t errlen)
{
	static const enum dns_type types[2] = {DNS_TYPE_A, DNS_TYPE_AAAA};
	char					 **addresses = NULL;
	size_t					   n = 0;
	unsigned				   ttl = 3600;
	bool					   ok;

	for (int t = 0; t < 2; t++)
	{
		struct dns_answer a;

		if ((types[t] == DNS_TYPE_A && family == FAMILY_IPV6_ONLY)
			|| (types[t] == DNS_TYPE_AAAA && family == FAMILY_IPV4_ONLY))
			continue;
		dns_resolve_sync(internet_resolver, host, types[t], &a);
		if (a.status == DNS_OK)
			for (size_t i = 0; i < a.count; i++)
			{
				char text[INET6_ADDRSTRLEN];

				if (a.records[i].type == DNS_TYPE_A && a.records[i].rdata_len == 4)
					inet_ntop(AF_INET, a.records[i].rdata, text, sizeof(text));
				else if (a.records[i].type == DNS_TYPE_AAAA && a.records[i].rdata_len == 16)
					inet_ntop(AF_INET6, a.records[i].rdata, text, sizeof(text));
				else
					continue;
				if (n >= 32)
					break; /* an absurd answer: the first are enough */
				addresses = xrealloc(addresses, (n + 1) * sizeof(char *));
				addresses[n++] = xstrdup(text);
				if (a.ttl < ttl)
					ttl = a.ttl;
			}
		else if (a.status != DNS_NXDOMAIN)
			snprintf(err, errlen, "cannot look up the address of %s: the DNS did not answer", host);
		dns_answer_free(&a);
	}
	if (n == 0)
	{
		if (err[0] == '\0')
			snprintf(err, errlen, "the MX host %s has no address", host);
		free(addresses);
		return false;
	}
	/* A zero TTL still spares the next message of this pass the lookup. */
	ok = destination_store_addresses(pepsi_db(ctx), host, addresses, n, ttl < 5 ? 5 : ttl, err, errlen);
	for (size_t i = 0; i < n; i++)
		free(addresses[i]);
	free(addresses);
	return ok;
}

static enum internet_family internet_sort_family;

static int
internet_address_compare(const void *a, const void *b)
{
	const struct cached_address *x = a;
	const struct cached_address *y = b;
	bool						 x6 = strchr(x->address, ':') != NULL;
	bool						 y6 = strchr(y->address, ':') != NULL;

	if ((x->retry_in > 0) != (y->retry_in > 0))
		return x->retry_in > 0 ? 1 : -1;
	if (x6 != y6)
		return (x6 == (internet_sort_family == FAMILY_IPV6_FIRST)) ? -1 : 1;
	return x->failures - y->failures;
}

/*
 * The addresses of host worth trying now, best first: from
 * pepsi.dns_address while they are within their TTL and not all failing,
 * else from the DNS afresh.
 */
static bool
internet_host_addresses(struct pepsi_ctx *ctx, const char *host, enum internet_family family,
						struct cached_host *out, char *err, size_t errlen)
{
	size_t usable = 0;

	if (!destination_cached_addresses(pepsi_db(ctx), host, out, err, errlen))
		return false;
	for (size_t i = 0; i < out->count; i++)
		if (out->addresses[i].retry_in <= 0 && internet_family_allowed(family, out->addresses[i].address))
			usable++;
	if (usable == 0)
	{
		destination_cached_free(out);
		if (!internet_resolve_host(ctx, host, family, err, errlen))
			return false;
		if (!destination_cached_addresses(pepsi_db(ctx), host, out, err, errlen))
			return false;
	}
	internet_sort_family = family;
	qsort(out->addresses, out->count, sizeof(*out->addresses), internet_address_compare);
	return true;
}

/* ---------------------------------------------------------------------------
 * The delivery
 * ------------------------------------------------------------------------- */

/* The recipients as sent: an IDN domain in A-labels when the local part is ASCII. */
static char **
internet_wire_recipients(struct pepsi_ctx *ctx, const char *ascii_domain)
{
	size_t n = pepsi_rcpt_count(ctx);
	char **rcpt = xcalloc(n + 1, sizeof(char *));

	for (size_t i = 0; i < n; i++)
	{
		const char *address = pepsi_rcpt(ctx, i);
		const char *at = strrchr(address, '@');
		bool		ascii_local = true;

		for (const char *p = address; at && p < at; p++)
			if ((unsigned char) *p >= 0x80)
				ascii_local = false;
		if (at && ascii_local)
			rcpt[i] = xasprintf("%.*s@%s", (int) (at - address), address, ascii_domain);
		else
			rcpt[i] = xstrdup(address);
	}
	return rcpt;
}

/* Did this attempt fail before any transaction: try the next address? */
static bool
internet_host_failed(const struct smtp_result *r)
{
	if (r->outcome == SMTP_DELIVERED)
		return false;
	return r->phase == SMTP_PHASE_CONNECT || r->phase == SMTP_PHASE_GREETING || r->phase == SMTP_PHASE_EHLO
		   || r->phase == SMTP_PHASE_STARTTLS;
}

struct internet_attempt
{
	struct smtp_result	result;
	bool				have_result; /* a session was tried */
	bool				connected;	 /* a host took a transaction */
	bool				refused;	 /* some host refused or dropped us before a transaction */
	bool				try_later;	 /* some host said 421 before a transaction: too busy now */
	bool				loop;		 /* the best MX host is this host (by address) */
	char				error[1200]; /* why no host could be reached */
	char				ok_host[256];
	char				ok_address[INET6_ADDRSTRLEN];
	struct smtp_client *client; /* the session that reached it */
	struct buf			failed_hosts;
	struct buf			failed_addresses;
	double				retry_in; /* when nothing was tried: the soonest address retry */
};

static void
internet_try_hosts(struct pepsi_ctx *ctx, const char *domain, const struct mx_route *route,
				   const struct smtp_envelope *env, const struct buf *raw, struct internet_attempt *at)
{
	enum internet_family family = (enum internet_family) pepsi_option_enum(ctx, "ADDRESS_PREFERENCE");
	long long			 attempts_left = pepsi_option_int(ctx, "MAX_ADDRESSES");
	const char			*helo_name = pepsi_option(ctx, "HELO_NAME");
	char				 port[16];

	if (helo_name == NULL)
		helo_name = config_hostname(pepsi_config(ctx));
	snprintf(port, sizeof(port), "%lld", pepsi_option_int(ctx, "SMTP_PORT"));
	buf_append_str(&at->failed_hosts, "{");
	buf_append_str(&at->failed_addresses, "{");
	at->retry_in = -1;
	for (size_t h = 0; h < route->nhosts && attempts_left > 0 && !at->connected; h++)
	{
		const char				  *host = route->hosts[h].name;
		struct cached_host		   addresses;
		struct internet_tls_policy policy;
		char					   err[300] = "";

		if (!internet_host_addresses(ctx, host, family, &addresses, err, sizeof(err)))
		{
			snprintf(at->error, sizeof(at->error), "%s", err);
			continue;
		}
		internet_tls_policy_lookup(ctx, internet_resolver, domain, host, route->secure, &policy);
		if (policy.refuse)
		{
			snprintf(at->error, sizeof(at->error), "%s", policy.reason);
			internet_tls_policy_free(&policy);
			destination_cached_free(&addresses);
			continue;
		}
		for (size_t a = 0; a < addresses.count && attempts_left > 0 && !at->connected; a++)
		{
			const struct cached_address *address = &addresses.addresses[a];
			struct smtp_client_options	 o = {0};
			struct smtp_client			*client;

			if (!internet_family_allowed(family, address->address))
				continue;
			if (mx_address_is_self(&internet_self, address->address))
			{
				/* Only the hosts preferred to this one are worth trying (RFC 5321 5.1). */
				if (route->hosts[h].preference == route->hosts[0].preference && !at->have_result)
					at->loop = true;
				snprintf(at->error, sizeof(at->error), "mail for %s loops back to myself (%s is %s)",
						 domain, host, address->address);
				internet_tls_policy_free(&policy);
				destination_cached_free(&addresses);
				return;
			}
			if (address->retry_in > 0)
			{
				if (at->retry_in < 0 || address->retry_in < at->retry_in)
					at->retry_in = address->retry_in;
				if (at->error[0] == '\0')
					snprintf(at->error, sizeof(at->error),
							 "every address of %s's MX hosts failed recently (%s: %d failures)", domain,
							 address->address, address->failures);
				continue;
			}
			o.host = host;
			o.address = address->address;
			o.port = port;
			o.helo_name = helo_name;
			o.connect_timeout_ms = (int) (pepsi_option_seconds(ctx, "CONNECT_TIMEOUT") * 1000);
			o.command_timeout_ms = (int) (pepsi_option_seconds(ctx, "TIMEOUT") * 1000);
			o.max_messages_per_connection = (int) pepsi_option_int(ctx, "REUSE_MESSAGES");
			o.max_idle_ms = (int) (pepsi_option_seconds(ctx, "REUSE_IDLE") * 1000);
			internet_tls_policy_apply(&policy, &o);
			client = internet_session_for(&o, pepsi_option_int(ctx, "SESSION_CACHE"));
			internet_tls_policy_attach(&policy, client);
			if (at->have_result)
				smtp_result_free(&at->result);
			smtp_client_send(client, env, raw->data, raw->len, &at->result);
			at->have_result = true;
			attempts_left--;
			if (!internet_host_failed(&at->result))
			{
				at->connected = true;
				at->client = client;
				snprintf(at->ok_host, sizeof(at->ok_host), "%s", host);
				snprintf(at->ok_address, sizeof(at->ok_address), "%s", address->address);
				break;
			}
			at->refused = true;
			if (at->result.reply.code == 421)
				at->try_later = true;
			if (at->result.reply.code >= 400 && !at->result.error[0])
				snprintf(at->error, sizeof(at->error), "%s said %d %s", at->result.relay,
						 at->result.reply.code, at->result.reply.text.data ? at->result.reply.text.data : "");
			else
				snprintf(at->error, sizeof(at->error), "%s", at->result.error);
			if (at->result.phase == SMTP_PHASE_CONNECT)
			{
				destination_forget(host);
				db_array_append(&at->failed_hosts, host);
				db_array_append(&at->failed_addresses, address->address);
			}
		}
		internet_tls_policy_free(&policy);
		destination_cached_free(&addresses);
	}
	buf_append_str(&at->failed_hosts, "}");
	buf_append_str(&at->failed_addresses, "}");
}

/*
 * destination_begin for domain, whose MX hosts are route's.  A session
 * kept with the slot of a contended destination is closed when the slot
 * goes (the destination counts an idle connection as a busy one); to the
 * same domain, slot and session carry on.
 */
static bool
internet_destination_begin(struct pepsi_ctx *ctx, const char *domain, const struct mx_route *route,
						   struct destination_start *start, char *err, size_t errlen)
{
	const char		  **hosts = xcalloc(route->nhosts + 1, sizeof(char *));
	bool				kept_contended;
	const char		   *kept = destination_kept_domain(&kept_contended);
	bool				same = kept && strcasecmp(kept, domain) == 0;
	struct smtp_client *kept_client = internet_kept_client;
	bool				ok;

	struct destination_share share = {
		.default_concurrency = pepsi_option_int(ctx, "DESTINATION_CONCURRENCY"),
		.slow_seconds = pepsi_option_seconds(ctx, "DESTINATION_SLOW"),
		/* (rounded up: a slow destination keeps a slot of a small stage) */
		.slow_limit = (pepsi_option_int(ctx, "PARALLELISM") * pepsi_option_int(ctx, "DESTINATION_SLOW_SHARE") + 99)
					  / 100,
		.handoff_seconds = pepsi_option_seconds(ctx, "DESTINATION_HANDOFF"),
		.stage = pepsi_stage_name(ctx),
	};

	/*
	 * To another domain, the session goes before the slot: a waiter given
	 * the slot at once must not find the destination's connections full.
	 */
	if (kept_client && kept_contended && !same)
	{
		internet_session_close(kept_client);
		kept_client = NULL;
	}
	for (size_t i = 0; i < route->nhosts; i++)
		hosts[i] = route->hosts[i].name;
	ok = destination_begin(pepsi_db(ctx), domain, &share, hosts, route->nhosts, start, err, errlen);
	free(hosts);
	internet_kept_client = NULL;
	if (kept_client && kept_contended && !(ok && same && start->slot >= 0))
		internet_session_close(kept_client);
	if (ok)
		internet_tls_policy_sts_cached(domain, start->sts_policy_id, start->sts_policy);
	return ok;
}

/* The worker has no row to work on: after a short grace, the kept slot goes. */
#define INTERNET_KEEP_GRACE_MS 200

static int
internet_idle(PGconn *conn, double idle_seconds)
{
	bool		contended;
	const char *kept = destination_kept_domain(&contended);
	char		err[512];

	if (kept == NULL)
		return -1;
	if (idle_seconds * 1000 < INTERNET_KEEP_GRACE_MS)
		return INTERNET_KEEP_GRACE_MS - (int) (idle_seconds * 1000);
	/* (The session first, as internet_destination_begin does.) */
	if (contended && internet_kept_client)
		internet_session_close(internet_kept_client);
	internet_kept_client = NULL;
	if (!destination_release(conn, err, sizeof(err)))
		log_warnx("%s", err);
	return -1;
}

static int
internet_deliver(struct pepsi_ctx *ctx, const char *domain, const struct mx_route *route)
{
	PGconn					*conn = pepsi_db(ctx);
	json_t					*origin = json_object_get(pepsi_state(ctx), "origin");
	const char				*body = json_string_value(json_object_get(origin, "body"));
	size_t					 n = pepsi_rcpt_count(ctx);
	char				   **rcpt;
	const char			   **notify = xcalloc(n + 1, sizeof(char *));
	const char			   **orcpt = xcalloc(n + 1, sizeof(char *));
	struct smtp_envelope	 env = {0};
	struct internet_attempt	 at;
	struct destination_end	 end = {0};
	struct buf				 raw = BUF_INIT;
	char					 err[512];
	struct destination_start start;
	bool					 contended = false;
	bool					 ended;
	double					 begun_at;
	int						 rc;

	if (!internet_destination_begin(ctx, domain, route, &start, err, sizeof(err)))
	{
		free(notify);
		free(orcpt);
		return pepsi_error(ctx, "%s", err);
	}
	/* The destination's pace is its deliveries' time, not the wait for a slot. */
	begun_at = pepsi_pass_seconds(ctx);
	if (start.slot < 0)
	{
		struct delivery_report r = {.status = "4.4.5", .diagnostic = start.reason};

		free(notify);
		free(orcpt);
		/* A little jitter, so that waiters given the same time do not come back at once. */
		rc = delivery_postponed(ctx, &r, start.wait * (1.0 + 0.1 * ((double) random() / RAND_MAX)) + 0.05);
		destination_start_free(&start);
		return rc;
	}
	if (!pepsi_raw_message(ctx, &raw))
	{
		free(notify);
		free(orcpt);
		destination_unlock(conn, domain, start.slot);
		destination_start_free(&start);
		return -1;
	}
	rcpt = internet_wire_recipients(ctx, domain);
	for (size_t i = 0; i < n; i++)
	{
		notify[i] = delivery_notify(ctx, i);
		orcpt[i] = delivery_orcpt(ctx, i);
	}
	env.mail_from = pepsi_mail_from(ctx);
	env.rcpt = (const char *const *) rcpt;
	env.nrcpt = n;
	env.notify = notify;
	env.orcpt = orcpt;
	env.ret = delivery_dsn_param(ctx, "ret");
	env.envid = delivery_dsn_param(ctx, "envid");
	env.body_8bit = body && strcasecmp(body, "8BITMIME") == 0;
	env.smtputf8 = json_is_true(json_object_get(origin, "smtputf8"));
	env.requiretls = json_is_true(json_object_get(origin, "requiretls"));

	memset(&at, 0, sizeof(at));
	internet_try_hosts(ctx, domain, route, &env, &raw, &at);

	/*
	 * A refusal while other workers deliver there (or a 421: "try later")
	 * is the destination's limit, not its death.
	 */
	end.outcome = at.connected										 ? "connected"
				  : (at.refused && (start.slot > 0 || at.try_later)) ? "busy"
																	 : "unreachable";
	end.error = at.connected ? NULL : at.error;
	end.ok_host = at.connected ? at.ok_host : NULL;
	end.ok_address = at.connected ? at.ok_address : NULL;
	end.failed_hosts = &at.failed_hosts;
	end.failed_addresses = &at.failed_addresses;
	end.backoff_after = pepsi_option_int(ctx, "DESTINATION_BACKOFF_AFTER");
	end.backoff_base = pepsi_option_seconds(ctx, "DESTINATION_BACKOFF_BASE");
	end.backoff_max = pepsi_option_seconds(ctx, "DESTINATION_BACKOFF_MAX");
	end.seconds = pepsi_pass_seconds(ctx) - begun_at;
	if (at.loop)
		end.outcome = "connected"; /* nothing is wrong with the destination */
	if (at.connected)
		internet_slow_note(ctx, domain, end.seconds);
	if (strcmp(end.outcome, "connected") == 0 && at.failed_addresses.len <= 2)
	{
		/*
		 * Recorded by the next begin (or when idle); the slot goes on with
		 * the session.  (Addresses that failed on the way are recorded at
		 * once, below, for the other workers to pass over.)
		 */
		destination_keep(domain, start.slot, end.ok_host, end.ok_address, end.seconds, start.contended);
		internet_kept_client = at.client;
		pepsi_when_idle(ctx, internet_idle);
		ended = true;
	}
	else
		ended = destination_end(conn, domain, start.slot, &end, &contended, err, sizeof(err));
	if (!ended)
		rc = pepsi_error(ctx, "%s", err);
	else if (at.loop)
		rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.4.6", at.error);
	else if (at.connected)
		rc = internet_conclude_transaction(ctx, &at.result);
	else if (!at.have_result && at.retry_in > 0)
	{
		/* Nothing tried: every address is waiting out its failures. */
		struct delivery_report r = {.status = "4.4.1", .diagnostic = at.error};

		rc = delivery_postponed(ctx, &r, at.retry_in + 1.0 * ((double) random() / RAND_MAX));
	}
	else if (strcmp(end.outcome, "busy") == 0)
	{
		char				  *diagnostic = xasprintf("X-Pepsi; %s (the destination is at its limit)", at.error);
		struct delivery_report r = {.status = "4.4.5", .diagnostic = diagnostic};

		rc = delivery_postponed(ctx, &r, 0.5 + 1.0 * ((double) random() / RAND_MAX));
		free(diagnostic);
	}
	else if (at.have_result)
	{
		char				   status[16];
		struct buf			   diagnostic = BUF_INIT;
		struct delivery_report r;

		delivery_report_from_smtp(&at.result, NULL, &r, status, sizeof(status), &diagnostic);
		rc = internet_conclude_all(ctx, DELIVERY_DEFERRED, &r);
		buf_free(&diagnostic);
	}
	else
		rc = internet_refuse(ctx, DELIVERY_DEFERRED, "4.4.3",
							 at.error[0] ? at.error : "no MX host of the domain has an address");
	destination_start_free(&start);
	if (at.have_result)
		smtp_result_free(&at.result);
	buf_free(&at.failed_hosts);
	buf_free(&at.failed_addresses);
	for (size_t i = 0; i < n; i++)
		free(rcpt[i]);
	free(rcpt);
	free(notify);
	free(orcpt);
	buf_free(&raw);
	return rc;
}

static bool
internet_resolver_ready(struct pepsi_ctx *ctx, char *err, size_t errlen)
{
	struct dns_config dns;

	if (internet_resolver)
		return true;
	if (!dns_config_load(pepsi_config(ctx), &dns, err, errlen))
		return false;
	internet_resolver = dns_resolver_new(NULL, &dns, err, errlen);
	dns_config_free(&dns);
	return internet_resolver != NULL;
}

static int
internet_run(struct pepsi_ctx *ctx)
{
	struct mx_route route;
	char			err[300];
	char		   *domain;
	int				rc;

	if (internet_split_by_destination(ctx, pepsi_option_int(ctx, "MAX_RECIPIENTS")) < 0)
		return -1;
	if (!internet_self_loaded)
		internet_self_load(ctx);
	domain = mx_domain_to_ascii(internet_domain_of(pepsi_rcpt(ctx, 0)));
	if (domain == NULL)
	{
		char *reason = xasprintf("\"%s\" is not a valid domain name", internet_domain_of(pepsi_rcpt(ctx, 0)));

		rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.1.2", reason);
		free(reason);
		return rc;
	}
	if (!internet_resolver_ready(ctx, err, sizeof(err)))
	{
		log_warnx("[stage-%s]: %s", pepsi_stage_name(ctx), err);
		free(domain);
		return internet_refuse(ctx, DELIVERY_DEFERRED, "4.3.5", err);
	}
	mx_route_lookup(internet_resolver, domain, &internet_self, (size_t) pepsi_option_int(ctx, "MAX_MX_HOSTS"),
					&route);
	switch (route.status)
	{
		case MX_OK:
			rc = internet_deliver(ctx, domain, &route);
			break;
		case MX_NULL:
			rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.1.10", route.reason);
			break;
		case MX_LOOP:
			rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.4.6", route.reason);
			break;
		case MX_NO_HOST:
		case MX_INVALID:
			rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.1.2", route.reason);
			break;
		default:
			rc = internet_refuse(ctx, DELIVERY_DEFERRED, "4.4.3", route.reason);
			break;
	}
	mx_route_free(&route);
	free(domain);
	return rc;
}

/*
 * A row that must be split first (several destinations) cannot run fused,
 * nor one to a domain this process saw to be slow.
 */
static bool
internet_can_fuse(struct pepsi_ctx *ctx)
{
	size_t n = pepsi_rcpt_count(ctx);
	char  *domain;
	bool   slow;

	if ((long long) n > pepsi_option_int(ctx, "MAX_RECIPIENTS"))
		return false;
	for (size_t i = 1; i < n; i++)
		if (strcasecmp(internet_domain_of(pepsi_rcpt(ctx, 0)), internet_domain_of(pepsi_rcpt(ctx, i))) != 0)
			return false;
	domain = mx_domain_to_ascii(internet_domain_of(pepsi_rcpt(ctx, 0)));
	slow = domain && internet_slow_recently(domain);
	free(domain);
	return !slow;
}

const struct pepsi_stage pepsi_stage_relay_to_internet_stage = {
	.program = "pepsi-stage-relay-to-internet",
	.load = PEPSI_LOAD_FULL,
	.run = internet_run,
	.can_fuse = internet_can_fuse,
	/* After route (body-free), in the same pass: its body loaded then, not a second claim. */
	.late_load = true,
};

int
pepsi_stage_relay_to_internet_main(int argc, char **argv)
{
	int rc = pepsi_worker_main(&pepsi_stage_relay_to_internet_stage, argc, argv);

	internet_close_all(); /* QUIT the sessions the worker kept (and atexit finds none) */
	if (internet_resolver)
		dns_resolver_free(internet_resolver);
	return rc;
}
