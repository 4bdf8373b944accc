/*
 * pepsi 0.1 -> 0.2: the schema changes made since 0.1 was released.
 *
 * An existing 0.1 database reaches 0.2 with ALTER EXTENSION pepsi UPDATE;
 * CREATE EXTENSION pepsi installs pepsi--0.2.sql, the whole of 0.2.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue (see
 * docs/upgrading.md for the scheme).
 *
 * pepsi--0.1.sql is released: it is never edited.  Each feature of 0.2
 * that changed the schema has its own block here, delimited by a header
 * comment naming the feature and a closing "-- end of <feature>" line;
 * each object is made (or changed) once, in its final form, in the block
 * where it first appears.  Every statement must work on a database
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


-- A group role may hold another's privileges by membership, and then
-- holds nothing on the schema itself: a role's grants on the schema
-- outlive DROP EXTENSION (the schema stays), and 0.1's check at CREATE
-- EXTENSION would take a surviving grant to a role it does not know for
-- drift.  Membership is declared here, granted by grant_apply(), and
-- counted by grant_expected().
CREATE TABLE pepsi.grant_membership (
    member      name NOT NULL REFERENCES pepsi.grant_role (name),
    granted     name NOT NULL REFERENCES pepsi.grant_role (name),
    PRIMARY KEY (member, granted),
    CHECK (member <> granted)
);
INSERT INTO pepsi.grant_owner VALUES ('grant_membership');

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
    roles AS (SELECT DISTINCT g.role FROM pepsi.grant_policy() g
              WHERE EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role))
    SELECT r.role, o.classid, o.objid, o.kind, a.privilege,
           EXISTS (SELECT FROM pepsi.grant_policy() g
                   WHERE (g.role = r.role
                          OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                     AND g.object_kind = o.object_kind
                     AND g.object_name = o.name AND a.privilege = ANY (g.privileges))
    FROM objects o CROSS JOIN roles r CROSS JOIN LATERAL unnest(o.applicable) AS a (privilege)
$$;

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

    FOR item IN SELECT * FROM pepsi.grant_membership
    LOOP
        EXECUTE format('GRANT %I TO %I', item.granted, item.member);
    END LOOP;
END
$$;

SELECT pepsi.grant_apply();

-- end of grant rules as data

-- ===========================================================================
-- Local recipients: virtual mailboxes
--
-- The addresses of local domains that exist without a maildir or an alias
-- of their own (common/local/local.c, source "virtual").  pepsi-ingress reads
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
-- hop is authenticated are read from the file only (common/config/config.c
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

-- ===========================================================================
-- pepsi-httpd: administrative credentials, the API's read paths, metrics
--
-- pepsi-httpd (daemons/httpd) serves /metrics, a JSON API over the operator
-- functions and a web page.  It connects as a member of pepsi_httpd, which
-- may read the views and statistics and call the operator functions, and
-- alone may read the credential tables: a component that could read
-- admin_session could mint itself an administrative session.  Only digests
-- are stored (SHA-256 of a session cookie or of an API token, Argon2id of
-- a password), so a backup holds no usable credential.
-- ===========================================================================

INSERT INTO pepsi.grant_role VALUES
    ('pepsi_httpd', 'Pepsi: pepsi-httpd: metrics, queue views and operator functions, administrative credentials');
SELECT pepsi.grant_roles_create();

CREATE TABLE pepsi.admin_account (
    name            text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    password_hash   text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    disabled        boolean NOT NULL DEFAULT false
);
COMMENT ON TABLE pepsi.admin_account IS 'pepsi-httpd administrators; passwords as Argon2id encoded hashes';

CREATE TABLE pepsi.admin_session (
    digest          bytea PRIMARY KEY CHECK (length(digest) = 32),
    account         text NOT NULL REFERENCES pepsi.admin_account (name) ON DELETE CASCADE,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);
CREATE INDEX admin_session_expires ON pepsi.admin_session (expires_at);
COMMENT ON TABLE pepsi.admin_session IS 'Live pepsi-httpd browser sessions: SHA-256 of the cookie';

CREATE TABLE pepsi.api_token (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    digest          bytea NOT NULL UNIQUE CHECK (length(digest) = 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at      timestamptz
);
COMMENT ON TABLE pepsi.api_token IS 'Bearer tokens of the pepsi-httpd API: SHA-256 of the token';

-- A new token: returned once, stored only as its digest.  The secret is
-- three version-4 UUIDs, 366 random bits (gen_random_uuid() is in core;
-- pgcrypto's gen_random_bytes is not).
CREATE FUNCTION pepsi.api_token_create(name text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text := 'pepsi_' || replace(gen_random_uuid()::text || gen_random_uuid()::text
                                      || gen_random_uuid()::text, '-', '');
BEGIN
    INSERT INTO pepsi.api_token (name, digest) VALUES (api_token_create.name, sha256(convert_to(token, 'UTF8')));
    PERFORM pepsi.event_log_write('api_token_create', jsonb_build_object('name', api_token_create.name));
    RETURN token;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'API token "%" exists already', api_token_create.name
        USING ERRCODE = 'unique_violation',
              HINT = 'Revoke it with pepsi.api_token_revoke(name), or choose another name.';
END
$$;

CREATE FUNCTION pepsi.api_token_revoke(name text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    revoked boolean;
BEGIN
    UPDATE pepsi.api_token t SET revoked_at = now()
    WHERE t.name = api_token_revoke.name AND t.revoked_at IS NULL;
    revoked := FOUND;
    PERFORM pepsi.event_log_write('api_token_revoke',
        jsonb_build_object('name', api_token_revoke.name, 'revoked', revoked));
    RETURN revoked;
END
$$;

-- Set an administrator's password hash (made by pepsi-httpd passwd, which
-- hashes with Argon2id: the password never reaches the server).
CREATE FUNCTION pepsi.admin_account_set(name text, password_hash text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    INSERT INTO pepsi.admin_account AS a (name, password_hash) VALUES (name, password_hash)
    ON CONFLICT ON CONSTRAINT admin_account_pkey
    DO UPDATE SET password_hash = excluded.password_hash, disabled = false;
    -- A new password ends the account's sessions.
    DELETE FROM pepsi.admin_session s WHERE s.account = admin_account_set.name;
    PERFORM pepsi.event_log_write('admin_account_set', jsonb_build_object('name', name));
END
$$;

-- ---------------------------------------------------------------------------
-- Queue gauges for /metrics
--
-- Counting a million rows by stage and status takes 100 to 250 ms even as
-- an index-only scan (queue_summary), too slow for a scrape.  The counts
-- are kept as a snapshot in queue_gauge: refreshed at every read while a
-- refresh is cheap (a queue under 20,000 messages: the gauges are then
-- live), and by the
-- maintenance worker otherwise, at most every twenty times what a refresh
-- costs (every 5 s for a 250 ms count), so a big queue costs the server
-- a few percent of a core and a scrape reads forty rows.  as_of says how
-- old the snapshot is.
-- ---------------------------------------------------------------------------

CREATE TABLE pepsi.queue_gauge (
    stage               text NOT NULL,
    status              pepsi.status NOT NULL,
    messages            bigint NOT NULL,
    held                bigint NOT NULL,
    oldest_received_at  timestamptz,
    PRIMARY KEY (stage, status)
);
CREATE TABLE pepsi.queue_gauge_refresh (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    refreshed_at    timestamptz,
    duration        interval,
    counted         bigint
);
INSERT INTO pepsi.queue_gauge_refresh DEFAULT VALUES;

-- Recount when the snapshot is older than its period (twenty times the
-- last count's cost, at least min_period), or always when force.  One
-- refresh at a time: a concurrent caller keeps the snapshot it finds.
-- Returns whether it counted.
CREATE FUNCTION pepsi.queue_gauge_refresh(force boolean DEFAULT false,
                                          min_period interval DEFAULT '1 second')
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
DECLARE
    last record;
    started timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO last FROM pepsi.queue_gauge_refresh;
    IF NOT force AND last.refreshed_at IS NOT NULL
       AND clock_timestamp() - last.refreshed_at < greatest(min_period, last.duration * 20) THEN
        RETURN false;
    END IF;
    -- ('PEPS', 3): the gauge refresh.  (1 is the maintenance worker's
    -- session lock and 2 the dispatcher's: sharing 2 made a dispatcher
    -- starting during a refresh exit as if another were running, and no
    -- refresh could run while a dispatcher held it.)
    IF NOT pg_try_advisory_xact_lock(1346720851, 3) THEN
        RETURN false;
    END IF;
    DELETE FROM pepsi.queue_gauge;
    INSERT INTO pepsi.queue_gauge
    SELECT c.stage, c.status, c.messages, c.held, c.oldest_received_at FROM pepsi.queue_counts() c;
    UPDATE pepsi.queue_gauge_refresh
    SET refreshed_at = clock_timestamp(), duration = clock_timestamp() - started,
        counted = (SELECT coalesce(sum(g.messages), 0) FROM pepsi.queue_gauge g);
    RETURN true;
END
$$;

-- The gauges for a scrape: recounted first when a count is cheap (the
-- last one found under 20,000 messages, a few milliseconds of index-only
-- scan) or the snapshot is a minute old (no maintenance worker is
-- refreshing it).
CREATE FUNCTION pepsi.queue_gauges()
RETURNS TABLE (stage text, status pepsi.status, messages bigint, held bigint,
               oldest_age_seconds double precision, as_of timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
DECLARE
    last record;
BEGIN
    SELECT * INTO last FROM pepsi.queue_gauge_refresh;
    IF last.refreshed_at IS NULL OR last.counted < 20000
       OR clock_timestamp() - last.refreshed_at > interval '1 minute' THEN
        PERFORM pepsi.queue_gauge_refresh(true);
        SELECT * INTO last FROM pepsi.queue_gauge_refresh;
    END IF;
    RETURN QUERY
    SELECT g.stage, g.status, g.messages, g.held,
           extract(epoch FROM now() - g.oldest_received_at)::double precision, last.refreshed_at
    FROM pepsi.queue_gauge g ORDER BY g.stage, g.status;
END
$$;

-- ---------------------------------------------------------------------------
-- The API's queue reads: a page of the queue and one message, for a role
-- that may not read pepsi.workqueue itself.
-- ---------------------------------------------------------------------------

-- Newest first; before_id pages on; search matches the sender or a
-- recipient (case-insensitive substring).
CREATE FUNCTION pepsi.queue_list(stage text DEFAULT NULL, status pepsi.status DEFAULT NULL,
                                 search text DEFAULT NULL, max_rows integer DEFAULT 100,
                                 before_id bigint DEFAULT NULL)
RETURNS TABLE (id bigint, stage text, status pepsi.status, held boolean, received_at timestamptz,
               age_seconds double precision, retry_at timestamptz, mail_from text, rcpt_to text[],
               size bigint, last_error text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT w.id, w.stage, w.status, w.status = 'paused' AND w.timeout = 'infinity', w.received_at,
           extract(epoch FROM now() - w.received_at)::double precision,
           CASE WHEN w.timeout < 'infinity' THEN w.timeout END,
           w.mail_from, w.rcpt_to, length(w.headers) + 2 + length(b.body),
           coalesce(w.state ->> 'last_error', w.state ->> 'dispatch_error')
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE (queue_list.stage IS NULL OR w.stage = queue_list.stage)
      AND (queue_list.status IS NULL OR w.status = queue_list.status)
      AND (queue_list.before_id IS NULL OR w.id < queue_list.before_id)
      AND (queue_list.search IS NULL
           OR strpos(lower(w.mail_from), lower(queue_list.search)) > 0
           OR EXISTS (SELECT FROM unnest(w.rcpt_to) r WHERE strpos(lower(r), lower(queue_list.search)) > 0))
    ORDER BY w.id DESC
    LIMIT least(greatest(coalesce(max_rows, 100), 1), 1000)
$$;

CREATE FUNCTION pepsi.queue_message(message_id bigint)
RETURNS TABLE (id bigint, stage text, status pepsi.status, held boolean, received_at timestamptz,
               retry_at timestamptz, mail_from text, rcpt_to text[], sender_key text, state jsonb,
               headers bytea, body_size bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT w.id, w.stage, w.status, w.status = 'paused' AND w.timeout = 'infinity', w.received_at,
           CASE WHEN w.timeout < 'infinity' THEN w.timeout END, w.mail_from, w.rcpt_to, w.sender_key,
           w.state, w.headers, length(b.body)
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE w.id = message_id
$$;

-- pepsi-httpd's section holds its listening address, certificate and
-- database connection: like the listeners, it comes from the file only.
ALTER TABLE pepsi.config_override ADD CONSTRAINT config_override_httpd_file_only
    CHECK (section <> 'httpd');

-- The credential writers run as the owner, so that no role but
-- pepsi_httpd holds a privilege on the credential tables.  (config_set and
-- config_unset run as the owner since the block above, so pepsi_httpd may
-- call them without writing config_override itself.)
INSERT INTO pepsi.grant_definer VALUES ('queue_list'), ('queue_message'), ('queue_gauges'),
    ('queue_gauge_refresh'), ('api_token_create'), ('api_token_revoke'), ('admin_account_set')
    ON CONFLICT DO NOTHING;
INSERT INTO pepsi.grant_owner VALUES ('queue_gauge'), ('queue_gauge_refresh') ON CONFLICT DO NOTHING;
-- pepsi_httpd reads what pepsi_monitor reads (and reaches the schema
-- through it: see grant_membership), and more.
INSERT INTO pepsi.grant_membership VALUES ('pepsi_httpd', 'pepsi_monitor');
INSERT INTO pepsi.grant_rule VALUES
    ('pepsi_httpd', 'table', 'admin_account', '{SELECT}'),
    ('pepsi_httpd', 'table', 'admin_session', '{SELECT,INSERT,DELETE}'),
    ('pepsi_httpd', 'table', 'api_token', '{SELECT}'),
    ('pepsi_httpd', 'table', 'dns_address', '{SELECT}'),
    ('pepsi_httpd', 'function', 'queue_list', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_message', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_retry', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_hold', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_release', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_delete', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'queue_bounce', '{EXECUTE}'),
    ('pepsi_httpd', 'table', 'config_override', '{SELECT}'),
    ('pepsi_httpd', 'table', 'config_option', '{SELECT}'),
    ('pepsi_httpd', 'function', 'config_get', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_validate', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_scope', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_domain_problem', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_set', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'config_unset', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'event_principal', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'queue_gauges', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_gauges', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_list', '{EXECUTE}'),
    ('pepsi_config', 'function', 'queue_message', '{EXECUTE}'),
    ('pepsi_config', 'function', 'api_token_create', '{EXECUTE}'),
    ('pepsi_config', 'function', 'api_token_revoke', '{EXECUTE}'),
    ('pepsi_config', 'function', 'admin_account_set', '{EXECUTE}')
    ON CONFLICT DO NOTHING;
SELECT pepsi.grant_apply();

-- end of pepsi-httpd

-- ===========================================================================
-- Message authentication at ingress (iprev, SPF, DKIM, DMARC, ARC) and the
-- resolver it asks.  Where DNS answers come from (DNS_FORWARDER) and which
-- DNSSEC answers are trusted (DNS_TRUST_ANCHOR) decide every verdict: they
-- are read from the file only (common/config/config.c refuses them too).
-- ===========================================================================

ALTER TABLE pepsi.config_override ADD CONSTRAINT config_override_dns_file_only
    CHECK (NOT (section = 'pepsi' AND option IN ('DNS_FORWARDER', 'DNS_TRUST_ANCHOR'))) NOT VALID;

-- end of message authentication

-- ===========================================================================
-- Dispatcher: worker crashes retry (extension/src/crash.c)
--
-- A row whose worker died is paused and retried, and isolated after
-- CRASH_LIMIT attempts.  workqueue_crashed runs as the owner: it writes
-- the crash_limit entry of pepsi.event_log, which no group role inserts
-- into directly (the entry records the calling role all the same).
-- ===========================================================================

-- How many rows the dispatcher paused for a retry after their worker died
-- (crash, MAX_RUNTIME, broken protocol), and how many it isolated after
-- CRASH_LIMIT such attempts; pepsi-status raises an alert for the latter.
ALTER TABLE pepsi.dispatch_stats
    ADD COLUMN crash_retries bigint NOT NULL DEFAULT 0,
    ADD COLUMN crash_failures bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_crash_failure_at timestamptz;

-- The dispatcher's write when a worker died on a row: paused for a retry
-- after retry_seconds, doubled per attempt, with the attempt counted in
-- state.crash; at crash_limit attempts at the same stage, final_status
-- (failed, or timeout for MAX_RUNTIME) with the reason in
-- state.dispatch_error, an event_log entry and dispatch_stats counted.
-- Returns the new status, or NULL if the row is no longer running at
-- expected_stage (the worker committed it before it died).
CREATE FUNCTION pepsi.workqueue_crashed(
    id bigint, expected_stage text, reason text, crash_limit integer,
    retry_seconds double precision, final_status text DEFAULT 'failed')
RETURNS text AS 'MODULE_PATHNAME', 'workqueue_crashed' LANGUAGE C CALLED ON NULL INPUT VOLATILE;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'workqueue_crashed', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('workqueue_crashed');

SELECT pepsi.grant_apply();

-- end of dispatcher: worker crashes retry

-- ===========================================================================
-- Dispatcher: no queue without maintenance (extension/src/maint.c)
--
-- Without shared_preload_libraries no maintenance worker runs until someone
-- calls start_maintenance(), and one started so is gone after a restart:
-- paused rows would wait for ever.  pepsi-dispatch asks who serves the
-- database, starts a worker when its role may, and otherwise requeues the
-- due rows itself (workqueue_requeue_due), with a warning for the DBA.
-- ===========================================================================

-- The pid of the maintenance worker serving this database, or 0.
CREATE FUNCTION pepsi.maintenance_pid()
RETURNS integer AS 'MODULE_PATHNAME', 'maintenance_pid' LANGUAGE C STRICT VOLATILE;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'maintenance_pid', '{EXECUTE}'),
    ('pepsi_monitor', 'function', 'maintenance_pid', '{EXECUTE}');

SELECT pepsi.grant_apply();

-- end of dispatcher: no queue without maintenance

-- ===========================================================================
-- Cheaper row transitions: clone_token indexed only where it is set
--
-- Every change of a row's status (the claim, each commit) is a non-HOT
-- update, since status is in the predicates of the pending and paused
-- indexes, so it inserts into every full index of the table.  0.1's UNIQUE
-- (clone_token) indexed every row, nearly all of them NULL: one btree of
-- duplicates grown on each transition, for rows that can never conflict.
-- Only clones carry a token; the unique index keeps only them (same name,
-- so the duplicate-key error reads as before).  ON CONFLICT (clone_token)
-- names the predicate to infer it, which 0.1's full index satisfies too.
-- ===========================================================================

ALTER TABLE pepsi.workqueue DROP CONSTRAINT workqueue_clone_token_key;
CREATE UNIQUE INDEX workqueue_clone_token_key ON pepsi.workqueue (clone_token)
    WHERE clone_token IS NOT NULL;

-- end of cheaper row transitions

-- ===========================================================================
-- The mail log's history of one message
--
-- With [pepsi] MAIL_LOG = yes a delivery stage writes a pepsi.mail_log row
-- per attempt in the statement that commits it (common/delivery/maillog.c);
-- pepsi-queue log <id> reads a row's history by its id.
-- ===========================================================================

CREATE INDEX mail_log_workqueue_id ON pepsi.mail_log (workqueue_id);

-- end of the mail log's history of one message

-- ===========================================================================
-- Deliveries by status
--
-- Each delivery attempt's status= (sent, deferred, bounced, expired) comes
-- back on the worker's status line; pepsi-dispatch counts them per stage
-- and flushes them with the other statistics, so no worker writes this
-- table.  /metrics reads them as pepsi_deliveries_total.
-- ===========================================================================

ALTER TABLE pepsi.stage_stats
    ADD COLUMN deliveries_sent bigint NOT NULL DEFAULT 0,
    ADD COLUMN deliveries_deferred bigint NOT NULL DEFAULT 0,
    ADD COLUMN deliveries_bounced bigint NOT NULL DEFAULT 0,
    ADD COLUMN deliveries_expired bigint NOT NULL DEFAULT 0;

-- end of deliveries by status

-- ===========================================================================
-- Option schema: schema/options.def is the one list of options
--
-- 0.1 kept the options twice: in common/config/config.c and, copied by hand, in
-- the rows of pepsi.config_option.  Both now come from schema/options.def:
-- the programs compile it into their table (schema/options.c), and this
-- module compiles the same file and the same value checks
-- (extension/src/config_schema.c).  pepsi.config_option becomes a view of
-- that table, and pepsi.config_validate checks a value with the programs'
-- own code (pepsi.config_value_problem) and a scope against the option's
-- (file, global, domain or address), so the database and the programs
-- cannot disagree.  A stage program's own options carry its name in the
-- new column program.
-- ===========================================================================

CREATE FUNCTION pepsi.config_option_schema(
    OUT section text, OUT program text, OUT option text, OUT kind text, OUT scope text,
    OUT default_value text, OUT min_value bigint, OUT max_value bigint, OUT choices text,
    OUT description text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'config_option_schema'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION pepsi.config_value_problem(section text, option text, value text,
                                           program text DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'config_value_problem'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

DROP TABLE pepsi.config_option;
CREATE VIEW pepsi.config_option AS
    SELECT s.section, s.option, s.kind, s.min_value, s.max_value,
           s.scope IN ('file', 'global') AS global_only, s.description,
           s.program, s.scope, s.default_value, s.choices
    FROM pepsi.config_option_schema() AS s;
COMMENT ON VIEW pepsi.config_option IS
    'Every option of pepsi.conf (schema/options.def): kind, range (ms for a duration, bytes for a size), default, and the most specific scope it may be set at';

-- As in 0.1, with the option, its scope and its value checked against the
-- schema: a stage program's option is found by the section's PROGRAM
-- override when there is one, else by the one program that declares it.
CREATE OR REPLACE FUNCTION pepsi.config_validate(scope text, section text, option text,
                                                 value text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text;
    known pepsi.config_option;
    section_known boolean;
    section_overridable boolean;
    program_name text;
    options text;
    problem text;
BEGIN
    canonical := pepsi.config_scope(scope);

    IF section IS NULL THEN
        RAISE EXCEPTION 'section must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF section !~ '^[a-z][a-z0-9_-]*$' THEN
        RAISE EXCEPTION 'invalid section name "%"', section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A section name is lower case: a letter, then letters, digits, "_" or "-", as in "dispatch" or "stage-relay".',
                  HINT = CASE WHEN section ~ '^\[.*\]$'
                              THEN format('Give the name without its brackets: "%s".', btrim(section, '[]'))
                              WHEN lower(section) ~ '^[a-z][a-z0-9_-]*$'
                              THEN format('Section names are lower case: "%s".', lower(section))
                              ELSE 'The sections are those of pepsi.conf, named without their brackets.' END;
    END IF;
    SELECT count(*) > 0, coalesce(bool_or(o.scope <> 'file'), false)
    INTO section_known, section_overridable
    FROM pepsi.config_option o
    WHERE o.section = config_validate.section
       OR (o.section LIKE '%*' AND config_validate.section LIKE replace(o.section, '*', '%'));
    IF NOT section_known THEN
        SELECT string_agg(DISTINCT '[' || replace(o.section, '*', '<name>') || ']', ', ') INTO options
        FROM pepsi.config_option o WHERE o.scope <> 'file';
        RAISE EXCEPTION 'unknown section [%]', section
            USING ERRCODE = 'undefined_object',
                  DETAIL = format('The sections an override may name are %s.', options);
    END IF;
    IF NOT section_overridable THEN
        RAISE EXCEPTION 'section [%] cannot be overridden', section
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = CASE WHEN section = 'database'
                                THEN 'It is read from pepsi.conf before any database connection exists, so an override could never take effect.'
                                WHEN section LIKE 'listener-%'
                                THEN 'Listener sections are read from pepsi.conf only, so that a compromised database cannot move a listening socket.'
                                ELSE 'Its options are read from pepsi.conf only, so that a compromised database cannot change them.' END,
                  HINT = 'Change it in pepsi.conf.';
    END IF;

    IF section LIKE '%-' THEN
        RAISE EXCEPTION 'invalid section name "%"', section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A section name does not end with "-": a stage section is "stage-" followed by the stage''s name.';
    END IF;

    IF option IS NULL THEN
        RAISE EXCEPTION 'option must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF section = 'ingress' AND option IN ('USER', 'GROUP', 'CREDENTIALS') THEN
        RAISE EXCEPTION 'option % of [ingress] cannot be overridden', option
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = 'It decides whom ingress runs as and whose passwords it trusts, which a compromised database must not change.',
                  HINT = 'Change it in pepsi.conf.';
    END IF;
    IF option !~ '^[A-Z][A-Z0-9_]*$' THEN
        RAISE EXCEPTION 'invalid option name "%"', option
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'An option name is upper case: a letter, then letters, digits or "_", as in "MAX_RUNTIME".',
                  HINT = CASE WHEN upper(option) ~ '^[A-Z][A-Z0-9_]*$'
                              THEN format('Option names are upper case: "%s".', upper(option))
                              ELSE 'The options are those of pepsi.conf, written as they are there.' END;
    END IF;

    SELECT * INTO known FROM pepsi.config_option o
    WHERE o.option = config_validate.option AND o.program IS NULL
      AND (o.section = config_validate.section
           OR (o.section LIKE '%*' AND config_validate.section LIKE replace(o.section, '*', '%')))
    ORDER BY o.section LIKE '%*'
    LIMIT 1;
    IF NOT FOUND THEN
        SELECT string_agg(o.option, ', ' ORDER BY o.option) INTO options
        FROM pepsi.config_option o WHERE o.section = config_validate.section;
        IF options IS NOT NULL THEN
            RAISE EXCEPTION 'section [%] has no option %', section, option
                USING ERRCODE = 'undefined_object',
                      DETAIL = format('The options of [%s] are %s.', section, options);
        END IF;
        -- A stage program's own option: that of the section's program when
        -- an override names it, else of the one program that has it.
        SELECT regexp_replace(c.value, '^.*/', '') INTO program_name FROM pepsi.config_override c
        WHERE c.scope = 'global' AND c.section = config_validate.section AND c.option = 'PROGRAM';
        SELECT * INTO known FROM pepsi.config_option o
        WHERE o.program IS NOT NULL AND o.option = config_validate.option
          AND (program_name IS NULL OR o.program = program_name)
        ORDER BY o.program
        LIMIT 1;
        IF NOT FOUND AND program_name IS NOT NULL
           AND EXISTS (SELECT FROM pepsi.config_option o WHERE o.program = program_name) THEN
            SELECT string_agg(o.option, ', ' ORDER BY o.option) INTO options
            FROM pepsi.config_option o WHERE o.program = program_name OR o.section = 'stage-*' AND o.program IS NULL;
            RAISE EXCEPTION 'section [%] has no option %', section, option
                USING ERRCODE = 'undefined_object',
                      DETAIL = format('Its PROGRAM is %s, whose options are %s.', program_name, options);
        END IF;
        IF NOT FOUND THEN
            -- a third-party program's option: its form only, or a stage it names
            known := NULL;
            IF option LIKE '%\_STAGE' THEN
                known.kind := 'stage';
            END IF;
        END IF;
    END IF;
    IF known.scope = 'file' THEN
        RAISE EXCEPTION 'option % of [%] cannot be overridden', option, section
            USING ERRCODE = 'cant_change_runtime_param',
                  DETAIL = CASE WHEN known.kind = 'path' THEN 'It names a path a program reads. '
                                WHEN option IN ('SMARTHOST', 'TLS', 'TLS_NAME', 'AUTH_USER')
                                THEN 'It decides where mail is sent or how the next hop is authenticated. '
                                ELSE '' END
                           || 'It is read from pepsi.conf only, so that a compromised database cannot change it.',
                  HINT = 'Change it in pepsi.conf.';
    END IF;
    IF known.scope = 'global' AND canonical <> 'global' THEN
        RAISE EXCEPTION 'option % of [%] takes the global scope only', option, section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It is read once by a process, not per message, so an override for a domain or an address could never apply.',
                  HINT = 'Use the scope "global".';
    END IF;
    IF known.scope = 'domain' AND canonical LIKE 'address:%' THEN
        RAISE EXCEPTION 'option % of [%] takes the global and domain scopes only', option, section
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It is read per message with the domain of its recipients, never an address.',
                  HINT = 'Use the scope "global" or "domain:<domain>".';
    END IF;

    IF value IS NULL THEN
        RETURN canonical;
    END IF;
    IF value ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'value of % must be one line of text', option
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It contains a line break or another control character.';
    END IF;
    IF known.option IS NOT NULL THEN
        problem := pepsi.config_value_problem(section, option, value, known.program);
    ELSIF known.kind = 'stage' AND value !~ '^[a-z0-9_-]+$' THEN
        problem := format('%s names a stage, by its [stage-<name>] section: lower-case letters, digits, "_" and "-".', option);
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid value "%" for % in [%]', value, option, section
            USING ERRCODE = 'invalid_parameter_value', DETAIL = problem;
    END IF;
    RETURN canonical;
