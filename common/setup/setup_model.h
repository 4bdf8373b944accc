/*
 * setup_model.h: the setup interview, as data: the questions a new
 * installation answers, the check of each answer, and the plan the
 * answers make: the setup tasks (setup_task.h) that bring the host to
 * them.  pepsi-setup init asks the questions on a terminal or takes them
 * as options and applies the plan itself; the web setup asks the same
 * questions in a form and enqueues the same plan in pepsi.setup_task.
 * Nothing here acts: it only checks and plans.
 */
#ifndef PEPSI_SETUP_MODEL_H
#define PEPSI_SETUP_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

enum setup_question_id
{
	SETUP_Q_DOMAINS,	   /* the mail domains, space or comma separated */
	SETUP_Q_HOSTNAME,	   /* this host's name (the MX) */
	SETUP_Q_CONNINFO,	   /* the cluster, as its owner connects (libpq conninfo) */
	SETUP_Q_DELIVERY,	   /* maildir | lmtp:HOST:PORT */
	SETUP_Q_RELAY,		   /* direct | smarthost:HOST:PORT */
	SETUP_Q_SMARTHOST_TLS, /* verify | may | none */
	SETUP_Q_LISTEN,		   /* the address ingress listens on */
	SETUP_Q_SMTP_PORT,	   /* and its port */
	SETUP_Q_USER,		   /* the daemons' account (when installing as root) */
	SETUP_Q_COUNT
};

struct setup_question
{
	const char *name;		   /* as an option: --domains, as a form field: domains */
	const char *prompt;		   /* the question */
	const char *default_value; /* NULL: none, an answer is required */
};

extern const struct setup_question setup_questions[SETUP_Q_COUNT];

struct setup_answers
{
	char *value[SETUP_Q_COUNT]; /* NULL: not answered (the default then) */
};

/* The question of a name ("domains"), or -1. */
int setup_question_find(const char *name);
/* Check and record an answer; false with why (the answer is then unchanged). */
bool setup_answer(struct setup_answers *answers, enum setup_question_id q, const char *value, char *why,
				  size_t whylen);
/* The answer, or the default (NULL when there is none). */
const char *setup_answer_value(const struct setup_answers *answers, enum setup_question_id q);
/* Is every question without a default answered?  false with the first missing in why. */
bool setup_answers_complete(const struct setup_answers *answers, char *why, size_t whylen);
void setup_answers_free(struct setup_answers *answers);

/*
 * Where the plan puts things: root is prepended to every path written and
 * to every path in what is written (for tests; "" for /); as_root: the
 * daemons drop to SETUP_Q_USER and the secrets go to its group (else the
 * files are the invoking account's and no USER is written).
 */
struct setup_layout
{
	const char *root;
	bool		as_root;
};

/* The DKIM private key's path for a domain and selector (allocated). */
char *setup_dkim_key_path(const struct setup_layout *layout, const char *domain, const char *selector);
/* The configuration file's path (allocated). */
char *setup_config_path(const struct setup_layout *layout);
/* The mailboxes' directory for delivery = maildir (allocated). */
char *setup_maildir_root(const struct setup_layout *layout);
/* The configuration as the answers make it, for pepsi.conf.d/setup.conf (allocated). */
char *setup_config_text(const struct setup_answers *answers, const struct setup_layout *layout);

/* The plan: a JSON array of tasks {"kind", "params"}, each of which setup_task_check accepts. */
json_t *setup_plan(const struct setup_answers *answers, const struct setup_layout *layout);

/* The login roles the plan makes, each with its group role, NULL-terminated pairs. */
extern const char *const setup_login_roles[][2];

#endif
