/*
 * setup_task.c: see setup_task.h.  Each kind's parameters are a table:
 * name, form, whether required; a task is checked against it whole.
 */
#include "setup/setup_task.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "config/config.h"
#include "options.h"

enum setup_param_form
{
	PARAM_NAME,	  /* a role, group, selector or file name */
	PARAM_DOMAIN, /* a domain name */
	PARAM_PATH,	  /* an absolute path */
	PARAM_TEXT,	  /* one line, no control character */
	PARAM_CONFIG, /* a whole pepsi.conf, which must load */
	PARAM_ENUM	  /* one of choices */
};

struct setup_param
{
	const char			 *name;
	enum setup_param_form form;
	bool				  required;
	const char			 *choices; /* PARAM_ENUM: "a|b|c" */
};

#define SETUP_MAX_PARAMS 6

static const struct
{
	const char		  *name;
	struct setup_param params[SETUP_MAX_PARAMS];
} setup_kinds[SETUP_KIND_COUNT] = {
	[SETUP_CONFIG_FILE] = {"config_file",
						   {{"name", PARAM_ENUM, true, "pepsi.conf.d/setup.conf"}, {"content", PARAM_CONFIG, true, NULL}}},
	[SETUP_SECRET] = {"secret",
					  {{"name", PARAM_NAME, true, NULL},
					   {"group", PARAM_NAME, true, NULL},
					   {"section", PARAM_TEXT, true, NULL},
					   {"option", PARAM_TEXT, true, NULL},
					   {"value", PARAM_TEXT, true, NULL}}},
	[SETUP_DATABASE_ROLE] = {"database_role",
							 {{"name", PARAM_NAME, true, NULL},
							  {"member_of", PARAM_ENUM, true,
							   "pepsi_stage|pepsi_ingress|pepsi_config|pepsi_monitor|pepsi_httpd"}}},
	[SETUP_GRANT_POLICY] = {"grant_policy", {{NULL, 0, false, NULL}}},
	[SETUP_PG_HBA_LINE] = {"pg_hba_line",
						   {{"type", PARAM_ENUM, true, "local|host|hostssl"},
							{"database", PARAM_NAME, true, NULL},
							{"user", PARAM_NAME, true, NULL},
							{"method", PARAM_ENUM, true, "peer|scram-sha-256|cert"},
							{"address", PARAM_TEXT, false, NULL},
							{"map", PARAM_NAME, false, NULL}}},
	[SETUP_DKIM_KEY] = {"dkim_key",
						{{"domain", PARAM_DOMAIN, true, NULL},
						 {"selector", PARAM_NAME, true, NULL},
						 {"algorithm", PARAM_ENUM, true, "rsa-sha256|ed25519-sha256"},
						 {"owner", PARAM_NAME, false, NULL}}},
	[SETUP_SRS_SECRET] = {"srs_secret", {{"group", PARAM_NAME, true, NULL}}},
	[SETUP_CERTIFICATE] = {"certificate",
						   {{"host", PARAM_DOMAIN, true, NULL},
							{"certificate", PARAM_PATH, true, NULL},
							{"key", PARAM_PATH, true, NULL},
							{"group", PARAM_NAME, false, NULL}}},
	[SETUP_RELOAD] = {"reload", {{"service", PARAM_ENUM, true, "ingress|dispatch|httpd"}}},
	[SETUP_ADMIN_ACCOUNT] = {"admin_account",
							 {{"name", PARAM_NAME, true, NULL},
							  {"role", PARAM_ENUM, false, "admin|viewer"},
							  {"password_file", PARAM_PATH, false, NULL}}},
	[SETUP_DNS_CHECK] = {"dns_check", {{"domain", PARAM_DOMAIN, true, NULL}}},
};

const char *
setup_kind_name(enum setup_kind kind)
{
	return kind < SETUP_KIND_COUNT ? setup_kinds[kind].name : "?";
}

bool
setup_kind_parse(const char *name, enum setup_kind *kind)
{
	for (int i = 0; i < SETUP_KIND_COUNT; i++)
		if (strcmp(name, setup_kinds[i].name) == 0)
		{
			*kind = (enum setup_kind) i;
			return true;
		}
	return false;
}

const char *
setup_kind_list(void)
{
	static char list[512];

	if (list[0] == '\0')
		for (int i = 0; i < SETUP_KIND_COUNT; i++)
			snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "",
					 setup_kinds[i].name);
	return list;
}

bool
setup_name_valid(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > 63 || !(islower((unsigned char) name[0]) || name[0] == '_'))
		return false;
	for (const char *p = name; *p; p++)
		if (!islower((unsigned char) *p) && !isdigit((unsigned char) *p) && !strchr("_.-", *p))
			return false;
	return true;
}

bool
setup_domain_valid(const char *name, char *why, size_t whylen)
{
	if (strchr(name, '.') == NULL)
	{
		snprintf(why, whylen, "\"%s\" is not a domain (a domain has a dot: example.org)", name);
		return false;
	}
	{
		char problem[512];

		if (option_domain_check(name, strlen(name), problem, sizeof(problem)))
			return true;
		snprintf(why, whylen, "\"%.200s\" is not a domain: %s", name, problem);
		return false;
	}
}

