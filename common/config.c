/*
 * config.c: see config.h.  Parsing is libinih's; what this file adds is
 * the schema (which sections and options exist), line numbers for every
 * value, the overlay, and typed getters whose errors name the place.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include "log.h"
#include "xalloc.h"

/*
 * The lookup index: the positions of the entries sorted by section, option
 * and position, so that the values of one option (the file's and its
 * overrides) are found by binary search.  A stage worker looks options up
 * several times per message and per fused hop; a linear scan of every
 * entry each time grew with the size of the configuration.  Rebuilt when
 * entries have been added since.
 */
struct config_index
{
	size_t	   *order;
	size_t		built_for;		/* the entry count it was built for */
};

/*
 * The schema.  A section is named exactly or by a prefix ending in '-'
 * (one per listener or stage).  options == NULL means any upper-case name:
 * stage sections carry the options of their own program, which the program
 * checks itself.
 */
struct config_section_schema
{
	const char *name;
	bool		prefix;
	bool		overridable;
	const char *const *options;
};

static const char *const pepsi_options[] = {
	"HOSTNAME", "ALLOW_FUSION", "MAIL_LOG", "LOG", "LOG_FORMAT", "DNS_FORWARDER", "DNS_TRUST_ANCHOR", "DNS_TIMEOUT",
	"LOCAL_DOMAINS", "LOCAL_RECIPIENTS", "ALIASES_FILE", "MAILDIR_ROOT", NULL
};
static const char *const database_options[] = {
	"CONNINFO", NULL
};
static const char *const dispatch_options[] = {
	"POLL_INTERVAL", "FAIR_HALF_LIFE", "FAIR_FIFO_PERCENT", "WORKER_IDLE_TIMEOUT",
	"SPAWN_COOLDOWN", "STATS_INTERVAL", "INIT_STAGE", "CRASH_LIMIT", "CRASH_RETRY_DELAY", NULL
};
static const char *const ingress_options[] = {
	"AUTHSERV_ID", "DISPATCH_WAKE_INTERVAL", "USER", "GROUP", "CREDENTIALS",
	"DATABASE_CONNECTIONS", "BATCH_SIZE", "INIT_STAGE", "TRUSTED_NETWORKS",
	"LOCAL_RECIPIENTS_REFRESH", "DNS_MESSAGE_BUDGET", "MAX_HOPS", "ARC_TRUSTED_SEALERS",
	"MAX_MESSAGE_MEMORY", NULL
};
static const char *const sendmail_options[] = {
	"INIT_STAGE", NULL
};
static const char *const listener_options[] = {
	"ADDRESS", "PORT", "MODE", "CERTIFICATE", "KEY", "MAX_SIZE", "MAX_RECIPIENTS",
	"MAX_LINE_LENGTH", "MAX_SESSIONS", "MAX_SESSIONS_PER_CLIENT", "IDLE_TIMEOUT",
	"MAX_ERRORS", "COMMAND_RATE", "TRUSTED_NETWORKS",
	"MESSAGE_AUTHENTICATION", "SPF_FAIL", "DMARC_POLICY", "SESSION_DEADLINE", "MIN_DATA_RATE", NULL
};

/*
 * Options of overridable sections that are read from the file only: who a
 * process runs as, whose passwords and which networks it trusts, the paths
 * it reads and where it sends mail.  A compromised database must not change
 * them (pepsi--0.1--0.2.sql refuses the same rows).  section NULL: any
 * section; an option ending in "_" stands for every option with that
 * ending ("_FILE").
 */
static const struct
{
	const char *section;
	const char *option;
	const char *why;
}			config_file_only[] = {
	{"ingress", "USER", "whom ingress runs as"},
	{"ingress", "GROUP", "whom ingress runs as"},
	{"ingress", "CREDENTIALS", "whose passwords ingress trusts"},
	{"ingress", "TRUSTED_NETWORKS", "which clients may relay"},
	{"pepsi", "DNS_FORWARDER", "where every DNS answer comes from"},
	{"pepsi", "DNS_TRUST_ANCHOR", "which DNSSEC answers are trusted"},
	{NULL, "_FILE", "a path a program reads"},
	{NULL, "MAILDIR_ROOT", "where mailboxes are written"},
	{NULL, "SMARTHOST", "where mail is sent"},
	{NULL, "TLS", "how the next hop is authenticated"},
	{NULL, "TLS_NAME", "how the next hop is authenticated"},
	{NULL, "CERTIFICATE", "a path a program reads"},
	{NULL, "KEY", "a path a program reads"},
	{NULL, "AUTH_USER", "the credentials used at the next hop"},
};

