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

UPDATE pepsi.schema_version SET version = '0.12';
