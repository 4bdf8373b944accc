/*
 * transaction.c: one delivery of a relay-to-internet row, under its
 * destination's slot (schedule.c): the MX hosts tried in order, each
 * host's addresses in order (addresses.c), each connection with the TLS
 * policy asked of the seam (tls_policy_seam.h), until one host takes the
 * transaction; then what the destination learnt is recorded and each
 * recipient's outcome concluded (outcome.c).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "internet.h"
#include "runtime/db.h"
#include "tls_policy_seam.h"
#include "tls_tally.h"

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
	double				retry_in;		  /* when nothing was tried: the soonest address retry */
	const char		   *tls_policy;		  /* the TLS policy of the last host tried (tls_policy_name) */
	char				tls_outcome[300]; /* what it gave; "" when nothing is known */
};

/* The TLS policy of the host tried last and what it gave, for pepsi.destination. */
static void
internet_attempt_note_tls(struct internet_attempt *at, const struct internet_tls_policy *policy)
{
	const struct smtp_result *r = &at->result;

	at->tls_policy = policy->source;
	if (policy->refuse)
		snprintf(at->tls_outcome, sizeof(at->tls_outcome), "%s", policy->reason);
	else if (r->tls_outcome[0])
		snprintf(at->tls_outcome, sizeof(at->tls_outcome), "%s", r->tls_outcome);
	else if (!internet_host_failed(r))
		snprintf(at->tls_outcome, sizeof(at->tls_outcome), "%s", r->tls[0] ? r->tls : "no TLS");
	else
		at->tls_outcome[0] = '\0';
}

/*
 * Count the sessions the send opened for TLS reports: a session whose TLS
 * the policy judged (tls_outcome) succeeded, or failed with tls_result;
 * one that ended before (no connection, no greeting) had no TLS to
 * report.  A failure of the domain's MTA-STS policy counts every session.
 */
static void
internet_tally_session(struct pepsi_ctx *ctx, const char *domain, const struct internet_tls_policy *policy,
					   const char *host, const char *address, const struct smtp_result *r)
{
	const char *result = policy->report_failure[0] ? policy->report_failure : r->tls_result;

	if (r->sessions_opened == 0 || r->tls_outcome[0] == '\0')
		return;
	internet_tls_tally_add(domain, policy, result, host, address, r->local_address, r->sessions_opened);
	pepsi_when_idle(ctx, internet_tls_tally_idle);
}

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
			/* No session, but one the policy failed (RFC 8460 4.3.2). */
			internet_tls_tally_add(domain, &policy, policy.policy.refused_result, host,
								   addresses.count ? addresses.addresses[0].address : "", "", 1);
			pepsi_when_idle(ctx, internet_tls_tally_idle);
			internet_attempt_note_tls(at, &policy);
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
			internet_attempt_note_tls(at, &policy);
			internet_tally_session(ctx, domain, &policy, host, address->address, &at->result);
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

/* The envelope of the row as sent to domain (A-label); free it with internet_envelope_free. */
struct internet_envelope
{
	struct smtp_envelope env;
	char			   **rcpt;
	const char		   **notify;
	const char		   **orcpt;
};

static void
internet_envelope_make(struct pepsi_ctx *ctx, const char *domain, struct internet_envelope *e)
{
	json_t	   *origin = json_object_get(pepsi_state(ctx), "origin");
	const char *body = json_string_value(json_object_get(origin, "body"));
	size_t		n = pepsi_rcpt_count(ctx);

	memset(e, 0, sizeof(*e));
	e->rcpt = internet_wire_recipients(ctx, domain);
	e->notify = xcalloc(n + 1, sizeof(char *));
	e->orcpt = xcalloc(n + 1, sizeof(char *));
	for (size_t i = 0; i < n; i++)
	{
		e->notify[i] = delivery_notify(ctx, i);
		e->orcpt[i] = delivery_orcpt(ctx, i);
	}
	e->env.mail_from = pepsi_mail_from(ctx);
	e->env.rcpt = (const char *const *) e->rcpt;
	e->env.nrcpt = n;
	e->env.notify = e->notify;
	e->env.orcpt = e->orcpt;
	e->env.ret = delivery_dsn_param(ctx, "ret");
	e->env.envid = delivery_dsn_param(ctx, "envid");
	e->env.body_8bit = body && strcasecmp(body, "8BITMIME") == 0;
	e->env.smtputf8 = json_is_true(json_object_get(origin, "smtputf8"));
	e->env.requiretls = json_is_true(json_object_get(origin, "requiretls"));
}

static void
internet_envelope_free(struct internet_envelope *e)
{
	for (size_t i = 0; i < e->env.nrcpt; i++)
		free(e->rcpt[i]);
	free(e->rcpt);
	free(e->notify);
	free(e->orcpt);
}

/*
 * Record what the attempt taught about the destination: a delivery that
 * connected keeps its slot and session (recorded by the next begin, or
 * when idle); anything else ends the slot now.  *outcome: what was
 * recorded ("connected", "busy", "unreachable").  False on a database error.
 */
