/*
 * pepsi 0.5 -> 0.6: the schema changes made since 0.5.
 *
 * 0.5 was released with the schedule, the failure bouncer, DMARC
 * aggregates, setup tasks and the MX defences' tables; every schema change
 * since is a block here, placed before the final UPDATE of
 * pepsi.schema_version, and folded into pepsi--0.6.sql (new objects at its
 * end).  An existing 0.5 database reaches 0.6 with ALTER EXTENSION pepsi
 * UPDATE; CREATE EXTENSION pepsi installs pepsi--0.6.sql.  Both paths must
 * end in the same schema: t/003_extension_upgrade.pl compares their
 * catalogs and tests the upgrade with a filled queue.  The scheme (blocks,
 * grants as data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.6'" to load this file. \quit

-- ===========================================================================
-- TLS reports (RFC 8460): the TLS outcomes pepsi-stage-relay-to-internet
-- counts, for pepsi-tlsrpt(8); pruning of the aggregates and of
-- pepsi-ingress's defence tables (schedule calls)
-- ===========================================================================

-- One row per UTC day and per what a report's policy and failure details
-- show: the recipient domain (policy_domain), the policy the sessions
-- were made under (policy_type sts, tlsa or no-policy-found; its text as
-- lines, policy_string, and its MX patterns or host, mx_host, each list
-- joined by newlines), and, for failed sessions, the RFC 8460 result type
-- with the MX host and address tried; result_type '' counts the
-- successful sessions.  The relay stage counts in memory and adds its
-- counts with pepsi.tls_tally() in the round trip it makes anyway for the
-- destination's slot (pepsi.destination_begin), or once when its worker
-- goes idle: no round trip per message.
CREATE TABLE pepsi.tls_aggregate (
    day                   date NOT NULL,
    policy_domain         text NOT NULL,
    policy_type           text NOT NULL CHECK (policy_type IN ('sts', 'tlsa', 'no-policy-found')),
    policy_string         text NOT NULL DEFAULT '',
    mx_host               text NOT NULL DEFAULT '',
    result_type           text NOT NULL DEFAULT '' CHECK (result_type ~ '^[a-z0-9-]{0,64}$'),
    receiving_mx_hostname text NOT NULL DEFAULT '',
    receiving_ip          text NOT NULL DEFAULT '',
    sending_mta_ip        text NOT NULL DEFAULT '',
    sessions              bigint NOT NULL CHECK (sessions > 0),
    PRIMARY KEY (policy_domain, day, policy_type, policy_string, mx_host, result_type,
                 receiving_mx_hostname, receiving_ip, sending_mta_ip)
);
CREATE INDEX tls_aggregate_day ON pepsi.tls_aggregate (day);
COMMENT ON TABLE pepsi.tls_aggregate IS
    'TLS sessions per day, policy and result, counted by pepsi-stage-relay-to-internet for pepsi-tlsrpt';

-- Add a batch of counts (the relay stage): a JSON array of objects with the
-- columns above (count for sessions), at most 100000; the day is now's (UTC).
CREATE FUNCTION pepsi.tls_tally(counts jsonb) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    added integer;
BEGIN
    IF counts IS NULL THEN
        RETURN 0;
    END IF;
    IF jsonb_typeof(counts) <> 'array' THEN
        RAISE EXCEPTION 'counts must be a JSON array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(counts) > 100000 THEN
        RAISE EXCEPTION 'at most 100000 records in one call, not %', jsonb_array_length(counts)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    INSERT INTO pepsi.tls_aggregate AS a (day, policy_domain, policy_type, policy_string, mx_host,
        result_type, receiving_mx_hostname, receiving_ip, sending_mta_ip, sessions)
    SELECT (now() AT TIME ZONE 'UTC')::date, lower(r.policy_domain), r.policy_type,
           coalesce(r.policy_string, ''), lower(coalesce(r.mx_host, '')), coalesce(r.result_type, ''),
           lower(coalesce(r.receiving_mx_hostname, '')), coalesce(r.receiving_ip, ''),
           coalesce(r.sending_mta_ip, ''), sum(r.count)
    FROM jsonb_to_recordset(counts) AS r(policy_domain text, policy_type text, policy_string text,
        mx_host text, result_type text, receiving_mx_hostname text, receiving_ip text,
        sending_mta_ip text, count bigint)
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
    ON CONFLICT (policy_domain, day, policy_type, policy_string, mx_host, result_type,
                 receiving_mx_hostname, receiving_ip, sending_mta_ip)
    DO UPDATE SET sessions = a.sessions + excluded.sessions;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added;
END
$$;

-- The days of past reports go (a pepsi.schedule row may call it:
-- tls_aggregate_prune on the allow-list).  Returns how many rows went.
CREATE FUNCTION pepsi.tls_aggregate_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 day' THEN
        RAISE EXCEPTION 'older_than must be a day or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A day''s counts are reported after the day; keep at least the last one.';
    END IF;
    DELETE FROM pepsi.tls_aggregate a WHERE a.day < ((now() - older_than) AT TIME ZONE 'UTC')::date;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

-- pepsi-tlsrpt's message into the queue (pepsi_config), as
-- pepsi.dmarc_report_inject: a new row at stage, to the one mailto: rua
-- address, marked as Pepsi's own mail, with the token
-- tlsrpt:<report id>:<rua>, so a report is queued once per destination
-- however often the tool runs.  Logged.  Returns the row's id, or NULL
-- when it was queued already.
CREATE FUNCTION pepsi.tlsrpt_inject(stage text, mail_from text, rua text, headers bytea, body bytea,
    policy_domain text, report_id text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    queued bigint;
BEGIN
    IF report_id IS NULL OR report_id = '' OR policy_domain IS NULL OR policy_domain = '' THEN
        RAISE EXCEPTION 'a report needs its report_id and policy_domain' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    queued := pepsi.workqueue_inject(stage, mail_from, ARRAY[rua], headers, body,
        jsonb_build_object('origin', jsonb_build_object('trust', 'pepsi', 'program', 'pepsi-tlsrpt')),
        format('tlsrpt:%s:%s', report_id, lower(rua)));
    PERFORM pepsi.event_log_write('tlsrpt_sent',
        jsonb_build_object('domain', policy_domain, 'rua', rua, 'report_id', report_id, 'row', queued));
    RETURN queued;
END
$$;

-- A report POSTed to an https: rua (pepsi-tlsrpt does the POST): logged,
-- so pepsi.event_log says what went where, as for the queued ones.
CREATE FUNCTION pepsi.tlsrpt_posted(policy_domain text, rua text, report_id text, status integer)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    PERFORM pepsi.event_log_write('tlsrpt_sent',
        jsonb_build_object('domain', policy_domain, 'rua', rua, 'report_id', report_id, 'http_status', status));
END
$$;

-- Pruning pepsi-ingress's defence tables (each a schedule call): the
-- greylist triplets not seen for older_than and the clients whose
-- auto-whitelisting ended; the hours of send_count older than older_than
-- (only the current hour is ever read); the expired screen verdicts.
-- Each returns how many rows went.
CREATE FUNCTION pepsi.greylist_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
    clients bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'older_than must be an hour or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Longer than the listeners'' GREYLIST_EXPIRE, or retried triplets start over.';
    END IF;
    DELETE FROM pepsi.greylist g WHERE g.last_seen < now() - older_than;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    DELETE FROM pepsi.greylist_client c WHERE c.until < now();
    GET DIAGNOSTICS clients = ROW_COUNT;
    RETURN pruned + clients;
END
$$;

CREATE FUNCTION pepsi.send_count_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '1 hour' THEN
        RAISE EXCEPTION 'older_than must be an hour or more, not %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pepsi.send_count s WHERE s.hour < date_trunc('hour', now()) - older_than;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

CREATE FUNCTION pepsi.screen_verdict_prune() RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned bigint;
BEGIN
    DELETE FROM pepsi.screen_verdict v WHERE v.expires <= now();
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'tls_tally', '{EXECUTE}'),
    ('pepsi_config', 'table', 'tls_aggregate', '{SELECT}'),
    ('pepsi_config', 'function', 'tls_aggregate_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'tlsrpt_inject', '{EXECUTE}'),
    ('pepsi_config', 'function', 'tlsrpt_posted', '{EXECUTE}'),
    ('pepsi_config', 'function', 'greylist_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'send_count_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'screen_verdict_prune', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'tls_aggregate', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('tls_tally'), ('tls_aggregate_prune'), ('tlsrpt_inject'),
    ('tlsrpt_posted'), ('greylist_prune'), ('send_count_prune'), ('screen_verdict_prune');

SELECT pg_catalog.pg_extension_config_dump('pepsi.tls_aggregate', '');

SELECT pepsi.grant_apply();

-- The schedule's allow-list gains the prune functions above.
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
            'Delete the expired connection-level verdicts (DNSBL, pre-greeting)')
$$;

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
    ELSIF function_name = 'screen_verdict_prune' THEN
        SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(arguments) k;
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'screen_verdict_prune takes no argument %', unknown
                USING ERRCODE = 'invalid_parameter_value', DETAIL = 'It takes no arguments.';
        END IF;
    END IF;
END
$$;

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
    END CASE;
END
$$;

-- end of TLS reports and pruning

UPDATE pepsi.schema_version SET version = '0.6';
