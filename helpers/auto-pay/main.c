/*
 * pepsi-helper-auto-pay: runs a user's wallet, as that user, to pay one
 * payment request for pepsi-stage-auto-pay (docs/pepsi-helper-auto-pay.8.md).
 *
 *   pepsi-helper-auto-pay [-c CONFIG] -s SECTION pay PAYMENT-ID SECONDS
 *
 * Installed setuid root, mode 4750, in the group of its caller (the stage
 * runs setgid to that group): only that group can run it, and it checks so
 * again itself.  What it pays is never its caller's to say either: the
 * caller names only a payment that pepsi.auto_pay_reserve recorded pending
 * within its owner's limits, and the helper itself asks the database for
 * it.  It connects over the local socket with peer authentication (which
 * keys off the effective uid: root, which pg_ident.conf maps to a member
 * of pepsi_autopay; SECTION's HELPER_CONNINFO, default [database]
 * CONNINFO) and calls pepsi.auto_pay_claim, which marks the payment
 * claimed, once, and returns its address, amount and URI: a made-up id,
 * one refused (over a limit), finished or claimed already, or one reserved
 * too long ago pays nothing, and the answer says why.  (The other design,
 * a MAC over id, address and amount under a key the helper and the
 * database share, keeps libpq out of this program but cannot say "once"
 * without a state of the helper's own, and puts the key in two places;
 * libpq is the price of asking the one place that knows.)  Nothing of the
 * caller's environment reaches libpq: privilege_sanitize_process empties
 * it first, and the connection string is root's configuration's.
 *
 * Linked to libc, libpq and a few files of common/ only.  What it runs is
 * never its caller's to say: for an address of
 * SYSTEM_DOMAINS (SECTION's, a [stage-*] of pepsi-stage-auto-pay in CONFIG,
 * a file only root can change; default [pepsi] LOCAL_DOMAINS) the wallet
 * is the user's own ~/.pepsi-wallet (the local part is the user name),
 * run as that user, never root, and only when no one else could have
 * written it (a regular file of the user's or root's, not group- or
 * world-writable, in a home directory as safe); for any other address
 * (a virtual user) it is WALLET_DIR/DOMAIN, root's, run as WALLET_USER.
 * The wallet is not a command line from the database: a settings row
 * (which mail to a settings address can write) must not choose what runs
 * as a user.
 *
 * The wallet runs with an empty environment but PEPSI_PAYER (the address),
 * PEPSI_PAYMENT_URI, PEPSI_PAYMENT_AMOUNT and the user's HOME, USER,
 * LOGNAME, PATH, as "WALLET pay URI AMOUNT"; it pays at most AMOUNT (the
 * database checked that against the owner's limits) and prints the proof
 * of payment on its first line.  Killed (its process group) after SECONDS.
 * The answer, on standard output, one line: "paid PROOF", or "failed
 * REASON" (nothing was paid: the payment could not be claimed, no wallet,
 * it failed, it hung, it printed no proof).  Logs go to standard error.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "process/child_run.h"
#include "process/privilege.h"

/* The longest proof a wallet may print (an HMAC, a signature, a receipt id). */
#define AUTO_PAY_MAX_PROOF 512
/* What a wallet's error output may add to the reason of its failure. */
#define AUTO_PAY_MAX_OUTPUT 300
/* The most of a wallet's output read (the rest is dropped). */
#define AUTO_PAY_MAX_WALLET_OUTPUT 4096

int main(int argc, char **argv);

static void
usage(void)
{
	fprintf(stderr, "usage: pepsi-helper-auto-pay [-c CONFIG] -s SECTION pay PAYMENT-ID SECONDS\n"
					"  CONFIG defaults to %s; it must be root's.\n",
			PEPSI_CONFIG_DEFAULT_PATH);
	exit(EX_USAGE);
}

/* The answer's line, kept until the database has recorded it. */
static char auto_pay_answer[2048];

static void auto_pay_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Set the answer (one line, with its newline). */
static void
auto_pay_say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(auto_pay_answer, sizeof(auto_pay_answer) - 1, fmt, ap);
	va_end(ap);
	if (strchr(auto_pay_answer, '\n') == NULL)
		strcat(auto_pay_answer, "\n");
}

