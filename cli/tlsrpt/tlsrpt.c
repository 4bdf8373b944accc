/*
 * pepsi-tlsrpt: send SMTP TLS reports (RFC 8460).
 *
 *   pepsi-tlsrpt [-C config] [--day YYYY-MM-DD] [--domain DOMAIN] [--dry-run]
 *
 * For a UTC day (by default yesterday), and each recipient domain the
 * relay delivered to (pepsi.tls_aggregate, counted by
 * pepsi-stage-relay-to-internet: stages/relay-to-internet/tls_tally.h),
 * it reads the domain's TLSRPT record (_smtp._tls.<domain>, TXT
 * "v=TLSRPTv1; rua=..."), builds the report as RFC 8460 section 4's JSON
 * (a policy per policy type, text and MX patterns, with its session
 * counts and failure details), compresses it with gzip and sends it to
 * each rua: a mailto: as a message (RFC 8460 5.3: multipart/report with
 * an application/tlsrpt+gzip part, queued through pepsi.tlsrpt_inject,
 * once per report and address), an https: with a POST of
 * application/tlsrpt+gzip (libcurl, https only, the certificate verified,
 * redirects not followed; RFC 8460 5.4).  A rua that is neither, a
 * malformed one, an http: one, and a record without rua are logged with
 * the reason and get nothing.  Run daily (pepsi-tlsrpt.timer).
 */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <libpq-fe.h>

#include "base/base64.h"
#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "dns/dns.h"
#include "message/report.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_tlsrpt_main(int argc, char **argv);

#define TR_PROGRAM "pepsi-tlsrpt"
#define TR_SECTION "tlsrpt"
#define TR_MAX_RUA 8

struct tr_context
{
	struct report_run run;
	const char		 *ca_file;
	long			  timeout_ms;
	long long		  begin; /* the day's first second */
	char			  day[16];
};

static void
tr_usage(FILE *out)
{
	fprintf(out, "usage: " TR_PROGRAM " [-C CONFIG] [--day YYYY-MM-DD] [--domain DOMAIN] [--dry-run]\n"
				 "  send the SMTP TLS reports (RFC 8460) of a day (default: yesterday, UTC)\n");
}

/* A newline-joined list as a JSON array of its lines ("" gives []). */
static json_t *
tr_lines(const char *text)
{
	json_t *a = json_array();

	while (text && *text)
	{
		const char *end = strchr(text, '\n');
		size_t		len = end ? (size_t) (end - text) : strlen(text);

		json_array_append_new(a, json_stringn(text, len));
		text = end ? end + 1 : text + len;
	}
	return a;
}

/* The report of one domain (RFC 8460 4.4), or NULL when it has no rows. */
static json_t *
tr_build(struct tr_context *ctx, const char *domain, const char *report_id)
{
	const char *values[2] = {domain, ctx->day};
	PGresult   *res;
	json_t	   *report = NULL;
	json_t	   *policies;
	json_t	   *current = NULL;
	long long	ok = 0;
	long long	failed = 0;
	char		start[32];
	char		end[32];
	int			n;

	res = db_exec(ctx->run.conn,
				  "SELECT policy_type, policy_string, mx_host, result_type, receiving_mx_hostname, receiving_ip,"
				  " sending_mta_ip, sum(sessions)::text"
				  " FROM pepsi.tls_aggregate WHERE policy_domain = $1 AND day = $2::date"
				  " GROUP BY 1, 2, 3, 4, 5, 6, 7"
				  " ORDER BY policy_type, policy_string, mx_host, result_type <> '', 4, 5, 6, 7",
				  2, values);
	n = PQresultStatus(res) == PGRES_TUPLES_OK ? PQntuples(res) : -1;
	if (n < 0)
		cli_db_error(TR_PROGRAM, res, ctx->run.conn);
	if (n <= 0)
	{
		PQclear(res);
		return NULL;
	}
	snprintf(start, sizeof(start), "%sT00:00:00Z", ctx->day);
	snprintf(end, sizeof(end), "%sT23:59:59Z", ctx->day);
	report = json_object();
	json_object_set_new(report, "organization-name", json_string(ctx->run.org_name));
	json_object_set_new(report, "date-range",
						json_pack("{s:s, s:s}", "start-datetime", start, "end-datetime", end));
	json_object_set_new(report, "contact-info", json_string(ctx->run.sender));
	json_object_set_new(report, "report-id", json_string(report_id));
	policies = json_array();
	for (int i = 0; i <= n; i++)
	{
		bool new_policy = i == n || current == NULL || strcmp(PQgetvalue(res, i, 0), PQgetvalue(res, i - 1, 0)) != 0
						  || strcmp(PQgetvalue(res, i, 1), PQgetvalue(res, i - 1, 1)) != 0
						  || strcmp(PQgetvalue(res, i, 2), PQgetvalue(res, i - 1, 2)) != 0;
		long long sessions;

		if (new_policy && current)
		{
			json_object_set_new(current, "summary",
								json_pack("{s:I, s:I}", "total-successful-session-count", (json_int_t) ok,
										  "total-failure-session-count", (json_int_t) failed));
			json_array_append_new(policies, current);
			current = NULL;
		}
		if (i == n)
			break;
		if (new_policy)
		{
			current = json_object();
			json_object_set_new(current, "policy",
								json_pack("{s:s, s:o, s:s, s:o}", "policy-type", PQgetvalue(res, i, 0),
										  "policy-string", tr_lines(PQgetvalue(res, i, 1)), "policy-domain",
										  domain, "mx-host", tr_lines(PQgetvalue(res, i, 2))));
			json_object_set_new(current, "failure-details", json_array());
			ok = failed = 0;
		}
		sessions = atoll(PQgetvalue(res, i, 7));
		if (*PQgetvalue(res, i, 3) == '\0')
			ok += sessions;
		else
		{
			json_t *detail = json_object();

			failed += sessions;
			json_object_set_new(detail, "result-type", json_string(PQgetvalue(res, i, 3)));
			if (*PQgetvalue(res, i, 6))
				json_object_set_new(detail, "sending-mta-ip", json_string(PQgetvalue(res, i, 6)));
			if (*PQgetvalue(res, i, 4))
				json_object_set_new(detail, "receiving-mx-hostname", json_string(PQgetvalue(res, i, 4)));
			if (*PQgetvalue(res, i, 5))
				json_object_set_new(detail, "receiving-ip", json_string(PQgetvalue(res, i, 5)));
			json_object_set_new(detail, "failed-session-count", json_integer((json_int_t) sessions));
			json_array_append_new(json_object_get(current, "failure-details"), detail);
		}
	}
	json_object_set_new(report, "policies", policies);
	PQclear(res);
	return report;
}

