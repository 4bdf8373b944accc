/* aliases.c: see aliases.h. */
#include "local/aliases.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "local/local.h"

#define ALIASES_MAX_DEPTH 32
#define ALIASES_MAX_ADDRESSES 10000
/* Lookups per expansion: a name listed twice at every level would double the walk each time. */
#define ALIASES_MAX_LOOKUPS 100000
/* An aliases file larger than this is refused rather than read whole. */
#define ALIASES_MAX_FILE (64 * 1024 * 1024)

struct alias
{
	char  *name; /* lower case */
	char **targets;
	size_t ntargets;
	int	   line;
};

struct alias_table
{
	struct alias *aliases;
	size_t		  count;
};

static int
aliases_compare(const void *a, const void *b)
{
	return strcmp(((const struct alias *) a)->name, ((const struct alias *) b)->name);
}

static char *
aliases_trim(char *s)
{
	char *end;

	while (isspace((unsigned char) *s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char) end[-1]))
		*--end = '\0';
	return s;
}

/*
 * A pipe, a file or an include: deliveries this stage does not make.  The
 * quoted forms ("|/usr/bin/procmail -f-") are the usual way to write a
 * command with spaces, so they are looked through.
 */
static bool
aliases_is_delivery_target(const char *target)
{
	if (*target == '"')
		target++;
	return *target == '|' || *target == '/' || strncasecmp(target, ":include:", 9) == 0;
}

