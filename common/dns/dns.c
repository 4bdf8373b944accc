/*
 * dns.c: see dns.h.  libunbound runs the lookups on its own thread and
 * signals answers on ub_fd, which we watch; our own timer per lookup
 * bounds what libunbound would otherwise retry for minutes.  Every answer
 * is decoded here once, with hostile input in mind: names are checked
 * label by label, lengths against the record's.
 */
#include "dns/dns.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unbound.h>

#include "base/log.h"
#include "base/xalloc.h"

#define DNS_DEFAULT_TIMEOUT_MS 5000
/*
 * The resolver's cache: answers for their TTL, bounded in time and in
 * number.  A daemon's is its loop's; a stage worker's (the blocking form,
 * no loop) is the worker's own, so that the same MX and MTA-STS lookups
 * of every message to a domain cost no round trip to libunbound's thread
 * (bench/list: about a third of a relay worker's CPU went to those).
 */
#define DNS_CACHE_BUCKETS 4096
#define DNS_CACHE_MAX_ENTRIES 16384
#define DNS_CACHE_MAX_TTL 300
#define DNS_CACHE_NEGATIVE_TTL 60

struct dns_cache_entry
{
	char				   *key; /* "type/name", the name in lower case */
	ev_tstamp				expires;
	struct dns_answer		answer;
	struct dns_cache_entry *next;
};

struct dns_resolver
{
	struct ev_loop			*loop;
	struct ub_ctx			*ub; /* NULL with a backend */
	struct dns_backend		 backend;
	ev_io					 io;
	double					 timeout;
	size_t					 in_flight;
	struct dns_cache_entry **cache; /* DNS_CACHE_BUCKETS chains; NULL for a backend */
	size_t					 cache_count;
	size_t					 cache_hits; /* lookups the cache answered (dns_cache_answered) */
	/* The circuit breaker (dns_resolver_breaker) */
	double			  probe_interval; /* 0: no breaker */
	bool			  breaker_open;	  /* lookups answered DNS_TEMPFAIL at once */
	ev_tstamp		  last_answer;	  /* when the resolver last answered (OK or NXDOMAIN) */
	ev_timer		  probe_timer;
	struct dns_query *probe;
};

struct dns_query
{
	struct dns_resolver *resolver;
	int					 async_id;
	bool				 started;	   /* false: refused (bad name, spent budget), answered by the timer */
	bool				 full_timeout; /* waits the whole DNS_TIMEOUT (no budget cut it short) */
	ev_tstamp			 started_at;
	enum dns_status		 refusal; /* the answer then */
	ev_timer			 timer;
	dns_callback		 cb;
	void				*arg;
	char				*cache_key; /* to keep the answer under */
	struct dns_answer	*cached;	/* answered from the cache (by the timer) */
	/* The blocking form waits for these */
	bool			   sync;
	bool			   answered;
	struct dns_answer *sync_answer;
};

/*
 * Configuration
 */

bool
dns_config_load(const struct pepsi_config *cfg, struct dns_config *out, char *err, size_t errlen)
{
	const char *forwarder = config_get(cfg, "pepsi", "DNS_FORWARDER");
	const char *anchor = config_get(cfg, "pepsi", "DNS_TRUST_ANCHOR");
	long long	timeout_ms = config_duration_ms(cfg, "pepsi", "DNS_TIMEOUT");

	memset(out, 0, sizeof(*out));
	if (forwarder && *forwarder)
	{
		/* "addr@port" is libunbound's spelling; check it here to name the option. */
		const char	 *at = strchr(forwarder, '@');
		char		  addr[INET6_ADDRSTRLEN + 1];
		unsigned char bin[16];
		size_t		  alen = at ? (size_t) (at - forwarder) : strlen(forwarder);

		if (alen == 0 || alen >= sizeof(addr))
		{
			snprintf(err, errlen, "[pepsi] DNS_FORWARDER: \"%s\" is not an address", forwarder);
			return false;
		}
		memcpy(addr, forwarder, alen);
		addr[alen] = '\0';
		if (inet_pton(AF_INET, addr, bin) != 1 && inet_pton(AF_INET6, addr, bin) != 1)
		{
			snprintf(err, errlen, "[pepsi] DNS_FORWARDER: \"%s\" is not an IP address", addr);
			return false;
		}
		if (at)
		{
			char *end;
			long  port = strtol(at + 1, &end, 10);

			if (at[1] == '\0' || *end || port < 1 || port > 65535)
			{
				snprintf(err, errlen, "[pepsi] DNS_FORWARDER: \"%s\" is not a port", at + 1);
				return false;
			}
		}
		out->forwarder = xstrdup(forwarder);
	}
	if (anchor && *anchor)
		out->trust_anchor = xstrdup(anchor);
	out->timeout = timeout_ms / 1000.0;
	return true;
}

