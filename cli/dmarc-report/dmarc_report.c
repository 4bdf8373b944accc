/*
 * pepsi-dmarc-report: send DMARC aggregate reports (RFC 7489 7.2).
 *
 *   pepsi-dmarc-report [-C config] [--day YYYY-MM-DD | --begin EPOCH --end EPOCH]
 *                      [--domain DOMAIN] [--dry-run]
 *
 * For the period (by default yesterday, UTC), and each domain whose policy
 * applied to messages pepsi-ingress received (pepsi.dmarc_aggregate,
 * dmarc_tally.c), it reads the domain's DMARC record again, builds the
 * XML feedback (docs/dmarc-aggregate.xsd, RFC 7489 appendix C), compresses
 * it with gzip and queues it as a message to each of the record's rua
 * addresses (pepsi.dmarc_report_inject, marked as Pepsi's own mail, once
 * per report and address).  A rua that is not a mailto: URI with one
 * address is refused, and one whose domain is outside the policy domain's
 * organization is used only when that domain authorises it (RFC 7489 7.1:
 * a "v=DMARC1" TXT record at <policy domain>._report._dmarc.<rua domain>);
 * each refusal is logged with its reason.  Run daily (a systemd timer, or
 * a pepsi.schedule row injecting at a stage that runs it).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "auth/dmarc.h"
#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "dns/dns.h"
#include "message/report.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_dmarc_report_main(int argc, char **argv);

#define DR_PROGRAM "pepsi-dmarc-report"
#define DR_SECTION "dmarc-report"
#define DR_MAX_RUA 8

struct dr_context
{
	struct report_run run;
	long long		  begin;
	long long		  end;
};

static void
dr_usage(FILE *out)
{
	fprintf(out, "usage: " DR_PROGRAM " [-C CONFIG] [--day YYYY-MM-DD | --begin EPOCH --end EPOCH]\n"
				 "       [--domain DOMAIN] [--dry-run]\n"
				 "  send the DMARC aggregate reports of a period (default: yesterday, UTC)\n");
}

static void
dr_xml_text(struct buf *b, const char *s)
{
	for (; *s; s++)
		switch (*s)
		{
			case '&':
				buf_append_str(b, "&amp;");
				break;
			case '<':
				buf_append_str(b, "&lt;");
				break;
			case '>':
				buf_append_str(b, "&gt;");
				break;
			case '"':
				buf_append_str(b, "&quot;");
				break;
			default:
				if ((unsigned char) *s >= 0x20 || *s == '\t')
					buf_append_char(b, *s);
		}
}

static void
dr_xml_element(struct buf *b, const char *indent, const char *name, const char *value)
{
	buf_printf(b, "%s<%s>", indent, name);
	dr_xml_text(b, value);
	buf_printf(b, "</%s>\n", name);
}

/*
 * One rua URI (RFC 7489 6.2, 6.4): "mailto:" and one address, with an
 * optional "!size" limit.  The address into out; false with why.
 */
static bool
dr_parse_rua(const char *uri, char *out, size_t outlen, const char **why)
{
	const char *addr;
	const char *bang;
	size_t		len;

	if (strncasecmp(uri, "mailto:", 7) != 0)
	{
		*why = "not a mailto: URI (Pepsi sends reports by mail only)";
		return false;
	}
	addr = uri + 7;
	bang = strchr(addr, '!');
	len = bang ? (size_t) (bang - addr) : strlen(addr);
	if (bang)
	{
		const char *s = bang + 1;

		if (!isdigit((unsigned char) *s))
		{
			*why = "the size limit after \"!\" is not a number";
			return false;
		}
		while (isdigit((unsigned char) *s))
			s++;
		if (*s && (strchr("kmgt", *s) == NULL || s[1] != '\0'))
		{
			*why = "the size limit after \"!\" is not a number with k, m, g or t";
			return false;
		}
	}
	return report_mailto_address(addr, len, "", "the address holds a character no address may (or a %-escape)", out,
								 outlen, why);
}

/*
 * RFC 7489 7.1: may reports for policy_domain go to rua_domain?  Yes when
 * both have the same organizational domain; otherwise rua_domain must
 * publish "v=DMARC1" at <policy_domain>._report._dmarc.<rua_domain>.
 */
