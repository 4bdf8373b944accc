/*
 * stage_fusion.c: fusion, running a row's successors in the pass that
 * advanced it rather than handing it back to pepsi-dispatch: the stage
 * registry of the multi-call binary, whether a successor can run here
 * (its can_fuse, its privileges, the columns it needs), the chain of
 * successors in one pass with the report of each fused hop, and the late
 * loads and rendezvous of successors that need more columns or a prepare.
 * Apart from stage.c, whose worker loop works the same without it.
 */
#include "runtime/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "process/privilege.h"
#include "runtime/db.h"
#include "runtime/stage_internal.h"
#include "touched.h"

static pepsi_registry_fn stage_registry;

void
pepsi_registry_install(pepsi_registry_fn lookup)
{
	stage_registry = lookup;
}

bool
pepsi_registry_has(const char *program)
{
	return stage_registry != NULL && stage_registry(program) != NULL;
}

bool
pepsi_registry_one_at_a_time(const char *program)
{
	const struct pepsi_stage *stage = stage_registry ? stage_registry(program) : NULL;

	return stage != NULL && stage->load != PEPSI_LOAD_METADATA && stage->batch_max <= 1;
}

/* ---------------------------------------------------------------------------
 * Running a pass: the stage, then each fused successor
 * ------------------------------------------------------------------------- */

/*
 * Does pepsi-dispatch run program as a set-id file of its own (a
 * privileged stage installed by make install-privileged)?  Then it must
 * not run fused in this worker, which lacks its bit.  Asked once per
 * program name: a worker does not outlive a change of its installation.
 */
static bool
stage_runs_privileged(const char *program)
{
	static struct
	{
		char *program;
		bool  privileged;
	} memo[16];
	static char self[4096];
	char	   *setid;
	size_t		i;

	for (i = 0; i < sizeof(memo) / sizeof(memo[0]) && memo[i].program; i++)
		if (strcmp(memo[i].program, program) == 0)
			return memo[i].privileged;
	if (self[0] == '\0')
	{
		ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

		if (n <= 0)
			return true; /* cannot tell: run it apart */
		self[n] = '\0';
	}
	setid = privilege_setid_program(program, self);
	free(setid);
	if (i < sizeof(memo) / sizeof(memo[0]))
	{
		memo[i].program = xstrdup(program);
		memo[i].privileged = setid != NULL;
	}
	return setid != NULL;
}

/* The stage [section] runs, if the registry has its PROGRAM (named in *program); else NULL. */
static const struct pepsi_stage *
stage_of_section(const struct pepsi_config *cfg, const char *section, const char **program)
{
	*program = config_get(cfg, section, "PROGRAM");
	return *program ? stage_registry(stage_basename(*program)) : NULL;
}

/*
 * The columns to load late for a row going on to next (in section): its
 * load, or more when its NEXT_STAGE is a stage that loads late too and
 * needs more (vacation, then the maildir stage's bodies), so that the
 * chain's columns come with one statement rather than one per stage.  A
 * row that then does not go on so far has loaded what it did not need.
 */
static enum pepsi_load
stage_late_load_level(const struct pepsi_config *cfg, const char *section, const struct pepsi_stage *next)
{
	const char				 *after = config_get(cfg, section, "NEXT_STAGE");
	char					 *after_section;
	const char				 *program;
	const struct pepsi_stage *then;

	if (after == NULL)
		return next->load;
	after_section = xasprintf("stage-%s", after);
	then = stage_of_section(cfg, after_section, &program);
	free(after_section);
	return then != NULL && then->late_load && then->load > next->load && !stage_runs_privileged(program)
			   ? then->load
			   : next->load;
}

enum stage_fusion
{
	STAGE_NOT_FUSED,
	STAGE_FUSED,
	STAGE_FUSED_AFTER_LOAD /* the successor can run once its columns are loaded */
};

/*
 * Switch ctx to the stage it advances to if that can run in this pass.  A
 * successor that needs more columns than are loaded, and takes them late
 * (stage.h late_load), is not switched to yet: ctx->late_load says what
 * it needs, and the call after the late load (at_rendezvous) switches.
 * So is one that takes them late and has a prepare, with all it needs
 * loaded: the batch's rows going on to it meet there, to be prepared
 * together (a delivery stage: one batch of files, one fsync), rather than
 * each run alone.
 */
