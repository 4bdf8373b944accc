/* destination.c: see destination.h. */
#include "destination.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/xalloc.h"
#include "runtime/db.h"
#include "tls_tally.h"

static bool
destination_ok(PGresult *res, PGconn *conn, const char *what, char *err, size_t errlen)
{
	if (PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK)
		return true;
	snprintf(err, errlen, "%s: %s", what, db_error(res, conn));
	return false;
}

static bool
destination_read_addresses(PGconn *conn, const char *host, struct cached_host *out, char *err,
						   size_t errlen)
{
	struct buf	hosts = BUF_INIT;
	const char *values[1];
	PGresult   *res;
	bool		ok;

	memset(out, 0, sizeof(*out));
	buf_append_str(&hosts, "{");
	db_array_append(&hosts, host);
	buf_append_str(&hosts, "}");
	values[0] = hosts.data;
	res = db_exec(conn, "SELECT address, failures, retry_in FROM pepsi.dns_address_current($1)", 1,
				  values);
	ok = destination_ok(res, conn, "pepsi.dns_address_current", err, errlen);
	if (ok)
	{
		int n = PQntuples(res);

		out->count = (size_t) n;
		out->addresses = xcalloc((size_t) n + 1, sizeof(*out->addresses));
		for (int i = 0; i < n; i++)
		{
			out->addresses[i].address = xstrdup(PQgetvalue(res, i, 0));
			out->addresses[i].failures = atoi(PQgetvalue(res, i, 1));
			out->addresses[i].retry_in = atof(PQgetvalue(res, i, 2));
		}
	}
	PQclear(res);
	buf_free(&hosts);
	return ok;
}

/*
 * What this worker read last, per host: a burst of messages to one host
 * reads pepsi.dns_address once a second, not once a message.  What other
 * workers write is seen within that second; what this worker writes drops
 * the host's memo at once.
 */
#define DESTINATION_MEMO_HOSTS 64
#define DESTINATION_MEMO_SECONDS 1.0

struct destination_memo
{
	char			  *host;
	double			   read_at;
	struct cached_host addresses;
};
static struct destination_memo destination_memo[DESTINATION_MEMO_HOSTS];

double
destination_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
destination_copy(const struct cached_host *from, struct cached_host *to)
{
	to->count = from->count;
	to->addresses = xcalloc(from->count + 1, sizeof(*to->addresses));
	for (size_t i = 0; i < from->count; i++)
	{
		to->addresses[i] = from->addresses[i];
		to->addresses[i].address = xstrdup(from->addresses[i].address);
	}
}

static struct destination_memo *
destination_memo_slot(const char *host)
{
	struct destination_memo *oldest = &destination_memo[0];

	for (size_t i = 0; i < DESTINATION_MEMO_HOSTS; i++)
	{
		if (destination_memo[i].host && strcmp(destination_memo[i].host, host) == 0)
			return &destination_memo[i];
		if (destination_memo[i].read_at < oldest->read_at)
			oldest = &destination_memo[i];
	}
	free(oldest->host);
	oldest->host = NULL;
	destination_cached_free(&oldest->addresses);
	return oldest;
}

/* Keep what was just read of host as its memo. */
static void
destination_memo_store(const char *host, const struct cached_host *addresses, double now)
{
	struct destination_memo *m = destination_memo_slot(host);

	if (m->host)
	{
		free(m->host);
		destination_cached_free(&m->addresses);
	}
	m->host = xstrdup(host);
	m->read_at = now;
	destination_copy(addresses, &m->addresses);
}

void
destination_forget(const char *host)
{
	for (size_t i = 0; i < DESTINATION_MEMO_HOSTS; i++)
		if (destination_memo[i].host && strcmp(destination_memo[i].host, host) == 0)
		{
			free(destination_memo[i].host);
			destination_memo[i].host = NULL;
			destination_memo[i].read_at = 0;
			destination_cached_free(&destination_memo[i].addresses);
		}
}

bool
destination_cached_addresses(PGconn *conn, const char *host, struct cached_host *out, char *err,
							 size_t errlen)
{
	struct destination_memo *m = destination_memo_slot(host);
	double					 now = destination_now();

	if (m->host && now - m->read_at < DESTINATION_MEMO_SECONDS)
	{
		/* retry_in counts down as time passes */
		destination_copy(&m->addresses, out);
		for (size_t i = 0; i < out->count; i++)
			out->addresses[i].retry_in -= now - m->read_at;
		return true;
	}
	if (m->host)
	{
		free(m->host);
		m->host = NULL;
		destination_cached_free(&m->addresses);
	}
	if (!destination_read_addresses(conn, host, out, err, errlen))
		return false;
	destination_memo_store(host, out, now);
	return true;
}

