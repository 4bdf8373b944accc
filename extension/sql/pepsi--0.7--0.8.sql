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
-- Auto-pay: pepsi-stage-auto-pay, pepsi-helper-auto-pay, and the
-- secretary's paid alternative to confirmation
--
-- pepsi.outbound_message records the Message-Ids of the mail our users
-- send (authenticated, trusted-network or local submissions: the stage
-- never records a stranger's), so that a payment request that comes back
-- is matched to the message it asks payment for; outbound_message_prune
-- (a pepsi.schedule call) keeps it bounded.  pepsi.payment is the audit of
-- every payment both ways: out (one of our users paid a payment request
-- through their wallet, or it was refused or the wallet failed: reason
-- says why) and in (a proof of payment released an owner's held mail).
-- auto_pay_reserve checks a request against the owner's limits (per
-- message, per day, per recipient domain: pepsi.settings, resolved by the
-- stage; nothing is paid without a per-message and a per-day limit) and
-- records the payment as pending before the wallet runs, so two requests
-- at once cannot both fit under one limit, and a request already paid is
-- never paid twice; auto_pay_finish records what the wallet did.  The
-- stage's role writes none of the tables itself.  The schedule's
-- allow-list gains outbound_message_prune (its three functions replaced).
-- ===========================================================================

CREATE OR REPLACE FUNCTION pepsi.schedule_functions(OUT name text, OUT arguments text, OUT description text)
RETURNS SETOF record LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    VALUES ('failure_bounce',
            'older_than (interval, required), policy ("bounce" or "delete"), bounce_stage, max_rows',
            'Bounce (or delete) failed and timed-out rows older than older_than: pepsi-failure-bouncer(8)'),
           ('dmarc_aggregate_prune', 'older_than (interval, required, an hour or more)',
            'Delete the DMARC verdicts counted more than older_than ago: pepsi-dmarc-report(8)'),
           ('tls_aggregate_prune', 'older_than (interval, required, a day or more)',
            'Delete the TLS sessions counted more than older_than ago: pepsi-tlsrpt(8)'),
           ('greylist_prune', 'older_than (interval, required, an hour or more)',
            'Delete the greylisting triplets not seen for older_than, and ended auto-whitelistings'),
           ('send_count_prune', 'older_than (interval, required, an hour or more)',
            'Delete the hours of per-account send counts older than older_than'),
           ('screen_verdict_prune', '(none)',
            'Delete the expired connection-level verdicts (DNSBL, pre-greeting)'),
           ('secretary_expire', '(none)',
            'Delete the mail the secretary held whose HOLD_TIME is up: pepsi-stage-check-whitelist(8)'),
           ('outbound_message_prune', 'older_than (interval, required, an hour or more)',
            'Delete the records of our users'' Message-Ids sent more than older_than ago: pepsi-stage-auto-pay(8)')
$$;

-- Check a call's arguments as the call would read them; raise naming the
-- problem.  Used by schedule_add (so a bad row is refused when it is
-- added, not found failing at 3 a.m.) and again by schedule_call.
CREATE OR REPLACE FUNCTION pepsi.schedule_check_call(function_name text, arguments jsonb) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    unknown text;
    older_than interval;
    max_rows integer;
BEGIN
    IF function_name IS NULL OR NOT EXISTS (SELECT FROM pepsi.schedule_functions() f
                                             WHERE f.name = function_name) THEN
        RAISE EXCEPTION 'a schedule may not call "%"', function_name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('The functions a schedule may call: %s.',
                                  (SELECT string_agg(f.name, ', ') FROM pepsi.schedule_functions() f)),
                  HINT = 'For other work at a time, inject a row at the stage that does it (stage => ...).';
    END IF;
    IF function_name = 'failure_bounce' THEN
        SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(arguments) k
        WHERE k NOT IN ('older_than', 'policy', 'bounce_stage', 'max_rows');
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'failure_bounce takes no argument %', unknown
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'Its arguments: older_than, policy, bounce_stage, max_rows.';
        END IF;
        IF arguments ->> 'older_than' IS NULL THEN
            RAISE EXCEPTION 'failure_bounce needs the argument older_than'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'arguments => ''{"older_than": "5 days"}''';
        END IF;
        BEGIN
            older_than := (arguments ->> 'older_than')::interval;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            RAISE EXCEPTION 'failure_bounce''s older_than is not an interval: "%"', arguments ->> 'older_than'
                USING ERRCODE = 'invalid_parameter_value', HINT = 'For example "5 days" or "12 hours".';
        END;
        BEGIN
            max_rows := coalesce((arguments ->> 'max_rows')::integer, 1000);
        EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range THEN
            RAISE EXCEPTION 'failure_bounce''s max_rows is not a whole number: "%"', arguments ->> 'max_rows'
                USING ERRCODE = 'invalid_parameter_value';
        END;
        PERFORM pepsi.failure_bounce_check(older_than, coalesce(arguments ->> 'policy', 'bounce'),
                                           coalesce(arguments ->> 'bounce_stage', 'bounce'), max_rows);
    ELSIF function_name IN ('dmarc_aggregate_prune', 'tls_aggregate_prune', 'greylist_prune', 'send_count_prune',
                            'outbound_message_prune') THEN
        SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(arguments) k WHERE k <> 'older_than';
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION '% takes no argument %', function_name, unknown
                USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Its argument: older_than.';
        END IF;
        BEGIN
            older_than := (arguments ->> 'older_than')::interval;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            RAISE EXCEPTION '%''s older_than is not an interval: "%"', function_name, arguments ->> 'older_than'
                USING ERRCODE = 'invalid_parameter_value';
        END;
        IF function_name = 'tls_aggregate_prune' AND (older_than IS NULL OR older_than < interval '1 day') THEN
            RAISE EXCEPTION 'tls_aggregate_prune needs older_than, a day or more'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF older_than IS NULL OR older_than < interval '1 hour' THEN
            RAISE EXCEPTION '% needs older_than, an hour or more', function_name
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSIF function_name IN ('screen_verdict_prune', 'secretary_expire') THEN
        SELECT string_agg(k, ', ') INTO unknown FROM jsonb_object_keys(arguments) k;
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION '% takes no argument %', function_name, unknown
                USING ERRCODE = 'invalid_parameter_value', DETAIL = 'It takes no arguments.';
        END IF;
    END IF;
END
$$;

-- One fixed call per allow-listed name; returns the outcome's text.
CREATE OR REPLACE FUNCTION pepsi.schedule_call(function_name text, arguments jsonb) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    bounced bigint;
    deleted bigint;
BEGIN
    PERFORM pepsi.schedule_check_call(function_name, arguments);
    CASE function_name
        WHEN 'failure_bounce' THEN
            SELECT count(*) FILTER (WHERE f.action = 'bounced'),
                   count(*) FILTER (WHERE f.action <> 'bounced')
            INTO bounced, deleted
            FROM pepsi.failure_bounce((arguments ->> 'older_than')::interval,
                                      coalesce(arguments ->> 'policy', 'bounce'),
                                      coalesce(arguments ->> 'bounce_stage', 'bounce'),
                                      coalesce((arguments ->> 'max_rows')::integer, 1000)) f;
            RETURN format('%s bounced, %s deleted', bounced, deleted);
        WHEN 'dmarc_aggregate_prune' THEN
            RETURN format('%s rows pruned', pepsi.dmarc_aggregate_prune((arguments ->> 'older_than')::interval));
        WHEN 'tls_aggregate_prune' THEN
            RETURN format('%s rows pruned', pepsi.tls_aggregate_prune((arguments ->> 'older_than')::interval));
        WHEN 'greylist_prune' THEN
            RETURN format('%s rows pruned', pepsi.greylist_prune((arguments ->> 'older_than')::interval));
        WHEN 'send_count_prune' THEN
            RETURN format('%s rows pruned', pepsi.send_count_prune((arguments ->> 'older_than')::interval));
        WHEN 'screen_verdict_prune' THEN
            RETURN format('%s rows pruned', pepsi.screen_verdict_prune());
        WHEN 'secretary_expire' THEN
            RETURN format('%s held messages expired', pepsi.secretary_expire());
        WHEN 'outbound_message_prune' THEN
            RETURN format('%s rows pruned', pepsi.outbound_message_prune((arguments ->> 'older_than')::interval));
    END CASE;
END
$$;

CREATE TABLE pepsi.outbound_message (
    message_id  text PRIMARY KEY CHECK (length(message_id) BETWEEN 3 AND 998),
    sender      text NOT NULL CHECK (sender ~ '^[^@\s]+@[^@\s]+$'),
    recipient_domains text[] NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbound_message_sent_at ON pepsi.outbound_message (sent_at);
COMMENT ON TABLE pepsi.outbound_message IS
    'The Message-Ids of the mail our users sent, which a payment request must answer (pepsi-stage-auto-pay)';

CREATE TABLE pepsi.payment (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    direction   text NOT NULL CHECK (direction IN ('out', 'in')),
    address     text NOT NULL,
    peer        text NOT NULL,
    peer_domain text NOT NULL,
    message_id  text,
    uri         text NOT NULL CHECK (length(uri) <= 2048),
    currency    text NOT NULL,
    amount      numeric NOT NULL CHECK (amount >= 0),
    outcome     text NOT NULL CHECK (outcome IN ('pending', 'paid', 'refused', 'failed', 'received')),
    reason      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX payment_address_created_at ON pepsi.payment (address, created_at);
COMMENT ON TABLE pepsi.payment IS
    'Every payment made for our users (out: paid, refused, failed) and received by the secretary (in)';

-- An amount as GNU Taler writes one ("EUR:0.50"), split; an error naming it otherwise.
CREATE FUNCTION pepsi.payment_amount(amount text, OUT currency text, OUT value numeric)
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m text[] := regexp_match(btrim(coalesce(amount, '')), '^([A-Z][A-Z0-9]{0,11}):([0-9]{1,12}(\.[0-9]{1,8})?)$');
BEGIN
    IF m IS NULL THEN
        RAISE EXCEPTION 'invalid amount "%"', amount
            USING ERRCODE = 'invalid_parameter_value', HINT = 'CURRENCY:VALUE, as EUR:0.50.';
    END IF;
    currency := m[1];
    value := m[2]::numeric;
END
$$;

-- Record a Message-Id of mail our user sender sent to recipients
-- (pepsi-stage-auto-pay): their domains are the ones a request may come from.
CREATE FUNCTION pepsi.outbound_message_record(message_id text, sender text, recipients text[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    INSERT INTO pepsi.outbound_message (message_id, sender, recipient_domains)
    VALUES (outbound_message_record.message_id, lower(outbound_message_record.sender),
            ARRAY(SELECT DISTINCT lower(split_part(r, '@', 2)) FROM unnest(recipients) r))
    ON CONFLICT (message_id) DO NOTHING
$$;

-- Delete the records of mail sent more than older_than ago (a
-- pepsi.schedule call); returns how many went.
CREATE FUNCTION pepsi.outbound_message_prune(older_than interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    deleted bigint;
BEGIN
    DELETE FROM pepsi.outbound_message o WHERE o.sent_at < now() - older_than;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

-- A payment request from peer to our user address, answering one of
-- message_ids (its In-Reply-To and References) that went to peer's domain
-- (or a subdomain of it), for amount at uri: may it
-- be paid within the owner's limits (per_message, per_day: required;
-- per_domain: the day's total to peer's domain, optional), unless the
-- stage refuses it already (refusal: why, recorded)?  Returns
-- {"pay": true, "id": N} with the payment recorded pending, or
-- {"pay": false, "why": ...} with the refusal recorded (a request that
-- answers none of address's messages is not recorded: it is no request of
-- ours to refuse, only mail).
CREATE FUNCTION pepsi.auto_pay_reserve(address text, peer text, message_ids text[], uri text, amount text,
                                       per_message text, per_day text, per_domain text, refusal text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.secretary_address(address);
    peer_key text := pepsi.secretary_address(peer);
    domain text := split_part(pepsi.secretary_address(peer), '@', 2);
    matched text;
    asked record;
    lim record;
    spent numeric;
    why text;
    new_id bigint;
BEGIN
    SELECT o.message_id INTO matched FROM pepsi.outbound_message o
    WHERE o.message_id = ANY (message_ids) AND o.sender = key
      AND EXISTS (SELECT FROM unnest(o.recipient_domains) r WHERE r = domain OR r LIKE '%.' || domain)
    LIMIT 1;
    IF matched IS NULL THEN
        RETURN jsonb_build_object('pay', false, 'match', false,
                                  'why', 'it answers no message this address sent to that domain');
    END IF;
    -- One decision at a time per payer: the limits are sums over its rows.
    PERFORM pg_advisory_xact_lock(hashtext('pepsi.auto_pay'), hashtext(key));
    BEGIN
        asked := pepsi.payment_amount(amount);
    EXCEPTION WHEN invalid_parameter_value THEN
        asked := ROW('?', 0::numeric);
        why := format('the amount "%s" is not CURRENCY:VALUE', left(amount, 40));
    END;
    why := coalesce(why, refusal);
    IF why IS NULL AND EXISTS (SELECT FROM pepsi.payment p WHERE p.direction = 'out' AND p.address = key
                               AND p.uri = auto_pay_reserve.uri AND p.outcome IN ('pending', 'paid')) THEN
        why := 'it was paid already';
    ELSIF why IS NULL AND (per_message IS NULL OR per_day IS NULL) THEN
        why := 'no limit is set (AUTO_PAY_PER_MESSAGE and AUTO_PAY_PER_DAY)';
    END IF;
    IF why IS NULL THEN
        BEGIN
            lim := pepsi.payment_amount(per_message);
            IF lim.currency <> asked.currency OR asked.value > lim.value THEN
                why := format('%s is over the limit per message, %s (AUTO_PAY_PER_MESSAGE)', amount, per_message);
            END IF;
            lim := pepsi.payment_amount(per_day);
            SELECT coalesce(sum(p.amount), 0) INTO spent FROM pepsi.payment p
            WHERE p.direction = 'out' AND p.address = key AND p.currency = asked.currency
              AND p.outcome IN ('pending', 'paid') AND p.created_at > now() - interval '1 day';
            IF why IS NULL AND (lim.currency <> asked.currency OR spent + asked.value > lim.value) THEN
                why := format('%s would bring the last day''s payments to %s:%s, over the limit per day, %s (AUTO_PAY_PER_DAY)',
                              amount, asked.currency, spent + asked.value, per_day);
            END IF;
            IF why IS NULL AND per_domain IS NOT NULL THEN
                lim := pepsi.payment_amount(per_domain);
                SELECT coalesce(sum(p.amount), 0) INTO spent FROM pepsi.payment p
                WHERE p.direction = 'out' AND p.address = key AND p.currency = asked.currency
                  AND p.peer_domain = domain AND p.outcome IN ('pending', 'paid')
                  AND p.created_at > now() - interval '1 day';
                IF lim.currency <> asked.currency OR spent + asked.value > lim.value THEN
                    why := format('%s would bring the last day''s payments to %s to %s:%s, over the limit per recipient domain, %s (AUTO_PAY_PER_DOMAIN)',
                                  amount, domain, asked.currency, spent + asked.value, per_domain);
                END IF;
            END IF;
        EXCEPTION WHEN invalid_parameter_value THEN
            why := format('a limit is not CURRENCY:VALUE (%s)', SQLERRM);
        END;
    END IF;
    INSERT INTO pepsi.payment (direction, address, peer, peer_domain, message_id, uri, currency, amount, outcome,
                               reason, finished_at)
    VALUES ('out', key, peer_key, domain, matched, left(auto_pay_reserve.uri, 2048), asked.currency, asked.value,
            CASE WHEN why IS NULL THEN 'pending' ELSE 'refused' END, why,
            CASE WHEN why IS NOT NULL THEN now() END)
    RETURNING id INTO new_id;
    IF why IS NOT NULL THEN
        RETURN jsonb_build_object('pay', false, 'match', true, 'why', why, 'id', new_id);
    END IF;
    RETURN jsonb_build_object('pay', true, 'match', true, 'id', new_id, 'message_id', matched);
END
$$;

-- What became of pending payment id: 'paid' or 'failed', with the reason.
CREATE FUNCTION pepsi.auto_pay_finish(id bigint, outcome text, reason text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF outcome NOT IN ('paid', 'failed') THEN
        RAISE EXCEPTION 'invalid outcome "%"', outcome USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pepsi.payment p SET outcome = auto_pay_finish.outcome, reason = auto_pay_finish.reason, finished_at = now()
    WHERE p.id = auto_pay_finish.id AND p.outcome = 'pending';
END
$$;

-- A proof of payment (checked by the stage) for challenge of owner: its
-- held mail is released and its sender whitelisted, as a confirmation
-- would, and the payment recorded (in).  Returns how many rows were
-- released, or NULL when the challenge is not owner's open one.
CREATE FUNCTION pepsi.secretary_paid(owner text, payer text, challenge bigint, uri text, amount text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    key text := pepsi.secretary_address(owner);
    c pepsi.secretary_challenge;
    asked record := pepsi.payment_amount(amount);
BEGIN
    SELECT * INTO c FROM pepsi.secretary_challenge s
    WHERE s.id = challenge AND s.owner = key AND s.released_at IS NULL AND s.expires_at > now() FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO pepsi.payment (direction, address, peer, peer_domain, message_id, uri, currency, amount, outcome,
                               reason, finished_at)
    VALUES ('in', key, coalesce(nullif(c.sender, ''), lower(payer)), split_part(coalesce(nullif(c.sender, ''), payer), '@', 2),
            c.id::text, left(secretary_paid.uri, 2048), asked.currency, asked.value, 'received',
            format('proof from <%s>', payer), now());
    RETURN pepsi.secretary_release_challenge(c.id, 'reply');
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'outbound_message', '{SELECT}'),
    ('pepsi_config', 'table', 'payment', '{SELECT}'),
    ('pepsi_config', 'function', 'outbound_message_prune', '{EXECUTE}'),
    ('pepsi_config', 'function', 'payment_amount', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'payment_amount', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'outbound_message_record', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'auto_pay_reserve', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'auto_pay_finish', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'secretary_paid', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('outbound_message_record'), ('outbound_message_prune'),
    ('auto_pay_reserve'), ('auto_pay_finish'), ('secretary_paid');

SELECT pg_catalog.pg_extension_config_dump('pepsi.outbound_message', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.payment', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.payment_id_seq', '');
SELECT pepsi.grant_apply();
-- end of auto-pay

UPDATE pepsi.schema_version SET version = '0.8';
