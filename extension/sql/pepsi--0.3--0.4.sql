/*
 * pepsi 0.3 -> 0.4: the schema changes made since 0.3.
 *
 * An existing 0.3 database reaches 0.4 with ALTER EXTENSION pepsi UPDATE;
 * CREATE EXTENSION pepsi installs pepsi--0.4.sql, the whole of 0.4.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue.  The scheme
 * (blocks, grants as data, every statement safe on a live queue) is the
 * one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.4'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Per-message functions in C (extension/src/destination.c,
-- reply_limits.c, gauges.c, ingress_stats.c)
--
-- pepsi.destination_begin (a relay-to-internet worker's every delivery),
-- pepsi.dsn_rate_take (a bounce stage's every DSN), pepsi.autoreply_due
-- (a vacation stage's every reply), pepsi.queue_gauge_refresh (every
-- maintenance pass) and pepsi.ingress_report (every ingress, every few
-- seconds) leave PL/pgSQL for C, with the same signatures, answers and
-- errors; pepsi.queue_gauges becomes plain SQL.  CREATE OR REPLACE resets
-- what grant_apply() set on a definer function, so the block ends with it.
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pepsi.queue_gauge_refresh(force boolean DEFAULT false,
                                                     min_period interval DEFAULT '1 second')
RETURNS boolean AS 'MODULE_PATHNAME', 'queue_gauge_refresh'
LANGUAGE C SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off;

CREATE OR REPLACE FUNCTION pepsi.queue_gauges()
RETURNS TABLE (stage text, status pepsi.status, messages bigint, held bigint,
               oldest_age_seconds double precision, as_of timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT pepsi.queue_gauge_refresh(true)
    WHERE coalesce((SELECT r.refreshed_at IS NULL OR r.counted < 20000
                           OR clock_timestamp() - r.refreshed_at > interval '1 minute'
                    FROM pepsi.queue_gauge_refresh r), true);
    SELECT g.stage, g.status, g.messages, g.held,
           extract(epoch FROM now() - g.oldest_received_at)::double precision,
           (SELECT r.refreshed_at FROM pepsi.queue_gauge_refresh r)
    FROM pepsi.queue_gauge g ORDER BY g.stage, g.status;
$$;

CREATE OR REPLACE FUNCTION pepsi.dsn_rate_take(sender text, per_hour integer) RETURNS boolean
AS 'MODULE_PATHNAME', 'dsn_rate_take'
LANGUAGE C SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp;

CREATE OR REPLACE FUNCTION pepsi.autoreply_due(responder text, recipient text, every interval) RETURNS boolean
AS 'MODULE_PATHNAME', 'autoreply_due'
LANGUAGE C SET search_path = pg_catalog, pepsi, pg_temp;

CREATE OR REPLACE FUNCTION pepsi.ingress_report(
    instance text, sessions integer, sessions_total bigint, messages bigint,
    stopping boolean DEFAULT false)
RETURNS void AS 'MODULE_PATHNAME', 'ingress_report' LANGUAGE C;

CREATE OR REPLACE FUNCTION pepsi.destination_begin(domain text, default_concurrency integer,
    hosts text[] DEFAULT NULL, previous_domain text DEFAULT NULL, previous_slot integer DEFAULT NULL,
    previous_host text DEFAULT NULL, previous_address inet DEFAULT NULL,
    previous_seconds double precision DEFAULT NULL,
    slow_seconds double precision DEFAULT NULL, slow_limit integer DEFAULT NULL,
    handoff_seconds double precision DEFAULT NULL, stage text DEFAULT NULL,
    OUT slot integer, OUT wait_seconds double precision, OUT reason text,
    OUT contended boolean, OUT addresses jsonb, OUT sts_policy_id text, OUT sts_policy text)
AS 'MODULE_PATHNAME', 'destination_begin' LANGUAGE C;

SELECT pepsi.grant_apply();

-- end of per-message functions in C

UPDATE pepsi.schema_version SET version = '0.4';
