--
-- Admission: workqueue_add (ingress; no NOTIFY, so SMTP sessions
-- group-commit) and workqueue_inject (side messages; NOTIFY, and
-- at-most-once under a token).
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 1001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 1001;

CREATE TEMP VIEW queue AS
SELECT w.id, w.stage, w.status, w.state, w.timeout IS NOT NULL AS has_timeout,
       w.mail_from, w.rcpt_to, convert_from(w.headers, 'UTF8') AS headers,
       convert_from(b.body, 'UTF8') AS body, w.clone_token, w.sender_key
FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id;

-- psql prints a notification with the sending backend's PID, so where one
-- is expected the output is captured and the PID masked.
SELECT '/tmp/pepsi-regress-notify-' || pg_backend_pid() || '.out' AS notify_file \gset
\setenv PEPSI_NOTIFY_FILE :notify_file

-- ---------------------------------------------------------------------------
-- workqueue_add
-- ---------------------------------------------------------------------------

-- The defaults: stage init, pending, empty state, no retry time.  No
-- notification follows the commit (psql would print it after COMMIT).
LISTEN pepsi_workqueue;
BEGIN;
SELECT pepsi.workqueue_add('alice@example.org', '{bob@example.net,carol@example.net}',
                           'Subject: hi', 'Hello.') AS plain \gset
SELECT received_at = now() AS received_now, client_address IS NULL AS no_address,
       auth_account IS NULL AS no_account, pending_seq IS NOT NULL AS queued
FROM pepsi.workqueue WHERE id = :plain;
\o :notify_file
COMMIT;
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT * FROM queue WHERE id = :plain;

-- Every argument given; the null sender and an empty message are legal.
SELECT pepsi.workqueue_add('', '{postmaster@example.org}', '', '',
                           '{"dsn": {"ret": "FULL"}}', '203.0.113.5', 'alice', 'smtp-in') AS full \gset
SELECT * FROM queue WHERE id = :full;

-- Each message has a body of its own.
SELECT count(DISTINCT body_id) AS bodies, count(*) AS rows FROM pepsi.workqueue;

-- Errors name the argument; nothing is written.
SELECT pepsi.workqueue_add(NULL, '{bob@example.net}', 'h', 'b');
SELECT pepsi.workqueue_add('a@example.org', NULL, 'h', 'b');
SELECT pepsi.workqueue_add('a@example.org', '{}', 'h', 'b');
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net,NULL}', 'h', 'b');
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net,""}', 'h', 'b');
SELECT pepsi.workqueue_add('a@example.org', '{{bob@example.net},{carol@example.net}}', 'h', 'b');
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net}', NULL, 'b');
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net}', 'h', NULL);
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net}', 'h', 'b', NULL);
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net}', 'h', 'b', '[]');
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net}', 'h', 'b', '"state"');
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net}', 'h', 'b', stage => NULL);
SELECT pepsi.workqueue_add('a@example.org', '{bob@example.net}', 'h', 'b', stage => '');
SELECT count(*) AS rows, (SELECT count(*) FROM pepsi.workqueue_body) AS bodies FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- workqueue_inject
-- ---------------------------------------------------------------------------

-- A side message at a named stage, a new message received now, and the
-- dispatcher is woken at commit.
LISTEN pepsi_workqueue;
BEGIN;
SELECT pepsi.workqueue_inject('autoreply', 'bob@example.net', '{alice@example.org}',
                              'Subject: away', 'I am away.', '{"reply_to": 1001}',
                              'vacation-1001') AS injected \gset
SELECT received_at = now() AS received_now, pending_seq IS NOT NULL AS queued
FROM pepsi.workqueue WHERE id = :injected;
\o :notify_file
COMMIT;
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT * FROM queue WHERE id = :injected;

-- The token is live: a second inject returns NULL, adds no row, leaves no
-- body behind, and wakes nobody.
SELECT count(*) AS bodies_before FROM pepsi.workqueue_body \gset
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.workqueue_inject('autoreply', 'bob@example.net', '{alice@example.org}',
                              'Subject: away', 'I am still away.', '{}', 'vacation-1001') IS NULL
    AS skipped;
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT count(*) AS rows_with_token FROM pepsi.workqueue WHERE clone_token = 'vacation-1001';
SELECT count(*) - :bodies_before AS bodies_added FROM pepsi.workqueue_body;
SELECT body FROM queue WHERE clone_token = 'vacation-1001';

-- The same, twice in one transaction: still one row.
BEGIN;
SELECT pepsi.workqueue_inject('autoreply', 'bob@example.net', '{dave@example.org}',
                              'h', 'b', '{}', 'vacation-1002') IS NOT NULL AS made;