/* Why the option is read from the file only, or NULL if the overlay may set it. */
static const char *
config_file_only_reason(const char *section, const char *option)
{
	size_t		len = strlen(option);

	for (size_t i = 0; i < sizeof(config_file_only) / sizeof(config_file_only[0]); i++)
	{
		const char *name = config_file_only[i].option;
		size_t		n = strlen(name);
		bool		matches = name[0] == '_' ? len > n && strcmp(option + len - n, name) == 0
			: strcmp(option, name) == 0;

		if (matches && (config_file_only[i].section == NULL
						|| strcmp(section, config_file_only[i].section) == 0))
			return config_file_only[i].why;
	}
	return NULL;
}

/* The first control character of a value (TAB excepted), or NULL. */
static const char *
config_control_character(const char *value)
{
	for (const char *p = value; *p; p++)
		if (((unsigned char) *p < 0x20 && *p != '\t') || *p == 0x7f)
			return p;
	return NULL;
}

/*
 * A PROGRAM from the database is a program's name, never a path: the
 * dispatcher then runs it only from Pepsi's own program directory.
 */
static bool
config_program_name_valid(const char *value)
{
	if (!islower((unsigned char) value[0]) && !isdigit((unsigned char) value[0]))
		return false;
	for (const char *p = value; *p; p++)
		if (!islower((unsigned char) *p) && !isdigit((unsigned char) *p) && !strchr("._+-", *p))
			return false;
	return true;
}

/* A signing key (common/auth/keys.h): file only, so the overlay cannot move it. */
static const char *const dkim_key_options[] = {
	"DOMAIN", "SELECTOR", "ALGORITHM", "KEY_FILE", NULL
};

/* The SRS engine (common/srs.h): file only, the secrets must not come from the database. */
static const char *const srs_options[] = {
	"DOMAIN", "SECRET_FILE", "MAX_AGE", "HASH_LENGTH", "SEPARATOR", NULL
};

static const char *const httpd_options[] = {
	"ADDRESS", "PORT", "CERTIFICATE", "KEY", "USER", "GROUP", "CONNINFO", "SESSION_LIFETIME",
	"METRICS_AUTH", NULL
};

static const struct config_section_schema config_schema[] = {
	{"pepsi", false, true, pepsi_options},
	{"database", false, false, database_options},
	{"dispatch", false, true, dispatch_options},
	{"ingress", false, true, ingress_options},
	{"sendmail", false, true, sendmail_options},
	{"listener-", true, false, listener_options},
	{"dkim-key-", true, false, dkim_key_options},
	{"srs", false, false, srs_options},
	/* Where it listens, its certificate and its role: the file's alone. */
	{"httpd", false, false, httpd_options},
	{"stage-", true, true, NULL},
};

static const struct config_section_schema *
config_schema_for(const char *section)
{
	for (size_t i = 0; i < sizeof(config_schema) / sizeof(config_schema[0]); i++)
	{
		const struct config_section_schema *s = &config_schema[i];

		if (s->prefix ? (strncmp(section, s->name, strlen(s->name)) == 0
						 && section[strlen(s->name)] != '\0')
			: strcmp(section, s->name) == 0)
			return s;
	}
	return NULL;
}

static bool
config_option_name_valid(const char *option)
{
	if (!isupper((unsigned char) option[0]))
		return false;
	for (const char *p = option; *p; p++)
		if (!isupper((unsigned char) *p) && !isdigit((unsigned char) *p) && *p != '_')
			return false;
	return true;
}

bool
config_section_known(const char *section)
{
	return config_schema_for(section) != NULL;
}

bool
config_section_overridable(const char *section)
{
	const struct config_section_schema *s = config_schema_for(section);

	return s != NULL && s->overridable;
}

bool
config_option_known(const char *section, const char *option)
{
	const struct config_section_schema *s = config_schema_for(section);

	if (s == NULL || !config_option_name_valid(option))
		return false;
	if (s->options == NULL)
		return true;
	for (const char *const *o = s->options; *o; o++)
		if (strcmp(*o, option) == 0)
			return true;
	return false;
}

