/*
 * metrics.c: GET /metrics in the Prometheus text exposition format
 * (version 0.0.4).
 *
 * The counters are pepsi.stage_stats and pepsi.dispatch_stats, which the
 * dispatcher flushes; the queue gauges come from pepsi.queue_gauges(),
 * which counts live while that is cheap and serves the maintenance
 * worker's snapshot for a big queue (pepsi--0.1--0.2.sql says why), so a
 * scrape stays a few small reads however long the queue is.  Ingress
 * sessions come from pepsi.ingress_stats, which each running pepsi-ingress
 * refreshes every few seconds; an instance silent for a minute is gone.
 * The histograms of stage run time and delivery delay are the
 * dispatcher's (pepsi.stage_histogram), the refusals by code and the
 * messages received ingress's, summed over its restarts by
 * pepsi.ingress_report (pepsi.smtp_refusal, pepsi.ingress_total).
 *
 * GET /healthz is here too: what pepsi_up says, for a load balancer or
 * systemd's and Kubernetes' probes.  Healthy is: the database answers,
 * and a pepsi-dispatch is connected to it, which it knows from the
 * advisory lock the dispatcher holds while it runs (db.h): pg_locks is
 * readable by every role, so pepsi_httpd needs no further privilege.  A
 * dispatcher that is connected but stuck is its watchdog's business
 * (WatchdogSec= in its unit).
 */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "httpd.h"
#include "process/cli.h"
#include "runtime/db.h"

/* A label value with \, " and newline escaped, as the format wants. */
static void
metrics_label(struct buf *out, const char *value)
{
	buf_append_char(out, '"');
	for (const char *p = value; *p; p++)
	{
		if (*p == '\\' || *p == '"')
			buf_append_char(out, '\\');
		if (*p == '\n')
			buf_append_str(out, "\\n");
		else
			buf_append_char(out, *p);
	}
	buf_append_char(out, '"');
}

static void
metrics_family(struct buf *out, const char *name, const char *type, const char *help)
{
	buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * One family from a column of res: one sample per row, labelled by the
 * columns named in labels (NULL-terminated) with the same names.
 */
static void
metrics_column(struct buf *out, PGresult *res, const char *name, const char *type, const char *help,
			   const char *column, const char *const *labels)
{
	int col = PQfnumber(res, column);

	if (col < 0)
		return;
	metrics_family(out, name, type, help);
	for (int row = 0; row < PQntuples(res); row++)
	{
		if (PQgetisnull(res, row, col))
			continue;
		buf_append_str(out, name);
		if (labels && labels[0])
		{
			buf_append_char(out, '{');
			for (int i = 0; labels[i]; i++)
			{
				buf_printf(out, "%s%s=", i ? "," : "", labels[i]);
				metrics_label(out, PQgetvalue(res, row, PQfnumber(res, labels[i])));
			}
			buf_append_char(out, '}');
		}
		buf_printf(out, " %s\n", PQgetvalue(res, row, col));
	}
}

static PGresult *
metrics_query(PGconn *conn, const char *sql)
{
	PGresult *res = db_exec(conn, sql, 0, NULL);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("metrics: %s", db_error(res, conn));
		PQclear(res);
		return NULL;
	}
	return res;
}

/*
 * The histograms of pepsi.stage_histogram, one family per metric, a
 * series per stage: res has metric, stage, le (text, "+Inf" last), the
 * cumulative count at le, sum and count, ordered by metric, stage and le.
 */
