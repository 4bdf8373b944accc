--
-- workqueue_commit_many: one outcome for a batch of rows, with per-row
-- targets, state merges and retry times in arrays parallel to ids.  All or
-- nothing: one row that is not running at its expected stage fails the
-- call and no row changes.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 3001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 3001;

-- Three rows running: a and b at check, c at route.
SELECT pepsi.workqueue_add('s@example.org', '{a@example.net}', 'h', 'b', '{"n": "a"}') AS a \gset
SELECT pepsi.workqueue_add('s@example.org', '{b@example.net}', 'h', 'b', '{"n": "b"}') AS b \gset
SELECT pepsi.workqueue_add('s@example.org', '{c@example.net}', 'h', 'b', '{"n": "c"}') AS c \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'check' WHERE id IN (:a, :b);
UPDATE pepsi.workqueue SET status = 'running', stage = 'route' WHERE id = :c;

CREATE TEMP VIEW batch AS
SELECT split_part(rcpt_to[1], '@', 1) AS row, stage, status, state, timeout IS NOT NULL AS has_timeout
FROM pepsi.workqueue ORDER BY id;

-- ---------------------------------------------------------------------------
-- Each transition
-- ---------------------------------------------------------------------------

-- advance: each row to its own target, merges where given (NULL: none).
SELECT max(pending_seq) AS seq_before FROM pepsi.workqueue \gset
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b, :c], '{check,check,route}', 'advance',
                                   '{deliver,bounce,relay}',
                                   ARRAY['{"m": 1}', NULL, '{"n": "c2", "m": 3}']::jsonb[]);
SELECT * FROM batch;
SELECT bool_and(pending_seq > :seq_before) AS all_requeued_at_back FROM pepsi.workqueue;

-- advance_to and reroute are advances too; merge_states may be left out.
UPDATE pepsi.workqueue SET status = 'running';
SELECT pepsi.workqueue_commit_many(ARRAY[:a], '{deliver}', 'advance_to', '{relay}');
SELECT pepsi.workqueue_commit_many(ARRAY[:b, :c], '{bounce,relay}', 'reroute', '{bounce,bounce}',
                                   ARRAY[NULL, '{"bounce": {"reason": "5.7.1"}}']::jsonb[]);
SELECT * FROM batch;

-- pause: each row with its own retry time.
UPDATE pepsi.workqueue SET status = 'running';
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b, :c], '{relay,bounce,bounce}', 'pause',
                                   merge_states => ARRAY[NULL, NULL, '{"attempts": 2}']::jsonb[],
                                   retry_seconds => '{0,3600,60.5}');
SELECT * FROM batch;
SELECT split_part(rcpt_to[1], '@', 1) AS row, timeout <= now() AS due_now,
       timeout > now() + interval '3590 seconds' AS due_in_an_hour
FROM pepsi.workqueue ORDER BY id;

-- fail: state merges only.
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL;
SELECT pepsi.workqueue_commit_many(ARRAY[:c, :a], '{bounce,relay}', 'fail',
                                   merge_states => ARRAY['{"error": "c"}', '{"error": "a"}']::jsonb[]);
SELECT * FROM batch;

-- finish: the rows and their bodies go; the row left out stays.
UPDATE pepsi.workqueue SET status = 'running';
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :c], '{relay,bounce}', 'finish');
SELECT * FROM batch;
SELECT count(*) AS bodies FROM pepsi.workqueue_body;

DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- Refusals
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('s@example.org', '{a@example.net}', 'h', 'b', '{"n": "a"}') AS a \gset
SELECT pepsi.workqueue_add('s@example.org', '{b@example.net}', 'h', 'b', '{"n": "b"}') AS b \gset
SELECT pepsi.workqueue_add('s@example.org', '{c@example.net}', 'h', 'b', '{"n": "c"}') AS c \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'check' WHERE id IN (:a, :b);
UPDATE pepsi.workqueue SET stage = 'check' WHERE id = :c;
SELECT jsonb_agg(to_jsonb(w) ORDER BY id) AS before FROM pepsi.workqueue w \gset

-- One bad row fails the call, named, and no row changes, whatever the
-- transition: c is pending, b is not at route, row -1 does not exist.
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :c], '{check,check}', 'advance', '{deliver,deliver}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,route}', 'pause', retry_seconds => '{60,60}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b, -1], '{check,check,check}', 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[:b, :a, :c], '{check,check,check}', 'finish');
-- the first bad row in ids order is the one named
SELECT pepsi.workqueue_commit_many(ARRAY[:a, -2, :c], '{check,check,check}', 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :c, -2], '{check,check,check}', 'fail');

-- ids
SELECT pepsi.workqueue_commit_many(NULL, '{check}', 'fail');
SELECT pepsi.workqueue_commit_many('{}', '{}', 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, NULL], '{check,check}', 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b, :a], '{check,check,check}', 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[[:a], [:b]], '{check,check}', 'fail');

-- expected_stages
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], NULL, 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check}', 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check,check}', 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,NULL}', 'fail');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{{check},{check}}', 'fail');

-- the transition and the arrays it needs or forbids
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', NULL);
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'advance');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'reroute');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'advance', '{deliver}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'advance', '{deliver,NULL}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'advance', '{deliver,""}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'fail', '{deliver,deliver}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'finish', '{deliver,deliver}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'advance', '{deliver,deliver}',
                                   retry_seconds => '{1,1}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'fail', retry_seconds => '{1,1}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'pause');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'pause', retry_seconds => '{60}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'pause', retry_seconds => '{60,NULL}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'pause', retry_seconds => '{60,-1}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'pause', retry_seconds => '{NaN,60}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'pause', retry_seconds => '{60,-Infinity}');

-- merge_states
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'fail',
                                   merge_states => ARRAY['{}']::jsonb[]);
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'fail',
                                   merge_states => ARRAY['{}', '[1]']::jsonb[]);
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '{check,check}', 'fail',
                                   merge_states => ARRAY['"x"', NULL]::jsonb[]);

-- Nothing changed: a and b still running at check, c pending, same content.
SELECT jsonb_agg(to_jsonb(w) ORDER BY id) = :'before'::jsonb AS untouched FROM pepsi.workqueue w;
SELECT * FROM batch;

-- ---------------------------------------------------------------------------
-- Arrays whose lower bound is not 1 line up by position, as unnest does
-- (a target_stages array like this once crashed the backend).
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '[5:6]={check,check}', 'advance',
                                   '[0:1]={deliver,""}');
SELECT pepsi.workqueue_commit_many(ARRAY[:a, :b], '[5:6]={check,check}', 'advance',
                                   '[0:1]={deliver,relay}',
                                   merge_states => '[-1:0]={"{\"m\": 1}","{\"m\": 2}"}');
SELECT * FROM batch;

-- Leave the queue empty, every body released.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
