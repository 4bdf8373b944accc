/*
 * pepsi 0.10 -> 0.11: the schema changes made since 0.10.
 *
 * 0.10 was released with the S/MIME keys learnt from signed mail, the
 * archive's phrase search and batched import, and the secretary's
 * set-based batch; every schema change since is a block here, placed
 * before the final UPDATE of pepsi.schema_version, and folded into
 * pepsi--0.11.sql (new objects at its end).  An existing 0.10 database
 * reaches 0.11 with ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi
 * installs pepsi--0.11.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every
 * statement safe on a live queue) is the one pepsi--0.1--0.2.sql describes
 * and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.11'" to load this file. \quit

-- The grants' check made cheaper (issue 37): grant_expected() and
-- grant_verify() read pepsi.grant_rule instead of pepsi.grant_policy(),
-- which, having a SET clause, is never inlined, so each of their EXISTS
-- and IN tests ran it again and scanned every rule.  Same rows, same
-- result; grant_verify() went from about 5 s of backend CPU a call to
-- about 1.3 s, and every CREATE EXTENSION pepsi and apply_grants() run it.
CREATE OR REPLACE FUNCTION pepsi.grant_expected()
RETURNS TABLE (role name, classid regclass, objid oid, kind "char", privilege text, expected boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH objects AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid, c.relkind AS kind, c.relname::text AS name,
               CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' ELSE 'table' END AS object_kind,
               CASE c.relkind WHEN 'S' THEN '{USAGE,SELECT,UPDATE}'::text[]
                    ELSE '{SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER}' END AS applicable
        FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid, 'f', p.proname::text, 'function', '{EXECUTE}'
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
        UNION ALL
        SELECT 'pg_namespace'::regclass, 'pepsi'::regnamespace::oid, 'n', 'pepsi', 'schema', '{USAGE,CREATE}'),
    roles AS (SELECT DISTINCT g.role FROM pepsi.grant_rule g
              WHERE EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role))
    SELECT r.role, o.classid, o.objid, o.kind, a.privilege,
           EXISTS (SELECT FROM pepsi.grant_rule g
                   WHERE (g.role = r.role
                          OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                     AND g.object_kind = o.object_kind
                     AND g.object_name = o.name AND a.privilege = ANY (g.privileges))
    FROM objects o CROSS JOIN roles r CROSS JOIN LATERAL unnest(o.applicable) AS a (privilege)
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
               EXISTS (SELECT FROM pepsi.grant_rule g
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
        CROSS JOIN (SELECT DISTINCT g.role FROM pepsi.grant_rule g
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
                                WHERE r.rolname IN (SELECT g.role FROM pepsi.grant_rule g))),
    unclassified AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
          AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype = 'i')
          AND c.relname NOT IN (SELECT g.object_name FROM pepsi.grant_rule g)
          AND c.relname NOT IN (SELECT * FROM pepsi.grant_owner_only())
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p
        WHERE p.pronamespace = 'pepsi'::regnamespace AND p.prorettype <> 'trigger'::regtype
          AND p.proname NOT IN (SELECT g.object_name FROM pepsi.grant_rule g)
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
    FROM pepsi.grant_rule g WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role)
    UNION ALL
    SELECT s.grantee, pepsi.grant_object_name(s.classid, s.objid, s.subid), s.privilege, false, true
    FROM strangers s
    UNION ALL
    SELECT NULL, pepsi.grant_object_name(u.classid, u.objid, 0), 'named in grant_policy()', true, false
    FROM unclassified u
    UNION ALL
    SELECT DISTINCT NULL, g.object_kind || ' pepsi.' || g.object_name, 'exists', true, false
    FROM pepsi.grant_rule g
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
-- end of the grants' check made cheaper

UPDATE pepsi.schema_version SET version = '0.11';
