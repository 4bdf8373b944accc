/*
 * options.c: the schema of schema/options.def as a table, and the checks
 * and parsers of option values (see options.h).
 *
 * Compiled into libpepsi and, through extension/src/config_schema.c, into
 * the extension: it uses only the C library, never allocates and never
 * logs, so it runs as well in a backend as in a stage.
 */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define OPTION(where, name, type, scope, default_value, min, max, choices, description) \
	{where, name, OPTION_##type, OPTION_SCOPE_##scope, default_value, min, max, choices, description},
#define UNSKIPPABLE(program, why)
#define SECRET(where, name)
#define OWNER(where, name, lines)

const struct option_def option_table[] = {
#include "options.def"
};

#undef OPTION
#undef UNSKIPPABLE
#undef SECRET
#undef OWNER

const size_t option_count = sizeof(option_table) / sizeof(option_table[0]);

#define OPTION(where, name, type, scope, default_value, min, max, choices, description)
#define UNSKIPPABLE(program, why) {program, why},
#define SECRET(where, name)
#define OWNER(where, name, lines)

static const struct
{
	const char *program;
	const char *why;
} option_unskippable_table[] = {
#include "options.def"
};

#undef OPTION
#undef UNSKIPPABLE
#undef SECRET
#undef OWNER

#define OPTION(where, name, type, scope, default_value, min, max, choices, description)
#define UNSKIPPABLE(program, why)
#define SECRET(where, name) {where, name},
#define OWNER(where, name, lines)

static const struct
{
	const char *where;
	const char *name;
} option_secret_table[] = {
#include "options.def"
};

#undef OPTION
#undef UNSKIPPABLE
#undef SECRET
#undef OWNER

#define OPTION(where, name, type, scope, default_value, min, max, choices, description)
#define UNSKIPPABLE(program, why)
#define SECRET(where, name)
#define OWNER(where, name, lines) {where, name, lines},

static const struct
{
	const char *where;
	const char *name;
	int			lines;
} option_owner_table[] = {
#include "options.def"
};

#undef OPTION
#undef UNSKIPPABLE
#undef SECRET
#undef OWNER

const struct option_def *
option_owner_find(const char *name, bool *lines)
{
	for (size_t i = 0; name && i < sizeof(option_owner_table) / sizeof(option_owner_table[0]); i++)
		if (strcmp(name, option_owner_table[i].name) == 0)
			for (size_t j = 0; j < option_count; j++)
				if (strcmp(option_table[j].where, option_owner_table[i].where) == 0
					&& strcmp(option_table[j].name, name) == 0 && option_table[j].scope == OPTION_SCOPE_ADDRESS)
				{
					if (lines)
						*lines = option_owner_table[i].lines != 0;
					return &option_table[j];
				}
	return NULL;
}

const char *
option_owner_name(size_t index)
{
	return index < sizeof(option_owner_table) / sizeof(option_owner_table[0]) ? option_owner_table[index].name
																			  : NULL;
}

bool
option_owner_value_check(const char *name, const char *value, char *problem, size_t problem_len)
{
	bool					 lines = false;
	const struct option_def *def = option_owner_find(name, &lines);

	if (def == NULL)
	{
		snprintf(problem, problem_len, "%s is not an option an address's owner may set", name);
		return false;
	}
	if (value == NULL)
		return true;
	if (strlen(value) > OPTION_OWNER_VALUE_MAX)
	{
		snprintf(problem, problem_len, "the value of %s is longer than %d bytes", name, OPTION_OWNER_VALUE_MAX);
		return false;
	}
	if (!lines)
		return option_value_check(def, value, true, problem, problem_len);
	for (const char *p = value; *p; p++)
		if (iscntrl((unsigned char) *p) && *p != '\n' && *p != '\r' && *p != '\t')
		{
			snprintf(problem, problem_len, "%s is text: lines and tabs, no other control character", name);
			return false;
		}
	return true;
}

bool
option_is_secret(const struct option_def *def)
{
	for (size_t i = 0; def && i < sizeof(option_secret_table) / sizeof(option_secret_table[0]); i++)
		if (strcmp(def->where, option_secret_table[i].where) == 0 && strcmp(def->name, option_secret_table[i].name) == 0)
			return true;
	return false;
}

int
option_unskippable_index(const char *program, const char **why)
{
	const char *name = option_program_name(program);

	for (size_t i = 0; name && i < sizeof(option_unskippable_table) / sizeof(option_unskippable_table[0]); i++)
		if (strcmp(name, option_unskippable_table[i].program) == 0)
		{
			if (why)
				*why = option_unskippable_table[i].why;
			return (int) i;
		}
	return -1;
}

const char *
option_type_name(enum option_type type)
{
	switch (type)
	{
		case OPTION_TEXT:
			return "text";
		case OPTION_BOOL:
			return "boolean";
		case OPTION_INT:
			return "integer";
		case OPTION_DURATION:
			return "duration";
		case OPTION_SIZE:
			return "size";
		case OPTION_STAGE:
			return "stage";
		case OPTION_PROGRAM:
			return "program";
		case OPTION_DOMAIN:
			return "domain";
		case OPTION_DOMAIN_LIST:
			return "domain_list";
		case OPTION_ADDRESS_LIST:
			return "address_list";
		case OPTION_PATH:
			return "path";
		case OPTION_ENUM:
			return "enum";
		case OPTION_NAME:
			return "name";
	}
	return "text";
}

const char *
option_scope_name(enum option_scope scope)
{
	switch (scope)
	{
		case OPTION_SCOPE_FILE:
			return "file";
		case OPTION_SCOPE_GLOBAL:
			return "global";
		case OPTION_SCOPE_DOMAIN:
			return "domain";
		case OPTION_SCOPE_ADDRESS:
			return "address";
	}
	return "file";
}

/* ---------------------------------------------------------------------------
 * Sections and lookups
 * ------------------------------------------------------------------------- */

const char *
option_program_name(const char *program)
{
	const char *slash = program ? strrchr(program, '/') : NULL;

	return slash ? slash + 1 : program;
}

/* A stage program's lines are keyed by its name, which no section has. */
static bool
option_where_is_program(const char *where)
{
	return strncmp(where, "pepsi-", 6) == 0;
}

/* Does where ("dispatch", "listener-*") cover section? */
static bool
option_where_matches(const char *where, const char *section)
{
	size_t len = strlen(where);

	if (len >= 2 && where[len - 1] == '*')
		return strncmp(section, where, len - 1) == 0 && section[len - 1] != '\0';
	return strcmp(where, section) == 0;
}

bool
option_program_declared(const char *program)
{
	const char *name = option_program_name(program);

	if (name == NULL)
		return false;
	for (size_t i = 0; i < option_count; i++)
		if (strcmp(option_table[i].where, name) == 0)
			return true;
	return false;
}

bool
option_section_known(const char *section)
{
	for (size_t i = 0; i < option_count; i++)
		if (!option_where_is_program(option_table[i].where)
			&& option_where_matches(option_table[i].where, section))
			return true;
	return false;
}

bool
option_section_overridable(const char *section)
{
	if (strncmp(section, "stage-", 6) == 0 && section[6] != '\0')
		return true; /* its program's options may be, whatever the program */
	for (size_t i = 0; i < option_count; i++)
		if (option_table[i].scope != OPTION_SCOPE_FILE
			&& !option_where_is_program(option_table[i].where)
			&& option_where_matches(option_table[i].where, section))
			return true;
	return false;
}

static const struct option_def *
option_find_in_table(const char *section, const char *program_name, const char *name)
{
	for (size_t i = 0; i < option_count; i++)
		if (strcmp(option_table[i].name, name) == 0
			&& !option_where_is_program(option_table[i].where)
			&& option_where_matches(option_table[i].where, section))
			return &option_table[i];
	if (program_name == NULL || strncmp(section, "stage-", 6) != 0)
		return NULL;
	for (size_t i = 0; i < option_count; i++)
		if (strcmp(option_table[i].name, name) == 0
			&& strcmp(option_table[i].where, program_name) == 0)
			return &option_table[i];
	return NULL;
}

/*
 * option_find's answers, by section, program and name: a stage reads
 * its options by name for every row (a relay a dozen a row), and the
 * table has hundreds of lines.  The answer depends on the three strings
 * only (the table is fixed), so it is kept for good; an entry is
 * replaced by another whose strings hash alike.  Per thread, as the
 * callers may be threads of one program.
 */
#define OPTION_MEMO_SIZE 256
#define OPTION_MEMO_KEY 64

struct option_memo
{
	bool					 used;
	char					 section[OPTION_MEMO_KEY];
	char					 program[OPTION_MEMO_KEY]; /* "" for none */
	char					 name[OPTION_MEMO_KEY];
	const struct option_def *def;
};
static __thread struct option_memo option_memo[OPTION_MEMO_SIZE];

static uint32_t
option_memo_hash(uint32_t h, const char *s)
{
	for (; *s; s++)
		h = (h ^ (unsigned char) *s) * 16777619u;
	return (h ^ 0xffu) * 16777619u; /* (so that "ab" + "c" and "a" + "bc" differ) */
}

const struct option_def *
option_find(const char *section, const char *program, const char *name)
{
	const char		   *program_name = option_program_name(program);
	const char		   *p = program_name ? program_name : "";
	struct option_memo *m;

	if (strlen(section) >= OPTION_MEMO_KEY || strlen(p) >= OPTION_MEMO_KEY || strlen(name) >= OPTION_MEMO_KEY)
		return option_find_in_table(section, program_name, name);
	m = &option_memo[option_memo_hash(option_memo_hash(option_memo_hash(2166136261u, section), p), name)
					 % OPTION_MEMO_SIZE];
	if (m->used && strcmp(m->name, name) == 0 && strcmp(m->section, section) == 0 && strcmp(m->program, p) == 0)
		return m->def;
	m->def = option_find_in_table(section, program_name, name);
	strcpy(m->section, section);
	strcpy(m->program, p);
	strcpy(m->name, name);
	m->used = true;
	return m->def;
}

/* ---------------------------------------------------------------------------
 * Parsers
 * ------------------------------------------------------------------------- */

bool
option_parse_bool(const char *value, bool *out)
{
	static const char *const yes[] = {"yes", "true", "on", "1"};
	static const char *const no[] = {"no", "false", "off", "0"};

	for (size_t i = 0; i < 4; i++)
	{
		if (strcasecmp(value, yes[i]) == 0)
		{
			*out = true;
			return true;
		}
		if (strcasecmp(value, no[i]) == 0)
		{
			*out = false;
			return true;
		}
	}
	return false;
}

/* "-?[0-9]{1,18}": what fits a bigint whatever its digits. */
bool
option_parse_int(const char *value, long long *out)
{
	const char *p = value + (value[0] == '-');
	size_t		digits = strspn(p, "0123456789");

	if (digits == 0 || digits > 18 || p[digits] != '\0')
		return false;
	*out = strtoll(value, NULL, 10);
	return true;
}

/* "[0-9]{1,12}(.[0-9]{1,9})?" then the rest in *end; the value in *number. */
static bool
option_parse_decimal(const char *value, double *number, const char **end)
{
	size_t whole = strspn(value, "0123456789");
	size_t fraction = 0;
	char   text[32];

	if (whole == 0 || whole > 12)
		return false;
	if (value[whole] == '.')
	{
		fraction = strspn(value + whole + 1, "0123456789");
		if (fraction == 0 || fraction > 9)
			return false;
		fraction++;
	}
	memcpy(text, value, whole + fraction);
	text[whole + fraction] = '\0';
	*number = strtod(text, NULL);
	*end = value + whole + fraction;
	return true;
}

bool
option_parse_duration_ms(const char *value, long long *out)
{
	static const struct
	{
		const char *unit;
		double		ms;
	} units[] = {
		{"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"min", 60000}, {"h", 3600000}, {"d", 86400000}};
	double		number;
	const char *unit;

	if (!option_parse_decimal(value, &number, &unit))
		return false;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (strcmp(unit, units[i].unit) == 0)
		{
			*out = (long long) (number * units[i].ms);
			return true;
		}
	return false;
}

bool
option_parse_size(const char *value, long long *out)
{
	size_t	  digits = strspn(value, "0123456789");
	long long unit = 1;
	long long number;

	if (digits == 0 || digits > 15)
		return false;
	if (value[digits] == 'k' || value[digits] == 'K')
		unit = 1024;
	else if (value[digits] == 'M')
		unit = 1024 * 1024;
	else if (value[digits] == 'G')
		unit = 1024 * 1024 * 1024;
	else if (value[digits] != '\0')
		return false;
	if (unit != 1 && value[digits + 1] != '\0')
		return false;
	number = strtoll(value, NULL, 10);
	if (number > LLONG_MAX / unit)
		return false;
	*out = number * unit;
	return true;
}

int
option_enum_index(const struct option_def *def, const char *value)
{
	const char *p = def->choices ? def->choices : "";
	size_t		len = strlen(value);

	for (int index = 0; *p; index++)
	{
		size_t n = strcspn(p, "|");

		if (n == len && strncasecmp(p, value, n) == 0)
			return index;
		p += n + (p[n] == '|');
	}
	return -1;
}

const char *
option_list_next(const char **cursor, size_t *len)
{
	const char *item;

	if (*cursor == NULL)
		return NULL;
	*cursor += strspn(*cursor, ", \t");
	*len = strcspn(*cursor, ", \t");
	if (*len == 0)
		return NULL;
	item = *cursor;
	*cursor += *len;
	return item;
}

bool
option_list_contains(const char *list, const char *item)
{
	size_t		len = strlen(item);
	const char *cursor = list;
	const char *p;
	size_t		n;

	while ((p = option_list_next(&cursor, &n)) != NULL)
		if (n == len && strncasecmp(p, item, n) == 0)
			return true;
	return false;
}

/* ---------------------------------------------------------------------------
 * Checks
 * ------------------------------------------------------------------------- */

bool
option_domain_check(const char *domain, size_t len, char *problem, size_t problem_len)
{
	size_t label = 0;

	if (len == 0)
	{
		snprintf(problem, problem_len, "It is empty.");
		return false;
	}
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) domain[i] >= 0x80 || domain[i] == '\0')
		{
			snprintf(problem, problem_len, "It is not ASCII: write an internationalized domain in "
										   "its A-label (xn--) form.");
			return false;
		}
	if (len > 253)
	{
		snprintf(problem, problem_len, "It is longer than 253 characters.");
		return false;
	}
	if (domain[len - 1] == '.')
	{
		snprintf(problem, problem_len, "It ends with a dot: write it without the root's dot.");
		return false;
	}
	for (size_t i = 0; i <= len; i++)
	{
		if (i == len || domain[i] == '.')
		{
			if (label == 0 || label > 63 || domain[i - 1] == '-' || domain[i - label] == '-')
				break;
			label = 0;
			if (i == len)
				return true;
			continue;
		}
		if (!isalnum((unsigned char) domain[i]) && domain[i] != '-')
			break;
		label++;
	}
	snprintf(problem, problem_len, "Each of its dot-separated labels is 1 to 63 letters, digits "
								   "and hyphens, not starting or ending with a hyphen.");
	return false;
}

/* Each comma/space separated item of value, as a domain or (addresses) local@domain. */
static bool
option_list_check(const struct option_def *def, const char *value, char *problem, size_t problem_len)
{
	bool		addresses = def->type == OPTION_ADDRESS_LIST;
	const char *p = value;
	size_t		items = 0;
	char		why[256];

	while (*p)
	{
		size_t		n;
		const char *domain;
		size_t		domain_len;

		p += strspn(p, ", \t");
		n = strcspn(p, ", \t");
		if (n == 0)
			break;
		items++;
		domain = p;
		domain_len = n;
		if (addresses)
		{
			const char *at = memchr(p, '@', n);

			if (at == NULL || at == p || memchr(at + 1, '@', n - (size_t) (at + 1 - p)) != NULL)
			{
				snprintf(problem, problem_len, "%s is a list of addresses, each a local part, one "
											   "\"@\" and a domain: \"%.*s\" is not one.",
						 def->name, (int) n, p);
				return false;
			}
			domain = at + 1;
			domain_len = n - (size_t) (domain - p);
		}
		if (!option_domain_check(domain, domain_len, why, sizeof(why)))
		{
			snprintf(problem, problem_len, "%s is a list of %s, comma or space separated: "
										   "\"%.*s\" is not one. %s",
					 def->name, addresses ? "addresses" : "domain names",
					 (int) n, p, why);
			return false;
		}
		p += n;
	}
	if (items == 0)
	{
		snprintf(problem, problem_len, "%s is a list of %s, comma or space separated, and it is empty.",
				 def->name, addresses ? "addresses" : "domain names");
		return false;
	}
	return true;
}

/* The range of an integer, a duration or a size, as words: " from 1 to 1024". */
static void
option_range_words(const struct option_def *def, char *out, size_t outlen)
{
	const char *unit = def->type == OPTION_DURATION ? " ms" : def->type == OPTION_SIZE ? " bytes"
																					   : "";

	if (def->max != 0)
		snprintf(out, outlen, " from %lld%s to %lld%s", def->min, unit, def->max, unit);
	else if (def->min != 0)
		snprintf(out, outlen, ", at least %lld%s", def->min, unit);
	else
		out[0] = '\0';
}

static bool
option_in_range(const struct option_def *def, long long n)
{
	return n >= def->min && (def->max == 0 || n <= def->max);
}

static bool
option_stage_name_valid(const char *value)
{
	return value[0] != '\0' && value[strspn(value, "abcdefghijklmnopqrstuvwxyz0123456789_-")] == '\0';
}

/* A name: min to max (by def) letters, digits, ".", "_" and "-". */
static bool
option_name_valid(const struct option_def *def, const char *value)
{
	size_t len = strlen(value);

	if (value[strspn(value, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")] != '\0')
		return false;
	return len > 0 && (long long) len >= def->min && (def->max == 0 || (long long) len <= def->max);
}

static bool
option_program_valid(const char *value, bool from_database)
{
	if (!from_database && value[0] == '/' && value[1] != '\0')
		return true;
	return (islower((unsigned char) value[0]) || isdigit((unsigned char) value[0]))
		   && value[strspn(value, "abcdefghijklmnopqrstuvwxyz0123456789._+-")] == '\0';
}

bool
option_value_check(const struct option_def *def, const char *value, bool from_database,
				   char *problem, size_t problem_len)
{
	char	  range[96];
	char	  why[256];
	long long n;
	bool	  flag;

	problem[0] = '\0';
	if (from_database)
		for (const char *p = value; *p; p++)
			if (iscntrl((unsigned char) *p))
			{
				snprintf(problem, problem_len, "%s must be one line of text: it contains a line "
											   "break or another control character.",
						 def->name);
				return false;
			}
	option_range_words(def, range, sizeof(range));
	switch (def->type)
	{
		case OPTION_TEXT:
			return true;
		case OPTION_BOOL:
			if (!option_parse_bool(value, &flag))
				snprintf(problem, problem_len, "%s is a boolean: yes, no, true, false, on, off, 1 or 0.",
						 def->name);
			break;
		case OPTION_INT:
			if (!option_parse_int(value, &n) || !option_in_range(def, n))
				snprintf(problem, problem_len, "%s is a whole number%s.", def->name, range);
			break;
		case OPTION_DURATION:
			if (!option_parse_duration_ms(value, &n))
				snprintf(problem, problem_len, "%s is a duration: a number of seconds, or a number "
											   "with the unit ms, s, m (or min), h or d, as in \"30s\", \"1.5m\" or \"2h\".",
						 def->name);
			else if (!option_in_range(def, n))
				snprintf(problem, problem_len, "%s is a duration%s.", def->name, range);
			break;
		case OPTION_SIZE:
			if (!option_parse_size(value, &n))
				snprintf(problem, problem_len, "%s is a size: a number of bytes, or a number with "
											   "the unit k, M or G (times 1024), as in \"10M\".",
						 def->name);
			else if (!option_in_range(def, n))
				snprintf(problem, problem_len, "%s is a size%s.", def->name, range);
			break;
		case OPTION_STAGE:
			if (!option_stage_name_valid(value))
				snprintf(problem, problem_len, "%s names a stage, by its [stage-<name>] section: "
											   "lower-case letters, digits, \"_\" and \"-\".",
						 def->name);
			break;
		case OPTION_PROGRAM:
			if (!option_program_valid(value, from_database))
				snprintf(problem, problem_len, from_database ? "%s names a program: from the database it is a program name, never a path." : "%s names a program: a program name, or the absolute path of one.",
						 def->name);
			break;
		case OPTION_DOMAIN:
			if (!option_domain_check(value, strlen(value), why, sizeof(why)))
				snprintf(problem, problem_len, "%s is a domain name. %s", def->name, why);
			break;
		case OPTION_DOMAIN_LIST:
		case OPTION_ADDRESS_LIST:
			return option_list_check(def, value, problem, problem_len);
		case OPTION_PATH:
			if (value[0] != '/')
				snprintf(problem, problem_len, "%s is the absolute path of a file or directory.",
						 def->name);
			break;
		case OPTION_NAME:
			if (!option_name_valid(def, value))
				snprintf(problem, problem_len, "%s is a name: %lld to %lld letters, digits, \".\", \"_\" or \"-\".",
						 def->name, def->min > 0 ? def->min : 1, def->max);
			break;
		case OPTION_ENUM:
			if (option_enum_index(def, value) < 0)
			{
				snprintf(problem, problem_len, "%s is one of ", def->name);
				for (const char *p = def->choices; *p;)
				{
					size_t k = strcspn(p, "|");
					size_t used = strlen(problem);

					snprintf(problem + used, problem_len - used, "%s\"%.*s\"",
							 p == def->choices ? "" : p[k] ? ", "
														   : " or ",
							 (int) k, p);
					p += k + (p[k] == '|');
				}
				if (strlen(problem) + 1 < problem_len)
					strcat(problem, ".");
			}
			break;
	}
	return problem[0] == '\0';
}

bool
option_scope_check(const struct option_def *def, const char *scope, char *problem, size_t problem_len)
{
	enum option_scope wanted = OPTION_SCOPE_GLOBAL;

	if (strncmp(scope, "domain:", 7) == 0)
		wanted = OPTION_SCOPE_DOMAIN;
	else if (strncmp(scope, "address:", 8) == 0)
		wanted = OPTION_SCOPE_ADDRESS;
	if (wanted <= def->scope)
		return true;
	if (def->scope == OPTION_SCOPE_FILE)
		snprintf(problem, problem_len, "%s is read from pepsi.conf only, so that a compromised "
									   "database cannot change it.",
				 def->name);
	else if (def->scope == OPTION_SCOPE_GLOBAL)
		snprintf(problem, problem_len, "%s is read once by a process, not per message, so an "
									   "override for a domain or an address could never apply.",
				 def->name);
	else
		snprintf(problem, problem_len, "%s is read per message with its recipients' domain, "
									   "not their address.",
				 def->name);
	return false;
}
