/*
 * stage.c: the stage runtime (see stage.h) — the worker loop, loading,
 * the content setters and terminals, fusion and batching.
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
 * body take one id at a time.
 */
#include "stage.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "db.h"
#include "log.h"
#include "xalloc.h"
#include "touched.h"

#define STAGE_BATCH_MAX 1024
#define STAGE_FUSION_MAX_HOPS 32


enum terminal_kind
{
	TERMINAL_NONE,
	TERMINAL_ADVANCE,
	TERMINAL_PAUSE,
	TERMINAL_PAUSE_WITH,
	TERMINAL_FAIL,
	TERMINAL_FINISH,
	TERMINAL_FINISH_WITH
};

/* Buffers a worker reuses from batch to batch, rather than growing new ones each time. */
enum scratch
{
	SCRATCH_IDS,
	SCRATCH_STAGES,
	SCRATCH_TARGETS,
	SCRATCH_MERGES,
	SCRATCH_RETRIES,
	SCRATCH_STATUS,
	SCRATCH_COUNT
};

struct worker
{
	const struct pepsi_stage *stage;
	struct pepsi_config *cfg;
	PGconn	   *conn;
	bool		allow_fusion;
	struct buf	input;
	bool		eof;
	struct buf	scratch[SCRATCH_COUNT];
};

struct pepsi_ctx
{
	struct worker *worker;
	const struct pepsi_stage *stage;	/* running now (a successor, when fused) */
	long long	id;
	char	   *db_stage;		/* where the row is in the database */
	char	   *stage_name;		/* the stage running now */
	char	   *section;		/* "stage-" stage_name */
	enum pepsi_load loaded;
	char	   *mail_from;
	char	  **rcpt;
	size_t		nrcpt;
	double		age_seconds;	/* now - received_at, when loaded */
	json_t	   *state;			/* current view: database state with this pass's changes */
	json_t	   *merge;			/* changes to merge at commit */
	struct buf	headers;
	struct buf	body;
	unsigned	touched;
	bool		split_done;
	/* the outcome */
	enum terminal_kind terminal;
	int			terminals;
	char	   *target;
	double		retry_seconds;
	int		   *keep;
	size_t		nkeep;
	json_t	   *clones;
	char	   *error;
	struct buf	fused;			/* {"stage":s,"us":n},... of the successors run in this pass */
	/* the input line, for the status */
	bool		valid;
};

static pepsi_registry_fn stage_registry;

void
pepsi_registry_install(pepsi_registry_fn lookup)
{
	stage_registry = lookup;
}

/* ---------------------------------------------------------------------------
 * Errors and small helpers
 * ------------------------------------------------------------------------- */

int
pepsi_error(struct pepsi_ctx *ctx, const char *fmt, ...)
{
	va_list		ap;
	char		message[1024];

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	if (ctx->error == NULL)
		ctx->error = xstrdup(message);
	return -1;
}

