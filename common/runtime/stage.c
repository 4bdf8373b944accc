/*
 * stage.c: the stage runtime (see stage.h) — the worker loop and
 * loading.  Running a pass with its fused successors is in
 * stage_fusion.c, the row's accessors and setters in stage_row.c, the
 * terminals and fan-out in stage_terminal.c, batching and committing in
 * stage_commit.c.
 *
 * Protocol: one workqueue id per input line; one status line per id, in
 * order: "0" (optionally followed by a space and a JSON report of the
 * stages fused into the pass) or "1 {json}" with the reason.  Stdout is the
 * protocol and nothing else writes to it; logs go to stderr.
 *
 * A body-free (METADATA) stage drains the ids already waiting on stdin,
 * loads them in one SELECT ... = ANY, runs each, and commits the plain
 * outcomes with one pepsi.workqueue_commit_many per outcome shape; any
 * other outcome is committed on its own.  Stages that load headers or the
 * body take one id at a time, or as many as their batch_max says (the
 * same loading and committing), with their prepare called on the batch.
 */
#include "runtime/stage.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/log_config.h"
#include "message/queue_id.h"
#include "process/cli.h"
#include "process/privilege.h"
#include "runtime/db.h"
#include "runtime/stage_internal.h"
#include "touched.h"

/* ---------------------------------------------------------------------------
 * Errors and small helpers
 * ------------------------------------------------------------------------- */

int
pepsi_error(struct pepsi_ctx *ctx, const char *fmt, ...)
{
	va_list ap;
	char	message[1024];

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	if (ctx->error == NULL)
		ctx->error = xstrdup(message);
	return -1;
}

double
stage_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