SELECT pepsi.workqueue_inject('autoreply', 'bob@example.net', '{dave@example.org}',
                              'h', 'b', '{}', 'vacation-1002') IS NULL AS skipped;
COMMIT;
SELECT count(*) AS rows_with_token FROM pepsi.workqueue WHERE clone_token = 'vacation-1002';

-- Once the token's row is gone, the token is free again.
DELETE FROM pepsi.workqueue WHERE clone_token = 'vacation-1001';
SELECT pepsi.workqueue_inject('autoreply', 'bob@example.net', '{alice@example.org}',
                              'h', 'Back next week.', '{}', 'vacation-1001') IS NOT NULL AS made;
SELECT body FROM queue WHERE clone_token = 'vacation-1001';

-- Without a token there is no at-most-once: two calls, two rows.
SELECT pepsi.workqueue_inject('sendmail', 'root@localhost', '{admin@example.org}', 'h', 'cron') IS NOT NULL AS made;
SELECT pepsi.workqueue_inject('sendmail', 'root@localhost', '{admin@example.org}', 'h', 'cron') IS NOT NULL AS made;
SELECT stage, state, clone_token IS NULL AS no_token, sender_key FROM queue WHERE stage = 'sendmail';

-- state.origin.trust is not the admission roles' to choose: a member of
-- pepsi_ingress (pepsi-sendmail's login) that claims "pepsi", mail Pepsi
-- made itself and signs, gets "local", the rest of its origin kept; a
-- state without an origin gets one.  The pipeline (pepsi_stage) keeps
-- what it says.
SELECT current_setting('pepsi.admission_stage') AS admission_stage \gset
CREATE ROLE regress_admit_sendmail NOLOGIN IN ROLE pepsi_ingress;
CREATE ROLE regress_admit_stage NOLOGIN IN ROLE pepsi_stage;
SET ROLE regress_admit_sendmail;
SELECT pepsi.workqueue_inject(:'admission_stage', 'root@localhost', '{admin@example.org}', 'h', 'b',
                              '{"origin": {"trust": "pepsi", "program": "forged"}, "x": 1}') AS claimed \gset
SELECT pepsi.workqueue_inject(:'admission_stage', 'root@localhost', '{admin@example.org}', 'h', 'b',
                              '{"origin": "pepsi"}') AS claimed_text \gset
SELECT pepsi.workqueue_inject(:'admission_stage', 'root@localhost', '{admin@example.org}', 'h', 'b') AS plain \gset
SET ROLE regress_admit_stage;
SELECT pepsi.workqueue_inject('autoreply', 'bob@example.net', '{alice@example.org}', 'h', 'b',
                              '{"origin": {"trust": "pepsi", "program": "pepsi-stage-autoreply"}}') AS generated \gset
RESET ROLE;
SELECT id = :claimed AS claimed, id = :generated AS generated, state
FROM pepsi.workqueue WHERE id IN (:claimed, :claimed_text, :plain, :generated) ORDER BY id;
DELETE FROM pepsi.workqueue WHERE id IN (:claimed, :claimed_text, :plain, :generated);
DROP ROLE regress_admit_sendmail;
DROP ROLE regress_admit_stage;

-- Errors name the argument; nothing is written.
SELECT count(*) AS rows_before FROM pepsi.workqueue \gset
SELECT pepsi.workqueue_inject(NULL, 'a@example.org', '{b@example.net}', 'h', 'b');
SELECT pepsi.workqueue_inject('', 'a@example.org', '{b@example.net}', 'h', 'b');
SELECT pepsi.workqueue_inject('autoreply', NULL, '{b@example.net}', 'h', 'b');
SELECT pepsi.workqueue_inject('autoreply', 'a@example.org', NULL, 'h', 'b');
SELECT pepsi.workqueue_inject('autoreply', 'a@example.org', '{}', 'h', 'b');
SELECT pepsi.workqueue_inject('autoreply', 'a@example.org', '{NULL}', 'h', 'b');
SELECT pepsi.workqueue_inject('autoreply', 'a@example.org', '{b@example.net}', NULL, 'b');
SELECT pepsi.workqueue_inject('autoreply', 'a@example.org', '{b@example.net}', 'h', NULL);
SELECT pepsi.workqueue_inject('autoreply', 'a@example.org', '{b@example.net}', 'h', 'b', NULL);
SELECT pepsi.workqueue_inject('autoreply', 'a@example.org', '{b@example.net}', 'h', 'b', '[1]');
SELECT pepsi.workqueue_inject('autoreply', 'a@example.org', '{b@example.net}', 'h', 'b', '{}', '');
SELECT count(*) - :rows_before AS rows_added FROM pepsi.workqueue;

\! rm -f "$PEPSI_NOTIFY_FILE"

-- Leave the queue empty, every body released.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
