/*
 * pepsi 0.13 -> 0.14: the schema changes made since 0.13.
 *
 * 0.13 was released with an unguessable order reference for each
 * challenge and the archive's search key in C; every schema change since
 * is a block here, placed before the final UPDATE of pepsi.schema_version,
 * and folded into pepsi--0.14.sql (new objects at its end).  An existing
 * 0.13 database reaches 0.14 with ALTER EXTENSION pepsi UPDATE; CREATE
 * EXTENSION pepsi installs pepsi--0.14.sql.  Both paths must end in the
 * same schema: t/003_extension_upgrade.pl compares their catalogs and
 * tests the upgrade with a filled queue.  The scheme (blocks, grants as
 * data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.14'" to load this file. \quit

-- ===========================================================================
-- The archive's import at 100,000 messages, again (issue 40)
--
-- archive_store_message's lookups of a message by its Message-Id (is it
-- archived already, which of the ones it names is its parent) were planned
-- for each message with the list's id as a constant (plpgsql's custom
-- plans), from the statistics of the table: for a list that had few
-- messages when they were made (a new list, or any list during its first
-- import, whose rows no ANALYZE sees until it commits) the planner took
-- archive_message_list_sent for a list of a row or two and read every
-- message of the list, once a message: an import's time grew with the
-- square of its size (4,400 rows read a message on average over a
-- 50,000-message import).  Its plans are now generic (plan_cache_mode),
-- made once a session from the query's shape: the unique index on
-- (list_id, message_id), whatever the statistics; and no plan is made
-- again for each message.  The parser's helpers called for every message
-- (a header field ten times, its parameters, its Message-Ids, the
-- references kept) were SQL functions, whose plans PostgreSQL 15 makes
-- again at every call; in plpgsql their plans are kept for the session.
-- Same results.
-- ===========================================================================
CREATE OR REPLACE FUNCTION pepsi.archive_bytes_text(raw bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN convert_from(raw, 'LATIN1');
END
$$;

CREATE OR REPLACE FUNCTION pepsi.archive_header(headers text, name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN btrim((regexp_match(regexp_replace(E'\n' || headers, E'\r?\n[ \t]+', ' ', 'g'),
                               E'\n' || name || E':[ \t]*([^\r\n]*)', 'i'))[1]);
END
$$;

CREATE OR REPLACE FUNCTION pepsi.archive_header_parameter(value text, name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN coalesce((regexp_match(value, ';\s*' || name || '\s*=\s*"([^"]*)"', 'i'))[1],
                    (regexp_match(value, ';\s*' || name || '\s*=\s*([^;\s]+)', 'i'))[1]);
END
$$;

CREATE OR REPLACE FUNCTION pepsi.archive_message_ids(value text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(m[1] ORDER BY n), '{}')
            FROM regexp_matches(coalesce(value, ''), '<([^<>\s]+)>', 'g') WITH ORDINALITY AS x(m, n));
END
$$;

CREATE OR REPLACE FUNCTION pepsi.archive_keep_parts(message bigint, list bigint, named text, refs text[],
                                                    attachments pepsi.archive_attachment[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    INSERT INTO pepsi.archive_reference (message_id, position, list_id, referenced)
    SELECT message, x.n, list, x.r FROM unnest(refs) WITH ORDINALITY AS x(r, n) WHERE x.r <> named;
    IF cardinality(attachments) > 0 THEN
        INSERT INTO pepsi.archive_attachment (message_id, position, filename, content_type, size, content, withheld)
        SELECT message, a.position, a.filename, a.content_type, a.size, a.content, a.withheld FROM unnest(attachments) AS a;
    END IF;
END
$$;

ALTER FUNCTION pepsi.archive_store_message(bigint, bytea, text) SET plan_cache_mode = force_generic_plan;
-- end of the archive's import at 100,000 messages, again

-- ===========================================================================
-- The archive's count never a sequential scan (issue 40)
--
-- archive_search_count plans with enable_seqscan = off.  For a query the
-- statistics say nearly every message of the list matches (a common
-- word, words or'ed, a word excluded) the planner charged the GIN index's
-- bitmap archive_search_key's COST for every row, as it charges the
-- sequential scan, and took the scan for its cheaper pages; but the
-- bitmap's rows are counted without being checked, and the scan reads
-- back and checks every message's tsvector: a common word's count took
-- 39 s at 50,000 messages.  A count has no plan better than the bitmap.
-- ===========================================================================
ALTER FUNCTION pepsi.archive_search_count(bigint, text) SET enable_seqscan = off;
-- end of the archive's count never a sequential scan

-- ===========================================================================
-- Two imports into one list at once (issue 40)
--
-- archive_import_finish recounts the list's months (archive_month_recount:
-- its rows deleted, counted again): two imports into one list that ended
-- together each inserted the same months, and the second failed on
-- archive_month's key, all its messages rolled back (2 of 10 imports of
-- 5,000 messages run at once).  The recounts of one list now take turns
-- (a transaction's advisory lock on the list: the second, once the first
-- has committed, counts its messages too), and a month a post counted
-- meanwhile is counted again, not inserted twice.
-- ===========================================================================
CREATE OR REPLACE FUNCTION pepsi.archive_month_recount(list bigint) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pg_advisory_xact_lock(hashtextextended('pepsi.archive_month_recount/' || list::text, 0));
    DELETE FROM pepsi.archive_month x WHERE x.list_id = list;
    INSERT INTO pepsi.archive_month AS x (list_id, month, messages)
    SELECT list, date_trunc('month', m.sent_at AT TIME ZONE 'UTC')::date, count(*)
    FROM pepsi.archive_message m WHERE m.list_id = list GROUP BY 2
    ON CONFLICT ON CONSTRAINT archive_month_pkey DO UPDATE SET messages = excluded.messages;
$$;
-- end of two imports into one list at once

-- ===========================================================================
-- A list's VERP fan-out grouped by destination domain (issue 40)
--
-- pepsi.list_fanout gave a VERP post's groups (one row per subscriber) in
-- address order, which spreads a domain's subscribers over the whole
-- fan-out: consecutive rows went to different domains, so a relay
-- worker's batch of them needed a session and a destination slot each.
-- By domain, then address: a domain's rows come together.
-- ===========================================================================
-- The split groups (pepsi.workqueue_split) of a post to list, for stage:
-- with VERP one per subscriber, sent from list-bounces+user=domain@ with
-- its own List-Unsubscribe (RFC 8058 one-click when the list has an
-- unsubscribe_url); without, one per destination domain from
-- list-bounces@.  Only subscribers who take each message.  The VERP
-- groups keep a domain's subscribers together (by domain, then address),
-- so that the rows made of them, claimed in that order, reach a relay
-- worker's batch together: one session, one kept destination slot.
CREATE OR REPLACE FUNCTION pepsi.list_fanout(list bigint, stage text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    local text;
    domain text;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.id = list;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    local := split_part(l.address, '@', 1);
    domain := split_part(l.address, '@', 2);
    IF l.verp THEN
        RETURN coalesce((SELECT jsonb_agg(jsonb_build_object(
                'rcpt_to', jsonb_build_array(m.address), 'stage', stage,
                'mail_from', local || '-bounces+' || replace(m.address, '@', '=') || '@' || domain,
                'prepend_headers', CASE WHEN l.unsubscribe_url IS NOT NULL THEN
                    'List-Unsubscribe: <' || l.unsubscribe_url || '?l=' || l.id || '&a='
                    || replace(replace(m.address, '%', '%25'), '+', '%2B') || '&t='
                    || left(encode(sha256(l.secret || convert_to(m.address, 'UTF8')), 'hex'), 32)
                    || '>, <mailto:' || local || '-unsubscribe@' || domain || '>' || E'\r\n'
                    || E'List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n'
                  ELSE 'List-Unsubscribe: <mailto:' || local || '-unsubscribe@' || domain || E'>\r\n' END)
                ORDER BY split_part(m.address, '@', 2), m.address)
            FROM pepsi.list_member m
            WHERE m.list_id = list AND m.delivery = 'each' AND m.disabled IS NULL), '[]');
    END IF;
    RETURN coalesce((SELECT jsonb_agg(jsonb_build_object(
            'rcpt_to', g.rcpt, 'stage', stage, 'mail_from', local || '-bounces@' || domain,
            'prepend_headers', 'List-Unsubscribe: <mailto:' || local || '-unsubscribe@' || domain || E'>\r\n')
            ORDER BY g.dom)
        FROM (SELECT split_part(m.address, '@', 2) AS dom, jsonb_agg(m.address ORDER BY m.address) AS rcpt
              FROM pepsi.list_member m
              WHERE m.list_id = list AND m.delivery = 'each' AND m.disabled IS NULL
              GROUP BY 1) g), '[]');
END
$$;
-- end of a list's VERP fan-out grouped by destination domain

-- ===========================================================================
-- destination_begin: the TLS result recorded, and whether each message
-- must ask (issue 40)
--
-- A relay worker wrote a delivery's TLS result (tls_policy, tls_outcome)
-- with destination_end, a round trip of its own, unless it had written
-- the same for the domain itself: with many workers and many domains,
-- most deliveries of a list's fan-out were a worker's first to their
-- domain, and each paid a destination_end (and waited on the others'
-- writes of the same row).  destination_begin, which reads the row
-- anyway, now gives what is recorded; a worker that got the same keeps
-- its slot as after any healthy delivery.  And per_message: whether each
-- message must ask for its turn (a rate limit, or a slow destination's
-- share of the workers); when not, a worker delivers the rest of its
-- batch's messages to the domain under the slot it holds.  New OUT
-- columns change the function's type: dropped and made again, its
-- grants applied again.
-- ===========================================================================
DROP FUNCTION IF EXISTS pepsi.destination_begin(text, integer, text[], text, integer, text, inet,
    double precision, double precision, integer, double precision, text);
-- (As in pepsi--0.14.sql.)
CREATE FUNCTION pepsi.destination_begin(domain text, default_concurrency integer,
    hosts text[] DEFAULT NULL, previous_domain text DEFAULT NULL, previous_slot integer DEFAULT NULL,
    previous_host text DEFAULT NULL, previous_address inet DEFAULT NULL,
    previous_seconds double precision DEFAULT NULL,
    slow_seconds double precision DEFAULT NULL, slow_limit integer DEFAULT NULL,
    handoff_seconds double precision DEFAULT NULL, stage text DEFAULT NULL,
    OUT slot integer, OUT wait_seconds double precision, OUT reason text,
    OUT contended boolean, OUT addresses jsonb, OUT sts_policy_id text, OUT sts_policy text,
    OUT tls_policy text, OUT tls_outcome text, OUT per_message boolean)
AS 'MODULE_PATHNAME', 'destination_begin' LANGUAGE C;

SELECT pepsi.grant_apply();
-- end of destination_begin: the TLS result recorded, and whether each message must ask

UPDATE pepsi.schema_version SET version = '0.14';
