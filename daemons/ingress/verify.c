/*
 * verify.c: see verify.h.  A session's struct verify holds its checks in
 * flight; each check's callback records its verdict and asks whether the
 * message is complete (verify_settle).  Nothing here blocks: a check that
 * never hears from the DNS ends by its lookup timeout or the message's
 * budget, with a temperror, and the message is still taken.
 *
 * What reads the message itself runs on the worker threads
 * (auth_worker.h), never on the loop: a header section at the limits with
 * dozens of signatures takes milliseconds to read and hash.  A message
 * goes there twice: to find what its signatures need (verify_scan), and,
 * once the keys are in, to check them (verify_check).  While a job is out
 * (v->job), the loop leaves the fields it writes alone.
 */
#include "verify.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "auth/arc.h"
#include "auth/dkim_verify.h"
#include "auth/dmarc.h"
#include "auth/results.h"
#include "auth/spf.h"
#include "auth_worker.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "dmarc_tally.h"
#include "dns/dns.h"

/* Lookups of one message: SPF's worst case is 10 terms x 10 names, twice. */
#define VERIFY_BUDGET_LOOKUPS 300
#define VERIFY_IPREV_NAMES 10
#define VERIFY_ARC_KEYS 16

enum verify_iprev_step
{
	VERIFY_IPREV_PTR,	  /* the client's names */
	VERIFY_IPREV_FORWARD, /* one name's addresses */
	VERIFY_IPREV_DONE
};

/*
 * Within one session, a verdict is kept for the next transaction with the
 * same HELO and sender (the SPF macros can use the local part, so the
 * whole address), for this long: a client sending message after message
 * from one address gets the same answer without evaluating the record
 * again, while a record changed meanwhile is seen within seconds.  A
 * temperror is never kept.
 */
#define VERIFY_SPF_MEMO_SECONDS 10.0

struct verify_spf
{
	struct spf_check *check;   /* in flight, or done; NULL when answered from the memo */
	bool			  started; /* this identity is being checked (by either means) */
	bool			  done;
	enum spf_result	  result;
	char			 *reason;
	char			 *explanation;
};

/* The last verdict for one identity in this session (VERIFY_SPF_MEMO_SECONDS). */
struct verify_spf_memo
{
	char		   *sender;
	char		   *helo;
	ev_tstamp		at;
	enum spf_result result;
	char		   *reason;
	char		   *explanation;
};

/* A key the ARC chain's signatures name, fetched before arc_verify runs. */
struct verify_arc_key
{
	struct verify	  *owner;
	struct arc_key_ref ref;
	struct dns_query  *query;
	enum dns_status	   status;
	char			  *record;
};

struct verify
{
	const struct verify_policy *policy;
	char					   *client_ip;
	char					   *hostname;

	/* iprev (RFC 8601 3): PTR, then a forward lookup per name */
	enum verify_iprev_step iprev_step;
	struct dns_query	  *iprev_query;
	struct dns_budget	   iprev_budget;
	char				  *iprev_names[VERIFY_IPREV_NAMES];
	size_t				   iprev_count;
	size_t				   iprev_index;
	bool				   iprev_forward_error;
	const char			  *iprev_result;
	char				  *iprev_name;

	/* The transaction */
	struct dns_budget	   mail_budget;	   /* SPF, from MAIL on */
	struct dns_budget	   message_budget; /* DKIM and DMARC, from the end of DATA */
	char				  *mail_from;
	char				  *helo;
	struct verify_spf	   spf_mail;
	struct verify_spf	   spf_helo;
	struct verify_spf_memo spf_mail_memo; /* these two outlive the transaction */
	struct verify_spf_memo spf_helo_memo;
	struct dkim_verify	  *dkim;
	bool				   dkim_done;
	struct dmarc_check	  *dmarc;
	char				  *from_domain;
	const char			  *from_problem;
	bool				   dmarc_done;
	struct verify_arc_key  arc_keys[VERIFY_ARC_KEYS];
	size_t				   arc_key_count;
	size_t				   arc_pending;
	bool				   arc_done;
	struct arc_verdict	   arc;
	char				  *arc_sealer; /* d= of the newest ARC-Seal */
	bool				   dkim_keys_in;
	const char			  *message; /* the content, until the signatures are checked */
	size_t				   message_len;
	size_t				   header_len;
	struct auth_job		  *job;		 /* on a worker thread (auth_worker.h) */
	struct buf			   orphaned; /* the session's content, taken over when it went first */