/* Parse "name: target, target" (continuations already joined). */
static bool
aliases_add_entry(struct alias_table *table, char *entry, const char *name, int line,
				  char *err, size_t errlen)
{
	char		 *colon = strchr(entry, ':');
	struct alias *alias;
	char		 *key;
	char		 *p;

	if (colon == NULL)
	{
		snprintf(err, errlen, "%s:%d: expected \"name: address, ...\"", name, line);
		return false;
	}
	*colon = '\0';
	key = aliases_trim(entry);
	if (*key == '\0' || strpbrk(key, " \t@"))
	{
		snprintf(err, errlen, "%s:%d: \"%s\" is not an alias name", name, line, key);
		return false;
	}
	for (size_t i = 0; i < table->count; i++)
		if (strcasecmp(table->aliases[i].name, key) == 0)
		{
			snprintf(err, errlen, "%s:%d: alias \"%s\" is defined twice (first at line %d)",
					 name, line, key, table->aliases[i].line);
			return false;
		}
	table->aliases = xrealloc(table->aliases, (table->count + 1) * sizeof(struct alias));
	alias = &table->aliases[table->count++];
	memset(alias, 0, sizeof(*alias));
	alias->name = xstrdup(key);
	for (p = alias->name; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	alias->line = line;

	/* Targets: comma separated; a quoted string may hold commas. */
	p = colon + 1;
	while (*p)
	{
		struct buf target = BUF_INIT;
		bool	   quoted = false;
		char	  *t;

		while (*p && (isspace((unsigned char) *p) || *p == ','))
			p++;
		for (; *p && (quoted || *p != ','); p++)
		{
			if (*p == '"')
				quoted = !quoted;
			buf_append_char(&target, *p);
		}
		if (target.len == 0)
			continue;
		t = aliases_trim(target.data);
		if (aliases_is_delivery_target(t))
		{
			snprintf(err, errlen, "%s:%d: alias \"%s\": \"%s\" is not supported "
								  "(only addresses and alias names; no pipes, files or includes)",
					 name, line, alias->name, t);
			buf_free(&target);
			return false;
		}
		if (*t)
		{
			alias->targets = xrealloc(alias->targets, (alias->ntargets + 1) * sizeof(char *));
			alias->targets[alias->ntargets++] = xstrdup(t);
		}
		buf_free(&target);
	}
	if (alias->ntargets == 0)
	{
		snprintf(err, errlen, "%s:%d: alias \"%s\" has no address", name, line, alias->name);
		return false;
	}
	return true;
}

struct alias_table *
aliases_parse(const char *text, const char *name, char *err, size_t errlen)
{
	struct alias_table *table = xcalloc(1, sizeof(*table));
	struct buf			entry = BUF_INIT;
	int					line = 0;
	int					entry_line = 0;
	const char		   *p = text;
	bool				ok = true;

	while (ok && *p)
	{
		size_t n = strcspn(p, "\n");
		char  *raw = xstrndup(p, n);

		line++;
		p += n + (p[n] == '\n');
		if (raw[0] == '#' || aliases_trim(raw)[0] == '\0')
		{
			free(raw);
			continue;
		}
		if (isspace((unsigned char) raw[0]))
		{
			if (entry.len == 0)
			{
				snprintf(err, errlen, "%s:%d: continuation line with no alias before it", name, line);
				ok = false;
			}
			else
				buf_printf(&entry, " %s", aliases_trim(raw));
			free(raw);
			continue;
		}
		if (entry.len > 0)
			ok = aliases_add_entry(table, entry.data, name, entry_line, err, errlen);
		buf_reset(&entry);
		buf_append_str(&entry, raw);
		entry_line = line;
		free(raw);
	}
	if (ok && entry.len > 0)
		ok = aliases_add_entry(table, entry.data, name, entry_line, err, errlen);
	buf_free(&entry);
	if (!ok)
	{
		aliases_free(table);
		return NULL;
	}
	if (table->count > 0)
		qsort(table->aliases, table->count, sizeof(struct alias), aliases_compare);
	return table;
}

struct alias_table *
aliases_load(const char *path, char *err, size_t errlen)
{
	struct buf			text = BUF_INIT;
	struct alias_table *table;

	if (!buf_append_file(&text, path, ALIASES_MAX_FILE, err, errlen))
	{
		buf_free(&text);
		return NULL;
	}
	table = aliases_parse(text.data, path, err, errlen);
	buf_free(&text);
	return table;
}

void
aliases_free(struct alias_table *table)
{
	if (table == NULL)
		return;
	for (size_t i = 0; i < table->count; i++)
	{
		for (size_t j = 0; j < table->aliases[i].ntargets; j++)
			free(table->aliases[i].targets[j]);
		free(table->aliases[i].targets);
		free(table->aliases[i].name);
	}
	free(table->aliases);
	free(table);
}

size_t
aliases_count(const struct alias_table *table)
{
	return table->count;
}

static const struct alias *
aliases_find(const struct alias_table *table, const char *local)
{
	struct alias		key;
	char			   *lower = xstrdup(local);
	const struct alias *found = NULL;

	for (char *p = lower; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	key.name = lower;
	if (table->count > 0)
		found = bsearch(&key, table->aliases, table->count, sizeof(struct alias), aliases_compare);
	free(lower);
	return found;
}

bool
aliases_has(const struct alias_table *table, const char *local)
{
	return aliases_find(table, local) != NULL;
}

static void
aliases_emit(char ***out, size_t *count, const char *address)
{
	for (size_t i = 0; i < *count; i++)
		if (strcasecmp((*out)[i], address) == 0)
			return;
	*out = xrealloc(*out, (*count + 1) * sizeof(char *));
	(*out)[(*count)++] = xstrdup(address);
}

struct aliases_walk
{
	const struct alias_table *table;
	const char				 *domains;
	const char				 *path[ALIASES_MAX_DEPTH]; /* names being expanded */
	int						  depth;
	long					  lookups;
	char					 *err;
	size_t					  errlen;
};

static bool
aliases_walk(struct aliases_walk *walk, const char *address, char ***out, size_t *count)
{
	const char		   *at = strrchr(address, '@');
	char			   *local = at ? xstrndup(address, (size_t) (at - address)) : xstrdup(address);
	const char		   *domain = at ? at + 1 : "";
	const struct alias *alias = NULL;
	bool				ok = true;

	if (++walk->lookups > ALIASES_MAX_LOOKUPS)
	{
		snprintf(walk->err, walk->errlen, "alias expansion takes more than %d lookups",
				 ALIASES_MAX_LOOKUPS);
		free(local);
		return false;
	}
	if (local_domain_listed(walk->domains, domain))
		alias = aliases_find(walk->table, local);
	for (int i = 0; alias && i < walk->depth; i++)
		if (strcmp(walk->path[i], alias->name) == 0)
			alias = NULL; /* met again on its own path: deliver as is */
	if (alias == NULL)
	{
		aliases_emit(out, count, address);
		free(local);
		if (*count > ALIASES_MAX_ADDRESSES)
		{
			snprintf(walk->err, walk->errlen, "alias expansion of more than %d addresses",
					 ALIASES_MAX_ADDRESSES);
			return false;
		}
		return true;
	}
	if (walk->depth == ALIASES_MAX_DEPTH)
	{
		snprintf(walk->err, walk->errlen, "alias \"%s\" nests deeper than %d levels",
				 alias->name, ALIASES_MAX_DEPTH);
		free(local);
		return false;
	}
	walk->path[walk->depth++] = alias->name;
	for (size_t i = 0; ok && i < alias->ntargets; i++)
	{
		const char *target = alias->targets[i];

		if (strchr(target, '@') == NULL && *domain)
		{
			char *full = xasprintf("%s@%s", target, domain);

			ok = aliases_walk(walk, full, out, count);
			free(full);
		}
		else
			ok = aliases_walk(walk, target, out, count);
	}
	walk->depth--;
	free(local);
	return ok;
}

bool
aliases_expand(const struct alias_table *table, const char *address, const char *domains,
			   char ***out, size_t *count, char *err, size_t errlen)
{
	struct aliases_walk walk = {.table = table, .domains = domains, .err = err, .errlen = errlen};

	return aliases_walk(&walk, address, out, count);
}
