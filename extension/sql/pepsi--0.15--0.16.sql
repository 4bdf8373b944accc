/*
 * pepsi 0.15 -> 0.16: the schema changes made since 0.15.
 *
 * 0.15 was released with a new destination's TLS result written by one
 * worker; every schema change since is a block here, placed before the
 * final UPDATE of pepsi.schema_version, and folded into pepsi--0.16.sql
 * (new objects at its end).  An existing 0.15 database reaches 0.16 with
 * ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi installs
 * pepsi--0.16.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every statement
 * safe on a live queue) is the one pepsi--0.1--0.2.sql describes and
 * docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.16'" to load this file. \quit

UPDATE pepsi.schema_version SET version = '0.16';
