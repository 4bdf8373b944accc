/*
 * setup_task.h: the closed set of setup task kinds (pepsi.setup_task) and
 * the strict check of each kind's parameters.
 *
 * A task says what should be true ("this secret exists", "this role is a
 * member of pepsi_stage"); pepsi-setup apply (cli/setup/) decides how, as
 * root.  The web setup checks a task here before it enqueues it, and the
 * applier checks it again before it acts: a parameter that is missing,
 * unknown or malformed refuses the task, with the reason.  The kinds are
 * those of the CHECK on pepsi.setup_task.kind; docs/pepsi-setup.8.md
 * describes each.
 */
#ifndef PEPSI_SETUP_TASK_H
#define PEPSI_SETUP_TASK_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

enum setup_kind
{
	SETUP_CONFIG_FILE,	 /* /etc/pepsi/pepsi.conf.d/setup.conf (pepsi.conf is the package's) */
	SETUP_SECRET,		 /* a secrets.d fragment holding one secret option */
	SETUP_DATABASE_ROLE, /* a login role, member of one group role */
	SETUP_GRANT_POLICY,	 /* pepsi.grant_apply(), then grant_verify() must be empty */
	SETUP_PG_HBA_LINE,	 /* a pg_hba.conf line, printed for the DBA */
	SETUP_DKIM_KEY,		 /* a DKIM private key, made once */
	SETUP_SRS_SECRET,	 /* the SRS signing secret in secrets.d, made once */
	SETUP_CERTIFICATE,	 /* a TLS certificate and key for ingress */
	SETUP_RELOAD,		 /* reload a daemon */
	SETUP_ADMIN_ACCOUNT, /* a web administrator, its password from a root-only file */
	SETUP_DNS_CHECK,	 /* check a domain's published records */
	SETUP_KIND_COUNT
};

/* "config_file", ... as pepsi.setup_task.kind spells it. */
const char *setup_kind_name(enum setup_kind kind);
/* The kind of a name; false if it is none of the closed set. */
bool setup_kind_parse(const char *name, enum setup_kind *kind);
/* The kinds, comma separated, for a message. */
const char *setup_kind_list(void);

/*
 * Are params (a JSON object) exactly what kind takes: every required
 * parameter present, none unknown, each of its form?  false with the
 * reason in why.
 */
bool setup_task_check(enum setup_kind kind, json_t *params, char *why, size_t whylen);

/* A task: {"kind": ..., "params": {...}} (the plan of setup_model.h is an array of them). */
json_t *setup_task_new(enum setup_kind kind, json_t *params);

/* Forms shared with the interview model. */
bool setup_name_valid(const char *name); /* a role, group, selector or fragment name */
bool setup_domain_valid(const char *name, char *why, size_t whylen);

#endif
