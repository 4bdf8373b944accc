/*
 * local.c: see local.h.  Every answer is from memory or one stat(2): the
 * aliases file is read once and again only when it changes, and the
 * virtual mailboxes are a sorted array the caller refreshes from SQL (a
 * stage worker at start, pepsi-ingress on a timer off its event loop), so
 * a check at RCPT time costs no round trip to the database.
 */
#include "local/local.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "local/aliases.h"
#include "options.h"

#define LOCAL_ALIASES_RECHECK_SECONDS 1

enum local_source
{
	LOCAL_SOURCE_ALIASES = 1 << 0,
	LOCAL_SOURCE_MAILDIR = 1 << 1,
	LOCAL_SOURCE_VIRTUAL = 1 << 2
};

struct local_resolver
{
	unsigned			sources;
	char			   *aliases_path;
	struct alias_table *aliases;
	struct timespec		aliases_mtime;
	time_t				aliases_checked; /* when the file's mtime was last looked at */
	char			   *maildir_root;
	char **virtual; /* lower case, sorted */
	size_t nvirtual;
	bool   virtual_loaded; /* the table was read at least once */
};

const char local_virtual_query[] = "SELECT address FROM pepsi.virtual_mailbox";

/*
 * Domains
 */

const char *
local_domains(const struct pepsi_config *cfg, const char *section)
{
	static char fallback[300];
	const char *domains = section ? config_get(cfg, section, "LOCAL_DOMAINS") : NULL;

	if (domains == NULL)
		domains = config_text(cfg, "pepsi", "LOCAL_DOMAINS");
	if (domains)
		return domains;
	snprintf(fallback, sizeof(fallback), "%s localhost", config_hostname(cfg));
	return fallback;
}

bool
local_domain_listed(const char *domains, const char *domain)
{
	size_t len = strlen(domain);
	char   bare[256];

	if (len > 0 && domain[len - 1] == '.')
		len--; /* the root's dot: "example.org." is example.org */
	if (len == 0)
		return true;
	if (len >= sizeof(bare))
		return false;
	memcpy(bare, domain, len);
	bare[len] = '\0';
	return config_list_contains(domains, bare);
}

bool
local_address_is_local(const char *domains, const char *address)
{
	const char *at = strrchr(address, '@');

	return local_domain_listed(domains, at ? at + 1 : "");
}

/*
 * The resolver
 */

