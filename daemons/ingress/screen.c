/*
 * screen.c: see screen.h.  The DNSBL lookups of one client run on the
 * event loop with the resolver message authentication uses (and its
 * circuit breaker); their verdicts are kept per client address for
 * DNSBL_TTL, in this process and in pepsi.screen_verdict, which every
 * ingress host sharing the database reads (asked while the lookups run:
 * a verdict found there ends them).
 */
#include "screen.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "db_query.h"

struct screen_site
{
	char		 *domain;
	int			  weight;
	bool		  filtered;		/* =filter given */
	unsigned char octet[4][32]; /* the values each reply octet may have, a bit each */
};

#define SCREEN_CACHE_BUCKETS 4096
#define SCREEN_CACHE_MAX 100000

struct screen_cached
{
	char				  ip[64];
	enum screen_verdict	  verdict;
	char				 *list; /* the list named in the refusal, or NULL */
	ev_tstamp			  expires;
	struct screen_cached *next;
};

static struct
{
	struct ev_loop		  *loop;
	struct dns_resolver	  *resolver;
	struct screen_site	  *sites;
	size_t				   count;
	int					   threshold;		/* DNSBL_THRESHOLD */
	int					   allow_threshold; /* DNSBL_ALLOWLIST_THRESHOLD; 0: none */
	double				   ttl;				/* DNSBL_TTL, seconds */
	struct screen_cached  *cache[SCREEN_CACHE_BUCKETS];
	size_t				   cached;
	struct screen_retired *retired; /* lists replaced by a reload, which screens started before may read */
} screen_global;

/* The sites a reload replaced: kept until shutdown (a few per reload), as lookups may still answer for them. */
struct screen_retired
{
	struct screen_site	  *sites;
	size_t				   count;
	struct screen_retired *next;
};

struct screen_lookup
{
	struct screen	 *screen;
	size_t			  site;
	struct dns_query *query;
};

struct screen
{
	char					  ip[64];
	enum screen_verdict		  verdict;
	char					 *list;
	int						  score;
	int						  list_weight; /* of list */
	size_t					  pending;
	const struct screen_site *sites; /* the lists in force when it started */
	struct screen_lookup	 *lookups;
	size_t					  nlookups;
	bool					  from_cache; /* the verdict was kept from an earlier session */
	screen_done_fn			  done;
	void					 *arg;
	struct db_query			 *kept;	  /* the verdict kept in pepsi.screen_verdict, being read */
	ev_timer				  notify; /* done, from the loop */
};

/*
 * DNSBL_SITES: "list.example[=127.0.0.[2..11]][*3], ..."
 */

/* One octet of a filter: a number, or [n;n..m;...]; sets its bits in set. */
static const char *
screen_parse_octet(const char *p, unsigned char set[32])
{
	char *end;
	long  from,
		to;

	if (*p != '[')
	{
		from = strtol(p, &end, 10);
		if (end == p || from < 0 || from > 255)
			return NULL;
		set[from / 8] |= (unsigned char) (1u << (from % 8));
		return end;
	}
	p++;
	for (;;)
	{
		from = strtol(p, &end, 10);
		if (end == p || from < 0 || from > 255)
			return NULL;
		to = from;
		p = end;
		if (strncmp(p, "..", 2) == 0)
		{
			to = strtol(p + 2, &end, 10);
			if (end == p + 2 || to < from || to > 255)
				return NULL;
			p = end;
		}
		for (long v = from; v <= to; v++)
			set[v / 8] |= (unsigned char) (1u << (v % 8));
		if (*p == ']')
			return p + 1;
		if (*p != ';')
			return NULL;
		p++;
	}
}

