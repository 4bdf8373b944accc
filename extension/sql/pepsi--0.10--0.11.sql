/*
 * pepsi 0.10 -> 0.11: the schema changes made since 0.10.
 *
 * 0.10 was released with the S/MIME keys learnt from signed mail, the
 * archive's phrase search and batched import, and the secretary's
 * set-based batch; every schema change since is a block here, placed
 * before the final UPDATE of pepsi.schema_version, and folded into
 * pepsi--0.11.sql (new objects at its end).  An existing 0.10 database
 * reaches 0.11 with ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi
 * installs pepsi--0.11.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every
 * statement safe on a live queue) is the one pepsi--0.1--0.2.sql describes
 * and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.11'" to load this file. \quit

-- ===========================================================================
-- The archive's import at 100,000 messages: word pairs in C (issue 40)
--
-- archive_word_pairs (a message's word pairs, 'a b', for the phrase
-- search) was a SQL function: the tsvector unnested to a row a position,
-- lead() over them, the pairs aggregated; about 1.3 ms of CPU a message,
-- half of what parsing one cost, the largest part of an import after the
-- GIN index's own entries.  The same function in C
-- (extension/src/archive_search.c): one sort of the positions, one pass,
-- the same tsvector (array_to_tsvector makes it).  Same signature; a
-- message already archived keeps its tsvector (it is the same).
-- ===========================================================================
CREATE OR REPLACE FUNCTION pepsi.archive_word_pairs(words tsvector) RETURNS tsvector
    AS 'MODULE_PATHNAME', 'archive_word_pairs' LANGUAGE C IMMUTABLE PARALLEL SAFE;
-- end of the archive's import at 100,000 messages: word pairs in C

UPDATE pepsi.schema_version SET version = '0.11';
