/*
 * pepsi.h: declarations shared by the files of the pepsi extension.
 *
 * Each file holds one subsystem: admission (admit.c), stage transitions
 * (transition.c), fan-out and clones (split.c), shared bodies (body.c), the
 * maintenance worker (maint.c); spi_support.c and args.c hold the SPI plumbing and
 * argument checks they all use.
 */
#ifndef PEPSI_H
#define PEPSI_H

#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/jsonb.h"
#include "utils/uuid.h"

/* GUCs (pepsi.c) */
extern char *pepsi_database;
extern int	 pepsi_maintenance_interval_ms;
extern int	 pepsi_body_gc_interval_s;
extern int	 pepsi_mail_log_retention_s;
extern int	 pepsi_snapshot_warning_s;
extern char *pepsi_admin_account;
extern char *pepsi_admission_stage;
extern char *pepsi_admission_accounts;

/* The longest retry delay accepted (ten years), so now() + delay always fits. */
#define PEPSI_MAX_RETRY_SECONDS 315360000

/* The NOTIFY channel the dispatcher listens on. */
#define PEPSI_WORKQUEUE_CHANNEL "pepsi_workqueue"

/* spi_support.c: prepared plans kept for the life of the backend */
extern SPIPlanPtr queue_plan(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes);
/* queue_plan for a statement over arrays it unnests: its generic plan, never replanned. */
extern SPIPlanPtr queue_plan_generic(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes);
extern int		  queue_exec(SPIPlanPtr plan, Datum *values, const char *nulls, bool read_only, long count);
extern int		  queue_lock_running_row(int64 id, const char *expected_stage, pg_uuid_t *token);
/*
 * Lock the running row id claimed at expected_stage (a text Datum) with
 * token FOR UPDATE, as queue_lock_running_row, and leave the value of
 * column (an expression over the row) in SPI_tuptable; plans are the
 * caller's, one per column.
 */
extern void queue_lock_running_row_column(SPIPlanPtr plans[2], const char *column, int64 id,
										  Datum expected_stage, pg_uuid_t *token);
extern void queue_report_row_state(int64 id, const char *expected_stage, pg_uuid_t *token)
	pg_attribute_noreturn();
extern void	 queue_notify_workqueue(void);
extern int64 queue_result_int64(int row, int col);

/*
 * Claim tokens (0.4 on): the claim stamps each row it makes running with
 * a fresh random token, returns it, and keeps only its digest in
 * workqueue.claim_digest, so that reading the row does not reveal it.
 * Every transition a worker makes names the token; a row claimed without
 * one (workqueue_claim, for programs older than 0.4) has a NULL digest and
 * is matched only by a call without one.  The statements compare
 * "claim_digest IS NOT DISTINCT FROM $n", $n the digest queue_token_digest
 * made in C (NULL for no token); claim_token.c says why.
 */
extern bool	  queue_has_claim_digest(void);
extern bytea *queue_token_digest(const pg_uuid_t *token);
extern Datum  queue_token_digest_arg(const pg_uuid_t *token, char *nulls, int argno);
extern void	  queue_new_claim_tokens(pg_uuid_t *tokens, int count);

/* The dispatcher's one-per-database advisory lock (common/runtime/db.h's PEPSI_LOCK_*). */
#define PEPSI_LOCK_CLASS_ID 1346720851u
#define PEPSI_LOCK_DISPATCH_ID 2u
extern void		  queue_check_dispatcher(const char *what);
extern pg_uuid_t *arg_claim_token(FunctionCallInfo fcinfo, int argno);

/*
 * The pending rows of pepsi.workqueue, as its pending indexes find them.
 * From 0.2 on the indexes name index_status (status with running folded
 * into pending, so that a claim changes no indexed column and is a HOT
 * update), and the rows in flight they hold are skipped by status; 0.1's
 * schema, which this library still serves until ALTER EXTENSION UPDATE,
 * has status alone.  queue_plan_pending prepares the statement written
 * with QUEUE_PENDING or with QUEUE_PENDING_0_1, whichever the installed
 * schema has, each in its own slot.
 */
#define QUEUE_PENDING "index_status = 'pending' AND status = 'pending'"
#define QUEUE_PENDING_0_1 "status = 'pending'"
extern SPIPlanPtr queue_plan_pending(SPIPlanPtr slots[2], const char *sql, const char *sql_0_1,
									 int nargs, const Oid *argtypes);
/* The same, for a statement over arrays it unnests: its generic plan, never replanned. */
extern SPIPlanPtr queue_plan_pending_generic(SPIPlanPtr slots[2], const char *sql, const char *sql_0_1,
											 int nargs, const Oid *argtypes);

/* args.c: argument checks that raise a DBA-readable error */
extern int64	  arg_int64(FunctionCallInfo fcinfo, int argno, const char *name);
extern text		 *arg_text(FunctionCallInfo fcinfo, int argno, const char *name);
extern text		 *arg_stage(FunctionCallInfo fcinfo, int argno, const char *name);
extern void		  check_stage_name(text *stage, const char *name);
extern Jsonb	 *arg_json_object_or_null(FunctionCallInfo fcinfo, int argno, const char *name);
extern ArrayType *arg_recipients(FunctionCallInfo fcinfo, int argno, const char *name);
extern void		  check_recipients(ArrayType *rcpt, const char *name);
extern void		  check_address(const text *address, const char *name, int index);
/* The same check on bytes (an address inside a JSON argument). */
extern void	  check_address_chars(const char *p, int len, const char *name, int index);
extern text	 *arg_address(FunctionCallInfo fcinfo, int argno, const char *name);
extern double arg_seconds(FunctionCallInfo fcinfo, int argno, const char *name);
extern double arg_seconds_or_hold(FunctionCallInfo fcinfo, int argno, const char *name);
extern int	 *array_to_ints(ArrayType *array, const char *name, int *count);
extern void	  check_indices(const int *indices, int count, int nrcpt, const char *name, bool *taken);
extern void	  check_same_length(ArrayType *array, int expected, const char *name, const char *model);

/* body.c */
extern void	 body_release_if_unreferenced(int64 body_id);
extern int64 body_store(bytea *body);

/* split.c: rows spawned server-side from a source row */
typedef enum SpawnKind
{
	SPAWN_CLONES,	   /* side messages: token required, default all recipients */
	SPAWN_SPLIT_GROUPS /* fan-out siblings: recipients required */
} SpawnKind;
extern void		  spawn_validate(Jsonb *spec, SpawnKind kind, int nrcpt, bool *taken, const char *name);
extern ArrayType *spawn_rows(int64 source_id, Jsonb *spec, SpawnKind kind);
extern void		  split_reduce_recipients(int64 id, ArrayType *keep_indices);

/* maint.c */
extern void maint_register_static_worker(void);

#endif /* PEPSI_H */
