/*
 * sender_login.c: see sender_login.h.  The file is read at start (and at
 * each reload) into a list this process keeps; the database's entries are the session's.
 */
#include "sender_login.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/xalloc.h"

struct sender_login_entry
{
	char *address; /* lower case: a mailbox, or "@domain" */
	char *account;
};

struct sender_logins
{
	bool					   enabled;
	bool					   sql;
	struct sender_login_entry *entries;
	size_t					   count;
	long					   limit_messages;
	long					   limit_recipients;
};

static struct sender_logins logins;

static char *
sender_login_lower(const char *s)
{
	char *copy = xstrdup(s);

	for (char *p = copy; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	return copy;
}

static bool
sender_login_read_file(struct sender_logins *into, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char  line[4096];
	int	  number = 0;

	if (f == NULL)
	{
		snprintf(err, errlen, "[ingress] SENDER_LOGIN_MAPS: %s: %s", path, strerror(errno));
		return false;
	}
	while (fgets(line, sizeof(line), f))
	{
		char *save = NULL;
		char *address;
		char *accounts;

		number++;
		if ((address = strtok_r(line, " \t\r\n", &save)) == NULL || address[0] == '#')
			continue;
		if ((accounts = strtok_r(NULL, " \t\r\n", &save)) == NULL || strtok_r(NULL, " \t\r\n", &save)
			|| strchr(address, '@') == NULL)
		{
			snprintf(err, errlen,
					 "[ingress] SENDER_LOGIN_MAPS: %s line %d: not \"address account[,account...]\" "
					 "(an address \"@domain\" for all of a domain)",
					 path, number);
			fclose(f);
			return false;
		}
		for (char *a = strtok_r(accounts, ",", &save); a; a = strtok_r(NULL, ",", &save))
		{
			into->entries = xrealloc(into->entries, (into->count + 1) * sizeof(*into->entries));
			into->entries[into->count].address = sender_login_lower(address);
			into->entries[into->count].account = xstrdup(a);
			into->count++;
		}
	}
	fclose(f);
	return true;
}

static void
sender_login_free(struct sender_logins *list)
{
	for (size_t i = 0; i < list->count; i++)
	{
		free(list->entries[i].address);
		free(list->entries[i].account);
	}
	free(list->entries);
	memset(list, 0, sizeof(*list));
}

struct sender_logins *
sender_login_load(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	const char			 *maps = config_text(cfg, "ingress", "SENDER_LOGIN_MAPS");
	char				 *copy = xstrdup(maps ? maps : "");
	char				 *save = NULL;
	bool				  ok = true;
	struct sender_logins *next = xcalloc(1, sizeof(*next));

	next->limit_messages = (long) config_int(cfg, "ingress", "SEND_LIMIT_MESSAGES");
	next->limit_recipients = (long) config_int(cfg, "ingress", "SEND_LIMIT_RECIPIENTS");
	for (char *t = strtok_r(copy, ", \t", &save); t && ok; t = strtok_r(NULL, ", \t", &save))
	{
		next->enabled = true;
		if (strcmp(t, "sql") == 0)
			next->sql = true;
		else if (strncmp(t, "file:/", 6) == 0)
			ok = sender_login_read_file(next, t + 5, err, errlen);
		else
		{
			snprintf(err, errlen,
					 "[ingress] SENDER_LOGIN_MAPS: \"%s\" is neither \"sql\" nor \"file:\" and an "
					 "absolute path",
					 t);
			ok = false;
		}
	}
	free(copy);
	if (!ok)
	{
		sender_login_discard(next);
		return NULL;
	}
	return next;
}

void
sender_login_discard(struct sender_logins *next)
{
	if (next == NULL)
		return;
	sender_login_free(next);
	free(next);
}

void
sender_login_install(struct sender_logins *next)
{
	sender_login_free(&logins);
	logins = *next;
	free(next);
}

bool
sender_login_configure(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	struct sender_logins *next = sender_login_load(cfg, err, errlen);

	if (next == NULL)
		return false;
	sender_login_install(next);
	return true;
}

void
sender_login_shutdown(void)
{
	sender_login_free(&logins);
}

bool
sender_login_enabled(void)
{
	return logins.enabled;
}

bool
sender_login_uses_sql(void)
{
	return logins.sql;
}

long
sender_login_limit_messages(void)
{
	return logins.limit_messages;
}

long
sender_login_limit_recipients(void)
{
	return logins.limit_recipients;
}

/* Does entry (a mailbox, or "@domain") cover address? */
static bool
sender_login_covers(const char *entry, const char *address)
{
	const char *at = strrchr(address, '@');

	if (strcasecmp(entry, address) == 0)
		return true;
	return entry[0] == '@' && at && strcasecmp(entry, at) == 0;
}

bool
sender_login_allows(const char *account, const char *address, char *const *sql, size_t count)
{
	for (size_t i = 0; i < logins.count; i++)
		if (strcmp(logins.entries[i].account, account) == 0
			&& sender_login_covers(logins.entries[i].address, address))
			return true;
	for (size_t i = 0; sql && i < count; i++)
		if (sender_login_covers(sql[i], address))
			return true;
	return false;
}