const char *
stage_basename(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

char *
stage_json_text(json_t *json)
{
	return json ? json_dumps(json, JSON_COMPACT) : NULL;
}

/* Append s to b as a JSON string. */
void
stage_json_string(struct buf *b, const char *s)
{
	buf_append_char(b, '"');
	for (; *s; s++)
	{
		unsigned char c = (unsigned char) *s;

		if (c == '"' || c == '\\')
		{
			buf_append_char(b, '\\');
			buf_append_char(b, (char) c);
		}
		else if (c < 0x20)
			buf_printf(b, "\\u%04x", c);
		else
			buf_append_char(b, (char) c);
	}
	buf_append_char(b, '"');
}

/* ---------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------- */

/*
 * The results come in binary: text columns as their bytes, the recipients
 * as a text[] in PostgreSQL's binary array format (stage_text_array),
 * which costs neither side a JSON conversion; the age is date_part's
 * float8, as text (extract would compute a numeric), the received time
 * its microseconds since the epoch (a stable name for what the row
 * delivered: pepsi_received_us).
 */
#define STAGE_LOAD_ENVELOPE                                                   \
	"SELECT w.id::text, w.stage, w.status::text, w.state::text, w.mail_from," \
	" w.rcpt_to, date_part('epoch', now() - w.received_at)::text,"            \
	" (extract(epoch FROM w.received_at) * 1000000)::int8::text"
#define STAGE_LOAD_FROM_ROWS " FROM pepsi.workqueue w"
#define STAGE_LOAD_FROM_BODIES " FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
/*
 * The rows a load reads: a batch by its array of ids, or the one row a
 * worker mostly loads (a stage that takes one id at a time, a pass with
 * one id waiting) by its id.  A prepared statement whose parameter is an
 * array is planned afresh at every execution: the plan for the array
 * given (one element) always looks cheaper than the generic one (costed
 * for ten), so the plan cache never settles on the generic plan, and the
 * relay's loads spent more time in the planner than in the executor
 * (bench/list: 0.30 ms planning, 0.21 ms executing, a load).  The form
 * with one id costs the same either way, so it is planned five times and
 * then never again for the session's life.
 */
#define STAGE_LOAD_WHERE_MANY " WHERE w.id = ANY ($1::int8[])"
#define STAGE_LOAD_WHERE_ONE " WHERE w.id = $1::int8"

/* [one id][pepsi_load] */
static const char *const stage_load_sql[2][3] = {
	{
		[PEPSI_LOAD_METADATA] = STAGE_LOAD_ENVELOPE STAGE_LOAD_FROM_ROWS					 STAGE_LOAD_WHERE_MANY,
		[PEPSI_LOAD_HEADERS] = STAGE_LOAD_ENVELOPE ", w.headers" STAGE_LOAD_FROM_ROWS		 STAGE_LOAD_WHERE_MANY,
		[PEPSI_LOAD_FULL] = STAGE_LOAD_ENVELOPE ", w.headers, b.body" STAGE_LOAD_FROM_BODIES STAGE_LOAD_WHERE_MANY,
	},
	{
		[PEPSI_LOAD_METADATA] = STAGE_LOAD_ENVELOPE STAGE_LOAD_FROM_ROWS					 STAGE_LOAD_WHERE_ONE,
		[PEPSI_LOAD_HEADERS] = STAGE_LOAD_ENVELOPE ", w.headers" STAGE_LOAD_FROM_ROWS		 STAGE_LOAD_WHERE_ONE,
		[PEPSI_LOAD_FULL] = STAGE_LOAD_ENVELOPE ", w.headers, b.body" STAGE_LOAD_FROM_BODIES STAGE_LOAD_WHERE_ONE,
	},
};
static const char *const stage_load_names[2][3] = {
	{"pepsi_load_metadata", "pepsi_load_headers", "pepsi_load_full"},
	{"pepsi_load_metadata_one", "pepsi_load_headers_one", "pepsi_load_full_one"},
};

/*
 * The columns a fused successor needs beyond what its pass loaded (stage.h
 * late_load), for the rows of a batch that go on to it: the headers, or
 * the headers and the body.  Binary results, as above.
 */
static const char *const stage_late_load_sql[2][3] = {
	{
		[PEPSI_LOAD_METADATA] = NULL,
		[PEPSI_LOAD_HEADERS] = "SELECT w.id::text, w.headers" STAGE_LOAD_FROM_ROWS		  STAGE_LOAD_WHERE_MANY,
		[PEPSI_LOAD_FULL] = "SELECT w.id::text, w.headers, b.body" STAGE_LOAD_FROM_BODIES STAGE_LOAD_WHERE_MANY,
	},
	{
		[PEPSI_LOAD_METADATA] = NULL,
		[PEPSI_LOAD_HEADERS] = "SELECT w.id::text, w.headers" STAGE_LOAD_FROM_ROWS		  STAGE_LOAD_WHERE_ONE,
		[PEPSI_LOAD_FULL] = "SELECT w.id::text, w.headers, b.body" STAGE_LOAD_FROM_BODIES STAGE_LOAD_WHERE_ONE,
	},
};
static const char *const stage_late_load_names[2][3] = {
	{NULL, "pepsi_late_load_headers", "pepsi_late_load_full"},
	{NULL, "pepsi_late_load_headers_one", "pepsi_late_load_full_one"},
};

/*
 * How the worker's session plans.  Its loads read pepsi.workqueue (and
 * the bodies) by primary key, prepared once for the session's life, so
 * their generic plan is costed for the table as it was then.  A worker
 * started on an empty queue, as workers are when mail starts to arrive,
 * kept a sequential scan of a table of a few pages (and, for a load with
 * the body, a hash join over every body), and while the burst that
 * followed grew the table to thousands of pages every load of a few rows
 * read them all: in bench/fairness 3.4 ms and 1,650 buffers a load, a
 * third of the run's database time (t/024 shows the plan).  As the
 * extension's claim and commit functions are (pepsi--0.1--0.2.sql), the
 * session is planned with sequential scans off, which keeps every keyed
 * read on its index whatever the table's size, and without JIT, which the
 * disabled cost of a table read whole (the options overrides) would
 * otherwise set compiling.  No statement of a stage reads a table of the
 * queue whole.  One statement, so db_exec's retry of a transient error
 * covers it.
 */
#define STAGE_SESSION_SQL "SELECT set_config('enable_seqscan', 'off', false), set_config('jit', 'off', false)"

/*
 * Set up the worker's session and prepare its loads (at start, and after a
 * reconnect).  Through a pooler in transaction mode ([database]
 * STAGE_POOLED; PgBouncer 1.18 keeps no prepared statement there) each
 * transaction may get another server session: nothing is prepared, the
 * loads go as text (stage_exec_load), and the planner settings are left
 * as the server has them (the loads' plans then depend on the table's
 * statistics, as any client's do).
 */
static bool
stage_prepare_statements(struct stage_worker *w, PGconn *conn, char *err, size_t errlen)
{
	PGresult *res;
	bool	  ok;

	if (w->pooled)
		return true;
	res = db_exec(conn, STAGE_SESSION_SQL, 0, NULL);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;

	if (!ok)
		snprintf(err, errlen, "cannot set up the session: %s", db_error(res, conn));
	PQclear(res);
	if (!ok)
		return false;
	for (int one = 0; one <= 1; one++)
		for (int load = PEPSI_LOAD_METADATA; load <= PEPSI_LOAD_FULL; load++)
		{
			if (!db_prepare(conn, stage_load_names[one][load], stage_load_sql[one][load], err, errlen))
				return false;
			if (stage_late_load_sql[one][load]
				&& !db_prepare(conn, stage_late_load_names[one][load], stage_late_load_sql[one][load], err,
							   errlen))
				return false;
		}
	return true;
}

static char *
stage_value(PGresult *res, int row, int col)
{
	return xstrndup(PQgetvalue(res, row, col), (size_t) PQgetlength(res, row, col));
}

/* A big-endian 32-bit integer of a binary value, advancing *p; false past end. */
static bool
stage_binary_uint32(const unsigned char **p, const unsigned char *end, uint32_t *value)
{
	if (end - *p < 4)
		return false;
	*value = (uint32_t) (*p)[0] << 24 | (uint32_t) (*p)[1] << 16 | (uint32_t) (*p)[2] << 8 | (*p)[3];
	*p += 4;
	return true;
}

/*
 * The elements of a one-dimensional text[] without NULLs in PostgreSQL's
 * binary array format (ndim, flags, element type, then size and lower
 * bound per dimension, then length and bytes per element), as a
 * NULL-terminated array of strings; NULL if the value is not one.
 */
static char **
stage_text_array(const char *data, size_t len, size_t *count)
{
	const unsigned char *p = (const unsigned char *) data;
	const unsigned char *end = p + len;
	uint32_t			 ndim, flags, type, size = 0, lower;
	char			   **elements;

	if (!stage_binary_uint32(&p, end, &ndim) || !stage_binary_uint32(&p, end, &flags)
		|| !stage_binary_uint32(&p, end, &type) || type != 25 /* text */ || ndim > 1
		|| (ndim == 1 && (!stage_binary_uint32(&p, end, &size) || !stage_binary_uint32(&p, end, &lower)))
		|| size > len / 4)
		return NULL;
	elements = xcalloc((size_t) size + 1, sizeof(char *));
	for (uint32_t i = 0; i < size; i++)
	{
		uint32_t length;

		/* A NULL element is length 0xffffffff: more than what is left. */
		if (!stage_binary_uint32(&p, end, &length) || length > (size_t) (end - p)
			|| memchr(p, '\0', length) != NULL)
		{
			for (uint32_t j = 0; j < i; j++)
				free(elements[j]);
			free(elements);
			return NULL;
		}
		elements[i] = xstrndup((const char *) p, length);
		p += length;
	}
	*count = size;
	return elements;
}

/* Fill ctx from result row, checking the row is ours to run. */
static void
stage_ctx_from_row(struct pepsi_ctx *ctx, PGresult *res, int row)
{
	struct stage_worker *w = ctx->worker;
	char				*status = stage_value(res, row, 2);
	const char			*program;

	ctx->db_stage = stage_value(res, row, 1);
	ctx->stage_name = xstrdup(ctx->db_stage);
	ctx->section = xasprintf("stage-%s", ctx->db_stage);
	if (strcmp(status, "running") != 0)
	{
		pepsi_error(ctx, "row %lld is %s, not running", ctx->id, status);
		free(status);
		return;
	}
	free(status);
	program = config_get(w->cfg, ctx->section, "PROGRAM");
	if (program == NULL)
	{
		pepsi_error(ctx, "row %lld is at stage %s, but %s has no [%s] section with a PROGRAM",
					ctx->id, ctx->db_stage, w->cfg->path, ctx->section);
		return;
	}
	if (strcmp(stage_basename(program), w->stage->program) != 0)
	{
		pepsi_error(ctx, "row %lld is at stage %s, whose PROGRAM is %s, not %s", ctx->id,
					ctx->db_stage, program, w->stage->program);
		return;
	}
	/* Parsed only if the stage reads it (stage_state): many never do. */
	ctx->state_text = stage_value(res, row, 3);
	ctx->mail_from = stage_value(res, row, 4);
	ctx->rcpt = stage_text_array(PQgetvalue(res, row, 5), (size_t) PQgetlength(res, row, 5), &ctx->nrcpt);
	if (ctx->rcpt == NULL)
	{
		ctx->nrcpt = 0;
		ctx->rcpt = xcalloc(1, sizeof(char *));
		pepsi_error(ctx, "row %lld: the recipients are not a text array", ctx->id);
		return;
	}
	{
		char *age = stage_value(res, row, 6);

		ctx->age_seconds = atof(age);
		ctx->loaded_us = stage_now_us();
		free(age);
		age = stage_value(res, row, 7);
		ctx->received_us = atoll(age);
		free(age);
	}
	if (w->stage->load >= PEPSI_LOAD_HEADERS)
		buf_append(&ctx->headers, PQgetvalue(res, row, 8), (size_t) PQgetlength(res, row, 8));
	if (w->stage->load >= PEPSI_LOAD_FULL)
		buf_append(&ctx->body, PQgetvalue(res, row, 9), (size_t) PQgetlength(res, row, 9));
	ctx->valid = true;
}

static void
stage_ctx_free(struct pepsi_ctx *ctx)
{
	free(ctx->db_stage);
	free(ctx->stage_name);
	free(ctx->section);
	free(ctx->mail_from);
	for (size_t i = 0; i < ctx->nrcpt; i++)
		free(ctx->rcpt[i]);
	free(ctx->rcpt);
	free(ctx->state_text);
	json_decref(ctx->state);
	json_decref(ctx->merge);
	buf_free(&ctx->headers);
	buf_free(&ctx->body);
	free(ctx->target);
	free(ctx->keep);
	json_decref(ctx->clones);
	json_decref(ctx->mail_log);
	free(ctx->delivery_stage);
	free(ctx->error);
	buf_free(&ctx->fused);
}

/*
 * An id given twice in one batch: one at a time, the second would find the
 * row no longer running and be refused; in a batch both copies would run
 * on the row as loaded, and a split would be made twice from stale
 * recipients.  So the repeat is refused here, as it would have been.
 */
static void
stage_refuse_repeated_ids(struct pepsi_ctx *ctxs, size_t count)
{
	for (size_t i = 1; i < count; i++)
		for (size_t j = 0; j < i && ctxs[i].error == NULL; j++)
			if (ctxs[j].id == ctxs[i].id && ctxs[j].error == NULL)
				pepsi_error(&ctxs[i], "row %lld is already in this batch (given twice)",
							ctxs[i].id);
}

struct stage_loaded_row
{
	long long id;
	int		  row;
};

static int
stage_loaded_row_compare(const void *a, const void *b)
{
	long long x = ((const struct stage_loaded_row *) a)->id;
	long long y = ((const struct stage_loaded_row *) b)->id;

	return (x > y) - (x < y);
}

/*
 * The worker's nice value goes on to its database session, where most of
 * a row's CPU is spent: a bulk worker the dispatcher runs at BULK_NICE
 * (daemons/dispatch/pool.c) must not keep a session that competes at full
 * weight with the light lane's.  Checked before each batch, since the
 * dispatcher may lower a running worker's priority (one getpriority call);
 * pepsi.session_nice only ever raises the session's value.  A session
 * that cannot take it (an extension not yet updated) is warned of once
 * and used as it is.
 */
static void
stage_session_priority(struct stage_worker *w)
{
	static bool warned;
	char		value[16];
	const char *values[1] = {value};
	int			nice_value;
	PGresult   *res;

	if (w->pooled)
		return; /* the next transaction may run in another session */
	errno = 0;
	nice_value = getpriority(PRIO_PROCESS, 0);
	if (errno != 0 || nice_value <= w->session_nice)
		return;
	snprintf(value, sizeof(value), "%d", nice_value);
	res = PQexecParams(w->conn, "SELECT pepsi.session_nice($1::integer)", 1, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		w->session_nice = nice_value;
	else if (!warned)
	{
		log_warnx("cannot give the database session the worker's nice value %d: %s", nice_value,
				  PQerrorMessage(w->conn));
		warned = true;
	}
	PQclear(res);
}

/*
 * After a statement failed because the session is gone (the server
 * restarted, or the primary moved): reconnect, for STAGE_RECONNECT_SECONDS
 * at most, and prepare the load statements again.  The conninfo's hosts
 * are tried in turn at each attempt, and only a read-write session is
 * taken (db.h), so after a failover this finds the new primary.  The rows
 * are untouched and still running, so the caller can simply retry; a
 * commit whose answer was lost is retried too, and finds the row moved on
 * if it had committed (stage_commit_one).  The bound covers a Patroni
 * failover (ttl 30 s, docs/scaling.md); the dispatcher's MAX_RUNTIME
 * bounds the whole.
 */
#define STAGE_RECONNECT_SECONDS 45.0

bool
stage_reconnect(struct stage_worker *w)
{
	char   err[1024];
	double started = stage_now_us();

	if (PQstatus(w->conn) == CONNECTION_OK)
		return false;
	log_warnx("lost the database connection (%s); reconnecting for up to %.0f s", db_error(NULL, w->conn),
			  STAGE_RECONNECT_SECONDS);
	for (int attempt = 0;; attempt++)
	{
		PQreset(w->conn);
		if (PQstatus(w->conn) == CONNECTION_OK
			|| stage_now_us() - started > STAGE_RECONNECT_SECONDS * 1e6)
			break;
		usleep(100000U * (attempt < 5 ? attempt + 1 : 5));
	}
	if (PQstatus(w->conn) != CONNECTION_OK || !stage_prepare_statements(w, w->conn, err, sizeof(err)))
		return false;
	w->session_nice = 0; /* a new session */
	log_info("reconnected to the database (%s port %s)", PQhost(w->conn), PQport(w->conn));
	return true;
}

/*
 * A batch's ids are padded to the length PostgreSQL's planner assumes for
 * an unknown array parameter (db_pad_int_array), so the plan for the
 * array given costs what the generic one does and the plan cache keeps
 * the generic plan, not planning each load afresh (bench/list's VERP
 * fan-out: 586 batch loads a run).  "= ANY" reads a repeated id once.
 */
#define STAGE_LOAD_PLANNED_IDS 10

PGresult *
stage_exec_load(struct stage_worker *w, bool late, enum pepsi_load level, const char *ids, size_t count,
				int format)
{
	int			one = count == 1;
	const char *name = late ? stage_late_load_names[one][level] : stage_load_names[one][level];
	const char *sql = late ? stage_late_load_sql[one][level] : stage_load_sql[one][level];
	char		id[32];
	char		padded[STAGE_LOAD_PLANNED_IDS * 21 + 2];
	const char *values[1] = {ids};

	/* One id: the array literal's element alone ("{123}" -> "123"). */
	if (one)
	{
		snprintf(id, sizeof(id), "%.*s", (int) strcspn(ids + 1, "}"), ids + 1);
		values[0] = id;
	}
	else if (count < STAGE_LOAD_PLANNED_IDS && !w->pooled
			 && db_pad_int_array(ids, count, STAGE_LOAD_PLANNED_IDS, padded, sizeof(padded)))
		values[0] = padded;
	if (w->pooled)
		return PQexecParams(w->conn, sql, 1, NULL, values, NULL, NULL, format);
	return db_exec_prepared(w->conn, name, sql, 1, values, NULL, NULL, format);
}

/* Load every id of the batch in one statement (binary results: raw text and bytes). */
static void
stage_load(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t count)
{
	struct buf				*ids = &w->scratch[SCRATCH_IDS];
	const char				*values[1];
	PGresult				*res;
	int						 format = 1;
	size_t					 asked = 0;
	struct stage_loaded_row *rows;
	int						 nrows;

	stage_refuse_repeated_ids(ctxs, count);
	buf_append_char(ids, '{');
	for (size_t i = 0; i < count; i++)
		if (ctxs[i].error == NULL)
		{
			buf_printf(ids, "%s%lld", asked ? "," : "", ctxs[i].id);
			asked++;
		}
	buf_append_char(ids, '}');
	if (asked == 0)
	{
		buf_reset(ids);
		return;
	}
	values[0] = ids->data;
	res = stage_exec_load(w, false, w->stage->load, values[0], asked, format);
	if (PQresultStatus(res) != PGRES_TUPLES_OK && stage_reconnect(w))
	{
		PQclear(res);
		res = stage_exec_load(w, false, w->stage->load, values[0], asked, format);
	}
	buf_reset(ids);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		for (size_t i = 0; i < count; i++)
			if (ctxs[i].error == NULL)
				pepsi_error(&ctxs[i], "cannot load row %lld: %s", ctxs[i].id, db_error(res, w->conn));
		PQclear(res);
		return;
	}
	/* The rows come in no particular order: find each id's by binary search. */
	nrows = PQntuples(res);
	rows = xcalloc((size_t) nrows + 1, sizeof(*rows));
	for (int r = 0; r < nrows; r++)
	{
		rows[r].id = atoll(PQgetvalue(res, r, 0));
		rows[r].row = r;
	}
	qsort(rows, (size_t) nrows, sizeof(*rows), stage_loaded_row_compare);
	for (size_t i = 0; i < count; i++)
	{
		struct stage_loaded_row		   key = {.id = ctxs[i].id};
		const struct stage_loaded_row *found;

		if (ctxs[i].error != NULL)
			continue;
		found = bsearch(&key, rows, (size_t) nrows, sizeof(*rows), stage_loaded_row_compare);
		if (found)
			stage_ctx_from_row(&ctxs[i], res, found->row);
		else
			pepsi_error(&ctxs[i], "row %lld does not exist", ctxs[i].id);
	}
	free(rows);
	PQclear(res);
}

/* The stage's prepare, on the rows that loaded. */
static void
stage_prepare(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t count)
{
	struct pepsi_ctx **loaded;
	size_t			   n = 0;

	if (w->stage->prepare == NULL)
		return;
	loaded = xcalloc(count, sizeof(*loaded));
	for (size_t i = 0; i < count; i++)
		if (ctxs[i].error == NULL && ctxs[i].valid)
			loaded[n++] = &ctxs[i];
	if (n > 0)
		w->stage->prepare(loaded, n);
	free(loaded);
}

/* ---------------------------------------------------------------------------
 * The worker loop
 * ------------------------------------------------------------------------- */

/* Read more of stdin; block only if asked.  Returns false at end of input. */
static bool
stage_read_input(struct stage_worker *w, bool block)
{
	char	chunk[4096];
	ssize_t n;

	if (!block)
	{
		struct pollfd pfd = {.fd = 0, .events = POLLIN};

		if (poll(&pfd, 1, 0) <= 0)
			return true;
	}
	do
		n = read(0, chunk, sizeof(chunk));
	while (n < 0 && errno == EINTR);
	if (n <= 0)
	{
		w->eof = true;
		return false;
	}
	buf_append(&w->input, chunk, (size_t) n);
	return true;
}

/*
 * Take the next complete line from the input buffer into line
 * (NUL-terminated).  At end of input what is left is the last line, line
 * end or not ("printf 42 | PROGRAM worker" is answered, not ignored).
 */
static bool
stage_next_line(struct stage_worker *w, char *line, size_t size)
{
	char  *nl = w->input.len ? memchr(w->input.data, '\n', w->input.len) : NULL;
	size_t len;

	if (nl == NULL && (!w->eof || w->input.len == 0))
		return false;
	len = nl ? (size_t) (nl - w->input.data) : w->input.len;
	snprintf(line, size, "%.*s", (int) (len < size ? len : size - 1), w->input.data);
	buf_consume(&w->input, nl ? len + 1 : len);
	return true;
}

/*
 * An input line: the row id, then (from a dispatcher of 0.4 on) a space
 * and the row's claim token, a uuid, which every call that changes the row
 * names.  A bare id (a worker run by hand) leaves token empty.
 */
static bool
stage_parse_id(const char *line, long long *id, char token[37])
{
	char	   *end;
	size_t		len = strlen(line);
	const char *space = memchr(line, ' ', len);
	size_t		idlen;

	while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' '))
		len--;
	idlen = space && (size_t) (space - line) < len ? (size_t) (space - line) : len;
	token[0] = '\0';
	if (idlen == 0 || idlen > 19)
		return false;
	for (size_t i = 0; i < idlen; i++)
		if (line[i] < '0' || line[i] > '9')
			return false;
	if (idlen < len)
	{
		size_t tlen = len - idlen - 1;

		if (tlen != 36)
			return false;
		for (size_t i = 0; i < tlen; i++)
		{
			char c = line[idlen + 1 + i];

			if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
				  || (c == '-' && (i == 8 || i == 13 || i == 18 || i == 23))))
				return false;
		}
		memcpy(token, line + idlen + 1, tlen);
		token[tlen] = '\0';
	}
	*id = strtoll(line, &end, 10);
	return *id > 0;
}

