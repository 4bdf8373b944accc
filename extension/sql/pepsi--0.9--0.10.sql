/*
 * pepsi 0.9 -> 0.10: the schema changes made since 0.9.
 *
 * 0.9 was released with auto-pay's claim by id, the keydisc index, the
 * secure-link portal, the archive's search index and batched import with
 * the digest command, and the secretary's batch hold; every schema change
 * since is a block here, placed before the final UPDATE of
 * pepsi.schema_version, and folded into pepsi--0.10.sql (new objects at
 * its end).  An existing 0.9 database reaches 0.10 with ALTER EXTENSION
 * pepsi UPDATE; CREATE EXTENSION pepsi installs pepsi--0.10.sql.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue.  The scheme
 * (blocks, grants as data, every statement safe on a live queue) is the
 * one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.10'" to load this file. \quit

-- ===========================================================================
-- S/MIME certificates learnt from signed mail (issue 41): peer_key.source
-- 'smime-signed', a correspondent's certificate that
-- pepsi-stage-autocrypt-learn took from a good S/MIME signature of theirs,
-- with the ciphers its SMIMECapabilities announced.  The CHECK is replaced
-- in one statement (its name as CREATE TABLE gave it, so both paths agree);
-- every existing row satisfies the wider one.
-- ===========================================================================
ALTER TABLE pepsi.peer_key DROP CONSTRAINT peer_key_source_check,
    ADD CONSTRAINT peer_key_source_check CHECK (source IN ('wkd-advanced', 'wkd-direct', 'openpgpkey', 'smimea',
                                                           'keyserver', 'autocrypt', 'import', 'smime-signed'));
-- end of S/MIME certificates learnt from signed mail

UPDATE pepsi.schema_version SET version = '0.10';