void
dns_config_free(struct dns_config *c)
{
	free(c->forwarder);
	free(c->trust_anchor);
	memset(c, 0, sizeof(*c));
}

/*
 * Answers
 */

/*
 * A name in uncompressed wire format (libunbound expands compression) to
 * dotted text; NULL if it is malformed or holds what no host name may
 * (a dot or a control character inside a label, say).
 */
static char *
dns_decode_name(const unsigned char *p, size_t len)
{
	char   name[1025];
	size_t pos = 0,
		   out = 0;

	while (pos < len)
	{
		size_t label = p[pos++];

		if (label == 0)
		{
			if (out == 0)
				return xstrdup(".");
			name[out - 1] = '\0'; /* the last dot */
			return xstrdup(name);
		}
		if (label > 63 || pos + label > len || out + label + 1 >= sizeof(name))
			return NULL;
		for (size_t i = 0; i < label; i++)
		{
			unsigned char c = p[pos + i];

			if (c <= ' ' || c >= 0x7f || c == '.')
				return NULL;
			name[out++] = (char) c;
		}
		name[out++] = '.';
		pos += label;
	}
	return NULL;
}

void
dns_answer_add(struct dns_answer *a, enum dns_type type, const void *rdata, size_t len)
{
	const unsigned char *p = rdata;
	struct dns_record	*r;

	a->records = xrealloc(a->records, (a->count + 1) * sizeof(*a->records));
	r = &a->records[a->count++];
	memset(r, 0, sizeof(*r));
	r->type = (uint16_t) type;
	r->len = len;
	r->rdata_len = len;
	r->rdata = xmalloc(len + 1);
	memcpy(r->rdata, rdata, len);
	switch (type)
	{
		case DNS_TYPE_TXT:
			{
				/* Character-strings, each with its length octet: joined. */
				size_t pos = 0,
					   out = 0;

				r->text = xmalloc(len + 1);
				while (pos < len)
				{
					size_t n = p[pos++];

					if (pos + n > len)
						n = len - pos; /* truncated: keep what is there */
					memcpy(r->text + out, p + pos, n);
					out += n;
					pos += n;
				}
				r->text[out] = '\0';
				r->len = out;
				break;
			}
		case DNS_TYPE_MX:
			if (len >= 3)
			{
				r->preference = (uint16_t) (p[0] << 8 | p[1]);
				r->text = dns_decode_name(p + 2, len - 2);
			}
			break;
		case DNS_TYPE_PTR:
		case DNS_TYPE_CNAME:
			r->text = dns_decode_name(p, len);
			break;
		default:
			break;
	}
}

void
dns_answer_free(struct dns_answer *a)
{
	for (size_t i = 0; i < a->count; i++)
	{
		free(a->records[i].rdata);
		free(a->records[i].text);
	}
	free(a->records);
	memset(a, 0, sizeof(*a));
}

static void
dns_answer_copy(struct dns_answer *dst, const struct dns_answer *src)
{
	*dst = *src;
	dst->records = src->count ? xcalloc(src->count, sizeof(*dst->records)) : NULL;
	for (size_t i = 0; i < src->count; i++)
	{
		const struct dns_record *s = &src->records[i];
		struct dns_record		*d = &dst->records[i];

		*d = *s;
		d->rdata = xmalloc(s->rdata_len + 1);
		memcpy(d->rdata, s->rdata, s->rdata_len + 1);
		if (s->text)
		{
			size_t n = s->type == DNS_TYPE_TXT ? s->len : strlen(s->text);

			d->text = xmalloc(n + 1);
			memcpy(d->text, s->text, n + 1);
		}
	}
}

