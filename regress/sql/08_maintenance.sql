--
-- The maintenance worker, started on demand by pepsi.start_maintenance():
-- its passes put due paused rows back to pending (waking the dispatcher)
-- and sweep unreferenced bodies.  It is stopped at the end so that it
-- cannot requeue or sweep behind the back of a later file.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 8001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 8001;

-- Poll a condition (the worker runs in its own time), for up to a minute.
CREATE FUNCTION pg_temp.wait_for(condition text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    met boolean;
BEGIN
    FOR i IN 1..1200 LOOP
        EXECUTE 'SELECT ' || condition INTO met;
        IF met THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END;
$$;

-- Only a superuser may start a background worker.
CREATE ROLE regress_pepsi_operator;
GRANT USAGE ON SCHEMA pepsi TO regress_pepsi_operator;
SET ROLE regress_pepsi_operator;
SELECT pepsi.start_maintenance();
RESET ROLE;
DROP OWNED BY regress_pepsi_operator;
DROP ROLE regress_pepsi_operator;

-- Work for the first pass: a row due now, one due in an hour, an orphan body.
SELECT pepsi.workqueue_add('s@example.org', '{due@example.net}', 'h', 'b') AS due \gset
SELECT pepsi.workqueue_add('s@example.org', '{later@example.net}', 'h', 'b') AS later \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'relay';
SELECT pepsi.workqueue_commit_many(ARRAY[:due, :later], '{relay,relay}', 'pause',
                                   retry_seconds => '{0,3600}');
INSERT INTO pepsi.workqueue_body (body) VALUES ('orphan');

-- psql prints a notification with the sender's PID, here the worker's,
-- after whichever statement is running when it arrives: the output is
-- captured, shown without them, and they are counted.
SELECT '/tmp/pepsi-regress-notify-' || pg_backend_pid() || '.out' AS notify_file \gset
\setenv PEPSI_NOTIFY_FILE :notify_file
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.start_maintenance() AS worker \gset
SELECT pg_temp.wait_for($$ (SELECT status = 'pending' FROM pepsi.workqueue WHERE id = $$ || :due || ')')
    AS due_row_requeued;
SELECT pg_temp.wait_for($$ NOT EXISTS (SELECT 1 FROM pepsi.workqueue_body WHERE body = 'orphan') $$)
    AS orphan_swept;
\o
UNLISTEN pepsi_workqueue;
\! sed -E '/^Asynchronous notification/d' "$PEPSI_NOTIFY_FILE"
\! grep -c 'Asynchronous notification "pepsi_workqueue" received' "$PEPSI_NOTIFY_FILE"
\! rm -f "$PEPSI_NOTIFY_FILE"

SELECT backend_type, datname = current_database() AS this_database
FROM pg_stat_activity WHERE pid = :worker;
SELECT rcpt_to, status, timeout IS NOT NULL AS has_timeout FROM pepsi.workqueue ORDER BY id;
SELECT count(*) AS bodies FROM pepsi.workqueue_body;

-- One worker per database: a second call returns the running one.
SELECT pepsi.start_maintenance() = :worker AS same_worker;

-- Stop it: a clean exit, which the postmaster does not restart.
SELECT pg_terminate_backend(:worker);
SELECT pg_temp.wait_for($$ NOT EXISTS (SELECT 1 FROM pg_stat_activity
                                       WHERE backend_type = 'pepsi maintenance') $$) AS stopped;

-- Leave the queue empty, every body released.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
