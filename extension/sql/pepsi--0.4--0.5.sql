/*
 * pepsi 0.4 -> 0.5: the schema changes made since 0.4.
 *
 * 0.4 was released with the claim tokens, the queue id and the web page's
 * history; every schema change since is a block here, placed before the
 * final UPDATE of pepsi.schema_version, and folded into pepsi--0.5.sql (new
 * objects at its end).  An existing 0.4 database reaches 0.5 with ALTER
 * EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi installs pepsi--0.5.sql.
 * Both paths must end in the same schema: t/003_extension_upgrade.pl
 * compares their catalogs and tests the upgrade with a filled queue.  The
 * scheme (blocks, grants as data, every statement safe on a live queue) is
 * the one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.5'" to load this file. \quit

-- ===========================================================================
-- DANE/TLS results per destination (pepsi-stage-relay-to-internet)
--
-- The relay records, per destination domain, the TLS policy its last
-- delivery was made under (dane, dane-encrypt, sts enforce, sts testing,
-- opportunistic) and what it gave ("dane verified (usage 3)", or why it
-- failed), in pepsi.destination, through destination_end, which records
-- the delivery's outcome anyway: written only when they change, so a
-- healthy destination still costs no write per message.  The web page's
-- destinations view (destination_overview) shows them, and lists every
-- destination with a TLS result, not only those in trouble.
-- ===========================================================================
ALTER TABLE pepsi.destination
    ADD COLUMN tls_policy text,
    ADD COLUMN tls_outcome text,
    ADD COLUMN tls_at timestamptz;
COMMENT ON COLUMN pepsi.destination.tls_policy IS
    'The TLS policy the last delivery here was made under: dane, dane-encrypt, sts enforce, sts testing or opportunistic';
COMMENT ON COLUMN pepsi.destination.tls_outcome IS
    'What that policy gave: e.g. "dane verified (usage 3)", "opportunistic unverified", or why it failed';
COMMENT ON COLUMN pepsi.destination.tls_at IS
    'When tls_policy and tls_outcome were last written (only a change is written)';

DROP FUNCTION pepsi.destination_end(text, integer, text, text, text, inet, text[], inet[], integer,
                                    double precision, double precision, double precision);
-- The end of a delivery to domain: the slot is freed and what was seen
-- recorded.  outcome: 'connected' (a host took the session), 'unreachable'
-- (no address of any MX could be reached: the destination's consecutive
-- failures grow, and from backoff_after on it backs off as a whole,
-- backoff_base doubling up to backoff_max seconds), 'busy' (refused while
-- other workers deliver to it: its concurrency window narrows to those).
-- failed_hosts/failed_addresses are the addresses that did not answer,
-- ok_host/ok_address the one that did; seconds, how long the delivery
-- took (kept as the pace of a destination that has a queue of waiters);
-- tls_policy and tls_outcome, the TLS policy the delivery was made under
-- and what it gave (NULL: not known), written only when they change.
-- Returns whether the destination is contended.
CREATE FUNCTION pepsi.destination_end(domain text, slot integer, outcome text, error text,
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
        IF NOT FOUND AND destination_end.tls_policy IS NOT NULL THEN
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

DROP FUNCTION pepsi.destination_overview(integer);
-- The destinations the page shows: those with mail waiting to be retried,
-- a delivery failure remembered or a TLS result recorded, with their last
-- error (the destination's, else the newest waiting message's), the TLS
-- policy of their last delivery and what it gave (else the MTA-STS policy
-- the relay holds for them, as "sts <mode>").  Reads the queue's paused
-- rows, on demand.
CREATE FUNCTION pepsi.destination_overview(max_rows integer DEFAULT 100)
RETURNS TABLE (domain text, deferred bigint, failures integer, backoff_until timestamptz,
               last_error text, last_success timestamptz, concurrency_limit integer,
               messages_per_minute integer, tls_policy text, tls_policy_expires_at timestamptz,
               tls_outcome text, tls_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH waiting AS (
        SELECT pepsi.recipient_domain(unnest(w.rcpt_to)) AS domain, w.id,
               coalesce(w.state ->> 'last_error', w.state ->> 'dispatch_error') AS last_error
        FROM pepsi.workqueue w WHERE w.status = 'paused' AND w.timeout < 'infinity'
    ), counted AS (
        SELECT c.domain, count(*) AS deferred,
               (array_agg(c.last_error ORDER BY c.id DESC) FILTER (WHERE c.last_error IS NOT NULL))[1]
                   AS last_error
        FROM waiting c GROUP BY c.domain
    )
    SELECT coalesce(c.domain, d.domain), coalesce(c.deferred, 0), coalesce(d.failures, 0),
           d.backoff_until, coalesce(d.last_error, c.last_error), d.last_success, d.concurrency_limit, d.messages_per_minute,
           coalesce(d.tls_policy, 'sts ' || p.mode), p.expires_at, d.tls_outcome, d.tls_at
    FROM counted c
    FULL JOIN (SELECT * FROM pepsi.destination x
               WHERE x.failures > 0 OR x.backoff_until > now() OR x.last_error IS NOT NULL
                  OR x.tls_policy IS NOT NULL) d
           ON d.domain = c.domain
    LEFT JOIN pepsi.mta_sts_policy p ON p.domain = coalesce(c.domain, d.domain) AND p.expires_at > now()
    ORDER BY coalesce(c.deferred, 0) DESC, coalesce(d.failures, 0) DESC, 1
    LIMIT least(greatest(coalesce(max_rows, 100), 1), 1000)
$$;

SELECT pepsi.grant_apply();
-- end of DANE/TLS results per destination

UPDATE pepsi.schema_version SET version = '0.5';
