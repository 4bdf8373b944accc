--
-- The virtual mailboxes of the local-recipient resolver (common/local/local.c,
-- LOCAL_RECIPIENTS = virtual): pepsi.virtual_mailbox_add and _remove, their
-- refusals, the canonical form they store, and the audit row each writes.
--
\set SHOW_CONTEXT never

SELECT coalesce(max(id), 0) AS events_before FROM pepsi.event_log \gset

-- Added once, in lower case; the second add says it was there.
SELECT pepsi.virtual_mailbox_add('Alice@Example.ORG', 'the first mailbox');
SELECT pepsi.virtual_mailbox_add(' alice@example.org ');
SELECT address, note, created_by = current_user AS by_me FROM pepsi.virtual_mailbox ORDER BY address;

-- Refused: no domain, a control character, a path, a leading dot, NULL.
SELECT pepsi.virtual_mailbox_add('alice');
SELECT pepsi.virtual_mailbox_add(E'bob@example.org\r\nRCPT TO:<x@y>');
SELECT pepsi.virtual_mailbox_add('../etc@example.org');
SELECT pepsi.virtual_mailbox_add('.hidden@example.org');
SELECT pepsi.virtual_mailbox_add(NULL);
SELECT pepsi.virtual_mailbox_add('carol@example.org', E'two\nlines');
-- The table refuses the same forms when written directly (by its owner).
\set VERBOSITY terse
INSERT INTO pepsi.virtual_mailbox (address) VALUES ('Upper@example.org');
INSERT INTO pepsi.virtual_mailbox (address) VALUES (E'tab\t@example.org');
\set VERBOSITY default

SELECT pepsi.virtual_mailbox_remove('ALICE@example.org');
SELECT pepsi.virtual_mailbox_remove('alice@example.org');
SELECT count(*) FROM pepsi.virtual_mailbox;

-- Each call is audited, refusals excepted (they changed nothing).
SELECT principal = current_user AS by_me, action, detail
FROM pepsi.event_log WHERE id > :events_before ORDER BY id;

-- Who may do what: ingress and the pipeline read, only pepsi_config changes.
SELECT r.rolname,
       has_table_privilege(r.rolname, 'pepsi.virtual_mailbox', 'SELECT') AS reads,
       has_table_privilege(r.rolname, 'pepsi.virtual_mailbox', 'INSERT,UPDATE,DELETE') AS writes,
       has_function_privilege(r.rolname, 'pepsi.virtual_mailbox_add(text, text)', 'EXECUTE') AS adds
FROM pg_roles r WHERE r.rolname LIKE 'pepsi\_%' ORDER BY r.rolname;
