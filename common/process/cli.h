/*
 * cli.h: what the operator tools share: finding the configuration and
 * the database, parsing ids, and printing a result as an aligned table or
 * as JSON; and the options every daemon and stage worker takes.
 */
#ifndef PEPSI_CLI_H
#define PEPSI_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include <libpq-fe.h>

#include "config/config.h"

/* sysexits(3) */
#define CLI_EX_OK 0
#define CLI_EX_USAGE 64
#define CLI_EX_DATAERR 65
#define CLI_EX_TEMPFAIL 75
#define CLI_EX_NOPERM 77
#define CLI_EX_CONFIG 78

/*
 * The role a command connects as: a tool that only looks at aggregates as
 * a member of pepsi_monitor ([database] MONITOR_CONNINFO), one that reads
 * messages or changes anything as a member of pepsi_config
 * ([database] CONFIG_CONNINFO); the database then enforces that a
 * read-only command writes nothing.
 */
enum cli_role
{
	CLI_ROLE_MONITOR,
	CLI_ROLE_CONFIG
};

/* Pepsi's version (META.json), as --version prints it and /metrics reports it. */
const char *pepsi_version(void);
/*
 * The options every program takes, handled once for all of them by the
 * multi-call main and the standalone one, before the program's own: with
 * --version as its first argument, print "PROGRAM (Pepsi) VERSION" on
 * standard output and return true (the program then exits 0).  --help is
 * each program's own (its usage on standard output, exit status 0;
 * cli_is_help), since only it knows its usage.
 */
bool cli_version_option(const char *program, int argc, char **argv);
/* Whether arg asks for the usage (--help). */
bool cli_is_help(const char *arg);

/*
 * The options of a daemon or a stage worker, from argv[optind] on (the
 * caller sets optind): -c CONFIG, -v (each once more verbose) and -h.
 * *config_path: CONFIG, else $PEPSI_CONFIG, else the default.  False for
 * an option it does not take; *help for -h.  Either way the caller prints
 * its usage (on standard output and exit 0 for -h, else standard error
 * and exit 64).
 */
bool cli_daemon_options(int argc, char **argv, const char **config_path, bool *help);

/*
 * The options of a command-word tool (pepsi-archive, pepsi-list,
 * pepsi-quota, pepsi-settings, pepsi-whitelist), before its command:
 * -C/--config FILE, -j/--json, -h/--help, and -s/--section NAME where
 * section is not NULL.  True with optind at the command word (one must
 * follow when command_required); false with *rc the exit status, the
 * usage printed (on standard output and 0 for -h, on standard error and 64
 * for a bad option or a missing command).  One parser, so that the tools
 * cannot drift apart in what they take or how they refuse it.
 */
bool cli_command_options(int argc, char **argv, void (*usage)(FILE *), bool command_required,
						 const char **config_path, bool *as_json, const char **section, int *rc);

/* The configuration file: given (-C), else $PEPSI_CONFIG, else the default. */
const char *cli_config_path(const char *given);
/* Load the configuration and connect as role; on failure print why and return NULL (*rc set). */
PGconn *cli_connect(const char *program, const char *config_path, enum cli_role role,
					struct pepsi_config **cfg, int *rc);
/* A workqueue id argument: a positive whole number that fits a bigint. */
bool cli_parse_id(const char *text, long long *id);
/*
 * A whole-number option argument from min to max: all of text is digits
 * (a leading minus only where min is negative), no overflow.  atoi() took
 * "12x" as 12 and "x" as 0, which then met a range check with a misleading
 * message or none; the caller prints its own, naming the option.
 */
bool cli_parse_int_range(const char *text, long min, long max, long *value);
/*
 * Print rows: aligned columns with a header, or a JSON array of objects.
 * In the table a line break, tab or other control character in a value is
 * shown escaped ("\n", "\t", "\x01"), so that one row stays one line.
 */
void cli_print(PGresult *res, bool as_json);
/*
 * Write message text for a terminal: control characters that could move
 * the cursor, retitle the window or rewrite what is shown (ESC sequences,
 * a lone CR, C1 controls) come out as \xHH; TAB and CRLF stay.
 */
void cli_write_escaped(const char *data, size_t len, FILE *out);
/* Print the server's error for res, prefixed with the program name. */
void cli_db_error(const char *program, PGresult *res, PGconn *conn);
/*
 * The exit status for a statement that failed: EX_TEMPFAIL when the
 * connection failed or the server asks for a retry (a serialization
 * failure, a deadlock, a shutdown), EX_NOPERM when the role lacks the
 * privilege, else EX_DATAERR (the database refused what it was given).
 */
int cli_db_exit_code(PGresult *res, PGconn *conn);
/*
 * Print a query's rows (cli_print), or its error (cli_db_error); clears res
 * and returns the exit code.
 */
int cli_show_result(const char *program, PGresult *res, PGconn *conn, bool as_json);

#endif
