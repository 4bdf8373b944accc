--
-- The schema: the extension itself, the fair-share sender key, the table
-- constraints that guard the queue, and the two administrative tables that
-- refuse what they must (the audit log's changes, config overrides of the
-- [database] and [listener-*] sections).
--
-- Every file of the suite runs in this one database, in name order, and
-- leaves the queue empty.  Each restarts the identities at its own base so
-- the ids in error messages do not depend on what earlier files did.  Errors
-- show their DETAIL and HINT (the default verbosity), except constraint
-- violations, whose DETAIL prints the whole row, received_at included.
--
CREATE EXTENSION pepsi;
SELECT extversion FROM pg_extension WHERE extname = 'pepsi';

ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 1;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 1;

-- ---------------------------------------------------------------------------
-- sender_key: whom the fair-share claim charges for a row
-- ---------------------------------------------------------------------------

SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b',
                           client_address => '192.0.2.7', auth_account => 'alice') AS auth_and_ip \gset
SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b',
                           auth_account => 'bob') AS auth_only \gset
SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b',
                           client_address => '192.0.2.7') AS ipv4 \gset
SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b',
                           client_address => '2001:db8:1:2::10') AS ipv6_a \gset
SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b',
                           client_address => '2001:db8:1:2:ffff:ffff:ffff:1') AS ipv6_b \gset
SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b',
                           client_address => '2001:db8:1:3::10') AS ipv6_other \gset
SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b',
                           client_address => '::ffff:192.0.2.7') AS ipv4_mapped \gset
SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b',
                           client_address => '::ffff:198.51.100.9') AS ipv4_mapped_other \gset
SELECT pepsi.workqueue_add('s@example.org', '{r@example.net}', 'h', 'b') AS local \gset

-- The authenticated account wins over the address; IPv4 is the host;
-- IPv6 is its /64; an IPv4-mapped address is one IPv4 host, not the /64
-- (::/64) that would lump every mapped client together; no address is
-- mail injected on this host.
SELECT id - :auth_and_ip AS n, client_address, auth_account, sender_key
FROM pepsi.workqueue ORDER BY id;

-- Two addresses of one /64 share a key, another /64 does not.
SELECT (SELECT sender_key FROM pepsi.workqueue WHERE id = :ipv6_a)
     = (SELECT sender_key FROM pepsi.workqueue WHERE id = :ipv6_b) AS same_64_shares,
       (SELECT sender_key FROM pepsi.workqueue WHERE id = :ipv6_a)
     = (SELECT sender_key FROM pepsi.workqueue WHERE id = :ipv6_other) AS other_64_shares,
       (SELECT sender_key FROM pepsi.workqueue WHERE id = :ipv4_mapped)
     = (SELECT sender_key FROM pepsi.workqueue WHERE id = :ipv4_mapped_other) AS mapped_hosts_share;

-- The key follows the columns it is computed from.
UPDATE pepsi.workqueue SET auth_account = 'carol' WHERE id = :ipv4;
UPDATE pepsi.workqueue SET auth_account = NULL WHERE id = :auth_and_ip;
SELECT id - :auth_and_ip AS n, sender_key FROM pepsi.workqueue
WHERE id IN (:ipv4, :auth_and_ip) ORDER BY id;

-- It is generated, never written.
\set VERBOSITY terse
UPDATE pepsi.workqueue SET sender_key = 'auth:mallory' WHERE id = :local;
\set VERBOSITY default

