/*
 * pepsi-secure-link: the secure-link portal's links from the command line
 * (docs/pepsi-secure-link.8.md).
 *
 *   pepsi-secure-link [-C CONFIG] [--json] list [--open]
 *   pepsi-secure-link [-C CONFIG] expire [ID...]
 *   pepsi-secure-link [-C CONFIG] revoke [--reason TEXT] ID...
 *
 * A link is one message pepsi-stage-encrypt sealed for a recipient without
 * a key (NO_KEY = portal); pepsi-httpd serves it (its /secure/ pages).
 * list shows them (the recipient, the sender, open, used, expired or
 * revoked, how often opened of how often it may be (PORTAL_OPENS when it
 * was made) and replied to: never the message, which this tool
 * cannot read either).  expire ends links now, or with no id wipes the
 * ciphertext of every link past its time (a timer's job); revoke ends
 * links with a reason their page then shows.  Each change is one call of
 * pepsi.secure_link_end, audited in pepsi.event_log.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/buf.h"
#include "base/log.h"
#include "config/config.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_secure_link_main(int argc, char **argv);

#define SL_PROGRAM "pepsi-secure-link"

static void
sl_usage(FILE *out)
{
	fprintf(out, "usage: " SL_PROGRAM " [-C CONFIG] [--json] list [--open]\n"
				 "       " SL_PROGRAM " [-C CONFIG] expire [ID...]\n"
				 "       " SL_PROGRAM " [-C CONFIG] revoke [--reason TEXT] ID...\n"
				 "  list the secure-portal links; end links now (expire, revoke), or with no ID\n"
				 "  wipe the messages of every link past its time (expire)\n");
}

/* The ids args[0..n) as a SQL array literal into out; false (said why) when one is no id. */
static bool
sl_ids(char **args, int n, struct buf *out)
{
	buf_append_str(out, "{");
	for (int i = 0; i < n; i++)
	{
		long long id;

		if (!cli_parse_id(args[i], &id))
		{
			fprintf(stderr, SL_PROGRAM ": \"%s\" is not a link's id (pepsi-secure-link list shows them)\n", args[i]);
			return false;
		}
		buf_printf(out, "%s%lld", i ? "," : "", id);
	}
	buf_append_str(out, "}");
	return true;
}

int
pepsi_secure_link_main(int argc, char **argv)
{
	static const struct option long_options[] = {{"config", required_argument, NULL, 'C'},
												 {"json", no_argument, NULL, 'j'},
												 {"open", no_argument, NULL, 'o'},
												 {"reason", required_argument, NULL, 'r'},
												 {"help", no_argument, NULL, 'h'},
												 {NULL, 0, NULL, 0}};
	const char				  *config_path = NULL, *reason = NULL, *command;
	bool					   json = false, open_only = false;
	struct pepsi_config		  *cfg = NULL;
	struct buf				   ids = BUF_INIT;
	PGconn					  *conn;
	PGresult				  *res;
	int						   opt, rc = CLI_EX_OK;

	log_init(SL_PROGRAM, false);
	if (cli_version_option(SL_PROGRAM, argc, argv))
		return CLI_EX_OK;
	/* (+: options after the command are the command's) */
	while ((opt = getopt_long(argc, argv, "+C:h", long_options, NULL)) != -1)
		switch (opt)
		{
			case 'C':
				config_path = optarg;
				break;
			case 'j':
				json = true;
				break;
			case 'h':
				sl_usage(stdout);
				return CLI_EX_OK;
			default:
				sl_usage(stderr);
				return CLI_EX_USAGE;
		}
	if (optind >= argc)
	{
		sl_usage(stderr);
		return CLI_EX_USAGE;
	}
	command = argv[optind];
	optind++;
	while ((opt = getopt_long(argc, argv, "+", long_options, NULL)) != -1)
		if (opt == 'o' && strcmp(command, "list") == 0)
			open_only = true;
		else if (opt == 'r' && strcmp(command, "revoke") == 0)
			reason = optarg;
		else if (opt == 'j')
			json = true;
		else
		{
			fprintf(stderr, SL_PROGRAM ": %s takes no such option\n", command);
			sl_usage(stderr);
			return CLI_EX_USAGE;
		}
	if (strcmp(command, "list") != 0 && strcmp(command, "expire") != 0 && strcmp(command, "revoke") != 0)
	{
		fprintf(stderr, SL_PROGRAM ": the command is list, expire or revoke, not \"%s\"\n", command);
		sl_usage(stderr);
		return CLI_EX_USAGE;
	}
	if ((strcmp(command, "list") == 0 && optind < argc) || (strcmp(command, "revoke") == 0 && optind >= argc))
	{
		fprintf(stderr, SL_PROGRAM ": %s\n",
				strcmp(command, "list") == 0 ? "list takes no argument" : "revoke needs the ids of the links to revoke");
		return CLI_EX_USAGE;
	}
	if (optind < argc && !sl_ids(argv + optind, argc - optind, &ids))
	{
		buf_free(&ids);
		return CLI_EX_USAGE;
	}
	if ((conn = cli_connect(SL_PROGRAM, config_path, CLI_ROLE_CONFIG, &cfg, &rc)) == NULL)
	{
		buf_free(&ids);
		return rc;
	}
	if (strcmp(command, "list") == 0)
	{
		const char *values[1] = {open_only ? "true" : "false"};

		/* opened is "1/1" on a terminal (of open_limit; alone without one), two numbers in JSON. */
		res = db_exec(conn,
					  json ? "SELECT id, recipient, sender, queue_id,"
							 " to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS created,"
							 " to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS expires, state, opened,"
							 " open_limit, replies, coalesce(reason, '') AS reason"
							 " FROM pepsi.secure_link_list($1::boolean)"
						   : "SELECT id, recipient, sender, queue_id,"
							 " to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS created,"
							 " to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS expires, state,"
							 " opened || coalesce('/' || open_limit, '') AS opened, replies,"
							 " coalesce(reason, '') AS reason FROM pepsi.secure_link_list($1::boolean)",
					  1, values);
		rc = cli_show_result(SL_PROGRAM, res, conn, json);
	}
	else
	{
		const char *values[3] = {ids.data, strcmp(command, "revoke") == 0 ? "true" : "false", reason};

		res = db_exec(conn, "SELECT pepsi.secure_link_end($1::bigint[], $2::boolean, $3)", 3, values);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			rc = cli_db_exit_code(res, conn);
			cli_db_error(SL_PROGRAM, res, conn);
		}
		else
			printf("%s %s\n", PQgetvalue(res, 0, 0), strcmp(command, "revoke") == 0 ? "revoked" : "expired");
		PQclear(res);
	}
	buf_free(&ids);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
