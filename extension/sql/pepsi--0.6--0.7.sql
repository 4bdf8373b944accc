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
-- mailbox quotas
--
-- pepsi.quota holds the limits of an address ('alice@example.org') or of
-- a whole domain ('@example.org'): storage bytes, messages, and messages
-- received a day (0 or NULL: no limit of that kind).  An address's row
-- wins over its domain's; with neither, the maildir writer's QUOTA (or
-- the Maildir's own maildirsize) applies (pepsi.quota_limits).  The
-- usage pepsi.quota_usage holds is what the delivery side last learnt:
-- pepsi-stage-relay-to-maildir records the Maildir++ count the maildir
-- writer reports after each delivery (pepsi.quota_record), pepsi-quota
-- recount the count from disk (pepsi.quota_recounted), and the day's
-- deliveries.  pepsi-ingress answers 452 4.2.2 at RCPT for the addresses
-- pepsi.quota_full lists (it listens on pepsi_quota for changes).  The
-- warnings: quota_record returns the threshold just crossed, once per
-- crossing (warned remembers it until the use falls below it again).
-- Operators set the limits with pepsi-quota (pepsi.quota_set/unset,
-- audited in pepsi.event_log).
-- ===========================================================================

CREATE TABLE pepsi.quota (
    address       text PRIMARY KEY CHECK (address ~ '^[^@\s]*@[^@\s]+$'),
    max_bytes     bigint CHECK (max_bytes >= 0),
    max_messages  bigint CHECK (max_messages >= 0),
    max_daily     integer CHECK (max_daily >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.quota IS
    'Mailbox quotas of an address, or of a domain (@example.org) for its addresses without their own';

CREATE TABLE pepsi.quota_usage (
    address       text PRIMARY KEY CHECK (address ~ '^[^@\s]+@[^@\s]+$'),
    bytes         bigint NOT NULL DEFAULT 0,
    messages      bigint NOT NULL DEFAULT 0,
    disk_bytes    bigint NOT NULL DEFAULT 0,
    disk_messages bigint NOT NULL DEFAULT 0,
    day           date NOT NULL DEFAULT current_date,
    day_messages  integer NOT NULL DEFAULT 0,
    warned        integer NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.quota_usage IS
    'The use of each mailbox as the delivery side last counted it (Maildir++), the day''s deliveries, the last warning';

-- The limits in force for address: its row, else its domain's (source
-- 'address' or 'domain'); no row when neither exists.
CREATE FUNCTION pepsi.quota_limits(address text)
RETURNS TABLE (max_bytes bigint, max_messages bigint, max_daily integer, source text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(q.max_bytes, 0), coalesce(q.max_messages, 0), coalesce(q.max_daily, 0),
           CASE WHEN q.address LIKE '@%' THEN 'domain' ELSE 'address' END
    FROM pepsi.quota q
    WHERE q.address IN (pepsi.settings_key($1), substr(pepsi.settings_key($1), strpos(pepsi.settings_key($1), '@')))
    ORDER BY q.address LIKE '@%'
    LIMIT 1
$$;

-- The limits in force for address as the maildir writer's request takes
-- them (Maildir++: '<bytes>S,<count>C', '0S' for a row with none), or
-- NULL when no row applies (the writer's QUOTA or maildirsize then).
CREATE FUNCTION pepsi.quota_maildir_limits(address text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN l.max_bytes > 0 OR l.max_messages > 0
                THEN concat_ws(',', CASE WHEN l.max_bytes > 0 THEN l.max_bytes || 'S' END,
                               CASE WHEN l.max_messages > 0 THEN l.max_messages || 'C' END)
                ELSE '0S' END
    FROM pepsi.quota_limits($1) l
$$;

-- Is address at or over a limit, as far as the database knows (its
-- row's or domain's limits, else the ones the writer reported)?
CREATE FUNCTION pepsi.quota_is_full(address text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(bool_or(
               (coalesce(l.max_bytes, u.disk_bytes) > 0 AND u.bytes >= coalesce(l.max_bytes, u.disk_bytes))
            OR (coalesce(l.max_messages, u.disk_messages) > 0 AND u.messages >= coalesce(l.max_messages, u.disk_messages))
            OR (l.max_daily > 0 AND u.day = current_date AND u.day_messages >= l.max_daily)), false)
    FROM pepsi.quota_usage u
    LEFT JOIN LATERAL pepsi.quota_limits(u.address) l ON true
    WHERE u.address = pepsi.settings_key($1)
$$;

-- The addresses at or over a limit: what pepsi-ingress answers 452 for.
CREATE FUNCTION pepsi.quota_full() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT u.address FROM pepsi.quota_usage u WHERE pepsi.quota_is_full(u.address)
$$;

-- After a delivery attempt: the use the maildir writer counted (bytes and
-- messages, and the limits it applied: max_bytes, max_messages, 0 for
-- none), one more message today when delivered.  Returns the highest of
-- thresholds (percentages) the use reached and had not been warned of,
-- else 0; a use below a threshold warned of makes it due again.
-- Notifies pepsi_quota when the address becomes full or stops being.
CREATE FUNCTION pepsi.quota_record(address text, bytes bigint, messages bigint, max_bytes bigint,
                                   max_messages bigint, delivered boolean, thresholds integer[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    was_full boolean := pepsi.quota_is_full(key);
    l record;
    percent numeric := 0;
    reached integer := 0;
    before integer;
BEGIN
    SELECT * INTO l FROM pepsi.quota_limits(key);
    INSERT INTO pepsi.quota_usage AS u (address) VALUES (key) ON CONFLICT ON CONSTRAINT quota_usage_pkey DO NOTHING;
    SELECT u.warned INTO before FROM pepsi.quota_usage u WHERE u.address = key FOR UPDATE;
    IF coalesce(l.max_bytes, max_bytes) > 0 THEN
        percent := greatest(percent, 100.0 * bytes / coalesce(l.max_bytes, max_bytes));
    END IF;
    IF coalesce(l.max_messages, max_messages) > 0 THEN
        percent := greatest(percent, 100.0 * messages / coalesce(l.max_messages, max_messages));
    END IF;
    SELECT coalesce(max(t), 0) INTO reached FROM unnest(thresholds) t WHERE t > 0 AND percent >= t;
    UPDATE pepsi.quota_usage u SET
        bytes = quota_record.bytes, messages = quota_record.messages,
        disk_bytes = greatest(quota_record.max_bytes, 0), disk_messages = greatest(quota_record.max_messages, 0),
        day_messages = CASE WHEN u.day = current_date THEN u.day_messages ELSE 0 END
                       + CASE WHEN delivered THEN 1 ELSE 0 END,
        day = current_date, warned = reached, updated_at = now()
    WHERE u.address = key;
    IF pepsi.quota_is_full(key) IS DISTINCT FROM was_full THEN
        PERFORM pg_notify('pepsi_quota', key);
    END IF;
    RETURN CASE WHEN reached > before THEN reached ELSE 0 END;
END
$$;

-- Before a delivery: may address take one more message today?  (The
-- daily limit; the storage limits are the writer's to apply.)
CREATE FUNCTION pepsi.quota_daily_left(address text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce((SELECT l.max_daily = 0 OR u.day <> current_date OR u.day_messages < l.max_daily
                     FROM pepsi.quota_limits($1) l
                     LEFT JOIN pepsi.quota_usage u ON u.address = pepsi.settings_key($1)), true)
$$;

-- A limit must be a count of 0 or more; name the one that is not.
CREATE FUNCTION pepsi.quota_check_limit(name text, value bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF value < 0 THEN
        RAISE EXCEPTION 'quota % must be 0 or more, not %', name, value
            USING ERRCODE = 'invalid_parameter_value', HINT = '0 means no limit of that kind.';
    END IF;
END
$$;

-- Set the limits of an address or '@domain' (NULL leaves one as it is, 0
-- is no limit); audited.
CREATE FUNCTION pepsi.quota_set(address text, max_bytes bigint, max_messages bigint, max_daily integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
BEGIN
    PERFORM pepsi.quota_check_limit('max_bytes', max_bytes);
    PERFORM pepsi.quota_check_limit('max_messages', max_messages);
    PERFORM pepsi.quota_check_limit('max_daily', max_daily);
    INSERT INTO pepsi.quota AS q (address, max_bytes, max_messages, max_daily)
    VALUES (key, quota_set.max_bytes, quota_set.max_messages, quota_set.max_daily)
    ON CONFLICT ON CONSTRAINT quota_pkey DO UPDATE SET
        max_bytes = coalesce(excluded.max_bytes, q.max_bytes),
        max_messages = coalesce(excluded.max_messages, q.max_messages),
        max_daily = coalesce(excluded.max_daily, q.max_daily),
        updated_at = now();
    PERFORM pepsi.event_log_write('quota_set',
        jsonb_build_object('address', key, 'max_bytes', max_bytes, 'max_messages', max_messages,
                           'max_daily', max_daily));
    PERFORM pg_notify('pepsi_quota', key);
END
$$;

-- Remove the limits of an address or '@domain'; false if it had none.  Audited.
CREATE FUNCTION pepsi.quota_unset(address text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
    removed boolean;
BEGIN
    DELETE FROM pepsi.quota q WHERE q.address = key;
    removed := FOUND;
    PERFORM pepsi.event_log_write('quota_unset', jsonb_build_object('address', key, 'removed', removed));
    PERFORM pg_notify('pepsi_quota', key);
    RETURN removed;
END
$$;

-- The use pepsi-quota recount found on disk (and the limits the writer
-- applied); audited.
CREATE FUNCTION pepsi.quota_recounted(address text, bytes bigint, messages bigint, max_bytes bigint,
                                      max_messages bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.settings_key(address);
BEGIN
    PERFORM pepsi.quota_check_limit('bytes', bytes);
    PERFORM pepsi.quota_check_limit('messages', messages);
    PERFORM pepsi.quota_record(key, bytes, messages, max_bytes, max_messages, false, '{}');
    PERFORM pepsi.event_log_write('quota_recount',
        jsonb_build_object('address', key, 'bytes', bytes, 'messages', messages));
END
$$;

-- What pepsi-quota show prints: the limits in force and where they come
-- from, and the use last counted.
CREATE FUNCTION pepsi.quota_show(address text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT jsonb_build_object(
        'address', pepsi.settings_key($1),
        'source', coalesce(l.source, 'configuration'),
        'max_bytes', l.max_bytes, 'max_messages', l.max_messages, 'max_daily', l.max_daily,
        'bytes', u.bytes, 'messages', u.messages,
        'today', CASE WHEN u.day = current_date THEN u.day_messages ELSE 0 END,
        'warned', u.warned, 'full', pepsi.quota_is_full($1), 'counted_at', u.updated_at)
    FROM (SELECT 1) one
    LEFT JOIN LATERAL pepsi.quota_limits($1) l ON true
    LEFT JOIN pepsi.quota_usage u ON u.address = pepsi.settings_key($1)
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'quota', '{SELECT}'),
    ('pepsi_config', 'table', 'quota_usage', '{SELECT}'),
    ('pepsi_config', 'function', 'quota_limits', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_maildir_limits', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_is_full', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_check_limit', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_unset', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_recounted', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_show', '{EXECUTE}'),
    ('pepsi_config', 'function', 'quota_full', '{EXECUTE}'),
    ('pepsi_stage', 'table', 'quota', '{SELECT}'),
    ('pepsi_stage', 'table', 'quota_usage', '{SELECT}'),
    ('pepsi_stage', 'function', 'quota_limits', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_maildir_limits', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_is_full', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_record', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_daily_left', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'quota_full', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('quota_full'), ('quota_record'), ('quota_daily_left'),
    ('quota_set'), ('quota_unset'), ('quota_recounted'), ('quota_show');

SELECT pg_catalog.pg_extension_config_dump('pepsi.quota', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.quota_usage', '');
SELECT pepsi.grant_apply();
-- end of mailbox quotas

UPDATE pepsi.schema_version SET version = '0.7';
