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

-- ===========================================================================
-- The key store: end-to-end encryption's keys
--
-- (The tables and grants as pepsi--0.7.sql's block of that name says.)
-- Column-level grants come to the grants machinery with it:
-- pepsi.grant_column names a role's privilege on every column of a table
-- but those withheld, grant_apply() grants it and grant_verify() checks it
-- column by column.
-- ===========================================================================

-- A column-level grant: role gets privilege on every column of table
-- object_name but the withheld ones (crypto_identity's SELECT without
-- private_wrapped), instead of a table-level grant.  A column added to the
-- table later is granted with the rest; only what is named is withheld.
CREATE TABLE pepsi.grant_column (
    role        name NOT NULL REFERENCES pepsi.grant_role (name),
    object_name text NOT NULL,
    privilege   text NOT NULL CHECK (privilege IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')),
    withheld    name[] NOT NULL CHECK (cardinality(withheld) > 0),
    PRIMARY KEY (role, object_name, privilege)
);
INSERT INTO pepsi.grant_owner (name) VALUES ('grant_column');

CREATE OR REPLACE FUNCTION pepsi.grant_apply() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    missing text;
    routine text;
    item record;
    revokees text;
BEGIN
    SELECT string_agg(DISTINCT g.role, ', ') INTO missing FROM pepsi.grant_policy() g
    WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION '% % not exist', CASE WHEN missing LIKE '%,%' THEN 'group roles' ELSE 'group role' END,
                        missing || CASE WHEN missing LIKE '%,%' THEN ' do' ELSE ' does' END
            USING ERRCODE = 'undefined_object',
                  DETAIL = 'CREATE EXTENSION pepsi creates the group roles; only a DBA drops or renames them.',
                  HINT = 'Create it again with CREATE ROLE <name> NOLOGIN, then run SELECT * FROM pepsi.apply_grants().';
    END IF;
    SELECT 'PUBLIC, ' || string_agg(quote_ident(r.name), ', ' ORDER BY r.name) INTO revokees
    FROM pepsi.grant_role r;

    EXECUTE format('REVOKE ALL ON SCHEMA pepsi FROM %s', revokees);
    FOR item IN
        SELECT c.oid::regclass AS relation, c.relkind = 'S' AS is_sequence
        FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
    LOOP
        EXECUTE format('REVOKE ALL ON %s %s FROM %s',
                       CASE WHEN item.is_sequence THEN 'SEQUENCE' ELSE 'TABLE' END, item.relation, revokees);
    END LOOP;
    FOR item IN SELECT p.oid::regprocedure AS routine FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
    LOOP
        EXECUTE format('REVOKE ALL ON ROUTINE %s FROM %s', item.routine, revokees);
    END LOOP;

    -- The logs are append-only for every role, not just for ours.
    -- (A table-level REVOKE takes the column-level grants with it.)
    FOR item IN
        SELECT DISTINCT x.relation, a.privilege_type AS privilege,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
        FROM (SELECT c.oid::regclass AS relation, c.relowner AS owner, c.relacl AS acl FROM pg_class c
              UNION ALL
              SELECT c.oid::regclass, c.relowner, t.attacl
              FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid) AS x
        CROSS JOIN LATERAL aclexplode(x.acl) AS a
        WHERE x.relation IN ('pepsi.event_log'::regclass, 'pepsi.mail_log'::regclass)
          AND a.privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE') AND a.grantee <> x.owner
    LOOP
        EXECUTE format('REVOKE %s ON TABLE %s FROM %s CASCADE', item.privilege, item.relation, item.grantee);
    END LOOP;

    FOR item IN SELECT * FROM pepsi.grant_policy() g WHERE g.object_kind = 'schema'
    LOOP
        EXECUTE format('GRANT %s ON SCHEMA %I TO %I', array_to_string(item.privileges, ', '),
                       item.object_name, item.role);
    END LOOP;
    -- (An object the policy names that does not exist is skipped here and
    -- reported by grant_verify().)
    FOR item IN SELECT * FROM pepsi.grant_policy() g
                WHERE g.object_kind IN ('table', 'view', 'sequence')
                  AND to_regclass(format('pepsi.%I', g.object_name)) IS NOT NULL
    LOOP
        EXECUTE format('GRANT %s ON %s pepsi.%I TO %I', array_to_string(item.privileges, ', '),
                       CASE WHEN item.object_kind = 'sequence' THEN 'SEQUENCE' ELSE 'TABLE' END,
                       item.object_name, item.role);
    END LOOP;
    FOR item IN SELECT c.role, c.object_name, c.privilege,
                       (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) FROM pg_attribute a
                        WHERE a.attrelid = to_regclass(format('pepsi.%I', c.object_name)) AND a.attnum > 0
                          AND NOT a.attisdropped AND NOT a.attname = ANY (c.withheld)) AS columns
                FROM pepsi.grant_column c WHERE to_regclass(format('pepsi.%I', c.object_name)) IS NOT NULL
    LOOP
        EXECUTE format('GRANT %s (%s) ON TABLE pepsi.%I TO %I', item.privilege, item.columns,
                       item.object_name, item.role);
    END LOOP;
    FOR item IN SELECT * FROM pepsi.grant_policy() g WHERE g.object_kind = 'function'
    LOOP
        FOR routine IN SELECT p.oid::regprocedure::text FROM pg_proc p
                       WHERE p.pronamespace = 'pepsi'::regnamespace AND p.proname = item.object_name
        LOOP
            EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %I', routine, item.role);
        END LOOP;
    END LOOP;

    FOR item IN SELECT p.oid::regprocedure AS routine FROM pg_proc p
                WHERE p.pronamespace = 'pepsi'::regnamespace
                  AND p.proname IN (SELECT * FROM pepsi.grant_definer_functions())
    LOOP
        EXECUTE format('ALTER ROUTINE %s SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp',
                       item.routine);
    END LOOP;

    FOR item IN SELECT * FROM pepsi.grant_membership
    LOOP
        EXECUTE format('GRANT %I TO %I', item.granted, item.member);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pepsi.grant_verify()
RETURNS TABLE (grantee text, object text, privilege text, expected boolean, actual boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH checked AS (
        SELECT e.role::text AS grantee, e.classid, e.objid, e.privilege, e.expected,
               CASE e.kind
                   WHEN 'f' THEN has_function_privilege(e.role, e.objid, e.privilege)
                   WHEN 'n' THEN has_schema_privilege(e.role, e.objid, e.privilege)
                   WHEN 'S' THEN has_sequence_privilege(e.role, e.objid, e.privilege)
                   ELSE has_table_privilege(e.role, e.objid, e.privilege)
                        OR (NOT e.expected AND e.privilege IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')
                            AND has_any_column_privilege(e.role, e.objid, e.privilege)
                            AND NOT EXISTS (SELECT FROM pepsi.grant_column g
                                            WHERE to_regclass(format('pepsi.%I', g.object_name)) = e.objid
                                              AND g.privilege = e.privilege
                                              AND (g.role = e.role
                                                   OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m
                                                                 WHERE m.member = e.role))))
               END AS actual
        FROM pepsi.grant_expected() e),
    -- The tables with column-level grants, column by column: a role may
    -- use a column if the policy grants it the table or the column.
    columns AS (
        SELECT r.role::text AS grantee, c.oid AS objid, a.attnum, p.privilege,
               EXISTS (SELECT FROM pepsi.grant_policy() g
                       WHERE (g.role = r.role
                              OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                         AND g.object_kind = 'table' AND g.object_name = c.relname::text
                         AND p.privilege = ANY (g.privileges))
               OR EXISTS (SELECT FROM pepsi.grant_column g
                          WHERE (g.role = r.role
                                 OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                            AND g.object_name = c.relname::text AND g.privilege = p.privilege
                            AND NOT a.attname = ANY (g.withheld)) AS expected,
               has_column_privilege(r.role, c.oid, a.attnum, p.privilege) AS actual
        FROM (SELECT DISTINCT g.object_name, g.privilege FROM pepsi.grant_column g) p
        JOIN pg_class c ON c.relnamespace = 'pepsi'::regnamespace AND c.relname = p.object_name
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        CROSS JOIN (SELECT DISTINCT g.role FROM pepsi.grant_policy() g
                    WHERE EXISTS (SELECT FROM pg_roles x WHERE x.rolname = g.role)) r),
    acls AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid, 0 AS subid, c.relowner AS owner,
               coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner)) AS acl
        FROM pg_class c WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
        UNION ALL
        SELECT 'pg_class'::regclass, c.oid, t.attnum, c.relowner, t.attacl
        FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid
        WHERE c.relnamespace = 'pepsi'::regnamespace AND t.attacl IS NOT NULL
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid, 0, p.proowner, coalesce(p.proacl, acldefault('f', p.proowner))
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
        UNION ALL
        SELECT 'pg_namespace'::regclass, n.oid, 0, n.nspowner, coalesce(n.nspacl, acldefault('n', n.nspowner))
        FROM pg_namespace n WHERE n.nspname = 'pepsi'),
    strangers AS (
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee,
               x.classid, x.objid, x.subid, a.privilege_type AS privilege
        FROM acls x CROSS JOIN LATERAL aclexplode(x.acl) AS a
        WHERE a.grantee <> x.owner
          AND a.grantee NOT IN (SELECT r.oid FROM pg_roles r
                                WHERE r.rolname IN (SELECT g.role FROM pepsi.grant_policy() g))),
    unclassified AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
          AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype = 'i')
          AND c.relname NOT IN (SELECT g.object_name FROM pepsi.grant_policy() g)
          AND c.relname NOT IN (SELECT * FROM pepsi.grant_owner_only())
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p
        WHERE p.pronamespace = 'pepsi'::regnamespace AND p.prorettype <> 'trigger'::regtype
          AND p.proname NOT IN (SELECT g.object_name FROM pepsi.grant_policy() g)
          AND p.proname NOT IN (SELECT * FROM pepsi.grant_owner_only())),
    definers AS (
        SELECT p.oid AS objid, p.proname IN (SELECT * FROM pepsi.grant_definer_functions()) AS wanted,
               p.prosecdef,
               coalesce('search_path=pg_catalog, pepsi, pg_temp' = ANY (p.proconfig), false) AS pinned
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace)
    SELECT c.grantee, pepsi.grant_object_name(c.classid, c.objid, 0), c.privilege, c.expected, c.actual
    FROM checked c WHERE c.expected <> c.actual
    UNION ALL
    SELECT c.grantee, pepsi.grant_object_name('pg_class'::regclass, c.objid, c.attnum), c.privilege, c.expected, c.actual
    FROM columns c WHERE c.expected <> c.actual
    UNION ALL
    SELECT DISTINCT g.role::text, 'role ' || g.role, 'exists', true, false
    FROM pepsi.grant_policy() g WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role)
    UNION ALL
    SELECT s.grantee, pepsi.grant_object_name(s.classid, s.objid, s.subid), s.privilege, false, true
    FROM strangers s
    UNION ALL
    SELECT NULL, pepsi.grant_object_name(u.classid, u.objid, 0), 'named in grant_policy()', true, false
    FROM unclassified u
    UNION ALL
    SELECT DISTINCT NULL, g.object_kind || ' pepsi.' || g.object_name, 'exists', true, false
    FROM pepsi.grant_policy() g
    WHERE CASE WHEN g.object_kind = 'function'
               THEN NOT EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
                                AND p.proname = g.object_name)
               WHEN g.object_kind = 'schema' THEN false
               ELSE to_regclass(format('pepsi.%I', g.object_name)) IS NULL END
    UNION ALL
    SELECT NULL, pepsi.grant_object_name('pg_proc'::regclass, d.objid, 0), 'SECURITY DEFINER', d.wanted, d.prosecdef
    FROM definers d WHERE d.wanted <> d.prosecdef
    UNION ALL
    SELECT NULL, pepsi.grant_object_name('pg_proc'::regclass, d.objid, 0), 'SET search_path', true, false
    FROM definers d WHERE d.wanted AND NOT d.pinned
    ORDER BY 2, 1, 3
