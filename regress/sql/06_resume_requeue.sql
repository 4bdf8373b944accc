--
-- The transitions outside a stage: an operator's workqueue_resume, the
-- maintenance worker's workqueue_requeue_due, the dispatcher's
-- workqueue_reset_orphans after a crash, and notify_workqueue.  Each that
-- makes a row pending wakes the dispatcher on pepsi_workqueue, once per
-- transaction and only if it changed something.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 6001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 6001;

-- psql prints a notification with the sending backend's PID: the output of
-- a statement that may notify is captured and the PID masked.
SELECT '/tmp/pepsi-regress-notify-' || pg_backend_pid() || '.out' AS notify_file \gset
\setenv PEPSI_NOTIFY_FILE :notify_file

CREATE FUNCTION pg_temp.add(label text) RETURNS bigint LANGUAGE sql AS $$
    SELECT pepsi.workqueue_add('s@example.org', ARRAY[label || '@example.net'], 'h', 'b',
                               jsonb_build_object('label', label))
$$;
CREATE TEMP VIEW queue AS
SELECT state ->> 'label' AS row, stage, status, timeout IS NOT NULL AS has_timeout
FROM pepsi.workqueue ORDER BY id;

-- ---------------------------------------------------------------------------
-- workqueue_resume
-- ---------------------------------------------------------------------------

SELECT pg_temp.add('paused') AS paused, pg_temp.add('failed') AS failed,
       pg_temp.add('timedout') AS timedout, pg_temp.add('pending') AS pending,
       pg_temp.add('running') AS running \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver' WHERE id <> :pending;
SELECT pepsi.workqueue_commit(:paused, 'deliver', 'pause', retry_seconds => 3600);
SELECT pepsi.workqueue_commit(:failed, 'deliver', 'fail');
-- the dispatcher marks a stage that overran its time limit
UPDATE pepsi.workqueue SET status = 'timeout' WHERE id = :timedout;
SELECT * FROM queue;
SELECT jsonb_object_agg(id, pending_seq) AS seq_before FROM pepsi.workqueue \gset

-- Paused, failed and timed-out rows go back to pending at their stage, to
-- the back of the queue; a pending row named with them is left as it is.
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.workqueue_resume(ARRAY[:paused, :failed, :timedout, :pending]);
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT * FROM queue;
SELECT state ->> 'label' AS row,
       pending_seq > (:'seq_before'::jsonb ->> id::text)::bigint AS requeued_at_back
FROM pepsi.workqueue ORDER BY id;

-- Nothing to resume: 0, and no wake-up.
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.workqueue_resume(ARRAY[:paused, :pending]);
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"

-- All or nothing: an unknown row, or one a worker holds, fails the call
-- and the paused row named with it stays paused.
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :paused;
SELECT pepsi.workqueue_commit(:paused, 'deliver', 'pause', retry_seconds => 3600);
SELECT pepsi.workqueue_resume(ARRAY[:paused, -1]);
SELECT pepsi.workqueue_resume(ARRAY[:running, :paused]);
SELECT pepsi.workqueue_resume(ARRAY[:paused, -1, :running]);
SELECT pepsi.workqueue_resume(NULL);
SELECT pepsi.workqueue_resume('{}');
SELECT pepsi.workqueue_resume(ARRAY[:paused, NULL]);
SELECT pepsi.workqueue_resume(ARRAY[:paused, :paused]);
SELECT pepsi.workqueue_resume(ARRAY[[:paused], [:failed]]);
SELECT * FROM queue;

DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- workqueue_requeue_due
-- ---------------------------------------------------------------------------

SELECT pg_temp.add('due_old') AS due_old, pg_temp.add('due_new') AS due_new,
       pg_temp.add('later') AS later, pg_temp.add('failed') AS failed,
       pg_temp.add('running') AS running \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'relay';
SELECT pepsi.workqueue_commit_many(ARRAY[:due_old, :due_new, :later], '{relay,relay,relay}',
                                   'pause', retry_seconds => '{0,0,3600}');
SELECT pepsi.workqueue_commit(:failed, 'relay', 'fail');
-- due_old fell due first
UPDATE pepsi.workqueue SET timeout = timeout - interval '1 minute' WHERE id = :due_old;
SELECT jsonb_object_agg(id, pending_seq) AS seq_before FROM pepsi.workqueue \gset
SELECT * FROM queue;

-- At most max_rows, the longest due first; with a wake-up.
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.workqueue_requeue_due(1);
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT * FROM queue;

-- Then the other due row; the one due in an hour waits, and only paused
-- rows are looked at.
SELECT pepsi.workqueue_requeue_due();
SELECT * FROM queue;
SELECT state ->> 'label' AS row,
       pending_seq > (:'seq_before'::jsonb ->> id::text)::bigint AS requeued_at_back
FROM pepsi.workqueue ORDER BY id;

-- Nothing due: 0, and no wake-up.
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.workqueue_requeue_due();
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"

SELECT pepsi.workqueue_requeue_due(0);
SELECT pepsi.workqueue_requeue_due(-1);
SELECT pepsi.workqueue_requeue_due(NULL) IS NULL AS strict;

DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- workqueue_reset_orphans
-- ---------------------------------------------------------------------------

SELECT pg_temp.add('orphan1') AS orphan1, pg_temp.add('orphan2') AS orphan2,
       pg_temp.add('paused') AS paused, pg_temp.add('pending') AS pending \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'filter' WHERE id IN (:orphan1, :paused);
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver' WHERE id = :orphan2;
SELECT pepsi.workqueue_commit(:paused, 'filter', 'pause', retry_seconds => 3600);
SELECT jsonb_object_agg(id, pending_seq) AS seq_before FROM pepsi.workqueue \gset

-- Running rows go back to pending at their stage; the others stay.
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.workqueue_reset_orphans();
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT * FROM queue;
SELECT state ->> 'label' AS row,
       pending_seq > (:'seq_before'::jsonb ->> id::text)::bigint AS requeued_at_back
FROM pepsi.workqueue ORDER BY id;

-- No orphans: 0, and no wake-up.
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.workqueue_reset_orphans();
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"

DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- notify_workqueue, and wake-ups are transactional
-- ---------------------------------------------------------------------------

LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.notify_workqueue();
\o
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"

-- Several wake-ups in one transaction are delivered once, at commit.
SELECT pg_temp.add('a') AS a, pg_temp.add('b') AS b \gset
UPDATE pepsi.workqueue SET status = 'running';
\o :notify_file
BEGIN;
SELECT pepsi.workqueue_reset_orphans();
SELECT pepsi.notify_workqueue();
SELECT pepsi.workqueue_inject('sendmail', 'root@localhost', '{admin@example.org}', 'h', 'b') IS NOT NULL AS injected;
COMMIT;
\o
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"

-- A rolled-back wake-up is never delivered.
UPDATE pepsi.workqueue SET status = 'running';
\o :notify_file
BEGIN;
SELECT pepsi.workqueue_reset_orphans();
SELECT pepsi.workqueue_resume(ARRAY[-1]);
COMMIT;
\o
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT count(*) FILTER (WHERE status = 'running') AS still_running FROM pepsi.workqueue;
UNLISTEN pepsi_workqueue;
\! rm -f "$PEPSI_NOTIFY_FILE"

-- Leave the queue empty, every body released.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
