--
-- The administrative surface (docs/pepsi-admin.7.md): the group roles and
-- pepsi.apply_grants(), the queue views, the queue actions (retry, hold,
-- release, bounce, delete) and the configuration writers (config_set,
-- config_unset, config_get), each with its refusals, and the one
-- pepsi.event_log row every action writes.  What each role may do, tried
-- by logging in as it, is t/010_roles.pl.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 20001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 20001;

-- The functions are PL/pgSQL: an error's CONTEXT would name their line
-- numbers, which say nothing to a DBA and change with every edit.
\set SHOW_CONTEXT never

-- psql prints a notification with the sending backend's PID: the output of
-- a statement that may notify is captured and the PID masked.
SELECT '/tmp/pepsi-regress-notify-' || pg_backend_pid() || '.out' AS notify_file \gset
\setenv PEPSI_NOTIFY_FILE :notify_file

-- The audit rows of this file are those after this one.
SELECT coalesce(max(id), 0) AS events_before FROM pepsi.event_log \gset
CREATE TEMP VIEW events AS
SELECT principal = current_user AS by_me, action, detail
FROM pepsi.event_log WHERE id > :events_before ORDER BY id;

-- ---------------------------------------------------------------------------
-- Group roles and their grants
-- ---------------------------------------------------------------------------

-- CREATE EXTENSION made the group roles (pepsi-admin(7) lists them); none can log in.
SELECT rolname, rolcanlogin, rolsuper, rolinherit, rolcreaterole, rolcreatedb
FROM pg_roles WHERE rolname LIKE 'pepsi\_%' ORDER BY rolname;

-- What each holds on the tables and views, read from the live catalog.
SELECT r.rolname AS role, c.relname AS relation,
       string_agg(p.privilege, ',' ORDER BY p.n) AS privileges
FROM pg_roles r
CROSS JOIN pg_class c
CROSS JOIN unnest('{SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER}'::text[])
     WITH ORDINALITY AS p (privilege, n)
WHERE r.rolname LIKE 'pepsi\_%' AND c.relnamespace = 'pepsi'::regnamespace
  AND c.relkind IN ('r', 'v') AND has_table_privilege(r.oid, c.oid, p.privilege)
GROUP BY r.rolname, c.relname
ORDER BY r.rolname, c.relname;

-- ... on the sequences and the schema ...
SELECT r.rolname AS role, c.relname AS sequence
FROM pg_roles r CROSS JOIN pg_class c
WHERE r.rolname LIKE 'pepsi\_%' AND c.relnamespace = 'pepsi'::regnamespace AND c.relkind = 'S'
  AND has_sequence_privilege(r.oid, c.oid, 'USAGE')
ORDER BY 1, 2;
SELECT r.rolname AS role, has_schema_privilege(r.oid, 'pepsi', 'USAGE') AS usage,
       has_schema_privilege(r.oid, 'pepsi', 'CREATE') AS "create"
FROM pg_roles r WHERE r.rolname LIKE 'pepsi\_%' ORDER BY 1;

