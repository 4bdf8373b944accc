/*
 * pepsi-helper-dot-forward: reads a user's ~/.forward as that user, and
 * runs the commands and writes the files it names as that user, for
 * pepsi-stage-dot-forward (docs/pepsi-stage-dot-forward.8.md).
 *
 * Installed setuid root, mode 4750, in the group of its caller (the stage
 * runs setgid to that group): only that group can run it, and it checks so
 * again itself.  It is a standalone program linked to nothing but libc and
 * three files of common/ (spec 22.2: a symlink to the multi-call binary
 * could not carry the bit without lending it to every program).  It
 * becomes the user before it opens any file of theirs, and does only what
 * the user's own .forward says: a command or a file is run or written
 * only if it is an entry of that .forward, read again for the purpose.
 *
 *   pepsi-helper-dot-forward read USER
 *   pepsi-helper-dot-forward -c CONFIG -s SECTION pipe USER SENDER RECIPIENT SECONDS COMMAND  < message
 *   pepsi-helper-dot-forward -c CONFIG -s SECTION file USER SENDER RECIPIENT PATH             < message
 *
 * A command or a file also needs the stage's own permission, read by the
 * helper itself: ALLOW_FORWARD_PIPES or ALLOW_FORWARD_FILES of SECTION, a
 * [stage-*] of pepsi-stage-dot-forward in CONFIG (default
 * /etc/pepsi/pepsi.conf), a file only root can change (without the bit:
 * root or the caller).  It starts with nothing of its caller's: no
 * environment, no descriptor but the standard ones, its own umask,
 * signal actions and resource limits (privilege_sanitize_process).
 *
 * The answer is on standard output.  read: "nouser", "none" (no
 * .forward), "ignored REASON" (one that is not safe to use, as sendmail
 * would ignore it), "temporary REASON", or "forward" followed by one line
 * per entry ("address A", "local USER", "pipe COMMAND", "file PATH", "bad
 * LINE REASON"), the entries of ":include:" files in place of their lines.  pipe and file: "ok", "temporary REASON" or "permanent
 * REASON".  The message comes with LF line ends.  Logs go to standard
 * error.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "forward_file.h"
#include "process/child_run.h"
#include "process/privilege.h"

/* A larger .forward is not a list of addresses. */
#define HELPER_MAX_FORWARD_SIZE 65536
/* What a command's output may add to the reason of its failure. */
#define HELPER_MAX_OUTPUT 400

int main(int argc, char **argv);

static void
usage(void)
{
	fprintf(stderr, "usage: pepsi-helper-dot-forward read USER\n"
					"       pepsi-helper-dot-forward [-c CONFIG] -s SECTION pipe USER SENDER RECIPIENT SECONDS COMMAND\n"
					"       pepsi-helper-dot-forward [-c CONFIG] -s SECTION file USER SENDER RECIPIENT PATH\n"
					"  CONFIG defaults to %s; it must be root's.\n",
			PEPSI_CONFIG_DEFAULT_PATH);
	exit(EX_USAGE);
}

/* A user name as useradd makes them; anything else never reaches getpwnam. */
static bool
helper_user_name_ok(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > 32 || !(islower((unsigned char) name[0]) || name[0] == '_'))
		return false;
	for (size_t i = 0; i < len; i++)
		if (!(islower((unsigned char) name[i]) || isdigit((unsigned char) name[i])
			  || strchr("_.-", name[i])))
			return false;
	return true;
}

