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
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.2'" to load this file. \quit
