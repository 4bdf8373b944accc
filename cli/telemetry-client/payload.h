/*
 * payload.h: the report pepsi-telemetry-client sends, built from
 * aggregates only (docs/pepsi-telemetry-client.8.md lists every field):
 * the versions, the message volumes of the last complete UTC days
 * (pepsi.stats_daily), and the stage graph's shape from pepsi.conf,
 * anonymised unless [telemetry] SEND_STAGE_NAMES says otherwise.
 */
#ifndef PEPSI_TELEMETRY_PAYLOAD_H
#define PEPSI_TELEMETRY_PAYLOAD_H

#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "config/config.h"

/* The report's format; the collector refuses another. */
#define TELEMETRY_SCHEMA 1

/*
 * The report for install_id, or NULL with the reason in err (a query the
 * database refused).
 */
json_t *telemetry_payload(const struct pepsi_config *cfg, PGconn *conn, const char *install_id,
						  char *err, size_t errlen);

#endif