	/* The message waiting for all of them */
	bool		   waiting;
	verify_done_fn done;
	void		  *arg;
	ev_timer	   settle_timer;
	json_t		  *auth;
	json_t		  *iprev_state;
	char		  *refusal;
};

static struct
{
	struct ev_loop		*loop;
	struct dns_resolver *resolver;
	double				 budget;			  /* seconds */
	char				*arc_trusted_sealers; /* ARC_TRUSTED_SEALERS, lower case, space separated */
} verify_global;

/*
 * Options
 */

void
verify_init(struct ev_loop *loop, const struct pepsi_config *cfg)
{
	struct dns_config dc;
	char			  err[1024];

	verify_global.loop = loop;
	if (!dns_config_load(cfg, &dc, err, sizeof(err)))
		fatalx("%s", err);
	verify_global.budget = config_duration_ms(cfg, "ingress", "DNS_MESSAGE_BUDGET") / 1000.0;
	if (config_text(cfg, "ingress", "ARC_TRUSTED_SEALERS"))
	{
		char *list = xstrdup(config_text(cfg, "ingress", "ARC_TRUSTED_SEALERS"));

		for (char *p = list; *p; p++)
			*p = *p == ',' ? ' ' : (char) tolower((unsigned char) *p);
		verify_global.arc_trusted_sealers = list;
	}
	if ((verify_global.resolver = dns_resolver_new(loop, &dc, err, sizeof(err))) == NULL)
		fatalx("DNS resolver: %s", err);
	if (config_duration_ms(cfg, "ingress", "DNS_PROBE_INTERVAL") > 0)
		dns_resolver_breaker(verify_global.resolver,
							 config_duration_ms(cfg, "ingress", "DNS_PROBE_INTERVAL") / 1000.0);
	dns_config_free(&dc);
}

struct dns_resolver *
verify_resolver(void)
{
	return verify_global.resolver;
}

void
verify_shutdown(void)
{
	dns_resolver_free(verify_global.resolver);
	verify_global.resolver = NULL;
	free(verify_global.arc_trusted_sealers);
	verify_global.arc_trusted_sealers = NULL;
}

bool
verify_listener_policy(const struct pepsi_config *cfg, const char *section,
					   struct verify_policy *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	/* The choices are in the order of schema/options.def: tag|reject, off|report|enforce. */
	out->enabled = config_bool(cfg, section, "MESSAGE_AUTHENTICATION");
	out->trusted_too = config_bool(cfg, section, "TRUSTED_MESSAGE_AUTHENTICATION");
	out->spf_reject = config_enum(cfg, section, "SPF_FAIL") == 1;
	out->dmarc = (enum verify_dmarc_mode) config_enum(cfg, section, "DMARC_POLICY");
	return true;
}

/*
 * Settling: the message waits until every check has a verdict
 */

static bool
verify_complete(const struct verify *v)
{
	return v->job == NULL && v->iprev_step == VERIFY_IPREV_DONE && (!v->spf_mail.started || v->spf_mail.done)
		   && (!v->spf_helo.started || v->spf_helo.done) && (v->dkim == NULL || v->dkim_done)
		   && (v->dmarc == NULL || v->dmarc_done) && v->arc_done;
}

static void verify_conclude(struct verify *v);

static void
verify_on_settled(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct verify *v = w->data;

	if (!v->waiting || !verify_complete(v))
		return;
	v->waiting = false;
	verify_conclude(v);
	v->done(v->arg);
}

/* A check finished: if the message was waiting for it last, finish from the loop. */
static void
verify_settle(struct verify *v)
{
	if (v->waiting && verify_complete(v) && !ev_is_active(&v->settle_timer))
		ev_timer_start(verify_global.loop, &v->settle_timer);
}

/*
 * iprev
 */

static void verify_on_iprev_answer(void *arg, const struct dns_answer *a);

static void
verify_iprev_finish(struct verify *v, const char *result)
{
	v->iprev_step = VERIFY_IPREV_DONE;
	v->iprev_result = result;
	if (strcmp(result, "pass") == 0)
		log_debug("%s: iprev pass as %s", v->client_ip, v->iprev_name);
	verify_settle(v);
}