static bool
screen_parse_site(const char *token, struct screen_site *site, char *err, size_t errlen)
{
	size_t		len = strcspn(token, "=*");
	const char *p = token + len;

	memset(site, 0, sizeof(*site));
	site->weight = 1;
	if (len == 0 || len > 200)
		goto bad;
	site->domain = xstrndup(token, len);
	for (char *d = site->domain; *d; d++)
	{
		if (!isalnum((unsigned char) *d) && *d != '-' && *d != '.' && *d != '_')
			goto bad;
		*d = (char) tolower((unsigned char) *d);
	}
	if (*p == '=')
	{
		p++;
		site->filtered = true;
		for (int i = 0; i < 4; i++)
		{
			if ((p = screen_parse_octet(p, site->octet[i])) == NULL)
				goto bad;
			if (i < 3 && *p++ != '.')
				goto bad;
		}
	}
	if (*p == '*')
	{
		char *end;
		long  w;

		errno = 0;
		w = strtol(p + 1, &end, 10);
		if (end == p + 1 || errno || w < -1000000 || w > 1000000 || w == 0)
			goto bad;
		site->weight = (int) w;
		p = end;
	}
	if (*p == '\0')
		return true;
bad:
	snprintf(err, errlen,
			 "[ingress] DNSBL_SITES: \"%s\" is not list.domain[=d.d.d.d][*weight] (an octet: n, "
			 "[n..m] or [n;m]; a weight: a whole number, negative for an allow-list)",
			 token);
	free(site->domain);
	site->domain = NULL;
	return false;
}

bool
screen_sites_parse(const char *text, struct screen_site **sites, size_t *count, char *err,
				   size_t errlen)
{
	char *copy = xstrdup(text ? text : "");
	char *save = NULL;

	*sites = NULL;
	*count = 0;
	for (char *t = strtok_r(copy, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save))
	{
		*sites = xrealloc(*sites, (*count + 1) * sizeof(**sites));
		if (!screen_parse_site(t, &(*sites)[*count], err, errlen))
		{
			screen_sites_free(*sites, *count);
			*sites = NULL;
			*count = 0;
			free(copy);
			return false;
		}
		(*count)++;
	}
	free(copy);
	return true;
}

void
screen_sites_free(struct screen_site *sites, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(sites[i].domain);
	free(sites);
}

bool
screen_site_matches(const struct screen_site *sites, size_t i, const unsigned char reply[4],
					int *weight)
{
	const struct screen_site *site = &sites[i];

	*weight = site->weight;
	/* 127.255.255.x: the list's own error (query refused, rate limited), not a listing. */
	if (reply[0] == 127 && reply[1] == 255 && reply[2] == 255)
		return false;
	if (!site->filtered)
		return true;
	for (int o = 0; o < 4; o++)
		if (!(site->octet[o][reply[o] / 8] & (1u << (reply[o] % 8))))
			return false;
	return true;
}

/*
 * Options
 */

static void screen_cache_clear(void);

bool
screen_configure(const struct pepsi_config *cfg, struct dns_resolver *resolver, char *err,
				 size_t errlen)
{
	struct screen_site *sites;
	size_t				count;

	struct screen_retired *retired;

	if (!screen_sites_parse(config_text(cfg, "ingress", "DNSBL_SITES"), &sites, &count, err,
							errlen))
		return false;
	if (screen_global.sites)
	{
		retired = xmalloc(sizeof(*retired));
		*retired = (struct screen_retired){screen_global.sites, screen_global.count,
										   screen_global.retired};
		screen_global.retired = retired;
	}
	/* The verdicts kept here were reached with the old lists and thresholds. */
	screen_cache_clear();
	screen_global.sites = sites;
	screen_global.count = count;
	screen_global.loop = dns_resolver_loop(resolver);
	screen_global.resolver = resolver;
	screen_global.threshold = (int) config_int(cfg, "ingress", "DNSBL_THRESHOLD");
	screen_global.allow_threshold = (int) config_int(cfg, "ingress", "DNSBL_ALLOWLIST_THRESHOLD");
	screen_global.ttl = config_duration_ms(cfg, "ingress", "DNSBL_TTL") / 1000.0;
	return true;
}

bool
screen_enabled(void)
{
	return screen_global.count > 0;
}

