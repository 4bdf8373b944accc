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
-- One timer: pepsi.schedule, run by the maintenance worker; the failure
-- bouncer (pepsi.failure_bounce, pepsi-failure-bouncer(8))
-- ===========================================================================

-- Work due at a time (reports, held-mail expiry, digests, key expiry, the
-- failure bouncer) is a row here, and the maintenance worker
-- (extension/src/maint.c) is the one clock that runs it: there is no cron
-- line, no timer in a daemon and no sleep loop in a stage.  Each pass the
-- worker calls pepsi.schedule_run_due(), which runs every row whose
-- next_run has come, each in its own subtransaction (a failing one is
-- recorded in last_outcome and logged, and the others still run), and
-- sleeps no longer than until the earliest next_run.
--
-- A row does one of two things:
--   inject  a queue row at stage, through pepsi.workqueue_inject (the
--           same function stages use for side messages), with the null
--           sender, the row's recipients and its arguments as state, plus
--           state.schedule = {name, due}.  The stage named does the work
--           (a report stage, a digest stage) with the pipeline's retries,
--           crash limits and logs.  The inject carries the token
--           "schedule:<name>:<due>", so a period is injected at most once
--           even if a pass were to run twice.
--   call    one function of the closed allow-list below, with the row's
--           arguments, for work that is a statement (the failure bouncer).
--
-- Why a closed list and not any function named in the row: the worker
-- runs as the bootstrap superuser.  A row naming any function would let
-- whoever may add a schedule (pepsi_config) run any function, with any
-- arguments, as superuser.  So the callable names are fixed in this
-- script, each mapped by pepsi.schedule_call() to one fixed call of an
-- extension function with its arguments read from the row's jsonb by
-- name and type-checked (no dynamic SQL, no name looked up in the
-- catalog); adding one is a schema change, reviewed and versioned like
-- any other.  pepsi.schedule_functions() lists them.
--
-- Time: next_run is when the row is due.  A repeating row (every) then
-- moves to the first next_run + k * every after now, so a row fires once
-- per period, keeps its phase, and after the server was down for several
-- periods it fires once, not once per missed period.  A one-shot row
-- (every NULL) keeps its record with next_run 'infinity'.  The worker
-- wakes for the earliest row, and at least every
-- pepsi.maintenance_interval, so a row added while it sleeps fires within
-- that interval of its time.  The table is the schedule's state: a
-- restart, a backup and restore (pg_extension_config_dump) keep it.
CREATE TABLE pepsi.schedule (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]*$' AND length(name) <= 100),
    action          text NOT NULL CHECK (action IN ('inject', 'call')),
    stage           text CHECK (stage ~ '^[a-z0-9_-]+$'),
    rcpt_to         text[] CHECK (cardinality(rcpt_to) > 0 AND array_position(rcpt_to, NULL) IS NULL),
    function_name   text,
    arguments       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(arguments) = 'object'),
    next_run        timestamptz NOT NULL,
    every           interval CHECK (every > interval '0'),
    last_run        timestamptz,
    last_outcome    text,
    runs            bigint NOT NULL DEFAULT 0,
    failures        bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL DEFAULT current_user,
    CHECK ((action = 'inject') = (stage IS NOT NULL AND rcpt_to IS NOT NULL)),
    CHECK ((action = 'call') = (function_name IS NOT NULL))
);
CREATE INDEX schedule_next_run ON pepsi.schedule (next_run);
COMMENT ON TABLE pepsi.schedule IS
    'Work due at a time, run by the maintenance worker: inject a queue row at a stage, or call an allow-listed function';

-- The allow-list: what a "call" row may name, and its arguments.
CREATE FUNCTION pepsi.schedule_functions(OUT name text, OUT arguments text, OUT description text)
RETURNS SETOF record LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    VALUES ('failure_bounce',
            'older_than (interval, required), policy ("bounce" or "delete"), bounce_stage, max_rows',
            'Bounce (or delete) failed and timed-out rows older than older_than: pepsi-failure-bouncer(8)'),
           ('dmarc_aggregate_prune', 'older_than (interval, required, an hour or more)',
            'Delete the DMARC verdicts counted more than older_than ago: pepsi-dmarc-report(8)')
$$;

