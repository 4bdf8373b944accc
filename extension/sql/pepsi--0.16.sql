/*
 * pepsi 0.16: the queue schema of the Pepsi mail transfer agent.
 *
 * One row of pepsi.workqueue per message in flight; its body lives in
 * pepsi.workqueue_body and is shared by every row split off the same
 * message.  Every state transition is a native function (extension/src/);
 * clients call those and never write queue SQL of their own.
 *
 * This is the whole of 0.16, for CREATE EXTENSION pepsi; an older database
 * reaches the same schema with ALTER EXTENSION pepsi UPDATE, through
 * pepsi--0.1--0.2.sql, pepsi--0.2--0.3.sql, pepsi--0.3--0.4.sql and
 * pepsi--0.4--0.5.sql, pepsi--0.5--0.6.sql, pepsi--0.6--0.7.sql,
 * pepsi--0.7--0.8.sql, pepsi--0.8--0.9.sql, pepsi--0.9--0.10.sql,
 * pepsi--0.10--0.11.sql, pepsi--0.11--0.12.sql, pepsi--0.12--0.13.sql,
 * pepsi--0.13--0.14.sql, pepsi--0.14--0.15.sql and pepsi--0.15--0.16.sql,
 * and t/003_extension_upgrade.pl compares the paths (docs/upgrading.md).  The
 * sections after the administrative surface are the features 0.2 added,
 * each as its upgrade block introduced it, with later changes folded in.
 */

\echo Use "CREATE EXTENSION pepsi" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The queue
-- ---------------------------------------------------------------------------

CREATE TYPE pepsi.status AS ENUM ('pending', 'running', 'paused', 'failed', 'timeout');

-- The outcomes a stage can commit through workqueue_commit.  advance and
-- advance_to differ only in how the client chose the target (NEXT_STAGE or
-- an explicit one); reroute is an advance that carries state for the target
-- (how a message reaches its BOUNCE_STAGE).
CREATE TYPE pepsi.transition AS ENUM ('advance', 'advance_to', 'reroute', 'pause', 'fail', 'finish');

CREATE TABLE pepsi.workqueue_body (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    body        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.workqueue_body IS
    'Message bodies, shared by every workqueue row split off the same message; '
    'released by trigger when the last referencing row goes, swept by workqueue_body_gc()';

-- Position of a row in its stage's pending queue: drawn afresh whenever a
-- row becomes pending (admission, advance, requeue, resume), so "oldest"
-- means "waiting longest at this stage", and the claim can find the rows
-- that became pending since it last looked (see extension/src/claim.c).
CREATE SEQUENCE pepsi.pending_seq;

CREATE TABLE pepsi.workqueue (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stage           text NOT NULL DEFAULT 'init' CHECK (stage <> ''),
    status          pepsi.status NOT NULL DEFAULT 'pending',
    state           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(state) = 'object'),
    timeout         timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    mail_from       text NOT NULL,
    rcpt_to         text[] NOT NULL CHECK (cardinality(rcpt_to) > 0 AND array_position(rcpt_to, NULL) IS NULL),
    headers         bytea NOT NULL,
    body_id         bigint NOT NULL REFERENCES pepsi.workqueue_body (id),
    client_address  inet,
    auth_account    text,
    -- Who the fair-share claim charges: the authenticated account, else the
    -- connecting address with IPv6 folded to its /64 (one customer's
    -- addresses) and IPv4-mapped IPv6 unmapped (one client seen both ways
    -- is one sender), else 'local' for mail injected on this host.
    sender_key      text GENERATED ALWAYS AS (
        CASE
            WHEN auth_account IS NOT NULL THEN 'auth:' || auth_account
            WHEN client_address IS NULL THEN 'local'
            WHEN family(client_address) = 6 AND NOT client_address << inet '::ffff:0:0/96'
                THEN 'ip:' || host(network(set_masklen(client_address, 64))) || '/64'
            WHEN family(client_address) = 6 THEN 'ip:' || substr(host(client_address), 8)
            ELSE 'ip:' || host(client_address)
        END) STORED,
    clone_token     text,
    pending_seq     bigint NOT NULL DEFAULT nextval('pepsi.pending_seq'),
    CHECK ((status = 'paused') = (timeout IS NOT NULL)),
    index_status    pepsi.status
        GENERATED ALWAYS AS (CASE WHEN status = 'running' THEN 'pending'::pepsi.status ELSE status END) STORED,
    -- SHA-256 of the claim token the claim returned with the row (claim.c);
    -- NULL for a row claimed without one, or never claimed
    claim_digest    bytea
) WITH (
    -- a claim is a HOT update, which needs room on the page; vacuum and
    -- analyze keep up with a table that churns (pepsi--0.1--0.2.sql says
    -- why: "a claim that is a HOT update", "cheaper stage hops")
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
COMMENT ON TABLE pepsi.workqueue IS 'One row per message in flight (see pepsi(7))';
COMMENT ON COLUMN pepsi.workqueue.clone_token IS
    'Set on rows spawned as clones; unique, so a clone is created at most once while it lives';
COMMENT ON COLUMN pepsi.workqueue.index_status IS
    'status with running read as pending: what the indexes name, so that a claim changes no indexed column (a HOT update)';

-- The claim: oldest pending rows of a stage, and of one sender at a stage.
-- No index names status (they name index_status, where a running row is
-- still pending), so the claim, which changes only status, is a HOT
-- update (pepsi--0.1--0.2.sql, "a claim that is a HOT update", weighs
-- it).  The INCLUDEd columns answer the queue's counts.
CREATE INDEX workqueue_pending_fifo ON pepsi.workqueue (stage, pending_seq)
    INCLUDE (sender_key, id, received_at) WHERE index_status = 'pending';
CREATE INDEX workqueue_pending_sender ON pepsi.workqueue (stage, sender_key, pending_seq)
    INCLUDE (id) WHERE index_status = 'pending';
-- The rows that are not pending, by stage and status (the queue's counts).
CREATE INDEX workqueue_stage_status ON pepsi.workqueue (stage, index_status)
    INCLUDE (received_at, timeout) WHERE index_status <> 'pending';
-- The due-time scan of paused rows (timeout is set on paused rows only).
-- A row held without a time (timeout 'infinity': the secretary's held
-- mail, pepsi.queue_hold) is never due: it has no entry, so its hold
-- writes one index entry fewer (bench/secretary).
CREATE INDEX workqueue_paused_due ON pepsi.workqueue (timeout) WHERE timeout < 'infinity';
-- Body release: is any row still referencing this body?
CREATE INDEX workqueue_body_ref ON pepsi.workqueue (body_id);
-- Only clones carry a token: the unique index keeps only them.
CREATE UNIQUE INDEX workqueue_clone_token_key ON pepsi.workqueue (clone_token)
    WHERE clone_token IS NOT NULL;

ALTER SEQUENCE pepsi.pending_seq OWNED BY pepsi.workqueue.pending_seq;

-- A row that becomes pending again goes to the back of its stage's pending
-- queue: the queue's own transitions draw pending_seq in the statement
-- that makes it pending; the trigger catches a row that became pending
-- without a new one (a DBA's UPDATE, say).  AFTER, not BEFORE: a BEFORE
-- ROW trigger on UPDATE locks every row updated, whatever its WHEN says.
CREATE FUNCTION pepsi.workqueue_pending_seq_trigger() RETURNS trigger
    AS 'MODULE_PATHNAME', 'workqueue_pending_seq_trigger' LANGUAGE C;
CREATE TRIGGER workqueue_pending_seq
    AFTER UPDATE ON pepsi.workqueue FOR EACH ROW
    WHEN (NEW.status = 'pending' AND (OLD.status <> 'pending' OR OLD.stage <> NEW.stage)
          AND NEW.pending_seq = OLD.pending_seq)
    EXECUTE FUNCTION pepsi.workqueue_pending_seq_trigger();

-- Release the bodies of deleted rows once nothing references them.
CREATE FUNCTION pepsi.workqueue_body_release_trigger() RETURNS trigger
    AS 'MODULE_PATHNAME', 'workqueue_body_release_trigger' LANGUAGE C;
CREATE TRIGGER workqueue_body_release
    AFTER DELETE ON pepsi.workqueue REFERENCING OLD TABLE AS deleted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.workqueue_body_release_trigger();

-- ---------------------------------------------------------------------------
-- Statistics (written by pepsi-dispatch only)
-- ---------------------------------------------------------------------------

CREATE TABLE pepsi.stage_stats (
    stage               text PRIMARY KEY,
    messages            bigint NOT NULL DEFAULT 0,
    processing_time     interval NOT NULL DEFAULT '0',
    kills               bigint NOT NULL DEFAULT 0,
    timeouts            bigint NOT NULL DEFAULT 0,
    crashes             bigint NOT NULL DEFAULT 0,
    fused_hops          bigint NOT NULL DEFAULT 0,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- each delivery attempt's status= (sent, deferred, bounced, expired)
    deliveries_sent     bigint NOT NULL DEFAULT 0,
    deliveries_deferred bigint NOT NULL DEFAULT 0,
    deliveries_bounced  bigint NOT NULL DEFAULT 0,
    deliveries_expired  bigint NOT NULL DEFAULT 0
);

CREATE TABLE pepsi.dispatch_stats (
    singleton               boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    stages_run              bigint NOT NULL DEFAULT 0,
    messages                bigint NOT NULL DEFAULT 0,
    messages_failed         bigint NOT NULL DEFAULT 0,
    serialization_failures  bigint NOT NULL DEFAULT 0,
    started_at              timestamptz,
    updated_at              timestamptz NOT NULL DEFAULT now(),
    -- rows paused for a retry after their worker died, rows isolated after
    -- CRASH_LIMIT such attempts (extension/src/crash.c)
    crash_retries           bigint NOT NULL DEFAULT 0,
    crash_failures          bigint NOT NULL DEFAULT 0,
    last_crash_failure_at   timestamptz
);
INSERT INTO pepsi.dispatch_stats DEFAULT VALUES;

-- ---------------------------------------------------------------------------
-- Configuration overlay and per-address settings
-- ---------------------------------------------------------------------------

CREATE TABLE pepsi.config_override (
    scope       text NOT NULL CHECK (scope = 'global' OR scope ~ '^(domain|address):.+$'),
    section     text NOT NULL CHECK (section ~ '^[a-z][a-z0-9_-]*$'
                                     AND section <> 'database' AND section !~ '^listener-'),
    option      text NOT NULL CHECK (option ~ '^[A-Z][A-Z0-9_]*$'),
    value       text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text NOT NULL DEFAULT current_user,
    PRIMARY KEY (scope, section, option),
    -- whom ingress runs as and whose passwords it trusts: file only
    CHECK (NOT (section = 'ingress' AND option IN ('USER', 'GROUP', 'CREDENTIALS')))
);
COMMENT ON TABLE pepsi.config_override IS
    'Administrator overrides layered over pepsi.conf; never [database] nor [listener-*]';

CREATE FUNCTION pepsi.config_changed_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pepsi_config_changed', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER config_override_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pepsi.config_override
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.config_changed_notify();

CREATE TABLE pepsi.settings (
    address     text NOT NULL CHECK (address ~ '^[^@\s]*@[^@\s]+$'),
    option      text NOT NULL CHECK (option ~ '^[A-Z][A-Z0-9_]*$'),
    value       text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (address, option)
);
COMMENT ON TABLE pepsi.settings IS
    'Per-address overrides written by account owners (a privilege boundary apart from config_override); @domain rows for a whole domain';

-- ---------------------------------------------------------------------------
-- Delivery companions and logs
-- ---------------------------------------------------------------------------

CREATE TABLE pepsi.dns_address (
    host            text NOT NULL,
    address         inet NOT NULL,
    expires_at      timestamptz NOT NULL,
    failures        integer NOT NULL DEFAULT 0,
    last_success    timestamptz,
    last_failure    timestamptz,
    PRIMARY KEY (host, address),
    next_retry      timestamptz
);
COMMENT ON TABLE pepsi.dns_address IS
    'MX-host addresses with their DNS expiry and connect health, maintained by pepsi-stage-relay-to-internet';

CREATE TABLE pepsi.event_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    principal   text NOT NULL DEFAULT current_user,
    action      text NOT NULL,
    detail      jsonb NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE pepsi.event_log IS 'Administrative audit log: append-only';

CREATE FUNCTION pepsi.event_log_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pepsi.event_log is append-only'
        USING ERRCODE = 'insufficient_privilege',
              DETAIL = format('%s on the audit log is refused for every role.', TG_OP),
              HINT = 'Record a correcting event with INSERT instead.';
END;
$$;
CREATE TRIGGER event_log_append_only
    BEFORE UPDATE OR DELETE ON pepsi.event_log
    FOR EACH ROW EXECUTE FUNCTION pepsi.event_log_refuse_change();
CREATE TRIGGER event_log_no_truncate
    BEFORE TRUNCATE ON pepsi.event_log
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.event_log_refuse_change();

CREATE TABLE pepsi.mail_log (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    workqueue_id    bigint,
    event           text NOT NULL,
    detail          jsonb NOT NULL DEFAULT '{}',
    queue_id        text
);
CREATE INDEX mail_log_at ON pepsi.mail_log (at);
COMMENT ON COLUMN pepsi.mail_log.queue_id IS
    'The message''s queue id (state.queue_id of its rows); workqueue_id is the row';
COMMENT ON TABLE pepsi.mail_log IS
    'Opt-in per-message log ([pepsi] MAIL_LOG); pruned past pepsi.mail_log_retention by the maintenance worker';

-- ---------------------------------------------------------------------------
-- Recipient subsets (used by splits, clones and pause)
-- ---------------------------------------------------------------------------

-- The recipients at 1-based indices, in the order given.
CREATE FUNCTION pepsi.recipients_subset(rcpt_to text[], indices integer[])
RETURNS text[] LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT array_agg(rcpt_to[i] ORDER BY n) FROM unnest(indices) WITH ORDINALITY AS u(i, n)
$$;

-- state with its per-recipient DSN parameters (state.dsn.rcpt, parallel to
-- rcpt_to) cut down to the same indices, so they follow their recipients.
CREATE FUNCTION pepsi.state_for_recipients(state jsonb, recipient_count integer, indices integer[])
RETURNS jsonb LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN jsonb_typeof(state #> '{dsn,rcpt}') = 'array'
             AND jsonb_array_length(state #> '{dsn,rcpt}') = recipient_count
        THEN jsonb_set(state, '{dsn,rcpt}',
                       (SELECT coalesce(jsonb_agg((state #> '{dsn,rcpt}') -> (i - 1) ORDER BY n), '[]')
                        FROM unnest(indices) WITH ORDINALITY AS u(i, n)))
        ELSE state
    END
$$;

-- ---------------------------------------------------------------------------
-- Queue functions (native: extension/src/)
-- ---------------------------------------------------------------------------

-- Admission: the row and its body in one statement; deliberately no NOTIFY,
-- so concurrent SMTP sessions group-commit (ingress wakes the dispatcher).
CREATE FUNCTION pepsi.workqueue_add(
    mail_from text, rcpt_to text[], headers bytea, body bytea,
    state jsonb DEFAULT '{}', client_address inet DEFAULT NULL,
    auth_account text DEFAULT NULL, stage text DEFAULT 'init')
RETURNS bigint AS 'MODULE_PATHNAME', 'workqueue_add' LANGUAGE C CALLED ON NULL INPUT;

-- A brand-new side message at a named stage (auto-reply, sendmail), with NOTIFY.
-- A token makes it at-most-once: a second inject with a live token returns NULL.
CREATE FUNCTION pepsi.workqueue_inject(
    stage text, mail_from text, rcpt_to text[], headers bytea, body bytea,
    state jsonb DEFAULT '{}', token text DEFAULT NULL)
RETURNS bigint AS 'MODULE_PATHNAME', 'workqueue_inject' LANGUAGE C CALLED ON NULL INPUT;

-- A stage's single write: the columns it touched plus its transition.
-- at_stage: where a pause or failure leaves the row when a successor stage
-- fused into the worker's pass decided it (the row is still at the first).
CREATE FUNCTION pepsi.workqueue_commit(
    id bigint, expected_stage text, transition pepsi.transition,
    target_stage text DEFAULT NULL, merge_state jsonb DEFAULT NULL,
    retry_seconds double precision DEFAULT NULL,
    set_headers bytea DEFAULT NULL, set_body bytea DEFAULT NULL,
    set_mail_from text DEFAULT NULL, set_rcpt_to text[] DEFAULT NULL,
    set_state jsonb DEFAULT NULL, at_stage text DEFAULT NULL)
RETURNS void AS 'MODULE_PATHNAME', 'workqueue_commit' LANGUAGE C CALLED ON NULL INPUT
    SET enable_seqscan = off SET jit = off;

-- The arrayed form for batched body-free stages: one outcome, per-row
-- targets, state merges and retry times.  Returns the number of rows.
CREATE FUNCTION pepsi.workqueue_commit_many(
    ids bigint[], expected_stages text[], transition pepsi.transition,
    target_stages text[] DEFAULT NULL, merge_states jsonb[] DEFAULT NULL,
    retry_seconds double precision[] DEFAULT NULL)
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_commit_many' LANGUAGE C CALLED ON NULL INPUT
    SET enable_seqscan = off SET jit = off;

-- Pause with a retry time, optionally keeping a recipient subset
-- (1-based indices into rcpt_to) and spawning side clones, all at once.
-- clones: a JSON array of {"token", "stage", "state", "rcpt_to", "mail_from"}.
-- Returns the ids of the clones created (a live token is skipped).
CREATE FUNCTION pepsi.workqueue_pause(
    id bigint, expected_stage text, retry_seconds double precision,
    merge_state jsonb DEFAULT NULL, keep_indices integer[] DEFAULT NULL,
    clones jsonb DEFAULT NULL, at_stage text DEFAULT NULL)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_pause' LANGUAGE C CALLED ON NULL INPUT;

-- Delete the row (delivered or dropped) and spawn its clones in one call.
CREATE FUNCTION pepsi.workqueue_finish_with_clones(
    id bigint, expected_stage text, clones jsonb)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_finish_with_clones' LANGUAGE C CALLED ON NULL INPUT;

-- Fan a running row out into sibling rows.  The row keeps keep_indices
-- (1-based into rcpt_to); groups is a JSON array of
-- {"rcpt_indices": [..]} or {"rcpt_to": [..]} with optional "stage",
-- "state", "status" (pending | retry | failed) and "retry_seconds".
-- Returns the sibling ids, in group order.
CREATE FUNCTION pepsi.workqueue_split(
    id bigint, expected_stage text, keep_indices integer[], groups jsonb)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_split' LANGUAGE C CALLED ON NULL INPUT;

-- Peel an index subset onto one sibling, pending at target_stage (default:
-- the current stage).
CREATE FUNCTION pepsi.workqueue_split_off(
    id bigint, expected_stage text, rcpt_indices integer[], target_stage text DEFAULT NULL)
RETURNS bigint AS 'MODULE_PATHNAME', 'workqueue_split_off' LANGUAGE C CALLED ON NULL INPUT;

-- Peel recipients 2..n each onto its own row at the current stage.
CREATE FUNCTION pepsi.workqueue_split_one_per_row(id bigint, expected_stage text)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_split_one_per_row' LANGUAGE C CALLED ON NULL INPUT;

-- Operator resume of paused/failed/timeout rows, with NOTIFY.
CREATE FUNCTION pepsi.workqueue_resume(ids bigint[])
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_resume' LANGUAGE C CALLED ON NULL INPUT;

-- Paused rows whose retry time has come go back to pending (NOTIFY if any).
CREATE FUNCTION pepsi.workqueue_requeue_due(max_rows integer DEFAULT 10000)
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_requeue_due' LANGUAGE C STRICT;

-- Running rows left behind by a dead dispatcher go back to pending, except
-- the ids a reconnecting dispatcher still has in flight.
CREATE FUNCTION pepsi.workqueue_reset_orphans(except_ids bigint[] DEFAULT NULL)
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_reset_orphans' LANGUAGE C CALLED ON NULL INPUT;

-- The dispatcher's own writes when a worker cannot conclude a row: a
-- crash or a non-zero status (failed), MAX_RUNTIME (timeout), or ids it
-- never started, or a shutdown (pending).  Unlike the stage transitions it
-- skips rows that are no longer running at the stage given, and says which
-- it changed: a worker may have committed a row just before it died,
-- and that outcome must stand.  The reason goes to state.dispatch_error.
CREATE FUNCTION pepsi.workqueue_recover(
    ids bigint[], expected_stages text[], new_status pepsi.status, reason text DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql AS $$
BEGIN
    RETURN pepsi.workqueue_recover(ids, expected_stages, new_status, reason, NULL::uuid[]);
END;
$$;

-- Sweep bodies no row references (what a race between two releases leaves).
CREATE FUNCTION pepsi.workqueue_body_gc()
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_body_gc' LANGUAGE C STRICT;

-- The explicit wake for writers outside the dispatcher's loop.
CREATE FUNCTION pepsi.notify_workqueue()
RETURNS void LANGUAGE sql AS $$ SELECT pg_notify('pepsi_workqueue', '') $$;

-- Start the maintenance background worker for this database when the
-- library is not in shared_preload_libraries.  Returns its pid.
CREATE FUNCTION pepsi.start_maintenance()
RETURNS integer AS 'MODULE_PATHNAME', 'start_maintenance' LANGUAGE C STRICT;
REVOKE EXECUTE ON FUNCTION pepsi.start_maintenance() FROM PUBLIC;

-- The dispatcher's one call per wake (extension/src/claim.c): for every
-- stage with spare capacity, pick pending rows fairly among senders, set
-- them running and return them.  account_* are the dispatcher's fair-share
-- accounting as parallel arrays (stage, sender_key, worker time used,
-- already decayed); row_costs, parallel to stages, is what one claimed row
-- charges its sender within this claim (the stage's mean worker time per
-- message, in the accounting's unit), so that equal senders interleave.
CREATE FUNCTION pepsi.workqueue_claim(
    stages text[], capacities integer[],
    account_stages text[] DEFAULT NULL, account_senders text[] DEFAULT NULL,
    account_used double precision[] DEFAULT NULL,
    fifo_percent integer DEFAULT 10,
    row_costs double precision[] DEFAULT NULL)
RETURNS TABLE (id bigint, stage text, sender_key text)
AS 'MODULE_PATHNAME', 'workqueue_claim' LANGUAGE C CALLED ON NULL INPUT VOLATILE
    -- planned for a queue of any size, reading rows in index order
    -- (pepsi--0.1--0.2.sql says why: "the queue's statements planned for
    -- a queue of any size", "the claim's reads kept in order")
    SET enable_seqscan = off SET jit = off SET enable_bitmapscan = off SET enable_sort = off;

-- ===========================================================================
-- The administrative surface: queue views and actions for DBAs, the
-- configuration overlay's writer functions, group roles and their grants
-- (docs/pepsi-admin.7.md).
--
-- None of this is a hot path, so it is SQL and PL/pgSQL; extension/src/
-- admin.c holds what SQL does badly (who is acting inside a SECURITY
-- DEFINER function; the domain of every recipient of a big queue).  Every
-- administrative action is all or nothing and writes exactly one
-- pepsi.event_log row.
--
-- Every object of the schema gets its privileges from pepsi.grant_policy()
-- and nowhere else: an object added to this script must be added there too
-- (otherwise no group role may use it), and pepsi.apply_grants() re-applies
-- and checks the whole policy.  This section stays the last of the script,
-- so that the grants applied at its end see every object.
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- Group roles
--
-- Roles belong to the cluster, not to a database or to the extension: the
-- first CREATE EXTENSION in a cluster makes them, later ones (another
-- database, a re-creation) find them and leave them as they are, and DROP
-- EXTENSION leaves them behind.  They cannot log in; login roles are made
-- members of them (CREATE ROLE relay LOGIN IN ROLE pepsi_stage).
-- pepsi_dispatch is a member of pepsi_stage (grant_membership) that alone
-- claims rows and recovers those of a worker that died: a stage worker's
-- role cannot claim, nor stand in for the dispatcher while none runs.
-- make run and pepsi-setup let it log in itself, as pepsi-dispatch's role.
-- ---------------------------------------------------------------------------

CREATE TABLE pepsi.grant_role (
    name        name PRIMARY KEY,
    description text NOT NULL
);
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_stage', 'Pepsi: the pipeline (pepsi-dispatch and the stage workers)'),
    ('pepsi_ingress', 'Pepsi: admission only (pepsi-ingress, pepsi-sendmail): EXECUTE on pepsi.workqueue_add and workqueue_inject'),
    ('pepsi_config', 'Pepsi: administration: writes pepsi.config_override, acts on the queue'),
    ('pepsi_monitor', 'Pepsi: read-only monitoring: the queue views and statistics'),
    ('pepsi_httpd', 'Pepsi: pepsi-httpd: metrics, queue views and operator functions, administrative credentials'),
    ('pepsi_dispatch', 'Pepsi: the dispatcher (pepsi-dispatch): pepsi_stage, and claims and recovers rows');

-- The group roles pepsi.grant_role names that the cluster lacks.  Roles
-- belong to the cluster: a role that exists already is left as it is.
CREATE FUNCTION pepsi.grant_roles_create() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    wanted record;
BEGIN
    FOR wanted IN SELECT * FROM pepsi.grant_role r
                  WHERE NOT EXISTS (SELECT FROM pg_roles x WHERE x.rolname = r.name)
    LOOP
        EXECUTE format('CREATE ROLE %I NOLOGIN', wanted.name);
        EXECUTE format('COMMENT ON ROLE %I IS %L', wanted.name, wanted.description);
    END LOOP;
END
$$;

SELECT pepsi.grant_roles_create();

-- ---------------------------------------------------------------------------
-- Queue views
--
-- Operator holds: a held row is paused with timeout = 'infinity'.  The
-- requeue of due rows (timeout <= now()) never reaches it, so neither the
-- maintenance worker nor the dispatcher touches it; only
-- pepsi.queue_release() (or pepsi.queue_bounce/queue_delete, or a DBA's
-- pepsi.workqueue_resume) moves it on.  The hold is the row's status and
-- nothing else, so no stage ever sees a marker in state and no marker can
-- outlive the hold.  The views count held rows among the paused ones and
-- again in their own "held" column.
--
-- Ages are measured from received_at, the message's arrival, as Postfix's
-- mailq and qshape measure them.  The views are ordered for reading in
-- psql: queue_summary by stage and status, the others biggest first.
-- ---------------------------------------------------------------------------

-- Each view reads a SECURITY DEFINER function rather than the table,
-- for two reasons measured on a queue of a million rows (bench/admin):
-- JIT compilation, on by default, costs these aggregations more than it
-- saves (it took 1.7 s of queue_shape's 6 once the cost estimate passed
-- jit_optimize_above_cost) and cannot be turned off for a view, only for a
-- function; and the function runs as the owner, as a view would, so that
-- pepsi_monitor may see the aggregates without reading a single message.
-- The scans still run in parallel.

-- Rows by stage and status, the held ones among them and the oldest
-- arrival, by index-only scans: pending and running rows through
-- workqueue_pending_fifo, the others through workqueue_stage_status (each
-- condition matches its index's predicate).
CREATE FUNCTION pepsi.queue_counts()
RETURNS TABLE (stage text, status pepsi.status, messages bigint, held bigint,
               oldest_received_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT w.stage, w.status, count(*), 0::bigint, min(w.received_at)
    FROM pepsi.workqueue w WHERE w.index_status = 'pending'
    GROUP BY w.stage, w.status
    UNION ALL
    SELECT w.stage, w.index_status, count(*),
           count(*) FILTER (WHERE w.index_status = 'paused' AND w.timeout = 'infinity'),
           min(w.received_at)
    FROM pepsi.workqueue w WHERE w.index_status <> 'pending'
    GROUP BY w.stage, w.index_status
$$;

CREATE FUNCTION pepsi.queue_summary_rows()
RETURNS TABLE (stage text, status pepsi.status, messages bigint, held bigint, oldest_age interval)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT c.stage, c.status, c.messages, c.held, now() - c.oldest_received_at
    FROM pepsi.queue_counts() c
$$;

CREATE VIEW pepsi.queue_summary AS
SELECT stage, status, messages, held, oldest_age
FROM pepsi.queue_summary_rows()
ORDER BY stage, status;
COMMENT ON VIEW pepsi.queue_summary IS
    'Messages per stage and status: how many, how many on hold, the age of the oldest';

-- The domain of a recipient as queue_shape counts it: after the last "@",
-- lower-cased; NULL without one ("postmaster").  Native (admin.c): it runs
-- once per recipient of the queue.
CREATE FUNCTION pepsi.recipient_domain(address text) RETURNS text
    AS 'MODULE_PATHNAME', 'recipient_domain' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- Like Postfix's qshape: one row per recipient domain, counting recipients
-- in age buckets that double: "5m" up to 5 minutes old, "10m" over 5 and up
-- to 10, ..., "1280m" over 640 and up to 1280 minutes, "1280m+" older.  The
-- bucket is one width_bucket() against bounds computed once per call; the
-- recipients are unnested in the scan's own target list (a LATERAL
-- unnest() costs a function scan per row, four times as much), so that
-- their domains are taken in the parallel workers.
CREATE FUNCTION pepsi.queue_shape_rows()
RETURNS TABLE (domain text, total bigint, "5m" bigint, "10m" bigint, "20m" bigint, "40m" bigint,
               "80m" bigint, "160m" bigint, "320m" bigint, "640m" bigint, "1280m" bigint,
               "1280m+" bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT r.domain, count(*),
           count(*) FILTER (WHERE r.bucket = 9), count(*) FILTER (WHERE r.bucket = 8),
           count(*) FILTER (WHERE r.bucket = 7), count(*) FILTER (WHERE r.bucket = 6),
           count(*) FILTER (WHERE r.bucket = 5), count(*) FILTER (WHERE r.bucket = 4),
           count(*) FILTER (WHERE r.bucket = 3), count(*) FILTER (WHERE r.bucket = 2),
           count(*) FILTER (WHERE r.bucket = 1), count(*) FILTER (WHERE r.bucket = 0)
    FROM (SELECT pepsi.recipient_domain(unnest(w.rcpt_to)) AS domain,
                 width_bucket(w.received_at,
                              (SELECT array_agg(now() - make_interval(mins => m.minutes) ORDER BY m.minutes DESC)
                               FROM unnest('{5,10,20,40,80,160,320,640,1280}'::integer[]) AS m (minutes)))
                     AS bucket
          FROM pepsi.workqueue w) AS r
    GROUP BY r.domain
$$;

CREATE VIEW pepsi.queue_shape AS
SELECT domain, total, "5m", "10m", "20m", "40m", "80m", "160m", "320m", "640m", "1280m", "1280m+"
FROM pepsi.queue_shape_rows()
ORDER BY total DESC, domain;
COMMENT ON VIEW pepsi.queue_shape IS
    'Recipients per destination domain in doubling age buckets, like Postfix''s qshape';

CREATE FUNCTION pepsi.queue_senders_rows()
RETURNS TABLE (sender_key text, pending bigint, running bigint, paused bigint, held bigint,
               failed bigint, timeout bigint, total bigint, oldest_age interval)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT w.sender_key,
           count(*) FILTER (WHERE w.status = 'pending'),
           count(*) FILTER (WHERE w.status = 'running'),
           count(*) FILTER (WHERE w.status = 'paused'),
           count(*) FILTER (WHERE w.status = 'paused' AND w.timeout = 'infinity'),
           count(*) FILTER (WHERE w.status = 'failed'),
           count(*) FILTER (WHERE w.status = 'timeout'),
           count(*),
           now() - min(w.received_at)
    FROM pepsi.workqueue w
    GROUP BY w.sender_key
$$;

CREATE VIEW pepsi.queue_senders AS
SELECT sender_key, pending, running, paused, held, failed, timeout, total, oldest_age
FROM pepsi.queue_senders_rows()
ORDER BY total DESC, sender_key;
COMMENT ON VIEW pepsi.queue_senders IS
    'Messages per sender (the fair-share sender_key) and status';

-- ---------------------------------------------------------------------------
-- Queue actions
--
-- Each takes the rows by id, all or nothing: a NULL, empty or repeated id,
-- a row that does not exist or one a worker holds (running) is an error
-- naming it, and nothing changes.  Otherwise a row the action does not
-- apply to (a pending row to retry, a row not on hold to release) is left
-- as it is, and the count returned says how many rows changed; so the
-- tools' selectors ("every paused row") need not know about holds.
--
-- They run as the extension's owner (SECURITY DEFINER), so pepsi_config
-- needs EXECUTE on them and no write access to the queue, and every change
-- it makes goes through here and is logged.  The log records ids and
-- counts, never envelopes: recording who corresponds with whom is
-- pepsi.mail_log's opt-in, not the audit log's.
-- ---------------------------------------------------------------------------

-- Who is acting: current_user at the session's top level.  Inside a
-- SECURITY DEFINER function current_user is the function's owner, so the
-- actions record this instead (extension/src/admin.c).
CREATE FUNCTION pepsi.event_principal() RETURNS text
    AS 'MODULE_PATHNAME', 'event_principal' LANGUAGE C STABLE STRICT;

-- Check ids and lock their rows (in id order, so two actions on
-- overlapping rows cannot deadlock); raise, naming the row, unless every
-- row exists and none is running.  action names the calling function and
-- verb says what it does to a row ("deleted"), for the messages.
CREATE FUNCTION pepsi.queue_lock_rows(ids bigint[], action text, verb text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    repeated bigint;
    missing bigint[];
    running bigint;
BEGIN
    IF ids IS NULL THEN
        RAISE EXCEPTION 'ids must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF array_ndims(ids) > 1 THEN
        RAISE EXCEPTION 'ids must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(ids) = 0 THEN
        RAISE EXCEPTION 'ids must not be empty'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('pepsi.%s needs at least one row.', action);
    END IF;
    IF array_position(ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'ids[%] is null', array_position(ids, NULL)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT u.id INTO repeated FROM unnest(ids) AS u (id)
    GROUP BY u.id HAVING count(*) > 1 ORDER BY u.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'workqueue row % appears twice in ids', repeated
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('pepsi.%s acts on each row once.', action);
    END IF;

    PERFORM FROM pepsi.workqueue w WHERE w.id = ANY (ids) ORDER BY w.id FOR UPDATE;

    SELECT array_agg(u.id ORDER BY u.id) INTO missing FROM unnest(ids) AS u (id)
    WHERE NOT EXISTS (SELECT FROM pepsi.workqueue w WHERE w.id = u.id);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'workqueue row % does not exist', missing[1]
            USING ERRCODE = 'no_data_found',
                  DETAIL = CASE WHEN cardinality(missing) = 1
                                THEN format('No row was %s.', verb)
                                ELSE format('Rows %s do not exist; no row was %s.',
                                            array_to_string(missing[1:10], ', ')
                                            || CASE WHEN cardinality(missing) > 10
                                                    THEN format(' and %s more', cardinality(missing) - 10)
                                                    ELSE '' END,
                                            verb) END;
    END IF;

    SELECT w.id INTO running FROM pepsi.workqueue w
    WHERE w.id = ANY (ids) AND w.status = 'running' ORDER BY w.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'workqueue row % is running and cannot be %', running, verb
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('A worker holds it; no row was %s.', verb),
                  HINT = 'Wait for the stage to finish with it, or stop the dispatcher first.';
    END IF;
END
$$;

-- The one audit row of an action.
-- Raise unless the role is one pepsi-httpd knows.
CREATE FUNCTION pepsi.admin_role_valid(role text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF role IS NULL OR role NOT IN ('admin', 'viewer') THEN
        RAISE EXCEPTION 'role must be ''admin'' or ''viewer'', not %', coalesce(quote_literal(role), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A viewer may read the pages and the API''s GET endpoints; an admin may also act.';
    END IF;
END
$$;

-- Raise (insufficient_privilege) when pepsi-httpd acts for a viewer: the
-- administrator it names (pepsi.admin_account: an account's name, or
-- "token:" and a token's name) has the role 'viewer'.  A name
-- pepsi.event_principal does not apply (another role set it) or that no
-- live account or token has is not checked here: pepsi-httpd names only
-- the principal it has just authenticated.
CREATE FUNCTION pepsi.admin_role_check(action text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    acting text := current_setting('pepsi.admin_account', true);
    principal text;
    role text;
BEGIN
    IF acting IS NULL OR acting = '' THEN
        RETURN;
    END IF;
    principal := pepsi.event_principal();
    IF right(principal, length(acting) + 1) IS DISTINCT FROM ':' || acting THEN
        RETURN;
    END IF;
    IF acting LIKE 'token:%' THEN
        SELECT t.role INTO role FROM pepsi.api_token t
        WHERE t.name = substr(acting, 7) AND t.revoked_at IS NULL;
    ELSE
        SELECT a.role INTO role FROM pepsi.admin_account a WHERE a.name = acting;
    END IF;
    IF role = 'viewer' THEN
        RAISE EXCEPTION '% is a viewer: it may read, not %',
                        CASE WHEN acting LIKE 'token:%' THEN format('API token "%s"', substr(acting, 7))
                             ELSE format('account "%s"', acting) END, action
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An admin gives it the admin role with pepsi-httpd passwd NAME admin (token NAME admin for a new token).';
    END IF;
END
$$;

CREATE FUNCTION pepsi.event_log_write(action text, detail jsonb) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pepsi.admin_role_check(action);
    INSERT INTO pepsi.event_log (principal, action, detail)
    VALUES (pepsi.event_principal(), action, detail)
$$;

-- Paused, failed and timed-out rows go back to pending now, at their
-- stage (pepsi.workqueue_resume, which also wakes the dispatcher).  Rows
-- already pending are left as they are, and so are rows on hold: only a
-- release ends a hold, so that retrying "everything paused" does not send
-- what an operator held.  Returns how many rows were retried.
CREATE FUNCTION pepsi.queue_retry(ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    retryable bigint[];
    retried integer := 0;
BEGIN
    PERFORM pepsi.queue_lock_rows(ids, 'queue_retry', 'retried');
    SELECT array_agg(w.id) INTO retryable FROM pepsi.workqueue w
    WHERE w.id = ANY (ids) AND w.status IN ('paused', 'failed', 'timeout')
      AND NOT (w.status = 'paused' AND w.timeout = 'infinity');
    IF retryable IS NOT NULL THEN
        retried := pepsi.workqueue_resume(retryable);
    END IF;
    PERFORM pepsi.event_log_write('queue_retry',
        jsonb_build_object('ids', to_jsonb(ids), 'retried', retried));
    RETURN retried;
END
$$;

-- Put rows on hold: paused with timeout 'infinity', at their stage, until
-- released.  Pending, paused, failed and timed-out rows may be held; rows
-- already on hold are left as they are.  Returns how many rows were put
-- on hold.
CREATE FUNCTION pepsi.queue_hold(ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    held integer;
BEGIN
    PERFORM pepsi.queue_lock_rows(ids, 'queue_hold', 'held');
    UPDATE pepsi.workqueue w SET status = 'paused', timeout = 'infinity'
    WHERE w.id = ANY (ids) AND NOT (w.status = 'paused' AND w.timeout = 'infinity');
    GET DIAGNOSTICS held = ROW_COUNT;
    PERFORM pepsi.event_log_write('queue_hold',
        jsonb_build_object('ids', to_jsonb(ids), 'held', held));
    RETURN held;
END
$$;

-- End the hold of rows: they become pending at their stage now (and the
-- dispatcher is woken).  Rows not on hold are left as they are.  Returns
-- how many rows were released.
CREATE FUNCTION pepsi.queue_release(ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    released integer;
BEGIN
    PERFORM pepsi.queue_lock_rows(ids, 'queue_release', 'released');
    UPDATE pepsi.workqueue w SET status = 'pending', timeout = NULL
    WHERE w.id = ANY (ids) AND w.status = 'paused' AND w.timeout = 'infinity';
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM pepsi.notify_workqueue();
    END IF;
    PERFORM pepsi.event_log_write('queue_release',
        jsonb_build_object('ids', to_jsonb(ids), 'released', released));
    RETURN released;
END
$$;

-- Delete rows that no worker holds.  Their bodies go with the last row
-- that references them (the workqueue_body_release trigger).  No bounce is
-- sent: pepsi.queue_bounce() is the way to tell the sender.  Returns how
-- many rows were deleted.
CREATE FUNCTION pepsi.queue_delete(ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    deleted integer;
BEGIN
    PERFORM pepsi.queue_lock_rows(ids, 'queue_delete', 'deleted');
    DELETE FROM pepsi.workqueue w WHERE w.id = ANY (ids);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    PERFORM pepsi.event_log_write('queue_delete',
        jsonb_build_object('ids', to_jsonb(ids), 'deleted', deleted));
    RETURN deleted;
END
$$;

-- Bounce rows: send each to bounce_stage, pending, with state.bounce saying
-- it failed permanently for the reason given (pepsi.state(7): kind,
-- diagnostic, failed_recipient, envid/notify/orcpt copied from state.dsn),
-- so that the bounce stage returns it to its sender as a DSN for every one
-- of its recipients.  A message with the null sender (itself a bounce) is
-- refused: a bounce is never bounced.  Returns how many rows were bounced.
CREATE FUNCTION pepsi.queue_bounce(ids bigint[], reason text, bounce_stage text DEFAULT 'bounce')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    null_sender bigint;
    bounced integer;
BEGIN
    IF reason IS NULL THEN
        RAISE EXCEPTION 'reason must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = 'The reason is the diagnostic the delivery status notification gives the sender.';
    END IF;
    IF btrim(reason) = '' THEN
        RAISE EXCEPTION 'reason must not be empty'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The reason is the diagnostic the delivery status notification gives the sender.';
    END IF;
    IF reason ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'reason must be one line of text'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It is quoted in the delivery status notification, where a line break would start a new field.';
    END IF;
    IF bounce_stage IS NULL THEN
        RAISE EXCEPTION 'bounce_stage must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF bounce_stage !~ '^[a-z0-9_-]+$' THEN
        RAISE EXCEPTION 'invalid bounce stage name "%"', bounce_stage
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A stage is named by its [stage-<name>] section: lower-case letters, digits, "_" and "-".';
    END IF;
    PERFORM pepsi.queue_lock_rows(ids, 'queue_bounce', 'bounced');
    SELECT w.id INTO null_sender FROM pepsi.workqueue w
    WHERE w.id = ANY (ids) AND w.mail_from IN ('', '<>') ORDER BY w.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'workqueue row % has the null sender and cannot be bounced', null_sender
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'A bounce is never itself bounced; no row was bounced.',
                  HINT = 'Delete it with pepsi.queue_delete() instead.';
    END IF;
    UPDATE pepsi.workqueue w
    SET stage = bounce_stage, status = 'pending', timeout = NULL,
        state = w.state || jsonb_build_object('bounce', jsonb_strip_nulls(jsonb_build_object(
            'kind', 'permanent',
            'diagnostic', reason,
            'source', 'operator',
            'failed_recipient', CASE WHEN cardinality(w.rcpt_to) = 1 THEN w.rcpt_to[1] END,
            'envid', w.state #> '{dsn,envid}',
            'notify', CASE WHEN cardinality(w.rcpt_to) = 1 THEN w.state #> '{dsn,rcpt,0,notify}' END,
            'orcpt', CASE WHEN cardinality(w.rcpt_to) = 1 THEN w.state #> '{dsn,rcpt,0,orcpt}' END)))
    WHERE w.id = ANY (ids);
    GET DIAGNOSTICS bounced = ROW_COUNT;
    PERFORM pepsi.notify_workqueue();
    PERFORM pepsi.event_log_write('queue_bounce',
        jsonb_build_object('ids', to_jsonb(ids), 'reason', reason,
                           'bounce_stage', bounce_stage, 'bounced', bounced));
    RETURN bounced;
END
$$;

-- ---------------------------------------------------------------------------
-- Configuration overlay: the writer functions
--
-- pepsi.config_set/config_unset are how pepsi-config and a DBA change
-- pepsi.config_override: they canonicalize and check the scope, section,
-- option and value (a bad override is refused here, by the writer, not
-- found later by a daemon), skip writes that change nothing (every write
-- wakes every daemon on pepsi_config_changed) and log each action.  They
-- run with the caller's rights: only pepsi_config may write the table.
-- ---------------------------------------------------------------------------

-- What the overlay knows of the options: schema/options.def, the one list
-- the programs compile too (schema/options.c), compiled into this module
-- with the same value checks (extension/src/config_schema.c).  A stage
-- program's own options carry its name in program.
CREATE FUNCTION pepsi.config_option_schema(
    OUT section text, OUT program text, OUT option text, OUT kind text, OUT scope text,
    OUT default_value text, OUT min_value bigint, OUT max_value bigint, OUT choices text,
    OUT description text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'config_option_schema'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION pepsi.config_value_problem(section text, option text, value text,
                                           program text DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'config_value_problem'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE VIEW pepsi.config_option AS
    SELECT s.section, s.option, s.kind, s.min_value, s.max_value,
           s.scope IN ('file', 'global') AS global_only, s.description,
           s.program, s.scope, s.default_value, s.choices
    FROM pepsi.config_option_schema() AS s;
COMMENT ON VIEW pepsi.config_option IS
    'Every option of pepsi.conf (schema/options.def): kind, range (ms for a duration, bytes for a size), default, and the most specific scope it may be set at';

-- Why d is not a domain name Pepsi accepts, as a sentence; NULL if it is one.
CREATE FUNCTION pepsi.config_domain_problem(d text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE
        WHEN d = '' THEN 'It is empty.'
        WHEN d ~ '[^\x01-\x7f]'
            THEN 'It is not ASCII: write an internationalized domain in its A-label (xn--) form.'
        WHEN length(d) > 253 THEN 'It is longer than 253 characters.'
        WHEN d LIKE '%.' THEN 'It ends with a dot: write it without the root''s dot.'
        WHEN EXISTS (SELECT FROM unnest(string_to_array(d, '.')) AS l (label)
                     WHERE l.label !~* '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$')
            THEN 'Each of its dot-separated labels is 1 to 63 letters, digits and hyphens, '
                 'not starting or ending with a hyphen.'
    END
$$;

-- The canonical form of a scope: "global", "domain:<domain>" with the
-- domain lower-cased, or "address:<local>@<domain>" with the domain
-- lower-cased (the local part is the owner's and keeps its case); raise if
-- it is none of these.
CREATE FUNCTION pepsi.config_scope(scope text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    name text;
    local_part text;
    problem text;
BEGIN
    IF scope IS NULL THEN
        RAISE EXCEPTION 'scope must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'The scope of an override for every message is "global".';
    END IF;
    IF scope = 'global' THEN
        RETURN scope;
    END IF;
    IF scope LIKE 'domain:%' THEN
        name := substr(scope, 8);
        IF name = '' THEN
            RAISE EXCEPTION 'scope "domain:" names no domain'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'A domain scope is "domain:" followed by the domain, as in "domain:example.org".';
        END IF;
        problem := pepsi.config_domain_problem(name);
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'invalid domain "%" in scope "%"', name, scope
                USING ERRCODE = 'invalid_parameter_value', DETAIL = problem;
        END IF;
        RETURN 'domain:' || lower(name);
    END IF;
    IF scope LIKE 'address:%' THEN
        name := substr(scope, 9);
        IF name = '' THEN
            RAISE EXCEPTION 'scope "address:" names no address'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'An address scope is "address:" followed by the address, as in "address:postmaster@example.org".';
        END IF;
        IF name !~ '^[^@]+@[^@]*$' THEN
            RAISE EXCEPTION 'invalid address "%" in scope "%"', name, scope
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'An address is a local part, one "@" and a domain.';
        END IF;
        local_part := split_part(name, '@', 1);
        IF local_part !~ '^[^[:space:][:cntrl:]]+$' OR octet_length(local_part) > 64 THEN
            RAISE EXCEPTION 'invalid address "%" in scope "%"', name, scope
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'Its local part must be 1 to 64 octets without spaces or control characters.';
        END IF;
        problem := pepsi.config_domain_problem(split_part(name, '@', 2));
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'invalid address "%" in scope "%"', name, scope
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'Its domain is not valid. ' || problem;
        END IF;
        RETURN 'address:' || local_part || '@' || lower(split_part(name, '@', 2));
    END IF;
    RAISE EXCEPTION 'invalid scope "%"', scope
        USING ERRCODE = 'invalid_parameter_value',
              DETAIL = 'A scope is "global", "domain:<domain>" or "address:<address>".';
END
$$;

-- Check an override (value NULL: the name only, for config_get and
-- config_unset) and return its scope in canonical form; raise, saying what
-- is wrong and how to put it right, if it would be refused.
CREATE FUNCTION pepsi.config_validate(scope text, section text, option text,
                                         value text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text;
    known pepsi.config_option;
    section_known boolean;
    section_overridable boolean;
    program_name text;
    options text;
    problem text;
BEGIN
    canonical := pepsi.config_scope(scope);

    IF section IS NULL THEN
        RAISE EXCEPTION 'section must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF section !~ '^[a-z][a-z0-9_-]*$' THEN
        RAISE EXCEPTION 'invalid section name "%"', section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A section name is lower case: a letter, then letters, digits, "_" or "-", as in "dispatch" or "stage-relay".',
                  HINT = CASE WHEN section ~ '^\[.*\]$'
                              THEN format('Give the name without its brackets: "%s".', btrim(section, '[]'))
                              WHEN lower(section) ~ '^[a-z][a-z0-9_-]*$'
                              THEN format('Section names are lower case: "%s".', lower(section))
                              ELSE 'The sections are those of pepsi.conf, named without their brackets.' END;
    END IF;
    SELECT count(*) > 0, coalesce(bool_or(o.scope <> 'file'), false)
    INTO section_known, section_overridable
    FROM pepsi.config_option o
    WHERE o.section = config_validate.section
       OR (o.section LIKE '%*' AND config_validate.section LIKE replace(o.section, '*', '%'));
    IF NOT section_known THEN
        SELECT string_agg(DISTINCT '[' || replace(o.section, '*', '<name>') || ']', ', ') INTO options
        FROM pepsi.config_option o WHERE o.scope <> 'file';
        RAISE EXCEPTION 'unknown section [%]', section
            USING ERRCODE = 'undefined_object',
                  DETAIL = format('The sections an override may name are %s.', options);
    END IF;
    IF NOT section_overridable THEN
        RAISE EXCEPTION 'section [%] cannot be overridden', section
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = CASE WHEN section = 'database'
                                THEN 'It is read from pepsi.conf before any database connection exists, so an override could never take effect.'
                                WHEN section LIKE 'listener-%'
                                THEN 'Listener sections are read from pepsi.conf only, so that a compromised database cannot move a listening socket.'
                                ELSE 'Its options are read from pepsi.conf only, so that a compromised database cannot change them.' END,
                  HINT = 'Change it in pepsi.conf.';
    END IF;

    IF section LIKE '%-' THEN
        RAISE EXCEPTION 'invalid section name "%"', section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A section name does not end with "-": a stage section is "stage-" followed by the stage''s name.';
    END IF;

    IF option IS NULL THEN
        RAISE EXCEPTION 'option must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF section = 'ingress' AND option IN ('USER', 'GROUP', 'CREDENTIALS') THEN
        RAISE EXCEPTION 'option % of [ingress] cannot be overridden', option
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = 'It decides whom ingress runs as and whose passwords it trusts, which a compromised database must not change.',
                  HINT = 'Change it in pepsi.conf.';
    END IF;
    IF option !~ '^[A-Z][A-Z0-9_]*$' THEN
        RAISE EXCEPTION 'invalid option name "%"', option
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'An option name is upper case: a letter, then letters, digits or "_", as in "MAX_RUNTIME".',
                  HINT = CASE WHEN upper(option) ~ '^[A-Z][A-Z0-9_]*$'
                              THEN format('Option names are upper case: "%s".', upper(option))
                              ELSE 'The options are those of pepsi.conf, written as they are there.' END;
    END IF;

    SELECT * INTO known FROM pepsi.config_option o
    WHERE o.option = config_validate.option AND o.program IS NULL
      AND (o.section = config_validate.section
           OR (o.section LIKE '%*' AND config_validate.section LIKE replace(o.section, '*', '%')))
    ORDER BY o.section LIKE '%*'
    LIMIT 1;
    IF NOT FOUND THEN
        SELECT string_agg(o.option, ', ' ORDER BY o.option) INTO options
        FROM pepsi.config_option o WHERE o.section = config_validate.section;
        IF options IS NOT NULL THEN
            RAISE EXCEPTION 'section [%] has no option %', section, option
                USING ERRCODE = 'undefined_object',
                      DETAIL = format('The options of [%s] are %s.', section, options);
        END IF;
        -- A stage program's own option: that of the section's program when
        -- an override names it, else of the one program that has it.
        SELECT regexp_replace(c.value, '^.*/', '') INTO program_name FROM pepsi.config_override c
        WHERE c.scope = 'global' AND c.section = config_validate.section AND c.option = 'PROGRAM';
        SELECT * INTO known FROM pepsi.config_option o
        WHERE o.program IS NOT NULL AND o.option = config_validate.option
          AND (program_name IS NULL OR o.program = program_name)
        ORDER BY o.program
        LIMIT 1;
        IF NOT FOUND AND program_name IS NOT NULL
           AND EXISTS (SELECT FROM pepsi.config_option o WHERE o.program = program_name) THEN
            SELECT string_agg(o.option, ', ' ORDER BY o.option) INTO options
            FROM pepsi.config_option o WHERE o.program = program_name OR o.section = 'stage-*' AND o.program IS NULL;
            RAISE EXCEPTION 'section [%] has no option %', section, option
                USING ERRCODE = 'undefined_object',
                      DETAIL = format('Its PROGRAM is %s, whose options are %s.', program_name, options);
        END IF;
        IF NOT FOUND THEN
            -- a third-party program's option: its form only, or a stage it names
            known := NULL;
            IF option LIKE '%\_STAGE' THEN
                known.kind := 'stage';
            END IF;
        END IF;
    END IF;
    IF known.scope = 'file' THEN
        RAISE EXCEPTION 'option % of [%] cannot be overridden', option, section
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = CASE WHEN known.kind = 'path' THEN 'It names a path a program reads. '
                                WHEN option IN ('SMARTHOST', 'TLS', 'TLS_NAME', 'AUTH_USER')
                                THEN 'It decides where mail is sent or how the next hop is authenticated. '
                                ELSE '' END
                           || 'It is read from pepsi.conf only, so that a compromised database cannot change it.',
                  HINT = 'Change it in pepsi.conf.';
    END IF;
    IF known.scope = 'global' AND canonical <> 'global' THEN
        RAISE EXCEPTION 'option % of [%] takes the global scope only', option, section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It is read once by a process, not per message, so an override for a domain or an address could never apply.',
                  HINT = 'Use the scope "global".';
    END IF;
    IF known.scope = 'domain' AND canonical LIKE 'address:%' THEN
        RAISE EXCEPTION 'option % of [%] takes the global and domain scopes only', option, section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It is read per message with the domain of its recipients, never an address.',
                  HINT = 'Use the scope "global" or "domain:<domain>".';
    END IF;

    IF value IS NULL THEN
        RETURN canonical;
    END IF;
    IF value ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'value of % must be one line of text', option
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It contains a line break or another control character.';
    END IF;
    IF known.option IS NOT NULL THEN
        problem := pepsi.config_value_problem(section, option, value, known.program);
    ELSIF known.kind = 'stage' AND value !~ '^[a-z0-9_-]+$' THEN
        problem := format('%s names a stage, by its [stage-<name>] section: lower-case letters, digits, "_" and "-".', option);
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid value "%" for % in [%]', value, option, section
            USING ERRCODE = 'invalid_parameter_value', DETAIL = problem;
    END IF;
    RETURN canonical;
END
$$;

-- Set an override (insert or replace); returns the value it replaced, or
-- NULL.  Setting the value already in force writes nothing and wakes no
-- daemon, but is still logged, with "unchanged": true.
CREATE FUNCTION pepsi.config_set(scope text, section text, option text, value text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text;
    previous text;
    unchanged boolean;
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'value must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'pepsi.config_unset() removes an override.';
    END IF;
    canonical := pepsi.config_validate(scope, section, option, value);
    SELECT c.value INTO previous FROM pepsi.config_override c
    WHERE c.scope = canonical AND c.section = config_set.section AND c.option = config_set.option
    FOR UPDATE;
    unchanged := FOUND AND previous = value;
    IF NOT unchanged THEN
        INSERT INTO pepsi.config_override AS c (scope, section, option, value)
        VALUES (canonical, config_set.section, config_set.option, config_set.value)
        ON CONFLICT ON CONSTRAINT config_override_pkey
        DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at,
                      updated_by = excluded.updated_by;
    END IF;
    PERFORM pepsi.event_log_write('config_set',
        jsonb_build_object('scope', canonical, 'section', section, 'option', option,
                           'value', value, 'previous', previous, 'unchanged', unchanged));
    RETURN previous;
END
$$;

-- Remove an override; returns the value it had.  Removing one that does
-- not exist is an error, so that a mistyped name is not taken for success.
CREATE FUNCTION pepsi.config_unset(scope text, section text, option text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text;
    previous text;
BEGIN
    canonical := pepsi.config_validate(scope, section, option);
    DELETE FROM pepsi.config_override c
    WHERE c.scope = canonical AND c.section = config_unset.section AND c.option = config_unset.option
    RETURNING c.value INTO previous;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no override of [%] % at scope "%"', section, option, canonical
            USING ERRCODE = 'undefined_object',
                  DETAIL = 'Nothing was removed.',
                  HINT = 'pepsi.config_override lists the overrides in force.';
    END IF;
    PERFORM pepsi.event_log_write('config_unset',
        jsonb_build_object('scope', canonical, 'section', section, 'option', option,
                           'previous', previous));
    RETURN previous;
END
$$;

-- The override set at exactly this scope, or NULL.  The names are checked
-- as config_set checks them, so a mistyped one is an error, not a NULL.
-- (Which value wins for a message is the reader's business: address, then
-- domain, then global, then pepsi.conf; see common/config/config.h.)
CREATE FUNCTION pepsi.config_get(scope text, section text, option text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text;
    current text;
BEGIN
    canonical := pepsi.config_validate(scope, section, option);
    SELECT c.value INTO current FROM pepsi.config_override c
    WHERE c.scope = canonical AND c.section = config_get.section AND c.option = config_get.option;
    RETURN current;
END
$$;

-- ---------------------------------------------------------------------------
-- Grants
--
-- The boundaries (architecture 22.3): the pipeline may not write the
-- configuration (config_override, settings); ingress may only admit, through
-- pepsi.workqueue_add (and local submission, pepsi-sendmail, through
-- workqueue_inject), which run as the owner so that ingress holds no
-- write access to any table; only pepsi_config writes config_override; no
-- role may UPDATE, DELETE or TRUNCATE the two logs; pepsi_monitor reads the
-- queue views and the statistics, never a message.  Every function is
-- revoked from PUBLIC and granted to the roles that call it.
-- ---------------------------------------------------------------------------

-- The policy is data: what each group role holds (functions named without
-- their arguments: every overload gets the same grant), the functions that
-- run as the owner with the search_path they pin (so that a caller's
-- search_path cannot substitute an object of its own), and the objects no
-- group role may use, the owner's alone (the grants machinery, internal
-- helpers; trigger functions and identity sequences are the owner's too,
-- without being named).  Every other object of the schema must be named
-- in grant_rule: grant_verify() reports one that is in neither, so that an
-- object added without a grant shows up as drift instead of as a
-- permission error in production.  A feature that adds objects inserts
-- their rows (docs/upgrading.md).
CREATE TABLE pepsi.grant_rule (
    role        name NOT NULL REFERENCES pepsi.grant_role (name),
    object_kind text NOT NULL CHECK (object_kind IN ('schema', 'table', 'view', 'sequence', 'function')),
    object_name text NOT NULL,
    privileges  text[] NOT NULL CHECK (cardinality(privileges) > 0),
    PRIMARY KEY (role, object_kind, object_name)
);

CREATE TABLE pepsi.grant_definer (name text PRIMARY KEY);

CREATE TABLE pepsi.grant_owner (name text PRIMARY KEY);

-- A group role may hold another's privileges by membership, and then
-- holds nothing on the schema itself: a role's grants on the schema
-- outlive DROP EXTENSION (the schema stays), and 0.1's check at CREATE
-- EXTENSION would take a surviving grant to a role it does not know for
-- drift.  Membership is declared here, granted by grant_apply(), and
-- counted by grant_expected().
CREATE TABLE pepsi.grant_membership (
    member      name NOT NULL REFERENCES pepsi.grant_role (name),
    granted     name NOT NULL REFERENCES pepsi.grant_role (name),
    PRIMARY KEY (member, granted),
    CHECK (member <> granted)
);

-- A column-level grant: role gets privilege on every column of table
-- object_name but the withheld ones (crypto_identity's SELECT without
-- private_wrapped), instead of a table-level grant.  A column added to the
-- table later is granted with the rest; only what is named is withheld.
CREATE TABLE pepsi.grant_column (
    role        name NOT NULL REFERENCES pepsi.grant_role (name),
    object_name text NOT NULL,
    privilege   text NOT NULL CHECK (privilege IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')),
    withheld    name[] NOT NULL CHECK (cardinality(withheld) > 0),
    PRIMARY KEY (role, object_name, privilege)
);

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_config', 'table', 'config_override', '{SELECT}'),
    ('pepsi_config', 'table', 'destination', '{SELECT}'),
    ('pepsi_config', 'table', 'dispatch_stats', '{SELECT}'),
    ('pepsi_config', 'table', 'dns_address', '{SELECT}'),
    ('pepsi_config', 'table', 'dsn_rate', '{SELECT}'),
    ('pepsi_config', 'table', 'event_log', '{SELECT}'),
    ('pepsi_config', 'table', 'ingress_stats', '{SELECT}'),
    ('pepsi_config', 'table', 'mail_log', '{SELECT}'),
    ('pepsi_config', 'table', 'settings', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_config', 'table', 'stage_stats', '{SELECT}'),
    ('pepsi_config', 'table', 'virtual_mailbox', '{SELECT}'),
    ('pepsi_config', 'table', 'workqueue', '{SELECT}'),
    ('pepsi_config', 'table', 'workqueue_body', '{SELECT}'),
    ('pepsi_config', 'view', 'config_option', '{SELECT}'),
    ('pepsi_config', 'view', 'queue_senders', '{SELECT}'),
    ('pepsi_config', 'view', 'queue_shape', '{SELECT}'),
    ('pepsi_config', 'view', 'queue_summary', '{SELECT}'),
    ('pepsi_config', 'function', 'admin_account_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'api_token_create', '{EXECUTE}'),
    ('pepsi_config', 'function', 'api_token_revoke', '{EXECUTE}'),
    ('pepsi_config', 'function', 'autoreply_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'config_domain_problem', '{EXECUTE}'),
    ('pepsi_config', 'function', 'config_get', '{EXECUTE}'),
    ('pepsi_config', 'function', 'config_option_schema', '{EXECUTE}'),
    ('pepsi_config', 'function', 'config_scope', '{EXECUTE}'),
    ('pepsi_config', 'function', 'config_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'config_unset', '{EXECUTE}'),
    ('pepsi_config', 'function', 'config_validate', '{EXECUTE}'),
    ('pepsi_config', 'function', 'config_value_problem', '{EXECUTE}'),
    ('pepsi_config', 'function', 'destination_reset', '{EXECUTE}'),
    ('pepsi_config', 'function', 'destination_set_limits', '{EXECUTE}'),
    ('pepsi_config', 'function', 'event_principal', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_bounce', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_delete', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_gauges', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_hold', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_list', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_message', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_release', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_retry', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_senders_rows', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_shape_rows', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_summary_rows', '{EXECUTE}'),
    ('pepsi_config', 'function', 'recipient_domain', '{EXECUTE}'),
    ('pepsi_config', 'function', 'vacation_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'vacation_unset', '{EXECUTE}'),
    ('pepsi_config', 'function', 'virtual_mailbox_add', '{EXECUTE}'),
    ('pepsi_config', 'function', 'virtual_mailbox_canonical', '{EXECUTE}'),
    ('pepsi_config', 'function', 'virtual_mailbox_remove', '{EXECUTE}'),
    ('pepsi_httpd', 'table', 'admin_account', '{SELECT}'),
    ('pepsi_httpd', 'table', 'admin_session', '{SELECT,INSERT,DELETE}'),
    ('pepsi_httpd', 'table', 'api_token', '{SELECT}'),
    ('pepsi_httpd', 'table', 'config_override', '{SELECT}'),
    ('pepsi_httpd', 'table', 'dns_address', '{SELECT}'),
    ('pepsi_httpd', 'view', 'config_option', '{SELECT}'),
    ('pepsi_httpd', 'function', 'config_domain_problem', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_get', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_option_schema', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_scope', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_set', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_unset', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_validate', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_value_problem', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'event_principal', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_bounce', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_delete', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_hold', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_list', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_message', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_release', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_retry', '{EXECUTE}'),
    ('pepsi_ingress', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_ingress', 'table', 'config_override', '{SELECT}'),
    ('pepsi_ingress', 'table', 'virtual_mailbox', '{SELECT}'),
    ('pepsi_ingress', 'view', 'config_option', '{SELECT}'),
    ('pepsi_ingress', 'function', 'config_domain_problem', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'config_get', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'config_option_schema', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'config_scope', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'config_validate', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'config_value_problem', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'ingress_report', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'notify_workqueue', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'session_nice', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'workqueue_add', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'workqueue_add_logged', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'workqueue_inject', '{EXECUTE}'),
    ('pepsi_monitor', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_monitor', 'table', 'destination', '{SELECT}'),
    ('pepsi_monitor', 'table', 'dispatch_stats', '{SELECT}'),
    ('pepsi_monitor', 'table', 'dns_address', '{SELECT}'),
    ('pepsi_monitor', 'table', 'dsn_rate', '{SELECT}'),
    ('pepsi_monitor', 'table', 'ingress_stats', '{SELECT}'),
    ('pepsi_monitor', 'table', 'mta_sts_policy', '{SELECT}'),
    ('pepsi_monitor', 'table', 'stage_stats', '{SELECT}'),
    ('pepsi_monitor', 'view', 'queue_senders', '{SELECT}'),
    ('pepsi_monitor', 'view', 'queue_shape', '{SELECT}'),
    ('pepsi_monitor', 'view', 'queue_summary', '{SELECT}'),
    ('pepsi_monitor', 'function', 'held_horizon', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'maintenance_pid', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'queue_gauges', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'queue_senders_rows', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'queue_shape_rows', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'queue_summary_rows', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'recipient_domain', '{EXECUTE}'),
    ('pepsi_stage', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_stage', 'table', 'config_override', '{SELECT}'),
    ('pepsi_stage', 'table', 'destination', '{SELECT}'),
    ('pepsi_stage', 'table', 'dispatch_stats', '{SELECT,UPDATE}'),
    ('pepsi_stage', 'table', 'dns_address', '{SELECT}'),
    ('pepsi_stage', 'table', 'mail_log', '{INSERT}'),
    ('pepsi_stage', 'table', 'mta_sts_policy', '{SELECT}'),
    ('pepsi_stage', 'table', 'settings', '{SELECT}'),
    ('pepsi_stage', 'table', 'stage_stats', '{SELECT,INSERT,UPDATE}'),
    ('pepsi_stage', 'table', 'virtual_mailbox', '{SELECT}'),
    ('pepsi_stage', 'table', 'workqueue', '{SELECT}'),
    ('pepsi_stage', 'table', 'workqueue_body', '{SELECT}'),
    ('pepsi_stage', 'view', 'config_option', '{SELECT}'),
    ('pepsi_stage', 'sequence', 'pending_seq', '{USAGE,SELECT}'),
    ('pepsi_stage', 'function', 'autoreply_due', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'bounce_gather', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'config_domain_problem', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'config_get', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'config_option_schema', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'config_scope', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'config_validate', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'config_value_problem', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'destination_begin', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'destination_end', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'destination_slot_key', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'destination_waiter_key', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'dns_address_current', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'dns_address_store', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'dsn_rate_take', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'maintenance_pid', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'mta_sts_policy_get', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'mta_sts_policy_put', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'notify_workqueue', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'recipients_subset', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'session_nice', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'state_for_recipients', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_body_gc', '{EXECUTE}'),
    ('pepsi_dispatch', 'function', 'workqueue_claim', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_commit', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_commit_many', '{EXECUTE}'),
    ('pepsi_dispatch', 'function', 'workqueue_crashed', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_finish_with_clones', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_inject', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_pause', '{EXECUTE}'),
    ('pepsi_dispatch', 'function', 'workqueue_recover', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_requeue_due', '{EXECUTE}'),
    ('pepsi_dispatch', 'function', 'workqueue_reset_orphans', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_resume', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_split', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_split_off', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'workqueue_split_one_per_row', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES
    ('admin_account_set'),
    ('api_token_create'),
    ('api_token_revoke'),
    ('autoreply_due'),
    ('autoreply_prune'),
    ('bounce_gather'),
    ('config_set'),
    ('config_unset'),
    ('destination_reset'),
    ('destination_set_limits'),
    ('dsn_rate_take'),
    ('held_horizon'),
    ('ingress_report'),
    ('mta_sts_policy_get'),
    ('mta_sts_policy_put'),
    ('queue_bounce'),
    ('queue_counts'),
    ('queue_delete'),
    ('queue_gauge_refresh'),
    ('queue_gauges'),
    ('queue_hold'),
    ('queue_list'),
    ('queue_message'),
    ('queue_release'),
    ('queue_retry'),
    ('queue_senders_rows'),
    ('queue_shape_rows'),
    ('queue_summary_rows'),
    ('vacation_set'),
    ('vacation_unset'),
    ('virtual_mailbox_add'),
    ('virtual_mailbox_remove'),
    ('workqueue_add'),
    ('workqueue_add_logged'),
    ('workqueue_crashed'),
    ('workqueue_inject');
INSERT INTO pepsi.grant_owner (name) VALUES
    ('apply_grants'),
    ('autoreply_sent'),
    ('config_override_guard'),
    ('event_log_write'),
    ('grant_apply'),
    ('grant_column'),
    ('grant_definer'),
    ('grant_definer_functions'),
    ('grant_expected'),
    ('grant_membership'),
    ('grant_object_name'),
    ('grant_owner'),
    ('grant_owner_only'),
    ('grant_policy'),
    ('grant_role'),
    ('grant_roles_create'),
    ('grant_rule'),
    ('grant_verify'),
    ('queue_counts'),
    ('queue_gauge'),
    ('queue_gauge_refresh'),
    ('queue_lock_rows'),
    ('schema_version'),
    ('schema_version_restore'),
    ('start_maintenance');
INSERT INTO pepsi.grant_membership VALUES ('pepsi_httpd', 'pepsi_monitor'), ('pepsi_dispatch', 'pepsi_stage');

-- The policy as 0.1's functions gave it (apply_grants reads it through
-- it).  grant_expected and grant_verify read pepsi.grant_rule itself: a
-- function with a SET clause is never inlined, so each of their EXISTS
-- and IN tests ran this one again and scanned every rule, some seven
-- thousand times a call, where the table's primary key answers at once.
CREATE FUNCTION pepsi.grant_policy()
RETURNS TABLE (role name, object_kind text, object_name text, privileges text[])
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT g.role, g.object_kind, g.object_name, g.privileges FROM pepsi.grant_rule g
$$;

CREATE FUNCTION pepsi.grant_definer_functions() RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT d.name FROM pepsi.grant_definer d
$$;

CREATE FUNCTION pepsi.grant_owner_only() RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT o.name FROM pepsi.grant_owner o
$$;

-- The relations and functions of the schema with what the policy wants
-- each group role to hold on them: one row per (role, object, privilege
-- that applies to the object).
CREATE FUNCTION pepsi.grant_expected()
RETURNS TABLE (role name, classid regclass, objid oid, kind "char", privilege text, expected boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH objects AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid, c.relkind AS kind, c.relname::text AS name,
               CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' ELSE 'table' END AS object_kind,
               CASE c.relkind WHEN 'S' THEN '{USAGE,SELECT,UPDATE}'::text[]
                    ELSE '{SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER}' END AS applicable
        FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid, 'f', p.proname::text, 'function', '{EXECUTE}'
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
        UNION ALL
        SELECT 'pg_namespace'::regclass, 'pepsi'::regnamespace::oid, 'n', 'pepsi', 'schema', '{USAGE,CREATE}'),
    roles AS (SELECT DISTINCT g.role FROM pepsi.grant_rule g
              WHERE EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role))
    SELECT r.role, o.classid, o.objid, o.kind, a.privilege,
           EXISTS (SELECT FROM pepsi.grant_rule g
                   WHERE (g.role = r.role
                          OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                     AND g.object_kind = o.object_kind
                     AND g.object_name = o.name AND a.privilege = ANY (g.privileges))
    FROM objects o CROSS JOIN roles r CROSS JOIN LATERAL unnest(o.applicable) AS a (privilege)
$$;

-- Apply the policy: revoke everything PUBLIC and the group roles hold on
-- the schema and its objects, revoke UPDATE, DELETE and TRUNCATE on the two
-- logs from every role (whoever granted them), grant what the policy says
-- and make the definer functions so.  Grants to other roles are left alone
-- (pepsi.apply_grants() reports them).
CREATE FUNCTION pepsi.grant_apply() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    missing text;
    routine text;
    item record;
    revokees text;
BEGIN
    SELECT string_agg(DISTINCT g.role, ', ') INTO missing FROM pepsi.grant_policy() g
    WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION '% % not exist', CASE WHEN missing LIKE '%,%' THEN 'group roles' ELSE 'group role' END,
                        missing || CASE WHEN missing LIKE '%,%' THEN ' do' ELSE ' does' END
            USING ERRCODE = 'undefined_object',
                  DETAIL = 'CREATE EXTENSION pepsi creates the group roles; only a DBA drops or renames them.',
                  HINT = 'Create it again with CREATE ROLE <name> NOLOGIN, then run SELECT * FROM pepsi.apply_grants().';
    END IF;
    SELECT 'PUBLIC, ' || string_agg(quote_ident(r.name), ', ' ORDER BY r.name) INTO revokees
    FROM pepsi.grant_role r;

    EXECUTE format('REVOKE ALL ON SCHEMA pepsi FROM %s', revokees);
    FOR item IN
        SELECT c.oid::regclass AS relation, c.relkind = 'S' AS is_sequence
        FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
    LOOP
        EXECUTE format('REVOKE ALL ON %s %s FROM %s',
                       CASE WHEN item.is_sequence THEN 'SEQUENCE' ELSE 'TABLE' END, item.relation, revokees);
    END LOOP;
    FOR item IN SELECT p.oid::regprocedure AS routine FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
    LOOP
        EXECUTE format('REVOKE ALL ON ROUTINE %s FROM %s', item.routine, revokees);
    END LOOP;

    -- The logs are append-only for every role, not just for ours.
    -- (A table-level REVOKE takes the column-level grants with it.)
    FOR item IN
        SELECT DISTINCT x.relation, a.privilege_type AS privilege,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
        FROM (SELECT c.oid::regclass AS relation, c.relowner AS owner, c.relacl AS acl FROM pg_class c
              UNION ALL
              SELECT c.oid::regclass, c.relowner, t.attacl
              FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid) AS x
        CROSS JOIN LATERAL aclexplode(x.acl) AS a
        WHERE x.relation IN ('pepsi.event_log'::regclass, 'pepsi.mail_log'::regclass)
          AND a.privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE') AND a.grantee <> x.owner
    LOOP
        EXECUTE format('REVOKE %s ON TABLE %s FROM %s CASCADE', item.privilege, item.relation, item.grantee);
    END LOOP;

    FOR item IN SELECT * FROM pepsi.grant_policy() g WHERE g.object_kind = 'schema'
    LOOP
        EXECUTE format('GRANT %s ON SCHEMA %I TO %I', array_to_string(item.privileges, ', '),
                       item.object_name, item.role);
    END LOOP;
    -- (An object the policy names that does not exist is skipped here and
    -- reported by grant_verify().)
    FOR item IN SELECT * FROM pepsi.grant_policy() g
                WHERE g.object_kind IN ('table', 'view', 'sequence')
                  AND to_regclass(format('pepsi.%I', g.object_name)) IS NOT NULL
    LOOP
        EXECUTE format('GRANT %s ON %s pepsi.%I TO %I', array_to_string(item.privileges, ', '),
                       CASE WHEN item.object_kind = 'sequence' THEN 'SEQUENCE' ELSE 'TABLE' END,
                       item.object_name, item.role);
    END LOOP;
    FOR item IN SELECT c.role, c.object_name, c.privilege,
                       (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) FROM pg_attribute a
                        WHERE a.attrelid = to_regclass(format('pepsi.%I', c.object_name)) AND a.attnum > 0
                          AND NOT a.attisdropped AND NOT a.attname = ANY (c.withheld)) AS columns
                FROM pepsi.grant_column c WHERE to_regclass(format('pepsi.%I', c.object_name)) IS NOT NULL
    LOOP
        EXECUTE format('GRANT %s (%s) ON TABLE pepsi.%I TO %I', item.privilege, item.columns,
                       item.object_name, item.role);
    END LOOP;
    FOR item IN SELECT * FROM pepsi.grant_policy() g WHERE g.object_kind = 'function'
    LOOP
        FOR routine IN SELECT p.oid::regprocedure::text FROM pg_proc p
                       WHERE p.pronamespace = 'pepsi'::regnamespace AND p.proname = item.object_name
        LOOP
            EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %I', routine, item.role);
        END LOOP;
    END LOOP;

    FOR item IN SELECT p.oid::regprocedure AS routine FROM pg_proc p
                WHERE p.pronamespace = 'pepsi'::regnamespace
                  AND p.proname IN (SELECT * FROM pepsi.grant_definer_functions())
    LOOP
        EXECUTE format('ALTER ROUTINE %s SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp',
                       item.routine);
    END LOOP;

    FOR item IN SELECT * FROM pepsi.grant_membership
    LOOP
        EXECUTE format('GRANT %I TO %I', item.granted, item.member);
    END LOOP;
END
$$;

-- An object as the drift report names it, "table pepsi.workqueue" or
-- "column action of table pepsi.event_log": pg_describe_object qualifies
-- what the search_path does not show, so it shows pg_catalog only.
CREATE FUNCTION pepsi.grant_object_name(classid regclass, objid oid, subid integer) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_describe_object(classid, objid, subid)
$$;

-- Compare the live catalog with the policy: one row per difference, none
-- when all is well.  Group roles are checked through has_*_privilege, so a
-- privilege reached through role membership (pepsi_monitor made a member
-- of pepsi_stage) or a column-level grant counts; PUBLIC and every other
-- grantee are checked in the ACLs; the definer functions must still run as
-- the owner with their pinned search_path, and no other function may; and
-- every object must be in the policy or the owner's alone.
CREATE FUNCTION pepsi.grant_verify()
RETURNS TABLE (grantee text, object text, privilege text, expected boolean, actual boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH checked AS (
        SELECT e.role::text AS grantee, e.classid, e.objid, e.privilege, e.expected,
               CASE e.kind
                   WHEN 'f' THEN has_function_privilege(e.role, e.objid, e.privilege)
                   WHEN 'n' THEN has_schema_privilege(e.role, e.objid, e.privilege)
                   WHEN 'S' THEN has_sequence_privilege(e.role, e.objid, e.privilege)
                   ELSE has_table_privilege(e.role, e.objid, e.privilege)
                        OR (NOT e.expected AND e.privilege IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')
                            AND has_any_column_privilege(e.role, e.objid, e.privilege)
                            AND NOT EXISTS (SELECT FROM pepsi.grant_column g
                                            WHERE to_regclass(format('pepsi.%I', g.object_name)) = e.objid
                                              AND g.privilege = e.privilege
                                              AND (g.role = e.role
                                                   OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m
                                                                 WHERE m.member = e.role))))
               END AS actual
        FROM pepsi.grant_expected() e),
    -- The tables with column-level grants, column by column: a role may
    -- use a column if the policy grants it the table or the column.
    columns AS (
        SELECT r.role::text AS grantee, c.oid AS objid, a.attnum, p.privilege,
               EXISTS (SELECT FROM pepsi.grant_rule g
                       WHERE (g.role = r.role
                              OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                         AND g.object_kind = 'table' AND g.object_name = c.relname::text
                         AND p.privilege = ANY (g.privileges))
               OR EXISTS (SELECT FROM pepsi.grant_column g
                          WHERE (g.role = r.role
                                 OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                            AND g.object_name = c.relname::text AND g.privilege = p.privilege
                            AND NOT a.attname = ANY (g.withheld)) AS expected,
               has_column_privilege(r.role, c.oid, a.attnum, p.privilege) AS actual
        FROM (SELECT DISTINCT g.object_name, g.privilege FROM pepsi.grant_column g) p
        JOIN pg_class c ON c.relnamespace = 'pepsi'::regnamespace AND c.relname = p.object_name
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        CROSS JOIN (SELECT DISTINCT g.role FROM pepsi.grant_rule g
                    WHERE EXISTS (SELECT FROM pg_roles x WHERE x.rolname = g.role)) r),
    acls AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid, 0 AS subid, c.relowner AS owner,
               coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner)) AS acl
        FROM pg_class c WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
        UNION ALL
        SELECT 'pg_class'::regclass, c.oid, t.attnum, c.relowner, t.attacl
        FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid
        WHERE c.relnamespace = 'pepsi'::regnamespace AND t.attacl IS NOT NULL
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid, 0, p.proowner, coalesce(p.proacl, acldefault('f', p.proowner))
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
        UNION ALL
        SELECT 'pg_namespace'::regclass, n.oid, 0, n.nspowner, coalesce(n.nspacl, acldefault('n', n.nspowner))
        FROM pg_namespace n WHERE n.nspname = 'pepsi'),
    strangers AS (
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee,
               x.classid, x.objid, x.subid, a.privilege_type AS privilege
        FROM acls x CROSS JOIN LATERAL aclexplode(x.acl) AS a
        WHERE a.grantee <> x.owner
          AND a.grantee NOT IN (SELECT r.oid FROM pg_roles r
                                WHERE r.rolname IN (SELECT g.role FROM pepsi.grant_rule g))),
    unclassified AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
          AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype = 'i')
          AND c.relname NOT IN (SELECT g.object_name FROM pepsi.grant_rule g)
          AND c.relname NOT IN (SELECT * FROM pepsi.grant_owner_only())
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p
        WHERE p.pronamespace = 'pepsi'::regnamespace AND p.prorettype <> 'trigger'::regtype
          AND p.proname NOT IN (SELECT g.object_name FROM pepsi.grant_rule g)
          AND p.proname NOT IN (SELECT * FROM pepsi.grant_owner_only())),
    definers AS (
        SELECT p.oid AS objid, p.proname IN (SELECT * FROM pepsi.grant_definer_functions()) AS wanted,
               p.prosecdef,
               coalesce('search_path=pg_catalog, pepsi, pg_temp' = ANY (p.proconfig), false) AS pinned
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace)
    SELECT c.grantee, pepsi.grant_object_name(c.classid, c.objid, 0), c.privilege, c.expected, c.actual
    FROM checked c WHERE c.expected <> c.actual
    UNION ALL
    SELECT c.grantee, pepsi.grant_object_name('pg_class'::regclass, c.objid, c.attnum), c.privilege, c.expected, c.actual
    FROM columns c WHERE c.expected <> c.actual
    UNION ALL
    SELECT DISTINCT g.role::text, 'role ' || g.role, 'exists', true, false
    FROM pepsi.grant_rule g WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role)
    UNION ALL
    SELECT s.grantee, pepsi.grant_object_name(s.classid, s.objid, s.subid), s.privilege, false, true
    FROM strangers s
    UNION ALL
    SELECT NULL, pepsi.grant_object_name(u.classid, u.objid, 0), 'named in grant_policy()', true, false
    FROM unclassified u
    UNION ALL
    SELECT DISTINCT NULL, g.object_kind || ' pepsi.' || g.object_name, 'exists', true, false
    FROM pepsi.grant_rule g
    WHERE CASE WHEN g.object_kind = 'function'
               THEN NOT EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
                                AND p.proname = g.object_name)
               WHEN g.object_kind = 'schema' THEN false
               ELSE to_regclass(format('pepsi.%I', g.object_name)) IS NULL END
    UNION ALL
    SELECT NULL, pepsi.grant_object_name('pg_proc'::regclass, d.objid, 0), 'SECURITY DEFINER', d.wanted, d.prosecdef
    FROM definers d WHERE d.wanted <> d.prosecdef
    UNION ALL
    SELECT NULL, pepsi.grant_object_name('pg_proc'::regclass, d.objid, 0), 'SET search_path', true, false
    FROM definers d WHERE d.wanted AND NOT d.pinned
    ORDER BY 2, 1, 3
$$;

-- (Re)apply the grants and verify them against the live catalog; returns
-- the drift that remains (see pepsi.grant_verify), none when all is well.
-- strict: raise instead, undoing the whole call, if anything remains.
-- Logged as one event, with the number of drift rows.
CREATE FUNCTION pepsi.apply_grants(strict boolean DEFAULT false)
RETURNS TABLE (grantee text, object text, privilege text, expected boolean, actual boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    drift record;
    drift_count integer := 0;
    first_drift text;
BEGIN
    PERFORM pepsi.grant_apply();
    FOR drift IN SELECT * FROM pepsi.grant_verify() LOOP
        drift_count := drift_count + 1;
        IF first_drift IS NULL THEN
            first_drift := format('%s %s %s on %s', coalesce(drift.grantee, 'the owner'),
                                  CASE WHEN drift.actual THEN 'has' ELSE 'lacks' END,
                                  drift.privilege, drift.object);
        END IF;
        grantee := drift.grantee;
        object := drift.object;
        privilege := drift.privilege;
        expected := drift.expected;
        actual := drift.actual;
        RETURN NEXT;
    END LOOP;
    IF strict AND drift_count > 0 THEN
        RAISE EXCEPTION 'the grants of schema pepsi differ from the policy in % place%',
                        drift_count, CASE WHEN drift_count = 1 THEN '' ELSE 's' END
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('First: %s.', first_drift),
                  HINT = 'SELECT * FROM pepsi.apply_grants() lists them all; role memberships are not undone by it.';
    END IF;
    PERFORM pepsi.event_log_write('apply_grants', jsonb_build_object('drift', drift_count));
END
$$;

-- ===========================================================================
-- The features of 0.2
--
-- Each section is the block of pepsi--0.1--0.2.sql that brought it, less
-- what is folded into the definitions above (columns, indexes, settings,
-- the grants) and made here in its final form.
-- ===========================================================================

-- ===========================================================================
-- Local recipients: virtual mailboxes
--
-- The addresses of local domains that exist without a maildir or an alias
-- of their own (common/local/local.c, source "virtual").  pepsi-ingress reads
-- the table to refuse unknown local recipients at RCPT time (550 5.1.1);
-- the pipeline may read it; only pepsi_config changes it, and only through
-- the audited functions below, never by writing the table.
-- ===========================================================================

CREATE TABLE pepsi.virtual_mailbox (
    address    text PRIMARY KEY,
    note       text,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text NOT NULL DEFAULT current_user,
    CONSTRAINT virtual_mailbox_address_form CHECK (
        address = lower(address)
        AND address ~ '^[^@[:space:][:cntrl:]]{1,64}@[a-z0-9_.-]{1,253}$'
        AND address !~ '^\.' AND address !~ '/'),
    CONSTRAINT virtual_mailbox_note_form CHECK (note IS NULL OR note !~ '[[:cntrl:]]')
);
COMMENT ON TABLE pepsi.virtual_mailbox IS
    'Local recipients that exist without a maildir or an alias (LOCAL_RECIPIENTS = virtual); changed through virtual_mailbox_add/remove';

-- The canonical form of a mailbox address, or an error saying what is wrong.
CREATE FUNCTION pepsi.virtual_mailbox_canonical(address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := lower(btrim(address));
BEGIN
    IF address IS NULL THEN
        RAISE EXCEPTION 'address must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF canonical ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid mailbox address: it contains a control character'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A line break or another control character in an address could forge SMTP commands or headers.';
    END IF;
    IF canonical !~ '^[^@[:space:]]{1,64}@[a-z0-9_.-]{1,253}$' OR canonical ~ '^\.' OR canonical ~ '/' THEN
        RAISE EXCEPTION 'invalid mailbox address %', quote_literal(address)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A mailbox is local-part@domain: a local part of at most 64 characters without spaces, "/" or a leading dot, and an ASCII domain name.',
                  HINT = 'Give the address as mail is sent to it, as in "alice@example.org".';
    END IF;
    RETURN canonical;
END
$$;

-- Add a mailbox; false if it existed already.  Audited in pepsi.event_log.
CREATE FUNCTION pepsi.virtual_mailbox_add(address text, note text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := pepsi.virtual_mailbox_canonical(address);
    added boolean;
BEGIN
    IF note ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'note must be one line of text'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It contains a line break or another control character.';
    END IF;
    INSERT INTO pepsi.virtual_mailbox AS v (address, note, created_by)
    VALUES (canonical, note, pepsi.event_principal())
    ON CONFLICT ON CONSTRAINT virtual_mailbox_pkey DO NOTHING;
    added := FOUND;
    PERFORM pepsi.event_log_write('virtual_mailbox_add',
        jsonb_build_object('address', canonical, 'note', note, 'added', added));
    RETURN added;
END
$$;

-- Remove a mailbox; false if there was none.  Audited in pepsi.event_log.
CREATE FUNCTION pepsi.virtual_mailbox_remove(address text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := pepsi.virtual_mailbox_canonical(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.virtual_mailbox v WHERE v.address = canonical;
    removed := FOUND;
    PERFORM pepsi.event_log_write('virtual_mailbox_remove',
        jsonb_build_object('address', canonical, 'removed', removed));
    RETURN removed;
END
$$;

-- end of local recipients: virtual mailboxes

-- ===========================================================================
-- The database cannot run code or redirect mail
--
-- An override of pepsi.conf is one line of text; PROGRAM is a program's
-- name (the dispatcher runs it from Pepsi's own program directory, never
-- a path); the options that name a path, where mail goes or how the next
-- hop is authenticated are read from the file only (common/config/config.c
-- refuses the same rows whatever the database holds).  The constraints are
-- NOT VALID so that the update succeeds on a database holding such a row;
-- the programs refuse it.
--
-- The configuration and the audit log are written only through audited
-- SECURITY DEFINER functions: no group role writes config_override or
-- inserts into event_log directly, and both record the caller
-- (pepsi.event_principal(), the role outside any definer function), so
-- the audit trail cannot be forged.
-- ===========================================================================

ALTER TABLE pepsi.config_override
    ADD CONSTRAINT config_override_one_line CHECK (value !~ '[\x01-\x08\x0a-\x1f\x7f]') NOT VALID,
    ADD CONSTRAINT config_override_program_name
        CHECK (option <> 'PROGRAM' OR value ~ '^[a-z0-9][a-z0-9._+-]*$') NOT VALID,
    ADD CONSTRAINT config_override_file_only
        CHECK (option !~ '_FILE$'
               AND option NOT IN ('MAILDIR_ROOT', 'SMARTHOST', 'TLS', 'TLS_NAME', 'CERTIFICATE', 'KEY',
                                  'AUTH_USER')
               AND NOT (section = 'ingress' AND option = 'TRUSTED_NETWORKS')) NOT VALID;

-- The refusal config_set (and a superuser's INSERT) gets, before the constraint would.
CREATE FUNCTION pepsi.config_override_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    -- (inline: a trigger runs with the writer's rights, which need no other function)
    why text := CASE
        WHEN NEW.option ~ '_FILE$' OR NEW.option IN ('MAILDIR_ROOT', 'CERTIFICATE', 'KEY')
            THEN 'It names a path a program reads.'
        WHEN NEW.option IN ('SMARTHOST', 'TLS', 'TLS_NAME', 'AUTH_USER')
            THEN 'It decides where mail is sent or how the next hop is authenticated.'
        WHEN NEW.section = 'ingress' AND NEW.option = 'TRUSTED_NETWORKS'
            THEN 'It decides which clients may relay.'
    END;
BEGIN
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'option % of [%] cannot be overridden', NEW.option, NEW.section
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = why || ' It is read from pepsi.conf only, so that a compromised database cannot change it.',
                  HINT = 'Change it in pepsi.conf.';
    END IF;
    IF NEW.option = 'PROGRAM' AND NEW.value !~ '^[a-z0-9][a-z0-9._+-]*$' THEN
        RAISE EXCEPTION 'invalid value for PROGRAM in [%]', NEW.section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'From the database PROGRAM names a program of Pepsi''s (lower-case letters, digits, ".", "_", "+" and "-"), never a path.';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER config_override_guard
    BEFORE INSERT OR UPDATE ON pepsi.config_override
    FOR EACH ROW EXECUTE FUNCTION pepsi.config_override_guard();

-- The principal is the caller even inside the definer functions.
ALTER TABLE pepsi.config_override ALTER COLUMN updated_by SET DEFAULT pepsi.event_principal();
ALTER TABLE pepsi.event_log ALTER COLUMN principal SET DEFAULT pepsi.event_principal();

-- end of the database cannot run code or redirect mail

-- ===========================================================================
-- pepsi-httpd: administrative credentials, the API's read paths, metrics
--
-- pepsi-httpd (daemons/httpd) serves /metrics, a JSON API over the operator
-- functions and a web page.  It connects as a member of pepsi_httpd, which
-- may read the views and statistics and call the operator functions, and
-- alone may read the credential tables: a component that could read
-- admin_session could mint itself an administrative session.  Only digests
-- are stored (SHA-256 of a session cookie or of an API token, Argon2id of
-- a password), so a backup holds no usable credential.
-- ===========================================================================

CREATE TABLE pepsi.admin_account (
    name            text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    password_hash   text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    disabled        boolean NOT NULL DEFAULT false,
    role            text NOT NULL DEFAULT 'admin' CONSTRAINT admin_account_role_check CHECK (role IN ('admin', 'viewer'))
);
COMMENT ON TABLE pepsi.admin_account IS 'pepsi-httpd administrators; passwords as Argon2id encoded hashes';
COMMENT ON COLUMN pepsi.admin_account.role IS 'admin: every action; viewer: reads only';

CREATE TABLE pepsi.admin_session (
    digest          bytea PRIMARY KEY CHECK (length(digest) = 32),
    account         text NOT NULL REFERENCES pepsi.admin_account (name) ON DELETE CASCADE,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);
CREATE INDEX admin_session_expires ON pepsi.admin_session (expires_at);
COMMENT ON TABLE pepsi.admin_session IS 'Live pepsi-httpd browser sessions: SHA-256 of the cookie';

CREATE TABLE pepsi.api_token (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    digest          bytea NOT NULL UNIQUE CHECK (length(digest) = 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at      timestamptz,
    role            text NOT NULL DEFAULT 'admin' CONSTRAINT api_token_role_check CHECK (role IN ('admin', 'viewer'))
);
COMMENT ON TABLE pepsi.api_token IS 'Bearer tokens of the pepsi-httpd API: SHA-256 of the token';
COMMENT ON COLUMN pepsi.api_token.role IS 'admin: every action; viewer: reads only';

-- A new token: returned once, stored only as its digest.  The secret is
-- three version-4 UUIDs, 366 random bits (gen_random_uuid() is in core;
-- pgcrypto's gen_random_bytes is not).
CREATE FUNCTION pepsi.api_token_create(name text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text := 'pepsi_' || replace(gen_random_uuid()::text || gen_random_uuid()::text
                                      || gen_random_uuid()::text, '-', '');
BEGIN
    INSERT INTO pepsi.api_token (name, digest) VALUES (api_token_create.name, sha256(convert_to(token, 'UTF8')));
    PERFORM pepsi.event_log_write('api_token_create', jsonb_build_object('name', api_token_create.name));
    RETURN token;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'API token "%" exists already', api_token_create.name
        USING ERRCODE = 'unique_violation',
              HINT = 'Revoke it with pepsi.api_token_revoke(name), or choose another name.';
END
$$;

CREATE FUNCTION pepsi.api_token_revoke(name text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    revoked boolean;
BEGIN
    UPDATE pepsi.api_token t SET revoked_at = now()
    WHERE t.name = api_token_revoke.name AND t.revoked_at IS NULL;
    revoked := FOUND;
    PERFORM pepsi.event_log_write('api_token_revoke',
        jsonb_build_object('name', api_token_revoke.name, 'revoked', revoked));
    RETURN revoked;
END
$$;

-- Set an administrator's password hash (made by pepsi-httpd passwd, which
-- hashes with Argon2id: the password never reaches the server).
CREATE FUNCTION pepsi.admin_account_set(name text, password_hash text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    INSERT INTO pepsi.admin_account AS a (name, password_hash) VALUES (name, password_hash)
    ON CONFLICT ON CONSTRAINT admin_account_pkey
    DO UPDATE SET password_hash = excluded.password_hash, disabled = false;
    -- A new password ends the account's sessions.
    DELETE FROM pepsi.admin_session s WHERE s.account = admin_account_set.name;
    PERFORM pepsi.event_log_write('admin_account_set', jsonb_build_object('name', name));
END
$$;

-- A new token with a role (api_token_create(name) makes an admin's).
CREATE FUNCTION pepsi.api_token_create(name text, role text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text;
BEGIN
    PERFORM pepsi.admin_role_valid(role);
    token := pepsi.api_token_create(name);
    UPDATE pepsi.api_token t SET role = api_token_create.role WHERE t.name = api_token_create.name;
    PERFORM pepsi.event_log_write('api_token_role', jsonb_build_object('name', name, 'role', role));
    RETURN token;
END
$$;

-- Set an administrator's password hash and role.
CREATE FUNCTION pepsi.admin_account_set(name text, password_hash text, role text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    PERFORM pepsi.admin_role_valid(role);
    PERFORM pepsi.admin_account_set(name, password_hash);
    UPDATE pepsi.admin_account a SET role = admin_account_set.role WHERE a.name = admin_account_set.name;
    PERFORM pepsi.event_log_write('admin_account_role', jsonb_build_object('name', name, 'role', role));
END
$$;

INSERT INTO pepsi.grant_owner (name) VALUES ('admin_role_valid'), ('admin_role_check');

-- ---------------------------------------------------------------------------
-- Queue gauges for /metrics
--
-- Counting a million rows by stage and status takes 100 to 250 ms even as
-- an index-only scan (queue_summary), too slow for a scrape.  The counts
-- are kept as a snapshot in queue_gauge: refreshed at every read while a
-- refresh is cheap (a queue under 20,000 messages: the gauges are then
-- live), and by the
-- maintenance worker otherwise, at most every twenty times what a refresh
-- costs (every 5 s for a 250 ms count), so a big queue costs the server
-- a few percent of a core and a scrape reads forty rows.  as_of says how
-- old the snapshot is.
-- ---------------------------------------------------------------------------

CREATE TABLE pepsi.queue_gauge (
    stage               text NOT NULL,
    status              pepsi.status NOT NULL,
    messages            bigint NOT NULL,
    held                bigint NOT NULL,
    oldest_received_at  timestamptz,
    PRIMARY KEY (stage, status)
);
CREATE TABLE pepsi.queue_gauge_refresh (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    refreshed_at    timestamptz,
    duration        interval,
    counted         bigint
);
INSERT INTO pepsi.queue_gauge_refresh DEFAULT VALUES;

-- Recount when the snapshot is older than its period (twenty times the
-- last count's cost, at least min_period), or always when force.  One
-- refresh at a time: a concurrent caller keeps the snapshot it finds.
-- Returns whether it counted.
CREATE FUNCTION pepsi.queue_gauge_refresh(force boolean DEFAULT false,
                                          min_period interval DEFAULT '1 second')
RETURNS boolean AS 'MODULE_PATHNAME', 'queue_gauge_refresh'
LANGUAGE C SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off;

-- The gauges for a scrape: recounted first when a count is cheap (the
-- last one found under 20,000 messages, a few milliseconds of index-only
-- scan) or the snapshot is a minute old (no maintenance worker is
-- refreshing it).
CREATE FUNCTION pepsi.queue_gauges()
RETURNS TABLE (stage text, status pepsi.status, messages bigint, held bigint,
               oldest_age_seconds double precision, as_of timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT pepsi.queue_gauge_refresh(true)
    WHERE coalesce((SELECT r.refreshed_at IS NULL OR r.counted < 20000
                           OR clock_timestamp() - r.refreshed_at > interval '1 minute'
                    FROM pepsi.queue_gauge_refresh r), true);
    SELECT g.stage, g.status, g.messages, g.held,
           extract(epoch FROM now() - g.oldest_received_at)::double precision,
           (SELECT r.refreshed_at FROM pepsi.queue_gauge_refresh r)
    FROM pepsi.queue_gauge g ORDER BY g.stage, g.status;
$$;

-- ---------------------------------------------------------------------------
-- The API's queue reads: a page of the queue and one message, for a role
-- that may not read pepsi.workqueue itself.
-- ---------------------------------------------------------------------------

-- Newest first; before_id pages on; search matches the sender or a
-- recipient (case-insensitive substring).
CREATE FUNCTION pepsi.queue_list(stage text DEFAULT NULL, status pepsi.status DEFAULT NULL,
                                 search text DEFAULT NULL, max_rows integer DEFAULT 100,
                                 before_id bigint DEFAULT NULL)
RETURNS TABLE (id bigint, queue_id text, stage text, status pepsi.status, held boolean,
               received_at timestamptz, age_seconds double precision, retry_at timestamptz,
               mail_from text, rcpt_to text[], size bigint, last_error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT w.id, coalesce(w.state ->> 'queue_id', w.id::text), w.stage, w.status,
           w.status = 'paused' AND w.timeout = 'infinity', w.received_at,
           extract(epoch FROM now() - w.received_at)::double precision,
           CASE WHEN w.timeout < 'infinity' THEN w.timeout END,
           w.mail_from, w.rcpt_to, length(w.headers) + 2 + length(b.body),
           coalesce(w.state ->> 'last_error', w.state ->> 'dispatch_error')
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE (queue_list.stage IS NULL OR w.stage = queue_list.stage)
      AND (queue_list.status IS NULL OR w.status = queue_list.status)
      AND (queue_list.before_id IS NULL OR w.id < queue_list.before_id)
      AND (queue_list.search IS NULL
           OR strpos(lower(w.mail_from), lower(queue_list.search)) > 0
           OR EXISTS (SELECT FROM unnest(w.rcpt_to) r WHERE strpos(lower(r), lower(queue_list.search)) > 0))
    ORDER BY w.id DESC
    LIMIT least(greatest(coalesce(max_rows, 100), 1), 1000)
$$;

CREATE FUNCTION pepsi.queue_message(message_id bigint)
RETURNS TABLE (id bigint, stage text, status pepsi.status, held boolean, received_at timestamptz,
               retry_at timestamptz, mail_from text, rcpt_to text[], sender_key text, state jsonb,
               headers bytea, body_size bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT w.id, w.stage, w.status, w.status = 'paused' AND w.timeout = 'infinity', w.received_at,
           CASE WHEN w.timeout < 'infinity' THEN w.timeout END, w.mail_from, w.rcpt_to, w.sender_key,
           w.state, w.headers, length(b.body)
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE w.id = message_id
$$;

-- pepsi-httpd's section holds its listening address, certificate and
-- database connection: like the listeners, it comes from the file only.
ALTER TABLE pepsi.config_override ADD CONSTRAINT config_override_httpd_file_only
    CHECK (section <> 'httpd');

-- end of pepsi-httpd

-- ===========================================================================
-- Message authentication at ingress (iprev, SPF, DKIM, DMARC, ARC) and the
-- resolver it asks.  Where DNS answers come from (DNS_FORWARDER) and which
-- DNSSEC answers are trusted (DNS_TRUST_ANCHOR) decide every verdict: they
-- are read from the file only (common/config/config.c refuses them too).
-- ===========================================================================

ALTER TABLE pepsi.config_override ADD CONSTRAINT config_override_dns_file_only
    CHECK (NOT (section = 'pepsi' AND option IN ('DNS_FORWARDER', 'DNS_TRUST_ANCHOR'))) NOT VALID;

-- end of message authentication

-- ===========================================================================
-- Dispatcher: worker crashes retry (extension/src/crash.c)
--
-- A row whose worker died is paused and retried, and isolated after
-- CRASH_LIMIT attempts.  workqueue_crashed runs as the owner: it writes
-- the crash_limit entry of pepsi.event_log, which no group role inserts
-- into directly (the entry records the calling role all the same).
-- ===========================================================================

-- The dispatcher's write when a worker died on a row: paused for a retry
-- after retry_seconds, doubled per attempt, with the attempt counted in
-- state.crash; at crash_limit attempts at the same stage, final_status
-- (failed, or timeout for MAX_RUNTIME) with the reason in
-- state.dispatch_error, an event_log entry and dispatch_stats counted.
-- Returns the new status, or NULL if the row is no longer running at
-- expected_stage (the worker committed it before it died).
CREATE FUNCTION pepsi.workqueue_crashed(
    id bigint, expected_stage text, reason text, crash_limit integer,
    retry_seconds double precision, final_status text DEFAULT 'failed')
RETURNS text AS 'MODULE_PATHNAME', 'workqueue_crashed' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

-- end of dispatcher: worker crashes retry

-- ===========================================================================
-- Dispatcher: no queue without maintenance (extension/src/maint.c)
--
-- Without shared_preload_libraries no maintenance worker runs until someone
-- calls start_maintenance(), and one started so is gone after a restart:
-- paused rows would wait for ever.  pepsi-dispatch asks who serves the
-- database, starts a worker when its role may, and otherwise requeues the
-- due rows itself (workqueue_requeue_due), with a warning for the DBA.
-- ===========================================================================

-- The pid of the maintenance worker serving this database, or 0.
CREATE FUNCTION pepsi.maintenance_pid()
RETURNS integer AS 'MODULE_PATHNAME', 'maintenance_pid' LANGUAGE C STRICT VOLATILE;

-- end of dispatcher: no queue without maintenance

-- ===========================================================================
-- The mail log's history of one message
--
-- With [pepsi] MAIL_LOG = yes a delivery stage writes a pepsi.mail_log row
-- per attempt in the statement that commits it (common/delivery/maillog.c);
-- pepsi-queue log <id> reads a row's history by its id.
-- ===========================================================================

CREATE INDEX mail_log_workqueue_id ON pepsi.mail_log (workqueue_id);

-- end of the mail log's history of one message

-- ===========================================================================
-- Ingress in the statistics and the mail log
--
-- Each pepsi-ingress reports its open sessions and its counters every few
-- seconds through ingress_report (one row per running instance, removed
-- when it stops), so /metrics can show ingress sessions beside the queue.
-- With [pepsi] MAIL_LOG = yes, ingress admits through
-- workqueue_add_logged, which writes the "received" row of pepsi.mail_log
-- in the statement that stores the message: the admission is in the log
-- exactly when it is in the queue.  Both run as the owner, so the
-- admission role still writes no table directly.
-- ===========================================================================

CREATE TABLE pepsi.ingress_stats (
    instance        text PRIMARY KEY,
    sessions        integer NOT NULL DEFAULT 0,
    sessions_total  bigint NOT NULL DEFAULT 0,
    messages        bigint NOT NULL DEFAULT 0,
    started_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- SMTP refusals since the instance started, by reply code (web page)
    refusals        jsonb NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE pepsi.ingress_stats IS
    'One row per running pepsi-ingress (host:pid), refreshed every few seconds by pepsi.ingress_report';

-- The instance's row as of now; with stopping, the row goes.  Rows of an
-- instance that died without saying so are past their updated_at: readers
-- ignore rows older than a minute, and each report removes those a day old.
-- What the instance counted since its last report (messages, and refusals:
-- a JSON object of reply code to count since it started) is added to
-- pepsi.ingress_total and pepsi.smtp_refusal, which outlive it.
CREATE FUNCTION pepsi.ingress_report(
    instance text, sessions integer, sessions_total bigint, messages bigint,
    stopping boolean DEFAULT false, refusals jsonb DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    previous pepsi.ingress_stats;
BEGIN
    IF instance IS NULL OR instance !~ '^[[:print:]]{1,255}$' THEN
        RAISE EXCEPTION 'instance must be 1 to 255 printable characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF sessions < 0 OR sessions_total < 0 OR messages < 0 THEN
        RAISE EXCEPTION 'ingress counters cannot be negative'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF refusals IS NOT NULL AND (jsonb_typeof(refusals) <> 'object'
        OR EXISTS (SELECT FROM jsonb_each(refusals) r
                   WHERE r.key !~ '^[45][0-9][0-9]$' OR jsonb_typeof(r.value) <> 'number'
                      OR (r.value #>> '{}') !~ '^[0-9]{1,18}$')) THEN
        RAISE EXCEPTION 'refusals must map three-digit 4xx and 5xx reply codes to counts'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF stopping THEN
        DELETE FROM pepsi.ingress_stats s WHERE s.instance = ingress_report.instance;
        RETURN;
    END IF;
    SELECT * INTO previous FROM pepsi.ingress_stats s WHERE s.instance = ingress_report.instance FOR UPDATE;
    IF ingress_report.messages > coalesce(previous.messages, 0) THEN
        UPDATE pepsi.ingress_total
        SET messages = ingress_total.messages + ingress_report.messages - coalesce(previous.messages, 0),
            updated_at = now();
    END IF;
    INSERT INTO pepsi.smtp_refusal AS t (code, refusals)
    SELECT r.key::integer, r.value::bigint - coalesce((previous.refusals ->> r.key)::bigint, 0)
    FROM jsonb_each_text(coalesce(refusals, '{}')) r
    WHERE r.value::bigint > coalesce((previous.refusals ->> r.key)::bigint, 0)
    ORDER BY 1
    ON CONFLICT ON CONSTRAINT smtp_refusal_pkey DO UPDATE
        SET refusals = t.refusals + EXCLUDED.refusals, updated_at = now();
    INSERT INTO pepsi.ingress_stats AS s (instance, sessions, sessions_total, messages, refusals)
    VALUES (ingress_report.instance, ingress_report.sessions, ingress_report.sessions_total,
            ingress_report.messages, coalesce(refusals, '{}'))
    ON CONFLICT ON CONSTRAINT ingress_stats_pkey DO UPDATE
        SET sessions = EXCLUDED.sessions, sessions_total = EXCLUDED.sessions_total,
            messages = EXCLUDED.messages, refusals = EXCLUDED.refusals, updated_at = now();
    DELETE FROM pepsi.ingress_stats s WHERE s.updated_at < now() - interval '1 day';
END
$$;

-- workqueue_add, and the mail log's "received" row (detail: what the
-- ingress log line says) in the same statement.
CREATE FUNCTION pepsi.workqueue_add_logged(
    mail_from text, rcpt_to text[], headers bytea, body bytea,
    state jsonb, client_address inet, auth_account text, stage text, log_detail jsonb)
RETURNS bigint AS 'MODULE_PATHNAME', 'workqueue_add_logged' LANGUAGE C CALLED ON NULL INPUT;

-- end of ingress in the statistics and the mail log

-- ===========================================================================
-- Relay to the internet: the dns_address cache and per-destination
-- scheduling (stages/relay-to-internet)
--
-- pepsi.dns_address holds the addresses of MX hosts with their TTL and
-- connect health; every relay worker reads it before connecting and
-- reports what it saw, so one worker's failure steers the others.
-- pepsi.destination holds what belongs to a destination (a recipient
-- domain) rather than to each message: the operator's limits, its
-- consecutive connection failures and the backoff they started, and the
-- concurrency window a refusing destination narrowed.  A worker holds one
-- of the destination's concurrency slots (a session advisory lock, so a
-- worker that dies frees it) while it delivers.
-- ===========================================================================

CREATE TABLE pepsi.destination (
    domain              text PRIMARY KEY CHECK (domain = lower(domain) AND domain <> ''),
    concurrency_limit   integer CHECK (concurrency_limit BETWEEN 1 AND 10000),
    messages_per_minute integer CHECK (messages_per_minute BETWEEN 1 AND 100000000),
    failures            integer NOT NULL DEFAULT 0,
    backoff_until       timestamptz,
    last_error          text,
    last_success        timestamptz,
    window_limit        integer,
    next_turn           timestamptz,
    service_seconds     double precision,
    rate_tokens         double precision,
    rate_updated        timestamptz,
    tls_policy          text,
    tls_outcome         text,
    tls_at              timestamptz
);
COMMENT ON TABLE pepsi.destination IS
    'Per-destination limits (set with pepsi.destination_set_limits) and health, kept by pepsi-stage-relay-to-internet';
COMMENT ON COLUMN pepsi.destination.tls_policy IS
    'The TLS policy the last delivery here was made under: dane, dane-encrypt, sts enforce, sts testing or opportunistic';
COMMENT ON COLUMN pepsi.destination.tls_outcome IS
    'What that policy gave: e.g. "dane verified (usage 3)", "opportunistic unverified", or why it failed';
COMMENT ON COLUMN pepsi.destination.tls_at IS
    'When tls_policy and tls_outcome were last written (only a change is written)';

-- The advisory-lock key of a destination's concurrency slot (the bigint
-- form, which nothing else in Pepsi uses).
CREATE FUNCTION pepsi.destination_slot_key(domain text, slot integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (hashtext(lower(domain))::bigint << 32) | slot::bigint
$$;

-- The addresses of these MX hosts not past their TTL, with their health
-- (retry_in: seconds before a failed address is tried again, 0 if now).
CREATE FUNCTION pepsi.dns_address_current(hosts text[])
RETURNS TABLE (host text, address text, failures integer, retry_in double precision)
LANGUAGE sql STABLE STRICT AS $$
    SELECT a.host, host(a.address), a.failures,
           greatest(0, coalesce(extract(epoch FROM a.next_retry - now()), 0))::float8
    FROM pepsi.dns_address a
    WHERE a.host = ANY (hosts) AND a.expires_at > now()
    ORDER BY a.host, a.failures, a.address
$$;

-- A host's addresses as the DNS just gave them, valid for ttl_seconds:
-- addresses it no longer has go, the health of those it kept stays.
CREATE FUNCTION pepsi.dns_address_store(host text, addresses inet[], ttl_seconds integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF host IS NULL OR host = '' OR addresses IS NULL THEN
        RAISE EXCEPTION 'dns_address_store needs a host and its addresses'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    DELETE FROM pepsi.dns_address a
    WHERE a.host = dns_address_store.host AND a.address <> ALL (addresses);
    INSERT INTO pepsi.dns_address AS a (host, address, expires_at)
    SELECT dns_address_store.host, x, now() + make_interval(secs => greatest(coalesce(ttl_seconds, 0), 0))
    FROM unnest(addresses) AS x
    ON CONFLICT ON CONSTRAINT dns_address_pkey DO UPDATE SET expires_at = EXCLUDED.expires_at;
END
$$;

-- May a worker deliver to domain now?  A slot (hold it until
-- destination_end), or the seconds to wait and why: the destination is
-- backing off, or at its concurrency or rate limit.
--
-- One call is all a healthy delivery asks of the database besides its
-- row, so it also answers what the worker would otherwise ask apart:
-- contended (the destination has more takers than connections), the
-- current addresses of its MX hosts (hosts) as dns_address_current gives
-- them, as a jsonb array of {host, address, failures, retry_in}, and the
-- domain's cached MTA-STS policy (sts_policy_id, sts_policy), and the TLS
-- result last recorded for it (tls_policy, tls_outcome: a worker whose
-- delivery got the same has nothing to write in destination_end), and
-- per_message: whether each message must ask for its turn (the domain
-- has a rate limit, or is slow and capped to a share of the workers);
-- when not, a worker may deliver the rest of its batch's messages to the
-- domain under the slot it holds, without asking again.  And it ends
-- the worker's previous delivery, which reached its destination and kept
-- its slot (previous_*, as destination_end's 'connected' takes them):
-- its slot is freed first, so that to the same domain this delivery
-- takes it again and the session that holds the connection carries it.
CREATE FUNCTION pepsi.destination_begin(domain text, default_concurrency integer,
    hosts text[] DEFAULT NULL, previous_domain text DEFAULT NULL, previous_slot integer DEFAULT NULL,
    previous_host text DEFAULT NULL, previous_address inet DEFAULT NULL,
    previous_seconds double precision DEFAULT NULL,
    slow_seconds double precision DEFAULT NULL, slow_limit integer DEFAULT NULL,
    handoff_seconds double precision DEFAULT NULL, stage text DEFAULT NULL,
    OUT slot integer, OUT wait_seconds double precision, OUT reason text,
    OUT contended boolean, OUT addresses jsonb, OUT sts_policy_id text, OUT sts_policy text,
    OUT tls_policy text, OUT tls_outcome text, OUT per_message boolean)
AS 'MODULE_PATHNAME', 'destination_begin' LANGUAGE C;

-- The end of a delivery to domain: the slot is freed and what was seen
-- recorded.  outcome: 'connected' (a host took the session), 'unreachable'
-- (no address of any MX could be reached: the destination's consecutive
-- failures grow, and from backoff_after on it backs off as a whole,
-- backoff_base doubling up to backoff_max seconds), 'busy' (refused while
-- other workers deliver to it: its concurrency window narrows to those).
-- failed_hosts/failed_addresses are the addresses that did not answer,
-- ok_host/ok_address the one that did; seconds, how long the delivery
-- took (kept as the pace of a destination that has a queue of waiters);
-- tls_policy and tls_outcome, the TLS policy the delivery was made under
-- and what it gave (NULL: not known), written only when they change.
-- Returns whether the destination is contended.
CREATE FUNCTION pepsi.destination_end(domain text, slot integer, outcome text, error text,
    ok_host text, ok_address inet, failed_hosts text[], failed_addresses inet[],
    backoff_after integer, backoff_base double precision, backoff_max double precision,
    seconds double precision DEFAULT NULL, tls_policy text DEFAULT NULL, tls_outcome text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    active integer;
BEGIN
    IF domain IS NULL OR outcome IS NULL OR outcome NOT IN ('connected', 'unreachable', 'busy') THEN
        RAISE EXCEPTION 'destination_end needs a domain and an outcome of connected, unreachable or busy'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    domain := lower(domain);
    IF slot IS NOT NULL THEN
        PERFORM pg_advisory_unlock(pepsi.destination_slot_key(domain, slot));
    END IF;
    IF cardinality(failed_addresses) > 0 THEN
        UPDATE pepsi.dns_address a
        SET failures = a.failures + 1, last_failure = now(),
            next_retry = now() + make_interval(secs => least(60 * 2 ^ least(a.failures, 10), 3600))
        FROM unnest(failed_hosts, failed_addresses) AS f (host, address)
        WHERE a.host = f.host AND a.address = f.address;
    END IF;
    IF ok_address IS NOT NULL THEN
        -- Skipped while another worker is writing the same news: every
        -- worker that reaches the host may be here at once, and none
        -- should wait for another's commit to say it again.
        UPDATE pepsi.dns_address a
        SET failures = 0, next_retry = NULL, last_success = now()
        WHERE (a.host, a.address) IN (
            SELECT b.host, b.address FROM pepsi.dns_address b
            WHERE b.host = ok_host AND b.address = ok_address
              AND (b.failures > 0 OR b.last_success IS NULL OR b.last_success < now() - interval '1 minute')
            FOR UPDATE SKIP LOCKED);
    END IF;
    IF outcome = 'connected' THEN
        -- Written only when there is something to clear or widen, so a
        -- healthy destination costs no write per message; and not while
        -- another worker writes it (its news is the same).
        UPDATE pepsi.destination t
        SET failures = 0, backoff_until = NULL, last_success = now(),
            service_seconds = CASE WHEN seconds IS NULL THEN t.service_seconds
                                   ELSE coalesce(0.8 * t.service_seconds + 0.2 * seconds, seconds) END,
            window_limit = CASE WHEN t.window_limit IS NULL THEN NULL
                                WHEN random() * t.window_limit * 4 >= 1 THEN t.window_limit
                                ELSE t.window_limit + 1 END,
            tls_policy = coalesce(destination_end.tls_policy, t.tls_policy),
            tls_outcome = CASE WHEN destination_end.tls_policy IS NULL THEN t.tls_outcome
                               ELSE destination_end.tls_outcome END,
            tls_at = CASE WHEN destination_end.tls_policy IS NULL THEN t.tls_at ELSE now() END
        WHERE t.domain IN (
            SELECT u.domain FROM pepsi.destination u
            WHERE u.domain = destination_end.domain
              AND (u.failures > 0 OR u.window_limit IS NOT NULL
                   OR u.next_turn > now() - interval '1 minute'
                   OR u.last_success IS NULL OR u.last_success < now() - interval '1 minute'
                   OR (destination_end.tls_policy IS NOT NULL
                       AND (u.tls_policy IS DISTINCT FROM destination_end.tls_policy
                            OR u.tls_outcome IS DISTINCT FROM destination_end.tls_outcome)))
            FOR UPDATE SKIP LOCKED);
        -- A healthy destination has no row until it has a TLS result to keep.
        -- Written by one worker at a time, the others skipping it: every
        -- worker that starts on a new domain at once (a list's fan-out,
        -- grouped by domain) finds no row, and each INSERT would wait for
        -- the first one's commit to find its conflict (6.9 ms a call,
        -- bench/list) only to write nothing.  The lock is the two-key
        -- form, which no slot (destination_slot_key) uses.
        IF NOT FOUND AND destination_end.tls_policy IS NOT NULL
           AND pg_try_advisory_xact_lock(hashtext('pepsi.destination_end'), hashtext(domain)) THEN
            INSERT INTO pepsi.destination AS t (domain, last_success, tls_policy, tls_outcome, tls_at)
            VALUES (domain, now(), destination_end.tls_policy, destination_end.tls_outcome, now())
            ON CONFLICT ON CONSTRAINT destination_pkey DO NOTHING;
        END IF;
    ELSIF outcome = 'busy' THEN
        SELECT count(*) INTO active FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = ((pepsi.destination_slot_key(domain, 0) >> 32) & 4294967295)::oid;
        INSERT INTO pepsi.destination AS t (domain, window_limit, last_error, tls_policy, tls_outcome, tls_at)
        VALUES (domain, greatest(active, 1), error, destination_end.tls_policy, destination_end.tls_outcome,
                CASE WHEN destination_end.tls_policy IS NOT NULL THEN now() END)
        ON CONFLICT ON CONSTRAINT destination_pkey DO UPDATE
        SET window_limit = greatest(least(coalesce(t.window_limit, EXCLUDED.window_limit), EXCLUDED.window_limit), 1),
            last_error = EXCLUDED.last_error,
            tls_policy = coalesce(EXCLUDED.tls_policy, t.tls_policy),
            tls_outcome = CASE WHEN EXCLUDED.tls_policy IS NULL THEN t.tls_outcome ELSE EXCLUDED.tls_outcome END,
            tls_at = coalesce(EXCLUDED.tls_at, t.tls_at);
    ELSE
        INSERT INTO pepsi.destination AS t (domain, failures, last_error, backoff_until, tls_policy, tls_outcome,
                                            tls_at)
        VALUES (domain, 1, error,
                CASE WHEN backoff_after <= 1
                     THEN now() + make_interval(secs => least(backoff_base, backoff_max) * (0.9 + 0.2 * random())) END,
                destination_end.tls_policy, destination_end.tls_outcome,
                CASE WHEN destination_end.tls_policy IS NOT NULL THEN now() END)
        ON CONFLICT ON CONSTRAINT destination_pkey DO UPDATE
        SET failures = t.failures + 1, last_error = EXCLUDED.last_error,
            tls_policy = coalesce(EXCLUDED.tls_policy, t.tls_policy),
            tls_outcome = CASE WHEN EXCLUDED.tls_policy IS NULL THEN t.tls_outcome ELSE EXCLUDED.tls_outcome END,
            tls_at = coalesce(EXCLUDED.tls_at, t.tls_at),
            backoff_until = CASE WHEN t.failures + 1 >= backoff_after
                THEN now() + make_interval(secs => least(backoff_base * 2 ^ least(t.failures + 1 - backoff_after, 20),
                                                         backoff_max) * (0.9 + 0.2 * random()))
                END;
    END IF;
    -- Is the destination contended (its window narrowed, or messages
    -- queued for a turn)?  Then the worker does not keep its session to
    -- it open idle, holding a connection the destination counts.
    RETURN EXISTS (SELECT 1 FROM pepsi.destination t
                   WHERE t.domain = destination_end.domain
                     AND (t.window_limit IS NOT NULL OR t.next_turn > now() - interval '10 seconds'));
END
$$;

-- The operator's limits for a destination (NULL: the default; both NULL
-- drops the row's limits).  Audited in pepsi.event_log.
CREATE FUNCTION pepsi.destination_set_limits(domain text, concurrency_limit integer,
    messages_per_minute integer)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF domain IS NULL OR domain = '' OR domain <> lower(domain) OR domain ~ '[[:space:][:cntrl:]@]' THEN
        RAISE EXCEPTION 'invalid destination domain "%"', domain
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give the recipient domain in lower case, in its A-label (xn--) form if it is an IDN.';
    END IF;
    IF concurrency_limit IS NOT NULL AND concurrency_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'concurrency_limit must be between 1 and 10000, not %', concurrency_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF messages_per_minute IS NOT NULL AND messages_per_minute NOT BETWEEN 1 AND 100000000 THEN
        RAISE EXCEPTION 'messages_per_minute must be between 1 and 100000000, not %', messages_per_minute
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL removes the rate limit.';
    END IF;
    INSERT INTO pepsi.destination AS t (domain, concurrency_limit, messages_per_minute)
    VALUES (domain, concurrency_limit, messages_per_minute)
    ON CONFLICT ON CONSTRAINT destination_pkey DO UPDATE
    SET concurrency_limit = EXCLUDED.concurrency_limit,
        messages_per_minute = EXCLUDED.messages_per_minute,
        rate_tokens = NULL, rate_updated = NULL;
    INSERT INTO pepsi.event_log (action, detail)
    VALUES ('destination_set_limits', jsonb_build_object('domain', domain,
            'concurrency_limit', concurrency_limit, 'messages_per_minute', messages_per_minute));
END
$$;

-- An operator's way to end a destination's backoff at once (after fixing it).
CREATE FUNCTION pepsi.destination_reset(domain text)
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    found_it boolean;
BEGIN
    UPDATE pepsi.destination t SET failures = 0, backoff_until = NULL, window_limit = NULL
    WHERE t.domain = lower(destination_reset.domain);
    found_it := FOUND;
    INSERT INTO pepsi.event_log (action, detail)
    VALUES ('destination_reset', jsonb_build_object('domain', lower(domain)));
    RETURN found_it;
END
$$;

-- end of relay to the internet

-- ===========================================================================
-- Backscatter caps: one DSN per message and kind, DSNs per sender per hour
--
-- The delivery stages work on one recipient per row, so the recipients of
-- one message that fail together reach the bounce stage as separate rows.
-- pepsi.bounce_gather() lets the bounce stage answer them with one DSN:
-- the first row of a message whose siblings are still on their way waits
-- a short window as the group's leader; siblings that arrive meanwhile
-- wait behind it; when the leader runs again it takes every sibling
-- waiting at its stage for the same kind of report into its own state
-- (state.bounce_gathered) and deletes them, in one transaction, so a
-- crash loses no report.  A recipient that fails later (after a retry)
-- gets a DSN of its own, as RFC 3461 allows.  Siblings are the rows of
-- one admission: same sender, arrival time and body.
--
-- pepsi.dsn_rate_take() counts the DSNs sent to one address per clock
-- hour; past the limit the bounce stage drops the DSN, and each drop is
-- recorded in pepsi.event_log.
-- ===========================================================================

-- Returns {"action": "wait", "seconds": s, "bounce_gather": {...}} (pause
-- that long, merging bounce_gather into the state) or {"action": "report",
-- "gathered": [{"rcpt_to": [...], "bounce": {...}, "delivery": {...},
-- "dsn_rcpt": [...]}]}:
-- the siblings this row now answers for, besides its own recipients.
-- at_stage is the bounce stage running the row (the row may still be at
-- the delivery stage in the database when the bounce stage runs fused).
CREATE FUNCTION pepsi.bounce_gather(row_id bigint, at_stage text, window_seconds float8) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    me pepsi.workqueue;
    report_kind text;
    leader_until float8;
    now_epoch float8 := extract(epoch FROM clock_timestamp());
    gathered jsonb;
BEGIN
    SELECT * INTO me FROM pepsi.workqueue w WHERE w.id = row_id FOR UPDATE;
    IF NOT FOUND OR me.status <> 'running' THEN
        RAISE EXCEPTION 'row % is not running', row_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Only the stage that holds a row may gather its siblings.';
    END IF;
    IF window_seconds IS NULL OR window_seconds < 0 OR window_seconds > 3600 THEN
        RAISE EXCEPTION 'window_seconds must be between 0 and 3600'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    gathered := coalesce(me.state->'bounce_gathered', '[]');
    IF me.body_id IS NULL OR me.mail_from = '' THEN
        RETURN jsonb_build_object('action', 'report', 'gathered', gathered);
    END IF;
    report_kind := coalesce(me.state->'bounce'->>'kind', 'permanent');
    -- One decision at a time per message: two siblings never both lead.
    PERFORM pg_advisory_xact_lock(hashtextextended('pepsi.bounce_gather/' || me.body_id::text, 0));

    IF me.state->'bounce_gather' IS NULL AND window_seconds > 0 THEN
        SELECT max((w.state->'bounce_gather'->>'until')::float8) INTO leader_until
        FROM pepsi.workqueue w
        WHERE w.body_id = me.body_id AND w.id <> me.id
          AND w.mail_from = me.mail_from AND w.received_at = me.received_at
          AND coalesce(w.state->'bounce'->>'kind', 'permanent') = report_kind
          AND w.state->'bounce_gather'->>'role' = 'leader'
          AND w.status IN ('pending', 'paused', 'running');
        IF leader_until > now_epoch THEN
            me.state := me.state || jsonb_build_object('bounce_gather',
                jsonb_build_object('role', 'follower', 'until', leader_until + 1));
            UPDATE pepsi.workqueue w SET state = me.state WHERE w.id = me.id;
            RETURN jsonb_build_object('action', 'wait', 'seconds', leader_until + 1 - now_epoch,
                                      'bounce_gather', me.state->'bounce_gather');
        END IF;
        IF EXISTS (SELECT FROM pepsi.workqueue w
                   WHERE w.body_id = me.body_id AND w.id <> me.id
                     AND w.mail_from = me.mail_from AND w.received_at = me.received_at
                     AND w.status IN ('pending', 'running')
                     AND (w.stage <> at_stage OR w.state->'bounce_gather' IS NULL)) THEN
            me.state := me.state || jsonb_build_object('bounce_gather',
                jsonb_build_object('role', 'leader', 'until', now_epoch + window_seconds));
            UPDATE pepsi.workqueue w SET state = me.state WHERE w.id = me.id;
            RETURN jsonb_build_object('action', 'wait', 'seconds', window_seconds,
                                      'bounce_gather', me.state->'bounce_gather');
        END IF;
    END IF;

    WITH taken AS (
        DELETE FROM pepsi.workqueue w
        WHERE w.id IN (SELECT s.id FROM pepsi.workqueue s
                       WHERE s.body_id = me.body_id AND s.id <> me.id AND s.stage = at_stage
                         AND s.mail_from = me.mail_from AND s.received_at = me.received_at
                         AND coalesce(s.state->'bounce'->>'kind', 'permanent') = report_kind
                         AND s.status IN ('pending', 'paused')
                       ORDER BY s.id
                       FOR UPDATE SKIP LOCKED)
        RETURNING w.id, w.rcpt_to, w.state)
    SELECT gathered || coalesce(jsonb_agg(x.entry ORDER BY x.id), '[]')
    INTO gathered
    FROM (SELECT t.id, jsonb_build_object('rcpt_to', to_jsonb(t.rcpt_to),
                                          'bounce', coalesce(t.state->'bounce', '{}'),
                                          'delivery', t.state->'delivery',
                                          'dsn_rcpt', t.state->'dsn'->'rcpt') AS entry
          FROM taken t
          UNION ALL
          SELECT t.id, e.entry FROM taken t,
                 jsonb_array_elements(coalesce(t.state->'bounce_gathered', '[]')) AS e (entry)) x;
    IF gathered <> coalesce(me.state->'bounce_gathered', '[]') THEN
        UPDATE pepsi.workqueue w
        SET state = w.state || jsonb_build_object('bounce_gathered', gathered)
        WHERE w.id = me.id;
    END IF;
    RETURN jsonb_build_object('action', 'report', 'gathered', gathered);
END
$$;

CREATE TABLE pepsi.dsn_rate (
    sender  text PRIMARY KEY,
    hour    timestamptz NOT NULL,
    sent    integer NOT NULL
);
COMMENT ON TABLE pepsi.dsn_rate IS 'DSNs sent to each address in the current clock hour (pepsi.dsn_rate_take)';

-- Count one DSN to sender; false (and an event_log entry) past per_hour.
CREATE FUNCTION pepsi.dsn_rate_take(sender text, per_hour integer) RETURNS boolean
AS 'MODULE_PATHNAME', 'dsn_rate_take'
LANGUAGE C SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp;

-- end of backscatter caps

-- ===========================================================================
-- Vacation: RFC 3834 automatic replies (stages/vacation, common/message/autoreply.c)
--
-- An account's owner sets a vacation notice for their own address with
-- pepsi.vacation_set: rows of the per-address settings (pepsi.settings:
-- VACATION, VACATION_MESSAGE, VACATION_SUBJECT, VACATION_INTERVAL), each
-- value checked, the change audited.  pepsi.autoreply_sent remembers when
-- a responder last answered a sender, so that a sender gets at most one
-- reply per interval; the stage checks and records it in the very
-- statement that injects the reply (pepsi.autoreply_due), and the table
-- is the owner's alone.
-- ===========================================================================

CREATE TABLE pepsi.autoreply_sent (
    responder   text NOT NULL,
    recipient   text NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now(),
    keep_until  timestamptz,
    PRIMARY KEY (responder, recipient)
);
CREATE INDEX autoreply_sent_keep_until ON pepsi.autoreply_sent (keep_until);
COMMENT ON TABLE pepsi.autoreply_sent IS
    'When an automatic responder (a vacation notice) last answered a sender (RFC 3834: once per interval)';

-- Is a reply from responder to recipient due (none within every)?  If so,
-- it is recorded as sent now.  Concurrent callers for one pair: one wins.
CREATE FUNCTION pepsi.autoreply_due(responder text, recipient text, every interval) RETURNS boolean
AS 'MODULE_PATHNAME', 'autoreply_due'
LANGUAGE C SET search_path = pg_catalog, pepsi, pg_temp;

-- Set the vacation notice of address: message (its text), subject (NULL:
-- "Auto: " and the original subject), every (one reply per sender in that
-- time, RFC 3834's default of 7 days).  A new notice answers everyone
-- afresh.  Audited in pepsi.event_log.
CREATE FUNCTION pepsi.vacation_set(address text, message text, subject text DEFAULT NULL,
                                   every interval DEFAULT '7 days') RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := pepsi.virtual_mailbox_canonical(address);
    seconds bigint;
BEGIN
    IF message IS NULL OR btrim(message) = '' THEN
        RAISE EXCEPTION 'a vacation notice needs a message'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(message) > 10000 OR message ~ '[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]' THEN
        RAISE EXCEPTION 'invalid vacation message'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A message is text of at most 10000 bytes: lines, tabs, no other control character.';
    END IF;
    IF subject IS NOT NULL AND (subject ~ '[[:cntrl:]]' OR length(subject) > 200) THEN
        RAISE EXCEPTION 'invalid vacation subject'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A subject is one line of at most 200 characters.';
    END IF;
    IF every IS NULL OR every < interval '1 second' OR every > interval '365 days' THEN
        RAISE EXCEPTION 'invalid vacation interval %', every
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'One reply per sender in at least a second and at most 365 days.';
    END IF;
    seconds := ceil(extract(epoch FROM every));
    INSERT INTO pepsi.settings AS s (address, option, value)
    VALUES (canonical, 'VACATION', 'yes'), (canonical, 'VACATION_MESSAGE', message),
           (canonical, 'VACATION_INTERVAL', seconds || 's')
    ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
    IF subject IS NULL THEN
        DELETE FROM pepsi.settings s WHERE s.address = canonical AND s.option = 'VACATION_SUBJECT';
    ELSE
        INSERT INTO pepsi.settings AS s (address, option, value)
        VALUES (canonical, 'VACATION_SUBJECT', subject)
        ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
    END IF;
    DELETE FROM pepsi.autoreply_sent a WHERE a.responder = canonical;
    PERFORM pepsi.event_log_write('vacation_set',
        jsonb_build_object('address', canonical, 'subject', subject, 'interval_seconds', seconds));
END
$$;

-- End the vacation notice of address; false if there was none.  Audited.
CREATE FUNCTION pepsi.vacation_unset(address text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := pepsi.virtual_mailbox_canonical(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.settings s
    WHERE s.address = canonical
      AND s.option IN ('VACATION', 'VACATION_MESSAGE', 'VACATION_SUBJECT', 'VACATION_INTERVAL');
    removed := FOUND;
    DELETE FROM pepsi.autoreply_sent a WHERE a.responder = canonical;
    PERFORM pepsi.event_log_write('vacation_unset',
        jsonb_build_object('address', canonical, 'removed', removed));
    RETURN removed;
END
$$;

-- end of vacation

-- ===========================================================================
-- MTA-STS policy cache
--
-- The MTA-STS policies (RFC 8461) pepsi-stage-relay-to-internet fetched
-- over HTTPS (common/smtp/mta_sts.c), one row per recipient domain, kept for the
-- policy's max_age and shared by every relay worker.  Stages read and write
-- it only through the two functions below; pepsi_monitor may read it.
-- ===========================================================================

CREATE TABLE pepsi.mta_sts_policy (
    domain     text PRIMARY KEY,
    policy_id  text NOT NULL,
    mode       text NOT NULL,
    policy     text NOT NULL,
    max_age    integer NOT NULL,
    fetched_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT mta_sts_policy_domain_form CHECK (domain = lower(domain) AND domain ~ '^[a-z0-9_.-]{1,253}$'),
    CONSTRAINT mta_sts_policy_id_form CHECK (policy_id ~ '^[A-Za-z0-9]{1,32}$'),
    CONSTRAINT mta_sts_policy_mode_form CHECK (mode IN ('enforce', 'testing', 'none')),
    CONSTRAINT mta_sts_policy_size CHECK (octet_length(policy) <= 65536),
    CONSTRAINT mta_sts_policy_max_age_range CHECK (max_age BETWEEN 0 AND 31557600)
);
COMMENT ON TABLE pepsi.mta_sts_policy IS
    'MTA-STS policies (RFC 8461) fetched by the relay, each kept until expires_at; written through mta_sts_policy_put';

-- The cached policy of a domain, if it has not expired.
CREATE FUNCTION pepsi.mta_sts_policy_get(domain text)
RETURNS TABLE (policy_id text, mode text, policy text, expires_at timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT p.policy_id, p.mode, p.policy, p.expires_at FROM pepsi.mta_sts_policy p
    WHERE p.domain = lower(mta_sts_policy_get.domain) AND p.expires_at > now()
$$;

-- Store a freshly fetched policy for its max_age (replacing the one before).
CREATE FUNCTION pepsi.mta_sts_policy_put(domain text, policy_id text, mode text, policy text,
                                         max_age integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF domain IS NULL OR policy_id IS NULL OR mode IS NULL OR policy IS NULL OR max_age IS NULL THEN
        RAISE EXCEPTION 'no argument of mta_sts_policy_put may be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_age < 0 OR max_age > 31557600 THEN
        RAISE EXCEPTION 'max_age % is out of range', max_age
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'RFC 8461 section 3.2 allows 0 to 31557600 seconds.';
    END IF;
    INSERT INTO pepsi.mta_sts_policy AS p (domain, policy_id, mode, policy, max_age, fetched_at, expires_at)
    VALUES (lower(domain), policy_id, mode, policy, max_age, now(), now() + make_interval(secs => max_age))
    ON CONFLICT ON CONSTRAINT mta_sts_policy_pkey DO UPDATE
        SET policy_id = EXCLUDED.policy_id, mode = EXCLUDED.mode, policy = EXCLUDED.policy,
            max_age = EXCLUDED.max_age, fetched_at = EXCLUDED.fetched_at, expires_at = EXCLUDED.expires_at;
    RETURN true;
END
$$;

-- end of MTA-STS policy cache

-- ===========================================================================
-- Message bodies: lz4 compression
--
-- A body is written once (at admission, or when a stage rewrites it) and
-- read whole by every stage that loads it (Load::Full: signing, sealing,
-- every relay).  The server's default compression, pglz, is slow both
-- ways: with 100 KB bodies it made the admission statement cost 1.44 ms
-- of the backend's time per message against 0.26 ms with lz4, and a load
-- 0.31 ms against 0.22 ms (pg_stat_statements over 2,000 messages of
-- bench/dkim-sign).  lz4 compresses text about as well, and gives up
-- quickly on what does not compress (attachments already encoded), which
-- is then stored as it is.  Existing bodies keep their compression (both
-- are read alike); a server built without lz4 keeps pglz.
-- ===========================================================================

DO $$
BEGIN
    EXECUTE 'ALTER TABLE pepsi.workqueue_body ALTER COLUMN body SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'pepsi.workqueue_body.body keeps the server''s default compression: %', SQLERRM;
END
$$;

-- end of message bodies: lz4 compression

-- ===========================================================================
-- Vacation: pruning pepsi.autoreply_sent (extension/src/maint.c)
--
-- A row of pepsi.autoreply_sent only matters until its interval has passed:
-- after that the next message from the sender gets a reply anyway.  The
-- row now keeps that time (keep_until), and pepsi.autoreply_prune, which
-- the maintenance worker calls with its other sweeps, deletes the rows
-- past it, so the table holds the senders of one interval, not of ever.
-- (A row without keep_until goes once it is older than the longest
-- interval vacation_set allows, 365 days.)
-- ===========================================================================

-- Delete at most batch rows of pepsi.autoreply_sent whose interval has
-- passed; returns how many went.
CREATE FUNCTION pepsi.autoreply_prune(batch integer DEFAULT 10000) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned integer;
BEGIN
    IF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pepsi.autoreply_sent a
    WHERE (a.responder, a.recipient) IN
          (SELECT o.responder, o.recipient FROM pepsi.autoreply_sent o
           WHERE o.keep_until < now()
              OR (o.keep_until IS NULL AND o.sent_at < now() - interval '365 days')
           LIMIT batch
           FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

-- end of pruning pepsi.autoreply_sent

-- ===========================================================================
-- Relay to the internet: a slow destination capped only while other mail
-- waits, and the waiter ticket's key named
--
-- A slow destination's share of the workers (slow_limit) protects the
-- other destinations' mail; when there is none, the slow destination may
-- use what its concurrency limit allows.  destination_begin takes the
-- stage (stage, NULL: only the other destinations' slots tell) to look
-- at the first rows of it not yet done.  The waiter ticket's advisory key
-- comes from pepsi.destination_waiter_key, as the slot's does from
-- destination_slot_key.  And the previous delivery a begin ends costs no
-- call of destination_end when there is nothing to record.
-- ===========================================================================

-- The advisory-lock key of a waiter ticket of domain (destination_begin
-- waiting in place for a slot), apart from the slots' keys.
CREATE FUNCTION pepsi.destination_waiter_key(domain text, ticket integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (hashtext(lower(domain) || ' waiting')::bigint << 32) | ticket::bigint
$$;

-- end of a slow destination capped only while other mail waits

-- ===========================================================================
-- pepsi-status names a transaction holding back the xmin horizon
--
-- The maintenance worker's warning (pepsi.snapshot_warning) goes to the
-- server log, which only the DBA reads; an operator running pepsi-status
-- sees the same condition there: who (pid, program, state, user, client),
-- since when, for how long.  Not the statement, which may be another
-- role's and hold what only that role may read.  The function runs as
-- the owner so that pepsi_monitor sees other roles' sessions.
-- ===========================================================================

CREATE FUNCTION pepsi.held_horizon(
    OUT pid integer, OUT program text, OUT state text, OUT usename text, OUT client text,
    OUT xact_start timestamptz, OUT seconds integer)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'held_horizon' LANGUAGE C STRICT VOLATILE;

-- end of pepsi-status names a transaction holding back the xmin horizon

-- ===========================================================================
-- A bulk worker's database session at the worker's own CPU priority
--
-- pepsi-dispatch runs a batching stage's workers other than its light lane
-- at a higher nice value (BULK_NICE), so that on a busy machine the lane's
-- processes get the CPU first.  Most of a row's CPU is spent in the
-- worker's database session, which would keep the server's priority: the
-- worker passes its nice value on with pepsi.session_nice.  It only raises
-- the calling backend's own value (0 to 19), never another's, never lower.
-- ===========================================================================

CREATE FUNCTION pepsi.session_nice(nice integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'session_nice' LANGUAGE C STRICT VOLATILE;

-- end of a bulk worker's database session at the worker's own CPU priority

-- ===========================================================================
-- Backups keep the mail
--
-- pg_dump leaves out the rows of an extension's tables unless the
-- extension registers them with pg_extension_config_dump: without this a
-- dump restored with pg_restore gave back an empty queue, no bodies, no
-- administrators and no settings.  Every table that holds the
-- installation's state is registered, whole or through a filter, and so is
-- every sequence that numbers its rows, so that a restored sequence is
-- past the ids and pending_seq values of the restored rows (the claim
-- reads pending rows by pending_seq, extension/src/sendercache.c).
--
-- Not registered: what CREATE EXTENSION writes itself (the grant policy,
-- the seeded singletons dispatch_stats and queue_gauge_refresh, whose
-- counters start again), and what is only a cache of the moment:
-- dns_address (looked up again), queue_gauge (recounted), ingress_stats
-- (live processes), dsn_rate (this hour's DSN counts).  docs/backup.md
-- says what a restore keeps.
--
-- pepsi.schema_version holds the version whose schema the rows are in.
-- CREATE EXTENSION writes its row; a restore's COPY brings the dump's row,
-- which the trigger drops when the versions agree and refuses, saying what
-- to do, when they differ: the other rows would not fit this schema.
-- Every later upgrade script updates the row.
-- ===========================================================================

CREATE TABLE pepsi.schema_version (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version     text NOT NULL
);
COMMENT ON TABLE pepsi.schema_version IS
    'The pepsi version whose schema the data is in; a restore refuses a dump of another version';
INSERT INTO pepsi.schema_version (version) VALUES ('0.16');

CREATE FUNCTION pepsi.schema_version_restore() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    installed text := (SELECT extversion FROM pg_extension WHERE extname = 'pepsi');
BEGIN
    IF NEW.version IS DISTINCT FROM installed THEN
        RAISE EXCEPTION 'this dump holds pepsi % data, and this database has pepsi %', NEW.version, installed
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The rows of a dump fit only the schema of the version they were dumped from.',
                  HINT = format('Drop this database, create it again, run CREATE EXTENSION pepsi VERSION %L in it'
                                ' (with the release that has that version installed), restore the dump into it,'
                                ' then ALTER EXTENSION pepsi UPDATE.  See docs/backup.md.', NEW.version);
    END IF;
    -- CREATE EXTENSION wrote this row already.
    RETURN NULL;
END
$$;
CREATE TRIGGER schema_version_restore
    BEFORE INSERT ON pepsi.schema_version
    FOR EACH ROW EXECUTE FUNCTION pepsi.schema_version_restore();

-- The queue: every row in every status, the bodies, and the numbering.
SELECT pg_catalog.pg_extension_config_dump('pepsi.workqueue', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.workqueue_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.workqueue_body', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.workqueue_body_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.pending_seq', '');
-- The operator's configuration, the accounts and their credentials.
SELECT pg_catalog.pg_extension_config_dump('pepsi.config_override', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.settings', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.virtual_mailbox', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.admin_account', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.admin_session', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.api_token', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.api_token_id_seq', '');
-- The logs and the statistics.
SELECT pg_catalog.pg_extension_config_dump('pepsi.mail_log', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.mail_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.event_log', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.event_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.stage_stats', '');
-- What delivery remembers that must outlive a restore: the limits an
-- operator set on a destination (its health comes along, and expires), the
-- MTA-STS policies (RFC 8461: kept until they expire, or a downgrade
-- attack gets through), and when each vacation notice was last sent (or a
-- restore answers every sender again).
SELECT pg_catalog.pg_extension_config_dump('pepsi.destination',
    'WHERE concurrency_limit IS NOT NULL OR messages_per_minute IS NOT NULL');
SELECT pg_catalog.pg_extension_config_dump('pepsi.mta_sts_policy', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.autoreply_sent', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.schema_version', '');

-- end of backups keep the mail

-- ===========================================================================
-- pepsi-httpd's web page: history, histograms, SMTP refusals
--
-- The page's charts read a small history the maintenance worker keeps,
-- never the queue: once a minute it stores the totals as they then are
-- (messages received, delivery attempts by outcome, SMTP refusals, the
-- delivery-delay histogram, and the queue's depth per stage from the
-- gauges' snapshot) in pepsi.stats_minute, and drops rows past a day.
-- A minute's traffic is the difference between its row and the next;
-- pepsi.stats_history() adds the minute in progress, live.
--
-- The totals are kept where their writers already write in batches: the
-- dispatcher's statistics flush adds its histograms of stage run time and
-- delivery delay (pepsi.stage_histogram_add); each pepsi-ingress's report,
-- every few seconds, carries its counts since it started (messages, and
-- refusals by reply code), and pepsi.ingress_report adds what is new since
-- its last report to pepsi.ingress_total and pepsi.smtp_refusal.
-- ===========================================================================

CREATE TABLE pepsi.stage_histogram (
    stage       text NOT NULL,
    metric      text NOT NULL CHECK (metric IN ('run_seconds', 'delivery_delay_seconds')),
    le          double precision[] NOT NULL,
    buckets     bigint[] NOT NULL CHECK (cardinality(buckets) = cardinality(le) + 1),
    sum         double precision NOT NULL DEFAULT 0,
    count       bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, metric)
);
COMMENT ON TABLE pepsi.stage_histogram IS
    'Histograms by stage, added to by the dispatcher: run_seconds (worker time per message) and delivery_delay_seconds (receipt to a sent delivery); buckets[i] counts observations at most le[i] and above le[i-1], the last one those above every bound';

CREATE TABLE pepsi.ingress_total (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    messages    bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pepsi.ingress_total DEFAULT VALUES;
COMMENT ON TABLE pepsi.ingress_total IS
    'Messages every pepsi-ingress stored, over its restarts (from pepsi.ingress_report)';

CREATE TABLE pepsi.smtp_refusal (
    code        integer PRIMARY KEY CHECK (code BETWEEN 400 AND 599),
    refusals    bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.smtp_refusal IS
    'SMTP replies pepsi-ingress refused with, by code, over its restarts (from pepsi.ingress_report)';

CREATE TABLE pepsi.stats_minute (
    minute          timestamptz PRIMARY KEY,
    received        bigint NOT NULL,
    sent            bigint NOT NULL,
    deferred        bigint NOT NULL,
    bounced         bigint NOT NULL,
    expired         bigint NOT NULL,
    refused         bigint NOT NULL,
    delivery_delay  bigint[] NOT NULL,
    queue           jsonb NOT NULL
);
COMMENT ON TABLE pepsi.stats_minute IS
    'The totals at the start of each minute of the last day (maintenance worker): counters since installation, and the queue''s messages per stage';

-- Add the dispatcher's observations since its last flush: a JSON array of
-- {stage, metric, le, buckets, sum, count}.  Bounds that changed (another
-- version of the dispatcher) start the histogram again.
CREATE FUNCTION pepsi.stage_histogram_add(observations jsonb) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    INSERT INTO pepsi.stage_histogram AS t (stage, metric, le, buckets, sum, count, updated_at)
    SELECT o.stage, o.metric, o.le, o.buckets, o.sum, o.count, now()
    FROM jsonb_to_recordset(observations)
         AS o (stage text, metric text, le double precision[], buckets bigint[], sum double precision,
               count bigint)
    ON CONFLICT ON CONSTRAINT stage_histogram_pkey DO UPDATE
        SET buckets = CASE WHEN t.le = EXCLUDED.le
                           THEN (SELECT array_agg(a + b ORDER BY i)
                                 FROM unnest(t.buckets, EXCLUDED.buckets) WITH ORDINALITY AS u (a, b, i))
                           ELSE EXCLUDED.buckets END,
            sum = CASE WHEN t.le = EXCLUDED.le THEN t.sum + EXCLUDED.sum ELSE EXCLUDED.sum END,
            count = CASE WHEN t.le = EXCLUDED.le THEN t.count + EXCLUDED.count ELSE EXCLUDED.count END,
            le = EXCLUDED.le, updated_at = now()
$$;

-- The totals now: what a row of pepsi.stats_minute holds.  As the owner:
-- the queue's depth is the gauges' snapshot, which no group role reads.
CREATE FUNCTION pepsi.stats_totals(
    OUT received bigint, OUT sent bigint, OUT deferred bigint, OUT bounced bigint, OUT expired bigint,
    OUT refused bigint, OUT delivery_delay bigint[], OUT queue jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT (SELECT coalesce(sum(i.messages), 0)::bigint FROM pepsi.ingress_total i),
           coalesce(sum(s.deliveries_sent), 0)::bigint, coalesce(sum(s.deliveries_deferred), 0)::bigint,
           coalesce(sum(s.deliveries_bounced), 0)::bigint, coalesce(sum(s.deliveries_expired), 0)::bigint,
           (SELECT coalesce(sum(r.refusals), 0)::bigint FROM pepsi.smtp_refusal r),
           (SELECT coalesce(array_agg(b.n ORDER BY b.i), '{}')
            FROM (SELECT u.i, sum(u.n)::bigint AS n
                  FROM pepsi.stage_histogram h, unnest(h.buckets) WITH ORDINALITY AS u (n, i)
                  WHERE h.metric = 'delivery_delay_seconds' GROUP BY u.i) b),
           (SELECT coalesce(jsonb_object_agg(g.stage, g.messages), '{}')
            FROM (SELECT q.stage, sum(q.messages) AS messages FROM pepsi.queue_gauge q
                  GROUP BY q.stage) g)
    FROM pepsi.stage_stats s
$$;

-- The maintenance worker's, once a minute: the minute's row (once), and
-- rows past a day and an hour dropped.  Returns whether it stored one.
CREATE FUNCTION pepsi.stats_minute_roll() RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    stored boolean;
BEGIN
    INSERT INTO pepsi.stats_minute
    SELECT date_trunc('minute', now()), t.* FROM pepsi.stats_totals() t
    ON CONFLICT ON CONSTRAINT stats_minute_pkey DO NOTHING;
    stored := FOUND;
    DELETE FROM pepsi.stats_minute m WHERE m.minute < now() - interval '25 hours';
    -- The day's first roll keeps the totals for pepsi.stats_daily (telemetry).
    INSERT INTO pepsi.stats_day
    SELECT (now() AT TIME ZONE 'UTC')::date, t.received, t.sent, t.deferred, t.bounced
    FROM pepsi.stats_totals() t
    ON CONFLICT ON CONSTRAINT stats_day_pkey DO NOTHING;
    DELETE FROM pepsi.stats_day d WHERE d.day < (now() AT TIME ZONE 'UTC')::date - 400;
    RETURN stored;
END
$$;

-- Traffic per step over the last span, the minute in progress included:
-- each row is the step starting at "at", with what was received, sent,
-- deferred, bounced, expired and refused in it, and the queue's messages
-- per stage at its end (now, for the step in progress).
CREATE FUNCTION pepsi.stats_history(span interval DEFAULT '1 hour', step interval DEFAULT '1 minute')
RETURNS TABLE (at timestamptz, received bigint, sent bigint, deferred bigint, bounced bigint,
               expired bigint, refused bigint, queue jsonb)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF span IS NULL OR span <= '0' OR span > interval '25 hours' THEN
        RAISE EXCEPTION 'span must be more than 0 and at most 25 hours'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF step IS NULL OR step < interval '1 minute' OR step > span THEN
        RAISE EXCEPTION 'step must be at least a minute and at most the span'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH points AS (
        SELECT m.minute AS at, m.received, m.sent, m.deferred, m.bounced, m.expired, m.refused, m.queue
        FROM pepsi.stats_minute m WHERE m.minute >= now() - span - step
        UNION ALL
        SELECT now(), t.received, t.sent, t.deferred, t.bounced, t.expired, t.refused, t.queue
        FROM pepsi.stats_totals() t
    ), deltas AS (
        SELECT lag(p.at) OVER w AS at,
               greatest(p.received - lag(p.received) OVER w, 0) AS received,
               greatest(p.sent - lag(p.sent) OVER w, 0) AS sent,
               greatest(p.deferred - lag(p.deferred) OVER w, 0) AS deferred,
               greatest(p.bounced - lag(p.bounced) OVER w, 0) AS bounced,
               greatest(p.expired - lag(p.expired) OVER w, 0) AS expired,
               greatest(p.refused - lag(p.refused) OVER w, 0) AS refused,
               p.queue
        FROM points p WINDOW w AS (ORDER BY p.at)
    )
    SELECT date_bin(step, d.at, timestamptz '2000-01-01 00:00:00+00') AS bin,
           sum(d.received)::bigint, sum(d.sent)::bigint, sum(d.deferred)::bigint,
           sum(d.bounced)::bigint, sum(d.expired)::bigint, sum(d.refused)::bigint,
           (array_agg(d.queue ORDER BY d.at DESC))[1]
    FROM deltas d
    WHERE d.at IS NOT NULL AND d.at >= date_bin(step, now() - span, timestamptz '2000-01-01 00:00:00+00')
    GROUP BY bin ORDER BY bin;
END
$$;

-- Percentiles of delivery delay (receipt to a sent delivery) over the last
-- span, from the histogram's growth since then (its buckets, interpolated
-- within one as Prometheus's histogram_quantile does; a quantile in the
-- last, unbounded bucket is given as the highest bound).
CREATE FUNCTION pepsi.stats_delivery_delay(span interval DEFAULT '1 hour')
RETURNS TABLE (quantile double precision, seconds double precision, deliveries bigint)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    bounds double precision[];
    now_buckets bigint[];
    then_buckets bigint[];
    growth bigint[] := '{}';
    total bigint := 0;
    q double precision;
    rank double precision;
    below bigint;
    n bigint;
BEGIN
    SELECT h.le INTO bounds FROM pepsi.stage_histogram h
    WHERE h.metric = 'delivery_delay_seconds' ORDER BY h.updated_at DESC LIMIT 1;
    SELECT t.delivery_delay INTO now_buckets FROM pepsi.stats_totals() t;
    SELECT m.delivery_delay INTO then_buckets FROM pepsi.stats_minute m
    WHERE m.minute >= now() - span ORDER BY m.minute LIMIT 1;
    IF bounds IS NULL OR cardinality(now_buckets) <> cardinality(bounds) + 1 THEN
        RETURN;
    END IF;
    FOR i IN 1 .. cardinality(now_buckets) LOOP
        n := greatest(now_buckets[i] - CASE WHEN cardinality(then_buckets) = cardinality(now_buckets)
                                            THEN then_buckets[i] ELSE 0 END, 0);
        growth := growth || n;
        total := total + n;
    END LOOP;
    FOREACH q IN ARRAY ARRAY[0.5, 0.9, 0.99] LOOP
        quantile := q;
        deliveries := total;
        seconds := NULL;
        IF total > 0 THEN
            rank := q * total;
            below := 0;
            FOR i IN 1 .. cardinality(growth) LOOP
                IF below + growth[i] >= rank AND growth[i] > 0 THEN
                    IF i > cardinality(bounds) THEN
                        seconds := bounds[cardinality(bounds)];
                    ELSE
                        seconds := coalesce(bounds[i - 1], 0)
                                   + (bounds[i] - coalesce(bounds[i - 1], 0)) * (rank - below) / growth[i];
                    END IF;
                    EXIT;
                END IF;
                below := below + growth[i];
            END LOOP;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The destinations the page shows: those with mail waiting to be retried,
-- a delivery failure remembered or a TLS result recorded, with their last
-- error (the destination's, else the newest waiting message's), the TLS
-- policy of their last delivery and what it gave (else the MTA-STS policy
-- the relay holds for them, as "sts <mode>").  Reads the queue's paused
-- rows, on demand.
CREATE FUNCTION pepsi.destination_overview(max_rows integer DEFAULT 100)
RETURNS TABLE (domain text, deferred bigint, failures integer, backoff_until timestamptz,
               last_error text, last_success timestamptz, concurrency_limit integer,
               messages_per_minute integer, tls_policy text, tls_policy_expires_at timestamptz,
               tls_outcome text, tls_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH waiting AS (
        SELECT pepsi.recipient_domain(unnest(w.rcpt_to)) AS domain, w.id,
               coalesce(w.state ->> 'last_error', w.state ->> 'dispatch_error') AS last_error
        FROM pepsi.workqueue w WHERE w.status = 'paused' AND w.timeout < 'infinity'
    ), counted AS (
        SELECT c.domain, count(*) AS deferred,
               (array_agg(c.last_error ORDER BY c.id DESC) FILTER (WHERE c.last_error IS NOT NULL))[1]
                   AS last_error
        FROM waiting c GROUP BY c.domain
    )
    SELECT coalesce(c.domain, d.domain), coalesce(c.deferred, 0), coalesce(d.failures, 0),
           d.backoff_until, coalesce(d.last_error, c.last_error), d.last_success, d.concurrency_limit, d.messages_per_minute,
           coalesce(d.tls_policy, 'sts ' || p.mode), p.expires_at, d.tls_outcome, d.tls_at
    FROM counted c
    FULL JOIN (SELECT * FROM pepsi.destination x
               WHERE x.failures > 0 OR x.backoff_until > now() OR x.last_error IS NOT NULL
                  OR x.tls_policy IS NOT NULL) d
           ON d.domain = c.domain
    LEFT JOIN pepsi.mta_sts_policy p ON p.domain = coalesce(c.domain, d.domain) AND p.expires_at > now()
    ORDER BY coalesce(c.deferred, 0) DESC, coalesce(d.failures, 0) DESC, 1
    LIMIT least(greatest(coalesce(max_rows, 100), 1), 1000)
$$;

-- pepsi.mail_log for pepsi-httpd, which may not read the table: one
-- message's history (oldest first), or the last events of a kind (newest
-- first).
CREATE FUNCTION pepsi.mail_log_read(message_id bigint DEFAULT NULL, event text DEFAULT NULL,
                                    max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, at timestamptz, workqueue_id bigint, event text, detail jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT l.id, l.at, l.workqueue_id, l.event, l.detail FROM pepsi.mail_log l
    WHERE mail_log_read.message_id IS NOT NULL AND l.workqueue_id = mail_log_read.message_id
      AND (mail_log_read.event IS NULL OR l.event = mail_log_read.event)
    UNION ALL
    (SELECT l.id, l.at, l.workqueue_id, l.event, l.detail FROM pepsi.mail_log l
     WHERE mail_log_read.message_id IS NULL
       AND (mail_log_read.event IS NULL OR l.event = mail_log_read.event)
     ORDER BY l.id DESC LIMIT least(greatest(coalesce(max_rows, 50), 1), 1000))
    ORDER BY 1
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_monitor', 'table', 'stage_histogram', '{SELECT}'),
    ('pepsi_monitor', 'table', 'ingress_total', '{SELECT}'),
    ('pepsi_monitor', 'table', 'smtp_refusal', '{SELECT}'),
    ('pepsi_monitor', 'table', 'stats_minute', '{SELECT}'),
    ('pepsi_monitor', 'function', 'stats_totals', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'stats_history', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'stats_delivery_delay', '{EXECUTE}'),
    ('pepsi_config', 'table', 'stage_histogram', '{SELECT}'),
    ('pepsi_config', 'table', 'ingress_total', '{SELECT}'),
    ('pepsi_config', 'table', 'smtp_refusal', '{SELECT}'),
    ('pepsi_config', 'table', 'stats_minute', '{SELECT}'),
    ('pepsi_stage', 'function', 'stage_histogram_add', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'destination_overview', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'mail_log_read', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES
    ('stage_histogram_add'), ('stats_totals'), ('destination_overview'), ('mail_log_read');
INSERT INTO pepsi.grant_owner (name) VALUES ('stats_minute_roll');

SELECT pg_catalog.pg_extension_config_dump('pepsi.stage_histogram', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.smtp_refusal', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.stats_minute', '');

-- end of pepsi-httpd's web page

-- ===========================================================================
-- Claim tokens: a stage changes only the rows it was handed
-- ===========================================================================

-- The claim that also returns each row's claim token (a fresh random uuid;
-- the row keeps only its SHA-256 digest, workqueue.claim_digest), and the
-- overloads of the worker's transitions that take it: a row claimed with a
-- token is changed only by a call naming that token, so a worker changes
-- only the rows it was handed, and one whose row was claimed again since
-- (a crash, an orphan reset) is refused.  The overloads without a token,
-- kept for the programs before 0.4, match only rows claimed without one
-- (by workqueue_claim).  Every argument is required, so that no call is
-- ambiguous between the two; a NULL token is the same as none.
CREATE FUNCTION pepsi.workqueue_claim_tokens(
    stages text[], capacities integer[],
    account_stages text[] DEFAULT NULL, account_senders text[] DEFAULT NULL,
    account_used double precision[] DEFAULT NULL,
    fifo_percent integer DEFAULT 10,
    row_costs double precision[] DEFAULT NULL)
RETURNS TABLE (id bigint, stage text, sender_key text, claim_token uuid)
AS 'MODULE_PATHNAME', 'workqueue_claim' LANGUAGE C CALLED ON NULL INPUT VOLATILE
    SET enable_seqscan = off SET jit = off SET enable_bitmapscan = off SET enable_sort = off;

CREATE FUNCTION pepsi.workqueue_commit(
    id bigint, expected_stage text, transition pepsi.transition,
    target_stage text, merge_state jsonb, retry_seconds double precision,
    set_headers bytea, set_body bytea, set_mail_from text, set_rcpt_to text[],
    set_state jsonb, at_stage text, claim_token uuid)
RETURNS void AS 'MODULE_PATHNAME', 'workqueue_commit' LANGUAGE C CALLED ON NULL INPUT
    SET enable_seqscan = off SET jit = off;

CREATE FUNCTION pepsi.workqueue_commit_many(
    ids bigint[], expected_stages text[], transition pepsi.transition,
    target_stages text[], merge_states jsonb[], retry_seconds double precision[],
    claim_tokens uuid[])
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_commit_many' LANGUAGE C CALLED ON NULL INPUT
    SET enable_seqscan = off SET jit = off;

CREATE FUNCTION pepsi.workqueue_pause(
    id bigint, expected_stage text, retry_seconds double precision,
    merge_state jsonb, keep_indices integer[], clones jsonb, at_stage text, claim_token uuid)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_pause' LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION pepsi.workqueue_finish_with_clones(
    id bigint, expected_stage text, clones jsonb, claim_token uuid)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_finish_with_clones' LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION pepsi.workqueue_split(
    id bigint, expected_stage text, keep_indices integer[], groups jsonb, claim_token uuid)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_split' LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION pepsi.workqueue_split_off(
    id bigint, expected_stage text, rcpt_indices integer[], target_stage text, claim_token uuid)
RETURNS bigint AS 'MODULE_PATHNAME', 'workqueue_split_off' LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION pepsi.workqueue_split_one_per_row(id bigint, expected_stage text, claim_token uuid)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_split_one_per_row' LANGUAGE C CALLED ON NULL INPUT;

-- pepsi_stage changes the queue, the bodies, the DNS address cache and the
-- destination table only through the functions, which run as the owner;
-- the claim is the dispatcher's (pepsi_dispatch).
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_dispatch', 'function', 'workqueue_claim_tokens', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES
    ('destination_begin'),
    ('destination_end'),
    ('dns_address_store'),
    ('workqueue_body_gc'),
    ('workqueue_claim'),
    ('workqueue_claim_tokens'),
    ('workqueue_commit'),
    ('workqueue_commit_many'),
    ('workqueue_finish_with_clones'),
    ('workqueue_pause'),
    ('workqueue_recover'),
    ('workqueue_requeue_due'),
    ('workqueue_reset_orphans'),
    ('workqueue_resume'),
    ('workqueue_split'),
    ('workqueue_split_off'),
    ('workqueue_split_one_per_row');

-- The recovery of running rows (workqueue_crashed, workqueue_recover,
-- workqueue_reset_orphans) refuses a session without the one-dispatcher
-- advisory lock, unless a superuser calls it: a stage worker, a member of
-- the same role, must not put another worker's row back to be claimed.
CREATE FUNCTION pepsi.dispatcher_check(what text) RETURNS void
    AS 'MODULE_PATHNAME', 'dispatcher_check' LANGUAGE C;
INSERT INTO pepsi.grant_owner (name) VALUES ('dispatcher_check');

-- The dispatcher's recovery of the rows it handed out names their claim
-- tokens, so that it leaves alone a row claimed again since (a row an
-- operator paused and the claim took again, say): the overloads of
-- workqueue_crashed and workqueue_recover taking them.  claim_tokens NULL:
-- no check (workqueue_recover of the programs before 0.4).
CREATE FUNCTION pepsi.workqueue_crashed(
    id bigint, expected_stage text, reason text, crash_limit integer,
    retry_seconds double precision, final_status text, claim_token uuid)
RETURNS text AS 'MODULE_PATHNAME', 'workqueue_crashed' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE FUNCTION pepsi.workqueue_recover(
    ids bigint[], expected_stages text[], new_status pepsi.status, reason text, claim_tokens uuid[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    changed bigint[];
BEGIN
    IF ids IS NULL OR expected_stages IS NULL OR new_status IS NULL THEN
        RAISE EXCEPTION 'ids, expected_stages and new_status must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM pepsi.dispatcher_check('workqueue_recover');
    IF cardinality(ids) <> cardinality(expected_stages) THEN
        RAISE EXCEPTION 'expected_stages has % elements but ids has %',
            cardinality(expected_stages), cardinality(ids)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The arrays are parallel: element i of each describes the same row.';
    END IF;
    IF cardinality(claim_tokens) <> cardinality(ids) THEN
        RAISE EXCEPTION 'claim_tokens has % elements but ids has %',
            cardinality(claim_tokens), cardinality(ids)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The arrays are parallel: element i is the claim token of row i.';
    END IF;
    IF new_status NOT IN ('pending', 'failed', 'timeout') THEN
        RAISE EXCEPTION 'a recovered row goes to pending, failed or timeout, not %', new_status
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Paused rows come from a stage''s own pause.';
    END IF;
    IF new_status <> 'pending' AND (reason IS NULL OR reason = '') THEN
        RAISE EXCEPTION 'a row forced to % needs a reason', new_status
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = 'The reason is recorded in state.dispatch_error for the operator.';
    END IF;
    WITH recovered AS (
        UPDATE pepsi.workqueue w
        SET status = new_status,
            state = CASE WHEN new_status = 'pending' THEN w.state
                         ELSE w.state || jsonb_build_object('dispatch_error', reason) END
        FROM unnest(ids, expected_stages, claim_tokens) AS u(id, stage, token)
        WHERE w.id = u.id AND w.stage = u.stage AND w.status = 'running'
          AND (claim_tokens IS NULL OR w.claim_digest IS NOT DISTINCT FROM sha256(uuid_send(u.token)))
        RETURNING w.id)
    SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO changed FROM recovered;
    RETURN changed;
END;
$$;
-- end of claim tokens

-- ===========================================================================
-- pepsi-whitelist: a local user's own whitelist (pepsi-whitelist(1))
--
-- pepsi-whitelist is set-user-id to the account pepsi-whitelist and
-- connects over the local socket with peer authentication, which keys off
-- the effective uid: only that file logs in as the role pepsi-whitelist, a
-- member of the group role pepsi_whitelist.  That group may execute the
-- three whitelist functions and nothing else of the schema (no table, no
-- other function), so a user who found a way into the role could still
-- only change whitelists.  The program passes its real user's address as
-- the owner (the kernel proves the real uid to it; no argument names
-- another), which is why the role is reachable only through it.
--
-- Here, before the grants are applied and verified at creation, not with
-- the objects at the end: a pepsi_whitelist that outlived a DROP
-- EXTENSION keeps its USAGE on the schema, which the verification would
-- otherwise find outside the policy.  The functions' grants follow when
-- the secretary's block applies the grants again.
-- ===========================================================================
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_whitelist', 'Pepsi: pepsi-whitelist (set-user-id, peer authentication): a local user''s own whitelist only');
SELECT pepsi.grant_roles_create();
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_whitelist', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_whitelist', 'function', 'whitelist_add', '{EXECUTE}'),
    ('pepsi_whitelist', 'function', 'whitelist_remove', '{EXECUTE}'),
    ('pepsi_whitelist', 'function', 'whitelist_list', '{EXECUTE}');
-- end of pepsi-whitelist

-- ===========================================================================
-- pepsi_autopay: pepsi-helper-auto-pay's role (auto-pay's helper claims its
-- payment, at the end): here for the reason pepsi_whitelist is.
-- ===========================================================================
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_autopay', 'Pepsi: pepsi-helper-auto-pay (set-user-id root, peer authentication): claims a reserved payment, once');
SELECT pepsi.grant_roles_create();
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_autopay', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_autopay', 'function', 'auto_pay_claim', '{EXECUTE}'),
    ('pepsi_autopay', 'function', 'auto_pay_settle', '{EXECUTE}');
-- end of pepsi_autopay

-- ===========================================================================
-- The grants, last, so that they see every object
-- ===========================================================================

-- At creation, apply and verify the grants; drift already (a group role
-- that existed before and is a member of another, say) fails CREATE
-- EXTENSION rather than leaving a boundary open.  An object missing from
-- the policy does not, nor a name in the policy that is missing from the
-- schema: no role can use the one, no role needs the other, and
-- pepsi.apply_grants() (and the regression suite) report both.  Not logged: nobody administered
-- anything yet.
--
-- The blocks folded in below, each a step's block in its final form,
-- leave out the grant_apply() that ends them in the step's upgrade
-- script: the one at the end of this file grants all their objects at
-- once.  Each call re-reads the whole policy and every object (about
-- 0.2 s of backend CPU), and 26 of them were most of CREATE EXTENSION's
-- time.  The last block keeps its own, as the last.
SELECT pepsi.grant_apply();
DO $$
DECLARE
    drift record;
BEGIN
    SELECT * INTO drift FROM pepsi.grant_verify() v
    WHERE v.privilege NOT IN ('named in grant_policy()', 'exists') OR v.grantee IS NOT NULL LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'the grants of schema pepsi differ from the policy'
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('%s %s %s on %s.', coalesce(drift.grantee, 'the owner'),
                                  CASE WHEN drift.actual THEN 'has' ELSE 'lacks' END,
                                  drift.privilege, drift.object),
                  HINT = 'A group role that existed before CREATE EXTENSION may hold other privileges or memberships: SELECT * FROM pepsi.grant_verify() lists them.';
    END IF;
END
$$;

-- ===========================================================================
-- One queue id (common/message/queue_id.h): the message's name from ingress on,
-- carried by every row split from it in state.queue_id; pepsi.mail_log's
-- queue_id column (above) finds a message's events across its rows.
-- ===========================================================================
CREATE INDEX mail_log_queue_id ON pepsi.mail_log (queue_id);
-- end of one queue id

-- ===========================================================================
-- One timer: pepsi.schedule, run by the maintenance worker; the failure
-- bouncer (pepsi.failure_bounce, pepsi-failure-bouncer(8))
-- ===========================================================================

-- Work due at a time (reports, held-mail expiry, digests, key expiry, the
-- failure bouncer) is a row here, and the maintenance worker
-- (extension/src/maint.c) is the one clock that runs it: there is no cron
-- line, no timer in a daemon and no sleep loop in a stage.  Each pass the
-- worker calls pepsi.schedule_run_due(), which runs every row whose
-- next_run has come, each in its own subtransaction (a failing one is
-- recorded in last_outcome and logged, and the others still run), and
-- sleeps no longer than until the earliest next_run.
--
-- A row does one of two things:
--   inject  a queue row at stage, through pepsi.workqueue_inject (the
--           same function stages use for side messages), with the null
--           sender, the row's recipients and its arguments as state, plus
--           state.schedule = {name, due}.  The stage named does the work
--           (a report stage, a digest stage) with the pipeline's retries,
--           crash limits and logs.  The inject carries the token
--           "schedule:<name>:<due>", so a period is injected at most once
--           even if a pass were to run twice.
--   call    one function of the closed allow-list below, with the row's
--           arguments, for work that is a statement (the failure bouncer).
--
-- Why a closed list and not any function named in the row: the worker
-- runs as the bootstrap superuser.  A row naming any function would let
-- whoever may add a schedule (pepsi_config) run any function, with any
-- arguments, as superuser.  So the callable names are fixed in this
-- script, each mapped by pepsi.schedule_call() to one fixed call of an
-- extension function with its arguments read from the row's jsonb by
-- name and type-checked (no dynamic SQL, no name looked up in the
-- catalog); adding one is a schema change, reviewed and versioned like
-- any other.  pepsi.schedule_functions() lists them.
--
-- Time: next_run is when the row is due.  A repeating row (every) then
-- moves to the first next_run + k * every after now, so a row fires once
-- per period, keeps its phase, and after the server was down for several
-- periods it fires once, not once per missed period.  A one-shot row
-- (every NULL) keeps its record with next_run 'infinity'.  The worker
-- wakes for the earliest row, and at least every
-- pepsi.maintenance_interval, so a row added while it sleeps fires within
-- that interval of its time.  The table is the schedule's state: a
-- restart, a backup and restore (pg_extension_config_dump) keep it.
CREATE TABLE pepsi.schedule (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]*$' AND length(name) <= 100),
    action          text NOT NULL CHECK (action IN ('inject', 'call')),
    stage           text CHECK (stage ~ '^[a-z0-9_-]+$'),
    rcpt_to         text[] CHECK (cardinality(rcpt_to) > 0 AND array_position(rcpt_to, NULL) IS NULL),
    function_name   text,
    arguments       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(arguments) = 'object'),
    next_run        timestamptz NOT NULL,
    every           interval CHECK (every > interval '0'),
    last_run        timestamptz,
    last_outcome    text,
    runs            bigint NOT NULL DEFAULT 0,
    failures        bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL DEFAULT current_user,
    CHECK ((action = 'inject') = (stage IS NOT NULL AND rcpt_to IS NOT NULL)),
    CHECK ((action = 'call') = (function_name IS NOT NULL))
);
CREATE INDEX schedule_next_run ON pepsi.schedule (next_run);
COMMENT ON TABLE pepsi.schedule IS
    'Work due at a time, run by the maintenance worker: inject a queue row at a stage, or call an allow-listed function';

-- The allow-list: what a "call" row may name, and its arguments.
CREATE FUNCTION pepsi.schedule_functions(OUT name text, OUT arguments text, OUT description text)
RETURNS SETOF record LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    VALUES ('failure_bounce',
            'older_than (interval, required), policy ("bounce" or "delete"), bounce_stage, max_rows',
            'Bounce (or delete) failed and timed-out rows older than older_than: pepsi-failure-bouncer(8)'),
           ('dmarc_aggregate_prune', 'older_than (interval, required, an hour or more)',
            'Delete the DMARC verdicts counted more than older_than ago: pepsi-dmarc-report(8)'),
           ('tls_aggregate_prune', 'older_than (interval, required, a day or more)',
            'Delete the TLS sessions counted more than older_than ago: pepsi-tlsrpt(8)'),
           ('greylist_prune', 'older_than (interval, required, an hour or more)',
            'Delete the greylisting triplets not seen for older_than, and ended auto-whitelistings'),
           ('send_count_prune', 'older_than (interval, required, an hour or more)',
            'Delete the hours of per-account send counts older than older_than'),
           ('screen_verdict_prune', '(none)',
            'Delete the expired connection-level verdicts (DNSBL, pre-greeting)'),
           ('secretary_expire', '(none)',
            'Delete the mail the secretary held whose HOLD_TIME is up: pepsi-stage-check-whitelist(8)'),
           ('outbound_message_prune', 'older_than (interval, required, an hour or more)',
            'Delete the records of our users'' Message-Ids sent more than older_than ago: pepsi-stage-auto-pay(8)')
$$;

-- Check a call's arguments as the call would read them; raise naming the
-- problem.  Used by schedule_add (so a bad row is refused when it is
-- added, not found failing at 3 a.m.) and again by schedule_call.
CREATE FUNCTION pepsi.schedule_check_call(function_name text, arguments jsonb) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    unknown text;
    older_than interval;
    max_rows integer;
BEGIN
    IF function_name IS NULL OR NOT EXISTS (SELECT FROM pepsi.schedule_functions() f
                                             WHERE f.name = function_name) THEN
        RAISE EXCEPTION 'a schedule may not call "%"', function_name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('The functions a schedule may call: %s.',
                                  (SELECT string_agg(f.name, ', ') FROM pepsi.schedule_functions() f)),
                  HINT = 'For other work at a time, inject a row at the stage that does it (stage => ...).';
    END IF;
    IF function_name = 'failure_bounce' THEN
        SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(arguments) k
        WHERE k NOT IN ('older_than', 'policy', 'bounce_stage', 'max_rows');
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'failure_bounce takes no argument %', unknown
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'Its arguments: older_than, policy, bounce_stage, max_rows.';
        END IF;
        IF arguments ->> 'older_than' IS NULL THEN
            RAISE EXCEPTION 'failure_bounce needs the argument older_than'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'arguments => ''{"older_than": "5 days"}''';
        END IF;
        BEGIN
            older_than := (arguments ->> 'older_than')::interval;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            RAISE EXCEPTION 'failure_bounce''s older_than is not an interval: "%"', arguments ->> 'older_than'
                USING ERRCODE = 'invalid_parameter_value', HINT = 'For example "5 days" or "12 hours".';
        END;
        BEGIN
            max_rows := coalesce((arguments ->> 'max_rows')::integer, 1000);
        EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range THEN
            RAISE EXCEPTION 'failure_bounce''s max_rows is not a whole number: "%"', arguments ->> 'max_rows'
                USING ERRCODE = 'invalid_parameter_value';
        END;
        PERFORM pepsi.failure_bounce_check(older_than, coalesce(arguments ->> 'policy', 'bounce'),
                                           coalesce(arguments ->> 'bounce_stage', 'bounce'), max_rows);
    ELSIF function_name IN ('dmarc_aggregate_prune', 'tls_aggregate_prune', 'greylist_prune', 'send_count_prune',
                            'outbound_message_prune') THEN
        SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(arguments) k WHERE k <> 'older_than';
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION '% takes no argument %', function_name, unknown
                USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Its argument: older_than.';
        END IF;
        BEGIN
            older_than := (arguments ->> 'older_than')::interval;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            RAISE EXCEPTION '%''s older_than is not an interval: "%"', function_name, arguments ->> 'older_than'
                USING ERRCODE = 'invalid_parameter_value';
        END;
        IF function_name = 'tls_aggregate_prune' AND (older_than IS NULL OR older_than < interval '1 day') THEN
            RAISE EXCEPTION 'tls_aggregate_prune needs older_than, a day or more'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF older_than IS NULL OR older_than < interval '1 hour' THEN
            RAISE EXCEPTION '% needs older_than, an hour or more', function_name
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSIF function_name IN ('screen_verdict_prune', 'secretary_expire') THEN
        SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(arguments) k;
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION '% takes no argument %', function_name, unknown
                USING ERRCODE = 'invalid_parameter_value', DETAIL = 'It takes no arguments.';
        END IF;
    END IF;
END
$$;

-- One fixed call per allow-listed name; returns the outcome's text.
CREATE FUNCTION pepsi.schedule_call(function_name text, arguments jsonb) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    bounced bigint;
    deleted bigint;
BEGIN
    PERFORM pepsi.schedule_check_call(function_name, arguments);
    CASE function_name
        WHEN 'failure_bounce' THEN
            SELECT count(*) FILTER (WHERE f.action = 'bounced'),
                   count(*) FILTER (WHERE f.action <> 'bounced')
            INTO bounced, deleted
            FROM pepsi.failure_bounce((arguments ->> 'older_than')::interval,
                                      coalesce(arguments ->> 'policy', 'bounce'),
                                      coalesce(arguments ->> 'bounce_stage', 'bounce'),
                                      coalesce((arguments ->> 'max_rows')::integer, 1000)) f;
            RETURN format('%s bounced, %s deleted', bounced, deleted);
        WHEN 'dmarc_aggregate_prune' THEN
            RETURN format('%s rows pruned', pepsi.dmarc_aggregate_prune((arguments ->> 'older_than')::interval));
        WHEN 'tls_aggregate_prune' THEN
            RETURN format('%s rows pruned', pepsi.tls_aggregate_prune((arguments ->> 'older_than')::interval));
        WHEN 'greylist_prune' THEN
            RETURN format('%s rows pruned', pepsi.greylist_prune((arguments ->> 'older_than')::interval));
        WHEN 'send_count_prune' THEN
            RETURN format('%s rows pruned', pepsi.send_count_prune((arguments ->> 'older_than')::interval));
        WHEN 'screen_verdict_prune' THEN
            RETURN format('%s rows pruned', pepsi.screen_verdict_prune());
        WHEN 'secretary_expire' THEN
            RETURN format('%s held messages expired', pepsi.secretary_expire());
        WHEN 'outbound_message_prune' THEN
            RETURN format('%s rows pruned', pepsi.outbound_message_prune((arguments ->> 'older_than')::interval));
    END CASE;
END
$$;

-- Add a schedule (pepsi_config).  Exactly one of stage (inject a row
-- there, to rcpt_to) and function_name (call it); run_at is the first
-- time, every the period (NULL: once).  Logged in pepsi.event_log.
CREATE FUNCTION pepsi.schedule_add(name text, run_at timestamptz, every interval DEFAULT NULL,
    stage text DEFAULT NULL, rcpt_to text[] DEFAULT NULL, function_name text DEFAULT NULL,
    arguments jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF name IS NULL OR name !~ '^[a-z0-9][a-z0-9_.-]*$' OR length(name) > 100 THEN
        RAISE EXCEPTION 'invalid schedule name "%"', name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'Lower-case letters, digits, ".", "_" and "-", at most 100 characters.';
    END IF;
    IF run_at IS NULL OR NOT isfinite(run_at) THEN
        RAISE EXCEPTION 'run_at must be a finite time' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF every IS NOT NULL AND every <= interval '0' THEN
        RAISE EXCEPTION 'every must be a positive interval, not %', every
            USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL runs the schedule once.';
    END IF;
    IF arguments IS NULL OR jsonb_typeof(arguments) <> 'object' THEN
        RAISE EXCEPTION 'arguments must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (stage IS NULL) = (function_name IS NULL) THEN
        RAISE EXCEPTION 'a schedule names either a stage to inject a row at or a function to call'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'stage => ''digest'', rcpt_to => ARRAY[...], or function_name => ''failure_bounce''.';
    END IF;
    IF stage IS NOT NULL THEN
        IF stage !~ '^[a-z0-9_-]+$' THEN
            RAISE EXCEPTION 'invalid stage name "%"', stage
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'A stage is named by its [stage-<name>] section: lower-case letters, digits, "_" and "-".';
        END IF;
        IF rcpt_to IS NULL OR cardinality(rcpt_to) = 0 OR array_position(rcpt_to, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'a schedule that injects a row needs its recipients (rcpt_to)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSE
        IF rcpt_to IS NOT NULL THEN
            RAISE EXCEPTION 'rcpt_to is for a schedule that injects a row, not one that calls %', function_name
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM pepsi.schedule_check_call(function_name, arguments);
    END IF;
    IF EXISTS (SELECT FROM pepsi.schedule s WHERE s.name = schedule_add.name) THEN
        RAISE EXCEPTION 'schedule "%" exists already', name
            USING ERRCODE = 'unique_violation',
                  HINT = 'Remove it first with pepsi.schedule_remove().';
    END IF;
    INSERT INTO pepsi.schedule (name, action, stage, rcpt_to, function_name, arguments, next_run, every,
                                created_by)
    VALUES (name, CASE WHEN stage IS NULL THEN 'call' ELSE 'inject' END, stage, rcpt_to,
            function_name, arguments, run_at, every, pepsi.event_principal());
    PERFORM pepsi.event_log_write('schedule_add',
        jsonb_strip_nulls(jsonb_build_object('name', name, 'run_at', run_at, 'every', every::text,
                                             'stage', stage, 'rcpt_to', to_jsonb(rcpt_to),
                                             'function', function_name, 'arguments', arguments)));
END
$$;

-- Remove a schedule; returns whether there was one.  Logged.
CREATE FUNCTION pepsi.schedule_remove(name text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    removed boolean;
BEGIN
    DELETE FROM pepsi.schedule s WHERE s.name = schedule_remove.name;
    removed := FOUND;
    PERFORM pepsi.event_log_write('schedule_remove', jsonb_build_object('name', name, 'removed', removed));
    RETURN removed;
END
$$;

-- The schedules, soonest first, with what each does in one column.
CREATE FUNCTION pepsi.schedule_list()
RETURNS TABLE (name text, does text, next_run timestamptz, every interval, last_run timestamptz,
               last_outcome text, runs bigint, failures bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT s.name,
           CASE s.action WHEN 'inject' THEN format('inject at %s to %s', s.stage, array_to_string(s.rcpt_to, ', '))
                ELSE format('call %s(%s)', s.function_name, s.arguments::text) END,
           s.next_run, s.every, s.last_run, s.last_outcome, s.runs, s.failures
    FROM pepsi.schedule s ORDER BY s.next_run, s.name
$$;

-- The maintenance worker's part: run the rows that are due, at most
-- max_rows of them; returns how many ran.  Each in a subtransaction: a
-- failure is the row's last_outcome ("error: ...") and a WARNING in the
-- server log, and does not stop the others.  Due means due at the
-- transaction's start (now()), the time an injected row is stamped with
-- (received_at): a row that fell due while the caller's transaction ran
-- waits for its next call, so none is received before its time.
CREATE FUNCTION pepsi.schedule_run_due(max_rows integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    due record;
    ran integer := 0;
    outcome text;
    failed boolean;
    next_due timestamptz;
    injected bigint;
BEGIN
    FOR due IN SELECT * FROM pepsi.schedule s WHERE s.next_run <= now()
               ORDER BY s.next_run, s.name LIMIT max_rows FOR UPDATE SKIP LOCKED
    LOOP
        failed := false;
        BEGIN
            IF due.action = 'inject' THEN
                injected := pepsi.workqueue_inject(due.stage, '', due.rcpt_to, ''::bytea, ''::bytea,
                    due.arguments || jsonb_build_object('schedule',
                        jsonb_build_object('name', due.name, 'due', due.next_run)),
                    format('schedule:%s:%s', due.name, extract(epoch FROM due.next_run)));
                outcome := CASE WHEN injected IS NULL THEN 'ok: already injected'
                                ELSE format('ok: row %s at %s', injected, due.stage) END;
            ELSE
                outcome := 'ok: ' || pepsi.schedule_call(due.function_name, due.arguments);
            END IF;
        EXCEPTION WHEN OTHERS THEN
            failed := true;
            outcome := 'error: ' || SQLERRM;
            RAISE WARNING 'pepsi maintenance: schedule "%" failed: %', due.name, SQLERRM;
        END;
        IF due.every IS NULL THEN
            next_due := 'infinity';
        ELSE
            -- The first due time after now in the row's phase.
            next_due := due.next_run + due.every * greatest(1, floor(extract(epoch FROM clock_timestamp() - due.next_run)
                                                                 / extract(epoch FROM due.every))::bigint);
            FOR i IN 1..3 LOOP
                EXIT WHEN next_due > clock_timestamp();
                next_due := next_due + due.every;
            END LOOP;
            IF next_due <= clock_timestamp() THEN
                next_due := clock_timestamp() + due.every;
            END IF;
        END IF;
        UPDATE pepsi.schedule s
        SET next_run = next_due, last_run = clock_timestamp(), last_outcome = left(outcome, 1000),
            runs = s.runs + 1, failures = s.failures + failed::int
        WHERE s.name = due.name;
        ran := ran + 1;
    END LOOP;
    RETURN ran;
END
$$;

-- The failure bouncer: failed and timed-out rows that have been in the
-- queue longer than older_than (received_at) are bounced to their sender
-- through pepsi.queue_bounce (the bounce stage makes the DSN, as for
-- pepsi-queue bounce), or deleted when policy is "delete" (pepsi.queue_delete).
-- A row with the null sender (a DSN that could not be delivered) is
-- never bounced: it is deleted, and the deletion logged (server log and
-- pepsi-failure-bouncer's own log line).  Rows at bounce_stage are left
-- alone: the bounce stage failed to make their DSN, and bouncing them
-- again would go round the same failure; an operator looks at them.
-- Each row is one queue_bounce or queue_delete, so the audit trail is the
-- queue tools' (one pepsi.event_log row per message); one more row,
-- action failure_bounce, sums the run up.  A row another session holds is
-- skipped and taken next time.  dry_run: the rows, untouched.
CREATE FUNCTION pepsi.failure_bounce_check(older_than interval, policy text, bounce_stage text, max_rows integer)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must be an interval of 0 or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF policy IS NULL OR policy NOT IN ('bounce', 'delete') THEN
        RAISE EXCEPTION 'the failure bouncer''s policy is "bounce" or "delete", not "%"', policy
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF bounce_stage IS NULL OR bounce_stage !~ '^[a-z0-9_-]+$' THEN
        RAISE EXCEPTION 'invalid bounce stage name "%"', bounce_stage
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A stage is named by its [stage-<name>] section: lower-case letters, digits, "_" and "-".';
    END IF;
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 100000 THEN
        RAISE EXCEPTION 'max_rows must be between 1 and 100000, not %', coalesce(max_rows::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

CREATE FUNCTION pepsi.failure_bounce(older_than interval, policy text DEFAULT 'bounce',
    bounce_stage text DEFAULT 'bounce', max_rows integer DEFAULT 1000, dry_run boolean DEFAULT false)
RETURNS TABLE (id bigint, queue_id text, stage text, status text, mail_from text, age interval,
               action text, reason text)
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r record;
    why text;
    bounced integer := 0;
    deleted integer := 0;
BEGIN
    PERFORM pepsi.failure_bounce_check(older_than, policy, bounce_stage, max_rows);
    FOR r IN SELECT w.id, coalesce(w.state ->> 'queue_id', w.id::text) AS queue_id, w.stage,
                    w.status::text AS status, w.mail_from, now() - w.received_at AS age,
                    coalesce(w.state ->> 'last_error', w.state ->> 'dispatch_error') AS last_error
             FROM pepsi.workqueue w
             WHERE w.status IN ('failed', 'timeout') AND w.received_at < now() - older_than
               AND w.stage <> bounce_stage
             ORDER BY w.id LIMIT max_rows FOR UPDATE OF w SKIP LOCKED
    LOOP
        -- One line, as the DSN's Diagnostic-Code: 5.4.7 (delivery time
        -- expired) unless the stage's own error gives a code.
        why := format('%s at stage %s and not delivered after %s%s',
                      CASE r.status WHEN 'timeout' THEN 'timed out' ELSE 'failed' END, r.stage,
                      justify_interval(date_trunc('second', r.age)),
                      coalesce(': ' || left(regexp_replace(r.last_error, '[[:cntrl:]]+', ' ', 'g'), 400), ''));
        why := CASE WHEN why ~ '\m[245]\.[0-9]{1,3}\.[0-9]{1,3}\M' THEN why ELSE '5.4.7 ' || why END;
        id := r.id; queue_id := r.queue_id; stage := r.stage; status := r.status;
        mail_from := r.mail_from; age := r.age; reason := why;
        IF r.mail_from IN ('', '<>') THEN
            action := 'deleted: null sender';
        ELSIF policy = 'delete' THEN
            action := 'deleted';
        ELSE
            action := 'bounced';
        END IF;
        IF NOT dry_run THEN
            IF action = 'bounced' THEN
                PERFORM pepsi.queue_bounce(ARRAY[r.id], why, bounce_stage);
                UPDATE pepsi.workqueue w SET state = jsonb_set(w.state, '{bounce,source}', '"failure-bouncer"')
                WHERE w.id = r.id;
                bounced := bounced + 1;
            ELSE
                PERFORM pepsi.queue_delete(ARRAY[r.id]);
                deleted := deleted + 1;
                RAISE LOG 'pepsi failure-bouncer: deleted row % (queue id %) from <%>: %', r.id, r.queue_id,
                    r.mail_from, CASE WHEN action = 'deleted' THEN 'policy delete' ELSE 'null sender, never bounced' END;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF NOT dry_run AND bounced + deleted > 0 THEN
        PERFORM pepsi.event_log_write('failure_bounce',
            jsonb_build_object('older_than', older_than::text, 'policy', policy, 'bounce_stage', bounce_stage,
                               'bounced', bounced, 'deleted', deleted));
    END IF;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'schedule', '{SELECT}'),
    ('pepsi_config', 'function', 'schedule_add', '{EXECUTE}'),
    ('pepsi_config', 'function', 'schedule_remove', '{EXECUTE}'),
    ('pepsi_config', 'function', 'schedule_list', '{EXECUTE}'),
    ('pepsi_config', 'function', 'schedule_functions', '{EXECUTE}'),
    ('pepsi_config', 'function', 'failure_bounce', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'schedule', '{SELECT}'),
    ('pepsi_monitor', 'function', 'schedule_list', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'schedule_functions', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES
    ('schedule_add'), ('schedule_remove'), ('failure_bounce');
INSERT INTO pepsi.grant_owner (name) VALUES
    ('schedule_check_call'), ('schedule_call'), ('schedule_run_due'), ('failure_bounce_check');

SELECT pg_catalog.pg_extension_config_dump('pepsi.schedule', '');


-- end of one timer and the failure bouncer

-- ===========================================================================
-- DMARC aggregate reports (RFC 7489 7.2): the verdicts pepsi-ingress
-- counts, for pepsi-dmarc-report(8)
-- ===========================================================================

-- One row per hour and per what a report's <record> shows: the domain whose
-- policy applied (where the _dmarc record was found), the header From
-- domain, the client's address, the envelope's (MAIL FROM or HELO)
-- domain, the disposition applied, DMARC's aligned DKIM and SPF results,
-- and the DKIM signature and SPF check reported with them; messages counts
-- the messages.  pepsi-ingress counts in memory and adds its counts with
-- pepsi.dmarc_tally() in the transaction of its periodic report
-- (pepsi.ingress_report, every few seconds): no round trip per message.
CREATE TABLE pepsi.dmarc_aggregate (
    period          timestamptz NOT NULL CHECK (period = date_trunc('hour', period)),
    policy_domain   text NOT NULL,
    header_from     text NOT NULL,
    source_ip       inet NOT NULL,
    envelope_from   text NOT NULL DEFAULT '',
    disposition     text NOT NULL CHECK (disposition IN ('none', 'quarantine', 'reject')),
    dkim            text NOT NULL CHECK (dkim IN ('pass', 'fail')),
    spf             text NOT NULL CHECK (spf IN ('pass', 'fail')),
    dkim_domain     text NOT NULL DEFAULT '',
    dkim_selector   text NOT NULL DEFAULT '',
    dkim_result     text NOT NULL DEFAULT '',
    spf_scope       text NOT NULL DEFAULT 'mfrom' CHECK (spf_scope IN ('mfrom', 'helo')),
    spf_result      text NOT NULL DEFAULT 'none',
    messages        bigint NOT NULL CHECK (messages > 0),
    PRIMARY KEY (policy_domain, period, header_from, source_ip, envelope_from, disposition, dkim, spf,
                 dkim_domain, dkim_selector, dkim_result, spf_scope, spf_result)
);
CREATE INDEX dmarc_aggregate_period ON pepsi.dmarc_aggregate (period);
COMMENT ON TABLE pepsi.dmarc_aggregate IS
    'DMARC verdicts per hour and report record, counted by pepsi-ingress for pepsi-dmarc-report';

-- Add a batch of counts (pepsi-ingress): a JSON array of objects with the
-- columns above (count for messages), at most 100000; the hour is now's.
CREATE FUNCTION pepsi.dmarc_tally(counts jsonb) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    added integer;
BEGIN
    IF counts IS NULL OR jsonb_typeof(counts) <> 'array' THEN
        RAISE EXCEPTION 'counts must be a JSON array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(counts) > 100000 THEN
        RAISE EXCEPTION 'at most 100000 records in one call, not %', jsonb_array_length(counts)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    INSERT INTO pepsi.dmarc_aggregate AS a (period, policy_domain, header_from, source_ip, envelope_from,
        disposition, dkim, spf, dkim_domain, dkim_selector, dkim_result, spf_scope, spf_result, messages)
    SELECT date_trunc('hour', now()), lower(r.policy_domain), lower(r.header_from), r.source_ip,
           lower(coalesce(r.envelope_from, '')), r.disposition, r.dkim, r.spf,
           lower(coalesce(r.dkim_domain, '')), coalesce(r.dkim_selector, ''), coalesce(r.dkim_result, ''),
           coalesce(nullif(r.spf_scope, ''), 'mfrom'), coalesce(nullif(r.spf_result, ''), 'none'),
           sum(r.count)
    FROM jsonb_to_recordset(counts) AS r(policy_domain text, header_from text, source_ip inet,
        envelope_from text, disposition text, dkim text, spf text, dkim_domain text, dkim_selector text,
        dkim_result text, spf_scope text, spf_result text, count bigint)
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13
    ON CONFLICT (policy_domain, period, header_from, source_ip, envelope_from, disposition, dkim, spf,
                 dkim_domain, dkim_selector, dkim_result, spf_scope, spf_result)
    DO UPDATE SET messages = a.messages + excluded.messages;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added;
END
$$;

-- The rows of past reports go (a pepsi.schedule row may call it:
-- dmarc_aggregate_prune on the allow-list).  Returns how many went.
CREATE FUNCTION pepsi.dmarc_aggregate_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'older_than must be an hour or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pepsi.dmarc_aggregate a WHERE a.period < now() - older_than;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

-- pepsi-dmarc-report's message into the queue (pepsi_config): a new row at
-- stage, to the one rua address, marked as Pepsi's own mail (state.origin,
-- so pepsi-stage-dkim-sign signs it), through pepsi.workqueue_inject with
-- the token dmarc-report:<report id>:<rua>, so a report is queued once for
-- each of its destinations however often the tool runs.  Logged in
-- pepsi.event_log.  Returns the row's id, or NULL when it was queued
-- already.
CREATE FUNCTION pepsi.dmarc_report_inject(stage text, mail_from text, rua text, headers bytea, body bytea,
    policy_domain text, report_id text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    queued bigint;
BEGIN
    IF report_id IS NULL OR report_id = '' OR policy_domain IS NULL OR policy_domain = '' THEN
        RAISE EXCEPTION 'a report needs its report_id and policy_domain' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    queued := pepsi.workqueue_inject(stage, mail_from, ARRAY[rua], headers, body,
        jsonb_build_object('origin', jsonb_build_object('trust', 'pepsi', 'program', 'pepsi-dmarc-report')),
        format('dmarc-report:%s:%s', report_id, lower(rua)));
    PERFORM pepsi.event_log_write('dmarc_report_sent',
        jsonb_build_object('domain', policy_domain, 'rua', rua, 'report_id', report_id, 'row', queued));
    RETURN queued;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'dmarc_tally', '{EXECUTE}'),
    ('pepsi_config', 'function', 'dmarc_report_inject', '{EXECUTE}'),
    ('pepsi_config', 'table', 'dmarc_aggregate', '{SELECT}'),
    ('pepsi_config', 'function', 'dmarc_aggregate_prune', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'dmarc_aggregate', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('dmarc_tally'), ('dmarc_aggregate_prune'), ('dmarc_report_inject');

SELECT pg_catalog.pg_extension_config_dump('pepsi.dmarc_aggregate', '');


-- end of DMARC aggregate reports
-- setup tasks: pepsi.setup_task, the intent queue pepsi-setup(8) apply
-- drains as root, and pepsi.setup_task_log, the lines each task wrote.
--
-- Setting a mail server up is privileged (writing /etc/pepsi, secrets.d,
-- roles, keys) and pepsi-httpd runs unprivileged, so the web setup does not
-- act: it writes a row saying what should be true, of one of a closed set
-- of eleven kinds, and the applier decides how, validating the parameters
-- of each kind strictly (cli/setup/tasks.c; docs/pepsi-setup.8.md names
-- them).  Root is reached through a table, never through a socket.
-- written_by is forced from current_user by the BEFORE INSERT trigger,
-- whatever the row says, and the applier refuses a row not written by a
-- member of pepsi_config; only pepsi_config may INSERT (nobody UPDATEs or
-- DELETEs but the owner, which the applier connects as), pepsi_config and
-- pepsi_httpd may read both.  No role that handles mail touches them.
-- ===========================================================================
CREATE TABLE pepsi.setup_task (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('config_file', 'secret', 'database_role', 'grant_policy',
                                              'pg_hba_line', 'dkim_key', 'srs_secret', 'certificate',
                                              'reload', 'admin_account', 'dns_check')),
    params      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(params) = 'object'),
    written_by  name NOT NULL DEFAULT current_user,
    status      text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'running', 'done', 'unchanged', 'refused', 'failed')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX setup_task_pending ON pepsi.setup_task (id) WHERE status = 'pending';

CREATE TABLE pepsi.setup_task_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     bigint NOT NULL REFERENCES pepsi.setup_task (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT now(),
    line        text NOT NULL
);
CREATE INDEX setup_task_log_task ON pepsi.setup_task_log (task_id, id);

-- Who wrote a request is a fact about the connection, not a claim of the
-- payload: the trigger runs as the inserting role (it is no definer).  A
-- new row is pending, stamped now, whatever it says.
CREATE FUNCTION pepsi.setup_task_stamp() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    NEW.written_by := current_user;
    NEW.status := 'pending';
    NEW.created_at := now();
    NEW.started_at := NULL;
    NEW.finished_at := NULL;
    RETURN NEW;
END
$$;
CREATE TRIGGER setup_task_stamp BEFORE INSERT ON pepsi.setup_task
    FOR EACH ROW EXECUTE FUNCTION pepsi.setup_task_stamp();

SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_log', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_log_id_seq', '');

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'setup_task', '{SELECT,INSERT}'),
    ('pepsi_config', 'table', 'setup_task_log', '{SELECT}'),
    ('pepsi_httpd', 'table', 'setup_task', '{SELECT}'),
    ('pepsi_httpd', 'table', 'setup_task_log', '{SELECT}');
-- end of setup tasks

-- ===========================================================================
-- Greylisting (pepsi-ingress, a listener's GREYLIST): a triplet (the
-- client's network, an IPv4 /24 or an IPv6 /64; the sender; the
-- recipient) is deferred until it comes back after GREYLIST_DELAY; a
-- client that came back is let through whole for GREYLIST_AUTO_WHITELIST.
-- In the database, so that every ingress host sharing it agrees.
-- ===========================================================================
CREATE TABLE pepsi.greylist (
    client text NOT NULL,
    sender text NOT NULL,
    recipient text NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    last_seen timestamptz NOT NULL DEFAULT now(),
    passed boolean NOT NULL DEFAULT false,
    PRIMARY KEY (client, sender, recipient)
);
CREATE TABLE pepsi.greylist_client (
    client text PRIMARY KEY,
    until timestamptz NOT NULL
);

-- True: let the recipient through.  A triplet first seen, or seen again
-- before delay, is deferred; one not retried within expire starts over.
CREATE FUNCTION pepsi.greylist_check(client text, sender text, recipient text, delay interval,
                                     expire interval, auto_whitelist interval)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    t pepsi.greylist;
BEGIN
    IF EXISTS (SELECT FROM pepsi.greylist_client c
               WHERE c.client = greylist_check.client AND c.until > now()) THEN
        RETURN true;
    END IF;
    INSERT INTO pepsi.greylist AS g (client, sender, recipient)
    VALUES (greylist_check.client, greylist_check.sender, greylist_check.recipient)
    ON CONFLICT ON CONSTRAINT greylist_pkey DO UPDATE
        SET last_seen = now(),
            first_seen = CASE WHEN NOT g.passed AND g.first_seen < now() - greylist_check.expire
                              THEN now() ELSE g.first_seen END
    RETURNING * INTO t;
    IF t.passed OR (t.last_seen > t.first_seen AND t.first_seen <= now() - delay) THEN
        IF NOT t.passed THEN
            UPDATE pepsi.greylist g SET passed = true
            WHERE g.client = t.client AND g.sender = t.sender AND g.recipient = t.recipient;
        END IF;
        INSERT INTO pepsi.greylist_client AS c (client, until)
        VALUES (greylist_check.client, now() + auto_whitelist)
        ON CONFLICT ON CONSTRAINT greylist_client_pkey DO UPDATE SET until = EXCLUDED.until;
        RETURN true;
    END IF;
    RETURN false;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'greylist_check', '{EXECUTE}'),
    ('pepsi_config', 'table', 'greylist', '{SELECT}'),
    ('pepsi_config', 'table', 'greylist_client', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('greylist_check');

SELECT pg_catalog.pg_extension_config_dump('pepsi.greylist', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.greylist_client', '');
-- end of greylisting

-- ===========================================================================
-- Senders bound to their login (pepsi-ingress, [ingress] SENDER_LOGIN_MAPS
-- "sql", SEND_LIMIT_MESSAGES, SEND_LIMIT_RECIPIENTS): the addresses each
-- account may use (a mailbox, or "@domain" for all of one), and what each
-- account sent per hour, counted here so that every ingress host sharing
-- the database enforces the same limits.
-- ===========================================================================
CREATE TABLE pepsi.sender_login (
    address text NOT NULL CHECK (address = lower(address) AND position('@' IN address) > 0),
    account text NOT NULL,
    PRIMARY KEY (account, address)
);
CREATE TABLE pepsi.send_count (
    account text NOT NULL,
    hour timestamptz NOT NULL,
    messages integer NOT NULL DEFAULT 0,
    recipients integer NOT NULL DEFAULT 0,
    PRIMARY KEY (account, hour)
);

CREATE FUNCTION pepsi.sender_login_addresses(account text) RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT l.address FROM pepsi.sender_login l WHERE l.account = sender_login_addresses.account
$$;

-- One recipient (the transaction's first also counts a message) taken
-- from the account's hour: false, and nothing counted, past a limit (0: none).
CREATE FUNCTION pepsi.send_count_take(account text, new_message boolean, max_messages integer,
                                      max_recipients integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    c pepsi.send_count;
BEGIN
    INSERT INTO pepsi.send_count AS s (account, hour)
    VALUES (send_count_take.account, date_trunc('hour', now()))
    ON CONFLICT ON CONSTRAINT send_count_pkey DO UPDATE SET messages = s.messages
    RETURNING * INTO c;
    IF (max_recipients > 0 AND c.recipients >= max_recipients)
       OR (new_message AND max_messages > 0 AND c.messages >= max_messages) THEN
        RETURN false;
    END IF;
    UPDATE pepsi.send_count s
    SET recipients = s.recipients + 1,
        messages = s.messages + CASE WHEN new_message THEN 1 ELSE 0 END
    WHERE s.account = c.account AND s.hour = c.hour;
    DELETE FROM pepsi.send_count s
    WHERE s.account = send_count_take.account AND s.hour < date_trunc('hour', now());
    RETURN true;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'sender_login_addresses', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'send_count_take', '{EXECUTE}'),
    ('pepsi_config', 'table', 'sender_login', '{SELECT}'),
    ('pepsi_config', 'table', 'send_count', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('sender_login_addresses'), ('send_count_take');

SELECT pg_catalog.pg_extension_config_dump('pepsi.sender_login', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.send_count', '');
-- end of senders bound to their login

-- ===========================================================================
-- Connection-level verdicts (pepsi-ingress, [ingress] DNSBL_SITES and a
-- listener's PREGREET_WAIT): a client's verdict (its DNSBL score's, the
-- pre-greeting test's, a protocol violation's) kept per address until it expires, so that its next
-- sessions, on any ingress host sharing the database, are not tested again.
-- ===========================================================================
CREATE TABLE pepsi.screen_verdict (
    client text PRIMARY KEY,
    verdict text NOT NULL CHECK (verdict IN ('pass', 'allowed', 'listed', 'pregreet', 'pipelining',
                                             'bare newline')),
    list text,
    expires timestamptz NOT NULL
);

-- The client's verdict, if one is kept and has not expired.
CREATE FUNCTION pepsi.screen_verdict_get(client text, OUT verdict text, OUT list text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT v.verdict, v.list FROM pepsi.screen_verdict v
    WHERE v.client = screen_verdict_get.client AND v.expires > now()
$$;

-- Keep a verdict for ttl; a pre-greeting verdict is not overwritten by a
-- DNSBL one before it expires.  Expired rows of other clients go too.
CREATE FUNCTION pepsi.screen_verdict_put(client text, verdict text, list text, ttl interval)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    DELETE FROM pepsi.screen_verdict v WHERE v.expires <= now();
    INSERT INTO pepsi.screen_verdict AS v (client, verdict, list, expires)
    VALUES (screen_verdict_put.client, screen_verdict_put.verdict, screen_verdict_put.list,
            now() + screen_verdict_put.ttl)
    ON CONFLICT ON CONSTRAINT screen_verdict_pkey DO UPDATE
        SET verdict = EXCLUDED.verdict, list = EXCLUDED.list, expires = EXCLUDED.expires
        WHERE v.verdict <> 'pregreet' OR EXCLUDED.verdict = 'pregreet';
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'screen_verdict_get', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'screen_verdict_put', '{EXECUTE}'),
    ('pepsi_config', 'table', 'screen_verdict', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('screen_verdict_get'), ('screen_verdict_put');

SELECT pg_catalog.pg_extension_config_dump('pepsi.screen_verdict', '');
-- end of connection-level verdicts

-- ===========================================================================
-- TLS reports (RFC 8460): the TLS outcomes pepsi-stage-relay-to-internet
-- counts, for pepsi-tlsrpt(8); pruning of the aggregates and of
-- pepsi-ingress's defence tables (schedule calls)
-- ===========================================================================

-- One row per UTC day and per what a report's policy and failure details
-- show: the recipient domain (policy_domain), the policy the sessions
-- were made under (policy_type sts, tlsa or no-policy-found; its text as
-- lines, policy_string, and its MX patterns or host, mx_host, each list
-- joined by newlines), and, for failed sessions, the RFC 8460 result type
-- with the MX host and address tried; result_type '' counts the
-- successful sessions.  The relay stage counts in memory and adds its
-- counts with pepsi.tls_tally() in the round trip it makes anyway for the
-- destination's slot (pepsi.destination_begin), or once when its worker
-- goes idle: no round trip per message.
CREATE TABLE pepsi.tls_aggregate (
    day                   date NOT NULL,
    policy_domain         text NOT NULL,
    policy_type           text NOT NULL CHECK (policy_type IN ('sts', 'tlsa', 'no-policy-found')),
    policy_string         text NOT NULL DEFAULT '',
    mx_host               text NOT NULL DEFAULT '',
    result_type           text NOT NULL DEFAULT '' CHECK (result_type ~ '^[a-z0-9-]{0,64}$'),
    receiving_mx_hostname text NOT NULL DEFAULT '',
    receiving_ip          text NOT NULL DEFAULT '',
    sending_mta_ip        text NOT NULL DEFAULT '',
    sessions              bigint NOT NULL CHECK (sessions > 0),
    PRIMARY KEY (policy_domain, day, policy_type, policy_string, mx_host, result_type,
                 receiving_mx_hostname, receiving_ip, sending_mta_ip)
);
CREATE INDEX tls_aggregate_day ON pepsi.tls_aggregate (day);
COMMENT ON TABLE pepsi.tls_aggregate IS
    'TLS sessions per day, policy and result, counted by pepsi-stage-relay-to-internet for pepsi-tlsrpt';

-- Add a batch of counts (the relay stage): a JSON array of objects with the
-- columns above (count for sessions), at most 100000; the day is now's (UTC).
CREATE FUNCTION pepsi.tls_tally(counts jsonb) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    added integer;
BEGIN
    IF counts IS NULL THEN
        RETURN 0;
    END IF;
    IF jsonb_typeof(counts) <> 'array' THEN
        RAISE EXCEPTION 'counts must be a JSON array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(counts) > 100000 THEN
        RAISE EXCEPTION 'at most 100000 records in one call, not %', jsonb_array_length(counts)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    INSERT INTO pepsi.tls_aggregate AS a (day, policy_domain, policy_type, policy_string, mx_host,
        result_type, receiving_mx_hostname, receiving_ip, sending_mta_ip, sessions)
    SELECT (now() AT TIME ZONE 'UTC')::date, lower(r.policy_domain), r.policy_type,
           coalesce(r.policy_string, ''), lower(coalesce(r.mx_host, '')), coalesce(r.result_type, ''),
           lower(coalesce(r.receiving_mx_hostname, '')), coalesce(r.receiving_ip, ''),
           coalesce(r.sending_mta_ip, ''), sum(r.count)
    FROM jsonb_to_recordset(counts) AS r(policy_domain text, policy_type text, policy_string text,
        mx_host text, result_type text, receiving_mx_hostname text, receiving_ip text,
        sending_mta_ip text, count bigint)
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
    ON CONFLICT (policy_domain, day, policy_type, policy_string, mx_host, result_type,
                 receiving_mx_hostname, receiving_ip, sending_mta_ip)
    DO UPDATE SET sessions = a.sessions + excluded.sessions;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added;
END
$$;

-- The days of past reports go (a pepsi.schedule row may call it:
-- tls_aggregate_prune on the allow-list).  Returns how many rows went.
CREATE FUNCTION pepsi.tls_aggregate_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 day' THEN
        RAISE EXCEPTION 'older_than must be a day or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A day''s counts are reported after the day; keep at least the last one.';
    END IF;
    DELETE FROM pepsi.tls_aggregate a WHERE a.day < ((now() - older_than) AT TIME ZONE 'UTC')::date;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

-- pepsi-tlsrpt's message into the queue (pepsi_config), as
-- pepsi.dmarc_report_inject: a new row at stage, to the one mailto: rua
-- address, marked as Pepsi's own mail, with the token
-- tlsrpt:<report id>:<rua>, so a report is queued once per destination
-- however often the tool runs.  Logged.  Returns the row's id, or NULL
-- when it was queued already.
CREATE FUNCTION pepsi.tlsrpt_inject(stage text, mail_from text, rua text, headers bytea, body bytea,
    policy_domain text, report_id text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    queued bigint;
BEGIN
    IF report_id IS NULL OR report_id = '' OR policy_domain IS NULL OR policy_domain = '' THEN
        RAISE EXCEPTION 'a report needs its report_id and policy_domain' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    queued := pepsi.workqueue_inject(stage, mail_from, ARRAY[rua], headers, body,
        jsonb_build_object('origin', jsonb_build_object('trust', 'pepsi', 'program', 'pepsi-tlsrpt')),
        format('tlsrpt:%s:%s', report_id, lower(rua)));
    PERFORM pepsi.event_log_write('tlsrpt_sent',
        jsonb_build_object('domain', policy_domain, 'rua', rua, 'report_id', report_id, 'row', queued));
    RETURN queued;
END
$$;

-- A report POSTed to an https: rua (pepsi-tlsrpt does the POST): logged,
-- so pepsi.event_log says what went where, as for the queued ones.
CREATE FUNCTION pepsi.tlsrpt_posted(policy_domain text, rua text, report_id text, status integer)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    PERFORM pepsi.event_log_write('tlsrpt_sent',
        jsonb_build_object('domain', policy_domain, 'rua', rua, 'report_id', report_id, 'http_status', status));
END
$$;

-- Pruning pepsi-ingress's defence tables (each a schedule call): the
-- greylist triplets not seen for older_than and the clients whose
-- auto-whitelisting ended; the hours of send_count older than older_than
-- (only the current hour is ever read); the expired screen verdicts.
-- Each returns how many rows went.
CREATE FUNCTION pepsi.greylist_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
    clients bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'older_than must be an hour or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Longer than the listeners'' GREYLIST_EXPIRE, or retried triplets start over.';
    END IF;
    DELETE FROM pepsi.greylist g WHERE g.last_seen < now() - older_than;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    DELETE FROM pepsi.greylist_client c WHERE c.until < now();
    GET DIAGNOSTICS clients = ROW_COUNT;
    RETURN pruned + clients;
END
$$;

CREATE FUNCTION pepsi.send_count_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'older_than must be an hour or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pepsi.send_count s WHERE s.hour < date_trunc('hour', now()) - older_than;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

CREATE FUNCTION pepsi.screen_verdict_prune() RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
BEGIN
    DELETE FROM pepsi.screen_verdict v WHERE v.expires <= now();
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'tls_tally', '{EXECUTE}'),
    ('pepsi_config', 'table', 'tls_aggregate', '{SELECT}'),
    ('pepsi_config', 'function', 'tls_aggregate_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'tlsrpt_inject', '{EXECUTE}'),
    ('pepsi_config', 'function', 'tlsrpt_posted', '{EXECUTE}'),
    ('pepsi_config', 'function', 'greylist_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'send_count_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'screen_verdict_prune', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'tls_aggregate', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('tls_tally'), ('tls_aggregate_prune'), ('tlsrpt_inject'),
    ('tlsrpt_posted'), ('greylist_prune'), ('send_count_prune'), ('screen_verdict_prune');

SELECT pg_catalog.pg_extension_config_dump('pepsi.tls_aggregate', '');


-- end of TLS reports and pruning

-- ===========================================================================
-- Owner settings: domain rows, pepsi-settings and settings by e-mail
--
-- pepsi.settings holds a domain's rows too, written '@example.org': what
-- the domain's addresses have unless they set their own (an address row
-- wins over its domain's, and both over the configuration's value,
-- common/config/settings.c).  Only the options schema/options.def marks
-- OWNER may be set (pepsi.settings_option_problem checks the option and
-- the value with the programs' own code).  Operators set them with
-- pepsi-settings (pepsi.settings_set/unset, each change audited in
-- pepsi.event_log); an address's owner by mail to the settings address
-- (pepsi-stage-settings): the stage records the requested changes in
-- pepsi.settings_request with the hash of a single-use token it mails to
-- the owner, and applies them only when the owner answers with the token
-- before it expires (pepsi.settings_request_confirm).  The stage's role
-- may write neither table itself: the two request functions run as the
-- owner and check everything.
-- ===========================================================================

-- Why the owner of an address may not set option to value (a sentence),
-- or NULL when they may: options.def OWNER, and the value as its type wants.
CREATE FUNCTION pepsi.settings_option_problem(option text, value text) RETURNS text
AS 'MODULE_PATHNAME', 'settings_option_problem'
LANGUAGE C STABLE;

-- The canonical form of a settings row's key: an address (lower case,
-- as pepsi.virtual_mailbox_canonical) or a domain's '@example.org'.
CREATE FUNCTION pepsi.settings_key(address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := lower(btrim(address));
BEGIN
    IF address IS NULL THEN
        RAISE EXCEPTION 'address must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF key !~ '^[^@[:space:][:cntrl:]]*@[^@[:space:][:cntrl:]]+$' OR length(key) > 320 THEN
        RAISE EXCEPTION 'invalid address "%"', address
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An address (user@example.org) or a domain (@example.org), at most 320 characters.';
    END IF;
    RETURN key;
END
$$;

-- Set option of address (or '@domain') to value; audited.
CREATE FUNCTION pepsi.settings_set(address text, option text, value text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    problem text := pepsi.settings_option_problem(option, value);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pepsi.settings AS s (address, option, value)
    VALUES (key, settings_set.option, settings_set.value)
    ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
    PERFORM pepsi.event_log_write('settings_set',
        jsonb_build_object('address', key, 'option', option, 'value', left(value, 200)));
END
$$;

-- Remove option of address (or '@domain'); false if it was not set.  Audited.
CREATE FUNCTION pepsi.settings_unset(address text, option text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.settings s WHERE s.address = key AND s.option = settings_unset.option;
    removed := FOUND;
    PERFORM pepsi.event_log_write('settings_unset',
        jsonb_build_object('address', key, 'option', option, 'removed', removed));
    RETURN removed;
END
$$;

-- The settings in force for address: its own rows and its domain's it
-- does not override (source 'address' or 'domain').
CREATE FUNCTION pepsi.settings_resolved(address text)
RETURNS TABLE (option text, value text, source text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT DISTINCT ON (s.option) s.option, s.value,
           CASE WHEN s.address LIKE '@%' THEN 'domain' ELSE 'address' END
    FROM pepsi.settings s
    WHERE s.address = pepsi.settings_key(settings_resolved.address)
       OR s.address = '@' || split_part(pepsi.settings_key(settings_resolved.address), '@', 2)
    ORDER BY s.option, s.address LIKE '@%'
$$;

CREATE TABLE pepsi.settings_request (
    token_hash  bytea PRIMARY KEY,
    address     text NOT NULL CHECK (address ~ '^[^@\s]+@[^@\s]+$'),
    changes     jsonb NOT NULL CHECK (jsonb_typeof(changes) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);
CREATE INDEX settings_request_expires_at ON pepsi.settings_request (expires_at);
COMMENT ON TABLE pepsi.settings_request IS
    'Setting changes an owner asked for by mail, applied when the single-use token mailed to them comes back';

-- Record the changes (an object option -> value, null to unset) address
-- asked for, and return the token that confirms them within ttl (only
-- its hash is kept).  Requests that ended a day ago go.  Raises, naming
-- the problem, when a change is not one the owner may make.
CREATE FUNCTION pepsi.settings_request_create(address text, changes jsonb, ttl interval) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    change record;
    problem text;
BEGIN
    IF key LIKE '@%' THEN
        RAISE EXCEPTION 'only an address, not a domain, asks for its settings by mail'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(changes) IS DISTINCT FROM 'object' OR changes = '{}' THEN
        RAISE EXCEPTION 'changes must be a non-empty JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '30 days' THEN
        RAISE EXCEPTION 'invalid token lifetime %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to 30 days.';
    END IF;
    FOR change IN SELECT * FROM jsonb_each(changes) LOOP
        IF jsonb_typeof(change.value) NOT IN ('string', 'null') THEN
            RAISE EXCEPTION 'the value of % must be text or null', change.key
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        problem := pepsi.settings_option_problem(change.key,
                                                 coalesce(change.value #>> '{}', ''));
        IF problem IS NOT NULL AND NOT (jsonb_typeof(change.value) = 'null'
                                        AND pepsi.settings_option_problem(change.key, NULL) IS NULL) THEN
            RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    DELETE FROM pepsi.settings_request r WHERE r.expires_at < now() - interval '1 day';
    INSERT INTO pepsi.settings_request (token_hash, address, changes, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), key, changes, now() + ttl);
    PERFORM pepsi.event_log_write('settings_request',
        jsonb_build_object('address', key, 'options', (SELECT jsonb_agg(k ORDER BY k) FROM jsonb_object_keys(changes) k)));
    RETURN token;
END
$$;

-- Apply the changes token confirms for address, once: NULL when applied,
-- else why not (unknown, already used, expired, another address's).
-- Each change is audited as pepsi-settings' are.
CREATE FUNCTION pepsi.settings_request_confirm(address text, token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    request pepsi.settings_request;
    change record;
BEGIN
    SELECT * INTO request FROM pepsi.settings_request r
    WHERE r.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8')) FOR UPDATE;
    IF NOT FOUND OR request.address <> key THEN
        RETURN 'the token is not one this address was sent';
    ELSIF request.used_at IS NOT NULL THEN
        RETURN format('the token was already used (at %s)', to_char(request.used_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"'));
    ELSIF request.expires_at < now() THEN
        RETURN 'the token has expired: send the commands again';
    END IF;
    UPDATE pepsi.settings_request r SET used_at = now() WHERE r.token_hash = request.token_hash;
    FOR change IN SELECT * FROM jsonb_each(request.changes) LOOP
        IF jsonb_typeof(change.value) = 'null' THEN
            DELETE FROM pepsi.settings s WHERE s.address = key AND s.option = change.key;
            PERFORM pepsi.event_log_write('settings_unset',
                jsonb_build_object('address', key, 'option', change.key, 'by', 'mail'));
        ELSE
            INSERT INTO pepsi.settings AS s (address, option, value)
            VALUES (key, change.key, change.value #>> '{}')
            ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
            PERFORM pepsi.event_log_write('settings_set',
                jsonb_build_object('address', key, 'option', change.key,
                                   'value', left(change.value #>> '{}', 200), 'by', 'mail'));
        END IF;
    END LOOP;
    IF request.changes ? 'VACATION' OR request.changes ? 'VACATION_MESSAGE' THEN
        DELETE FROM pepsi.autoreply_sent a WHERE a.responder = key;
    END IF;
    RETURN NULL;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'settings_option_problem', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_key', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_unset', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_resolved', '{EXECUTE}'),
    ('pepsi_config', 'table', 'settings_request', '{SELECT}'),
    ('pepsi_stage', 'function', 'settings_option_problem', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_key', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_resolved', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_request_create', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_request_confirm', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('settings_set'), ('settings_unset'), ('settings_request_create'),
    ('settings_request_confirm');

SELECT pg_catalog.pg_extension_config_dump('pepsi.settings_request', '');
-- end of owner settings

-- ============================================================================
-- Dispatcher stage sets: a dispatcher that serves only the stages of its
-- [dispatch] STAGES resets only those stages' orphaned rows at start; the
-- rows another dispatcher's workers hold at other stages are not orphans.
-- The one-argument form stays for the dispatcher that serves every stage.
-- The grant rule on workqueue_reset_orphans (pepsi_dispatch) covers both.
CREATE FUNCTION pepsi.workqueue_reset_orphans(except_ids bigint[], stages text[])
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_reset_orphans' LANGUAGE C CALLED ON NULL INPUT;
-- end of dispatcher stage sets

-- ===========================================================================
-- The confirm-to-send secretary: pepsi-stage-check-whitelist and
-- pepsi-whitelist
--
-- An address whose owner turned WHITELIST on takes mail only from the
-- senders on its whitelist (pepsi.whitelist).  Mail from anyone else is
-- held at the stage (paused with no retry time, as pepsi.queue_hold
-- leaves a row) and recorded in pepsi.secretary_held against the open
-- challenge of that owner and sender (pepsi.secretary_challenge, one per
-- pair at a time).  The sender gets one challenge, carrying a single-use
-- token of which only the hash is kept, and only when the stage found the
-- sender's address verified (SPF or aligned DKIM): an unverified sender's
-- mail is held without one.  The token, in a reply or through the page
-- pepsi-httpd serves, releases every held row of the challenge and
-- whitelists the sender (pepsi.secretary_release).  Held mail that nobody
-- released expires (pepsi.secretary_expire, a call a pepsi.schedule row
-- may make).  The stage's role writes none of the tables itself: the
-- functions run as the owner and check everything.
-- ===========================================================================

CREATE TABLE pepsi.whitelist (
    owner       text NOT NULL CHECK (owner ~ '^[^@\s]+@[^@\s]+$'),
    sender      text NOT NULL CHECK (sender ~ '^[^@\s]+@[^@\s]+$'),
    source      text NOT NULL CHECK (source IN ('reply', 'link', 'owner', 'sent-folder', 'operator')),
    added_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, sender)
);
COMMENT ON TABLE pepsi.whitelist IS
    'The senders an address that turned WHITELIST on takes mail from (pepsi-stage-check-whitelist)';

CREATE TABLE pepsi.secretary_challenge (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner       text NOT NULL CHECK (owner ~ '^[^@\s]+@[^@\s]+$'),
    sender      text NOT NULL,
    token_hash  bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    challenged_at timestamptz,
    released_at timestamptz,
    released_by text CHECK (released_by IN ('reply', 'link')),
    -- The order its payment request names is pepsi-ID-ORDER_REF: 128
    -- bits of pg_strong_random, so that no one can guess an open one and
    -- have a proof judged (pepsi-stage-check-whitelist(8)).  NULL only
    -- for a challenge opened before 0.13 (given one when first sent),
    -- whose order was pepsi-ID (pepsi--0.12--0.13.sql says why it counts).
    order_ref   text DEFAULT encode(substr(sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')), 1, 16), 'hex')
                CHECK (order_ref ~ '^[0-9a-f]{32}$')
);
CREATE UNIQUE INDEX secretary_challenge_open ON pepsi.secretary_challenge (owner, sender)
    WHERE released_at IS NULL;
CREATE INDEX secretary_challenge_expires_at ON pepsi.secretary_challenge (expires_at);
CREATE INDEX secretary_challenge_challenged ON pepsi.secretary_challenge (owner, challenged_at)
    WHERE challenged_at IS NOT NULL;
COMMENT ON TABLE pepsi.secretary_challenge IS
    'Mail held for an owner from one sender not on its whitelist, and the hash of the token that releases it';

CREATE TABLE pepsi.secretary_held (
    row_id       bigint PRIMARY KEY,
    challenge_id bigint NOT NULL REFERENCES pepsi.secretary_challenge (id) ON DELETE CASCADE,
    held_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX secretary_held_challenge ON pepsi.secretary_held (challenge_id);
COMMENT ON TABLE pepsi.secretary_held IS
    'The queue rows pepsi-stage-check-whitelist holds, each under its challenge';

-- The canonical form of an address of the secretary (lower case), or an error naming it.
CREATE FUNCTION pepsi.secretary_address(address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := lower(btrim(address));
BEGIN
    IF key IS NULL OR key !~ '^[^@[:space:][:cntrl:]]+@[^@[:space:][:cntrl:]]+$' OR length(key) > 320 THEN
        RAISE EXCEPTION 'invalid address "%"', address
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An address (user@example.org), at most 320 characters.';
    END IF;
    RETURN key;
END
$$;

-- The secretary's decision on the row row_id, from sender to owner (an
-- address that turned WHITELIST on), as a JSON object:
--   {"action": "pass"}      the sender is on the owner's whitelist
--   {"action": "released"}  the row is the sender's reply carrying the
--                           token of its open challenge (token, else, when
--                           look_in_text (the row refers to a challenge),
--                           one found in its text): the held mail is
--                           released and the sender whitelisted; the
--                           reply itself is done with
--   {"action": "hold", "token": T or null, "why": ...}
--                           the row is recorded as held (the stage then
--                           holds it); T is the new challenge's token when
--                           one is to be sent now (and "reference" its
--                           order reference, which its payment request
--                           names), only when verified
--                           (the stage found the sender's address proven
--                           and the message one an auto-reply may
--                           answer), no challenge of the pair is open yet
--                           (or its mail came unverified), and the owner
--                           sent fewer than max_per_hour in the last hour.
-- ttl is how long held mail waits for its release.
CREATE FUNCTION pepsi.secretary_decide(owner text, sender text, row_id bigint, verified boolean,
                                       token text, look_in_text boolean, ttl interval, max_per_hour integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
#variable_conflict use_column
DECLARE
    key text := pepsi.secretary_address(owner);
    from_key text := lower(coalesce(sender, ''));
    challenge pepsi.secretary_challenge;
    new_token text;
    sent_last_hour bigint := 0;
    open_found boolean;
BEGIN
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '365 days' THEN
        RAISE EXCEPTION 'invalid hold time %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to a year (HOLD_TIME).';
    END IF;
    IF from_key <> '' AND EXISTS (SELECT FROM pepsi.whitelist w WHERE w.owner = key AND w.sender = from_key) THEN
        RETURN '{"action": "pass"}';
    END IF;
    -- The common case: mail of a pair already challenged, which only
    -- waits (no token to try, the challenge in time).  FOR SHARE, so the
    -- batches holding the pair's mail do not wait for each other's commit
    -- (their transactions hold the rows and inject challenges too), while
    -- a release or an expiry (which updates the row) still waits for them.
    IF NOT (verified AND (token IS NOT NULL OR look_in_text)) THEN
        SELECT * INTO challenge FROM pepsi.secretary_challenge c
        WHERE c.owner = key AND c.sender = from_key AND c.released_at IS NULL
          AND c.challenged_at IS NOT NULL AND c.expires_at > now() FOR SHARE;
        IF FOUND THEN
            INSERT INTO pepsi.secretary_held (row_id, challenge_id) VALUES (row_id, challenge.id)
            ON CONFLICT ON CONSTRAINT secretary_held_pkey DO UPDATE SET challenge_id = excluded.challenge_id;
            RETURN jsonb_build_object('action', 'hold', 'token', NULL, 'challenge', challenge.id,
                                      'expires_at', challenge.expires_at,
                                      'why', CASE WHEN verified THEN 'challenged before'
                                                  ELSE 'not verified: no challenge' END);
        END IF;
    END IF;
    -- FOR NO KEY UPDATE: two decisions of the pair still take turns, but
    -- another message's secretary_held insert (its foreign key's KEY SHARE
    -- on this row) no longer waits for this whole call (bench/secretary).
    SELECT * INTO challenge FROM pepsi.secretary_challenge c
    WHERE c.owner = key AND c.sender = from_key AND c.released_at IS NULL FOR NO KEY UPDATE;
    open_found := FOUND;
    -- A verified reply to the open challenge releases it.
    IF verified AND open_found AND challenge.challenged_at IS NOT NULL AND challenge.expires_at > now() THEN
        IF (token IS NOT NULL AND sha256(convert_to(token, 'UTF8')) = challenge.token_hash)
           OR (look_in_text AND EXISTS (SELECT FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id,
                              regexp_matches(encode(substring(b.body FOR 65536), 'escape'), '[0-9a-f]{64}', 'g') m
                      WHERE w.id = row_id AND sha256(convert_to(m[1], 'UTF8')) = challenge.token_hash)) THEN
            PERFORM pepsi.secretary_release_challenge(challenge.id, 'reply');
            RETURN '{"action": "released"}';
        END IF;
    END IF;
    IF open_found AND challenge.expires_at <= now() THEN
        -- Its time is up (secretary_expire has not come by yet): a new hold.
        DELETE FROM pepsi.workqueue w USING pepsi.secretary_held h
        WHERE h.challenge_id = challenge.id AND w.id = h.row_id AND w.status = 'paused' AND w.timeout = 'infinity';
        DELETE FROM pepsi.secretary_challenge c WHERE c.id = challenge.id;
        open_found := false;
    END IF;
    IF verified AND NOT (open_found AND challenge.challenged_at IS NOT NULL) THEN
        SELECT count(*) INTO sent_last_hour FROM pepsi.secretary_challenge c
        WHERE c.owner = key AND c.challenged_at > now() - interval '1 hour';
        IF sent_last_hour < max_per_hour THEN
            new_token := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
        END IF;
    END IF;
    IF NOT open_found THEN
        INSERT INTO pepsi.secretary_challenge (owner, sender, token_hash, expires_at, challenged_at)
        VALUES (key, from_key, sha256(convert_to(coalesce(new_token, gen_random_uuid()::text), 'UTF8')),
                now() + ttl, CASE WHEN new_token IS NOT NULL THEN now() END)
        ON CONFLICT (owner, sender) WHERE released_at IS NULL DO NOTHING
        RETURNING * INTO challenge;
        IF NOT FOUND THEN
            -- Another message of the pair opened it meanwhile (this call
            -- waited for its commit): join that one.  A row that only
            -- waits under it, sent and in time, takes it FOR SHARE as
            -- above, so that the pair's later batches do not queue behind
            -- this one's commit too (bench/secretary).
            IF NOT (verified AND (token IS NOT NULL OR look_in_text)) THEN
                SELECT * INTO challenge FROM pepsi.secretary_challenge c
                WHERE c.owner = key AND c.sender = from_key AND c.released_at IS NULL
                  AND c.challenged_at IS NOT NULL AND c.expires_at > now() FOR SHARE;
                IF FOUND THEN
                    INSERT INTO pepsi.secretary_held (row_id, challenge_id) VALUES (row_id, challenge.id)
                    ON CONFLICT ON CONSTRAINT secretary_held_pkey DO UPDATE SET challenge_id = excluded.challenge_id;
                    RETURN jsonb_build_object('action', 'hold', 'token', NULL, 'challenge', challenge.id,
                                              'expires_at', challenge.expires_at,
                                              'why', CASE WHEN verified THEN 'challenged before'
                                                          ELSE 'not verified: no challenge' END);
                END IF;
            END IF;
            SELECT * INTO challenge FROM pepsi.secretary_challenge c
            WHERE c.owner = key AND c.sender = from_key AND c.released_at IS NULL FOR NO KEY UPDATE;
            open_found := true;
        END IF;
    END IF;
    IF open_found AND new_token IS NOT NULL THEN
        IF challenge.challenged_at IS NULL THEN
            UPDATE pepsi.secretary_challenge c
            SET token_hash = sha256(convert_to(new_token, 'UTF8')), challenged_at = now()
            WHERE c.id = challenge.id;
            IF challenge.order_ref IS NULL THEN
                -- Opened before 0.13, and sent only now: its payment
                -- request names a reference, as every new one does.
                UPDATE pepsi.secretary_challenge c SET order_ref = DEFAULT
                WHERE c.id = challenge.id RETURNING c.order_ref INTO challenge.order_ref;
            END IF;
        ELSE
            new_token := NULL;
        END IF;
    END IF;
    INSERT INTO pepsi.secretary_held (row_id, challenge_id) VALUES (row_id, challenge.id)
    ON CONFLICT ON CONSTRAINT secretary_held_pkey DO UPDATE SET challenge_id = excluded.challenge_id;
    RETURN jsonb_build_object('action', 'hold', 'token', new_token, 'challenge', challenge.id,
                              'reference', CASE WHEN new_token IS NOT NULL THEN challenge.order_ref END,
                              'expires_at', challenge.expires_at,
                              'why', CASE WHEN new_token IS NOT NULL THEN 'challenged'
                                          WHEN NOT verified THEN 'not verified: no challenge'
                                          WHEN challenge.challenged_at IS NOT NULL THEN 'challenged before'
                                          ELSE format('%s challenges in the last hour (MAX_CHALLENGES_PER_HOUR)',
                                                      sent_last_hour) END);
END
$$;

-- Release challenge id (by 'reply' or 'link'): its held rows become
-- pending at their stage, where the whitelisted sender now passes, and the
-- sender goes on the owner's whitelist.  Returns how many rows were released.
CREATE FUNCTION pepsi.secretary_release_challenge(id bigint, released_by text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    challenge pepsi.secretary_challenge;
    released integer;
BEGIN
    UPDATE pepsi.secretary_challenge c SET released_at = now(), released_by = secretary_release_challenge.released_by
    WHERE c.id = secretary_release_challenge.id AND c.released_at IS NULL RETURNING * INTO challenge;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF challenge.sender <> '' THEN
        INSERT INTO pepsi.whitelist (owner, sender, source) VALUES (challenge.owner, challenge.sender, released_by)
        ON CONFLICT ON CONSTRAINT whitelist_pkey DO NOTHING;
    END IF;
    UPDATE pepsi.workqueue w SET status = 'pending', timeout = NULL
    FROM pepsi.secretary_held h
    WHERE h.challenge_id = challenge.id AND w.id = h.row_id AND w.status = 'paused' AND w.timeout = 'infinity';
    GET DIAGNOSTICS released = ROW_COUNT;
    DELETE FROM pepsi.secretary_held h WHERE h.challenge_id = challenge.id;
    IF released > 0 THEN
        PERFORM pepsi.notify_workqueue();
    END IF;
    RETURN released;
END
$$;

-- What the page of a challenge's link shows (pepsi-httpd, GET): the
-- owner, the sender, how many messages wait and until when, and whether
-- the token may still be used (state: open, released, expired, unknown).
-- Reading changes nothing.
CREATE FUNCTION pepsi.secretary_challenge_show(token text)
RETURNS TABLE (state text, owner text, sender text, held bigint, expires_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN c.id IS NULL THEN 'unknown' WHEN c.released_at IS NOT NULL THEN 'released'
                WHEN c.expires_at <= now() THEN 'expired' ELSE 'open' END,
           c.owner, c.sender,
           (SELECT count(*) FROM pepsi.secretary_held h WHERE h.challenge_id = c.id), c.expires_at
    FROM (SELECT 1) one
    LEFT JOIN pepsi.secretary_challenge c ON c.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8'))
                                          AND c.challenged_at IS NOT NULL
$$;

-- Release the held mail of the challenge token names, once (the link's
-- page, POST): NULL when released, else why not.
CREATE FUNCTION pepsi.secretary_release(token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    challenge pepsi.secretary_challenge;
BEGIN
    SELECT * INTO challenge FROM pepsi.secretary_challenge c
    WHERE c.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8')) AND c.challenged_at IS NOT NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'the link is not one this server sent';
    ELSIF challenge.released_at IS NOT NULL THEN
        RETURN format('the link was already used (at %s)',
                      to_char(challenge.released_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"'));
    ELSIF challenge.expires_at <= now() THEN
        RETURN 'the link has expired, and the messages with it';
    END IF;
    PERFORM pepsi.secretary_release_challenge(challenge.id, 'link');
    RETURN NULL;
END
$$;

-- Delete the held mail whose time is up, with its challenges, and the
-- records of released challenges a day after their time (so a reused
-- token is told it was used until then).  Returns how many queue rows
-- went.  The maintenance worker runs it from a pepsi.schedule row
-- (function_name => 'secretary_expire').
CREATE FUNCTION pepsi.secretary_expire() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    deleted bigint;
BEGIN
    DELETE FROM pepsi.workqueue w USING pepsi.secretary_held h, pepsi.secretary_challenge c
    WHERE c.expires_at <= now() AND c.released_at IS NULL AND h.challenge_id = c.id AND w.id = h.row_id
      AND w.status = 'paused' AND w.timeout = 'infinity';
    GET DIAGNOSTICS deleted = ROW_COUNT;
    DELETE FROM pepsi.secretary_challenge c
    WHERE (c.released_at IS NULL AND c.expires_at <= now())
       OR (c.released_at IS NOT NULL AND c.expires_at <= now() - interval '1 day');
    -- Rows an operator released or deleted meanwhile.
    DELETE FROM pepsi.secretary_held h
    WHERE NOT EXISTS (SELECT FROM pepsi.workqueue w WHERE w.id = h.row_id);
    RETURN deleted;
END
$$;

-- pepsi-whitelist: a local user's own list (the program decides whose;
-- its role may call nothing else of the secretary).  Each change audited.
CREATE FUNCTION pepsi.whitelist_add(owner text, sender text, source text DEFAULT 'owner') RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.secretary_address(owner);
    from_key text := pepsi.secretary_address(sender);
    open_id bigint;
BEGIN
    INSERT INTO pepsi.whitelist (owner, sender, source) VALUES (key, from_key, source)
    ON CONFLICT ON CONSTRAINT whitelist_pkey DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pepsi.event_log_write('whitelist_add', jsonb_build_object('owner', key, 'sender', from_key, 'source', source));
    -- What the sender had waiting goes now.
    SELECT c.id INTO open_id FROM pepsi.secretary_challenge c
    WHERE c.owner = key AND c.sender = from_key AND c.released_at IS NULL;
    IF open_id IS NOT NULL THEN
        UPDATE pepsi.workqueue w SET status = 'pending', timeout = NULL
        FROM pepsi.secretary_held h
        WHERE h.challenge_id = open_id AND w.id = h.row_id AND w.status = 'paused' AND w.timeout = 'infinity';
        DELETE FROM pepsi.secretary_challenge c WHERE c.id = open_id;
        PERFORM pepsi.notify_workqueue();
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION pepsi.whitelist_remove(owner text, sender text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.secretary_address(owner);
    from_key text := pepsi.secretary_address(sender);
    removed boolean;
BEGIN
    DELETE FROM pepsi.whitelist w WHERE w.owner = key AND w.sender = from_key;
    removed := FOUND;
    PERFORM pepsi.event_log_write('whitelist_remove',
        jsonb_build_object('owner', key, 'sender', from_key, 'removed', removed));
    RETURN removed;
END
$$;

CREATE FUNCTION pepsi.whitelist_list(owner text)
RETURNS TABLE (sender text, source text, added_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT w.sender, w.source, w.added_at FROM pepsi.whitelist w
    WHERE w.owner = pepsi.secretary_address(whitelist_list.owner) ORDER BY w.sender
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'whitelist', '{SELECT}'),
    ('pepsi_config', 'table', 'secretary_challenge', '{SELECT}'),
    ('pepsi_config', 'table', 'secretary_held', '{SELECT}'),
    ('pepsi_config', 'function', 'secretary_address', '{EXECUTE}'),
    ('pepsi_config', 'function', 'secretary_expire', '{EXECUTE}'),
    ('pepsi_config', 'function', 'whitelist_add', '{EXECUTE}'),
    ('pepsi_config', 'function', 'whitelist_remove', '{EXECUTE}'),
    ('pepsi_config', 'function', 'whitelist_list', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'secretary_address', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'secretary_decide', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secretary_challenge_show', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secretary_release', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('secretary_decide'), ('secretary_release_challenge'),
    ('secretary_challenge_show'), ('secretary_release'), ('secretary_expire'), ('whitelist_add'),
    ('whitelist_remove'), ('whitelist_list');
INSERT INTO pepsi.grant_owner (name) VALUES ('secretary_release_challenge');

SELECT pg_catalog.pg_extension_config_dump('pepsi.whitelist', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.secretary_challenge', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.secretary_challenge_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.secretary_held', '');
-- end of the confirm-to-send secretary

-- ===========================================================================
-- The key store: end-to-end encryption's keys
--
-- The key pairs of the addresses we serve (crypto_identity), the public
-- keys and certificates of correspondents (peer_key) and who among them
-- holds one of ours (peer_has_own_key), the CAs an S/MIME chain must reach
-- (ca_trust), and key discovery's requests and negative cache
-- (key_request).  pepsi-keys writes identities, pepsi-stage-encrypt and
-- pepsi-stage-decrypt read them, pepsi-stage-autocrypt-learn records
-- peers' keys (docs/pepsi-keys.8.md).
--
-- private_wrapped is the private half sealed with AES-256-GCM under the
-- key-encryption key of a secrets.d fragment (common/crypto/kek.c: a
-- version byte, the KEK's id, the nonce, the ciphertext and the tag), so a
-- dump holds ciphertext only.  The pepsi_crypto group role alone may read
-- it: every other role that reads the table does so through a
-- column-level grant without it (pepsi.grant_column).  The crypto stages
-- run setuid pepsi-crypto and connect over the local socket with peer
-- authentication, whose login role is a member of pepsi_crypto (and
-- through it of pepsi_stage, for the queue).
-- ===========================================================================

INSERT INTO pepsi.grant_role VALUES
    ('pepsi_crypto', 'Pepsi: the key store (pepsi-stage-encrypt, pepsi-stage-decrypt, pepsi-keys): pepsi_stage, and the private keys');
SELECT pepsi.grant_roles_create();
INSERT INTO pepsi.grant_membership VALUES ('pepsi_crypto', 'pepsi_stage');

-- One row per key pair and capability.  status: active (used), retired
-- (kept to decrypt and verify what was made with it, not used to encrypt
-- or sign), revoked (never used again; its revocation is published).  One
-- primary active key per address, protocol and capability.  A purge drops
-- the private half and keeps the row (the public half still verifies).
CREATE TABLE pepsi.crypto_identity (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address           text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    protocol          text NOT NULL CHECK (protocol IN ('openpgp', 'smime')),
    capability        text NOT NULL CHECK (capability IN ('sign', 'encrypt', 'both')),
    algorithm         text NOT NULL,
    fingerprint       text NOT NULL CHECK (fingerprint ~ '^[0-9A-F]{40,64}$'),
    public_key        bytea NOT NULL,
    private_wrapped   bytea,
    kek_id            text,
    status            text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired', 'revoked')),
    is_primary        boolean NOT NULL DEFAULT false,
    published         boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz,
    revoked_at        timestamptz,
    revocation_reason text,
    private_purged_at timestamptz,
    UNIQUE (protocol, fingerprint),
    CHECK ((private_wrapped IS NULL) = (kek_id IS NULL)),
    CHECK (private_purged_at IS NULL OR private_wrapped IS NULL),
    CHECK ((status = 'revoked') = (revoked_at IS NOT NULL)),
    CHECK (NOT is_primary OR status = 'active')
);
CREATE UNIQUE INDEX crypto_identity_primary ON pepsi.crypto_identity (address, protocol, capability)
    WHERE is_primary;
CREATE INDEX crypto_identity_address ON pepsi.crypto_identity (address);
COMMENT ON TABLE pepsi.crypto_identity IS
    'Key pairs of the addresses we serve: public half, private half sealed under the KEK, lifecycle';

-- A correspondent's key, as found: source says where (wkd-advanced,
-- wkd-direct, openpgpkey and smimea from DNS, keyserver, autocrypt,
-- import), dnssec whether that answer was validated, verdict the last
-- check of it (why it was refused in verdict_reason) and cache_until when
-- to look again.
CREATE TABLE pepsi.peer_key (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address        text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    protocol       text NOT NULL CHECK (protocol IN ('openpgp', 'smime')),
    fingerprint    text NOT NULL CHECK (fingerprint ~ '^[0-9A-F]{40,64}$'),
    key_data       bytea NOT NULL,
    source         text NOT NULL CHECK (source IN ('wkd-advanced', 'wkd-direct', 'openpgpkey', 'smimea',
                                                   'keyserver', 'autocrypt', 'import', 'smime-signed')),
    dnssec         boolean NOT NULL DEFAULT false,
    verdict        text NOT NULL DEFAULT 'unchecked'
                   CHECK (verdict IN ('unchecked', 'valid', 'expired', 'revoked', 'mismatch', 'untrusted', 'invalid')),
    verdict_reason text,
    prefer_encrypt boolean NOT NULL DEFAULT false,
    expires_at     timestamptz,
    fetched_at     timestamptz NOT NULL DEFAULT now(),
    cache_until    timestamptz NOT NULL,
    smime_capabilities text[],
    UNIQUE (address, protocol, fingerprint)
);
COMMENT ON TABLE pepsi.peer_key IS
    'Correspondents'' public keys and certificates: source, DNSSEC, verdict, cache deadline';

-- Correspondents proven to hold one of our keys: they encrypted to it and
-- signed with a key of their own address.  Mail to them goes without our
-- key attached.
CREATE TABLE pepsi.peer_has_own_key (
    peer_address text NOT NULL CHECK (peer_address = lower(peer_address)),
    identity_id  bigint NOT NULL REFERENCES pepsi.crypto_identity (id) ON DELETE CASCADE,
    first_seen   timestamptz NOT NULL DEFAULT now(),
    last_seen    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (peer_address, identity_id)
);
CREATE INDEX peer_has_own_key_identity ON pepsi.peer_has_own_key (identity_id);
COMMENT ON TABLE pepsi.peer_has_own_key IS
    'Correspondents proven to hold one of our keys (written by pepsi-stage-autocrypt-learn)';

-- The CA certificates (DER) an inbound S/MIME chain must reach.
CREATE TABLE pepsi.ca_trust (
    fingerprint text PRIMARY KEY CHECK (fingerprint ~ '^[0-9A-F]{64}$'),
    subject     text NOT NULL,
    certificate bytea NOT NULL,
    not_after   timestamptz,
    added_at    timestamptz NOT NULL DEFAULT now(),
    note        text
);
COMMENT ON TABLE pepsi.ca_trust IS 'CA certificates inbound S/MIME chains must reach';

-- Key discovery: one row per address being looked up, the methods asked
-- and those that replied; settled without a key, negative_until keeps the
-- next message for the address from parking again.
CREATE TABLE pepsi.key_request (
    address         text PRIMARY KEY CHECK (address = lower(address)),
    methods_asked   text[] NOT NULL DEFAULT '{}',
    methods_replied text[] NOT NULL DEFAULT '{}',
    requested_at    timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz,
    negative_until  timestamptz,
    CHECK (negative_until IS NULL OR settled_at IS NOT NULL)
);
COMMENT ON TABLE pepsi.key_request IS
    'Key discovery requests in flight, and once settled without a key the negative cache';

-- The audit of the key store: pepsi-keys records each operation (action
-- key_generate, key_import, key_rotate, key_revoke, key_purge, kek_rotate,
-- ...) in the transaction that makes it.
CREATE FUNCTION pepsi.key_event(action text, detail jsonb) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF action IS NULL OR action !~ '^(key|kek)_[a-z_]+$' THEN
        RAISE EXCEPTION 'invalid key store action %', coalesce(action, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Key store actions are key_* and kek_*.';
    END IF;
    PERFORM pepsi.event_log_write(action, detail);
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_crypto', 'table', 'crypto_identity', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'table', 'peer_key', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'table', 'peer_has_own_key', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'table', 'ca_trust', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'table', 'key_request', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'function', 'key_event', '{EXECUTE}'),
    ('pepsi_stage', 'table', 'peer_key', '{SELECT,INSERT,UPDATE}'),
    ('pepsi_stage', 'table', 'peer_has_own_key', '{SELECT,INSERT,UPDATE}'),
    ('pepsi_stage', 'table', 'ca_trust', '{SELECT}'),
    ('pepsi_stage', 'table', 'key_request', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_config', 'table', 'peer_key', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_config', 'table', 'peer_has_own_key', '{SELECT,DELETE}'),
    ('pepsi_config', 'table', 'ca_trust', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_config', 'table', 'key_request', '{SELECT,DELETE}'),
    ('pepsi_config', 'function', 'key_event', '{EXECUTE}');
INSERT INTO pepsi.grant_column (role, object_name, privilege, withheld) VALUES
    ('pepsi_stage', 'crypto_identity', 'SELECT', '{private_wrapped}'),
    ('pepsi_config', 'crypto_identity', 'SELECT', '{private_wrapped}'),
    ('pepsi_httpd', 'crypto_identity', 'SELECT', '{private_wrapped}');
INSERT INTO pepsi.grant_definer (name) VALUES ('key_event');

SELECT pg_catalog.pg_extension_config_dump('pepsi.crypto_identity', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.crypto_identity_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.peer_key', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.peer_key_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.peer_has_own_key', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.ca_trust', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.key_request', '');
-- end of the key store

-- ===========================================================================
-- mailbox quotas
--
-- pepsi.quota holds the limits of an address ('alice@example.org') or of
-- a whole domain ('@example.org'): storage bytes, messages, and messages
-- received a day (0 or NULL: no limit of that kind).  An address's row
-- wins over its domain's; with neither, the maildir writer's QUOTA (or
-- the Maildir's own maildirsize) applies (pepsi.quota_limits).  The
-- usage pepsi.quota_usage holds is what the delivery side last learnt:
-- pepsi-stage-relay-to-maildir records the Maildir++ count the maildir
-- writer reports after each delivery (pepsi.quota_record), pepsi-quota
-- recount the count from disk (pepsi.quota_recounted), and the day's
-- deliveries.  pepsi-ingress answers 452 4.2.2 at RCPT for the addresses
-- pepsi.quota_full lists (it listens on pepsi_quota for changes).  The
-- warnings: quota_record returns the threshold just crossed, once per
-- crossing (warned remembers it until the use falls below it again).
-- Operators set the limits with pepsi-quota (pepsi.quota_set/unset,
-- audited in pepsi.event_log).
-- ===========================================================================

CREATE TABLE pepsi.quota (
    address       text PRIMARY KEY CHECK (address ~ '^[^@\s]*@[^@\s]+$'),
    max_bytes     bigint CHECK (max_bytes >= 0),
    max_messages  bigint CHECK (max_messages >= 0),
    max_daily     integer CHECK (max_daily >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.quota IS
    'Mailbox quotas of an address, or of a domain (@example.org) for its addresses without their own';

CREATE TABLE pepsi.quota_usage (
    address       text PRIMARY KEY CHECK (address ~ '^[^@\s]+@[^@\s]+$'),
    bytes         bigint NOT NULL DEFAULT 0,
    messages      bigint NOT NULL DEFAULT 0,
    disk_bytes    bigint NOT NULL DEFAULT 0,
    disk_messages bigint NOT NULL DEFAULT 0,
    day           date NOT NULL DEFAULT current_date,
    day_messages  integer NOT NULL DEFAULT 0,
    warned        integer NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    is_full       boolean NOT NULL DEFAULT false,
    daily_full_on date
);
COMMENT ON TABLE pepsi.quota_usage IS
    'The use of each mailbox as the delivery side last counted it (Maildir++), the day''s deliveries, the last warning';

-- The limits in force for address: its row, else its domain's (source
-- 'address' or 'domain'); no row when neither exists.
CREATE FUNCTION pepsi.quota_limits(address text)
RETURNS TABLE (max_bytes bigint, max_messages bigint, max_daily integer, source text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(q.max_bytes, 0), coalesce(q.max_messages, 0), coalesce(q.max_daily, 0),
           CASE WHEN q.address LIKE '@%' THEN 'domain' ELSE 'address' END
    FROM pepsi.quota q
    WHERE q.address IN (pepsi.settings_key($1), substr(pepsi.settings_key($1), strpos(pepsi.settings_key($1), '@')))
    ORDER BY q.address LIKE '@%'
    LIMIT 1
$$;

-- The limits in force for address as the maildir writer's request takes
-- them (Maildir++: '<bytes>S,<count>C', '0S' for a row with none), or
-- NULL when no row applies (the writer's QUOTA or maildirsize then).
CREATE FUNCTION pepsi.quota_maildir_limits(address text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN l.max_bytes > 0 OR l.max_messages > 0
                THEN concat_ws(',', CASE WHEN l.max_bytes > 0 THEN l.max_bytes || 'S' END,
                               CASE WHEN l.max_messages > 0 THEN l.max_messages || 'C' END)
                ELSE '0S' END
    FROM pepsi.quota_limits($1) l
$$;

-- Is address at or over a limit, as far as the database knows (its
-- row's or domain's limits, else the ones the writer reported)?
CREATE FUNCTION pepsi.quota_is_full(address text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(bool_or(
               (coalesce(l.max_bytes, u.disk_bytes) > 0 AND u.bytes >= coalesce(l.max_bytes, u.disk_bytes))
            OR (coalesce(l.max_messages, u.disk_messages) > 0 AND u.messages >= coalesce(l.max_messages, u.disk_messages))
            OR (l.max_daily > 0 AND u.day = current_date AND u.day_messages >= l.max_daily)), false)
    FROM pepsi.quota_usage u
    LEFT JOIN LATERAL pepsi.quota_limits(u.address) l ON true
    WHERE u.address = pepsi.settings_key($1)
$$;

-- The addresses at or over a limit: what pepsi-ingress answers 452 for
-- (the partial index quota_usage_full: the full ones only).
CREATE FUNCTION pepsi.quota_full() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT u.address FROM pepsi.quota_usage u
    WHERE (u.is_full OR u.daily_full_on IS NOT NULL) AND (u.is_full OR u.daily_full_on = current_date)
$$;

-- After a delivery attempt: the use the maildir writer counted (bytes and
-- messages, and the limits it applied: max_bytes, max_messages, 0 for
-- none), one more message today when delivered.  Returns the highest of
-- thresholds (percentages) the use reached and had not been warned of,
-- else 0; a use below a threshold warned of makes it due again.
-- Notifies pepsi_quota when the address becomes full or stops being.
CREATE FUNCTION pepsi.quota_record(address text, bytes bigint, messages bigint, max_bytes bigint,
                                   max_messages bigint, delivered boolean, thresholds integer[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    was_full boolean := pepsi.quota_is_full(key);
    l record;
    percent numeric := 0;
    reached integer := 0;
    before integer;
BEGIN
    SELECT * INTO l FROM pepsi.quota_limits(key);
    INSERT INTO pepsi.quota_usage AS u (address) VALUES (key) ON CONFLICT ON CONSTRAINT quota_usage_pkey DO NOTHING;
    SELECT u.warned INTO before FROM pepsi.quota_usage u WHERE u.address = key FOR UPDATE;
    IF coalesce(l.max_bytes, max_bytes) > 0 THEN
        percent := greatest(percent, 100.0 * bytes / coalesce(l.max_bytes, max_bytes));
    END IF;
    IF coalesce(l.max_messages, max_messages) > 0 THEN
        percent := greatest(percent, 100.0 * messages / coalesce(l.max_messages, max_messages));
    END IF;
    SELECT coalesce(max(t), 0) INTO reached FROM unnest(thresholds) t WHERE t > 0 AND percent >= t;
    UPDATE pepsi.quota_usage u SET
        bytes = quota_record.bytes, messages = quota_record.messages,
        disk_bytes = greatest(quota_record.max_bytes, 0), disk_messages = greatest(quota_record.max_messages, 0),
        day_messages = CASE WHEN u.day = current_date THEN u.day_messages ELSE 0 END
                       + CASE WHEN delivered THEN 1 ELSE 0 END,
        day = current_date, warned = reached, updated_at = now()
    WHERE u.address = key;
    IF pepsi.quota_is_full(key) IS DISTINCT FROM was_full THEN
        PERFORM pg_notify('pepsi_quota', key);
    END IF;
    RETURN CASE WHEN reached > before THEN reached ELSE 0 END;
END
$$;

-- Before a delivery: may address take one more message today?  (The
-- daily limit; the storage limits are the writer's to apply.)
CREATE FUNCTION pepsi.quota_daily_left(address text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce((SELECT l.max_daily = 0 OR u.day <> current_date OR u.day_messages < l.max_daily
                     FROM pepsi.quota_limits($1) l
                     LEFT JOIN pepsi.quota_usage u ON u.address = pepsi.settings_key($1)), true)
$$;

-- A limit must be a count of 0 or more; name the one that is not.
CREATE FUNCTION pepsi.quota_check_limit(name text, value bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF value < 0 THEN
        RAISE EXCEPTION 'quota % must be 0 or more, not %', name, value
            USING ERRCODE = 'invalid_parameter_value', HINT = '0 means no limit of that kind.';
    END IF;
END
$$;

-- Set the limits of an address or '@domain' (NULL leaves one as it is, 0
-- is no limit); audited.
CREATE FUNCTION pepsi.quota_set(address text, max_bytes bigint, max_messages bigint, max_daily integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
BEGIN
    PERFORM pepsi.quota_check_limit('max_bytes', max_bytes);
    PERFORM pepsi.quota_check_limit('max_messages', max_messages);
    PERFORM pepsi.quota_check_limit('max_daily', max_daily);
    INSERT INTO pepsi.quota AS q (address, max_bytes, max_messages, max_daily)
    VALUES (key, quota_set.max_bytes, quota_set.max_messages, quota_set.max_daily)
    ON CONFLICT ON CONSTRAINT quota_pkey DO UPDATE SET
        max_bytes = coalesce(excluded.max_bytes, q.max_bytes),
        max_messages = coalesce(excluded.max_messages, q.max_messages),
        max_daily = coalesce(excluded.max_daily, q.max_daily),
        updated_at = now();
    PERFORM pepsi.event_log_write('quota_set',
        jsonb_build_object('address', key, 'max_bytes', max_bytes, 'max_messages', max_messages,
                           'max_daily', max_daily));
    PERFORM pg_notify('pepsi_quota', key);
END
$$;

-- Remove the limits of an address or '@domain'; false if it had none.  Audited.
CREATE FUNCTION pepsi.quota_unset(address text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.quota q WHERE q.address = key;
    removed := FOUND;
    PERFORM pepsi.event_log_write('quota_unset', jsonb_build_object('address', key, 'removed', removed));
    PERFORM pg_notify('pepsi_quota', key);
    RETURN removed;
END
$$;

-- The use pepsi-quota recount found on disk (and the limits the writer
-- applied); audited.
CREATE FUNCTION pepsi.quota_recounted(address text, bytes bigint, messages bigint, max_bytes bigint,
                                      max_messages bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
BEGIN
    PERFORM pepsi.quota_check_limit('bytes', bytes);
    PERFORM pepsi.quota_check_limit('messages', messages);
    PERFORM pepsi.quota_record(key, bytes, messages, max_bytes, max_messages, false, '{}');
    PERFORM pepsi.event_log_write('quota_recount',
        jsonb_build_object('address', key, 'bytes', bytes, 'messages', messages));
END
$$;

-- What pepsi-quota show prints: the limits in force and where they come
-- from, and the use last counted.
CREATE FUNCTION pepsi.quota_show(address text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT jsonb_build_object(
        'address', pepsi.settings_key($1),
        'source', coalesce(l.source, 'configuration'),
        'max_bytes', l.max_bytes, 'max_messages', l.max_messages, 'max_daily', l.max_daily,
        'bytes', u.bytes, 'messages', u.messages,
        'today', CASE WHEN u.day = current_date THEN u.day_messages ELSE 0 END,
        'warned', u.warned, 'full', pepsi.quota_is_full($1), 'counted_at', u.updated_at)
    FROM (SELECT 1) one
    LEFT JOIN LATERAL pepsi.quota_limits($1) l ON true
    LEFT JOIN pepsi.quota_usage u ON u.address = pepsi.settings_key($1)
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'quota', '{SELECT}'),
    ('pepsi_config', 'table', 'quota_usage', '{SELECT}'),
    ('pepsi_config', 'function', 'quota_limits', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_maildir_limits', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_is_full', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_check_limit', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_unset', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_recounted', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_show', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_full', '{EXECUTE}'),
    ('pepsi_stage', 'table', 'quota', '{SELECT}'),
    ('pepsi_stage', 'table', 'quota_usage', '{SELECT}'),
    ('pepsi_stage', 'function', 'quota_limits', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_maildir_limits', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_is_full', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_record', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_daily_left', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'quota_full', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('quota_full'), ('quota_record'), ('quota_daily_left'),
    ('quota_set'), ('quota_unset'), ('quota_recounted'), ('quota_show');

SELECT pg_catalog.pg_extension_config_dump('pepsi.quota', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.quota_usage', '');
-- end of mailbox quotas

-- ===========================================================================
-- Mailing lists (pepsi-stage-list(8), pepsi-list(8); issue 40, items 1-3)
--
-- A list is a row of pepsi.mailing_list (its posting address, list@domain);
-- its subscribers, owners and moderators, bans, pending confirmations,
-- held posts and bounces are rows of the list_* tables.  The list stage
-- reads and changes them only through the SECURITY DEFINER functions
-- below (pepsi_stage may not touch the tables), pepsi-list through the
-- audited list_* administration functions (pepsi_config), pepsi-httpd's
-- one-click unsubscribe (RFC 8058) through list_unsubscribe_one_click.
-- Tokens mailed out (confirmations, moderation) are kept as their SHA-256
-- only; the one-click token is a keyed hash of the list's secret and the
-- subscriber, so nothing per post needs storing.
-- ===========================================================================

CREATE TABLE pepsi.mailing_list (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address          text NOT NULL UNIQUE
                     CHECK (address = lower(address) AND address ~ '^[a-z0-9][a-z0-9._-]*@[a-z0-9][a-z0-9.-]*$'
                            AND address !~ '-(request|owner|subscribe|unsubscribe|bounces)@'),
    description      text NOT NULL DEFAULT '',
    posting_policy   text NOT NULL DEFAULT 'members'
                     CHECK (posting_policy IN ('members', 'moderated', 'announce', 'open')),
    subject_tag      text CHECK (length(subject_tag) BETWEEN 1 AND 64 AND subject_tag !~ '[\r\n]'),
    header_text      text,
    footer_text      text,
    verp             boolean NOT NULL DEFAULT true,
    dmarc_mitigation text NOT NULL DEFAULT 'from' CHECK (dmarc_mitigation IN ('from', 'wrap', 'none')),
    bounce_threshold real NOT NULL DEFAULT 5 CHECK (bounce_threshold > 0),
    bounce_reset     interval NOT NULL DEFAULT '30 days' CHECK (bounce_reset > interval '0'),
    unsubscribe_url  text CHECK (unsubscribe_url ~ '^https?://[^\s?#]+$'),
    secret           bytea NOT NULL DEFAULT decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'),
    created_at       timestamptz NOT NULL DEFAULT now(),
    max_post_size    integer NOT NULL DEFAULT 10485760 CHECK (max_post_size > 0),
    digest_format    text NOT NULL DEFAULT 'mime' CHECK (digest_format IN ('mime', 'plain')),
    digest_issue     integer NOT NULL DEFAULT 0
);
COMMENT ON TABLE pepsi.mailing_list IS
    'The mailing lists: posting address, policy, headers and footers, VERP, DMARC mitigation, bounce threshold';

CREATE TABLE pepsi.list_member (
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address        text NOT NULL CHECK (address = lower(address) AND address ~ '^[^@\s<>]+@[^@\s<>]+$'),
    display_name   text,
    delivery       text NOT NULL DEFAULT 'each' CHECK (delivery IN ('each', 'digest', 'nomail')),
    disabled       text CHECK (disabled IN ('bounce', 'owner')),
    bounce_score   real NOT NULL DEFAULT 0,
    last_bounce_at timestamptz,
    subscribed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (list_id, address)
);
COMMENT ON TABLE pepsi.list_member IS
    'Subscribers: delivery mode (each, digest, nomail), why delivery stopped (bounce, owner), bounce score';

CREATE TABLE pepsi.list_role (
    list_id bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address text NOT NULL CHECK (address = lower(address) AND address ~ '^[^@\s<>]+@[^@\s<>]+$'),
    role    text NOT NULL CHECK (role IN ('owner', 'moderator')),
    PRIMARY KEY (list_id, address, role)
);
COMMENT ON TABLE pepsi.list_role IS 'Owners and moderators of each list';

CREATE TABLE pepsi.list_ban (
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    pattern    text NOT NULL CHECK (pattern = lower(pattern) AND pattern ~ '^([^@\s]+@)?[^@\s]+$' AND pattern LIKE '%@%'),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (list_id, pattern)
);
COMMENT ON TABLE pepsi.list_ban IS 'Addresses (user@domain) and domains (@domain) that may neither post nor subscribe';

CREATE TABLE pepsi.list_pending (
    token_hash bytea PRIMARY KEY,
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address    text NOT NULL,
    action     text NOT NULL CHECK (action IN ('subscribe', 'unsubscribe')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX list_pending_expires_at ON pepsi.list_pending (expires_at);
COMMENT ON TABLE pepsi.list_pending IS
    'Subscriptions and unsubscriptions waiting for the single-use token mailed to the address (double opt-in)';

CREATE TABLE pepsi.list_held (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id      bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    workqueue_id bigint NOT NULL UNIQUE,
    token_hash   bytea NOT NULL UNIQUE,
    sender       text NOT NULL,
    subject      text,
    reason       text NOT NULL,
    held_at      timestamptz NOT NULL DEFAULT now(),
    decision     text CHECK (decision IN ('approve', 'reject')),
    decided_by   text,
    decided_at   timestamptz
);
COMMENT ON TABLE pepsi.list_held IS
    'The moderation queue: posts held on hold in pepsi.workqueue until a moderator approves or rejects them';

CREATE TABLE pepsi.list_bounce (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id     bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address     text NOT NULL,
    status      text,
    diagnostic  text,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX list_bounce_member ON pepsi.list_bounce (list_id, address);
COMMENT ON TABLE pepsi.list_bounce IS 'Bounces received at the lists'' -bounces+ (VERP) addresses';

-- Every address a list answers at (ingress's RCPT check, pepsi-list):
-- list@, and its -request, -owner, -subscribe, -unsubscribe and -bounces
-- forms; a -bounces+... address is recognised by its -bounces base.
CREATE FUNCTION pepsi.list_addresses() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN s.suffix = '' THEN l.address
                ELSE split_part(l.address, '@', 1) || s.suffix || '@' || split_part(l.address, '@', 2) END
    FROM pepsi.mailing_list l,
         (VALUES (''), ('-request'), ('-owner'), ('-subscribe'), ('-unsubscribe'), ('-bounces')) AS s(suffix)
$$;

-- The list an address belongs to and what it asks for: NULL when none,
-- else {"id", "list", "kind": post | request | owner | subscribe |
-- unsubscribe | bounces, "verp": the subscriber of a -bounces+ address,
-- and the list's settings}.
CREATE FUNCTION pepsi.list_resolve(recipient text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    addr text := lower(recipient);
    local text := split_part(addr, '@', 1);
    domain text := split_part(addr, '@', 2);
    parts text[];
    kind text := 'post';
    verp text;
    l pepsi.mailing_list;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = addr;
    IF NOT FOUND THEN
        parts := regexp_match(local, '^(.+)-(request|owner|subscribe|unsubscribe|bounces)(\+(.*))?$');
        IF parts IS NULL OR (parts[3] IS NOT NULL AND parts[2] <> 'bounces') THEN
            RETURN NULL;
        END IF;
        kind := parts[2];
        verp := parts[4];
        SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = parts[1] || '@' || domain;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN jsonb_build_object('id', l.id, 'list', l.address, 'kind', kind,
        'verp', CASE WHEN verp IS NOT NULL THEN regexp_replace(verp, '=([^=]*)$', '@\1') END,
        'description', l.description, 'posting_policy', l.posting_policy, 'subject_tag', l.subject_tag,
        'header_text', l.header_text, 'footer_text', l.footer_text, 'verp_enabled', l.verp,
        'dmarc_mitigation', l.dmarc_mitigation, 'unsubscribe_url', l.unsubscribe_url,
        'max_post_size', l.max_post_size);
END
$$;

-- Is address (or its domain) banned from list?
CREATE FUNCTION pepsi.list_banned(list bigint, address text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT EXISTS (SELECT FROM pepsi.list_ban b WHERE b.list_id = list
                   AND (b.pattern = lower(address) OR b.pattern = '@' || split_part(lower(address), '@', 2)))
$$;

-- May sender post to list?  {"decision": accept | hold | reject, "reason"}.
-- Owners and moderators always may; then the policy: open (anyone),
-- members (subscribers; others held), moderated (every post held),
-- announce (no one else).
CREATE FUNCTION pepsi.list_post_check(list bigint, sender text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    policy text;
    who text := lower(coalesce(sender, ''));
BEGIN
    SELECT l.posting_policy INTO policy FROM pepsi.mailing_list l WHERE l.id = list;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('decision', 'reject', 'reason', 'no such list');
    ELSIF pepsi.list_banned(list, who) THEN
        RETURN jsonb_build_object('decision', 'reject', 'reason', 'the sender is banned');
    ELSIF EXISTS (SELECT FROM pepsi.list_role r WHERE r.list_id = list AND r.address = who) THEN
        RETURN jsonb_build_object('decision', 'accept', 'reason', 'an owner or moderator');
    ELSIF policy = 'open' THEN
        RETURN jsonb_build_object('decision', 'accept', 'reason', 'an open list');
    ELSIF policy = 'announce' THEN
        RETURN jsonb_build_object('decision', 'reject', 'reason', 'an announce-only list');
    ELSIF policy = 'moderated' THEN
        RETURN jsonb_build_object('decision', 'hold', 'reason', 'a moderated list');
    ELSIF EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list AND m.address = who) THEN
        RETURN jsonb_build_object('decision', 'accept', 'reason', 'a member');
    END IF;
    RETURN jsonb_build_object('decision', 'hold', 'reason', 'the sender is not a member');
END
$$;

-- The keyed token of a subscriber's one-click unsubscribe URL.
CREATE FUNCTION pepsi.list_member_token(list bigint, address text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT left(encode(sha256(l.secret || convert_to(lower($2), 'UTF8')), 'hex'), 32)
    FROM pepsi.mailing_list l WHERE l.id = $1
$$;

-- The split groups (pepsi.workqueue_split) of a post to list, for stage:
-- with VERP one per subscriber, sent from list-bounces+user=domain@ with
-- its own List-Unsubscribe (RFC 8058 one-click when the list has an
-- unsubscribe_url); without, one per destination domain from
-- list-bounces@.  Only subscribers who take each message.  The VERP
-- groups keep a domain's subscribers together (by domain, then address),
-- so that the rows made of them, claimed in that order, reach a relay
-- worker's batch together: one session, one kept destination slot.
CREATE FUNCTION pepsi.list_fanout(list bigint, stage text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    local text;
    domain text;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.id = list;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    local := split_part(l.address, '@', 1);
    domain := split_part(l.address, '@', 2);
    IF l.verp THEN
        RETURN coalesce((SELECT jsonb_agg(jsonb_build_object(
                'rcpt_to', jsonb_build_array(m.address), 'stage', stage,
                'mail_from', local || '-bounces+' || replace(m.address, '@', '=') || '@' || domain,
                'prepend_headers', CASE WHEN l.unsubscribe_url IS NOT NULL THEN
                    'List-Unsubscribe: <' || l.unsubscribe_url || '?l=' || l.id || '&a='
                    || replace(replace(m.address, '%', '%25'), '+', '%2B') || '&t='
                    || left(encode(sha256(l.secret || convert_to(m.address, 'UTF8')), 'hex'), 32)
                    || '>, <mailto:' || local || '-unsubscribe@' || domain || '>' || E'\r\n'
                    || E'List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n'
                  ELSE 'List-Unsubscribe: <mailto:' || local || '-unsubscribe@' || domain || E'>\r\n' END)
                ORDER BY split_part(m.address, '@', 2), m.address)
            FROM pepsi.list_member m
            WHERE m.list_id = list AND m.delivery = 'each' AND m.disabled IS NULL), '[]');
    END IF;
    RETURN coalesce((SELECT jsonb_agg(jsonb_build_object(
            'rcpt_to', g.rcpt, 'stage', stage, 'mail_from', local || '-bounces@' || domain,
            'prepend_headers', 'List-Unsubscribe: <mailto:' || local || '-unsubscribe@' || domain || E'>\r\n')
            ORDER BY g.dom)
        FROM (SELECT split_part(m.address, '@', 2) AS dom, jsonb_agg(m.address ORDER BY m.address) AS rcpt
              FROM pepsi.list_member m
              WHERE m.list_id = list AND m.delivery = 'each' AND m.disabled IS NULL
              GROUP BY 1) g), '[]');
END
$$;

-- Hold a post (row workqueue_id) for moderation: returns {"token", "id",
-- "moderators": the moderators, else the owners}.  Holding the same row
-- again (its stage ran again) makes a new token for it.
CREATE FUNCTION pepsi.list_hold(list bigint, workqueue_id bigint, sender text, subject text, reason text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    held bigint;
BEGIN
    INSERT INTO pepsi.list_held AS h (list_id, workqueue_id, token_hash, sender, subject, reason)
    VALUES (list, list_hold.workqueue_id, sha256(convert_to(token, 'UTF8')), lower(list_hold.sender),
            left(list_hold.subject, 500), list_hold.reason)
    ON CONFLICT ON CONSTRAINT list_held_workqueue_id_key DO UPDATE SET token_hash = excluded.token_hash
    RETURNING h.id INTO held;
    RETURN jsonb_build_object('token', token, 'id', held, 'moderators', coalesce(
        (SELECT jsonb_agg(r.address ORDER BY r.address) FROM pepsi.list_role r
         WHERE r.list_id = list AND r.role = 'moderator'),
        (SELECT jsonb_agg(r.address ORDER BY r.address) FROM pepsi.list_role r
         WHERE r.list_id = list AND r.role = 'owner'), '[]'));
END
$$;

-- The moderators' decision on the held row workqueue_id: approve, reject,
-- or NULL (none yet, or never held).
CREATE FUNCTION pepsi.list_held_decision(workqueue_id bigint) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT h.decision FROM pepsi.list_held h WHERE h.workqueue_id = list_held_decision.workqueue_id
$$;

-- Decide on held post (its id), as moderator by (an address, or NULL for
-- an administrator): records the decision and releases the row, whose
-- stage then sends or drops it.  NULL when done, else why not.
CREATE FUNCTION pepsi.list_decide(held bigint, decision text, actor text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    h pepsi.list_held;
BEGIN
    IF list_decide.decision NOT IN ('approve', 'reject') THEN
        RAISE EXCEPTION 'decision must be approve or reject, not %', list_decide.decision USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO h FROM pepsi.list_held x WHERE x.id = held FOR UPDATE;
    IF NOT FOUND THEN
        RETURN format('no held post %s', held);
    ELSIF h.decision IS NOT NULL THEN
        RETURN format('held post %s was already decided (%s)', held, h.decision);
    ELSIF actor IS NOT NULL AND NOT EXISTS (SELECT FROM pepsi.list_role r
                                         WHERE r.list_id = h.list_id AND r.address = lower(actor)) THEN
        RETURN format('%s is not a moderator or owner of the list', actor);
    END IF;
    UPDATE pepsi.list_held x SET decision = list_decide.decision, decided_by = coalesce(lower(actor), pepsi.event_principal()),
        decided_at = now() WHERE x.id = held;
    PERFORM pepsi.queue_release(ARRAY[h.workqueue_id]);
    PERFORM pepsi.event_log_write('list_' || list_decide.decision,
        jsonb_build_object('held', held, 'list', h.list_id, 'sender', h.sender, 'by', coalesce(lower(actor), 'operator')));
    RETURN NULL;
END
$$;

-- A moderator's reply carrying the token of a held post.
CREATE FUNCTION pepsi.list_decide_by_token(token text, decision text, actor text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    held bigint;
BEGIN
    SELECT h.id INTO held FROM pepsi.list_held h WHERE h.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8'));
    IF NOT FOUND THEN
        RETURN 'the token names no held post';
    END IF;
    RETURN pepsi.list_decide(held, list_decide_by_token.decision, coalesce(actor, ''));
END
$$;

-- Add address to list now (an operator, or a confirmed request).  False
-- when it was a member already.
CREATE FUNCTION pepsi.list_member_add(list bigint, address text, delivery text DEFAULT 'each',
                                      display_name text DEFAULT NULL, actor text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    added boolean;
BEGIN
    IF pepsi.list_banned(list, address) THEN
        RAISE EXCEPTION '% is banned from list %', address, list USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF (pepsi.list_resolve(address) ->> 'id')::bigint = list THEN
        RAISE EXCEPTION '% is an address of list % itself: a list cannot be its own member', address, list
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Its posts would come back to it.';
    END IF;
    INSERT INTO pepsi.list_member AS m (list_id, address, delivery, display_name)
    VALUES (list, lower(list_member_add.address), coalesce(list_member_add.delivery, 'each'),
            list_member_add.display_name)
    ON CONFLICT ON CONSTRAINT list_member_pkey DO NOTHING;
    added := FOUND;
    IF added THEN
        PERFORM pepsi.event_log_write('list_subscribe',
            jsonb_build_object('list', list, 'address', lower(list_member_add.address), 'by', coalesce(actor, 'operator')));
    END IF;
    RETURN added;
END
$$;

-- Remove address from list.  False when it was not a member.
CREATE FUNCTION pepsi.list_member_remove(list bigint, address text, actor text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    DELETE FROM pepsi.list_member m WHERE m.list_id = list AND m.address = lower(list_member_remove.address);
    IF FOUND THEN
        PERFORM pepsi.event_log_write('list_unsubscribe',
            jsonb_build_object('list', list, 'address', lower(list_member_remove.address), 'by', coalesce(actor, 'operator')));
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- Start delivery to a member again (stopped by bounces or an owner),
-- its bounce score cleared; audited.  False when it is not a member.
CREATE FUNCTION pepsi.list_member_enable(list bigint, address text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    UPDATE pepsi.list_member m SET disabled = NULL, bounce_score = 0
    WHERE m.list_id = list AND m.address = lower(list_member_enable.address);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pepsi.event_log_write('list_member_enable',
        jsonb_build_object('list', list, 'address', lower(list_member_enable.address)));
    RETURN true;
END
$$;

-- Subscribe and unsubscribe requests whose token expired unconfirmed go,
-- each logged (event list_request_expired).  How many went.
CREATE FUNCTION pepsi.list_pending_expire() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    p record;
    gone integer := 0;
BEGIN
    FOR p IN DELETE FROM pepsi.list_pending x WHERE x.expires_at < now() RETURNING x.list_id, x.address, x.action, x.created_at
    LOOP
        PERFORM pepsi.event_log_write('list_request_expired',
            jsonb_build_object('list', p.list_id, 'address', p.address, 'action', p.action,
                               'reason', format('not confirmed since %s', p.created_at)));
        gone := gone + 1;
    END LOOP;
    RETURN gone;
END
$$;

-- A subscribe or unsubscribe request by mail: the token that confirms it
-- within ttl (only its hash is kept); NULL when there is nothing to
-- confirm (already a member, or not one), or the address is banned.
-- Requests that expired a day ago go.
CREATE FUNCTION pepsi.list_request(list bigint, address text, action text, ttl interval) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    member boolean;
BEGIN
    IF list_request.action NOT IN ('subscribe', 'unsubscribe') THEN
        RAISE EXCEPTION 'action must be subscribe or unsubscribe, not %', list_request.action USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '30 days' THEN
        RAISE EXCEPTION 'invalid token lifetime %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to 30 days.';
    END IF;
    member := EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list
                      AND m.address = lower(list_request.address));
    IF (list_request.action = 'subscribe') = member
       OR (list_request.action = 'subscribe' AND pepsi.list_banned(list, list_request.address)) THEN
        RETURN NULL;
    END IF;
    PERFORM pepsi.list_pending_expire();
    INSERT INTO pepsi.list_pending (token_hash, list_id, address, action, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), list, lower(list_request.address), list_request.action, now() + ttl);
    RETURN token;
END
$$;

-- Carry out the request token confirms, once, for address: NULL when
-- done, else why not.
CREATE FUNCTION pepsi.list_confirm(list bigint, address text, token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    p pepsi.list_pending;
BEGIN
    DELETE FROM pepsi.list_pending x
    WHERE x.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8')) AND x.list_id = list
      AND x.address = lower(list_confirm.address)
    RETURNING * INTO p;
    IF NOT FOUND THEN
        RETURN 'the token is not one this address was sent for this list, or was used';
    ELSIF p.expires_at < now() THEN
        RETURN 'the token has expired: ask again';
    ELSIF p.action = 'subscribe' THEN
        PERFORM pepsi.list_member_add(list, p.address, 'each', NULL, 'confirmed by mail');
    ELSE
        PERFORM pepsi.list_member_remove(list, p.address, 'confirmed by mail');
    END IF;
    RETURN NULL;
END
$$;

-- RFC 8058 one-click unsubscribe (pepsi-httpd's POST): NULL when address
-- is no longer a member of list, else why not.
CREATE FUNCTION pepsi.list_unsubscribe_one_click(list bigint, address text, token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF token IS NULL OR token <> coalesce(pepsi.list_member_token(list, address), '') THEN
        RETURN 'the link is not valid';
    END IF;
    PERFORM pepsi.list_member_remove(list, address, 'one-click');
    RETURN NULL;
END
$$;

-- A bounce of a post to subscriber address (a DSN at list-bounces+...):
-- adds to its score (a score older than the list's bounce_reset starts
-- over) and stops delivery at the threshold.  {"member": false} when not
-- a member, else {"score", "disabled": just now, "owners"}.
CREATE FUNCTION pepsi.list_bounce_record(list bigint, address text, status text, diagnostic text, weight real)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    m pepsi.list_member;
    now_disabled boolean := false;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list x WHERE x.id = list;
    INSERT INTO pepsi.list_bounce (list_id, address, status, diagnostic)
    VALUES (list, lower(list_bounce_record.address), left(list_bounce_record.status, 32),
            left(list_bounce_record.diagnostic, 1000));
    UPDATE pepsi.list_member x
    SET bounce_score = CASE WHEN x.last_bounce_at < now() - l.bounce_reset THEN 0 ELSE x.bounce_score END + weight,
        last_bounce_at = now()
    WHERE x.list_id = list AND x.address = lower(list_bounce_record.address)
    RETURNING * INTO m;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('member', false);
    END IF;
    IF m.disabled IS NULL AND m.bounce_score >= l.bounce_threshold THEN
        UPDATE pepsi.list_member x SET disabled = 'bounce' WHERE x.list_id = list AND x.address = m.address;
        now_disabled := true;
        PERFORM pepsi.event_log_write('list_member_disabled',
            jsonb_build_object('list', list, 'address', m.address, 'score', m.bounce_score, 'by', 'bounces'));
    END IF;
    RETURN jsonb_build_object('member', true, 'score', m.bounce_score, 'threshold', l.bounce_threshold,
        'disabled', now_disabled, 'owners', coalesce((SELECT jsonb_agg(r.address ORDER BY r.address)
            FROM pepsi.list_role r WHERE r.list_id = list AND r.role = 'owner'), '[]'));
END
$$;

-- The owners of list (mail to list-owner@).
CREATE FUNCTION pepsi.list_owners(list bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(jsonb_agg(r.address ORDER BY r.address), '[]') FROM pepsi.list_role r
    WHERE r.list_id = list AND r.role = 'owner'
$$;

-- pepsi-list(8): create a list, audited.  Returns its id.
CREATE FUNCTION pepsi.list_create(address text, owner text, description text DEFAULT '') RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    list bigint;
BEGIN
    INSERT INTO pepsi.mailing_list AS l (address, description)
    VALUES (lower(list_create.address), coalesce(list_create.description, ''))
    RETURNING l.id INTO list;
    INSERT INTO pepsi.list_role VALUES (list, lower(owner), 'owner');
    PERFORM pepsi.event_log_write('list_create', jsonb_build_object('list', list, 'address', lower(list_create.address),
                                                                    'owner', lower(owner)));
    RETURN list;
END
$$;

-- pepsi-list(8): set one of a list's settings (a column of
-- pepsi.mailing_list other than id, address, secret and created_at),
-- NULL to reset it; audited.
CREATE FUNCTION pepsi.list_configure(list bigint, setting text, value text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    changed integer;
BEGIN
    IF setting NOT IN ('description', 'posting_policy', 'subject_tag', 'header_text', 'footer_text', 'verp',
                       'dmarc_mitigation', 'bounce_threshold', 'bounce_reset', 'unsubscribe_url',
                       'max_post_size', 'digest_format') THEN
        RAISE EXCEPTION 'a list has no setting "%"', setting USING ERRCODE = 'invalid_parameter_value',
            HINT = 'The settings: description, posting_policy, subject_tag, header_text, footer_text, verp, '
                   'dmarc_mitigation, bounce_threshold, bounce_reset, unsubscribe_url, max_post_size, digest_format.';
    END IF;
    IF value IS NULL THEN
        EXECUTE format('UPDATE pepsi.mailing_list SET %I = DEFAULT WHERE id = $1', setting) USING list;
    ELSE
        EXECUTE format('UPDATE pepsi.mailing_list SET %I = $2::%s WHERE id = $1', setting,
                       CASE setting WHEN 'verp' THEN 'boolean' WHEN 'bounce_threshold' THEN 'real'
                                    WHEN 'max_post_size' THEN 'integer'
                                    WHEN 'bounce_reset' THEN 'interval' ELSE 'text' END) USING list, value;
    END IF;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed = 0 THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM pepsi.event_log_write('list_configure',
        jsonb_build_object('list', list, 'setting', setting, 'value', left(value, 200)));
END
$$;

-- pepsi-list(8): give or take an owner or moderator role; audited.
CREATE FUNCTION pepsi.list_role_set(list bigint, address text, role text, present boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF present THEN
        INSERT INTO pepsi.list_role VALUES (list, lower(list_role_set.address), list_role_set.role) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM pepsi.list_role r WHERE r.list_id = list AND r.address = lower(list_role_set.address)
                                        AND r.role = list_role_set.role;
    END IF;
    PERFORM pepsi.event_log_write(CASE WHEN present THEN 'list_role_add' ELSE 'list_role_remove' END,
        jsonb_build_object('list', list, 'address', lower(list_role_set.address), 'role', list_role_set.role));
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'list_addresses', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_resolve', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_post_check', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_fanout', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_hold', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_held_decision', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_decide_by_token', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_request', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_confirm', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_bounce_record', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_owners', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_pending_expire', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'list_unsubscribe_one_click', '{EXECUTE}'),
    ('pepsi_config', 'table', 'mailing_list', '{SELECT}'),
    ('pepsi_config', 'table', 'list_member', '{SELECT}'),
    ('pepsi_config', 'table', 'list_role', '{SELECT}'),
    ('pepsi_config', 'table', 'list_ban', '{SELECT,INSERT,DELETE}'),
    ('pepsi_config', 'table', 'list_pending', '{SELECT}'),
    ('pepsi_config', 'table', 'list_held', '{SELECT}'),
    ('pepsi_config', 'table', 'list_bounce', '{SELECT}'),
    ('pepsi_config', 'function', 'list_addresses', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_create', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_configure', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_role_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_member_add', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_member_remove', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_member_enable', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_decide', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_addresses'), ('list_resolve'),
    ('list_post_check'), ('list_fanout'), ('list_hold'), ('list_held_decision'),
    ('list_decide'), ('list_decide_by_token'), ('list_member_add'), ('list_member_remove'), ('list_member_enable'), ('list_request'),
    ('list_confirm'), ('list_pending_expire'), ('list_unsubscribe_one_click'), ('list_bounce_record'), ('list_owners'), ('list_create'),
    ('list_configure'), ('list_role_set');
INSERT INTO pepsi.grant_owner (name) VALUES ('list_banned'), ('list_member_token');

SELECT pg_catalog.pg_extension_config_dump('pepsi.mailing_list', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.mailing_list_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_member', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_role', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_ban', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_pending', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_held', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_held_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_bounce', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_bounce_id_seq', '');
-- end of mailing lists

-- ===========================================================================
-- Auto-pay: pepsi-stage-auto-pay, pepsi-helper-auto-pay, and the
-- secretary's paid alternative to confirmation
--
-- pepsi.outbound_message records the Message-Ids of the mail our users
-- send (authenticated, trusted-network or local submissions: the stage
-- never records a stranger's), so that a payment request that comes back
-- is matched to the message it asks payment for; outbound_message_prune
-- (a pepsi.schedule call) keeps it bounded.  pepsi.payment is the audit of
-- every payment both ways: out (one of our users paid a payment request
-- through their wallet, or it was refused or the wallet failed: reason
-- says why) and in (a proof of payment released an owner's held mail).
-- auto_pay_reserve checks a request against the owner's limits (per
-- message, per day, per recipient domain: pepsi.settings, resolved by the
-- stage; nothing is paid without a per-message and a per-day limit) and
-- records the payment as pending before the wallet runs, so two requests
-- at once cannot both fit under one limit, and a request already paid is
-- never paid twice; auto_pay_finish records what the wallet did.  The
-- stage's role writes none of the tables itself.
-- ===========================================================================

CREATE TABLE pepsi.outbound_message (
    message_id  text PRIMARY KEY CHECK (length(message_id) BETWEEN 3 AND 998),
    sender      text NOT NULL CHECK (sender ~ '^[^@\s]+@[^@\s]+$'),
    recipient_domains text[] NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbound_message_sent_at ON pepsi.outbound_message (sent_at);
COMMENT ON TABLE pepsi.outbound_message IS
    'The Message-Ids of the mail our users sent, which a payment request must answer (pepsi-stage-auto-pay)';

CREATE TABLE pepsi.payment (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    direction   text NOT NULL CHECK (direction IN ('out', 'in')),
    address     text NOT NULL,
    peer        text NOT NULL,
    peer_domain text NOT NULL,
    message_id  text,
    uri         text NOT NULL CHECK (length(uri) <= 2048),
    currency    text NOT NULL,
    amount      numeric NOT NULL CHECK (amount >= 0),
    outcome     text NOT NULL CHECK (outcome IN ('pending', 'paid', 'refused', 'failed', 'received')),
    reason      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    claimed_at  timestamptz
);
CREATE INDEX payment_address_created_at ON pepsi.payment (address, created_at);
COMMENT ON TABLE pepsi.payment IS
    'Every payment made for our users (out: paid, refused, failed) and received by the secretary (in)';

-- An amount as GNU Taler writes one ("EUR:0.50"), split; an error naming it otherwise.
CREATE FUNCTION pepsi.payment_amount(amount text, OUT currency text, OUT value numeric)
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m text[] := regexp_match(btrim(coalesce(amount, '')), '^([A-Z][A-Z0-9]{0,11}):([0-9]{1,12}(\.[0-9]{1,8})?)$');
BEGIN
    IF m IS NULL THEN
        RAISE EXCEPTION 'invalid amount "%"', amount
            USING ERRCODE = 'invalid_parameter_value', HINT = 'CURRENCY:VALUE, as EUR:0.50.';
    END IF;
    currency := m[1];
    value := m[2]::numeric;
END
$$;

-- Record a Message-Id of mail our user sender sent to recipients
-- (pepsi-stage-auto-pay): their domains are the ones a request may come from.
CREATE FUNCTION pepsi.outbound_message_record(message_id text, sender text, recipients text[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    INSERT INTO pepsi.outbound_message (message_id, sender, recipient_domains)
    VALUES (outbound_message_record.message_id, lower(outbound_message_record.sender),
            ARRAY(SELECT DISTINCT lower(split_part(r, '@', 2)) FROM unnest(recipients) r))
    ON CONFLICT (message_id) DO NOTHING
$$;

-- Delete the records of mail sent more than older_than ago (a
-- pepsi.schedule call); returns how many went.
CREATE FUNCTION pepsi.outbound_message_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    deleted bigint;
BEGIN
    DELETE FROM pepsi.outbound_message o WHERE o.sent_at < now() - older_than;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

-- A payment request from peer to our user address, answering one of
-- message_ids (its In-Reply-To and References) that went to peer's domain
-- (or a subdomain of it), for amount at uri: may it
-- be paid within the owner's limits (per_message, per_day: required;
-- per_domain: the day's total to peer's domain, optional), unless the
-- stage refuses it already (refusal: why, recorded)?  Returns
-- {"pay": true, "id": N} with the payment recorded pending, or
-- {"pay": false, "why": ...} with the refusal recorded (a request that
-- answers none of address's messages is not recorded: it is no request of
-- ours to refuse, only mail).
CREATE FUNCTION pepsi.auto_pay_reserve(address text, peer text, message_ids text[], uri text, amount text,
                                       per_message text, per_day text, per_domain text, refusal text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.secretary_address(address);
    peer_key text := pepsi.secretary_address(peer);
    domain text := split_part(pepsi.secretary_address(peer), '@', 2);
    matched text;
    asked record;
    lim record;
    spent numeric;
    why text;
    new_id bigint;
BEGIN
    SELECT o.message_id INTO matched FROM pepsi.outbound_message o
    WHERE o.message_id = ANY (message_ids) AND o.sender = key
      AND EXISTS (SELECT FROM unnest(o.recipient_domains) r WHERE r = domain OR r LIKE '%.' || domain)
    LIMIT 1;
    IF matched IS NULL THEN
        RETURN jsonb_build_object('pay', false, 'match', false,
                                  'why', 'it answers no message this address sent to that domain');
    END IF;
    -- One decision at a time per payer: the limits are sums over its rows.
    PERFORM pg_advisory_xact_lock(hashtext('pepsi.auto_pay'), hashtext(key));
    BEGIN
        asked := pepsi.payment_amount(amount);
    EXCEPTION WHEN invalid_parameter_value THEN
        asked := ROW('?', 0::numeric);
        why := format('the amount "%s" is not CURRENCY:VALUE', left(amount, 40));
    END;
    why := coalesce(why, refusal);
    IF why IS NULL AND EXISTS (SELECT FROM pepsi.payment p WHERE p.direction = 'out' AND p.address = key
                               AND p.uri = auto_pay_reserve.uri AND p.outcome IN ('pending', 'paid')) THEN
        why := 'it was paid already';
    ELSIF why IS NULL AND (per_message IS NULL OR per_day IS NULL) THEN
        why := 'no limit is set (AUTO_PAY_PER_MESSAGE and AUTO_PAY_PER_DAY)';
    END IF;
    IF why IS NULL THEN
        BEGIN
            lim := pepsi.payment_amount(per_message);
            IF lim.currency <> asked.currency OR asked.value > lim.value THEN
                why := format('%s is over the limit per message, %s (AUTO_PAY_PER_MESSAGE)', amount, per_message);
            END IF;
            lim := pepsi.payment_amount(per_day);
            SELECT coalesce(sum(p.amount), 0) INTO spent FROM pepsi.payment p
            WHERE p.direction = 'out' AND p.address = key AND p.currency = asked.currency
              AND p.outcome IN ('pending', 'paid') AND p.created_at > now() - interval '1 day';
            IF why IS NULL AND (lim.currency <> asked.currency OR spent + asked.value > lim.value) THEN
                why := format('%s would bring the last day''s payments to %s:%s, over the limit per day, %s (AUTO_PAY_PER_DAY)',
                              amount, asked.currency, spent + asked.value, per_day);
            END IF;
            IF why IS NULL AND per_domain IS NOT NULL THEN
                lim := pepsi.payment_amount(per_domain);
                SELECT coalesce(sum(p.amount), 0) INTO spent FROM pepsi.payment p
                WHERE p.direction = 'out' AND p.address = key AND p.currency = asked.currency
                  AND p.peer_domain = domain AND p.outcome IN ('pending', 'paid')
                  AND p.created_at > now() - interval '1 day';
                IF lim.currency <> asked.currency OR spent + asked.value > lim.value THEN
                    why := format('%s would bring the last day''s payments to %s to %s:%s, over the limit per recipient domain, %s (AUTO_PAY_PER_DOMAIN)',
                                  amount, domain, asked.currency, spent + asked.value, per_domain);
                END IF;
            END IF;
        EXCEPTION WHEN invalid_parameter_value THEN
            why := format('a limit is not CURRENCY:VALUE (%s)', SQLERRM);
        END;
    END IF;
    INSERT INTO pepsi.payment (direction, address, peer, peer_domain, message_id, uri, currency, amount, outcome,
                               reason, finished_at)
    VALUES ('out', key, peer_key, domain, matched, left(auto_pay_reserve.uri, 2048), asked.currency, asked.value,
            CASE WHEN why IS NULL THEN 'pending' ELSE 'refused' END, why,
            CASE WHEN why IS NOT NULL THEN now() END)
    RETURNING id INTO new_id;
    IF why IS NOT NULL THEN
        RETURN jsonb_build_object('pay', false, 'match', true, 'why', why, 'id', new_id);
    END IF;
    RETURN jsonb_build_object('pay', true, 'match', true, 'id', new_id, 'message_id', matched);
END
$$;

-- What became of pending payment id: 'paid' or 'failed', with the reason.
-- Not of one pepsi-helper-auto-pay claimed (auto_pay_claim): that one is
-- the helper's to settle (auto_pay_settle), which alone knows what the
-- wallet did.
CREATE FUNCTION pepsi.auto_pay_finish(id bigint, outcome text, reason text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF outcome NOT IN ('paid', 'failed') THEN
        RAISE EXCEPTION 'invalid outcome "%"', outcome USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pepsi.payment p SET outcome = auto_pay_finish.outcome, reason = auto_pay_finish.reason, finished_at = now()
    WHERE p.id = auto_pay_finish.id AND p.outcome = 'pending' AND p.claimed_at IS NULL;
END
$$;

-- A proof of payment (checked by the stage) for challenge of owner: its
-- held mail is released and its sender whitelisted, as a confirmation
-- would, and the payment recorded (in).  Returns how many rows were
-- released, or NULL when the challenge is not owner's open one.
CREATE FUNCTION pepsi.secretary_paid(owner text, payer text, challenge bigint, uri text, amount text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.secretary_address(owner);
    c pepsi.secretary_challenge;
    asked record := pepsi.payment_amount(amount);
BEGIN
    SELECT * INTO c FROM pepsi.secretary_challenge s
    WHERE s.id = challenge AND s.owner = key AND s.released_at IS NULL AND s.expires_at > now() FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO pepsi.payment (direction, address, peer, peer_domain, message_id, uri, currency, amount, outcome,
                               reason, finished_at)
    VALUES ('in', key, coalesce(nullif(c.sender, ''), lower(payer)), split_part(coalesce(nullif(c.sender, ''), payer), '@', 2),
            c.id::text, left(secretary_paid.uri, 2048), asked.currency, asked.value, 'received',
            format('proof from <%s>', payer), now());
    RETURN pepsi.secretary_release_challenge(c.id, 'reply');
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'outbound_message', '{SELECT}'),
    ('pepsi_config', 'table', 'payment', '{SELECT}'),
    ('pepsi_config', 'function', 'outbound_message_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'payment_amount', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'payment_amount', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'outbound_message_record', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'auto_pay_reserve', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'auto_pay_finish', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'secretary_paid', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('outbound_message_record'), ('outbound_message_prune'),
    ('auto_pay_reserve'), ('auto_pay_finish'), ('secretary_paid');

SELECT pg_catalog.pg_extension_config_dump('pepsi.outbound_message', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.payment', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.payment_id_seq', '');
-- end of auto-pay

-- ===========================================================================
-- List digests, post size limit, DMARC wrap (issue 40)
--
-- A post to a list that has digest members is copied once into
-- pepsi.list_digest at its fan-out (keyed by its queue row, so a fan-out
-- that runs again adds nothing); a schedule row injecting at the list
-- stage with arguments {"list_digest": true} and the list's address as
-- recipient makes pepsi-stage-list call pepsi.list_digest_send, which in
-- one transaction builds the digest (mailing_list.digest_format: "mime",
-- RFC 2046 multipart/digest of message/rfc822 parts after a table of
-- contents, or "plain", RFC 1153), queues it to the digest members (one
-- row per domain, from list-bounces@, signed as the list's mail), and
-- deletes the posts it took: a second call finds none.  nomail members
-- get nothing.  mailing_list.max_post_size holds a bigger post for the
-- moderators; dmarc_mitigation "wrap" sends a p=reject or quarantine
-- author's post as an attachment (message/rfc822) of a message from the
-- list instead of rewriting its From:.
-- ===========================================================================

CREATE TABLE pepsi.list_digest (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id       bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    workqueue_id  bigint NOT NULL,
    subject       text NOT NULL DEFAULT '',
    author        text NOT NULL DEFAULT '',
    sent_date     text NOT NULL DEFAULT '',
    message_id    text NOT NULL DEFAULT '',
    content_type  text NOT NULL DEFAULT 'text/plain',
    headers       bytea NOT NULL,
    body          bytea NOT NULL,
    added_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (list_id, workqueue_id)
);
COMMENT ON TABLE pepsi.list_digest IS
    'Posts waiting for the next digest of their list (copied at fan-out when the list has digest members)';

-- Copy the post on queue row workqueue_id (its headers as the list sends
-- them) for list's next digest, when the list has a digest member.  True
-- when copied; a second call for the same row copies nothing.
CREATE FUNCTION pepsi.list_digest_add(list bigint, workqueue_id bigint, subject text, author text, sent_date text,
                                      message_id text, content_type text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list AND m.delivery = 'digest'
                   AND m.disabled IS NULL) THEN
        RETURN false;
    END IF;
    INSERT INTO pepsi.list_digest (list_id, workqueue_id, subject, author, sent_date, message_id, content_type,
                                   headers, body)
    SELECT list, w.id, left(coalesce(list_digest_add.subject, ''), 500), left(coalesce(author, ''), 500),
           left(coalesce(sent_date, ''), 100), left(coalesce(message_id, ''), 500),
           lower(left(coalesce(nullif(content_type, ''), 'text/plain'), 200)), w.headers, b.body
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE w.id = list_digest_add.workqueue_id
    ON CONFLICT ON CONSTRAINT list_digest_list_id_workqueue_id_key DO NOTHING;
    RETURN FOUND;
END
$$;

-- One digest of list's waiting posts to its digest members, queued at
-- stage; the posts taken are deleted in the same transaction.
-- {"posts", "rows", "issue"}; posts 0 when nothing waited.
CREATE FUNCTION pepsi.list_digest_send(list bigint, stage text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    local text;
    domain text;
    posts integer;
    issue integer;
    boundary text := 'digest-' || replace(gen_random_uuid()::text, '-', '');
    toc text;
    head text;
    body bytea;
    g record;
    made integer := 0;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.id = list FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    local := split_part(l.address, '@', 1);
    domain := split_part(l.address, '@', 2);
    SELECT count(*), string_agg(format('%4s. %s (%s)', d.n, d.subject, d.author), E'\r\n' ORDER BY d.n)
    INTO posts, toc
    FROM (SELECT row_number() OVER (ORDER BY x.id) AS n, coalesce(nullif(x.subject, ''), '(no subject)') AS subject,
                 x.author FROM pepsi.list_digest x WHERE x.list_id = list) d;
    IF posts = 0 THEN
        RETURN jsonb_build_object('posts', 0, 'rows', 0);
    END IF;
    issue := l.digest_issue + 1;
    UPDATE pepsi.mailing_list m SET digest_issue = issue WHERE m.id = list;
    head := format(E'From: <%s-request@%s>\r\nTo: <%s>\r\nSubject: %s Digest, Issue %s (%s message%s)\r\n'
                   'Date: %s\r\nMessage-ID: <digest.%s.%s.%s@%s>\r\nList-Id: <%s.%s>\r\nList-Post: <mailto:%s>\r\n'
                   'List-Unsubscribe: <mailto:%s-unsubscribe@%s>\r\nX-Loop: %s\r\nPrecedence: list\r\nMIME-Version: 1.0\r\n',
                   local, domain, l.address, local, issue, posts, CASE WHEN posts = 1 THEN '' ELSE 's' END,
                   to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS') || ' +0000',
                   l.id, issue, left(boundary, 16), domain, local, domain, l.address, local, domain, l.address);
    IF l.digest_format = 'mime' THEN
        head := head || format(E'Content-Type: multipart/mixed; boundary="%s"\r\n', boundary);
        SELECT convert_to(format(E'This is a MIME digest (RFC 2046 multipart/digest).\r\n\r\n--%s\r\n'
                                 'Content-Type: text/plain; charset=utf-8\r\nContent-Description: Today''s Topics\r\n\r\n'
                                 'Today''s Topics:\r\n\r\n%s\r\n\r\n--%s\r\nContent-Type: multipart/digest; boundary="%s-d"\r\n\r\n',
                                 boundary, toc, boundary, boundary), 'UTF8')
               || string_agg(convert_to(format(E'--%s-d\r\n\r\n', boundary), 'UTF8') || x.headers || '\x0d0a'::bytea
                             || x.body || CASE WHEN length(x.body) > 0 AND get_byte(x.body, length(x.body) - 1) = 10
                                               THEN ''::bytea ELSE '\x0d0a'::bytea END, ''::bytea ORDER BY x.id)
               || convert_to(format(E'--%s-d--\r\n\r\n--%s--\r\n', boundary, boundary), 'UTF8')
        INTO body FROM pepsi.list_digest x WHERE x.list_id = list;
    ELSE
        head := head || E'Content-Type: text/plain; charset=utf-8\r\n';
        SELECT convert_to(format(E'Today''s Topics:\r\n\r\n%s\r\n\r\n%s\r\n\r\n', toc, repeat('-', 70)), 'UTF8')
               || string_agg(convert_to(format(E'Date: %s\r\nFrom: %s\r\nSubject: %s\r\nMessage-ID: %s\r\n\r\n',
                                               x.sent_date, x.author, x.subject, x.message_id), 'UTF8')
                             || CASE WHEN x.content_type LIKE 'text/plain%' THEN x.body
                                     ELSE convert_to(format(E'[A %s message, left out of the plain digest.]\r\n',
                                                            split_part(x.content_type, ';', 1)), 'UTF8') END
                             || convert_to(E'\r\n' || repeat('-', 30) || E'\r\n\r\n', 'UTF8'), ''::bytea ORDER BY x.id)
               || convert_to(format(E'End of %s Digest, Issue %s\r\n%s\r\n', local, issue,
                                    repeat('*', length(format('End of %s Digest, Issue %s', local, issue)))), 'UTF8')
        INTO body FROM pepsi.list_digest x WHERE x.list_id = list;
    END IF;
    FOR g IN SELECT split_part(m.address, '@', 2) AS dom, array_agg(m.address ORDER BY m.address) AS rcpt
             FROM pepsi.list_member m WHERE m.list_id = list AND m.delivery = 'digest' AND m.disabled IS NULL
             GROUP BY 1 ORDER BY 1
    LOOP
        PERFORM pepsi.workqueue_inject(stage, local || '-bounces@' || domain, g.rcpt, convert_to(head, 'UTF8'), body,
            jsonb_build_object('origin', jsonb_build_object('trust', 'list', 'program', 'pepsi-stage-list',
                                                            'list', l.address, 'domain', domain),
                               'list', jsonb_build_object('digest', issue)),
            format('list-digest-%s-%s-%s', list, issue, g.dom));
        made := made + 1;
    END LOOP;
    DELETE FROM pepsi.list_digest x WHERE x.list_id = list;
    RETURN jsonb_build_object('posts', posts, 'rows', made, 'issue', issue);
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'list_digest_add', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_digest_send', '{EXECUTE}'),
    ('pepsi_config', 'table', 'list_digest', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_digest_add'), ('list_digest_send');

-- The web forms of pepsi-httpd (/list/form/...): a subscribe or
-- unsubscribe request for address, made as if address had mailed
-- list-subscribe@ or list-unsubscribe@: a message injected at the
-- admission stage (init, where pepsi-stage-list takes it), from address, whose
-- answer is the mail carrying the confirmation token and link (double
-- opt-in: nothing changes until the token comes back).  One live request
-- per list, address and action (its token).  NULL when queued, else why not.
CREATE FUNCTION pepsi.list_web_request(list text, address text, action text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    who text := lower(trim(coalesce(address, '')));
    target text;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = lower(list_web_request.list);
    IF NOT FOUND THEN
        RETURN 'there is no such list';
    ELSIF list_web_request.action IS NULL OR list_web_request.action NOT IN ('subscribe', 'unsubscribe') THEN
        RETURN 'the action must be subscribe or unsubscribe';
    ELSIF who !~ '^[a-z0-9.!#$%&''*+/=?^_`{|}~-]+@[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$'
          OR length(who) > 254 THEN
        RETURN 'that is not an e-mail address';
    ELSIF pepsi.list_resolve(who) IS NOT NULL THEN
        RETURN 'a list address cannot subscribe';
    END IF;
    target := split_part(l.address, '@', 1) || '-' || list_web_request.action || '@' || split_part(l.address, '@', 2);
    PERFORM pepsi.workqueue_inject('init', who, ARRAY[target],
        convert_to(format(E'From: <%s>\r\nTo: <%s>\r\nSubject: %s\r\nMessage-ID: <web.%s@%s>\r\n'
                          'Date: %s\r\nX-Pepsi-Web-Request: yes\r\n',
                          who, target, list_web_request.action, replace(gen_random_uuid()::text, '-', ''),
                          split_part(l.address, '@', 2),
                          to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS') || ' +0000'), 'UTF8'),
        convert_to(list_web_request.action || E'\r\n', 'UTF8'),
        jsonb_build_object('origin', jsonb_build_object('trust', 'pepsi', 'program', 'pepsi-httpd')),
        format('list-web-%s-%s-%s', l.id, list_web_request.action, who));
    PERFORM pepsi.event_log_write('list_web_request',
        jsonb_build_object('list', l.id, 'address', who, 'action', list_web_request.action));
    RETURN NULL;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_httpd', 'function', 'list_web_request', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'list_confirm', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_web_request');

SELECT pg_catalog.pg_extension_config_dump('pepsi.list_digest', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_digest_id_seq', '');
-- end of list digests, post size limit, DMARC wrap

-- ===========================================================================
-- Owner leftovers: the secretary's batched decision, quotas at scale
--
-- pepsi.secretary_decide_many decides a batch of rows of
-- pepsi-stage-check-whitelist with one call and one transaction instead
-- of a call each (bench/secretary); the pairs in the order of (owner,
-- sender), so that two batches that need the same challenges wait for
-- each other and never deadlock.
--
-- pepsi.quota_usage keeps whether each mailbox is full (is_full: storage
-- or messages, against the limits in force) and the day its daily limit
-- was reached (daily_full_on), set by a trigger at each write of the
-- use and recomputed for the addresses whose limits change (a trigger on
-- pepsi.quota).  pepsi.quota_full then reads a partial index of the few
-- full mailboxes instead of working out every row's limits at each of
-- pepsi-ingress's refreshes.  pepsi.quota_record_many records a batch of
-- the maildir writer's reports with one call; pepsi.quota_delivered
-- counts the day's deliveries of the LMTP path, for max_daily.
-- ===========================================================================

-- The secretary's decisions on a batch of rows: rows is a JSON array of
-- objects {owner, sender, row_id, verified, token, look_in_text} (the
-- arguments of pepsi.secretary_decide, ttl and max_per_hour shared);
-- returns secretary_decide's answers as a JSON array in the same order.
-- A row may also carry "hold": {expected_stage, at_stage, claim_token,
-- merge} (the stage's pepsi_hold_args): when its answer is to hold, the
-- row is then held here (pepsi.workqueue_commit's pause with no retry
-- time, its state merged with merge and {"secretary": {owner,
-- challenge}}), in the decision's own transaction, and its answer says
-- "held": true; if one row's hold fails (its claim is stale), the call
-- fails and nothing of the batch is decided or held.  A row that also
-- carries "may_defer": true may be left undecided, its answer null: its
-- pair (owner, sender) was being decided by another session's batch at
-- the time (opening or sending the pair's challenge, not yet committed);
-- the stage decides such a row alone (pepsi.secretary_decide), after
-- this batch's commit, instead of the whole batch waiting for the
-- other's commit with its own decisions uncommitted, which others then
-- wait for in turn (bench/secretary).  A row without it is decided here,
-- waiting if need be, as an older stage expects.
--
-- Set-based where the batch allows (bench/secretary): the whitelist is
-- read once for the batch, the pairs (owner, sender) are taken in that
-- order (so two batches that need the same challenges wait for each other
-- and never deadlock), and a pair whose rows only wait under its open
-- challenge (the common case: no token to try, the challenge sent and in
-- time) is one lookup, FOR SHARE, whatever its number of rows; only the
-- other pairs' rows are decided one by one (pepsi.secretary_decide).  The
-- rows held are then recorded in pepsi.secretary_held and held with one
-- statement each; a row whose claim is stale is put through
-- pepsi.workqueue_commit, which names it in the error.
CREATE FUNCTION pepsi.secretary_decide_many(rows jsonb, ttl interval, max_per_hour integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    q jsonb[];
    keys text[];
    froms text[];
    waits boolean[];
    answers jsonb[];
    waiting_rows bigint[] := '{}';
    waiting_challenges bigint[] := '{}';
    held bigint[];
    p record;
    c pepsi.secretary_challenge;
    i integer;
    n integer;
BEGIN
    IF jsonb_typeof(rows) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the rows to decide must be a JSON array, not %', coalesce(jsonb_typeof(rows), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    n := jsonb_array_length(rows);
    IF n = 0 THEN
        RETURN '[]';
    END IF;
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '365 days' THEN
        RAISE EXCEPTION 'invalid hold time %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to a year (HOLD_TIME).';
    END IF;
    -- Each row's owner and sender as secretary_decide keys them, and
    -- whether it only waits under an open challenge (no token to try).
    SELECT array_agg(a.e ORDER BY a.o), array_agg(pepsi.secretary_address(a.e->>'owner') ORDER BY a.o),
           array_agg(lower(coalesce(a.e->>'sender', '')) ORDER BY a.o),
           array_agg(NOT (coalesce((a.e->>'verified')::boolean, false)
                          AND (a.e->>'token' IS NOT NULL OR coalesce((a.e->>'look_in_text')::boolean, false)))
                     ORDER BY a.o)
    INTO q, keys, froms, waits
    FROM jsonb_array_elements(rows) WITH ORDINALITY AS a (e, o);
    answers := array_fill(NULL::jsonb, ARRAY[n]);
    -- Senders on their owner's whitelist pass: one lookup for the batch.
    FOR i IN SELECT u.o FROM unnest(keys, froms) WITH ORDINALITY AS u (k, f, o)
             JOIN pepsi.whitelist w ON w.owner = u.k AND w.sender = u.f WHERE u.f <> ''
    LOOP
        answers[i] := '{"action": "pass"}';
    END LOOP;
    FOR p IN SELECT u.k, u.f, bool_and(u.w) AS waits, array_agg(u.o ORDER BY u.o) AS os,
                    bool_and(coalesce((q[u.o]->>'may_defer')::boolean, false)) AS may_defer
             FROM unnest(keys, froms, waits) WITH ORDINALITY AS u (k, f, w, o)
             WHERE answers[u.o] IS NULL GROUP BY u.k, u.f ORDER BY u.k, u.f
    LOOP
        IF p.waits THEN
            -- FOR SHARE, as secretary_decide's own wait (which see).
            SELECT * INTO c FROM pepsi.secretary_challenge x
            WHERE x.owner = p.k AND x.sender = p.f AND x.released_at IS NULL
              AND x.challenged_at IS NOT NULL AND x.expires_at > now() FOR SHARE;
            IF FOUND THEN
                FOREACH i IN ARRAY p.os LOOP
                    answers[i] := jsonb_build_object('action', 'hold', 'token', NULL, 'challenge', c.id,
                                                     'expires_at', c.expires_at,
                                                     'why', CASE WHEN coalesce((q[i]->>'verified')::boolean, false)
                                                                 THEN 'challenged before'
                                                                 ELSE 'not verified: no challenge' END);
                    waiting_rows := waiting_rows || (q[i]->>'row_id')::bigint;
                    waiting_challenges := waiting_challenges || c.id;
                END LOOP;
                CONTINUE;
            END IF;
        END IF;
        -- The pair's rows decided one by one may open or send its
        -- challenge: the lock says this transaction does, until its
        -- commit.  Another batch's rows of the pair are then left to be
        -- decided alone (a null answer) rather than wait here for it.
        IF NOT pg_try_advisory_xact_lock(hashtext('pepsi.secretary_decide_many'), hashtext(p.k || ' ' || p.f)) THEN
            CONTINUE WHEN p.may_defer;
        END IF;
        FOREACH i IN ARRAY p.os LOOP
            answers[i] := pepsi.secretary_decide(q[i]->>'owner', q[i]->>'sender', (q[i]->>'row_id')::bigint,
                                                 coalesce((q[i]->>'verified')::boolean, false), q[i]->>'token',
                                                 coalesce((q[i]->>'look_in_text')::boolean, false),
                                                 ttl, max_per_hour);
        END LOOP;
    END LOOP;
    INSERT INTO pepsi.secretary_held (row_id, challenge_id)
    SELECT DISTINCT ON (u.r) u.r, u.c FROM unnest(waiting_rows, waiting_challenges) WITH ORDINALITY AS u (r, c, o)
    ORDER BY u.r, u.o DESC
    ON CONFLICT ON CONSTRAINT secretary_held_pkey DO UPDATE SET challenge_id = excluded.challenge_id;
    -- The rows to hold with their claims (pepsi.workqueue_commit's guard), all at once.
    WITH h AS (
        SELECT (q[o]->>'row_id')::bigint AS id, q[o]->'hold'->>'expected_stage' AS expected,
               q[o]->'hold'->>'at_stage' AS at_stage, (q[o]->'hold'->>'claim_token')::uuid AS token,
               CASE WHEN jsonb_typeof(q[o]->'hold'->'merge') = 'object' THEN q[o]->'hold'->'merge' ELSE '{}' END
               || jsonb_build_object('secretary', jsonb_build_object('owner', q[o]->>'owner',
                                                                     'challenge', answers[o]->'challenge')) AS merge
        FROM generate_subscripts(q, 1) AS o
        WHERE answers[o]->>'action' = 'hold' AND jsonb_typeof(q[o]->'hold') = 'object'
    ), done AS (
        UPDATE pepsi.workqueue w
        SET status = 'paused', timeout = 'infinity', state = w.state || h.merge, stage = coalesce(h.at_stage, w.stage)
        FROM h
        WHERE w.id = h.id AND h.at_stage IS DISTINCT FROM ''
          AND (w.status = 'running' AND w.stage = h.expected
               AND w.claim_digest IS NOT DISTINCT FROM sha256(uuid_send(h.token))) IS TRUE
        RETURNING w.id
    )
    SELECT array_agg(d.id) INTO held FROM done d;
    FOR i IN 1 .. n LOOP
        CONTINUE WHEN (answers[i]->>'action' = 'hold' AND jsonb_typeof(q[i]->'hold') = 'object') IS NOT TRUE;
        IF NOT (q[i]->>'row_id')::bigint = ANY (coalesce(held, '{}')) THEN
            -- Its claim is stale (or its hold malformed): the commit names why, and the call fails.
            PERFORM pepsi.workqueue_commit((q[i]->>'row_id')::bigint, q[i]->'hold'->>'expected_stage', 'pause',
                NULL, '{}', 'Infinity', NULL, NULL, NULL, NULL, NULL, q[i]->'hold'->>'at_stage',
                (q[i]->'hold'->>'claim_token')::uuid);
            RAISE EXCEPTION 'row % of the batch could not be held', q[i]->>'row_id';
        END IF;
        answers[i] := answers[i] || '{"held": true}';
    END LOOP;
    RETURN to_jsonb(answers);
END
$$;

-- The trigger that keeps quota_usage's is_full and daily_full_on.
CREATE FUNCTION pepsi.quota_usage_state() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l record;
BEGIN
    SELECT * INTO l FROM pepsi.quota_limits(NEW.address);
    NEW.is_full := coalesce(
        (coalesce(l.max_bytes, NEW.disk_bytes) > 0 AND NEW.bytes >= coalesce(l.max_bytes, NEW.disk_bytes))
        OR (coalesce(l.max_messages, NEW.disk_messages) > 0
            AND NEW.messages >= coalesce(l.max_messages, NEW.disk_messages)), false);
    NEW.daily_full_on := CASE WHEN l.max_daily > 0 AND NEW.day_messages >= l.max_daily THEN NEW.day END;
    RETURN NEW;
END
$$;
CREATE TRIGGER quota_usage_state BEFORE INSERT OR UPDATE OF bytes, messages, disk_bytes, disk_messages, day, day_messages
    ON pepsi.quota_usage FOR EACH ROW EXECUTE FUNCTION pepsi.quota_usage_state();
CREATE INDEX quota_usage_full ON pepsi.quota_usage (address) WHERE is_full OR daily_full_on IS NOT NULL;

-- When the limits of an address or a domain change: its use rows' state again.
CREATE FUNCTION pepsi.quota_limits_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := CASE WHEN TG_OP = 'DELETE' THEN OLD.address ELSE NEW.address END;
BEGIN
    IF key LIKE '@%' THEN
        UPDATE pepsi.quota_usage u SET day = u.day WHERE right(u.address, length(key)) = key;
    ELSE
        UPDATE pepsi.quota_usage u SET day = u.day WHERE u.address = key;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER quota_limits_changed AFTER INSERT OR UPDATE OR DELETE ON pepsi.quota
    FOR EACH ROW EXECUTE FUNCTION pepsi.quota_limits_changed();

-- pepsi.quota_record for a batch of deliveries: a JSON array of objects
-- {address, bytes, messages, max_bytes, max_messages, delivered,
-- thresholds (an array of percentages)}, recorded in order; returns
-- quota_record's answers (the threshold to warn of, else 0) in order.
CREATE FUNCTION pepsi.quota_record_many(deliveries jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    d jsonb;
    answers jsonb := '[]';
BEGIN
    IF jsonb_typeof(deliveries) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the deliveries must be a JSON array, not %', coalesce(jsonb_typeof(deliveries), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR d IN SELECT e FROM jsonb_array_elements(deliveries) WITH ORDINALITY AS a (e, o) ORDER BY o LOOP
        answers := answers || to_jsonb(pepsi.quota_record(d->>'address', (d->>'bytes')::bigint,
            (d->>'messages')::bigint, (d->>'max_bytes')::bigint, (d->>'max_messages')::bigint,
            coalesce((d->>'delivered')::boolean, false),
            coalesce(ARRAY(SELECT t::integer FROM jsonb_array_elements_text(d->'thresholds') t), '{}')));
    END LOOP;
    RETURN answers;
END
$$;

-- One more message today for each address of addresses (a JSON array)
-- whose limits have a max_daily: what the LMTP path delivered.  Notifies
-- pepsi_quota when an address becomes full.  Returns how many it counted.
CREATE FUNCTION pepsi.quota_delivered(addresses jsonb) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    a text;
    key text;
    was_full boolean;
    counted integer := 0;
BEGIN
    IF jsonb_typeof(addresses) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the addresses must be a JSON array, not %', coalesce(jsonb_typeof(addresses), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR a IN SELECT jsonb_array_elements_text(addresses) LOOP
        key := pepsi.settings_key(a);
        CONTINUE WHEN NOT EXISTS (SELECT FROM pepsi.quota_limits(key) l WHERE l.max_daily > 0);
        was_full := pepsi.quota_is_full(key);
        INSERT INTO pepsi.quota_usage AS u (address, day, day_messages) VALUES (key, current_date, 1)
        ON CONFLICT ON CONSTRAINT quota_usage_pkey DO UPDATE SET
            day_messages = CASE WHEN u.day = current_date THEN u.day_messages ELSE 0 END + 1,
            day = current_date, updated_at = now();
        counted := counted + 1;
        IF pepsi.quota_is_full(key) IS DISTINCT FROM was_full THEN
            PERFORM pg_notify('pepsi_quota', key);
        END IF;
    END LOOP;
    RETURN counted;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'secretary_decide_many', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_record_many', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_delivered', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('secretary_decide_many'), ('quota_record_many'),
    ('quota_delivered');

-- end of owner leftovers

-- ===========================================================================
-- telemetry: message volumes by day
--
-- pepsi-telemetry-client (opt-in) reports the messages received,
-- delivered, deferred and bounced per UTC day, and nothing per message.
-- The counters are totals since installation (pepsi.stats_totals), so the
-- maintenance worker's first roll of each day (pepsi.stats_minute_roll)
-- keeps them in pepsi.stats_day, 400 days, and a day's volume is the next
-- day's totals less its own.
-- ===========================================================================

CREATE TABLE pepsi.stats_day (
    day         date PRIMARY KEY,
    received    bigint NOT NULL,
    sent        bigint NOT NULL,
    deferred    bigint NOT NULL,
    bounced     bigint NOT NULL
);
COMMENT ON TABLE pepsi.stats_day IS
    'The totals of pepsi.stats_totals at the first minute of each UTC day (maintenance worker), 400 days';

-- The complete UTC days of the last "days" (today excluded) whose two
-- ends are known, with what was received, delivered, deferred and bounced
-- in each.
CREATE FUNCTION pepsi.stats_daily(days integer DEFAULT 7)
RETURNS TABLE (day date, received bigint, delivered bigint, deferred bigint, bounced bigint)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF days IS NULL OR days < 1 OR days > 366 THEN
        RAISE EXCEPTION 'days must be from 1 to 366'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH points AS (
        SELECT d.day, d.received, d.sent, d.deferred, d.bounced FROM pepsi.stats_day d
        WHERE d.day >= (now() AT TIME ZONE 'UTC')::date - days
    ), steps AS (
        SELECT p.day, lead(p.day) OVER w AS next_day,
               greatest(lead(p.received) OVER w - p.received, 0) AS received,
               greatest(lead(p.sent) OVER w - p.sent, 0) AS delivered,
               greatest(lead(p.deferred) OVER w - p.deferred, 0) AS deferred,
               greatest(lead(p.bounced) OVER w - p.bounced, 0) AS bounced
        FROM points p WINDOW w AS (ORDER BY p.day)
    )
    SELECT s.day, s.received, s.delivered, s.deferred, s.bounced
    FROM steps s WHERE s.next_day = s.day + 1
    ORDER BY s.day;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_monitor', 'table', 'stats_day', '{SELECT}'),
    ('pepsi_monitor', 'function', 'stats_daily', '{EXECUTE}'),
    ('pepsi_config', 'table', 'stats_day', '{SELECT}');

SELECT pg_catalog.pg_extension_config_dump('pepsi.stats_day', '');
-- end of telemetry

-- ====================================================================
-- S/MIME and key discovery (issue 41 items 2-3): peer_key.smime_capabilities
-- is folded into peer_key above.

-- Key discovery: pepsi-stage-encrypt parks a message waiting for a
-- recipient's key (KEYDISC) with state.encrypt.waiting_for = the address
-- and a key_request row; pepsi-keydisc asks WKD, DANE and the key servers,
-- stores what it finds in peer_key and calls keydisc_release, which
-- settles the request (found: the row goes; a miss: negative_until, the
-- negative cache that keeps the next message from parking) and resumes
-- the parked rows (workqueue_resume: NOTIFY).  It runs as the owner: the
-- crypto role writes no queue row itself.  Returns the rows resumed.
CREATE FUNCTION pepsi.keydisc_release(address text, found boolean, negative_seconds integer DEFAULT 86400,
                                      methods_replied text[] DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    a text := lower(keydisc_release.address);
    ids bigint[];
BEGIN
    IF found THEN
        DELETE FROM pepsi.key_request r WHERE r.address = a;
    ELSE
        UPDATE pepsi.key_request r SET settled_at = now(),
               methods_replied = coalesce(keydisc_release.methods_replied, '{}'),
               negative_until = now() + make_interval(secs => greatest(negative_seconds, 1))
         WHERE r.address = a;
    END IF;
    -- index_status, not status: workqueue_keydisc_waiting's predicate (paused either way).
    SELECT array_agg(w.id) INTO ids FROM pepsi.workqueue w
     WHERE w.index_status = 'paused' AND w.state -> 'encrypt' ->> 'waiting_for' = a;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    RETURN pepsi.workqueue_resume(ids);
END
$$;
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_crypto', 'function', 'keydisc_release', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('keydisc_release');
-- end of S/MIME and key discovery

-- ===========================================================================
-- The mailing lists' web archive (pepsi-archive(8), pepsi-httpd's archive
-- pages; issue 40, items 4-5)
--
-- Every post a list accepts is stored once, as its OWN copy: the list stage
-- calls archive_post(list, row) before the fan-out, which copies the row's
-- headers and body server-side into pepsi.archive_message.raw, so the
-- body garbage collector owes the archive nothing (the queue's body goes
-- when the last delivery does).  pepsi-archive import feeds an mbox through
-- archive_store.  A message is parsed here (headers unfolded, RFC 2047
-- words decoded, MIME walked, transfer encodings undone) into its text, one
-- tsvector (GIN-indexed) and its attachments; it joins the thread of the
-- nearest message it names (References, then In-Reply-To, nearest first,
-- as MHonArc and JWZ do), and a message arriving late adopts the messages
-- that named it.  What was wrong with a message (no Message-Id, broken
-- MIME, an attachment over the list's limit) is kept with it in problems
-- and written to event_log; it is still archived.  Members of a private
-- list read it after logging in with a single-use link mailed to them
-- (archive_login, archive_session).
-- ===========================================================================

CREATE TABLE pepsi.archive_policy (
    list_id          bigint PRIMARY KEY REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    enabled          boolean NOT NULL DEFAULT true,
    visibility       text NOT NULL DEFAULT 'public' CHECK (visibility IN ('public', 'private')),
    obfuscation      text NOT NULL DEFAULT 'at' CHECK (obfuscation IN ('none', 'at', 'hide')),
    max_attachment   bigint NOT NULL DEFAULT 10485760 CHECK (max_attachment >= 0)
);
COMMENT ON TABLE pepsi.archive_policy IS
    'Per list: archived or not, public or members only, how addresses are obfuscated, the largest attachment kept';

CREATE TABLE pepsi.archive_thread (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id       bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    subject       text,
    started_at    timestamptz NOT NULL,
    last_at       timestamptz NOT NULL,
    message_count integer NOT NULL DEFAULT 0
);
CREATE INDEX archive_thread_list_started ON pepsi.archive_thread (list_id, started_at);
COMMENT ON TABLE pepsi.archive_thread IS 'Threads of a list''s archive (its first message''s subject and dates)';

CREATE TABLE pepsi.archive_message (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id      bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    message_id   text NOT NULL,
    thread_id    bigint REFERENCES pepsi.archive_thread ON DELETE SET NULL,
    parent_id    bigint REFERENCES pepsi.archive_message ON DELETE SET NULL,
    subject      text,
    from_name    text,
    from_address text,
    sent_at      timestamptz NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT now(),
    raw          bytea NOT NULL,
    body_text    text NOT NULL DEFAULT '',
    search       tsvector NOT NULL DEFAULT ''::tsvector,
    problems     text[] NOT NULL DEFAULT '{}',
    UNIQUE (list_id, message_id)
) WITH (toast_tuple_target = 128);
CREATE INDEX archive_message_list_sent ON pepsi.archive_message (list_id, sent_at);
CREATE INDEX archive_message_thread ON pepsi.archive_message (thread_id, sent_at);
CREATE INDEX archive_message_parent ON pepsi.archive_message (parent_id);
COMMENT ON TABLE pepsi.archive_message IS
    'Archived posts: the archive''s own copy (raw), its text, its tsvector, its thread and parent, what was wrong with it';

CREATE TABLE pepsi.archive_reference (
    message_id bigint NOT NULL REFERENCES pepsi.archive_message ON DELETE CASCADE,
    position   integer NOT NULL,
    list_id    bigint NOT NULL,
    referenced text NOT NULL,
    PRIMARY KEY (message_id, position)
);
CREATE INDEX archive_reference_referenced ON pepsi.archive_reference (list_id, referenced);
COMMENT ON TABLE pepsi.archive_reference IS
    'The Message-Ids a message names (References, then In-Reply-To), in order: late arrivals find their replies here';

CREATE TABLE pepsi.archive_attachment (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   bigint NOT NULL REFERENCES pepsi.archive_message ON DELETE CASCADE,
    position     integer NOT NULL,
    filename     text,
    content_type text NOT NULL,
    size         bigint NOT NULL,
    content      bytea,
    withheld     text,
    UNIQUE (message_id, position)
);
COMMENT ON TABLE pepsi.archive_attachment IS
    'Attachments of archived posts, decoded; content NULL and withheld saying why when over the list''s limit';

CREATE TABLE pepsi.archive_month (
    list_id  bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    month    date NOT NULL,
    messages integer NOT NULL DEFAULT 0,
    PRIMARY KEY (list_id, month)
);
COMMENT ON TABLE pepsi.archive_month IS 'How many posts each month of a list''s archive holds (the index page)';

CREATE TABLE pepsi.archive_import (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id     bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    source      text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    messages    integer NOT NULL DEFAULT 0,
    duplicates  integer NOT NULL DEFAULT 0,
    problems    integer NOT NULL DEFAULT 0
);
COMMENT ON TABLE pepsi.archive_import IS 'Every mbox pepsi-archive imported: where from, how many posts, duplicates and problems';

CREATE TABLE pepsi.archive_login (
    token_hash bytea PRIMARY KEY,
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
COMMENT ON TABLE pepsi.archive_login IS
    'Single-use login links mailed to a list''s members and owners (only their SHA-256 kept)';

CREATE TABLE pepsi.archive_session (
    token_hash bytea PRIMARY KEY,
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address    text NOT NULL,
    csrf       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX archive_session_expires_at ON pepsi.archive_session (expires_at);
COMMENT ON TABLE pepsi.archive_session IS
    'Logged-in readers of a list''s archive (the cookie''s SHA-256) and their CSRF token';

-- bytes as text, one character per byte (LATIN1 maps every byte), so the
-- parser below can use text functions on any message and give the bytes
-- back exactly with convert_to(..., 'LATIN1').
CREATE FUNCTION pepsi.archive_bytes_text(raw bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN convert_from(raw, 'LATIN1');
END
$$;

-- bytes in charset as text; UTF-8 then Latin-1 when charset is unknown or
-- the bytes are not valid in it.
CREATE FUNCTION pepsi.archive_decode_charset(raw bytea, charset text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    BEGIN
        RETURN convert_from(raw, CASE WHEN coalesce(charset, '') IN ('', 'us-ascii', 'ascii') THEN 'UTF8'
                                      ELSE charset END);
    EXCEPTION WHEN OTHERS THEN
        BEGIN
            RETURN convert_from(raw, 'UTF8');
        EXCEPTION WHEN OTHERS THEN
            RETURN convert_from(raw, 'LATIN1');
        END;
    END;
END
$$;

-- Quoted-printable to bytes (soft line breaks joined, =XX decoded, a
-- stray = kept).
CREATE FUNCTION pepsi.archive_qp_decode(encoded text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(string_agg(CASE WHEN m[1] IS NOT NULL THEN decode(m[1], 'hex')
                                    ELSE convert_to(m[2], 'LATIN1') END, ''::bytea ORDER BY n), ''::bytea)
    FROM regexp_matches(regexp_replace(encoded, '=\r?\n', '', 'g'), '=([0-9A-Fa-f]{2})|([^=]+|=)', 'g')
         WITH ORDINALITY AS x(m, n)
$$;

-- Base64 to bytes; NULL when it is not base64.
CREATE FUNCTION pepsi.archive_base64_decode(encoded text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    clean text := regexp_replace(encoded, '[^A-Za-z0-9+/]', '', 'g');
BEGIN
    clean := clean || repeat('=', (4 - length(clean) % 4) % 4);
    RETURN decode(clean, 'base64');
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;

-- A header field value with RFC 2047 encoded words decoded (whitespace
-- between two encoded words dropped, as the RFC says).
CREATE FUNCTION pepsi.archive_decode_words(value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    word text[];
    decoded bytea;
    result text := '';
    rest text := regexp_replace(value, '(\?=)\s+(=\?)', '\1\2', 'g');
    at integer;
BEGIN
    IF value IS NULL OR position('=?' IN value) = 0 THEN
        RETURN value;
    END IF;
    FOR i IN 1..100 LOOP
        word := regexp_match(rest, '=\?([^?*]+)(?:\*[^?]*)?\?([BbQq])\?([^?]*)\?=');
        EXIT WHEN word IS NULL;
        at := position('=?' || word[1] IN rest);
        decoded := CASE WHEN upper(word[2]) = 'B' THEN pepsi.archive_base64_decode(word[3])
                        ELSE pepsi.archive_qp_decode(replace(word[3], '_', ' ')) END;
        result := result || left(rest, at - 1)
                  || coalesce(pepsi.archive_decode_charset(decoded, lower(word[1])), word[3]);
        rest := substr(rest, at + length(word[1]) + length(word[3]) + 6);
        rest := substr(rest, position('?=' IN rest) + 2);
    END LOOP;
    RETURN result || rest;
END
$$;

-- The first field called name in a header block (as text), unfolded;
-- NULL when absent.
CREATE FUNCTION pepsi.archive_header(headers text, name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN btrim((regexp_match(regexp_replace(E'\n' || headers, E'\r?\n[ \t]+', ' ', 'g'),
                               E'\n' || name || E':[ \t]*([^\r\n]*)', 'i'))[1]);
END
$$;

-- A parameter of a structured header value (boundary, charset, name).
CREATE FUNCTION pepsi.archive_header_parameter(value text, name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN coalesce((regexp_match(value, ';\s*' || name || '\s*=\s*"([^"]*)"', 'i'))[1],
                    (regexp_match(value, ';\s*' || name || '\s*=\s*([^;\s]+)', 'i'))[1]);
END
$$;

-- The <...> message ids in a header value, in order.
CREATE FUNCTION pepsi.archive_message_ids(value text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(m[1] ORDER BY n), '{}')
            FROM regexp_matches(coalesce(value, ''), '<([^<>\s]+)>', 'g') WITH ORDINALITY AS x(m, n));
END
$$;

-- The leaf parts of a MIME entity (LF line ends, one character per byte):
-- type, charset, filename, whether it is the message's text (text/plain
-- not marked as an attachment), its decoded bytes, and what was wrong with
-- it.  A multipart without its boundary, a bad base64 part or nesting past
-- ten levels is returned whole as text, with the problem named.
CREATE FUNCTION pepsi.archive_mime_parts(entity text, depth integer)
RETURNS TABLE (content_type text, charset text, filename text, is_text boolean, content bytea, problem text)
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    split integer := CASE WHEN left(entity, 1) = E'\n' THEN 1 ELSE position(E'\n\n' IN entity) END;
    head text := CASE WHEN split > 0 THEN left(entity, split) ELSE entity END;
    body text := CASE WHEN split > 0 THEN substr(entity, split + CASE WHEN split = 1 THEN 1 ELSE 2 END) ELSE '' END;
    ctype_field text := coalesce(pepsi.archive_header(head, 'Content-Type'), 'text/plain');
    ctype text := lower(btrim(split_part(ctype_field, ';', 1)));
    encoding text := lower(coalesce(pepsi.archive_header(head, 'Content-Transfer-Encoding'), '7bit'));
    disposition text := pepsi.archive_header(head, 'Content-Disposition');
    boundary text;
    closing integer;
    parts text[];
    decoded bytea;
    fault text;
BEGIN
    IF ctype LIKE 'multipart/%' AND depth < 10 THEN
        boundary := pepsi.archive_header_parameter(ctype_field, 'boundary');
        IF boundary IS NOT NULL THEN
            boundary := regexp_replace(boundary, '([^A-Za-z0-9])', '\\\1', 'g');
            closing := position(E'\n--' || pepsi.archive_header_parameter(ctype_field, 'boundary') || '--' IN E'\n' || body);
            IF closing > 0 THEN
                body := left(E'\n' || body, closing);
            ELSE
                body := E'\n' || body;
            END IF;
            parts := regexp_split_to_array(body, E'\n--' || boundary || E'[ \t]*\n');
            IF array_length(parts, 1) > 1 THEN
                FOR i IN 2..array_length(parts, 1) LOOP
                    RETURN QUERY SELECT * FROM pepsi.archive_mime_parts(parts[i], depth + 1);
                END LOOP;
                IF closing = 0 THEN
                    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, false, NULL::bytea,
                                        'broken MIME: a ' || ctype || ' without its closing boundary';
                END IF;
                RETURN;
            END IF;
            fault := 'broken MIME: no part of the ' || ctype || ' has its boundary';
        ELSE
            fault := 'broken MIME: a ' || ctype || ' without a boundary';
        END IF;
        RETURN QUERY SELECT 'text/plain'::text, NULL::text, NULL::text, true, convert_to(body, 'LATIN1'), fault;
        RETURN;
    ELSIF ctype = 'message/rfc822' AND depth < 10 THEN
        RETURN QUERY SELECT * FROM pepsi.archive_mime_parts(body, depth + 1);
        RETURN;
    ELSIF ctype LIKE 'multipart/%' THEN
        fault := 'broken MIME: nested more than ten levels deep';
    END IF;
    IF encoding = 'base64' THEN
        decoded := pepsi.archive_base64_decode(body);
        IF decoded IS NULL THEN
            fault := 'broken MIME: a ' || ctype || ' part is not valid base64';
        END IF;
    ELSIF encoding = 'quoted-printable' THEN
        decoded := pepsi.archive_qp_decode(body);
    END IF;
    RETURN QUERY SELECT ctype, lower(pepsi.archive_header_parameter(ctype_field, 'charset')),
        pepsi.archive_decode_words(coalesce(pepsi.archive_header_parameter(disposition, 'filename'),
                                            pepsi.archive_header_parameter(ctype_field, 'name'))),
        ctype = 'text/plain' AND coalesce(lower(disposition), '') NOT LIKE 'attachment%',
        coalesce(decoded, convert_to(body, 'LATIN1')), fault;
END
$$;

-- The list's archive policy, its defaults when it has no row.
CREATE FUNCTION pepsi.archive_policy_of(list bigint) RETURNS pepsi.archive_policy
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce((SELECT p FROM pepsi.archive_policy p WHERE p.list_id = list),
                    ROW(list, true, 'public', 'at', 10485760)::pepsi.archive_policy)
$$;

-- (Re)build an archived message's fields from its raw copy: subject,
-- sender, date, text, tsvector, attachments, references, problems.
CREATE FUNCTION pepsi.archive_index_message(message bigint) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m pepsi.archive_message;
    p record;
BEGIN
    SELECT * INTO m FROM pepsi.archive_message a WHERE a.id = message;
    p := pepsi.archive_parse(m.list_id, m.message_id, m.raw);
    UPDATE pepsi.archive_message a SET subject = p.subject, from_address = p.from_address, from_name = p.from_name,
        sent_at = coalesce(p.sent_at, a.archived_at), body_text = p.body_text, search = p.search, problems = p.problems
    WHERE a.id = message;
    DELETE FROM pepsi.archive_reference r WHERE r.message_id = message;
    DELETE FROM pepsi.archive_attachment a WHERE a.message_id = message;
    PERFORM pepsi.archive_keep_parts(message, m.list_id, m.message_id, p.refs, p.attachments);
    RETURN p.problems;
END
$$;

-- Recompute a thread's subject (its first root's), dates and size; a
-- thread left with no message goes.
CREATE FUNCTION pepsi.archive_thread_refresh(threads bigint[]) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    DELETE FROM pepsi.archive_thread t WHERE t.id = ANY (threads)
        AND NOT EXISTS (SELECT FROM pepsi.archive_message m WHERE m.thread_id = t.id);
    UPDATE pepsi.archive_thread t SET message_count = s.n, started_at = s.first, last_at = s.last,
        subject = (SELECT m.subject FROM pepsi.archive_message m WHERE m.thread_id = t.id
                   ORDER BY m.parent_id IS NULL DESC, m.sent_at, m.id LIMIT 1)
    FROM (SELECT m.thread_id, count(*) AS n, min(m.sent_at) AS first, max(m.sent_at) AS last
          FROM pepsi.archive_message m WHERE m.thread_id = ANY (threads) GROUP BY m.thread_id) s
    WHERE t.id = s.thread_id;
$$;

-- Put an archived message in its thread: under the nearest message it
-- names that is archived (References then In-Reply-To, last first), else
-- at the root of a new thread; then adopt the messages that name it more
-- nearly than their present parent (they arrived first), their replies
-- moving with them (archive_thread_adopt).
CREATE FUNCTION pepsi.archive_thread_message(message bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m pepsi.archive_message;
    parent pepsi.archive_message;
    thread bigint;
BEGIN
    SELECT * INTO m FROM pepsi.archive_message a WHERE a.id = message;
    SELECT p.* INTO parent FROM pepsi.archive_reference r
    JOIN pepsi.archive_message p ON p.list_id = r.list_id AND p.message_id = r.referenced
    WHERE r.message_id = message AND p.id <> message
    ORDER BY r.position DESC LIMIT 1;
    IF parent.id IS NOT NULL AND parent.thread_id IS NOT NULL THEN
        thread := parent.thread_id;
    ELSE
        INSERT INTO pepsi.archive_thread (list_id, subject, started_at, last_at)
        VALUES (m.list_id, m.subject, m.sent_at, m.sent_at) RETURNING id INTO thread;
    END IF;
    UPDATE pepsi.archive_message a SET parent_id = parent.id, thread_id = thread WHERE a.id = message;
    PERFORM pepsi.archive_thread_refresh(pepsi.archive_thread_adopt(message, m.list_id, m.message_id, thread, parent.id)
                                         || thread);
    RETURN thread;
END
$$;

-- Archive one message (raw: headers, blank line, body) in list, once: the
-- archive's id of it, or NULL when the list has it already (same
-- Message-Id; a message without one is named by its SHA-256).  What was
-- wrong with it is written to event_log.
CREATE FUNCTION pepsi.archive_store(list bigint, raw bytea, source text DEFAULT 'post') RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    s record;
BEGIN
    s := pepsi.archive_store_message(list, raw, source);
    PERFORM pepsi.archive_thread_refresh(s.threads);
    RETURN s.stored;
END
$$;

-- The list stage's call for an accepted post (its row at the stage): the
-- archive copies the row's headers and body server-side.  NULL when the
-- list keeps no archive or has the post already.
CREATE FUNCTION pepsi.archive_post(list bigint, row_id bigint) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pepsi.archive_store(list, w.headers || '\x0d0a'::bytea || b.body, 'post')
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE w.id = row_id AND (pepsi.archive_policy_of(list)).enabled
$$;

-- Count a list's archive by month again.  Two imports into one list
-- recount one after the other (the second, once the first has
-- committed, counts its messages too), and a month a post has just
-- counted is counted again, not inserted twice (0.14: two imports at
-- once failed at their end on archive_month's key).
CREATE FUNCTION pepsi.archive_month_recount(list bigint) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pg_advisory_xact_lock(hashtextextended('pepsi.archive_month_recount/' || list::text, 0));
    DELETE FROM pepsi.archive_month x WHERE x.list_id = list;
    INSERT INTO pepsi.archive_month AS x (list_id, month, messages)
    SELECT list, date_trunc('month', m.sent_at AT TIME ZONE 'UTC')::date, count(*)
    FROM pepsi.archive_message m WHERE m.list_id = list GROUP BY 2
    ON CONFLICT ON CONSTRAINT archive_month_pkey DO UPDATE SET messages = excluded.messages;
$$;

-- pepsi-archive import: begin a run (its id), then archive_store each
-- message, then archive_import_finish; audited.
CREATE FUNCTION pepsi.archive_import_begin(list bigint, source text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    INSERT INTO pepsi.archive_import (list_id, source) VALUES (list, left(source, 1000)) RETURNING id
$$;

CREATE FUNCTION pepsi.archive_import_finish(import bigint, messages integer, duplicates integer) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    i pepsi.archive_import;
BEGIN
    UPDATE pepsi.archive_import x SET finished_at = clock_timestamp(), messages = archive_import_finish.messages,
        duplicates = archive_import_finish.duplicates,
        problems = (SELECT count(*) FROM pepsi.archive_message m WHERE m.list_id = x.list_id
                    AND m.archived_at = x.started_at AND cardinality(m.problems) > 0)
    WHERE x.id = import RETURNING * INTO i;
    PERFORM pepsi.archive_month_recount(i.list_id);
    PERFORM pepsi.event_log_write('archive_import', jsonb_build_object('list', i.list_id, 'source', i.source,
        'messages', i.messages, 'duplicates', i.duplicates, 'problems', i.problems));
    RETURN jsonb_build_object('messages', i.messages, 'duplicates', i.duplicates, 'problems', i.problems);
END
$$;

-- pepsi-archive export: record that the list's archive was exported.
CREATE FUNCTION pepsi.archive_exported(list bigint, messages bigint, target text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pepsi.event_log_write('archive_export',
        jsonb_build_object('list', list, 'messages', messages, 'target', left(target, 1000)))
$$;

-- pepsi-archive reindex: every message of list parsed again from its raw
-- copy and threaded again in date order; audited.  Returns how many.
CREATE FUNCTION pepsi.archive_reindex(list bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    message bigint;
    done bigint := 0;
BEGIN
    FOR message IN SELECT m.id FROM pepsi.archive_message m WHERE m.list_id = list LOOP
        PERFORM pepsi.archive_index_message(message);
        done := done + 1;
    END LOOP;
    UPDATE pepsi.archive_message m SET parent_id = NULL, thread_id = NULL WHERE m.list_id = list;
    DELETE FROM pepsi.archive_thread t WHERE t.list_id = list;
    FOR message IN SELECT m.id FROM pepsi.archive_message m WHERE m.list_id = list ORDER BY m.sent_at, m.id LOOP
        PERFORM pepsi.archive_thread_message(message);
    END LOOP;
    PERFORM pepsi.archive_month_recount(list);
    PERFORM pepsi.event_log_write('archive_reindex', jsonb_build_object('list', list, 'messages', done));
    RETURN done;
END
$$;

-- pepsi-archive set: one setting of a list's archive policy; audited.
CREATE FUNCTION pepsi.archive_policy_set(list bigint, setting text, value text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF setting NOT IN ('enabled', 'visibility', 'obfuscation', 'max_attachment') THEN
        RAISE EXCEPTION 'an archive has no setting "%"', setting USING ERRCODE = 'invalid_parameter_value',
            HINT = 'The settings: enabled, visibility (public, private), obfuscation (none, at, hide), max_attachment (bytes).';
    END IF;
    INSERT INTO pepsi.archive_policy (list_id) VALUES (list) ON CONFLICT DO NOTHING;
    EXECUTE format('UPDATE pepsi.archive_policy SET %I = $2::%s WHERE list_id = $1', setting,
                   CASE setting WHEN 'enabled' THEN 'boolean' WHEN 'max_attachment' THEN 'bigint' ELSE 'text' END)
        USING list, value;
    PERFORM pepsi.event_log_write('archive_configure',
        jsonb_build_object('list', list, 'setting', setting, 'value', left(value, 200)));
END
$$;

-- Text shown to readers, its addresses obfuscated by the list's policy:
-- none, at (user at example.org), hide (user@...); archive_obfuscated.
CREATE FUNCTION pepsi.archive_obfuscate(list bigint, shown text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN pepsi.archive_obfuscated((pepsi.archive_policy_of(list)).obfuscation, shown);
END
$$;

-- Full-text search of a list's archive (websearch syntax: words, "a
-- phrase", -not, or), newest first.  The list and the words are one
-- condition on the GIN index archive_message_list_search (see
-- archive_search_key; a phrase is looked up by its word pairs, see
-- archive_search_query); EXECUTE plans each query with its words, so the
-- planner weighs them with the index's statistics and chooses alone: a
-- common word's newest matches come in date order from
-- archive_message_list_sent, checked one by one (a few hundred rows for a
-- page), a rare word's or a phrase's from the index's bitmap, sorted.  The
-- excerpt is archive_excerpt's, made for the page's rows only (after the
-- LIMIT); the query's words are parsed once, not once a row, and the
-- list's obfuscation is looked up once, not three times a row.
CREATE FUNCTION pepsi.archive_search(list bigint, query text, max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, thread_id bigint, subject text, from_name text, sent_at timestamptz, excerpt text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT m.id, m.thread_id, pepsi.archive_obfuscated($5, m.subject),
                pepsi.archive_obfuscated($5, coalesce(m.from_name, m.from_address)), m.sent_at,
                pepsi.archive_obfuscated($5, pepsi.archive_excerpt(m.body_text, $4))
         FROM pepsi.archive_message m
         WHERE m.list_id = $1 AND pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)
         ORDER BY m.sent_at DESC, m.id DESC LIMIT $3'
        USING list, query, least(greatest(max_rows, 1), 1000), websearch_to_tsquery('simple', query),
              (pepsi.archive_policy_of(list)).obfuscation;
END
$$;

-- How many messages of a list's archive match query: counted from the
-- GIN index's bitmap, never reading a row the index answers for (a heap
-- page is read only when not all-visible, or to check the word positions
-- of a phrase of three words or more).  The planner chooses the index
-- alone: archive_search_key declares what checking a row costs (its
-- tsvector read back from TOAST), so a sequential scan, which checks
-- every message, is not taken for cheap.  No parallel worker (0.13): that
-- cost is charged for every row of the bitmap as if each were checked,
-- so a common word's count looked worth a worker, where the bitmap's rows
-- are counted, not checked, in a few milliseconds; starting the worker
-- took longer than the whole count (50,000 messages: w0's count 36 ms
-- with a worker, 6.5 ms without; "w0 w1" 31 ms, 2 ms).  No sequential
-- scan (0.14): for a query the statistics say nearly every message
-- matches (a common word, two words or'ed, a word excluded) the planner
-- charges the bitmap the key's COST for each row as it charges the
-- sequential scan, and takes the scan for its cheaper pages, where the
-- bitmap's rows are counted without being checked and the scan reads
-- and checks every message's tsvector (w0's count 39 s at 50,000
-- messages, "w0 or w1" at 10,000 a sequential scan): a count has no
-- plan better than the index's bitmap.
CREATE FUNCTION pepsi.archive_search_count(list bigint, query text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off
SET max_parallel_workers_per_gather = 0 SET enable_seqscan = off AS $$
DECLARE
    found bigint;
BEGIN
    EXECUTE 'SELECT count(*) FROM pepsi.archive_message m
             WHERE pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)'
        INTO found USING list, query;
    RETURN found;
END
$$;

-- The pages: the months of a list's archive, the threads started in a
-- month, a thread's messages in tree order, one message, an attachment.
CREATE FUNCTION pepsi.archive_months(list bigint) RETURNS TABLE (month date, messages integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT x.month, x.messages FROM pepsi.archive_month x WHERE x.list_id = list AND x.messages > 0 ORDER BY x.month DESC
$$;

CREATE FUNCTION pepsi.archive_threads(list bigint, month date)
RETURNS TABLE (id bigint, subject text, started_at timestamptz, last_at timestamptz, message_count integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT t.id, pepsi.archive_obfuscate(list, t.subject), t.started_at, t.last_at, t.message_count
    FROM pepsi.archive_thread t
    WHERE t.list_id = list AND t.started_at >= (month::timestamp AT TIME ZONE 'UTC')
      AND t.started_at < ((month + interval '1 month')::timestamp AT TIME ZONE 'UTC')
    ORDER BY t.started_at, t.id
$$;

CREATE FUNCTION pepsi.archive_thread_messages(list bigint, thread bigint)
RETURNS TABLE (id bigint, parent_id bigint, depth integer, subject text, from_name text, sent_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH RECURSIVE tree(id, depth, path) AS (
        SELECT m.id, 0, ARRAY[extract(epoch FROM m.sent_at), m.id::numeric]
        FROM pepsi.archive_message m
        WHERE m.thread_id = thread AND m.list_id = list
          AND (m.parent_id IS NULL OR NOT EXISTS (SELECT FROM pepsi.archive_message p
                                                   WHERE p.id = m.parent_id AND p.thread_id = thread))
        UNION ALL
        SELECT c.id, t.depth + 1, t.path || ARRAY[extract(epoch FROM c.sent_at), c.id::numeric]
        FROM pepsi.archive_message c JOIN tree t ON c.parent_id = t.id
        WHERE c.thread_id = thread AND t.depth < 100)
    SELECT m.id, m.parent_id, t.depth, pepsi.archive_obfuscate(list, m.subject),
           pepsi.archive_obfuscate(list, coalesce(m.from_name, m.from_address)), m.sent_at
    FROM tree t JOIN pepsi.archive_message m ON m.id = t.id ORDER BY t.path
$$;

CREATE FUNCTION pepsi.archive_message_show(list bigint, message bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT jsonb_build_object('id', m.id, 'thread', m.thread_id, 'parent', m.parent_id,
        'message_id', pepsi.archive_obfuscate(list, m.message_id), 'subject', pepsi.archive_obfuscate(list, m.subject),
        'from', pepsi.archive_obfuscate(list, coalesce(m.from_name || ' <' || m.from_address || '>', m.from_address, m.from_name)),
        'date', m.sent_at, 'text', pepsi.archive_obfuscate(list, m.body_text), 'problems', to_jsonb(m.problems),
        'attachments', coalesce((SELECT jsonb_agg(jsonb_build_object('position', a.position, 'filename', a.filename,
                                     'content_type', a.content_type, 'size', a.size, 'withheld', a.withheld)
                                     ORDER BY a.position)
                                 FROM pepsi.archive_attachment a WHERE a.message_id = m.id), '[]'))
    FROM pepsi.archive_message m WHERE m.id = message AND m.list_id = list
$$;

CREATE FUNCTION pepsi.archive_attachment_get(list bigint, message bigint, attachment integer)
RETURNS TABLE (filename text, content_type text, content bytea)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT a.filename, a.content_type, a.content FROM pepsi.archive_attachment a
    JOIN pepsi.archive_message m ON m.id = a.message_id
    WHERE m.list_id = list AND a.message_id = message AND a.position = attachment AND a.content IS NOT NULL
$$;

-- The members' login (pepsi-httpd): the list at address and whether its
-- archive needs one ({"id", "private"}), NULL when it keeps none.
CREATE FUNCTION pepsi.archive_list(address text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT jsonb_build_object('id', l.id, 'private', (pepsi.archive_policy_of(l.id)).visibility = 'private')
    FROM pepsi.mailing_list l
    WHERE l.address = lower(archive_list.address) AND (pepsi.archive_policy_of(l.id)).enabled
$$;

-- Mail a single-use login link (link || token) to address when it is a
-- member, owner or moderator of list, queued at stage; says nothing either
-- way (the page does not tell who is a member).  Pending links expire
-- after ttl; a day after, they go.
CREATE FUNCTION pepsi.archive_login_request(list bigint, address text, link text, stage text, ttl interval)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    who text := lower(btrim(address));
    l pepsi.mailing_list;
    request text;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.id = list;
    DELETE FROM pepsi.archive_login x WHERE x.expires_at < now() - interval '1 day';
    IF l.id IS NULL OR who !~ '^[^@\s<>]+@[^@\s<>]+$'
       OR NOT (EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list AND m.address = who)
               OR EXISTS (SELECT FROM pepsi.list_role r WHERE r.list_id = list AND r.address = who)) THEN
        RETURN;
    END IF;
    INSERT INTO pepsi.archive_login (token_hash, list_id, address, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), list, who, now() + ttl);
    request := split_part(l.address, '@', 1) || '-request@' || split_part(l.address, '@', 2);
    PERFORM pepsi.workqueue_inject(stage, split_part(l.address, '@', 1) || '-bounces@' || split_part(l.address, '@', 2),
        ARRAY[who],
        convert_to(format(E'From: <%s>\r\nTo: <%s>\r\nSubject: Your link to the archive of %s\r\n'
                          'Date: %s\r\nMessage-ID: <archive-login.%s@%s>\r\nAuto-Submitted: auto-generated\r\n'
                          'MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n',
                          request, who, l.address, to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "+0000"'),
                          left(token, 16), split_part(l.address, '@', 2)), 'UTF8'),
        convert_to(format(E'To read the archive of %s, open this link (once, within %s):\r\n\r\n%s%s\r\n',
                          l.address, ttl, link, token), 'UTF8'));
    PERFORM pepsi.event_log_write('archive_login_mailed', jsonb_build_object('list', list, 'address', who));
END
$$;

-- Use a login link, once: a new session of session_lifetime ({"session":
-- the cookie's value, "csrf"}), NULL when the link is unknown, used or
-- expired.
CREATE FUNCTION pepsi.archive_login_redeem(list bigint, token text, session_lifetime interval) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    x pepsi.archive_login;
    session text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    csrf text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    DELETE FROM pepsi.archive_login l WHERE l.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8'))
        AND l.list_id = list RETURNING * INTO x;
    IF x.token_hash IS NULL OR x.expires_at < now() THEN
        RETURN NULL;
    END IF;
    DELETE FROM pepsi.archive_session s WHERE s.expires_at < now();
    INSERT INTO pepsi.archive_session (token_hash, list_id, address, csrf, expires_at)
    VALUES (sha256(convert_to(session, 'UTF8')), list, x.address, csrf, now() + session_lifetime);
    PERFORM pepsi.event_log_write('archive_login', jsonb_build_object('list', list, 'address', x.address));
    RETURN jsonb_build_object('session', session, 'csrf', csrf);
END
$$;

-- Who a session cookie is on list: {"address", "csrf", "owner"}, NULL
-- when none (or expired, or no longer a member, owner or moderator).
CREATE FUNCTION pepsi.archive_session_check(list bigint, session text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT jsonb_build_object('address', s.address, 'csrf', s.csrf,
        'owner', EXISTS (SELECT FROM pepsi.list_role r WHERE r.list_id = list AND r.address = s.address AND r.role = 'owner'))
    FROM pepsi.archive_session s
    WHERE s.token_hash = sha256(convert_to(coalesce(session, ''), 'UTF8')) AND s.list_id = list AND s.expires_at > now()
      AND (EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list AND m.address = s.address)
           OR EXISTS (SELECT FROM pepsi.list_role r WHERE r.list_id = list AND r.address = s.address))
$$;

-- The owners' pages: the members, the moderation queue, and a decision,
-- each only for a session of an owner of list (NULL/nothing otherwise);
-- the decision also needs the session's CSRF token.
CREATE FUNCTION pepsi.archive_owner_members(list bigint, session text)
RETURNS TABLE (address text, display_name text, delivery text, disabled text, bounce_score real)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT m.address, m.display_name, m.delivery, m.disabled, m.bounce_score FROM pepsi.list_member m
    WHERE m.list_id = list AND (pepsi.archive_session_check(list, session) ->> 'owner')::boolean
    ORDER BY m.address
$$;

CREATE FUNCTION pepsi.archive_owner_held(list bigint, session text)
RETURNS TABLE (id bigint, sender text, subject text, reason text, held_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT h.id, h.sender, h.subject, h.reason, h.held_at FROM pepsi.list_held h
    WHERE h.list_id = list AND h.decision IS NULL AND (pepsi.archive_session_check(list, session) ->> 'owner')::boolean
    ORDER BY h.id
$$;

CREATE FUNCTION pepsi.archive_owner_decide(list bigint, session text, csrf text, held bigint, decision text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    who jsonb := pepsi.archive_session_check(list, session);
BEGIN
    IF who IS NULL OR NOT (who ->> 'owner')::boolean THEN
        RETURN 'only an owner of the list who logged in may moderate';
    ELSIF csrf IS NULL OR csrf <> who ->> 'csrf' THEN
        RETURN 'the form is stale or forged (CSRF token): reload the page';
    ELSIF NOT EXISTS (SELECT FROM pepsi.list_held h WHERE h.id = held AND h.list_id = list) THEN
        RETURN 'no such held post on this list';
    END IF;
    RETURN pepsi.list_decide(held, decision, who ->> 'address');
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'archive_post', '{EXECUTE}'),
    ('pepsi_config', 'table', 'archive_policy', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_thread', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_message', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_reference', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_attachment', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_month', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_import', '{SELECT}'),
    ('pepsi_config', 'function', 'archive_store', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_import_begin', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_import_finish', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_exported', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_reindex', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_policy_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_search', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_search_count', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_list', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_login_request', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_login_redeem', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_session_check', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_owner_members', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_owner_held', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_owner_decide', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_search', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_months', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_threads', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_thread_messages', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_message_show', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_attachment_get', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('archive_store'), ('archive_post'), ('archive_import_begin'),
    ('archive_import_finish'), ('archive_exported'), ('archive_reindex'), ('archive_policy_set'), ('archive_search'),
    ('archive_search_count'), ('archive_list'), ('archive_login_request'),
    ('archive_login_redeem'), ('archive_session_check'), ('archive_owner_members'), ('archive_owner_held'),
    ('archive_owner_decide'), ('archive_months'), ('archive_threads'), ('archive_thread_messages'),
    ('archive_message_show'), ('archive_attachment_get');
INSERT INTO pepsi.grant_owner (name) VALUES ('archive_bytes_text'), ('archive_decode_charset'), ('archive_qp_decode'),
    ('archive_base64_decode'), ('archive_decode_words'), ('archive_header'), ('archive_header_parameter'),
    ('archive_message_ids'), ('archive_mime_parts'), ('archive_policy_of'), ('archive_index_message'),
    ('archive_thread_refresh'), ('archive_thread_message'), ('archive_obfuscate'), ('archive_month_recount'), ('archive_login'), ('archive_session');

SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_policy', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_thread', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_thread_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_message', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_message_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_reference', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_attachment', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_attachment_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_month', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_import', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_import_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_login', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_session', '');
-- end of the mailing lists' web archive

-- ====================================================================
-- The secure-link portal (pepsi-secure-link(8), pepsi-stage-encrypt(8),
-- pepsi-httpd(8) "The secure-link portal")
--
-- A recipient whose POLICY requires encryption and who has no key gets,
-- when NO_KEY = portal, a notice with a link instead of the message.  The
-- link carries a secret of 256 random bits that never reaches the
-- database: pepsi-stage-encrypt derives from it (HKDF-SHA256, two labels)
-- the message's AES-256-GCM key and the link's identifier, and stores
-- only the identifier and the ciphertext (whose additional data is the
-- identifier and the recipient, so a row's ciphertext opens under no
-- other row).  Neither a dump nor pepsi_httpd's role reads a message
-- without the link; pepsi-httpd, given the link, opens it in memory.
-- (A plain hash of the secret would do for the lookup; a second HKDF
-- label keeps the identifier and the key apart by construction.)
--
-- The recipient proves control of the address with a one-time code
-- mailed to it (secure_link_code_request): the code is kept as a hash
-- salted with the link's identifier, good for CODE_LIFETIME and
-- SECURE_LINK_CODE_ATTEMPTS tries; at most SECURE_LINK_CODES_PER_HOUR
-- codes an hour.  A right code starts a session bound to the link (its
-- cookie kept as its SHA-256) with a CSRF token that is used once.  A
-- link starts at most open_limit sessions (PORTAL_OPENS when it was made;
-- NULL, a link made before 0.11: no limit): then its page, a code asked
-- for and a code checked are refused with the reason (audited as
-- secure_link_reused), while a session open goes on until it ends.
-- Replies go back into the queue from the portal's own address with the
-- recipient in Reply-To (mail "from" the recipient's domain would fail
-- its DMARC).  pepsi-secure-link lists, expires and revokes links; an
-- ended link's ciphertext is wiped, not only marked.
-- ====================================================================

CREATE TABLE pepsi.secure_link (
    id              bigserial PRIMARY KEY,
    link_id         bytea NOT NULL UNIQUE CHECK (octet_length(link_id) = 32),
    recipient       text NOT NULL,
    sender          text NOT NULL,
    portal_address  text NOT NULL,
    notice_stage    text NOT NULL,
    queue_id        text,
    nonce           bytea NOT NULL CHECK (octet_length(nonce) = 12),
    sealed          bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_reason  text,
    code_hash       bytea,
    code_expires_at timestamptz,
    code_attempts   integer NOT NULL DEFAULT 0,
    code_used_at    timestamptz,
    codes_window    timestamptz,
    codes_sent      integer NOT NULL DEFAULT 0,
    opened          integer NOT NULL DEFAULT 0,
    last_opened_at  timestamptz,
    replies         integer NOT NULL DEFAULT 0,
    open_limit      integer CHECK (open_limit > 0)
);
CREATE INDEX secure_link_expires_at ON pepsi.secure_link (expires_at) WHERE sealed IS NOT NULL;

CREATE TABLE pepsi.secure_link_session (
    token_hash      bytea PRIMARY KEY,
    link            bigint NOT NULL REFERENCES pepsi.secure_link (id) ON DELETE CASCADE,
    csrf            text NOT NULL,
    expires_at      timestamptz NOT NULL
);
CREATE INDEX secure_link_session_link ON pepsi.secure_link_session (link);

-- Why the link of identifier link_id cannot be used now, or NULL (the
-- reasons the pages show: unknown, revoked, expired).
CREATE FUNCTION pepsi.secure_link_refusal(l pepsi.secure_link) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE
        WHEN l.id IS NULL THEN 'unknown: this server sent no such link (check that it was copied whole)'
        WHEN l.revoked_at IS NOT NULL THEN format('revoked on %s: %s',
            to_char(l.revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'), coalesce(l.revoked_reason, 'by the administrator'))
        WHEN l.expires_at <= now() OR l.sealed IS NULL THEN format('expired on %s: ask the sender to send the message again',
            to_char(l.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'))
    END
$$;

-- Why the link l starts no new session, or NULL: it was redeemed (a right
-- code, a session) open_limit times, PORTAL_OPENS when it was made; NULL,
-- a link made before 0.11, has no limit.  Unlike secure_link_refusal it
-- leaves a session already open alone: the recipient reads and replies
-- within it, and only a link forwarded or replayed after is refused.
CREATE FUNCTION pepsi.secure_link_reuse_refusal(l pepsi.secure_link) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN l.open_limit IS NOT NULL AND l.opened >= l.open_limit THEN
        format('this link was used already (opened %s of %s times) on %s: ask %s to send the message again',
               l.opened, l.open_limit,
               coalesce(to_char(l.last_opened_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'), 'an earlier visit'),
               coalesce(nullif(l.sender, ''), 'the sender'))
    END
$$;

-- pepsi-stage-encrypt: store a sealed message (the identifier and nonce
-- are the stage's, derived from the link's secret) whose link starts at
-- most opens sessions (PORTAL_OPENS; NULL: no limit); its row id.
CREATE FUNCTION pepsi.secure_link_store(link_id bytea, recipient text, sender text, portal_address text,
                                        notice_stage text, queue_id text, nonce bytea, sealed bytea, lifetime interval,
                                        opens integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    id bigint;
BEGIN
    IF lifetime IS NULL OR lifetime <= interval '0' THEN
        RAISE EXCEPTION 'a secure link''s lifetime must be positive, not %', lifetime
            USING ERRCODE = 'invalid_parameter_value', HINT = '[stage-*] PORTAL_LIFETIME sets it.';
    END IF;
    IF opens < 1 THEN
        RAISE EXCEPTION 'a secure link opens at least once, not % times', opens
            USING ERRCODE = 'invalid_parameter_value', HINT = '[stage-*] PORTAL_OPENS sets it (0 there: no limit).';
    END IF;
    IF portal_address IS NULL OR portal_address !~ '^[^@\s<>]+@[^@\s<>]+$' THEN
        RAISE EXCEPTION 'the portal''s address "%" is not an address', portal_address
            USING ERRCODE = 'invalid_parameter_value', HINT = '[stage-*] PORTAL_ADDRESS sets it.';
    END IF;
    INSERT INTO pepsi.secure_link AS l (link_id, recipient, sender, portal_address, notice_stage, queue_id, nonce,
                                        sealed, expires_at, open_limit)
    VALUES (link_id, lower(recipient), sender, portal_address, notice_stage, queue_id, nonce, sealed, now() + lifetime,
            opens)
    RETURNING l.id INTO id;
    PERFORM pepsi.event_log_write('secure_link_stored',
        jsonb_build_object('id', id, 'recipient', lower(recipient), 'sender', sender, 'queue_id', queue_id,
                           'opens', opens));
    RETURN id;
END
$$;

-- The same, as pepsi-stage-encrypt before 0.11 called it: a link without
-- a limit, as every link was then.
CREATE FUNCTION pepsi.secure_link_store(link_id bytea, recipient text, sender text, portal_address text,
                                        notice_stage text, queue_id text, nonce bytea, sealed bytea, lifetime interval)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pepsi.secure_link_store(link_id, recipient, sender, portal_address, notice_stage, queue_id, nonce, sealed,
                                   lifetime, NULL::integer)
$$;

-- The link page: {"state": "open"} or {"state": "refused", "reason"},
-- with the recipient (whom the code goes to) and the expiry; an open link
-- that starts no new session (its opens spent) says why in "used", and
-- its pages for a session already open go on working.
CREATE FUNCTION pepsi.secure_link_status(link_id bytea) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN pepsi.secure_link_refusal(l) IS NULL
                THEN jsonb_strip_nulls(jsonb_build_object('state', 'open', 'recipient', l.recipient,
                                                          'expires_at', l.expires_at,
                                                          'used', pepsi.secure_link_reuse_refusal(l)))
                ELSE jsonb_build_object('state', 'refused', 'reason', pepsi.secure_link_refusal(l)) END
    FROM (SELECT 1) one LEFT JOIN pepsi.secure_link l ON l.link_id = secure_link_status.link_id
$$;

-- Mail a one-time code to the link's recipient (through the stage after
-- the encryption stage, like the notice): NULL, or why not.  A link whose
-- opens are spent gets no code (audited: secure_link_reused).
CREATE FUNCTION pepsi.secure_link_code_request(link_id bytea, code_lifetime interval, per_hour integer)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    code text;
    domain text;
    reused text;
BEGIN
    SELECT * INTO l FROM pepsi.secure_link s WHERE s.link_id = secure_link_code_request.link_id FOR UPDATE;
    IF pepsi.secure_link_refusal(l) IS NOT NULL THEN
        RETURN pepsi.secure_link_refusal(l);
    END IF;
    reused := pepsi.secure_link_reuse_refusal(l);
    IF reused IS NOT NULL THEN
        PERFORM pepsi.event_log_write('secure_link_reused', jsonb_build_object('id', l.id, 'recipient', l.recipient,
            'asked', 'code', 'opened', l.opened, 'opens', l.open_limit));
        RETURN reused;
    END IF;
    IF l.codes_window IS NULL OR l.codes_window <= now() - interval '1 hour' THEN
        l.codes_window := now();
        l.codes_sent := 0;
    END IF;
    IF l.codes_sent >= per_hour THEN
        RETURN format('%s codes were mailed for this link in the last hour (the most): use the last one, or try again after %s',
                      per_hour, to_char((l.codes_window + interval '1 hour') AT TIME ZONE 'UTC', 'HH24:MI "UTC"'));
    END IF;
    -- 8 decimal digits from 30 random bits.
    code := lpad(((('x' || substr(md5(gen_random_uuid()::text), 1, 8))::bit(32)::bigint & 1073741823) % 100000000)::text,
                 8, '0');
    UPDATE pepsi.secure_link s SET code_hash = sha256(l.link_id || convert_to(code, 'UTF8')),
        code_expires_at = now() + code_lifetime, code_attempts = 0, code_used_at = NULL,
        codes_window = l.codes_window, codes_sent = l.codes_sent + 1
    WHERE s.id = l.id;
    domain := split_part(l.portal_address, '@', 2);
    PERFORM pepsi.workqueue_inject(l.notice_stage, l.portal_address, ARRAY[l.recipient],
        convert_to(format(E'From: <%s>\r\nTo: <%s>\r\nSubject: Your code for the encrypted message: %s\r\n'
                          'Date: %s\r\nMessage-ID: <secure-link-code.%s@%s>\r\nAuto-Submitted: auto-generated\r\n'
                          'MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n',
                          l.portal_address, l.recipient, code,
                          to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "+0000"'),
                          replace(gen_random_uuid()::text, '-', ''), domain), 'UTF8'),
        convert_to(format(E'Your one-time code to read the encrypted message waiting for %s is\r\n\r\n    %s\r\n\r\n'
                          'It is good for %s, once.  If you did not ask for it, ignore this mail.\r\n',
                          l.recipient, code, code_lifetime), 'UTF8'));
    PERFORM pepsi.event_log_write('secure_link_code_mailed', jsonb_build_object('id', l.id, 'recipient', l.recipient));
    RETURN NULL;
END
$$;

-- Check a code: {"session", "csrf"} (a new session of session_lifetime,
-- bound to the link), or {"refused": why}.  A code is good once, for its
-- lifetime and SECURE_LINK_CODE_ATTEMPTS tries (attempts), and none is
-- once the link's opens are spent (audited: secure_link_reused), even a
-- code mailed before: the row's lock makes the count exact under
-- concurrent checks.
CREATE FUNCTION pepsi.secure_link_code_check(link_id bytea, code text, session_lifetime interval, attempts integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    session text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    csrf text := replace(gen_random_uuid()::text, '-', '');
    reused text;
BEGIN
    SELECT * INTO l FROM pepsi.secure_link s WHERE s.link_id = secure_link_code_check.link_id FOR UPDATE;
    reused := pepsi.secure_link_reuse_refusal(l);
    IF pepsi.secure_link_refusal(l) IS NOT NULL THEN
        RETURN jsonb_build_object('refused', pepsi.secure_link_refusal(l));
    ELSIF reused IS NOT NULL THEN
        PERFORM pepsi.event_log_write('secure_link_reused', jsonb_build_object('id', l.id, 'recipient', l.recipient,
            'asked', 'session', 'opened', l.opened, 'opens', l.open_limit));
        RETURN jsonb_build_object('refused', reused);
    ELSIF l.code_hash IS NULL AND l.code_used_at IS NOT NULL THEN
        RETURN jsonb_build_object('refused', 'this code was used already: ask for a new one');
    ELSIF l.code_hash IS NULL THEN
        RETURN jsonb_build_object('refused', 'no code was mailed for this link: ask for one');
    ELSIF l.code_expires_at <= now() THEN
        RETURN jsonb_build_object('refused', 'the code has expired: ask for a new one');
    ELSIF l.code_attempts >= attempts THEN
        RETURN jsonb_build_object('refused', format('%s wrong codes: this one no longer counts; ask for a new one', attempts));
    ELSIF sha256(l.link_id || convert_to(coalesce(code, ''), 'UTF8')) <> l.code_hash THEN
        UPDATE pepsi.secure_link s SET code_attempts = s.code_attempts + 1 WHERE s.id = l.id;
        PERFORM pepsi.event_log_write('secure_link_code_wrong', jsonb_build_object('id', l.id, 'attempt', l.code_attempts + 1));
        RETURN jsonb_build_object('refused', CASE WHEN l.code_attempts + 1 >= attempts
            THEN format('wrong code, the %sth: this code no longer counts; ask for a new one', attempts)
            ELSE format('wrong code (%s of %s tries left)', attempts - l.code_attempts - 1, attempts) END);
    END IF;
    UPDATE pepsi.secure_link s SET code_hash = NULL, code_used_at = now(), opened = s.opened + 1,
        last_opened_at = now() WHERE s.id = l.id;
    DELETE FROM pepsi.secure_link_session x WHERE x.expires_at < now();
    INSERT INTO pepsi.secure_link_session (token_hash, link, csrf, expires_at)
    VALUES (sha256(convert_to(session, 'UTF8')), l.id, csrf, now() + session_lifetime);
    PERFORM pepsi.event_log_write('secure_link_opened', jsonb_build_object('id', l.id, 'recipient', l.recipient,
        'opened', l.opened + 1, 'opens', l.open_limit));
    RETURN jsonb_build_object('session', session, 'csrf', csrf);
END
$$;

-- The sealed message for a session of the link: one row, or none (and
-- refusal says why) when the session is not one of this link's or ended
-- (and why no new one starts when the link's opens are spent).
CREATE FUNCTION pepsi.secure_link_open(link_id bytea, session text)
RETURNS TABLE (refusal text, recipient text, sender text, nonce bytea, sealed bytea, csrf text, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    s pepsi.secure_link_session;
BEGIN
    SELECT * INTO l FROM pepsi.secure_link x WHERE x.link_id = secure_link_open.link_id;
    refusal := pepsi.secure_link_refusal(l);
    IF refusal IS NULL THEN
        SELECT * INTO s FROM pepsi.secure_link_session x
        WHERE x.token_hash = sha256(convert_to(coalesce(session, ''), 'UTF8')) AND x.link = l.id AND x.expires_at > now();
        IF s.link IS NULL THEN
            refusal := coalesce(pepsi.secure_link_reuse_refusal(l),
                                'no session: enter the code mailed to you first (a session lasts a few minutes)');
        ELSE
            recipient := l.recipient;
            sender := l.sender;
            nonce := l.nonce;
            sealed := l.sealed;
            csrf := s.csrf;
            expires_at := s.expires_at;
        END IF;
    END IF;
    RETURN NEXT;
END
$$;

-- A reply written on the page: queued at stage from the portal's
-- address, To the message's sender, Reply-To the recipient.  The
-- session's CSRF token is used once (a new one is made); NULL, or why not.
CREATE FUNCTION pepsi.secure_link_reply(link_id bytea, session text, csrf text, stage text, subject text,
                                        in_reply_to text, body text, max_replies integer)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    s pepsi.secure_link_session;
    clean text := regexp_replace(left(coalesce(subject, ''), 200), '[\x01-\x1f\x7f]', ' ', 'g');
    encoded text;
    domain text;
    id text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    SELECT * INTO l FROM pepsi.secure_link x WHERE x.link_id = secure_link_reply.link_id FOR UPDATE;
    IF pepsi.secure_link_refusal(l) IS NOT NULL THEN
        RETURN pepsi.secure_link_refusal(l);
    END IF;
    SELECT * INTO s FROM pepsi.secure_link_session x
    WHERE x.token_hash = sha256(convert_to(coalesce(session, ''), 'UTF8')) AND x.link = l.id AND x.expires_at > now()
    FOR UPDATE;
    IF s.link IS NULL THEN
        RETURN coalesce(pepsi.secure_link_reuse_refusal(l), 'no session: enter the code mailed to you first');
    ELSIF s.csrf IS DISTINCT FROM csrf THEN
        RETURN 'the form is stale or not this page''s (its CSRF token): reload the message and write again';
    ELSIF l.sender = '' THEN
        RETURN 'the message has no sender to reply to';
    ELSIF l.replies >= max_replies THEN
        RETURN format('%s replies were sent from this link already (the most)', max_replies);
    ELSIF btrim(coalesce(body, '')) = '' THEN
        RETURN 'the reply is empty';
    END IF;
    UPDATE pepsi.secure_link_session x SET csrf = replace(gen_random_uuid()::text, '-', '') WHERE x.token_hash = s.token_hash;
    UPDATE pepsi.secure_link x SET replies = x.replies + 1 WHERE x.id = l.id;
    IF clean ~ '[^\x20-\x7e]' THEN
        encoded := '=?UTF-8?B?' || replace(encode(convert_to(clean, 'UTF8'), 'base64'), E'\n', '') || '?=';
    ELSE
        encoded := clean;
    END IF;
    domain := split_part(l.portal_address, '@', 2);
    PERFORM pepsi.workqueue_inject(stage, l.portal_address, ARRAY[l.sender],
        convert_to(format(E'From: "%s via the secure portal" <%s>\r\nReply-To: <%s>\r\nTo: <%s>\r\nSubject: %s\r\n'
                          'Date: %s\r\nMessage-ID: <secure-link-reply.%s@%s>\r\n%s'
                          'MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n'
                          'Content-Transfer-Encoding: base64\r\n',
                          replace(l.recipient, '"', ''), l.portal_address, l.recipient, l.sender, encoded,
                          to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "+0000"'), id, domain,
                          CASE WHEN in_reply_to ~ '^<[!-;=?-~]+>$'
                               THEN format(E'In-Reply-To: %s\r\nReferences: %s\r\n', in_reply_to, in_reply_to) ELSE '' END),
                   'UTF8'),
        convert_to(replace(encode(convert_to(replace(replace(body, E'\r\n', E'\n'), E'\n', E'\r\n'), 'UTF8'), 'base64'),
                           E'\n', E'\r\n') || E'\r\n', 'UTF8'));
    PERFORM pepsi.event_log_write('secure_link_replied', jsonb_build_object('id', l.id, 'recipient', l.recipient,
                                                                            'to', l.sender));
    RETURN NULL;
END
$$;

-- pepsi-secure-link list: the links (all, or those still open: that may
-- start a session).  A link whose opens are spent is "used" (a session it
-- started may still run); open_limit is NULL for a link without a limit.
CREATE FUNCTION pepsi.secure_link_list(open_only boolean DEFAULT false)
RETURNS TABLE (id bigint, recipient text, sender text, queue_id text, created_at timestamptz, expires_at timestamptz,
               state text, opened integer, open_limit integer, replies integer, reason text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT l.id, l.recipient, l.sender, l.queue_id, l.created_at, l.expires_at,
           CASE WHEN l.revoked_at IS NOT NULL THEN 'revoked' WHEN l.expires_at <= now() OR l.sealed IS NULL THEN 'expired'
                WHEN pepsi.secure_link_reuse_refusal(l) IS NOT NULL THEN 'used' ELSE 'open' END,
           l.opened, l.open_limit, l.replies, l.revoked_reason
    FROM pepsi.secure_link l
    WHERE NOT open_only OR (l.revoked_at IS NULL AND l.expires_at > now() AND l.sealed IS NOT NULL
                            AND pepsi.secure_link_reuse_refusal(l) IS NULL)
    ORDER BY l.id
$$;

-- pepsi-secure-link expire / revoke: end links now (ids), or with no ids
-- (expire only) wipe the ciphertext of every link whose time is up.  The
-- ciphertext and the sessions go; the row stays for the list and the
-- audit.  How many links were ended; an unknown id is an error.
CREATE FUNCTION pepsi.secure_link_end(ids bigint[], revoking boolean, reason text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    missing bigint;
    n integer;
BEGIN
    IF ids IS NULL AND revoking THEN
        RAISE EXCEPTION 'revoke needs the ids of the links to revoke' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT i INTO missing FROM unnest(ids) i WHERE NOT EXISTS (SELECT FROM pepsi.secure_link l WHERE l.id = i) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'no secure link has id %', missing USING ERRCODE = 'no_data_found',
            HINT = 'pepsi-secure-link list shows them.';
    END IF;
    DELETE FROM pepsi.secure_link_session s
    WHERE (ids IS NULL AND s.link IN (SELECT l.id FROM pepsi.secure_link l WHERE l.expires_at <= now()))
       OR s.link = ANY (ids);
    UPDATE pepsi.secure_link l SET sealed = NULL, code_hash = NULL,
        expires_at = CASE WHEN ids IS NULL OR revoking THEN l.expires_at ELSE least(l.expires_at, now()) END,
        revoked_at = CASE WHEN revoking THEN coalesce(l.revoked_at, now()) ELSE l.revoked_at END,
        revoked_reason = CASE WHEN revoking THEN coalesce(reason, 'by the administrator') ELSE l.revoked_reason END
    WHERE CASE WHEN ids IS NULL THEN l.expires_at <= now() AND l.sealed IS NOT NULL ELSE l.id = ANY (ids) END;
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM pepsi.event_log_write(CASE WHEN revoking THEN 'secure_link_revoked' ELSE 'secure_link_expired' END,
        jsonb_build_object('ids', to_jsonb(ids), 'count', n, 'reason', reason));
    RETURN n;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_crypto', 'function', 'secure_link_store', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_status', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_code_request', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_code_check', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_open', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_reply', '{EXECUTE}'),
    ('pepsi_config', 'function', 'secure_link_list', '{EXECUTE}'),
    ('pepsi_config', 'function', 'secure_link_end', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('secure_link_store'), ('secure_link_status'),
    ('secure_link_code_request'), ('secure_link_code_check'), ('secure_link_open'), ('secure_link_reply'),
    ('secure_link_list'), ('secure_link_end');
INSERT INTO pepsi.grant_owner (name) VALUES ('secure_link'), ('secure_link_id_seq'), ('secure_link_session'),
    ('secure_link_refusal'), ('secure_link_reuse_refusal');

SELECT pg_catalog.pg_extension_config_dump('pepsi.secure_link', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.secure_link_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.secure_link_session', '');
-- end of the secure-link portal

-- ===========================================================================
-- Auto-pay's helper claims its payment (issue 39)
--
-- pepsi-helper-auto-pay (set-user-id root) used to pay whatever address
-- and amount its caller named: the limits were checked only here, by
-- auto_pay_reserve, which the stage calls, so anyone who could run the
-- helper (its group, the stage's user) could pay anything to anyone.  Now
-- the helper takes only a payment id, connects itself over the local
-- socket with peer authentication as a member of the group role
-- pepsi_autopay, and calls auto_pay_claim, which marks a payment that
-- auto_pay_reserve recorded pending (within the limits) as claimed, once,
-- and returns its address, amount and URI: what the wallet is asked to pay
-- comes from here, never from the helper's caller.  An unknown id, one
-- that was refused or finished, one claimed already, or one reserved more
-- than 10 minutes ago is refused with the reason.  The helper then
-- records what the wallet did itself (auto_pay_settle), and auto_pay_finish
-- (the stage's) no longer touches a claimed payment: a caller that is not
-- the helper cannot record a payment made as failed, which would free its
-- amount under the limits again.  pepsi_autopay may execute these two and
-- nothing else of the schema; pepsi_stage may execute neither.
-- ===========================================================================
-- The group role pepsi_autopay and its grants are made with
-- pepsi_whitelist's, before the grants are verified at creation (see there).

-- Claim pending payment id for the helper: {"pay": true, "address",
-- "amount" (CURRENCY:VALUE), "uri"}, the payment marked claimed, or
-- {"pay": false, "why": ...} with nothing changed.
CREATE FUNCTION pepsi.auto_pay_claim(id bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    p pepsi.payment;
BEGIN
    SELECT * INTO p FROM pepsi.payment q WHERE q.id = auto_pay_claim.id AND q.direction = 'out' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('pay', false, 'why', format('no payment %s was reserved', id));
    ELSIF p.claimed_at IS NOT NULL THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s was claimed already, at %s', id, p.claimed_at));
    ELSIF p.outcome <> 'pending' THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s is %s, not pending%s', id, p.outcome,
                                                coalesce(' (' || p.reason || ')', '')));
    ELSIF p.created_at < now() - interval '10 minutes' THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s was reserved at %s, more than 10 minutes ago', id,
                                                p.created_at));
    END IF;
    UPDATE pepsi.payment q SET claimed_at = now() WHERE q.id = p.id;
    RETURN jsonb_build_object('pay', true, 'id', p.id, 'address', p.address,
                              'amount', p.currency || ':' || p.amount::text, 'uri', p.uri);
END
$$;

-- What became of payment id, which the helper claimed: 'paid' or
-- 'failed', with the reason.  True when it was recorded (a payment not
-- claimed, or settled already, is left as it is).
CREATE FUNCTION pepsi.auto_pay_settle(id bigint, outcome text, reason text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF outcome NOT IN ('paid', 'failed') THEN
        RAISE EXCEPTION 'invalid outcome "%"', outcome USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pepsi.payment p SET outcome = auto_pay_settle.outcome, reason = auto_pay_settle.reason, finished_at = now()
    WHERE p.id = auto_pay_settle.id AND p.direction = 'out' AND p.outcome = 'pending' AND p.claimed_at IS NOT NULL;
    RETURN FOUND;
END
$$;

INSERT INTO pepsi.grant_definer (name) VALUES ('auto_pay_claim'), ('auto_pay_settle');
-- end of auto-pay's helper claims its payment

-- ===========================================================================
-- keydisc_release finds the parked rows by an index (issue 41)
--
-- keydisc_release resumes the rows parked for an address
-- (state.encrypt.waiting_for); it scanned every row of the queue for them.
-- workqueue_keydisc_waiting indexes the address of the paused rows that
-- wait for a key only, so it stays small and the lookup is an index scan.
-- Its predicate names index_status, not status, like the queue's other
-- indexes: the claim, which changes only status, stays a HOT update.
-- ===========================================================================
CREATE INDEX workqueue_keydisc_waiting ON pepsi.workqueue (((state -> 'encrypt') ->> 'waiting_for'))
    WHERE index_status = 'paused' AND ((state -> 'encrypt') ->> 'waiting_for') IS NOT NULL;
-- end of keydisc_release finds the parked rows by an index

-- ===========================================================================
-- The archive's search and import at scale (issue 40)
--
-- Search: the archive's GIN index is on archive_search_key(list_id,
-- search), the message's tsvector and one lexeme naming its list
-- ('#list' and the id: no parser makes a word of '#'), so that a list's
-- search is one condition on the index and a count is answered by the
-- index's bitmap without reading the rows (only a page not all-visible,
-- or a phrase's word positions, send it to the table).  The index on
-- search alone goes.  archive_search and archive_search_count plan each
-- query with its words (EXECUTE), and the count never scans the whole
-- table: that reads every message's tsvector, seconds for a common word
-- at 100,000 messages.
-- Import: archive_store_batch archives many messages in one call, so
-- pepsi-archive import makes one round trip a batch, not one a message.
-- archive_message keeps the raw copy, the text and the tsvector out of
-- line as soon as a row passes 128 bytes (toast_tuple_target, in place):
-- a row is then its few short fields, about 35 to a page, and the count
-- of a common word visits some 3,000 pages for 100,000 messages where it
-- visited 16,000.
-- ===========================================================================

-- The key the archive's GIN index is on: a message's tsvector and its
-- list's lexeme.  Checked on a row, it reads the message's tsvector (5 to
-- 12 KB with its word pairs) back from TOAST, several pages, and
-- decompresses it: its COST says so, where an inlined expression counted
-- a few operators and a sequential scan, which checks every message,
-- looked cheaper than the index's bitmap for a common word
-- (archive_search_count needed enable_seqscan = off).  Measured at 10,000
-- messages: with COST 1000 a word in 98.6% of them still went to a
-- sequential scan (0.6 to 4.7 s), with 10000 to the bitmap (3 to 5 ms).
-- A word in more than 99% of the messages still gets the sequential
-- scan: the planner takes costs within 1% of each other as equal.  In C
-- (extension/src/archive_search.c, 0.13): the tsvector with the list's
-- lexeme put in its place, one copy, as search ||
-- array_to_tsvector(ARRAY['#list' || list]) made it in SQL, where a page
-- walked in date order paid a SQL call, a search_path set and
-- tsvector_concat on every row it checked.
CREATE FUNCTION pepsi.archive_search_key(list bigint, search tsvector) RETURNS tsvector
    AS 'MODULE_PATHNAME', 'archive_search_key' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE COST 10000;

-- A reader's query (websearch syntax) within list, for archive_search_key;
-- a query with no words matches nothing, as before.  A phrase (words
-- adjacent and in order, "a b c") is looked up by its word pairs, which
-- the message's tsvector holds as lexemes of their own ('a b',
-- archive_word_pairs): two words are the one pair, answered by the index
-- alone like a word; three or more are their pairs, all of them, and the
-- phrase itself, checked on the few messages that have every pair.  A
-- pair over 100 bytes is not indexed, so its phrase is left as it was
-- (checked on every message with its words).
CREATE FUNCTION pepsi.archive_search_query(list bigint, query text) RETURNS tsquery
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    -- a run of quoted lexemes joined by <->, as tsquery's text shows a
    -- phrase (no lexeme of the 'simple' configuration holds a space)
    run constant text := '(?:^|(?<=[ (!]))''(?:[^'' ]|'''')*''(?: <-> ''(?:[^'' ]|'''')*'')+';
    q tsquery := websearch_to_tsquery('simple', query);
    rest text := q::text;
    done text := '';
    phrase text;
    words text[];
    pairs text[];
    at integer;
BEGIN
    IF numnode(q) = 0 THEN
        RETURN q;
    END IF;
    LOOP
        at := regexp_instr(rest, run);
        EXIT WHEN at = 0;
        phrase := regexp_substr(rest, run);
        words := ARRAY(SELECT (tsvector_to_array(w.m[1]::tsvector))[1]
                       FROM regexp_matches(phrase, '(''(?:[^'' ]|'''')*'')', 'g') WITH ORDINALITY AS w(m, n) ORDER BY w.n);
        pairs := ARRAY(SELECT words[i] || ' ' || words[i + 1] FROM generate_series(1, cardinality(words) - 1) AS i);
        done := done || left(rest, at - 1);
        rest := substr(rest, at + length(phrase));
        IF right(done, 4) = '<-> ' OR left(rest, 4) = ' <->' OR EXISTS (SELECT FROM unnest(pairs) p WHERE octet_length(p) > 100) THEN
            done := done || phrase;
        ELSE
            done := done || '( ' || (SELECT string_agg('''' || replace(replace(p, '\', '\\'), '''', '''''') || '''', ' & ')
                                     FROM unnest(pairs) p)
                    || CASE WHEN cardinality(words) > 2 THEN ' & ' || phrase ELSE '' END || ' )';
        END IF;
    END LOOP;
    RETURN (done || rest)::tsquery && ('#list' || list::text)::tsquery;
END
$$;

CREATE INDEX archive_message_list_search ON pepsi.archive_message
    USING gin (pepsi.archive_search_key(list_id, search));

-- pepsi-archive import's call: messages (each as archive_store takes it)
-- archived in order in one call; how many were new (the others the list
-- had already).  A NULL message is refused, and the whole batch with it.
-- Each message is written once, with its thread; the threads the batch
-- touched are recounted once, at its end.
CREATE FUNCTION pepsi.archive_store_batch(list bigint, messages bytea[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    message bytea;
    s record;
    stored integer := 0;
    threads bigint[] := '{}';
BEGIN
    IF array_position(messages, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'message % of the batch is NULL', array_position(messages, NULL)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOREACH message IN ARRAY coalesce(messages, '{}') LOOP
        s := pepsi.archive_store_message(list, message, 'import');
        IF s.stored IS NOT NULL THEN
            stored := stored + 1;
        END IF;
        threads := threads || s.threads;
    END LOOP;
    PERFORM pepsi.archive_thread_refresh(ARRAY(SELECT DISTINCT t FROM unnest(threads) AS t));
    RETURN stored;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'archive_store_batch', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('archive_store_batch');
INSERT INTO pepsi.grant_owner (name) VALUES ('archive_search_key'), ('archive_search_query');
-- end of the archive's search and import at scale

-- ===========================================================================
-- pepsi-list digest: a list's digest sent now (issue 40)
--
-- list_digest_now(list, stage) is what the schedule's row does when it is
-- due (list_digest_send: the digest built, queued at stage for the digest
-- members, the posts taken, in one transaction), for pepsi-list as
-- pepsi_config, and audited (event_log list_digest).  It refuses, naming
-- the reason, a list that does not exist, one with no digest member (no
-- enabled member whose delivery is digest) and one with no post waiting,
-- so nothing is queued for nobody and no empty issue is counted.
-- ===========================================================================
CREATE FUNCTION pepsi.list_digest_now(list text, stage text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    sent jsonb;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = lower(list_digest_now.list);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list_digest_now.list USING ERRCODE = 'no_data_found',
            HINT = 'pepsi-list lists shows the lists.';
    END IF;
    IF NOT EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = l.id AND m.delivery = 'digest'
                   AND m.disabled IS NULL) THEN
        RAISE EXCEPTION 'list % has no digest member: no digest to send', l.address USING ERRCODE = 'no_data_found',
            HINT = 'A member gets digests after pepsi-list add LIST ADDRESS digest.';
    END IF;
    IF NOT EXISTS (SELECT FROM pepsi.list_digest x WHERE x.list_id = l.id) THEN
        RAISE EXCEPTION 'list % has no post waiting for a digest: none sent', l.address USING ERRCODE = 'no_data_found';
    END IF;
    sent := pepsi.list_digest_send(l.id, stage);
    PERFORM pepsi.event_log_write('list_digest', jsonb_build_object('list', l.address, 'stage', stage) || sent);
    RETURN sent;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'list_digest_now', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_digest_now');
-- end of pepsi-list digest

-- ===========================================================================
-- The list stage's fan-out in one call (issue 40)
--
-- Before its commit, the list stage made three calls for an accepted
-- post: its copy for the next digest (list_digest_add), the archive's
-- copy (archive_post) and the subscribers' groups (list_fanout).
-- list_fanout_post is the three in one round trip, each as it was (the
-- copies keyed by the row, so a fan-out that runs again adds nothing
-- twice); the commit (workqueue_finish_with_clones) stays the one call
-- that makes the subscribers' rows and ends the post's.
-- ===========================================================================
CREATE FUNCTION pepsi.list_fanout_post(list bigint, row_id bigint, stage text, subject text, author text,
                                       sent_date text, message_id text, content_type text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    kept boolean;
    archived bigint;
BEGIN
    kept := pepsi.list_digest_add(list, row_id, subject, author, sent_date, message_id, content_type);
    archived := pepsi.archive_post(list, row_id);
    RETURN jsonb_build_object('kept', kept, 'archived', archived, 'groups', pepsi.list_fanout(list, stage));
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'list_fanout_post', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_fanout_post');
-- end of the list stage's fan-out in one call

-- ===========================================================================
-- The archive's phrase search, excerpts and import at 100,000 messages
-- (issue 40)
--
-- Phrases: a message's tsvector holds, besides its words, each two words
-- at adjacent positions as one lexeme of their own, 'a b' (no lexeme of the
-- 'simple' configuration holds a space; archive_word_pairs), made from the
-- tsvector's own positions, so a pair is there exactly when the phrase
-- "a b" matches the words.  archive_search_query turns a two-word phrase
-- into its pair: one lookup in the GIN index like a word, and a count from
-- the index's bitmap (no recheck), where a phrase's <-> sent every message
-- having both words to the table to read its positions back (seconds for
-- two common words at 100,000 messages).  A longer phrase is all its pairs
-- AND the phrase, checked on the few messages that have every pair.
-- Chosen over the other way, the tsvectors in a narrow table of their
-- own (not measured here): that makes the positions cheaper to read back,
-- but still reads one back per message having both words; the pairs read
-- none.  Measured: the count of "w0 w1" at 10,000 messages takes 2 ms from
-- the index (7.3 s at 100,000 through the positions).  The price is at
-- import: the pairs, stored without positions, are more entries in the
-- index than the words, nearly all of them distinct.
-- Excerpts: ts_headline over 600 characters around the query's first word,
-- not the whole text (0.12: archive_excerpt, in C, in its place).
-- Planner: archive_search_key declares its cost (it reads a message's
-- tsvector back from TOAST), so the planner itself takes the GIN index
-- for every query but the commonest words' pages; no enable_* override.
-- Import: a message is parsed (archive_parse) before it is written, and
-- written once with its thread (archive_store_message); a batch recounts
-- its threads once, at its end, not once a message.
-- ===========================================================================

-- The word pairs of a message's tsvector: the lexemes at positions p and
-- p + 1 as one lexeme 'a b' each, without positions (each position's next
-- one, in position order).  A pair over 100 bytes is left out
-- (archive_search_query leaves such a phrase to the positions).  The
-- pairs stay under 400,000 bytes, the first ones kept (more than the
-- 16,383 positions a tsvector counts give in mail's text), so that the
-- tsvector stays under its 1 MB.  In C (extension/src/archive_search.c):
-- made in SQL, the pairs were half of what parsing a message cost at import.
CREATE FUNCTION pepsi.archive_word_pairs(words tsvector) RETURNS tsvector
    AS 'MODULE_PATHNAME', 'archive_word_pairs' LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- A message's fields from its raw copy (named: its Message-Id): subject,
-- sender, date (NULL when unreadable), text, tsvector with its word
-- pairs, what was wrong with it, the Message-Ids it names (the last 100,
-- References then In-Reply-To) and its attachments (list's limit applied).
CREATE FUNCTION pepsi.archive_parse(list bigint, named text, raw bytea,
    OUT subject text, OUT from_name text, OUT from_address text, OUT sent_at timestamptz, OUT body_text text,
    OUT search tsvector, OUT problems text[], OUT refs text[], OUT attachments pepsi.archive_attachment[])
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    policy pepsi.archive_policy := pepsi.archive_policy_of(list);
    entity text := replace(pepsi.archive_bytes_text(raw), E'\r\n', E'\n');
    head text;
    field text;
    body text := '';
    words tsvector;
    part record;
    attached integer := 0;
BEGIN
    problems := '{}';
    attachments := '{}';
    head := CASE WHEN position(E'\n\n' IN entity) > 0 THEN left(entity, position(E'\n\n' IN entity)) ELSE entity END;
    IF named LIKE 'no-message-id.%@archive.invalid' THEN
        problems := problems || ('no Message-Id: archived as <' || named || '>');
    END IF;
    field := pepsi.archive_header(head, 'Date');
    BEGIN
        sent_at := regexp_replace(field, '\s*\([^)]*\)\s*$', '')::timestamptz;
    EXCEPTION WHEN OTHERS THEN
        sent_at := NULL;
    END;
    IF sent_at IS NULL THEN
        problems := problems || ('no readable Date: (' || coalesce(left(field, 80), 'none') || '): the archiving time stands for it');
    END IF;
    field := pepsi.archive_decode_words(pepsi.archive_header(head, 'From'));
    from_address := lower(coalesce((regexp_match(field, '<([^<>\s]+@[^<>\s]+)>'))[1],
                                   (regexp_match(field, '([^<>\s"]+@[^<>\s"]+)'))[1]));
    from_name := CASE WHEN field LIKE '%<%' THEN nullif(btrim(regexp_replace(field, '\s*<[^<>]*>\s*$', ''), E' \t"'), '') END;
    refs := pepsi.archive_message_ids(pepsi.archive_header(head, 'References'));
    refs := refs || ARRAY(SELECT i FROM unnest(pepsi.archive_message_ids(pepsi.archive_header(head, 'In-Reply-To'))) i
                          WHERE i <> ALL (refs));
    refs := refs[greatest(1, cardinality(refs) - 99):];
    FOR part IN SELECT * FROM pepsi.archive_mime_parts(entity, 0) LOOP
        IF part.problem IS NOT NULL THEN
            problems := problems || part.problem;
        END IF;
        IF part.content IS NULL THEN
            CONTINUE;
        ELSIF part.is_text AND part.filename IS NULL THEN
            body := body || pepsi.archive_decode_charset(part.content, part.charset) || E'\n';
        ELSE
            attached := attached + 1;
            IF length(part.content) > policy.max_attachment THEN
                problems := problems || format('attachment %s (%s, %s bytes) is over the list''s max_attachment (%s bytes): not kept',
                                               attached, part.content_type, length(part.content), policy.max_attachment);
            END IF;
            attachments := attachments || ROW(NULL, NULL, attached, left(part.filename, 255),
                coalesce(part.content_type, 'application/octet-stream'), length(part.content),
                CASE WHEN length(part.content) <= policy.max_attachment THEN part.content END,
                CASE WHEN length(part.content) > policy.max_attachment
                     THEN format('over the list''s max_attachment (%s bytes)', policy.max_attachment) END)::pepsi.archive_attachment;
        END IF;
    END LOOP;
    IF length(body) > 500000 THEN
        problems := problems || 'a text over 500000 characters: only its start is searchable';
    END IF;
    subject := left(pepsi.archive_decode_words(pepsi.archive_header(head, 'Subject')), 1000);
    body_text := body;
    words := setweight(to_tsvector('simple', coalesce(pepsi.archive_decode_words(pepsi.archive_header(head, 'Subject')), '')), 'A')
             || setweight(to_tsvector('simple', left(body, 500000)), 'B');
    search := words || pepsi.archive_word_pairs(words);
END
$$;

-- Keep a message's references (not its own Message-Id) and attachments,
-- as archive_parse gave them.
CREATE FUNCTION pepsi.archive_keep_parts(message bigint, list bigint, named text, refs text[],
                                         attachments pepsi.archive_attachment[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    INSERT INTO pepsi.archive_reference (message_id, position, list_id, referenced)
    SELECT message, x.n, list, x.r FROM unnest(refs) WITH ORDINALITY AS x(r, n) WHERE x.r <> named;
    IF cardinality(attachments) > 0 THEN
        INSERT INTO pepsi.archive_attachment (message_id, position, filename, content_type, size, content, withheld)
        SELECT message, a.position, a.filename, a.content_type, a.size, a.content, a.withheld FROM unnest(attachments) AS a;
    END IF;
END
$$;

-- A message (named, in thread under parent) just placed adopts the
-- messages that name it more nearly than their present parent (they
-- arrived first), their replies moving with it; the threads they left
-- (for archive_thread_refresh).
CREATE FUNCTION pepsi.archive_thread_adopt(message bigint, list bigint, named text, thread bigint, parent bigint)
RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    adopted bigint[];
    moved bigint[];
BEGIN
    WITH RECURSIVE ancestor(id) AS (SELECT parent UNION SELECT a.parent_id FROM pepsi.archive_message a
                                    JOIN ancestor x ON a.id = x.id WHERE a.parent_id IS NOT NULL)
    SELECT array_agg(DISTINCT c.id) INTO adopted
    FROM pepsi.archive_reference r JOIN pepsi.archive_message c ON c.id = r.message_id
    WHERE r.list_id = list AND r.referenced = named AND c.id <> message
      AND c.id NOT IN (SELECT x.id FROM ancestor x WHERE x.id IS NOT NULL)
      AND r.position > coalesce((SELECT max(r2.position) FROM pepsi.archive_reference r2
                                 JOIN pepsi.archive_message p ON p.id = c.parent_id
                                 WHERE r2.message_id = c.id AND r2.referenced = p.message_id), 0);
    IF adopted IS NULL THEN
        RETURN '{}';
    END IF;
    UPDATE pepsi.archive_message a SET parent_id = message WHERE a.id = ANY (adopted);
    WITH RECURSIVE subtree(id) AS (SELECT unnest(adopted) UNION SELECT a.id FROM pepsi.archive_message a
                                   JOIN subtree s ON a.parent_id = s.id)
    SELECT array_agg(DISTINCT a.thread_id) INTO moved FROM pepsi.archive_message a
    WHERE a.id IN (SELECT id FROM subtree);
    WITH RECURSIVE subtree(id) AS (SELECT unnest(adopted) UNION SELECT a.id FROM pepsi.archive_message a
                                   JOIN subtree s ON a.parent_id = s.id)
    UPDATE pepsi.archive_message a SET thread_id = thread WHERE a.id IN (SELECT id FROM subtree);
    RETURN coalesce(moved, '{}');
END
$$;

-- Archive one message as archive_store does, but leave the threads it
-- touched (threads) to the caller's archive_thread_refresh: parsed first,
-- then written once with its parent and thread (the nearest message it
-- names that is archived, References then In-Reply-To, last first; else a
-- new thread), then its references and attachments, then its adoptions.
-- Its plans are generic (0.14), made once a session: a custom plan, made
-- with the list's id from the table's statistics, took the date index for
-- a list that had few messages then (any list during its first import)
-- and read every message of the list for each one archived.
CREATE FUNCTION pepsi.archive_store_message(list bigint, raw bytea, source text, OUT stored bigint, OUT threads bigint[])
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    entity text := replace(pepsi.archive_bytes_text(raw), E'\r\n', E'\n');
    named text;
    p record;
    parent bigint;
    thread bigint;
BEGIN
    threads := '{}';
    IF NOT EXISTS (SELECT FROM pepsi.mailing_list l WHERE l.id = list) THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    entity := CASE WHEN position(E'\n\n' IN entity) > 0 THEN left(entity, position(E'\n\n' IN entity)) ELSE entity END;
    named := left((pepsi.archive_message_ids(pepsi.archive_header(entity, 'Message-Id')))[1], 900);
    IF named IS NULL THEN
        named := 'no-message-id.' || encode(sha256(raw), 'hex') || '@archive.invalid';
    END IF;
    IF EXISTS (SELECT FROM pepsi.archive_message a WHERE a.list_id = list AND a.message_id = named) THEN
        RETURN;
    END IF;
    p := pepsi.archive_parse(list, named, raw);
    SELECT a.id, a.thread_id INTO parent, thread FROM pepsi.archive_message a
    WHERE a.list_id = list AND a.message_id = ANY (p.refs) AND a.message_id <> named
    ORDER BY (SELECT max(r.n) FROM unnest(p.refs) WITH ORDINALITY AS r(referenced, n) WHERE r.referenced = a.message_id) DESC
    LIMIT 1;
    IF thread IS NULL THEN
        INSERT INTO pepsi.archive_thread (list_id, subject, started_at, last_at)
        VALUES (list, p.subject, coalesce(p.sent_at, now()), coalesce(p.sent_at, now())) RETURNING id INTO thread;
    END IF;
    threads := ARRAY[thread];
    INSERT INTO pepsi.archive_message AS a (list_id, message_id, thread_id, parent_id, subject, from_name, from_address,
                                            sent_at, raw, body_text, search, problems)
    VALUES (list, named, thread, parent, p.subject, p.from_name, p.from_address, coalesce(p.sent_at, now()), raw,
            p.body_text, p.search, p.problems)
    ON CONFLICT ON CONSTRAINT archive_message_list_id_message_id_key DO NOTHING
    RETURNING a.id INTO stored;
    IF stored IS NULL THEN
        RETURN;
    END IF;
    PERFORM pepsi.archive_keep_parts(stored, list, named, p.refs, p.attachments);
    threads := threads || pepsi.archive_thread_adopt(stored, list, named, thread, parent);
    -- An import recounts the months once at its end (archive_import_finish):
    -- a row updated per message of one transaction would grow a chain of
    -- dead versions that every later update walks.
    IF source <> 'import' THEN
        INSERT INTO pepsi.archive_month AS x (list_id, month, messages)
        VALUES (list, date_trunc('month', coalesce(p.sent_at, now()) AT TIME ZONE 'UTC')::date, 1)
        ON CONFLICT ON CONSTRAINT archive_month_pkey DO UPDATE SET messages = x.messages + 1;
    END IF;
    IF cardinality(p.problems) > 0 THEN
        PERFORM pepsi.event_log_write('archive_problem', jsonb_build_object('list', list, 'message', stored,
            'message_id', named, 'source', source, 'problems', to_jsonb(p.problems)));
    END IF;
END
$$;

-- shown with its addresses obfuscated as obfuscation says (a list's
-- archive_policy): none, at (user at example.org), hide (user@...); what
-- regexp_replace made of ([A-Za-z0-9._%+=-]+)@([A-Za-z0-9.-]+\.[A-Za-z]+),
-- in C (extension/src/archive_search.c, 0.13): one pass, none at all
-- without an '@'.  COST 100: a page's sort and LIMIT come first, so only
-- the rows shown have their text read back and obfuscated.
CREATE FUNCTION pepsi.archive_obfuscated(obfuscation text, shown text) RETURNS text
    AS 'MODULE_PATHNAME', 'archive_obfuscated' LANGUAGE C IMMUTABLE PARALLEL SAFE COST 100;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_httpd', 'function', 'archive_search_count', '{EXECUTE}');
INSERT INTO pepsi.grant_owner (name) VALUES ('archive_word_pairs'), ('archive_parse'), ('archive_keep_parts'),
    ('archive_thread_adopt'), ('archive_store_message'), ('archive_obfuscated');
-- end of the archive's phrase search, excerpts and import at 100,000 messages

-- ===========================================================================
-- A proof of payment is judged only for an open challenge (issue 39)
--
-- pepsi-stage-check-whitelist ran PAYMENT_VERIFY_COMMAND (a process a
-- proof, and perhaps a call to the payment service) for any well-formed
-- Payment-Proof:, even one naming an order that no open challenge of
-- that recipient has: anyone could make the stage run the verifier as
-- often as they sent mail.  pepsi.secretary_challenge_open says whether
-- the proof's challenge is an open one (sent, not released, in time) of
-- that owner; the stage asks it first, and any other proof is not paid,
-- without the verifier (or the secret) being consulted.  The sender is
-- not compared: a payer's wallet may answer from an address of its own
-- (pepsi-stage-auto-pay does), and pepsi.secretary_paid records the
-- challenge's sender as the payer anyway.  Since 0.13 the proof names
-- the challenge's order reference too (pepsi.secretary_challenge
-- order_ref), unguessable where the id was not, and only a proof naming
-- the reference of an open challenge is judged.
-- ===========================================================================

-- Is challenge, named with reference, an open challenge of owner's: sent
-- (challenged_at, so its payment request went out), not released, not
-- expired, and reference its order reference?  A challenge whose payment
-- request went out before 0.13 has none (order_ref NULL): it is named
-- by its id alone (reference NULL), and only it is.  The references are
-- compared as their SHA-256 hashes, so how long the comparison takes
-- says nothing of the stored one: a guess learns no prefix of it.
CREATE FUNCTION pepsi.secretary_challenge_open(owner text, challenge bigint, reference text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT EXISTS (SELECT FROM pepsi.secretary_challenge c
                   WHERE c.id = secretary_challenge_open.challenge
                     AND c.owner = pepsi.secretary_address(secretary_challenge_open.owner)
                     AND c.challenged_at IS NOT NULL AND c.released_at IS NULL AND c.expires_at > now()
                     AND CASE WHEN c.order_ref IS NULL THEN secretary_challenge_open.reference IS NULL
                              ELSE sha256(convert_to(c.order_ref, 'UTF8'))
                                   = sha256(convert_to(secretary_challenge_open.reference, 'UTF8')) END)
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'secretary_challenge_open', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('secretary_challenge_open');
-- end of a proof of payment is judged only for an open challenge
-- The archive's search excerpts in C (issue 40)
--
-- A search result's excerpt was ts_headline over 600 characters of the
-- text a regular expression had found (archive_excerpt_window): about
-- 0.15 ms of CPU a row, so a page of 100 results cost some 30 ms whatever
-- the search, and a rare word's page, at 100,000 messages, stayed near 4x
-- grep -c over the mbox.  archive_excerpt (extension/src/archive_search.c)
-- is one pass over the text's first 20,000 bytes (only they are read back
-- from TOAST): its words found, the query's among them marked « », cut at
-- word boundaries, up to two fragments as ts_headline's MaxFragments=2
-- gave.  archive_search keeps its signature and its rows.
-- ===========================================================================

-- What a search result shows of a message's text: up to two fragments of
-- some 35 words around the query's words (the first found, then the first
-- past the first fragment), joined by " ... ", the query's words between
-- « and », white space one space; the text's start when none of the
-- query's words is in its first 20,000 bytes.  Not escaped: the page
-- escapes it for HTML.  COST 100 (ts_headline's): a query's sort and
-- LIMIT come before it, so only the rows shown get one (at cost 1 a
-- phrase's page made one for every match, then kept 100).
CREATE FUNCTION pepsi.archive_excerpt(body text, query tsquery) RETURNS text
    AS 'MODULE_PATHNAME', 'archive_excerpt' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE COST 100;

INSERT INTO pepsi.grant_owner (name) VALUES ('archive_excerpt');
SELECT pepsi.grant_apply();
-- end of the archive's search excerpts in C