$$;

INSERT INTO pepsi.grant_role VALUES
    ('pepsi_crypto', 'Pepsi: the key store (pepsi-stage-encrypt, pepsi-stage-decrypt, pepsi-keys): pepsi_stage, and the private keys');
SELECT pepsi.grant_roles_create();
INSERT INTO pepsi.grant_membership VALUES ('pepsi_crypto', 'pepsi_stage');

-- One row per key pair and capability.  status: active (used), retired
-- (kept to decrypt and verify what was made with it, not used to encrypt
-- or sign), revoked (never used again; its revocation is published).  One
-- primary active key per address, protocol and capability.  A purge drops
-- the private half and keeps the row (the public half still verifies).
CREATE TABLE pepsi.crypto_identity (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address           text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    protocol          text NOT NULL CHECK (protocol IN ('openpgp', 'smime')),
    capability        text NOT NULL CHECK (capability IN ('sign', 'encrypt', 'both')),
    algorithm         text NOT NULL,
    fingerprint       text NOT NULL CHECK (fingerprint ~ '^[0-9A-F]{40,64}$'),
    public_key        bytea NOT NULL,
    private_wrapped   bytea,
    kek_id            text,
    status            text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired', 'revoked')),
    is_primary        boolean NOT NULL DEFAULT false,
    published         boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz,
    revoked_at        timestamptz,
    revocation_reason text,
    private_purged_at timestamptz,
    UNIQUE (protocol, fingerprint),
    CHECK ((private_wrapped IS NULL) = (kek_id IS NULL)),
    CHECK (private_purged_at IS NULL OR private_wrapped IS NULL),
    CHECK ((status = 'revoked') = (revoked_at IS NOT NULL)),
    CHECK (NOT is_primary OR status = 'active')
);
CREATE UNIQUE INDEX crypto_identity_primary ON pepsi.crypto_identity (address, protocol, capability)
    WHERE is_primary;
