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
 * Grants: the policy is data (the first block below): an object a block
 * adds is no role's until the block inserts its rows into pepsi.grant_rule
 * (role, kind, name, privileges), pepsi.grant_definer (functions that run
 * as the owner) or pepsi.grant_owner (the owner's alone); a new group role
 * goes into pepsi.grant_role, then SELECT pepsi.grant_roles_create().  A
 * block that adds objects ends with SELECT pepsi.grant_apply().  Blocks
 * only ever insert rows, so blocks from different branches never edit the
 * same definition.  The upgrade test checks that pepsi.grant_verify()
 * finds no drift.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.2'" to load this file. \quit

-- ===========================================================================
-- Grant rules as data
--
-- 0.1 wrote the policy as VALUES lists inside grant_policy(),
-- grant_definer_functions() and grant_owner_only(), and named the group
-- roles inside grant_apply().  Every feature that adds an object had to
-- redefine those functions whole, so two features added on two branches
-- each dropped the other's rows.  The lists become tables that each block
-- appends to; the functions read them, and keep their names and results so
-- that grant_expected(), grant_verify() and apply_grants() are unchanged.
-- ===========================================================================

CREATE TABLE pepsi.grant_role (
    name        name PRIMARY KEY,
    description text NOT NULL
);
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_stage', 'Pepsi: the pipeline (pepsi-dispatch and the stage workers)'),
    ('pepsi_ingress', 'Pepsi: admission only (pepsi-ingress, pepsi-sendmail): EXECUTE on pepsi.workqueue_add and workqueue_inject'),
    ('pepsi_config', 'Pepsi: administration: writes pepsi.config_override, acts on the queue'),
    ('pepsi_monitor', 'Pepsi: read-only monitoring: the queue views and statistics');

CREATE TABLE pepsi.grant_rule (
    role        name NOT NULL REFERENCES pepsi.grant_role (name),
    object_kind text NOT NULL CHECK (object_kind IN ('schema', 'table', 'view', 'sequence', 'function')),
    object_name text NOT NULL,
    privileges  text[] NOT NULL CHECK (cardinality(privileges) > 0),
    PRIMARY KEY (role, object_kind, object_name)
);
INSERT INTO pepsi.grant_rule SELECT * FROM pepsi.grant_policy();

CREATE TABLE pepsi.grant_definer (name text PRIMARY KEY);
INSERT INTO pepsi.grant_definer SELECT * FROM pepsi.grant_definer_functions();

CREATE TABLE pepsi.grant_owner (name text PRIMARY KEY);
INSERT INTO pepsi.grant_owner SELECT * FROM pepsi.grant_owner_only();
INSERT INTO pepsi.grant_owner VALUES
    ('grant_role'), ('grant_rule'), ('grant_definer'), ('grant_owner'), ('grant_roles_create');

CREATE OR REPLACE FUNCTION pepsi.grant_policy()
RETURNS TABLE (role name, object_kind text, object_name text, privileges text[])
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT g.role, g.object_kind, g.object_name, g.privileges FROM pepsi.grant_rule g
$$;

CREATE OR REPLACE FUNCTION pepsi.grant_definer_functions() RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT d.name FROM pepsi.grant_definer d
$$;

CREATE OR REPLACE FUNCTION pepsi.grant_owner_only() RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT o.name FROM pepsi.grant_owner o
$$;

-- The group roles pepsi.grant_role names that the cluster lacks.  Roles
-- belong to the cluster: a role that exists already is left as it is.
CREATE FUNCTION pepsi.grant_roles_create() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    wanted record;
BEGIN
    FOR wanted IN SELECT * FROM pepsi.grant_role r
                  WHERE NOT EXISTS (SELECT FROM pg_roles x WHERE x.rolname = r.name)
    LOOP
        EXECUTE format('CREATE ROLE %I NOLOGIN', wanted.name);
        EXECUTE format('COMMENT ON ROLE %I IS %L', wanted.name, wanted.description);
    END LOOP;
END
$$;

-- As in 0.1, with the group roles read from pepsi.grant_role.
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
END
$$;

SELECT pepsi.grant_apply();

-- end of grant rules as data

-- ===========================================================================
-- Local recipients: virtual mailboxes
--
-- The addresses of local domains that exist without a maildir or an alias
-- of their own (common/local.c, source "virtual").  pepsi-ingress reads
-- the table to refuse unknown local recipients at RCPT time (550 5.1.1);
-- the pipeline may read it; only pepsi_config changes it, and only through
-- the audited functions below, never by writing the table.
-- ===========================================================================

CREATE TABLE pepsi.virtual_mailbox (
    address    text PRIMARY KEY,
    note       text,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text NOT NULL DEFAULT current_user,
    CONSTRAINT virtual_mailbox_address_form CHECK (
        address = lower(address)
        AND address ~ '^[^@[:space:][:cntrl:]]{1,64}@[a-z0-9_.-]{1,253}$'
        AND address !~ '^\.' AND address !~ '/'),
    CONSTRAINT virtual_mailbox_note_form CHECK (note IS NULL OR note !~ '[[:cntrl:]]')
);
COMMENT ON TABLE pepsi.virtual_mailbox IS
    'Local recipients that exist without a maildir or an alias (LOCAL_RECIPIENTS = virtual); changed through virtual_mailbox_add/remove';

-- The canonical form of a mailbox address, or an error saying what is wrong.
CREATE FUNCTION pepsi.virtual_mailbox_canonical(address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := lower(btrim(address));
BEGIN
    IF address IS NULL THEN
        RAISE EXCEPTION 'address must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF canonical ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid mailbox address: it contains a control character'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A line break or another control character in an address could forge SMTP commands or headers.';
    END IF;
    IF canonical !~ '^[^@[:space:]]{1,64}@[a-z0-9_.-]{1,253}$' OR canonical ~ '^\.' OR canonical ~ '/' THEN
        RAISE EXCEPTION 'invalid mailbox address %', quote_literal(address)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A mailbox is local-part@domain: a local part of at most 64 characters without spaces, "/" or a leading dot, and an ASCII domain name.',
                  HINT = 'Give the address as mail is sent to it, as in "alice@example.org".';
    END IF;
    RETURN canonical;
END
$$;

-- Add a mailbox; false if it existed already.  Audited in pepsi.event_log.
CREATE FUNCTION pepsi.virtual_mailbox_add(address text, note text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := pepsi.virtual_mailbox_canonical(address);
    added boolean;
BEGIN
    IF note ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'note must be one line of text'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It contains a line break or another control character.';
    END IF;
    INSERT INTO pepsi.virtual_mailbox AS v (address, note, created_by)
    VALUES (canonical, note, pepsi.event_principal())
    ON CONFLICT ON CONSTRAINT virtual_mailbox_pkey DO NOTHING;
    added := FOUND;
    PERFORM pepsi.event_log_write('virtual_mailbox_add',
        jsonb_build_object('address', canonical, 'note', note, 'added', added));
    RETURN added;
END
$$;

-- Remove a mailbox; false if there was none.  Audited in pepsi.event_log.
CREATE FUNCTION pepsi.virtual_mailbox_remove(address text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := pepsi.virtual_mailbox_canonical(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.virtual_mailbox v WHERE v.address = canonical;
    removed := FOUND;
    PERFORM pepsi.event_log_write('virtual_mailbox_remove',
        jsonb_build_object('address', canonical, 'removed', removed));
    RETURN removed;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'table', 'virtual_mailbox', '{SELECT}'),
    ('pepsi_stage', 'table', 'virtual_mailbox', '{SELECT}'),
    ('pepsi_config', 'table', 'virtual_mailbox', '{SELECT}'),
    ('pepsi_config', 'function', 'virtual_mailbox_add', '{EXECUTE}'),
    ('pepsi_config', 'function', 'virtual_mailbox_remove', '{EXECUTE}'),
    ('pepsi_config', 'function', 'virtual_mailbox_canonical', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('virtual_mailbox_add'), ('virtual_mailbox_remove');

SELECT pepsi.grant_apply();

-- end of local recipients: virtual mailboxes

-- ===========================================================================
-- The database cannot run code or redirect mail
--
-- An override of pepsi.conf is one line of text; PROGRAM is a program's
-- name (the dispatcher runs it from Pepsi's own program directory, never
-- a path); the options that name a path, where mail goes or how the next
-- hop is authenticated are read from the file only (common/config.c
-- refuses the same rows whatever the database holds).  The constraints are
-- NOT VALID so that the update succeeds on a database holding such a row;
-- the programs refuse it.
--
-- The configuration and the audit log are written only through audited
-- SECURITY DEFINER functions: no group role writes config_override or
-- inserts into event_log directly, and both record the caller
-- (pepsi.event_principal(), the role outside any definer function), so
-- the audit trail cannot be forged.
-- ===========================================================================

ALTER TABLE pepsi.config_override
    ADD CONSTRAINT config_override_one_line CHECK (value !~ '[\x01-\x08\x0a-\x1f\x7f]') NOT VALID,
    ADD CONSTRAINT config_override_program_name
        CHECK (option <> 'PROGRAM' OR value ~ '^[a-z0-9][a-z0-9._+-]*$') NOT VALID,
    ADD CONSTRAINT config_override_file_only
        CHECK (option !~ '_FILE$'
               AND option NOT IN ('MAILDIR_ROOT', 'SMARTHOST', 'TLS', 'TLS_NAME', 'CERTIFICATE', 'KEY',
                                  'AUTH_USER')
               AND NOT (section = 'ingress' AND option = 'TRUSTED_NETWORKS')) NOT VALID;

-- The refusal config_set (and a superuser's INSERT) gets, before the constraint would.
CREATE FUNCTION pepsi.config_override_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    -- (inline: a trigger runs with the writer's rights, which need no other function)
    why text := CASE
        WHEN NEW.option ~ '_FILE$' OR NEW.option IN ('MAILDIR_ROOT', 'CERTIFICATE', 'KEY')
            THEN 'It names a path a program reads.'
        WHEN NEW.option IN ('SMARTHOST', 'TLS', 'TLS_NAME', 'AUTH_USER')
            THEN 'It decides where mail is sent or how the next hop is authenticated.'
        WHEN NEW.section = 'ingress' AND NEW.option = 'TRUSTED_NETWORKS'
            THEN 'It decides which clients may relay.'
    END;
BEGIN
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'option % of [%] cannot be overridden', NEW.option, NEW.section
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = why || ' It is read from pepsi.conf only, so that a compromised database cannot change it.',
                  HINT = 'Change it in pepsi.conf.';
    END IF;
    IF NEW.option = 'PROGRAM' AND NEW.value !~ '^[a-z0-9][a-z0-9._+-]*$' THEN
        RAISE EXCEPTION 'invalid value for PROGRAM in [%]', NEW.section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'From the database PROGRAM names a program of Pepsi''s (lower-case letters, digits, ".", "_", "+" and "-"), never a path.';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER config_override_guard
    BEFORE INSERT OR UPDATE ON pepsi.config_override
    FOR EACH ROW EXECUTE FUNCTION pepsi.config_override_guard();

-- The principal is the caller even inside the definer functions.
ALTER TABLE pepsi.config_override ALTER COLUMN updated_by SET DEFAULT pepsi.event_principal();
ALTER TABLE pepsi.event_log ALTER COLUMN principal SET DEFAULT pepsi.event_principal();

UPDATE pepsi.grant_rule SET privileges = '{SELECT}'
WHERE role = 'pepsi_config' AND object_kind = 'table' AND object_name IN ('config_override', 'event_log');
DELETE FROM pepsi.grant_rule
WHERE (role = 'pepsi_stage' AND object_kind = 'table' AND object_name = 'event_log')
   OR (object_kind = 'function' AND object_name = 'event_log_write');
INSERT INTO pepsi.grant_owner (name) VALUES ('event_log_write'), ('config_override_guard');
INSERT INTO pepsi.grant_definer (name) VALUES ('config_set'), ('config_unset');

SELECT pepsi.grant_apply();

-- end of the database cannot run code or redirect mail
