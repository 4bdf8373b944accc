-- One sample of what can slow the claim (run.sh runs it once a second,
-- drive.py's "diagnose" reads the samples): the backend holding back the
-- oldest xmin (its age in transactions, its pid, program, state, how long
-- its transaction has run, its statement), the queue table's dead and
-- live versions and vacuums, the rows running and pending, and the
-- claim's calls and total server time so far (pg_stat_statements).
-- The rows running and pending are the queue gauges' (pepsi.queue_gauge,
-- which the maintenance worker refreshes every few seconds): counting the
-- queue here read the whole table, dead versions and all, every second,
-- 140 ms a sample under the burst, 7% of the machine in every run.
SELECT extract(epoch FROM clock_timestamp())::numeric(16, 2),
       coalesce(h.xmin_age, 0),
       coalesce(h.xact_s, 0), coalesce(h.holder, '-'),
       coalesce((SELECT max(extract(epoch FROM clock_timestamp() - a.xact_start))::numeric(10, 1)
                 FROM pg_stat_activity a WHERE a.pid <> pg_backend_pid()), 0),
       t.n_dead_tup, t.n_live_tup, t.autovacuum_count, t.autoanalyze_count,
       q.running, q.pending,
       coalesce(s.calls, 0), coalesce(s.total_ms, 0)::numeric(14, 2)
FROM pg_stat_user_tables t
CROSS JOIN (SELECT coalesce(sum(messages) FILTER (WHERE status = 'running'), 0) AS running,
                   coalesce(sum(messages) FILTER (WHERE status = 'pending'), 0) AS pending
            FROM pepsi.queue_gauge) q
LEFT JOIN (SELECT sum(calls) AS calls, sum(total_exec_time) AS total_ms FROM pg_stat_statements
           WHERE query LIKE '%workqueue_claim(%') s ON true
LEFT JOIN (SELECT age(a.backend_xmin) AS xmin_age,
                  coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::numeric(10, 1), 0) AS xact_s,
                  format('pid %s (%s, %s): %s', a.pid,
                         coalesce(nullif(a.application_name, ''), a.backend_type), a.state,
                         left(regexp_replace(a.query, '\s+', ' ', 'g'), 70)) AS holder
           FROM pg_stat_activity a
           WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
           ORDER BY age(a.backend_xmin) DESC LIMIT 1) h ON true
WHERE t.relid = 'pepsi.workqueue'::regclass;
