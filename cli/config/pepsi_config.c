/*
 * pepsi-config: the configuration overlay from the command line.
 *
 *   pepsi-config [-C config] [--json] get SECTION OPTION [--scope SCOPE | --address A | --domain D]
 *   pepsi-config [-C config] set SECTION OPTION VALUE [--scope SCOPE]
 *   pepsi-config [-C config] unset SECTION OPTION [--scope SCOPE]
 *   pepsi-config [-C config] [--json] list [--scope SCOPE]
 *
 * SCOPE is global (the default), domain:<domain> or address:<address>.
 * set and unset go through pepsi.config_set / pepsi.config_unset, which
 * validate and log the change; the dispatcher is notified at once and
 * replaces its workers so they read the new value.  [database] and
 * [listener-*] are never overridden: they are only read from the file.
 * get prints the value a component would use and where it comes from.
 *
 *   pepsi-config [-C config] check [FILE]
 *
 * check reads FILE (by default the configuration file) as every program
 * reads it, and connects nowhere and starts nothing, like postfix check: a
 * mistake is named with its file, line, option and the rule it breaks
 * (config_load), and the exit status is EX_CONFIG.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_config_main(int argc, char **argv);

static void
config_usage(FILE *out)
{
	fprintf(out,
			"usage: pepsi-config [-C CONFIG] [--json] COMMAND ...\n"
			"  get SECTION OPTION [--scope SCOPE]   the value in force and where it comes from\n"
			"  set SECTION OPTION VALUE [--scope SCOPE]\n"
			"  unset SECTION OPTION [--scope SCOPE]\n"
			"  list [--scope SCOPE]                 the file's values and the overrides\n"
			"  check [FILE]                         check a configuration file; connects nowhere\n"
			"  SCOPE: global (default), domain:<domain>, address:<address>;\n"
			"  --domain D and --address A are short for --scope domain:D and address:A\n");
}

/* "[stage-relay]" or "stage-relay" -> "stage-relay". */
static char *
config_section_arg(const char *arg)
{
	size_t len = strlen(arg);

	if (len >= 2 && arg[0] == '[' && arg[len - 1] == ']')
		return xstrndup(arg + 1, len - 2);
	return xstrdup(arg);
}

static bool
config_check_scope(const char *scope)
{
	if (strcmp(scope, "global") == 0
		|| (strncmp(scope, "domain:", 7) == 0 && scope[7] != '\0')
		|| (strncmp(scope, "address:", 8) == 0 && scope[8] != '\0' && strchr(scope + 8, '@')))
		return true;
	fprintf(stderr, "pepsi-config: \"%s\" is not a scope (global, domain:<domain>, "
					"address:<local@domain>)\n",
			scope);
	return false;
}

/* Refuse locally what the overlay can never hold, with the reason. */
static bool
config_check_target(const char *section, const char *option)
{
	if (!config_section_known(section))
	{
		fprintf(stderr, "pepsi-config: there is no section [%s]\n", section);
		return false;
	}
	if (!config_section_overridable(section))
	{
		fprintf(stderr, "pepsi-config: [%s] is read only from the file: a database override "
						"could move a listening socket or the database connection itself\n",
				section);
		return false;
	}
	if (!config_option_known(section, option))
	{
		fprintf(stderr, "pepsi-config: [%s] has no option %s\n", section, option);
		return false;
	}
	return true;
}

/* get: the section and option must exist; file-only sections may be read. */
static bool
config_check_name(const char *section, const char *option)
{
	if (!config_section_known(section))
	{
		fprintf(stderr, "pepsi-config: there is no section [%s]\n", section);
		return false;
	}
	if (!config_option_known(section, option))
	{
		fprintf(stderr, "pepsi-config: [%s] has no option %s\n", section, option);
		return false;
	}
	return true;
}

