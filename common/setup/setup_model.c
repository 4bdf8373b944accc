/*
 * setup_model.c: see setup_model.h.  The plan's pepsi.conf is a complete
 * pipeline: route, local delivery (Maildir or LMTP), the DKIM signer, the
 * remote relay (direct or a smarthost), and the bounce path through the
 * same stages.
 */
#include "setup/setup_model.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/buf.h"
#include "base/xalloc.h"
#include "options.h"
#include "setup/setup_task.h"

const struct setup_question setup_questions[SETUP_Q_COUNT] = {
	[SETUP_Q_DOMAINS] = {"domains", "The mail domains this server receives for (space separated)", NULL},
	[SETUP_Q_HOSTNAME] = {"hostname", "This host's name, as the MX records will name it", NULL},
	[SETUP_Q_CONNINFO] = {"conninfo", "The PostgreSQL database, as its owner connects (libpq conninfo)",
						  "host=/var/run/postgresql dbname=pepsi user=postgres"},
	[SETUP_Q_DELIVERY] = {"delivery", "Where local mail is delivered: maildir or lmtp:HOST:PORT (Dovecot)",
						  "maildir"},
	[SETUP_Q_RELAY] = {"relay", "How other mail leaves: direct, or smarthost:HOST:PORT", "direct"},
	[SETUP_Q_SMARTHOST_TLS] = {"smarthost-tls", "TLS with the smarthost: verify, may or none", "verify"},
	[SETUP_Q_LISTEN] = {"listen", "The address pepsi-ingress listens on", "0.0.0.0"},
	[SETUP_Q_SMTP_PORT] = {"smtp-port", "The SMTP port", "25"},
	[SETUP_Q_USER] = {"user", "The account the daemons run as", "pepsi"},
};

const char *const setup_login_roles[][2] = {
	{"pepsi_dispatch", "pepsi_stage"},
	{"pepsi_smtpd", "pepsi_ingress"},
	{"pepsi_web", "pepsi_httpd"},
	{"pepsi_viewer", "pepsi_monitor"},
	{"pepsi_operator", "pepsi_config"},
	{NULL, NULL},
};

int
setup_question_find(const char *name)
{
	for (int i = 0; i < SETUP_Q_COUNT; i++)
		if (strcmp(setup_questions[i].name, name) == 0)
			return i;
	return -1;
}

static bool
setup_port_valid(const char *text)
{
	char *end;
	long  port = strtol(text, &end, 10);

	return isdigit((unsigned char) *text) && *end == '\0' && port >= 1 && port <= 65535;
}

/* PREFIX:HOST:PORT: the host a domain or an address, the port a number. */
static bool
setup_destination_valid(const char *value, const char *prefix, char *why, size_t whylen)
{
	const char *host;
	const char *colon;
	char		name[256];
	char		problem[256];
	size_t		len;

	/* The prefix first: a value shorter than it has no host to look at. */
	if (strncmp(value, prefix, strlen(prefix)) != 0)
		goto bad;
	host = value + strlen(prefix);
	colon = strrchr(host, ':');
	if (colon == NULL || !setup_port_valid(colon + 1))
		goto bad;
	len = (size_t) (colon - host);
	if (len == 0 || len >= sizeof(name))
		goto bad;
	memcpy(name, host, len);
	name[len] = '\0';
	if (name[0] == '[' && name[len - 1] == ']')
	{
		unsigned char addr[16];

		name[len - 1] = '\0';
		if (inet_pton(AF_INET6, name + 1, addr) == 1)
			return true;
		goto bad;
	}
	{
		unsigned char addr[4];

		if (inet_pton(AF_INET, name, addr) == 1 || option_domain_check(name, len, problem, sizeof(problem)))
			return true;
	}
bad:
	snprintf(why, whylen, "\"%.200s\" is not %sHOST:PORT (a host name or an address, a port 1-65535)", value,
			 prefix);
	return false;
}

