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

-- ===========================================================================
-- Owner leftovers: the secretary's batched decision, quotas at scale
--
-- pepsi.secretary_decide_many decides a batch of rows of
-- pepsi-stage-check-whitelist with one call and one transaction instead
-- of a call each (bench/secretary); the pairs in the order of (owner,
-- sender), so that two batches that need the same challenges wait for
-- each other and never deadlock.
--
-- pepsi.quota_usage keeps whether each mailbox is full (is_full: storage
-- or messages, against the limits in force) and the day its daily limit
-- was reached (daily_full_on), set by a trigger at each write of the
-- use and recomputed for the addresses whose limits change (a trigger on
-- pepsi.quota).  pepsi.quota_full then reads a partial index of the few
-- full mailboxes instead of working out every row's limits at each of
-- pepsi-ingress's refreshes.  pepsi.quota_record_many records a batch of
-- the maildir writer's reports with one call; pepsi.quota_delivered
-- counts the day's deliveries of the LMTP path, for max_daily.
-- ===========================================================================

ALTER TABLE pepsi.quota_usage ADD COLUMN is_full boolean NOT NULL DEFAULT false;
ALTER TABLE pepsi.quota_usage ADD COLUMN daily_full_on date;
-- The addresses at or over a limit: what pepsi-ingress answers 452 for
-- (the partial index quota_usage_full: the full ones only).
CREATE OR REPLACE FUNCTION pepsi.quota_full() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT u.address FROM pepsi.quota_usage u
    WHERE (u.is_full OR u.daily_full_on IS NOT NULL) AND (u.is_full OR u.daily_full_on = current_date)
$$;