static int
config_get_command(PGconn *conn, struct pepsi_config *cfg, const char *section, const char *option,
				   const char *scope, bool as_json)
{
	char		err[1024];
	const char *value;
	const char *domain = NULL;
	const char *address = NULL;
	char		origin[512] = "";

	if (!db_load_overrides(conn, cfg, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-config: %s\n", err);
		return CLI_EX_TEMPFAIL;
	}
	if (scope && strncmp(scope, "domain:", 7) == 0)
		domain = scope + 7;
	else if (scope && strncmp(scope, "address:", 8) == 0)
		address = scope + 8;
	value = config_get_for(cfg, section, option, domain, address);
	/*
	 * Where it comes from: the entry the lookup chose (its value is that
	 * entry's own string), so the origin is the one the components use
	 * even when several scopes hold the same value.
	 */
	for (size_t i = 0; value && i < cfg->count; i++)
	{
		const struct config_entry *e = &cfg->entries[i];

		if (e->value != value)
			continue;
		if (e->scope)
			snprintf(origin, sizeof(origin), "override %s", e->scope);
		else
			snprintf(origin, sizeof(origin), "%s:%d", cfg->path, e->line);
		break;
	}
	if (as_json)
	{
		json_t *out = json_object();

		json_object_set_new(out, "section", json_string(section));
		json_object_set_new(out, "option", json_string(option));
		json_object_set_new(out, "scope", json_string(scope ? scope : "global"));
		json_object_set_new(out, "value", value ? json_string(value) : json_null());
		json_object_set_new(out, "origin", value ? json_string(origin) : json_string("default"));
		json_dumpf(out, stdout, JSON_INDENT(2));
		putchar('\n');
		json_decref(out);
	}
	else if (value == NULL)
		printf("[%s] %s is not set (the program's default applies)\n", section, option);
	else
		printf("%s\t(%s)\n", value, origin);
	return CLI_EX_OK;
}

static int
config_change(PGconn *conn, const char *verb, const char *scope, const char *section,
			  const char *option, const char *value)
{
	const char *values[4] = {scope, section, option, value};
	PGresult   *res = strcmp(verb, "set") == 0
						  ? db_exec(conn, "SELECT pepsi.config_set($1, $2, $3, $4), pepsi.config_scope($1)", 4, values)
						  : db_exec(conn, "SELECT pepsi.config_unset($1, $2, $3), pepsi.config_scope($1)", 3, values);
	int			rc = CLI_EX_OK;
	const char *previous;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		cli_db_error("pepsi-config", res, conn);
		rc = cli_db_exit_code(res, conn);
		PQclear(res);
		return rc;
	}
	/* the scope as it is stored: domain lower-cased */
	scope = PQgetvalue(res, 0, 1);
	previous = PQgetisnull(res, 0, 0) ? NULL : PQgetvalue(res, 0, 0);
	if (strcmp(verb, "set") == 0 && previous && strcmp(previous, value) == 0)
		printf("[%s] %s = %s for %s already; nothing changed\n", section, option, value, scope);
	else if (strcmp(verb, "set") == 0)
		printf("[%s] %s = %s for %s (%s%s); pepsi-dispatch reloads now and replaces its workers\n",
			   section, option, value, scope, previous ? "was " : "no override before",
			   previous ? previous : "");
	else
		printf("[%s] %s unset for %s (was %s); pepsi-dispatch reloads now and replaces its workers\n",
			   section, option, scope, previous ? previous : "");
	PQclear(res);
	return rc;
}

/* A file value as list shows it: a password in any CONNINFO is masked. */
static char *
config_shown_value(const struct config_entry *e)
{
	PQconninfoOption *options;
	struct buf		  shown = BUF_INIT;
	bool			  masked = false;
	size_t			  option_len = strlen(e->option);

	if (option_len < 8 || strcmp(e->option + option_len - 8, "CONNINFO") != 0
		|| (options = PQconninfoParse(e->value, NULL)) == NULL)
		return xstrdup(e->value);
	for (PQconninfoOption *o = options; o->keyword; o++)
	{
		if (o->val == NULL)
			continue;
		if (strcmp(o->keyword, "password") == 0)
		{
			masked = true;
			buf_printf(&shown, "%s%s=********", shown.len ? " " : "", o->keyword);
			continue;
		}
		buf_printf(&shown, "%s%s='", shown.len ? " " : "", o->keyword);
		for (const char *p = o->val; *p; p++)
		{
			if (*p == '\'' || *p == '\\')
				buf_append_char(&shown, '\\');
			buf_append_char(&shown, *p);
		}
		buf_append_char(&shown, '\'');
	}
	PQconninfoFree(options);
	if (!masked)
	{
		buf_free(&shown);
		return xstrdup(e->value);
	}
	return shown.data;
}

static int
config_list(PGconn *conn, struct pepsi_config *cfg, const char *scope, bool as_json)
{
	struct buf	sql = BUF_INIT;
	const char *values[1] = {scope};
	PGresult   *res;
	int			rc = CLI_EX_OK;

	/*
	 * The file's values and the overrides side by side, as one result.  A
	 * scope is taken in its canonical form (pepsi.config_scope), as the
	 * overrides are stored; with a scope only its overrides are listed.
	 */
	buf_append_str(&sql, "SELECT scope, section, option, value, origin FROM (VALUES ");
	for (size_t i = 0; i < cfg->count; i++)
	{
		const struct config_entry *e = &cfg->entries[i];
		char					  *shown = config_shown_value(e);
		char					  *where = xasprintf("%s:%d", cfg->path, e->line);
		char					  *section = PQescapeLiteral(conn, e->section, strlen(e->section));
		char					  *option = PQescapeLiteral(conn, e->option, strlen(e->option));
		char					  *value = PQescapeLiteral(conn, shown, strlen(shown));
		char					  *origin = PQescapeLiteral(conn, where, strlen(where));

		buf_printf(&sql, "%s('file', %s, %s, %s, %s)", i ? ", " : "", section, option, value, origin);
		PQfreemem(section);
		PQfreemem(option);
		PQfreemem(value);
		PQfreemem(origin);
		free(shown);
		free(where);
	}
	if (cfg->count == 0)
		buf_append_str(&sql, "(NULL, NULL, NULL, NULL, NULL)");
	buf_append_str(&sql, ") AS f(scope, section, option, value, origin) WHERE scope IS NOT NULL"
						 " AND $1::text IS NULL"
						 " UNION ALL SELECT scope, section, option, value, 'override by ' || updated_by"
						 " FROM pepsi.config_override"
						 " WHERE $1::text IS NULL OR scope = pepsi.config_scope($1)"
						 " ORDER BY 2, 3, 1");
	res = db_exec(conn, sql.data, 1, values);
	rc = cli_show_result("pepsi-config", res, conn, as_json);
	buf_free(&sql);
	return rc;
}

