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

-- ===========================================================================
-- pepsi-httpd's web page: history, histograms, SMTP refusals
--
-- The page's charts read a small history the maintenance worker keeps,
-- never the queue: once a minute it stores the totals as they then are
-- (messages received, delivery attempts by outcome, SMTP refusals, the
-- delivery-delay histogram, and the queue's depth per stage from the
-- gauges' snapshot) in pepsi.stats_minute, and drops rows past a day.
-- A minute's traffic is the difference between its row and the next;
-- pepsi.stats_history() adds the minute in progress, live.
--
-- The totals are kept where their writers already write in batches: the
-- dispatcher's statistics flush adds its histograms of stage run time and
-- delivery delay (pepsi.stage_histogram_add); each pepsi-ingress's report,
-- every few seconds, carries its counts since it started (messages, and
-- refusals by reply code), and pepsi.ingress_report adds what is new since
-- its last report to pepsi.ingress_total and pepsi.smtp_refusal.
-- ===========================================================================

CREATE TABLE pepsi.stage_histogram (
    stage       text NOT NULL,
    metric      text NOT NULL CHECK (metric IN ('run_seconds', 'delivery_delay_seconds')),
    le          double precision[] NOT NULL,
    buckets     bigint[] NOT NULL CHECK (cardinality(buckets) = cardinality(le) + 1),
    sum         double precision NOT NULL DEFAULT 0,
    count       bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, metric)
);
COMMENT ON TABLE pepsi.stage_histogram IS
    'Histograms by stage, added to by the dispatcher: run_seconds (worker time per message) and delivery_delay_seconds (receipt to a sent delivery); buckets[i] counts observations at most le[i] and above le[i-1], the last one those above every bound';

