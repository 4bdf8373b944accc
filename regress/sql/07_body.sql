--
-- Shared bodies and the pending queue position.  A body is stored once for
-- all the rows split off a message, released when the last of them is
-- deleted, protected by the foreign key while one remains, and swept by
-- workqueue_body_gc when a release was missed.  A row that becomes pending
-- again draws a fresh pending_seq: it goes to the back of its stage's queue.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 7001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 7001;

-- ---------------------------------------------------------------------------
-- Release on DELETE
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('s@example.org', '{a@example.net,b@example.net,c@example.net}',
                           'h', 'Shared.') AS s \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'relay' WHERE id = :s;
SELECT ids[1] AS t1, ids[2] AS t2 FROM pepsi.workqueue_split_one_per_row(:s, 'relay') AS ids \gset
SELECT pepsi.workqueue_add('s@example.org', '{d@example.net}', 'h', 'Alone.') AS other \gset
SELECT body_id AS shared FROM pepsi.workqueue WHERE id = :s \gset

-- Three rows, one body between them.
SELECT id - :s AS n, rcpt_to, body_id - :shared AS body FROM pepsi.workqueue ORDER BY id;
SELECT id - :shared AS body, convert_from(body, 'UTF8') AS body_text
FROM pepsi.workqueue_body ORDER BY id;

-- A referenced body cannot be deleted.
DELETE FROM pepsi.workqueue_body WHERE id = :shared;

-- Deleting siblings keeps the body while one remains ...
DELETE FROM pepsi.workqueue WHERE id = :s;
SELECT count(*) AS shared_left FROM pepsi.workqueue_body WHERE id = :shared;
SELECT pepsi.workqueue_body_gc() AS swept;
SELECT count(*) AS shared_left FROM pepsi.workqueue_body WHERE id = :shared;

-- ... and the last one takes it; two rows deleted in one statement release
-- their shared body once, another row's body is not touched.
DELETE FROM pepsi.workqueue WHERE id IN (:t1, :t2);
SELECT id - :shared AS body FROM pepsi.workqueue_body ORDER BY id;

-- One statement deleting rows of several bodies releases each of them.
SELECT pepsi.workqueue_add('s@example.org', '{e@example.net}', 'h', 'E.') IS NOT NULL AS added;
SELECT pepsi.workqueue_add('s@example.org', '{f@example.net}', 'h', 'F.') IS NOT NULL AS added;
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;

-- ---------------------------------------------------------------------------
-- workqueue_body_gc
-- ---------------------------------------------------------------------------

-- An orphan, as a race between two releases leaves one; a body in use;
-- and a row whose body a DBA swapped by hand, leaving the old one behind.
INSERT INTO pepsi.workqueue_body (body) VALUES ('orphan');
SELECT pepsi.workqueue_add('s@example.org', '{g@example.net}', 'h', 'In use.') AS g \gset
SELECT pepsi.workqueue_add('s@example.org', '{h@example.net}', 'h', 'Replaced.') AS h \gset
INSERT INTO pepsi.workqueue_body (body) VALUES ('Replacement.') RETURNING id AS replacement \gset
UPDATE pepsi.workqueue SET body_id = :replacement WHERE id = :h;
SELECT convert_from(body, 'UTF8') AS body_text FROM pepsi.workqueue_body ORDER BY id;

SELECT pepsi.workqueue_body_gc() AS swept;
SELECT convert_from(b.body, 'UTF8') AS body_text,
       (SELECT count(*) FROM pepsi.workqueue w WHERE w.body_id = b.id) AS rows
FROM pepsi.workqueue_body b ORDER BY b.id;
SELECT pepsi.workqueue_body_gc() AS swept_again;

DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;

-- ---------------------------------------------------------------------------
-- pending_seq: the position in the pending queue
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('s@example.org', '{a@example.net}', 'h', 'b', '{"n": "a"}') AS a \gset
SELECT pepsi.workqueue_add('s@example.org', '{b@example.net}', 'h', 'b', '{"n": "b"}') AS b \gset
SELECT pepsi.workqueue_add('s@example.org', '{c@example.net}', 'h', 'b', '{"n": "c"}') AS c \gset

-- The rank of each row in its stage's pending queue (a row not pending: no
-- rank), and whether its pending_seq changed since the last snapshot.
CREATE TEMP TABLE seq_snapshot (id bigint PRIMARY KEY, pending_seq bigint);
CREATE FUNCTION pg_temp.snapshot() RETURNS void LANGUAGE sql AS $$
    DELETE FROM seq_snapshot;
    INSERT INTO seq_snapshot SELECT id, pending_seq FROM pepsi.workqueue;
$$;
CREATE TEMP VIEW pending_queue AS
SELECT w.state ->> 'n' AS row, w.stage, w.status,
       CASE WHEN w.status = 'pending'
            THEN rank() OVER (PARTITION BY w.stage, w.status = 'pending' ORDER BY w.pending_seq) END
           AS position,
       w.pending_seq <> s.pending_seq AS new_seq
FROM pepsi.workqueue w LEFT JOIN seq_snapshot s USING (id) ORDER BY w.id;

-- Admission order.
SELECT pg_temp.snapshot();
SELECT * FROM pending_queue;

-- Claimed (pending to running): no new position.
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :a;
SELECT * FROM pending_queue;

-- Back to pending at the same stage (an orphan reset): behind b and c.
SELECT pepsi.workqueue_reset_orphans();
SELECT * FROM pending_queue;

-- An advance draws a new position at the new stage.
SELECT pg_temp.snapshot();
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :b;
SELECT pepsi.workqueue_commit(:b, 'init', 'advance', 'deliver');
SELECT * FROM pending_queue;

-- A pending row whose other columns change keeps its position ...
SELECT pg_temp.snapshot();
UPDATE pepsi.workqueue SET state = state || '{"note": 1}' WHERE id = :c;
SELECT * FROM pending_queue;

-- ... but a DBA moving it to another stage sends it to the back there,
-- and so does a DBA's resume of a failed row.
UPDATE pepsi.workqueue SET stage = 'deliver' WHERE id = :c;
SELECT * FROM pending_queue;
SELECT pg_temp.snapshot();
UPDATE pepsi.workqueue SET status = 'failed' WHERE id = :b;
SELECT * FROM pending_queue;
UPDATE pepsi.workqueue SET status = 'pending' WHERE id = :b;
SELECT * FROM pending_queue;

-- An advance to the stage a row is already at still re-queues it.
SELECT pg_temp.snapshot();
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :c;
SELECT pepsi.workqueue_commit(:c, 'deliver', 'advance', 'deliver');
SELECT * FROM pending_queue;

-- A sibling split off joins the back of its stage's queue (a new row: not
-- in the snapshot).
UPDATE pepsi.workqueue SET status = 'running', rcpt_to = '{a@example.net,a2@example.net}'
WHERE id = :a;
SELECT pepsi.workqueue_split_off(:a, 'init', '{2}', 'deliver') IS NOT NULL AS split;
UPDATE pepsi.workqueue SET state = '{"n": "a2"}'
WHERE rcpt_to = '{a2@example.net}';
SELECT * FROM pending_queue;

-- Leave the queue empty, every body released.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