static double
stage_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static const char *
stage_basename(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

static char *
stage_json_text(json_t *json)
{
	return json ? json_dumps(json, JSON_COMPACT) : NULL;
}

/* Append s to b as a JSON string. */
static void
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
 * Accessors
 * ------------------------------------------------------------------------- */

long long
pepsi_id(const struct pepsi_ctx *ctx)
{
	return ctx->id;
}

const char *
pepsi_stage_name(const struct pepsi_ctx *ctx)
{
	return ctx->stage_name;
}

double
pepsi_message_age(const struct pepsi_ctx *ctx)
{
	return ctx->age_seconds;
}

const char *
pepsi_mail_from(const struct pepsi_ctx *ctx)
{
	return ctx->mail_from;
}

size_t
pepsi_rcpt_count(const struct pepsi_ctx *ctx)
{
	return ctx->nrcpt;
}

const char *
pepsi_rcpt(const struct pepsi_ctx *ctx, size_t index)
{
	return index < ctx->nrcpt ? ctx->rcpt[index] : NULL;
}

json_t *
pepsi_state(const struct pepsi_ctx *ctx)
{
	return ctx->state;
}

const struct buf *
pepsi_headers(struct pepsi_ctx *ctx)
{
	if (ctx->loaded < PEPSI_LOAD_HEADERS)
	{
		pepsi_error(ctx, "%s read the headers but declared a metadata load", ctx->stage->program);
		return NULL;
	}
	return &ctx->headers;
}

const struct buf *
pepsi_body(struct pepsi_ctx *ctx)
{
	if (ctx->loaded < PEPSI_LOAD_FULL)
	{
		pepsi_error(ctx, "%s read the body but did not declare a full load", ctx->stage->program);
		return NULL;
	}
	return &ctx->body;
}

bool
pepsi_raw_message(struct pepsi_ctx *ctx, struct buf *out)
{
	if (ctx->loaded < PEPSI_LOAD_FULL)
	{
		pepsi_error(ctx, "%s read the raw message but did not declare a full load",
					ctx->stage->program);
		return false;
	}
	buf_append(out, ctx->headers.data, ctx->headers.len);
	buf_append(out, "\r\n", 2);
	buf_append(out, ctx->body.data, ctx->body.len);
	return true;
}

const struct pepsi_config *
pepsi_config(const struct pepsi_ctx *ctx)
{
	return ctx->worker->cfg;
}

const char *
pepsi_option(const struct pepsi_ctx *ctx, const char *option)
{
	return config_get(ctx->worker->cfg, ctx->section, option);
}

const char *
pepsi_option_for(const struct pepsi_ctx *ctx, const char *option, const char *address)
{
	return config_get_for(ctx->worker->cfg, ctx->section, option, NULL, address);
}

/* ---------------------------------------------------------------------------
 * Content setters
 * ------------------------------------------------------------------------- */

void
pepsi_set_headers(struct pepsi_ctx *ctx, const char *headers, size_t len)
{
	buf_reset(&ctx->headers);
	buf_append(&ctx->headers, headers, len);
	ctx->touched |= TOUCHED_HEADERS;
}

void
pepsi_set_body(struct pepsi_ctx *ctx, const char *body, size_t len)
{
	buf_reset(&ctx->body);
	buf_append(&ctx->body, body, len);
	ctx->touched |= TOUCHED_BODY;
}

void
pepsi_set_mail_from(struct pepsi_ctx *ctx, const char *mail_from)
{
	free(ctx->mail_from);
	ctx->mail_from = xstrdup(mail_from);
	ctx->touched |= TOUCHED_MAIL_FROM;
}

static void
stage_replace_rcpt(struct pepsi_ctx *ctx, const char *const *rcpt, size_t count)
{
	for (size_t i = 0; i < ctx->nrcpt; i++)
		free(ctx->rcpt[i]);
	free(ctx->rcpt);
	ctx->rcpt = xcalloc(count + 1, sizeof(char *));
	for (size_t i = 0; i < count; i++)
		ctx->rcpt[i] = xstrdup(rcpt[i]);
	ctx->nrcpt = count;
}

void
pepsi_set_rcpt_to(struct pepsi_ctx *ctx, const char *const *rcpt, size_t count)
{
	stage_replace_rcpt(ctx, rcpt, count);
	ctx->touched |= TOUCHED_RCPT_TO;
}

void
pepsi_merge_state(struct pepsi_ctx *ctx, json_t *merge)
{
	if (merge == NULL || !json_is_object(merge))
		return;
	json_object_update(ctx->state, merge);
	json_object_update(ctx->merge, merge);
}

void
pepsi_set_state(struct pepsi_ctx *ctx, json_t *state)
{
	json_decref(ctx->state);
	ctx->state = json_is_object(state) ? json_deep_copy(state) : json_object();
	json_object_clear(ctx->merge);
	ctx->touched |= TOUCHED_SET_STATE;
}

/* ---------------------------------------------------------------------------
 * Terminals
 * ------------------------------------------------------------------------- */

static int
stage_terminal(struct pepsi_ctx *ctx, enum terminal_kind kind)
{
	if (++ctx->terminals > 1)
		return pepsi_error(ctx, "%s called a second terminal for row %lld",
						   ctx->stage->program, ctx->id);
	ctx->terminal = kind;
	return 0;
}

int
pepsi_advance_to(struct pepsi_ctx *ctx, const char *stage)
{
	if (stage == NULL || *stage == '\0')
		return pepsi_error(ctx, "%s advanced to no stage", ctx->stage->program);
	if (stage_terminal(ctx, TERMINAL_ADVANCE) != 0)
		return -1;
	free(ctx->target);
	ctx->target = xstrdup(stage);
	return 0;
}

int
pepsi_advance(struct pepsi_ctx *ctx)
{
	const char *next = pepsi_option(ctx, "NEXT_STAGE");

	if (next == NULL)
		return pepsi_error(ctx, "[%s] has no NEXT_STAGE to advance to", ctx->section);
	return pepsi_advance_to(ctx, next);
}

int
pepsi_reroute(struct pepsi_ctx *ctx, const char *stage, json_t *merge)
{
	pepsi_merge_state(ctx, merge);
	return pepsi_advance_to(ctx, stage);
}

int
pepsi_pause(struct pepsi_ctx *ctx, json_t *merge, double seconds)
{
	if (!(seconds >= 0))
		return pepsi_error(ctx, "%s paused for a negative time", ctx->stage->program);
	pepsi_merge_state(ctx, merge);
	if (stage_terminal(ctx, TERMINAL_PAUSE) != 0)
		return -1;
	ctx->retry_seconds = seconds;
	return 0;
}

/* The fan-out and clone paths do not carry content rewrites: refuse rather than drop them. */
static int
stage_refuse_content(struct pepsi_ctx *ctx, const char *what)
{
	if (ctx->touched != 0)
		return pepsi_error(ctx, "%s rewrote the message and then called %s, which cannot "
						   "commit the rewrite", ctx->stage->program, what);
	return 0;
}

int
pepsi_pause_with(struct pepsi_ctx *ctx, json_t *merge, double seconds, const int *keep_indices,
				 size_t nkeep, json_t *clones)
{
	if (stage_refuse_content(ctx, "pause_with") != 0)
		return -1;
	if (pepsi_pause(ctx, merge, seconds) != 0)
		return -1;
	ctx->terminal = TERMINAL_PAUSE_WITH;
	if (keep_indices && nkeep > 0)
	{
		ctx->keep = xcalloc(nkeep, sizeof(int));
		memcpy(ctx->keep, keep_indices, nkeep * sizeof(int));
		ctx->nkeep = nkeep;
	}
	ctx->clones = clones ? json_incref(clones) : NULL;
	return 0;
}

int
pepsi_fail(struct pepsi_ctx *ctx, json_t *merge)
{
	pepsi_merge_state(ctx, merge);
	return stage_terminal(ctx, TERMINAL_FAIL);
}

int
pepsi_finish(struct pepsi_ctx *ctx)
{
	return stage_terminal(ctx, TERMINAL_FINISH);
}

int
pepsi_finish_with(struct pepsi_ctx *ctx, json_t *clones)
{
	if (stage_terminal(ctx, TERMINAL_FINISH_WITH) != 0)
		return -1;
	ctx->clones = clones ? json_incref(clones) : json_array();
	return 0;
}

int
pepsi_advance_or_finish(struct pepsi_ctx *ctx)
{
	return pepsi_option(ctx, "NEXT_STAGE") ? pepsi_advance(ctx) : pepsi_finish(ctx);
}

/*
 * After a successful delivery: when the stage originates success DSNs
 * (ORIGINATE_SUCCESS_DSN) and a recipient asked for one (NOTIFY=SUCCESS),
 * reroute to BOUNCE_STAGE with state.bounce.kind = success; otherwise
 * advance or finish.
 */
int
pepsi_complete_success(struct pepsi_ctx *ctx)
{
	const char *originate = pepsi_option(ctx, "ORIGINATE_SUCCESS_DSN");
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	json_t	   *rcpts = json_object_get(json_object_get(ctx->state, "dsn"), "rcpt");
	bool		wanted = false;
	size_t		i;
	json_t	   *r;

	if (originate && (strcasecmp(originate, "yes") == 0 || strcasecmp(originate, "true") == 0
					  || strcmp(originate, "1") == 0))
		json_array_foreach(rcpts, i, r)
	{
		const char *notify = json_string_value(json_object_get(r, "notify"));

		if (notify && strcasestr(notify, "SUCCESS"))
			wanted = true;
	}
	if (wanted && bounce_stage)
	{
		json_t	   *merge = json_pack("{s:{s:s}}", "bounce", "kind", "success");
		int			rc = pepsi_reroute(ctx, bounce_stage, merge);

		json_decref(merge);
		return rc;
	}
	return pepsi_advance_or_finish(ctx);
}

int
pepsi_rewrite_recipients(struct pepsi_ctx *ctx, const char *const *rcpt, size_t count,
						 json_t *state)
{
	if (count == 0)
		return pepsi_error(ctx, "%s rewrote the recipients to none", ctx->stage->program);
	pepsi_set_rcpt_to(ctx, rcpt, count);
	if (state)
		pepsi_set_state(ctx, state);
	return pepsi_advance(ctx);
}

/* ---------------------------------------------------------------------------
 * Fan-out helpers: immediate extension calls
 * ------------------------------------------------------------------------- */

/* Re-read the row's recipients and state after a split (merges stay applied). */
static int
stage_reload_recipients(struct pepsi_ctx *ctx)
{
	char		id[32];
	const char *values[1] = {id};
	PGresult   *res;
	json_t	   *rcpt;
	json_t	   *state;
	json_error_t jerr;
	size_t		i;
	json_t	   *value;

	snprintf(id, sizeof(id), "%lld", ctx->id);
	res = db_exec(ctx->worker->conn, "SELECT array_to_json(rcpt_to)::text, state::text"
				  " FROM pepsi.workqueue WHERE id = $1", 1, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		pepsi_error(ctx, "cannot re-read row %lld after a split: %s", ctx->id,
					db_error(res, ctx->worker->conn));
		PQclear(res);
		return -1;
	}
	rcpt = json_loads(PQgetvalue(res, 0, 0), 0, &jerr);
	state = json_loads(PQgetvalue(res, 0, 1), 0, &jerr);
	PQclear(res);
	for (size_t k = 0; k < ctx->nrcpt; k++)
		free(ctx->rcpt[k]);
	free(ctx->rcpt);
	ctx->nrcpt = json_array_size(rcpt);
	ctx->rcpt = xcalloc(ctx->nrcpt + 1, sizeof(char *));
	json_array_foreach(rcpt, i, value)
		ctx->rcpt[i] = xstrdup(json_string_value(value));
	json_decref(rcpt);
	json_decref(ctx->state);
	ctx->state = state ? state : json_object();
	json_object_update(ctx->state, ctx->merge);
	return 0;
}

static int
stage_fan_out_call(struct pepsi_ctx *ctx, const char *sql, int nparams, const char *const *values,
				   const char *what)
{
	PGresult   *res;
	int			created;

	if (stage_refuse_content(ctx, what) != 0)
		return -1;
	if (strcmp(ctx->stage_name, ctx->db_stage) != 0)
		return pepsi_error(ctx, "%s called %s in a fused pass; its can_fuse must refuse rows "
						   "it may split", ctx->stage->program, what);
	res = db_exec(ctx->worker->conn, sql, nparams, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		pepsi_error(ctx, "%s of row %lld failed: %s", what, ctx->id, db_error(res, ctx->worker->conn));
		PQclear(res);
		return -1;
	}
	created = atoi(PQgetvalue(res, 0, 0));
	PQclear(res);
	ctx->split_done = true;
	return stage_reload_recipients(ctx) == 0 ? created : -1;
}

static void
stage_int_array(struct buf *b, const int *values, size_t count)
{
	buf_append_char(b, '{');
	for (size_t i = 0; i < count; i++)
		buf_printf(b, "%s%d", i ? "," : "", values[i]);
	buf_append_char(b, '}');
}

int
pepsi_split_off_recipients(struct pepsi_ctx *ctx, const int *indices, size_t count,
						   const char *target_stage)
{
	struct buf	array = BUF_INIT;
	char		id[32];
	const char *values[4];
	int			rc;

	snprintf(id, sizeof(id), "%lld", ctx->id);
	stage_int_array(&array, indices, count);
	values[0] = id;
	values[1] = ctx->db_stage;
	values[2] = array.data;
	values[3] = target_stage;
	rc = stage_fan_out_call(ctx, "SELECT 1 FROM pepsi.workqueue_split_off($1, $2, $3, $4)",
							4, values, "split_off_recipients");
	buf_free(&array);
	return rc;
}

int
pepsi_split_to_one_per_row(struct pepsi_ctx *ctx)
{
	char		id[32];
	const char *values[2] = {id, ctx->db_stage};

	snprintf(id, sizeof(id), "%lld", ctx->id);
	return stage_fan_out_call(ctx, "SELECT coalesce(cardinality(pepsi.workqueue_split_one_per_row($1, $2)), 0)",
							  2, values, "split_to_one_per_row");
}

int
pepsi_fan_out(struct pepsi_ctx *ctx, const int *keep, size_t nkeep, json_t *groups)
{
	struct buf	array = BUF_INIT;
	char		id[32];
	char	   *groups_text = stage_json_text(groups);
	const char *values[4];
	int			rc;

	snprintf(id, sizeof(id), "%lld", ctx->id);
	stage_int_array(&array, keep, nkeep);
	values[0] = id;
	values[1] = ctx->db_stage;
	values[2] = array.data;
	values[3] = groups_text;
	rc = stage_fan_out_call(ctx, "SELECT coalesce(cardinality(pepsi.workqueue_split($1, $2, $3, $4)), 0)",
							4, values, "fan_out");
	free(groups_text);
	buf_free(&array);
	return rc;
}

long long
pepsi_enqueue_new(struct pepsi_ctx *ctx, const char *stage, const char *mail_from,
				  const char *const *rcpt, size_t nrcpt, const char *headers, size_t hlen,
				  const char *body, size_t blen, json_t *state, const char *token)
{
	struct buf	array = BUF_INIT;
	char	   *state_text = state ? stage_json_text(state) : xstrdup("{}");
	const char *values[7];
	int			lengths[7] = {0};
	int			formats[7] = {0};
	PGresult   *res;
	long long	id = 0;

	buf_append_char(&array, '{');
	for (size_t i = 0; i < nrcpt; i++)
		db_array_append(&array, rcpt[i]);
	buf_append_char(&array, '}');
	values[0] = stage;
	values[1] = mail_from;
	values[2] = array.data;
	values[3] = headers;
	lengths[3] = (int) hlen;
	formats[3] = 1;
	values[4] = body;
	lengths[4] = (int) blen;
	formats[4] = 1;
	values[5] = state_text;
	values[6] = token;
	res = PQexecParams(ctx->worker->conn,
					   "SELECT pepsi.workqueue_inject($1, $2, $3, $4, $5, $6, $7)",
					   7, NULL, values, lengths, formats, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		pepsi_error(ctx, "enqueue_new at stage %s failed: %s", stage, db_error(res, ctx->worker->conn));
	else if (!PQgetisnull(res, 0, 0))
		id = atoll(PQgetvalue(res, 0, 0));
	PQclear(res);
	free(state_text);
	buf_free(&array);
	return ctx->error ? -1 : id;
}

/* ---------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------- */

static const char *const stage_load_sql[] = {
	[PEPSI_LOAD_METADATA] =
	"SELECT w.id::text, w.stage, w.status::text, w.state::text, w.mail_from,"
	" array_to_json(w.rcpt_to)::text, extract(epoch FROM now() - w.received_at)::text"
	" FROM pepsi.workqueue w WHERE w.id = ANY ($1::int8[])",
	[PEPSI_LOAD_HEADERS] =
	"SELECT w.id::text, w.stage, w.status::text, w.state::text, w.mail_from,"
	" array_to_json(w.rcpt_to)::text, extract(epoch FROM now() - w.received_at)::text,"
	" w.headers FROM pepsi.workqueue w WHERE w.id = ANY ($1::int8[])",
	[PEPSI_LOAD_FULL] =
	"SELECT w.id::text, w.stage, w.status::text, w.state::text, w.mail_from,"
	" array_to_json(w.rcpt_to)::text, extract(epoch FROM now() - w.received_at)::text,"
	" w.headers, b.body FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
	" WHERE w.id = ANY ($1::int8[])",
};
static const char *const stage_load_names[] = {"pepsi_load_metadata", "pepsi_load_headers", "pepsi_load_full"};

static char *
stage_value(PGresult *res, int row, int col)
{
	return xstrndup(PQgetvalue(res, row, col), (size_t) PQgetlength(res, row, col));
}

/* Fill ctx from result row, checking the row is ours to run. */
static void
stage_ctx_from_row(struct pepsi_ctx *ctx, PGresult *res, int row)
{
	struct worker *w = ctx->worker;
	char	   *status = stage_value(res, row, 2);
	json_error_t jerr;
	json_t	   *rcpt;
	const char *program;
	char	   *state_text;
	char	   *rcpt_text;
	size_t		i;
	json_t	   *value;

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
	state_text = stage_value(res, row, 3);
	ctx->state = json_loads(state_text, 0, &jerr);
	free(state_text);
	if (!json_is_object(ctx->state))
	{
		json_decref(ctx->state);
		ctx->state = json_object();
	}
	ctx->mail_from = stage_value(res, row, 4);
	rcpt_text = stage_value(res, row, 5);
	rcpt = json_loads(rcpt_text, 0, &jerr);
	free(rcpt_text);
	ctx->nrcpt = json_array_size(rcpt);
	ctx->rcpt = xcalloc(ctx->nrcpt + 1, sizeof(char *));
	json_array_foreach(rcpt, i, value)
		ctx->rcpt[i] = xstrdup(json_string_value(value));
	json_decref(rcpt);
	{
		char	   *age = stage_value(res, row, 6);

		ctx->age_seconds = atof(age);
		free(age);
	}
	if (w->stage->load >= PEPSI_LOAD_HEADERS)
		buf_append(&ctx->headers, PQgetvalue(res, row, 7), (size_t) PQgetlength(res, row, 7));
	if (w->stage->load >= PEPSI_LOAD_FULL)
		buf_append(&ctx->body, PQgetvalue(res, row, 8), (size_t) PQgetlength(res, row, 8));
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
	json_decref(ctx->state);
	json_decref(ctx->merge);
	buf_free(&ctx->headers);
	buf_free(&ctx->body);
	free(ctx->target);
	free(ctx->keep);
	json_decref(ctx->clones);
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
	long long	id;
	int			row;
};

static int
stage_loaded_row_compare(const void *a, const void *b)
{
	long long	x = ((const struct stage_loaded_row *) a)->id;
	long long	y = ((const struct stage_loaded_row *) b)->id;

	return (x > y) - (x < y);
}

/*
 * After a statement failed because the session is gone (the server
 * restarted, say): reconnect, for about ten seconds at most, and prepare
 * the load statements again.  The
 * rows are untouched and still running, so the caller can simply retry.
 */
static bool
stage_reconnect(struct worker *w)
{
	char		err[1024];

	if (PQstatus(w->conn) == CONNECTION_OK)
		return false;
	/* A server that is restarting takes a moment: try for about ten seconds. */
	for (int attempt = 0; attempt < 20; attempt++)
	{
		PQreset(w->conn);
		if (PQstatus(w->conn) == CONNECTION_OK)
			break;
		usleep(100000U * (attempt < 5 ? attempt + 1 : 5));
	}
	if (PQstatus(w->conn) != CONNECTION_OK)
		return false;
	for (int load = PEPSI_LOAD_METADATA; load <= PEPSI_LOAD_FULL; load++)
		if (!db_prepare(w->conn, stage_load_names[load], stage_load_sql[load], err, sizeof(err)))
			return false;
	log_info("reconnected to the database");
	return true;
}

/* Load every id of the batch in one statement (binary results: raw text and bytes). */
static void
stage_load(struct worker *w, struct pepsi_ctx *ctxs, size_t count)
{
	struct buf *ids = &w->scratch[SCRATCH_IDS];
	const char *values[1];
	PGresult   *res;
	int			format = 1;
	size_t		asked = 0;
	struct stage_loaded_row *rows;
	int			nrows;

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
	res = PQexecPrepared(w->conn, stage_load_names[w->stage->load], 1, values, NULL, NULL, format);
	if (PQresultStatus(res) != PGRES_TUPLES_OK && stage_reconnect(w))
	{
		PQclear(res);
		res = PQexecPrepared(w->conn, stage_load_names[w->stage->load], 1, values, NULL, NULL, format);
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
		struct stage_loaded_row key = {.id = ctxs[i].id};
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

/* ---------------------------------------------------------------------------
 * Running a pass: the stage, then each fused successor
 * ------------------------------------------------------------------------- */

/* Switch ctx to the stage it advances to if that can run in this pass. */
static bool
stage_fuse_successor(struct pepsi_ctx *ctx)
{
	struct worker *w = ctx->worker;
	char	   *section;
	const char *program;
	const struct pepsi_stage *next;
	char	   *old_name;
	char	   *old_section;
	const struct pepsi_stage *old_stage;

	if (!w->allow_fusion || stage_registry == NULL || ctx->terminal != TERMINAL_ADVANCE
		|| ctx->split_done)
		return false;
	section = xasprintf("stage-%s", ctx->target);
	program = config_get(w->cfg, section, "PROGRAM");
	next = program ? stage_registry(stage_basename(program)) : NULL;
	if (next == NULL || next->load > ctx->loaded)
	{
		free(section);
		return false;
	}
	old_name = ctx->stage_name;
	old_section = ctx->section;
	old_stage = ctx->stage;
	ctx->stage_name = xstrdup(ctx->target);
	ctx->section = section;
	ctx->stage = next;
	if (next->can_fuse && !next->can_fuse(ctx))
	{
		free(ctx->stage_name);
		free(ctx->section);
		ctx->stage_name = old_name;
		ctx->section = old_section;
		ctx->stage = old_stage;
		return false;
	}
	free(old_name);
	free(old_section);
	ctx->terminal = TERMINAL_NONE;
	ctx->terminals = 0;
	free(ctx->target);
	ctx->target = NULL;
	return true;
}

static void
stage_run_pass(struct pepsi_ctx *ctx)
{
	for (int hop = 0; hop < STAGE_FUSION_MAX_HOPS; hop++)
	{
		double		started = stage_now_us();
		int			rc = ctx->stage->run(ctx);

		if (rc != 0 && ctx->error == NULL)
			pepsi_error(ctx, "%s failed on row %lld", ctx->stage->program, ctx->id);
		if (ctx->error == NULL && ctx->terminals == 0)
			pepsi_error(ctx, "%s called no terminal for row %lld", ctx->stage->program, ctx->id);
		if (hop > 0)
		{
			buf_append_str(&ctx->fused, ctx->fused.len ? ",{\"stage\":" : "{\"stage\":");
			stage_json_string(&ctx->fused, ctx->stage_name);
			buf_printf(&ctx->fused, ",\"us\":%lld}", (long long) (stage_now_us() - started));
		}
		if (ctx->error != NULL || !stage_fuse_successor(ctx))
			return;
	}
}

/* ---------------------------------------------------------------------------
 * Committing
 * ------------------------------------------------------------------------- */

static int
stage_check_result(struct pepsi_ctx *ctx, PGresult *res, const char *what)
{
	if (PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK)
	{
		PQclear(res);
		return 0;
	}
	pepsi_error(ctx, "%s of row %lld failed: %s", what, ctx->id, db_error(res, ctx->worker->conn));
	PQclear(res);
	return -1;
}

static const char *
stage_transition_name(enum terminal_kind kind)
{
	switch (kind)
	{
		case TERMINAL_ADVANCE:
			return "advance";
		case TERMINAL_PAUSE:
		case TERMINAL_PAUSE_WITH:
			return "pause";
		case TERMINAL_FAIL:
			return "fail";
		case TERMINAL_FINISH:
		case TERMINAL_FINISH_WITH:
			return "finish";
		case TERMINAL_NONE:
			break;
	}
	return NULL;
}

/* The stage a paused or failed row stays at: the one that paused it, even when fused. */
static const char *
stage_at_stage(const struct pepsi_ctx *ctx)
{
	return strcmp(ctx->stage_name, ctx->db_stage) != 0 ? ctx->stage_name : NULL;
}

/* Commit one message's outcome with one extension call. */
static int
stage_commit_attempt(struct pepsi_ctx *ctx)
{
	PGconn	   *conn = ctx->worker->conn;
	char		id[32];
	char		retry[64];
	char	   *merge = json_object_size(ctx->merge) ? stage_json_text(ctx->merge) : NULL;
	char	   *state = (ctx->touched & TOUCHED_SET_STATE) ? stage_json_text(ctx->state) : NULL;
	char	   *clones = NULL;
	struct buf	array = BUF_INIT;
	PGresult   *res;
	int			rc;

	snprintf(id, sizeof(id), "%lld", ctx->id);
	snprintf(retry, sizeof(retry), "%.3f", ctx->retry_seconds);
	if (ctx->terminal == TERMINAL_PAUSE_WITH)
	{
		const char *values[7] = {id, ctx->db_stage, retry, merge, NULL, NULL, stage_at_stage(ctx)};

		if (ctx->nkeep > 0)
		{
			stage_int_array(&array, ctx->keep, ctx->nkeep);
			values[4] = array.data;
		}
		values[5] = clones = ctx->clones ? stage_json_text(ctx->clones) : NULL;
		res = db_exec(conn, "SELECT pepsi.workqueue_pause($1, $2, $3, $4, $5, $6, $7)", 7, values);
	}
	else if (ctx->terminal == TERMINAL_FINISH_WITH)
	{
		const char *values[3] = {id, ctx->db_stage, NULL};

		values[2] = clones = stage_json_text(ctx->clones);
		res = db_exec(conn, "SELECT pepsi.workqueue_finish_with_clones($1, $2, $3)", 3, values);
	}
	else
	{
		const char *values[12];
		int			lengths[12] = {0};
		int			formats[12] = {0};
		bool		finish = ctx->terminal == TERMINAL_FINISH;

		values[0] = id;
		values[1] = ctx->db_stage;
		values[2] = stage_transition_name(ctx->terminal);
		values[3] = ctx->terminal == TERMINAL_ADVANCE ? ctx->target : NULL;
		values[4] = finish ? NULL : merge;
		values[5] = ctx->terminal == TERMINAL_PAUSE ? retry : NULL;
		values[6] = !finish && (ctx->touched & TOUCHED_HEADERS) ? ctx->headers.data : NULL;
		lengths[6] = (int) ctx->headers.len;
		formats[6] = 1;
		values[7] = !finish && (ctx->touched & TOUCHED_BODY) ? ctx->body.data : NULL;
		lengths[7] = (int) ctx->body.len;
		formats[7] = 1;
		values[8] = !finish && (ctx->touched & TOUCHED_MAIL_FROM) ? ctx->mail_from : NULL;
		values[9] = NULL;
		if (!finish && (ctx->touched & TOUCHED_RCPT_TO))
		{
			buf_append_char(&array, '{');
			for (size_t i = 0; i < ctx->nrcpt; i++)
				db_array_append(&array, ctx->rcpt[i]);
			buf_append_char(&array, '}');
			values[9] = array.data;
		}
		values[10] = finish ? NULL : state;
		values[11] = ctx->terminal == TERMINAL_ADVANCE || finish ? NULL : stage_at_stage(ctx);
		res = PQexecParams(conn, "SELECT pepsi.workqueue_commit($1, $2, $3, $4, $5, $6, $7, $8,"
						   " $9, $10, $11, $12)", 12, NULL, values, lengths, formats, 0);
		if (db_error_is_transient(res))
		{
			PQclear(res);
			db_transient_retries++;
			res = PQexecParams(conn, "SELECT pepsi.workqueue_commit($1, $2, $3, $4, $5, $6, $7,"
							   " $8, $9, $10, $11, $12)", 12, NULL, values, lengths, formats, 0);
		}
	}
	rc = stage_check_result(ctx, res, "commit");
	free(merge);
	free(state);
	free(clones);
	buf_free(&array);
	return rc;
}

/*
 * Commit one message's outcome; if the session was lost, reconnect and try
 * once more.  Had the lost statement committed after all, the retry finds
 * the row no longer running and says so, and that outcome stands.
 */
static int
stage_commit_one(struct pepsi_ctx *ctx)
{
	int			rc = stage_commit_attempt(ctx);

	if (rc != 0 && stage_reconnect(ctx->worker))
	{
		free(ctx->error);
		ctx->error = NULL;
		rc = stage_commit_attempt(ctx);
	}
	return rc;
}

/* May this outcome ride in an arrayed commit? Plain transitions with at most a state merge. */
static bool
stage_batchable(const struct pepsi_ctx *ctx)
{
	if (ctx->error || ctx->touched != 0)
		return false;
	switch (ctx->terminal)
	{
		case TERMINAL_ADVANCE:
		case TERMINAL_FINISH:
			return true;
		case TERMINAL_PAUSE:
		case TERMINAL_FAIL:
			return stage_at_stage(ctx) == NULL;
		default:
			return false;
	}
}

/* One workqueue_commit_many for every batchable message with outcome kind. */
static void
stage_commit_shape(struct worker *w, struct pepsi_ctx *ctxs, size_t count, enum terminal_kind kind)
{
	struct buf *ids = &w->scratch[SCRATCH_IDS];
	struct buf *stages = &w->scratch[SCRATCH_STAGES];
	struct buf *targets = &w->scratch[SCRATCH_TARGETS];
	struct buf *merges = &w->scratch[SCRATCH_MERGES];
	struct buf *retries = &w->scratch[SCRATCH_RETRIES];
	size_t		members = 0;
	const char *values[6];
	PGresult   *res;

	buf_append_char(ids, '{');
	buf_append_char(stages, '{');
	buf_append_char(targets, '{');
	buf_append_char(merges, '{');
	buf_append_char(retries, '{');
	for (size_t i = 0; i < count; i++)
	{
		struct pepsi_ctx *ctx = &ctxs[i];
		char	   *merge;

		if (!stage_batchable(ctx) || ctx->terminal != kind)
			continue;
		buf_printf(ids, "%s%lld", members ? "," : "", ctx->id);
		db_array_append(stages, ctx->db_stage);
		db_array_append(targets, ctx->target);
		merge = json_object_size(ctx->merge) ? stage_json_text(ctx->merge) : NULL;
		db_array_append(merges, merge);
		free(merge);
		buf_printf(retries, "%s%.3f", members ? "," : "", ctx->retry_seconds);
		members++;
	}
	buf_append_char(ids, '}');
	buf_append_char(stages, '}');
	buf_append_char(targets, '}');
	buf_append_char(merges, '}');
	buf_append_char(retries, '}');

	if (members == 1)
	{
		/* One row: the single-row commit is the cheaper statement. */
		for (size_t i = 0; i < count; i++)
			if (stage_batchable(&ctxs[i]) && ctxs[i].terminal == kind)
				stage_commit_one(&ctxs[i]);
	}
	else if (members > 1)
	{
		values[0] = ids->data;
		values[1] = stages->data;
		values[2] = stage_transition_name(kind);
		values[3] = kind == TERMINAL_ADVANCE ? targets->data : NULL;
		values[4] = kind == TERMINAL_FINISH ? NULL : merges->data;
		values[5] = kind == TERMINAL_PAUSE ? retries->data : NULL;
		res = db_exec(w->conn, "SELECT pepsi.workqueue_commit_many($1, $2, $3, $4, $5, $6)", 6, values);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			/* One row refused spoils the statement: commit them one by one to find it. */
			log_warnx("batch commit failed (%s); committing row by row", db_error(res, w->conn));
			for (size_t i = 0; i < count; i++)
				if (stage_batchable(&ctxs[i]) && ctxs[i].terminal == kind)
					stage_commit_one(&ctxs[i]);
		}
		PQclear(res);
	}
	buf_reset(ids);
	buf_reset(stages);
	buf_reset(targets);
	buf_reset(merges);
	buf_reset(retries);
}

static void
stage_commit_all(struct worker *w, struct pepsi_ctx *ctxs, size_t count)
{
	static const enum terminal_kind shapes[] = {TERMINAL_ADVANCE, TERMINAL_PAUSE, TERMINAL_FAIL,
	TERMINAL_FINISH};

	if (count > 1)
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
			stage_commit_shape(w, ctxs, count, shapes[s]);
	for (size_t i = 0; i < count; i++)
		if (ctxs[i].error == NULL && (count == 1 || !stage_batchable(&ctxs[i])))
			stage_commit_one(&ctxs[i]);
}

/* ---------------------------------------------------------------------------
 * The worker loop
 * ------------------------------------------------------------------------- */

/* Read more of stdin; block only if asked.  Returns false at end of input. */
static bool
stage_read_input(struct worker *w, bool block)
{
	char		chunk[4096];
	ssize_t		n;

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
stage_next_line(struct worker *w, char *line, size_t size)
{
	char	   *nl = w->input.len ? memchr(w->input.data, '\n', w->input.len) : NULL;
	size_t		len;

	if (nl == NULL && (!w->eof || w->input.len == 0))
		return false;
	len = nl ? (size_t) (nl - w->input.data) : w->input.len;
	snprintf(line, size, "%.*s", (int) (len < size ? len : size - 1), w->input.data);
	buf_consume(&w->input, nl ? len + 1 : len);
	return true;
}

static bool
stage_parse_id(const char *line, long long *id)
{
	char	   *end;
	size_t		len = strlen(line);

	while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' '))
		len--;
	if (len == 0 || len > 19)
		return false;
	for (size_t i = 0; i < len; i++)
		if (line[i] < '0' || line[i] > '9')
			return false;
	*id = strtoll(line, &end, 10);
	return *id > 0;
}

/*
 * Gather the next batch: block for one line, then (for a metadata stage)
 * take every further line already waiting, without blocking.
 */
static size_t
stage_next_batch(struct worker *w, struct pepsi_ctx *ctxs, size_t max)
{
	char		line[256];
	size_t		count = 0;

	if (w->stage->load != PEPSI_LOAD_METADATA)
		max = 1;
	while (!stage_next_line(w, line, sizeof(line)))
	{
		if (w->eof)
			return 0;
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
		if (!stage_parse_id(line, &ctx->id))
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

static void
stage_write_status(struct worker *w, struct pepsi_ctx *ctxs, size_t count)
{
	struct buf *out = &w->scratch[SCRATCH_STATUS];

	for (size_t i = 0; i < count; i++)
	{
		struct pepsi_ctx *ctx = &ctxs[i];

		if (ctx->error)
		{
			json_t	   *report = json_pack("{s:s}", "error", ctx->error);
			char	   *text = json_dumps(report, JSON_COMPACT);

			log_warnx("%s", ctx->error);
			buf_printf(out, "1 %s\n", text ? text : "{}");
			free(text);
			json_decref(report);
		}
		else if (ctx->fused.len > 0)
		{
			buf_append_str(out, "0 {\"fused\":[");
			buf_append(out, ctx->fused.data, ctx->fused.len);
			buf_append_str(out, "]}\n");
		}
		else
			buf_append_str(out, "0\n");
	}
	for (size_t off = 0; off < out->len;)
	{
		ssize_t		n = write(1, out->data + off, out->len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fatal("cannot write status lines");
		off += (size_t) n;
	}
	buf_reset(out);
}

static void
stage_usage(const struct pepsi_stage *stage)
{
	fprintf(stderr, "usage: %s worker [-c CONFIG] [-v]\n"
			"  Reads workqueue ids from stdin, one per line; writes one status line each.\n"
			"  CONFIG defaults to $PEPSI_CONFIG, then %s.\n",
			stage->program, PEPSI_CONFIG_DEFAULT_PATH);
}

/* Check every section that runs this program, before taking work. */
static void
stage_check_sections(struct worker *w)
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
	struct worker w = {.stage = stage};
	const char *config_path = getenv("PEPSI_CONFIG");
	char		err[1024];
	struct pepsi_ctx *ctxs;
	int			opt;

	log_init(stage->program, false);
	if (argc < 2 || strcmp(argv[1], "worker") != 0)
	{
		stage_usage(stage);
		return 64;
	}
	optind = 2;
	while ((opt = getopt(argc, argv, "c:v")) != -1)
		switch (opt)
		{
			case 'c':
				config_path = optarg;
				break;
			case 'v':
				log_setverbose(log_getverbose() + 1);
				break;
			default:
				stage_usage(stage);
				return 64;
		}
	if (config_path == NULL)
		config_path = PEPSI_CONFIG_DEFAULT_PATH;
	signal(SIGPIPE, SIG_IGN);

	if ((w.cfg = config_load(config_path, err, sizeof(err))) == NULL)
		fatalx("%s", err);
	if ((w.conn = db_connect(w.cfg, stage->program, err, sizeof(err))) == NULL)
		fatalx("%s", err);
	if (!db_load_overrides(w.conn, w.cfg, err, sizeof(err)))
		fatalx("%s", err);
	if (!config_get_bool(w.cfg, "pepsi", "ALLOW_FUSION", true, &w.allow_fusion, err, sizeof(err)))
		fatalx("%s", err);
	stage_check_sections(&w);
	for (int load = PEPSI_LOAD_METADATA; load <= PEPSI_LOAD_FULL; load++)
		if (!db_prepare(w.conn, stage_load_names[load], stage_load_sql[load], err, sizeof(err)))
			fatalx("%s", err);

	ctxs = xcalloc(STAGE_BATCH_MAX, sizeof(*ctxs));
	for (;;)
	{
		size_t		count = stage_next_batch(&w, ctxs, STAGE_BATCH_MAX);

		if (count == 0)
			break;
		if (PQstatus(w.conn) != CONNECTION_OK && !stage_reconnect(&w))
			fatalx("lost the database connection: %s", PQerrorMessage(w.conn));
		stage_load(&w, ctxs, count);
		for (size_t i = 0; i < count; i++)
			if (ctxs[i].error == NULL)
				stage_run_pass(&ctxs[i]);
		stage_commit_all(&w, ctxs, count);
		stage_write_status(&w, ctxs, count);
		for (size_t i = 0; i < count; i++)
			stage_ctx_free(&ctxs[i]);
	}
	free(ctxs);
	for (int i = 0; i < SCRATCH_COUNT; i++)
		buf_free(&w.scratch[i]);
	buf_free(&w.input);
	PQfinish(w.conn);
	config_free(w.cfg);
	return 0;
}