-- ... and who may call each function (none: the owner's alone); PUBLIC
-- may call none of them.
SELECT p.proname AS function, coalesce(string_agg(DISTINCT r.rolname, ' ' ORDER BY r.rolname), '') AS roles
FROM pg_proc p
LEFT JOIN pg_roles r ON r.rolname LIKE 'pepsi\_%' AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
WHERE p.pronamespace = 'pepsi'::regnamespace
GROUP BY p.proname ORDER BY p.proname;
SELECT count(*) AS functions_public_may_call
FROM pg_proc p CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
WHERE p.pronamespace = 'pepsi'::regnamespace AND a.grantee = 0;

-- The functions that run as the owner pin their search_path; no other does.
SELECT p.proname AS definer, p.proconfig
FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace AND p.prosecdef
ORDER BY p.proname;

-- Applied and verified: no drift, and one audit row.
SELECT * FROM pepsi.apply_grants();

-- Drift of every kind the check knows: a grant beyond the policy, one to
-- PUBLIC, a definer made invoker, the append-only log opened to a role
-- outside the policy, a grant to such a role, a group made a member of
-- another.
CREATE ROLE regress_admin_stranger NOLOGIN;
GRANT UPDATE ON pepsi.config_override TO pepsi_stage;
GRANT SELECT ON pepsi.workqueue TO PUBLIC;
GRANT UPDATE (action) ON pepsi.event_log TO pepsi_monitor;
ALTER FUNCTION pepsi.queue_delete(bigint[]) SECURITY INVOKER RESET search_path;
GRANT DELETE, TRUNCATE ON pepsi.event_log TO regress_admin_stranger;
GRANT INSERT ON pepsi.settings TO regress_admin_stranger;
GRANT pepsi_ingress TO pepsi_monitor;
SELECT * FROM pepsi.grant_verify();

-- Re-applying repairs what grants can repair; what remains is reported:
-- the membership (which gives pepsi_monitor what pepsi_ingress holds) and
-- the stranger's grant outside the logs.
SELECT * FROM pepsi.apply_grants();
-- strict raises instead, and undoes the whole call
SELECT * FROM pepsi.apply_grants(strict => true);
REVOKE pepsi_ingress FROM pepsi_monitor;
REVOKE ALL ON pepsi.settings FROM regress_admin_stranger;
DROP ROLE regress_admin_stranger;
SELECT * FROM pepsi.apply_grants(strict => true);
SELECT * FROM events;

-- A missing group role is reported, and apply_grants says how to recreate it.
ALTER ROLE pepsi_monitor RENAME TO regress_admin_monitor;
SELECT * FROM pepsi.grant_verify() WHERE object LIKE 'role %';
SELECT * FROM pepsi.apply_grants();
ALTER ROLE regress_admin_monitor RENAME TO pepsi_monitor;

-- An object the policy does not cover, and a name in the policy that the
-- schema lacks, are reported (a function added without its grants would
-- otherwise fail only in production, with a permission error); neither
-- stops the grants from being applied.
ALTER FUNCTION pepsi.recipients_subset(text[], integer[]) RENAME TO regress_renamed;
CREATE FUNCTION pepsi.regress_unlisted() RETURNS integer LANGUAGE sql AS 'SELECT 1';
SELECT * FROM pepsi.apply_grants();
ALTER FUNCTION pepsi.regress_renamed(text[], integer[]) RENAME TO recipients_subset;
DROP FUNCTION pepsi.regress_unlisted();
SELECT * FROM pepsi.apply_grants();

-- ---------------------------------------------------------------------------
-- The views, in one transaction so that now() and thus every age is fixed
-- ---------------------------------------------------------------------------

BEGIN;
CREATE FUNCTION pg_temp.add_aged(rcpt text[], age interval, client inet DEFAULT NULL,
                                 account text DEFAULT NULL) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    added bigint := pepsi.workqueue_add('s@example.org', rcpt, 'h', 'b',
                                        client_address => client, auth_account => account);
BEGIN
    UPDATE pepsi.workqueue SET received_at = now() - age WHERE id = added;
    RETURN added;
END
$$;
SELECT pg_temp.add_aged('{alice@Example.ORG,bob@example.org}', '1 minute', '192.0.2.1') AS fresh,
       pg_temp.add_aged('{carol@example.net}', '5 minutes', '192.0.2.1') AS five,
       pg_temp.add_aged('{dave@example.net,erin@mail.example.com}', '30 minutes', account => 'alice') AS held,
       pg_temp.add_aged('{postmaster}', '100 minutes', account => 'alice') AS failed,
       pg_temp.add_aged('{frank@EXAMPLE.org}', '3 days', '2001:db8::1') AS running,
       pg_temp.add_aged('{grace@example.com}', '1000 minutes', '2001:db8::2') AS timedout \gset
UPDATE pepsi.workqueue SET stage = 'relay' WHERE id <> :fresh;
UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '10 minutes' WHERE id = :five;
UPDATE pepsi.workqueue SET status = 'paused', timeout = 'infinity' WHERE id = :held;
UPDATE pepsi.workqueue SET status = 'failed' WHERE id = :failed;
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :running;
UPDATE pepsi.workqueue SET status = 'timeout', stage = 'deliver' WHERE id = :timedout;

-- Stage x status: messages, those on hold (counted among the paused), the
-- age of the oldest.
SELECT * FROM pepsi.queue_summary;

-- Recipients per domain (after the last "@", lower-cased; none for
-- "postmaster") in doubling age buckets: 5 minutes old is still "5m".
SELECT * FROM pepsi.queue_shape;

-- Per sender as the fair share sees them.
SELECT * FROM pepsi.queue_senders;
COMMIT;

SELECT pepsi.recipient_domain('Bob@Ex@AMPLE.org') AS last_at, pepsi.recipient_domain('postmaster') AS none,
       pepsi.recipient_domain('bob@') AS empty, pepsi.recipient_domain(NULL) AS null;

DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- Queue actions
-- ---------------------------------------------------------------------------

CREATE FUNCTION pg_temp.add(label text, rcpt text[] DEFAULT NULL, sender text DEFAULT 's@example.org',
                            state jsonb DEFAULT '{}') RETURNS bigint LANGUAGE sql AS $$
    SELECT pepsi.workqueue_add(sender, coalesce(rcpt, ARRAY[label || '@example.net']), 'h', 'b',
                               jsonb_build_object('label', label) || state)
$$;
CREATE TEMP VIEW queue AS
SELECT id, state ->> 'label' AS row, stage, status,
       CASE WHEN timeout = 'infinity' THEN 'held' WHEN timeout IS NOT NULL THEN 'retry time' END AS timeout
FROM pepsi.workqueue ORDER BY id;

SELECT pg_temp.add('pending') AS pending, pg_temp.add('paused') AS paused,
       pg_temp.add('failed') AS failed, pg_temp.add('timedout') AS timedout,
       pg_temp.add('running') AS running, pg_temp.add('held') AS held,
       pg_temp.add('bounce', '{s@example.org}', '') AS dsn \gset
UPDATE pepsi.workqueue SET stage = 'relay' WHERE id <> :dsn;
UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 hour' WHERE id = :paused;
UPDATE pepsi.workqueue SET status = 'failed' WHERE id = :failed;
UPDATE pepsi.workqueue SET status = 'timeout' WHERE id = :timedout;
UPDATE pepsi.workqueue SET status = 'running' WHERE id = :running;
UPDATE pepsi.workqueue SET status = 'failed', stage = 'bounce' WHERE id = :dsn;
SELECT pepsi.queue_hold(ARRAY[:held]);
SELECT * FROM queue;
SELECT max(id) AS events_before_actions FROM pepsi.event_log \gset

-- Every action refuses a bad id list, all or nothing, before it looks at
-- a row: NULL, empty, a NULL id, an id twice, two dimensions; then an id
-- with no row (naming every missing one), a running row.
SELECT pepsi.queue_retry(NULL);
SELECT pepsi.queue_hold('{}');
SELECT pepsi.queue_release(ARRAY[:held, NULL]);
SELECT pepsi.queue_delete(ARRAY[:paused, :failed, :paused]);
SELECT pepsi.queue_bounce('{{1,2},{3,4}}', 'no such user');
SELECT pepsi.queue_retry(ARRAY[:paused, 99]);
SELECT pepsi.queue_delete(ARRAY[97, :paused, 98, 99]);
SELECT pepsi.queue_hold(ARRAY[:pending, :running]);
SELECT pepsi.queue_delete(ARRAY[:running]);
SELECT pepsi.queue_bounce(ARRAY[:failed, :running], 'no such user');
-- Nothing changed and nothing was logged.
SELECT * FROM queue;
SELECT count(*) AS events_of_refusals FROM pepsi.event_log WHERE id > :events_before_actions;

-- queue_retry: paused, failed and timed-out rows are pending again now,
-- and the dispatcher is woken.  A pending row named with them is left as
-- it is, and so is a held row: only a release ends a hold.
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.queue_retry(ARRAY[:paused, :failed, :timedout, :pending, :held]);
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT * FROM queue;
-- Nothing to retry: 0, and no wake-up (still an action, logged).
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.queue_retry(ARRAY[:pending, :held]);
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"

-- queue_hold: pending, paused and failed rows alike are parked, paused
-- with no retry time; a row already held is left as it is.
UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 hour' WHERE id = :paused;
UPDATE pepsi.workqueue SET status = 'failed' WHERE id = :failed;
SELECT pepsi.queue_hold(ARRAY[:pending, :paused, :failed, :held]);
SELECT pepsi.queue_hold(ARRAY[:pending]);
SELECT * FROM queue;

-- Neither the maintenance requeue of due rows nor a requeue far in the
-- future touches a hold.
SELECT pepsi.workqueue_requeue_due();
SELECT count(*) AS held_rows_due_in_a_century FROM pepsi.workqueue
WHERE status = 'paused' AND timeout <= now() + interval '100 years';

-- queue_release: held rows are pending again, and the dispatcher is
-- woken; rows not on hold (one paused until its retry time, a failed one)
-- are left as they are.
UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 hour' WHERE id = :timedout;
SELECT pepsi.queue_release(ARRAY[:pending, :running]);
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.queue_release(ARRAY[:pending, :paused, :failed, :timedout, :dsn]);
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT * FROM queue;
-- Nothing on hold: 0, and no wake-up.
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.queue_release(ARRAY[:timedout, :dsn]);
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"

-- queue_bounce: the reason is one line the DSN quotes; the stage a name;
-- a bounce is never bounced.
SELECT pepsi.queue_bounce(ARRAY[:failed], NULL);
SELECT pepsi.queue_bounce(ARRAY[:failed], '   ');
SELECT pepsi.queue_bounce(ARRAY[:failed], E'no such user\r\nX-Injected: yes');
SELECT pepsi.queue_bounce(ARRAY[:failed], 'no such user', NULL);
SELECT pepsi.queue_bounce(ARRAY[:failed], 'no such user', 'Bounce Stage');
SELECT pepsi.queue_bounce(ARRAY[:failed, :dsn], 'no such user');

-- A row of one recipient names it and carries its DSN parameters; a row
-- of several fails all of them; the rest of the state is kept; the rows
-- go pending to the bounce stage (default "bounce", or the one given),
-- and the dispatcher is woken.
UPDATE pepsi.workqueue
SET state = state || '{"attempts": 3, "dsn": {"envid": "QQ314159", "ret": "HDRS",
                        "rcpt": [{"notify": "FAILURE,DELAY", "orcpt": "rfc822;failed@example.net"}]}}'
