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
-- pepsi.secretary_decide takes the pair's challenge FOR SHARE when the
-- message only waits under it (challenged, in time, no token to try),
-- so batches holding the same pair's mail, whose transactions are now
-- longer, do not wait for each other's commit.
-- ===========================================================================

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
--                           one is to be sent now: only when verified
--                           (the stage found the sender's address proven
--                           and the message one an auto-reply may
--                           answer), no challenge of the pair is open yet
--                           (or its mail came unverified), and the owner
--                           sent fewer than max_per_hour in the last hour.
-- ttl is how long held mail waits for its release.
CREATE OR REPLACE FUNCTION pepsi.secretary_decide(owner text, sender text, row_id bigint, verified boolean,
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
            -- Another message of the pair opened it meanwhile: join that one.
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
        ELSE
            new_token := NULL;
        END IF;
    END IF;
    INSERT INTO pepsi.secretary_held (row_id, challenge_id) VALUES (row_id, challenge.id)
    ON CONFLICT ON CONSTRAINT secretary_held_pkey DO UPDATE SET challenge_id = excluded.challenge_id;
    RETURN jsonb_build_object('action', 'hold', 'token', new_token, 'challenge', challenge.id,
                              'expires_at', challenge.expires_at,
                              'why', CASE WHEN new_token IS NOT NULL THEN 'challenged'
                                          WHEN NOT verified THEN 'not verified: no challenge'
                                          WHEN challenge.challenged_at IS NOT NULL THEN 'challenged before'
                                          ELSE format('%s challenges in the last hour (MAX_CHALLENGES_PER_HOUR)',
                                                      sent_last_hour) END);
END
$$;

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
