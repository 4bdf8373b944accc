/*
 * options.h: the option schema (schema/options.def) as a C table, and the
 * checks of a value against it.
 *
 * Pure functions of their arguments, with no allocation and no logging:
 * the extension compiles options.c too (extension/src/config_schema.c),
 * so pepsi.config_validate and the programs check a value with the same
 * code.  config.c applies the schema to pepsi.conf and the overlay, and
 * its typed getters (config.h) and the stage API's (stage.h) read values
 * with these parsers.
 */
#ifndef PEPSI_OPTIONS_H
#define PEPSI_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

enum option_type
{
	OPTION_TEXT,
	OPTION_BOOL,
	OPTION_INT,
	OPTION_DURATION, /* milliseconds */
	OPTION_SIZE,	 /* bytes */
	OPTION_STAGE,
	OPTION_PROGRAM,
	OPTION_DOMAIN,
	OPTION_DOMAIN_LIST,
	OPTION_ADDRESS_LIST,
	OPTION_PATH,
	OPTION_ENUM,
	OPTION_NAME /* min to max letters, digits, ".", "_" and "-": a name other programs see (a log tag) */
};

/* The most specific place an option may be set; each includes those before it. */
enum option_scope
{
	OPTION_SCOPE_FILE,	 /* pepsi.conf only */
	OPTION_SCOPE_GLOBAL, /* and a global override */
	OPTION_SCOPE_DOMAIN, /* and per recipient domain */
	OPTION_SCOPE_ADDRESS /* and per recipient address */
};

struct option_def
{
	const char		 *where; /* "dispatch", "stage-*", "pepsi-stage-bounce", ... */
	const char		 *name;
	enum option_type  type;
	enum option_scope scope;
	const char		 *default_value; /* as written in pepsi.conf; NULL: none */
	long long		  min;			 /* INT, DURATION (ms), SIZE (bytes), NAME (its length); 0 and 0: unbounded */
	long long		  max;
	const char		 *choices; /* ENUM: "a|b|c" */
	const char		 *description;
};

extern const struct option_def option_table[];
extern const size_t			   option_count;

/* "text", "boolean", "integer", ...: the kinds pepsi.config_option lists. */
const char *option_type_name(enum option_type type);
/* "file", "global", "domain", "address". */
const char *option_scope_name(enum option_scope scope);

/* The program a [stage-*] section's PROGRAM names: its last path component. */
const char *option_program_name(const char *program);
/*
 * Is program (a name or a path) one an override never routes mail around
 * (options.def UNSKIPPABLE)?  Its index among those (below 32), why in
 * *why (may be NULL); -1 if not.
 */
int option_unskippable_index(const char *program, const char **why);
/*
 * The owner's options (options.def OWNER): the longest value an owner may
 * set (the vacation notice's text's bound); the option of that name an
 * owner may set (with *lines true for a text of several lines), or NULL;
 * the index'th such option's name, or NULL past the last; and whether
 * value (NULL: removing it) is one an owner may set, else false with why.
 */
#define OPTION_OWNER_VALUE_MAX 10000
const struct option_def *option_owner_find(const char *name, bool *lines);
const char				*option_owner_name(size_t index);
bool					 option_owner_value_check(const char *name, const char *value, char *problem, size_t problem_len);
/* Does def hold a secret (options.def SECRET), read only from secrets.d? */
bool option_is_secret(const struct option_def *def);
/* Does the schema declare options of this stage program (so any other is refused)? */
bool option_program_declared(const char *program);
/* Is a section of this name known ([pepsi], [listener-x], [stage-x], ...)? */
bool option_section_known(const char *section);
/* May anything in this section be set by an override? */
bool option_section_overridable(const char *section);

/*
 * The definition of option in section; for a [stage-*] section those of
 * every stage first, then those of program (which may be NULL: unknown).
 * NULL when the schema has no such option.
 */
const struct option_def *option_find(const char *section, const char *program, const char *name);

/*
 * Is value valid for def?  false with a sentence saying why in problem.
 * from_database: the value comes from pepsi.config_override, where a
 * PROGRAM is a name, never a path, and no value holds a control character.
 */
bool option_value_check(const struct option_def *def, const char *value, bool from_database,
						char *problem, size_t problem_len);
/* Is scope ("global", "domain:d", "address:a") allowed for def?  false with a sentence if not. */
bool option_scope_check(const struct option_def *def, const char *scope, char *problem,
						size_t problem_len);

/* The parsers, for values already checked (or to check one): false if malformed. */
bool option_parse_bool(const char *value, bool *out);
bool option_parse_int(const char *value, long long *out);
bool option_parse_duration_ms(const char *value, long long *out);
bool option_parse_size(const char *value, long long *out);
/* The index of value among def's choices (case-insensitive), or -1. */
int option_enum_index(const struct option_def *def, const char *value);
/*
 * The next item of a comma/space separated list: its start (not
 * terminated; *len bytes), or NULL at the end.  *cursor starts at the list
 * (NULL: an empty one) and moves past each item.
 */
const char *option_list_next(const char **cursor, size_t *len);
/* Is item one of the comma/space separated list (case-insensitive)? */
bool option_list_contains(const char *list, const char *item);
/* A domain name as Pepsi accepts one (ASCII, A-labels); false with why in problem. */
bool option_domain_check(const char *domain, size_t len, char *problem, size_t problem_len);

#endif