static unsigned
dns_cache_hash(const char *key)
{
	unsigned h = 5381;

	for (const char *p = key; *p; p++)
		h = h * 33 + (unsigned char) *p;
	return h % DNS_CACHE_BUCKETS;
}

static char *
dns_cache_key(const char *name, enum dns_type type)
{
	char  *key = xasprintf("%d/%s", (int) type, name);
	size_t len = strlen(key);

	for (char *p = key; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	if (len > 0 && key[len - 1] == '.')
		key[len - 1] = '\0';
	return key;
}

/* The cache's clock: the loop's time, or the monotonic clock's for the blocking form. */
static double
dns_now(const struct dns_resolver *r)
{
	struct timespec now;

	if (r->loop)
		return ev_now(r->loop);
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double) now.tv_sec + now.tv_nsec / 1e9;
}

static void
dns_cache_flush(struct dns_resolver *r)
{
	for (size_t b = 0; r->cache && b < DNS_CACHE_BUCKETS; b++)
		while (r->cache[b])
		{
			struct dns_cache_entry *e = r->cache[b];

			r->cache[b] = e->next;
			free(e->key);
			dns_answer_free(&e->answer);
			free(e);
		}
	r->cache_count = 0;
}

/* A live entry for key, or NULL (an expired one is dropped). */
static struct dns_cache_entry *
dns_cache_find(struct dns_resolver *r, const char *key)
{
	struct dns_cache_entry **p;

	if (r->cache == NULL)
		return NULL;
	for (p = &r->cache[dns_cache_hash(key)]; *p; p = &(*p)->next)
		if (strcmp((*p)->key, key) == 0)
		{
			struct dns_cache_entry *e = *p;

			if (e->expires > dns_now(r))
				return e;
			*p = e->next;
			free(e->key);
			dns_answer_free(&e->answer);
			free(e);
			r->cache_count--;
			return NULL;
		}
	return NULL;
}

/*
 * Keep an answer: a positive one for its TTL, NXDOMAIN for a minute at
 * most; never an error.  An NXDOMAIN without a TTL (no SOA came with it)
 * the loop's cache keeps a minute, the blocking form's not at all, as
 * libunbound, which answered it before it had a cache of its own, does not.
 */
static void
dns_cache_store(struct dns_resolver *r, const char *key, const struct dns_answer *a)
{
	struct dns_cache_entry *e;
	unsigned				ttl = a->ttl;
	unsigned				b;

	if (r->cache == NULL || a->bogus || (a->status != DNS_OK && a->status != DNS_NXDOMAIN))
		return;
	if (a->status == DNS_NXDOMAIN && ttl == 0 && r->loop == NULL)
		return;
	if (a->status == DNS_NXDOMAIN && (ttl == 0 || ttl > DNS_CACHE_NEGATIVE_TTL))
		ttl = DNS_CACHE_NEGATIVE_TTL;
	if (ttl == 0)
		return;
	if (ttl > DNS_CACHE_MAX_TTL)
		ttl = DNS_CACHE_MAX_TTL;
	if (dns_cache_find(r, key))
		return; /* a lookup that raced another: the first stays */
	if (r->cache_count >= DNS_CACHE_MAX_ENTRIES)
		dns_cache_flush(r);
	e = xcalloc(1, sizeof(*e));
	e->key = xstrdup(key);
	e->expires = dns_now(r) + ttl;
	dns_answer_copy(&e->answer, a);
	b = dns_cache_hash(key);
	e->next = r->cache[b];
	r->cache[b] = e;
	r->cache_count++;
}