END
$$;

UPDATE pepsi.grant_rule SET object_kind = 'view' WHERE object_name = 'config_option';
-- Whoever reads the view calls the function behind it.
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges)
SELECT g.role, 'function', f.name, '{EXECUTE}'
FROM pepsi.grant_rule g
CROSS JOIN (VALUES ('config_option_schema'), ('config_value_problem')) AS f (name)
WHERE g.object_name = 'config_option'
ON CONFLICT DO NOTHING;

SELECT pepsi.grant_apply();

-- end of option schema

-- ===========================================================================
-- Ingress in the statistics and the mail log
--
-- Each pepsi-ingress reports its open sessions and its counters every few
-- seconds through ingress_report (one row per running instance, removed
-- when it stops), so /metrics can show ingress sessions beside the queue.
-- With [pepsi] MAIL_LOG = yes, ingress admits through
-- workqueue_add_logged, which writes the "received" row of pepsi.mail_log
-- in the statement that stores the message: the admission is in the log
-- exactly when it is in the queue.  Both run as the owner, so the
-- admission role still writes no table directly.
-- ===========================================================================

CREATE TABLE pepsi.ingress_stats (
    instance        text PRIMARY KEY,
    sessions        integer NOT NULL DEFAULT 0,
    sessions_total  bigint NOT NULL DEFAULT 0,
    messages        bigint NOT NULL DEFAULT 0,
    started_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.ingress_stats IS
    'One row per running pepsi-ingress (host:pid), refreshed every few seconds by pepsi.ingress_report';

-- The instance's row as of now; with stopping, the row goes.  Rows of an
-- instance that died without saying so are past their updated_at: readers
-- ignore rows older than a minute, and each report removes those a day old.
CREATE FUNCTION pepsi.ingress_report(
    instance text, sessions integer, sessions_total bigint, messages bigint,
    stopping boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF instance IS NULL OR instance !~ '^[[:print:]]{1,255}$' THEN
        RAISE EXCEPTION 'instance must be 1 to 255 printable characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF sessions < 0 OR sessions_total < 0 OR messages < 0 THEN
        RAISE EXCEPTION 'ingress counters cannot be negative'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF stopping THEN
        DELETE FROM pepsi.ingress_stats s WHERE s.instance = ingress_report.instance;
        RETURN;
    END IF;
    INSERT INTO pepsi.ingress_stats AS s (instance, sessions, sessions_total, messages)
    VALUES (ingress_report.instance, ingress_report.sessions, ingress_report.sessions_total,
            ingress_report.messages)
    ON CONFLICT ON CONSTRAINT ingress_stats_pkey DO UPDATE
        SET sessions = EXCLUDED.sessions, sessions_total = EXCLUDED.sessions_total,
            messages = EXCLUDED.messages, updated_at = now();
    DELETE FROM pepsi.ingress_stats s WHERE s.updated_at < now() - interval '1 day';
END
$$;

-- workqueue_add, and the mail log's "received" row (detail: what the
-- ingress log line says) in the same statement.
CREATE FUNCTION pepsi.workqueue_add_logged(
    mail_from text, rcpt_to text[], headers bytea, body bytea,
    state jsonb, client_address inet, auth_account text, stage text, log_detail jsonb)
RETURNS bigint AS 'MODULE_PATHNAME', 'workqueue_add_logged' LANGUAGE C CALLED ON NULL INPUT;

INSERT INTO pepsi.grant_definer (name) VALUES ('ingress_report'), ('workqueue_add_logged');
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'ingress_report', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'workqueue_add_logged', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'ingress_stats', '{SELECT}'),
    ('pepsi_config', 'table', 'ingress_stats', '{SELECT}');