/* Printable ASCII only, at most max bytes: what may go on an argument or the answer's line. */
static bool
auto_pay_printable(const char *s, size_t max)
{
	size_t len = strlen(s);

	if (len == 0 || len > max)
		return false;
	for (; *s; s++)
		if ((unsigned char) *s <= 0x20 || (unsigned char) *s >= 0x7f)
			return false;
	return true;
}

/* A user name as useradd makes them; anything else never reaches getpwnam. */
static bool
auto_pay_user_name_ok(const char *name, size_t len)
{
	if (len == 0 || len > 32 || !(islower((unsigned char) name[0]) || name[0] == '_'))
		return false;
	for (size_t i = 0; i < len; i++)
		if (!(islower((unsigned char) name[i]) || isdigit((unsigned char) name[i]) || strchr("_.-", name[i])))
			return false;
	return true;
}

/* A domain that names a file of WALLET_DIR: letters, digits, '-' and '.' not first. */
static bool
auto_pay_domain_ok(const char *d)
{
	if (d[0] == '\0' || d[0] == '.' || d[0] == '-' || strlen(d) > 253)
		return false;
	for (; *d; d++)
		if (!(isalnum((unsigned char) *d) || *d == '-' || *d == '.'))
			return false;
	return true;
}

/*
 * May the wallet at path run: a regular, executable file of owner's or
 * root's that no one else may write, in a directory as safe?  Checked
 * with the ids that will run it.  NULL, or why not.
 */
static const char *
auto_pay_wallet_refusal(const char *path, uid_t owner)
{
	static char why[512];
	struct stat st;
	char	   *dir = xstrdup(path);
	char	   *slash = strrchr(dir, '/');

	*slash = '\0';
	why[0] = '\0';
	if (stat(dir[0] ? dir : "/", &st) != 0)
		snprintf(why, sizeof(why), "%s: %s", dir, strerror(errno));
	else if ((st.st_uid != owner && st.st_uid != 0) || (st.st_mode & (S_IWGRP | S_IWOTH)))
		snprintf(why, sizeof(why), "%s may be written by others than its owner", dir);
	else if (lstat(path, &st) != 0)
		snprintf(why, sizeof(why), "no wallet (%s: %s)", path, strerror(errno));
	else if (!S_ISREG(st.st_mode))
		snprintf(why, sizeof(why), "%s is not a regular file", path);
	else if (st.st_uid != owner && st.st_uid != 0)
		snprintf(why, sizeof(why), "%s is owned by uid %ld", path, (long) st.st_uid);
	else if (st.st_mode & (S_IWGRP | S_IWOTH))
		snprintf(why, sizeof(why), "%s is group- or world-writable (mode %04o)", path,
				 (unsigned) (st.st_mode & 07777));
	else if (access(path, X_OK) != 0)
		snprintf(why, sizeof(why), "%s is not executable", path);
	free(dir);
	return why[0] ? why : NULL;
}

/* What the wallet's child runs: the wallet, as "WALLET pay URI AMOUNT", in the user's home. */
struct auto_pay_exec
{
	const struct passwd *pw;
	const char			*wallet;
	const char			*uri;
	const char			*amount;
	char			   **env;
};

static void
auto_pay_exec(void *arg)
{
	const struct auto_pay_exec *x = arg;

	if (chdir(x->pw->pw_dir) != 0 && chdir("/") != 0)
		_exit(EX_TEMPFAIL);
	execle(x->wallet, "pepsi-wallet", "pay", x->uri, x->amount, (char *) NULL, x->env);
	_exit(EX_OSERR);
}

/* The wallet's output: its first line is the proof, what follows may add to a failure's reason. */
static void
auto_pay_split_output(const char *output, char *proof, char *more)
{
	size_t kept = 0;
	size_t extra = 0;
	bool   first = true;

	for (const char *p = output; *p; p++)
	{
		char c = (unsigned char) *p < 0x20 || *p == 0x7f ? ' ' : *p;

		if (first && *p == '\n')
			first = false;
		else if (first && kept < AUTO_PAY_MAX_PROOF)
			proof[kept++] = c;
		else if (!first && extra < AUTO_PAY_MAX_OUTPUT)
			more[extra++] = c;
	}
	proof[kept] = '\0';
	more[extra] = '\0';
	while (kept > 0 && proof[kept - 1] == ' ')
		proof[--kept] = '\0';
}

