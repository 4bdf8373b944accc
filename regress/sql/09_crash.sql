--
-- workqueue_crashed: the dispatcher's write when a worker died on a row.
-- Each attempt pauses the row with a backoff that doubles, counted per
-- stage in state.crash; the attempt that reaches crash_limit isolates the
-- row (failed, or timeout) with an event_log entry and the dispatch_stats
-- counters.  A row the worker committed before it died is left alone.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 9001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 9001;

CREATE FUNCTION pg_temp.add(label text) RETURNS bigint LANGUAGE sql AS $$
    SELECT pepsi.workqueue_add('s@example.org', ARRAY[label || '@example.net'], 'h', 'b',
                               jsonb_build_object('label', label))
$$;
-- retry_in: from the crash's own time (state.crash.at, the now() of the
-- call that paused the row), not from this query's: on a loaded machine
-- half a second or more passes between the two statements.
CREATE TEMP VIEW queue AS
SELECT state ->> 'label' AS row, stage, status,
       round(extract(epoch FROM timeout - (state #>> '{crash,at}')::timestamptz)) AS retry_in,
       (state -> 'crash') - 'at'::text AS crash, state ->> 'dispatch_error' AS dispatch_error
FROM pepsi.workqueue ORDER BY id;
CREATE TEMP VIEW stats AS
SELECT crash_retries, crash_failures, last_crash_failure_at IS NOT NULL AS has_last
FROM pepsi.dispatch_stats;
UPDATE pepsi.dispatch_stats SET crash_retries = 0, crash_failures = 0, last_crash_failure_at = NULL;
SELECT coalesce(max(id), 0) AS events_before FROM pepsi.event_log \gset

SELECT pg_temp.add('poison') AS poison, pg_temp.add('slow') AS slow,
       pg_temp.add('committed') AS committed \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver';

-- ---------------------------------------------------------------------------
-- Retries, then isolation
-- ---------------------------------------------------------------------------

-- First and second attempts: paused, 10 s then 20 s.
SELECT pepsi.workqueue_crashed(:poison, 'deliver', 'worker killed by signal 11', 3, 10);
SELECT * FROM queue WHERE row = 'poison';
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :poison;
SELECT pepsi.workqueue_crashed(:poison, 'deliver', 'worker killed by signal 11', 3, 10);
SELECT * FROM queue WHERE row = 'poison';
SELECT * FROM stats;

-- The third isolates it: failed, the reason for the operator, logged, counted.
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :poison;
SELECT pepsi.workqueue_crashed(:poison, 'deliver', 'worker killed by signal 11', 3, 10);
SELECT * FROM queue WHERE row = 'poison';
SELECT action, detail - 'id' AS detail, (detail ->> 'id')::bigint = :poison AS about_the_row
FROM pepsi.event_log WHERE id > :events_before ORDER BY id;
SELECT * FROM stats;

-- Attempts count per stage: a crash at another stage starts again at 1.
UPDATE pepsi.workqueue SET status = 'running', stage = 'bounce' WHERE id = :poison;
SELECT pepsi.workqueue_crashed(:poison, 'bounce', 'worker exited with status 1', 3, 10);
SELECT * FROM queue WHERE row = 'poison';

-- MAX_RUNTIME: isolated as timeout; a limit of 1 isolates at once.
SELECT pepsi.workqueue_crashed(:slow, 'deliver', 'no answer within MAX_RUNTIME', 1, 10, 'timeout');
SELECT * FROM queue WHERE row = 'slow';
SELECT * FROM stats;

-- The backoff is capped like any retry delay.
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver', timeout = NULL,
    state = state || '{"crash": {"stage": "deliver", "attempts": 70}}' WHERE id = :slow;
SELECT pepsi.workqueue_crashed(:slow, 'deliver', 'again', 100, 1e8);
SELECT retry_in = 315360000 AS capped FROM queue WHERE row = 'slow';

-- ---------------------------------------------------------------------------
-- What is left alone, and bad arguments
-- ---------------------------------------------------------------------------

-- Committed before the worker died (no longer running there): NULL, unchanged.
UPDATE pepsi.workqueue SET status = 'pending' WHERE id = :committed;
SELECT pepsi.workqueue_crashed(:committed, 'deliver', 'crash', 3, 10) IS NULL AS left_alone;
SELECT pepsi.workqueue_crashed(-1, 'deliver', 'crash', 3, 10) IS NULL AS unknown_row;
SELECT * FROM queue WHERE row = 'committed';

SELECT pepsi.workqueue_crashed(NULL, 'deliver', 'crash', 3, 10);
SELECT pepsi.workqueue_crashed(:committed, '', 'crash', 3, 10);
SELECT pepsi.workqueue_crashed(:committed, 'deliver', '', 3, 10);
SELECT pepsi.workqueue_crashed(:committed, 'deliver', 'crash', 0, 10);
SELECT pepsi.workqueue_crashed(:committed, 'deliver', 'crash', NULL, 10);
SELECT pepsi.workqueue_crashed(:committed, 'deliver', 'crash', 3, -1);
SELECT pepsi.workqueue_crashed(:committed, 'deliver', 'crash', 3, 10, 'pending');

-- Leave the queue empty, every body released, the counters as found.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
UPDATE pepsi.dispatch_stats SET crash_retries = 0, crash_failures = 0, last_crash_failure_at = NULL;