static void
metrics_histograms(struct buf *out, PGresult *res)
{
	static const struct
	{
		const char *metric;
		const char *name;
		const char *help;
	} families[] = {
		{"run_seconds", "pepsi_stage_run_seconds",
		 "Worker time a stage spent on each message (its part of a fused pass)."},
		{"delivery_delay_seconds", "pepsi_delivery_delay_seconds",
		 "Time from receipt to a sent delivery, by the stage that delivered."},
	};

	for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++)
	{
		metrics_family(out, families[f].name, "histogram", families[f].help);
		for (int row = 0; row < PQntuples(res); row++)
		{
			const char *stage = PQgetvalue(res, row, 1);
			const char *le = PQgetvalue(res, row, 2);

			if (strcmp(PQgetvalue(res, row, 0), families[f].metric) != 0)
				continue;
			buf_printf(out, "%s_bucket{stage=", families[f].name);
			metrics_label(out, stage);
			buf_printf(out, ",le=\"%s\"} %s\n", le, PQgetvalue(res, row, 3));
			if (strcmp(le, "+Inf") != 0)
				continue;
			buf_printf(out, "%s_sum{stage=", families[f].name);
			metrics_label(out, stage);
			buf_printf(out, "} %s\n%s_count{stage=", PQgetvalue(res, row, 4), families[f].name);
			metrics_label(out, stage);
			buf_printf(out, "} %s\n", PQgetvalue(res, row, 5));
		}
	}
}

static const char histogram_sql[] = "SELECT h.metric, h.stage,"
									" CASE WHEN u.le = 'Infinity' THEN '+Inf' ELSE u.le::text END,"
									" sum(u.n) OVER (PARTITION BY h.metric, h.stage ORDER BY u.i),"
									" h.sum, h.count FROM pepsi.stage_histogram h,"
									" unnest(h.le || 'Infinity'::float8, h.buckets) WITH ORDINALITY AS u (le, n, i)"
									" ORDER BY h.metric, h.stage, u.i";

/* Whether a dispatcher holds its lock in this database (db.h). */
static const char health_sql[] = "SELECT EXISTS (SELECT FROM pg_locks"
								 " WHERE locktype = 'advisory' AND granted"
								 " AND database = (SELECT oid FROM pg_database"
								 " WHERE datname = current_database())"
								 " AND classid = " PEPSI_LOCK_CLASS " AND objid = " PEPSI_LOCK_DISPATCH
								 " AND objsubid = 2)";

/*
 * Healthy (true), or false with why: the database does not answer, or no
 * dispatcher is connected to it.
 */
static bool
health_check(char *why, size_t whylen)
{
	PGconn	 *conn = httpd_db();
	PGresult *res;
	bool	  healthy = false;

	if (conn == NULL)
	{
		snprintf(why, whylen, "the database is not answering");
		return false;
	}
	res = db_exec(conn, health_sql, 0, NULL);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		snprintf(why, whylen, "the database is not answering: %s", db_error(res, conn));
	else if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		snprintf(why, whylen, "no pepsi-dispatch is connected to the database");
	else
		healthy = true;
	PQclear(res);
	return healthy;
}

enum MHD_Result
healthz_respond(struct request *req)
{
	char why[1024];
	char body[1100];
	int	 len;

	if (health_check(why, sizeof(why)))
		return reply_bytes(req, MHD_HTTP_OK, "text/plain; charset=utf-8", "ok\n", 3, false);
	/* Not reply_error: a probe that polls an outage every few seconds would flood the log. */
	log_debug("/healthz: %s", why);
	len = snprintf(body, sizeof(body), "%s\n", why);
	return reply_bytes(req, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", body,
					   (size_t) len, true);
}

/* pepsi_up and pepsi_build_info: the families a scrape has even when the database is down. */
static void
metrics_health(struct buf *out, bool healthy)
{
	metrics_family(out, "pepsi_up", "gauge",
				   "1 when the database answers and a pepsi-dispatch is connected (/healthz), else 0.");
	buf_printf(out, "pepsi_up %d\n", healthy ? 1 : 0);
	metrics_family(out, "pepsi_build_info", "gauge", "Always 1, labelled with the version of Pepsi.");
	buf_append_str(out, "pepsi_build_info{version=");
	metrics_label(out, pepsi_version());
	buf_append_str(out, "} 1\n");
}

/* A scrape with the database down: pepsi_up 0, so the outage is a value, not a failed scrape. */
static enum MHD_Result
metrics_down(struct request *req)
{
	struct buf		out = BUF_INIT;
	enum MHD_Result result;

	metrics_health(&out, false);
	result = reply_bytes(req, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", out.data,
						 out.len, true);
	buf_free(&out);
	return result;
}

