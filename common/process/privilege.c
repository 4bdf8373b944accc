/*
 * privilege.c: see privilege.h.  chroot is left out: a daemon's libpq
 * needs the socket directory and /etc, and a helper must reach the home
 * directories it serves.
 */
#include "process/privilege.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/xalloc.h"
#include "setid_programs.h" /* PEPSI_SETID_PROGRAMS: generated from the Makefile's list */

/* The set-id programs make install installs, and nothing else is run as one. */
static const char *const privilege_setid_programs[] = {PEPSI_SETID_PROGRAMS};

bool
privilege_become(const char *user, uid_t uid, gid_t gid, const char *dir, char *err,
				 size_t errlen)
{
	const char *where = dir ? dir : "/";

	if (geteuid() != 0)
	{
		/* Already that user (make run, the tests, a helper without its bit): nothing to drop. */
		if (getuid() != uid || geteuid() != uid)
		{
			snprintf(err, errlen, "only root can become uid %ld", (long) uid);
			return false;
		}
		if (chdir(where) != 0)
		{
			snprintf(err, errlen, "chdir %s: %s", where, strerror(errno));
			return false;
		}
		return true;
	}
	if (chdir(where) != 0)
	{
		snprintf(err, errlen, "chdir %s: %s", where, strerror(errno));
		return false;
	}
	if ((user ? initgroups(user, gid) : setgroups(1, &gid)) != 0)
	{
		snprintf(err, errlen, "setting the groups of uid %ld: %s", (long) uid, strerror(errno));
		return false;
	}
	if (setresgid(gid, gid, gid) != 0)
	{
		snprintf(err, errlen, "setresgid %ld: %s", (long) gid, strerror(errno));
		return false;
	}
	if (setresuid(uid, uid, uid) != 0)
	{
		snprintf(err, errlen, "setresuid %ld: %s", (long) uid, strerror(errno));
		return false;
	}
	/* A process that could regain root would make the drop pointless. */
	if (uid != 0 && (setuid(0) == 0 || seteuid(0) == 0))
	{
		snprintf(err, errlen, "could regain root after becoming uid %ld", (long) uid);
		return false;
	}
	return true;
}

bool
privilege_caller_in_group(gid_t gid)
{
	gid_t groups[NGROUPS_MAX];
	int	  count;

	if (getuid() == 0 || getgid() == gid || getegid() == gid)
		return true;
	if ((count = getgroups(NGROUPS_MAX, groups)) < 0)
		return false;
	for (int i = 0; i < count; i++)
		if (groups[i] == gid)
			return true;
	return false;
}

bool
privilege_own_group(gid_t *gid, char *err, size_t errlen)
{
	struct stat st;

	if (stat("/proc/self/exe", &st) != 0)
	{
		snprintf(err, errlen, "cannot find my own executable: %s", strerror(errno));
		return false;
	}
	*gid = st.st_gid;
	return true;
}

bool
privilege_setid_file(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & (S_ISUID | S_ISGID))
		   && access(path, X_OK) == 0;
}

bool
privilege_is_setid_program(const char *name)
{
	for (size_t i = 0; i < sizeof(privilege_setid_programs) / sizeof(privilege_setid_programs[0]); i++)
		if (strcmp(name, privilege_setid_programs[i]) == 0)
			return true;
	return false;
}

char *
privilege_setid_program(const char *program, const char *self_exe)
{
	const char *slash = strrchr(self_exe, '/');
	int			dir_len = slash ? (int) (slash - self_exe) : 1;
	const char *dir = slash ? self_exe : ".";
	char	   *candidate;

	if (strchr(program, '/'))
		return privilege_setid_file(program) ? xstrdup(program) : NULL;
	if (!privilege_is_setid_program(program))
		return NULL;
	candidate = xasprintf("%.*s/%s", dir_len, dir, program);
	if (privilege_setid_file(candidate))
		return candidate;
	free(candidate);
	candidate = xasprintf("%.*s/../../bin/%s", dir_len, dir, program);
	if (privilege_setid_file(candidate))
		return candidate;
	free(candidate);
	return NULL;
}

char **
privilege_clean_env(const char *const *pairs)
{
	size_t count = 0;
	char **env;

	while (pairs[2 * count])
		count++;
	env = xcalloc(count + 1, sizeof(char *));
	for (size_t i = 0; i < count; i++)
		env[i] = xasprintf("%s=%s", pairs[2 * i], pairs[2 * i + 1] ? pairs[2 * i + 1] : "");
	return env;
}

void
privilege_env_free(char **env)
{
	for (size_t i = 0; env && env[i]; i++)
		free(env[i]);
	free(env);
}

static int privilege_setid = -1; /* -1: privilege_setid_start not called */