static bool
helper_one_line(const char *s)
{
	for (; *s; s++)
		if ((unsigned char) *s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

/*
 * Read the file at path (called what in reasons) as pw, with the checks a
 * .forward gets: no symbolic link, a regular file of pw's or root's that
 * no one else may write, at most HELPER_MAX_FORWARD_SIZE bytes.  Returns
 * "forward" with *text (NUL-terminated), *len and *st, or the status word
 * ("none", "ignored", "temporary") with why.
 */
static const char *
helper_read_checked(const struct passwd *pw, const char *path, const char *what, struct stat *st,
					char **text, size_t *len, char *why, size_t whylen)
{
	int		fd;
	ssize_t n;

	*text = NULL;
	*len = 0;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
	{
		int saved = errno;

		if (saved == ENOENT || saved == ENOTDIR)
		{
			snprintf(why, whylen, "%s does not exist", what);
			return "none";
		}
		snprintf(why, whylen, "%s %s", what, saved == ELOOP ? "is a symbolic link" : strerror(saved));
		return saved == ELOOP || saved == EACCES ? "ignored" : "temporary";
	}
	if (fstat(fd, st) != 0)
	{
		snprintf(why, whylen, "fstat %s: %s", what, strerror(errno));
		close(fd);
		return "temporary";
	}
	if (!S_ISREG(st->st_mode))
		snprintf(why, whylen, "%s is not a regular file", what);
	else if (st->st_uid != pw->pw_uid && st->st_uid != 0)
		snprintf(why, whylen, "%s is owned by uid %ld, not by %s", what, (long) st->st_uid, pw->pw_name);
	else if (st->st_mode & (S_IWGRP | S_IWOTH))
		snprintf(why, whylen, "%s is group- or world-writable (mode %04o)", what,
				 (unsigned) (st->st_mode & 07777));
	else if (st->st_size > HELPER_MAX_FORWARD_SIZE)
		snprintf(why, whylen, "%s is larger than %d bytes", what, HELPER_MAX_FORWARD_SIZE);
	else
		why[0] = '\0';
	if (why[0])
	{
		close(fd);
		return "ignored";
	}
	*text = xmalloc(HELPER_MAX_FORWARD_SIZE + 1);
	while (*len <= HELPER_MAX_FORWARD_SIZE
		   && (n = read(fd, *text + *len, HELPER_MAX_FORWARD_SIZE + 1 - *len)) != 0)
	{
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
		{
			snprintf(why, whylen, "reading %s: %s", what, strerror(errno));
			free(*text);
			*text = NULL;
			close(fd);
			return "temporary";
		}
		*len += (size_t) n;
	}
	close(fd);
	if (*len > HELPER_MAX_FORWARD_SIZE)
	{
		snprintf(why, whylen, "%s is larger than %d bytes", what, HELPER_MAX_FORWARD_SIZE);
		free(*text);
		*text = NULL;
		return "ignored";
	}
	(*text)[*len] = '\0';
	return "forward";
}

/* The files being read, the .forward first: an :include: of one of them is a loop. */
struct helper_include_chain
{
	dev_t dev[FORWARD_MAX_INCLUDE_DEPTH + 1];
	ino_t ino[FORWARD_MAX_INCLUDE_DEPTH + 1];
	int	  depth; /* files in the chain */
};

/*
 * Is the directory of an :include: file one only pw or root can change
 * (or sticky, as /tmp)?  Else someone else could put another file there.
 */
static bool
helper_include_dir_safe(const struct passwd *pw, const char *path, char *why, size_t whylen)
{
	const char *slash = strrchr(path, '/');
	char	   *dir = xstrndup(path, slash == path ? 1 : (size_t) (slash - path));
	struct stat st;
	bool		ok = false;

	if (stat(dir, &st) != 0)
		snprintf(why, whylen, "its directory %s: %s", dir, strerror(errno));
	else if (st.st_uid != pw->pw_uid && st.st_uid != 0)
		snprintf(why, whylen, "its directory %s is owned by another user", dir);
	else if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
		snprintf(why, whylen, "its directory %s is group- or world-writable", dir);
	else
		ok = true;
	free(dir);
	return ok;
}

static const char *helper_expand_includes(const struct passwd *pw, struct forward_list *list,
										  struct helper_include_chain *chain, char *why, size_t whylen);

/*
 * The entries of the :include: file of entry e (line: of the .forward)
 * added to out; false (why set) when it cannot be read now, which makes
 * the whole .forward wait.  A file that is unsafe, missing, a loop or too
 * deep is a bad entry: logged and skipped, as a bad line is.
 */
static bool
helper_include(const struct passwd *pw, const struct forward_entry *e, int line,
			   struct helper_include_chain *chain, struct forward_list *out, char *why, size_t whylen)
{
	struct forward_list included;
	struct stat			st;
	char				problem[512] = "";
	char			   *text;
	size_t				len;
	const char		   *status;
	char				dir_problem[400];
	char			   *what = xasprintf(":include:%s", e->value);

	if (chain->depth > FORWARD_MAX_INCLUDE_DEPTH)
		snprintf(problem, sizeof(problem), "%s is more than %d :include: files deep", what,
				 FORWARD_MAX_INCLUDE_DEPTH);
	else if (!helper_include_dir_safe(pw, e->value, dir_problem, sizeof(dir_problem)))
		snprintf(problem, sizeof(problem), "%s: %s", what, dir_problem);
	if (problem[0])
	{
		forward_list_append(out, FORWARD_BAD, line, xasprintf("%s: ignored", problem));
		free(what);
		return true;
	}
	status = helper_read_checked(pw, e->value, what, &st, &text, &len, problem, sizeof(problem));
	if (strcmp(status, "temporary") == 0)
	{
		snprintf(why, whylen, "%s", problem);
		free(what);
		return false;
	}
	if (strcmp(status, "forward") != 0)
	{
		forward_list_append(out, FORWARD_BAD, line, xasprintf("%s: ignored", problem));
		free(what);
		return true;
	}
	for (int i = 0; i < chain->depth; i++)
		if (chain->dev[i] == st.st_dev && chain->ino[i] == st.st_ino)
		{
			forward_list_append(out, FORWARD_BAD, line,
								xasprintf("%s is an :include: loop (that file is being read already)", what));
			free(text);
			free(what);
			return true;
		}
	forward_parse(text, len, &included);
	free(text);
	chain->dev[chain->depth] = st.st_dev;
	chain->ino[chain->depth] = st.st_ino;
	chain->depth++;
	status = helper_expand_includes(pw, &included, chain, why, whylen);
	chain->depth--;
	if (strcmp(status, "forward") != 0)
	{
		forward_list_free(&included);
		free(what);
		return false;
	}
	/* Its entries stand for the :include: line; its bad lines say where they are. */
	for (size_t i = 0; i < included.count; i++)
	{
		struct forward_entry *in = &included.entries[i];

		if (in->kind == FORWARD_BAD)
		{
			forward_list_append(out, FORWARD_BAD, line,
								in->line > 0 ? xasprintf("%s line %d %s", what, in->line, in->value)
											 : xstrdup(in->value));
			free(in->value);
		}
		else
			forward_list_append(out, in->kind, line, in->value);
		in->value = NULL;
	}
	forward_list_free(&included);
	free(what);
	return true;
}

/*
 * Replace every :include: entry of list by the entries of its file, read
 * as pw with a .forward's checks, FORWARD_MAX_INCLUDE_DEPTH deep at most.
 * "forward", or "temporary" with why.
 */
static const char *
helper_expand_includes(const struct passwd *pw, struct forward_list *list, struct helper_include_chain *chain,
					   char *why, size_t whylen)
{
	struct forward_list out = {0};
	bool				ok = true;

	for (size_t i = 0; i < list->count; i++)
	{
		struct forward_entry *e = &list->entries[i];

		if (e->kind != FORWARD_INCLUDE)
		{
			forward_list_append(&out, e->kind, e->line, e->value);
			e->value = NULL;
		}
		else if (ok)
			ok = helper_include(pw, e, e->line, chain, &out, why, whylen);
	}
	forward_list_free(list);
	*list = out;
	return ok ? "forward" : "temporary";
}

/*
 * The .forward of pw, read as pw (the caller has become pw), its
 * :include: files expanded.  Returns the status word and sets *why or
 * fills list.
 */
static const char *
helper_read_forward(const struct passwd *pw, struct forward_list *list, char *why, size_t whylen)
{
	struct helper_include_chain chain = {0};
	struct stat					st;
	const char				   *status;
	char					   *path;
	char					   *text;
	size_t						len;

	list->entries = NULL;
	list->count = 0;
	if (stat(pw->pw_dir, &st) != 0)
	{
		if (errno == ENOENT || errno == ENOTDIR)
			return "none";
		snprintf(why, whylen, "home directory %s: %s", pw->pw_dir, strerror(errno));
		return errno == EACCES ? "ignored" : "temporary";
	}
	/* Someone else who can write the directory could put a .forward there. */
	if ((st.st_uid != pw->pw_uid && st.st_uid != 0) || (st.st_mode & (S_IWGRP | S_IWOTH)))
	{
		snprintf(why, whylen, "home directory %s is %s", pw->pw_dir,
				 st.st_uid != pw->pw_uid && st.st_uid != 0 ? "owned by another user"
														   : "group- or world-writable");
		return "ignored";
	}
	path = xasprintf("%s/.forward", pw->pw_dir);
	status = helper_read_checked(pw, path, ".forward", &st, &text, &len, why, whylen);
	free(path);
	if (strcmp(status, "forward") != 0)
		return status;
	forward_parse(text, len, list);
	free(text);
	chain.dev[0] = st.st_dev;
	chain.ino[0] = st.st_ino;
	chain.depth = 1;
	status = helper_expand_includes(pw, list, &chain, why, whylen);
	if (strcmp(status, "forward") != 0)
		forward_list_free(list);
	return status;
}

/* Is value an entry of that kind in the list (the user asked for it)? */
static bool
helper_listed(const struct forward_list *list, enum forward_kind kind, const char *value)
{
	for (size_t i = 0; i < list->count; i++)
		if (list->entries[i].kind == kind && strcmp(list->entries[i].value, value) == 0)
			return true;
	return false;
}

/* What a pipe's child runs: the command, through /bin/sh, in the user's home, the message on its stdin. */
struct helper_exec
{
	const struct passwd *pw;
	const char			*command;
	char			   **env;
};

static void
helper_exec(void *arg)
{
	const struct helper_exec *x = arg;

	if (chdir(x->pw->pw_dir) != 0 && chdir("/") != 0)
		_exit(EX_TEMPFAIL);
	execle("/bin/sh", "sh", "-c", x->command, (char *) NULL, x->env);
	_exit(EX_OSERR);
}

/* Run command as pw (already become) with the message on our stdin. */
static void
helper_pipe(const struct passwd *pw, const char *sender, const char *recipient, long seconds,
			const char *command)
{
	const char *const	pairs[] = {"HOME", pw->pw_dir, "USER", pw->pw_name, "LOGNAME", pw->pw_name,
								   "SHELL", "/bin/sh", "PATH", "/usr/bin:/bin", "SENDER", sender,
								   "RECIPIENT", recipient, NULL};
	struct helper_exec	x = {pw, command, privilege_clean_env(pairs)};
	struct child_spec	spec = {helper_exec, &x, (long long) seconds * 1000, HELPER_MAX_OUTPUT, NULL, 0};
	struct child_result r;
	char				err[256];
	size_t				kept;

	if (!child_run(&spec, &r, err, sizeof(err)))
	{
		printf("temporary %s\n", err);
		return;
	}
	/* Its output is only ever a line of the answer: printable, no trailing space. */
	for (size_t i = 0; i < r.len; i++)
		if ((unsigned char) r.output[i] < 0x20 || r.output[i] == 0x7f)
			r.output[i] = ' ';
	kept = strlen(r.output);
	while (kept > 0 && r.output[kept - 1] == ' ')
		r.output[--kept] = '\0';
	if (r.end == CHILD_TIMED_OUT)
		printf("temporary the command ran longer than %ld s and was killed\n", seconds);
	else if (r.end == CHILD_EXITED && r.code == 0)
		printf("ok\n");
	else if (r.end == CHILD_EXITED && r.code == EX_TEMPFAIL)
		printf("temporary the command exited with status 75 (EX_TEMPFAIL)%s%s\n", kept ? ": " : "", r.output);
	else if (r.end == CHILD_EXITED)
		printf("permanent the command exited with status %d%s%s\n", r.code, kept ? ": " : "", r.output);
	else
		printf("temporary the command was killed by signal %d\n", r.code);
	child_result_free(&r);
}

/* Append the message on stdin to path as an mbox message (mboxrd quoting). */
static void
helper_file(const char *sender, const char *path)
{
	struct stat st;
	FILE	   *in = stdin;
	FILE	   *out;
	char	   *line = NULL;
	size_t		cap = 0;
	ssize_t		n;
	time_t		now = time(NULL);
	char		date[64];
	int			fd;
	bool		ok = true;

	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
	if (fd < 0)
	{
		printf("%s %s: %s\n", errno == ELOOP ? "permanent" : "temporary", path,
			   errno == ELOOP ? "is a symbolic link" : strerror(errno));
		return;
	}
	if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)))
	{
		printf("permanent %s is not a regular file\n", path);
		close(fd);
		return;
	}
	if (S_ISREG(st.st_mode) && flock(fd, LOCK_EX) != 0)
	{
		printf("temporary locking %s: %s\n", path, strerror(errno));
		close(fd);
		return;
	}
	if ((out = fdopen(fd, "a")) == NULL)
	{
		printf("temporary %s: %s\n", path, strerror(errno));
		close(fd);
		return;
	}
	strftime(date, sizeof(date), "%a %b %e %H:%M:%S %Y", gmtime(&now));
	fprintf(out, "From %s %s\n", sender[0] ? sender : "MAILER-DAEMON", date);
	while ((n = getline(&line, &cap, in)) > 0)
	{
		const char *p = line;

		while (*p == '>')
			p++;
		if (strncmp(p, "From ", 5) == 0)
			fputc('>', out);
		fwrite(line, 1, (size_t) n, out);
	}
	free(line);
	fputc('\n', out);
	if (fflush(out) != 0 || (S_ISREG(st.st_mode) && fsync(fd) != 0))
		ok = false;
	if (!ok)
	{
		int saved = errno;

		/* Nothing half-written: the file is cut back to where it was. */
		if (S_ISREG(st.st_mode) && ftruncate(fd, st.st_size) != 0)
			log_warn("%s: cannot cut back a partial message", path);
		printf("temporary writing %s: %s\n", path, strerror(saved));
	}
	else
		printf("ok\n");
	fclose(out);
}