static void
dns_answer_from_unbound(struct dns_answer *a, int err, struct ub_result *result)
{
	memset(a, 0, sizeof(*a));
	if (err != 0 || result == NULL)
	{
		a->status = DNS_TEMPFAIL;
		return;
	}
	a->secure = result->secure != 0;
	a->bogus = result->bogus != 0;
	a->ttl = result->ttl > 0 ? (unsigned) result->ttl : 0;
	if (result->bogus)
		a->status = DNS_TEMPFAIL;
	else if (result->rcode == 3) /* NXDOMAIN */
		a->status = DNS_NXDOMAIN;
	else if (result->rcode != 0)
		a->status = DNS_TEMPFAIL;
	else
	{
		a->status = DNS_OK;
		for (size_t i = 0; result->havedata && result->data[i]; i++)
		{
			size_t len = (size_t) result->len[i];

			/* Addresses of the wrong length are dropped, not trusted. */
			if ((result->qtype == DNS_TYPE_A && len != 4)
				|| (result->qtype == DNS_TYPE_AAAA && len != 16))
				continue;
			dns_answer_add(a, (enum dns_type) result->qtype, result->data[i], len);
		}
	}
}

/*
 * Lookups
 */

/*
 * The circuit breaker: when a lookup waits out its whole timeout and the
 * resolver answered nothing at all meanwhile, the resolver is taken to be
 * down, and lookups are answered DNS_TEMPFAIL at once (the cache still
 * answers) until a probe of the root is answered.  Without it, a daemon
 * whose resolver stopped answering spent DNS_TIMEOUT on every message.
 */

static void dns_on_probe_timer(struct ev_loop *loop, ev_timer *w, int revents);

static void
dns_breaker_answered(struct dns_resolver *r)
{
	r->last_answer = ev_now(r->loop);
	if (!r->breaker_open)
		return;
	r->breaker_open = false;
	ev_timer_stop(r->loop, &r->probe_timer);
	log_info("dns: the resolver answers again: lookups go to it again");
}

static void
dns_breaker_timed_out(struct dns_resolver *r, const struct dns_query *q)
{
	if (r->probe_interval <= 0 || r->breaker_open || !q->full_timeout
		|| r->last_answer >= q->started_at)
		return;
	r->breaker_open = true;
	log_warnx("dns: the resolver answered nothing for %.1fs: lookups are answered temperror at "
			  "once until it answers a probe (every %.1fs)",
			  r->timeout, r->probe_interval);
	ev_timer_set(&r->probe_timer, r->probe_interval, 0);
	ev_timer_start(r->loop, &r->probe_timer);
}

static void
dns_on_probe_answer(void *arg, const struct dns_answer *a)
{
	struct dns_resolver *r = arg;

	r->probe = NULL;
	/* An answer closed the breaker already (dns_query_finish); else probe again. */
	if (r->breaker_open)
	{
		ev_timer_set(&r->probe_timer, r->probe_interval, 0);
		ev_timer_start(r->loop, &r->probe_timer);
	}
}

void
dns_resolver_breaker(struct dns_resolver *r, double probe_interval)
{
	r->probe_interval = probe_interval;
	ev_timer_init(&r->probe_timer, dns_on_probe_timer, probe_interval, 0);
	r->probe_timer.data = r;
}

bool
dns_resolver_down(const struct dns_resolver *r)
{
	return r->breaker_open;
}

/* a is the callee's to take apart (the blocking form keeps its records). */
static void
dns_query_finish(struct dns_query *q, struct dns_answer *a)
{
	struct dns_resolver *r = q->resolver;

	r->in_flight--;
	if (q->sync)
	{
		if (q->cache_key)
			dns_cache_store(r, q->cache_key, a);
		*q->sync_answer = *a;
		memset(a, 0, sizeof(*a));
		q->answered = true;
		return;
	}
	ev_timer_stop(r->loop, &q->timer);
	if (q->started && (a->status == DNS_OK || a->status == DNS_NXDOMAIN))
		dns_breaker_answered(r);
	if (q->cache_key)
		dns_cache_store(r, q->cache_key, a);
	q->cb(q->arg, a);
	free(q->cache_key);
	free(q);
}

static void
dns_on_answer(void *arg, int err, struct ub_result *result)
{
	struct dns_query *q = arg;
	struct dns_answer a;

	dns_answer_from_unbound(&a, err, result);
	if (result)
		ub_resolve_free(result);
	if (err)
		log_debug("dns: %s", ub_strerror(err));
	dns_query_finish(q, &a);
	dns_answer_free(&a);
}

void
dns_query_answer(struct dns_query *q, const struct dns_answer *a)
{
	struct dns_answer copy = *a;

	dns_query_finish(q, &copy);
}

