--
-- workqueue_pause (a retry time, a recipient subset kept, side clones) and
-- workqueue_finish_with_clones.  Clones are new messages (DSNs, copies) that
-- share the row's body; a token makes each at-most-once while it lives.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 4001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 4001;

CREATE TEMP VIEW queue AS
SELECT w.id, w.stage, w.status, w.timeout IS NOT NULL AS has_timeout, w.mail_from,
       w.rcpt_to, w.state, w.clone_token
FROM pepsi.workqueue w;

-- A message to three recipients, each with its DSN parameters, received
-- long ago, from an authenticated sender.
SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net,b@example.net,c@example.net}',
                           'Subject: three', 'Body.',
                           '{"dsn": {"ret": "HDRS", "rcpt": [{"notify": "A"}, {"notify": "B"}, {"notify": "C"}]}}',
                           auth_account => 'alice') AS p \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver',
       received_at = '2000-01-01 00:00:00+00' WHERE id = :p;
SELECT body_id AS p_body FROM pepsi.workqueue WHERE id = :p \gset

-- ---------------------------------------------------------------------------
-- workqueue_pause
-- ---------------------------------------------------------------------------

-- b was delivered: keep c and a (in that order), note the attempt, and
-- spawn a delay DSN about b plus an archive copy of the whole message.
-- Clones see the row as it was: all recipients, no merge.
SELECT array(SELECT x - :p FROM unnest(
    pepsi.workqueue_pause(:p, 'deliver', 600, '{"attempts": 1}', '{3,1}',
        '[{"token": "dsn-delay-p", "stage": "bounce", "rcpt_indices": [2], "state": {"dsn_kind": "delay"}},
          {"token": "archive-p", "stage": "archive"}]')) x) AS clones;
SELECT id - :p AS n, stage, status, has_timeout, mail_from, rcpt_to, state, clone_token
FROM queue ORDER BY id;
SELECT timeout > now() + interval '590 seconds' AND timeout <= now() + interval '600 seconds'
    AS due_in_ten_minutes
FROM pepsi.workqueue WHERE id = :p;

-- The clones share the body, headers and sender, and are new messages.
SELECT id - :p AS n, body_id = :p_body AS shares_body, headers = 'Subject: three' AS same_headers,
       sender_key, received_at > '2000-01-01 00:00:00+00' AS received_anew
FROM pepsi.workqueue ORDER BY id;

-- The row comes back; a second pause spawns the same clones again, as a
-- retried stage would.  Live tokens are skipped, not duplicated: only the
-- new one is made.  A clone may name recipients the row keeps, and new
-- addresses, from the null sender: a DSN about c back to the sender.
SELECT pepsi.workqueue_resume(ARRAY[:p]);
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :p;
SELECT array(SELECT x - :p FROM unnest(
    pepsi.workqueue_pause(:p, 'deliver', 1200, '{"attempts": 2}', '{1}',
        '[{"token": "dsn-delay-p", "stage": "bounce", "rcpt_indices": [2]},
          {"token": "archive-p", "stage": "archive"},
          {"token": "dsn-fail-p", "stage": "bounce", "mail_from": "", "rcpt_to": ["alice@example.org"],
           "state": {"dsn_kind": "failure", "about": ["c@example.net"]}}]')) x) AS clones;
SELECT clone_token, count(*) FROM pepsi.workqueue WHERE clone_token IS NOT NULL
GROUP BY clone_token ORDER BY clone_token;
SELECT id - :p AS n, stage, status, mail_from, rcpt_to, state, clone_token
FROM queue ORDER BY id;

-- Once a clone is gone (its DSN sent), its token may spawn again.
DELETE FROM pepsi.workqueue WHERE clone_token = 'dsn-delay-p';
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :p;
SELECT array(SELECT x - :p FROM unnest(
    pepsi.workqueue_pause(:p, 'deliver', 60,
        clones => '[{"token": "dsn-delay-p", "stage": "bounce"}]')) x) AS clones;
SELECT id - :p AS n, rcpt_to, state, clone_token FROM queue
WHERE clone_token = 'dsn-delay-p';

-- A clone may be parked too, like a split group.
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :p;
SELECT cardinality(pepsi.workqueue_pause(:p, 'deliver', 60,
        clones => '[{"token": "later-p", "stage": "bounce", "status": "retry", "retry_seconds": 30},
                    {"token": "failed-p", "stage": "bounce", "status": "failed"}]')) AS made;
SELECT clone_token, status, coalesce(timeout > now(), false) AS has_future_timeout FROM pepsi.workqueue
WHERE clone_token IN ('later-p', 'failed-p') ORDER BY clone_token;

-- Nothing to keep or spawn: just the pause, and an empty array back.
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :p;
SELECT pepsi.workqueue_pause(:p, 'deliver', 60);
UPDATE pepsi.workqueue SET status = 'running', timeout = NULL WHERE id = :p;
SELECT pepsi.workqueue_pause(:p, 'deliver', 0, NULL, NULL, '[]');
SELECT status, rcpt_to, state -> 'attempts' AS attempts FROM pepsi.workqueue WHERE id = :p;

DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- Refusals of workqueue_pause: nothing written, no clone made
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net,b@example.net,c@example.net}',
                           'h', 'b', '{"k": 1}') AS e \gset
SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net}', 'h', 'b') AS idle \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver' WHERE id = :e;
SELECT jsonb_agg(to_jsonb(w) ORDER BY id) AS before FROM pepsi.workqueue w \gset

-- the row and the plain arguments
SELECT pepsi.workqueue_pause(NULL, 'deliver', 60);
SELECT pepsi.workqueue_pause(-1, 'deliver', 60);
SELECT pepsi.workqueue_pause(:idle, 'init', 60);
SELECT pepsi.workqueue_pause(:e, 'relay', 60);
SELECT pepsi.workqueue_pause(:e, NULL, 60);
SELECT pepsi.workqueue_pause(:e, 'deliver', NULL);
SELECT pepsi.workqueue_pause(:e, 'deliver', -5);
SELECT pepsi.workqueue_pause(:e, 'deliver', 'NaN');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, '[]');

-- keep_indices
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, keep_indices => '{}');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, keep_indices => '{0}');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, keep_indices => '{4}');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, keep_indices => '{1,3,1}');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, keep_indices => '{1,NULL}');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, keep_indices => '{{1},{2}}');

