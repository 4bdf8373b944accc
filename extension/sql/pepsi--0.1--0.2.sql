/*
 * pepsi 0.1 -> 0.2: the schema changes made since 0.1 was released.
 *
 * CREATE EXTENSION pepsi installs pepsi--0.1.sql and then this script
 * (there is no pepsi--0.2.sql, so PostgreSQL chains them); an existing
 * 0.1 database reaches 0.2 with ALTER EXTENSION pepsi UPDATE.  Both paths
 * must end in the same schema, and t/ tests the upgrade with a filled queue
 * (see docs/upgrading.md for the scheme).
 *
 * pepsi--0.1.sql is released: it is never edited.  Each feature that
 * changes the schema appends its own block to the end of this file,
 * delimited by a header comment naming the feature and a closing
 * "-- end of <feature>" line, so changes from different branches merge
 * without touching each other.  Every statement must work on a database
 * whose queue holds rows (no NOT NULL column without a default, no
 * rewrite that drops data), since this runs on live installations.
 *
 * Grants: an object a block adds is no role's until pepsi.grant_policy()
 * names it (and pepsi.grant_definer_functions() or grant_owner_only() where
 * they apply).  A block that adds objects redefines those functions with
 * CREATE OR REPLACE, starting from their latest definition in this file
 * (an earlier block's, else 0.1's), and ends with SELECT pepsi.grant_apply().
 * The upgrade test checks that pepsi.grant_verify() finds no drift, so a
 * block that drops another's rows from the policy fails it.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.2'" to load this file. \quit
