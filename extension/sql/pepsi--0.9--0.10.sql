/*
 * pepsi 0.9 -> 0.10: the schema changes made since 0.9.
 *
 * 0.9 was released with auto-pay's claim by id, the keydisc index, the
 * secure-link portal, the archive's search index and batched import with
 * the digest command, and the secretary's batch hold; every schema change
 * since is a block here, placed before the final UPDATE of
 * pepsi.schema_version, and folded into pepsi--0.10.sql (new objects at
 * its end).  An existing 0.9 database reaches 0.10 with ALTER EXTENSION
 * pepsi UPDATE; CREATE EXTENSION pepsi installs pepsi--0.10.sql.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue.  The scheme
 * (blocks, grants as data, every statement safe on a live queue) is the
 * one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.10'" to load this file. \quit

-- ===========================================================================
-- The secretary's batch, set-based (bench/secretary)
--
-- pepsi.secretary_decide_many reads the whitelist once for the batch,
-- takes each pair (owner, sender) once in that order, and a pair whose
-- rows only wait under its open challenge is one lookup whatever its
-- number of rows; the rows held are recorded and held with one statement
-- each instead of a pepsi.workqueue_commit a row.  pepsi.secretary_decide
-- joins a challenge another batch opened meanwhile FOR SHARE when its row
-- only waits under it.  Same answers, same guarantees (one transaction,
-- nothing held on a stale claim).
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
CREATE OR REPLACE FUNCTION pepsi.secretary_decide_many(rows jsonb, ttl interval, max_per_hour integer)
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
    FOR p IN SELECT u.k, u.f, bool_and(u.w) AS waits, array_agg(u.o ORDER BY u.o) AS os
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

-- end of the secretary's batch, set-based

UPDATE pepsi.schema_version SET version = '0.10';