/*
 * A mailto: rua (RFC 8460 3: "mailto:" and one address, RFC 6068): the
 * address into out; false with why.
 */
static bool
tr_parse_mailto(const char *uri, char *out, size_t outlen, const char **why)
{
	const char *addr = uri + 7;

	return report_mailto_address(addr, strlen(addr), "?",
								 "the address holds a character no address may (or a %-escape or a query)", out,
								 outlen, why);
}

/* Queue the report to one mailto: address (RFC 8460 5.3). */
static void
tr_mail(struct tr_context *ctx, const char *domain, const char *rua, const char *report_id,
		const struct buf *gz)
{
	struct buf headers = BUF_INIT;
	struct buf body = BUF_INIT;
	struct buf extra = BUF_INIT;
	char	   filename[700];
	char	   boundary[64];
	time_t	   now = time(NULL);

	/* RFC 8460 5.3: sender!policy-domain!begin-timestamp!end-timestamp.json.gz */
	report_file_name(filename, sizeof(filename), &ctx->run, domain, ctx->begin, ctx->begin + 86399, "json.gz");
	snprintf(boundary, sizeof(boundary), "=_tlsrpt_%lld_%lld", (long long) now, ctx->begin);
	buf_printf(&extra, "TLS-Report-Domain: %s\r\nTLS-Report-Submitter: %s\r\n", domain, ctx->run.hostname);
	report_headers(&headers, &ctx->run, rua, domain, ctx->run.hostname, report_id, extra.data, now);
	buf_printf(&headers, "Content-Type: multipart/report; report-type=\"tlsrpt\"; boundary=\"%s\"\r\n", boundary);
	buf_printf(&body,
			   "This is a multipart message in MIME format.\r\n\r\n--%s\r\n"
			   "Content-Type: text/plain; charset=\"us-ascii\"\r\nContent-Transfer-Encoding: 7bit\r\n\r\n"
			   "This is an aggregate TLS report from %s\r\n\r\n--%s\r\n"
			   "Content-Type: application/tlsrpt+gzip\r\nContent-Transfer-Encoding: base64\r\n"
			   "Content-Disposition: attachment; filename=\"%s\"\r\n\r\n",
			   boundary, ctx->run.hostname, boundary, filename);
	report_base64_lines(&body, gz->data, gz->len);
	buf_printf(&body, "\r\n--%s--\r\n", boundary);
	report_run_queue(&ctx->run, "SELECT coalesce(pepsi.tlsrpt_inject($1, $2, $3, $4, $5, $6, $7)::text, '')", domain, rua,
					 report_id, &headers, &body, gz->len);
	buf_free(&headers);
	buf_free(&body);
	buf_free(&extra);
}

