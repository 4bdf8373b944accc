/*
 * stage_internal.h: what the stage runtime's files share (not for stages).
 *
 * The runtime is split along its sections: stage.c (the worker loop and
 * loading), stage_fusion.c (running a pass and its fused successors),
 * stage_row.c (accessors and content setters), stage_terminal.c
 * (terminals and fan-out), stage_commit.c (batching and committing).
 * Stages see only stage.h.
 */
#ifndef PEPSI_STAGE_INTERNAL_H
#define PEPSI_STAGE_INTERNAL_H

#include <libpq-fe.h>

#include "base/buf.h"
#include "runtime/stage.h"

#define STAGE_BATCH_MAX 1024
#define STAGE_FUSION_MAX_HOPS 32
#define STAGE_IDLE_MAX 8
/* Rows of a batch loaded by one late load statement (stage.h late_load): a relay batch's worth. */
#define STAGE_LATE_LOAD_MAX 32
/* A batch starts no more late-loaded passes after this long: the rest advance as plain outcomes. */
#define STAGE_LATE_FUSION_US 1000000.0


enum terminal_kind
{
	TERMINAL_NONE,
	TERMINAL_ADVANCE,
	TERMINAL_PAUSE,
	TERMINAL_PAUSE_WITH,
	TERMINAL_FAIL,
	TERMINAL_FINISH,
	TERMINAL_FINISH_WITH,
	TERMINAL_HELD_BY_CALL /* pepsi_held_by_call: the stage's own call committed the hold */
};

/* Buffers a worker reuses from batch to batch, rather than growing new ones each time. */
enum scratch
{
	SCRATCH_IDS,
	SCRATCH_STAGES,
	SCRATCH_TARGETS,
	SCRATCH_MERGES,
	SCRATCH_RETRIES,
	SCRATCH_TOKENS,
	SCRATCH_STATUS,
	SCRATCH_COUNT
};

struct stage_worker
{
	const struct pepsi_stage *stage;
	struct pepsi_config		 *cfg;
	PGconn					 *conn;
	bool					  allow_fusion;
	bool					  mail_log;		 /* [pepsi] MAIL_LOG: events ride the commits */
	unsigned				  queue_id_host; /* [pepsi] HOST_ID, for the queue ids of new messages */
	int						  session_nice;	 /* the nice value last given to conn's session */
	bool					  pooled;		 /* [database] STAGE_POOLED: nothing kept in the session */
	bool					  report_queued; /* the dispatcher reads "queued" (STAGE_STATUS_QUEUED_ENV) */
	/* pepsi_db handed conn out in this batch: the stage may have queued rows anywhere */
	bool		  db_handed_out;
	struct buf	  input;
	bool		  eof;
	struct buf	  scratch[SCRATCH_COUNT];
	pepsi_idle_fn idle[STAGE_IDLE_MAX]; /* pepsi_when_idle */
	size_t		  nidle;
	/*
	 * The most ids a body-free batch takes while its late fusion runs out
	 * of time (stage_late_fusion), 0 for no such bound: the rows past
	 * STAGE_LATE_FUSION_US would otherwise advance unfused, to be claimed,
	 * loaded and committed once more by their successor's workers.
	 */
	size_t late_batch_cap;
	/* pepsi_prefetch_address_settings: address -> settings, for the rows of that generation */
	json_t	*settings;
	unsigned settings_generation;
};

struct pepsi_ctx
{
	struct stage_worker		 *worker;
	const struct pepsi_stage *stage; /* running now (a successor, when fused) */
	long long				  id;
	char					  token[37];	/* the claim token written after the id, or "" */
	char					 *db_stage;		/* where the row is in the database */
	char					 *stage_name;	/* the stage running now */
	char					 *section;		/* "stage-" stage_name */
	char					  queue_id[32]; /* pepsi_queue_id's, for a row without state.queue_id */
	enum pepsi_load			  loaded;
	char					 *mail_from;
	char					**rcpt;
	size_t					  nrcpt;
	double					  age_seconds;	  /* now - received_at, when loaded */
	long long				  received_us;	  /* received_at, microseconds since the epoch */
	double					  loaded_us;	  /* when it was loaded (stage_now_us) */
	json_t					 *mail_log;		  /* [{event, detail}] for pepsi.mail_log, or NULL */
	const char				 *delivery;		  /* a delivery attempt's status= (a static string), or NULL */
	char					 *delivery_stage; /* the stage that made it */
	double					  delivery_delay; /* and its delay since receipt, in seconds */
	char					 *state_text;	  /* state as loaded, until something reads it (stage_state) */
	json_t					 *state;		  /* current view: database state with this pass's changes; NULL until parsed */
	json_t					 *merge;		  /* changes to merge at commit */
	struct buf				  headers;
	struct buf				  body;
	unsigned				  touched;
	bool					  split_done;
	bool					  queued_unknown;  /* a call may have queued rows at other stages */
	bool					  own_transaction; /* pepsi_write_with_outcome opened the session's transaction */
	bool					  committed;	   /* its outcome is committed (stage_commit_with_writes) */
	/* the outcome */
	enum terminal_kind terminal;
	int				   terminals;
	char			  *target;
	double			   retry_seconds;
	int				  *keep;
	size_t			   nkeep;
	json_t			  *clones;
	char			  *error;
	struct buf		   fused; /* {"stage":s,"us":n},... of the successors run in this pass */
	int				   hops;  /* stages run in this pass so far */
	/* The successor it advances to needs more columns (stage.h late_load): this much. */
	enum pepsi_load late_load;
	bool			awaiting_load;
	unsigned		settings_generation; /* its recipients' settings were prefetched in it */
	/* the input line, for the status */
	bool valid;
};


/* stage.c */
double		stage_now_us(void);
const char *stage_basename(const char *path);
/*
 * Run the load of level's columns (late: only those a fused successor
 * lacks, stage_fusion.c) for the count ids of the array literal ids:
 * prepared in a session of our own, its text through a pooler.
 */
PGresult *stage_exec_load(struct stage_worker *w, bool late, enum pepsi_load level, const char *ids, size_t count,
						  int format);
/* stage_row.c: ctx->state, parsed from the loaded text on first use. */
json_t *stage_state(struct pepsi_ctx *ctx);
/* Reconnect a lost database session (the rows it held are still running). */
bool  stage_reconnect(struct stage_worker *w);
char *stage_json_text(json_t *json);
void  stage_json_string(struct buf *b, const char *s);

/* stage_terminal.c */

void stage_int_array(struct buf *b, const int *values, size_t count);
int	 stage_terminal(struct pepsi_ctx *ctx, enum terminal_kind kind);

/* stage_fusion.c: a row's pass, its fused successors, then theirs after a late load. */
void stage_run_pass(struct pepsi_ctx *ctx);
void stage_late_fusion(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t count, double batch_started);

/* stage_commit.c */
void stage_commit_all(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t count);
/* Right after the pass of a message that wrote with its outcome (pepsi_write_with_outcome). */
void stage_commit_with_writes(struct pepsi_ctx *ctx);
int	 stage_check_result(struct pepsi_ctx *ctx, PGresult *res, const char *what);

/* The row's claim token as a query parameter: NULL when the worker was handed a bare id. */
const char *stage_claim_token(const struct pepsi_ctx *ctx);

#endif
