/*
 * report.h: what the aggregate report programs share
 * (pepsi-dmarc-report(8), RFC 7489 7.2; pepsi-tlsrpt(8), RFC 8460): the
 * policy record in the DNS and its tags, the report's gzip and its
 * base64 lines in the message, the --day option, and their start: the
 * configuration, the connection, the log and the resolver.
 */
#ifndef PEPSI_MESSAGE_REPORT_H
#define PEPSI_MESSAGE_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "base/buf.h"
#include "config/config.h"
#include "dns/dns.h"

/* The first TXT record at name that starts with prefix, or NULL (*status says why). */
char *report_txt(struct dns_resolver *r, const char *name, const char *prefix, enum dns_status *status);
/* The value of tag in a "tag=value; ..." record (RFC 7489 6.4, RFC 8460 3), trimmed, or NULL. */
char *report_tag(const char *record, const char *tag);
/* gzip (RFC 1952) of data appended to out; false if zlib fails. */
bool report_gzip(const char *data, size_t len, struct buf *out);
/* data in base64, in lines of 76 characters ended by CRLF, appended to out. */
void report_base64_lines(struct buf *out, const void *data, size_t len);
/* --day YYYY-MM-DD: that UTC day's first second, or -1. */
long long report_parse_day(const char *text);
/*
 * A report program's start: config_path loaded into *cfg and a connection
 * as a member of pepsi_config (cli_connect), the log configured, and
 * *resolver made from the configuration's DNS settings.  NULL when one of
 * them fails: the reason printed after program, nothing left open, *rc
 * the exit status.
 */
PGconn *report_open(const char *program, const char *config_path, struct pepsi_config **cfg,
					struct dns_resolver **resolver, int *rc);
/* What report_open made, closed. */
void report_close(PGconn *conn, struct pepsi_config *cfg, struct dns_resolver *resolver);
/* [section] ORG_NAME, the reporting organisation's name: the host name when it is not set. */
const char *report_org_name(const struct pepsi_config *cfg, const char *section);
/*
 * Run sql (its first column: the policy domains that have something to
 * report) and call each_domain(arg, domain) for each row, in order.  The
 * exit status: CLI_EX_OK, or the query's failure's (printed after
 * program, each_domain not called).
 */
int report_each_domain(const char *program, PGconn *conn, const char *sql, int nvalues,
					   const char *const *values, void (*each_domain)(void *arg, const char *domain),
					   void				 *arg);

#endif