static void
dns_on_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct dns_query *q = w->data;
	struct dns_answer a;

	if (q->cached)
	{
		struct dns_answer *cached = q->cached;

		q->cached = NULL;
		dns_query_finish(q, cached);
		dns_answer_free(cached);
		free(cached);
		return;
	}
	memset(&a, 0, sizeof(a));
	a.status = q->started ? DNS_TIMEOUT : q->refusal;
	if (q->started)
		dns_breaker_timed_out(q->resolver, q);
	if (q->started && q->resolver->ub)
		ub_cancel(q->resolver->ub, q->async_id);
	else if (q->started)
		q->resolver->backend.cancel(q->resolver->backend.data, q);
	dns_query_finish(q, &a);
}

static void
dns_on_readable(struct ev_loop *loop, ev_io *w, int revents)
{
	struct dns_resolver *r = w->data;
	int					 err = ub_process(r->ub);

	if (err != 0)
		log_warnx("dns: %s", ub_strerror(err));
}

static bool
dns_start(struct dns_query *q, const char *name, enum dns_type type)
{
	struct dns_resolver *r = q->resolver;

	if (r->ub == NULL)
		r->backend.start(r->backend.data, q, name, type);
	else if (ub_resolve_async(r->ub, name, (int) type, 1, q, dns_on_answer, &q->async_id) != 0)
		return false;
	q->started = true;
	return true;
}

/* A name libunbound can be given: what the wire format can carry. */
static bool
dns_name_valid(const char *name)
{
	size_t len = strlen(name),
		   label = 0;

	if (len == 0 || len > 253)
		return false;
	for (const char *p = name; *p; p++)
	{
		if (*p == '.')
		{
			if (label == 0 && p[1] != '\0')
				return false;
			label = 0;
		}
		/* A backslash would be an escape to libunbound: it is never given one. */
		else if ((unsigned char) *p < ' ' || (unsigned char) *p >= 0x7f || *p == '\\'
				 || ++label > 63)
			return false;
	}
	return true;
}

static struct dns_query *dns_lookup(struct dns_resolver *r, const char *name, enum dns_type type,
									struct dns_budget *budget, dns_callback cb, void *arg,
									bool probe);

struct dns_query *
dns_resolve(struct dns_resolver *r, const char *name, enum dns_type type,
			struct dns_budget *budget, dns_callback cb, void *arg)
{
	return dns_lookup(r, name, type, budget, cb, arg, false);
}

/* The root's NS: any resolver that works answers it, from its cache mostly. */
static void
dns_on_probe_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct dns_resolver *r = w->data;

	if (r->probe == NULL)
		r->probe = dns_lookup(r, ".", DNS_TYPE_NS, NULL, dns_on_probe_answer, r, true);
}

/* probe: past the breaker and the cache. */
static struct dns_query *
dns_lookup(struct dns_resolver *r, const char *name, enum dns_type type,
		   struct dns_budget *budget, dns_callback cb, void *arg, bool probe)
{
	struct dns_query *q = xcalloc(1, sizeof(*q));
	double			  timeout = r->timeout;
	bool			  refused = false;

	q->resolver = r;
	q->cb = cb;
	q->arg = arg;
	if (budget)
	{
		double left = budget->deadline - ev_now(r->loop);

		if (budget->lookups_left == 0 || left <= 0)
		{
			refused = true;
			q->refusal = DNS_TIMEOUT;
		}
		else
		{
			budget->lookups_left--;
			if (left < timeout)
				timeout = left;
		}
	}
	/* A name the DNS cannot hold does not exist. */
	if (!dns_name_valid(name))
	{
		refused = true;
		q->refusal = DNS_NXDOMAIN;
	}
	if (!refused && r->cache && !probe)
	{
		struct dns_cache_entry *hit;

		q->cache_key = dns_cache_key(name, type);
		if ((hit = dns_cache_find(r, q->cache_key)) != NULL)
		{
			q->cached = xmalloc(sizeof(*q->cached));
			dns_answer_copy(q->cached, &hit->answer);
			r->cache_hits++;
			free(q->cache_key);
			q->cache_key = NULL;
			refused = true; /* not asked: answered by the timer below */
		}
	}
	if (!refused && r->breaker_open && !probe)
	{
		refused = true;
		q->refusal = DNS_TEMPFAIL;
		free(q->cache_key);
		q->cache_key = NULL;
	}
	/* A refused (or cached) lookup is answered from the loop all the same: no reentry. */
	ev_timer_init(&q->timer, dns_on_timeout, refused ? 0 : timeout, 0);
	q->timer.data = q;
	q->full_timeout = timeout >= r->timeout;
	q->started_at = ev_now(r->loop);
	r->in_flight++;
	if (!refused && !dns_start(q, name, type))
	{
		q->refusal = DNS_TEMPFAIL;
		ev_timer_set(&q->timer, 0, 0);
	}
	ev_timer_start(r->loop, &q->timer);
	return q;
}

