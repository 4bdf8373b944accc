/*
 * verify.h: message authentication in pepsi-ingress: iprev from the
 * connection on, SPF (MAIL FROM and HELO identities) from MAIL on, DKIM,
 * ARC and DMARC once the content is in, every lookup on the event loop
 * through common/dns/dns.h, so a session whose DNS is slow delays nobody
 * else.  What it finds becomes state.auth and the Authentication-Results
 * header (common/auth/results.h); what the listener's policy refuses
 * becomes the reply after DATA.  What reads the message (signatures
 * parsed, canonicalised, hashed, checked) runs on the worker threads of
 * auth_worker.h: the loop only starts lookups and gathers verdicts.
 *
 * Options, read here and nowhere else: per listener MESSAGE_AUTHENTICATION
 * (on|off, off by default), TRUSTED_MESSAGE_AUTHENTICATION (whether mail
 * from TRUSTED_NETWORKS and authenticated sessions is checked too: not by
 * default), SPF_FAIL (tag|reject), DMARC_POLICY (report|enforce|off); in
 * [ingress] DNS_MESSAGE_BUDGET, the time the lookups of one message may
 * take together, DNS_PROBE_INTERVAL (the resolver's circuit breaker,
 * common/dns/dns.h) and ARC_TRUSTED_SEALERS.
 */
#ifndef PEPSI_INGRESS_VERIFY_H
#define PEPSI_INGRESS_VERIFY_H

#include <stdbool.h>

#include <ev.h>
#include <jansson.h>

#include "config/config.h"
#include "smtp.h"

enum verify_dmarc_mode
{
	VERIFY_DMARC_OFF,	 /* no DMARC evaluation */
	VERIFY_DMARC_REPORT, /* evaluate and record, act on nothing */
	VERIFY_DMARC_ENFORCE /* p=reject: 550; p=quarantine: action recorded */
};

struct verify_policy
{
	bool				   enabled;		/* MESSAGE_AUTHENTICATION */
	bool				   trusted_too; /* TRUSTED_MESSAGE_AUTHENTICATION: also trusted and authenticated mail */
	bool				   spf_reject;	/* SPF_FAIL = reject */
	enum verify_dmarc_mode dmarc;		/* DMARC_POLICY */
};

/* Process-wide: the resolver and [ingress] options.  Exits on a bad option. */
void verify_init(struct ev_loop *loop, const struct pepsi_config *cfg);
void verify_shutdown(void);
/* The resolver (common/dns/dns.h) the process's DNS checks share, with its circuit breaker. */
struct dns_resolver *verify_resolver(void);
/* A listener's options; false with err (naming the option) for a bad value. */
bool verify_listener_policy(const struct pepsi_config *cfg, const char *section,
							struct verify_policy *out, char *err, size_t errlen);

struct verify;

/* A session's checks start with its connection (iprev); NULL when the listener has them off. */
struct verify *verify_session_start(const struct verify_policy *policy, const char *client_ip,
									const char *hostname);
/*
 * Cancels every lookup of the session.  message is the session's content:
 * if a worker thread is still reading it, it is taken (left empty) and
 * freed with v once the worker is done.
 */
void verify_free(struct verify *v, struct buf *message);
/* MAIL accepted: SPF for this transaction (the previous one's is dropped). */
void verify_mail(struct verify *v, const char *helo, const char *mail_from);

/* Everything is in: done(arg) is called from the loop, never from here. */
typedef void (*verify_done_fn)(void *arg);
void verify_message(struct verify *v, const struct smtp_session *s, verify_done_fn done,
					void *arg);

/* After done: the findings, for envelope.c (borrowed; valid until the next verify_mail). */
struct verify_findings
{
	json_t	   *auth;		 /* state.auth */
	json_t	   *iprev;		 /* state.origin.iprev */
	const char *client_name; /* the forward-confirmed name, or NULL */
	const char *refusal;	 /* the reply refusing the message, or NULL */
};
void verify_findings(struct verify *v, struct verify_findings *out);

#endif
