/*
 * pepsi 0.8 -> 0.9: the schema changes made since 0.8.
 *
 * 0.8 was released with auto-pay, the lists' archive and digests, S/MIME
 * and key discovery, and the telemetry tables; every schema change since
 * is a block here, placed before the final UPDATE of pepsi.schema_version,
 * and folded into pepsi--0.9.sql (new objects at its end).  An existing
 * 0.8 database reaches 0.9 with ALTER EXTENSION pepsi UPDATE; CREATE
 * EXTENSION pepsi installs pepsi--0.9.sql.  Both paths must end in the
 * same schema: t/003_extension_upgrade.pl compares their catalogs and
 * tests the upgrade with a filled queue.  The scheme (blocks, grants as
 * data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.9'" to load this file. \quit

-- ===========================================================================
-- The archive's search and import at scale (issue 40)
--
-- Search: the archive's GIN index is on archive_search_key(list_id,
-- search), the message's tsvector and one lexeme naming its list
-- ('#list' and the id: no parser makes a word of '#'), so that a list's
-- search is one condition on the index and a count is answered by the
-- index's bitmap without reading the rows (only a page not all-visible,
-- or a phrase's word positions, send it to the table).  The index on
-- search alone goes.  archive_search and archive_search_count plan each
-- query with its words (EXECUTE), and the count never scans the whole
-- table: that reads every message's tsvector, seconds for a common word
-- at 100,000 messages.
-- Import: archive_store_batch archives many messages in one call, so
-- pepsi-archive import makes one round trip a batch, not one a message.
-- ===========================================================================

DROP INDEX pepsi.archive_message_search;
-- The raw copy, the text and the tsvector out of line as soon as a row
-- passes 128 bytes: a row is then its few short fields, about 35 to a
-- page, and the count of a common word visits some 3,000 pages for
-- 100,000 messages where it visited 16,000.  Rows archived before keep
-- their layout until they are written again (pepsi-archive reindex).
ALTER TABLE pepsi.archive_message SET (toast_tuple_target = 128);

-- The key the archive's GIN index is on: a message's tsvector and its
-- list's lexeme.
CREATE FUNCTION pepsi.archive_search_key(list bigint, search tsvector) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT search OPERATOR(pg_catalog.||) pg_catalog.array_to_tsvector(ARRAY['#list' OPERATOR(pg_catalog.||) list::text])
$$;

-- A reader's query (websearch syntax) within list, for archive_search_key;
-- a query with no words matches nothing, as before.
CREATE FUNCTION pepsi.archive_search_query(list bigint, query text) RETURNS tsquery
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_catalog.numnode(q) = 0 THEN q
                ELSE q OPERATOR(pg_catalog.&&) ('#list' OPERATOR(pg_catalog.||) list::text)::tsquery END
    FROM pg_catalog.websearch_to_tsquery('simple', query) AS q
$$;

CREATE INDEX archive_message_list_search ON pepsi.archive_message
    USING gin (pepsi.archive_search_key(list_id, search));

-- pepsi-archive import's call: messages (each as archive_store takes it)
-- archived in order in one call; how many were new (the others the list
-- had already).  A NULL message is refused, and the whole batch with it.
CREATE FUNCTION pepsi.archive_store_batch(list bigint, messages bytea[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    message bytea;
    stored integer := 0;
BEGIN
    IF array_position(messages, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'message % of the batch is NULL', array_position(messages, NULL)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOREACH message IN ARRAY coalesce(messages, '{}') LOOP
        IF pepsi.archive_store(list, message, 'import') IS NOT NULL THEN
            stored := stored + 1;
        END IF;
    END LOOP;
    RETURN stored;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'archive_store_batch', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('archive_store_batch');
INSERT INTO pepsi.grant_owner (name) VALUES ('archive_search_key'), ('archive_search_query');

-- Full-text search of a list's archive (websearch syntax: words, "a
-- phrase", -not, or), newest first.  The list and the words are one
-- condition on the GIN index archive_message_list_search (see
-- archive_search_key); EXECUTE plans each query with its words; the list
-- named again lets a common word's newest matches come in date order from
-- archive_message_list_sent, checked one by one, not all sorted.
CREATE OR REPLACE FUNCTION pepsi.archive_search(list bigint, query text, max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, thread_id bigint, subject text, from_name text, sent_at timestamptz, excerpt text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT m.id, m.thread_id, pepsi.archive_obfuscate($1, m.subject),
                pepsi.archive_obfuscate($1, coalesce(m.from_name, m.from_address)), m.sent_at,
                pepsi.archive_obfuscate($1, ts_headline(''simple'', left(m.body_text, 20000),
                    websearch_to_tsquery(''simple'', $2), ''StartSel=«, StopSel=», MaxFragments=2''))
         FROM pepsi.archive_message m
         WHERE m.list_id = $1 AND pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)
         ORDER BY m.sent_at DESC, m.id DESC LIMIT $3'
        USING list, query, least(greatest(max_rows, 1), 1000);
END
$$;

-- How many messages of a list's archive match query: counted from the
-- GIN index's bitmap, never reading a row the index answers for (a heap
-- page is read only when not all-visible, or to check a phrase's word
-- positions); never a sequential scan, which reads every message's
-- tsvector (seconds at 100,000 messages for a common word).
CREATE OR REPLACE FUNCTION pepsi.archive_search_count(list bigint, query text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp
    SET enable_seqscan = off SET jit = off AS $$
DECLARE
    found bigint;
BEGIN
    EXECUTE 'SELECT count(*) FROM pepsi.archive_message m
             WHERE pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)'
        INTO found USING list, query;
    RETURN found;
END
$$;

SELECT pepsi.grant_apply();
-- end of the archive's search and import at scale

-- ===========================================================================
-- pepsi-list digest: a list's digest sent now (issue 40)
--
-- list_digest_now(list, stage) is what the schedule's row does when it is
-- due (list_digest_send: the digest built, queued at stage for the digest
-- members, the posts taken, in one transaction), for pepsi-list as
-- pepsi_config, and audited (event_log list_digest).  It refuses, naming
-- the reason, a list that does not exist, one with no digest member (no
-- enabled member whose delivery is digest) and one with no post waiting,
-- so nothing is queued for nobody and no empty issue is counted.
-- ===========================================================================
CREATE FUNCTION pepsi.list_digest_now(list text, stage text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    sent jsonb;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = lower(list_digest_now.list);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list_digest_now.list USING ERRCODE = 'no_data_found',
            HINT = 'pepsi-list lists shows the lists.';
    END IF;
    IF NOT EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = l.id AND m.delivery = 'digest'
                   AND m.disabled IS NULL) THEN
        RAISE EXCEPTION 'list % has no digest member: no digest to send', l.address USING ERRCODE = 'no_data_found',
            HINT = 'A member gets digests after pepsi-list add LIST ADDRESS digest.';
    END IF;
    IF NOT EXISTS (SELECT FROM pepsi.list_digest x WHERE x.list_id = l.id) THEN
        RAISE EXCEPTION 'list % has no post waiting for a digest: none sent', l.address USING ERRCODE = 'no_data_found';
    END IF;
    sent := pepsi.list_digest_send(l.id, stage);
    PERFORM pepsi.event_log_write('list_digest', jsonb_build_object('list', l.address, 'stage', stage) || sent);
    RETURN sent;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'list_digest_now', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_digest_now');
SELECT pepsi.grant_apply();
-- end of pepsi-list digest

-- ===========================================================================
-- The list stage's fan-out in one call (issue 40)
--
-- Before its commit, the list stage made three calls for an accepted
-- post: its copy for the next digest (list_digest_add), the archive's
-- copy (archive_post) and the subscribers' groups (list_fanout).
-- list_fanout_post is the three in one round trip, each as it was (the
-- copies keyed by the row, so a fan-out that runs again adds nothing
-- twice); the commit (workqueue_finish_with_clones) stays the one call
-- that makes the subscribers' rows and ends the post's.
-- ===========================================================================
CREATE FUNCTION pepsi.list_fanout_post(list bigint, row_id bigint, stage text, subject text, author text,
                                       sent_date text, message_id text, content_type text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    kept boolean;
    archived bigint;
BEGIN
    kept := pepsi.list_digest_add(list, row_id, subject, author, sent_date, message_id, content_type);
    archived := pepsi.archive_post(list, row_id);
    RETURN jsonb_build_object('kept', kept, 'archived', archived, 'groups', pepsi.list_fanout(list, stage));
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'list_fanout_post', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_fanout_post');
SELECT pepsi.grant_apply();
-- end of the list stage's fan-out in one call

UPDATE pepsi.schema_version SET version = '0.9';
