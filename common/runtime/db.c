/* db.c: see db.h. */
#include "runtime/db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "process/secret.h"

#define DB_TRANSIENT_ATTEMPTS 5

unsigned long db_transient_retries;

/*
 * A database password must not be readable by others: refuse a password
 * file (passfile, PGPASSFILE) that is not the owner's alone, and a
 * password written into CONNINFO of a configuration file that others can
 * read.  libpq would only warn about the first and use the second.
 */
static bool
db_check_credentials(const struct pepsi_config *cfg, const char *section, const char *option,
					 const char *conninfo, char *err, size_t errlen)
{
	PQconninfoOption *options = PQconninfoParse(conninfo, NULL);
	const char		 *passfile = getenv("PGPASSFILE");
	bool			  password = false;
	bool			  ok = true;
	FILE			 *f;
	char			  why[512];
	struct stat		  st;

	for (PQconninfoOption *o = options; o && o->keyword; o++)
	{
		if (strcmp(o->keyword, "passfile") == 0 && o->val && *o->val)
			passfile = o->val;
		if (strcmp(o->keyword, "password") == 0 && o->val && *o->val)
			password = true;
	}
	if (passfile && *passfile && access(passfile, F_OK) == 0)
	{
		if ((f = secret_file_open(passfile, why, sizeof(why))) == NULL)
		{
			snprintf(err, errlen, "[%s] %s: password file %s", section, option, why);
			ok = false;
		}
		else
			fclose(f);
	}
	if (ok && password && cfg && cfg->path && stat(cfg->path, &st) == 0
		&& (st.st_mode & (S_IRWXG | S_IRWXO)))
	{
		snprintf(err, errlen,
				 "%s: [%s] %s holds a password, and others may read the file (mode %04o);"
				 " refused: chmod 600 %s, or keep the password in a passfile",
				 cfg->path, section, option, (unsigned) (st.st_mode & 07777), cfg->path);
		ok = false;
	}
	PQconninfoFree(options);
	return ok;
}

const char *
db_conninfo(const struct pepsi_config *cfg, const char *section, const char *option)
{
	const char *conninfo = cfg ? config_text(cfg, section, option) : NULL;

	if (conninfo == NULL && cfg)
		conninfo = config_text(cfg, "database", "CONNINFO");
	return conninfo ? conninfo : PEPSI_DEFAULT_CONNINFO;
}

PGconn *
db_connect(const struct pepsi_config *cfg, const char *application_name, char *err, size_t errlen)
{
	return db_connect_as(cfg, "database", "CONNINFO", application_name, err, errlen);
}

bool
db_option_reads_only(const char *option)
{
	return option && (strcmp(option, "MONITOR_CONNINFO") == 0 || strcmp(option, "READ_CONNINFO") == 0);
}

const char *
db_default_session_attrs(bool reads_only)
{
	return reads_only ? NULL : "read-write";
}

bool
db_is_standby(PGconn *conn)
{
	const char *hot_standby = PQparameterStatus(conn, "in_hot_standby");

	return hot_standby && strcmp(hot_standby, "on") == 0;
}

char *
db_standby_lag(PGconn *conn)
{
	PGresult *res;
	char	 *lag = NULL;

	if (!db_is_standby(conn))
		return NULL;
	res = db_exec(conn,
				  "SELECT to_char(coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0),"
				  " 'FM999999990.0')",
				  0, NULL);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		lag = strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return lag;
}

const char *
db_connect_hint(const char *message)
{
	if (strstr(message, "read-only") || strstr(message, "hot standby") || strstr(message, "is a standby"))
		return " (a standby answered where the primary is needed: list every database host in the "
			   "conninfo, host=a,b,c, and let target_session_attrs=read-write pick the primary)";
	return "";
}

