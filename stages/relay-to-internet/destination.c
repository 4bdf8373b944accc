/* destination.c: see destination.h. */
#include "destination.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buf.h"
#include "db.h"
#include "xalloc.h"

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

static double
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
	m->host = xstrdup(host);
	m->read_at = now;
	destination_copy(out, &m->addresses);
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

bool
destination_begin(PGconn *conn, const char *domain, long long default_concurrency, int *slot,
				  double *wait, char *reason, size_t reason_len, char *err, size_t errlen)
{
	char		concurrency[24];
	const char *values[2] = {domain, concurrency};
	PGresult   *res;
	bool		ok;

	snprintf(concurrency, sizeof(concurrency), "%lld", default_concurrency);
	res = db_exec(conn, "SELECT slot, wait_seconds, reason FROM pepsi.destination_begin($1, $2)", 2,
				  values);
	ok = destination_ok(res, conn, "pepsi.destination_begin", err, errlen) && PQntuples(res) == 1;
	if (ok)
	{
		*slot = PQgetisnull(res, 0, 0) ? -1 : atoi(PQgetvalue(res, 0, 0));
		*wait = PQgetisnull(res, 0, 1) ? 0 : atof(PQgetvalue(res, 0, 1));
		snprintf(reason, reason_len, "%s", PQgetvalue(res, 0, 2));
	}
	PQclear(res);
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
	const char *values[12];
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
	res = db_exec(conn,
				  "SELECT pepsi.destination_end($1, $2, $3, $4, $5, $6::inet, $7::text[], $8::inet[],"
				  " $9, $10, $11, $12)",
				  12, values);
	ok = destination_ok(res, conn, "pepsi.destination_end", err, errlen) && PQntuples(res) == 1;
	*contended = ok && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	return ok;
}
