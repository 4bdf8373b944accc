/*
 * config_secrets.c: the secrets.d fragments config_load includes after
 * pepsi.conf (config.h says what they may hold and who may own them):
 * each checked before it is opened and again on the open descriptor, read
 * by config.c's parser into the same configuration.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/config_internal.h"

char *
config_secrets_dir(const char *path)
{
	const char *slash = strrchr(path, '/');

	if (slash == NULL)
		return xstrdup("secrets.d");
	return xasprintf("%.*s/secrets.d", (int) (slash - path), path);
}

/*
 * Whoever may own the secrets.d directory and its fragments: root, or the
 * account loading them (an unprivileged test, a user's own instance),
 * which gains nothing by writing secrets it reads itself.
 */
static bool
config_secret_owner_ok(uid_t uid)
{
	return uid == 0 || uid == geteuid();
}

/* Why a fragment (st from lstat or fstat) must not be read, or NULL. */
static const char *
config_fragment_refusal(const struct stat *st, char *why, size_t whylen)
{
	if (!S_ISREG(st->st_mode))
		snprintf(why, whylen, "not a regular file (a symbolic link or a directory is refused)");
	else if (!config_secret_owner_ok(st->st_uid))
		snprintf(why, whylen, "owned by uid %u, not by root (chown root:GROUP, GROUP the one "
							  "group that reads it)",
				 (unsigned) st->st_uid);
	else if (st->st_mode & (mode_t) ~(S_IFMT | S_IRUSR | S_IWUSR | S_IRGRP))
		snprintf(why, whylen, "mode %04o gives more than 0640 (owner read-write, group read; "
							  "chmod 0640)",
				 (unsigned) (st->st_mode & 07777));
	else
		return NULL;
	return why;
}

static int
config_fragment_name_compare(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static int
config_fragment_name_filter(const struct dirent *d)
{
	size_t len = strlen(d->d_name);

	return d->d_name[0] != '.' && len > 5 && strcmp(d->d_name + len - 5, ".conf") == 0;
}

/* Read one fragment into p->cfg; skipped when this account may not read it. */
static bool
config_read_fragment(struct config_parse *p, const char *path)
{
	struct stat st;
	char		why[256];
	int			fd;

	if (lstat(path, &st) != 0)
	{
		snprintf(p->err, p->errlen, "%s: %s", path, strerror(errno));
		return false;
	}
	if (config_fragment_refusal(&st, why, sizeof(why)))
	{
		snprintf(p->err, p->errlen, "%s: refused: %s", path, why);
		return false;
	}
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && errno == EACCES)
		return true; /* another group's: not this program's secrets */
	if (fd < 0 || fstat(fd, &st) != 0 || config_fragment_refusal(&st, why, sizeof(why)))
	{
		snprintf(p->err, p->errlen, "%s: refused: %s", path, fd < 0 ? strerror(errno) : why);
		if (fd >= 0)
			close(fd);
		return false;
	}
	p->cfg->fragments = xrealloc(p->cfg->fragments, (p->cfg->fragment_count + 1) * sizeof(char *));
	p->fragment = p->cfg->fragments[p->cfg->fragment_count++] = xstrdup(path);
	p->name = p->fragment;
	p->file = fdopen(fd, "r");
	if (p->file == NULL)
		fatal("fdopen");
	{
		bool read = config_read(p);

		fclose(p->file);
		p->file = NULL;
		return read;
	}
}

bool
config_read_secrets(struct config_parse *p)
{
	char		   *dir = config_secrets_dir(p->cfg->path);
	struct dirent **names = NULL;
	struct stat		st;
	int				n;
	bool			ok = true;

	if (lstat(dir, &st) != 0)
	{
		if (errno != ENOENT)
		{
			snprintf(p->err, p->errlen, "%s: %s", dir, strerror(errno));
			ok = false;
		}
		free(dir);
		return ok;
	}
	if (!S_ISDIR(st.st_mode) || !config_secret_owner_ok(st.st_uid) || (st.st_mode & (S_IWGRP | S_IWOTH)))
	{
		snprintf(p->err, p->errlen, "%s: refused: it must be a directory owned by root that only "
									"root may write (chown root %s; chmod 0755 %s)",
				 dir, dir, dir);
		free(dir);
		return false;
	}
	n = scandir(dir, &names, config_fragment_name_filter, config_fragment_name_compare);
	if (n < 0 && errno == EACCES)
	{
		free(dir);
		return true; /* a directory of mode 0750: none of its fragments is this account's */
	}
	if (n < 0)
	{
		snprintf(p->err, p->errlen, "%s: %s", dir, strerror(errno));
		free(dir);
		return false;
	}
	for (int i = 0; i < n; i++)
	{
		char *path = xasprintf("%s/%s", dir, names[i]->d_name);

		if (ok && !config_read_fragment(p, path))
			ok = false;
		free(path);
		free(names[i]);
	}
	free(names);
	free(dir);
	p->fragment = NULL;
	p->name = p->cfg->path;
	return ok;
}
