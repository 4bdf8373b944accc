/* report.c: see report.h. */
#include "report.h"

#include <ctype.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <zlib.h>

#include "base/base64.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/log_config.h"
#include "process/cli.h"
#include "runtime/db.h"

char *
report_txt(struct dns_resolver *r, const char *name, const char *prefix, enum dns_status *status)
{
	struct dns_answer a;
	char			 *found = NULL;

	dns_resolve_sync(r, name, DNS_TYPE_TXT, &a);
	*status = a.status;
	for (size_t i = 0; a.status == DNS_OK && i < a.count && !found; i++)
		if (a.records[i].type == DNS_TYPE_TXT && a.records[i].text
			&& strlen(a.records[i].text) == a.records[i].len
			&& strncmp(a.records[i].text, prefix, strlen(prefix)) == 0)
			found = xstrdup(a.records[i].text);
	dns_answer_free(&a);
	return found;
}

char *
report_tag(const char *record, const char *tag)
{
	const char *p = record;
	size_t		taglen = strlen(tag);

	while (*p)
	{
		const char *end = strchr(p, ';');
		const char *stop = end ? end : p + strlen(p);

		while (p < stop && isspace((unsigned char) *p))
			p++;
		if ((size_t) (stop - p) > taglen && strncasecmp(p, tag, taglen) == 0)
		{
			const char *v = p + taglen;

			while (v < stop && isspace((unsigned char) *v))
				v++;
			if (v < stop && *v == '=')
			{
				const char *vend = stop;

				v++;
				while (v < vend && isspace((unsigned char) *v))
					v++;
				while (vend > v && isspace((unsigned char) vend[-1]))
					vend--;
				return xstrndup(v, (size_t) (vend - v));
			}
		}
		if (!end)
			break;
		p = end + 1;
	}
	return NULL;
}

bool
report_gzip(const char *data, size_t len, struct buf *out)
{
	z_stream z;
	int		 rc;

	memset(&z, 0, sizeof(z));
	if (deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
		return false;
	buf_reserve(out, deflateBound(&z, (uLong) len));
	z.next_in = (Bytef *) (uintptr_t) data;
	z.avail_in = (uInt) len;
	z.next_out = (Bytef *) out->data + out->len;
	z.avail_out = (uInt) deflateBound(&z, (uLong) len);
	rc = deflate(&z, Z_FINISH);
	if (rc == Z_STREAM_END)
		out->len += z.total_out;
	deflateEnd(&z);
	return rc == Z_STREAM_END;
}

void
report_base64_lines(struct buf *out, const void *data, size_t len)
{
	struct buf b64 = BUF_INIT;

	base64_append(&b64, data, len);
	for (size_t i = 0; i < b64.len; i += 76)
	{
		buf_append(out, b64.data + i, b64.len - i < 76 ? b64.len - i : 76);
		buf_append_str(out, "\r\n");
	}
	buf_free(&b64);
}

long long
report_parse_day(const char *text)
{
	struct tm tm;
	char	 *end;

	memset(&tm, 0, sizeof(tm));
	end = strptime(text, "%Y-%m-%d", &tm);
	if (end == NULL || *end)
		return -1;
	return (long long) timegm(&tm);
}

PGconn *
report_open(const char *program, const char *config_path, struct pepsi_config **cfg,
			struct dns_resolver **resolver, int *rc)
{
	PGconn			 *conn = cli_connect(program, config_path, CLI_ROLE_CONFIG, cfg, rc);
	struct dns_config dns;
	char			  err[512];

	if (conn == NULL)
		return NULL;
	*resolver = NULL;
	if (log_configure(*cfg, err, sizeof(err)) && dns_config_load(*cfg, &dns, err, sizeof(err)))
	{
		*resolver = dns_resolver_new(NULL, &dns, err, sizeof(err));
		dns_config_free(&dns);
	}
	if (*resolver != NULL)
		return conn;
	fprintf(stderr, "%s: %s\n", program, err);
	PQfinish(conn);
	config_free(*cfg);
	*cfg = NULL;
	*rc = CLI_EX_CONFIG;
	return NULL;
}

void
report_close(PGconn *conn, struct pepsi_config *cfg, struct dns_resolver *resolver)
{
	dns_resolver_free(resolver);
	PQfinish(conn);
	config_free(cfg);
}

const char *
report_org_name(const struct pepsi_config *cfg, const char *section)
{
	const char *name = config_text(cfg, section, "ORG_NAME");

	return name ? name : config_hostname(cfg);
}

int
report_each_domain(const char *program, PGconn *conn, const char *sql, int nvalues,
				   const char *const *values, void (*each_domain)(void *arg, const char *domain), void *arg)
{
	PGresult *res = db_exec(conn, sql, nvalues, values);
	int		  rc = CLI_EX_OK;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		rc = cli_db_exit_code(res, conn);
		cli_db_error(program, res, conn);
	}
	else
		for (int i = 0; i < PQntuples(res); i++)
			each_domain(arg, PQgetvalue(res, i, 0));
	PQclear(res);
	return rc;
}

bool
report_mailto_address(const char *addr, size_t len, const char *extra, const char *forbidden_why, char *out,
					  size_t outlen, const char **why)
{
	const char *at = memchr(addr, '@', len);

	if (len == 0 || at == NULL || at == addr || at == addr + len - 1 || memchr(at + 1, '@', addr + len - at - 1))
	{
		*why = "not one address (local@domain)";
		return false;
	}
	for (const char *p = addr; p < addr + len; p++)
		if (!isgraph((unsigned char) *p) || strchr("<>()[]\\,;:\"%", *p) || strchr(extra, *p))
		{
			*why = forbidden_why;
			return false;
		}
	for (const char *p = at + 1; p < addr + len; p++)
		if (!isalnum((unsigned char) *p) && *p != '-' && *p != '.')
		{
			*why = "the address's domain is not a host name";
			return false;
		}
	if (len >= outlen)
	{
		*why = "the address is too long";
		return false;
	}
	memcpy(out, addr, len);
	out[len] = '\0';
	for (char *p = strchr(out, '@'); p && *p; p++)
		*p = (char) tolower((unsigned char) *p);
	return true;
}

