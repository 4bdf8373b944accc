/*
 * pepsi 0.14 -> 0.15: the schema changes made since 0.14.
 *
 * 0.14 was released with the archive's import linear at 100,000 messages
 * and a list's VERP fan-out grouped by destination domain; every schema
 * change since is a block here, placed before the final UPDATE of
 * pepsi.schema_version, and folded into pepsi--0.15.sql (new objects at
 * its end).  An existing 0.14 database reaches 0.15 with ALTER EXTENSION
 * pepsi UPDATE; CREATE EXTENSION pepsi installs pepsi--0.15.sql.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue.  The scheme
 * (blocks, grants as data, every statement safe on a live queue) is the
 * one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.15'" to load this file. \quit

-- ===========================================================================
-- destination_end: the TLS result of a new destination written by one worker (issue 40)
--
-- The workers that start on a domain at once (a list's VERP fan-out,
-- grouped by domain) all found no pepsi.destination row, and each one's
-- INSERT ... ON CONFLICT DO NOTHING waited for the first one's commit
-- (6.9 ms a call in bench/list) to write nothing.  Now one of them writes
-- it, under a transaction-level advisory lock the others skip.
-- ===========================================================================
CREATE OR REPLACE FUNCTION pepsi.destination_end(domain text, slot integer, outcome text, error text,
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
-- CREATE OR REPLACE resets what grant_apply sets on a definer function
-- (SECURITY DEFINER, its search_path): set again.
SELECT pepsi.grant_apply();
-- end of destination_end: the TLS result of a new destination written by one worker

UPDATE pepsi.schema_version SET version = '0.15';
