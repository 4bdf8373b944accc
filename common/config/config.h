/*
 * config.h: pepsi.conf, the INI file, with pepsi.config_override layered
 * over it.
 *
 * The file is read once and checked whole against the option schema
 * (schema/options.def): an unknown section, an option a section does not
 * have, or a malformed value is refused with file:line and the reason.  The overlay (scopes global, domain:<d>, address:<a>)
 * applies to every section except [database] and [listener-*], which must
 * be known before a database connection exists and which a compromised
 * database must not move.
 *
 * The secrets (schema/options.def SECRET: passwords, the SRS secret,
 * tokens) are never in pepsi.conf, which every program and every operator
 * reads: config_load includes the fragments secrets.d/<name>.conf beside
 * the file, in name order, each owned by root (or by the account loading
 * it, which gains nothing by writing its own secrets) and readable by the
 * one group that needs it, mode 0640 at most.  A fragment (or a directory)
 * this process may not read is another account's and is skipped; one that is not owned or
 * protected so is refused with its path and the reason.  A fragment holds
 * secret options only, and a secret option in pepsi.conf is refused.
 *
 * Between the two, config_load includes the drop-ins pepsi.conf.d/NAME.conf
 * (the file's path and ".d"), in name order, under the same ownership
 * checks except that others may read them (mode 0644 at most): the
 * settings pepsi-setup writes, so that pepsi.conf, the package's conffile,
 * is never rewritten.  A drop-in's option replaces the one pepsi.conf or
 * an earlier drop-in sets; it holds no secret.
 */
#ifndef PEPSI_CONFIG_H
#define PEPSI_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#define PEPSI_CONFIG_DEFAULT_PATH "/etc/pepsi/pepsi.conf"

struct option_def;

struct config_entry
{
	char	   *scope; /* NULL for the file, else global / domain:d / address:a */
	char	   *section;
	char	   *option;
	char	   *value;
	int			line;	/* in the file; 0 for an override */
	const char *file;	/* NULL: pepsi.conf (path); else the pepsi.conf.d or secrets.d fragment's path */
	bool		dropin; /* file is a pepsi.conf.d fragment */
};

struct config_index;

struct pepsi_config
{
	char				*path;
	struct config_entry *entries;
	size_t				 count;
	size_t				 capacity;
	struct config_index *index;		/* lookups by section and option (config.c) */
	char			   **fragments; /* the pepsi.conf.d, then secrets.d, fragments read, in order */
	size_t				 fragment_count;
};

/* The secrets.d directory beside a configuration file path (allocated). */
char *config_secrets_dir(const char *path);
/* The drop-in directory of a configuration file path: PATH.d (allocated). */
char *config_dropin_dir(const char *path);

/* Load and check path; NULL with a message in err (file:line: reason) on failure. */
struct pepsi_config *config_load(const char *path, char *err, size_t errlen);
/* The same from a string (tests, pepsi-config's validation). */
struct pepsi_config *config_parse_string(const char *text, const char *name, char *err, size_t errlen);
void				 config_free(struct pepsi_config *cfg);

/*
 * Whether an option may be set in a section (and by the overlay), by the
 * schema alone: a [stage-*] section also takes any option of its program,
 * which config_load checks once it knows the PROGRAM.
 */
bool config_option_known(const char *section, const char *option);
bool config_section_overridable(const char *section);
bool config_section_known(const char *section);

/*
 * Would the override section's option = value (a STAGE option, or a
 * stage's PROGRAM) route mail around a stage of a program options.def
 * calls UNSKIPPABLE, by the file's routes (config_route.c)?  The refusal
 * in why, returned; NULL when it would not.
 */
const char *config_route_refusal(const struct pepsi_config *cfg, const char *section, const char *option,
								 const char *value, char *why, size_t whylen);

/* Add an override (from pepsi.config_override); false with err if it is refused. */
bool config_add_override(struct pepsi_config *cfg, const char *scope, const char *section,
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

/*
 * Does option's value in section differ between two loads of the
 * configuration (unset and set to its default being the same)?  A
 * daemon's reload refuses to ignore a change it cannot apply.
 */
bool config_option_changed(const struct pepsi_config *before, const struct pepsi_config *after,
						   const char *section, const char *option);

/*
 * Typed getters.  Every option read through them has its line in
 * schema/options.def, which gives its type, default and range; the value
 * was checked against it when loaded (the file by config_load, each
 * override by config_add_override), so they cannot fail: unset, they
 * return the default (false, 0, or NULL when there is none).  The _for
 * forms read the value in force for a recipient domain or address (either
 * may be NULL), as config_get_for does.  Reading an option options.def
 * does not declare, or with a getter of another type, is fatal.
 */
bool	  config_bool(const struct pepsi_config *cfg, const char *section, const char *option);
long long config_int(const struct pepsi_config *cfg, const char *section, const char *option);
long long config_duration_ms(const struct pepsi_config *cfg, const char *section, const char *option);
long long config_size(const struct pepsi_config *cfg, const char *section, const char *option);
/* The index of the value among the ENUM's choices ("a|b|c": 0, 1, 2). */
int config_enum(const struct pepsi_config *cfg, const char *section, const char *option);
/* Text, path, stage, program, domain and list options: the string, or NULL. */
const char *config_text(const struct pepsi_config *cfg, const char *section, const char *option);

bool		config_bool_for(const struct pepsi_config *cfg, const char *section, const char *option,
							const char *domain, const char *address);
long long	config_int_for(const struct pepsi_config *cfg, const char *section, const char *option,
						   const char *domain, const char *address);
long long	config_duration_ms_for(const struct pepsi_config *cfg, const char *section,
								   const char *option, const char *domain, const char *address);
long long	config_size_for(const struct pepsi_config *cfg, const char *section, const char *option,
							const char *domain, const char *address);
int			config_enum_for(const struct pepsi_config *cfg, const char *section, const char *option,
							const char *domain, const char *address);
const char *config_text_for(const struct pepsi_config *cfg, const char *section, const char *option,
							const char *domain, const char *address);

/* Is item in a DOMAIN_LIST or ADDRESS_LIST value (comma or space separated, any case)? */
bool config_list_contains(const char *list, const char *item);

/* [pepsi] HOSTNAME, else the system's host name, else "localhost". */
const char *config_hostname(const struct pepsi_config *cfg);
/* The authserv-id of our Authentication-Results: [ingress] AUTHSERV_ID, else config_hostname. */
const char *config_authserv_id(const struct pepsi_config *cfg);

/* The schema's definition of an option of section (a stage's with its PROGRAM), or NULL. */
const struct option_def *config_option_def(const struct pepsi_config *cfg, const char *section,
										   const char *option);

/* The sections whose name starts with prefix ("stage-"), in file order, each once. */
size_t config_sections(const struct pepsi_config *cfg, const char *prefix,
					   const char **names, size_t max);

#endif
