--
-- workqueue_commit: a stage's single write, guarded by "running at the stage
-- I think".  Each transition, the content columns it writes (only those the
-- stage touched), the copy-on-write of a shared body, and every refusal.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 2001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 2001;

CREATE TEMP VIEW queue AS
SELECT w.id, w.stage, w.status, w.state, w.timeout IS NOT NULL AS has_timeout,
       w.mail_from, w.rcpt_to, convert_from(w.headers, 'UTF8') AS headers,
       convert_from(b.body, 'UTF8') AS body
FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id;

-- The columns of a row that differ from an earlier snapshot of it (but
-- index_status, which is status as the indexes read it, generated).
CREATE FUNCTION pg_temp.snapshot(row_id bigint) RETURNS jsonb LANGUAGE sql
AS $$ SELECT to_jsonb(w) FROM pepsi.workqueue w WHERE w.id = row_id $$;
CREATE FUNCTION pg_temp.changed(row_id bigint, before jsonb) RETURNS text[] LANGUAGE sql
AS $$
    SELECT coalesce(array_agg(b.key ORDER BY b.key), '{}')
    FROM jsonb_each(before) b JOIN jsonb_each(pg_temp.snapshot(row_id)) a USING (key)
    WHERE a.value IS DISTINCT FROM b.value AND b.key <> 'index_status'
$$;

SELECT pepsi.workqueue_add('alice@example.org', '{bob@example.net,carol@example.net}',
                           'Subject: one', 'Body one.', '{"spam": {"score": 1}}') AS r \gset
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :r;

-- ---------------------------------------------------------------------------
-- The transitions
-- ---------------------------------------------------------------------------

-- advance: pending at the target stage, at the back of its queue.
SELECT pg_temp.snapshot(:r) AS before \gset
SELECT pepsi.workqueue_commit(:r, 'init', 'advance', 'filter');
SELECT pg_temp.changed(:r, :'before');
SELECT stage, status, has_timeout, state FROM queue WHERE id = :r;
SELECT pending_seq > (:'before'::jsonb ->> 'pending_seq')::bigint AS requeued_at_back
FROM pepsi.workqueue WHERE id = :r;

-- advance_to, with a state merge (top-level keys replaced, others kept).
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :r;
SELECT pg_temp.snapshot(:r) AS before \gset
SELECT pepsi.workqueue_commit(:r, 'filter', 'advance_to', 'deliver',
                              merge_state => '{"spam": {"score": 5}, "filtered": true}');
SELECT pg_temp.changed(:r, :'before');
SELECT stage, status, state FROM queue WHERE id = :r;

-- reroute: an advance carrying state for the target.
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :r;
SELECT pg_temp.snapshot(:r) AS before \gset
SELECT pepsi.workqueue_commit(:r, 'deliver', 'reroute', 'bounce',
                              merge_state => '{"bounce": {"reason": "5.1.1"}}');
SELECT pg_temp.changed(:r, :'before');
SELECT stage, status, state FROM queue WHERE id = :r;

-- pause: stays at its stage with a retry time.
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :r;
SELECT pg_temp.snapshot(:r) AS before \gset
SELECT pepsi.workqueue_commit(:r, 'bounce', 'pause', retry_seconds => 3600);
SELECT pg_temp.changed(:r, :'before');
SELECT stage, status, timeout > now() + interval '3590 seconds'
                  AND timeout <= now() + interval '3600 seconds' AS due_in_an_hour
FROM pepsi.workqueue WHERE id = :r;

-- pause with a state merge and no wait: due at once.
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :r;
SELECT pg_temp.snapshot(:r) AS before \gset
SELECT pepsi.workqueue_commit(:r, 'bounce', 'pause', merge_state => '{"attempts": 1}',
                              retry_seconds => 0);
SELECT pg_temp.changed(:r, :'before');
SELECT status, timeout <= now() AS due_now, state -> 'attempts' AS attempts
FROM pepsi.workqueue WHERE id = :r;

-- pause for ever: a hold, as pepsi.queue_hold leaves a row, until released.
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :r;
SELECT pepsi.workqueue_commit(:r, 'bounce', 'pause', merge_state => '{"held": "quarantine"}',
                              retry_seconds => 'Infinity');
SELECT stage, status, timeout = 'infinity' AS on_hold, state -> 'held' AS held
FROM pepsi.workqueue WHERE id = :r;
SELECT held FROM pepsi.queue_summary WHERE stage = 'bounce' AND status = 'paused';
SELECT pepsi.workqueue_requeue_due(100) IS NOT NULL AS swept;
SELECT status, timeout = 'infinity' AS still_on_hold FROM pepsi.workqueue WHERE id = :r;
SELECT pepsi.queue_release(ARRAY[:r]::bigint[]) AS released;
SELECT status, timeout FROM pepsi.workqueue WHERE id = :r;

-- fail: stays at its stage for an operator.
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :r;
SELECT pg_temp.snapshot(:r) AS before \gset
SELECT pepsi.workqueue_commit(:r, 'bounce', 'fail');
SELECT pg_temp.changed(:r, :'before');
SELECT stage, status, has_timeout FROM queue WHERE id = :r;