SELECT pepsi.grant_apply();

-- end of ingress in the statistics and the mail log

-- ===========================================================================
-- Relay to the internet: the dns_address cache and per-destination
-- scheduling (stages/relay-to-internet)
--
-- pepsi.dns_address holds the addresses of MX hosts with their TTL and
-- connect health; every relay worker reads it before connecting and
-- reports what it saw, so one worker's failure steers the others.
-- pepsi.destination holds what belongs to a destination (a recipient
-- domain) rather than to each message: the operator's limits, its
-- consecutive connection failures and the backoff they started, and the
-- concurrency window a refusing destination narrowed.  A worker holds one
-- of the destination's concurrency slots (a session advisory lock, so a
-- worker that dies frees it) while it delivers.
-- ===========================================================================

ALTER TABLE pepsi.dns_address ADD COLUMN next_retry timestamptz;
COMMENT ON TABLE pepsi.dns_address IS
    'MX-host addresses with their DNS expiry and connect health, maintained by pepsi-stage-relay-to-internet';

CREATE TABLE pepsi.destination (
    domain              text PRIMARY KEY CHECK (domain = lower(domain) AND domain <> ''),
    concurrency_limit   integer CHECK (concurrency_limit BETWEEN 1 AND 10000),
    messages_per_minute integer CHECK (messages_per_minute BETWEEN 1 AND 100000000),
    failures            integer NOT NULL DEFAULT 0,
    backoff_until       timestamptz,
    last_error          text,
    last_success        timestamptz,
    window_limit        integer,
    next_turn           timestamptz,
    service_seconds     double precision,
    rate_tokens         double precision,
    rate_updated        timestamptz
);
COMMENT ON TABLE pepsi.destination IS
    'Per-destination limits (set with pepsi.destination_set_limits) and health, kept by pepsi-stage-relay-to-internet';

