/*
 * pepsi 0.1: the queue schema of the Pepsi mail transfer agent.
 *
 * One row of pepsi.workqueue per message in flight; its body lives in
 * pepsi.workqueue_body and is shared by every row split off the same
 * message.  Every state transition is a native function (extension/src/);
 * clients call those and never write queue SQL of their own.
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
    clone_token     text UNIQUE,
    pending_seq     bigint NOT NULL DEFAULT nextval('pepsi.pending_seq'),
    CHECK ((status = 'paused') = (timeout IS NOT NULL))
);
COMMENT ON TABLE pepsi.workqueue IS 'One row per message in flight (see pepsi(7))';
COMMENT ON COLUMN pepsi.workqueue.clone_token IS
    'Set on rows spawned as clones; unique, so a clone is created at most once while it lives';

-- The claim: oldest pending rows of a stage, and of one sender at a stage.
-- The INCLUDEd columns let the claim read them by index-only scans: rows
-- waiting in a vacuumed queue sit on all-visible pages.
CREATE INDEX workqueue_pending_fifo ON pepsi.workqueue (stage, pending_seq)
    INCLUDE (sender_key, id) WHERE status = 'pending';
CREATE INDEX workqueue_pending_sender ON pepsi.workqueue (stage, sender_key, pending_seq)
    INCLUDE (id) WHERE status = 'pending';
-- The due-time scan of paused rows.
CREATE INDEX workqueue_paused_due ON pepsi.workqueue (timeout) WHERE status = 'paused';
-- Body release: is any row still referencing this body?
CREATE INDEX workqueue_body_ref ON pepsi.workqueue (body_id);

ALTER SEQUENCE pepsi.pending_seq OWNED BY pepsi.workqueue.pending_seq;

-- A row that becomes pending again (advance, requeue, resume, or a DBA's
-- UPDATE) goes to the back of its stage's pending queue.
CREATE FUNCTION pepsi.workqueue_pending_seq_trigger() RETURNS trigger
    AS 'MODULE_PATHNAME', 'workqueue_pending_seq_trigger' LANGUAGE C;
CREATE TRIGGER workqueue_pending_seq
    BEFORE UPDATE ON pepsi.workqueue FOR EACH ROW
    WHEN (NEW.status = 'pending' AND (OLD.status <> 'pending' OR OLD.stage <> NEW.stage))
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
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pepsi.dispatch_stats (
    singleton               boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    stages_run              bigint NOT NULL DEFAULT 0,
    messages                bigint NOT NULL DEFAULT 0,
    messages_failed         bigint NOT NULL DEFAULT 0,
    serialization_failures  bigint NOT NULL DEFAULT 0,
    started_at              timestamptz,
    updated_at              timestamptz NOT NULL DEFAULT now()
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
    address     text NOT NULL CHECK (address ~ '^[^@\s]+@[^@\s]+$'),
    option      text NOT NULL CHECK (option ~ '^[A-Z][A-Z0-9_]*$'),
    value       text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (address, option)
);
COMMENT ON TABLE pepsi.settings IS
    'Per-address overrides written by account owners (a privilege boundary apart from config_override)';

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
    PRIMARY KEY (host, address)
);

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
    detail          jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX mail_log_at ON pepsi.mail_log (at);
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
RETURNS void AS 'MODULE_PATHNAME', 'workqueue_commit' LANGUAGE C CALLED ON NULL INPUT;

-- The arrayed form for batched body-free stages: one outcome, per-row
-- targets, state merges and retry times.  Returns the number of rows.
CREATE FUNCTION pepsi.workqueue_commit_many(
    ids bigint[], expected_stages text[], transition pepsi.transition,
    target_stages text[] DEFAULT NULL, merge_states jsonb[] DEFAULT NULL,
    retry_seconds double precision[] DEFAULT NULL)
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_commit_many' LANGUAGE C CALLED ON NULL INPUT;

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
DECLARE
    changed bigint[];
BEGIN
    IF ids IS NULL OR expected_stages IS NULL OR new_status IS NULL THEN
        RAISE EXCEPTION 'ids, expected_stages and new_status must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(ids) <> cardinality(expected_stages) THEN
        RAISE EXCEPTION 'expected_stages has % elements but ids has %',
            cardinality(expected_stages), cardinality(ids)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The arrays are parallel: element i of each describes the same row.';
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
        FROM unnest(ids, expected_stages) AS u(id, stage)
        WHERE w.id = u.id AND w.stage = u.stage AND w.status = 'running'
        RETURNING w.id)
    SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO changed FROM recovered;
    RETURN changed;
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
AS 'MODULE_PATHNAME', 'workqueue_claim' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

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
-- ---------------------------------------------------------------------------

DO $$
DECLARE
    wanted record;
BEGIN
    FOR wanted IN
        SELECT * FROM (VALUES
            ('pepsi_stage', 'Pepsi: the pipeline (pepsi-dispatch and the stage workers)'),
            ('pepsi_ingress', 'Pepsi: admission only (pepsi-ingress, pepsi-sendmail): EXECUTE on pepsi.workqueue_add and workqueue_inject'),
            ('pepsi_config', 'Pepsi: administration: writes pepsi.config_override, acts on the queue'),
            ('pepsi_monitor', 'Pepsi: read-only monitoring: the queue views and statistics'))
            AS r (name, description)
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = wanted.name) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', wanted.name);
            EXECUTE format('COMMENT ON ROLE %I IS %L', wanted.name, wanted.description);
        END IF;
    END LOOP;
END
$$;

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

-- queue_summary reads every row, and a row of the queue is wide (its
-- headers are inline): a million rows are some 900 MB, and scanning and
-- hashing them took 500 ms on the benchmark's machine.  This index holds
-- just what the summary needs, in its grouping order, about 50 MB for a
-- million rows: the summary is an index-only scan with a sorted
-- aggregate (130 to 200 ms there, under load), as long as vacuum keeps
-- the visibility map current.  The price is one more index entry per row
-- version; a queue transition already changes status (an indexed column),
-- so it was never a HOT update, and the measured cost of a transition
-- stayed within the noise.
CREATE INDEX workqueue_stage_status ON pepsi.workqueue (stage, status) INCLUDE (received_at, timeout);

CREATE FUNCTION pepsi.queue_summary_rows()
RETURNS TABLE (stage text, status pepsi.status, messages bigint, held bigint, oldest_age interval)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT w.stage, w.status, count(*),
           count(*) FILTER (WHERE w.status = 'paused' AND w.timeout = 'infinity'),
           now() - min(w.received_at)
    FROM pepsi.workqueue w
    GROUP BY w.stage, w.status
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
CREATE FUNCTION pepsi.event_log_write(action text, detail jsonb) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
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

-- What the overlay knows of the options, after common/config/config.c's schema:
-- the sections named here without a wildcard ([pepsi], [dispatch],
-- [ingress], [sendmail]) have exactly these options; a stage section
-- ("stage-*") has these and its program's own, checked for their form (an
-- option ending in _STAGE names a stage, as the dispatcher reads it); no
-- other section can be overridden.  kind says how a value is checked (as
-- common/config/config.c reads it); global_only marks what a process reads once
-- rather than per message, for which a domain or address override could
-- never apply.  An option added to common/config/config.c is added here too.
CREATE TABLE pepsi.config_option (
    section     text NOT NULL CHECK (section ~ '^[a-z][a-z0-9_-]*(\*)?$'),
    option      text NOT NULL CHECK (option ~ '^[A-Z][A-Z0-9_]*$'),
    kind        text NOT NULL CHECK (kind IN ('text', 'boolean', 'integer', 'duration',
                                              'stage', 'program', 'domain')),
    min_value   bigint,
    max_value   bigint,
    global_only boolean NOT NULL DEFAULT false,
    description text NOT NULL,
    PRIMARY KEY (section, option)
);
COMMENT ON TABLE pepsi.config_option IS
    'The options pepsi.config_set() knows, with how their values are checked';

INSERT INTO pepsi.config_option (section, option, kind, min_value, max_value, global_only, description) VALUES
    ('pepsi', 'HOSTNAME', 'domain', NULL, NULL, true, 'This host''s name in SMTP greetings, trace headers and DSNs'),
    ('pepsi', 'ALLOW_FUSION', 'boolean', NULL, NULL, true, 'Run a successor stage in the same worker pass when it can'),
    ('pepsi', 'MAIL_LOG', 'boolean', NULL, NULL, true, 'Keep the opt-in per-message record in pepsi.mail_log'),
    ('dispatch', 'POLL_INTERVAL', 'duration', NULL, NULL, true, 'The dispatcher''s safety-net heartbeat'),
    ('dispatch', 'FAIR_HALF_LIFE', 'duration', NULL, NULL, true, 'How fast a sender''s lead in worker time decays'),
    ('dispatch', 'FAIR_FIFO_PERCENT', 'integer', 0, 100, true, 'Share of claim slots kept oldest-first'),
    ('dispatch', 'WORKER_IDLE_TIMEOUT', 'duration', NULL, NULL, true, 'How long a surplus worker idles before it is reaped'),
    ('dispatch', 'SPAWN_COOLDOWN', 'duration', NULL, NULL, true, 'How long a stage whose program cannot start is held off'),
    ('dispatch', 'STATS_INTERVAL', 'duration', NULL, NULL, true, 'How often the statistics are flushed'),
    ('dispatch', 'INIT_STAGE', 'stage', NULL, NULL, true, 'The stage of a new message'),
    ('ingress', 'AUTHSERV_ID', 'text', NULL, NULL, true, 'The authserv-id of Authentication-Results'),
    ('ingress', 'DISPATCH_WAKE_INTERVAL', 'duration', NULL, NULL, true, 'How often admissions wake the dispatcher'),
    ('ingress', 'USER', 'text', NULL, NULL, true, 'The user ingress runs as'),
    ('ingress', 'GROUP', 'text', NULL, NULL, true, 'The group ingress runs as'),
    ('ingress', 'CREDENTIALS', 'text', NULL, NULL, true, 'The file of SMTP AUTH credentials'),
    ('ingress', 'DATABASE_CONNECTIONS', 'integer', 1, 64, true, 'Connections admitting messages'),
    ('ingress', 'BATCH_SIZE', 'integer', 1, 1024, true, 'Admissions sent to the database at once'),
    ('ingress', 'INIT_STAGE', 'stage', NULL, NULL, true, 'The stage of a new message'),
    ('sendmail', 'INIT_STAGE', 'stage', NULL, NULL, true, 'The stage of a message pepsi-sendmail injects'),
    ('stage-*', 'PROGRAM', 'program', NULL, NULL, true, 'The stage program (its name, not a path)'),
    ('stage-*', 'NEXT_STAGE', 'stage', NULL, NULL, false, 'Where the stage advances a message'),
    ('stage-*', 'BOUNCE_STAGE', 'stage', NULL, NULL, false, 'Where the stage sends a message that failed permanently'),
    ('stage-*', 'PARALLELISM', 'integer', 1, 1024, true, 'Most workers of the stage at once'),
    ('stage-*', 'MAX_MESSAGES', 'integer', 1, 1099511627776, true, 'Messages after which a worker recycles its child'),
    ('stage-*', 'QUEUE_LIMIT', 'integer', 1, 1024, true, 'Messages pipelined to one worker at once'),
    ('stage-*', 'MAX_RUNTIME', 'duration', NULL, NULL, true, 'How long a worker may take before it is killed'),
    ('stage-*', 'MAX_LIFETIME', 'duration', NULL, NULL, false, 'Age after which a message still undelivered is bounced');

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
CREATE FUNCTION pepsi.config_validate(scope text, section text, option text, value text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text;
    known pepsi.config_option;
    closed boolean;
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
    IF section = 'database' THEN
        RAISE EXCEPTION 'section [database] cannot be overridden'
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = 'It is read from pepsi.conf before any database connection exists, so an override could never take effect.',
                  HINT = 'Change it in pepsi.conf.';
    END IF;
    IF section LIKE 'listener-%' THEN
        RAISE EXCEPTION 'section [%] cannot be overridden', section
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = 'Listener sections are read from pepsi.conf only, so that a compromised database cannot move a listening socket.',
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

    IF NOT EXISTS (SELECT FROM pepsi.config_option o
                   WHERE o.section = config_validate.section
                      OR (o.section LIKE '%*' AND config_validate.section LIKE replace(o.section, '*', '%'))) THEN
        SELECT string_agg(DISTINCT '[' || replace(o.section, '*', '<name>') || ']', ', ') INTO options
        FROM pepsi.config_option o;
        RAISE EXCEPTION 'unknown section [%]', section
            USING ERRCODE = 'undefined_object',
                  DETAIL = format('The sections an override may name are %s.', options);
    END IF;
    SELECT * INTO known FROM pepsi.config_option o
    WHERE o.option = config_validate.option
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
        -- a stage program's own option: its form only, or a stage it names
        known := NULL;
        IF option LIKE '%\_STAGE' THEN
            known.kind := 'stage';
        END IF;
    END IF;
    IF known.global_only AND canonical <> 'global' THEN
        RAISE EXCEPTION 'option % of [%] takes the global scope only', option, section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It is read once by a process, not per message, so an override for a domain or an address could never apply.',
                  HINT = 'Use the scope "global".';
    END IF;

    IF value IS NULL THEN
        RETURN canonical;
    END IF;
    IF value ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'value of % must be one line of text', option
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It contains a line break or another control character.';
    END IF;
    problem := CASE known.kind
        WHEN 'boolean' THEN
            CASE WHEN value !~* '^(yes|no|true|false|on|off|1|0)$'
                 THEN format('%s is a boolean: yes, no, true, false, on, off, 1 or 0.', option) END
        WHEN 'integer' THEN
            -- (CASE, not OR: the cast must not see a value that is no number)
            CASE WHEN CASE WHEN value !~ '^-?[0-9]{1,18}$' THEN true
                           ELSE NOT value::bigint BETWEEN coalesce(known.min_value, value::bigint)
                                                      AND coalesce(known.max_value, value::bigint) END
                 THEN format('%s is a whole number%s.', option,
                             CASE WHEN known.max_value IS NOT NULL
                                  THEN format(' from %s to %s', known.min_value, known.max_value)
                                  WHEN known.min_value IS NOT NULL
                                  THEN format(', at least %s', known.min_value)
                                  ELSE '' END) END
        WHEN 'duration' THEN
            CASE WHEN value !~ '^[0-9]{1,12}(\.[0-9]{1,9})?(ms|s|m|min|h|d)?$'
                 THEN format('%s is a duration: a number of seconds, or a number with the unit ms, s, m (or min), h or d, as in "30s", "1.5m" or "2h".', option) END
        WHEN 'stage' THEN
            CASE WHEN value !~ '^[a-z0-9_-]+$'
                 THEN format('%s names a stage, by its [stage-<name>] section: lower-case letters, digits, "_" and "-".', option) END
        WHEN 'program' THEN
            CASE WHEN value !~ '^[a-z0-9][a-z0-9._+-]*$'
                 THEN format('%s names a program: from the database it is a program name, never a path.', option) END
        WHEN 'domain' THEN
            CASE WHEN pepsi.config_domain_problem(value) IS NOT NULL
                 THEN format('%s is a domain name. %s', option, pepsi.config_domain_problem(value)) END
    END;
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

-- The policy: what each group role holds.  Functions are named without
-- their arguments (every overload gets the same grant); relations and
-- functions not named here are the owner's alone.
CREATE FUNCTION pepsi.grant_policy()
RETURNS TABLE (role name, object_kind text, object_name text, privileges text[])
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT r.role::name, p.object_kind, p.object_name, p.privileges
    FROM (VALUES
        ('pepsi_stage'), ('pepsi_ingress'), ('pepsi_config'), ('pepsi_monitor')) AS r (role)
    CROSS JOIN LATERAL (VALUES ('schema', 'pepsi', '{USAGE}'::text[])) AS p (object_kind, object_name, privileges)
    UNION ALL
    SELECT role::name, object_kind, object_name, privileges::text[] FROM (VALUES
        -- the pipeline: the queue through the native functions (which run
        -- with the caller's rights), its companions, the statistics
        ('pepsi_stage', 'table', 'workqueue', '{SELECT,INSERT,UPDATE,DELETE}'),
        ('pepsi_stage', 'table', 'workqueue_body', '{SELECT,INSERT,UPDATE,DELETE}'),
        -- (the claim's sender cache reads pending_seq's last value)
        ('pepsi_stage', 'sequence', 'pending_seq', '{USAGE,SELECT}'),
        ('pepsi_stage', 'table', 'stage_stats', '{SELECT,INSERT,UPDATE}'),
        ('pepsi_stage', 'table', 'dispatch_stats', '{SELECT,UPDATE}'),
        ('pepsi_stage', 'table', 'dns_address', '{SELECT,INSERT,UPDATE,DELETE}'),
        ('pepsi_stage', 'table', 'config_override', '{SELECT}'),
        ('pepsi_stage', 'table', 'config_option', '{SELECT}'),
        ('pepsi_stage', 'table', 'settings', '{SELECT}'),
        ('pepsi_stage', 'table', 'event_log', '{INSERT}'),
        ('pepsi_stage', 'table', 'mail_log', '{INSERT}'),
        ('pepsi_stage', 'function', 'workqueue_inject', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_commit', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_commit_many', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_pause', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_finish_with_clones', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_split', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_split_off', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_split_one_per_row', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_resume', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_recover', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_requeue_due', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_reset_orphans', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_body_gc', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'workqueue_claim', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'notify_workqueue', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'recipients_subset', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'state_for_recipients', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'config_get', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'config_validate', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'config_scope', '{EXECUTE}'),
        ('pepsi_stage', 'function', 'config_domain_problem', '{EXECUTE}'),
        -- ingress: admission (SMTP, and pepsi-sendmail's local submission
        -- through workqueue_inject), the out-of-band wake, its configuration
        ('pepsi_ingress', 'function', 'workqueue_add', '{EXECUTE}'),
        ('pepsi_ingress', 'function', 'workqueue_inject', '{EXECUTE}'),
        ('pepsi_ingress', 'function', 'notify_workqueue', '{EXECUTE}'),
        ('pepsi_ingress', 'table', 'config_override', '{SELECT}'),
        ('pepsi_ingress', 'table', 'config_option', '{SELECT}'),
        ('pepsi_ingress', 'function', 'config_get', '{EXECUTE}'),
        ('pepsi_ingress', 'function', 'config_validate', '{EXECUTE}'),
        ('pepsi_ingress', 'function', 'config_scope', '{EXECUTE}'),
        ('pepsi_ingress', 'function', 'config_domain_problem', '{EXECUTE}'),
        -- administration: the configuration, the audited queue actions,
        -- reading the queue (pepsi-queue list/show) and the logs
        ('pepsi_config', 'table', 'config_override', '{SELECT,INSERT,UPDATE,DELETE}'),
        ('pepsi_config', 'table', 'config_option', '{SELECT}'),
        ('pepsi_config', 'table', 'settings', '{SELECT,INSERT,UPDATE,DELETE}'),
        ('pepsi_config', 'table', 'event_log', '{SELECT,INSERT}'),
        ('pepsi_config', 'table', 'mail_log', '{SELECT}'),
        ('pepsi_config', 'table', 'workqueue', '{SELECT}'),
        ('pepsi_config', 'table', 'workqueue_body', '{SELECT}'),
        ('pepsi_config', 'table', 'stage_stats', '{SELECT}'),
        ('pepsi_config', 'table', 'dispatch_stats', '{SELECT}'),
        ('pepsi_config', 'view', 'queue_summary', '{SELECT}'),
        ('pepsi_config', 'view', 'queue_shape', '{SELECT}'),
        ('pepsi_config', 'view', 'queue_senders', '{SELECT}'),
        ('pepsi_config', 'function', 'queue_retry', '{EXECUTE}'),
        ('pepsi_config', 'function', 'queue_hold', '{EXECUTE}'),
        ('pepsi_config', 'function', 'queue_release', '{EXECUTE}'),
        ('pepsi_config', 'function', 'queue_delete', '{EXECUTE}'),
        ('pepsi_config', 'function', 'queue_bounce', '{EXECUTE}'),
        ('pepsi_config', 'function', 'config_set', '{EXECUTE}'),
        ('pepsi_config', 'function', 'config_unset', '{EXECUTE}'),
        ('pepsi_config', 'function', 'config_get', '{EXECUTE}'),
        ('pepsi_config', 'function', 'config_validate', '{EXECUTE}'),
        ('pepsi_config', 'function', 'config_scope', '{EXECUTE}'),
        ('pepsi_config', 'function', 'config_domain_problem', '{EXECUTE}'),
        ('pepsi_config', 'function', 'event_log_write', '{EXECUTE}'),
        ('pepsi_config', 'function', 'event_principal', '{EXECUTE}'),
        ('pepsi_config', 'function', 'queue_summary_rows', '{EXECUTE}'),
        ('pepsi_config', 'function', 'queue_shape_rows', '{EXECUTE}'),
        ('pepsi_config', 'function', 'queue_senders_rows', '{EXECUTE}'),
        ('pepsi_config', 'function', 'recipient_domain', '{EXECUTE}'),
        -- monitoring: aggregates only
        ('pepsi_monitor', 'view', 'queue_summary', '{SELECT}'),
        ('pepsi_monitor', 'view', 'queue_shape', '{SELECT}'),
        ('pepsi_monitor', 'view', 'queue_senders', '{SELECT}'),
        ('pepsi_monitor', 'function', 'queue_summary_rows', '{EXECUTE}'),
        ('pepsi_monitor', 'function', 'queue_shape_rows', '{EXECUTE}'),
        ('pepsi_monitor', 'function', 'queue_senders_rows', '{EXECUTE}'),
        ('pepsi_monitor', 'function', 'recipient_domain', '{EXECUTE}'),
        ('pepsi_monitor', 'table', 'stage_stats', '{SELECT}'),
        ('pepsi_monitor', 'table', 'dispatch_stats', '{SELECT}'))
        AS g (role, object_kind, object_name, privileges)
$$;

-- The functions that run as the owner, and the search_path they pin (so
-- that a caller's search_path cannot substitute an object of its own).
CREATE FUNCTION pepsi.grant_definer_functions() RETURNS SETOF text
LANGUAGE sql IMMUTABLE AS $$
    VALUES ('workqueue_add'), ('workqueue_inject'), ('queue_retry'), ('queue_hold'), ('queue_release'),
           ('queue_delete'), ('queue_bounce'),
           ('queue_summary_rows'), ('queue_shape_rows'), ('queue_senders_rows')
$$;

-- The functions and relations no group role may use, the owner's alone:
-- the grants machinery, internal helpers, the maintenance worker's
-- starter.  (Trigger functions and identity sequences are the owner's
-- too, without being named.)  Every other object of the schema must be
-- named in grant_policy(); grant_verify() reports one that is in neither,
-- so that an object added without a grant shows up as drift instead of as
-- a permission error in production.
CREATE FUNCTION pepsi.grant_owner_only() RETURNS SETOF text
LANGUAGE sql IMMUTABLE AS $$
    VALUES ('apply_grants'), ('grant_apply'), ('grant_verify'), ('grant_expected'),
           ('grant_policy'), ('grant_definer_functions'), ('grant_owner_only'),
           ('grant_object_name'), ('queue_lock_rows'), ('start_maintenance')
$$;

-- The relations and functions of the schema with what grant_policy() wants
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
    roles AS (SELECT DISTINCT g.role FROM pepsi.grant_policy() g
              WHERE EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role))
    SELECT r.role, o.classid, o.objid, o.kind, a.privilege,
           EXISTS (SELECT FROM pepsi.grant_policy() g
                   WHERE g.role = r.role AND g.object_kind = o.object_kind
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

    EXECUTE 'REVOKE ALL ON SCHEMA pepsi FROM PUBLIC, pepsi_stage, pepsi_ingress, pepsi_config, pepsi_monitor';
    FOR item IN
        SELECT c.oid::regclass AS relation, c.relkind = 'S' AS is_sequence
        FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
    LOOP
        EXECUTE format('REVOKE ALL ON %s %s FROM PUBLIC, pepsi_stage, pepsi_ingress, pepsi_config, pepsi_monitor',
                       CASE WHEN item.is_sequence THEN 'SEQUENCE' ELSE 'TABLE' END, item.relation);
    END LOOP;
    FOR item IN SELECT p.oid::regprocedure AS routine FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
    LOOP
        EXECUTE format('REVOKE ALL ON ROUTINE %s FROM PUBLIC, pepsi_stage, pepsi_ingress, pepsi_config, pepsi_monitor',
                       item.routine);
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
                            AND has_any_column_privilege(e.role, e.objid, e.privilege))
               END AS actual
        FROM pepsi.grant_expected() e),
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
                                WHERE r.rolname IN (SELECT g.role FROM pepsi.grant_policy() g))),
    unclassified AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
          AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype = 'i')
          AND c.relname NOT IN (SELECT g.object_name FROM pepsi.grant_policy() g)
          AND c.relname NOT IN (SELECT * FROM pepsi.grant_owner_only())
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p
        WHERE p.pronamespace = 'pepsi'::regnamespace AND p.prorettype <> 'trigger'::regtype
          AND p.proname NOT IN (SELECT g.object_name FROM pepsi.grant_policy() g)
          AND p.proname NOT IN (SELECT * FROM pepsi.grant_owner_only())),
    definers AS (
        SELECT p.oid AS objid, p.proname IN (SELECT * FROM pepsi.grant_definer_functions()) AS wanted,
               p.prosecdef,
               coalesce('search_path=pg_catalog, pepsi, pg_temp' = ANY (p.proconfig), false) AS pinned
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace)
    SELECT c.grantee, pepsi.grant_object_name(c.classid, c.objid, 0), c.privilege, c.expected, c.actual
    FROM checked c WHERE c.expected <> c.actual
    UNION ALL
    SELECT DISTINCT g.role::text, 'role ' || g.role, 'exists', true, false
    FROM pepsi.grant_policy() g WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role)
    UNION ALL
    SELECT s.grantee, pepsi.grant_object_name(s.classid, s.objid, s.subid), s.privilege, false, true
    FROM strangers s
    UNION ALL
    SELECT NULL, pepsi.grant_object_name(u.classid, u.objid, 0), 'named in grant_policy()', true, false
    FROM unclassified u
    UNION ALL
    SELECT DISTINCT NULL, g.object_kind || ' pepsi.' || g.object_name, 'exists', true, false
    FROM pepsi.grant_policy() g
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

-- At creation, apply and verify the grants; drift already (a group role
-- that existed before and is a member of another, say) fails CREATE
-- EXTENSION rather than leaving a boundary open.  An object missing from
-- the policy does not, nor a name in the policy that is missing from the
-- schema: no role can use the one, no role needs the other, and
-- pepsi.apply_grants() (and the regression suite) report both.  Not logged: nobody administered
-- anything yet.
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