static unsigned
screen_hash(const char *ip)
{
	unsigned h = 5381;

	for (const char *p = ip; *p; p++)
		h = h * 33 + (unsigned char) *p;
	return h % SCREEN_CACHE_BUCKETS;
}

static void
screen_cache_clear(void)
{
	for (size_t b = 0; b < SCREEN_CACHE_BUCKETS; b++)
		while (screen_global.cache[b])
		{
			struct screen_cached *c = screen_global.cache[b];

			screen_global.cache[b] = c->next;
			free(c->list);
			free(c);
		}
	screen_global.cached = 0;
}

void
screen_shutdown(void)
{
	screen_cache_clear();
	screen_sites_free(screen_global.sites, screen_global.count);
	screen_global.sites = NULL;
	screen_global.count = 0;
	while (screen_global.retired)
	{
		struct screen_retired *r = screen_global.retired;

		screen_global.retired = r->next;
		screen_sites_free(r->sites, r->count);
		free(r);
	}
}

bool
screen_check(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	struct screen_site *sites;
	size_t				count;

	if (!screen_sites_parse(config_text(cfg, "ingress", "DNSBL_SITES"), &sites, &count, err,
							errlen))
		return false;
	screen_sites_free(sites, count);
	return true;
}

/*
 * The verdicts kept
 */

static struct screen_cached *
screen_cache_find(const char *ip)
{
	struct screen_cached **p = &screen_global.cache[screen_hash(ip)];
	ev_tstamp			   now = ev_now(screen_global.loop);

	while (*p)
	{
		struct screen_cached *c = *p;

		if (c->expires <= now)
		{
			*p = c->next;
			free(c->list);
			free(c);
			screen_global.cached--;
			continue;
		}
		if (strcmp(c->ip, ip) == 0)
			return c;
		p = &c->next;
	}
	return NULL;
}

static const char *const screen_kept_names[] = {"", "pass", "allowed", "listed",
												"pregreet", "pipelining", "bare newline"};

/* Into pepsi.screen_verdict too, for the other hosts and the next start. */
static void
screen_keep(const char *ip, enum screen_verdict verdict, const char *list)
{
	char		ttl[32];
	const char *values[4];

	if (!db_query_available() || verdict == SCREEN_PENDING || screen_global.ttl <= 0)
		return;
	snprintf(ttl, sizeof(ttl), "%.3f seconds", screen_global.ttl);
	values[0] = ip;
	values[1] = screen_kept_names[verdict];
	values[2] = list;
	values[3] = ttl;
	db_query_send("SELECT pepsi.screen_verdict_put($1, $2, $3, $4::interval)", 4, values, NULL, NULL);
}

static void
screen_cache_store(const char *ip, enum screen_verdict verdict, const char *list)
{
	struct screen_cached *c = screen_cache_find(ip);

	if (c == NULL)
	{
		if (screen_global.cached >= SCREEN_CACHE_MAX || screen_global.ttl <= 0)
			return;
		c = xcalloc(1, sizeof(*c));
		snprintf(c->ip, sizeof(c->ip), "%s", ip);
		c->next = screen_global.cache[screen_hash(ip)];
		screen_global.cache[screen_hash(ip)] = c;
		screen_global.cached++;
	}
	c->verdict = verdict;
	free(c->list);
	c->list = list ? xstrdup(list) : NULL;
	c->expires = ev_now(screen_global.loop) + screen_global.ttl;
}

void
screen_pregreet(const char *client_ip)
{
	log_info("%s: screen verdict: PREGREET (talked before the greeting)", client_ip);
	screen_cache_store(client_ip, SCREEN_PREGREET, NULL);
	screen_keep(client_ip, SCREEN_PREGREET, NULL);
}