/*
 * May the stage run commands (pipe) or write files?  Its section in the
 * configuration says so, read here from a file the caller cannot have
 * written: the stage's own check is not the only one.  NULL when it may,
 * else the refusal, naming the option.
 */
static const char *
helper_refusal(const char *config_path, const char *section, bool pipe)
{
	static char			 refusal[1024];
	const char			*option = pipe ? "ALLOW_FORWARD_PIPES" : "ALLOW_FORWARD_FILES";
	struct pepsi_config *cfg;
	const char			*program;
	char				 why[768] = "";
	bool				 allowed;

	if (getuid() != 0 && !privilege_path_trusted(config_path, geteuid() == 0 ? 0 : getuid(), why, sizeof(why)))
	{
		snprintf(refusal, sizeof(refusal), "refusing the configuration for %s: %s", option, why);
		return refusal;
	}
	if ((cfg = config_load(config_path, why, sizeof(why))) == NULL)
	{
		snprintf(refusal, sizeof(refusal), "%s (reading %s)", why, option);
		return refusal;
	}
	program = section ? config_get(cfg, section, "PROGRAM") : NULL;
	if (section == NULL || strncmp(section, "stage-", 6) != 0 || program == NULL
		|| strcmp(strrchr(program, '/') ? strrchr(program, '/') + 1 : program, "pepsi-stage-dot-forward") != 0)
	{
		snprintf(refusal, sizeof(refusal), "%s: [%s] is not a section of pepsi-stage-dot-forward (for %s)",
				 config_path, section ? section : "", option);
		config_free(cfg);
		return refusal;
	}
	allowed = config_bool(cfg, section, option);
	if (!allowed)
		snprintf(refusal, sizeof(refusal), "mail to %s is not allowed here: %s is off in [%s] of %s",
				 pipe ? "commands" : "files", option, section, config_path);
	config_free(cfg);
	return allowed ? NULL : refusal;
}

