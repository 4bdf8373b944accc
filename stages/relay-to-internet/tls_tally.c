/*
 * tls_tally.c: see tls_tally.h.  A small table of counts per worker (a
 * worker delivers one message at a time: no lock), keyed by what a
 * report's policy and failure details show.  At most TLS_TALLY_MAX
 * distinct records are kept between two additions; past that a session
 * is not counted, and that is logged once.
 */
#include "tls_tally.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "runtime/db.h"
#include "tls_policy_seam.h"

#define TLS_TALLY_MAX 1024
#define TLS_TALLY_FIELDS 8

static const char *const tally_names[TLS_TALLY_FIELDS] = {
	"policy_domain", "policy_type", "policy_string", "mx_host", "result_type", "receiving_mx_hostname",
	"receiving_ip", "sending_mta_ip"};

static struct
{
	char	 *keys[TLS_TALLY_MAX]; /* the fields, each ended by '\037' */
	long long counts[TLS_TALLY_MAX];
	size_t	  used;
	time_t	  first; /* when the oldest count was made */
	bool	  overflow_logged;
	bool	  refused; /* the extension has no pepsi.tls_tally: count nothing */
} tally;

static void
tally_field(struct buf *key, const char *value)
{
	for (const char *p = value ? value : ""; *p; p++)
		if (*p != '\037')
			buf_append(key, p, 1);
	buf_append(key, "\037", 1);
}

void
internet_tls_tally_add(const char *domain, const struct internet_tls_policy *policy,
					   const char *result_type, const char *mx_host, const char *address,
					   const char *local_address, int sessions)
{
	struct buf key = BUF_INIT;
	bool	   failed = result_type && result_type[0];
	size_t	   i;

	if (sessions <= 0 || policy->report_type == NULL || tally.refused)
		return;
	tally_field(&key, domain);
	tally_field(&key, policy->report_type);
	tally_field(&key, policy->report_strings);
	tally_field(&key, policy->report_mx);
	tally_field(&key, failed ? result_type : "");
	tally_field(&key, failed ? mx_host : "");
	tally_field(&key, failed ? address : "");
	tally_field(&key, failed ? local_address : "");
	buf_append(&key, "", 1);
	for (i = 0; i < tally.used && strcmp(tally.keys[i], key.data) != 0; i++)
		;
	if (i == tally.used)
	{
		if (tally.used == TLS_TALLY_MAX)
		{
			if (!tally.overflow_logged)
				log_warnx("TLS reports: more than %d distinct records not yet added; the sessions past "
						  "them are not counted",
						  TLS_TALLY_MAX);
			tally.overflow_logged = true;
			buf_free(&key);
			return;
		}
		if (tally.used == 0)
			tally.first = time(NULL);
		tally.keys[tally.used] = xstrdup(key.data);
		tally.counts[tally.used++] = 0;
	}
	tally.counts[i] += sessions;
	buf_free(&key);
}

char *
internet_tls_tally_due(bool now)
{
	json_t *rows;
	char   *text;

	if (tally.used == 0 || (!now && time(NULL) - tally.first < TLS_TALLY_SECONDS))
		return NULL;
	rows = json_array();
	for (size_t i = 0; i < tally.used; i++)
	{
		json_t *row = json_object();
		char   *field = tally.keys[i];

		for (int f = 0; f < TLS_TALLY_FIELDS; f++)
		{
			char *end = strchr(field, '\037');

			json_object_set_new(row, tally_names[f], json_stringn(field, (size_t) (end - field)));
			field = end + 1;
		}
		json_object_set_new(row, "count", json_integer((json_int_t) tally.counts[i]));
		json_array_append_new(rows, row);
	}
	text = json_dumps(rows, JSON_COMPACT);
	json_decref(rows);
	return text;
}

void
internet_tls_tally_clear(void)
{
	for (size_t i = 0; i < tally.used; i++)
		free(tally.keys[i]);
	tally.used = 0;
	tally.overflow_logged = false;
}

bool
internet_tls_tally_refused(const PGresult *res)
{
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	if (PQresultStatus(res) != PGRES_FATAL_ERROR || state == NULL || strcmp(state, "42883") != 0)
		return false;
	log_warnx("TLS reports: the database has no pepsi.tls_tally (an extension older than 0.6): the TLS "
			  "sessions are not counted; ALTER EXTENSION pepsi UPDATE adds it");
	tally.refused = true;
	internet_tls_tally_clear();
	return true;
}

int
internet_tls_tally_idle(PGconn *conn, double idle_seconds)
{
	char	   *counts;
	const char *values[1];
	PGresult   *res;

	if (tally.used == 0)
		return -1;
	if (idle_seconds < 1.0)
		return (int) ((1.0 - idle_seconds) * 1000) + 1;
	counts = internet_tls_tally_due(true);
	values[0] = counts;
	res = db_exec(conn, "SELECT pepsi.tls_tally($1::jsonb)", 1, values);
	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		internet_tls_tally_clear();
	else if (!internet_tls_tally_refused(res))
		log_warnx("TLS reports: the session counts could not be added (kept for the next try): %s",
				  PQresultErrorMessage(res));
	PQclear(res);
	free(counts);
	return -1;
}