void
destination_cached_free(struct cached_host *h)
{
	for (size_t i = 0; i < h->count; i++)
		free(h->addresses[i].address);
	free(h->addresses);
	memset(h, 0, sizeof(*h));
}

bool
destination_store_addresses(PGconn *conn, const char *host, char *const *addresses, size_t count,
							unsigned ttl, char *err, size_t errlen)
{
	struct buf	array = BUF_INIT;
	char		ttl_text[16];
	const char *values[3];
	PGresult   *res;
	bool		ok;

	buf_append_str(&array, "{");
	for (size_t i = 0; i < count; i++)
		db_array_append(&array, addresses[i]);
	buf_append_str(&array, "}");
	snprintf(ttl_text, sizeof(ttl_text), "%u", ttl);
	values[0] = host;
	values[1] = array.data;
	values[2] = ttl_text;
	destination_forget(host);
	res = db_exec(conn, "SELECT pepsi.dns_address_store($1, $2::inet[], $3)", 3, values);
	ok = destination_ok(res, conn, "pepsi.dns_address_store", err, errlen);
	PQclear(res);
	buf_free(&array);
	return ok;
}

/*
 * The memos of hosts from destination_begin's answer: a jsonb array of
 * {host, address, failures, retry_in}, each host's rows together.  A host
 * with no row is remembered with none (it is resolved afresh).
 */
static void
destination_memo_from_json(const char *text, const char *const *hosts, size_t nhosts)
{
	json_t *rows = text && *text ? json_loads(text, 0, NULL) : NULL;
	double	now = destination_now();

	for (size_t h = 0; h < nhosts; h++)
	{
		struct cached_host found = {0};
		size_t			   i;
		json_t			  *row;

		json_array_foreach (rows, i, row)
		{
			const char *host = json_string_value(json_object_get(row, "host"));
			const char *address = json_string_value(json_object_get(row, "address"));

			if (host == NULL || address == NULL || strcmp(host, hosts[h]) != 0)
				continue;
			found.addresses = xrealloc(found.addresses, (found.count + 2) * sizeof(*found.addresses));
			found.addresses[found.count].address = xstrdup(address);
			found.addresses[found.count].failures = (int) json_integer_value(json_object_get(row, "failures"));
			found.addresses[found.count].retry_in = json_number_value(json_object_get(row, "retry_in"));
			found.count++;
		}
		destination_memo_store(hosts[h], &found, now);
		destination_cached_free(&found);
	}
	json_decref(rows);
}

/* The delivery whose slot this worker kept (destination_keep), if any. */
static struct
{
	char  *domain;
	int	   slot;
	char  *ok_host;
	char  *ok_address;
	double seconds;
	bool   contended;
} destination_kept;

static void
destination_kept_clear(void)
{
	free(destination_kept.domain);
	free(destination_kept.ok_host);
	free(destination_kept.ok_address);
	memset(&destination_kept, 0, sizeof(destination_kept));
}

void
destination_keep(const char *domain, int slot, const char *ok_host, const char *ok_address,
				 double seconds, bool contended)
{
	destination_kept_clear();
	destination_kept.domain = xstrdup(domain);
	destination_kept.slot = slot;
	destination_kept.ok_host = ok_host ? xstrdup(ok_host) : NULL;
	destination_kept.ok_address = ok_address ? xstrdup(ok_address) : NULL;
	destination_kept.seconds = seconds;
	destination_kept.contended = contended;
}

int
destination_carry_on(const char *domain)
{
	int slot = destination_kept.slot;

	if (destination_kept.domain == NULL || slot < 0 || strcasecmp(destination_kept.domain, domain) != 0)
		return -1;
	destination_kept_clear();
	return slot;
}

const char *
destination_kept_domain(bool *contended)
{
	*contended = destination_kept.contended;
	return destination_kept.domain;
}