-- The secretary's decisions on a batch of rows: rows is a JSON array of
-- objects {owner, sender, row_id, verified, token, look_in_text} (the
-- arguments of pepsi.secretary_decide, ttl and max_per_hour shared);
-- returns secretary_decide's answers as a JSON array in the same order.
CREATE FUNCTION pepsi.secretary_decide_many(rows jsonb, ttl interval, max_per_hour integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r record;
    answers jsonb[];
BEGIN
    IF jsonb_typeof(rows) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the rows to decide must be a JSON array, not %', coalesce(jsonb_typeof(rows), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(rows) = 0 THEN
        RETURN '[]';
    END IF;
    answers := array_fill(NULL::jsonb, ARRAY[jsonb_array_length(rows)]);
    FOR r IN SELECT a.e, a.o FROM jsonb_array_elements(rows) WITH ORDINALITY AS a (e, o)
             ORDER BY pepsi.secretary_address(a.e->>'owner'), lower(coalesce(a.e->>'sender', '')), a.o
    LOOP
        answers[r.o] := pepsi.secretary_decide(r.e->>'owner', r.e->>'sender', (r.e->>'row_id')::bigint,
                                               coalesce((r.e->>'verified')::boolean, false), r.e->>'token',
                                               coalesce((r.e->>'look_in_text')::boolean, false),
                                               ttl, max_per_hour);
    END LOOP;
    RETURN to_jsonb(answers);
END
$$;

-- The trigger that keeps quota_usage's is_full and daily_full_on.
CREATE FUNCTION pepsi.quota_usage_state() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l record;
BEGIN
    SELECT * INTO l FROM pepsi.quota_limits(NEW.address);
    NEW.is_full := coalesce(
        (coalesce(l.max_bytes, NEW.disk_bytes) > 0 AND NEW.bytes >= coalesce(l.max_bytes, NEW.disk_bytes))
        OR (coalesce(l.max_messages, NEW.disk_messages) > 0
            AND NEW.messages >= coalesce(l.max_messages, NEW.disk_messages)), false);
    NEW.daily_full_on := CASE WHEN l.max_daily > 0 AND NEW.day_messages >= l.max_daily THEN NEW.day END;
    RETURN NEW;
END
$$;
CREATE TRIGGER quota_usage_state BEFORE INSERT OR UPDATE OF bytes, messages, disk_bytes, disk_messages, day, day_messages
    ON pepsi.quota_usage FOR EACH ROW EXECUTE FUNCTION pepsi.quota_usage_state();
CREATE INDEX quota_usage_full ON pepsi.quota_usage (address) WHERE is_full OR daily_full_on IS NOT NULL;

-- When the limits of an address or a domain change: its use rows' state again.
CREATE FUNCTION pepsi.quota_limits_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := CASE WHEN TG_OP = 'DELETE' THEN OLD.address ELSE NEW.address END;
BEGIN
    IF key LIKE '@%' THEN
        UPDATE pepsi.quota_usage u SET day = u.day WHERE right(u.address, length(key)) = key;
    ELSE
        UPDATE pepsi.quota_usage u SET day = u.day WHERE u.address = key;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER quota_limits_changed AFTER INSERT OR UPDATE OR DELETE ON pepsi.quota
    FOR EACH ROW EXECUTE FUNCTION pepsi.quota_limits_changed();

-- pepsi.quota_record for a batch of deliveries: a JSON array of objects
-- {address, bytes, messages, max_bytes, max_messages, delivered,
-- thresholds (an array of percentages)}, recorded in order; returns
-- quota_record's answers (the threshold to warn of, else 0) in order.
CREATE FUNCTION pepsi.quota_record_many(deliveries jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    d jsonb;
    answers jsonb := '[]';
BEGIN
    IF jsonb_typeof(deliveries) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the deliveries must be a JSON array, not %', coalesce(jsonb_typeof(deliveries), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR d IN SELECT e FROM jsonb_array_elements(deliveries) WITH ORDINALITY AS a (e, o) ORDER BY o LOOP
        answers := answers || to_jsonb(pepsi.quota_record(d->>'address', (d->>'bytes')::bigint,
            (d->>'messages')::bigint, (d->>'max_bytes')::bigint, (d->>'max_messages')::bigint,
            coalesce((d->>'delivered')::boolean, false),
            coalesce(ARRAY(SELECT t::integer FROM jsonb_array_elements_text(d->'thresholds') t), '{}')));
    END LOOP;
    RETURN answers;
END
$$;

-- One more message today for each address of addresses (a JSON array)
-- whose limits have a max_daily: what the LMTP path delivered.  Notifies
-- pepsi_quota when an address becomes full.  Returns how many it counted.
CREATE FUNCTION pepsi.quota_delivered(addresses jsonb) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    a text;
    key text;
    was_full boolean;
    counted integer := 0;
BEGIN
    IF jsonb_typeof(addresses) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the addresses must be a JSON array, not %', coalesce(jsonb_typeof(addresses), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR a IN SELECT jsonb_array_elements_text(addresses) LOOP
        key := pepsi.settings_key(a);
        CONTINUE WHEN NOT EXISTS (SELECT FROM pepsi.quota_limits(key) l WHERE l.max_daily > 0);
        was_full := pepsi.quota_is_full(key);
        INSERT INTO pepsi.quota_usage AS u (address, day, day_messages) VALUES (key, current_date, 1)
        ON CONFLICT ON CONSTRAINT quota_usage_pkey DO UPDATE SET
            day_messages = CASE WHEN u.day = current_date THEN u.day_messages ELSE 0 END + 1,
            day = current_date, updated_at = now();
        counted := counted + 1;
        IF pepsi.quota_is_full(key) IS DISTINCT FROM was_full THEN
            PERFORM pg_notify('pepsi_quota', key);
        END IF;
    END LOOP;
    RETURN counted;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'secretary_decide_many', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_record_many', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'quota_delivered', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('secretary_decide_many'), ('quota_record_many'),
    ('quota_delivered');

-- The state of the use rows there are.
UPDATE pepsi.quota_usage u SET day = u.day;
SELECT pepsi.grant_apply();
-- end of owner leftovers

UPDATE pepsi.schema_version SET version = '0.8';
