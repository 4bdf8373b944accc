/*
 * pepsi 0.12 -> 0.13: the schema changes made since 0.12.
 *
 * 0.12 was released with the secretary's cheaper held row, the proof of
 * payment checked against an open challenge and the archive's excerpt in
 * C; every schema change since is a block here, placed before the final
 * UPDATE of pepsi.schema_version, and folded into pepsi--0.13.sql (new
 * objects at its end).  An existing 0.12 database reaches 0.13 with ALTER
 * EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi installs pepsi--0.13.sql.
 * Both paths must end in the same schema: t/003_extension_upgrade.pl
 * compares their catalogs and tests the upgrade with a filled queue.  The
 * scheme (blocks, grants as data, every statement safe on a live queue)
 * is the one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.13'" to load this file. \quit

-- ===========================================================================
-- An unguessable order reference for each challenge (issue 39)
--
-- The order a challenge's payment request named was pepsi-ID, ID the
-- challenge's sequential id: anyone could guess an open one and send a
-- well-formed Payment-Proof: naming it, and the stage ran the owner's
-- PAYMENT_VERIFY_COMMAND for it (a process, perhaps a call to the
-- payment service) up to its time limit, as often as they sent mail, or
-- probed which challenges are open.  Each challenge now has an order
-- reference of 128 bits from the server's strong random source (the
-- SHA-256 of two gen_random_uuid()s, 244 bits of pg_strong_random, cut
-- to 16 bytes), made in the database when the challenge is opened and
-- kept in its row (order_ref, 32 lower-case hexadecimal digits); its
-- payment request names the order pepsi-ID-REFERENCE (secretary_decide
-- returns the reference with the new challenge's token), and
-- pepsi.secretary_challenge_open, which the stage asks before it judges
-- a proof, now takes the reference and says yes only when it is that
-- open challenge's (compared as hashes, so in time that says nothing of
-- it).  A proof naming a wrong reference, or none, is not paid and the
-- verifier is not run.
--
-- The challenges open at the update keep no reference (order_ref NULL):
-- their payment requests went out naming pepsi-ID, and a sender may have
-- paid that order already, or pay it before HOLD_TIME is up; a postmaster
-- would not have the update turn a paid order into held mail that then
-- expires, money taken.  So pepsi-ID is still accepted, for exactly those
-- challenges (named by id alone, and only while open), and for no
-- challenge opened or first sent from 0.13 on: one opened before and
-- only sent now (its sender was unproven until now) gets its reference
-- then.  What stays guessable is bounded: the ids of the challenges open
-- at the update, which expire within HOLD_TIME, and a proof for them is
-- still judged only while the challenge is open.  The old two-argument
-- secretary_challenge_open is dropped: a stage of 0.12 still running
-- fails a message carrying a Payment-Proof: with an error naming it
-- until it is restarted on the new binaries (step 3 of the upgrade).
-- ===========================================================================

ALTER TABLE pepsi.secretary_challenge ADD COLUMN IF NOT EXISTS order_ref text
    CHECK (order_ref ~ '^[0-9a-f]{32}$');
ALTER TABLE pepsi.secretary_challenge ALTER COLUMN order_ref
    SET DEFAULT encode(substr(sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')), 1, 16), 'hex');

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

DROP FUNCTION IF EXISTS pepsi.secretary_challenge_open(text, bigint);
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

SELECT pepsi.grant_apply();
-- end of an unguessable order reference for each challenge

-- ===========================================================================
-- The archive's search pages and counts at 100,000 messages (issue 40)
--
-- Once the excerpts were in C (0.12), SQL was still called once a row
-- of a search page: archive_search_key, checked on each row of a page
-- walked in date order (a common word's, a phrase's: some 900 rows for
-- a phrase in 10% of the messages), a SQL call, a search_path set and
-- tsvector_concat copying the message's 10 KB tsvector; and
-- archive_obfuscated, three regular expressions a row (the subject, the
-- sender, the excerpt) through a SQL function that set its search_path
-- at each call.  Both are in C now (extension/src/archive_search.c), with the
-- same results: the key the same tsvector (the index built on it stays
-- as it is), the obfuscation the same text in one pass, none at all for
-- a text without an '@'.  archive_obfuscated's COST 100 keeps it after a
-- page's sort and LIMIT, as the SQL function's default cost did.  The
-- count (archive_search_count) takes no parallel worker.
-- archive_search_pattern and archive_excerpt_window, the excerpt's
-- window before archive_excerpt (0.12), are called by nothing: they go.
-- ===========================================================================

CREATE OR REPLACE FUNCTION pepsi.archive_search_key(list bigint, search tsvector) RETURNS tsvector
    AS 'MODULE_PATHNAME', 'archive_search_key' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE COST 10000;

CREATE OR REPLACE FUNCTION pepsi.archive_obfuscated(obfuscation text, shown text) RETURNS text
    AS 'MODULE_PATHNAME', 'archive_obfuscated' LANGUAGE C IMMUTABLE PARALLEL SAFE COST 100;

-- archive_search_count takes no parallel worker: archive_search_key's
-- COST is charged for each row of the index's bitmap as if it were
-- checked, so a common word's or a phrase's count looked worth a worker,
-- where the bitmap's rows are counted in a few milliseconds and starting
-- the worker took longer (50,000 messages: w0's count 36 ms with a worker,
-- 6.5 ms without; "w0 w1" 31 ms, 2 ms).
ALTER FUNCTION pepsi.archive_search_count(bigint, text) SET max_parallel_workers_per_gather = 0;

DROP FUNCTION IF EXISTS pepsi.archive_search_pattern(text);
DROP FUNCTION IF EXISTS pepsi.archive_excerpt_window(text, text);
DELETE FROM pepsi.grant_owner WHERE name IN ('archive_search_pattern', 'archive_excerpt_window');
SELECT pepsi.grant_apply();
-- end of the archive's search pages and counts at 100,000 messages

UPDATE pepsi.schema_version SET version = '0.13';
