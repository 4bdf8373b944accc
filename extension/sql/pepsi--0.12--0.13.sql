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

UPDATE pepsi.schema_version SET version = '0.13';
