/*
 * config.c: see config.h.  Parsing is libinih's; what this file adds is
 * the schema's checks (schema/options.def, through options.h) of every
 * value with the place it came from, the overlay, and the typed getters.
 */
#include "config/config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/config_internal.h"
#include "options.h"

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
	size_t *order;
	size_t	built_for; /* the entry count it was built for */
};

/*
 * The options schema/options.def declares are file-only by their scope.
 * A third-party stage's options are not declared, so these names are
 * file-only in any section whatever the program: the paths a program
 * reads, where mail goes and how the next hop is authenticated.  A
 * compromised database must not change them (pepsi--0.1--0.2.sql refuses
 * the same rows).  section NULL: any section; an option ending in "_"
 * stands for every option with that ending ("_FILE").
 */
static const struct
{
	const char *section;
	const char *option;
	const char *why;
} config_file_only[] = {
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
	size_t len = strlen(option);

	for (size_t i = 0; i < sizeof(config_file_only) / sizeof(config_file_only[0]); i++)
	{
		const char *name = config_file_only[i].option;
		size_t		n = strlen(name);
		bool		matches = name[0] == '_' ? len > n && strcmp(option + len - n, name) == 0
											 : strcmp(option, name) == 0;

		if (matches && (config_file_only[i].section == NULL || strcmp(section, config_file_only[i].section) == 0))
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
	return option_section_known(section);
}

bool
config_section_overridable(const char *section)
{
	return option_section_overridable(section);
}

static bool
config_is_stage_section(const char *section)
{
	return strncmp(section, "stage-", 6) == 0 && section[6] != '\0';
}

bool
config_option_known(const char *section, const char *option)
{
	if (!config_option_name_valid(option))
		return false;
	/* A stage section also takes its program's options (checked with the PROGRAM known). */
	return option_find(section, NULL, option) != NULL || config_is_stage_section(section);
}

/* The PROGRAM of a [stage-*] section, or NULL. */
static const char *
config_section_program(const struct pepsi_config *cfg, const char *section)
{
	return config_is_stage_section(section) ? config_get(cfg, section, "PROGRAM") : NULL;
}

const struct option_def *
config_option_def(const struct pepsi_config *cfg, const char *section, const char *option)
{
	return option_find(section, config_section_program(cfg, section), option);
}

/*
 * Is option one section may hold?  def is its definition, or NULL for the
 * option of a stage program the schema does not know (checked by it).
 */
static bool
config_option_allowed(const struct pepsi_config *cfg, const char *section, const char *option,
					  const struct option_def **def)
{
	*def = config_option_def(cfg, section, option);
	if (*def)
		return true;
	return config_is_stage_section(section) && config_option_name_valid(option)
		   && !option_program_declared(config_section_program(cfg, section));
}

/* Why option is not one of section's, for a message. */
static const char *
config_option_refusal(const struct pepsi_config *cfg, const char *section, const char *option,
					  char *out, size_t outlen)
{
	const char *program = config_section_program(cfg, section);

	if (!config_option_name_valid(option))
		snprintf(out, outlen, "[%s] has no option %s (option names are upper case)", section, option);
	else if (program)
		snprintf(out, outlen, "[%s] has no option %s (neither every stage nor its PROGRAM %s "
							  "takes it)",
				 section, option, option_program_name(program));
	else
		snprintf(out, outlen, "[%s] has no option %s", section, option);
	return out;
}


static void config_parse_error(struct config_parse *p, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Record the first refusal; later ones are consequences or noise. */
static void
config_parse_error(struct config_parse *p, int line, const char *fmt, ...)
{
	char	reason[768];
	va_list ap;

	if (p->failed)
		return;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	snprintf(p->err, p->errlen, "%s:%d: %s", p->name, line, reason);
	p->failed = true;
	p->error_line = line;
}

static char *
config_read_line(char *str, int num, void *stream)
{
	struct config_parse *p = stream;
	const char			*line;
	size_t				 len;

	if (p->failed)
		return NULL; /* nothing after the first refusal matters */
	if (p->file)
	{
		ssize_t n = getline(&p->line_buffer, &p->line_capacity, p->file);

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
									   "long value on indented lines)",
						   num - 2);
		return NULL;
	}
	memcpy(str, line, len);
	str[len] = '\0';
	p->indented = len > 0 && (line[0] == ' ' || line[0] == '\t');
	return str;
}

static void
config_append(struct pepsi_config *cfg, const char *scope, const char *section,
			  const char *option, const char *value, int line, const char *file)
{
	struct config_entry *e;

	if (cfg->count == cfg->capacity)
	{
		cfg->capacity = cfg->capacity ? cfg->capacity * 2 : 32;
		cfg->entries = xrealloc(cfg->entries, cfg->capacity * sizeof(*cfg->entries));
	}
	e = &cfg->entries[cfg->count++];
	e->dropin = false;
	e->scope = scope ? xstrdup(scope) : NULL;
	e->section = xstrdup(section);
	e->option = xstrdup(option);
	e->value = xstrdup(value);
	e->line = line;
	e->file = file;
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
	char				*joined;

	if (!p->indented || p->cfg->count == 0)
		return false;
	last = &p->cfg->entries[p->cfg->count - 1];
	if (last->scope || last->file != p->fragment || strcmp(last->section, section) != 0
		|| strcmp(last->option, option) != 0)
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
									   "[dkim-key-<name>], [srs])",
						   section);
		return 0;
	}
	/* A stage program's options are checked once its PROGRAM is known (config_check_file). */
	if (!config_option_known(section, option))
	{
		char why[512];

		config_parse_error(p, p->line, "%s", config_option_refusal(p->cfg, section, option, why, sizeof(why)));
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
			struct config_entry *e = &cfg->entries[i];

			if (p->dropin && e->file != p->fragment && (e->file == NULL || e->dropin))
			{
				/* A drop-in replaces what pepsi.conf or an earlier drop-in says. */
				free(e->value);
				e->value = xstrdup(value);
				e->line = p->line;
				e->file = p->fragment;
				e->dropin = true;
				return 1;
			}
			if (cfg->entries[i].file == p->fragment)
				config_parse_error(p, p->line, "[%s] %s is set twice (first at line %d)", section,
								   option, cfg->entries[i].line);
			else
				config_parse_error(p, p->line, "[%s] %s is set twice (first at %s:%d)", section,
								   option, cfg->entries[i].file ? cfg->entries[i].file : cfg->path,
								   cfg->entries[i].line);
			return 0;
		}
	config_append(cfg, NULL, section, option, value, p->line, p->fragment);
	cfg->entries[cfg->count - 1].dropin = p->dropin;
	return 1;
}

