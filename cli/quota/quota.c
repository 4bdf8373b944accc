/*
 * pepsi-quota: an operator's view and edit of the mailbox quotas
 * (pepsi.quota, pepsi.quota_usage; pepsi-quota(8)).
 *
 *   pepsi-quota [-C config] [--json] show ADDRESS|@DOMAIN
 *   pepsi-quota [-C config] [--json] list
 *   pepsi-quota [-C config] set ADDRESS|@DOMAIN LIMIT=VALUE...
 *   pepsi-quota [-C config] unset ADDRESS|@DOMAIN
 *   pepsi-quota [-C config] [--json] [--section STAGE] recount ADDRESS
 *
 * LIMIT is bytes (a size: 100M), messages or daily (counts); 0 is no
 * limit of that kind.  set and unset go through pepsi.quota_set/unset,
 * which check the address and the limits and write a pepsi.event_log row
 * each.  recount has the Maildir counted afresh from disk by
 * pepsi-helper-maildir-writer (a "recount" request: the helper runs as
 * the mailbox's owner and rewrites its maildirsize) and records the
 * count (pepsi.quota_recounted, audited).  Installed, pepsi-quota is
 * set-group-id to the helper's caller group, taken up only to run it.
 * Connects as [database] CONFIG_CONNINFO.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "base/xalloc.h"
#include "config/config.h"
#include "delivery/maildir.h"
#include "process/cli.h"
#include "process/privilege.h"
#include "runtime/db.h"

int pepsi_quota_main(int argc, char **argv);

#define QUOTA_PROGRAM "pepsi-quota"
#define QUOTA_WRITER "pepsi-helper-maildir-writer"
#define QUOTA_STAGE_PROGRAM "pepsi-stage-relay-to-maildir"

static void
quota_usage(FILE *out)
{
	fprintf(out, "usage: " QUOTA_PROGRAM " [-C CONFIG] [--json] show ADDRESS|@DOMAIN\n"
				 "       " QUOTA_PROGRAM " [-C CONFIG] [--json] list\n"
				 "       " QUOTA_PROGRAM " [-C CONFIG] set ADDRESS|@DOMAIN bytes=SIZE|messages=N|daily=N...\n"
				 "       " QUOTA_PROGRAM " [-C CONFIG] unset ADDRESS|@DOMAIN\n"
				 "       " QUOTA_PROGRAM " [-C CONFIG] [--json] [--section STAGE] recount ADDRESS\n");
}

/* "10M" -> 10485760; "-5" stays -5 (the database names the limit it refuses); false if not a number. */
static bool
quota_parse_value(const char *text, bool size, long long *value)
{
	char	 *end;
	long long v;

	errno = 0;
	v = strtoll(text, &end, 10);
	if (errno || end == text)
		return false;
	if (size && *end)
	{
		long long unit = *end == 'k' || *end == 'K' ? 1024LL
						 : *end == 'M'				? 1024LL * 1024
						 : *end == 'G'				? 1024LL * 1024 * 1024
													: 0;
		if (unit == 0 || end[1] != '\0' || (v > 0 && v > LLONG_MAX / unit))
			return false;
		v *= unit;
	}
	else if (*end)
		return false;
	*value = v;
	return true;
}

