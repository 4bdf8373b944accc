/* report.c: see report.h. */
#include "report.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <zlib.h>

#include "base/base64.h"
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
