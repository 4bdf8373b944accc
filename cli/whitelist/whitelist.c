/*
 * pepsi-whitelist: a local user's own confirm-to-send whitelist
 * (pepsi.whitelist; pepsi-whitelist(1), pepsi-stage-check-whitelist(8)).
 *
 *   pepsi-whitelist [-C config] [--json] [list]
 *   pepsi-whitelist [-C config] add ADDRESS...
 *   pepsi-whitelist [-C config] remove ADDRESS...
 *   pepsi-whitelist [-C config] seed
 *
 * Whose list: always the real user's.  The owner is the real uid's
 * account name, lower case, at [whitelist] DOMAIN (default: the first of
 * [pepsi] LOCAL_DOMAINS), as system-user delivery maps an address's
 * local part to the account of that name (pepsi-helper-maildir-writer's
 * MAILBOXES = system); no argument, option or environment names another.
 *
 * Installed set-user-id to the account pepsi-whitelist, which exists for
 * this alone.  The privilege is the database connection, nothing else:
 * [whitelist] CONNINFO connects over the local socket with peer
 * authentication, which keys off the effective uid, so only this file can
 * log in as the role pepsi-whitelist, a member of the group role
 * pepsi_whitelist that may execute whitelist_add, whitelist_remove and
 * whitelist_list and nothing else of the schema.  Those functions take
 * the owner as an argument: the kernel proves the real uid to this
 * program, and the program is the only way into the role, so the owner it
 * passes is the caller's.  (The other design, one database role per
 * system user mapped by pg_ident.conf, would let the database check the
 * owner itself, but needs a role and an ident line per user: this keeps
 * it to one role and one line of pg_hba.conf.)  Everything else the
 * caller controls is put aside first: the environment is emptied before
 * libpq reads it (PGHOST, PGUSER, PGSERVICEFILE...), the configuration
 * is read only from a file root alone can change (privilege_config_load),
 * and nothing the caller names is opened with the set-uid account's ids.
 *
 * seed runs pepsi-helper-mailbox-scan, by name from this program's own
 * directory (never through PATH), in a child whose ids are all the real
 * user's again, on the user's sent folder (~/[whitelist] SENT_FOLDER);
 * its lines are checked and added in one transaction (source "sent-folder"), so
 * a failed scan or a refused address adds nothing.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "base/xalloc.h"
#include "config/config.h"
#include "local/local.h"
#include "process/cli.h"
#include "process/privilege.h"
#include "runtime/db.h"

int pepsi_whitelist_main(int argc, char **argv);

#define WL_PROGRAM "pepsi-whitelist"
#define WL_SCANNER "pepsi-helper-mailbox-scan"
#define WL_SECTION "whitelist"
#define WL_SEED_MAX 100000

static void
whitelist_usage(FILE *out)
{
	fprintf(out, "usage: " WL_PROGRAM " [-C CONFIG] [--json] [list]\n"
				 "       " WL_PROGRAM " [-C CONFIG] add ADDRESS...\n"
				 "       " WL_PROGRAM " [-C CONFIG] remove ADDRESS...\n"
				 "       " WL_PROGRAM " [-C CONFIG] seed\n");
}

/* An address as a user types it: local@domain, printable, no space, one '@'. */
static bool
whitelist_address_ok(const char *a)
{
	const char *at = strchr(a, '@');

	if (at == NULL || at == a || at[1] == '\0' || strchr(at + 1, '@') || strlen(a) > 320)
		return false;
	for (const char *p = a; *p; p++)
		if ((unsigned char) *p <= ' ' || (unsigned char) *p >= 0x7f || strchr("<>,;()[]\\\"", *p))
			return false;
	for (const char *p = at + 1; *p; p++)
		if (!(isalnum((unsigned char) *p) || *p == '-' || *p == '.'))
			return false;
	return at[1] != '.' && a[strlen(a) - 1] != '.';
}

