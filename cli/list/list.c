/*
 * pepsi-list: the mailing lists from the command line (docs/pepsi-list.8.md).
 *
 *   pepsi-list [-C CONFIG] [--json] lists
 *   pepsi-list [-C CONFIG] create LIST OWNER [DESCRIPTION]
 *   pepsi-list [-C CONFIG] [--json] show LIST
 *   pepsi-list [-C CONFIG] set LIST SETTING VALUE | reset LIST SETTING
 *   pepsi-list [-C CONFIG] role LIST ADDRESS owner|moderator on|off
 *   pepsi-list [-C CONFIG] [--json] members LIST
 *   pepsi-list [-C CONFIG] add LIST ADDRESS [each|digest|nomail] | remove LIST ADDRESS
 *   pepsi-list [-C CONFIG] enable LIST ADDRESS
 *   pepsi-list [-C CONFIG] import LIST FILE|-
 *   pepsi-list [-C CONFIG] export LIST [csv|mailman|mlmmj]
 *   pepsi-list [-C CONFIG] [--json] held LIST | approve ID | reject ID
 *   pepsi-list [-C CONFIG] digest LIST [STAGE]
 *
 * Every change goes through the extension's audited list_* functions (one
 * pepsi.event_log row each); import is all or nothing.  Connects as
 * [database] CONFIG_CONNINFO (pepsi_config).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/xalloc.h"
#include "config/config.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_list_main(int argc, char **argv);

#define LIST_PROGRAM "pepsi-list"

static void
list_usage(FILE *out)
{
	fprintf(out, "usage: " LIST_PROGRAM " [-C CONFIG] [--json] lists\n"
				 "       " LIST_PROGRAM " [-C CONFIG] create LIST OWNER [DESCRIPTION]\n"
				 "       " LIST_PROGRAM " [-C CONFIG] [--json] show LIST\n"
				 "       " LIST_PROGRAM " [-C CONFIG] set LIST SETTING VALUE\n"
				 "       " LIST_PROGRAM " [-C CONFIG] reset LIST SETTING\n"
				 "       " LIST_PROGRAM " [-C CONFIG] role LIST ADDRESS owner|moderator on|off\n"
				 "       " LIST_PROGRAM " [-C CONFIG] [--json] members LIST\n"
				 "       " LIST_PROGRAM " [-C CONFIG] add LIST ADDRESS [each|digest|nomail]\n"
				 "       " LIST_PROGRAM " [-C CONFIG] remove LIST ADDRESS\n"
				 "       " LIST_PROGRAM " [-C CONFIG] enable LIST ADDRESS\n"
				 "       " LIST_PROGRAM " [-C CONFIG] import LIST FILE|-\n"
				 "       " LIST_PROGRAM " [-C CONFIG] export LIST [csv|mailman|mlmmj]\n"
				 "       " LIST_PROGRAM " [-C CONFIG] [--json] held LIST\n"
				 "       " LIST_PROGRAM " [-C CONFIG] approve|reject ID\n"
				 "       " LIST_PROGRAM " [-C CONFIG] digest LIST [STAGE]\n");
}

struct list_command
{
	const char *name;
	int			min, max; /* words after the command */
};

static const struct list_command list_commands[] = {
	{"lists", 0, 0}, {"create", 2, 3}, {"show", 1, 1}, {"set", 3, 3}, {"reset", 2, 2}, {"role", 4, 4}, {"members", 1, 1}, {"add", 2, 3}, {"remove", 2, 2}, {"enable", 2, 2}, {"import", 2, 2}, {"export", 1, 2}, {"held", 1, 1}, {"approve", 1, 1}, {"reject", 1, 1}, {"digest", 1, 2}, {NULL, 0, 0}};

/* The most [stage-*] sections looked at for the list stage. */
#define LIST_STAGE_SECTIONS_MAX 256

