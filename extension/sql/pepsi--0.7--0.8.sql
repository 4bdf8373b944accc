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

-- ====================================================================
-- S/MIME and key discovery (issue 41 items 2-3)
--
-- peer_key.smime_capabilities: the content-encryption algorithms an S/MIME
-- correspondent announced (its signed mail's SMIMECapabilities, or the
-- operator's word), e.g. {aes-256-gcm,aes-256-cbc}: pepsi-stage-encrypt
-- uses AES-256-GCM only when every recipient of the message lists it, and
-- AES-256-CBC otherwise (NULL: not known).
ALTER TABLE pepsi.peer_key ADD COLUMN smime_capabilities text[];
-- end of S/MIME and key discovery

UPDATE pepsi.schema_version SET version = '0.8';
