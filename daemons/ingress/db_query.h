/*
 * db_query.h: the statements ingress asks the database during a session
 * (greylisting), one at a time on a connection of their own, off the
 * admission pool so that a slow lookup never holds a message's commit.
 * Each answer comes back by callback from the loop; with the database
 * down a query is answered NULL at once, and the caller decides (the
 * checks fail open: a message is never refused for our own trouble).
 */
#ifndef PEPSI_INGRESS_DB_QUERY_H
#define PEPSI_INGRESS_DB_QUERY_H

#include <stdbool.h>

#include <ev.h>
#include <libpq-fe.h>

#include "config/config.h"

/* res: the statement's result, NULL when it failed or the database is down (freed after). */
typedef void (*db_query_fn)(void *arg, const PGresult *res);

struct db_query;

void db_query_init(struct ev_loop *loop, const struct pepsi_config *cfg);
void db_query_shutdown(void);
/* Was db_query_init called (does some check of this process use the database)? */
bool db_query_available(void);
/* Run sql with text parameters (copied); fn(arg, ...) later, from the loop. */
struct db_query *db_query_send(const char *sql, int nparams, const char *const *values,
							   db_query_fn fn, void *arg);
/* fn will not be called. */
void db_query_cancel(struct db_query *q);

#endif