WHERE id = :failed;
UPDATE pepsi.workqueue SET rcpt_to = '{a@example.net,b@example.net}' WHERE id = :timedout;
LISTEN pepsi_workqueue;
\o :notify_file
SELECT pepsi.queue_bounce(ARRAY[:failed, :timedout], 'Mailbox retired by the postmaster');
\o
UNLISTEN pepsi_workqueue;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
SELECT pepsi.queue_bounce(ARRAY[:held], 'Held too long', bounce_stage => 'dsn-local');
SELECT id, stage, status, timeout, jsonb_pretty(state) AS state
FROM pepsi.workqueue WHERE id IN (:failed, :timedout, :held) ORDER BY id;

-- queue_delete: rows no worker holds go, and with the last of them their
-- bodies; no bounce is sent.
SELECT count(*) AS bodies FROM pepsi.workqueue_body;
SELECT pepsi.queue_delete(ARRAY[:pending, :paused, :failed, :timedout, :held, :dsn]);
SELECT * FROM queue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;

-- The principal is the role acting, also through the functions that run
-- as the owner: here a member of pepsi_config that took its role.
-- pepsi_config acts on the queue through these functions only.
CREATE ROLE regress_admin_operator NOLOGIN IN ROLE pepsi_config;
SET ROLE regress_admin_operator;
SELECT pepsi.queue_hold(ARRAY[:running]);
UPDATE pepsi.workqueue SET status = 'failed' WHERE id = :running;
RESET ROLE;
UPDATE pepsi.workqueue SET status = 'failed' WHERE id = :running;
SET ROLE regress_admin_operator;
SELECT pepsi.queue_hold(ARRAY[:running]);
SELECT pepsi.event_principal(), current_user;
RESET ROLE;
SELECT principal, action, detail FROM pepsi.event_log WHERE id = (SELECT max(id) FROM pepsi.event_log);

