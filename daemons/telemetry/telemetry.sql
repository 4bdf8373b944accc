-- pepsi-telemetry: the collector's own database (docs/pepsi-telemetry.8.md).
--
-- Not the pepsi extension: the collector runs on another host, with a
-- database of its own that holds no mail, only the reports
-- pepsi-telemetry-client sends.  Load it once, as the database's owner,
-- into an empty database:
--
--   createdb pepsi_telemetry
--   psql -d pepsi_telemetry -f /usr/share/pepsi-telemetry/telemetry.sql
--   createuser --login --role=pepsi_telemetry pepsi-telemetry
--
-- The group role pepsi_telemetry (made here when absent) may only call
-- telemetry.report_store and the totals functions: it reads and writes
-- no table itself.  Each function checks what it is given even though
-- the collector validated it first (daemons/telemetry/validate.c).

\set ON_ERROR_STOP on

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pepsi_telemetry') THEN
        CREATE ROLE pepsi_telemetry NOLOGIN;
    END IF;
END
$$;

CREATE SCHEMA telemetry;
REVOKE ALL ON SCHEMA telemetry FROM PUBLIC;
GRANT USAGE ON SCHEMA telemetry TO pepsi_telemetry;

CREATE TABLE telemetry.schema_version (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version     integer NOT NULL
);
INSERT INTO telemetry.schema_version (version) VALUES (1);

-- One row per install id: what its last report said.
CREATE TABLE telemetry.install (
    install_id          uuid PRIMARY KEY,
    first_seen          timestamptz NOT NULL DEFAULT now(),
    last_seen           timestamptz NOT NULL,
    reports             bigint NOT NULL DEFAULT 0,
    version             text NOT NULL,
    extension_version   text NOT NULL,
    hostname            text
);

-- Every report as it came, validated.
CREATE TABLE telemetry.report (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    install_id      uuid NOT NULL REFERENCES telemetry.install,
    received_at     timestamptz NOT NULL DEFAULT now(),
    payload         jsonb NOT NULL
);
CREATE INDEX report_install ON telemetry.report (install_id, received_at);

-- An install's volumes by day: a later report's figures for a day replace an earlier one's.
CREATE TABLE telemetry.volume (
    install_id  uuid NOT NULL REFERENCES telemetry.install,
    day         date NOT NULL,
    received    bigint NOT NULL CHECK (received >= 0),
    delivered   bigint NOT NULL CHECK (delivered >= 0),
    deferred    bigint NOT NULL CHECK (deferred >= 0),
    bounced     bigint NOT NULL CHECK (bounced >= 0),
    PRIMARY KEY (install_id, day)
);
CREATE INDEX volume_day ON telemetry.volume (day);

-- Store a report; NULL when stored, else why not (the install reported
-- less than min_interval ago: one report per interval per install id).
CREATE FUNCTION telemetry.report_store(report jsonb, min_interval interval) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, telemetry, pg_temp AS $$
DECLARE
    id   uuid := (report ->> 'install_id')::uuid;
    last timestamptz;
BEGIN
    IF jsonb_typeof(report -> 'days') <> 'array' OR jsonb_typeof(report -> 'version') <> 'string'
       OR jsonb_typeof(report -> 'extension_version') <> 'string' THEN
        RAISE EXCEPTION 'not a telemetry report' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO telemetry.install (install_id, last_seen, version, extension_version)
    VALUES (id, '-infinity', report ->> 'version', report ->> 'extension_version')
    ON CONFLICT (install_id) DO NOTHING;
    SELECT i.last_seen INTO last FROM telemetry.install i WHERE i.install_id = id FOR UPDATE;
    IF last > now() - min_interval THEN
        RETURN format('install id %s reported %s ago: one report per %s is stored', id,
                      date_trunc('second', now() - last), min_interval);
    END IF;
    UPDATE telemetry.install i
    SET last_seen = now(), reports = i.reports + 1, version = report ->> 'version',
        extension_version = report ->> 'extension_version', hostname = report ->> 'hostname'
    WHERE i.install_id = id;
    INSERT INTO telemetry.report (install_id, payload) VALUES (id, report);
    INSERT INTO telemetry.volume AS v (install_id, day, received, delivered, deferred, bounced)
    SELECT id, d.day, d.received, d.delivered, d.deferred, d.bounced
    FROM jsonb_to_recordset(report -> 'days')
         AS d (day date, received bigint, delivered bigint, deferred bigint, bounced bigint)
    ON CONFLICT (install_id, day) DO UPDATE
        SET received = EXCLUDED.received, delivered = EXCLUDED.delivered,
            deferred = EXCLUDED.deferred, bounced = EXCLUDED.bounced;
    RETURN NULL;
END
$$;

-- The totals page: installs (ever, and seen in the last 30 days), reports.
CREATE FUNCTION telemetry.totals_installs(OUT installs bigint, OUT active bigint, OUT reports bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, telemetry, pg_temp AS $$
    SELECT count(*), count(*) FILTER (WHERE i.last_seen > now() - interval '30 days'),
           coalesce(sum(i.reports), 0)::bigint
    FROM telemetry.install i
$$;

-- Installs by the version their last report gave.
CREATE FUNCTION telemetry.totals_versions()
RETURNS TABLE (version text, extension_version text, installs bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, telemetry, pg_temp AS $$
    SELECT i.version, i.extension_version, count(*) FROM telemetry.install i
    WHERE i.reports > 0 GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2
$$;

-- The volumes of every install summed by day, the last "days" days.
CREATE FUNCTION telemetry.totals_days(days integer)
RETURNS TABLE (day date, installs bigint, received bigint, delivered bigint, deferred bigint, bounced bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, telemetry, pg_temp AS $$
    SELECT v.day, count(*), sum(v.received)::bigint, sum(v.delivered)::bigint, sum(v.deferred)::bigint,
           sum(v.bounced)::bigint
    FROM telemetry.volume v WHERE v.day >= current_date - days
    GROUP BY v.day ORDER BY v.day DESC
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA telemetry FROM PUBLIC;
GRANT EXECUTE ON FUNCTION telemetry.report_store(jsonb, interval), telemetry.totals_installs(),
    telemetry.totals_versions(), telemetry.totals_days(integer) TO pepsi_telemetry;