void
pepsi_when_idle(struct pepsi_ctx *ctx, pepsi_idle_fn fn)
{
	struct stage_worker *w = ctx->worker;

	for (size_t i = 0; i < w->nidle; i++)
		if (w->idle[i] == fn)
			return;
	if (w->nidle == STAGE_IDLE_MAX)
		fatalx("more than %d idle callbacks", STAGE_IDLE_MAX);
	w->idle[w->nidle++] = fn;
}

/* Before blocking for input: the idle callbacks, until all let go or input came. */
static void
stage_idle(struct stage_worker *w)
{
	double started = stage_now_us();

	while (w->nidle > 0 && !w->eof)
	{
		int			  wait = -1;
		struct pollfd pfd = {.fd = 0, .events = POLLIN};

		for (size_t i = 0; i < w->nidle;)
		{
			int ms = w->idle[i](w->conn, (stage_now_us() - started) / 1e6);

			if (ms < 0)
			{
				w->idle[i] = w->idle[--w->nidle];
				continue;
			}
			if (wait < 0 || ms < wait)
				wait = ms;
			i++;
		}
		if (w->nidle == 0 || poll(&pfd, 1, wait) != 0)
			return;
	}
}

/*
 * Gather the next batch: block for one line, then (for a metadata stage)
 * take every further line already waiting, without blocking.
 */