static void
verify_iprev_next(struct verify *v)
{
	enum dns_type type = strchr(v->client_ip, ':') ? DNS_TYPE_AAAA : DNS_TYPE_A;

	if (v->iprev_index >= v->iprev_count)
	{
		/* No name leads back: fail, unless only errors kept us from knowing. */
		verify_iprev_finish(v, v->iprev_forward_error ? "temperror" : "fail");
		return;
	}
	v->iprev_step = VERIFY_IPREV_FORWARD;
	v->iprev_query = dns_resolve(verify_global.resolver, v->iprev_names[v->iprev_index], type,
								 &v->iprev_budget, verify_on_iprev_answer, v);
}

static bool
verify_same_address(const char *ip, const struct dns_record *r)
{
	unsigned char a[16];

	if (r->type == DNS_TYPE_A)
		return r->len == 4 && inet_pton(AF_INET, ip, a) == 1 && memcmp(a, r->rdata, 4) == 0;
	if (r->type == DNS_TYPE_AAAA)
		return r->len == 16 && inet_pton(AF_INET6, ip, a) == 1 && memcmp(a, r->rdata, 16) == 0;
	return false;
}

static void
verify_on_iprev_answer(void *arg, const struct dns_answer *a)
{
	struct verify *v = arg;

	v->iprev_query = NULL;
	if (v->iprev_step == VERIFY_IPREV_PTR)
	{
		if (a->status == DNS_TEMPFAIL || a->status == DNS_TIMEOUT)
		{
			verify_iprev_finish(v, "temperror");
			return;
		}
		for (size_t i = 0; i < a->count && v->iprev_count < VERIFY_IPREV_NAMES; i++)
			if (a->records[i].type == DNS_TYPE_PTR && a->records[i].text)
				v->iprev_names[v->iprev_count++] = xstrdup(a->records[i].text);
		/* RFC 8601 2.7.3: no PTR data at all is a permanent error. */
		if (v->iprev_count == 0)
		{
			verify_iprev_finish(v, "permerror");
			return;
		}
		v->iprev_index = 0;
		verify_iprev_next(v);
		return;
	}
	if (a->status == DNS_TEMPFAIL || a->status == DNS_TIMEOUT)
		v->iprev_forward_error = true;
	for (size_t i = 0; i < a->count; i++)
		if (verify_same_address(v->client_ip, &a->records[i]))
		{
			v->iprev_name = xstrdup(v->iprev_names[v->iprev_index]);
			verify_iprev_finish(v, "pass");
			return;
		}
	v->iprev_index++;
	verify_iprev_next(v);
}

/*
 * Sessions and transactions
 */

struct verify *
verify_session_start(const struct verify_policy *policy, const char *client_ip,
					 const char *hostname)
{
	struct verify *v;
	char		   name[128];

	if (!policy->enabled || verify_global.resolver == NULL)
		return NULL;
	v = xcalloc(1, sizeof(*v));
	v->policy = policy;
	v->client_ip = xstrdup(client_ip);
	v->hostname = xstrdup(hostname);
	ev_timer_init(&v->settle_timer, verify_on_settled, 0, 0);
	v->settle_timer.data = v;
	v->iprev_budget.deadline = ev_now(verify_global.loop) + verify_global.budget;
	v->iprev_budget.lookups_left = VERIFY_IPREV_NAMES + 1;
	if (!dns_reverse_name(client_ip, name, sizeof(name)))
	{
		v->iprev_step = VERIFY_IPREV_DONE;
		v->iprev_result = "permerror";
		return v;
	}
	v->iprev_step = VERIFY_IPREV_PTR;
	v->iprev_query = dns_resolve(verify_global.resolver, name, DNS_TYPE_PTR, &v->iprev_budget,
								 verify_on_iprev_answer, v);
	return v;
}

static void
verify_spf_clear(struct verify_spf *s)
{
	if (s->check && !s->done)
		spf_check_cancel(s->check);
	free(s->reason);
	free(s->explanation);
	memset(s, 0, sizeof(*s));
}

