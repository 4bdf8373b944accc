/*
 * pepsi 0.6 -> 0.7: the schema changes made since 0.6.
 *
 * 0.6 was released with TLS reports and pruning, owner settings and the
 * dispatcher's own role; every schema change since is a block here, placed
 * before the final UPDATE of pepsi.schema_version, and folded into
 * pepsi--0.7.sql (new objects at its end).  An existing 0.6 database
 * reaches 0.7 with ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi
 * installs pepsi--0.7.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every
 * statement safe on a live queue) is the one pepsi--0.1--0.2.sql describes
 * and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.7'" to load this file. \quit

-- ============================================================================
-- Dispatcher stage sets: a dispatcher that serves only the stages of its
-- [dispatch] STAGES resets only those stages' orphaned rows at start; the
-- rows another dispatcher's workers hold at other stages are not orphans.
-- The one-argument form stays for the dispatcher that serves every stage.
-- The grant rule on workqueue_reset_orphans (pepsi_dispatch) covers both.
CREATE FUNCTION pepsi.workqueue_reset_orphans(except_ids bigint[], stages text[])
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_reset_orphans' LANGUAGE C CALLED ON NULL INPUT;
SELECT pepsi.grant_apply();
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
    released_by text CHECK (released_by IN ('reply', 'link'))
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
--                           one is to be sent now: only when verified
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
-- secretary_expire joins the calls a schedule may make.
CREATE OR REPLACE FUNCTION pepsi.schedule_functions(OUT name text, OUT arguments text, OUT description text)
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
            'Delete the mail the secretary held whose HOLD_TIME is up: pepsi-stage-check-whitelist(8)')
$$;

-- Check a call's arguments as the call would read them; raise naming the
-- problem.  Used by schedule_add (so a bad row is refused when it is
-- added, not found failing at 3 a.m.) and again by schedule_call.
CREATE OR REPLACE FUNCTION pepsi.schedule_check_call(function_name text, arguments jsonb) RETURNS void
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
    ELSIF function_name IN ('dmarc_aggregate_prune', 'tls_aggregate_prune', 'greylist_prune', 'send_count_prune') THEN
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
CREATE OR REPLACE FUNCTION pepsi.schedule_call(function_name text, arguments jsonb) RETURNS text
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
    END CASE;
END
$$;

SELECT pepsi.grant_apply();
-- end of the confirm-to-send secretary

-- ===========================================================================
-- The key store: end-to-end encryption's keys
--
-- (The tables and grants as pepsi--0.7.sql's block of that name says.)
-- Column-level grants come to the grants machinery with it:
-- pepsi.grant_column names a role's privilege on every column of a table
-- but those withheld, grant_apply() grants it and grant_verify() checks it
-- column by column.
-- ===========================================================================

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
INSERT INTO pepsi.grant_owner (name) VALUES ('grant_column');

CREATE OR REPLACE FUNCTION pepsi.grant_apply() RETURNS void
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

CREATE OR REPLACE FUNCTION pepsi.grant_verify()
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
               EXISTS (SELECT FROM pepsi.grant_policy() g
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
        CROSS JOIN (SELECT DISTINCT g.role FROM pepsi.grant_policy() g
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
    SELECT c.grantee, pepsi.grant_object_name('pg_class'::regclass, c.objid, c.attnum), c.privilege, c.expected, c.actual
    FROM columns c WHERE c.expected <> c.actual
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
                                                   'keyserver', 'autocrypt', 'import')),
    dnssec         boolean NOT NULL DEFAULT false,
    verdict        text NOT NULL DEFAULT 'unchecked'
                   CHECK (verdict IN ('unchecked', 'valid', 'expired', 'revoked', 'mismatch', 'untrusted', 'invalid')),
    verdict_reason text,
    prefer_encrypt boolean NOT NULL DEFAULT false,
    expires_at     timestamptz,
    fetched_at     timestamptz NOT NULL DEFAULT now(),
    cache_until    timestamptz NOT NULL,
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
SELECT pepsi.grant_apply();
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
    updated_at    timestamptz NOT NULL DEFAULT now()
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

-- The addresses at or over a limit: what pepsi-ingress answers 452 for.
CREATE FUNCTION pepsi.quota_full() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT u.address FROM pepsi.quota_usage u WHERE pepsi.quota_is_full(u.address)
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
SELECT pepsi.grant_apply();
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
    dmarc_mitigation text NOT NULL DEFAULT 'from' CHECK (dmarc_mitigation IN ('from', 'none')),
    bounce_threshold real NOT NULL DEFAULT 5 CHECK (bounce_threshold > 0),
    bounce_reset     interval NOT NULL DEFAULT '30 days' CHECK (bounce_reset > interval '0'),
    unsubscribe_url  text CHECK (unsubscribe_url ~ '^https?://[^\s?#]+$'),
    secret           bytea NOT NULL DEFAULT decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'),
    created_at       timestamptz NOT NULL DEFAULT now()
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
        'dmarc_mitigation', l.dmarc_mitigation, 'unsubscribe_url', l.unsubscribe_url);
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
-- list-bounces@.  Only subscribers who take each message.
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
                ORDER BY m.address)
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
    DELETE FROM pepsi.list_pending p WHERE p.expires_at < now() - interval '1 day';
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
                       'dmarc_mitigation', 'bounce_threshold', 'bounce_reset', 'unsubscribe_url') THEN
        RAISE EXCEPTION 'a list has no setting "%"', setting USING ERRCODE = 'invalid_parameter_value',
            HINT = 'The settings: description, posting_policy, subject_tag, header_text, footer_text, verp, '
                   'dmarc_mitigation, bounce_threshold, bounce_reset, unsubscribe_url.';
    END IF;
    IF value IS NULL THEN
        EXECUTE format('UPDATE pepsi.mailing_list SET %I = DEFAULT WHERE id = $1', setting) USING list;
    ELSE
        EXECUTE format('UPDATE pepsi.mailing_list SET %I = $2::%s WHERE id = $1', setting,
                       CASE setting WHEN 'verp' THEN 'boolean' WHEN 'bounce_threshold' THEN 'real'
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
    ('list_confirm'), ('list_unsubscribe_one_click'), ('list_bounce_record'), ('list_owners'), ('list_create'),
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
SELECT pepsi.grant_apply();
-- end of mailing lists

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
-- ===========================================================================
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_whitelist', 'Pepsi: pepsi-whitelist (set-user-id, peer authentication): a local user''s own whitelist only');
SELECT pepsi.grant_roles_create();
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_whitelist', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_whitelist', 'function', 'whitelist_add', '{EXECUTE}'),
    ('pepsi_whitelist', 'function', 'whitelist_remove', '{EXECUTE}'),
    ('pepsi_whitelist', 'function', 'whitelist_list', '{EXECUTE}');
SELECT pepsi.grant_apply();
-- end of pepsi-whitelist

UPDATE pepsi.schema_version SET version = '0.7';