static int
local_compare(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

static char *
local_lower(const char *s)
{
	char *lower = xstrdup(s);

	for (char *p = lower; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	return lower;
}

static bool
local_sources_parse(struct local_resolver *r, const struct pepsi_config *cfg, char *err,
					size_t errlen)
{
	const char *cursor = config_get(cfg, "pepsi", "LOCAL_RECIPIENTS");
	const char *p;
	size_t		n;
	char		origin[512];

	while ((p = option_list_next(&cursor, &n)) != NULL)
	{
		if (n == 7 && strncasecmp(p, "aliases", n) == 0)
			r->sources |= LOCAL_SOURCE_ALIASES;
		else if (n == 7 && strncasecmp(p, "maildir", n) == 0)
			r->sources |= LOCAL_SOURCE_MAILDIR;
		else if (n == 7 && strncasecmp(p, "virtual", n) == 0)
			r->sources |= LOCAL_SOURCE_VIRTUAL;
		else
		{
			snprintf(err, errlen, "%s: [pepsi] LOCAL_RECIPIENTS: unknown source \"%.*s\" "
								  "(the sources are aliases, maildir and virtual)",
					 config_origin(cfg, "pepsi", "LOCAL_RECIPIENTS", origin, sizeof(origin)),
					 (int) (n > 64 ? 64 : n), p);
			return false;
		}
	}
	return true;
}

/* Read the aliases file when it is new or changed since it was read. */
static bool
local_aliases_refresh(struct local_resolver *r, char *err, size_t errlen)
{
	struct stat			st;
	struct alias_table *table;

	if (stat(r->aliases_path, &st) != 0)
	{
		snprintf(err, errlen, "[pepsi] ALIASES_FILE %s: %s", r->aliases_path, strerror(errno));
		return false;
	}
	if (r->aliases && st.st_mtim.tv_sec == r->aliases_mtime.tv_sec
		&& st.st_mtim.tv_nsec == r->aliases_mtime.tv_nsec)
		return true;
	if ((table = aliases_load(r->aliases_path, err, errlen)) == NULL)
		return false;
	aliases_free(r->aliases);
	r->aliases = table;
	r->aliases_mtime = st.st_mtim;
	return true;
}

struct local_resolver *
local_resolver_new(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	struct local_resolver *r = xcalloc(1, sizeof(*r));
	const char			  *path;

	if (!local_sources_parse(r, cfg, err, errlen))
		goto err;
	if (r->sources & LOCAL_SOURCE_ALIASES)
	{
		r->aliases_path = xstrdup(config_text(cfg, "pepsi", "ALIASES_FILE"));
		if (!local_aliases_refresh(r, err, errlen))
			goto err;
		r->aliases_checked = time(NULL);
	}
	if (r->sources & LOCAL_SOURCE_MAILDIR)
	{
		if ((path = config_get(cfg, "pepsi", "MAILDIR_ROOT")) == NULL)
		{
			snprintf(err, errlen, "%s: [pepsi] LOCAL_RECIPIENTS names maildir but [pepsi] "
								  "MAILDIR_ROOT is not set",
					 cfg->path);
			goto err;
		}
		r->maildir_root = xstrdup(path);
	}
	return r;

err:
	local_resolver_free(r);
	return NULL;
}

static void
local_virtual_clear(struct local_resolver *r)
{
	for (size_t i = 0; i < r->nvirtual; i++)
		free(r->virtual[i]);
	free(r->virtual);
	r->virtual = NULL;
	r->nvirtual = 0;
}

void
local_resolver_free(struct local_resolver *r)
{
	if (r == NULL)
		return;
	free(r->aliases_path);
	aliases_free(r->aliases);
	free(r->maildir_root);
	local_virtual_clear(r);
	free(r);
}

bool
local_resolver_validates(const struct local_resolver *r)
{
	return r != NULL && r->sources != 0;
}

bool
local_resolver_uses_virtual(const struct local_resolver *r)
{
	return r != NULL && (r->sources & LOCAL_SOURCE_VIRTUAL) != 0;
}

void
local_resolver_set_virtual_list(struct local_resolver *r, const char *const *addresses,
								size_t count)
{
	local_virtual_clear(r);
	r->virtual = xcalloc(count + 1, sizeof(char *));
	for (size_t i = 0; i < count; i++)
		r->virtual[i] = local_lower(addresses[i]);
	r->nvirtual = count;
	r->virtual_loaded = true;
	qsort(r->virtual, count, sizeof(char *), local_compare);
}

bool
local_resolver_set_virtual(struct local_resolver *r, const PGresult *res, char *err, size_t errlen)
{
	size_t		 count;
	const char **addresses;

	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQnfields(res) != 1)
	{
		snprintf(err, errlen, "pepsi.virtual_mailbox: %s", PQresultErrorMessage(res));
		err[strcspn(err, "\n")] = '\0';
		return false;
	}
	count = (size_t) PQntuples(res);
	addresses = xcalloc(count + 1, sizeof(char *));
	for (size_t i = 0; i < count; i++)
		addresses[i] = PQgetvalue(res, (int) i, 0);
	local_resolver_set_virtual_list(r, addresses, count);
	free(addresses);
	return true;
}

bool
local_resolver_load_virtual(struct local_resolver *r, PGconn *conn, char *err, size_t errlen)
{
	PGresult *res;
	bool	  ok;

	if (!local_resolver_uses_virtual(r))
		return true;
	res = PQexec(conn, local_virtual_query);
	ok = local_resolver_set_virtual(r, res, err, errlen);
	PQclear(res);
	return ok;
}

/* RFC 5321 4.5.1 and RFC 2142: these reach a person at every domain we serve. */
static bool
local_role_account(const char *local, size_t len)
{
	return (len == 10 && strncasecmp(local, "postmaster", len) == 0)
		   || (len == 5 && strncasecmp(local, "abuse", len) == 0);
}

/*
 * A mailbox directory named by the address.  An address that could step
 * out of the root ("/", or a leading dot as in "..@x") names none.
 */
static bool
local_maildir_exists(const struct local_resolver *r, const char *lower)
{
	struct stat st;
	char	   *path;
	bool		exists;

	if (lower[0] == '.' || strchr(lower, '/') != NULL)
		return false;
	path = xasprintf("%s/%s", r->maildir_root, lower);
	exists = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
	free(path);
	return exists;
}

enum local_lookup
local_recipient_lookup(struct local_resolver *r, const char *address)
{
	const char *at = strrchr(address, '@');
	size_t		local_len = at ? (size_t) (at - address) : strlen(address);
	char	   *lower;
	bool		exists = false;

	if (local_role_account(address, local_len) || !local_resolver_validates(r))
		return LOCAL_RECIPIENT_EXISTS;
	if (r->sources & LOCAL_SOURCE_ALIASES)
	{
		time_t now = time(NULL);
		char   err[1024];
		char  *local = xstrndup(address, local_len);

		/* A changed file is picked up within a second; a broken one keeps the old table. */
		if (now - r->aliases_checked >= LOCAL_ALIASES_RECHECK_SECONDS)
		{
			r->aliases_checked = now;
			if (!local_aliases_refresh(r, err, sizeof(err)))
				log_warnx("%s; keeping the aliases read before", err);
		}
		exists = r->aliases && aliases_has(r->aliases, local);
		free(local);
		if (exists)
			return LOCAL_RECIPIENT_EXISTS;
	}
	lower = local_lower(address);
	if (r->sources & LOCAL_SOURCE_VIRTUAL && r->nvirtual > 0)
		exists = bsearch(&lower, r->virtual, r->nvirtual, sizeof(char *), local_compare) != NULL;
	if (!exists && r->sources & LOCAL_SOURCE_MAILDIR)
		exists = local_maildir_exists(r, lower);
	free(lower);
	if (exists)
		return LOCAL_RECIPIENT_EXISTS;
	/* Never a permanent refusal for want of a table we could not read. */
	if (r->sources & LOCAL_SOURCE_VIRTUAL && !r->virtual_loaded)
		return LOCAL_RECIPIENT_UNVERIFIED;
	return LOCAL_RECIPIENT_UNKNOWN;
}
