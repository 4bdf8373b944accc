/*
 * cli.h: what the operator tools share: finding the configuration and
 * the database, parsing ids, and printing a result as an aligned table or
 * as JSON.
 */
#ifndef PEPSI_CLI_H
#define PEPSI_CLI_H

#include <stdbool.h>

#include <libpq-fe.h>

#include "config.h"

/* sysexits(3) */
#define CLI_EX_OK 0
#define CLI_EX_USAGE 64
#define CLI_EX_DATAERR 65
#define CLI_EX_TEMPFAIL 75
#define CLI_EX_CONFIG 78

/* Load the configuration and connect; on failure print why and return NULL (*rc set). */
PGconn	   *cli_connect(const char *program, const char *config_path, struct pepsi_config **cfg,
						int *rc);
/* A workqueue id argument: a positive whole number. */
bool		cli_parse_id(const char *text, long long *id);
/* Print rows: aligned columns with a header, or a JSON array of objects. */
void		cli_print(PGresult *res, bool as_json);
/* Print the server's error for res, prefixed with the program name. */
void		cli_db_error(const char *program, PGresult *res, PGconn *conn);

#endif