static bool
setup_choice_valid(const char *choices, const char *value)
{
	size_t len = strlen(value);

	for (const char *p = choices; *p;)
	{
		size_t n = strcspn(p, "|");

		if (n == len && strncmp(p, value, n) == 0)
			return true;
		p += n + (p[n] == '|');
	}
	return false;
}

static bool
setup_param_check(const struct setup_param *param, const char *value, char *why, size_t whylen)
{
	char problem[768];

	switch (param->form)
	{
		case PARAM_NAME:
			if (setup_name_valid(value))
				return true;
			snprintf(why, whylen, "%s \"%.64s\" is not a name (lower case letters, digits, '_', '.', '-')",
					 param->name, value);
			return false;
		case PARAM_DOMAIN:
			if (setup_domain_valid(value, problem, sizeof(problem)))
				return true;
			snprintf(why, whylen, "%s: %s", param->name, problem);
			return false;
		case PARAM_PATH:
			if (value[0] == '/' && strstr(value, "/../") == NULL && strlen(value) < 4096)
				return true;
			snprintf(why, whylen, "%s \"%.64s\" is not an absolute path", param->name, value);
			return false;
		case PARAM_TEXT:
			for (const char *p = value; *p; p++)
				if ((unsigned char) *p < 0x20 || *p == 0x7f)
				{
					snprintf(why, whylen, "%s has a control character", param->name);
					return false;
				}
			if (*value)
				return true;
			snprintf(why, whylen, "%s is empty", param->name);
			return false;
		case PARAM_CONFIG:
			{
				struct pepsi_config *cfg = config_parse_string(value, "pepsi.conf", problem, sizeof(problem));

				if (cfg)
				{
					config_free(cfg);
					return true;
				}
				snprintf(why, whylen, "%s does not load: %s", param->name, problem);
				return false;
			}
		case PARAM_ENUM:
			if (setup_choice_valid(param->choices, value))
				return true;
			snprintf(why, whylen, "%s \"%.64s\" is not one of %s", param->name, value, param->choices);
			return false;
	}
	return false;
}

/* The secret kind's option must be one options.def calls SECRET, in that section. */
static bool
setup_secret_check(const json_t *params, char *why, size_t whylen)
{
	const char *section = json_string_value(json_object_get(params, "section"));
	const char *option = json_string_value(json_object_get(params, "option"));

	for (size_t i = 0; i < option_count; i++)
	{
		const struct option_def *def = &option_table[i];
		bool					 here = strcmp(def->where, section) == 0
					|| (strncmp(section, "stage-", 6) == 0 && strncmp(def->where, "pepsi-stage-", 12) == 0);

		if (here && strcmp(def->name, option) == 0 && option_is_secret(def))
			return true;
	}
	snprintf(why, whylen, "[%.64s] %.64s is not a secret option (schema/options.def SECRET)", section, option);
	return false;
}

bool
setup_task_check(enum setup_kind kind, json_t *params, char *why, size_t whylen)
{
	const struct setup_param *table;
	const char				 *key;
	json_t					 *value;

	if (kind >= SETUP_KIND_COUNT)
	{
		snprintf(why, whylen, "unknown kind (known: %s)", setup_kind_list());
		return false;
	}
	if (!json_is_object(params))
	{
		snprintf(why, whylen, "params is not a JSON object");
		return false;
	}
	table = setup_kinds[kind].params;
	json_object_foreach (params, key, value)
	{
		const struct setup_param *param = NULL;

		for (int i = 0; i < SETUP_MAX_PARAMS && table[i].name && param == NULL; i++)
			if (strcmp(table[i].name, key) == 0)
				param = &table[i];
		if (param == NULL)
		{
			snprintf(why, whylen, "%s takes no parameter \"%.64s\"", setup_kinds[kind].name, key);
			return false;
		}
		if (!json_is_string(value))
		{
			snprintf(why, whylen, "%s: %s is not a string", setup_kinds[kind].name, key);
			return false;
		}
		if (!setup_param_check(param, json_string_value(value), why, whylen))
			return false;
	}
	for (int i = 0; i < SETUP_MAX_PARAMS && table[i].name; i++)
		if (table[i].required && json_object_get(params, table[i].name) == NULL)
		{
			snprintf(why, whylen, "%s needs the parameter %s", setup_kinds[kind].name, table[i].name);
			return false;
		}
	if (kind == SETUP_SECRET)
		return setup_secret_check(params, why, whylen);
	if (kind == SETUP_PG_HBA_LINE && strcmp(json_string_value(json_object_get(params, "type")), "local") != 0
		&& json_object_get(params, "address") == NULL)
	{
		snprintf(why, whylen, "pg_hba_line of type host needs the parameter address");
		return false;
	}
	return true;
}

json_t *
setup_task_new(enum setup_kind kind, json_t *params)
{
	return json_pack("{s:s, s:o}", "kind", setup_kind_name(kind), "params", params ? params : json_object());
}