void
screen_violation(struct screen *sc, enum screen_verdict verdict)
{
	if (sc->verdict == verdict)
		return;
	log_info("%s: screen verdict: %s", sc->ip, verdict == SCREEN_PIPELINING ? "PIPELINING (commands sent without waiting, PIPELINING not offered)" : "BARE NEWLINE (a command ended with a bare LF)");
	for (size_t i = 0; i < sc->nlookups; i++)
		if (sc->lookups[i].query)
		{
			dns_cancel(sc->lookups[i].query);
			sc->lookups[i].query = NULL;
		}
	db_query_cancel(sc->kept);
	sc->kept = NULL;
	sc->verdict = verdict;
	screen_cache_store(sc->ip, verdict, NULL);
	screen_keep(sc->ip, verdict, NULL);
}

/*
 * A client's lookups
 */

static const char *
screen_verdict_name(enum screen_verdict v)
{
	static const char *const names[] = {"pending", "pass", "allowed (DNSWL)", "listed (DNSBL)",
										"PREGREET", "PIPELINING", "BARE NEWLINE"};

	return names[v];
}

static void
screen_conclude(struct screen *sc)
{
	struct screen_cached *cached;

	if (sc->score >= screen_global.threshold)
		sc->verdict = SCREEN_LISTED;
	else if (screen_global.allow_threshold < 0 && sc->score <= screen_global.allow_threshold)
		sc->verdict = SCREEN_ALLOWED;
	else
		sc->verdict = SCREEN_PASS;
	log_info("%s: screen verdict: %s, DNSBL score %d%s%s", sc->ip, screen_verdict_name(sc->verdict),
			 sc->score, sc->list ? ", listed by " : "", sc->list ? sc->list : "");
	/* A talker's verdict stands until it expires. */
	cached = screen_cache_find(sc->ip);
	if (cached == NULL || cached->verdict != SCREEN_PREGREET)
	{
		screen_cache_store(sc->ip, sc->verdict, sc->verdict == SCREEN_LISTED ? sc->list : NULL);
		screen_keep(sc->ip, sc->verdict, sc->verdict == SCREEN_LISTED ? sc->list : NULL);
	}
	db_query_cancel(sc->kept);
	sc->kept = NULL;
	if (sc->done)
		sc->done(sc->arg);
}

static void
screen_on_answer(void *arg, const struct dns_answer *a)
{
	struct screen_lookup *l = arg;
	struct screen		 *sc = l->screen;
	int					  weight = 0;
	bool				  listed = false;

	l->query = NULL;
	/* NXDOMAIN, a timeout, SERVFAIL: not listed. */
	if (a->status == DNS_OK)
		for (size_t i = 0; i < a->count && !listed; i++)
			if (a->records[i].type == DNS_TYPE_A && a->records[i].rdata_len == 4)
				listed = screen_site_matches(sc->sites, l->site, a->records[i].rdata,
											 &weight);
	if (a->status == DNS_TIMEOUT || a->status == DNS_TEMPFAIL)
		log_info("%s: DNSBL %s did not answer: counted as not listed", sc->ip,
				 sc->sites[l->site].domain);
	if (listed)
	{
		sc->score += weight;
		if (weight > sc->list_weight)
		{
			free(sc->list);
			sc->list = xstrdup(sc->sites[l->site].domain);
			sc->list_weight = weight;
		}
	}
	if (--sc->pending == 0)
		screen_conclude(sc);
}

/* pepsi.screen_verdict answered: a verdict kept there (by any host) ends the lookups. */
static void
screen_on_kept(void *arg, const PGresult *res)
{
	struct screen *sc = arg;
	const char	  *name;

	sc->kept = NULL;
	if (sc->verdict != SCREEN_PENDING)
		return;
	name = res && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0) ? PQgetvalue(res, 0, 0) : NULL;
	for (int v = SCREEN_PASS; name && v <= SCREEN_BARE_NEWLINE; v++)
		if (strcmp(name, screen_kept_names[v]) == 0)
		{
			sc->verdict = (enum screen_verdict) v;
			free(sc->list);
			sc->list = PQgetisnull(res, 0, 1) ? NULL : xstrdup(PQgetvalue(res, 0, 1));
			screen_cache_store(sc->ip, sc->verdict, sc->list);
			for (size_t i = 0; i < sc->nlookups; i++)
				if (sc->lookups[i].query)
				{
					dns_cancel(sc->lookups[i].query);
					sc->lookups[i].query = NULL;
				}
			if (sc->done)
				sc->done(sc->arg);
			return;
		}
	/* Nothing kept: the lookups decide; without lists, it passes. */
	if (sc->nlookups == 0)
	{
		sc->verdict = SCREEN_PASS;
		if (sc->done)
			sc->done(sc->arg);
	}
}