/* The id of the list at address, as text; NULL (and why printed) when none. */
static char *
list_id(PGconn *conn, const char *address, int *rc)
{
	const char *values[1] = {address};
	PGresult   *res = db_exec(conn, "SELECT id FROM pepsi.mailing_list WHERE address = lower($1)", 1, values);
	char	   *id = NULL;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		*rc = cli_db_exit_code(res, conn);
		cli_db_error(LIST_PROGRAM, res, conn);
	}
	else if (PQntuples(res) == 0)
	{
		fprintf(stderr, LIST_PROGRAM ": no list %s (pepsi-list lists shows them)\n", address);
		*rc = CLI_EX_DATAERR;
	}
	else
		id = xstrdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return id;
}

/* Run a statement that changes something; false (why printed, *rc set) on an error. */
static bool
list_exec(PGconn *conn, const char *sql, int nparams, const char *const *values, int *rc, PGresult **out)
{
	PGresult *res = db_exec(conn, sql, nparams, values);

	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		*rc = cli_db_exit_code(res, conn);
		cli_db_error(LIST_PROGRAM, res, conn);
		PQclear(res);
		return false;
	}
	if (out)
		*out = res;
	else
		PQclear(res);
	return true;
}

/*
 * One member line of an import: a CSV "address[,name[,delivery]]" (pepsi-list
 * export), Mailman's "Name <address>" or a bare address (mlmmj's
 * subscribers.d files hold one address a line).  Empty and # lines are
 * skipped (false).
 */
static bool
list_import_line(char *line, char **address, char **name, char **delivery)
{
	char *lt;
	char *end = line + strlen(line);

	while (end > line && isspace((unsigned char) end[-1]))
		*--end = '\0';
	line += strspn(line, " \t");
	*address = *name = *delivery = NULL;
	if (*line == '\0' || *line == '#' || strncmp(line, "address,", 8) == 0)
		return false;
	if ((lt = strrchr(line, '<')) != NULL && strchr(lt, '>') != NULL)
	{
		*strchr(lt, '>') = '\0';
		*address = lt + 1;
		*lt = '\0';
		for (end = lt; end > line && (isspace((unsigned char) end[-1]) || end[-1] == '"'); end--)
			end[-1] = '\0';
		line += strspn(line, "\"");
		*name = *line ? line : NULL;
		return true;
	}
	*address = line;
	if ((lt = strchr(line, ',')) != NULL)
	{
		*lt++ = '\0';
		*name = *lt && *lt != ',' ? lt : NULL;
		if ((lt = strchr(lt, ',')) != NULL)
		{
			*lt++ = '\0';
			*delivery = *lt ? lt : NULL;
		}
	}
	return true;
}

/* Import the members of path ("-": standard input) into list, all or nothing. */
static int
list_import(PGconn *conn, const char *list, const char *path)
{
	FILE  *in = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
	char  *line = NULL;
	size_t size = 0;
	size_t number = 0;
	size_t added = 0;
	int	   rc = CLI_EX_OK;

	if (in == NULL)
	{
		fprintf(stderr, LIST_PROGRAM ": %s: %s\n", path, strerror(errno));
		return CLI_EX_DATAERR;
	}
	if (!list_exec(conn, "BEGIN", 0, NULL, &rc, NULL))
		goto out;
	while (getline(&line, &size, in) != -1)
	{
		char	 *address;
		char	 *name;
		char	 *delivery;
		PGresult *res;

		number++;
		if (!list_import_line(line, &address, &name, &delivery))
			continue;
		{
			const char *values[4] = {list, address, delivery ? delivery : "each", name};

			if (!list_exec(conn, "SELECT pepsi.list_member_add($1::bigint, $2, $3, $4, 'import')", 4, values, &rc,
						   &res))
			{
				fprintf(stderr, LIST_PROGRAM ": %s:%zu: <%s> refused: nothing imported\n", path, number, address);
				PQclear(PQexec(conn, "ROLLBACK"));
				goto out;
			}
			added += strcmp(PQgetvalue(res, 0, 0), "t") == 0;
			PQclear(res);
		}
	}
	if (list_exec(conn, "COMMIT", 0, NULL, &rc, NULL))
		printf("%zu member(s) added\n", added);
out:
	free(line);
	if (in != stdin)
		fclose(in);
	return rc;
}