/* pepsi-config check [FILE]: the file as config_load reads it; nothing more. */
static int
config_check_command(const char *path)
{
	struct pepsi_config *cfg;
	char				 err[1024];

	if (path == NULL)
	{
		fprintf(stderr, "pepsi-config: check takes one file at most\n");
		config_usage(stderr);
		return CLI_EX_USAGE;
	}
	if ((cfg = config_load(path, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "pepsi-config: %s\n", err);
		return CLI_EX_CONFIG;
	}
	config_free(cfg);
	printf("%s: OK\n", path);
	return CLI_EX_OK;
}

int
pepsi_config_main(int argc, char **argv)
{
	static const struct option long_options[] = {
		{"config", required_argument, NULL, 'C'},
		{"scope", required_argument, NULL, 's'},
		{"address", required_argument, NULL, 'a'},
		{"domain", required_argument, NULL, 'd'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	const char			*config_path = NULL;
	const char			*scope = NULL;
	char				*scope_copy = NULL;
	const char			*address = NULL;
	const char			*domain = NULL;
	bool				 as_json = false;
	struct pepsi_config *cfg = NULL;
	const char			*command;
	char				*section = NULL;
	PGconn				*conn;
	int					 opt;
	int					 rc = CLI_EX_OK;
	int					 nargs;

	log_init("pepsi-config", false);
	while ((opt = getopt_long(argc, argv, "C:s:a:d:jh", long_options, NULL)) != -1)
		switch (opt)
		{
			case 'C':
				config_path = optarg;
				break;
			case 's':
				scope = optarg;
				break;
			case 'a':
				address = optarg;
				break;
			case 'd':
				domain = optarg;
				break;
			case 'j':
				as_json = true;
				break;
			case 'h':
				config_usage(stdout);
				return CLI_EX_OK;
			default:
				config_usage(stderr);
				return CLI_EX_USAGE;
		}
	if (optind >= argc)
	{
		config_usage(stderr);
		return CLI_EX_USAGE;
	}
	command = argv[optind++];
	nargs = argc - optind;
	if (strcmp(command, "check") == 0)
		return config_check_command(nargs > 1 ? NULL : nargs == 1 ? argv[optind]
																  : cli_config_path(config_path));
	/* --domain D and --address A are --scope domain:D and --scope address:A */
	if ((scope != NULL) + (domain != NULL) + (address != NULL) > 1)
	{
		fprintf(stderr, "pepsi-config: give one of --scope, --domain and --address\n");
		return CLI_EX_USAGE;
	}
	if (domain || address)
		scope = scope_copy = xasprintf("%s:%s", domain ? "domain" : "address", domain ? domain : address);
	if (scope && !config_check_scope(scope))
	{
		free(scope_copy);
		return CLI_EX_USAGE;
	}
	if ((strcmp(command, "get") == 0 && nargs != 2) || (strcmp(command, "set") == 0 && nargs != 3)
		|| (strcmp(command, "unset") == 0 && nargs != 2) || (strcmp(command, "list") == 0 && nargs != 0))
	{
		fprintf(stderr, "pepsi-config: wrong number of arguments for %s\n", command);
		config_usage(stderr);
		free(scope_copy);
		return CLI_EX_USAGE;
	}
	if (strcmp(command, "get") != 0 && strcmp(command, "set") != 0 && strcmp(command, "unset") != 0
		&& strcmp(command, "list") != 0)
	{
		fprintf(stderr, "pepsi-config: unknown command \"%s\"\n", command);
		config_usage(stderr);
		free(scope_copy);
		return CLI_EX_USAGE;
	}
	if (nargs >= 2)
	{
		section = config_section_arg(argv[optind]);
		if (strcmp(command, "get") == 0 ? !config_check_name(section, argv[optind + 1])
										: !config_check_target(section, argv[optind + 1]))
		{
			free(section);
			free(scope_copy);
			return CLI_EX_DATAERR;
		}
	}
	if ((conn = cli_connect("pepsi-config", config_path, CLI_ROLE_CONFIG, &cfg, &rc)) == NULL)
	{
		free(section);
		free(scope_copy);
		return rc;
	}
	if (strcmp(command, "get") == 0)
		rc = config_get_command(conn, cfg, section, argv[optind + 1], scope, as_json);
	else if (strcmp(command, "set") == 0)
		rc = config_change(conn, "set", scope ? scope : "global", section, argv[optind + 1],
						   argv[optind + 2]);
	else if (strcmp(command, "unset") == 0)
		rc = config_change(conn, "unset", scope ? scope : "global", section, argv[optind + 1], NULL);
	else
		rc = config_list(conn, cfg, scope, as_json);
	free(section);
	free(scope_copy);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