void
dns_cancel(struct dns_query *q)
{
	struct dns_resolver *r = q->resolver;

	ev_timer_stop(r->loop, &q->timer);
	if (q->started && r->ub)
		ub_cancel(r->ub, q->async_id);
	else if (q->started)
		r->backend.cancel(r->backend.data, q);
	r->in_flight--;
	if (q->cached)
	{
		dns_answer_free(q->cached);
		free(q->cached);
	}
	free(q->cache_key);
	free(q);
}

size_t
dns_in_flight(const struct dns_resolver *r)
{
	return r->in_flight;
}

void
dns_resolve_sync(struct dns_resolver *r, const char *name, enum dns_type type, struct dns_answer *a)
{
	struct dns_query q;
	struct timespec	 start,
		now;

	memset(&q, 0, sizeof(q));
	memset(a, 0, sizeof(*a));
	q.resolver = r;
	q.sync = true;
	q.sync_answer = a;
	if (!dns_name_valid(name))
	{
		a->status = DNS_NXDOMAIN;
		return;
	}
	if (r->cache)
	{
		struct dns_cache_entry *hit;

		q.cache_key = dns_cache_key(name, type);
		if ((hit = dns_cache_find(r, q.cache_key)) != NULL)
		{
			dns_answer_copy(a, &hit->answer);
			a->ttl = (unsigned) (hit->expires - dns_now(r)); /* what is left of it, as libunbound's */
			r->cache_hits++;
			free(q.cache_key);
			return;
		}
	}
	if (r->ub == NULL || !dns_start(&q, name, type))
	{
		free(q.cache_key);
		a->status = DNS_TEMPFAIL;
		return;
	}
	r->in_flight++;
	clock_gettime(CLOCK_MONOTONIC, &start);
	while (!q.answered)
	{
		struct pollfd pfd = {.fd = ub_fd(r->ub), .events = POLLIN};
		double		  elapsed;
		int			  wait_ms;

		clock_gettime(CLOCK_MONOTONIC, &now);
		elapsed = (double) (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
		if (elapsed >= r->timeout)
		{
			ub_cancel(r->ub, q.async_id);
			r->in_flight--;
			free(q.cache_key);
			a->status = DNS_TIMEOUT;
			return;
		}
		wait_ms = (int) ((r->timeout - elapsed) * 1000) + 1;
		if (poll(&pfd, 1, wait_ms) < 0 && errno != EINTR)
			fatal("poll");
		if (pfd.revents)
			ub_process(r->ub);
	}
	free(q.cache_key);
}

size_t
dns_cache_answered(const struct dns_resolver *r)
{
	return r->cache_hits;
}

int
dns_ub_forward(struct ub_ctx *ub, const char *forwarder)
{
	/*
	 * A forwarder on loopback (a local cache, or the tests' server) must
	 * be allowed, and it decides what exists: libunbound's own answers for
	 * the special-use names (localhost, 127.0.0.0/8 and ::1 reverse, test.,
	 * invalid., the documentation networks of RFC 5737 and RFC 3849) step
	 * aside for it.
	 */
	static const char *const special_use[] = {
		"localhost.", "127.in-addr.arpa.",
		"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa.",
		"test.", "invalid.", "2.0.192.in-addr.arpa.", "100.51.198.in-addr.arpa.",
		"113.0.203.in-addr.arpa.", "8.b.d.0.1.0.0.2.ip6.arpa.", NULL};
	int rc;

	if ((rc = ub_ctx_set_option(ub, "do-not-query-localhost:", "no")) != 0 || (rc = ub_ctx_set_fwd(ub, forwarder)) != 0)
		return rc;
	for (size_t i = 0; special_use[i]; i++)
		if ((rc = ub_ctx_zone_remove(ub, special_use[i])) != 0 && rc != UB_NOID)
			return rc;
	return 0;
}

/*
 * Resolvers
 */

struct dns_resolver *
dns_resolver_new(struct ev_loop *loop, const struct dns_config *c, char *err, size_t errlen)
{
	struct dns_resolver *r = xcalloc(1, sizeof(*r));
	int					 rc;

	r->loop = loop;
	r->timeout = c->timeout > 0 ? c->timeout : DNS_DEFAULT_TIMEOUT_MS / 1000.0;
	if ((r->ub = ub_ctx_create()) == NULL)
	{
		snprintf(err, errlen, "cannot create a libunbound context");
		goto err;
	}
	/* A thread, not a forked process: nothing to reap, and no second privilege set. */
	if ((rc = ub_ctx_async(r->ub, 1)) != 0)
		goto unbound_err;
	/* Before the zones below: changing local zones finalizes the context, and a trust anchor comes after none. */
	if (c->trust_anchor && (rc = ub_ctx_add_ta_file(r->ub, c->trust_anchor)) != 0)
	{
		snprintf(err, errlen, "[pepsi] DNS_TRUST_ANCHOR %s: %s", c->trust_anchor, ub_strerror(rc));
		goto err;
	}
	if (c->forwarder)
	{
		if ((rc = dns_ub_forward(r->ub, c->forwarder)) != 0)
			goto unbound_err;
	}
	else if ((rc = ub_ctx_resolvconf(r->ub, NULL)) != 0)
		goto unbound_err;
	r->cache = xcalloc(DNS_CACHE_BUCKETS, sizeof(*r->cache));
	if (loop)
	{
		ev_io_init(&r->io, dns_on_readable, ub_fd(r->ub), EV_READ);
		r->io.data = r;
		ev_io_start(loop, &r->io);
	}
	return r;

unbound_err:
	snprintf(err, errlen, "libunbound: %s", ub_strerror(rc));
err:
	if (r->ub)
		ub_ctx_delete(r->ub);
	free(r);
	return NULL;
}

struct dns_resolver *
dns_resolver_new_backend(struct ev_loop *loop, const struct dns_backend *b, double timeout)
{
	struct dns_resolver *r = xcalloc(1, sizeof(*r));

	r->loop = loop;
	r->backend = *b;
	r->timeout = timeout;
	return r;
}

struct ev_loop *
dns_resolver_loop(const struct dns_resolver *r)
{
	return r->loop;
}

void
dns_resolver_free(struct dns_resolver *r)
{
	if (r == NULL)
		return;
	if (r->probe)
		dns_cancel(r->probe);
	if (r->loop && r->probe_interval > 0)
		ev_timer_stop(r->loop, &r->probe_timer);
	if (r->ub)
	{
		if (r->loop)
			ev_io_stop(r->loop, &r->io);
		ub_ctx_delete(r->ub);
	}
	dns_cache_flush(r);
	free(r->cache);
	free(r);
}

bool
dns_reverse_name(const char *ip, char *out, size_t outlen)
{
	unsigned char a[16];

	if (inet_pton(AF_INET, ip, a) == 1)
	{
		snprintf(out, outlen, "%u.%u.%u.%u.in-addr.arpa", a[3], a[2], a[1], a[0]);
		return true;
	}
	if (inet_pton(AF_INET6, ip, a) == 1 && outlen >= 16 * 4 + sizeof("ip6.arpa"))
	{
		static const char hex[] = "0123456789abcdef";
		size_t			  pos = 0;

		for (int i = 15; i >= 0; i--)
		{
			out[pos++] = hex[a[i] & 0xf];
			out[pos++] = '.';
			out[pos++] = hex[a[i] >> 4];
			out[pos++] = '.';
		}
		strcpy(out + pos, "ip6.arpa");
		return true;
	}
	return false;
}