static void
verify_arc_clear(struct verify *v)
{
	for (size_t i = 0; i < v->arc_key_count; i++)
	{
		if (v->arc_keys[i].query)
			dns_cancel(v->arc_keys[i].query);
		free(v->arc_keys[i].record);
	}
	memset(v->arc_keys, 0, sizeof(v->arc_keys));
	v->arc_key_count = v->arc_pending = 0;
	v->arc_done = false;
	memset(&v->arc, 0, sizeof(v->arc));
	free(v->arc_sealer);
	v->arc_sealer = NULL;
	v->message = NULL;
}

/* Drop the transaction's checks and findings. */
static void
verify_transaction_clear(struct verify *v)
{
	verify_spf_clear(&v->spf_mail);
	verify_spf_clear(&v->spf_helo);
	if (v->dkim)
		dkim_verify_free(v->dkim);
	v->dkim = NULL;
	v->dkim_done = v->dkim_keys_in = false;
	if (v->dmarc)
		dmarc_check_free(v->dmarc);
	v->dmarc = NULL;
	v->dmarc_done = false;
	free(v->from_domain);
	v->from_domain = NULL;
	v->from_problem = NULL;
	verify_arc_clear(v);
	free(v->mail_from);
	free(v->helo);
	v->mail_from = v->helo = NULL;
	json_decref(v->auth);
	json_decref(v->iprev_state);
	v->auth = v->iprev_state = NULL;
	free(v->refusal);
	v->refusal = NULL;
	v->waiting = false;
	ev_timer_stop(verify_global.loop, &v->settle_timer);
}

static void
verify_spf_memo_clear(struct verify_spf_memo *m)
{
	free(m->sender);
	free(m->helo);
	free(m->reason);
	free(m->explanation);
	memset(m, 0, sizeof(*m));
}

static void
verify_destroy(struct verify *v)
{
	verify_transaction_clear(v);
	verify_spf_memo_clear(&v->spf_mail_memo);
	verify_spf_memo_clear(&v->spf_helo_memo);
	if (v->iprev_query)
		dns_cancel(v->iprev_query);
	for (size_t i = 0; i < v->iprev_count; i++)
		free(v->iprev_names[i]);
	free(v->iprev_name);
	free(v->client_ip);
	free(v->hostname);
	buf_free(&v->orphaned);
	free(v);
}

/* The worker an abandoned struct verify waited for is done with it. */
static void
verify_release(void *arg)
{
	struct verify *v = arg;

	v->job = NULL;
	verify_destroy(v);
}

void
verify_free(struct verify *v, struct buf *message)
{
	if (v == NULL)
		return;
	if (v->job == NULL)
	{
		verify_destroy(v);
		return;
	}
	/*
	 * A worker still reads the content: it and v go when it is done.  What
	 * runs on the loop stops now (no lookup is in flight for the message
	 * while a worker has it, only the session's iprev and SPF, and DMARC).
	 */
	v->orphaned = *message;
	*message = (struct buf) BUF_INIT;
	v->waiting = false;
	ev_timer_stop(verify_global.loop, &v->settle_timer);
	if (v->iprev_query)
		dns_cancel(v->iprev_query);
	v->iprev_query = NULL;
	verify_spf_clear(&v->spf_mail);
	verify_spf_clear(&v->spf_helo);
	if (v->dmarc)
		dmarc_check_free(v->dmarc);
	v->dmarc = NULL;
	auth_worker_abandon(v->job, verify_release);
}

static void
verify_spf_done(struct verify *v, struct verify_spf *s, struct verify_spf_memo *memo,
				const char *sender, const struct spf_verdict *verdict, const char *identity)
{
	s->done = true;
	s->result = verdict->result;
	s->reason = xstrdup(verdict->reason ? verdict->reason : "");
	s->explanation = verdict->explanation ? xstrdup(verdict->explanation) : NULL;
	log_debug("%s: spf %s %s for %s (%s)", v->client_ip, identity, spf_result_name(s->result),
			  verdict->domain, s->reason);
	verify_spf_memo_clear(memo);
	if (s->result != SPF_TEMPERROR)
	{
		memo->sender = xstrdup(sender);
		memo->helo = xstrdup(v->helo);
		memo->at = ev_now(verify_global.loop);
		memo->result = s->result;
		memo->reason = xstrdup(s->reason);
		memo->explanation = s->explanation ? xstrdup(s->explanation) : NULL;
	}
	verify_settle(v);
}