static bool
setup_check(enum setup_question_id q, const char *value, char *why, size_t whylen)
{
	switch (q)
	{
		case SETUP_Q_DOMAINS:
			{
				const char *cursor = value;
				const char *item;
				size_t		len;
				int			count = 0;

				while ((item = option_list_next(&cursor, &len)) != NULL)
				{
					char *domain = strndup(item, len);
					bool  ok = setup_domain_valid(domain, why, whylen);

					free(domain);
					if (!ok)
						return false;
					count++;
				}
				if (count > 0)
					return true;
				snprintf(why, whylen, "no mail domain given");
				return false;
			}
		case SETUP_Q_HOSTNAME:
			return setup_domain_valid(value, why, whylen);
		case SETUP_Q_CONNINFO:
			{
				char			 *error = NULL;
				PQconninfoOption *options = PQconninfoParse(value, &error);

				if (options)
				{
					PQconninfoFree(options);
					return true;
				}
				snprintf(why, whylen, "conninfo \"%.200s\": %s", value, error ? error : "malformed");
				PQfreemem(error);
				return false;
			}
		case SETUP_Q_DELIVERY:
			return strcmp(value, "maildir") == 0 || setup_destination_valid(value, "lmtp:", why, whylen);
		case SETUP_Q_RELAY:
			return strcmp(value, "direct") == 0 || setup_destination_valid(value, "smarthost:", why, whylen);
		case SETUP_Q_SMARTHOST_TLS:
			if (strcmp(value, "verify") == 0 || strcmp(value, "may") == 0 || strcmp(value, "none") == 0)
				return true;
			snprintf(why, whylen, "smarthost-tls \"%.64s\" is not verify, may or none", value);
			return false;
		case SETUP_Q_LISTEN:
			{
				unsigned char addr[16];

				if (inet_pton(AF_INET, value, addr) == 1 || inet_pton(AF_INET6, value, addr) == 1)
					return true;
				snprintf(why, whylen, "listen \"%.64s\" is not an IPv4 or IPv6 address", value);
				return false;
			}
		case SETUP_Q_SMTP_PORT:
			if (setup_port_valid(value))
				return true;
			snprintf(why, whylen, "smtp-port \"%.64s\" is not a port (1-65535)", value);
			return false;
		case SETUP_Q_USER:
			if (setup_name_valid(value))
				return true;
			snprintf(why, whylen, "user \"%.64s\" is not an account name", value);
			return false;
		case SETUP_Q_COUNT:
			break;
	}
	return false;
}

bool
setup_answer(struct setup_answers *answers, enum setup_question_id q, const char *value, char *why,
			 size_t whylen)
{
	if (!setup_check(q, value, why, whylen))
		return false;
	free(answers->value[q]);
	answers->value[q] = xstrdup(value);
	return true;
}

const char *
setup_answer_value(const struct setup_answers *answers, enum setup_question_id q)
{
	return answers->value[q] ? answers->value[q] : setup_questions[q].default_value;
}

bool
setup_answers_complete(const struct setup_answers *answers, char *why, size_t whylen)
{
	for (int i = 0; i < SETUP_Q_COUNT; i++)
		if (setup_answer_value(answers, i) == NULL)
		{
			snprintf(why, whylen, "no answer to \"%s\" (--%s)", setup_questions[i].prompt, setup_questions[i].name);
			return false;
		}
	return true;
}

void
setup_answers_free(struct setup_answers *answers)
{
	for (int i = 0; i < SETUP_Q_COUNT; i++)
		free(answers->value[i]);
	memset(answers, 0, sizeof(*answers));
}

char *
setup_dkim_key_path(const struct setup_layout *layout, const char *domain, const char *selector)
{
	return xasprintf("%s/etc/pepsi/dkim/%s.%s.pem", layout->root, selector, domain);
}

char *
setup_config_path(const struct setup_layout *layout)
{
	return xasprintf("%s/etc/pepsi/pepsi.conf", layout->root);
}

char *
setup_maildir_root(const struct setup_layout *layout)
{
	return xasprintf("%s/var/mail/pepsi", layout->root);
}

static char *
setup_buf_string(struct buf *b)
{
	char *s = xstrdup(b->len ? b->data : "");

	buf_free(b);
	return s;
}

/* The domains, one space between each. */
static char *
setup_domain_list(const struct setup_answers *answers)
{
	const char *cursor = setup_answer_value(answers, SETUP_Q_DOMAINS);
	const char *item;
	size_t		len;
	struct buf	b = BUF_INIT;

	while ((item = option_list_next(&cursor, &len)) != NULL)
		buf_printf(&b, "%s%.*s", b.len ? " " : "", (int) len, item);
	return setup_buf_string(&b);
}

