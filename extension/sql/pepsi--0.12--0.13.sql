/*
 * pepsi 0.12 -> 0.13: the schema changes made since 0.12.
 *
 * 0.12 was released with the secretary's cheaper held row, the proof of
 * payment checked against an open challenge and the archive's excerpt in
 * C; every schema change since is a block here, placed before the final
 * UPDATE of pepsi.schema_version, and folded into pepsi--0.13.sql (new
 * objects at its end).  An existing 0.12 database reaches 0.13 with ALTER
 * EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi installs pepsi--0.13.sql.
 * Both paths must end in the same schema: t/003_extension_upgrade.pl
 * compares their catalogs and tests the upgrade with a filled queue.  The
 * scheme (blocks, grants as data, every statement safe on a live queue)
 * is the one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.13'" to load this file. \quit

-- ===========================================================================
-- The archive's search pages and counts at 100,000 messages (issue 40)
--
-- Once the excerpts were in C (0.12), SQL was still called once a row
-- of a search page: archive_search_key, checked on each row of a page
-- walked in date order (a common word's, a phrase's: some 900 rows for
-- a phrase in 10% of the messages), a SQL call, a search_path set and
-- tsvector_concat copying the message's 10 KB tsvector; and
-- archive_obfuscated, three regular expressions a row (the subject, the
-- sender, the excerpt) through a SQL function that set its search_path
-- at each call.  Both are in C now (extension/src/archive_search.c), with the
-- same results: the key the same tsvector (the index built on it stays
-- as it is), the obfuscation the same text in one pass, none at all for
-- a text without an '@'.  archive_obfuscated's COST 100 keeps it after a
-- page's sort and LIMIT, as the SQL function's default cost did.  The
-- count (archive_search_count) takes no parallel worker.
-- archive_search_pattern and archive_excerpt_window, the excerpt's
-- window before archive_excerpt (0.12), are called by nothing: they go.
-- ===========================================================================

CREATE OR REPLACE FUNCTION pepsi.archive_search_key(list bigint, search tsvector) RETURNS tsvector
    AS 'MODULE_PATHNAME', 'archive_search_key' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE COST 10000;

CREATE OR REPLACE FUNCTION pepsi.archive_obfuscated(obfuscation text, shown text) RETURNS text
    AS 'MODULE_PATHNAME', 'archive_obfuscated' LANGUAGE C IMMUTABLE PARALLEL SAFE COST 100;

-- archive_search_count takes no parallel worker: archive_search_key's
-- COST is charged for each row of the index's bitmap as if it were
-- checked, so a common word's or a phrase's count looked worth a worker,
-- where the bitmap's rows are counted in a few milliseconds and starting
-- the worker took longer (50,000 messages: w0's count 36 ms with a worker,
-- 6.5 ms without; "w0 w1" 31 ms, 2 ms).
ALTER FUNCTION pepsi.archive_search_count(bigint, text) SET max_parallel_workers_per_gather = 0;

DROP FUNCTION IF EXISTS pepsi.archive_search_pattern(text);
DROP FUNCTION IF EXISTS pepsi.archive_excerpt_window(text, text);
DELETE FROM pepsi.grant_owner WHERE name IN ('archive_search_pattern', 'archive_excerpt_window');
SELECT pepsi.grant_apply();
-- end of the archive's search pages and counts at 100,000 messages

UPDATE pepsi.schema_version SET version = '0.13';