static void
verify_on_spf_mail(void *arg, const struct spf_verdict *verdict)
{
	struct verify *v = arg;

	verify_spf_done(v, &v->spf_mail, &v->spf_mail_memo, v->mail_from, verdict, "mailfrom");
}

static void
verify_on_spf_helo(void *arg, const struct spf_verdict *verdict)
{
	struct verify *v = arg;

	verify_spf_done(v, &v->spf_helo, &v->spf_helo_memo, v->helo, verdict, "helo");
}

/* Check one identity: from the session's memo when it holds this one, else anew. */
static void
verify_spf_begin(struct verify *v, struct verify_spf *s, const struct verify_spf_memo *memo,
				 const char *sender, spf_done_fn done)
{
	s->started = true;
	if (memo->sender && strcmp(memo->sender, sender) == 0 && strcmp(memo->helo, v->helo) == 0
		&& ev_now(verify_global.loop) - memo->at < VERIFY_SPF_MEMO_SECONDS)
	{
		s->done = true;
		s->result = memo->result;
		s->reason = xstrdup(memo->reason);
		s->explanation = memo->explanation ? xstrdup(memo->explanation) : NULL;
		return;
	}
	s->check = spf_check_start(verify_global.resolver, &v->mail_budget, v->client_ip, sender,
							   v->helo, v->hostname, done, v);
}

void
verify_mail(struct verify *v, const char *helo, const char *mail_from)
{
	if (v == NULL)
		return;
	verify_transaction_clear(v);
	v->helo = xstrdup(helo ? helo : "");
	v->mail_from = xstrdup(mail_from);
	v->mail_budget.deadline = ev_now(verify_global.loop) + verify_global.budget;
	v->mail_budget.lookups_left = VERIFY_BUDGET_LOOKUPS;
	/*
	 * RFC 7208 2.3 and 2.4: the HELO identity always, MAIL FROM when there
	 * is one (a null sender's MAIL FROM identity is postmaster@helo: the
	 * HELO check stands for it).
	 */
	if (*v->helo)
		verify_spf_begin(v, &v->spf_helo, &v->spf_helo_memo, v->helo, verify_on_spf_helo);
	if (*mail_from)
		verify_spf_begin(v, &v->spf_mail, &v->spf_mail_memo, v->mail_from, verify_on_spf_mail);
}

/*
 * The message
 */

static void
verify_on_dmarc(void *arg)
{
	struct verify *v = arg;

	v->dmarc_done = true;
	verify_settle(v);
}

/*
 * ARC (RFC 8617), over common/auth/arc.c: the keys its signatures name are
 * fetched on the loop, then the chain is validated in one go.
 */
static EVP_PKEY *
verify_arc_key_lookup(void *arg, const char *domain, const char *selector,
					  enum sign_algorithm algorithm, char *err, size_t errlen)
{
	struct verify *v = arg;

	for (size_t i = 0; i < v->arc_key_count; i++)
	{
		struct verify_arc_key *k = &v->arc_keys[i];

		if (strcasecmp(k->ref.domain, domain) != 0 || strcmp(k->ref.selector, selector) != 0)
			continue;
		if (k->record == NULL)
		{
			snprintf(err, errlen, "%s", k->status == DNS_TEMPFAIL || k->status == DNS_TIMEOUT ? "key lookup failed" : "no key");
			return NULL;
		}
		return keys_parse_record(k->record, strlen(k->record), algorithm, err, errlen);
	}
	snprintf(err, errlen, "no key");
	return NULL;
}

static void
verify_arc_sealer_tag(void *arg, const char *tag, size_t taglen, const char *value, size_t len)
{
	char **sealer = arg;

	if (taglen == 1 && tag[0] == 'd' && len > 0 && len < 254)
	{
		free(*sealer);
		*sealer = xstrndup(value, len);
		for (char *p = *sealer; *p; p++)
			*p = (char) tolower((unsigned char) *p);
	}
}