/*
 * Every value of the file against the schema, once the whole file is read:
 * a value continued on indented lines is whole only then, and a stage
 * section's PROGRAM (which says what its other options are) may come after
 * them.
 */
static void
config_check_file(struct config_parse *p)
{
	struct pepsi_config *cfg = p->cfg;

	for (size_t i = 0; i < cfg->count && !p->failed; i++)
	{
		const struct config_entry *e = &cfg->entries[i];
		const struct option_def	  *def;
		char					   why[512];

		p->name = e->file ? e->file : cfg->path;
		if (!config_option_allowed(cfg, e->section, e->option, &def))
			config_parse_error(p, e->line, "%s", config_option_refusal(cfg, e->section, e->option, why, sizeof(why)));
		else if ((e->file == NULL || e->dropin) && option_is_secret(def))
		{
			char *dir = config_secrets_dir(cfg->path);

			config_parse_error(p, e->line, "[%s] %s is a secret: set it in a fragment of %s "
										   "(owned by root, mode 0640 at most), never in the file "
										   "every program reads",
							   e->section, e->option, dir);
			free(dir);
		}
		else if (e->file && !e->dropin && !option_is_secret(def))
			config_parse_error(p, e->line, "[%s] %s is not a secret: a secrets.d fragment holds "
										   "only secrets (schema/options.def SECRET); set it in %s",
							   e->section, e->option, cfg->path);
		/* A secret's value is never repeated in a message. */
		else if (def && !option_value_check(def, e->value, false, why, sizeof(why)))
			config_parse_error(p, e->line, "[%s] %s = %s: %s", e->section, e->option,
							   option_is_secret(def) ? "(secret)" : e->value, why);
	}
}