/* Export the members: CSV (pepsi-list import), Mailman's "Name <address>", or mlmmj's one address a line. */
static int
list_export(PGconn *conn, const char *list, const char *format)
{
	const char *values[1] = {list};
	PGresult   *res;
	int			rc = CLI_EX_OK;

	if (strcmp(format, "csv") && strcmp(format, "mailman") && strcmp(format, "mlmmj"))
	{
		fprintf(stderr, LIST_PROGRAM ": export formats are csv, mailman and mlmmj, not \"%s\"\n", format);
		return CLI_EX_USAGE;
	}
	if (!list_exec(conn,
				   "SELECT address, coalesce(display_name, ''), delivery FROM pepsi.list_member"
				   " WHERE list_id = $1::bigint ORDER BY address",
				   1, values, &rc, &res))
		return rc;
	if (strcmp(format, "csv") == 0)
		printf("address,display_name,delivery\n");
	for (int i = 0; i < PQntuples(res); i++)
	{
		const char *address = PQgetvalue(res, i, 0);
		const char *name = PQgetvalue(res, i, 1);

		if (strcmp(format, "csv") == 0)
			printf("%s,%s,%s\n", address, strpbrk(name, ",\"\n") ? "" : name, PQgetvalue(res, i, 2));
		else if (strcmp(format, "mailman") == 0 && *name && !strpbrk(name, "\"\n"))
			printf("\"%s\" <%s>\n", name, address);
		else
			printf("%s\n", address);
	}
	PQclear(res);
	return rc;
}

/*
 * Where a digest goes when pepsi-list digest names no STAGE: the NEXT_STAGE
 * of the configuration's pepsi-stage-list stage, where the schedule's
 * digest row has it go.  NULL (why printed) when no stage or several
 * different ones run it.
 */
static const char *
list_digest_stage(const struct pepsi_config *cfg)
{
	const char *sections[LIST_STAGE_SECTIONS_MAX];
	size_t		n = config_sections(cfg, "stage-", sections, LIST_STAGE_SECTIONS_MAX);
	const char *found = NULL;

	for (size_t i = 0; i < n; i++)
	{
		const char *program = config_get(cfg, sections[i], "PROGRAM");
		const char *next = config_get(cfg, sections[i], "NEXT_STAGE");

		if (program == NULL || strcmp(program, "pepsi-stage-list") != 0 || next == NULL)
			continue;
		if (found && strcmp(found, next) != 0)
		{
			fprintf(stderr,
					LIST_PROGRAM ": two pepsi-stage-list stages go on to %s and %s: name the stage the digest goes to "
								 "(pepsi-list digest LIST STAGE)\n",
					found, next);
			return NULL;
		}
		found = next;
	}
	if (found == NULL)
		fprintf(stderr, LIST_PROGRAM ": no [stage-*] section runs pepsi-stage-list with a NEXT_STAGE: name the stage "
									 "the digest goes to (pepsi-list digest LIST STAGE)\n");
	return found;
}

/* Send list's digest now, queued at stage (NULL: the list stage's NEXT_STAGE), as the schedule's row does; audited. */
static int
list_digest(PGconn *conn, const struct pepsi_config *cfg, const char *list, const char *stage)
{
	const char *values[2] = {list, stage ? stage : list_digest_stage(cfg)};
	PGresult   *res;
	int			rc = CLI_EX_OK;

	if (values[1] == NULL)
		return CLI_EX_CONFIG;
	if (list_exec(conn,
				  "SELECT d->>'issue', d->>'posts', d->>'rows' FROM pepsi.list_digest_now($1, $2) AS d", 2, values,
				  &rc, &res))
	{
		printf("%s: digest issue %s of %s post(s) queued at %s on %s row(s)\n", list, PQgetvalue(res, 0, 0),
			   PQgetvalue(res, 0, 1), values[1], PQgetvalue(res, 0, 2));
		PQclear(res);
	}
	return rc;
}