CREATE TABLE pepsi.ingress_total (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    messages    bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pepsi.ingress_total DEFAULT VALUES;
COMMENT ON TABLE pepsi.ingress_total IS
    'Messages every pepsi-ingress stored, over its restarts (from pepsi.ingress_report)';

CREATE TABLE pepsi.smtp_refusal (
    code        integer PRIMARY KEY CHECK (code BETWEEN 400 AND 599),
    refusals    bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.smtp_refusal IS
    'SMTP replies pepsi-ingress refused with, by code, over its restarts (from pepsi.ingress_report)';

CREATE TABLE pepsi.stats_minute (
    minute          timestamptz PRIMARY KEY,
    received        bigint NOT NULL,
    sent            bigint NOT NULL,
    deferred        bigint NOT NULL,
    bounced         bigint NOT NULL,
    expired         bigint NOT NULL,
    refused         bigint NOT NULL,
    delivery_delay  bigint[] NOT NULL,
    queue           jsonb NOT NULL
);
COMMENT ON TABLE pepsi.stats_minute IS
    'The totals at the start of each minute of the last day (maintenance worker): counters since installation, and the queue''s messages per stage';

-- Add the dispatcher's observations since its last flush: a JSON array of
-- {stage, metric, le, buckets, sum, count}.  Bounds that changed (another
-- version of the dispatcher) start the histogram again.
CREATE FUNCTION pepsi.stage_histogram_add(observations jsonb) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    INSERT INTO pepsi.stage_histogram AS t (stage, metric, le, buckets, sum, count, updated_at)
    SELECT o.stage, o.metric, o.le, o.buckets, o.sum, o.count, now()
    FROM jsonb_to_recordset(observations)
         AS o (stage text, metric text, le double precision[], buckets bigint[], sum double precision,
               count bigint)
    ON CONFLICT ON CONSTRAINT stage_histogram_pkey DO UPDATE
        SET buckets = CASE WHEN t.le = EXCLUDED.le
                           THEN (SELECT array_agg(a + b ORDER BY i)
                                 FROM unnest(t.buckets, EXCLUDED.buckets) WITH ORDINALITY AS u (a, b, i))
                           ELSE EXCLUDED.buckets END,
            sum = CASE WHEN t.le = EXCLUDED.le THEN t.sum + EXCLUDED.sum ELSE EXCLUDED.sum END,
            count = CASE WHEN t.le = EXCLUDED.le THEN t.count + EXCLUDED.count ELSE EXCLUDED.count END,
            le = EXCLUDED.le, updated_at = now()
$$;

-- The totals now: what a row of pepsi.stats_minute holds.  As the owner:
-- the queue's depth is the gauges' snapshot, which no group role reads.
CREATE FUNCTION pepsi.stats_totals(
    OUT received bigint, OUT sent bigint, OUT deferred bigint, OUT bounced bigint, OUT expired bigint,
    OUT refused bigint, OUT delivery_delay bigint[], OUT queue jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT (SELECT coalesce(sum(i.messages), 0)::bigint FROM pepsi.ingress_total i),
           coalesce(sum(s.deliveries_sent), 0)::bigint, coalesce(sum(s.deliveries_deferred), 0)::bigint,
           coalesce(sum(s.deliveries_bounced), 0)::bigint, coalesce(sum(s.deliveries_expired), 0)::bigint,
           (SELECT coalesce(sum(r.refusals), 0)::bigint FROM pepsi.smtp_refusal r),
           (SELECT coalesce(array_agg(b.n ORDER BY b.i), '{}')
            FROM (SELECT u.i, sum(u.n)::bigint AS n
                  FROM pepsi.stage_histogram h, unnest(h.buckets) WITH ORDINALITY AS u (n, i)
                  WHERE h.metric = 'delivery_delay_seconds' GROUP BY u.i) b),
           (SELECT coalesce(jsonb_object_agg(g.stage, g.messages), '{}')
            FROM (SELECT q.stage, sum(q.messages) AS messages FROM pepsi.queue_gauge q
                  GROUP BY q.stage) g)
    FROM pepsi.stage_stats s
$$;

-- The maintenance worker's, once a minute: the minute's row (once), and
-- rows past a day and an hour dropped.  Returns whether it stored one.
CREATE FUNCTION pepsi.stats_minute_roll() RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    stored boolean;
BEGIN
    INSERT INTO pepsi.stats_minute
    SELECT date_trunc('minute', now()), t.* FROM pepsi.stats_totals() t
    ON CONFLICT ON CONSTRAINT stats_minute_pkey DO NOTHING;
    stored := FOUND;
    DELETE FROM pepsi.stats_minute m WHERE m.minute < now() - interval '25 hours';
    RETURN stored;
END
$$;

-- Traffic per step over the last span, the minute in progress included:
-- each row is the step starting at "at", with what was received, sent,
-- deferred, bounced, expired and refused in it, and the queue's messages
-- per stage at its end (now, for the step in progress).
CREATE FUNCTION pepsi.stats_history(span interval DEFAULT '1 hour', step interval DEFAULT '1 minute')
RETURNS TABLE (at timestamptz, received bigint, sent bigint, deferred bigint, bounced bigint,
               expired bigint, refused bigint, queue jsonb)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF span IS NULL OR span <= '0' OR span > interval '25 hours' THEN
        RAISE EXCEPTION 'span must be more than 0 and at most 25 hours'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF step IS NULL OR step < interval '1 minute' OR step > span THEN
        RAISE EXCEPTION 'step must be at least a minute and at most the span'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH points AS (
        SELECT m.minute AS at, m.received, m.sent, m.deferred, m.bounced, m.expired, m.refused, m.queue
        FROM pepsi.stats_minute m WHERE m.minute >= now() - span - step
        UNION ALL
        SELECT now(), t.received, t.sent, t.deferred, t.bounced, t.expired, t.refused, t.queue
        FROM pepsi.stats_totals() t
    ), deltas AS (
        SELECT lag(p.at) OVER w AS at,
               greatest(p.received - lag(p.received) OVER w, 0) AS received,
               greatest(p.sent - lag(p.sent) OVER w, 0) AS sent,
               greatest(p.deferred - lag(p.deferred) OVER w, 0) AS deferred,
               greatest(p.bounced - lag(p.bounced) OVER w, 0) AS bounced,
               greatest(p.expired - lag(p.expired) OVER w, 0) AS expired,
               greatest(p.refused - lag(p.refused) OVER w, 0) AS refused,
               p.queue
        FROM points p WINDOW w AS (ORDER BY p.at)
    )
    SELECT date_bin(step, d.at, timestamptz '2000-01-01 00:00:00+00') AS bin,
           sum(d.received)::bigint, sum(d.sent)::bigint, sum(d.deferred)::bigint,
           sum(d.bounced)::bigint, sum(d.expired)::bigint, sum(d.refused)::bigint,
           (array_agg(d.queue ORDER BY d.at DESC))[1]
    FROM deltas d
    WHERE d.at IS NOT NULL AND d.at >= date_bin(step, now() - span, timestamptz '2000-01-01 00:00:00+00')
    GROUP BY bin ORDER BY bin;
END
$$;

-- Percentiles of delivery delay (receipt to a sent delivery) over the last
-- span, from the histogram's growth since then (its buckets, interpolated
-- within one as Prometheus's histogram_quantile does; a quantile in the
-- last, unbounded bucket is given as the highest bound).
CREATE FUNCTION pepsi.stats_delivery_delay(span interval DEFAULT '1 hour')
RETURNS TABLE (quantile double precision, seconds double precision, deliveries bigint)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    bounds double precision[];
    now_buckets bigint[];
    then_buckets bigint[];
    growth bigint[] := '{}';
    total bigint := 0;
    q double precision;
    rank double precision;
    below bigint;
    n bigint;
BEGIN
    SELECT h.le INTO bounds FROM pepsi.stage_histogram h
    WHERE h.metric = 'delivery_delay_seconds' ORDER BY h.updated_at DESC LIMIT 1;
    SELECT t.delivery_delay INTO now_buckets FROM pepsi.stats_totals() t;
    SELECT m.delivery_delay INTO then_buckets FROM pepsi.stats_minute m
    WHERE m.minute >= now() - span ORDER BY m.minute LIMIT 1;
    IF bounds IS NULL OR cardinality(now_buckets) <> cardinality(bounds) + 1 THEN
        RETURN;
    END IF;
    FOR i IN 1 .. cardinality(now_buckets) LOOP
        n := greatest(now_buckets[i] - CASE WHEN cardinality(then_buckets) = cardinality(now_buckets)
                                            THEN then_buckets[i] ELSE 0 END, 0);
        growth := growth || n;
        total := total + n;
    END LOOP;
    FOREACH q IN ARRAY ARRAY[0.5, 0.9, 0.99] LOOP
        quantile := q;
        deliveries := total;
        seconds := NULL;
        IF total > 0 THEN
            rank := q * total;
            below := 0;
            FOR i IN 1 .. cardinality(growth) LOOP
                IF below + growth[i] >= rank AND growth[i] > 0 THEN
                    IF i > cardinality(bounds) THEN
                        seconds := bounds[cardinality(bounds)];
                    ELSE
                        seconds := coalesce(bounds[i - 1], 0)
                                   + (bounds[i] - coalesce(bounds[i - 1], 0)) * (rank - below) / growth[i];
                    END IF;
                    EXIT;
                END IF;
                below := below + growth[i];
            END LOOP;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The destinations the page shows: those with mail waiting to be retried
-- or a delivery failure remembered, with their last error (the
-- destination's, else the newest waiting message's) and the TLS policy the
-- relay holds for them (MTA-STS).  Reads the queue's paused rows, on
-- demand.
CREATE FUNCTION pepsi.destination_overview(max_rows integer DEFAULT 100)
RETURNS TABLE (domain text, deferred bigint, failures integer, backoff_until timestamptz,
               last_error text, last_success timestamptz, concurrency_limit integer,
               messages_per_minute integer, tls_policy text, tls_policy_expires_at timestamptz)
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
           p.mode, p.expires_at
    FROM counted c
    FULL JOIN (SELECT * FROM pepsi.destination x
               WHERE x.failures > 0 OR x.backoff_until > now() OR x.last_error IS NOT NULL) d
           ON d.domain = c.domain
    LEFT JOIN pepsi.mta_sts_policy p ON p.domain = coalesce(c.domain, d.domain) AND p.expires_at > now()
    ORDER BY coalesce(c.deferred, 0) DESC, coalesce(d.failures, 0) DESC, 1
    LIMIT least(greatest(coalesce(max_rows, 100), 1), 1000)
$$;

-- pepsi.mail_log for pepsi-httpd, which may not read the table: one
-- message's history (oldest first), or the last events of a kind (newest
-- first).
CREATE FUNCTION pepsi.mail_log_read(message_id bigint DEFAULT NULL, event text DEFAULT NULL,
                                    max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, at timestamptz, workqueue_id bigint, event text, detail jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT l.id, l.at, l.workqueue_id, l.event, l.detail FROM pepsi.mail_log l
    WHERE mail_log_read.message_id IS NOT NULL AND l.workqueue_id = mail_log_read.message_id
      AND (mail_log_read.event IS NULL OR l.event = mail_log_read.event)
    UNION ALL
    (SELECT l.id, l.at, l.workqueue_id, l.event, l.detail FROM pepsi.mail_log l
     WHERE mail_log_read.message_id IS NULL
       AND (mail_log_read.event IS NULL OR l.event = mail_log_read.event)
     ORDER BY l.id DESC LIMIT least(greatest(coalesce(max_rows, 50), 1), 1000))
    ORDER BY 1
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_monitor', 'table', 'stage_histogram', '{SELECT}'),
    ('pepsi_monitor', 'table', 'ingress_total', '{SELECT}'),
    ('pepsi_monitor', 'table', 'smtp_refusal', '{SELECT}'),
    ('pepsi_monitor', 'table', 'stats_minute', '{SELECT}'),
    ('pepsi_monitor', 'function', 'stats_totals', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'stats_history', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'stats_delivery_delay', '{EXECUTE}'),
    ('pepsi_config', 'table', 'stage_histogram', '{SELECT}'),
    ('pepsi_config', 'table', 'ingress_total', '{SELECT}'),
    ('pepsi_config', 'table', 'smtp_refusal', '{SELECT}'),
    ('pepsi_config', 'table', 'stats_minute', '{SELECT}'),
    ('pepsi_stage', 'function', 'stage_histogram_add', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'destination_overview', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'mail_log_read', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES
    ('stage_histogram_add'), ('stats_totals'), ('destination_overview'), ('mail_log_read');
INSERT INTO pepsi.grant_owner (name) VALUES ('stats_minute_roll');

SELECT pg_catalog.pg_extension_config_dump('pepsi.stage_histogram', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.smtp_refusal', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.stats_minute', '');

-- ingress_stats remembers each instance's refusals, and ingress_report
-- takes them (an older pepsi-ingress's five arguments still do).
ALTER TABLE pepsi.ingress_stats ADD COLUMN refusals jsonb NOT NULL DEFAULT '{}';
DROP FUNCTION pepsi.ingress_report(text, integer, bigint, bigint, boolean);
-- The instance's row as of now; with stopping, the row goes.  Rows of an
-- instance that died without saying so are past their updated_at: readers
-- ignore rows older than a minute, and each report removes those a day old.
-- What the instance counted since its last report (messages, and refusals:
-- a JSON object of reply code to count since it started) is added to
-- pepsi.ingress_total and pepsi.smtp_refusal, which outlive it.
CREATE FUNCTION pepsi.ingress_report(
    instance text, sessions integer, sessions_total bigint, messages bigint,
    stopping boolean DEFAULT false, refusals jsonb DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    previous pepsi.ingress_stats;
BEGIN
    IF instance IS NULL OR instance !~ '^[[:print:]]{1,255}$' THEN
        RAISE EXCEPTION 'instance must be 1 to 255 printable characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF sessions < 0 OR sessions_total < 0 OR messages < 0 THEN
        RAISE EXCEPTION 'ingress counters cannot be negative'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF refusals IS NOT NULL AND (jsonb_typeof(refusals) <> 'object'
        OR EXISTS (SELECT FROM jsonb_each(refusals) r
                   WHERE r.key !~ '^[45][0-9][0-9]$' OR jsonb_typeof(r.value) <> 'number'
                      OR (r.value #>> '{}') !~ '^[0-9]{1,18}$')) THEN
        RAISE EXCEPTION 'refusals must map three-digit 4xx and 5xx reply codes to counts'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF stopping THEN
        DELETE FROM pepsi.ingress_stats s WHERE s.instance = ingress_report.instance;
        RETURN;
    END IF;
    SELECT * INTO previous FROM pepsi.ingress_stats s WHERE s.instance = ingress_report.instance FOR UPDATE;
    IF ingress_report.messages > coalesce(previous.messages, 0) THEN
        UPDATE pepsi.ingress_total
        SET messages = ingress_total.messages + ingress_report.messages - coalesce(previous.messages, 0),
            updated_at = now();
    END IF;
    INSERT INTO pepsi.smtp_refusal AS t (code, refusals)
    SELECT r.key::integer, r.value::bigint - coalesce((previous.refusals ->> r.key)::bigint, 0)
    FROM jsonb_each_text(coalesce(refusals, '{}')) r
    WHERE r.value::bigint > coalesce((previous.refusals ->> r.key)::bigint, 0)
    ORDER BY 1
    ON CONFLICT ON CONSTRAINT smtp_refusal_pkey DO UPDATE
        SET refusals = t.refusals + EXCLUDED.refusals, updated_at = now();
    INSERT INTO pepsi.ingress_stats AS s (instance, sessions, sessions_total, messages, refusals)
    VALUES (ingress_report.instance, ingress_report.sessions, ingress_report.sessions_total,
            ingress_report.messages, coalesce(refusals, '{}'))
    ON CONFLICT ON CONSTRAINT ingress_stats_pkey DO UPDATE
        SET sessions = EXCLUDED.sessions, sessions_total = EXCLUDED.sessions_total,
            messages = EXCLUDED.messages, refusals = EXCLUDED.refusals, updated_at = now();
    DELETE FROM pepsi.ingress_stats s WHERE s.updated_at < now() - interval '1 day';
END
$$;

SELECT pepsi.grant_apply();

-- end of pepsi-httpd's web page

-- ===========================================================================
-- Claim tokens: a stage changes only the rows it was handed
-- ===========================================================================

-- The digest of each running row's claim token (nullable, no default: no
-- rewrite of the queue; the rows in flight keep NULL, which the
-- transitions without a token, those of the running programs, match).
ALTER TABLE pepsi.workqueue ADD COLUMN claim_digest bytea;

-- The claim that also returns each row's claim token (a fresh random uuid;
-- the row keeps only its SHA-256 digest, workqueue.claim_digest), and the
-- overloads of the worker's transitions that take it: a row claimed with a
-- token is changed only by a call naming that token, so a worker changes
-- only the rows it was handed, and one whose row was claimed again since
-- (a crash, an orphan reset) is refused.  The overloads without a token,
-- kept for the programs before 0.4, match only rows claimed without one
-- (by workqueue_claim).  Every argument is required, so that no call is
-- ambiguous between the two; a NULL token is the same as none.
CREATE FUNCTION pepsi.workqueue_claim_tokens(
    stages text[], capacities integer[],
    account_stages text[] DEFAULT NULL, account_senders text[] DEFAULT NULL,
    account_used double precision[] DEFAULT NULL,
    fifo_percent integer DEFAULT 10,
    row_costs double precision[] DEFAULT NULL)
RETURNS TABLE (id bigint, stage text, sender_key text, claim_token uuid)
AS 'MODULE_PATHNAME', 'workqueue_claim' LANGUAGE C CALLED ON NULL INPUT VOLATILE
    SET enable_seqscan = off SET jit = off SET enable_bitmapscan = off SET enable_sort = off;

CREATE FUNCTION pepsi.workqueue_commit(
    id bigint, expected_stage text, transition pepsi.transition,
    target_stage text, merge_state jsonb, retry_seconds double precision,
    set_headers bytea, set_body bytea, set_mail_from text, set_rcpt_to text[],
    set_state jsonb, at_stage text, claim_token uuid)
RETURNS void AS 'MODULE_PATHNAME', 'workqueue_commit' LANGUAGE C CALLED ON NULL INPUT
    SET enable_seqscan = off SET jit = off;

CREATE FUNCTION pepsi.workqueue_commit_many(
    ids bigint[], expected_stages text[], transition pepsi.transition,
    target_stages text[], merge_states jsonb[], retry_seconds double precision[],
    claim_tokens uuid[])
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_commit_many' LANGUAGE C CALLED ON NULL INPUT
    SET enable_seqscan = off SET jit = off;

CREATE FUNCTION pepsi.workqueue_pause(
    id bigint, expected_stage text, retry_seconds double precision,
    merge_state jsonb, keep_indices integer[], clones jsonb, at_stage text, claim_token uuid)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_pause' LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION pepsi.workqueue_finish_with_clones(
    id bigint, expected_stage text, clones jsonb, claim_token uuid)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_finish_with_clones' LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION pepsi.workqueue_split(
    id bigint, expected_stage text, keep_indices integer[], groups jsonb, claim_token uuid)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_split' LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION pepsi.workqueue_split_off(
    id bigint, expected_stage text, rcpt_indices integer[], target_stage text, claim_token uuid)
RETURNS bigint AS 'MODULE_PATHNAME', 'workqueue_split_off' LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION pepsi.workqueue_split_one_per_row(id bigint, expected_stage text, claim_token uuid)
RETURNS bigint[] AS 'MODULE_PATHNAME', 'workqueue_split_one_per_row' LANGUAGE C CALLED ON NULL INPUT;

-- pepsi_stage changes the queue, the bodies, the DNS address cache and the
-- destination table only through the functions, which run as the owner.
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'workqueue_claim_tokens', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES
    ('destination_begin'),
    ('destination_end'),
    ('dns_address_store'),
    ('workqueue_body_gc'),
    ('workqueue_claim'),
    ('workqueue_claim_tokens'),
    ('workqueue_commit'),
    ('workqueue_commit_many'),
    ('workqueue_finish_with_clones'),
    ('workqueue_pause'),
    ('workqueue_recover'),
    ('workqueue_requeue_due'),
    ('workqueue_reset_orphans'),
    ('workqueue_resume'),
    ('workqueue_split'),
    ('workqueue_split_off'),
    ('workqueue_split_one_per_row');
-- pepsi_stage keeps SELECT (the stage runtime's row load) and loses
-- INSERT, UPDATE and DELETE on the tables the functions above write.
UPDATE pepsi.grant_rule SET privileges = '{SELECT}'
WHERE role = 'pepsi_stage' AND object_kind = 'table'
  AND object_name IN ('destination', 'dns_address', 'workqueue', 'workqueue_body');

-- The recovery of running rows (workqueue_crashed, workqueue_recover,
-- workqueue_reset_orphans) refuses a session without the one-dispatcher
-- advisory lock, unless a superuser calls it: a stage worker, a member of
-- the same role, must not put another worker's row back to be claimed.
CREATE FUNCTION pepsi.dispatcher_check(what text) RETURNS void
    AS 'MODULE_PATHNAME', 'dispatcher_check' LANGUAGE C;
INSERT INTO pepsi.grant_owner (name) VALUES ('dispatcher_check');

CREATE OR REPLACE FUNCTION pepsi.workqueue_recover(
    ids bigint[], expected_stages text[], new_status pepsi.status, reason text DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql AS $$
BEGIN
    RETURN pepsi.workqueue_recover(ids, expected_stages, new_status, reason, NULL::uuid[]);
END;
$$;

-- The dispatcher's recovery of the rows it handed out names their claim
-- tokens, so that it leaves alone a row claimed again since (a row an
-- operator paused and the claim took again, say): the overloads of
-- workqueue_crashed and workqueue_recover taking them.  claim_tokens NULL:
-- no check (workqueue_recover of the programs before 0.4).
CREATE FUNCTION pepsi.workqueue_crashed(
    id bigint, expected_stage text, reason text, crash_limit integer,
    retry_seconds double precision, final_status text, claim_token uuid)
RETURNS text AS 'MODULE_PATHNAME', 'workqueue_crashed' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

CREATE FUNCTION pepsi.workqueue_recover(
    ids bigint[], expected_stages text[], new_status pepsi.status, reason text, claim_tokens uuid[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    changed bigint[];
BEGIN
    IF ids IS NULL OR expected_stages IS NULL OR new_status IS NULL THEN
        RAISE EXCEPTION 'ids, expected_stages and new_status must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM pepsi.dispatcher_check('workqueue_recover');
    IF cardinality(ids) <> cardinality(expected_stages) THEN
        RAISE EXCEPTION 'expected_stages has % elements but ids has %',
            cardinality(expected_stages), cardinality(ids)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The arrays are parallel: element i of each describes the same row.';
    END IF;
    IF cardinality(claim_tokens) <> cardinality(ids) THEN
        RAISE EXCEPTION 'claim_tokens has % elements but ids has %',
            cardinality(claim_tokens), cardinality(ids)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'The arrays are parallel: element i is the claim token of row i.';
    END IF;
    IF new_status NOT IN ('pending', 'failed', 'timeout') THEN
        RAISE EXCEPTION 'a recovered row goes to pending, failed or timeout, not %', new_status
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Paused rows come from a stage''s own pause.';
    END IF;
    IF new_status <> 'pending' AND (reason IS NULL OR reason = '') THEN
        RAISE EXCEPTION 'a row forced to % needs a reason', new_status
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = 'The reason is recorded in state.dispatch_error for the operator.';
    END IF;
    WITH recovered AS (
        UPDATE pepsi.workqueue w
        SET status = new_status,
            state = CASE WHEN new_status = 'pending' THEN w.state
                         ELSE w.state || jsonb_build_object('dispatch_error', reason) END
        FROM unnest(ids, expected_stages, claim_tokens) AS u(id, stage, token)
        WHERE w.id = u.id AND w.stage = u.stage AND w.status = 'running'
          AND (claim_tokens IS NULL OR w.claim_digest IS NOT DISTINCT FROM sha256(uuid_send(u.token)))
        RETURNING w.id)
    SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO changed FROM recovered;
    RETURN changed;
END;
$$;
SELECT pepsi.grant_apply();
-- end of claim tokens

-- ---------------------------------------------------------------------------
-- One queue id (common/message/queue_id.h): the message's name from ingress on,
-- carried by every row split from it in state.queue_id, and the column of
-- pepsi.mail_log that finds a message's events across its rows.
-- ---------------------------------------------------------------------------
ALTER TABLE pepsi.mail_log ADD COLUMN queue_id text;
COMMENT ON COLUMN pepsi.mail_log.queue_id IS
    'The message''s queue id (state.queue_id of its rows); workqueue_id is the row';
CREATE INDEX mail_log_queue_id ON pepsi.mail_log (queue_id);

-- pepsi-httpd's page of the queue shows it: a new result column, so the
-- function is made anew (and granted again).
DROP FUNCTION pepsi.queue_list(text, pepsi.status, text, integer, bigint);
-- Newest first; before_id pages on; search matches the sender or a
-- recipient (case-insensitive substring).
CREATE FUNCTION pepsi.queue_list(stage text DEFAULT NULL, status pepsi.status DEFAULT NULL,
                                 search text DEFAULT NULL, max_rows integer DEFAULT 100,
                                 before_id bigint DEFAULT NULL)
RETURNS TABLE (id bigint, queue_id text, stage text, status pepsi.status, held boolean,
               received_at timestamptz, age_seconds double precision, retry_at timestamptz,
               mail_from text, rcpt_to text[], size bigint, last_error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT w.id, coalesce(w.state ->> 'queue_id', w.id::text), w.stage, w.status,
           w.status = 'paused' AND w.timeout = 'infinity', w.received_at,
           extract(epoch FROM now() - w.received_at)::double precision,
           CASE WHEN w.timeout < 'infinity' THEN w.timeout END,
           w.mail_from, w.rcpt_to, length(w.headers) + 2 + length(b.body),
           coalesce(w.state ->> 'last_error', w.state ->> 'dispatch_error')
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE (queue_list.stage IS NULL OR w.stage = queue_list.stage)
      AND (queue_list.status IS NULL OR w.status = queue_list.status)
      AND (queue_list.before_id IS NULL OR w.id < queue_list.before_id)
      AND (queue_list.search IS NULL
           OR strpos(lower(w.mail_from), lower(queue_list.search)) > 0
           OR EXISTS (SELECT FROM unnest(w.rcpt_to) r WHERE strpos(lower(r), lower(queue_list.search)) > 0))
    ORDER BY w.id DESC
    LIMIT least(greatest(coalesce(max_rows, 100), 1), 1000)
$$;

SELECT pepsi.grant_apply();
-- end of one queue id
-- ---------------------------------------------------------------------------
-- Per-message functions in C (extension/src/destination.c,
-- reply_limits.c, gauges.c)
--
-- pepsi.destination_begin (a relay-to-internet worker's every delivery),
-- pepsi.dsn_rate_take (a bounce stage's every DSN), pepsi.autoreply_due
-- (a vacation stage's every reply), pepsi.queue_gauge_refresh (every
-- maintenance pass) leave PL/pgSQL for C, with the same signatures,
-- answers and errors; pepsi.queue_gauges becomes plain SQL.
-- (pepsi.ingress_report, once every few seconds per ingress, stays
-- PL/pgSQL: the web page's block above gives it its refusals.)  CREATE OR REPLACE resets
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