/* Run wallet as pw (already become) and print the answer. */
static void
auto_pay_run(const struct passwd *pw, const char *wallet, const char *address, long seconds, const char *amount,
			 const char *uri)
{
	const char *const	 pairs[] = {"HOME", pw->pw_dir, "USER", pw->pw_name, "LOGNAME", pw->pw_name,
									"PATH", "/usr/bin:/bin", "PEPSI_PAYER", address, "PEPSI_PAYMENT_URI", uri,
									"PEPSI_PAYMENT_AMOUNT", amount, NULL};
	struct auto_pay_exec x = {pw, wallet, uri, amount, privilege_clean_env(pairs)};
	struct child_spec	 spec = {auto_pay_exec, &x, (long long) seconds * 1000, AUTO_PAY_MAX_WALLET_OUTPUT, NULL, 0};
	struct child_result	 r;
	char				 proof[AUTO_PAY_MAX_PROOF + 1];
	char				 more[AUTO_PAY_MAX_OUTPUT + 1];
	char				 err[256];

	if (!child_run(&spec, &r, err, sizeof(err)))
	{
		auto_pay_say("failed %s\n", err);
		return;
	}
	auto_pay_split_output(r.output, proof, more);
	if (r.end == CHILD_TIMED_OUT)
		auto_pay_say("failed the wallet ran longer than %ld s and was killed\n", seconds);
	else if (r.end == CHILD_SIGNALED)
		auto_pay_say("failed the wallet was killed by signal %d\n", r.code);
	else if (r.code != 0)
		auto_pay_say("failed the wallet exited with status %d%s%s%s%s\n", r.code, proof[0] ? ": " : "", proof,
					 more[0] ? " " : "", more);
	else if (!auto_pay_printable(proof, AUTO_PAY_MAX_PROOF))
		auto_pay_say("failed the wallet printed no proof of payment (one line of printable characters)\n");
	else
		auto_pay_say("paid %s\n", proof);
	child_result_free(&r);
}

/*
 * Root's CONFIG, after checking that only root could have written it:
 * NULL with why otherwise.
 */
static struct pepsi_config *
auto_pay_config(const char *config_path, char *why, size_t whylen)
{
	struct pepsi_config *cfg;
	char				 err[768] = "";

	if (getuid() != 0 && !privilege_path_trusted(config_path, geteuid() == 0 ? 0 : getuid(), err, sizeof(err)))
	{
		snprintf(why, whylen, "refusing the configuration: %s", err);
		return NULL;
	}
	if ((cfg = config_load(config_path, err, sizeof(err))) == NULL)
		snprintf(why, whylen, "%s", err);
	return cfg;
}

/*
 * Claim payment id from the database (pepsi.auto_pay_claim, as the
 * helper's own role): its address, amount and URI (allocated), or false
 * with the reason in why.
 */
static bool
auto_pay_claim(const struct pepsi_config *cfg, const char *section, const char *id, PGconn **connp,
			   char **address, char **amount, char **uri, char *why, size_t whylen)
{
	const char *conninfo = config_get(cfg, section, "HELPER_CONNINFO");
	const char *keywords[] = {"dbname", "application_name", NULL};
	const char *values[] = {NULL, "pepsi-helper-auto-pay", NULL};
	const char *params[1] = {id};
	PGconn	   *conn;
	PGresult   *res;
	bool		ok = false;

	if (conninfo == NULL)
		conninfo = config_get(cfg, "database", "CONNINFO");
	if (conninfo == NULL)
	{
		snprintf(why, whylen, "[%s] HELPER_CONNINFO (or [database] CONNINFO) is not set", section);
		return false;
	}
	values[0] = conninfo;
	conn = PQconnectdbParams(keywords, values, 1);
	if (conn == NULL || PQstatus(conn) != CONNECTION_OK)
	{
		snprintf(why, whylen, "cannot connect to the database as [%s] HELPER_CONNINFO says: %s", section,
				 conn ? PQerrorMessage(conn) : "out of memory");
		why[strcspn(why, "\n")] = '\0';
		PQfinish(conn);
		return false;
	}
	res = PQexecParams(conn,
					   "SELECT r->>'pay', r->>'why', r->>'address', r->>'amount', r->>'uri'"
					   " FROM pepsi.auto_pay_claim($1::bigint) AS r",
					   1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 || PQnfields(res) != 5)
		snprintf(why, whylen, "cannot claim payment %s: %s", id, PQerrorMessage(conn));
	else if (strcmp(PQgetvalue(res, 0, 0), "true") != 0)
		snprintf(why, whylen, "refused: %s", PQgetvalue(res, 0, 1));
	else
	{
		*address = xstrdup(PQgetvalue(res, 0, 2));
		*amount = xstrdup(PQgetvalue(res, 0, 3));
		*uri = xstrdup(PQgetvalue(res, 0, 4));
		ok = true;
	}
	why[strcspn(why, "\n")] = '\0';
	PQclear(res);
	if (ok)
		*connp = conn;
	else
		PQfinish(conn);
	return ok;
}

