/*
 * dispatch.h: pepsi-dispatch, the single coordinator (docs/architecture.md 4).
 *
 * One libev loop drives everything: the database connection (dbconn.c:
 * LISTEN and its jobs; claim.c: the claim; dbwrites.c: the dispatcher's own
 * recovery writes, statistics),
 * the stage worker pools (pool.c: processes, pipes, status lines, time
 * limits; depth.c: how many ids a worker holds), the fair-share
 * accounting (fair.c), the stage graph read from the configuration
 * (graph.c), and the watch that paused rows are
 * requeued even when no maintenance worker runs (maintenance.c).  The
 * dispatcher never touches message content: it claims rows, hands their
 * ids to workers, and reads back one status line per id.
 */
#ifndef PEPSI_DISPATCH_H
#define PEPSI_DISPATCH_H

#include <stdbool.h>
#include <sys/types.h>

#include <ev.h>
#include <jansson.h>
#include <libpq-fe.h>

#include "base/buf.h"
#include "config/config.h"

/* One [stage-*] section, as the dispatcher uses it. */
struct stage_spec
{
	char *name; /* without "stage-" */
	char *program;
	long  parallelism;
	long  max_messages;
	long  queue_limit;
	long  max_runtime_ms;
	bool  light_lane; /* LIGHT_LANE (pool.c: the light lane) */
	int	  bulk_nice;  /* BULK_NICE: the nice value of the workers not the lane */
};

/* An id given to a worker and not yet answered. */
struct inflight
{
	long long id;
	char	  token[37]; /* its claim token (pepsi.workqueue_claim_tokens), written after the id */
	char	 *sender;
	double	  sent_at;	  /* when it was written to the worker */
	double	  sender_use; /* its sender's worker time when it was given (fair.c) */
};

struct fair_account;

/* The status= of a delivery attempt, as the workers report them (common/delivery/maillog.h). */
#define DELIVERY_STATUSES 4
extern const char *const delivery_statuses[DELIVERY_STATUSES];

/* The histograms each pool keeps between flushes (histogram.c). */
enum histogram_kind
{
	HISTOGRAM_RUN,			  /* worker time per message */
	HISTOGRAM_DELIVERY_DELAY, /* receipt to a sent delivery */
	HISTOGRAMS
};
#define HISTOGRAM_BOUNDS 15
struct histogram
{
	unsigned long buckets[HISTOGRAM_BOUNDS + 1];
	double		  sum;
	unsigned long count;
};

struct pool_stats
{
	unsigned long	 messages;
	double			 processing_us;
	unsigned long	 kills;
	unsigned long	 timeouts;
	unsigned long	 crashes;
	unsigned long	 fused_hops;
	unsigned long	 deliveries[DELIVERY_STATUSES]; /* by delivery_statuses[] */
	struct histogram histograms[HISTOGRAMS];
};

void histogram_observe(struct pool_stats *stats, enum histogram_kind kind, double seconds);
void histogram_rows(json_t *rows, const char *stage, const struct pool_stats *stats);

struct pool;

/* The batches a pool's workers answered lately, for its pipeline depth (depth.c). */
#define DEPTH_WINDOW 32
struct pool_depth
{
	int	   rows[DEPTH_WINDOW]; /* ids answered together */
	double us[DEPTH_WINDOW];   /* from the first one's start to their answers */
	int	   count;
	int	   next;
	int	   depth;  /* ids a worker may hold, before QUEUE_LIMIT */
	double row_us; /* the marginal cost of a row the depth was sized by */
};

/*
 * What a worker does, advanced by worker_transition (worker.c).  Only a
 * running worker takes ids; the two killed states say what its exit means
 * for the row it was working on.
 */
enum worker_state
{
	WORKER_RUNNING,
	WORKER_RETIRING,		   /* takes no more ids; its stdin closes once drained */
	WORKER_KILLED_FOR_TIMEOUT, /* SIGKILLed: its oldest row outlived MAX_RUNTIME */
	WORKER_KILLED_FOR_PROTOCOL /* SIGKILLed: wrote what is no status line; rest ignored */
};

/*
 * How a pool's workers take their ids (pool.c, HAND_AHEAD): one per pass,
 * or every one waiting as a batch.  Known from the stage registry for
 * Pepsi's own stages; learnt from the answers for another program.
 */