/* The first address of host through the project's resolver, as curl's --resolve wants it. */
static bool
tr_address(struct tr_context *ctx, const char *host, char *out, size_t outlen)
{
	static const enum dns_type types[] = {DNS_TYPE_A, DNS_TYPE_AAAA};

	for (size_t t = 0; t < 2; t++)
	{
		struct dns_answer a;

		dns_resolve_sync(ctx->run.resolver, host, types[t], &a);
		for (size_t i = 0; a.status == DNS_OK && i < a.count; i++)
		{
			char text[INET6_ADDRSTRLEN];

			if (a.records[i].type == DNS_TYPE_A && a.records[i].rdata_len == 4)
			{
				inet_ntop(AF_INET, a.records[i].rdata, text, sizeof(text));
				snprintf(out, outlen, "%s", text);
				dns_answer_free(&a);
				return true;
			}
			if (a.records[i].type == DNS_TYPE_AAAA && a.records[i].rdata_len == 16)
			{
				inet_ntop(AF_INET6, a.records[i].rdata, text, sizeof(text));
				snprintf(out, outlen, "[%s]", text);
				dns_answer_free(&a);
				return true;
			}
		}
		dns_answer_free(&a);
	}
	return false;
}

/* POST the report to one https: rua (RFC 8460 5.4); false with why. */
static bool
tr_post(struct tr_context *ctx, const char *domain, const char *uri, const char *report_id,
		const struct buf *gz, char *why, size_t whylen)
{
	CURLU			  *url = curl_url();
	CURL			  *curl = NULL;
	char			  *scheme = NULL;
	char			  *host = NULL;
	char			  *port = NULL;
	char			   address[INET6_ADDRSTRLEN + 2];
	char			   resolve[600];
	char			   curl_error[CURL_ERROR_SIZE] = "";
	struct curl_slist *headers = NULL;
	struct curl_slist *pinned = NULL;
	long			   status = 0;
	bool			   ok = false;
	CURLcode		   rc;

	if (url == NULL || curl_url_set(url, CURLUPART_URL, uri, 0) != CURLUE_OK
		|| curl_url_get(url, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK
		|| curl_url_get(url, CURLUPART_HOST, &host, 0) != CURLUE_OK
		|| curl_url_get(url, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK)
	{
		snprintf(why, whylen, "not a URI libcurl can parse");
		goto done;
	}
	if (strcasecmp(scheme, "https") != 0)
	{
		snprintf(why, whylen, "not an https: URI (reports are POSTed over https only)");
		goto done;
	}
	if (ctx->run.dry_run)
	{
		printf("%s: would POST report %s to %s (%zu octets gzipped)\n", domain, report_id, uri, gz->len);
		ok = true;
		goto done;
	}
	curl = curl_easy_init();
	if (curl == NULL)
	{
		snprintf(why, whylen, "cannot start libcurl");
		goto done;
	}
	if (host[0] != '[' && inet_pton(AF_INET, host, address) != 1)
	{
		if (!tr_address(ctx, host, address, sizeof(address)))
		{
			snprintf(why, whylen, "%s has no address", host);
			goto done;
		}
		snprintf(resolve, sizeof(resolve), "%s:%s:%s", host, port, address);
		pinned = curl_slist_append(NULL, resolve);
		curl_easy_setopt(curl, CURLOPT_RESOLVE, pinned);
	}
	headers = curl_slist_append(NULL, "Content-Type: application/tlsrpt+gzip");
	curl_easy_setopt(curl, CURLOPT_URL, uri);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https");
	curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
	if (ctx->ca_file)
		curl_easy_setopt(curl, CURLOPT_CAINFO, ctx->ca_file);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, ctx->timeout_ms);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
	curl_easy_setopt(curl, CURLOPT_POSTFIELDS, gz->data);
	curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) gz->len);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "Pepsi TLSRPT");
	rc = curl_easy_perform(curl);
	if (rc != CURLE_OK)
	{
		snprintf(why, whylen, "%s", curl_error[0] ? curl_error : curl_easy_strerror(rc));
		goto done;
	}
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	if (status < 200 || status > 299)
	{
		snprintf(why, whylen, "the server answered HTTP status %ld", status);
		goto done;
	}
	ok = true;
	{
		char		status_text[16];
		const char *values[4] = {domain, uri, report_id, status_text};
		PGresult   *res;

		snprintf(status_text, sizeof(status_text), "%ld", status);
		res = db_exec(ctx->run.conn, "SELECT pepsi.tlsrpt_posted($1, $2, $3, $4::integer)", 4, values);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			log_warnx("%s: the POST to %s is not in the event log: %s", domain, uri, PQresultErrorMessage(res));
		PQclear(res);
	}
	log_info("%s: report %s POSTed to %s (HTTP status %ld)", domain, report_id, uri, status);
	ctx->run.sent++;
done:
	curl_slist_free_all(headers);
	curl_slist_free_all(pinned);
	if (curl)
		curl_easy_cleanup(curl);
	curl_free(scheme);
	curl_free(host);
	curl_free(port);
	curl_url_cleanup(url);
	return ok;
}

