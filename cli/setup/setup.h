/*
 * setup.h: pepsi-setup's parts: the applier of setup tasks (apply.c), which
 * init runs on its own plan and apply on the rows of pepsi.setup_task, and
 * the DNS records (dns.c).
 */
#ifndef PEPSI_CLI_SETUP_H
#define PEPSI_CLI_SETUP_H

#include <stdbool.h>
#include <sys/stat.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "config/config.h"
#include "setup/setup_task.h"

#define SETUP_EX_UNAVAILABLE 69 /* sysexits: the database or a port */

enum setup_outcome
{
	SETUP_DONE,		 /* something changed */
	SETUP_UNCHANGED, /* it already was so */
	SETUP_PRINTED,	 /* for the DBA or the DNS: nothing of ours to change */
	SETUP_FAILED
};

struct setup_ctx
{
	const char *root; /* "" or --root DIR */
	bool		as_root;
	PGconn	   *db;		 /* the extension owner's connection */
	long long	task_id; /* > 0: the lines go to pepsi.setup_task_log too */
};

/* A line of the task being applied: standard output, and its log row. */
void setup_say(struct setup_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Apply one task whose params setup_task_check accepted. */
enum setup_outcome setup_apply_task(struct setup_ctx *ctx, enum setup_kind kind, const json_t *params);

/* pepsi-setup apply: the grants, then every pending row.  An exit status. */
int setup_drain(struct setup_ctx *ctx);

/* pepsi.grant_apply(), then grant_verify() must be empty. */
enum setup_outcome setup_grants(struct setup_ctx *ctx);

/* pepsi-setup init --web (web.c): the one-time link to pepsi-httpd's setup page.  An exit status. */
int setup_init_web(int argc, char **argv, const char *root, const char *config_path);

/* pepsi-setup dns and check on a loaded configuration: exit statuses. */
int setup_dns_print(const struct pepsi_config *cfg);
/* check's lines go to ctx's task (and its log) when ctx is not NULL. */
int setup_dns_check(const struct pepsi_config *cfg, const char *only_domain, struct setup_ctx *ctx);

/* A task's parameter, or NULL (apply.c). */
const char *setup_param(const json_t *params, const char *name);
/* Write path whole (a temporary file renamed over it) with this mode and owner, unless it already is so. */
enum setup_outcome setup_write_file(struct setup_ctx *ctx, const char *path, const char *content, mode_t mode, uid_t uid,
									gid_t gid);
/* A query of the owner's connection; NULL (said) when it fails. */
PGresult *setup_query(struct setup_ctx *ctx, const char *sql, int n, const char *const *values);

/* A pg_hba_line task's line, as pg_hba.conf has it (allocated; pg_hba.c). */
char *setup_pg_hba_text(const json_t *params);
/* The pg_hba_line task: the line said, for the DBA. */
enum setup_outcome setup_pg_hba_line(struct setup_ctx *ctx, const json_t *params);

/*
 * init --apply-pg-hba: pepsi-setup's block of lines in the cluster's
 * pg_hba.conf (first, since the first matching line wins) and
 * pg_ident.conf, between "# BEGIN pepsi-setup" and "# END pepsi-setup".
 * prepare checks, before init changes anything, that the cluster is
 * local (the files the server reads, as pg_read_file shows them, are the
 * ones here, and writable) and the block whole; apply writes them, has the
 * server parse them (pg_hba_file_rules), puts them back if it cannot,
 * and reloads the cluster.
 */
struct setup_hba
{
	char	   *path[2]; /* pg_hba.conf, pg_ident.conf */
	struct stat st[2];
	char	   *before[2];
	char	   *after[2];
};

bool			   setup_hba_prepare(struct setup_ctx *ctx, struct setup_hba *hba, const char *hba_lines, const char *ident_lines,
									 char *why, size_t whylen);
enum setup_outcome setup_hba_apply(struct setup_ctx *ctx, struct setup_hba *hba);
void			   setup_hba_free(struct setup_hba *hba);

/*
 * pepsi-helper-auto-pay's login role (pg_hba.c): its pg_hba.conf line
 * appended to hba_lines, ident_lines with its pg_ident.conf line
 * (allocated); the role made as the map expects.
 */
#define SETUP_AUTOPAY_ROLE "pepsi_payer"
struct buf;
char			  *setup_autopay_lines(const char *database, struct buf *hba_lines, const char *ident_lines);
enum setup_outcome setup_autopay_role(struct setup_ctx *ctx, const char *database);

/* pepsi-setup certificate (certificate.c): an exit status. */
int setup_certificate_command(struct setup_ctx *ctx, const struct pepsi_config *cfg, int argc, char **argv);

/* Is the port free on address?  false with why when another process holds it. */
bool setup_port_free(const char *address, const char *port, char *why, size_t whylen);

#endif