-- finish: the row goes, and its body with it.
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :r;
SELECT body_id AS r_body FROM pepsi.workqueue WHERE id = :r \gset
SELECT pepsi.workqueue_commit(:r, 'bounce', 'finish');
SELECT count(*) AS rows FROM pepsi.workqueue WHERE id = :r;
SELECT count(*) AS bodies FROM pepsi.workqueue_body WHERE id = :r_body;

-- ---------------------------------------------------------------------------
-- Content: only the columns the stage touched are written
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('alice@example.org', '{bob@example.net,carol@example.net}',
                           'Subject: two', 'Body two.', '{"k": 1, "keep": true}') AS c \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'rewrite' WHERE id = :c;

SELECT pg_temp.snapshot(:c) AS before \gset
SELECT pepsi.workqueue_commit(:c, 'rewrite', 'fail', set_headers => 'Subject: two (tagged)');
SELECT pg_temp.changed(:c, :'before');
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :c;

SELECT pg_temp.snapshot(:c) AS before \gset
SELECT pepsi.workqueue_commit(:c, 'rewrite', 'fail', set_mail_from => '');
SELECT pg_temp.changed(:c, :'before');
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :c;

SELECT pg_temp.snapshot(:c) AS before \gset
SELECT pepsi.workqueue_commit(:c, 'rewrite', 'fail', set_rcpt_to => '{dave@example.net}');
SELECT pg_temp.changed(:c, :'before');
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :c;

-- set_state replaces the state ...
SELECT pg_temp.snapshot(:c) AS before \gset
SELECT pepsi.workqueue_commit(:c, 'rewrite', 'fail', set_state => '{"fresh": 1}');
SELECT pg_temp.changed(:c, :'before');
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :c;
SELECT * FROM queue WHERE id = :c;

-- ... and a merge given with it applies on top of the new state.
SELECT pepsi.workqueue_commit(:c, 'rewrite', 'fail', set_state => '{"fresh": 2, "a": 1}',
                              merge_state => '{"a": 2, "b": 3}');
SELECT state FROM queue WHERE id = :c;
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :c;

-- A body of its own: the new body is stored, the old one released.
SELECT body_id AS c_body FROM pepsi.workqueue WHERE id = :c \gset
SELECT pg_temp.snapshot(:c) AS before \gset
SELECT pepsi.workqueue_commit(:c, 'rewrite', 'fail', set_body => 'Body two, rewritten.');
SELECT pg_temp.changed(:c, :'before');
SELECT body FROM queue WHERE id = :c;
SELECT count(*) AS old_body_left FROM pepsi.workqueue_body WHERE id = :c_body;
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :c;

-- Everything at once, with an advance.
SELECT pepsi.workqueue_commit(:c, 'rewrite', 'advance', 'deliver',
                              merge_state => '{"rewritten": true}',
                              set_headers => 'Subject: three', set_body => 'Body three.',
                              set_mail_from => 'alice@example.org',
                              set_rcpt_to => '{erin@example.net,frank@example.net}');
SELECT * FROM queue WHERE id = :c;
SELECT count(*) AS bodies FROM pepsi.workqueue_body;

-- finish deletes the row: content arguments are moot, and no body is stored.
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :c;
SELECT pepsi.workqueue_commit(:c, 'deliver', 'finish', merge_state => '{"x": 1}',
                              set_headers => 'h', set_body => 'never stored',
                              set_mail_from => 'x@example.org', set_rcpt_to => '{y@example.org}',
                              set_state => '{}');
SELECT count(*) AS rows, (SELECT count(*) FROM pepsi.workqueue_body) AS bodies
FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- Copy-on-write of a body shared by siblings
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net,b@example.net,c@example.net}',
                           'h', 'Shared body.') AS s \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'relay' WHERE id = :s;
SELECT body_id AS shared_body FROM pepsi.workqueue WHERE id = :s \gset
SELECT ids[1] AS t1, ids[2] AS t2
FROM pepsi.workqueue_split_one_per_row(:s, 'relay') AS ids \gset
UPDATE pepsi.workqueue SET status = 'running' WHERE id IN (:t1, :t2);
SELECT id - :s AS sibling, rcpt_to, body_id = :shared_body AS shares_body
FROM pepsi.workqueue ORDER BY id;

-- The first sibling to rewrite gets a body of its own; the others keep the
-- shared one, which stays.
SELECT pepsi.workqueue_commit(:s, 'relay', 'advance', 'deliver', set_body => 'Rewritten for a.');
SELECT w.id - :s AS sibling, convert_from(b.body, 'UTF8') AS body, w.body_id = :shared_body AS shares_body
FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id ORDER BY w.id;
SELECT count(*) AS shared_body_left FROM pepsi.workqueue_body WHERE id = :shared_body;

SELECT pepsi.workqueue_commit(:t1, 'relay', 'advance', 'deliver', set_body => 'Rewritten for b.');
SELECT count(*) AS shared_body_left FROM pepsi.workqueue_body WHERE id = :shared_body;