/* One domain's report: its record, its rua, the JSON, and each destination. */
static void
tr_each_domain(void *arg, const char *domain)
{
	struct tr_context *ctx = arg;
	char			   name[600];
	char			  *record;
	char			  *rua;
	char			   report_id[700];
	json_t			  *report;
	char			  *json;
	struct buf		   gz = BUF_INIT;
	char			  *uri;
	char			  *save = NULL;
	int				   nuri = 0;

	snprintf(name, sizeof(name), "_smtp._tls.%s", domain);
	if ((record = report_policy_record(&ctx->run, domain, name, "v=TLSRPTv1", "no TLSRPT record", "")) == NULL)
		return;
	rua = report_tag(record, "rua");
	if (rua == NULL || *rua == '\0')
	{
		log_warnx("%s: no report: its TLSRPT record \"%s\" has no rua", domain, record);
		ctx->run.refused++;
		free(rua);
		free(record);
		return;
	}
	snprintf(report_id, sizeof(report_id), "%s.%lld@%s", domain, ctx->begin, ctx->run.hostname);
	report = tr_build(ctx, domain, report_id);
	if (report == NULL)
	{
		free(rua);
		free(record);
		return;
	}
	json = json_dumps(report, JSON_COMPACT);
	json_decref(report);
	if (json == NULL || !report_gzip(json, strlen(json), &gz))
	{
		log_warnx("%s: the report could not be compressed", domain);
		ctx->run.refused++;
	}
	else
		while ((uri = report_next_rua(&ctx->run, domain, rua, &save, &nuri, TR_MAX_RUA)) != NULL)
		{
			char		address[320];
			char		why[600];
			const char *bad;

			if (strncasecmp(uri, "mailto:", 7) == 0)
			{
				if (!tr_parse_mailto(uri, address, sizeof(address), &bad))
					report_refuse(&ctx->run, domain, uri, bad);
				else
					tr_mail(ctx, domain, address, report_id, &gz);
			}
			else if (strncasecmp(uri, "https:", 6) == 0)
			{
				if (!tr_post(ctx, domain, uri, report_id, &gz, why, sizeof(why)))
					report_refuse(&ctx->run, domain, uri, why);
			}
			else
				report_refuse(&ctx->run, domain, uri,
							  strncasecmp(uri, "http:", 5) == 0 ? "an http: URI (reports are POSTed over https only)"
																: "neither a mailto: nor an https: URI (RFC 8460 3)");
		}
	free(json);
	buf_free(&gz);
	free(rua);
	free(record);
}

int
pepsi_tlsrpt_main(int argc, char **argv)
{
	static const struct option long_options[] = {REPORT_OPTIONS, {NULL, 0, NULL, 0}};
	struct tr_context		   ctx = {.begin = -1};
	struct report_args		   args = {.day = -1};
	int						   opt;
	int						   got;
	int						   rc = CLI_EX_OK;

	log_init(TR_PROGRAM, false);
	while ((opt = getopt_long(argc, argv, "C:h", long_options, NULL)) != -1)
		if ((got = report_option(TR_PROGRAM, opt, &args, &ctx.run)) < 0)
			return CLI_EX_USAGE;
		else if (got == 0)
		{
			tr_usage(opt == 'h' ? stdout : stderr);
			return opt == 'h' ? CLI_EX_OK : CLI_EX_USAGE;
		}
	if (!report_no_argument(TR_PROGRAM, argc, argv))
		return CLI_EX_USAGE;
	/* by default yesterday (UTC), the last whole day */
	ctx.begin = args.day >= 0 ? args.day : (long long) time(NULL) / 86400 * 86400 - 86400;
	{
		time_t	  t = (time_t) ctx.begin;
		struct tm tm;

		gmtime_r(&t, &tm);
		strftime(ctx.day, sizeof(ctx.day), "%Y-%m-%d", &tm);
	}
	if (!report_run_start(&ctx.run, TR_PROGRAM, TR_SECTION, args.config_path, "tlsrpt-noreply", &rc))
		return rc;
	ctx.ca_file = config_text(ctx.run.cfg, TR_SECTION, "TLS_CA_FILE");
	ctx.timeout_ms = (long) config_duration_ms(ctx.run.cfg, TR_SECTION, "HTTPS_TIMEOUT");

	{
		const char *values[2] = {ctx.day, args.only};

		rc = report_each_domain(TR_PROGRAM, ctx.run.conn,
								"SELECT DISTINCT policy_domain FROM pepsi.tls_aggregate"
								" WHERE day = $1::date AND ($2::text IS NULL OR policy_domain = lower($2)) ORDER BY 1",
								2, values, tr_each_domain, &ctx);
	}
	return report_run_finish(&ctx.run, rc, "sent");
}