enum pool_intake
{
	INTAKE_UNKNOWN, /* written HAND_AHEAD ids, until it answers that many at once */
	INTAKE_ONE,		/* written HAND_AHEAD ids */
	INTAKE_BATCH	/* written all its ids */
};

/*
 * Whether a pool's stage may have pending rows, for the claim (pool.c:
 * pool_may_have_work).  Each state implies those before it; a claim going
 * out and its answer move a pool back down.
 */
enum pool_work
{
	POOL_DRAINED,		/* the last claim came back short: nothing known to wait */
	POOL_MAY_HAVE_WORK, /* a claim came back full */
	POOL_SIGNALLED,		/* rows came since the last claim went out (a status line, a recovery) */
	POOL_WOKEN			/* ... and a NOTIFY or the heartbeat: maybe a light sender's, for the lane */
};

/* A stage worker process and the ids it holds. */
struct pool_worker
{
	struct pool		   *pool;
	pid_t				pid;
	int					to_child;	/* the worker's stdin */
	int					from_child; /* its stdout */
	ev_io				reader;
	ev_io				writer;
	ev_child			child;
	struct buf			in;		 /* partial status lines */
	struct buf			out;	 /* ids not yet written */
	size_t				written; /* bytes of ids written to its stdin, ever */
	struct inflight	   *queue;	 /* ring of the queue limit at spawn, oldest at head */
	int					ring;
	int					head;
	int					count;
	int					handed; /* of count, from head: written (or being written) to it */
	long				handled;
	double				last_done; /* when the previous answer came: the next one's start */
	double				idle_since;
	bool				light_lane; /* the pool's light lane (pool.c), not one of PARALLELISM */
	enum worker_state	state;
	struct pool_worker *next;
};

struct pool
{
	struct stage_spec	 spec;
	struct pool_worker	*workers;
	int					 nworkers;		 /* of PARALLELISM: the light lane's is not counted */
	struct pool_worker	*light_lane;	 /* its worker, when running (pool.c) */
	double				 cooldown_until; /* spawning failed: hold off until then */
	double				 row_cost_us;	 /* mean worker time per message, for the claim */
	struct pool_depth	 depth;			 /* how many ids a worker may hold */
	enum pool_intake	 intake;		 /* how its workers take ids: how many to write them */
	struct fair_account *fair;
	struct pool_stats	 stats;		  /* since the last flush */
	bool				 removed;	  /* gone from the configuration: drained, then freed */
	int					 claim_asked; /* rows the claim in flight asked for */
	enum pool_work		 work;		  /* whether pending rows may wait for it (pool.c) */
	struct pool			*next;
};

struct dispatcher
{
	struct ev_loop		*loop;
	char				*config_path;
	struct pepsi_config *cfg;
	char				*self_exe; /* for exec of workers */
	bool				 self_multicall;
	struct pool			*pools;
	/* [dispatch] */
	double poll_interval;
	double fair_half_life;
	int	   fair_fifo_percent;
	double idle_timeout;
	double spawn_cooldown;
	double stats_interval;
	int	   crash_limit;		  /* attempts that end a worker before a row is isolated */
	double crash_retry_delay; /* before the first retry; doubles per attempt */
	/* [dispatch] STAGES as a sorted text[] literal ("{a,b}"), NULL for every stage; set at start */
	char *stage_set;
	char *stage_set_names; /* the same, for the log: "a, b" or "every stage" */
	bool  standby;		   /* [dispatch] STANDBY: wait for the stage set's lock */
	bool  shutting_down;
	/* global statistics since the last flush */
	unsigned long stages_run;
	unsigned long messages;
	unsigned long messages_failed;
	double		  last_flush;
	double		  last_activity;
};

extern struct dispatcher dispatcher;

double now_seconds(void);

/* graph.c */
bool graph_load(struct pepsi_config *cfg, struct stage_spec **specs, size_t *count,
				char *err, size_t errlen);
void graph_free(struct stage_spec *specs, size_t count);
bool dispatch_options_load(const struct pepsi_config *cfg, char *err, size_t errlen);
bool graph_select_stages(const struct pepsi_config *cfg, struct stage_spec *specs, size_t *count,
						 char *err, size_t errlen);