/*
 * Parsing state: libinih reads line by line through config_read_line.
 * libinih goes on after a refused line, so only the first refusal is kept
 * (with its own line number); the reader takes whole lines itself, since
 * libinih's fixed buffer would otherwise cut a long line in two and parse
 * its tail as a line of its own.
 */
struct config_parse
{
	struct pepsi_config *cfg;
	FILE	   *file;			/* or */
	const char *text;			/* the rest of a string */
	char	   *line_buffer;	/* getline's, for the file */
	size_t		line_capacity;
	int			line;
	bool		indented;		/* the current line starts with white space */
	char	   *err;
	size_t		errlen;
	bool		failed;
	int			error_line;
};

static void config_parse_error(struct config_parse *p, int line, const char *fmt, ...)
			__attribute__((format(printf, 3, 4)));

/* Record the first refusal; later ones are consequences or noise. */
static void
config_parse_error(struct config_parse *p, int line, const char *fmt, ...)
{
	char		reason[768];
	va_list		ap;

	if (p->failed)
		return;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	snprintf(p->err, p->errlen, "%s:%d: %s", p->cfg->path, line, reason);
	p->failed = true;
	p->error_line = line;
}

static char *
config_read_line(char *str, int num, void *stream)
{
	struct config_parse *p = stream;
	const char *line;
	size_t		len;

	if (p->failed)
		return NULL;			/* nothing after the first refusal matters */
	if (p->file)
	{
		ssize_t		n = getline(&p->line_buffer, &p->line_capacity, p->file);

		if (n < 0)
			return NULL;
		line = p->line_buffer;
		len = (size_t) n;
	}
	else
	{
		if (*p->text == '\0')
			return NULL;
		line = p->text;
		len = strcspn(p->text, "\n");
		len += p->text[len] == '\n';
		p->text += len;
	}
	p->line++;
	/* Room for the line, its line end and the NUL in libinih's buffer. */
	if (len - (len > 0 && line[len - 1] == '\n') > (size_t) num - 2)
	{
		config_parse_error(p, p->line, "line too long (more than %d characters; continue a "
						   "long value on indented lines)", num - 2);
		return NULL;
	}
	memcpy(str, line, len);
	str[len] = '\0';
	p->indented = len > 0 && (line[0] == ' ' || line[0] == '\t');
	return str;
}

static void
config_append(struct pepsi_config *cfg, const char *scope, const char *section,
			  const char *option, const char *value, int line)
{
	struct config_entry *e;

	if (cfg->count == cfg->capacity)
	{
		cfg->capacity = cfg->capacity ? cfg->capacity * 2 : 32;
		cfg->entries = xrealloc(cfg->entries, cfg->capacity * sizeof(*cfg->entries));
	}
	e = &cfg->entries[cfg->count++];
	e->scope = scope ? xstrdup(scope) : NULL;
	e->section = xstrdup(section);
	e->option = xstrdup(option);
	e->value = xstrdup(value);
	e->line = line;
}

/*
 * libinih hands an indented line after an option to the handler as more of
 * that option's value (as Python's configparser does): join it with a space.
 */
static bool
config_continue_value(struct config_parse *p, const char *section, const char *option,
					  const char *value)
{
	struct config_entry *last;
	char	   *joined;

	if (!p->indented || p->cfg->count == 0)
		return false;
	last = &p->cfg->entries[p->cfg->count - 1];
	if (last->scope || strcmp(last->section, section) != 0 || strcmp(last->option, option) != 0)
		return false;
	joined = xasprintf("%s%s%s", last->value, *last->value && *value ? " " : "", value);
	free(last->value);
	last->value = joined;
	return true;
}