-- clones
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '{"token": "t"}');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '"t"');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '["t"]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"stage": "bounce"}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": null, "stage": "bounce"}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": ""}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": 42}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60,
    clones => '[{"token": "t1", "stage": "bounce"}, {"token": "t2"}, {"token": "t1", "stage": "archive"}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "rcpt": ["x@example.net"]}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "stage": ""}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "stage": null}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "state": [1]}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "mail_from": 1}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "status": "paused"}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "status": "retry"}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "retry_seconds": 5}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "rcpt_indices": [4]}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "rcpt_indices": [1, 1]}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "rcpt_indices": []}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "rcpt_indices": [1.5]}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "rcpt_indices": "1"}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "rcpt_to": []}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, clones => '[{"token": "t", "rcpt_to": ["x@example.net", ""]}]');
SELECT pepsi.workqueue_pause(:e, 'deliver', 60,
    clones => '[{"token": "t", "rcpt_indices": [1], "rcpt_to": ["x@example.net"]}]');
-- a good clone before a bad keep list is not made either
SELECT pepsi.workqueue_pause(:e, 'deliver', 60, '{}', '{9}', '[{"token": "t"}]');

SELECT jsonb_agg(to_jsonb(w) ORDER BY id) = :'before'::jsonb AS untouched FROM pepsi.workqueue w;
DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- workqueue_finish_with_clones
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net,b@example.net}', 'h', 'Body.',
                           '{"dsn": {"rcpt": [{"notify": "A"}, {"notify": "B"}]}}') AS f \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver' WHERE id = :f;