-- The last reference goes: the shared body is released.
SELECT pepsi.workqueue_commit(:t2, 'relay', 'advance', 'deliver', set_body => 'Rewritten for c.');
SELECT w.id - :s AS sibling, convert_from(b.body, 'UTF8') AS body, w.body_id = :shared_body AS shares_body
FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id ORDER BY w.id;
SELECT count(*) AS shared_body_left FROM pepsi.workqueue_body WHERE id = :shared_body;
SELECT count(*) AS bodies FROM pepsi.workqueue_body;

DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- Refusals: each one writes nothing
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('alice@example.org', '{bob@example.net}', 'h', 'b', '{"k": 1}') AS e \gset
SELECT pepsi.workqueue_add('alice@example.org', '{bob@example.net}', 'h', 'b') AS p \gset
SELECT pepsi.workqueue_add('alice@example.org', '{bob@example.net}', 'h', 'b') AS z \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'filter' WHERE id = :e;
UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 hour' WHERE id = :z;
SELECT pg_temp.snapshot(:e) AS before \gset
SELECT count(*) AS bodies_before FROM pepsi.workqueue_body \gset

-- The row: unknown, not running, at another stage.
SELECT pepsi.workqueue_commit(NULL, 'filter', 'advance', 'deliver');
SELECT pepsi.workqueue_commit(-1, 'filter', 'advance', 'deliver');
SELECT pepsi.workqueue_commit(:p, 'init', 'advance', 'deliver');
SELECT pepsi.workqueue_commit(:z, 'init', 'fail');
SELECT pepsi.workqueue_commit(:e, 'deliver', 'advance', 'relay');
SELECT pepsi.workqueue_commit(:e, NULL, 'advance', 'deliver');
SELECT pepsi.workqueue_commit(:e, '', 'advance', 'deliver');
-- with a body rewrite, checked before the new body is stored
SELECT pepsi.workqueue_commit(-1, 'filter', 'fail', set_body => 'new');
SELECT pepsi.workqueue_commit(:e, 'deliver', 'fail', set_body => 'new');
SELECT pepsi.workqueue_commit(:p, 'init', 'fail', set_body => 'new');

-- The transition and the arguments it needs or forbids.
SELECT pepsi.workqueue_commit(:e, 'filter', NULL);
SELECT pepsi.workqueue_commit(:e, 'filter', 'explode');
SELECT pepsi.workqueue_commit(:e, 'filter', 'advance');
SELECT pepsi.workqueue_commit(:e, 'filter', 'advance_to');
SELECT pepsi.workqueue_commit(:e, 'filter', 'reroute', merge_state => '{"bounce": {}}');
SELECT pepsi.workqueue_commit(:e, 'filter', 'advance', '');
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', 'deliver');
SELECT pepsi.workqueue_commit(:e, 'filter', 'pause', 'deliver', retry_seconds => 60);
SELECT pepsi.workqueue_commit(:e, 'filter', 'finish', 'deliver');
SELECT pepsi.workqueue_commit(:e, 'filter', 'advance', 'deliver', retry_seconds => 60);
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', retry_seconds => 60);
SELECT pepsi.workqueue_commit(:e, 'filter', 'finish', retry_seconds => 0);
SELECT pepsi.workqueue_commit(:e, 'filter', 'pause');
SELECT pepsi.workqueue_commit(:e, 'filter', 'pause', retry_seconds => -1);
SELECT pepsi.workqueue_commit(:e, 'filter', 'pause', retry_seconds => 'NaN');
SELECT pepsi.workqueue_commit(:e, 'filter', 'pause', retry_seconds => '-Infinity');
SELECT pepsi.workqueue_commit(:e, 'filter', 'pause', retry_seconds => 1e12);
SELECT pepsi.workqueue_commit(:e, 'filter', 'advance', 'deliver', at_stage => 'deliver');
SELECT pepsi.workqueue_commit(:e, 'filter', 'finish', at_stage => 'deliver');
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', at_stage => '');

-- Content arguments.
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', merge_state => '[{"k": 2}]');
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', merge_state => '"k"');
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', set_state => '[]');
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', set_rcpt_to => '{}');
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', set_rcpt_to => '{bob@example.net,NULL}');
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', set_rcpt_to => '{""}');

-- Nothing was written, no body was stored.
SELECT pg_temp.changed(:e, :'before') AS changed_by_refusals;
SELECT count(*) - :bodies_before AS bodies_added FROM pepsi.workqueue_body;
SELECT id - :e AS n, stage, status FROM pepsi.workqueue ORDER BY id;

-- A pause or failure decided by a successor fused into the pass stays at
-- that successor's stage (at_stage), so its retry runs that stage again.
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :e;
SELECT pepsi.workqueue_commit(:e, 'filter', 'pause', retry_seconds => 60, at_stage => 'deliver');
SELECT stage, status FROM pepsi.workqueue WHERE id = :e;
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL, stage = 'filter' WHERE id = :e;
SELECT pepsi.workqueue_commit(:e, 'filter', 'fail', merge_state => '{"why": "x"}', at_stage => 'sign');
SELECT stage, status, state->>'why' AS why FROM pepsi.workqueue WHERE id = :e;

-- Leave the queue empty, every body released.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
