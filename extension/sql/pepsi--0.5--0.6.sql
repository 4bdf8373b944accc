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

-- ===========================================================================
-- Owner settings: domain rows, pepsi-settings and settings by e-mail
--
-- pepsi.settings holds a domain's rows too, written '@example.org': what
-- the domain's addresses have unless they set their own (an address row
-- wins over its domain's, and both over the configuration's value,
-- common/config/settings.c).  Only the options schema/options.def marks
-- OWNER may be set (pepsi.settings_option_problem checks the option and
-- the value with the programs' own code).  Operators set them with
-- pepsi-settings (pepsi.settings_set/unset, each change audited in
-- pepsi.event_log); an address's owner by mail to the settings address
-- (pepsi-stage-settings): the stage records the requested changes in
-- pepsi.settings_request with the hash of a single-use token it mails to
-- the owner, and applies them only when the owner answers with the token
-- before it expires (pepsi.settings_request_confirm).  The stage's role
-- may write neither table itself: the two request functions run as the
-- owner and check everything.
-- ===========================================================================

ALTER TABLE pepsi.settings DROP CONSTRAINT settings_address_check,
    ADD CONSTRAINT settings_address_check CHECK (address ~ '^[^@\s]*@[^@\s]+$');
COMMENT ON TABLE pepsi.settings IS
    'Per-address overrides written by account owners (a privilege boundary apart from config_override); @domain rows for a whole domain';

-- Why the owner of an address may not set option to value (a sentence),
-- or NULL when they may: options.def OWNER, and the value as its type wants.
CREATE FUNCTION pepsi.settings_option_problem(option text, value text) RETURNS text
AS 'MODULE_PATHNAME', 'settings_option_problem'
LANGUAGE C STABLE;

-- The canonical form of a settings row's key: an address (lower case,
-- as pepsi.virtual_mailbox_canonical) or a domain's '@example.org'.
CREATE FUNCTION pepsi.settings_key(address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := lower(btrim(address));
BEGIN
    IF address IS NULL THEN
        RAISE EXCEPTION 'address must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF key !~ '^[^@[:space:][:cntrl:]]*@[^@[:space:][:cntrl:]]+$' OR length(key) > 320 THEN
        RAISE EXCEPTION 'invalid address "%"', address
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An address (user@example.org) or a domain (@example.org), at most 320 characters.';
    END IF;
    RETURN key;
END
$$;

-- Set option of address (or '@domain') to value; audited.
CREATE FUNCTION pepsi.settings_set(address text, option text, value text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    problem text := pepsi.settings_option_problem(option, value);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pepsi.settings AS s (address, option, value)
    VALUES (key, settings_set.option, settings_set.value)
    ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
    PERFORM pepsi.event_log_write('settings_set',
        jsonb_build_object('address', key, 'option', option, 'value', left(value, 200)));
END
$$;

-- Remove option of address (or '@domain'); false if it was not set.  Audited.
CREATE FUNCTION pepsi.settings_unset(address text, option text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.settings s WHERE s.address = key AND s.option = settings_unset.option;
    removed := FOUND;
    PERFORM pepsi.event_log_write('settings_unset',
        jsonb_build_object('address', key, 'option', option, 'removed', removed));
    RETURN removed;
END
$$;

-- The settings in force for address: its own rows and its domain's it
-- does not override (source 'address' or 'domain').
CREATE FUNCTION pepsi.settings_resolved(address text)
RETURNS TABLE (option text, value text, source text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT DISTINCT ON (s.option) s.option, s.value,
           CASE WHEN s.address LIKE '@%' THEN 'domain' ELSE 'address' END
    FROM pepsi.settings s
    WHERE s.address = pepsi.settings_key(settings_resolved.address)
       OR s.address = '@' || split_part(pepsi.settings_key(settings_resolved.address), '@', 2)
    ORDER BY s.option, s.address LIKE '@%'
$$;

CREATE TABLE pepsi.settings_request (
    token_hash  bytea PRIMARY KEY,
    address     text NOT NULL CHECK (address ~ '^[^@\s]+@[^@\s]+$'),
    changes     jsonb NOT NULL CHECK (jsonb_typeof(changes) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);
CREATE INDEX settings_request_expires_at ON pepsi.settings_request (expires_at);
COMMENT ON TABLE pepsi.settings_request IS
    'Setting changes an owner asked for by mail, applied when the single-use token mailed to them comes back';

-- Record the changes (an object option -> value, null to unset) address
-- asked for, and return the token that confirms them within ttl (only
-- its hash is kept).  Requests that ended a day ago go.  Raises, naming
-- the problem, when a change is not one the owner may make.
CREATE FUNCTION pepsi.settings_request_create(address text, changes jsonb, ttl interval) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    change record;
    problem text;
BEGIN
    IF key LIKE '@%' THEN
        RAISE EXCEPTION 'only an address, not a domain, asks for its settings by mail'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(changes) IS DISTINCT FROM 'object' OR changes = '{}' THEN
        RAISE EXCEPTION 'changes must be a non-empty JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '30 days' THEN
        RAISE EXCEPTION 'invalid token lifetime %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to 30 days.';
    END IF;
    FOR change IN SELECT * FROM jsonb_each(changes) LOOP
        IF jsonb_typeof(change.value) NOT IN ('string', 'null') THEN
            RAISE EXCEPTION 'the value of % must be text or null', change.key
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        problem := pepsi.settings_option_problem(change.key,
                                                 coalesce(change.value #>> '{}', ''));
        IF problem IS NOT NULL AND NOT (jsonb_typeof(change.value) = 'null'
                                        AND pepsi.settings_option_problem(change.key, NULL) IS NULL) THEN
            RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    DELETE FROM pepsi.settings_request r WHERE r.expires_at < now() - interval '1 day';
    INSERT INTO pepsi.settings_request (token_hash, address, changes, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), key, changes, now() + ttl);
    PERFORM pepsi.event_log_write('settings_request',
        jsonb_build_object('address', key, 'options', (SELECT jsonb_agg(k ORDER BY k) FROM jsonb_object_keys(changes) k)));
    RETURN token;
END
$$;

-- Apply the changes token confirms for address, once: NULL when applied,
-- else why not (unknown, already used, expired, another address's).
-- Each change is audited as pepsi-settings' are.
CREATE FUNCTION pepsi.settings_request_confirm(address text, token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    request pepsi.settings_request;
    change record;
BEGIN
    SELECT * INTO request FROM pepsi.settings_request r
    WHERE r.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8')) FOR UPDATE;
    IF NOT FOUND OR request.address <> key THEN
        RETURN 'the token is not one this address was sent';
    ELSIF request.used_at IS NOT NULL THEN
        RETURN format('the token was already used (at %s)', to_char(request.used_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"'));
    ELSIF request.expires_at < now() THEN
        RETURN 'the token has expired: send the commands again';
    END IF;
    UPDATE pepsi.settings_request r SET used_at = now() WHERE r.token_hash = request.token_hash;
    FOR change IN SELECT * FROM jsonb_each(request.changes) LOOP
        IF jsonb_typeof(change.value) = 'null' THEN
            DELETE FROM pepsi.settings s WHERE s.address = key AND s.option = change.key;
            PERFORM pepsi.event_log_write('settings_unset',
                jsonb_build_object('address', key, 'option', change.key, 'by', 'mail'));
        ELSE
            INSERT INTO pepsi.settings AS s (address, option, value)
            VALUES (key, change.key, change.value #>> '{}')
            ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
            PERFORM pepsi.event_log_write('settings_set',
                jsonb_build_object('address', key, 'option', change.key,
                                   'value', left(change.value #>> '{}', 200), 'by', 'mail'));
        END IF;
    END LOOP;
    IF request.changes ? 'VACATION' OR request.changes ? 'VACATION_MESSAGE' THEN
        DELETE FROM pepsi.autoreply_sent a WHERE a.responder = key;
    END IF;
    RETURN NULL;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'settings_option_problem', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_key', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_unset', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_resolved', '{EXECUTE}'),
    ('pepsi_config', 'table', 'settings_request', '{SELECT}'),
    ('pepsi_stage', 'function', 'settings_option_problem', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_key', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_resolved', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_request_create', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_request_confirm', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('settings_set'), ('settings_unset'), ('settings_request_create'),
    ('settings_request_confirm');

SELECT pg_catalog.pg_extension_config_dump('pepsi.settings_request', '');
SELECT pepsi.grant_apply();
-- end of owner settings

-- ===========================================================================
-- The dispatcher's role: claiming and recovering rows
--
-- Claiming rows (workqueue_claim, workqueue_claim_tokens) and putting back
-- the rows of a worker that died (workqueue_crashed, workqueue_recover,
-- workqueue_reset_orphans, which also refuse a session without the
-- one-dispatcher advisory lock) are pepsi-dispatch's alone.  Granted to
-- pepsi_stage, any member could claim rows itself, or take the
-- dispatcher's lock while no dispatcher ran and recover rows other
-- workers hold.  They go to pepsi_dispatch, a member of pepsi_stage with
-- these rights besides; the stage workers' functions (commit, pause, split
-- with their claim token) stay pepsi_stage's.  The role is created if the
-- cluster lacks it; a login role of that name (as make run and pepsi-setup
-- made it) is kept, and becomes the dispatcher's.
-- ===========================================================================
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_dispatch', 'Pepsi: the dispatcher (pepsi-dispatch): pepsi_stage, and claims and recovers rows');
SELECT pepsi.grant_roles_create();
INSERT INTO pepsi.grant_membership VALUES ('pepsi_dispatch', 'pepsi_stage');
UPDATE pepsi.grant_rule SET role = 'pepsi_dispatch'
WHERE role = 'pepsi_stage' AND object_kind = 'function'
  AND object_name IN ('workqueue_claim', 'workqueue_claim_tokens', 'workqueue_crashed',
                      'workqueue_recover', 'workqueue_reset_orphans');
SELECT pepsi.grant_apply();
-- end of the dispatcher's role

UPDATE pepsi.schema_version SET version = '0.6';