/* The local delivery stage's options (Maildir or LMTP). */
static void
setup_local_stage(struct buf *b, const struct setup_answers *answers, const struct setup_layout *layout)
{
	const char *delivery = setup_answer_value(answers, SETUP_Q_DELIVERY);

	if (strcmp(delivery, "maildir") == 0)
	{
		char *root = setup_maildir_root(layout);

		buf_printf(b, "PROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = %s\n", root);
		free(root);
	}
	else
		buf_printf(b, "PROGRAM = pepsi-stage-relay-to-lmtp\nSERVER = %s\n", delivery + strlen("lmtp:"));
}

static void
setup_remote_stage(struct buf *b, const struct setup_answers *answers)
{
	const char *relay = setup_answer_value(answers, SETUP_Q_RELAY);

	if (strcmp(relay, "direct") == 0)
		buf_printf(b, "PROGRAM = pepsi-stage-relay-to-internet\n");
	else
		buf_printf(b, "PROGRAM = pepsi-stage-relay-to-smarthost\nSMARTHOST = %s\nTLS = %s\n",
				   relay + strlen("smarthost:"), setup_answer_value(answers, SETUP_Q_SMARTHOST_TLS));
}

char *
setup_config_text(const struct setup_answers *answers, const struct setup_layout *layout)
{
	struct buf	b = BUF_INIT;
	const char *conninfo = setup_answer_value(answers, SETUP_Q_CONNINFO);
	const char *user = setup_answer_value(answers, SETUP_Q_USER);
	char	   *domains = setup_domain_list(answers);
	char	   *first = strndup(domains, strcspn(domains, " "));
	const char *cursor = domains;
	const char *item;
	size_t		len;

	buf_printf(&b, "# Written by pepsi-setup init from its answers; running it again with the same\n"
				   "# answers changes nothing.  It is read after pepsi.conf, whose options it\n"
				   "# replaces; the secrets are in secrets.d/, never here.\n\n");
	buf_printf(&b, "[pepsi]\nHOSTNAME = %s\nLOCAL_DOMAINS = %s\n\n", setup_answer_value(answers, SETUP_Q_HOSTNAME),
			   domains);
	buf_printf(&b,
			   "[database]\nCONNINFO = %s user=pepsi_dispatch\nMONITOR_CONNINFO = %s user=pepsi_viewer\n"
			   "CONFIG_CONNINFO = %s user=pepsi_operator\nADMIN_CONNINFO = %s\n\n",
			   conninfo, conninfo, conninfo, conninfo);
	buf_printf(&b, "[dispatch]\n%s%s%s\n", layout->as_root ? "USER = " : "", layout->as_root ? user : "",
			   layout->as_root ? "\n" : "");
	buf_printf(&b, "[ingress]\n");
	if (layout->as_root)
		buf_printf(&b, "USER = %s\n", user);
	buf_printf(&b, "CONNINFO = %s user=pepsi_smtpd\nTRUSTED_NETWORKS = 127.0.0.0/8 ::1/128\n\n", conninfo);
	buf_printf(&b, "[listener-smtp]\nADDRESS = %s\nPORT = %s\n\n", setup_answer_value(answers, SETUP_Q_LISTEN),
			   setup_answer_value(answers, SETUP_Q_SMTP_PORT));
	buf_printf(&b, "[sendmail]\nCONNINFO = %s user=pepsi_smtpd\n\n", conninfo);
	buf_printf(&b, "[httpd]\n");
	if (layout->as_root)
		buf_printf(&b, "USER = %s\n", user);
	buf_printf(&b, "CONNINFO = %s user=pepsi_web\n\n", conninfo);
	buf_printf(&b, "[srs]\nDOMAIN = %s\n\n", first);
	while ((item = option_list_next(&cursor, &len)) != NULL)
	{
		char *domain = strndup(item, len);
		char *path = setup_dkim_key_path(layout, domain, "pepsi");

		buf_printf(&b, "[dkim-key-");
		for (const char *p = domain; *p; p++)
			buf_printf(&b, "%c", *p == '.' ? '-' : *p);
		buf_printf(&b, "]\nDOMAIN = %s\nSELECTOR = pepsi\nALGORITHM = rsa-sha256\nKEY_FILE = %s\n\n", domain, path);
		free(path);
		free(domain);
	}
	buf_printf(&b, "[stage-init]\nPROGRAM = pepsi-stage-route\nLOCAL_DOMAINS = %s\nLOCAL_STAGE = local\n"
				   "REMOTE_STAGE = sign\n\n",
			   domains);
	buf_printf(&b, "[stage-local]\n");
	setup_local_stage(&b, answers, layout);
	buf_printf(&b, "BOUNCE_STAGE = bounce\n\n");
	buf_printf(&b, "[stage-sign]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = remote\n\n");
	buf_printf(&b, "[stage-remote]\n");
	setup_remote_stage(&b, answers);
	buf_printf(&b, "BOUNCE_STAGE = bounce\n\n");
	buf_printf(&b, "[stage-bounce]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = dsn-route\n\n");
	buf_printf(&b, "[stage-dsn-route]\nPROGRAM = pepsi-stage-route\nLOCAL_DOMAINS = %s\nLOCAL_STAGE = dsn-local\n"
				   "REMOTE_STAGE = dsn-sign\n\n",
			   domains);
	buf_printf(&b, "[stage-dsn-local]\n");
	setup_local_stage(&b, answers, layout);
	buf_printf(&b, "\n[stage-dsn-sign]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = dsn-remote\n\n");
	buf_printf(&b, "[stage-dsn-remote]\n");
	setup_remote_stage(&b, answers);
	free(first);
	free(domains);
	return setup_buf_string(&b);
}