bool
privilege_setid_start(void)
{
	gid_t rgid = getgid();
	gid_t egid = getegid();

	privilege_setid = getauxval(AT_SECURE) != 0;
	/* The extra group kept as the saved gid only; the caller's own is the effective one. */
	if (privilege_setid && egid != rgid && setresgid(rgid, rgid, egid) != 0)
	{
		fprintf(stderr, "cannot set the group id aside: %s\n", strerror(errno));
		_exit(70);
	}
	return privilege_setid;
}

bool
privilege_running_setid(void)
{
	if (privilege_setid < 0)
		return getauxval(AT_SECURE) != 0;
	return privilege_setid;
}

bool
privilege_exec_group(bool raise, char *err, size_t errlen)
{
	gid_t rgid, egid, sgid;

	if (privilege_setid <= 0)
		return true;
	if (getresgid(&rgid, &egid, &sgid) != 0 || setresgid((gid_t) -1, raise ? sgid : rgid, (gid_t) -1) != 0)
	{
		snprintf(err, errlen, "cannot %s the group id %ld: %s", raise ? "take up" : "set aside",
				 (long) sgid, strerror(errno));
		return false;
	}
	return true;
}

bool
privilege_path_trusted(const char *path, uid_t trusted, char *why, size_t whylen)
{
	char	   *copy = xstrdup(path);
	char	   *save = NULL;
	char	   *component;
	struct stat st;
	int			fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	bool		ok = false;

	why[0] = '\0';
	if (path[0] != '/')
	{
		snprintf(why, whylen, "%s is not an absolute path", path);
		goto done;
	}
	for (component = strtok_r(copy, "/", &save); fd >= 0; component = strtok_r(NULL, "/", &save))
	{
		bool last;
		int	 next;

		if (fstat(fd, &st) != 0)
			break;
		if (st.st_uid != 0 && st.st_uid != trusted)
		{
			snprintf(why, whylen, "%s: a directory on the way belongs to uid %ld", path,
					 (long) st.st_uid);
			goto done;
		}
		if (S_ISDIR(st.st_mode) && (st.st_mode & (S_IWGRP | S_IWOTH))
			&& !((st.st_mode & S_ISVTX) && st.st_uid == 0))
		{
			snprintf(why, whylen, "%s: a directory on the way is writable by others", path);
			goto done;
		}
		if (component == NULL)
			break;
		last = save == NULL || *save == '\0';
		next = openat(fd, component, (last ? 0 : O_DIRECTORY) | O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
		close(fd);
		fd = next;
		if (fd < 0)
		{
			snprintf(why, whylen, "%s: %s", path, strerror(errno));
			goto done;
		}
		if (last)
		{
			if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
			{
				snprintf(why, whylen, "%s is not a regular file", path);
				goto done;
			}
			if (st.st_uid != 0 && st.st_uid != trusted)
			{
				snprintf(why, whylen, "%s belongs to uid %ld, not to root", path, (long) st.st_uid);
				goto done;
			}
			if (st.st_mode & (S_IWGRP | S_IWOTH))
			{
				snprintf(why, whylen, "%s is writable by others", path);
				goto done;
			}
			ok = true;
			break;
		}
	}
	if (!ok && why[0] == '\0')
		snprintf(why, whylen, "%s: %s", path, strerror(errno));
done:
	if (fd >= 0)
		close(fd);
	free(copy);
	return ok;
}

/* A limit the caller may have lowered, and what the program gets instead. */
static void
privilege_reset_limit(int resource, rlim_t value)
{
	struct rlimit limit;

	if (getrlimit(resource, &limit) != 0)
		return;
	/* Root may raise the hard limit too; anyone else gets as much as it allows. */
	if (geteuid() == 0 && (limit.rlim_max == RLIM_INFINITY || limit.rlim_max < value))
		limit.rlim_max = value;
	limit.rlim_cur = value == RLIM_INFINITY || limit.rlim_max < value ? limit.rlim_max : value;
	(void) setrlimit(resource, &limit);
}

void
privilege_sanitize_process(void)
{
	struct rlimit no_core = {0, 0};

	clearenv();
	umask(077);
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			signal(sig, SIG_DFL);
	{
		sigset_t none;

		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
	}
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0)
		{
			/* stdin and stdout are the protocol: without them there is no caller to answer. */
			if (fd < 2)
				_exit(2);
			if (open("/dev/null", O_WRONLY) != fd)
				_exit(2);
		}
	close_range(3, ~0U, 0);
	(void) setrlimit(RLIMIT_CORE, &no_core); /* a root process's memory never lands in a file */
	privilege_reset_limit(RLIMIT_FSIZE, RLIM_INFINITY);
	privilege_reset_limit(RLIMIT_CPU, RLIM_INFINITY);
	privilege_reset_limit(RLIMIT_AS, RLIM_INFINITY);
	privilege_reset_limit(RLIMIT_DATA, RLIM_INFINITY);
	privilege_reset_limit(RLIMIT_STACK, 8 * 1024 * 1024);
	privilege_reset_limit(RLIMIT_NOFILE, 1024);
}