/* "4.3.2.1" (or the IPv6 nibbles) of ip, then ".list". */
static bool
screen_query_name(const char *ip, const char *list, char *out, size_t outlen)
{
	char  reverse[128];
	char *suffix;

	if (!dns_reverse_name(ip, reverse, sizeof(reverse)))
		return false;
	if ((suffix = strstr(reverse, ".in-addr.arpa")) == NULL)
		suffix = strstr(reverse, ".ip6.arpa");
	if (suffix == NULL)
		return false;
	*suffix = '\0';
	return (size_t) snprintf(out, outlen, "%s.%s", reverse, list) < outlen;
}

static void
screen_on_notify(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct screen *sc = w->data;

	if (sc->done)
		sc->done(sc->arg);
}

struct screen *
screen_start(const char *client_ip)
{
	struct screen		 *sc = xcalloc(1, sizeof(*sc));
	struct screen_cached *cached;

	snprintf(sc->ip, sizeof(sc->ip), "%s", client_ip);
	ev_timer_init(&sc->notify, screen_on_notify, 0, 0);
	sc->notify.data = sc;
	if ((cached = screen_cache_find(client_ip)) != NULL)
	{
		sc->verdict = cached->verdict;
		sc->list = cached->list ? xstrdup(cached->list) : NULL;
		sc->from_cache = true;
		return sc;
	}
	sc->verdict = SCREEN_PENDING;
	if (db_query_available())
	{
		const char *values[1] = {client_ip};

		sc->kept = db_query_send("SELECT verdict, list FROM pepsi.screen_verdict_get($1)", 1, values,
								 screen_on_kept, sc);
	}
	if (screen_global.count == 0)
	{
		if (sc->kept == NULL)
			sc->verdict = SCREEN_PASS;
		return sc;
	}
	sc->sites = screen_global.sites;
	sc->lookups = xcalloc(screen_global.count, sizeof(*sc->lookups));
	sc->nlookups = screen_global.count;
	sc->pending = screen_global.count;
	for (size_t i = 0; i < screen_global.count; i++)
	{
		char name[512];

		sc->lookups[i].screen = sc;
		sc->lookups[i].site = i;
		if (!screen_query_name(client_ip, screen_global.sites[i].domain, name, sizeof(name)))
			snprintf(name, sizeof(name), "invalid.");
		/* Answered from the loop, never from here: pending counts them all first. */
		sc->lookups[i].query = dns_resolve(screen_global.resolver, name, DNS_TYPE_A, NULL,
										   screen_on_answer, &sc->lookups[i]);
	}
	return sc;
}

bool
screen_from_cache(const struct screen *sc)
{
	return sc->from_cache;
}

enum screen_verdict
screen_verdict(const struct screen *sc, const char **list)
{
	*list = sc->list ? sc->list : "";
	return sc->verdict;
}

void
screen_wait(struct screen *sc, screen_done_fn done, void *arg)
{
	sc->done = done;
	sc->arg = arg;
	if (sc->verdict != SCREEN_PENDING)
		ev_timer_start(screen_global.loop, &sc->notify);
}

void
screen_free(struct screen *sc)
{
	if (sc == NULL)
		return;
	ev_timer_stop(screen_global.loop, &sc->notify);
	db_query_cancel(sc->kept);
	if (sc->lookups)
		for (size_t i = 0; i < sc->nlookups; i++)
			if (sc->lookups[i].query)
				dns_cancel(sc->lookups[i].query);
	free(sc->lookups);
	free(sc->list);
	free(sc);
}