/*
 * destination_begin's call and the columns read from it, one text for
 * its three forms (with the TLS counts, without, and the retry for an
 * extension older than 0.6).  The TLS result recorded and per_message
 * (from 0.14 on) are read through to_jsonb, so that an extension not yet
 * updated answers NULL rather than an error: then every message asks.
 */
#define DESTINATION_BEGIN_COLUMNS                                                  \
	"slot, wait_seconds, reason, contended, addresses, sts_policy_id, sts_policy," \
	" to_jsonb(d) ->> 'tls_policy', to_jsonb(d) ->> 'tls_outcome', to_jsonb(d) ->> 'per_message'"
#define DESTINATION_BEGIN_CALL \
	"pepsi.destination_begin($1, $2, $3::text[], $4, $5, $6, $7::inet, $8, $9, $10, $11, $12) d"

bool
destination_begin(PGconn *conn, const char *domain, const struct destination_share *share,
				  const char *const *hosts, size_t nhosts, struct destination_start *out, char *err,
				  size_t errlen)
{
	char		concurrency[24];
	char		slot_text[16];
	char		seconds[32];
	char		slow_seconds[32];
	char		slow_limit[24];
	char		handoff[32];
	struct buf	host_array = BUF_INIT;
	const char *values[13];
	char	   *tls_counts = internet_tls_tally_due(false);
	bool		tls_sent = tls_counts != NULL;
	PGresult   *res;
	bool		ok;

	memset(out, 0, sizeof(*out));
	out->slot = -1;
	snprintf(concurrency, sizeof(concurrency), "%lld", share->default_concurrency);
	snprintf(slow_seconds, sizeof(slow_seconds), "%.3f", share->slow_seconds);
	snprintf(slow_limit, sizeof(slow_limit), "%lld", share->slow_limit < 1 ? 1 : share->slow_limit);
	snprintf(handoff, sizeof(handoff), "%.3f", share->handoff_seconds);
	buf_append_str(&host_array, "{");
	for (size_t i = 0; i < nhosts; i++)
		db_array_append(&host_array, hosts[i]);
	buf_append_str(&host_array, "}");
	snprintf(slot_text, sizeof(slot_text), "%d", destination_kept.slot);
	snprintf(seconds, sizeof(seconds), "%.3f", destination_kept.seconds);
	values[0] = domain;
	values[1] = concurrency;
	values[2] = host_array.data;
	values[3] = destination_kept.domain;
	values[4] = destination_kept.domain && destination_kept.slot >= 0 ? slot_text : NULL;
	values[5] = destination_kept.ok_host;
	values[6] = destination_kept.ok_address;
	values[7] = destination_kept.domain ? seconds : NULL;
	values[8] = share->slow_seconds > 0 ? slow_seconds : NULL;
	values[9] = slow_limit;
	values[10] = handoff;
	values[11] = share->stage;
	values[12] = tls_counts;
	/* (The TLS session counts ride along when they are due: tls_tally.h.) */
	res = db_exec_kept(conn,
					   tls_counts ? "SELECT " DESTINATION_BEGIN_COLUMNS ", pepsi.tls_tally($13::jsonb) FROM " DESTINATION_BEGIN_CALL
								  : "SELECT " DESTINATION_BEGIN_COLUMNS " FROM " DESTINATION_BEGIN_CALL,
					   tls_counts ? 13 : 12, values, NULL, NULL);
	free(tls_counts);
	if (tls_sent && internet_tls_tally_refused(res))
	{
		/* An extension older than 0.6: the same call without the counts. */
		tls_sent = false;
		PQclear(res);
		res = db_exec(conn, "SELECT " DESTINATION_BEGIN_COLUMNS " FROM " DESTINATION_BEGIN_CALL, 12, values);
	}
	/* Ended by this call, or (on an error) by the session's end: not asked again either way. */
	destination_kept_clear();
	ok = destination_ok(res, conn, "pepsi.destination_begin", err, errlen) && PQntuples(res) == 1;
	if (ok)
	{
		if (tls_sent)
			internet_tls_tally_clear();
		out->slot = PQgetisnull(res, 0, 0) ? -1 : atoi(PQgetvalue(res, 0, 0));
		out->wait = PQgetisnull(res, 0, 1) ? 0 : atof(PQgetvalue(res, 0, 1));
		snprintf(out->reason, sizeof(out->reason), "%s", PQgetvalue(res, 0, 2));
		out->contended = strcmp(PQgetvalue(res, 0, 3), "t") == 0;
		destination_memo_from_json(PQgetisnull(res, 0, 4) ? NULL : PQgetvalue(res, 0, 4), hosts, nhosts);
		out->sts_cached = true;
		if (!PQgetisnull(res, 0, 5) && !PQgetisnull(res, 0, 6))
		{
			out->sts_policy_id = xstrdup(PQgetvalue(res, 0, 5));
			out->sts_policy = xstrdup(PQgetvalue(res, 0, 6));
		}
		out->per_message = PQgetisnull(res, 0, 9) || strcmp(PQgetvalue(res, 0, 9), "false") != 0;
		if (!PQgetisnull(res, 0, 7))
		{
			out->tls_policy = xstrdup(PQgetvalue(res, 0, 7));
			out->tls_outcome = PQgetisnull(res, 0, 8) ? NULL : xstrdup(PQgetvalue(res, 0, 8));
		}
	}
	PQclear(res);
	buf_free(&host_array);
	return ok;
}