/* The real user's address: account name, lower case, @ the domain.  NULL (said why) if none. */
static char *
whitelist_owner(const struct pepsi_config *cfg, struct passwd **pw_out)
{
	const char	  *domain = config_text(cfg, WL_SECTION, "DOMAIN");
	struct passwd *pw;
	char		   first[256];
	char		  *owner;

	errno = 0;
	if ((pw = getpwuid(getuid())) == NULL)
	{
		fprintf(stderr, WL_PROGRAM ": the user id %ld has no account name\n", (long) getuid());
		return NULL;
	}
	if (domain == NULL)
	{
		const char *domains = local_domains(cfg, NULL);
		size_t		len;

		domains += strspn(domains, ", \t");
		len = strcspn(domains, ", \t");
		if (len == 0 || len >= sizeof(first))
		{
			fprintf(stderr, WL_PROGRAM ": no local domain: set [whitelist] DOMAIN or [pepsi] LOCAL_DOMAINS\n");
			return NULL;
		}
		memcpy(first, domains, len);
		first[len] = '\0';
		domain = first;
	}
	owner = xasprintf("%s@%s", pw->pw_name, domain);
	for (char *p = owner; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	if (!whitelist_address_ok(owner))
	{
		fprintf(stderr, WL_PROGRAM ": \"%s\" (the account %s at %s) is not an address\n", owner, pw->pw_name,
				domain);
		free(owner);
		return NULL;
	}
	*pw_out = pw;
	return owner;
}

/* One call of whitelist_add or whitelist_remove; its boolean into *changed.  An exit code. */
static int
whitelist_change(PGconn *conn, bool add, const char *owner, const char *address, const char *source,
				 bool *changed)
{
	const char *params[3] = {owner, address, source};
	PGresult   *res = db_exec(conn,
							  add ? "SELECT pepsi.whitelist_add($1, $2, $3)" : "SELECT pepsi.whitelist_remove($1, $2)",
							  add ? 3 : 2, params);
	int			rc = CLI_EX_OK;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		rc = cli_db_exit_code(res, conn);
		cli_db_error(WL_PROGRAM, res, conn);
	}
	else
		*changed = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	return rc;
}

static int
whitelist_add_remove(PGconn *conn, bool add, const char *owner, char **addresses, int count)
{
	int rc = CLI_EX_OK;

	/* Every argument checked before anything changes. */
	for (int i = 0; i < count; i++)
		if (!whitelist_address_ok(addresses[i]))
		{
			fprintf(stderr, WL_PROGRAM ": \"%s\" is not an address (local@domain); nothing changed\n",
					addresses[i]);
			return CLI_EX_DATAERR;
		}
	for (int i = 0; i < count && rc == CLI_EX_OK; i++)
	{
		bool changed = false;

		rc = whitelist_change(conn, add, owner, addresses[i], "owner", &changed);
		if (rc == CLI_EX_OK)
			printf("%s: %s\n", addresses[i],
				   add ? (changed ? "added" : "already on the whitelist")
					   : (changed ? "removed" : "not on the whitelist"));
	}
	return rc;
}

/* This program's directory + "/" WL_SCANNER.  NULL if unknown. */
static char *
whitelist_scanner_path(void)
{
	char	path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
	char   *slash;

	if (n <= 0)
		return NULL;
	path[n] = '\0';
	if ((slash = strrchr(path, '/')) == NULL)
		return NULL;
	*slash = '\0';
	return xasprintf("%s/%s", path, WL_SCANNER);
}