static bool
dr_rua_authorised(struct dr_context *ctx, const char *policy_domain, const char *rua_domain, char *why,
				  size_t whylen)
{
	char		   *org_policy = dmarc_organizational_domain(policy_domain);
	char		   *org_rua = dmarc_organizational_domain(rua_domain);
	bool			same = org_policy && org_rua && strcasecmp(org_policy, org_rua) == 0;
	char			name[600];
	char		   *record;
	enum dns_status status;

	free(org_policy);
	free(org_rua);
	if (same)
		return true;
	snprintf(name, sizeof(name), "%s._report._dmarc.%s", policy_domain, rua_domain);
	record = report_txt(ctx->run.resolver, name, "v=DMARC1", &status);
	if (record)
	{
		free(record);
		return true;
	}
	snprintf(why, whylen, "%s is outside %s and does not authorise its reports: %s at %s",
			 rua_domain, policy_domain,
			 status == DNS_OK || status == DNS_NXDOMAIN ? "no \"v=DMARC1\" TXT record"
			 : status == DNS_TIMEOUT					? "the lookup timed out for"
														: "the lookup failed for",
			 name);
	return false;
}

/* The <feedback> document for one domain, or false when it has no rows. */
static bool
dr_build_xml(struct dr_context *ctx, const char *domain, const char *record, const char *report_id,
			 struct buf *xml)
{
	char		begin[24];
	char		end[24];
	const char *values[3] = {domain, begin, end};
	PGresult   *res;
	char	   *p = report_tag(record, "p");
	char	   *sp = report_tag(record, "sp");
	char	   *adkim = report_tag(record, "adkim");
	char	   *aspf = report_tag(record, "aspf");
	char	   *pct = report_tag(record, "pct");
	char	   *fo = report_tag(record, "fo");
	int			n;

	snprintf(begin, sizeof(begin), "%lld", ctx->begin);
	snprintf(end, sizeof(end), "%lld", ctx->end);
	res = db_exec(ctx->run.conn,
				  "SELECT host(source_ip), sum(messages)::text, disposition, dkim, spf, envelope_from, header_from,"
				  " dkim_domain, dkim_selector, dkim_result, spf_scope, spf_result"
				  " FROM pepsi.dmarc_aggregate"
				  " WHERE policy_domain = $1 AND period >= to_timestamp($2::bigint) AND period < to_timestamp($3::bigint)"
				  " GROUP BY source_ip, disposition, dkim, spf, envelope_from, header_from, dkim_domain,"
				  " dkim_selector, dkim_result, spf_scope, spf_result"
				  " ORDER BY source_ip, header_from, disposition, dkim, spf, envelope_from, dkim_domain",
				  3, values);
	n = PQresultStatus(res) == PGRES_TUPLES_OK ? PQntuples(res) : -1;
	if (n < 0)
		cli_db_error(DR_PROGRAM, res, ctx->run.conn);
	if (n > 0)
	{
		const char *const policies[] = {"none", "quarantine", "reject"};
		const char		 *p_ok = "none";
		const char		 *sp_ok;

		for (int i = 0; i < 3; i++)
			if (p && strcasecmp(p, policies[i]) == 0)
				p_ok = policies[i];
		sp_ok = p_ok;
		for (int i = 0; i < 3; i++)
			if (sp && strcasecmp(sp, policies[i]) == 0)
				sp_ok = policies[i];
		buf_append_str(xml, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<feedback>\n  <version>1.0</version>\n"
							"  <report_metadata>\n");
		dr_xml_element(xml, "    ", "org_name", ctx->run.org_name);
		dr_xml_element(xml, "    ", "email", ctx->run.sender);
		dr_xml_element(xml, "    ", "report_id", report_id);
		buf_printf(xml, "    <date_range>\n      <begin>%lld</begin>\n      <end>%lld</end>\n    </date_range>\n",
				   ctx->begin, ctx->end - 1);
		buf_append_str(xml, "  </report_metadata>\n  <policy_published>\n");
		dr_xml_element(xml, "    ", "domain", domain);
		dr_xml_element(xml, "    ", "adkim", adkim && strcasecmp(adkim, "s") == 0 ? "s" : "r");
		dr_xml_element(xml, "    ", "aspf", aspf && strcasecmp(aspf, "s") == 0 ? "s" : "r");
		dr_xml_element(xml, "    ", "p", p_ok);
		dr_xml_element(xml, "    ", "sp", sp_ok);
		buf_printf(xml, "    <pct>%d</pct>\n", pct ? atoi(pct) : 100);
		dr_xml_element(xml, "    ", "fo", fo ? fo : "0");
		buf_append_str(xml, "  </policy_published>\n");
		for (int i = 0; i < n; i++)
		{
			buf_append_str(xml, "  <record>\n    <row>\n");
			dr_xml_element(xml, "      ", "source_ip", PQgetvalue(res, i, 0));
			dr_xml_element(xml, "      ", "count", PQgetvalue(res, i, 1));
			buf_append_str(xml, "      <policy_evaluated>\n");
			dr_xml_element(xml, "        ", "disposition", PQgetvalue(res, i, 2));
			dr_xml_element(xml, "        ", "dkim", PQgetvalue(res, i, 3));
			dr_xml_element(xml, "        ", "spf", PQgetvalue(res, i, 4));
			buf_append_str(xml, "      </policy_evaluated>\n    </row>\n    <identifiers>\n");
			dr_xml_element(xml, "      ", "envelope_from", PQgetvalue(res, i, 5));
			dr_xml_element(xml, "      ", "header_from", PQgetvalue(res, i, 6));
			buf_append_str(xml, "    </identifiers>\n    <auth_results>\n");
			if (*PQgetvalue(res, i, 7))
			{
				buf_append_str(xml, "      <dkim>\n");
				dr_xml_element(xml, "        ", "domain", PQgetvalue(res, i, 7));
				if (*PQgetvalue(res, i, 8))
					dr_xml_element(xml, "        ", "selector", PQgetvalue(res, i, 8));
				dr_xml_element(xml, "        ", "result", *PQgetvalue(res, i, 9) ? PQgetvalue(res, i, 9) : "none");
				buf_append_str(xml, "      </dkim>\n");
			}
			buf_append_str(xml, "      <spf>\n");
			dr_xml_element(xml, "        ", "domain", PQgetvalue(res, i, 5));
			dr_xml_element(xml, "        ", "scope", PQgetvalue(res, i, 10));
			dr_xml_element(xml, "        ", "result", PQgetvalue(res, i, 11));
			buf_append_str(xml, "      </spf>\n    </auth_results>\n  </record>\n");
		}
		buf_append_str(xml, "</feedback>\n");
	}
	PQclear(res);
	free(p);
	free(sp);
	free(adkim);
	free(aspf);
	free(pct);
	free(fo);
	return n > 0;
}

