/*
 * config_secrets.c: the fragments config_load includes after pepsi.conf,
 * those of pepsi.conf.d and then those of secrets.d (config.h says what
 * they may hold and who may own them): each checked before it is opened
 * and again on the open descriptor, read by config.c's parser into the
 * same configuration.  The two directories differ only in whether others
 * may read a fragment.
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

char *
config_dropin_dir(const char *path)
{
	return xasprintf("%s.d", path);
}

/* The permission bits a fragment may have: a secret is for one group, a drop-in for everyone. */
#define CONFIG_SECRET_MODE (S_IRUSR | S_IWUSR | S_IRGRP)
#define CONFIG_DROPIN_MODE (S_IRUSR | S_IWUSR | S_IRGRP | S_IROTH)

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

/* Why a fragment (st from lstat or fstat) must not be read, or NULL; allowed: its permission bits at most. */
static const char *
config_fragment_refusal(const struct stat *st, mode_t allowed, char *why, size_t whylen)
{
	if (!S_ISREG(st->st_mode))
		snprintf(why, whylen, "not a regular file (a symbolic link or a directory is refused)");
	else if (!config_secret_owner_ok(st->st_uid))
		snprintf(why, whylen, "owned by uid %u, not by root (chown root%s)", (unsigned) st->st_uid,
				 allowed == CONFIG_SECRET_MODE ? ":GROUP, GROUP the one group that reads it" : "");
	else if (st->st_mode & (mode_t) ~(S_IFMT | allowed))
		snprintf(why, whylen, "mode %04o gives more than %04o (%s; chmod %04o)", (unsigned) (st->st_mode & 07777),
				 (unsigned) allowed, allowed == CONFIG_SECRET_MODE ? "owner read-write, group read" : "only root writes",
				 (unsigned) allowed);
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
config_read_fragment(struct config_parse *p, const char *path, mode_t allowed)
{
	struct stat st;
	char		why[256];
	int			fd;

	if (lstat(path, &st) != 0)
	{
		snprintf(p->err, p->errlen, "%s: %s", path, strerror(errno));
		return false;
	}
	if (config_fragment_refusal(&st, allowed, why, sizeof(why)))
	{
		snprintf(p->err, p->errlen, "%s: refused: %s", path, why);
		return false;
	}
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && errno == EACCES)
		return true; /* another group's: not this program's secrets */
	if (fd < 0 || fstat(fd, &st) != 0 || config_fragment_refusal(&st, allowed, why, sizeof(why)))
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

/* The fragments of dir (allocated, freed here), in name order; none when it does not exist. */
static bool
config_read_fragments(struct config_parse *p, char *dir, bool dropin)
{
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
	p->dropin = dropin;
	for (int i = 0; i < n; i++)
	{
		char *path = xasprintf("%s/%s", dir, names[i]->d_name);

		if (ok && !config_read_fragment(p, path, dropin ? CONFIG_DROPIN_MODE : CONFIG_SECRET_MODE))
			ok = false;
		free(path);
		free(names[i]);
	}
	free(names);
	free(dir);
	p->fragment = NULL;
	p->dropin = false;
	p->name = p->cfg->path;
	return ok;
}

bool
config_read_secrets(struct config_parse *p)
{
	return config_read_fragments(p, config_secrets_dir(p->cfg->path), false);
}

bool
config_read_dropins(struct config_parse *p)
{
	return config_read_fragments(p, config_dropin_dir(p->cfg->path), true);
}