/* The child: every id the real user's for good, then the scanner on the sent folder. */
static void
whitelist_exec_scanner(const char *scanner, const char *folder, long long max_size, int out)
{
	uid_t uid = getuid();
	gid_t gid = getgid();
	uid_t euid = geteuid();
	char  size[32];
	char  name[] = WL_SCANNER;
	char  flag[] = "--max-size";
	char *path = xstrdup(folder);
	char *argv[] = {name, flag, size, path, NULL};
	char *envp[] = {NULL};

	if (setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0 || geteuid() != uid || getegid() != gid
		|| (euid != uid && setresuid((uid_t) -1, euid, (uid_t) -1) == 0))
	{
		fprintf(stderr, WL_PROGRAM ": cannot drop back to the user id %ld\n", (long) uid);
		_exit(CLI_EX_NOPERM);
	}
	if (dup2(out, 1) < 0)
		_exit(CLI_EX_TEMPFAIL);
	snprintf(size, sizeof(size), "%lld", max_size);
	execve(scanner, argv, envp);
	fprintf(stderr, WL_PROGRAM ": cannot run %s: %s\n", scanner, strerror(errno));
	_exit(CLI_EX_TEMPFAIL);
}

static int
whitelist_seed(PGconn *conn, const struct pepsi_config *cfg, const char *owner, const struct passwd *pw)
{
	const char *sent = config_text(cfg, WL_SECTION, "SENT_FOLDER");
	long long	max_size = config_size(cfg, WL_SECTION, "SEED_MAX_SIZE");
	char	   *scanner = whitelist_scanner_path();
	char	   *folder;
	char	  **lines = NULL;
	size_t		count = 0, size = 0;
	char		line[1024];
	int			fds[2];
	int			status;
	int			rc = CLI_EX_OK;
	size_t		added = 0;
	pid_t		pid;
	FILE	   *from;
	PGresult   *res;

	if (scanner == NULL)
	{
		fprintf(stderr, WL_PROGRAM ": cannot find my own executable, beside which " WL_SCANNER " is\n");
		return CLI_EX_TEMPFAIL;
	}
	if (sent == NULL || sent[0] == '/' || strstr(sent, ".."))
	{
		fprintf(stderr, WL_PROGRAM ": [whitelist] SENT_FOLDER must be a path relative to the home directory\n");
		free(scanner);
		return CLI_EX_CONFIG;
	}
	folder = xasprintf("%s/%s", pw->pw_dir, sent);
	if (pipe(fds) != 0)
	{
		fprintf(stderr, WL_PROGRAM ": pipe: %s\n", strerror(errno));
		free(scanner);
		free(folder);
		return CLI_EX_TEMPFAIL;
	}
	fflush(NULL);
	if ((pid = fork()) < 0)
	{
		fprintf(stderr, WL_PROGRAM ": fork: %s\n", strerror(errno));
		rc = CLI_EX_TEMPFAIL;
		close(fds[0]);
		close(fds[1]);
		goto out;
	}
	if (pid == 0)
	{
		close(fds[0]);
		whitelist_exec_scanner(scanner, folder, max_size, fds[1]);
	}
	close(fds[1]);
	from = fdopen(fds[0], "r");
	while (from && fgets(line, sizeof(line), from))
	{
		line[strcspn(line, "\n")] = '\0';
		if (!whitelist_address_ok(line))
		{
			fprintf(stderr, WL_PROGRAM ": " WL_SCANNER " printed \"%.80s\", which is not an address\n", line);
			rc = CLI_EX_DATAERR;
			continue;
		}
		if (count == WL_SEED_MAX)
		{
			fprintf(stderr, WL_PROGRAM ": %s names more than %d addresses\n", folder, WL_SEED_MAX);
			rc = CLI_EX_DATAERR;
			break;
		}
		if (count == size)
		{
			size = size ? size * 2 : 64;
			lines = xrealloc(lines, size * sizeof(*lines));
		}
		lines[count++] = xstrdup(line);
	}
	if (from)
		fclose(from);
	else
		close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
	{
		fprintf(stderr, WL_PROGRAM ": the scan of %s failed: nothing added\n", folder);
		rc = WIFEXITED(status) && WEXITSTATUS(status) == CLI_EX_DATAERR ? CLI_EX_DATAERR : CLI_EX_TEMPFAIL;
		goto out;
	}
	if (rc != CLI_EX_OK)
	{
		fprintf(stderr, WL_PROGRAM ": nothing added\n");
		goto out;
	}
	res = db_exec(conn, "BEGIN", 0, NULL);
	PQclear(res);
	for (size_t i = 0; i < count && rc == CLI_EX_OK; i++)
	{
		bool changed = false;

		if (strcasecmp(lines[i], owner) == 0)
			continue; /* one's own address is no sender to confirm */
		rc = whitelist_change(conn, true, owner, lines[i], "sent-folder", &changed);
		added += changed;
	}
	res = db_exec(conn, rc == CLI_EX_OK ? "COMMIT" : "ROLLBACK", 0, NULL);
	if (rc == CLI_EX_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		rc = cli_db_exit_code(res, conn);
		cli_db_error(WL_PROGRAM, res, conn);
	}
	PQclear(res);
	if (rc == CLI_EX_OK)
		printf("%s: %zu addresses found in %s, %zu added\n", owner, count, folder, added);
	else
		fprintf(stderr, WL_PROGRAM ": nothing added\n");
out:
	for (size_t i = 0; i < count; i++)
		free(lines[i]);
	free(lines);
	free(scanner);
	free(folder);
	return rc;
}