bool
report_run_start(struct report_run *run, const char *program, const char *section, const char *config_path,
				 const char *default_local, int *rc)
{
	if ((run->conn = report_open(program, config_path, &run->cfg, &run->resolver, rc)) == NULL)
		return false;
	run->hostname = config_hostname(run->cfg);
	run->org_name = report_org_name(run->cfg, section);
	run->sender = config_text(run->cfg, section, "SENDER");
	if (run->sender == NULL)
		run->sender = run->own_sender = xasprintf("%s@%s", default_local, run->hostname);
	run->stage = config_text(run->cfg, section, "STAGE");
	return true;
}

void
report_run_queue(struct report_run *run, const char *sql, const char *domain, const char *rua,
				 const char *report_id, const struct buf *headers, const struct buf *body, size_t gzlen)
{
	const char *values[7] = {run->stage, run->sender, rua, headers->data, body->data, domain, report_id};
	int			lengths[7] = {0, 0, 0, (int) headers->len, (int) body->len, 0, 0};
	int			formats[7] = {0, 0, 0, 1, 1, 0, 0};
	PGresult   *res;

	if (run->dry_run)
	{
		printf("%s: would send report %s to <%s> (%zu octets gzipped)\n", domain, report_id, rua, gzlen);
		return;
	}
	res = PQexecParams(run->conn, sql, 7, NULL, values, lengths, formats, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("%s: report %s to <%s> not queued: %s", domain, report_id, rua, PQresultErrorMessage(res));
		run->refused++;
	}
	else if (*PQgetvalue(res, 0, 0) == '\0')
		log_info("%s: report %s to <%s> was queued already", domain, report_id, rua);
	else
	{
		log_info("%s: report %s to <%s> queued as row %s", domain, report_id, rua, PQgetvalue(res, 0, 0));
		run->sent++;
	}
	PQclear(res);
}

int
report_run_finish(struct report_run *run, int rc, const char *verb)
{
	if (rc == CLI_EX_OK)
		printf("%s%d reports %s, %d destinations refused\n", run->dry_run ? "dry run: " : "", run->sent, verb,
			   run->refused);
	report_close(run->conn, run->cfg, run->resolver);
	free(run->own_sender);
	return rc;
}

int
report_option(const char *program, int opt, struct report_args *args, struct report_run *run)
{
	switch (opt)
	{
		case 'C':
			args->config_path = optarg;
			return 1;
		case 'd':
			if ((args->day = report_parse_day(optarg)) < 0)
			{
				fprintf(stderr, "%s: --day takes a date, YYYY-MM-DD, not \"%s\"\n", program, optarg);
				return -1;
			}
			return 1;
		case 'D':
			args->only = optarg;
			return 1;
		case 'n':
			run->dry_run = true;
			return 1;
		default:
			return 0;
	}
}

bool
report_no_argument(const char *program, int argc, char **argv)
{
	if (optind < argc)
	{
		fprintf(stderr, "%s: takes no argument, not \"%s\"\n", program, argv[optind]);
		return false;
	}
	return true;
}

void
report_refuse(struct report_run *run, const char *domain, const char *uri, const char *why)
{
	log_warnx("%s: rua \"%s\" refused: %s", domain, uri, why);
	run->refused++;
}

char *
report_next_rua(struct report_run *run, const char *domain, char *rua, char **save, int *nuri, int max)
{
	char *uri;
	char  why[64];

	while ((uri = strtok_r(*nuri == 0 ? rua : NULL, ",", save)) != NULL)
	{
		while (isspace((unsigned char) *uri))
			uri++;
		for (size_t l = strlen(uri); l > 0 && isspace((unsigned char) uri[l - 1]); l--)
			uri[l - 1] = '\0';
		if (++*nuri <= max)
			return uri;
		snprintf(why, sizeof(why), "more than %d destinations", max);
		report_refuse(run, domain, uri, why);
	}
	return NULL;
}

void
report_file_name(char *out, size_t outlen, const struct report_run *run, const char *domain, long long first,
				 long long last, const char *ext)
{
	snprintf(out, outlen, "%s!%s!%lld!%lld.%s", run->hostname, domain, first, last, ext);
}

void
report_headers(struct buf *headers, const struct report_run *run, const char *rua, const char *domain,
			   const char *submitter, const char *report_id, const char *extra, time_t now)
{
	char	  date[64];
	struct tm tm;

	gmtime_r(&now, &tm);
	strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S +0000", &tm);
	buf_printf(headers,
			   "From: <%s>\r\nTo: <%s>\r\nDate: %s\r\n"
			   "Subject: Report Domain: %s Submitter: %s Report-ID: <%s>\r\n%s"
			   "Message-ID: <%s.%lld@%s>\r\nAuto-Submitted: auto-generated\r\nMIME-Version: 1.0\r\n",
			   run->sender, rua, date, domain, submitter, report_id, extra, report_id, (long long) now,
			   run->hostname);
}

char *
report_policy_record(struct report_run *run, const char *domain, const char *name, const char *prefix,
					 const char *no_record, const char *when)
{
	enum dns_status status;
	char		   *record = report_txt(run->resolver, name, prefix, &status);

	if (record == NULL)
		log_info("%s: no report: %s at %s%s", domain,
				 status == DNS_OK || status == DNS_NXDOMAIN ? no_record : "the lookup failed", name, when);
	return record;
}