static enum stage_fusion
stage_fuse_successor(struct pepsi_ctx *ctx, bool at_rendezvous)
{
	struct stage_worker		 *w = ctx->worker;
	char					 *section;
	const char				 *program;
	const struct pepsi_stage *next;
	char					 *old_name;
	char					 *old_section;
	const struct pepsi_stage *old_stage;
	bool					  late;
	bool					  passing_on;

	if (!w->allow_fusion || stage_registry == NULL || ctx->terminal != TERMINAL_ADVANCE
		|| ctx->split_done)
		return STAGE_NOT_FUSED;
	section = xasprintf("stage-%s", ctx->target);
	next = stage_of_section(w->cfg, section, &program);
	/* A row a fuses_passing_on stage accepts needs neither its columns nor its privileges. */
	passing_on = next != NULL && next->fuses_passing_on && next->can_fuse != NULL;
	late = next != NULL && next->load > ctx->loaded && !passing_on;
	if (next == NULL || (late && !next->late_load) || (!passing_on && stage_runs_privileged(program)))
	{
		free(section);
		return STAGE_NOT_FUSED;
	}
	old_name = ctx->stage_name;
	old_section = ctx->section;
	old_stage = ctx->stage;
	ctx->stage_name = xstrdup(ctx->target);
	ctx->section = section;
	ctx->stage = next;
	if (!late && !at_rendezvous && next->late_load && next->prepare != NULL)
		late = true; /* loaded, but met with the others (above) */
	if (late || (next->can_fuse && !next->can_fuse(ctx)))
	{
		bool			agreed = late && (next->can_fuse == NULL || next->can_fuse(ctx));
		enum pepsi_load level = agreed ? stage_late_load_level(w->cfg, ctx->section, next) : next->load;

		if (level < ctx->loaded)
			level = ctx->loaded;

		free(ctx->stage_name);
		free(ctx->section);
		ctx->stage_name = old_name;
		ctx->section = old_section;
		ctx->stage = old_stage;
		if (!agreed)
			return STAGE_NOT_FUSED;
		ctx->late_load = level;
		ctx->awaiting_load = true;
		return STAGE_FUSED_AFTER_LOAD;
	}
	free(old_name);
	free(old_section);
	ctx->terminal = TERMINAL_NONE;
	ctx->terminals = 0;
	free(ctx->target);
	ctx->target = NULL;
	return STAGE_FUSED;
}

/*
 * Run the pass's stages from the one ctx is at; a pass that stopped for a
 * late load goes on from there (its hops counted on).
 */
void
stage_run_pass(struct pepsi_ctx *ctx)
{
	for (int hop = ctx->hops; hop < STAGE_FUSION_MAX_HOPS; hop++)
	{
		double started = stage_now_us();
		int	   rc = ctx->stage->run(ctx);

		ctx->hops = hop + 1;
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
		if (ctx->error != NULL || stage_fuse_successor(ctx, false) != STAGE_FUSED)
			return;
	}
}

/*
 * Load the columns the rows ctxs[0..count) wait for (their late_load: the
 * most any of them needs) in one statement, keeping what the pass already
 * changed in memory.  Returns false if the statement failed: the rows then
 * go no further in this pass.
 */
static bool
stage_late_load(struct stage_worker *w, struct pepsi_ctx **ctxs, size_t count)
{
	struct buf	   *ids = &w->scratch[SCRATCH_IDS];
	enum pepsi_load level = PEPSI_LOAD_HEADERS;
	const char	   *values[1];
	PGresult	   *res;
	bool			ok;
	size_t			wanting = 0;

	/* The rows that lack columns: those met for a prepare alone need no statement. */
	buf_append_char(ids, '{');
	for (size_t i = 0; i < count; i++)
	{
		if (ctxs[i]->loaded >= ctxs[i]->late_load)
			continue;
		buf_printf(ids, "%s%lld", wanting++ ? "," : "", ctxs[i]->id);
		if (ctxs[i]->late_load > level)
			level = ctxs[i]->late_load;
	}
	buf_append_char(ids, '}');
	if (wanting == 0)
	{
		buf_reset(ids);
		return true;
	}
	values[0] = ids->data;
	res = stage_exec_load(w, true, level, values[0], wanting, 1);
	buf_reset(ids);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (!ok)
		log_warnx("cannot load the columns of a fused successor (the rows advance instead): %s",
				  db_error(res, w->conn));
	for (int r = 0; ok && r < PQntuples(res); r++)
	{
		long long id = atoll(PQgetvalue(res, r, 0));

		for (size_t i = 0; i < count; i++)
		{
			struct pepsi_ctx *ctx = ctxs[i];

			if (ctx->id != id || ctx->loaded >= level)
				continue;
			if (ctx->loaded < PEPSI_LOAD_HEADERS && !(ctx->touched & TOUCHED_HEADERS))
				buf_append(&ctx->headers, PQgetvalue(res, r, 1), (size_t) PQgetlength(res, r, 1));
			if (level >= PEPSI_LOAD_FULL && !(ctx->touched & TOUCHED_BODY))
				buf_append(&ctx->body, PQgetvalue(res, r, 2), (size_t) PQgetlength(res, r, 2));
			ctx->loaded = level;
		}
	}
	PQclear(res);
	return ok;
}

/*
 * The rows of a late load that switched to a successor with a prepare
 * (stage.h): its prepare on them, one call per successor, before their
 * passes run, as its own worker would call it on its batch (a delivery
 * stage: one batch of files, one fsync).
 */
static void
stage_prepare_fused(struct pepsi_ctx **group, const bool *fused, size_t n)
{
	struct pepsi_ctx *same[STAGE_LATE_LOAD_MAX];
	bool			  done[STAGE_LATE_LOAD_MAX] = {false};

	for (size_t i = 0; i < n; i++)
	{
		const struct pepsi_stage *stage = group[i]->stage;
		size_t					  m = 0;

		if (!fused[i] || done[i] || stage->prepare == NULL)
			continue;
		for (size_t j = i; j < n; j++)
			if (fused[j] && !done[j] && group[j]->stage == stage)
			{
				same[m++] = group[j];
				done[j] = true;
			}
		stage->prepare(same, m);
	}
}

