/*
 * db.h: libpq helpers shared by the programs: connecting as each
 * program's role, the configuration overlay, and statements that are
 * retried when PostgreSQL reports a transient serialization failure or
 * deadlock (40001, 40P01).
 */
#ifndef PEPSI_DB_H
#define PEPSI_DB_H

#include <libpq-fe.h>
#include <stdbool.h>

#include "base/buf.h"
#include "config/config.h"

#define PEPSI_DEFAULT_CONNINFO "dbname=pepsi"
/*
 * The advisory lock one pepsi-dispatch per database holds while it runs
 * (pg_try_advisory_lock(class, key), daemons/dispatch/dbconn.c): whoever
 * sees it granted in pg_locks knows a dispatcher is connected (/healthz).
 * The class is 'PEPS'; keys 1 and 3 are the maintenance worker's and the
 * queue gauges' refresh.
 */
#define PEPSI_LOCK_CLASS "1346720851"
#define PEPSI_LOCK_DISPATCH "2"
/* The per-stage locks of a dispatcher serving a stage set: ('PEPT', hashtext(stage)). */
#define PEPSI_LOCK_STAGE_CLASS "1346720852"

/* Transient failures retried so far by this process (for statistics). */
extern unsigned long db_transient_retries;

/*
 * Each program connects as a role of its own (least privilege): the
 * pipeline from [database] CONNINFO, the others from their own option
 * (db_conninfo: [ingress] CONNINFO, [database] MONITOR_CONNINFO, ...),
 * which falls back to [database] CONNINFO, then PEPSI_DEFAULT_CONNINFO.
 */
const char *db_conninfo(const struct pepsi_config *cfg, const char *section, const char *option);
/* db_connect_as for [database] CONNINFO. */
PGconn *db_connect(const struct pepsi_config *cfg, const char *application_name,
				   char *err, size_t errlen);
/*
 * Connect with [section] option (db_conninfo), after refusing a password
 * file or a configuration holding a password that others may read.
 */
PGconn *db_connect_as(const struct pepsi_config *cfg, const char *section, const char *option,
					  const char *application_name, char *err, size_t errlen);
/*
 * Following the primary.  A conninfo may list several hosts (host=a,b,c);
 * every connection that writes asks libpq for a read-write session
 * (target_session_attrs=read-write unless the conninfo says otherwise), so
 * libpq finds the primary among them, now and at each reconnect, and a
 * standby that answers anyway is refused.  Only the read-only tools'
 * [database] MONITOR_CONNINFO and pepsi-httpd's [httpd] READ_CONNINFO (its
 * views) may name a standby (then pepsi-status and the web page show the
 * replication lag).
 */
bool db_option_reads_only(const char *option);
/* The target_session_attrs a connection asks for by default (NULL: libpq's). */
const char *db_default_session_attrs(bool reads_only);
/* The session's server is in recovery (PostgreSQL 14 on report it). */
bool db_is_standby(PGconn *conn);
/*
 * How far behind the session's server is, in seconds since the last
 * transaction it replayed ("12.3", malloc'd), or NULL when it is no
 * standby (or cannot say).
 */
char *db_standby_lag(PGconn *conn);
/* What to add to a connection error that says a standby answered ("" if not). */
const char *db_connect_hint(const char *message);
/* Read pepsi.config_override into cfg; false with err if a row is refused. */
bool db_load_overrides(PGconn *conn, struct pepsi_config *cfg, char *err, size_t errlen);

/*
 * Transient failures are retried only outside a transaction: inside one,
 * the failed statement has aborted it, and only its owner can start again.
 */
bool db_error_is_transient(const PGresult *res);
/* PQexecParams with text parameters, retried on transient failure. */
PGresult *db_exec(PGconn *conn, const char *sql, int nparams, const char *const *values);
/*
 * Prepared statements.  db.c keeps, for each session (a connection and
 * its backend pid: a reconnected or reset connection is a new session),
 * which statements it holds.  db_prepare prepares name as sql now (a
 * program's set-up).  db_exec_prepared runs statement name, whose text is
 * sql, the same way as db_exec (retried on transient failure), with
 * result_format (0 text, 1 binary); it prepares it first when the session
 * does not hold it yet, outside a transaction only (a PREPARE that failed
 * inside one would abort it), so that PostgreSQL parses and plans it once
 * a session rather than once a call.  It goes as a plain statement instead
 * when preparing failed in the session, and once when the session answers
 * that it lost the statement (SQLSTATE 26000: DISCARD ALL, DEALLOCATE, a
 * pooler's other server session; 0A000: a function's result type changed
 * by an upgrade, the stale statement then deallocated), which is then
 * prepared again on its next use; inside a transaction that answer is the
 * caller's, as the transaction is aborted.  After db_keep_statements(false)
 * (a pooler in transaction mode, which keeps nothing in a session:
 * [database] STAGE_POOLED) every call goes as text.
 *
 * db_exec_kept is db_exec_prepared for the statements a worker runs for
 * every message (its commit, the relay's calls on pepsi.destination),
 * named by their text: a statement built at run time may be given.
 */
PGresult *db_exec_prepared(PGconn *conn, const char *name, const char *sql, int nparams,
						   const char *const *values, const int *lengths, const int *formats,
						   int result_format);
bool	  db_prepare(PGconn *conn, const char *name, const char *sql, char *err, size_t errlen);
void	  db_keep_statements(bool keep);
PGresult *db_exec_kept(PGconn *conn, const char *sql, int nparams, const char *const *values,
					   const int *lengths, const int *formats);
/*
 * Build a PostgreSQL array literal for a text parameter: start with "{",
 * append elements (NULL for a SQL NULL; quoted and escaped otherwise), end
 * with "}".
 */
void db_array_append(struct buf *array, const char *element);

/* The error of a failed result, one line, for logs. */
const char *db_error(const PGresult *res, PGconn *conn);

/*
 * The array literal array ("{1,2,3}", count elements) padded to length
 * elements with its last one repeated, into out; false when it does not
 * fit (or is not such a literal).  For a statement over "= ANY" of an
 * array parameter: see stage.c, STAGE_LOAD_PLANNED_IDS.
 */
bool db_pad_int_array(const char *array, size_t count, size_t length, char *out, size_t outlen);

#endif