-- One audit row per action, with its ids and what it did.
SELECT * FROM events WHERE action LIKE 'queue%';

-- ---------------------------------------------------------------------------
-- Configuration: config_set, config_get, config_unset
-- ---------------------------------------------------------------------------

-- Scopes are canonical: domains lower-cased, an address's local part kept.
SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '5s') AS previous;
SELECT pepsi.config_set('domain:Example.ORG', 'stage-relay', 'MAX_LIFETIME', '5d') AS previous;
SELECT pepsi.config_set('address:Bob@Example.ORG', 'stage-filter', 'SPAM_SCORE', '7') AS previous;
SELECT pepsi.config_set('global', 'stage-relay', 'PARALLELISM', '8') AS previous;
SELECT pepsi.config_set('global', 'pepsi', 'MAIL_LOG', 'Yes') AS previous;
SELECT pepsi.config_set('global', 'pepsi', 'HOSTNAME', 'mx1.example.org') AS previous;
SELECT pepsi.config_set('global', 'stage-relay', 'PROGRAM', 'pepsi-stage-relay-to-smarthost') AS previous;
SELECT pepsi.config_set('global', 'dispatch', 'FAIR_HALF_LIFE', '1.5min') AS previous;
SELECT pepsi.config_set('global', 'ingress', 'BATCH_SIZE', '128') AS previous;
SELECT pepsi.config_set('domain:example.net', 'stage-route', 'REMOTE_STAGE', 'relay-slow') AS previous;
SELECT scope, section, option, value, updated_by = current_user AS by_me
FROM pepsi.config_override ORDER BY scope, section, option;

