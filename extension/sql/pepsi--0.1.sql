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
    PRIMARY KEY (scope, section, option)
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