/* set: LIMIT=VALUE words into pepsi.quota_set's arguments (NULL: left as it is). */
static int
quota_set(PGconn *conn, char **argv, int nargs)
{
	static const char *const names[] = {"bytes", "messages", "daily"};
	char					 values[3][32];
	const char				*params[4] = {argv[0], NULL, NULL, NULL};
	PGresult				*res;
	int						 rc;

	for (int i = 1; i < nargs; i++)
	{
		const char *eq = strchr(argv[i], '=');
		size_t		len = eq ? (size_t) (eq - argv[i]) : 0;
		int			k;
		long long	v;

		for (k = 0; k < 3; k++)
			if (eq && strlen(names[k]) == len && strncmp(argv[i], names[k], len) == 0)
				break;
		if (k == 3)
		{
			fprintf(stderr, QUOTA_PROGRAM ": \"%s\": not bytes=SIZE, messages=N or daily=N\n", argv[i]);
			return CLI_EX_USAGE;
		}
		if (!quota_parse_value(eq + 1, k == 0, &v))
		{
			fprintf(stderr, QUOTA_PROGRAM ": %s: \"%s\" is not a %s\n", names[k], eq + 1,
					k == 0 ? "size (bytes, or with k, M, G)" : "whole number");
			return CLI_EX_USAGE;
		}
		snprintf(values[k], sizeof(values[k]), "%lld", v);
		params[k + 1] = values[k];
	}
	res = db_exec(conn, "SELECT pepsi.quota_set($1, $2::bigint, $3::bigint, $4::integer)", 4, params);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		rc = cli_db_exit_code(res, conn);
		cli_db_error(QUOTA_PROGRAM, res, conn);
	}
	else
	{
		rc = CLI_EX_OK;
		printf("%s: quota set\n", argv[0]);
	}
	PQclear(res);
	return rc;
}

/* The [stage-*] of relay-to-maildir to count for: the one named, else the first. */
static const char *
quota_section(const struct pepsi_config *cfg, const char *named)
{
	const char *sections[256];
	size_t		n = config_sections(cfg, "stage-", sections, 256);

	for (size_t i = 0; i < n; i++)
	{
		const char *program = config_text(cfg, sections[i], "PROGRAM");
		const char *base = program && strrchr(program, '/') ? strrchr(program, '/') + 1 : program;

		if (base == NULL || strcmp(base, QUOTA_STAGE_PROGRAM) != 0)
			continue;
		if (named == NULL || strcmp(sections[i] + 6, named) == 0 || strcmp(sections[i], named) == 0)
			return sections[i];
	}
	return NULL;
}

/* The helper beside this program (always, set-group-id), else the section's MAILDIR_WRITER path. */
static char *
quota_writer_path(const struct pepsi_config *cfg, const char *section)
{
	const char *configured = config_text(cfg, section, "MAILDIR_WRITER");
	char		path[PATH_MAX];
	ssize_t		n;
	char	   *slash;

	if (!privilege_running_setid() && configured && strchr(configured, '/'))
		return xstrdup(configured);
	n = readlink("/proc/self/exe", path, sizeof(path) - 1);
	if (n <= 0)
		return NULL;
	path[n] = '\0';
	slash = strrchr(path, '/');
	if (slash)
		*slash = '\0';
	return xasprintf("%s/%s", path, QUOTA_WRITER);
}

/* Run the helper on request; its one reply line into reply.  False with why. */
static bool
quota_run_writer(const char *writer, const char *config_path, const char *request, char *reply,
				 size_t size)
{
	int						   in[2], out[2];
	posix_spawn_file_actions_t actions;
	char					   name[] = QUOTA_WRITER;
	char					   flag[] = "-c";
	char					  *path = xstrdup(config_path);
	char					  *argv[] = {name, flag, path, NULL};
	char					  *envp[] = {NULL};
	pid_t					   pid;
	int						   rc;
	int						   status;
	FILE					  *from;

	signal(SIGPIPE, SIG_IGN);
	if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
	{
		snprintf(reply, size, "pipe: %s", strerror(errno));
		return false;
	}
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, in[0], 0);
	posix_spawn_file_actions_adddup2(&actions, out[1], 1);
	if (!privilege_exec_group(true, reply, size))
	{
		free(path);
		return false;
	}
	rc = posix_spawn(&pid, writer, &actions, NULL, argv, envp);
	if (!privilege_exec_group(false, reply, size))
		_exit(CLI_EX_NOPERM);
	posix_spawn_file_actions_destroy(&actions);
	free(path);
	close(in[0]);
	close(out[1]);
	if (rc != 0)
	{
		snprintf(reply, size, "cannot run %s: %s", writer, strerror(rc));
		close(in[1]);
		close(out[0]);
		return false;
	}
	(void) !write(in[1], request, strlen(request));
	close(in[1]);
	from = fdopen(out[0], "r");
	if (from == NULL || fgets(reply, (int) size, from) == NULL)
		snprintf(reply, size, "%s gave no answer", writer);
	reply[strcspn(reply, "\n")] = '\0';
	if (from)
		fclose(from);
	waitpid(pid, &status, 0);
	return true;
}

