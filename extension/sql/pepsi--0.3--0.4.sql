/*
 * pepsi 0.3 -> 0.4: the schema changes made since 0.3.
 *
 * An existing 0.3 database reaches 0.4 with ALTER EXTENSION pepsi UPDATE;
 * CREATE EXTENSION pepsi installs pepsi--0.4.sql, the whole of 0.4.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue.  The scheme
 * (blocks, grants as data, every statement safe on a live queue) is the
 * one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.4'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- One queue id (common/queue_id.h): the message's name from ingress on,
-- carried by every row split from it in state.queue_id, and the column of
-- pepsi.mail_log that finds a message's events across its rows.
-- ---------------------------------------------------------------------------
ALTER TABLE pepsi.mail_log ADD COLUMN queue_id text;
COMMENT ON COLUMN pepsi.mail_log.queue_id IS
    'The message''s queue id (state.queue_id of its rows); workqueue_id is the row';
CREATE INDEX mail_log_queue_id ON pepsi.mail_log (queue_id);
-- end of one queue id

UPDATE pepsi.schema_version SET version = '0.4';