-- The advisory-lock key of a destination's concurrency slot (the bigint
-- form, which nothing else in Pepsi uses).
CREATE FUNCTION pepsi.destination_slot_key(domain text, slot integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (hashtext(lower(domain))::bigint << 32) | slot::bigint
$$;

-- The addresses of these MX hosts not past their TTL, with their health
-- (retry_in: seconds before a failed address is tried again, 0 if now).
CREATE FUNCTION pepsi.dns_address_current(hosts text[])
RETURNS TABLE (host text, address text, failures integer, retry_in double precision)
LANGUAGE sql STABLE STRICT AS $$
    SELECT a.host, host(a.address), a.failures,
           greatest(0, coalesce(extract(epoch FROM a.next_retry - now()), 0))::float8
    FROM pepsi.dns_address a
    WHERE a.host = ANY (hosts) AND a.expires_at > now()
    ORDER BY a.host, a.failures, a.address
$$;

-- A host's addresses as the DNS just gave them, valid for ttl_seconds:
-- addresses it no longer has go, the health of those it kept stays.
CREATE FUNCTION pepsi.dns_address_store(host text, addresses inet[], ttl_seconds integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF host IS NULL OR host = '' OR addresses IS NULL THEN
        RAISE EXCEPTION 'dns_address_store needs a host and its addresses'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    DELETE FROM pepsi.dns_address a
    WHERE a.host = dns_address_store.host AND a.address <> ALL (addresses);
    INSERT INTO pepsi.dns_address AS a (host, address, expires_at)
    SELECT dns_address_store.host, x, now() + make_interval(secs => greatest(coalesce(ttl_seconds, 0), 0))
    FROM unnest(addresses) AS x
    ON CONFLICT ON CONSTRAINT dns_address_pkey DO UPDATE SET expires_at = EXCLUDED.expires_at;
END
$$;

-- May a worker deliver to domain now?  A slot (hold it until
-- destination_end), or the seconds to wait and why: the destination is
-- backing off, or at its concurrency or rate limit.
--
-- One call is all a healthy delivery asks of the database besides its
-- row, so it also answers what the worker would otherwise ask apart:
-- contended (the destination has more takers than connections), the
-- current addresses of its MX hosts (hosts) as dns_address_current gives
-- them, as a jsonb array of {host, address, failures, retry_in}, and the
-- domain's cached MTA-STS policy (sts_policy_id, sts_policy).  And it ends
-- the worker's previous delivery, which reached its destination and kept
-- its slot (previous_*, as destination_end's 'connected' takes them):
-- its slot is freed first, so that to the same domain this delivery
-- takes it again and the session that holds the connection carries it.
CREATE FUNCTION pepsi.destination_begin(domain text, default_concurrency integer,
    hosts text[] DEFAULT NULL, previous_domain text DEFAULT NULL, previous_slot integer DEFAULT NULL,
    previous_host text DEFAULT NULL, previous_address inet DEFAULT NULL,
    previous_seconds double precision DEFAULT NULL,
    slow_seconds double precision DEFAULT NULL, slow_limit integer DEFAULT NULL,
    handoff_seconds double precision DEFAULT NULL, stage text DEFAULT NULL,
    OUT slot integer, OUT wait_seconds double precision, OUT reason text,
    OUT contended boolean, OUT addresses jsonb, OUT sts_policy_id text, OUT sts_policy text)
LANGUAGE plpgsql AS $$
DECLARE
    d       pepsi.destination;
    lim     integer;
    tokens  double precision;
    carried integer;
    slow    boolean;
    waiter  integer;
    saved   text;
BEGIN
    IF domain IS NULL OR domain = '' OR coalesce(default_concurrency, 0) < 1 THEN
        RAISE EXCEPTION 'destination_begin needs a domain and a concurrency of at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF slow_limit IS NOT NULL AND slow_limit < 1 THEN
        RAISE EXCEPTION 'slow_limit must be at least 1, not %', slow_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    domain := lower(domain);
    IF previous_domain IS NOT NULL THEN
        -- To the same domain the slot carries over (recorded, not freed);
        -- to another it is freed first.
        IF lower(previous_domain) = domain AND previous_slot IS NOT NULL THEN
            carried := previous_slot;
        END IF;
        -- destination_end's 'connected' writes only when its destination
        -- or address has news to record (at most once a minute when
        -- healthy): otherwise only the slot is freed, here, sparing the
        -- call its updates that would find nothing.
        IF EXISTS (SELECT 1 FROM pepsi.destination u
                   WHERE u.domain = lower(previous_domain)
                     AND (u.failures > 0 OR u.window_limit IS NOT NULL
                          OR u.next_turn > now() - interval '1 minute'
                          OR u.last_success IS NULL OR u.last_success < now() - interval '1 minute'))
           OR EXISTS (SELECT 1 FROM pepsi.dns_address b
                      WHERE b.host = previous_host AND b.address = previous_address
                        AND (b.failures > 0 OR b.last_success IS NULL
                             OR b.last_success < now() - interval '1 minute')) THEN
            PERFORM pepsi.destination_end(previous_domain, CASE WHEN carried IS NULL THEN previous_slot END,
                                          'connected', NULL, previous_host, previous_address, NULL, NULL,
                                          1, 1, 1, previous_seconds);
        ELSIF carried IS NULL AND previous_slot IS NOT NULL THEN
            PERFORM pg_advisory_unlock(pepsi.destination_slot_key(previous_domain, previous_slot));
        END IF;
    END IF;
    IF hosts IS NOT NULL THEN
        -- (dns_address_current's rows, written out: a plan PL/pgSQL keeps.)
        SELECT jsonb_agg(jsonb_build_object('host', a.host, 'address', host(a.address),
                   'failures', a.failures,
                   'retry_in', greatest(0, coalesce(extract(epoch FROM a.next_retry - now()), 0))::float8))
        INTO addresses FROM pepsi.dns_address a
        WHERE a.host = ANY (hosts) AND a.expires_at > now();
        -- (mta_sts_policy_get's row, written out likewise.)
        SELECT p.policy_id, p.policy INTO sts_policy_id, sts_policy
        FROM pepsi.mta_sts_policy p
        WHERE p.domain = destination_begin.domain AND p.expires_at > now();
    END IF;
    SELECT * INTO d FROM pepsi.destination t WHERE t.domain = destination_begin.domain;
    contended := FOUND AND coalesce(d.window_limit IS NOT NULL OR d.next_turn > now() - interval '10 seconds', false);
    IF FOUND AND d.backoff_until > now() THEN
        IF carried IS NOT NULL THEN
            PERFORM pg_advisory_unlock(pepsi.destination_slot_key(domain, carried));
        END IF;
        wait_seconds := extract(epoch FROM d.backoff_until - now());
        reason := format('%s is backing off after %s failed connection attempts (%s)', domain,
                         d.failures, coalesce(d.last_error, 'no connection'));
        RETURN;
    END IF;
    lim := least(coalesce(d.concurrency_limit, default_concurrency), coalesce(d.window_limit, 2147483647));
    slow := slow_seconds IS NOT NULL AND coalesce(d.service_seconds >= slow_seconds, false);
    IF slow AND slow_limit IS NOT NULL AND slow_limit < lim THEN
        -- Capped only while other mail waits: another destination holds a
        -- slot or a waiter ticket (the bigint advisory keys), or among the
        -- first rows of the stage not yet done is one for another domain.
        IF EXISTS (SELECT 1 FROM pg_locks l
                   WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
                     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND l.classid <> ((pepsi.destination_slot_key(domain, 0) >> 32) & 4294967295)::oid
                     AND l.classid <> ((pepsi.destination_waiter_key(domain, 0) >> 32) & 4294967295)::oid)
           OR EXISTS (SELECT 1 FROM (SELECT w.rcpt_to[1] AS rcpt FROM pepsi.workqueue w
                                     WHERE w.stage = destination_begin.stage AND w.index_status = 'pending'
                                       AND w.status = 'pending'
                                     LIMIT 64) p
                      WHERE lower(split_part(p.rcpt, '@', 2)) <> domain)
           OR EXISTS (SELECT 1 FROM (SELECT w.rcpt_to[1] AS rcpt FROM pepsi.workqueue w
                                     WHERE w.stage = destination_begin.stage AND w.index_status = 'pending'
                                       AND w.status = 'running'
                                     LIMIT 64) r
                      WHERE lower(split_part(r.rcpt, '@', 2)) <> domain) THEN
            lim := slow_limit;
        END IF;
    END IF;
    IF carried IS NOT NULL AND carried < lim THEN
        slot := carried;
    ELSE
        IF carried IS NOT NULL THEN
            -- The destination's limit came down below it.
            PERFORM pg_advisory_unlock(pepsi.destination_slot_key(domain, carried));
        END IF;
        FOR i IN 0 .. lim - 1 LOOP
            IF pg_try_advisory_lock(pepsi.destination_slot_key(domain, i)) THEN
                slot := i;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF slot IS NULL THEN
        -- A turn in the destination's virtual queue, spaced by how long a
        -- delivery there takes per slot: the messages waiting for a busy
        -- destination come back about when a slot frees, not all at once.
        INSERT INTO pepsi.destination AS t (domain, next_turn)
        VALUES (domain, now() + interval '1 second')
        ON CONFLICT ON CONSTRAINT destination_pkey DO UPDATE
        SET next_turn = greatest(t.next_turn, now())
                        + make_interval(secs => least(coalesce(t.service_seconds, 1), 60) / lim)
        RETURNING least(extract(epoch FROM t.next_turn - now()), 300) INTO wait_seconds;
        IF coalesce(handoff_seconds, 0) > 0 AND wait_seconds <= handoff_seconds AND NOT slow THEN
            -- Its turn is near: wait here for slot k, holding waiter
            -- ticket k (a key of its own, apart from the slots' count).
            FOR k IN 0 .. lim - 1 LOOP
                IF pg_try_advisory_lock(pepsi.destination_waiter_key(domain, k)) THEN
                    waiter := k;
                    EXIT;
                END IF;
            END LOOP;
            IF waiter IS NOT NULL THEN
                saved := current_setting('lock_timeout');
                BEGIN
                    PERFORM set_config('lock_timeout', ceil(handoff_seconds * 1000)::bigint || 'ms', true);
                    PERFORM pg_advisory_lock(pepsi.destination_slot_key(domain, waiter));
                    slot := waiter;
                EXCEPTION WHEN lock_not_available THEN
                    NULL;
                END;
                PERFORM set_config('lock_timeout', saved, true);
                PERFORM pg_advisory_unlock(pepsi.destination_waiter_key(domain, waiter));
            END IF;
        END IF;
        IF slot IS NULL THEN
            reason := format('%s is at its concurrency limit of %s', domain, lim);
            contended := true;
            RETURN;
        END IF;
        wait_seconds := NULL;
        contended := true;
    END IF;
    IF d.messages_per_minute IS NOT NULL THEN
        -- A token bucket holding a second's worth (at least one message).
        SELECT least(greatest(t.messages_per_minute / 60.0, 1),
                     coalesce(t.rate_tokens, 1)
                     + extract(epoch FROM now() - coalesce(t.rate_updated, now())) * t.messages_per_minute / 60.0)
        INTO tokens
        FROM pepsi.destination t WHERE t.domain = destination_begin.domain FOR UPDATE;
        IF tokens < 1 THEN
            UPDATE pepsi.destination t SET rate_tokens = tokens, rate_updated = now()
            WHERE t.domain = destination_begin.domain;
            PERFORM pg_advisory_unlock(pepsi.destination_slot_key(domain, slot));
            slot := NULL;
            wait_seconds := (1 - tokens) * 60.0 / d.messages_per_minute;
            reason := format('%s is at its rate limit of %s messages a minute', domain, d.messages_per_minute);
            RETURN;
        END IF;
        UPDATE pepsi.destination t SET rate_tokens = tokens - 1, rate_updated = now()
        WHERE t.domain = destination_begin.domain;
    END IF;
END
$$;

-- The end of a delivery to domain: the slot is freed and what was seen
-- recorded.  outcome: 'connected' (a host took the session), 'unreachable'
-- (no address of any MX could be reached: the destination's consecutive
-- failures grow, and from backoff_after on it backs off as a whole,
-- backoff_base doubling up to backoff_max seconds), 'busy' (refused while
-- other workers deliver to it: its concurrency window narrows to those).
-- failed_hosts/failed_addresses are the addresses that did not answer,
-- ok_host/ok_address the one that did; seconds, how long the delivery
-- took (kept as the pace of a destination that has a queue of waiters).
-- Returns whether the destination is contended.
CREATE FUNCTION pepsi.destination_end(domain text, slot integer, outcome text, error text,
    ok_host text, ok_address inet, failed_hosts text[], failed_addresses inet[],
    backoff_after integer, backoff_base double precision, backoff_max double precision,
    seconds double precision DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    active integer;
BEGIN
    IF domain IS NULL OR outcome IS NULL OR outcome NOT IN ('connected', 'unreachable', 'busy') THEN
        RAISE EXCEPTION 'destination_end needs a domain and an outcome of connected, unreachable or busy'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    domain := lower(domain);
    IF slot IS NOT NULL THEN
        PERFORM pg_advisory_unlock(pepsi.destination_slot_key(domain, slot));
    END IF;
    IF cardinality(failed_addresses) > 0 THEN
        UPDATE pepsi.dns_address a
        SET failures = a.failures + 1, last_failure = now(),
            next_retry = now() + make_interval(secs => least(60 * 2 ^ least(a.failures, 10), 3600))
        FROM unnest(failed_hosts, failed_addresses) AS f (host, address)
        WHERE a.host = f.host AND a.address = f.address;
    END IF;
    IF ok_address IS NOT NULL THEN
        -- Skipped while another worker is writing the same news: every
        -- worker that reaches the host may be here at once, and none
        -- should wait for another's commit to say it again.
        UPDATE pepsi.dns_address a
        SET failures = 0, next_retry = NULL, last_success = now()
        WHERE (a.host, a.address) IN (
            SELECT b.host, b.address FROM pepsi.dns_address b
            WHERE b.host = ok_host AND b.address = ok_address
              AND (b.failures > 0 OR b.last_success IS NULL OR b.last_success < now() - interval '1 minute')
            FOR UPDATE SKIP LOCKED);
    END IF;
    IF outcome = 'connected' THEN
        -- Written only when there is something to clear or widen, so a
        -- healthy destination costs no write per message; and not while
        -- another worker writes it (its news is the same).
        UPDATE pepsi.destination t
        SET failures = 0, backoff_until = NULL, last_success = now(),
            service_seconds = CASE WHEN seconds IS NULL THEN t.service_seconds
                                   ELSE coalesce(0.8 * t.service_seconds + 0.2 * seconds, seconds) END,
            window_limit = CASE WHEN t.window_limit IS NULL THEN NULL
                                WHEN random() * t.window_limit * 4 >= 1 THEN t.window_limit
                                ELSE t.window_limit + 1 END
        WHERE t.domain IN (
            SELECT u.domain FROM pepsi.destination u
            WHERE u.domain = destination_end.domain
              AND (u.failures > 0 OR u.window_limit IS NOT NULL
                   OR u.next_turn > now() - interval '1 minute'
                   OR u.last_success IS NULL OR u.last_success < now() - interval '1 minute')
            FOR UPDATE SKIP LOCKED);
    ELSIF outcome = 'busy' THEN
        SELECT count(*) INTO active FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = ((pepsi.destination_slot_key(domain, 0) >> 32) & 4294967295)::oid;
        INSERT INTO pepsi.destination AS t (domain, window_limit, last_error)
        VALUES (domain, greatest(active, 1), error)
        ON CONFLICT ON CONSTRAINT destination_pkey DO UPDATE
        SET window_limit = greatest(least(coalesce(t.window_limit, EXCLUDED.window_limit), EXCLUDED.window_limit), 1),
            last_error = EXCLUDED.last_error;
    ELSE
        INSERT INTO pepsi.destination AS t (domain, failures, last_error, backoff_until)
        VALUES (domain, 1, error,
                CASE WHEN backoff_after <= 1
                     THEN now() + make_interval(secs => least(backoff_base, backoff_max) * (0.9 + 0.2 * random())) END)
        ON CONFLICT ON CONSTRAINT destination_pkey DO UPDATE
        SET failures = t.failures + 1, last_error = EXCLUDED.last_error,
            backoff_until = CASE WHEN t.failures + 1 >= backoff_after
                THEN now() + make_interval(secs => least(backoff_base * 2 ^ least(t.failures + 1 - backoff_after, 20),
                                                         backoff_max) * (0.9 + 0.2 * random()))
                END;
    END IF;
    -- Is the destination contended (its window narrowed, or messages
    -- queued for a turn)?  Then the worker does not keep its session to
    -- it open idle, holding a connection the destination counts.
    RETURN EXISTS (SELECT 1 FROM pepsi.destination t
                   WHERE t.domain = destination_end.domain
                     AND (t.window_limit IS NOT NULL OR t.next_turn > now() - interval '10 seconds'));
END
$$;

-- The operator's limits for a destination (NULL: the default; both NULL
-- drops the row's limits).  Audited in pepsi.event_log.
CREATE FUNCTION pepsi.destination_set_limits(domain text, concurrency_limit integer,
    messages_per_minute integer)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF domain IS NULL OR domain = '' OR domain <> lower(domain) OR domain ~ '[[:space:][:cntrl:]@]' THEN
        RAISE EXCEPTION 'invalid destination domain "%"', domain
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give the recipient domain in lower case, in its A-label (xn--) form if it is an IDN.';
    END IF;
    IF concurrency_limit IS NOT NULL AND concurrency_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'concurrency_limit must be between 1 and 10000, not %', concurrency_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF messages_per_minute IS NOT NULL AND messages_per_minute NOT BETWEEN 1 AND 100000000 THEN
        RAISE EXCEPTION 'messages_per_minute must be between 1 and 100000000, not %', messages_per_minute
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL removes the rate limit.';
    END IF;
    INSERT INTO pepsi.destination AS t (domain, concurrency_limit, messages_per_minute)
    VALUES (domain, concurrency_limit, messages_per_minute)
    ON CONFLICT ON CONSTRAINT destination_pkey DO UPDATE
    SET concurrency_limit = EXCLUDED.concurrency_limit,
        messages_per_minute = EXCLUDED.messages_per_minute,
        rate_tokens = NULL, rate_updated = NULL;
    INSERT INTO pepsi.event_log (action, detail)
    VALUES ('destination_set_limits', jsonb_build_object('domain', domain,
            'concurrency_limit', concurrency_limit, 'messages_per_minute', messages_per_minute));
END
$$;

-- An operator's way to end a destination's backoff at once (after fixing it).
CREATE FUNCTION pepsi.destination_reset(domain text)
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    found_it boolean;
BEGIN
    UPDATE pepsi.destination t SET failures = 0, backoff_until = NULL, window_limit = NULL
    WHERE t.domain = lower(destination_reset.domain);
    found_it := FOUND;
    INSERT INTO pepsi.event_log (action, detail)
    VALUES ('destination_reset', jsonb_build_object('domain', lower(domain)));
    RETURN found_it;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'table', 'destination', '{SELECT,INSERT,UPDATE,DELETE}'),
    ('pepsi_config', 'table', 'destination', '{SELECT}'),
    ('pepsi_monitor', 'table', 'destination', '{SELECT}'),
    ('pepsi_config', 'table', 'dns_address', '{SELECT}'),
    ('pepsi_monitor', 'table', 'dns_address', '{SELECT}'),
    ('pepsi_stage', 'function', 'destination_slot_key', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'dns_address_current', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'dns_address_store', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'destination_begin', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'destination_end', '{EXECUTE}'),
    ('pepsi_config', 'function', 'destination_set_limits', '{EXECUTE}'),
    ('pepsi_config', 'function', 'destination_reset', '{EXECUTE}')
ON CONFLICT DO NOTHING;
INSERT INTO pepsi.grant_definer (name) VALUES ('destination_set_limits'), ('destination_reset');

SELECT pepsi.grant_apply();

-- end of relay to the internet

-- ===========================================================================
-- Backscatter caps: one DSN per message and kind, DSNs per sender per hour
--
-- The delivery stages work on one recipient per row, so the recipients of
-- one message that fail together reach the bounce stage as separate rows.
-- pepsi.bounce_gather() lets the bounce stage answer them with one DSN:
-- the first row of a message whose siblings are still on their way waits
-- a short window as the group's leader; siblings that arrive meanwhile
-- wait behind it; when the leader runs again it takes every sibling
-- waiting at its stage for the same kind of report into its own state
-- (state.bounce_gathered) and deletes them, in one transaction, so a
-- crash loses no report.  A recipient that fails later (after a retry)
-- gets a DSN of its own, as RFC 3461 allows.  Siblings are the rows of
-- one admission: same sender, arrival time and body.
--
-- pepsi.dsn_rate_take() counts the DSNs sent to one address per clock
-- hour; past the limit the bounce stage drops the DSN, and each drop is
-- recorded in pepsi.event_log.
-- ===========================================================================

-- Returns {"action": "wait", "seconds": s, "bounce_gather": {...}} (pause
-- that long, merging bounce_gather into the state) or {"action": "report",
-- "gathered": [{"rcpt_to": [...], "bounce": {...}, "delivery": {...},
-- "dsn_rcpt": [...]}]}:
-- the siblings this row now answers for, besides its own recipients.
-- at_stage is the bounce stage running the row (the row may still be at
-- the delivery stage in the database when the bounce stage runs fused).
CREATE FUNCTION pepsi.bounce_gather(row_id bigint, at_stage text, window_seconds float8) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    me pepsi.workqueue;
    report_kind text;
    leader_until float8;
    now_epoch float8 := extract(epoch FROM clock_timestamp());
    gathered jsonb;
BEGIN
    SELECT * INTO me FROM pepsi.workqueue w WHERE w.id = row_id FOR UPDATE;
    IF NOT FOUND OR me.status <> 'running' THEN
        RAISE EXCEPTION 'row % is not running', row_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Only the stage that holds a row may gather its siblings.';
    END IF;
    IF window_seconds IS NULL OR window_seconds < 0 OR window_seconds > 3600 THEN
        RAISE EXCEPTION 'window_seconds must be between 0 and 3600'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    gathered := coalesce(me.state->'bounce_gathered', '[]');
    IF me.body_id IS NULL OR me.mail_from = '' THEN
        RETURN jsonb_build_object('action', 'report', 'gathered', gathered);
    END IF;
    report_kind := coalesce(me.state->'bounce'->>'kind', 'permanent');
    -- One decision at a time per message: two siblings never both lead.
    PERFORM pg_advisory_xact_lock(hashtextextended('pepsi.bounce_gather/' || me.body_id::text, 0));

    IF me.state->'bounce_gather' IS NULL AND window_seconds > 0 THEN
        SELECT max((w.state->'bounce_gather'->>'until')::float8) INTO leader_until
        FROM pepsi.workqueue w
        WHERE w.body_id = me.body_id AND w.id <> me.id
          AND w.mail_from = me.mail_from AND w.received_at = me.received_at
          AND coalesce(w.state->'bounce'->>'kind', 'permanent') = report_kind
          AND w.state->'bounce_gather'->>'role' = 'leader'
          AND w.status IN ('pending', 'paused', 'running');
        IF leader_until > now_epoch THEN
            me.state := me.state || jsonb_build_object('bounce_gather',
                jsonb_build_object('role', 'follower', 'until', leader_until + 1));
            UPDATE pepsi.workqueue w SET state = me.state WHERE w.id = me.id;
            RETURN jsonb_build_object('action', 'wait', 'seconds', leader_until + 1 - now_epoch,
                                      'bounce_gather', me.state->'bounce_gather');
        END IF;
        IF EXISTS (SELECT FROM pepsi.workqueue w
                   WHERE w.body_id = me.body_id AND w.id <> me.id
                     AND w.mail_from = me.mail_from AND w.received_at = me.received_at
                     AND w.status IN ('pending', 'running')
                     AND (w.stage <> at_stage OR w.state->'bounce_gather' IS NULL)) THEN
            me.state := me.state || jsonb_build_object('bounce_gather',
                jsonb_build_object('role', 'leader', 'until', now_epoch + window_seconds));
            UPDATE pepsi.workqueue w SET state = me.state WHERE w.id = me.id;
            RETURN jsonb_build_object('action', 'wait', 'seconds', window_seconds,
                                      'bounce_gather', me.state->'bounce_gather');
        END IF;
    END IF;

    WITH taken AS (
        DELETE FROM pepsi.workqueue w
        WHERE w.id IN (SELECT s.id FROM pepsi.workqueue s
                       WHERE s.body_id = me.body_id AND s.id <> me.id AND s.stage = at_stage
                         AND s.mail_from = me.mail_from AND s.received_at = me.received_at
                         AND coalesce(s.state->'bounce'->>'kind', 'permanent') = report_kind
                         AND s.status IN ('pending', 'paused')
                       ORDER BY s.id
                       FOR UPDATE SKIP LOCKED)
        RETURNING w.id, w.rcpt_to, w.state)
    SELECT gathered || coalesce(jsonb_agg(x.entry ORDER BY x.id), '[]')
    INTO gathered
    FROM (SELECT t.id, jsonb_build_object('rcpt_to', to_jsonb(t.rcpt_to),
                                          'bounce', coalesce(t.state->'bounce', '{}'),
                                          'delivery', t.state->'delivery',
                                          'dsn_rcpt', t.state->'dsn'->'rcpt') AS entry
          FROM taken t
          UNION ALL
          SELECT t.id, e.entry FROM taken t,
                 jsonb_array_elements(coalesce(t.state->'bounce_gathered', '[]')) AS e (entry)) x;
    IF gathered <> coalesce(me.state->'bounce_gathered', '[]') THEN
        UPDATE pepsi.workqueue w
        SET state = w.state || jsonb_build_object('bounce_gathered', gathered)
        WHERE w.id = me.id;
    END IF;
    RETURN jsonb_build_object('action', 'report', 'gathered', gathered);
END
$$;

CREATE TABLE pepsi.dsn_rate (
    sender  text PRIMARY KEY,
    hour    timestamptz NOT NULL,
    sent    integer NOT NULL
);
COMMENT ON TABLE pepsi.dsn_rate IS 'DSNs sent to each address in the current clock hour (pepsi.dsn_rate_take)';

-- Count one DSN to sender; false (and an event_log entry) past per_hour.
CREATE FUNCTION pepsi.dsn_rate_take(sender text, per_hour integer) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    hour_start timestamptz := date_trunc('hour', now());
    counted integer;
BEGIN
    IF sender IS NULL OR sender = '' OR per_hour IS NULL OR per_hour < 1 THEN
        RAISE EXCEPTION 'dsn_rate_take needs a sender and a limit of at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pepsi.dsn_rate AS r (sender, hour, sent)
    VALUES (lower(dsn_rate_take.sender), hour_start, 1)
    ON CONFLICT ON CONSTRAINT dsn_rate_pkey DO UPDATE
    SET hour = excluded.hour,
        sent = CASE WHEN r.hour = excluded.hour THEN r.sent + 1 ELSE 1 END
    RETURNING r.sent INTO counted;
    -- The table keeps one row per address that got a DSN this hour.
    IF random() < 0.01 THEN
        DELETE FROM pepsi.dsn_rate r WHERE r.hour < hour_start;
    END IF;
    IF counted > per_hour THEN
        PERFORM pepsi.event_log_write('dsn_rate_limited',
            jsonb_build_object('sender', lower(dsn_rate_take.sender), 'limit', per_hour,
                               'this_hour', counted));
        RETURN false;
    END IF;
    RETURN true;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'bounce_gather', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'dsn_rate_take', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'dsn_rate', '{SELECT}'),
    ('pepsi_config', 'table', 'dsn_rate', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('bounce_gather'), ('dsn_rate_take');

SELECT pepsi.grant_apply();

-- end of backscatter caps

-- ===========================================================================
-- Vacation: RFC 3834 automatic replies (stages/vacation, common/message/autoreply.c)
--
-- An account's owner sets a vacation notice for their own address with
-- pepsi.vacation_set: rows of the per-address settings (pepsi.settings:
-- VACATION, VACATION_MESSAGE, VACATION_SUBJECT, VACATION_INTERVAL), each
-- value checked, the change audited.  pepsi.autoreply_sent remembers when
-- a responder last answered a sender, so that a sender gets at most one
-- reply per interval; the stage checks and records it in the very
-- statement that injects the reply (pepsi.autoreply_due), and the table
-- is the owner's alone.
-- ===========================================================================

CREATE TABLE pepsi.autoreply_sent (
    responder   text NOT NULL,
    recipient   text NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now(),
    keep_until  timestamptz,
    PRIMARY KEY (responder, recipient)
);
CREATE INDEX autoreply_sent_keep_until ON pepsi.autoreply_sent (keep_until);
COMMENT ON TABLE pepsi.autoreply_sent IS
    'When an automatic responder (a vacation notice) last answered a sender (RFC 3834: once per interval)';

-- Is a reply from responder to recipient due (none within every)?  If so,
-- it is recorded as sent now.  Concurrent callers for one pair: one wins.
CREATE FUNCTION pepsi.autoreply_due(responder text, recipient text, every interval) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF responder IS NULL OR recipient IS NULL OR every IS NULL THEN
        RAISE EXCEPTION 'responder, recipient and every must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO pepsi.autoreply_sent AS s (responder, recipient, sent_at, keep_until)
    VALUES (lower(autoreply_due.responder), lower(autoreply_due.recipient), now(), now() + every)
    ON CONFLICT ON CONSTRAINT autoreply_sent_pkey DO UPDATE SET sent_at = now(), keep_until = now() + every
        WHERE s.sent_at <= now() - every;
    RETURN FOUND;
END
$$;

-- Set the vacation notice of address: message (its text), subject (NULL:
-- "Auto: " and the original subject), every (one reply per sender in that
-- time, RFC 3834's default of 7 days).  A new notice answers everyone
-- afresh.  Audited in pepsi.event_log.
CREATE FUNCTION pepsi.vacation_set(address text, message text, subject text DEFAULT NULL,
                                   every interval DEFAULT '7 days') RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := pepsi.virtual_mailbox_canonical(address);
    seconds bigint;
BEGIN
    IF message IS NULL OR btrim(message) = '' THEN
        RAISE EXCEPTION 'a vacation notice needs a message'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(message) > 10000 OR message ~ '[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]' THEN
        RAISE EXCEPTION 'invalid vacation message'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A message is text of at most 10000 bytes: lines, tabs, no other control character.';
    END IF;
    IF subject IS NOT NULL AND (subject ~ '[[:cntrl:]]' OR length(subject) > 200) THEN
        RAISE EXCEPTION 'invalid vacation subject'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A subject is one line of at most 200 characters.';
    END IF;
    IF every IS NULL OR every < interval '1 second' OR every > interval '365 days' THEN
        RAISE EXCEPTION 'invalid vacation interval %', every
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'One reply per sender in at least a second and at most 365 days.';
    END IF;
    seconds := ceil(extract(epoch FROM every));
    INSERT INTO pepsi.settings AS s (address, option, value)
    VALUES (canonical, 'VACATION', 'yes'), (canonical, 'VACATION_MESSAGE', message),
           (canonical, 'VACATION_INTERVAL', seconds || 's')
    ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
    IF subject IS NULL THEN
        DELETE FROM pepsi.settings s WHERE s.address = canonical AND s.option = 'VACATION_SUBJECT';
    ELSE
        INSERT INTO pepsi.settings AS s (address, option, value)
        VALUES (canonical, 'VACATION_SUBJECT', subject)
        ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
    END IF;
    DELETE FROM pepsi.autoreply_sent a WHERE a.responder = canonical;
    PERFORM pepsi.event_log_write('vacation_set',
        jsonb_build_object('address', canonical, 'subject', subject, 'interval_seconds', seconds));
END
$$;

-- End the vacation notice of address; false if there was none.  Audited.
CREATE FUNCTION pepsi.vacation_unset(address text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    canonical text := pepsi.virtual_mailbox_canonical(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.settings s
    WHERE s.address = canonical
      AND s.option IN ('VACATION', 'VACATION_MESSAGE', 'VACATION_SUBJECT', 'VACATION_INTERVAL');
    removed := FOUND;
    DELETE FROM pepsi.autoreply_sent a WHERE a.responder = canonical;
    PERFORM pepsi.event_log_write('vacation_unset',
        jsonb_build_object('address', canonical, 'removed', removed));
    RETURN removed;
END
$$;

INSERT INTO pepsi.grant_owner (name) VALUES ('autoreply_sent');
INSERT INTO pepsi.grant_definer (name) VALUES ('autoreply_due'), ('vacation_set'), ('vacation_unset');
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'autoreply_due', '{EXECUTE}'),
    ('pepsi_config', 'function', 'vacation_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'vacation_unset', '{EXECUTE}');
SELECT pepsi.grant_apply();

-- end of vacation

-- ===========================================================================
-- MTA-STS policy cache
--
-- The MTA-STS policies (RFC 8461) pepsi-stage-relay-to-internet fetched
-- over HTTPS (common/smtp/mta_sts.c), one row per recipient domain, kept for the
-- policy's max_age and shared by every relay worker.  Stages read and write
-- it only through the two functions below; pepsi_monitor may read it.
-- ===========================================================================

CREATE TABLE pepsi.mta_sts_policy (
    domain     text PRIMARY KEY,
    policy_id  text NOT NULL,
    mode       text NOT NULL,
    policy     text NOT NULL,
    max_age    integer NOT NULL,
    fetched_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT mta_sts_policy_domain_form CHECK (domain = lower(domain) AND domain ~ '^[a-z0-9_.-]{1,253}$'),
    CONSTRAINT mta_sts_policy_id_form CHECK (policy_id ~ '^[A-Za-z0-9]{1,32}$'),
    CONSTRAINT mta_sts_policy_mode_form CHECK (mode IN ('enforce', 'testing', 'none')),
    CONSTRAINT mta_sts_policy_size CHECK (octet_length(policy) <= 65536),
    CONSTRAINT mta_sts_policy_max_age_range CHECK (max_age BETWEEN 0 AND 31557600)
);
COMMENT ON TABLE pepsi.mta_sts_policy IS
    'MTA-STS policies (RFC 8461) fetched by the relay, each kept until expires_at; written through mta_sts_policy_put';

-- The cached policy of a domain, if it has not expired.
CREATE FUNCTION pepsi.mta_sts_policy_get(domain text)
RETURNS TABLE (policy_id text, mode text, policy text, expires_at timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT p.policy_id, p.mode, p.policy, p.expires_at FROM pepsi.mta_sts_policy p
    WHERE p.domain = lower(mta_sts_policy_get.domain) AND p.expires_at > now()
$$;

-- Store a freshly fetched policy for its max_age (replacing the one before).
CREATE FUNCTION pepsi.mta_sts_policy_put(domain text, policy_id text, mode text, policy text,
                                         max_age integer) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF domain IS NULL OR policy_id IS NULL OR mode IS NULL OR policy IS NULL OR max_age IS NULL THEN
        RAISE EXCEPTION 'no argument of mta_sts_policy_put may be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_age < 0 OR max_age > 31557600 THEN
        RAISE EXCEPTION 'max_age % is out of range', max_age
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'RFC 8461 section 3.2 allows 0 to 31557600 seconds.';
    END IF;
    INSERT INTO pepsi.mta_sts_policy AS p (domain, policy_id, mode, policy, max_age, fetched_at, expires_at)
    VALUES (lower(domain), policy_id, mode, policy, max_age, now(), now() + make_interval(secs => max_age))
    ON CONFLICT ON CONSTRAINT mta_sts_policy_pkey DO UPDATE
        SET policy_id = EXCLUDED.policy_id, mode = EXCLUDED.mode, policy = EXCLUDED.policy,
            max_age = EXCLUDED.max_age, fetched_at = EXCLUDED.fetched_at, expires_at = EXCLUDED.expires_at;
    RETURN true;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'mta_sts_policy_get', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'mta_sts_policy_put', '{EXECUTE}'),
    ('pepsi_monitor', 'table', 'mta_sts_policy', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('mta_sts_policy_get'), ('mta_sts_policy_put');

SELECT pepsi.grant_apply();

-- end of MTA-STS policy cache

-- ===========================================================================
-- Message bodies: lz4 compression
--
-- A body is written once (at admission, or when a stage rewrites it) and
-- read whole by every stage that loads it (Load::Full: signing, sealing,
-- every relay).  The server's default compression, pglz, is slow both
-- ways: with 100 KB bodies it made the admission statement cost 1.44 ms
-- of the backend's time per message against 0.26 ms with lz4, and a load
-- 0.31 ms against 0.22 ms (pg_stat_statements over 2,000 messages of
-- bench/dkim-sign).  lz4 compresses text about as well, and gives up
-- quickly on what does not compress (attachments already encoded), which
-- is then stored as it is.  Existing bodies keep their compression (both
-- are read alike); a server built without lz4 keeps pglz.
-- ===========================================================================

DO $$
BEGIN
    EXECUTE 'ALTER TABLE pepsi.workqueue_body ALTER COLUMN body SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'pepsi.workqueue_body.body keeps the server''s default compression: %', SQLERRM;
END
$$;

SELECT pepsi.grant_apply();

-- end of message bodies: lz4 compression

-- ===========================================================================
-- Vacation: pruning pepsi.autoreply_sent (extension/src/maint.c)
--
-- A row of pepsi.autoreply_sent only matters until its interval has passed:
-- after that the next message from the sender gets a reply anyway.  The
-- row now keeps that time (keep_until), and pepsi.autoreply_prune, which
-- the maintenance worker calls with its other sweeps, deletes the rows
-- past it, so the table holds the senders of one interval, not of ever.
-- (A row without keep_until goes once it is older than the longest
-- interval vacation_set allows, 365 days.)
-- ===========================================================================

-- Delete at most batch rows of pepsi.autoreply_sent whose interval has
-- passed; returns how many went.
CREATE FUNCTION pepsi.autoreply_prune(batch integer DEFAULT 10000) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    pruned integer;
BEGIN
    IF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pepsi.autoreply_sent a
    WHERE (a.responder, a.recipient) IN
          (SELECT o.responder, o.recipient FROM pepsi.autoreply_sent o
           WHERE o.keep_until < now()
              OR (o.keep_until IS NULL AND o.sent_at < now() - interval '365 days')
           LIMIT batch
           FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

INSERT INTO pepsi.grant_definer (name) VALUES ('autoreply_prune');
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'autoreply_prune', '{EXECUTE}');

SELECT pepsi.grant_apply();

-- end of pruning pepsi.autoreply_sent

-- ===========================================================================
-- Cheaper stage hops: the queue's storage and its trigger
--
-- A stage hop is two updates of a row (the claim, the commit); these make
-- each cheaper without changing what it does.
--
-- The storage: pepsi.workqueue is a table that churns.  Every row is
-- rewritten at each claim and each commit and deleted at the end, so
-- between two vacuums much of the table is dead row versions.  The
-- server's defaults suit a table that grows: vacuum once a fifth of it is
-- dead, throttled, and analyze once a tenth changed.
-- On a queue of 100,000 messages that is 20,000 dead versions before a
-- vacuum, and the claim's index scans wade through their entries, the
-- visibility map is never current enough for an index-only scan, and the
-- plans were made for a queue of another size.  So, for this table, vacuum
-- and analyze after 2% and 5% of the rows changed (plus 1,000), not 20%
-- and 10%, and unthrottled (cost delay 0): a slow vacuum of a queue only
-- leaves its dead versions longer for every claim to skip.  The fillfactor
-- stays 100: no update of a row is HOT (status is in the partial indexes'
-- predicates), and at 70 a stage hop cost some 10% more server CPU
-- (more pages to prune and to write whole after a checkpoint).
--
-- Storage parameters only: nothing is rewritten, and a DBA may override
-- them with ALTER TABLE as usual.
--
-- The trigger: 0.1's workqueue_pending_seq fired BEFORE UPDATE, and any
-- BEFORE ROW trigger on UPDATE makes PostgreSQL lock each row before it
-- updates it, whatever the trigger's WHEN says: one more WAL record and
-- page write per row at every claim and every commit.  The queue's own
-- transitions now draw pending_seq in the statement that makes a row
-- pending (extension/src/transition.c), and the trigger fires AFTER UPDATE,
-- only for a row that became pending without a new pending_seq (a DBA's
-- UPDATE, say), which it then sends to the back of its queue as before.
-- ===========================================================================

ALTER TABLE pepsi.workqueue SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

DROP TRIGGER workqueue_pending_seq ON pepsi.workqueue;
CREATE TRIGGER workqueue_pending_seq
    AFTER UPDATE ON pepsi.workqueue FOR EACH ROW
    WHEN (NEW.status = 'pending' AND (OLD.status <> 'pending' OR OLD.stage <> NEW.stage)
          AND NEW.pending_seq = OLD.pending_seq)
    EXECUTE FUNCTION pepsi.workqueue_pending_seq_trigger();

SELECT pepsi.grant_apply();

-- end of cheaper stage hops

-- ===========================================================================
-- Relay to the internet: a freed slot handed to a waiting delivery, a
-- slow destination's share of the workers, the MTA-STS cache read in place
--
-- destination_begin learns three things.  A delivery that finds its
-- destination at its limit while the destination's next turn is near
-- (handoff_seconds) waits for a slot in place, up to handoff_seconds,
-- rather than pausing its row for a turn: the slot a worker frees goes at
-- once to a delivery already claimed for it (at most one waiter a slot,
-- and never for a slow destination, which would hold workers).  A worker
-- whose previous delivery was to the same domain keeps its slot outright,
-- so a waiter cannot take it between the end and the begin.  And a slow
-- destination (deliveries there take slow_seconds or more, on average)
-- gets at most slow_limit slots, the stage's share the worker passes, so
-- that it cannot hold most of the stage's workers while the other
-- destinations have mail: its concurrency comes down with its pace, as
-- it widens again when the pace recovers.
--
-- The MTA-STS policy cache is read in destination_begin's own plan: the
-- stage role may read the cached policies (they are public documents),
-- and only mta_sts_policy_put writes them.
-- ===========================================================================



INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'table', 'mta_sts_policy', '{SELECT}')
ON CONFLICT DO NOTHING;

SELECT pepsi.grant_apply();

-- end of the freed slot handed on

-- ===========================================================================
-- One index entry fewer per stage hop
--
-- A stage hop updates a row twice (the claim makes it running, the commit
-- pending at its next stage), and neither update is HOT, so each inserts
-- an entry into every index whose predicate the new version meets.
-- workqueue_stage_status held every version, pending ones too, for the
-- summary's counts; yet every pending row is in workqueue_pending_fifo
-- already.  So workqueue_stage_status keeps only the rows that are not
-- pending, workqueue_pending_fifo carries received_at as well (for the
-- age of the oldest pending row), and the counts read pending rows from
-- the one and the others from the other, both index-only scans.  The
-- commit of a hop inserts one entry fewer (of five); a perf profile of
-- bench/stages had index insertion at a third of the server's samples.
-- ===========================================================================

-- (The indexes, pepsi.queue_counts and pepsi.queue_summary_rows are made
-- in their final form by the block "a claim that is a HOT update" below,
-- which changes them again.)

-- end of one index entry fewer per stage hop

-- ===========================================================================
-- Relay to the internet: a slow destination capped only while other mail
-- waits, and the waiter ticket's key named
--
-- A slow destination's share of the workers (slow_limit) protects the
-- other destinations' mail; when there is none, the slow destination may
-- use what its concurrency limit allows.  destination_begin takes the
-- stage (stage, NULL: only the other destinations' slots tell) to look
-- at the first rows of it not yet done.  The waiter ticket's advisory key
-- comes from pepsi.destination_waiter_key, as the slot's does from
-- destination_slot_key.  And the previous delivery a begin ends costs no
-- call of destination_end when there is nothing to record.
-- ===========================================================================

-- The advisory-lock key of a waiter ticket of domain (destination_begin
-- waiting in place for a slot), apart from the slots' keys.
CREATE FUNCTION pepsi.destination_waiter_key(domain text, ticket integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (hashtext(lower(domain) || ' waiting')::bigint << 32) | ticket::bigint
$$;



INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'destination_waiter_key', '{EXECUTE}')
ON CONFLICT DO NOTHING;

SELECT pepsi.grant_apply();

-- end of a slow destination capped only while other mail waits

-- ===========================================================================
-- The queue's statements planned for a queue of any size
--
-- The claim and the commits run their statements through plans they keep
-- for the life of the connection, and after five runs PostgreSQL keeps one
-- generic plan, made for the table as it looked then.  A queue that was
-- empty then (just drained and vacuumed, or truncated: pg_class says 0
-- rows in 0 pages) gets sequential scans, which a burst of mail then pays
-- for on every call until autovacuum next analyzes the table (up to a
-- minute away, autovacuum_naptime): in bench/local the dispatcher's claim
-- went from 0.8 to 2.4 to 7.5 ms a call over three runs of 20,000
-- messages, each run starting on an emptied queue, its UPDATE ... WHERE id
-- = ANY and its read of the oldest pending rows scanning the whole table
-- and its dead versions.  Every statement of these functions has an index
-- made for it, so they are planned with sequential scans off: the plan
-- they keep is then the index's, right for 10 rows or 10 million.  And
-- without JIT: the read of pepsi.pending_seq can only be a sequential
-- scan, whose cost (disabled) would pass jit_above_cost, and compiling it
-- took 40 ms a claim; no statement of a claim or a commit is long enough
-- for JIT to pay anyway.
-- ===========================================================================

ALTER FUNCTION pepsi.workqueue_claim(text[], integer[], text[], text[], double precision[], integer,
                                     double precision[])
    SET enable_seqscan = off SET jit = off SET enable_bitmapscan = off SET enable_sort = off;
ALTER FUNCTION pepsi.workqueue_commit(bigint, text, pepsi.transition, text, jsonb, double precision,
                                      bytea, bytea, text, text[], jsonb, text)
    SET enable_seqscan = off SET jit = off;
ALTER FUNCTION pepsi.workqueue_commit_many(bigint[], text[], pepsi.transition, text[], jsonb[],
                                           double precision[])
    SET enable_seqscan = off SET jit = off;

SELECT pepsi.grant_apply();

-- end of the queue's statements planned for any size

-- ===========================================================================
-- A claim that is a HOT update
--
-- A stage hop updated its row twice, and neither update was HOT: the
-- claim's (pending -> running) inserted an entry into the primary key, the
-- body_id index and workqueue_stage_status, and the pages those entries
-- fill are swept by bottom-up deletion, which visits the heap for every
-- entry it weighs; a perf profile of bench/stages had index work at a
-- third of the server's samples and the claim's UPDATE at 100 of its 126
-- us per hop.  An update is HOT, and inserts no index entry, when no
-- column any index names (key, INCLUDE or predicate) changes.  The claim
-- changes status only, so no index names status any more: they name
-- index_status, status with running folded into pending, a generated
-- column the claim leaves as it was.  Every other transition changes
-- stage or pending_seq anyway (not HOT whatever the indexes are).
--
-- What it costs: the pending indexes now hold the running rows too, so a
-- read of pending rows names both (index_status = 'pending' to match the
-- index, status = 'pending' to skip the rows in flight) and checks the
-- heap for each entry instead of answering from the index alone; the
-- rows it skips are the ones in flight at the head of the stage (a few
-- hundred, what the workers hold).  A count of running rows reads them
-- through the pending index, with the pending ones.
--
-- The rest: paused_due's predicate is timeout IS NOT NULL, the same rows
-- (the CHECK ties timeout to paused), implied by the due-time scans'
-- "timeout <= now()"; fillfactor 50 leaves room on each page for the
-- claimed version (a HOT update must fit on the page of the old one:
-- bench/stages found 0.30 of the claims HOT at fillfactor 90, 0.77 at
-- 70, 0.89 at 60 and 0.99 at 50; the table is about twice as large at
-- rest, which a queue that drains can afford).
-- A claimed row is still claimed once: the claim's UPDATE re-checks
-- status = 'pending' on the latest version, as before.
-- ===========================================================================

ALTER TABLE pepsi.workqueue ADD COLUMN index_status pepsi.status
    GENERATED ALWAYS AS (CASE WHEN status = 'running' THEN 'pending'::pepsi.status ELSE status END) STORED;
COMMENT ON COLUMN pepsi.workqueue.index_status IS
    'status with running read as pending: what the indexes name, so that a claim changes no indexed column (a HOT update)';

DROP INDEX pepsi.workqueue_pending_fifo;
CREATE INDEX workqueue_pending_fifo ON pepsi.workqueue (stage, pending_seq)
    INCLUDE (sender_key, id, received_at) WHERE index_status = 'pending';
DROP INDEX pepsi.workqueue_pending_sender;
CREATE INDEX workqueue_pending_sender ON pepsi.workqueue (stage, sender_key, pending_seq)
    INCLUDE (id) WHERE index_status = 'pending';
DROP INDEX pepsi.workqueue_stage_status;
CREATE INDEX workqueue_stage_status ON pepsi.workqueue (stage, index_status)
    INCLUDE (received_at, timeout) WHERE index_status <> 'pending';
DROP INDEX pepsi.workqueue_paused_due;
CREATE INDEX workqueue_paused_due ON pepsi.workqueue (timeout) WHERE timeout IS NOT NULL;

ALTER TABLE pepsi.workqueue SET (fillfactor = 50);

-- Rows by stage and status, the held ones among them and the oldest
-- arrival: pending and running rows through workqueue_pending_fifo, the
-- others through workqueue_stage_status (each condition matches its
-- index's predicate).
CREATE FUNCTION pepsi.queue_counts()
RETURNS TABLE (stage text, status pepsi.status, messages bigint, held bigint,
               oldest_received_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT w.stage, w.status, count(*), 0::bigint, min(w.received_at)
    FROM pepsi.workqueue w WHERE w.index_status = 'pending'
    GROUP BY w.stage, w.status
    UNION ALL
    SELECT w.stage, w.index_status, count(*),
           count(*) FILTER (WHERE w.index_status = 'paused' AND w.timeout = 'infinity'),
           min(w.received_at)
    FROM pepsi.workqueue w WHERE w.index_status <> 'pending'
    GROUP BY w.stage, w.index_status
$$;
INSERT INTO pepsi.grant_definer VALUES ('queue_counts') ON CONFLICT DO NOTHING;
INSERT INTO pepsi.grant_owner VALUES ('queue_counts') ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION pepsi.queue_summary_rows()
RETURNS TABLE (stage text, status pepsi.status, messages bigint, held bigint, oldest_age interval)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
    SELECT c.stage, c.status, c.messages, c.held, now() - c.oldest_received_at
    FROM pepsi.queue_counts() c
$$;


SELECT pepsi.grant_apply();

-- end of a claim that is a HOT update

-- ===========================================================================
-- The claim's reads kept in order whatever the statistics say
--
-- In the middle of a burst the rows that moved on to later stages have
-- drawn new pending_seq values, interleaved with the new arrivals at the
-- first stage, and their new versions share the pages with the stage's
-- pending rows.  An ANALYZE then (autovacuum's, at 5% of the table) gives
-- the planner a histogram of pending_seq over every stage: it estimates
-- thousands of a stage's rows past the sender cache's watermark where a
-- few dozen are, and it planned the claim's read of the arrivals (LIMIT
-- 20001, planned for its parameters) as a bitmap heap scan and a sort,
-- the bitmap built from workqueue_pending_sender, whose pending_seq is no
-- bound across senders: every entry of the stage, live or dead, was
-- walked at every claim.  A bitmap scan never marks the dead entries it
-- passes, so they piled up until the next vacuum removed them: in one of
-- ten bench/fairness runs every claim took 150 to 800 ms, with 8,700 rows
-- pending, until autovacuum of pepsi.workqueue ended.  On a table in that
-- state (t/015) the arrivals' plan flips after ANALYZE: estimated 4,969
-- rows, 100 read, bitmap and sort; reading all 8,799 pending rows, an index
-- scan took 11 ms and the bitmap and sort 158 (one run each, load 30).
--
-- Each read of the claim has its ordered index (workqueue_pending_fifo for
-- a stage in pending_seq order, workqueue_pending_sender for one sender's
-- rows), so the claim is planned without bitmap scans and without sorts:
-- the plan reads rows in order and stops at its LIMIT, and a statistics
-- change cannot turn it into a read of every pending row.
-- ===========================================================================

-- (Set with the claim's other settings, in the block "the queue's
-- statements planned for a queue of any size" above.)

-- end of the claim's reads kept in order

-- ===========================================================================
-- pepsi-status names a transaction holding back the xmin horizon
--
-- The maintenance worker's warning (pepsi.snapshot_warning) goes to the
-- server log, which only the DBA reads; an operator running pepsi-status
-- sees the same condition there: who (pid, program, state, user, client),
-- since when, for how long.  Not the statement, which may be another
-- role's and hold what only that role may read.  The function runs as
-- the owner so that pepsi_monitor sees other roles' sessions.
-- ===========================================================================

CREATE FUNCTION pepsi.held_horizon(
    OUT pid integer, OUT program text, OUT state text, OUT usename text, OUT client text,
    OUT xact_start timestamptz, OUT seconds integer)
RETURNS SETOF record AS 'MODULE_PATHNAME', 'held_horizon' LANGUAGE C STRICT VOLATILE;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_monitor', 'function', 'held_horizon', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('held_horizon');

SELECT pepsi.grant_apply();

-- end of pepsi-status names a transaction holding back the xmin horizon

-- ===========================================================================
-- A bulk worker's database session at the worker's own CPU priority
--
-- pepsi-dispatch runs a batching stage's workers other than its light lane
-- at a higher nice value (BULK_NICE), so that on a busy machine the lane's
-- processes get the CPU first.  Most of a row's CPU is spent in the
-- worker's database session, which would keep the server's priority: the
-- worker passes its nice value on with pepsi.session_nice.  It only raises
-- the calling backend's own value (0 to 19), never another's, never lower.
-- ===========================================================================

CREATE FUNCTION pepsi.session_nice(nice integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'session_nice' LANGUAGE C STRICT VOLATILE;

-- pepsi-ingress does the same for the sessions that admit its known
-- clients' messages (its BULK_NICE), keeping the new clients' at the
-- server's priority.
INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'session_nice', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'session_nice', '{EXECUTE}');

SELECT pepsi.grant_apply();

-- end of a bulk worker's database session at the worker's own CPU priority

-- ===========================================================================
-- Backups keep the mail
--
-- pg_dump leaves out the rows of an extension's tables unless the
-- extension registers them with pg_extension_config_dump: without this a
-- dump restored with pg_restore gave back an empty queue, no bodies, no
-- administrators and no settings.  Every table that holds the
-- installation's state is registered, whole or through a filter, and so is
-- every sequence that numbers its rows, so that a restored sequence is
-- past the ids and pending_seq values of the restored rows (the claim
-- reads pending rows by pending_seq, extension/src/sendercache.c).
--
-- Not registered: what CREATE EXTENSION writes itself (the grant policy,
-- the seeded singletons dispatch_stats and queue_gauge_refresh, whose
-- counters start again), and what is only a cache of the moment:
-- dns_address (looked up again), queue_gauge (recounted), ingress_stats
-- (live processes), dsn_rate (this hour's DSN counts).  docs/backup.md
-- says what a restore keeps.
--
-- pepsi.schema_version holds the version whose schema the rows are in.
-- CREATE EXTENSION writes its row; a restore's COPY brings the dump's row,
-- which the trigger drops when the versions agree and refuses, saying what
-- to do, when they differ: the other rows would not fit this schema.
-- Every later upgrade script updates the row.
-- ===========================================================================

CREATE TABLE pepsi.schema_version (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version     text NOT NULL
);
COMMENT ON TABLE pepsi.schema_version IS
    'The pepsi version whose schema the data is in; a restore refuses a dump of another version';
INSERT INTO pepsi.schema_version (version) VALUES ('0.2');

CREATE FUNCTION pepsi.schema_version_restore() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    installed text := (SELECT extversion FROM pg_extension WHERE extname = 'pepsi');
BEGIN
    IF NEW.version IS DISTINCT FROM installed THEN
        RAISE EXCEPTION 'this dump holds pepsi % data, and this database has pepsi %', NEW.version, installed
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The rows of a dump fit only the schema of the version they were dumped from.',
                  HINT = format('Drop this database, create it again, run CREATE EXTENSION pepsi VERSION %L in it'
                                ' (with the release that has that version installed), restore the dump into it,'
                                ' then ALTER EXTENSION pepsi UPDATE.  See docs/backup.md.', NEW.version);
    END IF;
    -- CREATE EXTENSION wrote this row already.
    RETURN NULL;
END
$$;
CREATE TRIGGER schema_version_restore
    BEFORE INSERT ON pepsi.schema_version
    FOR EACH ROW EXECUTE FUNCTION pepsi.schema_version_restore();

-- The queue: every row in every status, the bodies, and the numbering.
SELECT pg_catalog.pg_extension_config_dump('pepsi.workqueue', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.workqueue_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.workqueue_body', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.workqueue_body_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.pending_seq', '');
-- The operator's configuration, the accounts and their credentials.
SELECT pg_catalog.pg_extension_config_dump('pepsi.config_override', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.settings', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.virtual_mailbox', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.admin_account', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.admin_session', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.api_token', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.api_token_id_seq', '');
-- The logs and the statistics.
SELECT pg_catalog.pg_extension_config_dump('pepsi.mail_log', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.mail_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.event_log', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.event_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.stage_stats', '');
-- What delivery remembers that must outlive a restore: the limits an
-- operator set on a destination (its health comes along, and expires), the
-- MTA-STS policies (RFC 8461: kept until they expire, or a downgrade
-- attack gets through), and when each vacation notice was last sent (or a
-- restore answers every sender again).
SELECT pg_catalog.pg_extension_config_dump('pepsi.destination',
    'WHERE concurrency_limit IS NOT NULL OR messages_per_minute IS NOT NULL');
SELECT pg_catalog.pg_extension_config_dump('pepsi.mta_sts_policy', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.autoreply_sent', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.schema_version', '');

INSERT INTO pepsi.grant_owner (name) VALUES ('schema_version'), ('schema_version_restore');

SELECT pepsi.grant_apply();

-- end of backups keep the mail