static int
list_run(PGconn *conn, const struct pepsi_config *cfg, const char *command, int nargs, char **argv, bool as_json)
{
	PGresult *res = NULL;
	char	 *id = NULL;
	int		  rc = CLI_EX_OK;

	if (strcmp(command, "lists") == 0)
		return cli_show_result(LIST_PROGRAM,
							   db_exec(conn,
									   "SELECT l.address, l.posting_policy, l.description,"
									   " (SELECT count(*) FROM pepsi.list_member m WHERE m.list_id = l.id) AS members"
									   " FROM pepsi.mailing_list l ORDER BY l.address",
									   0, NULL),
							   conn, as_json);
	if (strcmp(command, "create") == 0)
	{
		const char *values[3] = {argv[0], argv[1], nargs > 2 ? argv[2] : ""};

		if (list_exec(conn, "SELECT pepsi.list_create($1, $2, $3)", 3, values, &rc, NULL))
			printf("list %s created, owned by %s\n", argv[0], argv[1]);
		return rc;
	}
	if (strcmp(command, "approve") == 0 || strcmp(command, "reject") == 0)
	{
		const char *values[2] = {argv[0], command};
		long long	held;

		if (!cli_parse_id(argv[0], &held))
		{
			fprintf(stderr, LIST_PROGRAM ": \"%s\" is not a held post's id (pepsi-list held LIST)\n", argv[0]);
			return CLI_EX_USAGE;
		}
		if (list_exec(conn, "SELECT pepsi.list_decide($1::bigint, $2, NULL)", 2, values, &rc, &res))
		{
			if (PQgetisnull(res, 0, 0))
				printf("held post %s: %s\n", argv[0], strcmp(command, "approve") == 0 ? "approved" : "rejected");
			else
			{
				fprintf(stderr, LIST_PROGRAM ": %s\n", PQgetvalue(res, 0, 0));
				rc = CLI_EX_DATAERR;
			}
			PQclear(res);
		}
		return rc;
	}
	if (strcmp(command, "digest") == 0)
		return list_digest(conn, cfg, argv[0], nargs > 1 ? argv[1] : NULL);
	if ((id = list_id(conn, argv[0], &rc)) == NULL)
		return rc;
	if (strcmp(command, "show") == 0)
	{
		const char *values[1] = {id};

		rc = cli_show_result(LIST_PROGRAM,
							 db_exec(conn,
									 "SELECT address, description, posting_policy, subject_tag, header_text,"
									 " footer_text, verp, dmarc_mitigation, bounce_threshold, bounce_reset,"
									 " unsubscribe_url, created_at,"
									 " (SELECT string_agg(r.address || ' (' || r.role || ')', ', ' ORDER BY r.role, r.address)"
									 "  FROM pepsi.list_role r WHERE r.list_id = l.id) AS roles"
									 " FROM pepsi.mailing_list l WHERE id = $1::bigint",
									 1, values),
							 conn, as_json);
	}
	else if (strcmp(command, "set") == 0 || strcmp(command, "reset") == 0)
	{
		const char *values[3] = {id, argv[1], nargs > 2 ? argv[2] : NULL};

		if (list_exec(conn, "SELECT pepsi.list_configure($1::bigint, $2, $3)", 3, values, &rc, NULL))
			printf("%s %s %s\n", argv[0], argv[1], nargs > 2 ? "set" : "reset");
	}
	else if (strcmp(command, "role") == 0)
	{
		const char *values[4] = {id, argv[1], argv[2], strcmp(argv[3], "on") == 0 ? "true" : "false"};

		if ((strcmp(argv[2], "owner") && strcmp(argv[2], "moderator")) || (strcmp(argv[3], "on") && strcmp(argv[3], "off")))
		{
			fprintf(stderr, LIST_PROGRAM ": role takes owner or moderator, then on or off\n");
			rc = CLI_EX_USAGE;
		}
		else if (list_exec(conn, "SELECT pepsi.list_role_set($1::bigint, $2, $3, $4::boolean)", 4, values, &rc, NULL))
			printf("%s: %s %s %s\n", argv[0], argv[1], argv[2], argv[3]);
	}
	else if (strcmp(command, "members") == 0)
	{
		const char *values[1] = {id};

		rc = cli_show_result(LIST_PROGRAM,
							 db_exec(conn,
									 "SELECT address, display_name, delivery, disabled, bounce_score, subscribed_at"
									 " FROM pepsi.list_member WHERE list_id = $1::bigint ORDER BY address",
									 1, values),
							 conn, as_json);
	}
	else if (strcmp(command, "add") == 0 || strcmp(command, "remove") == 0 || strcmp(command, "enable") == 0)
	{
		const char *values[3] = {id, argv[1], nargs > 2 ? argv[2] : "each"};
		const char *sql = strcmp(command, "add") == 0	   ? "SELECT pepsi.list_member_add($1::bigint, $2, $3)"
						  : strcmp(command, "remove") == 0 ? "SELECT pepsi.list_member_remove($1::bigint, $2)"
														   : "SELECT pepsi.list_member_enable($1::bigint, $2)";

		if (list_exec(conn, sql, strcmp(command, "add") == 0 ? 3 : 2, values, &rc, &res))
		{
			if (strcmp(PQgetvalue(res, 0, 0), "t") == 0)
				printf("%s: %s %s\n", argv[0], argv[1],
					   strcmp(command, "add") == 0 ? "added" : strcmp(command, "remove") == 0 ? "removed"
																							  : "enabled");
			else
			{
				fprintf(stderr, LIST_PROGRAM ": %s: %s %s\n", argv[0], argv[1],
						strcmp(command, "add") == 0 ? "is a member already" : "is not a member");
				rc = CLI_EX_DATAERR;
			}
			PQclear(res);
		}
	}
	else if (strcmp(command, "import") == 0)
		rc = list_import(conn, id, argv[1]);
	else if (strcmp(command, "export") == 0)
		rc = list_export(conn, id, nargs > 1 ? argv[1] : "csv");
	else if (strcmp(command, "held") == 0)
	{
		const char *values[1] = {id};

		rc = cli_show_result(LIST_PROGRAM,
							 db_exec(conn,
									 "SELECT id, sender, subject, reason, held_at, decision, decided_by"
									 " FROM pepsi.list_held WHERE list_id = $1::bigint ORDER BY id",
									 1, values),
							 conn, as_json);
	}
	free(id);
	return rc;
}