SELECT body_id AS f_body FROM pepsi.workqueue WHERE id = :f \gset

-- Delivered to a, failed for b: the row goes, a failure DSN about b stays
-- with the body the row had.
SELECT array(SELECT x - :f FROM unnest(
    pepsi.workqueue_finish_with_clones(:f, 'deliver',
        '[{"token": "dsn-fail-f", "stage": "bounce", "rcpt_indices": [2], "state": {"dsn_kind": "failure"}}]')) x)
    AS clones;
SELECT id - :f AS n, stage, status, rcpt_to, state, clone_token, body_id = :f_body AS shares_body
FROM pepsi.workqueue ORDER BY id;
SELECT count(*) AS f_body_left FROM pepsi.workqueue_body WHERE id = :f_body;

-- The clone finishes too, with none of its own: now the body goes.
UPDATE pepsi.workqueue SET status = 'running' WHERE clone_token = 'dsn-fail-f';
SELECT id AS g FROM pepsi.workqueue WHERE clone_token = 'dsn-fail-f' \gset
SELECT pepsi.workqueue_finish_with_clones(:g, 'bounce', '[]');
SELECT count(*) AS rows, (SELECT count(*) FROM pepsi.workqueue_body) AS bodies FROM pepsi.workqueue;

-- A live token is skipped and the row still goes.
SELECT pepsi.workqueue_inject('bounce', '', '{alice@example.org}', 'h', 'dsn', '{}', 'dsn-fail-h') AS live \gset
SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net}', 'h', 'b') AS h \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver' WHERE id = :h;
SELECT pepsi.workqueue_finish_with_clones(:h, 'deliver', '[{"token": "dsn-fail-h", "stage": "bounce"}]');
SELECT id - :live AS n, stage, clone_token FROM pepsi.workqueue ORDER BY id;
SELECT count(*) AS bodies FROM pepsi.workqueue_body;
DELETE FROM pepsi.workqueue;

-- Refusals: the row stays, no clone is made.
SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net}', 'h', 'b') AS e \gset
SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net}', 'h', 'b') AS idle \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'deliver' WHERE id = :e;
SELECT pepsi.workqueue_finish_with_clones(:e, 'deliver', NULL);
SELECT pepsi.workqueue_finish_with_clones(:e, 'deliver', '{}');
SELECT pepsi.workqueue_finish_with_clones(:e, 'deliver', '[{"stage": "bounce"}]');
SELECT pepsi.workqueue_finish_with_clones(:e, 'deliver', '[{"token": "x", "rcpt_indices": [2]}]');
SELECT pepsi.workqueue_finish_with_clones(:e, 'deliver', '[{"token": "x"}, {"token": "x"}]');
SELECT pepsi.workqueue_finish_with_clones(:e, 'relay', '[]');
SELECT pepsi.workqueue_finish_with_clones(:idle, 'init', '[]');
SELECT pepsi.workqueue_finish_with_clones(-1, 'deliver', '[]');
SELECT pepsi.workqueue_finish_with_clones(NULL, 'deliver', '[]');
SELECT pepsi.workqueue_finish_with_clones(:e, '', '[]');
SELECT id - :e AS n, stage, status FROM pepsi.workqueue ORDER BY id;
DELETE FROM pepsi.workqueue;

-- A pause decided by a successor fused into the pass stays at that
-- successor's stage (at_stage), so the retry runs it again.
SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net}', 'h', 'b') AS f \gset
UPDATE pepsi.workqueue SET status = 'running', stage = 'sign' WHERE id = :f;
SELECT pepsi.workqueue_pause(:f, 'sign', 60, at_stage => '');
SELECT pepsi.workqueue_pause(:f, 'sign', 1e12);
SELECT cardinality(pepsi.workqueue_pause(:f, 'sign', 60, at_stage => 'deliver')) AS clones;
SELECT stage, status FROM pepsi.workqueue WHERE id = :f;

-- Leave the queue empty, every body released.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
