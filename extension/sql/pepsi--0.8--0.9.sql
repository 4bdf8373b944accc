/*
 * pepsi 0.8 -> 0.9: the schema changes made since 0.8.
 *
 * 0.8 was released with auto-pay, the lists' archive and digests, S/MIME
 * and key discovery, and the telemetry tables; every schema change since
 * is a block here, placed before the final UPDATE of pepsi.schema_version,
 * and folded into pepsi--0.9.sql (new objects at its end).  An existing
 * 0.8 database reaches 0.9 with ALTER EXTENSION pepsi UPDATE; CREATE
 * EXTENSION pepsi installs pepsi--0.9.sql.  Both paths must end in the
 * same schema: t/003_extension_upgrade.pl compares their catalogs and
 * tests the upgrade with a filled queue.  The scheme (blocks, grants as
 * data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.9'" to load this file. \quit

-- ===========================================================================
-- The secretary's hold in its batch's transaction
--
-- pepsi.secretary_decide_many also holds the rows it decides to hold when
-- the stage passes each row's claim ("hold": pepsi_hold_args), in the
-- transaction that records the decision: one commit for a batch of
-- pepsi-stage-check-whitelist where each held row had a commit of its own
-- after the batch's decision (bench/secretary), and no row is ever
-- recorded as held without being held.  The signature is unchanged.
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
-- fails and nothing of the batch is decided or held.
CREATE OR REPLACE FUNCTION pepsi.secretary_decide_many(rows jsonb, ttl interval, max_per_hour integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r record;
    answer jsonb;
    answers jsonb[];
BEGIN
    IF jsonb_typeof(rows) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the rows to decide must be a JSON array, not %', coalesce(jsonb_typeof(rows), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(rows) = 0 THEN
        RETURN '[]';
    END IF;
    answers := array_fill(NULL::jsonb, ARRAY[jsonb_array_length(rows)]);
    FOR r IN SELECT a.e, a.o FROM jsonb_array_elements(rows) WITH ORDINALITY AS a (e, o)
             ORDER BY pepsi.secretary_address(a.e->>'owner'), lower(coalesce(a.e->>'sender', '')), a.o
    LOOP
        answer := pepsi.secretary_decide(r.e->>'owner', r.e->>'sender', (r.e->>'row_id')::bigint,
                                         coalesce((r.e->>'verified')::boolean, false), r.e->>'token',
                                         coalesce((r.e->>'look_in_text')::boolean, false),
                                         ttl, max_per_hour);
        IF answer->>'action' = 'hold' AND jsonb_typeof(r.e->'hold') = 'object' THEN
            PERFORM pepsi.workqueue_commit((r.e->>'row_id')::bigint, r.e->'hold'->>'expected_stage', 'pause',
                NULL, CASE WHEN jsonb_typeof(r.e->'hold'->'merge') = 'object' THEN r.e->'hold'->'merge'
                           ELSE '{}' END
                      || jsonb_build_object('secretary', jsonb_build_object('owner', r.e->>'owner',
                                                                             'challenge', answer->'challenge')),
                'Infinity', NULL, NULL, NULL, NULL, NULL, r.e->'hold'->>'at_stage',
                (r.e->'hold'->>'claim_token')::uuid);
            answer := answer || '{"held": true}';
        END IF;
        answers[r.o] := answer;
    END LOOP;
    RETURN to_jsonb(answers);
END
$$;

SELECT pepsi.grant_apply();
-- end of the secretary's hold in its batch's transaction

UPDATE pepsi.schema_version SET version = '0.9';
