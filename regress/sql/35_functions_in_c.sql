--
-- The functions called per message or per pass that moved from PL/pgSQL
-- to C or plain SQL (extension/src/reply_limits.c, gauges.c,
-- destination.c): their answers, the NULLs and bad arguments refused
-- with a clear error, nothing written by a refused call.  And
-- ingress_report's (PL/pgSQL: once every few seconds, not per message).
--
\set SHOW_CONTEXT never

SELECT coalesce(max(id), 0) AS events_before FROM pepsi.event_log \gset

-- Per clock hour and sender, case-insensitive; past the limit false, and
-- each refusal in the event log.
SELECT pepsi.dsn_rate_take('Alice@Example.org', 2) AS first,
       pepsi.dsn_rate_take('alice@example.org', 2) AS second,
       pepsi.dsn_rate_take('ALICE@example.org', 2) AS third,
       pepsi.dsn_rate_take('bob@example.org', 2) AS other;
SELECT sender, sent, hour = date_trunc('hour', now()) AS this_hour FROM pepsi.dsn_rate ORDER BY sender;
SELECT action, detail FROM pepsi.event_log WHERE id > :events_before ORDER BY id;
-- A new hour starts the count afresh.
UPDATE pepsi.dsn_rate SET hour = hour - interval '1 hour';
SELECT pepsi.dsn_rate_take('alice@example.org', 1) AS next_hour;
SELECT sender, sent FROM pepsi.dsn_rate WHERE sender = 'alice@example.org';
-- Refused: no sender, an empty one, no limit, a limit below 1.
SELECT pepsi.dsn_rate_take(NULL, 1);
SELECT pepsi.dsn_rate_take('', 1);
SELECT pepsi.dsn_rate_take('carol@example.org', NULL);
SELECT pepsi.dsn_rate_take('carol@example.org', 0);
SELECT count(*) AS carol_rows FROM pepsi.dsn_rate WHERE sender = 'carol@example.org';

-- autoreply_due: each argument required.
SELECT pepsi.autoreply_due(NULL, 'x@example.org', '1 hour');
SELECT pepsi.autoreply_due('a@example.org', 'x@example.org', NULL);
SELECT count(*) AS autoreply_rows FROM pepsi.autoreply_sent WHERE responder = 'a@example.org';
-- A reply within the interval is not due; a zero interval always is.
SELECT pepsi.autoreply_due('a@example.org', 'x@example.org', '1 hour') AS first,
       pepsi.autoreply_due('a@example.org', 'X@Example.org', '1 hour') AS again,
       pepsi.autoreply_due('a@example.org', 'x@example.org', '0 seconds') AS zero_interval;

-- The gauges: a forced refresh counts; a fresh snapshot is kept unless
-- forced; a NULL force or period counts as the PL/pgSQL original did.
SELECT pepsi.workqueue_add('s@example.org', ARRAY['r@example.org'], '\x'::bytea, '\x'::bytea, '{}', NULL, NULL, 'gauge-test') > 0 AS added;
SELECT pepsi.queue_gauge_refresh(true) AS forced;
SELECT stage, status, messages, held FROM pepsi.queue_gauge WHERE stage = 'gauge-test' ORDER BY status;
SELECT counted >= 1 AS counted, duration >= interval '0' AS timed FROM pepsi.queue_gauge_refresh;
-- (The last count said to have taken an hour: fresh for twenty.)
UPDATE pepsi.queue_gauge_refresh SET refreshed_at = clock_timestamp(), duration = interval '1 hour';
SELECT pepsi.queue_gauge_refresh() AS fresh_kept,
       pepsi.queue_gauge_refresh(false, '1 second') AS fresh_kept_short,
       pepsi.queue_gauge_refresh(false, NULL) AS fresh_kept_null_period;
SELECT pepsi.queue_gauge_refresh(NULL) AS null_force;
UPDATE pepsi.queue_gauge_refresh SET refreshed_at = now() - interval '1 hour';
SELECT pepsi.queue_gauge_refresh() AS aged;
-- queue_gauges (plain SQL): recounts a small queue, then reads the snapshot.
SELECT pepsi.workqueue_add('s@example.org', ARRAY['r2@example.org'], '\x'::bytea, '\x'::bytea, '{}', NULL, NULL, 'gauge-test') > 0 AS added;
SELECT stage, status, messages, held, oldest_age_seconds >= 0 AS aged,
       as_of >= now() AS counted_now
FROM pepsi.queue_gauges() WHERE stage = 'gauge-test';
DELETE FROM pepsi.workqueue WHERE stage = 'gauge-test';

-- ingress_report: a row per instance, replaced; stopping removes it; a
-- row silent for a day goes at the next report.
SELECT pepsi.ingress_report('host:1', 3, 10, 7);
SELECT pepsi.ingress_report('host:1', 2, 12, 9);
SELECT pepsi.ingress_report('host:2', 1, 1, 0);
SELECT instance, sessions, sessions_total, messages FROM pepsi.ingress_stats ORDER BY instance;
SELECT pepsi.ingress_report('host:2', 0, 1, 0, true);
UPDATE pepsi.ingress_stats SET updated_at = now() - interval '2 days' WHERE instance = 'host:1';
SELECT pepsi.ingress_report('host:3', 0, 0, 0, NULL);
SELECT instance FROM pepsi.ingress_stats ORDER BY instance;
-- Refused: no instance, an empty or unprintable one, one too long, a
-- negative counter; a NULL counter by the table.
SELECT pepsi.ingress_report(NULL, 0, 0, 0);
SELECT pepsi.ingress_report('', 0, 0, 0);
SELECT pepsi.ingress_report(E'host\n:4', 0, 0, 0);
SELECT pepsi.ingress_report(repeat('h', 256), 0, 0, 0);
SELECT pepsi.ingress_report('host:4', 0, -1, 0);
SELECT pepsi.ingress_report('host:4', 0, 0, -1);
SELECT pepsi.ingress_report('host:4', -1, NULL, 0);
\set VERBOSITY terse
SELECT pepsi.ingress_report('host:4', NULL, 0, 0);
\set VERBOSITY default
SELECT instance FROM pepsi.ingress_stats ORDER BY instance;
DELETE FROM pepsi.ingress_stats;

-- The per-message functions are C, not PL/pgSQL.
SELECT p.proname, l.lanname, p.prosecdef FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = 'pepsi'::regnamespace
  AND p.proname IN ('dsn_rate_take', 'autoreply_due', 'queue_gauge_refresh', 'queue_gauges', 'destination_begin')
ORDER BY p.proname;