-- Replacing returns the value replaced; setting the value in force
-- changes nothing and wakes no daemon (it is still an action, logged).
LISTEN pepsi_config_changed;
\o :notify_file
SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '10s') AS previous;
SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '10s') AS previous;
\o
UNLISTEN pepsi_config_changed;
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"

-- config_get reads one scope exactly, whatever the case of its domain.
SELECT pepsi.config_get('domain:EXAMPLE.org', 'stage-relay', 'MAX_LIFETIME') AS domain_value,
       pepsi.config_get('global', 'stage-relay', 'MAX_LIFETIME') AS global_value,
       pepsi.config_get('address:Bob@example.org', 'stage-filter', 'SPAM_SCORE') AS address_value,
       pepsi.config_get('address:bob@example.org', 'stage-filter', 'SPAM_SCORE') AS other_local_part;

-- config_unset returns the value removed; removing what is not there is
-- an error, not a silent success.
SELECT pepsi.config_unset('domain:example.org', 'stage-relay', 'MAX_LIFETIME') AS removed;
SELECT pepsi.config_unset('domain:example.org', 'stage-relay', 'MAX_LIFETIME') AS removed;

-- config_validate checks without writing and gives the canonical scope.
SELECT pepsi.config_validate('address:Postmaster@XN--BCHER-KVA.Example', 'stage-relay', 'NEXT_STAGE', 'deliver');