int
main(int argc, char **argv)
{
	struct forward_list list;
	struct passwd	   *pw;
	const char		   *mode;
	const char		   *status;
	const char		   *config_path = PEPSI_CONFIG_DEFAULT_PATH;
	const char		   *section = NULL;
	const char		   *refusal;
	char				why[512];
	char				err[256];
	int					opt;

	privilege_sanitize_process();
	log_init("pepsi-helper-dot-forward", false);
	/* "+": the options come first; a command or an address that starts with "-" is an operand. */
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
	if (argc < 3)
		usage();
	mode = argv[1];
	if (!((strcmp(mode, "read") == 0 && argc == 3) || (strcmp(mode, "pipe") == 0 && argc == 7)
		  || (strcmp(mode, "file") == 0 && argc == 6)))
		usage();
	/* Setuid: only the stage's group may ask (mode 4750 says so too). */
	if (geteuid() == 0 && getuid() != 0)
	{
		gid_t group;

		if (!privilege_own_group(&group, err, sizeof(err)))
			fatalx("%s", err);
		if (!privilege_caller_in_group(group))
			fatalx("refused: uid %ld is not of group %ld, which this helper serves",
				   (long) getuid(), (long) group);
	}
	if (!helper_user_name_ok(argv[2]))
		fatalx("refused: \"%s\" is not a user name", argv[2]);
	for (int i = 3; i < argc; i++)
		if (!helper_one_line(argv[i]))
			fatalx("refused: argument %d has a control character", i);
	if ((pw = getpwnam(argv[2])) == NULL)
	{
		printf("nouser\n");
		return 0;
	}
	if (strcmp(mode, "read") != 0 && pw->pw_uid == 0)
	{
		printf("permanent commands and files of a .forward are never run as root\n");
		return 0;
	}
	/* Read as root, before becoming the user: the file is root's. */
	if (strcmp(mode, "read") != 0
		&& (refusal = helper_refusal(config_path, section, strcmp(mode, "pipe") == 0)) != NULL)
	{
		printf("permanent %s\n", refusal);
		return 0;
	}
	/* From here on we are the user: nothing of theirs is opened as root. */
	if (!privilege_become(pw->pw_name, pw->pw_uid, pw->pw_gid, "/", err, sizeof(err)))
	{
		if (geteuid() == 0)
			fatalx("becoming %s: %s", pw->pw_name, err);
		/* Without its bit (make run) only the caller's own .forward can be read. */
		printf("%s cannot act as %s: %s (the helper is not set-user-id root)\n",
			   strcmp(mode, "read") == 0 ? "ignored" : "permanent", pw->pw_name, err);
		return 0;
	}
	status = helper_read_forward(pw, &list, why, sizeof(why));
	if (strcmp(mode, "read") == 0)
	{
		if (strcmp(status, "none") == 0)
			printf("none\n");
		else if (strcmp(status, "forward") != 0)
			printf("%s %s\n", status, why);
		else
		{
			printf("forward\n");
			for (size_t i = 0; i < list.count; i++)
			{
				const struct forward_entry *e = &list.entries[i];

				if (e->kind == FORWARD_BAD)
					printf("bad %d %s\n", e->line, e->value);
				else
					printf("%s %s\n", forward_kind_name(e->kind), e->value);
			}
		}
	}
	else if (strcmp(status, "forward") != 0)
		printf("permanent %s's .forward no longer holds it%s%s\n", pw->pw_name, why[0] ? ": " : "",
			   why);
	else if (strcmp(mode, "pipe") == 0)
	{
		char *end;
		long  seconds = strtol(argv[5], &end, 10);

		if (*end || seconds <= 0 || seconds > 86400)
			fatalx("refused: \"%s\" is not a number of seconds", argv[5]);
		if (!helper_listed(&list, FORWARD_PIPE, argv[6]))
			printf("permanent the command is not in %s's .forward\n", pw->pw_name);
		else
			helper_pipe(pw, argv[3], argv[4], seconds, argv[6]);
	}
	else if (!helper_listed(&list, FORWARD_FILE, argv[5]))
		printf("permanent the file is not in %s's .forward\n", pw->pw_name);
	else
		helper_file(argv[3], argv[5]);
	forward_list_free(&list);
	return fflush(stdout) == 0 ? 0 : EX_IOERR;
}