/* On a worker: the ARC chain's sealer and the keys it names (their queries are the loop's). */
static void
verify_arc_scan(struct verify *v)
{
	struct header_fields fields;
	struct arc_chain	 chain;
	struct arc_key_ref	 refs[VERIFY_ARC_KEYS];
	char				 err[160];
	size_t				 n;

	/* A header section that does not parse: arc_verify says why, for a message with a chain. */
	if (!header_fields_parse(v->message, v->header_len, 0, &fields, err, sizeof(err)))
		return;
	arc_chain_parse(&fields, &chain);
	if (chain.count > 0 && chain.set[chain.count].seal)
	{
		const struct header_field *seal = chain.set[chain.count].seal;
		const char				  *colon = memchr(seal->start, ':', seal->len);

		if (colon)
			dkim_tag_list_parse(colon + 1, (size_t) (seal->start + seal->len - colon - 1),
								verify_arc_sealer_tag, &v->arc_sealer);
	}
	n = chain.count > 0 && !chain.malformed ? arc_required_keys(&chain, refs, VERIFY_ARC_KEYS) : 0;
	header_fields_free(&fields);
	for (size_t i = 0; i < n; i++)
	{
		v->arc_keys[i].owner = v;
		v->arc_keys[i].ref = refs[i];
	}
	v->arc_key_count = n;
}

static enum auth_lane
verify_lane(const struct verify *v)
{
	return v->message_len >= SMTP_HEAVY_MESSAGE ? AUTH_LANE_HEAVY : AUTH_LANE_LIGHT;
}

/* On a worker: what the message's signatures and From need fetched. */
static void
verify_scan(void *arg)
{
	struct verify *v = arg;
	const char	  *blank = memmem(v->message, v->message_len, "\r\n\r\n", 4);

	v->header_len = blank ? (size_t) (blank - v->message) + 2 : v->message_len;
	v->dkim = dkim_verify_new(v->message, v->message_len);
	verify_arc_scan(v);
	if (v->policy->dmarc != VERIFY_DMARC_OFF)
		v->from_domain = dmarc_from_domain(v->message, v->header_len, &v->from_problem);
}

/* On a worker, every key in: the DKIM signatures and the ARC chain checked. */
static void
verify_check(void *arg)
{
	struct verify *v = arg;
	const char	  *body = v->message + v->header_len;
	size_t		   blen = v->message_len - v->header_len;

	dkim_verify_check(v->dkim);
	/* The body starts after the empty line that ends the header block. */
	if (blen >= 2 && body[0] == '\r' && body[1] == '\n')
	{
		body += 2;
		blen -= 2;
	}
	arc_verify(v->message, v->header_len, body, blen, verify_arc_key_lookup, v, &v->arc);
}

static void
verify_on_checked(void *arg)
{
	struct verify *v = arg;

	v->job = NULL;
	v->dkim_done = v->arc_done = true;
	v->message = NULL;
	verify_settle(v);
}

/* A key is in: once all are, the signatures go to a worker. */
static void
verify_keys_settle(struct verify *v)
{
	if (v->dkim_keys_in && v->arc_pending == 0)
		v->job = auth_worker_run(verify_global.loop, verify_lane(v), verify_check, verify_on_checked, v);
}

static void
verify_on_dkim_keys(void *arg)
{
	struct verify *v = arg;

	v->dkim_keys_in = true;
	verify_keys_settle(v);
}

static void
verify_on_arc_key(void *arg, const struct dns_answer *a)
{
	struct verify_arc_key *k = arg;
	struct verify		  *v = k->owner;

	k->query = NULL;
	k->status = a->status;
	for (size_t i = 0; i < a->count && k->record == NULL; i++)
		if (a->records[i].type == DNS_TYPE_TXT
			&& memchr(a->records[i].text, '\0', a->records[i].len) == NULL)
			k->record = xstrdup(a->records[i].text);
	v->arc_pending--;
	verify_keys_settle(v);
}

/* Back from verify_scan: fetch what it found needed. */
static void
verify_on_scanned(void *arg)
{
	struct verify *v = arg;

	v->job = NULL;
	v->arc_pending = v->arc_key_count;
	for (size_t i = 0; i < v->arc_key_count; i++)
	{
		struct verify_arc_key *k = &v->arc_keys[i];
		char				  *name = xasprintf("%s._domainkey.%s", k->ref.selector, k->ref.domain);

		k->query = dns_resolve(verify_global.resolver, name, DNS_TYPE_TXT, &v->message_budget,
							   verify_on_arc_key, k);
		free(name);
	}
	if (v->from_domain)
		v->dmarc = dmarc_check_start(verify_global.resolver, &v->message_budget, v->from_domain,
									 verify_on_dmarc, v);
	/* Its done comes from the loop, later: after the ARC lookups are all started. */
	dkim_verify_lookup(v->dkim, verify_global.resolver, &v->message_budget, verify_on_dkim_keys, v);
}

