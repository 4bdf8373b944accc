/*
 * dmarc_tally.c: see dmarc_tally.h.  One table of counts per process,
 * keyed by everything an aggregate report's record shows (the policy
 * domain, header From domain, source address, disposition, the aligned
 * DKIM and SPF results and the reported signature and SPF check); the
 * report timer (admit.c, with pepsi.ingress_report, every few seconds)
 * takes it as one JSON array for pepsi.dmarc_tally(), in the report's
 * transaction.  Ingress runs verify in its one event loop, so there is no
 * lock.  At most DMARC_TALLY_MAX distinct records are kept between two
 * reports; past that a verdict is not counted, and that is logged once
 * per report interval.  A report that fails (the database away) gives its
 * counts back (dmarc_tally_return), for the next report.
 */
#include "dmarc_tally.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"

#define DMARC_TALLY_MAX 4096
#define DMARC_TALLY_SLOTS (2 * DMARC_TALLY_MAX)
#define DMARC_TALLY_FIELDS 12

static const char *const tally_names[DMARC_TALLY_FIELDS] = {
	"policy_domain", "header_from", "source_ip", "envelope_from", "disposition", "dkim",
	"spf", "dkim_domain", "dkim_selector", "dkim_result", "spf_scope", "spf_result"};

struct tally_entry
{
	char			  *key; /* the fields, each ended by '\037' */
	unsigned long long count;
};

static struct
{
	struct tally_entry slots[DMARC_TALLY_SLOTS];
	size_t			   used;
	bool			   overflow_logged;
} tally;

static uint64_t
tally_hash(const char *key)
{
	uint64_t h = 1469598103934665603ULL; /* FNV-1a */

	for (const unsigned char *p = (const unsigned char *) key; *p; p++)
		h = (h ^ *p) * 1099511628211ULL;
	return h;
}

static void tally_count(const char *key, unsigned long long count);

/* A field of the key: no separator inside, NULL as empty. */
static void
tally_field(struct buf *key, const char *value)
{
	for (const char *p = value ? value : ""; *p; p++)
		if (*p != '\037')
			buf_append(key, p, 1);
	buf_append(key, "\037", 1);
}

void
dmarc_tally_add(const struct dmarc_verdict *d, const char *action, const char *client_ip,
				const char *spf_domain, const char *spf_scope, enum spf_result spf,
				const struct dkim_signature_result *sigs, size_t nsigs)
{
	const struct dkim_signature_result *sig = NULL;
	struct buf							key = BUF_INIT;

	if (d->result == NULL || (strcmp(d->result, "pass") != 0 && strcmp(d->result, "fail") != 0))
		return; /* no policy (none), or not known (temperror): nothing to report to */
	if (d->dkim_reported >= 0 && (size_t) d->dkim_reported < nsigs)
		sig = &sigs[d->dkim_reported];
	tally_field(&key, d->policy_domain);
	tally_field(&key, d->from_domain);
	tally_field(&key, client_ip);
	tally_field(&key, spf_domain);
	tally_field(&key, action);
	tally_field(&key, d->dkim_aligned ? "pass" : "fail");
	tally_field(&key, d->spf_aligned ? "pass" : "fail");
	tally_field(&key, sig ? sig->domain : NULL);
	tally_field(&key, sig ? sig->selector : NULL);
	tally_field(&key, sig ? sig->result : NULL);
	tally_field(&key, spf_scope);
	tally_field(&key, spf_result_name(spf));
	buf_append(&key, "", 1);
	tally_count(key.data, 1);
	buf_free(&key);
}

/* Add count to the record of key. */
static void
tally_count(const char *key, unsigned long long count)
{
	uint64_t slot = tally_hash(key) % DMARC_TALLY_SLOTS;


	while (tally.slots[slot].key && strcmp(tally.slots[slot].key, key) != 0)
		slot = (slot + 1) % DMARC_TALLY_SLOTS;
	if (tally.slots[slot].key)
	{
		tally.slots[slot].count += count;
		return;
	}
	if (tally.used >= DMARC_TALLY_MAX)
	{
		if (!tally.overflow_logged)
			log_warnx("DMARC aggregate: more than %d distinct records since the last report;"
					  " the verdicts past them are not counted",
					  DMARC_TALLY_MAX);
		tally.overflow_logged = true;
		return;
	}
	tally.slots[slot].key = xstrdup(key);
	tally.slots[slot].count = count;
	tally.used++;
}

void
dmarc_tally_return(const char *counts)
{
	json_t *rows = counts ? json_loads(counts, 0, NULL) : NULL;
	size_t	i;
	json_t *row;

	json_array_foreach (rows, i, row)
	{
		struct buf key = BUF_INIT;
		json_int_t count = json_integer_value(json_object_get(row, "count"));

		for (int f = 0; f < DMARC_TALLY_FIELDS; f++)
			tally_field(&key, json_string_value(json_object_get(row, tally_names[f])));
		buf_append(&key, "", 1);
		if (count > 0)
			tally_count(key.data, (unsigned long long) count);
		buf_free(&key);
	}
	json_decref(rows);
}

char *
dmarc_tally_take(void)
{
	json_t *rows;
	char   *text;

	if (tally.used == 0)
		return NULL;
	rows = json_array();
	for (size_t i = 0; i < DMARC_TALLY_SLOTS; i++)
	{
		json_t *row;
		char   *field;

		if (tally.slots[i].key == NULL)
			continue;
		row = json_object();
		field = tally.slots[i].key;
		for (int f = 0; f < DMARC_TALLY_FIELDS; f++)
		{
			char *end = strchr(field, '\037');

			json_object_set_new(row, tally_names[f], json_stringn(field, (size_t) (end - field)));
			field = end + 1;
		}
		json_object_set_new(row, "count", json_integer((json_int_t) tally.slots[i].count));
		json_array_append_new(rows, row);
		free(tally.slots[i].key);
		tally.slots[i].key = NULL;
	}
	tally.used = 0;
	tally.overflow_logged = false;
	text = json_dumps(rows, JSON_COMPACT);
	json_decref(rows);
	return text;
}