CREATE INDEX crypto_identity_address ON pepsi.crypto_identity (address);
COMMENT ON TABLE pepsi.crypto_identity IS
    'Key pairs of the addresses we serve: public half, private half sealed under the KEK, lifecycle';

-- A correspondent's key, as found: source says where (wkd-advanced,
-- wkd-direct, openpgpkey and smimea from DNS, keyserver, autocrypt,
-- import), dnssec whether that answer was validated, verdict the last
-- check of it (why it was refused in verdict_reason) and cache_until when
-- to look again.
CREATE TABLE pepsi.peer_key (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address        text NOT NULL CHECK (address = lower(address) AND address LIKE '%_@_%'),
    protocol       text NOT NULL CHECK (protocol IN ('openpgp', 'smime')),
    fingerprint    text NOT NULL CHECK (fingerprint ~ '^[0-9A-F]{40,64}$'),
    key_data       bytea NOT NULL,
    source         text NOT NULL CHECK (source IN ('wkd-advanced', 'wkd-direct', 'openpgpkey', 'smimea',
                                                   'keyserver', 'autocrypt', 'import')),
    dnssec         boolean NOT NULL DEFAULT false,
    verdict        text NOT NULL DEFAULT 'unchecked'
                   CHECK (verdict IN ('unchecked', 'valid', 'expired', 'revoked', 'mismatch', 'untrusted', 'invalid')),
    verdict_reason text,
    prefer_encrypt boolean NOT NULL DEFAULT false,
    expires_at     timestamptz,
    fetched_at     timestamptz NOT NULL DEFAULT now(),
    cache_until    timestamptz NOT NULL,
    UNIQUE (address, protocol, fingerprint)
);
COMMENT ON TABLE pepsi.peer_key IS
    'Correspondents'' public keys and certificates: source, DNSSEC, verdict, cache deadline';