-- ---------------------------------------------------------------------------
-- The CHECK constraints of pepsi.workqueue, against writes that bypass the
-- functions (a DBA's UPDATE).  Terse: their DETAIL prints the row.
-- ---------------------------------------------------------------------------

\set VERBOSITY terse
UPDATE pepsi.workqueue SET stage = '' WHERE id = :local;
UPDATE pepsi.workqueue SET state = '[]' WHERE id = :local;
UPDATE pepsi.workqueue SET state = '"text"' WHERE id = :local;
UPDATE pepsi.workqueue SET rcpt_to = '{}' WHERE id = :local;
UPDATE pepsi.workqueue SET rcpt_to = '{a@example.net,NULL}' WHERE id = :local;
-- paused exactly when there is a retry time
UPDATE pepsi.workqueue SET status = 'paused' WHERE id = :local;
UPDATE pepsi.workqueue SET timeout = now() WHERE id = :local;
UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 hour' WHERE id = :local;
UPDATE pepsi.workqueue SET status = 'failed' WHERE id = :local;
-- a row points at a body that exists
UPDATE pepsi.workqueue SET body_id = -1 WHERE id = :local;
-- a clone token names one row
UPDATE pepsi.workqueue SET clone_token = 'once' WHERE id = :ipv4;
UPDATE pepsi.workqueue SET clone_token = 'once' WHERE id = :local;
UPDATE pepsi.workqueue SET status = 'exploded' WHERE id = :local;
\set VERBOSITY default

-- Only the legal change went through: paused, with its retry time.
SELECT status, timeout IS NOT NULL AS has_timeout, clone_token
FROM pepsi.workqueue WHERE id = :local;

-- ---------------------------------------------------------------------------
-- Recipient subsets (used by pause, clones and splits)
-- ---------------------------------------------------------------------------

SELECT pepsi.recipients_subset('{a,b,c,d}', '{3,1}');
SELECT pepsi.recipients_subset('{a,b,c,d}', '{2}');

-- state.dsn.rcpt, parallel to rcpt_to, follows its recipients ...
SELECT pepsi.state_for_recipients(
    '{"dsn": {"ret": "HDRS", "rcpt": [{"notify": "a"}, {"notify": "b"}, {"notify": "c"}]}, "k": 1}',
    3, '{3,1}');
-- ... and is left alone when it is not parallel to rcpt_to or is missing.
SELECT pepsi.state_for_recipients('{"dsn": {"rcpt": [{"notify": "a"}]}}', 3, '{2}');
SELECT pepsi.state_for_recipients('{"dsn": {"rcpt": "garbled"}}', 1, '{1}');
SELECT pepsi.state_for_recipients('{"k": 1}', 3, '{2}');

-- ---------------------------------------------------------------------------
-- config_override: an overlay on pepsi.conf that never reaches [database]
-- nor [listener-*], with scopes global, domain:<d> and address:<a>.
-- ---------------------------------------------------------------------------

INSERT INTO pepsi.config_override (scope, section, option, value) VALUES
    ('global', 'pepsi', 'MAIL_LOG', 'yes'),
    ('domain:example.org', 'stage-deliver', 'MAX_LIFETIME', '5d'),
    ('address:postmaster@example.org', 'stage-filter', 'SPAM_SCORE', '7'),
    ('global', 'listener', 'BANNER', 'a section named just "listener" is not a listener');
SELECT scope, section, option, value, updated_by = current_user AS by_me
FROM pepsi.config_override ORDER BY scope, section;

\set VERBOSITY terse
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'database', 'CONNINFO', 'x');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'listener-smtp', 'PORT', '25');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'listener-', 'PORT', '25');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('domain:', 'pepsi', 'MAIL_LOG', 'no');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('address:', 'pepsi', 'MAIL_LOG', 'no');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('host:mx.example.org', 'pepsi', 'MAIL_LOG', 'no');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('Global', 'pepsi', 'MAIL_LOG', 'no');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'Pepsi', 'MAIL_LOG', 'no');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'pepsi', 'mail_log', 'no');
INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'pepsi', 'MAIL_LOG', 'twice');
-- renaming an allowed row into a refused section is refused too
UPDATE pepsi.config_override SET section = 'database' WHERE section = 'pepsi';
\set VERBOSITY default

-- A change wakes the daemons on pepsi_config_changed.  psql prints a
-- notification with the sending backend's PID, so it is captured and masked.
SELECT '/tmp/pepsi-regress-notify-' || pg_backend_pid() || '.out' AS notify_file \gset
\setenv PEPSI_NOTIFY_FILE :notify_file
LISTEN pepsi_config_changed;
\o :notify_file
UPDATE pepsi.config_override SET value = 'no' WHERE scope = 'global' AND section = 'pepsi';
DELETE FROM pepsi.config_override;
\o
\! sed -E 's/PID [0-9]+/PID N/' "$PEPSI_NOTIFY_FILE"
UNLISTEN pepsi_config_changed;
\! rm -f "$PEPSI_NOTIFY_FILE"

-- ---------------------------------------------------------------------------
-- pepsi.settings: per-address options written by account owners
-- ---------------------------------------------------------------------------

INSERT INTO pepsi.settings (address, option, value) VALUES ('bob@example.org', 'VACATION', 'on');
-- a domain's row, for its addresses that set none
INSERT INTO pepsi.settings (address, option, value) VALUES ('@example.org', 'VACATION', 'on');
\set VERBOSITY terse
INSERT INTO pepsi.settings (address, option, value) VALUES ('bob', 'VACATION', 'on');
INSERT INTO pepsi.settings (address, option, value) VALUES ('bob@ex@ample.org', 'VACATION', 'on');
INSERT INTO pepsi.settings (address, option, value) VALUES ('bob@example.org', 'vacation', 'on');
\set VERBOSITY default
DELETE FROM pepsi.settings;

-- ---------------------------------------------------------------------------
-- pepsi.event_log: append-only for every role, the owner included
-- ---------------------------------------------------------------------------

INSERT INTO pepsi.event_log (action, detail) VALUES ('resume', '{"ids": [1, 2]}');
INSERT INTO pepsi.event_log (action) VALUES ('config');
SELECT action, detail, principal = current_user AS by_me FROM pepsi.event_log ORDER BY id;
UPDATE pepsi.event_log SET action = 'nothing happened';
DELETE FROM pepsi.event_log;
TRUNCATE pepsi.event_log;
SELECT count(*) AS events_kept FROM pepsi.event_log;

-- ---------------------------------------------------------------------------
-- pepsi.dispatch_stats: exactly one row
-- ---------------------------------------------------------------------------

SELECT singleton, stages_run, messages FROM pepsi.dispatch_stats;
\set VERBOSITY terse
INSERT INTO pepsi.dispatch_stats DEFAULT VALUES;
INSERT INTO pepsi.dispatch_stats (singleton) VALUES (false);
\set VERBOSITY default

-- ---------------------------------------------------------------------------
-- Leave the queue empty: deleting the rows releases their bodies.
-- ---------------------------------------------------------------------------

SELECT count(*) AS bodies FROM pepsi.workqueue_body;
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