/* The database the conninfo names (libpq's default: the user's name), for pg_hba.conf; allocated. */
static char *
setup_conninfo_database(const char *conninfo)
{
	PQconninfoOption *options = PQconninfoParse(conninfo, NULL);
	char			 *database = NULL;
	char			 *user = NULL;

	for (PQconninfoOption *o = options; o && o->keyword; o++)
		if (o->val && o->val[0] && strcmp(o->keyword, "dbname") == 0)
			database = xstrdup(o->val);
		else if (o->val && o->val[0] && strcmp(o->keyword, "user") == 0)
			user = xstrdup(o->val);
	PQconninfoFree(options);
	if (database == NULL || !setup_name_valid(database))
	{
		free(database);
		database = user && setup_name_valid(user) ? xstrdup(user) : xstrdup("pepsi");
	}
	free(user);
	return database;
}

json_t *
setup_plan(const struct setup_answers *answers, const struct setup_layout *layout)
{
	json_t	   *plan = json_array();
	const char *user = setup_answer_value(answers, SETUP_Q_USER);
	const char *cursor = setup_answer_value(answers, SETUP_Q_DOMAINS);
	const char *item;
	size_t		len;
	char	   *text;
	char	   *database;

	for (int i = 0; setup_login_roles[i][0]; i++)
		json_array_append_new(plan, setup_task_new(SETUP_DATABASE_ROLE,
												   json_pack("{s:s, s:s}", "name", setup_login_roles[i][0],
															 "member_of", setup_login_roles[i][1])));
	json_array_append_new(plan, setup_task_new(SETUP_GRANT_POLICY, NULL));
	json_array_append_new(plan, setup_task_new(SETUP_SRS_SECRET, json_pack("{s:s}", "group", user)));
	while ((item = option_list_next(&cursor, &len)) != NULL)
	{
		char *domain = strndup(item, len);

		json_array_append_new(plan, setup_task_new(SETUP_DKIM_KEY, json_pack("{s:s, s:s, s:s, s:s}", "domain", domain,
																			 "selector", "pepsi", "algorithm",
																			 "rsa-sha256", "owner", user)));
		free(domain);
	}
	text = setup_config_text(answers, layout);
	json_array_append_new(plan, setup_task_new(SETUP_CONFIG_FILE,
											   json_pack("{s:s, s:s}", "name", "pepsi.conf.d/setup.conf", "content", text)));
	free(text);
	database = setup_conninfo_database(setup_answer_value(answers, SETUP_Q_CONNINFO));
	for (int i = 0; setup_login_roles[i][0]; i++)
		json_array_append_new(plan, setup_task_new(SETUP_PG_HBA_LINE,
												   json_pack("{s:s, s:s, s:s, s:s, s:s}", "type", "local",
															 "database", database, "user", setup_login_roles[i][0],
															 "method", "peer", "map", "pepsi")));
	free(database);
	return plan;
}
