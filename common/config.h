/*
 * config.h: pepsi.conf, the INI file, with pepsi.config_override layered
 * over it.
 *
 * The file is read once and checked whole: an unknown section, an option a
 * section does not have, or a malformed value is refused with file:line
 * and the reason.  The overlay (scopes global, domain:<d>, address:<a>)
 * applies to every section except [database] and [listener-*], which must
 * be known before a database connection exists and which a compromised
 * database must not move.
 */
#ifndef PEPSI_CONFIG_H
#define PEPSI_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#define PEPSI_CONFIG_DEFAULT_PATH "/etc/pepsi/pepsi.conf"

struct config_entry
{
	char	   *scope;			/* NULL for the file, else global / domain:d / address:a */
	char	   *section;
	char	   *option;
	char	   *value;
	int			line;			/* in the file; 0 for an override */
};

struct config_index;

struct pepsi_config
{
	char	   *path;
	struct config_entry *entries;
	size_t		count;
	size_t		capacity;
	struct config_index *index; /* lookups by section and option (config.c) */
};

/* Load and check path; NULL with a message in err (file:line: reason) on failure. */
struct pepsi_config *config_load(const char *path, char *err, size_t errlen);
/* The same from a string (tests, pepsi-config's validation). */
struct pepsi_config *config_parse_string(const char *text, const char *name, char *err, size_t errlen);
void		config_free(struct pepsi_config *cfg);

/* Whether an option may be set in a section (and by the overlay). */
bool		config_option_known(const char *section, const char *option);
bool		config_section_overridable(const char *section);
bool		config_section_known(const char *section);

/* Add an override (from pepsi.config_override); false with err if it is refused. */
bool		config_add_override(struct pepsi_config *cfg, const char *scope, const char *section,
								const char *option, const char *value, char *err, size_t errlen);

/*
 * Lookups: the most specific value wins: address:<address>, then
 * domain:<domain of address or domain>, then global, then the file.
 * domain and address may be NULL.
 */
const char *config_get(const struct pepsi_config *cfg, const char *section, const char *option);
const char *config_get_for(const struct pepsi_config *cfg, const char *section, const char *option,
						   const char *domain, const char *address);
/* Where a value came from, for messages: "pepsi.conf:12" or "override global". */
const char *config_origin(const struct pepsi_config *cfg, const char *section, const char *option,
						  char *out, size_t outlen);

/* Typed getters: false with err naming file:line and the reason for a bad value. */
bool		config_get_long(const struct pepsi_config *cfg, const char *section, const char *option,
							long fallback, long min, long max, long *out, char *err, size_t errlen);
bool		config_get_bool(const struct pepsi_config *cfg, const char *section, const char *option,
							bool fallback, bool *out, char *err, size_t errlen);
/* Durations: "30", "30s", "5m", "2h", "1d", "250ms"; result in milliseconds. */
bool		config_get_duration_ms(const struct pepsi_config *cfg, const char *section,
								   const char *option, long fallback_ms, long min_ms,
								   long *out, char *err, size_t errlen);

/* The sections whose name starts with prefix ("stage-"), in file order, each once. */
size_t		config_sections(const struct pepsi_config *cfg, const char *prefix,
							const char **names, size_t max);

#endif
