/*
 * pepsi-settings: an operator's view and edit of the owners' settings
 * (pepsi.settings, common/config/settings.h).
 *
 *   pepsi-settings [-C config] [--json] get ADDRESS
 *   pepsi-settings [-C config] [--json] list [ADDRESS|@DOMAIN]
 *   pepsi-settings [-C config] set ADDRESS|@DOMAIN OPTION VALUE
 *   pepsi-settings [-C config] unset ADDRESS|@DOMAIN OPTION
 *   pepsi-settings options
 *
 * get shows the settings in force for an address (its own, and its
 * domain's it does not override, each with its source); list the rows as
 * stored (all of them, an address's or a domain's and its addresses');
 * set and unset change one, through pepsi.settings_set/unset, which check
 * that the option is one an owner may set (schema/options.def OWNER) and
 * the value, and write a pepsi.event_log row each.  options lists the
 * options an owner may set.  The owners set their own by mail
 * (pepsi-stage-settings).  Connects as [database] CONFIG_CONNINFO.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <libpq-fe.h>

#include "config/config.h"
#include "options.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_settings_main(int argc, char **argv);

#define SETTINGS_PROGRAM "pepsi-settings"

static void
settings_usage(FILE *out)
{
	fprintf(out, "usage: " SETTINGS_PROGRAM " [-C CONFIG] [--json] get ADDRESS\n"
				 "       " SETTINGS_PROGRAM " [-C CONFIG] [--json] list [ADDRESS|@DOMAIN]\n"
				 "       " SETTINGS_PROGRAM " [-C CONFIG] set ADDRESS|@DOMAIN OPTION VALUE\n"
				 "       " SETTINGS_PROGRAM " [-C CONFIG] unset ADDRESS|@DOMAIN OPTION\n"
				 "       " SETTINGS_PROGRAM " options\n");
}

/* The options an owner may set, with their kind and description. */
static int
settings_options(void)
{
	const char				*name;
	const struct option_def *def;

	for (size_t i = 0; (name = option_owner_name(i)) != NULL; i++)
		if ((def = option_owner_find(name, NULL)) != NULL)
			printf("%s\t%s\t%s\t%s\n", def->name, def->where, option_type_name(def->type), def->description);
	return CLI_EX_OK;
}

/* Does the command take nargs words after it?  Else print why. */
static bool
settings_nargs(const char *command, int have, int min, int max)
{
	if (have >= min && have <= max)
		return true;
	fprintf(stderr, SETTINGS_PROGRAM ": %s takes %s\n", command,
			strcmp(command, "get") == 0	   ? "an address"
			: strcmp(command, "list") == 0 ? "at most an address or @domain"
			: strcmp(command, "set") == 0  ? "an address or @domain, an option and a value"
										   : "an address or @domain and an option");
	settings_usage(stderr);
	return false;
}

int
pepsi_settings_main(int argc, char **argv)
{
	const char			*config_path = NULL;
	bool				 as_json = false;
	struct pepsi_config *cfg = NULL;
	const char			*command;
	PGconn				*conn;
	PGresult			*res;
	int					 nargs;
	int					 rc = CLI_EX_OK;

	if (!cli_command_options(argc, argv, settings_usage, true, &config_path, &as_json, NULL, &rc))
		return rc;
	command = argv[optind];
	nargs = argc - optind - 1;
	argv += optind + 1;
	if (strcmp(command, "options") == 0)
		return settings_nargs(command, nargs, 0, 0) ? settings_options() : CLI_EX_USAGE;
	if (strcmp(command, "get") == 0		? !settings_nargs(command, nargs, 1, 1)
		: strcmp(command, "list") == 0	? !settings_nargs(command, nargs, 0, 1)
		: strcmp(command, "set") == 0	? !settings_nargs(command, nargs, 3, 3)
		: strcmp(command, "unset") == 0 ? !settings_nargs(command, nargs, 2, 2)
										: true)
	{
		if (strcmp(command, "get") && strcmp(command, "list") && strcmp(command, "set") && strcmp(command, "unset"))
		{
			fprintf(stderr, SETTINGS_PROGRAM ": unknown command \"%s\"\n", command);
			settings_usage(stderr);
		}
		return CLI_EX_USAGE;
	}
	if ((conn = cli_connect(SETTINGS_PROGRAM, config_path, CLI_ROLE_CONFIG, &cfg, &rc)) == NULL)
		return rc;
	if (strcmp(command, "get") == 0)
		res = db_exec(conn, "SELECT option, value, source FROM pepsi.settings_resolved($1) ORDER BY option", 1,
					  (const char *const *) argv);
	else if (strcmp(command, "list") == 0 && nargs == 0)
		res = db_exec(conn,
					  "SELECT address, option, value, updated_at FROM pepsi.settings"
					  " ORDER BY address LIKE '@%' DESC, address, option",
					  0, NULL);
	else if (strcmp(command, "list") == 0)
		res = db_exec(conn,
					  "SELECT s.address, s.option, s.value, s.updated_at FROM pepsi.settings s"
					  " WHERE s.address = pepsi.settings_key($1)"
					  " OR (pepsi.settings_key($1) LIKE '@%' AND s.address LIKE '%' || pepsi.settings_key($1))"
					  " ORDER BY s.address LIKE '@%' DESC, s.address, s.option",
					  1, (const char *const *) argv);
	else if (strcmp(command, "set") == 0)
		res = db_exec(conn, "SELECT pepsi.settings_set($1, $2, $3)", 3, (const char *const *) argv);
	else
		res = db_exec(conn, "SELECT pepsi.settings_unset($1, $2)", 2, (const char *const *) argv);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		rc = cli_db_exit_code(res, conn);
		cli_db_error(SETTINGS_PROGRAM, res, conn);
	}
	else if (strcmp(command, "set") == 0)
		printf("%s %s set\n", argv[0], argv[1]);
	else if (strcmp(command, "unset") == 0)
	{
		if (strcmp(PQgetvalue(res, 0, 0), "t") == 0)
			printf("%s %s unset\n", argv[0], argv[1]);
		else
		{
			fprintf(stderr, SETTINGS_PROGRAM ": %s has no setting %s\n", argv[0], argv[1]);
			rc = CLI_EX_DATAERR;
		}
	}
	else
		cli_print(res, as_json);
	PQclear(res);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