-- Correspondents proven to hold one of our keys: they encrypted to it and
-- signed with a key of their own address.  Mail to them goes without our
-- key attached.
CREATE TABLE pepsi.peer_has_own_key (
    peer_address text NOT NULL CHECK (peer_address = lower(peer_address)),
    identity_id  bigint NOT NULL REFERENCES pepsi.crypto_identity (id) ON DELETE CASCADE,
    first_seen   timestamptz NOT NULL DEFAULT now(),
    last_seen    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (peer_address, identity_id)
);
CREATE INDEX peer_has_own_key_identity ON pepsi.peer_has_own_key (identity_id);
COMMENT ON TABLE pepsi.peer_has_own_key IS
    'Correspondents proven to hold one of our keys (written by pepsi-stage-autocrypt-learn)';

-- The CA certificates (DER) an inbound S/MIME chain must reach.
CREATE TABLE pepsi.ca_trust (
    fingerprint text PRIMARY KEY CHECK (fingerprint ~ '^[0-9A-F]{64}$'),
    subject     text NOT NULL,
    certificate bytea NOT NULL,
    not_after   timestamptz,
    added_at    timestamptz NOT NULL DEFAULT now(),
    note        text
);
COMMENT ON TABLE pepsi.ca_trust IS 'CA certificates inbound S/MIME chains must reach';