/*
 * A body the pass did not change is not committed: let it go once the
 * pass is over (not when it stopped to meet a successor's batch).
 */
static void
stage_late_body_done(struct pepsi_ctx *ctx)
{
	if (!ctx->awaiting_load && !(ctx->touched & TOUCHED_BODY))
		buf_free(&ctx->body);
}

/*
 * One group of rows whose passes stopped for a successor that loads late:
 * load their columns with one statement and go on with their passes, and
 * again for the rows that stop once more (vacation after a route, then
 * the maildir stage's bodies after vacation), until none waits.  Returns
 * false once the batch has run STAGE_LATE_FUSION_US or a load failed: the
 * rows still waiting then advance as they are.
 */
static bool
stage_late_fuse_group(struct stage_worker *w, struct pepsi_ctx **group, size_t n, double batch_started)
{
	bool deferred[STAGE_LATE_LOAD_MAX];

	while (n > 0)
	{
		size_t waiting = 0;

		if (stage_now_us() - batch_started > STAGE_LATE_FUSION_US || !stage_late_load(w, group, n))
			return false;
		/*
		 * In order, each row's pass right after its successor took it: a
		 * successor's can_fuse may rest on what the passes before learned
		 * (relay-to-internet's: a domain just seen to be slow).  Only the
		 * rows of a successor with a prepare wait for the others, to be
		 * prepared as one batch (stage_prepare_fused), then run.
		 */
		for (size_t i = 0; i < n; i++)
		{
			group[i]->awaiting_load = false;
			deferred[i] = false;
			if (group[i]->loaded >= group[i]->late_load && stage_fuse_successor(group[i], true) == STAGE_FUSED)
			{
				if (group[i]->stage->prepare != NULL)
				{
					deferred[i] = true;
					continue;
				}
				stage_run_pass(group[i]);
			}
			stage_late_body_done(group[i]);
		}
		stage_prepare_fused(group, deferred, n);
		for (size_t i = 0; i < n; i++)
			if (deferred[i])
			{
				stage_run_pass(group[i]);
				stage_late_body_done(group[i]);
			}
		/* The rows that stopped again, for a successor that needs still more. */
		for (size_t i = 0; i < n; i++)
			if (group[i]->awaiting_load && group[i]->error == NULL)
				group[waiting++] = group[i];
		n = waiting;
	}
	return true;
}

/*
 * The bound on the next body-free batches (w->late_batch_cap) from how
 * this one's late fusion went: a batch that ran out of time left `left`
 * of its count rows unfused, so the next take about as many as it fused
 * in time (a group at least), each batch within its time again; a full
 * batch that fused every row lets the bound grow by a group, until there
 * is none.  A group at a time, not doubling: each time the bound grows
 * past what fits, the batch's rows past the time advance unfused.
 */
static void
stage_late_batch_cap(struct stage_worker *w, size_t count, size_t left)
{
	if (left > 0)
		w->late_batch_cap = count - left > STAGE_LATE_LOAD_MAX ? count - left : STAGE_LATE_LOAD_MAX;
	else if (w->late_batch_cap != 0 && count >= w->late_batch_cap)
		w->late_batch_cap = w->late_batch_cap + STAGE_LATE_LOAD_MAX >= STAGE_BATCH_MAX
								? 0
								: w->late_batch_cap + STAGE_LATE_LOAD_MAX;
}

/*
 * The rows whose pass stopped for a successor that loads late: load their
 * columns, STAGE_LATE_LOAD_MAX rows a statement, and go on with their
 * passes (stage_late_fuse_group).  Once the batch has run
 * STAGE_LATE_FUSION_US, the rows left are committed as the plain advances
 * they are, for the successor's own workers: a batch of a body-free stage
 * may be long, and its rows are answered only when it ends.  Such a batch
 * bounds the next ones (stage_late_batch_cap), so that on a busy machine
 * its rows are not left to be claimed, loaded and committed again.
 */
void
stage_late_fusion(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t count, double batch_started)
{
	struct pepsi_ctx *group[STAGE_LATE_LOAD_MAX];
	size_t			  next = 0;
	size_t			  left = 0;
	bool			  waited = false;

	for (;;)
	{
		size_t n = 0;

		for (; next < count && n < STAGE_LATE_LOAD_MAX; next++)
			if (ctxs[next].awaiting_load && ctxs[next].error == NULL)
				group[n++] = &ctxs[next];
		waited = waited || n > 0;
		if (n == 0 || !stage_late_fuse_group(w, group, n, batch_started))
			break;
	}
	for (size_t i = 0; i < count; i++)
	{
		left += ctxs[i].awaiting_load && ctxs[i].error == NULL;
		ctxs[i].awaiting_load = false;
	}
	if (waited)
		stage_late_batch_cap(w, count, left);
}