static size_t
stage_next_batch(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t max)
{
	char   line[256];
	size_t count = 0;

	if (w->stage->load != PEPSI_LOAD_METADATA)
		max = w->stage->batch_max > 1 && w->stage->batch_max < max ? w->stage->batch_max : 1;
	else if (w->late_batch_cap != 0 && w->late_batch_cap < max)
		max = w->late_batch_cap; /* the rest waits for the next batch (stage_late_fusion) */
	while (!stage_next_line(w, line, sizeof(line)))
	{
		if (w->eof)
			return 0;
		stage_idle(w);
		stage_read_input(w, true);
	}
	do
	{
		struct pepsi_ctx *ctx = &ctxs[count++];

		memset(ctx, 0, sizeof(*ctx));
		ctx->worker = w;
		ctx->stage = w->stage;
		ctx->loaded = w->stage->load;
		ctx->merge = json_object();
		if (!stage_parse_id(line, &ctx->id, ctx->token))
			pepsi_error(ctx, "malformed id line \"%.64s\"", line);
		if (count == max)
			break;
		if (!stage_next_line(w, line, sizeof(line)))
		{
			stage_read_input(w, false);
			if (!stage_next_line(w, line, sizeof(line)))
				break;
		}
	} while (count < max);
	return count;
}

/*
 * The status line's "queued": the stages at which this pass left rows
 * pending, when the runtime knows them (stage_queued_known): its
 * advance's target, or none.
 * The dispatcher claims after a status line only at those stages and at
 * the worker's own (daemons/dispatch/pool.c, pool_note_queued).  Rows the
 * runtime cannot vouch for (a split or fan-out, clones, a function called
 * through pepsi_call_json, anything written through pepsi_db) leave it
 * out, and the dispatcher then claims at every stage, as it would for a
 * worker not of this runtime.  Side messages (pepsi_enqueue_new) notify
 * the dispatcher themselves.  Only a dispatcher that reads "queued" asks
 * for it (STAGE_STATUS_QUEUED_ENV): a worker run by hand, or by another
 * supervisor, writes the plain "0" the protocol began with.
 */