PGconn *
db_connect_as(const struct pepsi_config *cfg, const char *section, const char *option,
			  const char *application_name, char *err, size_t errlen)
{
	/* Before dbname: a default the conninfo's own target_session_attrs overrides. */
	const char *keywords[] = {"target_session_attrs", "dbname", "application_name", NULL};
	const char *values[] = {db_default_session_attrs(db_option_reads_only(option)),
							db_conninfo(cfg, section, option), application_name, NULL};
	PGconn	   *conn;

	/* The option that was used, for the messages. */
	if (cfg == NULL || config_text(cfg, section, option) == NULL)
		section = "database", option = "CONNINFO";
	if (!db_check_credentials(cfg, section, option, values[1], err, errlen))
		return NULL;
	conn = PQconnectdbParams(keywords, values, 1);
	if (conn == NULL || PQstatus(conn) != CONNECTION_OK
		|| (!db_option_reads_only(option) && db_is_standby(conn)))
	{
		const char *message = conn == NULL						? "out of memory"
							  : PQstatus(conn) != CONNECTION_OK ? PQerrorMessage(conn)
																: "the server is a standby (in recovery)";
		size_t		n;

		snprintf(err, errlen, "cannot connect to the database as [%s] %s says: %s", section, option,
				 message);
		n = strlen(err);
		while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' '))
			err[--n] = '\0';
		snprintf(err + n, errlen - n, "%s", db_connect_hint(message));
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

bool
db_load_overrides(PGconn *conn, struct pepsi_config *cfg, char *err, size_t errlen)
{
	PGresult *res = db_exec(conn, "SELECT scope, section, option, value FROM pepsi.config_override"
								  " ORDER BY scope, section, option",
							0, NULL);
	bool	  ok = true;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "cannot read pepsi.config_override: %s", db_error(res, conn));
		PQclear(res);
		return false;
	}
	for (int i = 0; i < PQntuples(res) && ok; i++)
		ok = config_add_override(cfg, PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
								 PQgetvalue(res, i, 2), PQgetvalue(res, i, 3), err, errlen);
	PQclear(res);
	return ok;
}

bool
db_error_is_transient(const PGresult *res)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	return state && (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0);
}

/* Sleep a random 1..(10 << attempt) ms, so retrying sessions do not collide again. */
static void
db_backoff(int attempt)
{
	long			max_us = 10000L << attempt;
	struct timespec ts;

	ts.tv_sec = 0;
	ts.tv_nsec = (1000 + random() % max_us) * 1000L;
	nanosleep(&ts, NULL);
}

static PGresult *
db_retry(PGconn *conn, const char *sql, const char *name, int nparams, const char *const *values,
		 const int *lengths, const int *formats, int result_format)
{
	for (int attempt = 1;; attempt++)
	{
		PGresult *res = name ? PQexecPrepared(conn, name, nparams, values, lengths, formats, result_format)
							 : PQexecParams(conn, sql, nparams, NULL, values, lengths, formats, result_format);

		if (!db_error_is_transient(res) || attempt == DB_TRANSIENT_ATTEMPTS
			|| PQtransactionStatus(conn) != PQTRANS_IDLE)
			return res;
		PQclear(res);
		db_transient_retries++;
		db_backoff(attempt);
	}
}

PGresult *
db_exec(PGconn *conn, const char *sql, int nparams, const char *const *values)
{
	return db_retry(conn, sql, NULL, nparams, values, NULL, NULL, 0);
}

/*
 * The statements each session holds (db.h).  A few sessions, the most
 * recently used kept: a process has one connection or two; a session
 * dropped from the table, or whose connection was reset or replaced (a
 * new backend pid), starts again from nothing.
 */
#define DB_SESSIONS 4

struct db_session
{
	const PGconn *conn;
	int			  backend_pid;
	unsigned long used;	   /* for replacing the least recently used */
	bool		  refused; /* preparing failed in this session: plain statements */
	char		**names;   /* the statements it holds */
	size_t		  count;
};

