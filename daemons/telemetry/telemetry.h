/*
 * telemetry.h: pepsi-telemetry, the collector of the reports
 * pepsi-telemetry-client sends (docs/pepsi-telemetry.8.md).  It runs on
 * another host than the mail system, from a file of its own, against a
 * database of its own (telemetry.sql) as the role pepsi_telemetry: an
 * HTTPS endpoint (libmicrohttpd, one thread, one database connection)
 * that takes POST /report, validated against the allow-list of
 * validate.c, rate-limited per install id and stored, and a page of
 * totals at GET /.
 */
#ifndef PEPSI_TELEMETRY_H
#define PEPSI_TELEMETRY_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "base/buf.h"
#include "config/config.h"

/* The limits of one report ([telemetry-collector] MAX_DAYS, MAX_STAGES). */
struct telemetry_limits
{
	long long max_days;
	long long max_stages;
};

/*
 * validate.c: is report a report, with only the keys of the allow-list,
 * each of its type and within the limits?  false with the reason in why.
 */
bool telemetry_validate(json_t *report, const struct telemetry_limits *limits, char *why,
						size_t whylen);

/* store.c: the database, connected (again) when needed; NULL when it does not answer. */
PGconn *collector_db(const struct pepsi_config *cfg);

enum store_result
{
	STORE_OK,
	STORE_RATE_LIMITED,
	STORE_UNAVAILABLE,
};

/* Store a validated report; why says why not. */
enum store_result collector_store(const struct pepsi_config *cfg, const char *report, char *why,
								  size_t whylen);

/* The totals page's HTML into page; false when the database does not answer. */
bool collector_totals_page(const struct pepsi_config *cfg, struct buf *page);

#endif
