/*
 * store.c: the collector's database (telemetry.sql) and the totals page
 * made from it.  The collector connects as a member of pepsi_telemetry,
 * which may call the schema's functions and touch no table: a report goes
 * in through telemetry.report_store (which applies the per-install rate
 * limit in the same transaction), the page comes out of the totals_*
 * functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "runtime/db.h"
#include "telemetry.h"

static PGconn *collector_conn;

PGconn *
collector_db(const struct pepsi_config *cfg)
{
	char err[1024];

	if (collector_conn && PQstatus(collector_conn) == CONNECTION_OK)
		return collector_conn;
	if (collector_conn)
	{
		PQreset(collector_conn);
		if (PQstatus(collector_conn) == CONNECTION_OK)
			return collector_conn;
		PQfinish(collector_conn);
		collector_conn = NULL;
	}
	if ((collector_conn = db_connect_as(cfg, "telemetry-collector", "CONNINFO", "pepsi-telemetry", err,
										sizeof(err)))
		== NULL)
		log_warnx("%s", err);
	return collector_conn;
}

enum store_result
collector_store(const struct pepsi_config *cfg, const char *report, char *why, size_t whylen)
{
	PGconn			 *conn = collector_db(cfg);
	char			  interval[32];
	const char		 *values[2] = {report, interval};
	PGresult		 *res;
	enum store_result result;

	if (conn == NULL)
	{
		snprintf(why, whylen, "the collector's database is not answering");
		return STORE_UNAVAILABLE;
	}
	snprintf(interval, sizeof(interval), "%lld milliseconds",
			 config_duration_ms(cfg, "telemetry-collector", "MIN_INTERVAL"));
	res = db_exec(conn, "SELECT telemetry.report_store($1::jsonb, $2::interval)", 2, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("storing a report: %s", db_error(res, conn));
		snprintf(why, whylen, "the report could not be stored");
		result = STORE_UNAVAILABLE;
	}
	else if (!PQgetisnull(res, 0, 0))
	{
		snprintf(why, whylen, "%s ([telemetry-collector] MIN_INTERVAL)", PQgetvalue(res, 0, 0));
		result = STORE_RATE_LIMITED;
	}
	else
		result = STORE_OK;
	PQclear(res);
	return result;
}

/* text, with &, <, >, " and ' as entities (the validator allows none of them: defence in depth). */
static void
page_text(struct buf *page, const char *text)
{
	for (; *text; text++)
		switch (*text)
		{
			case '&':
				buf_append_str(page, "&amp;");
				break;
			case '<':
				buf_append_str(page, "&lt;");
				break;
			case '>':
				buf_append_str(page, "&gt;");
				break;
			case '"':
				buf_append_str(page, "&quot;");
				break;
			case '\'':
				buf_append_str(page, "&#39;");
				break;
			default:
				buf_append_char(page, *text);
		}
}

/* A table of a query's rows under a heading, headed by columns (a row per result row). */
static bool
page_table(struct buf *page, PGconn *conn, const char *heading, const char *sql)
{
	PGresult *res = db_exec(conn, sql, 0, NULL);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("the totals page: %s", db_error(res, conn));
		PQclear(res);
		return false;
	}
	buf_printf(page, "<h2>%s</h2>\n<table>\n<tr>", heading);
	for (int c = 0; c < PQnfields(res); c++)
	{
		buf_append_str(page, "<th>");
		page_text(page, PQfname(res, c));
		buf_append_str(page, "</th>");
	}
	buf_append_str(page, "</tr>\n");
	for (int r = 0; r < PQntuples(res); r++)
	{
		buf_append_str(page, "<tr>");
		for (int c = 0; c < PQnfields(res); c++)
		{
			buf_append_str(page, "<td>");
			page_text(page, PQgetvalue(res, r, c));
			buf_append_str(page, "</td>");
		}
		buf_append_str(page, "</tr>\n");
	}
	buf_append_str(page, "</table>\n");
	PQclear(res);
	return true;
}

bool
collector_totals_page(const struct pepsi_config *cfg, struct buf *page)
{
	PGconn *conn = collector_db(cfg);
	bool	ok;

	if (conn == NULL)
		return false;
	buf_append_str(page, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
						 "<title>Pepsi telemetry</title>\n</head>\n<body>\n<h1>Pepsi telemetry</h1>\n");
	ok = page_table(page, conn, "Installs",
					"SELECT installs, active AS \"active (30 days)\", reports FROM telemetry.totals_installs()")
		 && page_table(page, conn, "Versions",
					   "SELECT version, extension_version AS extension, installs FROM telemetry.totals_versions()")
		 && page_table(page, conn, "Messages by day",
					   "SELECT day, installs, received, delivered, deferred, bounced"
					   " FROM telemetry.totals_days(31)");
	buf_append_str(page, "</body>\n</html>\n");
	return ok;
}