static int
quota_recount(PGconn *conn, const struct pepsi_config *cfg, const char *config_path, const char *named,
			  const char *address, bool as_json)
{
	const char *section = quota_section(cfg, named);
	const char *values[5] = {address};
	char		v[4][32];
	char		reply[2048];
	char	   *writer;
	char	   *name;
	char	   *request;
	const char *limits = NULL;
	const char *mark;
	long long	bytes, max_bytes, messages, max_messages;
	PGresult   *res;
	int			rc = CLI_EX_OK;

	if (section == NULL)
	{
		fprintf(stderr, QUOTA_PROGRAM ": %s: no [stage-%s] of " QUOTA_STAGE_PROGRAM " (--section)\n", cfg->path,
				named ? named : "*");
		return CLI_EX_CONFIG;
	}
	if ((name = maildir_mailbox_name(address, config_enum(cfg, section, "MAILBOX") == 1)) == NULL
		|| strchr(address, '@') == NULL)
	{
		fprintf(stderr, QUOTA_PROGRAM ": \"%s\" is not an address that can name a mailbox\n", address);
		free(name);
		return CLI_EX_DATAERR;
	}
	res = db_exec(conn,
				  "SELECT pepsi.quota_maildir_limits($1)", 1, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		rc = cli_db_exit_code(res, conn);
		cli_db_error(QUOTA_PROGRAM, res, conn);
		PQclear(res);
		free(name);
		return rc;
	}
	if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
		limits = PQgetvalue(res, 0, 0);
	request = xasprintf("section %s\nrecipient %s\nmailbox %s\nsize 0\nrecount yes\n%s%s%s\n", section, address,
						name, limits ? "quota " : "", limits ? limits : "", limits ? "\n" : "");
	PQclear(res);
	free(name);
	writer = quota_writer_path(cfg, section);
	if (writer == NULL || !quota_run_writer(writer, config_path, request, reply, sizeof(reply)))
	{
		fprintf(stderr, QUOTA_PROGRAM ": %s\n", writer ? reply : "cannot find my own executable");
		free(writer);
		free(request);
		return CLI_EX_TEMPFAIL;
	}
	free(writer);
	free(request);
	mark = strstr(reply, " quota=");
	if (strncmp(reply, "2.0.0 ", 6) != 0 || mark == NULL
		|| sscanf(mark, " quota=%lld/%lld,%lld/%lld", &bytes, &max_bytes, &messages, &max_messages) != 4)
	{
		fprintf(stderr, QUOTA_PROGRAM ": the maildir writer answered: %s\n", reply);
		return reply[0] == '5' ? CLI_EX_DATAERR : CLI_EX_TEMPFAIL;
	}
	for (int i = 0; i < 4; i++)
		snprintf(v[i], sizeof(v[i]), "%lld", i == 0 ? bytes : i == 1 ? messages
														  : i == 2	 ? max_bytes
																	 : max_messages);
	for (int i = 0; i < 4; i++)
		values[i + 1] = v[i];
	res = db_exec(conn, "SELECT pepsi.quota_recounted($1, $2::bigint, $3::bigint, $4::bigint, $5::bigint)", 5,
				  values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		rc = cli_db_exit_code(res, conn);
		cli_db_error(QUOTA_PROGRAM, res, conn);
	}
	else if (as_json)
	{
		PQclear(res);
		res = db_exec(conn, "SELECT pepsi.quota_show($1)", 1, values);
		if (PQresultStatus(res) == PGRES_TUPLES_OK)
			printf("%s\n", PQgetvalue(res, 0, 0));
	}
	else
		printf("%s: %lld bytes in %lld messages\n", address, bytes, messages);
	PQclear(res);
	return rc;
}

