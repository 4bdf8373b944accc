/*
 * pepsi 0.11 -> 0.12: the schema changes made since 0.11.
 *
 * 0.11 was released with the portal link's bounded opens, the archive's
 * word pairs in C and the grants' cheaper check; every schema change since
 * is a block here, placed before the final UPDATE of pepsi.schema_version,
 * and folded into pepsi--0.12.sql (new objects at its end).  An existing
 * 0.11 database reaches 0.12 with ALTER EXTENSION pepsi UPDATE; CREATE
 * EXTENSION pepsi installs pepsi--0.12.sql.  Both paths must end in the
 * same schema: t/003_extension_upgrade.pl compares their catalogs and
 * tests the upgrade with a filled queue.  The scheme (blocks, grants as
 * data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.12'" to load this file. \quit

-- ===========================================================================
-- The archive's search excerpts in C (issue 40)
--
-- A search result's excerpt was ts_headline over 600 characters of the
-- text a regular expression had found (archive_excerpt_window): about
-- 0.15 ms of CPU a row, so a page of 100 results cost some 30 ms whatever
-- the search, and a rare word's page, at 100,000 messages, stayed near 4x
-- grep -c over the mbox.  archive_excerpt (extension/src/archive_search.c)
-- is one pass over the text's first 20,000 bytes (only they are read back
-- from TOAST): its words found, the query's among them marked « », cut at
-- word boundaries, up to two fragments as ts_headline's MaxFragments=2
-- gave.  archive_search keeps its signature and its rows.
-- ===========================================================================

-- What a search result shows of a message's text: up to two fragments of
-- some 35 words around the query's words (the first found, then the first
-- past the first fragment), joined by " ... ", the query's words between
-- « and », white space one space; the text's start when none of the
-- query's words is in its first 20,000 bytes.  Not escaped: the page
-- escapes it for HTML.  COST 100 (ts_headline's): a query's sort and
-- LIMIT come before it, so only the rows shown get one (at cost 1 a
-- phrase's page made one for every match, then kept 100).
CREATE FUNCTION pepsi.archive_excerpt(body text, query tsquery) RETURNS text
    AS 'MODULE_PATHNAME', 'archive_excerpt' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE COST 100;

-- Full-text search of a list's archive (websearch syntax: words, "a
-- phrase", -not, or), newest first.  The list and the words are one
-- condition on the GIN index archive_message_list_search (see
-- archive_search_key; a phrase is looked up by its word pairs, see
-- archive_search_query); EXECUTE plans each query with its words, so the
-- planner weighs them with the index's statistics and chooses alone: a
-- common word's newest matches come in date order from
-- archive_message_list_sent, checked one by one (a few hundred rows for a
-- page), a rare word's or a phrase's from the index's bitmap, sorted.  The
-- excerpt is archive_excerpt's, made for the page's rows only (after the
-- LIMIT); the query's words are parsed once, not once a row, and the
-- list's obfuscation is looked up once, not three times a row.
CREATE OR REPLACE FUNCTION pepsi.archive_search(list bigint, query text, max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, thread_id bigint, subject text, from_name text, sent_at timestamptz, excerpt text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT m.id, m.thread_id, pepsi.archive_obfuscated($5, m.subject),
                pepsi.archive_obfuscated($5, coalesce(m.from_name, m.from_address)), m.sent_at,
                pepsi.archive_obfuscated($5, pepsi.archive_excerpt(m.body_text, $4))
         FROM pepsi.archive_message m
         WHERE m.list_id = $1 AND pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)
         ORDER BY m.sent_at DESC, m.id DESC LIMIT $3'
        USING list, query, least(greatest(max_rows, 1), 1000), websearch_to_tsquery('simple', query),
              (pepsi.archive_policy_of(list)).obfuscation;
END
$$;

INSERT INTO pepsi.grant_owner (name) VALUES ('archive_excerpt');
SELECT pepsi.grant_apply();
-- end of the archive's search excerpts in C

UPDATE pepsi.schema_version SET version = '0.12';