-- Check a call's arguments as the call would read them; raise naming the
-- problem.  Used by schedule_add (so a bad row is refused when it is
-- added, not found failing at 3 a.m.) and again by schedule_call.
CREATE FUNCTION pepsi.schedule_check_call(function_name text, arguments jsonb) RETURNS void
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
    ELSIF function_name = 'dmarc_aggregate_prune' THEN
        SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(arguments) k WHERE k <> 'older_than';
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'dmarc_aggregate_prune takes no argument %', unknown
                USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Its argument: older_than.';
        END IF;
        BEGIN
            older_than := (arguments ->> 'older_than')::interval;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            RAISE EXCEPTION 'dmarc_aggregate_prune''s older_than is not an interval: "%"', arguments ->> 'older_than'
                USING ERRCODE = 'invalid_parameter_value';
        END;
        IF older_than IS NULL OR older_than < interval '1 hour' THEN
            RAISE EXCEPTION 'dmarc_aggregate_prune needs older_than, an hour or more'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
END
$$;

-- One fixed call per allow-listed name; returns the outcome's text.
CREATE FUNCTION pepsi.schedule_call(function_name text, arguments jsonb) RETURNS text
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
    END CASE;
END
$$;

-- Add a schedule (pepsi_config).  Exactly one of stage (inject a row
-- there, to rcpt_to) and function_name (call it); run_at is the first
-- time, every the period (NULL: once).  Logged in pepsi.event_log.
CREATE FUNCTION pepsi.schedule_add(name text, run_at timestamptz, every interval DEFAULT NULL,
    stage text DEFAULT NULL, rcpt_to text[] DEFAULT NULL, function_name text DEFAULT NULL,
    arguments jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF name IS NULL OR name !~ '^[a-z0-9][a-z0-9_.-]*$' OR length(name) > 100 THEN
        RAISE EXCEPTION 'invalid schedule name "%"', name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'Lower-case letters, digits, ".", "_" and "-", at most 100 characters.';
    END IF;
    IF run_at IS NULL OR NOT isfinite(run_at) THEN
        RAISE EXCEPTION 'run_at must be a finite time' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF every IS NOT NULL AND every <= interval '0' THEN
        RAISE EXCEPTION 'every must be a positive interval, not %', every
            USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL runs the schedule once.';
    END IF;
    IF arguments IS NULL OR jsonb_typeof(arguments) <> 'object' THEN
        RAISE EXCEPTION 'arguments must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (stage IS NULL) = (function_name IS NULL) THEN
        RAISE EXCEPTION 'a schedule names either a stage to inject a row at or a function to call'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'stage => ''digest'', rcpt_to => ARRAY[...], or function_name => ''failure_bounce''.';
    END IF;
    IF stage IS NOT NULL THEN
        IF stage !~ '^[a-z0-9_-]+$' THEN
            RAISE EXCEPTION 'invalid stage name "%"', stage
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'A stage is named by its [stage-<name>] section: lower-case letters, digits, "_" and "-".';
        END IF;
        IF rcpt_to IS NULL OR cardinality(rcpt_to) = 0 OR array_position(rcpt_to, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'a schedule that injects a row needs its recipients (rcpt_to)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSE
        IF rcpt_to IS NOT NULL THEN
            RAISE EXCEPTION 'rcpt_to is for a schedule that injects a row, not one that calls %', function_name
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM pepsi.schedule_check_call(function_name, arguments);
    END IF;
    IF EXISTS (SELECT FROM pepsi.schedule s WHERE s.name = schedule_add.name) THEN
        RAISE EXCEPTION 'schedule "%" exists already', name
            USING ERRCODE = 'unique_violation',
                  HINT = 'Remove it first with pepsi.schedule_remove().';
    END IF;
    INSERT INTO pepsi.schedule (name, action, stage, rcpt_to, function_name, arguments, next_run, every,
                                created_by)
    VALUES (name, CASE WHEN stage IS NULL THEN 'call' ELSE 'inject' END, stage, rcpt_to,
            function_name, arguments, run_at, every, pepsi.event_principal());
    PERFORM pepsi.event_log_write('schedule_add',
        jsonb_strip_nulls(jsonb_build_object('name', name, 'run_at', run_at, 'every', every::text,
                                             'stage', stage, 'rcpt_to', to_jsonb(rcpt_to),
                                             'function', function_name, 'arguments', arguments)));
END
$$;

-- Remove a schedule; returns whether there was one.  Logged.
CREATE FUNCTION pepsi.schedule_remove(name text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    removed boolean;
BEGIN
    DELETE FROM pepsi.schedule s WHERE s.name = schedule_remove.name;
    removed := FOUND;
    PERFORM pepsi.event_log_write('schedule_remove', jsonb_build_object('name', name, 'removed', removed));
    RETURN removed;
END
$$;

-- The schedules, soonest first, with what each does in one column.
CREATE FUNCTION pepsi.schedule_list()
RETURNS TABLE (name text, does text, next_run timestamptz, every interval, last_run timestamptz,
               last_outcome text, runs bigint, failures bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT s.name,
           CASE s.action WHEN 'inject' THEN format('inject at %s to %s', s.stage, array_to_string(s.rcpt_to, ', '))
                ELSE format('call %s(%s)', s.function_name, s.arguments::text) END,
           s.next_run, s.every, s.last_run, s.last_outcome, s.runs, s.failures
    FROM pepsi.schedule s ORDER BY s.next_run, s.name
$$;

-- The maintenance worker's part: run the rows that are due, at most
-- max_rows of them; returns how many ran.  Each in a subtransaction: a
-- failure is the row's last_outcome ("error: ...") and a WARNING in the
-- server log, and does not stop the others.
CREATE FUNCTION pepsi.schedule_run_due(max_rows integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    due record;
    ran integer := 0;
    outcome text;
    failed boolean;
    next_due timestamptz;
    injected bigint;
BEGIN
    FOR due IN SELECT * FROM pepsi.schedule s WHERE s.next_run <= clock_timestamp()
               ORDER BY s.next_run, s.name LIMIT max_rows FOR UPDATE SKIP LOCKED
    LOOP
        failed := false;
        BEGIN
            IF due.action = 'inject' THEN
                injected := pepsi.workqueue_inject(due.stage, '', due.rcpt_to, ''::bytea, ''::bytea,
                    due.arguments || jsonb_build_object('schedule',
                        jsonb_build_object('name', due.name, 'due', due.next_run)),
                    format('schedule:%s:%s', due.name, extract(epoch FROM due.next_run)));
                outcome := CASE WHEN injected IS NULL THEN 'ok: already injected'
                                ELSE format('ok: row %s at %s', injected, due.stage) END;
            ELSE
                outcome := 'ok: ' || pepsi.schedule_call(due.function_name, due.arguments);
            END IF;
        EXCEPTION WHEN OTHERS THEN
            failed := true;
            outcome := 'error: ' || SQLERRM;
            RAISE WARNING 'pepsi maintenance: schedule "%" failed: %', due.name, SQLERRM;
        END;
        IF due.every IS NULL THEN
            next_due := 'infinity';
        ELSE
            -- The first due time after now in the row's phase.
            next_due := due.next_run + due.every * greatest(1, floor(extract(epoch FROM clock_timestamp() - due.next_run)
                                                                 / extract(epoch FROM due.every))::bigint);
            FOR i IN 1..3 LOOP
                EXIT WHEN next_due > clock_timestamp();
                next_due := next_due + due.every;
            END LOOP;
            IF next_due <= clock_timestamp() THEN
                next_due := clock_timestamp() + due.every;
            END IF;
        END IF;
        UPDATE pepsi.schedule s
        SET next_run = next_due, last_run = clock_timestamp(), last_outcome = left(outcome, 1000),
            runs = s.runs + 1, failures = s.failures + failed::int
        WHERE s.name = due.name;
        ran := ran + 1;
    END LOOP;
    RETURN ran;
END
$$;

-- The failure bouncer: failed and timed-out rows that have been in the
-- queue longer than older_than (received_at) are bounced to their sender
-- through pepsi.queue_bounce (the bounce stage makes the DSN, as for
-- pepsi-queue bounce), or deleted when policy is "delete" (pepsi.queue_delete).
-- A row with the null sender (a DSN that could not be delivered) is
-- never bounced: it is deleted, and the deletion logged (server log and
-- pepsi-failure-bouncer's own log line).  Rows at bounce_stage are left
-- alone: the bounce stage failed to make their DSN, and bouncing them
-- again would go round the same failure; an operator looks at them.
-- Each row is one queue_bounce or queue_delete, so the audit trail is the
-- queue tools' (one pepsi.event_log row per message); one more row,
-- action failure_bounce, sums the run up.  A row another session holds is
-- skipped and taken next time.  dry_run: the rows, untouched.
CREATE FUNCTION pepsi.failure_bounce_check(older_than interval, policy text, bounce_stage text, max_rows integer)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must be an interval of 0 or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF policy IS NULL OR policy NOT IN ('bounce', 'delete') THEN
        RAISE EXCEPTION 'the failure bouncer''s policy is "bounce" or "delete", not "%"', policy
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF bounce_stage IS NULL OR bounce_stage !~ '^[a-z0-9_-]+$' THEN
        RAISE EXCEPTION 'invalid bounce stage name "%"', bounce_stage
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A stage is named by its [stage-<name>] section: lower-case letters, digits, "_" and "-".';
    END IF;
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 100000 THEN
        RAISE EXCEPTION 'max_rows must be between 1 and 100000, not %', coalesce(max_rows::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

CREATE FUNCTION pepsi.failure_bounce(older_than interval, policy text DEFAULT 'bounce',
    bounce_stage text DEFAULT 'bounce', max_rows integer DEFAULT 1000, dry_run boolean DEFAULT false)
RETURNS TABLE (id bigint, queue_id text, stage text, status text, mail_from text, age interval,
               action text, reason text)
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r record;
    why text;
    bounced integer := 0;
    deleted integer := 0;
BEGIN
    PERFORM pepsi.failure_bounce_check(older_than, policy, bounce_stage, max_rows);
    FOR r IN SELECT w.id, coalesce(w.state ->> 'queue_id', w.id::text) AS queue_id, w.stage,
                    w.status::text AS status, w.mail_from, now() - w.received_at AS age,
                    coalesce(w.state ->> 'last_error', w.state ->> 'dispatch_error') AS last_error
             FROM pepsi.workqueue w
             WHERE w.status IN ('failed', 'timeout') AND w.received_at < now() - older_than
               AND w.stage <> bounce_stage
             ORDER BY w.id LIMIT max_rows FOR UPDATE OF w SKIP LOCKED
    LOOP
        -- One line, as the DSN's Diagnostic-Code: 5.4.7 (delivery time
        -- expired) unless the stage's own error gives a code.
        why := format('%s at stage %s and not delivered after %s%s',
                      CASE r.status WHEN 'timeout' THEN 'timed out' ELSE 'failed' END, r.stage,
                      justify_interval(date_trunc('second', r.age)),
                      coalesce(': ' || left(regexp_replace(r.last_error, '[[:cntrl:]]+', ' ', 'g'), 400), ''));
        why := CASE WHEN why ~ '\m[245]\.[0-9]{1,3}\.[0-9]{1,3}\M' THEN why ELSE '5.4.7 ' || why END;
        id := r.id; queue_id := r.queue_id; stage := r.stage; status := r.status;
        mail_from := r.mail_from; age := r.age; reason := why;
        IF r.mail_from IN ('', '<>') THEN
            action := 'deleted: null sender';
        ELSIF policy = 'delete' THEN
            action := 'deleted';
        ELSE
            action := 'bounced';
        END IF;
        IF NOT dry_run THEN
            IF action = 'bounced' THEN
                PERFORM pepsi.queue_bounce(ARRAY[r.id], why, bounce_stage);
                UPDATE pepsi.workqueue w SET state = jsonb_set(w.state, '{bounce,source}', '"failure-bouncer"')
                WHERE w.id = r.id;
                bounced := bounced + 1;
            ELSE
                PERFORM pepsi.queue_delete(ARRAY[r.id]);
                deleted := deleted + 1;
                RAISE LOG 'pepsi failure-bouncer: deleted row % (queue id %) from <%>: %', r.id, r.queue_id,
                    r.mail_from, CASE WHEN action = 'deleted' THEN 'policy delete' ELSE 'null sender, never bounced' END;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF NOT dry_run AND bounced + deleted > 0 THEN
        PERFORM pepsi.event_log_write('failure_bounce',
            jsonb_build_object('older_than', older_than::text, 'policy', policy, 'bounce_stage', bounce_stage,
                               'bounced', bounced, 'deleted', deleted));
    END IF;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'schedule', '{SELECT}'),
    ('pepsi_config', 'function', 'schedule_add', '{EXECUTE}'),
    ('pepsi_config', 'function', 'schedule_remove', '{EXECUTE}'),
    ('pepsi_config', 'function', 'schedule_list', '{EXECUTE}'),
    ('pepsi_config', 'function', 'schedule_functions', '{EXECUTE}'),
    ('pepsi_config', 'function', 'failure_bounce', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'schedule', '{SELECT}'),
    ('pepsi_monitor', 'function', 'schedule_list', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'schedule_functions', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES
    ('schedule_add'), ('schedule_remove'), ('failure_bounce');
INSERT INTO pepsi.grant_owner (name) VALUES
    ('schedule_check_call'), ('schedule_call'), ('schedule_run_due'), ('failure_bounce_check');

SELECT pg_catalog.pg_extension_config_dump('pepsi.schedule', '');

SELECT pepsi.grant_apply();

-- end of one timer and the failure bouncer

-- ===========================================================================
-- DMARC aggregate reports (RFC 7489 7.2): the verdicts pepsi-ingress
-- counts, for pepsi-dmarc-report(8)
-- ===========================================================================

-- One row per hour and per what a report's <record> shows: the domain whose
-- policy applied (where the _dmarc record was found), the header From
-- domain, the client's address, the envelope's (MAIL FROM or HELO)
-- domain, the disposition applied, DMARC's aligned DKIM and SPF results,
-- and the DKIM signature and SPF check reported with them; messages counts
-- the messages.  pepsi-ingress counts in memory and adds its counts with
-- pepsi.dmarc_tally() in the transaction of its periodic report
-- (pepsi.ingress_report, every few seconds): no round trip per message.
CREATE TABLE pepsi.dmarc_aggregate (
    period          timestamptz NOT NULL CHECK (period = date_trunc('hour', period)),
    policy_domain   text NOT NULL,
    header_from     text NOT NULL,
    source_ip       inet NOT NULL,
    envelope_from   text NOT NULL DEFAULT '',
    disposition     text NOT NULL CHECK (disposition IN ('none', 'quarantine', 'reject')),
    dkim            text NOT NULL CHECK (dkim IN ('pass', 'fail')),
    spf             text NOT NULL CHECK (spf IN ('pass', 'fail')),
    dkim_domain     text NOT NULL DEFAULT '',
    dkim_selector   text NOT NULL DEFAULT '',
    dkim_result     text NOT NULL DEFAULT '',
    spf_scope       text NOT NULL DEFAULT 'mfrom' CHECK (spf_scope IN ('mfrom', 'helo')),
    spf_result      text NOT NULL DEFAULT 'none',
    messages        bigint NOT NULL CHECK (messages > 0),
    PRIMARY KEY (policy_domain, period, header_from, source_ip, envelope_from, disposition, dkim, spf,
                 dkim_domain, dkim_selector, dkim_result, spf_scope, spf_result)
);
CREATE INDEX dmarc_aggregate_period ON pepsi.dmarc_aggregate (period);
COMMENT ON TABLE pepsi.dmarc_aggregate IS
    'DMARC verdicts per hour and report record, counted by pepsi-ingress for pepsi-dmarc-report';

-- Add a batch of counts (pepsi-ingress): a JSON array of objects with the
-- columns above (count for messages), at most 100000; the hour is now's.
CREATE FUNCTION pepsi.dmarc_tally(counts jsonb) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    added integer;
BEGIN
    IF counts IS NULL OR jsonb_typeof(counts) <> 'array' THEN
        RAISE EXCEPTION 'counts must be a JSON array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(counts) > 100000 THEN
        RAISE EXCEPTION 'at most 100000 records in one call, not %', jsonb_array_length(counts)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    INSERT INTO pepsi.dmarc_aggregate AS a (period, policy_domain, header_from, source_ip, envelope_from,
        disposition, dkim, spf, dkim_domain, dkim_selector, dkim_result, spf_scope, spf_result, messages)
    SELECT date_trunc('hour', now()), lower(r.policy_domain), lower(r.header_from), r.source_ip,
           lower(coalesce(r.envelope_from, '')), r.disposition, r.dkim, r.spf,
           lower(coalesce(r.dkim_domain, '')), coalesce(r.dkim_selector, ''), coalesce(r.dkim_result, ''),
           coalesce(nullif(r.spf_scope, ''), 'mfrom'), coalesce(nullif(r.spf_result, ''), 'none'),
           sum(r.count)
    FROM jsonb_to_recordset(counts) AS r(policy_domain text, header_from text, source_ip inet,
        envelope_from text, disposition text, dkim text, spf text, dkim_domain text, dkim_selector text,
        dkim_result text, spf_scope text, spf_result text, count bigint)
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13
    ON CONFLICT (policy_domain, period, header_from, source_ip, envelope_from, disposition, dkim, spf,
                 dkim_domain, dkim_selector, dkim_result, spf_scope, spf_result)
    DO UPDATE SET messages = a.messages + excluded.messages;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added;
END
$$;

-- The rows of past reports go (a pepsi.schedule row may call it:
-- dmarc_aggregate_prune on the allow-list).  Returns how many went.
CREATE FUNCTION pepsi.dmarc_aggregate_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'older_than must be an hour or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pepsi.dmarc_aggregate a WHERE a.period < now() - older_than;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

-- pepsi-dmarc-report's message into the queue (pepsi_config): a new row at
-- stage, to the one rua address, marked as Pepsi's own mail (state.origin,
-- so pepsi-stage-dkim-sign signs it), through pepsi.workqueue_inject with
-- the token dmarc-report:<report id>:<rua>, so a report is queued once for
-- each of its destinations however often the tool runs.  Logged in
-- pepsi.event_log.  Returns the row's id, or NULL when it was queued
-- already.
CREATE FUNCTION pepsi.dmarc_report_inject(stage text, mail_from text, rua text, headers bytea, body bytea,
    policy_domain text, report_id text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    queued bigint;
BEGIN
    IF report_id IS NULL OR report_id = '' OR policy_domain IS NULL OR policy_domain = '' THEN
        RAISE EXCEPTION 'a report needs its report_id and policy_domain' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    queued := pepsi.workqueue_inject(stage, mail_from, ARRAY[rua], headers, body,
        jsonb_build_object('origin', jsonb_build_object('trust', 'pepsi', 'program', 'pepsi-dmarc-report')),
        format('dmarc-report:%s:%s', report_id, lower(rua)));
    PERFORM pepsi.event_log_write('dmarc_report_sent',
        jsonb_build_object('domain', policy_domain, 'rua', rua, 'report_id', report_id, 'row', queued));
    RETURN queued;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'dmarc_tally', '{EXECUTE}'),
    ('pepsi_config', 'function', 'dmarc_report_inject', '{EXECUTE}'),
    ('pepsi_config', 'table', 'dmarc_aggregate', '{SELECT}'),
    ('pepsi_config', 'function', 'dmarc_aggregate_prune', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'dmarc_aggregate', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('dmarc_tally'), ('dmarc_aggregate_prune'), ('dmarc_report_inject');

SELECT pg_catalog.pg_extension_config_dump('pepsi.dmarc_aggregate', '');

SELECT pepsi.grant_apply();

-- end of DMARC aggregate reports
-- setup tasks: pepsi.setup_task, the intent queue pepsi-setup(8) apply
-- drains as root, and pepsi.setup_task_log, the lines each task wrote.
--
-- Setting a mail server up is privileged (writing /etc/pepsi, secrets.d,
-- roles, keys) and pepsi-httpd runs unprivileged, so the web setup does not
-- act: it writes a row saying what should be true, of one of a closed set
-- of eleven kinds, and the applier decides how, validating the parameters
-- of each kind strictly (cli/setup/tasks.c; docs/pepsi-setup.8.md names
-- them).  Root is reached through a table, never through a socket.
-- written_by is forced from current_user by the BEFORE INSERT trigger,
-- whatever the row says, and the applier refuses a row not written by a
-- member of pepsi_config; only pepsi_config may INSERT (nobody UPDATEs or
-- DELETEs but the owner, which the applier connects as), pepsi_config and
-- pepsi_httpd may read both.  No role that handles mail touches them.
-- ===========================================================================
CREATE TABLE pepsi.setup_task (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('config_file', 'secret', 'database_role', 'grant_policy',
                                              'pg_hba_line', 'dkim_key', 'srs_secret', 'certificate',
                                              'reload', 'admin_account', 'dns_check')),
    params      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(params) = 'object'),
    written_by  name NOT NULL DEFAULT current_user,
    status      text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'running', 'done', 'unchanged', 'refused', 'failed')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX setup_task_pending ON pepsi.setup_task (id) WHERE status = 'pending';

CREATE TABLE pepsi.setup_task_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     bigint NOT NULL REFERENCES pepsi.setup_task (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT now(),
    line        text NOT NULL
);
CREATE INDEX setup_task_log_task ON pepsi.setup_task_log (task_id, id);

-- Who wrote a request is a fact about the connection, not a claim of the
-- payload: the trigger runs as the inserting role (it is no definer).  A
-- new row is pending, stamped now, whatever it says.
CREATE FUNCTION pepsi.setup_task_stamp() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    NEW.written_by := current_user;
    NEW.status := 'pending';
    NEW.created_at := now();
    NEW.started_at := NULL;
    NEW.finished_at := NULL;
    RETURN NEW;
END
$$;
CREATE TRIGGER setup_task_stamp BEFORE INSERT ON pepsi.setup_task
    FOR EACH ROW EXECUTE FUNCTION pepsi.setup_task_stamp();

SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_log', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_log_id_seq', '');

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'setup_task', '{SELECT,INSERT}'),
    ('pepsi_config', 'table', 'setup_task_log', '{SELECT}'),
    ('pepsi_httpd', 'table', 'setup_task', '{SELECT}'),
    ('pepsi_httpd', 'table', 'setup_task_log', '{SELECT}');
SELECT pepsi.grant_apply();
-- end of setup tasks

-- ===========================================================================
-- Greylisting (pepsi-ingress, a listener's GREYLIST): a triplet (the
-- client's network, an IPv4 /24 or an IPv6 /64; the sender; the
-- recipient) is deferred until it comes back after GREYLIST_DELAY; a
-- client that came back is let through whole for GREYLIST_AUTO_WHITELIST.
-- In the database, so that every ingress host sharing it agrees.
-- ===========================================================================
CREATE TABLE pepsi.greylist (
    client text NOT NULL,
    sender text NOT NULL,
    recipient text NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    last_seen timestamptz NOT NULL DEFAULT now(),
    passed boolean NOT NULL DEFAULT false,
    PRIMARY KEY (client, sender, recipient)
);
CREATE TABLE pepsi.greylist_client (
    client text PRIMARY KEY,
    until timestamptz NOT NULL
);

-- True: let the recipient through.  A triplet first seen, or seen again
-- before delay, is deferred; one not retried within expire starts over.
CREATE FUNCTION pepsi.greylist_check(client text, sender text, recipient text, delay interval,
                                     expire interval, auto_whitelist interval)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    t pepsi.greylist;
BEGIN
    IF EXISTS (SELECT FROM pepsi.greylist_client c
               WHERE c.client = greylist_check.client AND c.until > now()) THEN
        RETURN true;
    END IF;
    INSERT INTO pepsi.greylist AS g (client, sender, recipient)
    VALUES (greylist_check.client, greylist_check.sender, greylist_check.recipient)
    ON CONFLICT ON CONSTRAINT greylist_pkey DO UPDATE
        SET last_seen = now(),
            first_seen = CASE WHEN NOT g.passed AND g.first_seen < now() - greylist_check.expire
                              THEN now() ELSE g.first_seen END
    RETURNING * INTO t;
    IF t.passed OR (t.last_seen > t.first_seen AND t.first_seen <= now() - delay) THEN
        IF NOT t.passed THEN
            UPDATE pepsi.greylist g SET passed = true
            WHERE g.client = t.client AND g.sender = t.sender AND g.recipient = t.recipient;
        END IF;
        INSERT INTO pepsi.greylist_client AS c (client, until)
        VALUES (greylist_check.client, now() + auto_whitelist)
        ON CONFLICT ON CONSTRAINT greylist_client_pkey DO UPDATE SET until = EXCLUDED.until;
        RETURN true;
    END IF;
    RETURN false;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'greylist_check', '{EXECUTE}'),
    ('pepsi_config', 'table', 'greylist', '{SELECT}'),
    ('pepsi_config', 'table', 'greylist_client', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('greylist_check');

SELECT pg_catalog.pg_extension_config_dump('pepsi.greylist', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.greylist_client', '');
SELECT pepsi.grant_apply();
-- end of greylisting

-- ===========================================================================
-- Senders bound to their login (pepsi-ingress, [ingress] SENDER_LOGIN_MAPS
-- "sql", SEND_LIMIT_MESSAGES, SEND_LIMIT_RECIPIENTS): the addresses each
-- account may use (a mailbox, or "@domain" for all of one), and what each
-- account sent per hour, counted here so that every ingress host sharing
-- the database enforces the same limits.
-- ===========================================================================
CREATE TABLE pepsi.sender_login (
    address text NOT NULL CHECK (address = lower(address) AND position('@' IN address) > 0),
    account text NOT NULL,
    PRIMARY KEY (account, address)
);
CREATE TABLE pepsi.send_count (
    account text NOT NULL,
    hour timestamptz NOT NULL,
    messages integer NOT NULL DEFAULT 0,
    recipients integer NOT NULL DEFAULT 0,
    PRIMARY KEY (account, hour)
);

CREATE FUNCTION pepsi.sender_login_addresses(account text) RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT l.address FROM pepsi.sender_login l WHERE l.account = sender_login_addresses.account
$$;

-- One recipient (the transaction's first also counts a message) taken
-- from the account's hour: false, and nothing counted, past a limit (0: none).
CREATE FUNCTION pepsi.send_count_take(account text, new_message boolean, max_messages integer,
                                      max_recipients integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    c pepsi.send_count;
BEGIN
    INSERT INTO pepsi.send_count AS s (account, hour)
    VALUES (send_count_take.account, date_trunc('hour', now()))
    ON CONFLICT ON CONSTRAINT send_count_pkey DO UPDATE SET messages = s.messages
    RETURNING * INTO c;
    IF (max_recipients > 0 AND c.recipients >= max_recipients)
       OR (new_message AND max_messages > 0 AND c.messages >= max_messages) THEN
        RETURN false;
    END IF;
    UPDATE pepsi.send_count s
    SET recipients = s.recipients + 1,
        messages = s.messages + CASE WHEN new_message THEN 1 ELSE 0 END
    WHERE s.account = c.account AND s.hour = c.hour;
    DELETE FROM pepsi.send_count s
    WHERE s.account = send_count_take.account AND s.hour < date_trunc('hour', now());
    RETURN true;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'sender_login_addresses', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'send_count_take', '{EXECUTE}'),
    ('pepsi_config', 'table', 'sender_login', '{SELECT}'),
    ('pepsi_config', 'table', 'send_count', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('sender_login_addresses'), ('send_count_take');

SELECT pg_catalog.pg_extension_config_dump('pepsi.sender_login', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.send_count', '');
SELECT pepsi.grant_apply();
-- end of senders bound to their login

-- ===========================================================================
-- Connection-level verdicts (pepsi-ingress, [ingress] DNSBL_SITES and a
-- listener's PREGREET_WAIT): a client's verdict (its DNSBL score's, the
-- pre-greeting test's, a protocol violation's) kept per address until it expires, so that its next
-- sessions, on any ingress host sharing the database, are not tested again.
-- ===========================================================================
CREATE TABLE pepsi.screen_verdict (
    client text PRIMARY KEY,
    verdict text NOT NULL CHECK (verdict IN ('pass', 'allowed', 'listed', 'pregreet', 'pipelining',
                                             'bare newline')),
    list text,
    expires timestamptz NOT NULL
);

-- The client's verdict, if one is kept and has not expired.
CREATE FUNCTION pepsi.screen_verdict_get(client text, OUT verdict text, OUT list text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT v.verdict, v.list FROM pepsi.screen_verdict v
    WHERE v.client = screen_verdict_get.client AND v.expires > now()
$$;

-- Keep a verdict for ttl; a pre-greeting verdict is not overwritten by a
-- DNSBL one before it expires.  Expired rows of other clients go too.
CREATE FUNCTION pepsi.screen_verdict_put(client text, verdict text, list text, ttl interval)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    DELETE FROM pepsi.screen_verdict v WHERE v.expires <= now();
    INSERT INTO pepsi.screen_verdict AS v (client, verdict, list, expires)
    VALUES (screen_verdict_put.client, screen_verdict_put.verdict, screen_verdict_put.list,
            now() + screen_verdict_put.ttl)
    ON CONFLICT ON CONSTRAINT screen_verdict_pkey DO UPDATE
        SET verdict = EXCLUDED.verdict, list = EXCLUDED.list, expires = EXCLUDED.expires
        WHERE v.verdict <> 'pregreet' OR EXCLUDED.verdict = 'pregreet';
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'screen_verdict_get', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'screen_verdict_put', '{EXECUTE}'),
    ('pepsi_config', 'table', 'screen_verdict', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('screen_verdict_get'), ('screen_verdict_put');

SELECT pg_catalog.pg_extension_config_dump('pepsi.screen_verdict', '');
SELECT pepsi.grant_apply();
-- end of connection-level verdicts

UPDATE pepsi.schema_version SET version = '0.5';