/* depth.c */
void depth_init(struct pool_depth *depth);
void depth_record_batch(struct pool_depth *depth, int rows, double us);
int	 depth_limit(const struct pool_depth *depth, long queue_limit);

/* fair.c */
struct fair_account *fair_create(void);
void				 fair_free(struct fair_account *account);
void				 fair_charge(struct fair_account *account, const char *sender, double us, double now,
								 double half_life);
double				 fair_used(struct fair_account *account, const char *sender, double now,
							   double half_life);
bool				 fair_outweighs(double heavy_us, double light_us, double row_us);
/* Append (stage, sender, used) for every sender worth passing to the claim. */
void fair_export(struct fair_account *account, const char *stage, double now,
				 double half_life, double floor, struct buf *stages, struct buf *senders,
				 struct buf *used);

/* pool.c */
struct pool *pool_find(const char *stage);
int			 pool_capacity(const struct pool *pool, double now);
bool		 pool_assign(struct pool *pool, long long id, const char *token, const char *sender);
void		 pools_flush(void);
void		 pools_configure(struct stage_spec *specs, size_t count);
void		 pools_housekeeping(double now);
void		 pools_retire_all(void);
void		 pools_stop_all(void);
void		 pools_kill_all(void);
void		 pools_may_have_work(void);
void		 pool_may_have_work(struct pool *pool);
void		 pools_claim_sent(void);
enum claim_urgency
{
	CLAIM_LATER, /* coalesced with the answers to come */
	CLAIM_NOW,
	CLAIM_LANES /* at once, for the light lanes only; the rest later */
};
enum claim_urgency pools_claim_urgency(double now);
int				   pool_lane_capacity(const struct pool *pool, double now);
void			   pool_claimed(struct pool *pool, int rows);
bool			   pools_all_stopped(void);
size_t			   pools_inflight(void);

/* dbconn.c: the connection, its set-up, and its queue of statements (jobs) */
typedef void (*dbconn_result_fn)(PGresult *res, void *arg);

/* A statement queued to run on the connection in turn (dbconn.c, dbwrites.c). */
struct job
{
	char *sql;
	int	  nparams;
	char *params[8];
	void (*done)(struct job *job, PGresult *res);
	dbconn_result_fn submitted; /* a statement of another part (dbconn_submit) */
	void			*submitted_arg;
	struct buf		 recovering; /* a recovery write: its ids, comma-separated */
	struct job		*next;
};

#define DBCONN_CLAIM_NAME "pepsi_dispatch_claim"
#define DBCONN_CLAIM_SQL "SELECT id, stage, sender_key, claim_token FROM pepsi.workqueue_claim_tokens(" \
						 "$1::text[], $2::int[], $3::text[], $4::text[], $5::float8[], $6::int, $7::float8[])"
#define DBCONN_OVERRIDES_SQL "SELECT scope, section, option, value FROM pepsi.config_override" \
							 " ORDER BY scope, section, option"

void		dbconn_start(void);
void		dbconn_submit(const char *sql, dbconn_result_fn done, void *arg);
void		dbconn_finish(void);
bool		dbconn_idle(void);
PGconn	   *dbconn_pq(void);
void		dbconn_send_work(void);
bool		dbconn_send_claim(int nparams, const char *const *values);
struct job *job_new(const char *sql, void (*done)(struct job *, PGresult *));
void		job_param(struct job *job, const char *value);
void		job_push(struct job *job, bool front);

/* claim.c */
void dbconn_want_claim(bool new_work);
void claim_init(void);
void claim_send_if_due(void);
void claim_done(PGresult *res);
void claim_after_connect(void);
void claim_connection_lost(void);

/* dbwrites.c */
void dbconn_recover(const char *stage, const struct inflight *rows, int count,
					const char *status, const char *reason);
void dbconn_crashed(const char *stage, const struct inflight *row, const char *reason,
					const char *final_status);
void dbconn_reload_config(void);
void dbconn_flush_stats(bool final);
void dbconn_apply_overrides(PGresult *res, bool starting);

/* maintenance.c */
void maintenance_watch(double now);
void maintenance_check_soon(void);

/* main.c */
void dispatch_apply_config(struct pepsi_config *cfg);
void dispatch_stop_requested(void);

#endif
