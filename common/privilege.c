/*
 * privilege.c: see privilege.h.  chroot is left out: a daemon's libpq
 * needs the socket directory and /etc, and a helper must reach the home
 * directories it serves.
 */
#include "privilege.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xalloc.h"

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

/* A regular, executable file with a set-user-id or set-group-id bit. */
static bool
privilege_setid_file(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & (S_ISUID | S_ISGID))
		   && access(path, X_OK) == 0;
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