void
verify_message(struct verify *v, const struct smtp_session *s, verify_done_fn done, void *arg)
{
	v->done = done;
	v->arg = arg;
	v->waiting = true;
	v->message = s->message.data ? s->message.data : "";
	v->message_len = s->message.len;
	v->message_budget.deadline = ev_now(verify_global.loop) + verify_global.budget;
	v->message_budget.lookups_left = VERIFY_BUDGET_LOOKUPS;
	v->job = auth_worker_run(verify_global.loop, verify_lane(v), verify_scan, verify_on_scanned, v);
}

static json_t *
verify_spf_state(const struct verify_spf *s, const char *property, const char *identity)
{
	json_t *r = auth_result(spf_result_name(s->result), property, identity);

	if (s->reason && *s->reason)
		json_object_set_new(r, "reason", json_string(s->reason));
	return r;
}

static const char *
verify_disposition_name(enum dmarc_disposition d)
{
	return d == DMARC_REJECT ? "reject" : d == DMARC_QUARANTINE ? "quarantine"
																: "none";
}

static json_t *
verify_arc_state(const struct verify *v)
{
	json_t *arc = auth_result(arc_result_name(v->arc.result), NULL, NULL);
	char	number[16];

	if (v->arc.result == ARC_PASS)
	{
		snprintf(number, sizeof(number), "%d", v->arc.oldest_pass);
		json_object_set_new(arc, "header.oldest-pass", json_string(number));
	}
	if (v->arc.result != ARC_NONE)
	{
		json_object_set_new(arc, "instance", json_integer(v->arc.instance));
		if (v->arc_sealer)
			json_object_set_new(arc, "sealer", json_string(v->arc_sealer));
	}
	if (v->arc.reason[0])
		json_object_set_new(arc, "reason", json_string(v->arc.reason));
	return arc;
}

/* Does the chain pass, sealed last by a sealer in ARC_TRUSTED_SEALERS? */
static bool
verify_arc_trusted(const struct verify *v)
{
	const char *list = verify_global.arc_trusted_sealers;
	size_t		len;

	if (v->arc.result != ARC_PASS || v->arc_sealer == NULL || list == NULL)
		return false;
	len = strlen(v->arc_sealer);
	for (const char *p = list; (p = strstr(p, v->arc_sealer)) != NULL; p += len)
		if ((p == list || p[-1] == ' ') && (p[len] == '\0' || p[len] == ' '))
			return true;
	return false;
}