/*
 * Record what became of claimed payment id, the answer (pepsi.auto_pay_settle),
 * on the connection that claimed it, and close it.  Here rather than by
 * the stage: only the helper knows what the wallet did, and a payment
 * claimed is the helper's to settle, so no caller (the stage, or another
 * member of the group that claimed it first) can record a payment made
 * as failed, which would free its amount under the limits again.  Should
 * this fail, the payment stays pending: it counts against the limits and
 * is never claimed again.
 */
static void
auto_pay_settle(PGconn *conn, const char *id)
{
	bool		paid = strncmp(auto_pay_answer, "paid ", 5) == 0;
	char		reason[sizeof(auto_pay_answer)];
	const char *params[3] = {id, paid ? "paid" : "failed", paid ? NULL : reason};
	PGresult   *res;

	snprintf(reason, sizeof(reason), "%s", strncmp(auto_pay_answer, "failed ", 7) == 0 ? auto_pay_answer + 7 : "");
	reason[strcspn(reason, "\n")] = '\0';
	res = PQexecParams(conn, "SELECT pepsi.auto_pay_settle($1::bigint, $2, $3)", 3, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_warnx("payment %s: cannot record that it %s: %s", id, paid ? "was paid" : "failed",
				  PQerrorMessage(conn));
	PQclear(res);
	PQfinish(conn);
}

/*
 * Whose wallet pays for address, from SECTION of root's cfg: *pw and
 * the wallet's path (allocated), or false with the answer's reason.
 */
static bool
auto_pay_wallet_of(const struct pepsi_config *cfg, const char *section, const char *address, struct passwd **pw,
				   char **wallet, char *why, size_t whylen)
{
	const char *at = strrchr(address, '@');
	const char *system_domains;
	bool		ok = false;

	system_domains = config_get(cfg, section, "SYSTEM_DOMAINS");
	if (system_domains == NULL)
		system_domains = config_get(cfg, "pepsi", "LOCAL_DOMAINS");
	*pw = NULL;
	if (system_domains && config_list_contains(system_domains, at + 1))
	{
		char *user = xstrndup(address, (size_t) (at - address));

		for (char *p = user; *p; p++)
			*p = (char) tolower((unsigned char) *p);
		if (!auto_pay_user_name_ok(user, strlen(user)) || (*pw = getpwnam(user)) == NULL)
			snprintf(why, whylen, "no system user %s (SYSTEM_DOMAINS names %s)", user, at + 1);
		else if ((*pw)->pw_uid == 0)
			snprintf(why, whylen, "a wallet never runs as root");
		else
		{
			*wallet = xasprintf("%s/.pepsi-wallet", (*pw)->pw_dir);
			ok = true;
		}
		free(user);
	}
	else
	{
		const char *user = config_get(cfg, section, "WALLET_USER");
		const char *dir = config_get(cfg, section, "WALLET_DIR");

		if (user == NULL || (*pw = getpwnam(user)) == NULL || (*pw)->pw_uid == 0)
			snprintf(why, whylen, "%s is a virtual domain and [%s] WALLET_USER names no user (not root)", at + 1,
					 section);
		else if (!auto_pay_domain_ok(at + 1))
			snprintf(why, whylen, "%s is not a domain", at + 1);
		else
		{
			const char *refusal;

			*wallet = xasprintf("%s/%s", dir ? dir : "/etc/pepsi/wallet.d", at + 1);
			/* Root's file, checked as root: WALLET_USER may not change it. */
			if ((refusal = auto_pay_wallet_refusal(*wallet, 0)) != NULL)
			{
				snprintf(why, whylen, "%s", refusal);
				free(*wallet);
			}
			else
				ok = true;
		}
	}
	return ok;
}

/* Is section of cfg one of pepsi-stage-auto-pay's? */
static bool
auto_pay_section_ok(const struct pepsi_config *cfg, const char *section)
{
	const char *program = config_get(cfg, section, "PROGRAM");

	return strncmp(section, "stage-", 6) == 0 && program != NULL
		   && strcmp(strrchr(program, '/') ? strrchr(program, '/') + 1 : program, "pepsi-stage-auto-pay") == 0;
}

/* The payment's answer: what to pay, whose wallet, then the wallet run as its user. */
static void
auto_pay_pay(const char *config_path, const char *section, const char *id, long seconds)
{
	struct pepsi_config *cfg;
	struct passwd		*pw;
	const char			*refusal;
	char				*wallet = NULL;
	char				*address = NULL;
	char				*amount = NULL;
	char				*uri = NULL;
	PGconn				*conn = NULL;
	char				 why[1024];
	char				 err[256];

	if ((cfg = auto_pay_config(config_path, why, sizeof(why))) == NULL)
	{
		printf("failed %s\n", why);
		return;
	}
	if (!auto_pay_section_ok(cfg, section))
		auto_pay_say("failed %s: [%s] is not a section of pepsi-stage-auto-pay\n", config_path, section);
	else if (!auto_pay_claim(cfg, section, id, &conn, &address, &amount, &uri, why, sizeof(why)))
		auto_pay_say("failed %s\n", why);
	/* The database's values, which mail wrote in part: checked as an argument was. */
	else if (!auto_pay_printable(address, 320) || strchr(address, '@') == NULL || strchr(address, '/') != NULL)
		auto_pay_say("failed payment %s: \"%s\" is not an address\n", id, address);
	else if (!auto_pay_printable(amount, 64) || !auto_pay_printable(uri, 2048))
		auto_pay_say("failed payment %s: its amount or URI is empty, too long, or has a space or control character\n",
					 id);
	else if (!auto_pay_wallet_of(cfg, section, address, &pw, &wallet, why, sizeof(why)))
		auto_pay_say("failed %s\n", why);
	/* From here on we are the wallet's user: nothing of theirs is opened as root. */
	else if (!privilege_become(pw->pw_name, pw->pw_uid, pw->pw_gid, "/", err, sizeof(err)))
	{
		if (geteuid() == 0)
			fatalx("becoming %s: %s", pw->pw_name, err);
		auto_pay_say("failed cannot act as %s: %s (the helper is not set-user-id root)\n", pw->pw_name, err);
	}
	else if ((refusal = auto_pay_wallet_refusal(wallet, pw->pw_uid)) != NULL)
		auto_pay_say("failed %s\n", refusal);
	else
		auto_pay_run(pw, wallet, address, seconds, amount, uri);
	if (conn)
		auto_pay_settle(conn, id);
	fputs(auto_pay_answer, stdout);
	free(wallet);
	free(address);
	free(amount);
	free(uri);
	config_free(cfg);
}

int
main(int argc, char **argv)
{
	const char *config_path = PEPSI_CONFIG_DEFAULT_PATH;
	const char *section = NULL;
	char	   *end;
	char		err[256];
	long long	id;
	long		seconds;
	int			opt;

	privilege_sanitize_process();
	log_init("pepsi-helper-auto-pay", false);
	while ((opt = getopt(argc, argv, "+c:s:")) != -1)
		switch (opt)
		{
			case 'c':
				config_path = optarg;
				break;
			case 's':
				section = optarg;
				break;
			default:
				usage();
		}
	argc -= optind - 1;
	argv += optind - 1;
	if (argc != 4 || section == NULL || strcmp(argv[1], "pay") != 0)
		usage();
	/* Setuid: only the stage's group may ask (mode 4750 says so too). */
	if (geteuid() == 0 && getuid() != 0)
	{
		gid_t group;

		if (!privilege_own_group(&group, err, sizeof(err)))
			fatalx("%s", err);
		if (!privilege_caller_in_group(group))
			fatalx("refused: uid %ld is not of group %ld, which this helper serves", (long) getuid(), (long) group);
	}
	errno = 0;
	id = strtoll(argv[2], &end, 10);
	if (!isdigit((unsigned char) argv[2][0]) || *end || errno || id <= 0)
		fatalx("refused: \"%.40s\" is not a payment id (a positive number)", argv[2]);
	seconds = strtol(argv[3], &end, 10);
	if (*end || seconds <= 0 || seconds > 3600)
		fatalx("refused: \"%.40s\" is not a number of seconds (1 to 3600)", argv[3]);
	auto_pay_pay(config_path, section, argv[2], seconds);
	return fflush(stdout) == 0 ? 0 : EX_IOERR;
}
