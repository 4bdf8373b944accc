/*
 * pepsi 0.3 -> 0.4: the schema changes made since 0.3.
 *
 * An existing 0.3 database reaches 0.4 with ALTER EXTENSION pepsi UPDATE;
 * CREATE EXTENSION pepsi installs pepsi--0.4.sql, the whole of 0.4.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue.  The scheme
 * (blocks, grants as data, every statement safe on a live queue) is the
 * one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.4'" to load this file. \quit

-- ===========================================================================
-- Claim tokens: a stage changes only the rows it was handed
-- ===========================================================================

-- The digest of each running row's claim token (nullable, no default: no
-- rewrite of the queue; the rows in flight keep NULL, which the
-- transitions without a token, those of the running programs, match).
ALTER TABLE pepsi.workqueue ADD COLUMN claim_digest bytea;

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
-- destination table only through the functions, which run as the owner.
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'workqueue_claim_tokens', '{EXECUTE}');
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
-- pepsi_stage keeps SELECT (the stage runtime's row load) and loses
-- INSERT, UPDATE and DELETE on the tables the functions above write.
UPDATE pepsi.grant_rule SET privileges = '{SELECT}'
WHERE role = 'pepsi_stage' AND object_kind = 'table'
  AND object_name IN ('destination', 'dns_address', 'workqueue', 'workqueue_body');

-- The recovery of running rows (workqueue_crashed, workqueue_recover,
-- workqueue_reset_orphans) refuses a session without the one-dispatcher
-- advisory lock, unless a superuser calls it: a stage worker, a member of
-- the same role, must not put another worker's row back to be claimed.
CREATE FUNCTION pepsi.dispatcher_check(what text) RETURNS void
    AS 'MODULE_PATHNAME', 'dispatcher_check' LANGUAGE C;
INSERT INTO pepsi.grant_owner (name) VALUES ('dispatcher_check');

CREATE OR REPLACE FUNCTION pepsi.workqueue_recover(
    ids bigint[], expected_stages text[], new_status pepsi.status, reason text DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql AS $$
BEGIN
    RETURN pepsi.workqueue_recover(ids, expected_stages, new_status, reason, NULL::uuid[]);
END;
$$;

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
SELECT pepsi.grant_apply();
-- end of claim tokens

UPDATE pepsi.schema_version SET version = '0.4';
