/*
 * pepsi 0.15 -> 0.16: the schema changes made since 0.15.
 *
 * 0.15 was released with a new destination's TLS result written by one
 * worker; every schema change since is a block here, placed before the
 * final UPDATE of pepsi.schema_version, and folded into pepsi--0.16.sql
 * (new objects at its end).  An existing 0.15 database reaches 0.16 with
 * ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi installs
 * pepsi--0.16.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every statement
 * safe on a live queue) is the one pepsi--0.1--0.2.sql describes and
 * docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.16'" to load this file. \quit

-- ===========================================================================
-- schedule_run_due: a row is due at the transaction's start (issue 37)
--
-- It ran the rows due by clock_timestamp(), while the rows it injects are
-- stamped received_at = now(), the start of the caller's transaction: a
-- maintenance pass that began just before a row fell due and reached the
-- schedules after it injected that row with a received_at before its
-- time (t/150 under load).  Now due means next_run <= now(); such a row
-- waits for the next pass, which the worker starts at once (its wake-up
-- is the earliest next_run after now()).  Same signature: replaced.
-- ===========================================================================
-- The maintenance worker's part: run the rows that are due, at most
-- max_rows of them; returns how many ran.  Each in a subtransaction: a
-- failure is the row's last_outcome ("error: ...") and a WARNING in the
-- server log, and does not stop the others.  Due means due at the
-- transaction's start (now()), the time an injected row is stamped with
-- (received_at): a row that fell due while the caller's transaction ran
-- waits for its next call, so none is received before its time.
CREATE OR REPLACE FUNCTION pepsi.schedule_run_due(max_rows integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    due record;
    ran integer := 0;
    outcome text;
    failed boolean;
    next_due timestamptz;
    injected bigint;
BEGIN
    FOR due IN SELECT * FROM pepsi.schedule s WHERE s.next_run <= now()
               ORDER BY s.next_run, s.name LIMIT max_rows FOR UPDATE SKIP LOCKED
    LOOP
        failed := false;
        BEGIN
            IF due.action = 'inject' THEN
                injected := pepsi.workqueue_inject(due.stage, '', due.rcpt_to, ''::bytea, ''::bytea,
                    due.arguments || jsonb_build_object('schedule',
                        jsonb_build_object('name', due.name, 'due', due.next_run)),
                    format('schedule:%s:%s', due.name, extract(epoch FROM due.next_run)));
                outcome := CASE WHEN injected IS NULL THEN 'ok: already injected'
                                ELSE format('ok: row %s at %s', injected, due.stage) END;
            ELSE
                outcome := 'ok: ' || pepsi.schedule_call(due.function_name, due.arguments);
            END IF;
        EXCEPTION WHEN OTHERS THEN
            failed := true;
            outcome := 'error: ' || SQLERRM;
            RAISE WARNING 'pepsi maintenance: schedule "%" failed: %', due.name, SQLERRM;
        END;
        IF due.every IS NULL THEN
            next_due := 'infinity';
        ELSE
            -- The first due time after now in the row's phase.
            next_due := due.next_run + due.every * greatest(1, floor(extract(epoch FROM clock_timestamp() - due.next_run)
                                                                 / extract(epoch FROM due.every))::bigint);
            FOR i IN 1..3 LOOP
                EXIT WHEN next_due > clock_timestamp();
                next_due := next_due + due.every;
            END LOOP;
            IF next_due <= clock_timestamp() THEN
                next_due := clock_timestamp() + due.every;
            END IF;
        END IF;
        UPDATE pepsi.schedule s
        SET next_run = next_due, last_run = clock_timestamp(), last_outcome = left(outcome, 1000),
            runs = s.runs + 1, failures = s.failures + failed::int
        WHERE s.name = due.name;
        ran := ran + 1;
    END LOOP;
    RETURN ran;
END
$$;
-- end of schedule_run_due: due at the transaction's start

UPDATE pepsi.schema_version SET version = '0.16';