static int
config_handle(void *user, const char *section, const char *option, const char *value)
{
	struct config_parse *p = user;
	struct pepsi_config *cfg = p->cfg;

	if (p->failed)
		return 0;
	if (section[0] == '\0')
	{
		config_parse_error(p, p->line, "option %s is outside any section", option);
		return 0;
	}
	if (!config_section_known(section))
	{
		config_parse_error(p, p->line, "unknown section [%s] (known: [pepsi], [database], "
						   "[dispatch], [ingress], [sendmail], [listener-<name>], [stage-<name>], "
						   "[dkim-key-<name>], [srs])", section);
		return 0;
	}
	if (!config_option_known(section, option))
	{
		config_parse_error(p, p->line, "[%s] has no option %s%s", section, option,
						   config_option_name_valid(option) ? "" : " (option names are upper case)");
		return 0;
	}
	if (config_control_character(value))
	{
		config_parse_error(p, p->line, "[%s] %s: the value has a control character",
						   section, option);
		return 0;
	}
	if (config_continue_value(p, section, option, value))
		return 1;
	for (size_t i = 0; i < cfg->count; i++)
		if (strcmp(cfg->entries[i].section, section) == 0
			&& strcmp(cfg->entries[i].option, option) == 0)
		{
			config_parse_error(p, p->line, "[%s] %s is set twice (first at line %d)",
							   section, option, cfg->entries[i].line);
			return 0;
		}
	config_append(cfg, NULL, section, option, value, p->line);
	return 1;
}

static struct pepsi_config *
config_parse(struct config_parse *p, const char *name)
{
	int			rc;

	p->cfg = xcalloc(1, sizeof(*p->cfg));
	p->cfg->path = xstrdup(name);
	p->cfg->index = xcalloc(1, sizeof(*p->cfg->index));
	rc = ini_parse_stream(config_read_line, p, config_handle, p);
	free(p->line_buffer);
	/* rc is the first line libinih refused, be it ours or a line it could not parse. */
	if (rc > 0 && (!p->failed || rc < p->error_line))
	{
		p->failed = false;
		config_parse_error(p, rc, "malformed line (expected [section] or OPTION = value)");
	}
	if (rc != 0 || p->failed)
	{
		config_free(p->cfg);
		return NULL;
	}
	return p->cfg;
}

