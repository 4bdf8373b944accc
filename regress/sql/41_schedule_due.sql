--
-- pepsi.schedule_run_due runs a schedule row when it is due at the start
-- of the caller's transaction (now()), the time the row it injects is
-- stamped with (received_at): a row that falls due while the transaction
-- runs waits for the next call, so no row is received before its time.
-- No maintenance worker runs here (08_maintenance stops the one it
-- starts), so the calls below are the only ones.
--
BEGIN;
SELECT pepsi.schedule_add('due-later', clock_timestamp() + interval '100 ms', interval '1 hour',
    stage => 'scheduled', rcpt_to => ARRAY['postmaster@example.org']);
SELECT pg_sleep(0.3);
-- Due by the clock now, not at the transaction's start: not run.
SELECT pepsi.schedule_run_due() AS ran_in_the_transaction_it_fell_due_in;
SELECT count(*) AS injected FROM pepsi.workqueue WHERE stage = 'scheduled';
COMMIT;
-- The next call's transaction starts after the due time: run once.
SELECT pepsi.schedule_run_due() AS ran_in_the_next;
SELECT count(*) AS injected,
       count(*) FILTER (WHERE received_at >= (state #>> '{schedule,due}')::timestamptz) AS not_before_its_time
FROM pepsi.workqueue WHERE stage = 'scheduled';
-- Its next time is an hour on: nothing more is due.
SELECT pepsi.schedule_run_due() AS ran_again;
DELETE FROM pepsi.workqueue WHERE stage = 'scheduled';
SELECT pepsi.schedule_remove('due-later');