static struct db_session db_sessions[DB_SESSIONS];

static void
db_session_clear(struct db_session *s)
{
	for (size_t i = 0; i < s->count; i++)
		free(s->names[i]);
	free(s->names);
	memset(s, 0, sizeof(*s));
}

/* conn's session: found, or made in the place of the least recently used. */
static struct db_session *
db_session_of(PGconn *conn)
{
	static unsigned long clock;
	struct db_session	*s = &db_sessions[0];
	int					 pid = PQbackendPID(conn);

	for (int i = 0; i < DB_SESSIONS; i++)
		if (db_sessions[i].conn == conn)
		{
			s = &db_sessions[i];
			break;
		}
		else if (db_sessions[i].used < s->used)
			s = &db_sessions[i];
	if (s->conn != conn || s->backend_pid != pid)
	{
		db_session_clear(s);
		s->conn = conn;
		s->backend_pid = pid;
	}
	s->used = ++clock;
	return s;
}

static size_t
db_session_find(const struct db_session *s, const char *name)
{
	size_t i = 0;

	while (i < s->count && strcmp(s->names[i], name) != 0)
		i++;
	return i;
}

static void
db_session_holds(struct db_session *s, const char *name, bool holds)
{
	size_t i = db_session_find(s, name);

	if (holds && i == s->count)
	{
		char **names = realloc(s->names, (s->count + 1) * sizeof(*names));
		char  *copy = strdup(name);

		if (names == NULL || copy == NULL)
		{
			/* Not noted: it is prepared again (42P05 answers that it is). */
			free(copy);
			s->names = names ? names : s->names;
			return;
		}
		s->names = names;
		s->names[s->count++] = copy;
	}
	else if (!holds && i < s->count)
	{
		free(s->names[i]);
		s->names[i] = s->names[--s->count];
	}
}

static bool
db_sqlstate_is(const PGresult *res, const char *state)
{
	const char *found = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	return found && strcmp(found, state) == 0;
}

/* Keep statements in sessions (db_keep_statements: false behind a pooler). */
static bool db_keeping = true;

void
db_keep_statements(bool keep)
{
	db_keeping = keep;
}

/*
 * The session lost name: 26000, no such prepared statement (DISCARD ALL,
 * DEALLOCATE, a pooler's other server session), or 0A000, its cached plan's
 * result type changed (an upgrade replaced a function it calls), where the
 * session still holds the stale one and must drop it before preparing
 * again.
 */
static bool
db_statement_lost(PGconn *conn, struct db_session *s, const char *name, const PGresult *res)
{
	bool stale = db_sqlstate_is(res, "0A000");

	if (PQresultStatus(res) != PGRES_FATAL_ERROR || !(stale || db_sqlstate_is(res, "26000")))
		return false;
	db_session_holds(s, name, false);
	if (stale && PQtransactionStatus(conn) == PQTRANS_IDLE)
	{
		char *deallocate = xasprintf("DEALLOCATE %s", name);

		PQclear(PQexec(conn, deallocate));
		free(deallocate);
	}
	return true;
}

PGresult *
db_exec_prepared(PGconn *conn, const char *name, const char *sql, int nparams, const char *const *values,
				 const int *lengths, const int *formats, int result_format)
{
	struct db_session *s;
	PGresult		  *res;

	if (!db_keeping)
		return db_retry(conn, sql, NULL, nparams, values, lengths, formats, result_format);
	s = db_session_of(conn);
	if (db_session_find(s, name) == s->count && !s->refused && PQtransactionStatus(conn) == PQTRANS_IDLE)
	{
		res = PQprepare(conn, name, sql, nparams, NULL);
		/* 42P05: the session holds it already, prepared where db.c did not note it. */
		if (PQresultStatus(res) == PGRES_COMMAND_OK || db_sqlstate_is(res, "42P05"))
			db_session_holds(s, name, true);
		else
			s->refused = true;
		PQclear(res);
	}
	if (db_session_find(s, name) == s->count)
		return db_retry(conn, sql, NULL, nparams, values, lengths, formats, result_format);
	res = db_retry(conn, NULL, name, nparams, values, lengths, formats, result_format);
	/* Lost: prepared again on its next use; inside a transaction the answer is the caller's. */
	if (db_statement_lost(conn, s, name, res) && PQtransactionStatus(conn) == PQTRANS_IDLE)
	{
		PQclear(res);
		res = db_retry(conn, sql, NULL, nparams, values, lengths, formats, result_format);
	}
	return res;
}

