/*
 * report.h: what the aggregate report programs share
 * (pepsi-dmarc-report(8), RFC 7489 7.2; pepsi-tlsrpt(8), RFC 8460): the
 * policy record in the DNS and its tags, the report's gzip and its
 * base64 lines in the message, the --day option, the rua mailto:
 * address, and their run: the configuration, the connection, the log,
 * the resolver, the queueing of each report and the tally.
 */
#ifndef PEPSI_MESSAGE_REPORT_H
#define PEPSI_MESSAGE_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

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
/*
 * A mailto: address (RFC 6068) of len octets at addr checked and copied,
 * its domain lowercased, into out: one local@domain, no space, control,
 * character of "<>()[]\\,;:\"%" or of extra (forbidden_why then says what
 * they are), a host name for domain.  false with *why otherwise.
 */
bool report_mailto_address(const char *addr, size_t len, const char *extra, const char *forbidden_why,
						   char *out, size_t outlen, const char **why);

/* One report program's run: what report_run_start sets up, and the tally. */
struct report_run
{
	PGconn				*conn;
	struct dns_resolver *resolver;
	struct pepsi_config *cfg;
	const char			*hostname;
	const char			*org_name; /* [section] ORG_NAME */
	const char			*sender;   /* [section] SENDER, or default_local@hostname */
	const char			*stage;	   /* [section] STAGE, or NULL */
	char				*own_sender;
	bool				 dry_run; /* print what would be queued, queue nothing */
	int					 sent;
	int					 refused;
};

/*
 * report_open, then run's names from [section] of the configuration.
 * false when report_open fails (*rc its exit status).
 */
bool report_run_start(struct report_run *run, const char *program, const char *section,
					  const char *config_path, const char *default_local, int *rc);
/*
 * Queue one report message (headers and body as the wire has them) to rua
 * through sql, a pepsi.*_inject($1 stage, $2 sender, $3 rua, $4 headers,
 * $5 body, $6 domain, $7 report_id) whose text is '' when it is queued
 * already; logged and counted in run.  A dry run prints it instead.
 */
void report_run_queue(struct report_run *run, const char *sql, const char *domain, const char *rua,
					  const char *report_id, const struct buf *headers, const struct buf *body, size_t gzlen);
/*
 * The end of a run: the tally printed when rc is CLI_EX_OK ("N reports
 * <verb>, M destinations refused"), everything closed; rc returned.
 */
int report_run_finish(struct report_run *run, int rc, const char *verb);

/*
 * domain's policy record, the TXT record at name that starts with prefix;
 * NULL when there is none, logged as "<domain>: no report: <no_record>
 * at <name><when>" (or "the lookup failed" for no_record).
 */
char *report_policy_record(struct report_run *run, const char *domain, const char *name, const char *prefix,
						   const char *no_record, const char *when);
/*
 * A report's attachment name, <hostname>!<domain>!<first>!<last>.<ext>
 * (RFC 7489 7.2.1.1, RFC 8460 5.3), into out.
 */
void report_file_name(char *out, size_t outlen, const struct report_run *run, const char *domain, long long first,
					  long long last, const char *ext);
/*
 * A report message's first header fields, appended to headers: From
 * (run->sender), To (rua), Date (now), Subject (RFC 7489 7.2.1.1, RFC 8460
 * 5.3), extra (whole CRLF-ended fields, or ""), Message-ID,
 * Auto-Submitted and MIME-Version.  The caller adds its Content-* fields.
 */
void report_headers(struct buf *headers, const struct report_run *run, const char *rua, const char *domain,
					const char *submitter, const char *report_id, const char *extra, time_t now);

/* uri of domain's rua refused for why: logged and counted in run. */
void report_refuse(struct report_run *run, const char *domain, const char *uri, const char *why);
/*
 * The next URI of the comma-separated rua list (strtok_r: *save NULL and
 * *nuri 0 at the start), trimmed; NULL at the end.  Those past the
 * first max are refused and passed over.
 */
char *report_next_rua(struct report_run *run, const char *domain, char *rua, char **save, int *nuri, int max);

/*
 * The options every report program takes, for getopt_long's table:
 * --config (-C), --day, --domain, --dry-run, --help (-h).
 */
#define REPORT_OPTIONS                                                                 \
	{"config", required_argument, NULL, 'C'}, {"day", required_argument, NULL, 'd'},   \
		{"domain", required_argument, NULL, 'D'}, {"dry-run", no_argument, NULL, 'n'}, \
	{                                                                                  \
		"help", no_argument, NULL, 'h'                                                 \
	}

/* What those options said (day: the --day's first second, or -1). */
struct report_args
{
	const char *config_path;
	const char *only; /* --domain */
	long long	day;
};

/*
 * opt (with optarg) from getopt_long, when it is one of REPORT_OPTIONS but
 * --help, into args and run->dry_run: 1.  -1 when its argument is wrong
 * (said on stderr after program); 0 when opt is none of them.
 */
int report_option(const char *program, int opt, struct report_args *args, struct report_run *run);
/* false, said on stderr after program, when argv holds an argument after the options. */
bool report_no_argument(const char *program, int argc, char **argv);

#endif