static bool
internet_record_attempt(struct pepsi_ctx *ctx, const char *domain, const struct destination_start *start,
						struct internet_attempt *at, double seconds, const char **outcome, char *err,
						size_t errlen)
{
	struct destination_end end = {0};
	bool				   contended = false;

	/*
	 * A refusal while other workers deliver there (or a 421: "try later")
	 * is the destination's limit, not its death.
	 */
	end.outcome = at->connected											? "connected"
				  : (at->refused && (start->slot > 0 || at->try_later)) ? "busy"
																		: "unreachable";
	end.error = at->connected ? NULL : at->error;
	end.ok_host = at->connected ? at->ok_host : NULL;
	end.ok_address = at->connected ? at->ok_address : NULL;
	end.failed_hosts = &at->failed_hosts;
	end.failed_addresses = &at->failed_addresses;
	end.backoff_after = pepsi_option_int(ctx, "DESTINATION_BACKOFF_AFTER");
	end.backoff_base = pepsi_option_seconds(ctx, "DESTINATION_BACKOFF_BASE");
	end.backoff_max = pepsi_option_seconds(ctx, "DESTINATION_BACKOFF_MAX");
	end.seconds = seconds;
	if (at->tls_policy && at->tls_outcome[0])
	{
		end.tls_policy = at->tls_policy;
		end.tls_outcome = at->tls_outcome;
	}
	if (at->loop)
		end.outcome = "connected"; /* nothing is wrong with the destination */
	if (at->connected)
		internet_slow_note(ctx, domain, end.seconds);
	*outcome = end.outcome;
	/*
	 * A TLS result this worker has not recorded for the domain is written
	 * now, with the outcome; the same result again rides on the kept slot.
	 */
	if (strcmp(end.outcome, "connected") == 0 && at->failed_addresses.len <= 2
		&& internet_tls_recorded(domain, end.tls_policy, end.tls_outcome))
	{
		/*
		 * Recorded by the next begin (or when idle); the slot goes on with
		 * the session.  (Addresses that failed on the way are recorded at
		 * once, below, for the other workers to pass over.)
		 */
		destination_keep(domain, start->slot, end.ok_host, end.ok_address, end.seconds, start->contended);
		internet_session_keep(at->client);
		pepsi_when_idle(ctx, internet_idle);
		return true;
	}
	if (!destination_end(pepsi_db(ctx), domain, start->slot, &end, &contended, err, errlen))
		return false;
	internet_tls_note(domain, end.tls_policy, end.tls_outcome);
	return true;
}

/* Each recipient's outcome of the attempt, whose destination outcome was outcome. */
static int
internet_conclude_attempt(struct pepsi_ctx *ctx, const struct internet_attempt *at, const char *outcome)
{
	int rc;

	if (at->loop)
		rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.4.6", at->error);
	else if (at->connected)
		rc = internet_conclude_transaction(ctx, &at->result);
	else if (!at->have_result && at->retry_in > 0)
	{
		/* Nothing tried: every address is waiting out its failures. */
		struct delivery_report r = {.status = "4.4.1", .diagnostic = at->error};

		rc = delivery_postponed(ctx, &r, at->retry_in + 1.0 * ((double) random() / RAND_MAX));
	}
	else if (strcmp(outcome, "busy") == 0)
	{
		char				  *diagnostic = xasprintf("X-Pepsi; %s (the destination is at its limit)", at->error);
		struct delivery_report r = {.status = "4.4.5", .diagnostic = diagnostic};

		rc = delivery_postponed(ctx, &r, 0.5 + 1.0 * ((double) random() / RAND_MAX));
		free(diagnostic);
	}
	else if (at->have_result)
	{
		char				   status[16];
		struct buf			   diagnostic = BUF_INIT;
		struct delivery_report r;

		delivery_report_from_smtp(&at->result, NULL, &r, status, sizeof(status), &diagnostic);
		rc = internet_conclude_all(ctx, DELIVERY_DEFERRED, &r);
		buf_free(&diagnostic);
	}
	else
		rc = internet_refuse(ctx, DELIVERY_DEFERRED, "4.4.3",
							 at->error[0] ? at->error : "no MX host of the domain has an address");
	return rc;
}

int
internet_deliver(struct pepsi_ctx *ctx, const char *domain, const struct mx_route *route)
{
	struct internet_envelope e;
	struct internet_attempt	 at;
	struct buf				 raw = BUF_INIT;
	char					 err[512];
	struct destination_start start;
	const char				*outcome;
	double					 begun_at;
	int						 rc;

	if (!internet_destination_begin(ctx, domain, route, &start, err, sizeof(err)))
		return pepsi_error(ctx, "%s", err);
	/* The destination's pace is its deliveries' time, not the wait for a slot. */
	begun_at = pepsi_pass_seconds(ctx);
	if (start.slot < 0)
	{
		struct delivery_report r = {.status = "4.4.5", .diagnostic = start.reason};

		/* A little jitter, so that waiters given the same time do not come back at once. */
		rc = delivery_postponed(ctx, &r, start.wait * (1.0 + 0.1 * ((double) random() / RAND_MAX)) + 0.05);
		destination_start_free(&start);
		return rc;
	}
	if (!pepsi_raw_message(ctx, &raw))
	{
		destination_unlock(pepsi_db(ctx), domain, start.slot);
		destination_start_free(&start);
		return -1;
	}
	internet_envelope_make(ctx, domain, &e);
	memset(&at, 0, sizeof(at));
	internet_try_hosts(ctx, domain, route, &e.env, &raw, &at);
	if (!internet_record_attempt(ctx, domain, &start, &at, pepsi_pass_seconds(ctx) - begun_at, &outcome, err,
								 sizeof(err)))
		rc = pepsi_error(ctx, "%s", err);
	else
		rc = internet_conclude_attempt(ctx, &at, outcome);
	destination_start_free(&start);
	if (at.have_result)
		smtp_result_free(&at.result);
	buf_free(&at.failed_hosts);
	buf_free(&at.failed_addresses);
	internet_envelope_free(&e);
	buf_free(&raw);
	return rc;
}