/* Queue the report to one rua address. */
static void
dr_send(struct dr_context *ctx, const char *domain, const char *rua, const char *report_id,
		const struct buf *gz)
{
	struct buf headers = BUF_INIT;
	struct buf body = BUF_INIT;
	char	   filename[700];

	/* RFC 7489 7.2.1.1: receiver!policy-domain!begin!end.xml.gz */
	report_file_name(filename, sizeof(filename), &ctx->run, domain, ctx->begin, ctx->end - 1, "xml.gz");
	report_headers(&headers, &ctx->run, rua, domain, ctx->run.org_name, report_id, "", time(NULL));
	buf_printf(&headers,
			   "Content-Type: application/gzip; name=\"%s\"\r\n"
			   "Content-Disposition: attachment; filename=\"%s\"\r\nContent-Transfer-Encoding: base64\r\n",
			   filename, filename);
	report_base64_lines(&body, gz->data, gz->len);
	report_run_queue(&ctx->run, "SELECT coalesce(pepsi.dmarc_report_inject($1, $2, $3, $4, $5, $6, $7)::text, '')", domain, rua,
					 report_id, &headers, &body, gz->len);
	buf_free(&headers);
	buf_free(&body);
}

/* One domain's report: its record, its rua, the XML, and each destination. */
static void
dr_each_domain(void *arg, const char *domain)
{
	struct dr_context *ctx = arg;
	char			   name[600];
	char			  *record;
	char			  *rua;
	char			   report_id[700];
	struct buf		   xml = BUF_INIT;
	struct buf		   gz = BUF_INIT;
	char			  *uri;
	char			  *save = NULL;
	int				   nuri = 0;

	snprintf(name, sizeof(name), "_dmarc.%s", domain);
	if ((record = report_policy_record(&ctx->run, domain, name, "v=DMARC1", "no DMARC record", " now")) == NULL)
		return;
	rua = report_tag(record, "rua");
	if (rua == NULL || *rua == '\0')
	{
		log_info("%s: no report: its DMARC record asks for none (no rua)", domain);
		free(rua);
		free(record);
		return;
	}
	snprintf(report_id, sizeof(report_id), "%s.%lld.%lld", domain, ctx->begin, ctx->end);
	if (!dr_build_xml(ctx, domain, record, report_id, &xml))
	{
		free(rua);
		free(record);
		buf_free(&xml);
		return;
	}
	if (!report_gzip(xml.data, xml.len, &gz))
	{
		log_warnx("%s: the report could not be compressed", domain);
		ctx->run.refused++;
	}
	else
		while ((uri = report_next_rua(&ctx->run, domain, rua, &save, &nuri, DR_MAX_RUA)) != NULL)
		{
			char		address[320];
			char		why[900];
			const char *bad;

			if (!dr_parse_rua(uri, address, sizeof(address), &bad))
				report_refuse(&ctx->run, domain, uri, bad);
			else if (!dr_rua_authorised(ctx, domain, strchr(address, '@') + 1, why, sizeof(why)))
				report_refuse(&ctx->run, domain, uri, why);
			else
				dr_send(ctx, domain, address, report_id, &gz);
		}
	buf_free(&xml);
	buf_free(&gz);
	free(rua);
	free(record);
}

