/*
 * pepsi 0.5 -> 0.6: the schema changes made since 0.5.
 *
 * 0.5 was released with the schedule, the failure bouncer, DMARC
 * aggregates, setup tasks and the MX defences' tables; every schema change
 * since is a block here, placed before the final UPDATE of
 * pepsi.schema_version, and folded into pepsi--0.6.sql (new objects at its
 * end).  An existing 0.5 database reaches 0.6 with ALTER EXTENSION pepsi
 * UPDATE; CREATE EXTENSION pepsi installs pepsi--0.6.sql.  Both paths must
 * end in the same schema: t/003_extension_upgrade.pl compares their
 * catalogs and tests the upgrade with a filled queue.  The scheme (blocks,
 * grants as data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.6'" to load this file. \quit

-- ===========================================================================
-- Owner settings: domain rows, pepsi-settings and settings by e-mail
--
-- pepsi.settings holds a domain's rows too, written '@example.org': what
-- the domain's addresses have unless they set their own (an address row
-- wins over its domain's, and both over the configuration's value,
-- common/config/settings.c).  Only the options schema/options.def marks
-- OWNER may be set (pepsi.settings_option_problem checks the option and
-- the value with the programs' own code).  Operators set them with
-- pepsi-settings (pepsi.settings_set/unset, each change audited in
-- pepsi.event_log); an address's owner by mail to the settings address
-- (pepsi-stage-settings): the stage records the requested changes in
-- pepsi.settings_request with the hash of a single-use token it mails to
-- the owner, and applies them only when the owner answers with the token
-- before it expires (pepsi.settings_request_confirm).  The stage's role
-- may write neither table itself: the two request functions run as the
-- owner and check everything.
-- ===========================================================================

ALTER TABLE pepsi.settings DROP CONSTRAINT settings_address_check,
    ADD CONSTRAINT settings_address_check CHECK (address ~ '^[^@\s]*@[^@\s]+$');
COMMENT ON TABLE pepsi.settings IS
    'Per-address overrides written by account owners (a privilege boundary apart from config_override); @domain rows for a whole domain';

-- Why the owner of an address may not set option to value (a sentence),
-- or NULL when they may: options.def OWNER, and the value as its type wants.
CREATE FUNCTION pepsi.settings_option_problem(option text, value text) RETURNS text
AS 'MODULE_PATHNAME', 'settings_option_problem'
LANGUAGE C STABLE;

-- The canonical form of a settings row's key: an address (lower case,
-- as pepsi.virtual_mailbox_canonical) or a domain's '@example.org'.
CREATE FUNCTION pepsi.settings_key(address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := lower(btrim(address));
BEGIN
    IF address IS NULL THEN
        RAISE EXCEPTION 'address must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF key !~ '^[^@[:space:][:cntrl:]]*@[^@[:space:][:cntrl:]]+$' OR length(key) > 320 THEN
        RAISE EXCEPTION 'invalid address "%"', address
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An address (user@example.org) or a domain (@example.org), at most 320 characters.';
    END IF;
    RETURN key;
END
$$;

-- Set option of address (or '@domain') to value; audited.
CREATE FUNCTION pepsi.settings_set(address text, option text, value text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    problem text := pepsi.settings_option_problem(option, value);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pepsi.settings AS s (address, option, value)
    VALUES (key, settings_set.option, settings_set.value)
    ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
    PERFORM pepsi.event_log_write('settings_set',
        jsonb_build_object('address', key, 'option', option, 'value', left(value, 200)));
END
$$;

-- Remove option of address (or '@domain'); false if it was not set.  Audited.
CREATE FUNCTION pepsi.settings_unset(address text, option text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.settings s WHERE s.address = key AND s.option = settings_unset.option;
    removed := FOUND;
    PERFORM pepsi.event_log_write('settings_unset',
        jsonb_build_object('address', key, 'option', option, 'removed', removed));
    RETURN removed;
END
$$;

-- The settings in force for address: its own rows and its domain's it
-- does not override (source 'address' or 'domain').
CREATE FUNCTION pepsi.settings_resolved(address text)
RETURNS TABLE (option text, value text, source text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT DISTINCT ON (s.option) s.option, s.value,
           CASE WHEN s.address LIKE '@%' THEN 'domain' ELSE 'address' END
    FROM pepsi.settings s
    WHERE s.address = pepsi.settings_key(settings_resolved.address)
       OR s.address = '@' || split_part(pepsi.settings_key(settings_resolved.address), '@', 2)
    ORDER BY s.option, s.address LIKE '@%'
$$;

CREATE TABLE pepsi.settings_request (
    token_hash  bytea PRIMARY KEY,
    address     text NOT NULL CHECK (address ~ '^[^@\s]+@[^@\s]+$'),
    changes     jsonb NOT NULL CHECK (jsonb_typeof(changes) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);
CREATE INDEX settings_request_expires_at ON pepsi.settings_request (expires_at);
COMMENT ON TABLE pepsi.settings_request IS
    'Setting changes an owner asked for by mail, applied when the single-use token mailed to them comes back';

-- Record the changes (an object option -> value, null to unset) address
-- asked for, and return the token that confirms them within ttl (only
-- its hash is kept).  Requests that ended a day ago go.  Raises, naming
-- the problem, when a change is not one the owner may make.
CREATE FUNCTION pepsi.settings_request_create(address text, changes jsonb, ttl interval) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    change record;
    problem text;
BEGIN
    IF key LIKE '@%' THEN
        RAISE EXCEPTION 'only an address, not a domain, asks for its settings by mail'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(changes) IS DISTINCT FROM 'object' OR changes = '{}' THEN
        RAISE EXCEPTION 'changes must be a non-empty JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '30 days' THEN
        RAISE EXCEPTION 'invalid token lifetime %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to 30 days.';
    END IF;
    FOR change IN SELECT * FROM jsonb_each(changes) LOOP
        IF jsonb_typeof(change.value) NOT IN ('string', 'null') THEN
            RAISE EXCEPTION 'the value of % must be text or null', change.key
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        problem := pepsi.settings_option_problem(change.key,
                                                 coalesce(change.value #>> '{}', ''));
        IF problem IS NOT NULL AND NOT (jsonb_typeof(change.value) = 'null'
                                        AND pepsi.settings_option_problem(change.key, NULL) IS NULL) THEN
            RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    DELETE FROM pepsi.settings_request r WHERE r.expires_at < now() - interval '1 day';
    INSERT INTO pepsi.settings_request (token_hash, address, changes, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), key, changes, now() + ttl);
    PERFORM pepsi.event_log_write('settings_request',
        jsonb_build_object('address', key, 'options', (SELECT jsonb_agg(k ORDER BY k) FROM jsonb_object_keys(changes) k)));
    RETURN token;
END
$$;

-- Apply the changes token confirms for address, once: NULL when applied,
-- else why not (unknown, already used, expired, another address's).
-- Each change is audited as pepsi-settings' are.
CREATE FUNCTION pepsi.settings_request_confirm(address text, token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    request pepsi.settings_request;
    change record;
BEGIN
    SELECT * INTO request FROM pepsi.settings_request r
    WHERE r.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8')) FOR UPDATE;
    IF NOT FOUND OR request.address <> key THEN
        RETURN 'the token is not one this address was sent';
    ELSIF request.used_at IS NOT NULL THEN
        RETURN format('the token was already used (at %s)', to_char(request.used_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"'));
    ELSIF request.expires_at < now() THEN
        RETURN 'the token has expired: send the commands again';
    END IF;
    UPDATE pepsi.settings_request r SET used_at = now() WHERE r.token_hash = request.token_hash;
    FOR change IN SELECT * FROM jsonb_each(request.changes) LOOP
        IF jsonb_typeof(change.value) = 'null' THEN
            DELETE FROM pepsi.settings s WHERE s.address = key AND s.option = change.key;
            PERFORM pepsi.event_log_write('settings_unset',
                jsonb_build_object('address', key, 'option', change.key, 'by', 'mail'));
        ELSE
            INSERT INTO pepsi.settings AS s (address, option, value)
            VALUES (key, change.key, change.value #>> '{}')
            ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE SET value = excluded.value, updated_at = now();
            PERFORM pepsi.event_log_write('settings_set',
                jsonb_build_object('address', key, 'option', change.key,
                                   'value', left(change.value #>> '{}', 200), 'by', 'mail'));
        END IF;
    END LOOP;
    IF request.changes ? 'VACATION' OR request.changes ? 'VACATION_MESSAGE' THEN
        DELETE FROM pepsi.autoreply_sent a WHERE a.responder = key;
    END IF;
    RETURN NULL;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'settings_option_problem', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_key', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_unset', '{EXECUTE}'),
    ('pepsi_config', 'function', 'settings_resolved', '{EXECUTE}'),
    ('pepsi_config', 'table', 'settings_request', '{SELECT}'),
    ('pepsi_stage', 'function', 'settings_option_problem', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_key', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_resolved', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_request_create', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'settings_request_confirm', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('settings_set'), ('settings_unset'), ('settings_request_create'),
    ('settings_request_confirm');

SELECT pg_catalog.pg_extension_config_dump('pepsi.settings_request', '');
SELECT pepsi.grant_apply();
-- end of owner settings

UPDATE pepsi.schema_version SET version = '0.6';