int
pepsi_list_main(int argc, char **argv)
{
	const char				  *config_path = NULL;
	bool					   as_json = false;
	struct pepsi_config		  *cfg = NULL;
	const struct list_command *c;
	PGconn					  *conn;
	int						   nargs;
	int						   rc = CLI_EX_OK;

	if (!cli_command_options(argc, argv, list_usage, true, &config_path, &as_json, NULL, &rc))
		return rc;
	for (c = list_commands; c->name && strcmp(c->name, argv[optind]) != 0; c++)
		;
	nargs = argc - optind - 1;
	if (c->name == NULL)
	{
		fprintf(stderr, LIST_PROGRAM ": unknown command \"%s\"\n", argv[optind]);
		list_usage(stderr);
		return CLI_EX_USAGE;
	}
	if (nargs < c->min || nargs > c->max)
	{
		fprintf(stderr, LIST_PROGRAM ": %s takes %d to %d argument(s), not %d\n", c->name, c->min, c->max, nargs);
		list_usage(stderr);
		return CLI_EX_USAGE;
	}
	if ((conn = cli_connect(LIST_PROGRAM, config_path, CLI_ROLE_CONFIG, &cfg, &rc)) == NULL)
		return rc;
	rc = list_run(conn, cfg, c->name, nargs, argv + optind + 1, as_json);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