struct pepsi_config *
config_load(const char *path, char *err, size_t errlen)
{
	struct config_parse p = {0};
	struct pepsi_config *cfg;

	p.file = fopen(path, "r");
	p.err = err;
	p.errlen = errlen;
	if (p.file == NULL)
	{
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	cfg = config_parse(&p, path);
	fclose(p.file);
	return cfg;
}

struct pepsi_config *
config_parse_string(const char *text, const char *name, char *err, size_t errlen)
{
	struct config_parse p = {0};

	p.text = text;
	p.err = err;
	p.errlen = errlen;
	return config_parse(&p, name);
}

void
config_free(struct pepsi_config *cfg)
{
	if (cfg == NULL)
		return;
	for (size_t i = 0; i < cfg->count; i++)
	{
		free(cfg->entries[i].scope);
		free(cfg->entries[i].section);
		free(cfg->entries[i].option);
		free(cfg->entries[i].value);
	}
	free(cfg->entries);
	free(cfg->path);
	if (cfg->index)
		free(cfg->index->order);
	free(cfg->index);
	free(cfg);
}

bool
config_add_override(struct pepsi_config *cfg, const char *scope, const char *section,
					const char *option, const char *value, char *err, size_t errlen)
{
	const char *why;

	if (!config_section_overridable(section))
	{
		snprintf(err, errlen, "override [%s] %s refused: [%s] is never read from the database",
				 section, option, section);
		return false;
	}
	if (!config_option_known(section, option))
	{
		snprintf(err, errlen, "override [%s] %s refused: the section has no such option",
				 section, option);
		return false;
	}
	if ((why = config_file_only_reason(section, option)) != NULL)
	{
		snprintf(err, errlen, "override [%s] %s refused: %s is read only from the file",
				 section, option, why);
		return false;
	}
	if (config_control_character(value))
	{
		snprintf(err, errlen, "override [%s] %s refused: the value has a control character",
				 section, option);
		return false;
	}
	if (strcmp(option, "PROGRAM") == 0 && !config_program_name_valid(value))
	{
		snprintf(err, errlen, "override [%s] PROGRAM refused: \"%.200s\" is not a program name "
				 "(from the database PROGRAM names a program of Pepsi's, never a path)",
				 section, value);
		return false;
	}
	if (strcmp(scope, "global") != 0
		&& !(strncmp(scope, "domain:", 7) == 0 && scope[7] != '\0')
		&& !(strncmp(scope, "address:", 8) == 0 && scope[8] != '\0'))
	{
		snprintf(err, errlen, "override [%s] %s refused: bad scope \"%s\"", section, option, scope);
		return false;
	}
	config_append(cfg, scope, section, option, value, 0);
	return true;
}

static const struct pepsi_config *config_sorting;

static int
config_entry_compare(const void *a, const void *b)
{
	const struct config_entry *x = &config_sorting->entries[*(const size_t *) a];
	const struct config_entry *y = &config_sorting->entries[*(const size_t *) b];
	int			c = strcmp(x->section, y->section);

	if (c == 0)
		c = strcmp(x->option, y->option);
	if (c == 0)
		c = (*(const size_t *) a > *(const size_t *) b) - (*(const size_t *) a < *(const size_t *) b);
	return c;
}

static void
config_index_build(const struct pepsi_config *cfg)
{
	struct config_index *index = cfg->index;

	free(index->order);
	index->order = xcalloc(cfg->count + 1, sizeof(size_t));
	for (size_t i = 0; i < cfg->count; i++)
		index->order[i] = i;
	config_sorting = cfg;
	qsort(index->order, cfg->count, sizeof(size_t), config_entry_compare);
	config_sorting = NULL;
	index->built_for = cfg->count;
}

/* The range [*first, *end) of index positions holding section's option. */
static void
config_index_range(const struct pepsi_config *cfg, const char *section, const char *option,
				   size_t *first, size_t *end)
{
	const size_t *order;
	size_t		lo = 0;
	size_t		hi = cfg->count;

	if (cfg->index->built_for != cfg->count)
		config_index_build(cfg);
	order = cfg->index->order;
	while (lo < hi)
	{
		size_t		mid = lo + (hi - lo) / 2;
		const struct config_entry *e = &cfg->entries[order[mid]];
		int			c = strcmp(e->section, section);

		if (c == 0)
			c = strcmp(e->option, option);
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*first = lo;
	while (hi < cfg->count && strcmp(cfg->entries[order[hi]].section, section) == 0
		   && strcmp(cfg->entries[order[hi]].option, option) == 0)
		hi++;
	*end = hi;
}

/* How specific an entry's scope is for this lookup: 0 when it does not apply. */
static int
config_scope_rank(const struct config_entry *e, const char *domain, const char *address)
{
	if (e->scope == NULL)
		return 1;
	if (strcmp(e->scope, "global") == 0)
		return 2;
	if (domain && strncmp(e->scope, "domain:", 7) == 0 && strcasecmp(e->scope + 7, domain) == 0)
		return 3;
	if (address && strncmp(e->scope, "address:", 8) == 0 && strcasecmp(e->scope + 8, address) == 0)
		return 4;
	return 0;
}

/* The most specific value: address, then domain, then global, then the file; the last of equals. */
static const struct config_entry *
config_lookup(const struct pepsi_config *cfg, const char *section, const char *option,
			  const char *domain, const char *address)
{
	const struct config_entry *best = NULL;
	int			best_rank = 0;
	size_t		first = 0;
	size_t		end = cfg->count;

	if (address && domain == NULL && strrchr(address, '@'))
		domain = strrchr(address, '@') + 1;
	if (cfg->index)
		config_index_range(cfg, section, option, &first, &end);
	for (size_t i = first; i < end; i++)
	{
		const struct config_entry *e = &cfg->entries[cfg->index ? cfg->index->order[i] : i];
		int			rank;

		if (!cfg->index && (strcmp(e->section, section) != 0 || strcmp(e->option, option) != 0))
			continue;
		rank = config_scope_rank(e, domain, address);
		if (rank > 0 && rank >= best_rank)
		{
			best = e;
			best_rank = rank;
		}
	}
	return best;
}

const char *
config_get_for(const struct pepsi_config *cfg, const char *section, const char *option,
			   const char *domain, const char *address)
{
	const struct config_entry *e = config_lookup(cfg, section, option, domain, address);

	return e ? e->value : NULL;
}

const char *
config_get(const struct pepsi_config *cfg, const char *section, const char *option)
{
	return config_get_for(cfg, section, option, NULL, NULL);
}

const char *
config_origin(const struct pepsi_config *cfg, const char *section, const char *option,
			  char *out, size_t outlen)
{
	const struct config_entry *e = config_lookup(cfg, section, option, NULL, NULL);

	if (e == NULL)
		snprintf(out, outlen, "%s (default)", cfg->path);
	else if (e->scope)
		snprintf(out, outlen, "override %s", e->scope);
	else
		snprintf(out, outlen, "%s:%d", cfg->path, e->line);
	return out;
}

static void
config_value_error(const struct pepsi_config *cfg, const char *section, const char *option,
				   char *err, size_t errlen, const char *fmt, ...)
{
	char		origin[512];
	char		reason[512];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	snprintf(err, errlen, "%s: [%s] %s: %s",
			 config_origin(cfg, section, option, origin, sizeof(origin)), section, option, reason);
}

bool
config_get_long(const struct pepsi_config *cfg, const char *section, const char *option,
				long fallback, long min, long max, long *out, char *err, size_t errlen)
{
	const char *value = config_get(cfg, section, option);
	char	   *end;
	long		n;

	if (value == NULL)
	{
		*out = fallback;
		return true;
	}
	errno = 0;
	n = strtol(value, &end, 10);
	if (errno || end == value || *end != '\0')
	{
		config_value_error(cfg, section, option, err, errlen, "\"%s\" is not a whole number", value);
		return false;
	}
	if (n < min || n > max)
	{
		config_value_error(cfg, section, option, err, errlen, "%ld is outside %ld..%ld", n, min, max);
		return false;
	}
	*out = n;
	return true;
}

bool
config_get_bool(const struct pepsi_config *cfg, const char *section, const char *option,
				bool fallback, bool *out, char *err, size_t errlen)
{
	const char *value = config_get(cfg, section, option);

	if (value == NULL)
		*out = fallback;
	else if (strcasecmp(value, "yes") == 0 || strcasecmp(value, "true") == 0
			 || strcasecmp(value, "on") == 0 || strcmp(value, "1") == 0)
		*out = true;
	else if (strcasecmp(value, "no") == 0 || strcasecmp(value, "false") == 0
			 || strcasecmp(value, "off") == 0 || strcmp(value, "0") == 0)
		*out = false;
	else
	{
		config_value_error(cfg, section, option, err, errlen,
						   "\"%s\" is not a boolean (yes/no, true/false, on/off, 1/0)", value);
		return false;
	}
	return true;
}

bool
config_get_duration_ms(const struct pepsi_config *cfg, const char *section, const char *option,
					   long fallback_ms, long min_ms, long *out, char *err, size_t errlen)
{
	const char *value = config_get(cfg, section, option);
	char	   *end;
	double		n;
	double		unit = 1000;

	if (value == NULL)
	{
		*out = fallback_ms;
		return true;
	}
	errno = 0;
	n = strtod(value, &end);
	if (errno || end == value || !isfinite(n) || n < 0)
	{
		config_value_error(cfg, section, option, err, errlen, "\"%s\" is not a duration", value);
		return false;
	}
	if (strcmp(end, "ms") == 0)
		unit = 1;
	else if (*end == '\0' || strcmp(end, "s") == 0)
		unit = 1000;
	else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
		unit = 60 * 1000;
	else if (strcmp(end, "h") == 0)
		unit = 3600 * 1000;
	else if (strcmp(end, "d") == 0)
		unit = 86400.0 * 1000;
	else
	{
		config_value_error(cfg, section, option, err, errlen,
						   "\"%s\" has an unknown unit (use ms, s, m, h or d)", value);
		return false;
	}
	if (n * unit > (double) LONG_MAX / 2 || n * unit < min_ms)
	{
		config_value_error(cfg, section, option, err, errlen,
						   "\"%s\" is out of range (at least %ld ms)", value, min_ms);
		return false;
	}
	*out = (long) (n * unit);
	return true;
}

size_t
config_sections(const struct pepsi_config *cfg, const char *prefix, const char **names, size_t max)
{
	size_t		count = 0;

	for (size_t i = 0; i < cfg->count; i++)
	{
		const char *section = cfg->entries[i].section;
		bool		seen = false;

		if (strncmp(section, prefix, strlen(prefix)) != 0)
			continue;
		for (size_t j = 0; j < count && !seen; j++)
			seen = strcmp(names[j], section) == 0;
		if (!seen && count < max)
			names[count++] = section;
	}
	return count;
}