int
pepsi_quota_main(int argc, char **argv)
{
	const char			*config_path = NULL;
	const char			*section = NULL;
	bool				 as_json = false;
	struct pepsi_config *cfg = NULL;
	const char			*command;
	PGconn				*conn;
	PGresult			*res = NULL;
	int					 nargs;
	int					 rc = CLI_EX_OK;

	privilege_setid_start();
	if (!cli_command_options(argc, argv, quota_usage, true, &config_path, &as_json, &section, &rc))
		return rc;
	command = argv[optind];
	nargs = argc - optind - 1;
	argv += optind + 1;
	if (strcmp(command, "list") == 0  ? nargs != 0
		: strcmp(command, "set") == 0 ? nargs < 2
		: strcmp(command, "show") == 0 || strcmp(command, "unset") == 0 || strcmp(command, "recount") == 0
			? nargs != 1
			: true)
	{
		if (strcmp(command, "list") && strcmp(command, "set") && strcmp(command, "show") && strcmp(command, "unset")
			&& strcmp(command, "recount"))
			fprintf(stderr, QUOTA_PROGRAM ": unknown command \"%s\"\n", command);
		else
			fprintf(stderr, QUOTA_PROGRAM ": %s takes %s\n", command,
					strcmp(command, "list") == 0  ? "nothing"
					: strcmp(command, "set") == 0 ? "an address or @domain and at least one LIMIT=VALUE"
												  : "one address");
		quota_usage(stderr);
		return CLI_EX_USAGE;
	}
	if ((conn = cli_connect(QUOTA_PROGRAM, config_path, CLI_ROLE_CONFIG, &cfg, &rc)) == NULL)
		return rc;
	if (strcmp(command, "set") == 0)
		rc = quota_set(conn, argv, nargs);
	else if (strcmp(command, "recount") == 0)
		rc = quota_recount(conn, cfg, cfg->path, section, argv[0], as_json);
	else
	{
		if (strcmp(command, "show") == 0)
			res = db_exec(conn,
						  "SELECT s->>'address' AS address, s->>'source' AS source, s->>'max_bytes' AS max_bytes,"
						  " s->>'max_messages' AS max_messages, s->>'max_daily' AS max_daily, s->>'bytes' AS bytes,"
						  " s->>'messages' AS messages, s->>'today' AS today, s->>'full' AS full,"
						  " s->>'counted_at' AS counted_at FROM pepsi.quota_show($1) s",
						  1, (const char *const *) argv);
		else if (strcmp(command, "list") == 0)
			res = db_exec(conn,
						  "SELECT address, max_bytes, max_messages, max_daily, updated_at FROM pepsi.quota"
						  " ORDER BY address LIKE '@%' DESC, address",
						  0, NULL);
		else
			res = db_exec(conn, "SELECT pepsi.quota_unset($1)", 1, (const char *const *) argv);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			rc = cli_db_exit_code(res, conn);
			cli_db_error(QUOTA_PROGRAM, res, conn);
		}
		else if (strcmp(command, "unset") == 0)
		{
			if (strcmp(PQgetvalue(res, 0, 0), "t") == 0)
				printf("%s: quota unset\n", argv[0]);
			else
			{
				fprintf(stderr, QUOTA_PROGRAM ": %s has no quota of its own\n", argv[0]);
				rc = CLI_EX_DATAERR;
			}
		}
		else
			cli_print(res, as_json);
		PQclear(res);
	}
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
