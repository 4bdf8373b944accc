/*
 * payload.c: the report of pepsi-telemetry-client (payload.h).  Nothing
 * here reads a message, an address or a log line: the volumes are
 * pepsi.stats_daily's sums, the graph is pepsi.conf's [stage-*] sections,
 * and a name the operator chose (a stage's, a third-party program's) is
 * replaced by a placeholder unless SEND_STAGE_NAMES is yes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "payload.h"
#include "process/cli.h"
#include "runtime/db.h"

#define TELEMETRY_MAX_STAGES 1024

/* The days of pepsi.stats_daily, as [{day, received, delivered, deferred, bounced}]. */
static json_t *
telemetry_days(const struct pepsi_config *cfg, PGconn *conn, char *err, size_t errlen)
{
	static const char *const counts[] = {"received", "delivered", "deferred", "bounced"};
	char					 days[16];
	const char				*values[1] = {days};
	PGresult				*res;
	json_t					*out;

	snprintf(days, sizeof(days), "%lld", config_int(cfg, "telemetry", "DAYS"));
	res = db_exec(conn,
				  "SELECT day::text, received, delivered, deferred, bounced FROM pepsi.stats_daily($1::integer)"
				  " ORDER BY day",
				  1, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "pepsi.stats_daily: %s", db_error(res, conn));
		PQclear(res);
		return NULL;
	}
	out = json_array();
	for (int i = 0; i < PQntuples(res); i++)
	{
		json_t *day = json_object();

		json_object_set_new(day, "day", json_string(PQgetvalue(res, i, 0)));
		for (int c = 0; c < 4; c++)
			json_object_set_new(day, counts[c], json_integer(strtoll(PQgetvalue(res, i, c + 1), NULL, 10)));
		json_array_append_new(out, day);
	}
	PQclear(res);
	return out;
}

/* Pepsi's own stage programs go by their name; another is "other" unless names are allowed. */
static const char *
telemetry_program(const char *program, bool names)
{
	const char *base;

	if (program == NULL)
		return "none";
	base = strrchr(program, '/') ? strrchr(program, '/') + 1 : program;
	if (strncmp(base, "pepsi-stage-", 12) == 0 && base[12] != '\0'
		&& strspn(base, "abcdefghijklmnopqrstuvwxyz0123456789-") == strlen(base))
		return base;
	return names ? base : "other";
}

/* A stage's name as reported: its own, or "stageN" by its place in the file. */
static void
telemetry_stage_label(const char *const *sections, size_t n, const char *stage, bool names, char *out,
					  size_t outlen)
{
	if (names)
	{
		snprintf(out, outlen, "%s", stage);
		return;
	}
	for (size_t i = 0; i < n; i++)
		if (strcmp(sections[i] + strlen("stage-"), stage) == 0)
		{
			snprintf(out, outlen, "stage%zu", i + 1);
			return;
		}
	/* A successor with no section of its own: named by no one but the operator. */
	snprintf(out, outlen, "undefined");
}

/* The [stage-*] sections of the file: [{name, program, next?, bounce?}]. */
static json_t *
telemetry_stages(const struct pepsi_config *cfg)
{
	const char *sections[TELEMETRY_MAX_STAGES];
	size_t		n = config_sections(cfg, "stage-", sections, TELEMETRY_MAX_STAGES);
	bool		names = config_bool(cfg, "telemetry", "SEND_STAGE_NAMES");
	json_t	   *out = json_array();
	char		label[256];

	for (size_t i = 0; i < n; i++)
	{
		json_t	   *stage = json_object();
		const char *next = config_text(cfg, sections[i], "NEXT_STAGE");
		const char *bounce = config_text(cfg, sections[i], "BOUNCE_STAGE");

		telemetry_stage_label(sections, n, sections[i] + strlen("stage-"), names, label, sizeof(label));
		json_object_set_new(stage, "name", json_string(label));
		json_object_set_new(stage, "program",
							json_string(telemetry_program(config_text(cfg, sections[i], "PROGRAM"), names)));
		if (next)
		{
			telemetry_stage_label(sections, n, next, names, label, sizeof(label));
			json_object_set_new(stage, "next", json_string(label));
		}
		if (bounce)
		{
			telemetry_stage_label(sections, n, bounce, names, label, sizeof(label));
			json_object_set_new(stage, "bounce", json_string(label));
		}
		json_array_append_new(out, stage);
	}
	return out;
}

json_t *
telemetry_payload(const struct pepsi_config *cfg, PGconn *conn, const char *install_id, char *err,
				  size_t errlen)
{
	PGresult *res;
	json_t	 *report;
	json_t	 *days;

	res = db_exec(conn, "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pepsi'", 0, NULL);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		snprintf(err, errlen, "the pepsi extension's version: %s",
				 PQresultStatus(res) == PGRES_TUPLES_OK ? "no extension pepsi in this database"
														: db_error(res, conn));
		PQclear(res);
		return NULL;
	}
	if ((days = telemetry_days(cfg, conn, err, errlen)) == NULL)
	{
		PQclear(res);
		return NULL;
	}
	report = json_object();
	json_object_set_new(report, "schema", json_integer(TELEMETRY_SCHEMA));
	json_object_set_new(report, "install_id", json_string(install_id));
	json_object_set_new(report, "version", json_string(pepsi_version()));
	json_object_set_new(report, "extension_version", json_string(PQgetvalue(res, 0, 0)));
	PQclear(res);
	if (config_bool(cfg, "telemetry", "SEND_HOSTNAME"))
		json_object_set_new(report, "hostname", json_string(config_hostname(cfg)));
	json_object_set_new(report, "days", days);
	json_object_set_new(report, "stages", telemetry_stages(cfg));
	return report;
}
