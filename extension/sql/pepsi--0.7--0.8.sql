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

-- Key discovery: pepsi-stage-encrypt parks a message waiting for a
-- recipient's key (KEYDISC) with state.encrypt.waiting_for = the address
-- and a key_request row; pepsi-keydisc asks WKD, DANE and the key servers,
-- stores what it finds in peer_key and calls keydisc_release, which
-- settles the request (found: the row goes; a miss: negative_until, the
-- negative cache that keeps the next message from parking) and resumes
-- the parked rows (workqueue_resume: NOTIFY).  It runs as the owner: the
-- crypto role writes no queue row itself.  Returns the rows resumed.
CREATE FUNCTION pepsi.keydisc_release(address text, found boolean, negative_seconds integer DEFAULT 86400,
                                      methods_replied text[] DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    a text := lower(keydisc_release.address);
    ids bigint[];
BEGIN
    IF found THEN
        DELETE FROM pepsi.key_request r WHERE r.address = a;
    ELSE
        UPDATE pepsi.key_request r SET settled_at = now(),
               methods_replied = coalesce(keydisc_release.methods_replied, '{}'),
               negative_until = now() + make_interval(secs => greatest(negative_seconds, 1))
         WHERE r.address = a;
    END IF;
    SELECT array_agg(w.id) INTO ids FROM pepsi.workqueue w
     WHERE w.status = 'paused' AND w.state -> 'encrypt' ->> 'waiting_for' = a;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    RETURN pepsi.workqueue_resume(ids);
END
$$;
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_crypto', 'function', 'keydisc_release', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('keydisc_release');
SELECT pepsi.grant_apply();
-- end of S/MIME and key discovery

UPDATE pepsi.schema_version SET version = '0.8';