int
pepsi_whitelist_main(int argc, char **argv)
{
	const char			*config_path = NULL;
	bool				 as_json = false;
	struct pepsi_config *cfg;
	struct passwd		*pw = NULL;
	const char			*command;
	char				*owner;
	char				 err[1024];
	PGconn				*conn;
	int					 nargs;
	int					 rc = CLI_EX_OK;

	privilege_setid_start();
	if (!cli_command_options(argc, argv, whitelist_usage, false, &config_path, &as_json, NULL, &rc))
		return rc;
	command = optind < argc ? argv[optind] : "list";
	nargs = optind < argc ? argc - optind - 1 : 0;
	argv += optind + 1;
	if (strcmp(command, "list") == 0 || strcmp(command, "seed") == 0	? nargs != 0
		: strcmp(command, "add") == 0 || strcmp(command, "remove") == 0 ? nargs < 1
																		: true)
	{
		if (strcmp(command, "list") && strcmp(command, "seed") && strcmp(command, "add") && strcmp(command, "remove"))
			fprintf(stderr, WL_PROGRAM ": unknown command \"%s\"\n", command);
		else
			fprintf(stderr, WL_PROGRAM ": %s takes %s (the list is always your own)\n", command,
					nargs ? "no argument" : "at least one address");
		whitelist_usage(stderr);
		return CLI_EX_USAGE;
	}
	/* Nothing of the caller's environment reaches libpq or the scanner when set-id. */
	config_path = cli_config_path(config_path);
	if (privilege_running_setid())
	{
		config_path = xstrdup(config_path);
		clearenv();
	}
	if ((cfg = privilege_config_load(config_path, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, WL_PROGRAM ": %s\n", err);
		return CLI_EX_CONFIG;
	}
	if ((owner = whitelist_owner(cfg, &pw)) == NULL)
	{
		config_free(cfg);
		return CLI_EX_NOPERM;
	}
	if ((conn = db_connect_as(cfg, WL_SECTION, "CONNINFO", WL_PROGRAM, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, WL_PROGRAM ": %s\n", err);
		free(owner);
		config_free(cfg);
		return CLI_EX_TEMPFAIL;
	}
	if (strcmp(command, "add") == 0 || strcmp(command, "remove") == 0)
		rc = whitelist_add_remove(conn, strcmp(command, "add") == 0, owner, argv, nargs);
	else if (strcmp(command, "seed") == 0)
		rc = whitelist_seed(conn, cfg, owner, pw);
	else
	{
		const char *params[1] = {owner};
		PGresult   *res = db_exec(conn, "SELECT sender, source, added_at FROM pepsi.whitelist_list($1)", 1, params);

		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			rc = cli_db_exit_code(res, conn);
			cli_db_error(WL_PROGRAM, res, conn);
		}
		else
			cli_print(res, as_json);
		PQclear(res);
	}
	PQfinish(conn);
	free(owner);
	config_free(cfg);
	return rc;
}