void
destination_start_free(struct destination_start *s)
{
	free(s->sts_policy_id);
	free(s->sts_policy);
	free(s->tls_policy);
	free(s->tls_outcome);
	memset(s, 0, sizeof(*s));
}

bool
destination_release(PGconn *conn, char *err, size_t errlen)
{
	struct destination_end e = {0};
	bool				   contended;
	bool				   ok;

	if (destination_kept.domain == NULL)
		return true;
	e.outcome = "connected";
	e.ok_host = destination_kept.ok_host;
	e.ok_address = destination_kept.ok_address;
	e.backoff_after = 1;
	e.backoff_base = 1;
	e.backoff_max = 1;
	e.seconds = destination_kept.seconds;
	ok = destination_end(conn, destination_kept.domain, destination_kept.slot, &e, &contended, err, errlen);
	destination_kept_clear();
	return ok;
}

bool
destination_end(PGconn *conn, const char *domain, int slot, const struct destination_end *e,
				bool *contended, char *err, size_t errlen)
{
	char		slot_text[16];
	char		after[24];
	char		base[32];
	char		max[32];
	char		seconds[32];
	const char *values[14];
	PGresult   *res;
	bool		ok;

	snprintf(slot_text, sizeof(slot_text), "%d", slot);
	snprintf(after, sizeof(after), "%lld", e->backoff_after);
	snprintf(base, sizeof(base), "%.3f", e->backoff_base);
	snprintf(max, sizeof(max), "%.3f", e->backoff_max);
	values[0] = domain;
	values[1] = slot >= 0 ? slot_text : NULL;
	values[2] = e->outcome;
	values[3] = e->error;
	values[4] = e->ok_host;
	values[5] = e->ok_address;
	values[6] = e->failed_hosts && e->failed_hosts->len > 2 ? e->failed_hosts->data : NULL;
	values[7] = e->failed_addresses && e->failed_addresses->len > 2 ? e->failed_addresses->data : NULL;
	values[8] = after;
	values[9] = base;
	values[10] = max;
	snprintf(seconds, sizeof(seconds), "%.3f", e->seconds);
	values[11] = seconds;
	values[12] = e->tls_policy;
	values[13] = e->tls_outcome;
	/* (The TLS result only when there is one: the call stays the one a 0.4 schema takes.) */
	res = db_exec_kept(conn,
					   e->tls_policy ? "SELECT pepsi.destination_end($1, $2, $3, $4, $5, $6::inet, $7::text[],"
									   " $8::inet[], $9, $10, $11, $12, $13, $14)"
									 : "SELECT pepsi.destination_end($1, $2, $3, $4, $5, $6::inet, $7::text[],"
									   " $8::inet[], $9, $10, $11, $12)",
					   e->tls_policy ? 14 : 12, values, NULL, NULL);
	ok = destination_ok(res, conn, "pepsi.destination_end", err, errlen) && PQntuples(res) == 1;
	*contended = ok && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	return ok;
}

void
destination_unlock(PGconn *conn, const char *domain, int slot)
{
	char		slot_text[16];
	const char *values[2] = {domain, slot_text};

	snprintf(slot_text, sizeof(slot_text), "%d", slot);
	PQclear(db_exec(conn, "SELECT pg_advisory_unlock(pepsi.destination_slot_key(lower($1), $2))", 2, values));
}
