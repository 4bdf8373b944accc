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

-- pepsi-httpd's page of the queue shows it: a new result column, so the
-- function is made anew (and granted again).
DROP FUNCTION pepsi.queue_list(text, pepsi.status, text, integer, bigint);
-- Newest first; before_id pages on; search matches the sender or a
-- recipient (case-insensitive substring).
CREATE FUNCTION pepsi.queue_list(stage text DEFAULT NULL, status pepsi.status DEFAULT NULL,
                                 search text DEFAULT NULL, max_rows integer DEFAULT 100,
                                 before_id bigint DEFAULT NULL)
RETURNS TABLE (id bigint, queue_id text, stage text, status pepsi.status, held boolean,
               received_at timestamptz, age_seconds double precision, retry_at timestamptz,
               mail_from text, rcpt_to text[], size bigint, last_error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT w.id, coalesce(w.state ->> 'queue_id', w.id::text), w.stage, w.status,
           w.status = 'paused' AND w.timeout = 'infinity', w.received_at,
           extract(epoch FROM now() - w.received_at)::double precision,
           CASE WHEN w.timeout < 'infinity' THEN w.timeout END,
           w.mail_from, w.rcpt_to, length(w.headers) + 2 + length(b.body),
           coalesce(w.state ->> 'last_error', w.state ->> 'dispatch_error')
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE (queue_list.stage IS NULL OR w.stage = queue_list.stage)
      AND (queue_list.status IS NULL OR w.status = queue_list.status)
      AND (queue_list.before_id IS NULL OR w.id < queue_list.before_id)
      AND (queue_list.search IS NULL
           OR strpos(lower(w.mail_from), lower(queue_list.search)) > 0
           OR EXISTS (SELECT FROM unnest(w.rcpt_to) r WHERE strpos(lower(r), lower(queue_list.search)) > 0))
    ORDER BY w.id DESC
    LIMIT least(greatest(coalesce(max_rows, 100), 1), 1000)
$$;

SELECT pepsi.grant_apply();
-- end of one queue id

UPDATE pepsi.schema_version SET version = '0.4';
