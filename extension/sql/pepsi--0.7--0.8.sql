/*
 * pepsi 0.7 -> 0.8: the schema changes made since 0.7.
 *
 * 0.7 was released with dispatcher stage sets, the confirm-to-send
 * secretary, the key store, quotas, mailing lists and the pepsi_whitelist
 * role; every schema change since is a block here, placed before the
 * final UPDATE of pepsi.schema_version, and folded into pepsi--0.8.sql
 * (new objects at its end).  An existing 0.7 database reaches 0.8 with
 * ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi installs
 * pepsi--0.8.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every
 * statement safe on a live queue) is the one pepsi--0.1--0.2.sql describes
 * and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.8'" to load this file. \quit

UPDATE pepsi.schema_version SET version = '0.8';
