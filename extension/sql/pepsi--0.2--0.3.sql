/*
 * pepsi 0.2 -> 0.3: the schema changes made since 0.2.
 *
 * An existing 0.2 database reaches 0.3 with ALTER EXTENSION pepsi UPDATE;
 * CREATE EXTENSION pepsi installs pepsi--0.3.sql, the whole of 0.3.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue.  The scheme
 * (blocks, grants as data, every statement safe on a live queue) is the
 * one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.3'" to load this file. \quit

-- ===========================================================================
-- pepsi-httpd viewers: read-only accounts and tokens
--
-- An administrator (pepsi.admin_account) and an API token (pepsi.api_token)
-- have a role: 'admin' may do everything pepsi-httpd offers, 'viewer' may
-- read the pages and the API's GET endpoints and nothing else.  Rows that
-- exist keep today's rights ('admin').  pepsi-httpd refuses a viewer's
-- action itself (403); the database refuses it too: every administrative
-- action writes pepsi.event_log through pepsi.event_log_write, which now
-- asks pepsi.admin_role_check whether the administrator pepsi-httpd names
-- for the transaction (pepsi.admin_account, as pepsi.event_principal reads
-- it) may act, so a viewer's call fails and rolls back whatever it did.
-- The two-argument admin_account_set and one-argument api_token_create
-- stay as they were (older programs call them): a new account or token
-- gets 'admin', an existing account keeps its role.  The overloads with a
-- role argument set it.
-- ===========================================================================

ALTER TABLE pepsi.admin_account
    ADD COLUMN role text NOT NULL DEFAULT 'admin' CONSTRAINT admin_account_role_check CHECK (role IN ('admin', 'viewer'));
ALTER TABLE pepsi.api_token
    ADD COLUMN role text NOT NULL DEFAULT 'admin' CONSTRAINT api_token_role_check CHECK (role IN ('admin', 'viewer'));
COMMENT ON COLUMN pepsi.admin_account.role IS 'admin: every action; viewer: reads only';
COMMENT ON COLUMN pepsi.api_token.role IS 'admin: every action; viewer: reads only';

-- Raise unless the role is one pepsi-httpd knows.
CREATE FUNCTION pepsi.admin_role_valid(role text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF role IS NULL OR role NOT IN ('admin', 'viewer') THEN
        RAISE EXCEPTION 'role must be ''admin'' or ''viewer'', not %', coalesce(quote_literal(role), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A viewer may read the pages and the API''s GET endpoints; an admin may also act.';
    END IF;
END
$$;

-- Raise (insufficient_privilege) when pepsi-httpd acts for a viewer: the
-- administrator it names (pepsi.admin_account: an account's name, or
-- "token:" and a token's name) has the role 'viewer'.  A name
-- pepsi.event_principal does not apply (another role set it) or that no
-- live account or token has is not checked here: pepsi-httpd names only
-- the principal it has just authenticated.
CREATE FUNCTION pepsi.admin_role_check(action text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    acting text := current_setting('pepsi.admin_account', true);
    principal text;
    role text;
BEGIN
    IF acting IS NULL OR acting = '' THEN
        RETURN;
    END IF;
    principal := pepsi.event_principal();
    IF right(principal, length(acting) + 1) IS DISTINCT FROM ':' || acting THEN
        RETURN;
    END IF;
    IF acting LIKE 'token:%' THEN
        SELECT t.role INTO role FROM pepsi.api_token t
        WHERE t.name = substr(acting, 7) AND t.revoked_at IS NULL;
    ELSE
        SELECT a.role INTO role FROM pepsi.admin_account a WHERE a.name = acting;
    END IF;
    IF role = 'viewer' THEN
        RAISE EXCEPTION '% is a viewer: it may read, not %',
                        CASE WHEN acting LIKE 'token:%' THEN format('API token "%s"', substr(acting, 7))
                             ELSE format('account "%s"', acting) END, action
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An admin gives it the admin role with pepsi-httpd passwd NAME admin (token NAME admin for a new token).';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pepsi.event_log_write(action text, detail jsonb) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pepsi.admin_role_check(action);
    INSERT INTO pepsi.event_log (principal, action, detail)
    VALUES (pepsi.event_principal(), action, detail)
$$;

-- A new token with a role (api_token_create(name) makes an admin's).
CREATE FUNCTION pepsi.api_token_create(name text, role text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text;
BEGIN
    PERFORM pepsi.admin_role_valid(role);
    token := pepsi.api_token_create(name);
    UPDATE pepsi.api_token t SET role = api_token_create.role WHERE t.name = api_token_create.name;
    PERFORM pepsi.event_log_write('api_token_role', jsonb_build_object('name', name, 'role', role));
    RETURN token;
END
$$;

-- Set an administrator's password hash and role.
CREATE FUNCTION pepsi.admin_account_set(name text, password_hash text, role text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    PERFORM pepsi.admin_role_valid(role);
    PERFORM pepsi.admin_account_set(name, password_hash);
    UPDATE pepsi.admin_account a SET role = admin_account_set.role WHERE a.name = admin_account_set.name;
    PERFORM pepsi.event_log_write('admin_account_role', jsonb_build_object('name', name, 'role', role));
END
$$;

INSERT INTO pepsi.grant_owner (name) VALUES ('admin_role_valid'), ('admin_role_check');

SELECT pepsi.grant_apply();

-- end of pepsi-httpd viewers

-- ===========================================================================
-- The data is in 0.3's schema.
-- ===========================================================================

UPDATE pepsi.schema_version SET version = '0.3';

-- end of the version