/* Read one file or string into p->cfg; false when refused (p->err says why). */
bool
config_read(struct config_parse *p)
{
	int rc;

	p->line = 0;
	p->indented = false;
	rc = ini_parse_stream(config_read_line, p, config_handle, p);
	if (p->line_buffer)
		explicit_bzero(p->line_buffer, p->line_capacity); /* a fragment's secrets */
	free(p->line_buffer);
	p->line_buffer = NULL;
	p->line_capacity = 0;
	/* rc is the first line libinih refused, be it ours or a line it could not parse. */
	if (rc > 0 && (!p->failed || rc < p->error_line))
	{
		p->failed = false;
		config_parse_error(p, rc, "malformed line (expected [section] or OPTION = value)");
	}
	return rc == 0 && !p->failed;
}

static struct pepsi_config *
config_new(const char *name)
{
	struct pepsi_config *cfg = xcalloc(1, sizeof(*cfg));

	cfg->path = xstrdup(name);
	cfg->index = xcalloc(1, sizeof(*cfg->index));
	return cfg;
}

/* Check what was read whole; cfg, or NULL (freed) with the refusal in p->err. */
static struct pepsi_config *
config_finish(struct config_parse *p, bool read)
{
	if (read)
		config_check_file(p);
	if (!read || p->failed)
	{
		config_free(p->cfg);
		return NULL;
	}
	return p->cfg;
}

static struct pepsi_config *
config_parse(struct config_parse *p, const char *name)
{
	p->cfg = config_new(name);
	p->name = p->cfg->path;
	return config_finish(p, config_read(p));
}

struct pepsi_config *
config_load(const char *path, char *err, size_t errlen)
{
	struct config_parse p = {0};
	bool				read;

	p.file = fopen(path, "r");
	p.err = err;
	p.errlen = errlen;
	if (p.file == NULL)
	{
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	p.cfg = config_new(path);
	p.name = p.cfg->path;
	read = config_read(&p);
	fclose(p.file);
	p.file = NULL;
	if (read)
		read = config_read_dropins(&p) && config_read_secrets(&p);
	return config_finish(&p, read);
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
		if (cfg->entries[i].file)
			explicit_bzero(cfg->entries[i].value, strlen(cfg->entries[i].value));
		free(cfg->entries[i].value);
	}
	free(cfg->entries);
	for (size_t i = 0; i < cfg->fragment_count; i++)
		free(cfg->fragments[i]);
	free(cfg->fragments);
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
	const struct option_def *def;
	const char				*file_only;
	char					 why[512];

	if (!config_section_overridable(section))
	{
		snprintf(err, errlen, "override [%s] %s refused: [%s] is never read from the database",
				 section, option, section);
		return false;
	}
	if (!config_option_allowed(cfg, section, option, &def))
	{
		snprintf(err, errlen, "override %s refused: %s", scope,
				 config_option_refusal(cfg, section, option, why, sizeof(why)));
		return false;
	}
	if (def == NULL && (file_only = config_file_only_reason(section, option)) != NULL)
	{
		snprintf(err, errlen, "override [%s] %s refused: %s is read only from the file",
				 section, option, file_only);
		return false;
	}
	if (config_control_character(value))
	{
		snprintf(err, errlen, "override [%s] %s refused: the value has a control character",
				 section, option);
		return false;
	}
	if (strcmp(scope, "global") != 0
		&& !(strncmp(scope, "domain:", 7) == 0 && scope[7] != '\0')
		&& !(strncmp(scope, "address:", 8) == 0 && scope[8] != '\0'))
	{
		snprintf(err, errlen, "override [%s] %s refused: bad scope \"%s\"", section, option, scope);
		return false;
	}
	if (def && (!option_scope_check(def, scope, why, sizeof(why)) || !option_value_check(def, value, true, why, sizeof(why))))
	{
		snprintf(err, errlen, "override %s [%s] %s = %.200s refused: %s", scope, section, option, value,
				 why);
		return false;
	}
	if (config_route_refusal(cfg, section, option, value, why, sizeof(why)))
	{
		snprintf(err, errlen, "override %s [%s] %s = %.200s refused: %s", scope, section, option, value,
				 why);
		return false;
	}
	config_append(cfg, scope, section, option, value, 0, NULL);
	return true;
}

