/*
 * pepsi 0.11 -> 0.12: the schema changes made since 0.11.
 *
 * 0.11 was released with the portal link's bounded opens, the archive's
 * word pairs in C and the grants' cheaper check; every schema change since
 * is a block here, placed before the final UPDATE of pepsi.schema_version,
 * and folded into pepsi--0.12.sql (new objects at its end).  An existing
 * 0.11 database reaches 0.12 with ALTER EXTENSION pepsi UPDATE; CREATE
 * EXTENSION pepsi installs pepsi--0.12.sql.  Both paths must end in the
 * same schema: t/003_extension_upgrade.pl compares their catalogs and
 * tests the upgrade with a filled queue.  The scheme (blocks, grants as
 * data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.12'" to load this file. \quit

-- ===========================================================================
-- The secretary's held row made cheaper (issue 39)
--
-- bench/secretary: the secretary side's decisions fell behind ingress
-- (the ratio to the plain side just under the target 0.80).  Two causes
-- that the statements' times showed:
--
-- pepsi.secretary_decide_many waited, inside the batch's transaction,
-- for another batch that was opening (or sending) the challenge of a
-- pair it also had rows of, until that batch committed; its own
-- decisions (other pairs' new challenges among them) stayed uncommitted
-- all that time, and further batches waited for it in turn.  It now
-- takes a transaction-level advisory lock for each pair it decides row
-- by row, and leaves a pair whose lock another batch holds undecided (a
-- null answer, for the rows the stage marks may_defer), for
-- pepsi-stage-check-whitelist to decide alone after the batch's commit.
--
-- The hold rewrites the queue row (not a HOT update: index_status,
-- named by every partial index's predicate, goes from pending to
-- paused), with an entry in every index whose predicate the held row
-- meets.  workqueue_paused_due, the due-time scan's index, now leaves out
-- the rows held without a time (timeout 'infinity'), which are never
-- due: one index entry fewer a held row (pepsi.workqueue_requeue_due
-- names the predicate).  Rebuilt at the upgrade: a short lock of the
-- queue while its rows in flight are indexed again.
-- ===========================================================================

DROP INDEX pepsi.workqueue_paused_due;
-- The due-time scan of paused rows (timeout is set on paused rows only).
-- A row held without a time (timeout 'infinity': the secretary's held
-- mail, pepsi.queue_hold) is never due: it has no entry, so its hold
-- writes one index entry fewer (bench/secretary).
CREATE INDEX workqueue_paused_due ON pepsi.workqueue (timeout) WHERE timeout < 'infinity';

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
-- end of the secretary's held row made cheaper

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
-- challenge's sender as the payer anyway.
-- ===========================================================================

-- Is challenge an open challenge of owner's: sent (challenged_at, so its
-- payment request went out), not released, not expired?
CREATE FUNCTION pepsi.secretary_challenge_open(owner text, challenge bigint) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT EXISTS (SELECT FROM pepsi.secretary_challenge c
                   WHERE c.id = secretary_challenge_open.challenge
                     AND c.owner = pepsi.secretary_address(secretary_challenge_open.owner)
                     AND c.challenged_at IS NOT NULL AND c.released_at IS NULL AND c.expires_at > now())
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'secretary_challenge_open', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('secretary_challenge_open');
SELECT pepsi.grant_apply();
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
CREATE OR REPLACE FUNCTION pepsi.archive_search(list bigint, query text, max_rows integer DEFAULT 50)
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

INSERT INTO pepsi.grant_owner (name) VALUES ('archive_excerpt');
SELECT pepsi.grant_apply();
-- end of the archive's search excerpts in C

UPDATE pepsi.schema_version SET version = '0.12';