-- Key discovery: one row per address being looked up, the methods asked
-- and those that replied; settled without a key, negative_until keeps the
-- next message for the address from parking again.
CREATE TABLE pepsi.key_request (
    address         text PRIMARY KEY CHECK (address = lower(address)),
    methods_asked   text[] NOT NULL DEFAULT '{}',
    methods_replied text[] NOT NULL DEFAULT '{}',
    requested_at    timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz,
    negative_until  timestamptz,
    CHECK (negative_until IS NULL OR settled_at IS NOT NULL)
);
COMMENT ON TABLE pepsi.key_request IS
    'Key discovery requests in flight, and once settled without a key the negative cache';

-- The audit of the key store: pepsi-keys records each operation (action
-- key_generate, key_import, key_rotate, key_revoke, key_purge, kek_rotate,
-- ...) in the transaction that makes it.
CREATE FUNCTION pepsi.key_event(action text, detail jsonb) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF action IS NULL OR action !~ '^(key|kek)_[a-z_]+$' THEN
        RAISE EXCEPTION 'invalid key store action %', coalesce(action, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Key store actions are key_* and kek_*.';
    END IF;
    PERFORM pepsi.event_log_write(action, detail);
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_crypto', 'table', 'crypto_identity', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'table', 'peer_key', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'table', 'peer_has_own_key', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'table', 'ca_trust', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'table', 'key_request', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_crypto', 'function', 'key_event', '{EXECUTE}'),
    ('pepsi_stage', 'table', 'peer_key', '{SELECT,INSERT,UPDATE}'),
    ('pepsi_stage', 'table', 'peer_has_own_key', '{SELECT,INSERT,UPDATE}'),
    ('pepsi_stage', 'table', 'ca_trust', '{SELECT}'),
    ('pepsi_stage', 'table', 'key_request', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_config', 'table', 'peer_key', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_config', 'table', 'peer_has_own_key', '{SELECT,DELETE}'),
    ('pepsi_config', 'table', 'ca_trust', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_config', 'table', 'key_request', '{SELECT,DELETE}'),
    ('pepsi_config', 'function', 'key_event', '{EXECUTE}');
INSERT INTO pepsi.grant_column (role, object_name, privilege, withheld) VALUES
    ('pepsi_stage', 'crypto_identity', 'SELECT', '{private_wrapped}'),
    ('pepsi_config', 'crypto_identity', 'SELECT', '{private_wrapped}'),
    ('pepsi_httpd', 'crypto_identity', 'SELECT', '{private_wrapped}');
INSERT INTO pepsi.grant_definer (name) VALUES ('key_event');

SELECT pg_catalog.pg_extension_config_dump('pepsi.crypto_identity', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.crypto_identity_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.peer_key', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.peer_key_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.peer_has_own_key', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.ca_trust', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.key_request', '');
SELECT pepsi.grant_apply();
-- end of the key store

UPDATE pepsi.schema_version SET version = '0.7';