-- Scopes refused
SELECT pepsi.config_set(NULL, 'pepsi', 'MAIL_LOG', 'yes');
SELECT pepsi.config_set('domain:', 'pepsi', 'MAIL_LOG', 'yes');
SELECT pepsi.config_set('address:', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('Global', 'pepsi', 'MAIL_LOG', 'yes');
SELECT pepsi.config_set('host:mx.example.org', 'pepsi', 'MAIL_LOG', 'yes');
SELECT pepsi.config_set('domain:exa mple.org', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('domain:-example.org', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('domain:example..org', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('domain:example.org.', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('domain:bücher.example', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('address:bob', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('address:bob@alice@example.org', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('address:b ob@example.org', 'stage-relay', 'MAX_LIFETIME', '1d');
SELECT pepsi.config_set('address:bob@', 'stage-relay', 'MAX_LIFETIME', '1d');

-- Sections refused: [database] and [listener-*] are never read from here
SELECT pepsi.config_set('global', 'database', 'CONNINFO', 'host=evil.example');
SELECT pepsi.config_set('global', 'listener-smtp', 'PORT', '2525');
SELECT pepsi.config_get('global', 'listener-submission', 'PORT');
SELECT pepsi.config_set('global', NULL, 'MAIL_LOG', 'yes');
SELECT pepsi.config_set('global', '[dispatch]', 'POLL_INTERVAL', '5s');
SELECT pepsi.config_set('global', 'Dispatch', 'POLL_INTERVAL', '5s');
SELECT pepsi.config_set('global', '9stage', 'POLL_INTERVAL', '5s');
SELECT pepsi.config_set('global', 'stage-', 'PARALLELISM', '2');
SELECT pepsi.config_set('global', 'dispatcher', 'POLL_INTERVAL', '5s');

-- Options refused: malformed names, and names the section does not have
SELECT pepsi.config_set('global', 'dispatch', NULL, '5s');
SELECT pepsi.config_set('global', 'dispatch', 'poll_interval', '5s');
SELECT pepsi.config_set('global', 'dispatch', 'POLL-INTERVAL', '5s');
SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVALS', '5s');
SELECT pepsi.config_get('global', 'pepsi', 'LOG_LEVEL');
SELECT pepsi.config_unset('global', 'dispatch', 'POLL_INTERVALS');
-- a process-wide option has no domain or address scope
SELECT pepsi.config_set('domain:example.org', 'dispatch', 'POLL_INTERVAL', '5s');
SELECT pepsi.config_set('address:bob@example.org', 'stage-relay', 'PARALLELISM', '2');

-- Values refused: each known option's value is checked for its kind, and
-- every value is one line
SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', NULL);
SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '5 s');
SELECT pepsi.config_set('global', 'dispatch', 'FAIR_FIFO_PERCENT', '101');
SELECT pepsi.config_set('global', 'dispatch', 'FAIR_FIFO_PERCENT', 'ten');
SELECT pepsi.config_set('global', 'dispatch', 'FAIR_FIFO_PERCENT', '99999999999999999999');
SELECT pepsi.config_set('global', 'stage-relay', 'PARALLELISM', '0');
SELECT pepsi.config_set('global', 'pepsi', 'MAIL_LOG', 'maybe');
SELECT pepsi.config_set('global', 'pepsi', 'HOSTNAME', 'mx..example.org');
SELECT pepsi.config_set('global', 'stage-relay', 'PROGRAM', '/bin/sh');
SELECT pepsi.config_set('global', 'stage-relay', 'NEXT_STAGE', 'Deliver');
SELECT pepsi.config_set('global', 'stage-route', 'REMOTE_STAGE', 'relay out');
SELECT pepsi.config_set('global', 'ingress', 'BATCH_SIZE', '2048');
SELECT pepsi.config_set('global', 'stage-filter', 'BANNER', E'one\ntwo');

-- None of the refusals wrote anything.
SELECT scope, section, option, value FROM pepsi.config_override ORDER BY scope, section, option;
SELECT * FROM events WHERE action LIKE 'config%';

-- ---------------------------------------------------------------------------
-- pepsi-httpd viewers: an account or token with the role 'viewer' may read,
-- not act.  pepsi-httpd names whom it acts for in pepsi.admin_account; an
-- action for a viewer fails (insufficient_privilege) and changes nothing.
-- ---------------------------------------------------------------------------

SELECT pepsi.admin_account_set('regress-viewer', '$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA', 'viewer');
SELECT pepsi.api_token_create('regress-viewer', 'viewer') IS NOT NULL AS token_made;
SELECT pepsi.api_token_create('regress-admin') IS NOT NULL AS token_made;
SELECT name, role FROM pepsi.api_token WHERE name LIKE 'regress-%' ORDER BY name;
SELECT format('%s %s', status, timeout) AS row_before FROM pepsi.workqueue WHERE id = :running \gset
BEGIN;
SELECT set_config('pepsi.admin_account', 'regress-viewer', true) IS NOT NULL AS acting;
SELECT pepsi.queue_release(ARRAY[:running]);
ROLLBACK;
BEGIN;
SELECT set_config('pepsi.admin_account', 'token:regress-viewer', true) IS NOT NULL AS acting;
SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '7s');
ROLLBACK;
SELECT format('%s %s', status, timeout) = :'row_before' AS unchanged FROM pepsi.workqueue WHERE id = :running;
SELECT count(*) AS overrides FROM pepsi.config_override;
-- A new password without a role keeps the account's role; a role is
-- admin or viewer; an admin acts.
SELECT pepsi.admin_account_set('regress-viewer', '$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA');
SELECT role FROM pepsi.admin_account WHERE name = 'regress-viewer';
SELECT pepsi.admin_account_set('regress-viewer', '$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA', 'root');
SELECT pepsi.api_token_create('regress-other', NULL);
SELECT pepsi.admin_account_set('regress-viewer', '$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA', 'admin');
BEGIN;
SELECT set_config('pepsi.admin_account', 'regress-viewer', true) IS NOT NULL AS acting;
SELECT pepsi.queue_release(ARRAY[:running]) AS released;
SELECT principal FROM pepsi.event_log WHERE id = (SELECT max(id) FROM pepsi.event_log);
ROLLBACK;
DELETE FROM pepsi.admin_account WHERE name = 'regress-viewer';
DELETE FROM pepsi.api_token WHERE name LIKE 'regress-%';

-- ---------------------------------------------------------------------------
-- Leave the queue and the overlay empty.
-- ---------------------------------------------------------------------------

SELECT pepsi.queue_delete(ARRAY[:running]);
DELETE FROM pepsi.config_override;
DROP ROLE regress_admin_operator;
\! rm -f "$PEPSI_NOTIFY_FILE"

-- Whom ingress runs as and whose passwords it trusts are file only, in the
-- functions and in the table itself.
SELECT pepsi.config_set('global', 'ingress', 'USER', 'root');
SELECT pepsi.config_set('global', 'ingress', 'CREDENTIALS', '/tmp/x');
\set VERBOSITY terse
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'ingress', 'GROUP', 'root');
\set VERBOSITY default