/* Build state.auth and the refusal, if any, from every verdict. */
static void
verify_conclude(struct verify *v)
{
	json_t							   *auth = json_object();
	json_t							   *dkim = json_array();
	const struct dkim_signature_result *sigs = NULL;
	size_t								nsigs = v->dkim ? dkim_verify_results(v->dkim, &sigs) : 0;
	enum spf_result						spf_for_dmarc = SPF_NONE;
	const char						   *spf_domain = NULL;
	char							   *helo_identity = NULL;

	/* iprev */
	v->iprev_state = auth_result(v->iprev_result, "policy.iprev", v->client_ip);
	if (v->iprev_name)
		json_object_set_new(v->iprev_state, "name", json_string(v->iprev_name));
	json_object_set(auth, "iprev", v->iprev_state);

	/* SPF: MAIL FROM, or for a null sender HELO standing for it. */
	if (v->spf_mail.started)
	{
		json_object_set_new(auth, "spf", verify_spf_state(&v->spf_mail, "smtp.mailfrom", v->mail_from));
		spf_for_dmarc = v->spf_mail.result;
		spf_domain = strrchr(v->mail_from, '@') ? strrchr(v->mail_from, '@') + 1 : v->mail_from;
	}
	if (v->spf_helo.started)
	{
		json_object_set_new(auth, v->spf_mail.started ? "spf_helo" : "spf",
							verify_spf_state(&v->spf_helo, "smtp.helo", v->helo));
		if (!v->spf_mail.started)
		{
			spf_for_dmarc = v->spf_helo.result;
			spf_domain = v->helo;
		}
	}
	else if (!v->spf_mail.started)
	{
		helo_identity = xstrdup(v->helo && *v->helo ? v->helo : "unknown");
		json_object_set_new(auth, "spf", auth_result("none", "smtp.helo", helo_identity));
	}

	/* DKIM: one result per signature. */
	for (size_t i = 0; i < nsigs; i++)
	{
		const struct dkim_signature_result *r = &sigs[i];
		json_t							   *one = auth_result(r->result, NULL, NULL);

		if (r->domain)
			json_object_set_new(one, "header.d", json_string(r->domain));
		if (r->identity)
			json_object_set_new(one, "header.i", json_string(r->identity));
		if (r->selector)
			json_object_set_new(one, "header.s", json_string(r->selector));
		if (r->algorithm)
			json_object_set_new(one, "header.a", json_string(r->algorithm));
		if (r->b)
			json_object_set_new(one, "header.b", json_string(r->b));
		if (r->reason)
			json_object_set_new(one, "reason", json_string(r->reason));
		json_array_append_new(dkim, one);
	}
	json_object_set_new(auth, "dkim", dkim);

	/* DMARC, and what the listener does about it. */
	if (v->policy->dmarc != VERIFY_DMARC_OFF)
	{
		json_t *dmarc;

		if (v->dmarc)
		{
			struct dmarc_verdict d;
			const char			*action = "none";

			dmarc_check_evaluate(v->dmarc, spf_for_dmarc, spf_domain, sigs, nsigs, &d);
			dmarc = auth_result(d.result, "header.from", d.from_domain);
			if (d.policy)
				json_object_set_new(dmarc, "policy.dmarc", json_string(d.policy));
			if (d.reason)
				json_object_set_new(dmarc, "reason", json_string(d.reason));
			if (strcmp(d.result, "fail") == 0 && v->policy->dmarc == VERIFY_DMARC_ENFORCE)
				action = verify_disposition_name(d.disposition);
			/*
			 * RFC 8617 7.2.1: a local policy may trust the chain of a
			 * forwarder it knows (ARC_TRUSTED_SEALERS) over a DMARC fail.
			 */
			if (strcmp(d.result, "fail") == 0 && verify_arc_trusted(v))
			{
				action = "none";
				json_object_set_new(dmarc, "override", json_string("arc"));
				json_object_set_new(dmarc, "reason",
									json_string("DMARC fail overridden by a trusted ARC sealer"));
			}
			json_object_set_new(dmarc, "action", json_string(action));
			if (strcmp(action, "reject") == 0)
				v->refusal = xasprintf("550 5.7.1 Message rejected by the DMARC policy of %s",
									   d.from_domain);
			log_info("%s: dmarc %s for %s (policy %s, action %s)", v->client_ip, d.result,
					 d.from_domain, d.policy ? d.policy : "-", action);
			dmarc_tally_add(&d, action, v->client_ip, spf_domain, v->spf_mail.started ? "mfrom" : "helo",
							spf_for_dmarc, sigs, nsigs);
		}
		else
		{
			/* No single From domain: DMARC cannot apply (RFC 7489 6.6.1). */
			dmarc = auth_result(v->from_problem ? "permerror" : "none", NULL, NULL);
			if (v->from_problem)
				json_object_set_new(dmarc, "reason", json_string(v->from_problem));
			json_object_set_new(dmarc, "action", json_string("none"));
		}
		json_object_set_new(auth, "dmarc", dmarc);
	}
	json_object_set_new(auth, "arc", verify_arc_state(v));

	if (v->refusal == NULL && v->policy->spf_reject && v->spf_mail.started && v->spf_mail.done
		&& v->spf_mail.result == SPF_FAIL)
		v->refusal = xasprintf("550 5.7.23 SPF validation failed for %s%s%s", spf_domain,
							   v->spf_mail.explanation ? ": " : "",
							   v->spf_mail.explanation ? v->spf_mail.explanation : "");
	free(helo_identity);
	v->auth = auth;
}

void
verify_findings(struct verify *v, struct verify_findings *out)
{
	out->auth = v->auth;
	out->iprev = v->iprev_state;
	out->client_name = v->iprev_name && strcmp(v->iprev_result, "pass") == 0 ? v->iprev_name : NULL;
	out->refusal = v->refusal;
}
