/*
 * pepsi 0.7 -> 0.8: the schema changes made since 0.7.
 *
 * 0.7 was released with dispatcher stage sets, the confirm-to-send
 * secretary, the key store, quotas, mailing lists and the pepsi_whitelist
 * role; every schema change since is a block here, placed before the
 * final UPDATE of pepsi.schema_version, and folded into pepsi--0.8.sql
 * (new objects at its end).  An existing 0.7 database reaches 0.8 with
 * ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi installs
 * pepsi--0.8.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every
 * statement safe on a live queue) is the one pepsi--0.1--0.2.sql describes
 * and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.8'" to load this file. \quit

-- ===========================================================================
-- telemetry: message volumes by day
--
-- pepsi-telemetry-client (opt-in) reports the messages received,
-- delivered, deferred and bounced per UTC day, and nothing per message.
-- The counters are totals since installation (pepsi.stats_totals), so the
-- maintenance worker's first roll of each day (pepsi.stats_minute_roll)
-- keeps them in pepsi.stats_day, 400 days, and a day's volume is the next
-- day's totals less its own.
-- ===========================================================================

CREATE OR REPLACE FUNCTION pepsi.stats_minute_roll() RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    stored boolean;
BEGIN
    INSERT INTO pepsi.stats_minute
    SELECT date_trunc('minute', now()), t.* FROM pepsi.stats_totals() t
    ON CONFLICT ON CONSTRAINT stats_minute_pkey DO NOTHING;
    stored := FOUND;
    DELETE FROM pepsi.stats_minute m WHERE m.minute < now() - interval '25 hours';
    -- The day's first roll keeps the totals for pepsi.stats_daily (telemetry).
    INSERT INTO pepsi.stats_day
    SELECT (now() AT TIME ZONE 'UTC')::date, t.received, t.sent, t.deferred, t.bounced
    FROM pepsi.stats_totals() t
    ON CONFLICT ON CONSTRAINT stats_day_pkey DO NOTHING;
    DELETE FROM pepsi.stats_day d WHERE d.day < (now() AT TIME ZONE 'UTC')::date - 400;
    RETURN stored;
END
$$;

CREATE TABLE pepsi.stats_day (
    day         date PRIMARY KEY,
    received    bigint NOT NULL,
    sent        bigint NOT NULL,
    deferred    bigint NOT NULL,
    bounced     bigint NOT NULL
);
COMMENT ON TABLE pepsi.stats_day IS
    'The totals of pepsi.stats_totals at the first minute of each UTC day (maintenance worker), 400 days';

-- The complete UTC days of the last "days" (today excluded) whose two
-- ends are known, with what was received, delivered, deferred and bounced
-- in each.
CREATE FUNCTION pepsi.stats_daily(days integer DEFAULT 7)
RETURNS TABLE (day date, received bigint, delivered bigint, deferred bigint, bounced bigint)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF days IS NULL OR days < 1 OR days > 366 THEN
        RAISE EXCEPTION 'days must be from 1 to 366'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH points AS (
        SELECT d.day, d.received, d.sent, d.deferred, d.bounced FROM pepsi.stats_day d
        WHERE d.day >= (now() AT TIME ZONE 'UTC')::date - days
    ), steps AS (
        SELECT p.day, lead(p.day) OVER w AS next_day,
               greatest(lead(p.received) OVER w - p.received, 0) AS received,
               greatest(lead(p.sent) OVER w - p.sent, 0) AS delivered,
               greatest(lead(p.deferred) OVER w - p.deferred, 0) AS deferred,
               greatest(lead(p.bounced) OVER w - p.bounced, 0) AS bounced
        FROM points p WINDOW w AS (ORDER BY p.day)
    )
    SELECT s.day, s.received, s.delivered, s.deferred, s.bounced
    FROM steps s WHERE s.next_day = s.day + 1
    ORDER BY s.day;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_monitor', 'table', 'stats_day', '{SELECT}'),
    ('pepsi_monitor', 'function', 'stats_daily', '{EXECUTE}'),
    ('pepsi_config', 'table', 'stats_day', '{SELECT}');

SELECT pg_catalog.pg_extension_config_dump('pepsi.stats_day', '');
SELECT pepsi.grant_apply();
-- end of telemetry

UPDATE pepsi.schema_version SET version = '0.8';