static const struct pepsi_config *config_sorting;

static int
config_entry_compare(const void *a, const void *b)
{
	const struct config_entry *x = &config_sorting->entries[*(const size_t *) a];
	const struct config_entry *y = &config_sorting->entries[*(const size_t *) b];
	int						   c = strcmp(x->section, y->section);

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
	size_t		  lo = 0;
	size_t		  hi = cfg->count;

	if (cfg->index->built_for != cfg->count)
		config_index_build(cfg);
	order = cfg->index->order;
	while (lo < hi)
	{
		size_t					   mid = lo + (hi - lo) / 2;
		const struct config_entry *e = &cfg->entries[order[mid]];
		int						   c = strcmp(e->section, section);

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
	int						   best_rank = 0;
	size_t					   first = 0;
	size_t					   end = cfg->count;

	if (address && domain == NULL && strrchr(address, '@'))
		domain = strrchr(address, '@') + 1;
	if (cfg->index)
		config_index_range(cfg, section, option, &first, &end);
	for (size_t i = first; i < end; i++)
	{
		const struct config_entry *e = &cfg->entries[cfg->index ? cfg->index->order[i] : i];
		int						   rank;

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
		snprintf(out, outlen, "%s:%d", e->file ? e->file : cfg->path, e->line);
	return out;
}

bool
config_option_changed(const struct pepsi_config *before, const struct pepsi_config *after,
					  const char *section, const char *option)
{
	const struct option_def *def = config_option_def(after, section, option);
	const char				*was = config_get(before, section, option);
	const char				*is = config_get(after, section, option);

	if (def && def->default_value)
	{
		was = was ? was : def->default_value;
		is = is ? is : def->default_value;
	}
	if (was == NULL || is == NULL)
		return was != is;
	return strcmp(was, is) != 0;
}

/*
 * The typed getters.  Every value was checked against the schema when it
 * was loaded, so a getter only parses; what it cannot parse, or an option
 * the schema does not have, is a bug in the program, and fatal.
 */
static const struct option_def *
config_typed_def(const struct pepsi_config *cfg, const char *section, const char *option,
				 enum option_type type)
{
	const struct option_def *def = config_option_def(cfg, section, option);

	if (def == NULL)
		fatalx("[%s] %s is read but schema/options.def does not declare it", section, option);
	if (def->type != type && !(type == OPTION_TEXT && def->type != OPTION_BOOL && def->type != OPTION_INT && def->type != OPTION_DURATION && def->type != OPTION_SIZE))
		fatalx("[%s] %s is a%s %s option, read as a%s %s", section, option,
			   def->type == OPTION_INT ? "n" : "", option_type_name(def->type),
			   type == OPTION_INT ? "n" : "", option_type_name(type));
	return def;
}

/* The value in force for the scope (or the schema's default); NULL if neither. */
static const char *
config_typed_value(const struct pepsi_config *cfg, const struct option_def *def, const char *section,
				   const char *domain, const char *address)
{
	const char *value = config_get_for(cfg, section, def->name, domain, address);

	return value ? value : def->default_value;
}

static void config_unparsable(const struct pepsi_config *cfg, const char *section,
							  const char *option, const char *value) __attribute__((noreturn));

static void
config_unparsable(const struct pepsi_config *cfg, const char *section, const char *option,
				  const char *value)
{
	char origin[512];

	fatalx("%s: [%s] %s = %s was not checked when loaded",
		   config_origin(cfg, section, option, origin, sizeof(origin)), section, option, value);
}

bool
config_bool_for(const struct pepsi_config *cfg, const char *section, const char *option,
				const char *domain, const char *address)
{
	const struct option_def *def = config_typed_def(cfg, section, option, OPTION_BOOL);
	const char				*value = config_typed_value(cfg, def, section, domain, address);
	bool					 result = false;

	if (value && !option_parse_bool(value, &result))
		config_unparsable(cfg, section, option, value);
	return result;
}

/* An INT, DURATION (ms) or SIZE (bytes) value, parsed by the type's one parser. */
static long long
config_number_for(const struct pepsi_config *cfg, const char *section, const char *option,
				  const char *domain, const char *address, enum option_type type,
				  bool (*parse)(const char *value, long long *out))
{
	const struct option_def *def = config_typed_def(cfg, section, option, type);
	const char				*value = config_typed_value(cfg, def, section, domain, address);
	long long				 result = 0;

	if (value && !parse(value, &result))
		config_unparsable(cfg, section, option, value);
	return result;
}

long long
config_int_for(const struct pepsi_config *cfg, const char *section, const char *option,
			   const char *domain, const char *address)
{
	return config_number_for(cfg, section, option, domain, address, OPTION_INT, option_parse_int);
}

long long
config_duration_ms_for(const struct pepsi_config *cfg, const char *section, const char *option,
					   const char *domain, const char *address)
{
	return config_number_for(cfg, section, option, domain, address, OPTION_DURATION,
							 option_parse_duration_ms);
}

long long
config_size_for(const struct pepsi_config *cfg, const char *section, const char *option,
				const char *domain, const char *address)
{
	return config_number_for(cfg, section, option, domain, address, OPTION_SIZE, option_parse_size);
}

int
config_enum_for(const struct pepsi_config *cfg, const char *section, const char *option,
				const char *domain, const char *address)
{
	const struct option_def *def = config_typed_def(cfg, section, option, OPTION_ENUM);
	const char				*value = config_typed_value(cfg, def, section, domain, address);
	int						 index = value ? option_enum_index(def, value) : 0;

	if (index < 0)
		config_unparsable(cfg, section, option, value);
	return index;
}

const char *
config_text_for(const struct pepsi_config *cfg, const char *section, const char *option,
				const char *domain, const char *address)
{
	const struct option_def *def = config_typed_def(cfg, section, option, OPTION_TEXT);

	return config_typed_value(cfg, def, section, domain, address);
}

bool
config_bool(const struct pepsi_config *cfg, const char *section, const char *option)
{
	return config_bool_for(cfg, section, option, NULL, NULL);
}

long long
config_int(const struct pepsi_config *cfg, const char *section, const char *option)
{
	return config_int_for(cfg, section, option, NULL, NULL);
}

long long
config_duration_ms(const struct pepsi_config *cfg, const char *section, const char *option)
{
	return config_duration_ms_for(cfg, section, option, NULL, NULL);
}

long long
config_size(const struct pepsi_config *cfg, const char *section, const char *option)
{
	return config_size_for(cfg, section, option, NULL, NULL);
}

int
config_enum(const struct pepsi_config *cfg, const char *section, const char *option)
{
	return config_enum_for(cfg, section, option, NULL, NULL);
}

const char *
config_text(const struct pepsi_config *cfg, const char *section, const char *option)
{
	return config_text_for(cfg, section, option, NULL, NULL);
}

bool
config_list_contains(const char *list, const char *item)
{
	return option_list_contains(list, item);
}

const char *
config_hostname(const struct pepsi_config *cfg)
{
	static char system_name[256];
	const char *configured = config_text(cfg, "pepsi", "HOSTNAME");

	if (configured)
		return configured;
	if (system_name[0] == '\0')
	{
		if (gethostname(system_name, sizeof(system_name)) != 0 || system_name[0] == '\0')
			snprintf(system_name, sizeof(system_name), "localhost");
		system_name[sizeof(system_name) - 1] = '\0';
	}
	return system_name;
}

const char *
config_authserv_id(const struct pepsi_config *cfg)
{
	const char *configured = config_text(cfg, "ingress", "AUTHSERV_ID");

	return configured ? configured : config_hostname(cfg);
}

size_t
config_sections(const struct pepsi_config *cfg, const char *prefix, const char **names, size_t max)
{
	size_t count = 0;

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