static bool
stage_queued_known(const struct stage_worker *w, const struct pepsi_ctx *ctx)
{
	return w->report_queued && !ctx->split_done && ctx->clones == NULL && !ctx->queued_unknown
		   && !w->db_handed_out;
}

static void
stage_queued_at(const struct pepsi_ctx *ctx, struct buf *out)
{
	buf_append_str(out, "\"queued\":[");
	if (ctx->terminal == TERMINAL_ADVANCE && ctx->target != NULL)
		stage_json_string(out, ctx->target);
	buf_append_str(out, "]");
}

static void
stage_write_status(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t count)
{
	struct buf *out = &w->scratch[SCRATCH_STATUS];

	for (size_t i = 0; i < count; i++)
	{
		struct pepsi_ctx *ctx = &ctxs[i];

		if (ctx->error)
		{
			json_t *report = json_pack("{s:s}", "error", ctx->error);
			char   *text = json_dumps(report, JSON_COMPACT);

			log_warnx("%s", ctx->error);
			buf_printf(out, "1 %s\n", text ? text : "{}");
			free(text);
			json_decref(report);
		}
		else
		{
			/* "0", or "0 {...}" with whatever there is to report. */
			const char *sep = "0 {";

			/* The dispatcher counts fused and delivery in pepsi.stage_stats: no worker writes it. */
			if (ctx->fused.len > 0)
			{
				buf_append_str(out, sep);
				buf_append_str(out, "\"fused\":[");
				buf_append(out, ctx->fused.data, ctx->fused.len);
				buf_append_str(out, "]");
				sep = ",";
			}
			if (ctx->delivery)
			{
				buf_append_str(out, sep);
				buf_append_str(out, "\"delivery\":{\"stage\":");
				stage_json_string(out, ctx->delivery_stage);
				buf_printf(out, ",\"status\":\"%s\",\"delay\":%.3f}", ctx->delivery, ctx->delivery_delay);
				sep = ",";
			}
			if (stage_queued_known(w, ctx))
			{
				buf_append_str(out, sep);
				stage_queued_at(ctx, out);
				sep = ",";
			}
			buf_append_str(out, strcmp(sep, "0 {") == 0 ? "0\n" : "}\n");
		}
	}
	w->db_handed_out = false;
	for (size_t off = 0; off < out->len;)
	{
		ssize_t n = write(1, out->data + off, out->len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fatal("cannot write status lines");
		off += (size_t) n;
	}
	buf_reset(out);
}

static void
stage_usage(const struct pepsi_stage *stage, FILE *out)
{
	fprintf(out, "usage: %s worker [-c CONFIG] [-v]\n"
				 "  Reads workqueue ids from stdin, one per line; writes one status line each.\n"
				 "  CONFIG defaults to $PEPSI_CONFIG, then %s.\n",
			stage->program, PEPSI_CONFIG_DEFAULT_PATH);
}

/* Check every section that runs this program, before taking work. */
static void
stage_check_sections(struct stage_worker *w)
{
	const char *sections[256];
	size_t		n = config_sections(w->cfg, "stage-", sections, 256);
	char		err[1024];

	for (size_t i = 0; i < n; i++)
	{
		const char *program = config_get(w->cfg, sections[i], "PROGRAM");

		if (program && strcmp(stage_basename(program), w->stage->program) == 0
			&& w->stage->check_config && !w->stage->check_config(w->cfg, sections[i], err, sizeof(err)))
			fatalx("%s", err);
	}
}

int
pepsi_worker_main(const struct pepsi_stage *stage, int argc, char **argv)
{
	struct stage_worker w = {.stage = stage};
	const char		   *config_path;
	const char		   *report_queued;
	char				err[1024];
	struct pepsi_ctx   *ctxs;
	bool				help;

	/* Installed set-group-id (dot-forward, relay-to-maildir): the group is for its helper only. */
	privilege_setid_start();
	log_init(stage->program, false);
	if (argc >= 2 && cli_is_help(argv[1]))
	{
		stage_usage(stage, stdout);
		return 0;
	}
	if (argc < 2 || strcmp(argv[1], "worker") != 0)
	{
		stage_usage(stage, stderr);
		return 64;
	}
	optind = 2;
	if (!cli_daemon_options(argc, argv, &config_path, &help) || help)
	{
		stage_usage(stage, help ? stdout : stderr);
		return help ? 0 : 64;
	}
	signal(SIGPIPE, SIG_IGN);

	if ((w.cfg = privilege_config_load(config_path, err, sizeof(err))) == NULL
		|| !log_configure(w.cfg, err, sizeof(err)))
		fatalx("%s", err);
	/*
	 * A stage with a conninfo section of its own (the crypto stages: peer
	 * authentication keys off their effective uid) connects directly with
	 * it, never through the pooler; the others with STAGE_CONNINFO.
	 */
	w.pooled = stage->conninfo_section == NULL && config_bool(w.cfg, "database", "STAGE_POOLED");
	db_keep_statements(!w.pooled);
	if ((w.conn = stage->conninfo_section
					  ? db_connect_as(w.cfg, stage->conninfo_section, "CONNINFO", stage->program, err, sizeof(err))
					  : db_connect_as(w.cfg, "database", "STAGE_CONNINFO", stage->program, err, sizeof(err)))
		== NULL)
		fatalx("%s", err);
	if (!db_load_overrides(w.conn, w.cfg, err, sizeof(err)))
		fatalx("%s", err);
	w.allow_fusion = config_bool(w.cfg, "pepsi", "ALLOW_FUSION");
	w.mail_log = config_bool(w.cfg, "pepsi", "MAIL_LOG");
	w.queue_id_host = queue_id_host(w.cfg);
	report_queued = getenv(STAGE_STATUS_QUEUED_ENV);
	w.report_queued = report_queued != NULL && strcmp(report_queued, "1") == 0;
	stage_check_sections(&w);
	if (!stage_prepare_statements(&w, w.conn, err, sizeof(err)))
		fatalx("%s", err);

	ctxs = xcalloc(STAGE_BATCH_MAX, sizeof(*ctxs));
	for (;;)
	{
		size_t count = stage_next_batch(&w, ctxs, STAGE_BATCH_MAX);
		double started = stage_now_us();

		if (count == 0)
			break;
		if (PQstatus(w.conn) != CONNECTION_OK && !stage_reconnect(&w))
			fatalx("lost the database connection: %s", PQerrorMessage(w.conn));
		stage_session_priority(&w);
		stage_load(&w, ctxs, count);
		stage_prepare(&w, ctxs, count);
		for (size_t i = 0; i < count; i++)
		{
			if (ctxs[i].error == NULL)
				stage_run_pass(&ctxs[i]);
			/* Its stage's writes are in the session's transaction: commit it now, before the next. */
			if (ctxs[i].own_transaction)
				stage_commit_with_writes(&ctxs[i]);
		}
		stage_late_fusion(&w, ctxs, count, started);
		stage_commit_all(&w, ctxs, count);
		stage_write_status(&w, ctxs, count);
		for (size_t i = 0; i < count; i++)
			stage_ctx_free(&ctxs[i]);
	}
	free(ctxs);
	for (int i = 0; i < SCRATCH_COUNT; i++)
		buf_free(&w.scratch[i]);
	buf_free(&w.input);
	json_decref(w.settings); /* pepsi_prefetch_address_settings' last batch */
	PQfinish(w.conn);
	config_free(w.cfg);
	return 0;
}
