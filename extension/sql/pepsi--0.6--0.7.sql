/*
 * pepsi 0.6 -> 0.7: the schema changes made since 0.6.
 *
 * 0.6 was released with TLS reports and pruning, owner settings and the
 * dispatcher's own role; every schema change since is a block here, placed
 * before the final UPDATE of pepsi.schema_version, and folded into
 * pepsi--0.7.sql (new objects at its end).  An existing 0.6 database
 * reaches 0.7 with ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi
 * installs pepsi--0.7.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every
 * statement safe on a live queue) is the one pepsi--0.1--0.2.sql describes
 * and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.7'" to load this file. \quit

-- ============================================================================
-- Dispatcher stage sets: a dispatcher that serves only the stages of its
-- [dispatch] STAGES resets only those stages' orphaned rows at start; the
-- rows another dispatcher's workers hold at other stages are not orphans.
-- The one-argument form stays for the dispatcher that serves every stage.
-- The grant rule on workqueue_reset_orphans (pepsi_dispatch) covers both.
CREATE FUNCTION pepsi.workqueue_reset_orphans(except_ids bigint[], stages text[])
RETURNS integer AS 'MODULE_PATHNAME', 'workqueue_reset_orphans' LANGUAGE C CALLED ON NULL INPUT;
SELECT pepsi.grant_apply();
-- end of dispatcher stage sets

UPDATE pepsi.schema_version SET version = '0.7';