/*
 * db_exec_kept's statements are named by their text: the first DB_KEPT_MAX
 * texts a process runs get a name each (pepsi_kept_N), the rest go as
 * text.  Which session holds which name is db_exec_prepared's to track.
 */
#define DB_KEPT_MAX 32
static char	 *db_kept_sql[DB_KEPT_MAX];
static size_t db_kept_count;

PGresult *
db_exec_kept(PGconn *conn, const char *sql, int nparams, const char *const *values, const int *lengths,
			 const int *formats)
{
	char   name[24];
	size_t i = 0;

	while (i < db_kept_count && strcmp(db_kept_sql[i], sql) != 0)
		i++;
	if (i == db_kept_count)
	{
		if (db_kept_count == DB_KEPT_MAX)
			return db_retry(conn, sql, NULL, nparams, values, lengths, formats, 0);
		db_kept_sql[db_kept_count++] = xstrdup(sql);
	}
	snprintf(name, sizeof(name), "pepsi_kept_%zu", i);
	return db_exec_prepared(conn, name, sql, nparams, values, lengths, formats, 0);
}

bool
db_prepare(PGconn *conn, const char *name, const char *sql, char *err, size_t errlen)
{
	PGresult *res = PQprepare(conn, name, sql, 0, NULL);
	bool	  ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	if (!ok)
		snprintf(err, errlen, "cannot prepare %s: %s", name, db_error(res, conn));
	else
		db_session_holds(db_session_of(conn), name, true);
	PQclear(res);
	return ok;
}

const char *
db_error(const PGresult *res, PGconn *conn)
{
	static char message[1024];
	const char *text = res ? PQresultErrorMessage(res) : NULL;
	size_t		n;

	if (text == NULL || *text == '\0')
		text = PQerrorMessage(conn);
	snprintf(message, sizeof(message), "%s", text);
	for (char *p = message; *p; p++)
		if (*p == '\n')
			*p = ' ';
	n = strlen(message);
	while (n > 0 && message[n - 1] == ' ')
		message[--n] = '\0';
	return message;
}

void
db_array_append(struct buf *array, const char *element)
{
	if (array->len > 0 && array->data[array->len - 1] != '{')
		buf_append_char(array, ',');
	if (element == NULL)
	{
		buf_append_str(array, "NULL");
		return;
	}
	buf_append_char(array, '"');
	for (; *element; element++)
	{
		if (*element == '"' || *element == '\\')
			buf_append_char(array, '\\');
		buf_append_char(array, *element);
	}
	buf_append_char(array, '"');
}

bool
db_pad_int_array(const char *array, size_t count, size_t length, char *out, size_t outlen)
{
	size_t		len = strlen(array);
	const char *last = strrchr(array, ',');
	size_t		used;

	if (len < 3 || array[0] != '{' || array[len - 1] != '}')
		return false;
	last = last ? last + 1 : array + 1;
	used = (size_t) snprintf(out, outlen, "%.*s", (int) (len - 1), array);
	for (size_t i = count; i < length && used < outlen; i++)
		used += (size_t) snprintf(out + used, outlen - used, ",%.*s", (int) (array + len - 1 - last), last);
	if (used + 2 > outlen)
		return false;
	out[used++] = '}';
	out[used] = '\0';
	return true;
}