enum MHD_Result
metrics_respond(struct request *req)
{
	static const char *const stage_status[] = {"stage", "status", NULL};
	static const char *const stage_only[] = {"stage", NULL};
	static const char *const instance_only[] = {"instance", NULL};
	static const char *const code_only[] = {"code", NULL};
	char					 why[1024];
	bool					 healthy = health_check(why, sizeof(why));
	PGconn					*conn = httpd_db();
	PGresult				*gauges, *stages, *deliveries, *dispatch, *dns, *ingress;
	PGresult				*histograms, *refusals, *received;
	struct buf				 out = BUF_INIT;
	enum MHD_Result			 result;

	if (conn == NULL || PQstatus(conn) != CONNECTION_OK)
		return metrics_down(req);
	gauges = metrics_query(conn, "SELECT stage, status::text AS status, messages, held,"
								 " round(oldest_age_seconds::numeric, 3) AS oldest_age,"
								 " round(extract(epoch FROM now() - as_of), 3) AS snapshot_age"
								 " FROM pepsi.queue_gauges()");
	stages = metrics_query(conn, "SELECT stage, messages, round(extract(epoch FROM processing_time), 6)"
								 " AS processing_seconds, kills, timeouts, crashes, fused_hops"
								 " FROM pepsi.stage_stats ORDER BY stage");
	deliveries = metrics_query(conn, "SELECT s.stage, d.status, d.count FROM pepsi.stage_stats s,"
									 " LATERAL (VALUES ('sent', s.deliveries_sent), ('deferred', s.deliveries_deferred),"
									 " ('bounced', s.deliveries_bounced), ('expired', s.deliveries_expired))"
									 " AS d (status, count)"
									 " WHERE s.deliveries_sent + s.deliveries_deferred + s.deliveries_bounced"
									 " + s.deliveries_expired > 0 ORDER BY s.stage, d.status");
	dispatch = metrics_query(conn, "SELECT stages_run, messages, messages_failed, serialization_failures"
								   " FROM pepsi.dispatch_stats");
	dns = metrics_query(conn, "SELECT count(*) AS addresses,"
							  " count(*) FILTER (WHERE failures > 0) AS failing FROM pepsi.dns_address");
	ingress = metrics_query(conn, "SELECT instance, sessions, sessions_total, messages"
								  " FROM pepsi.ingress_stats WHERE updated_at > now() - interval '1 minute'"
								  " ORDER BY instance");
	/* (Of schema 0.4: a database not yet updated scrapes without them.) */
	histograms = metrics_query(conn, histogram_sql);
	refusals = metrics_query(conn, "SELECT code::text AS code, refusals FROM pepsi.smtp_refusal ORDER BY code");
	received = metrics_query(conn, "SELECT messages FROM pepsi.ingress_total");
	if (gauges == NULL || stages == NULL || deliveries == NULL || dispatch == NULL || dns == NULL
		|| ingress == NULL)
	{
		PQclear(histograms);
		PQclear(refusals);
		PQclear(received);
		PQclear(ingress);
		PQclear(gauges);
		PQclear(stages);
		PQclear(deliveries);
		PQclear(dispatch);
		PQclear(dns);
		if (PQstatus(conn) != CONNECTION_OK)
			return metrics_down(req);
		return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the statistics could not be read");
	}

	metrics_health(&out, healthy);

	metrics_column(&out, gauges, "pepsi_queue_messages", "gauge",
				   "Messages in the queue by stage and status.", "messages", stage_status);
	metrics_column(&out, gauges, "pepsi_queue_held_messages", "gauge",
				   "Messages an operator put on hold (counted among the paused).", "held", stage_status);
	metrics_column(&out, gauges, "pepsi_queue_oldest_age_seconds", "gauge",
				   "Age of the oldest message by stage and status (since it was received).",
				   "oldest_age", stage_status);
	metrics_family(&out, "pepsi_queue_snapshot_age_seconds", "gauge",
				   "How old the queue counts are (0 when counted for this scrape).");
	buf_printf(&out, "pepsi_queue_snapshot_age_seconds %s\n",
			   PQntuples(gauges) > 0 ? PQgetvalue(gauges, 0, PQfnumber(gauges, "snapshot_age")) : "0");

	metrics_column(&out, stages, "pepsi_stage_messages_total", "counter",
				   "Messages a stage's workers processed.", "messages", stage_only);
	metrics_column(&out, stages, "pepsi_stage_processing_seconds_total", "counter",
				   "Worker time a stage spent on messages.", "processing_seconds", stage_only);
	metrics_column(&out, stages, "pepsi_stage_kills_total", "counter",
				   "Workers of a stage killed (MAX_RUNTIME or protocol errors).", "kills", stage_only);
	metrics_column(&out, stages, "pepsi_stage_timeouts_total", "counter",
				   "Messages of a stage that ran past MAX_RUNTIME.", "timeouts", stage_only);
	metrics_column(&out, stages, "pepsi_stage_crashes_total", "counter",
				   "Workers of a stage that died.", "crashes", stage_only);
	metrics_column(&out, stages, "pepsi_stage_fused_hops_total", "counter",
				   "Messages a stage processed inside its predecessor's worker (fusion).", "fused_hops",
				   stage_only);

	metrics_column(&out, deliveries, "pepsi_deliveries_total", "counter",
				   "Delivery attempts by stage and outcome (the status= of the delivery log).", "count",
				   stage_status);

	metrics_column(&out, dispatch, "pepsi_dispatch_stages_run_total", "counter",
				   "Stage runs the dispatcher handed out.", "stages_run", NULL);
	metrics_column(&out, dispatch, "pepsi_dispatch_messages_total", "counter",
				   "Messages the dispatcher handed to workers.", "messages", NULL);
	metrics_column(&out, dispatch, "pepsi_dispatch_messages_failed_total", "counter",
				   "Messages that ended failed or timed out (expected to stay 0).", "messages_failed", NULL);
	metrics_column(&out, dispatch, "pepsi_dispatch_serialization_failures_total", "counter",
				   "Serialization failures and deadlocks retried (expected to stay 0).",
				   "serialization_failures", NULL);

	metrics_column(&out, dns, "pepsi_dns_addresses", "gauge",
				   "MX host addresses in the delivery DNS cache (pepsi.dns_address).", "addresses", NULL);
	metrics_column(&out, dns, "pepsi_dns_addresses_failing", "gauge",
				   "Cached addresses whose last connection failed.", "failing", NULL);

	metrics_column(&out, ingress, "pepsi_ingress_sessions", "gauge",
				   "SMTP sessions open in each pepsi-ingress (as of its last report, at most 5 s old).",
				   "sessions", instance_only);
	metrics_column(&out, ingress, "pepsi_ingress_sessions_total", "counter",
				   "SMTP sessions each pepsi-ingress accepted since it started.", "sessions_total",
				   instance_only);
	metrics_column(&out, ingress, "pepsi_ingress_messages_total", "counter",
				   "Messages each pepsi-ingress stored since it started.", "messages", instance_only);

	if (received)
		metrics_column(&out, received, "pepsi_messages_received_total", "counter",
					   "Messages every pepsi-ingress stored, over its restarts.", "messages", NULL);
	if (refusals)
		metrics_column(&out, refusals, "pepsi_smtp_refusals_total", "counter",
					   "SMTP replies pepsi-ingress refused with (4xx and 5xx), by code.", "refusals", code_only);
	if (histograms)
		metrics_histograms(&out, histograms);

	PQclear(histograms);
	PQclear(refusals);
	PQclear(received);
	PQclear(gauges);
	PQclear(stages);
	PQclear(deliveries);
	PQclear(dispatch);
	PQclear(dns);
	PQclear(ingress);
	result = reply_bytes(req, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", out.data,
						 out.len, true);
	buf_free(&out);
	return result;
}