static bool
dr_parse_epoch(const char *text, long long *out)
{
	char *end;

	errno = 0;
	*out = strtoll(text, &end, 10);
	return *text && !*end && errno == 0 && *out >= 0;
}

int
pepsi_dmarc_report_main(int argc, char **argv)
{
	static const struct option long_options[] = {
		REPORT_OPTIONS, {"begin", required_argument, NULL, 'b'}, {"end", required_argument, NULL, 'e'}, {NULL, 0, NULL, 0}};
	struct dr_context  ctx = {.begin = -1, .end = -1};
	struct report_args args = {.day = -1};
	int				   opt;
	int				   got;
	int				   rc = CLI_EX_OK;

	log_init(DR_PROGRAM, false);
	while ((opt = getopt_long(argc, argv, "C:h", long_options, NULL)) != -1)
	{
		if ((got = report_option(DR_PROGRAM, opt, &args, &ctx.run)) < 0)
			return CLI_EX_USAGE;
		if (got > 0)
		{
			/* --day is the period from that day's first second to the next day's */
			if (opt == 'd')
				ctx.end = (ctx.begin = args.day) + 86400;
			continue;
		}
		switch (opt)
		{
			case 'b':
			case 'e':
				if (!dr_parse_epoch(optarg, opt == 'b' ? &ctx.begin : &ctx.end))
				{
					fprintf(stderr, DR_PROGRAM ": --%s takes seconds since the epoch, not \"%s\"\n",
							opt == 'b' ? "begin" : "end", optarg);
					return CLI_EX_USAGE;
				}
				break;
			case 'h':
				dr_usage(stdout);
				return CLI_EX_OK;
			default:
				dr_usage(stderr);
				return CLI_EX_USAGE;
		}
	}
	if (!report_no_argument(DR_PROGRAM, argc, argv))
		return CLI_EX_USAGE;
	if (ctx.begin < 0 && ctx.end < 0)
	{
		long long today = (long long) time(NULL) / 86400 * 86400;

		ctx.begin = today - 86400;
		ctx.end = today;
	}
	if (ctx.begin < 0 || ctx.end <= ctx.begin)
	{
		fprintf(stderr, DR_PROGRAM ": the period needs --begin before --end (or --day)\n");
		return CLI_EX_USAGE;
	}
	if (!report_run_start(&ctx.run, DR_PROGRAM, DR_SECTION, args.config_path, "dmarc-reports", &rc))
		return rc;

	{
		char		begin[24];
		char		end[24];
		const char *values[3] = {begin, end, args.only};

		snprintf(begin, sizeof(begin), "%lld", ctx.begin);
		snprintf(end, sizeof(end), "%lld", ctx.end);
		rc = report_each_domain(DR_PROGRAM, ctx.run.conn,
								"SELECT DISTINCT policy_domain FROM pepsi.dmarc_aggregate"
								" WHERE period >= to_timestamp($1::bigint) AND period < to_timestamp($2::bigint)"
								" AND ($3::text IS NULL OR policy_domain = lower($3)) ORDER BY 1",
								3, values, dr_each_domain, &ctx);
	}
	return report_run_finish(&ctx.run, rc, "queued");
}
