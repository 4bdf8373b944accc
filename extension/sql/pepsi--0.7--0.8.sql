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

-- ===========================================================================
-- List digests, post size limit, DMARC wrap (issue 40)
--
-- A post to a list that has digest members is copied once into
-- pepsi.list_digest at its fan-out (keyed by its queue row, so a fan-out
-- that runs again adds nothing); a schedule row injecting at the list
-- stage with arguments {"list_digest": true} and the list's address as
-- recipient makes pepsi-stage-list call pepsi.list_digest_send, which in
-- one transaction builds the digest (mailing_list.digest_format: "mime",
-- RFC 2046 multipart/digest of message/rfc822 parts after a table of
-- contents, or "plain", RFC 1153), queues it to the digest members (one
-- row per domain, from list-bounces@, signed as the list's mail), and
-- deletes the posts it took: a second call finds none.  nomail members
-- get nothing.  mailing_list.max_post_size holds a bigger post for the
-- moderators; dmarc_mitigation "wrap" sends a p=reject or quarantine
-- author's post as an attachment (message/rfc822) of a message from the
-- list instead of rewriting its From:.
-- ===========================================================================

ALTER TABLE pepsi.mailing_list DROP CONSTRAINT mailing_list_dmarc_mitigation_check,
    ADD CONSTRAINT mailing_list_dmarc_mitigation_check CHECK (dmarc_mitigation IN ('from', 'wrap', 'none')),
    ADD COLUMN max_post_size integer NOT NULL DEFAULT 10485760 CHECK (max_post_size > 0),
    ADD COLUMN digest_format text NOT NULL DEFAULT 'mime' CHECK (digest_format IN ('mime', 'plain')),
    ADD COLUMN digest_issue integer NOT NULL DEFAULT 0;

-- A list's own addresses may not be its members (a loop); list_resolve
-- tells the stage max_post_size; expired requests go, each logged.
CREATE FUNCTION pepsi.list_pending_expire() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    p record;
    gone integer := 0;
BEGIN
    FOR p IN DELETE FROM pepsi.list_pending x WHERE x.expires_at < now() RETURNING x.list_id, x.address, x.action, x.created_at
    LOOP
        PERFORM pepsi.event_log_write('list_request_expired',
            jsonb_build_object('list', p.list_id, 'address', p.address, 'action', p.action,
                               'reason', format('not confirmed since %s', p.created_at)));
        gone := gone + 1;
    END LOOP;
    RETURN gone;
END
$$;

CREATE OR REPLACE FUNCTION pepsi.list_resolve(recipient text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    addr text := lower(recipient);
    local text := split_part(addr, '@', 1);
    domain text := split_part(addr, '@', 2);
    parts text[];
    kind text := 'post';
    verp text;
    l pepsi.mailing_list;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = addr;
    IF NOT FOUND THEN
        parts := regexp_match(local, '^(.+)-(request|owner|subscribe|unsubscribe|bounces)(\+(.*))?$');
        IF parts IS NULL OR (parts[3] IS NOT NULL AND parts[2] <> 'bounces') THEN
            RETURN NULL;
        END IF;
        kind := parts[2];
        verp := parts[4];
        SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = parts[1] || '@' || domain;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN jsonb_build_object('id', l.id, 'list', l.address, 'kind', kind,
        'verp', CASE WHEN verp IS NOT NULL THEN regexp_replace(verp, '=([^=]*)$', '@\1') END,
        'description', l.description, 'posting_policy', l.posting_policy, 'subject_tag', l.subject_tag,
        'header_text', l.header_text, 'footer_text', l.footer_text, 'verp_enabled', l.verp,
        'dmarc_mitigation', l.dmarc_mitigation, 'unsubscribe_url', l.unsubscribe_url,
        'max_post_size', l.max_post_size);
END
$$;

CREATE OR REPLACE FUNCTION pepsi.list_member_add(list bigint, address text, delivery text DEFAULT 'each',
                                      display_name text DEFAULT NULL, actor text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    added boolean;
BEGIN
    IF pepsi.list_banned(list, address) THEN
        RAISE EXCEPTION '% is banned from list %', address, list USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF (pepsi.list_resolve(address) ->> 'id')::bigint = list THEN
        RAISE EXCEPTION '% is an address of list % itself: a list cannot be its own member', address, list
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'Its posts would come back to it.';
    END IF;
    INSERT INTO pepsi.list_member AS m (list_id, address, delivery, display_name)
    VALUES (list, lower(list_member_add.address), coalesce(list_member_add.delivery, 'each'),
            list_member_add.display_name)
    ON CONFLICT ON CONSTRAINT list_member_pkey DO NOTHING;
    added := FOUND;
    IF added THEN
        PERFORM pepsi.event_log_write('list_subscribe',
            jsonb_build_object('list', list, 'address', lower(list_member_add.address), 'by', coalesce(actor, 'operator')));
    END IF;
    RETURN added;
END
$$;

CREATE OR REPLACE FUNCTION pepsi.list_request(list bigint, address text, action text, ttl interval) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    member boolean;
BEGIN
    IF list_request.action NOT IN ('subscribe', 'unsubscribe') THEN
        RAISE EXCEPTION 'action must be subscribe or unsubscribe, not %', list_request.action USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '30 days' THEN
        RAISE EXCEPTION 'invalid token lifetime %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to 30 days.';
    END IF;
    member := EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list
                      AND m.address = lower(list_request.address));
    IF (list_request.action = 'subscribe') = member
       OR (list_request.action = 'subscribe' AND pepsi.list_banned(list, list_request.address)) THEN
        RETURN NULL;
    END IF;
    PERFORM pepsi.list_pending_expire();
    INSERT INTO pepsi.list_pending (token_hash, list_id, address, action, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), list, lower(list_request.address), list_request.action, now() + ttl);
    RETURN token;
END
$$;

CREATE OR REPLACE FUNCTION pepsi.list_configure(list bigint, setting text, value text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    changed integer;
BEGIN
    IF setting NOT IN ('description', 'posting_policy', 'subject_tag', 'header_text', 'footer_text', 'verp',
                       'dmarc_mitigation', 'bounce_threshold', 'bounce_reset', 'unsubscribe_url',
                       'max_post_size', 'digest_format') THEN
        RAISE EXCEPTION 'a list has no setting "%"', setting USING ERRCODE = 'invalid_parameter_value',
            HINT = 'The settings: description, posting_policy, subject_tag, header_text, footer_text, verp, '
                   'dmarc_mitigation, bounce_threshold, bounce_reset, unsubscribe_url, max_post_size, digest_format.';
    END IF;
    IF value IS NULL THEN
        EXECUTE format('UPDATE pepsi.mailing_list SET %I = DEFAULT WHERE id = $1', setting) USING list;
    ELSE
        EXECUTE format('UPDATE pepsi.mailing_list SET %I = $2::%s WHERE id = $1', setting,
                       CASE setting WHEN 'verp' THEN 'boolean' WHEN 'bounce_threshold' THEN 'real'
                                    WHEN 'max_post_size' THEN 'integer'
                                    WHEN 'bounce_reset' THEN 'interval' ELSE 'text' END) USING list, value;
    END IF;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed = 0 THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM pepsi.event_log_write('list_configure',
        jsonb_build_object('list', list, 'setting', setting, 'value', left(value, 200)));
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'list_pending_expire', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_pending_expire');

CREATE TABLE pepsi.list_digest (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id       bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    workqueue_id  bigint NOT NULL,
    subject       text NOT NULL DEFAULT '',
    author        text NOT NULL DEFAULT '',
    sent_date     text NOT NULL DEFAULT '',
    message_id    text NOT NULL DEFAULT '',
    content_type  text NOT NULL DEFAULT 'text/plain',
    headers       bytea NOT NULL,
    body          bytea NOT NULL,
    added_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (list_id, workqueue_id)
);
COMMENT ON TABLE pepsi.list_digest IS
    'Posts waiting for the next digest of their list (copied at fan-out when the list has digest members)';

-- Copy the post on queue row workqueue_id (its headers as the list sends
-- them) for list's next digest, when the list has a digest member.  True
-- when copied; a second call for the same row copies nothing.
CREATE FUNCTION pepsi.list_digest_add(list bigint, workqueue_id bigint, subject text, author text, sent_date text,
                                      message_id text, content_type text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list AND m.delivery = 'digest'
                   AND m.disabled IS NULL) THEN
        RETURN false;
    END IF;
    INSERT INTO pepsi.list_digest (list_id, workqueue_id, subject, author, sent_date, message_id, content_type,
                                   headers, body)
    SELECT list, w.id, left(coalesce(list_digest_add.subject, ''), 500), left(coalesce(author, ''), 500),
           left(coalesce(sent_date, ''), 100), left(coalesce(message_id, ''), 500),
           lower(left(coalesce(nullif(content_type, ''), 'text/plain'), 200)), w.headers, b.body
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE w.id = list_digest_add.workqueue_id
    ON CONFLICT ON CONSTRAINT list_digest_list_id_workqueue_id_key DO NOTHING;
    RETURN FOUND;
END
$$;

-- One digest of list's waiting posts to its digest members, queued at
-- stage; the posts taken are deleted in the same transaction.
-- {"posts", "rows", "issue"}; posts 0 when nothing waited.
CREATE FUNCTION pepsi.list_digest_send(list bigint, stage text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    local text;
    domain text;
    posts integer;
    issue integer;
    boundary text := 'digest-' || replace(gen_random_uuid()::text, '-', '');
    toc text;
    head text;
    body bytea;
    g record;
    made integer := 0;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.id = list FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    local := split_part(l.address, '@', 1);
    domain := split_part(l.address, '@', 2);
    SELECT count(*), string_agg(format('%4s. %s (%s)', d.n, d.subject, d.author), E'\r\n' ORDER BY d.n)
    INTO posts, toc
    FROM (SELECT row_number() OVER (ORDER BY x.id) AS n, coalesce(nullif(x.subject, ''), '(no subject)') AS subject,
                 x.author FROM pepsi.list_digest x WHERE x.list_id = list) d;
    IF posts = 0 THEN
        RETURN jsonb_build_object('posts', 0, 'rows', 0);
    END IF;
    issue := l.digest_issue + 1;
    UPDATE pepsi.mailing_list m SET digest_issue = issue WHERE m.id = list;
    head := format(E'From: <%s-request@%s>\r\nTo: <%s>\r\nSubject: %s Digest, Issue %s (%s message%s)\r\n'
                   'Date: %s\r\nMessage-ID: <digest.%s.%s.%s@%s>\r\nList-Id: <%s.%s>\r\nList-Post: <mailto:%s>\r\n'
                   'List-Unsubscribe: <mailto:%s-unsubscribe@%s>\r\nX-Loop: %s\r\nPrecedence: list\r\nMIME-Version: 1.0\r\n',
                   local, domain, l.address, local, issue, posts, CASE WHEN posts = 1 THEN '' ELSE 's' END,
                   to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS') || ' +0000',
                   l.id, issue, left(boundary, 16), domain, local, domain, l.address, local, domain, l.address);
    IF l.digest_format = 'mime' THEN
        head := head || format(E'Content-Type: multipart/mixed; boundary="%s"\r\n', boundary);
        SELECT convert_to(format(E'This is a MIME digest (RFC 2046 multipart/digest).\r\n\r\n--%s\r\n'
                                 'Content-Type: text/plain; charset=utf-8\r\nContent-Description: Today''s Topics\r\n\r\n'
                                 'Today''s Topics:\r\n\r\n%s\r\n\r\n--%s\r\nContent-Type: multipart/digest; boundary="%s-d"\r\n\r\n',
                                 boundary, toc, boundary, boundary), 'UTF8')
               || string_agg(convert_to(format(E'--%s-d\r\n\r\n', boundary), 'UTF8') || x.headers || '\x0d0a'::bytea
                             || x.body || CASE WHEN length(x.body) > 0 AND get_byte(x.body, length(x.body) - 1) = 10
                                               THEN ''::bytea ELSE '\x0d0a'::bytea END, ''::bytea ORDER BY x.id)
               || convert_to(format(E'--%s-d--\r\n\r\n--%s--\r\n', boundary, boundary), 'UTF8')
        INTO body FROM pepsi.list_digest x WHERE x.list_id = list;
    ELSE
        head := head || E'Content-Type: text/plain; charset=utf-8\r\n';
        SELECT convert_to(format(E'Today''s Topics:\r\n\r\n%s\r\n\r\n%s\r\n\r\n', toc, repeat('-', 70)), 'UTF8')
               || string_agg(convert_to(format(E'Date: %s\r\nFrom: %s\r\nSubject: %s\r\nMessage-ID: %s\r\n\r\n',
                                               x.sent_date, x.author, x.subject, x.message_id), 'UTF8')
                             || CASE WHEN x.content_type LIKE 'text/plain%' THEN x.body
                                     ELSE convert_to(format(E'[A %s message, left out of the plain digest.]\r\n',
                                                            split_part(x.content_type, ';', 1)), 'UTF8') END
                             || convert_to(E'\r\n' || repeat('-', 30) || E'\r\n\r\n', 'UTF8'), ''::bytea ORDER BY x.id)
               || convert_to(format(E'End of %s Digest, Issue %s\r\n%s\r\n', local, issue,
                                    repeat('*', length(format('End of %s Digest, Issue %s', local, issue)))), 'UTF8')
        INTO body FROM pepsi.list_digest x WHERE x.list_id = list;
    END IF;
    FOR g IN SELECT split_part(m.address, '@', 2) AS dom, array_agg(m.address ORDER BY m.address) AS rcpt
             FROM pepsi.list_member m WHERE m.list_id = list AND m.delivery = 'digest' AND m.disabled IS NULL
             GROUP BY 1 ORDER BY 1
    LOOP
        PERFORM pepsi.workqueue_inject(stage, local || '-bounces@' || domain, g.rcpt, convert_to(head, 'UTF8'), body,
            jsonb_build_object('origin', jsonb_build_object('trust', 'list', 'program', 'pepsi-stage-list',
                                                            'list', l.address, 'domain', domain),
                               'list', jsonb_build_object('digest', issue)),
            format('list-digest-%s-%s-%s', list, issue, g.dom));
        made := made + 1;
    END LOOP;
    DELETE FROM pepsi.list_digest x WHERE x.list_id = list;
    RETURN jsonb_build_object('posts', posts, 'rows', made, 'issue', issue);
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'list_digest_add', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_digest_send', '{EXECUTE}'),
    ('pepsi_config', 'table', 'list_digest', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_digest_add'), ('list_digest_send');

-- The web forms of pepsi-httpd (/list/form/...): a subscribe or
-- unsubscribe request for address, made as if address had mailed
-- list-subscribe@ or list-unsubscribe@: a message injected at the
-- admission stage (init, where pepsi-stage-list takes it), from address, whose
-- answer is the mail carrying the confirmation token and link (double
-- opt-in: nothing changes until the token comes back).  One live request
-- per list, address and action (its token).  NULL when queued, else why not.
CREATE FUNCTION pepsi.list_web_request(list text, address text, action text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    who text := lower(trim(coalesce(address, '')));
    target text;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = lower(list_web_request.list);
    IF NOT FOUND THEN
        RETURN 'there is no such list';
    ELSIF list_web_request.action IS NULL OR list_web_request.action NOT IN ('subscribe', 'unsubscribe') THEN
        RETURN 'the action must be subscribe or unsubscribe';
    ELSIF who !~ '^[a-z0-9.!#$%&''*+/=?^_`{|}~-]+@[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$'
          OR length(who) > 254 THEN
        RETURN 'that is not an e-mail address';
    ELSIF pepsi.list_resolve(who) IS NOT NULL THEN
        RETURN 'a list address cannot subscribe';
    END IF;
    target := split_part(l.address, '@', 1) || '-' || list_web_request.action || '@' || split_part(l.address, '@', 2);
    PERFORM pepsi.workqueue_inject('init', who, ARRAY[target],
        convert_to(format(E'From: <%s>\r\nTo: <%s>\r\nSubject: %s\r\nMessage-ID: <web.%s@%s>\r\n'
                          'Date: %s\r\nX-Pepsi-Web-Request: yes\r\n',
                          who, target, list_web_request.action, replace(gen_random_uuid()::text, '-', ''),
                          split_part(l.address, '@', 2),
                          to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS') || ' +0000'), 'UTF8'),
        convert_to(list_web_request.action || E'\r\n', 'UTF8'),
        jsonb_build_object('origin', jsonb_build_object('trust', 'pepsi', 'program', 'pepsi-httpd')),
        format('list-web-%s-%s-%s', l.id, list_web_request.action, who));
    PERFORM pepsi.event_log_write('list_web_request',
        jsonb_build_object('list', l.id, 'address', who, 'action', list_web_request.action));
    RETURN NULL;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_httpd', 'function', 'list_web_request', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'list_confirm', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_web_request');

SELECT pg_catalog.pg_extension_config_dump('pepsi.list_digest', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_digest_id_seq', '');
SELECT pepsi.grant_apply();
-- end of list digests, post size limit, DMARC wrap

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

-- ===========================================================================
-- telemetry: message volumes by day
--
-- pepsi-telemetry-client (opt-in) reports the messages received,
-- delivered, deferred and bounced per UTC day, and nothing per message.
-- The counters are totals since installation (pepsi.stats_totals), so the
-- maintenance worker's first roll of each day (pepsi.stats_minute_roll)
-- keeps them in pepsi.stats_day, 400 days, and a day's volume is the next
-- day's totals less its own.
-- ===========================================================================

CREATE OR REPLACE FUNCTION pepsi.stats_minute_roll() RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    stored boolean;
BEGIN
    INSERT INTO pepsi.stats_minute
    SELECT date_trunc('minute', now()), t.* FROM pepsi.stats_totals() t
    ON CONFLICT ON CONSTRAINT stats_minute_pkey DO NOTHING;
    stored := FOUND;
    DELETE FROM pepsi.stats_minute m WHERE m.minute < now() - interval '25 hours';
    -- The day's first roll keeps the totals for pepsi.stats_daily (telemetry).
    INSERT INTO pepsi.stats_day
    SELECT (now() AT TIME ZONE 'UTC')::date, t.received, t.sent, t.deferred, t.bounced
    FROM pepsi.stats_totals() t
    ON CONFLICT ON CONSTRAINT stats_day_pkey DO NOTHING;
    DELETE FROM pepsi.stats_day d WHERE d.day < (now() AT TIME ZONE 'UTC')::date - 400;
    RETURN stored;
END
$$;

CREATE TABLE pepsi.stats_day (
    day         date PRIMARY KEY,
    received    bigint NOT NULL,
    sent        bigint NOT NULL,
    deferred    bigint NOT NULL,
    bounced     bigint NOT NULL
);
COMMENT ON TABLE pepsi.stats_day IS
    'The totals of pepsi.stats_totals at the first minute of each UTC day (maintenance worker), 400 days';

-- The complete UTC days of the last "days" (today excluded) whose two
-- ends are known, with what was received, delivered, deferred and bounced
-- in each.
CREATE FUNCTION pepsi.stats_daily(days integer DEFAULT 7)
RETURNS TABLE (day date, received bigint, delivered bigint, deferred bigint, bounced bigint)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF days IS NULL OR days < 1 OR days > 366 THEN
        RAISE EXCEPTION 'days must be from 1 to 366'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH points AS (
        SELECT d.day, d.received, d.sent, d.deferred, d.bounced FROM pepsi.stats_day d
        WHERE d.day >= (now() AT TIME ZONE 'UTC')::date - days
    ), steps AS (
        SELECT p.day, lead(p.day) OVER w AS next_day,
               greatest(lead(p.received) OVER w - p.received, 0) AS received,
               greatest(lead(p.sent) OVER w - p.sent, 0) AS delivered,
               greatest(lead(p.deferred) OVER w - p.deferred, 0) AS deferred,
               greatest(lead(p.bounced) OVER w - p.bounced, 0) AS bounced
        FROM points p WINDOW w AS (ORDER BY p.day)
    )
    SELECT s.day, s.received, s.delivered, s.deferred, s.bounced
    FROM steps s WHERE s.next_day = s.day + 1
    ORDER BY s.day;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_monitor', 'table', 'stats_day', '{SELECT}'),
    ('pepsi_monitor', 'function', 'stats_daily', '{EXECUTE}'),
    ('pepsi_config', 'table', 'stats_day', '{SELECT}');

SELECT pg_catalog.pg_extension_config_dump('pepsi.stats_day', '');
SELECT pepsi.grant_apply();
-- end of telemetry

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

-- ===========================================================================
-- The mailing lists' web archive (pepsi-archive(8), pepsi-httpd's archive
-- pages; issue 40, items 4-5)
--
-- Every post a list accepts is stored once, as its OWN copy: the list stage
-- calls archive_post(list, row) before the fan-out, which copies the row's
-- headers and body server-side into pepsi.archive_message.raw, so the
-- body garbage collector owes the archive nothing (the queue's body goes
-- when the last delivery does).  pepsi-archive import feeds an mbox through
-- archive_store.  A message is parsed here (headers unfolded, RFC 2047
-- words decoded, MIME walked, transfer encodings undone) into its text, one
-- tsvector (GIN-indexed) and its attachments; it joins the thread of the
-- nearest message it names (References, then In-Reply-To, nearest first,
-- as MHonArc and JWZ do), and a message arriving late adopts the messages
-- that named it.  What was wrong with a message (no Message-Id, broken
-- MIME, an attachment over the list's limit) is kept with it in problems
-- and written to event_log; it is still archived.  Members of a private
-- list read it after logging in with a single-use link mailed to them
-- (archive_login, archive_session).
-- ===========================================================================

CREATE TABLE pepsi.archive_policy (
    list_id          bigint PRIMARY KEY REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    enabled          boolean NOT NULL DEFAULT true,
    visibility       text NOT NULL DEFAULT 'public' CHECK (visibility IN ('public', 'private')),
    obfuscation      text NOT NULL DEFAULT 'at' CHECK (obfuscation IN ('none', 'at', 'hide')),
    max_attachment   bigint NOT NULL DEFAULT 10485760 CHECK (max_attachment >= 0)
);
COMMENT ON TABLE pepsi.archive_policy IS
    'Per list: archived or not, public or members only, how addresses are obfuscated, the largest attachment kept';

CREATE TABLE pepsi.archive_thread (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id       bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    subject       text,
    started_at    timestamptz NOT NULL,
    last_at       timestamptz NOT NULL,
    message_count integer NOT NULL DEFAULT 0
);
CREATE INDEX archive_thread_list_started ON pepsi.archive_thread (list_id, started_at);
COMMENT ON TABLE pepsi.archive_thread IS 'Threads of a list''s archive (its first message''s subject and dates)';

CREATE TABLE pepsi.archive_message (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id      bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    message_id   text NOT NULL,
    thread_id    bigint REFERENCES pepsi.archive_thread ON DELETE SET NULL,
    parent_id    bigint REFERENCES pepsi.archive_message ON DELETE SET NULL,
    subject      text,
    from_name    text,
    from_address text,
    sent_at      timestamptz NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT now(),
    raw          bytea NOT NULL,
    body_text    text NOT NULL DEFAULT '',
    search       tsvector NOT NULL DEFAULT ''::tsvector,
    problems     text[] NOT NULL DEFAULT '{}',
    UNIQUE (list_id, message_id)
);
CREATE INDEX archive_message_search ON pepsi.archive_message USING gin (search);
CREATE INDEX archive_message_list_sent ON pepsi.archive_message (list_id, sent_at);
CREATE INDEX archive_message_thread ON pepsi.archive_message (thread_id, sent_at);
CREATE INDEX archive_message_parent ON pepsi.archive_message (parent_id);
COMMENT ON TABLE pepsi.archive_message IS
    'Archived posts: the archive''s own copy (raw), its text, its tsvector, its thread and parent, what was wrong with it';

CREATE TABLE pepsi.archive_reference (
    message_id bigint NOT NULL REFERENCES pepsi.archive_message ON DELETE CASCADE,
    position   integer NOT NULL,
    list_id    bigint NOT NULL,
    referenced text NOT NULL,
    PRIMARY KEY (message_id, position)
);
CREATE INDEX archive_reference_referenced ON pepsi.archive_reference (list_id, referenced);
COMMENT ON TABLE pepsi.archive_reference IS
    'The Message-Ids a message names (References, then In-Reply-To), in order: late arrivals find their replies here';

CREATE TABLE pepsi.archive_attachment (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   bigint NOT NULL REFERENCES pepsi.archive_message ON DELETE CASCADE,
    position     integer NOT NULL,
    filename     text,
    content_type text NOT NULL,
    size         bigint NOT NULL,
    content      bytea,
    withheld     text,
    UNIQUE (message_id, position)
);
COMMENT ON TABLE pepsi.archive_attachment IS
    'Attachments of archived posts, decoded; content NULL and withheld saying why when over the list''s limit';

CREATE TABLE pepsi.archive_month (
    list_id  bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    month    date NOT NULL,
    messages integer NOT NULL DEFAULT 0,
    PRIMARY KEY (list_id, month)
);
COMMENT ON TABLE pepsi.archive_month IS 'How many posts each month of a list''s archive holds (the index page)';

CREATE TABLE pepsi.archive_import (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id     bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    source      text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    messages    integer NOT NULL DEFAULT 0,
    duplicates  integer NOT NULL DEFAULT 0,
    problems    integer NOT NULL DEFAULT 0
);
COMMENT ON TABLE pepsi.archive_import IS 'Every mbox pepsi-archive imported: where from, how many posts, duplicates and problems';

CREATE TABLE pepsi.archive_login (
    token_hash bytea PRIMARY KEY,
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
COMMENT ON TABLE pepsi.archive_login IS
    'Single-use login links mailed to a list''s members and owners (only their SHA-256 kept)';

CREATE TABLE pepsi.archive_session (
    token_hash bytea PRIMARY KEY,
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address    text NOT NULL,
    csrf       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX archive_session_expires_at ON pepsi.archive_session (expires_at);
COMMENT ON TABLE pepsi.archive_session IS
    'Logged-in readers of a list''s archive (the cookie''s SHA-256) and their CSRF token';

-- bytes as text, one character per byte (LATIN1 maps every byte), so the
-- parser below can use text functions on any message and give the bytes
-- back exactly with convert_to(..., 'LATIN1').
CREATE FUNCTION pepsi.archive_bytes_text(raw bytea) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT convert_from(raw, 'LATIN1')
$$;

-- bytes in charset as text; UTF-8 then Latin-1 when charset is unknown or
-- the bytes are not valid in it.
CREATE FUNCTION pepsi.archive_decode_charset(raw bytea, charset text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    BEGIN
        RETURN convert_from(raw, CASE WHEN coalesce(charset, '') IN ('', 'us-ascii', 'ascii') THEN 'UTF8'
                                      ELSE charset END);
    EXCEPTION WHEN OTHERS THEN
        BEGIN
            RETURN convert_from(raw, 'UTF8');
        EXCEPTION WHEN OTHERS THEN
            RETURN convert_from(raw, 'LATIN1');
        END;
    END;
END
$$;

-- Quoted-printable to bytes (soft line breaks joined, =XX decoded, a
-- stray = kept).
CREATE FUNCTION pepsi.archive_qp_decode(encoded text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(string_agg(CASE WHEN m[1] IS NOT NULL THEN decode(m[1], 'hex')
                                    ELSE convert_to(m[2], 'LATIN1') END, ''::bytea ORDER BY n), ''::bytea)
    FROM regexp_matches(regexp_replace(encoded, '=\r?\n', '', 'g'), '=([0-9A-Fa-f]{2})|([^=]+|=)', 'g')
         WITH ORDINALITY AS x(m, n)
$$;

-- Base64 to bytes; NULL when it is not base64.
CREATE FUNCTION pepsi.archive_base64_decode(encoded text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    clean text := regexp_replace(encoded, '[^A-Za-z0-9+/]', '', 'g');
BEGIN
    clean := clean || repeat('=', (4 - length(clean) % 4) % 4);
    RETURN decode(clean, 'base64');
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;

-- A header field value with RFC 2047 encoded words decoded (whitespace
-- between two encoded words dropped, as the RFC says).
CREATE FUNCTION pepsi.archive_decode_words(value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    word text[];
    decoded bytea;
    result text := '';
    rest text := regexp_replace(value, '(\?=)\s+(=\?)', '\1\2', 'g');
    at integer;
BEGIN
    IF value IS NULL OR position('=?' IN value) = 0 THEN
        RETURN value;
    END IF;
    FOR i IN 1..100 LOOP
        word := regexp_match(rest, '=\?([^?*]+)(?:\*[^?]*)?\?([BbQq])\?([^?]*)\?=');
        EXIT WHEN word IS NULL;
        at := position('=?' || word[1] IN rest);
        decoded := CASE WHEN upper(word[2]) = 'B' THEN pepsi.archive_base64_decode(word[3])
                        ELSE pepsi.archive_qp_decode(replace(word[3], '_', ' ')) END;
        result := result || left(rest, at - 1)
                  || coalesce(pepsi.archive_decode_charset(decoded, lower(word[1])), word[3]);
        rest := substr(rest, at + length(word[1]) + length(word[3]) + 6);
        rest := substr(rest, position('?=' IN rest) + 2);
    END LOOP;
    RETURN result || rest;
END
$$;

-- The first field called name in a header block (as text), unfolded;
-- NULL when absent.
CREATE FUNCTION pepsi.archive_header(headers text, name text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT btrim((regexp_match(regexp_replace(E'\n' || headers, E'\r?\n[ \t]+', ' ', 'g'),
                               E'\n' || name || E':[ \t]*([^\r\n]*)', 'i'))[1])
$$;

-- A parameter of a structured header value (boundary, charset, name).
CREATE FUNCTION pepsi.archive_header_parameter(value text, name text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce((regexp_match(value, ';\s*' || name || '\s*=\s*"([^"]*)"', 'i'))[1],
                    (regexp_match(value, ';\s*' || name || '\s*=\s*([^;\s]+)', 'i'))[1])
$$;

-- The <...> message ids in a header value, in order.
CREATE FUNCTION pepsi.archive_message_ids(value text) RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(array_agg(m[1] ORDER BY n), '{}')
    FROM regexp_matches(coalesce(value, ''), '<([^<>\s]+)>', 'g') WITH ORDINALITY AS x(m, n)
$$;

-- The leaf parts of a MIME entity (LF line ends, one character per byte):
-- type, charset, filename, whether it is the message's text (text/plain
-- not marked as an attachment), its decoded bytes, and what was wrong with
-- it.  A multipart without its boundary, a bad base64 part or nesting past
-- ten levels is returned whole as text, with the problem named.
CREATE FUNCTION pepsi.archive_mime_parts(entity text, depth integer)
RETURNS TABLE (content_type text, charset text, filename text, is_text boolean, content bytea, problem text)
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    split integer := CASE WHEN left(entity, 1) = E'\n' THEN 1 ELSE position(E'\n\n' IN entity) END;
    head text := CASE WHEN split > 0 THEN left(entity, split) ELSE entity END;
    body text := CASE WHEN split > 0 THEN substr(entity, split + CASE WHEN split = 1 THEN 1 ELSE 2 END) ELSE '' END;
    ctype_field text := coalesce(pepsi.archive_header(head, 'Content-Type'), 'text/plain');
    ctype text := lower(btrim(split_part(ctype_field, ';', 1)));
    encoding text := lower(coalesce(pepsi.archive_header(head, 'Content-Transfer-Encoding'), '7bit'));
    disposition text := pepsi.archive_header(head, 'Content-Disposition');
    boundary text;
    closing integer;
    parts text[];
    decoded bytea;
    fault text;
BEGIN
    IF ctype LIKE 'multipart/%' AND depth < 10 THEN
        boundary := pepsi.archive_header_parameter(ctype_field, 'boundary');
        IF boundary IS NOT NULL THEN
            boundary := regexp_replace(boundary, '([^A-Za-z0-9])', '\\\1', 'g');
            closing := position(E'\n--' || pepsi.archive_header_parameter(ctype_field, 'boundary') || '--' IN E'\n' || body);
            IF closing > 0 THEN
                body := left(E'\n' || body, closing);
            ELSE
                body := E'\n' || body;
            END IF;
            parts := regexp_split_to_array(body, E'\n--' || boundary || E'[ \t]*\n');
            IF array_length(parts, 1) > 1 THEN
                FOR i IN 2..array_length(parts, 1) LOOP
                    RETURN QUERY SELECT * FROM pepsi.archive_mime_parts(parts[i], depth + 1);
                END LOOP;
                IF closing = 0 THEN
                    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, false, NULL::bytea,
                                        'broken MIME: a ' || ctype || ' without its closing boundary';
                END IF;
                RETURN;
            END IF;
            fault := 'broken MIME: no part of the ' || ctype || ' has its boundary';
        ELSE
            fault := 'broken MIME: a ' || ctype || ' without a boundary';
        END IF;
        RETURN QUERY SELECT 'text/plain'::text, NULL::text, NULL::text, true, convert_to(body, 'LATIN1'), fault;
        RETURN;
    ELSIF ctype = 'message/rfc822' AND depth < 10 THEN
        RETURN QUERY SELECT * FROM pepsi.archive_mime_parts(body, depth + 1);
        RETURN;
    ELSIF ctype LIKE 'multipart/%' THEN
        fault := 'broken MIME: nested more than ten levels deep';
    END IF;
    IF encoding = 'base64' THEN
        decoded := pepsi.archive_base64_decode(body);
        IF decoded IS NULL THEN
            fault := 'broken MIME: a ' || ctype || ' part is not valid base64';
        END IF;
    ELSIF encoding = 'quoted-printable' THEN
        decoded := pepsi.archive_qp_decode(body);
    END IF;
    RETURN QUERY SELECT ctype, lower(pepsi.archive_header_parameter(ctype_field, 'charset')),
        pepsi.archive_decode_words(coalesce(pepsi.archive_header_parameter(disposition, 'filename'),
                                            pepsi.archive_header_parameter(ctype_field, 'name'))),
        ctype = 'text/plain' AND coalesce(lower(disposition), '') NOT LIKE 'attachment%',
        coalesce(decoded, convert_to(body, 'LATIN1')), fault;
END
$$;

-- The list's archive policy, its defaults when it has no row.
CREATE FUNCTION pepsi.archive_policy_of(list bigint) RETURNS pepsi.archive_policy
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce((SELECT p FROM pepsi.archive_policy p WHERE p.list_id = list),
                    ROW(list, true, 'public', 'at', 10485760)::pepsi.archive_policy)
$$;

-- (Re)build an archived message's fields from its raw copy: subject,
-- sender, date, text, tsvector, attachments, references, problems.
CREATE FUNCTION pepsi.archive_index_message(message bigint) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m pepsi.archive_message;
    policy pepsi.archive_policy;
    entity text;
    head text;
    field text;
    refs text[];
    sent timestamptz;
    body text := '';
    found text[] := '{}';
    part record;
    attached integer := 0;
BEGIN
    SELECT * INTO m FROM pepsi.archive_message a WHERE a.id = message;
    policy := pepsi.archive_policy_of(m.list_id);
    entity := replace(pepsi.archive_bytes_text(m.raw), E'\r\n', E'\n');
    head := CASE WHEN position(E'\n\n' IN entity) > 0 THEN left(entity, position(E'\n\n' IN entity)) ELSE entity END;
    IF m.message_id LIKE 'no-message-id.%@archive.invalid' THEN
        found := found || ('no Message-Id: archived as <' || m.message_id || '>');
    END IF;
    field := pepsi.archive_header(head, 'Date');
    BEGIN
        sent := regexp_replace(field, '\s*\([^)]*\)\s*$', '')::timestamptz;
    EXCEPTION WHEN OTHERS THEN
        sent := NULL;
    END;
    IF sent IS NULL THEN
        found := found || ('no readable Date: (' || coalesce(left(field, 80), 'none') || '): the archiving time stands for it');
    END IF;
    field := pepsi.archive_decode_words(pepsi.archive_header(head, 'From'));
    refs := pepsi.archive_message_ids(pepsi.archive_header(head, 'References'));
    refs := refs || ARRAY(SELECT i FROM unnest(pepsi.archive_message_ids(pepsi.archive_header(head, 'In-Reply-To'))) i
                          WHERE i <> ALL (refs));
    DELETE FROM pepsi.archive_reference r WHERE r.message_id = message;
    INSERT INTO pepsi.archive_reference (message_id, position, list_id, referenced)
    SELECT message, n, m.list_id, r FROM unnest(refs[greatest(1, cardinality(refs) - 99):]) WITH ORDINALITY AS x(r, n)
    WHERE r <> m.message_id;
    DELETE FROM pepsi.archive_attachment a WHERE a.message_id = message;
    FOR part IN SELECT * FROM pepsi.archive_mime_parts(entity, 0) LOOP
        IF part.problem IS NOT NULL THEN
            found := found || part.problem;
        END IF;
        IF part.content IS NULL THEN
            CONTINUE;
        ELSIF part.is_text AND part.filename IS NULL THEN
            body := body || pepsi.archive_decode_charset(part.content, part.charset) || E'\n';
        ELSE
            attached := attached + 1;
            IF length(part.content) > policy.max_attachment THEN
                found := found || format('attachment %s (%s, %s bytes) is over the list''s max_attachment (%s bytes): not kept',
                                               attached, part.content_type, length(part.content), policy.max_attachment);
            END IF;
            INSERT INTO pepsi.archive_attachment (message_id, position, filename, content_type, size, content, withheld)
            VALUES (message, attached, left(part.filename, 255), coalesce(part.content_type, 'application/octet-stream'),
                    length(part.content),
                    CASE WHEN length(part.content) <= policy.max_attachment THEN part.content END,
                    CASE WHEN length(part.content) > policy.max_attachment
                         THEN format('over the list''s max_attachment (%s bytes)', policy.max_attachment) END);
        END IF;
    END LOOP;
    IF length(body) > 500000 THEN
        found := found || 'a text over 500000 characters: only its start is searchable';
    END IF;
    UPDATE pepsi.archive_message a SET
        subject = left(pepsi.archive_decode_words(pepsi.archive_header(head, 'Subject')), 1000),
        from_address = lower(coalesce((regexp_match(field, '<([^<>\s]+@[^<>\s]+)>'))[1],
                                      (regexp_match(field, '([^<>\s"]+@[^<>\s"]+)'))[1])),
        from_name = CASE WHEN field LIKE '%<%' THEN nullif(btrim(regexp_replace(field, '\s*<[^<>]*>\s*$', ''), E' \t"'), '') END,
        sent_at = coalesce(sent, a.archived_at), body_text = body,
        search = setweight(to_tsvector('simple', coalesce(pepsi.archive_decode_words(pepsi.archive_header(head, 'Subject')), '')), 'A')
                 || setweight(to_tsvector('simple', left(body, 500000)), 'B'),
        problems = found
    WHERE a.id = message;
    RETURN found;
END
$$;

-- Recompute a thread's subject (its first root's), dates and size; a
-- thread left with no message goes.
CREATE FUNCTION pepsi.archive_thread_refresh(threads bigint[]) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    DELETE FROM pepsi.archive_thread t WHERE t.id = ANY (threads)
        AND NOT EXISTS (SELECT FROM pepsi.archive_message m WHERE m.thread_id = t.id);
    UPDATE pepsi.archive_thread t SET message_count = s.n, started_at = s.first, last_at = s.last,
        subject = (SELECT m.subject FROM pepsi.archive_message m WHERE m.thread_id = t.id
                   ORDER BY m.parent_id IS NULL DESC, m.sent_at, m.id LIMIT 1)
    FROM (SELECT m.thread_id, count(*) AS n, min(m.sent_at) AS first, max(m.sent_at) AS last
          FROM pepsi.archive_message m WHERE m.thread_id = ANY (threads) GROUP BY m.thread_id) s
    WHERE t.id = s.thread_id;
$$;

-- Put an archived message in its thread: under the nearest message it
-- names that is archived (References then In-Reply-To, last first), else
-- at the root of a new thread; then adopt the messages that name it more
-- nearly than their present parent (they arrived first), their replies
-- moving with them.
CREATE FUNCTION pepsi.archive_thread_message(message bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m pepsi.archive_message;
    parent pepsi.archive_message;
    thread bigint;
    adopted bigint[];
    moved bigint[];
BEGIN
    SELECT * INTO m FROM pepsi.archive_message a WHERE a.id = message;
    SELECT p.* INTO parent FROM pepsi.archive_reference r
    JOIN pepsi.archive_message p ON p.list_id = r.list_id AND p.message_id = r.referenced
    WHERE r.message_id = message AND p.id <> message
    ORDER BY r.position DESC LIMIT 1;
    IF parent.id IS NOT NULL AND parent.thread_id IS NOT NULL THEN
        thread := parent.thread_id;
    ELSE
        INSERT INTO pepsi.archive_thread (list_id, subject, started_at, last_at)
        VALUES (m.list_id, m.subject, m.sent_at, m.sent_at) RETURNING id INTO thread;
    END IF;
    UPDATE pepsi.archive_message a SET parent_id = parent.id, thread_id = thread WHERE a.id = message;
    WITH RECURSIVE ancestor(id) AS (SELECT parent.id UNION SELECT a.parent_id FROM pepsi.archive_message a
                                    JOIN ancestor x ON a.id = x.id WHERE a.parent_id IS NOT NULL)
    SELECT array_agg(DISTINCT c.id) INTO adopted
    FROM pepsi.archive_reference r JOIN pepsi.archive_message c ON c.id = r.message_id
    WHERE r.list_id = m.list_id AND r.referenced = m.message_id AND c.id <> message
      AND c.id NOT IN (SELECT x.id FROM ancestor x WHERE x.id IS NOT NULL)
      AND r.position > coalesce((SELECT max(r2.position) FROM pepsi.archive_reference r2
                                 JOIN pepsi.archive_message p ON p.id = c.parent_id
                                 WHERE r2.message_id = c.id AND r2.referenced = p.message_id), 0);
    IF adopted IS NOT NULL THEN
        UPDATE pepsi.archive_message a SET parent_id = message WHERE a.id = ANY (adopted);
        WITH RECURSIVE subtree(id) AS (SELECT unnest(adopted) UNION SELECT a.id FROM pepsi.archive_message a
                                       JOIN subtree s ON a.parent_id = s.id)
        SELECT array_agg(DISTINCT a.thread_id) INTO moved FROM pepsi.archive_message a
        WHERE a.id IN (SELECT id FROM subtree);
        WITH RECURSIVE subtree(id) AS (SELECT unnest(adopted) UNION SELECT a.id FROM pepsi.archive_message a
                                       JOIN subtree s ON a.parent_id = s.id)
        UPDATE pepsi.archive_message a SET thread_id = thread WHERE a.id IN (SELECT id FROM subtree);
    END IF;
    PERFORM pepsi.archive_thread_refresh(array_append(coalesce(moved, '{}'), thread));
    RETURN thread;
END
$$;

-- Archive one message (raw: headers, blank line, body) in list, once: the
-- archive's id of it, or NULL when the list has it already (same
-- Message-Id; a message without one is named by its SHA-256).  What was
-- wrong with it is written to event_log.
CREATE FUNCTION pepsi.archive_store(list bigint, raw bytea, source text DEFAULT 'post') RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    entity text := replace(pepsi.archive_bytes_text(raw), E'\r\n', E'\n');
    message_id text;
    stored bigint;
    problems text[];
BEGIN
    IF NOT EXISTS (SELECT FROM pepsi.mailing_list l WHERE l.id = list) THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    entity := CASE WHEN position(E'\n\n' IN entity) > 0 THEN left(entity, position(E'\n\n' IN entity)) ELSE entity END;
    message_id := left((pepsi.archive_message_ids(pepsi.archive_header(entity, 'Message-Id')))[1], 900);
    IF message_id IS NULL THEN
        message_id := 'no-message-id.' || encode(sha256(raw), 'hex') || '@archive.invalid';
    END IF;
    INSERT INTO pepsi.archive_message AS a (list_id, message_id, sent_at, raw)
    VALUES (list, message_id, now(), raw)
    ON CONFLICT ON CONSTRAINT archive_message_list_id_message_id_key DO NOTHING
    RETURNING a.id INTO stored;
    IF stored IS NULL THEN
        RETURN NULL;
    END IF;
    problems := pepsi.archive_index_message(stored);
    PERFORM pepsi.archive_thread_message(stored);
    -- An import recounts the months once at its end (archive_import_finish):
    -- a row updated per message of one transaction would grow a chain of
    -- dead versions that every later update walks.
    IF source <> 'import' THEN
        INSERT INTO pepsi.archive_month AS x (list_id, month, messages)
        SELECT list, date_trunc('month', a.sent_at AT TIME ZONE 'UTC')::date, 1 FROM pepsi.archive_message a
        WHERE a.id = stored
        ON CONFLICT ON CONSTRAINT archive_month_pkey DO UPDATE SET messages = x.messages + 1;
    END IF;
    IF cardinality(problems) > 0 THEN
        PERFORM pepsi.event_log_write('archive_problem', jsonb_build_object('list', list, 'message', stored,
            'message_id', message_id, 'source', source, 'problems', to_jsonb(problems)));
    END IF;
    RETURN stored;
END
$$;

-- The list stage's call for an accepted post (its row at the stage): the
-- archive copies the row's headers and body server-side.  NULL when the
-- list keeps no archive or has the post already.
CREATE FUNCTION pepsi.archive_post(list bigint, row_id bigint) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pepsi.archive_store(list, w.headers || '\x0d0a'::bytea || b.body, 'post')
    FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
    WHERE w.id = row_id AND (pepsi.archive_policy_of(list)).enabled
$$;

-- Count a list's archive by month again.
CREATE FUNCTION pepsi.archive_month_recount(list bigint) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    DELETE FROM pepsi.archive_month x WHERE x.list_id = list;
    INSERT INTO pepsi.archive_month (list_id, month, messages)
    SELECT list, date_trunc('month', m.sent_at AT TIME ZONE 'UTC')::date, count(*)
    FROM pepsi.archive_message m WHERE m.list_id = list GROUP BY 2;
$$;

-- pepsi-archive import: begin a run (its id), then archive_store each
-- message, then archive_import_finish; audited.
CREATE FUNCTION pepsi.archive_import_begin(list bigint, source text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    INSERT INTO pepsi.archive_import (list_id, source) VALUES (list, left(source, 1000)) RETURNING id
$$;

CREATE FUNCTION pepsi.archive_import_finish(import bigint, messages integer, duplicates integer) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    i pepsi.archive_import;
BEGIN
    UPDATE pepsi.archive_import x SET finished_at = clock_timestamp(), messages = archive_import_finish.messages,
        duplicates = archive_import_finish.duplicates,
        problems = (SELECT count(*) FROM pepsi.archive_message m WHERE m.list_id = x.list_id
                    AND m.archived_at = x.started_at AND cardinality(m.problems) > 0)
    WHERE x.id = import RETURNING * INTO i;
    PERFORM pepsi.archive_month_recount(i.list_id);
    PERFORM pepsi.event_log_write('archive_import', jsonb_build_object('list', i.list_id, 'source', i.source,
        'messages', i.messages, 'duplicates', i.duplicates, 'problems', i.problems));
    RETURN jsonb_build_object('messages', i.messages, 'duplicates', i.duplicates, 'problems', i.problems);
END
$$;

-- pepsi-archive export: record that the list's archive was exported.
CREATE FUNCTION pepsi.archive_exported(list bigint, messages bigint, target text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pepsi.event_log_write('archive_export',
        jsonb_build_object('list', list, 'messages', messages, 'target', left(target, 1000)))
$$;

-- pepsi-archive reindex: every message of list parsed again from its raw
-- copy and threaded again in date order; audited.  Returns how many.
CREATE FUNCTION pepsi.archive_reindex(list bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    message bigint;
    done bigint := 0;
BEGIN
    FOR message IN SELECT m.id FROM pepsi.archive_message m WHERE m.list_id = list LOOP
        PERFORM pepsi.archive_index_message(message);
        done := done + 1;
    END LOOP;
    UPDATE pepsi.archive_message m SET parent_id = NULL, thread_id = NULL WHERE m.list_id = list;
    DELETE FROM pepsi.archive_thread t WHERE t.list_id = list;
    FOR message IN SELECT m.id FROM pepsi.archive_message m WHERE m.list_id = list ORDER BY m.sent_at, m.id LOOP
        PERFORM pepsi.archive_thread_message(message);
    END LOOP;
    PERFORM pepsi.archive_month_recount(list);
    PERFORM pepsi.event_log_write('archive_reindex', jsonb_build_object('list', list, 'messages', done));
    RETURN done;
END
$$;

-- pepsi-archive set: one setting of a list's archive policy; audited.
CREATE FUNCTION pepsi.archive_policy_set(list bigint, setting text, value text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF setting NOT IN ('enabled', 'visibility', 'obfuscation', 'max_attachment') THEN
        RAISE EXCEPTION 'an archive has no setting "%"', setting USING ERRCODE = 'invalid_parameter_value',
            HINT = 'The settings: enabled, visibility (public, private), obfuscation (none, at, hide), max_attachment (bytes).';
    END IF;
    INSERT INTO pepsi.archive_policy (list_id) VALUES (list) ON CONFLICT DO NOTHING;
    EXECUTE format('UPDATE pepsi.archive_policy SET %I = $2::%s WHERE list_id = $1', setting,
                   CASE setting WHEN 'enabled' THEN 'boolean' WHEN 'max_attachment' THEN 'bigint' ELSE 'text' END)
        USING list, value;
    PERFORM pepsi.event_log_write('archive_configure',
        jsonb_build_object('list', list, 'setting', setting, 'value', left(value, 200)));
END
$$;

-- Text shown to readers, its addresses obfuscated by the list's policy:
-- none, at (user at example.org), hide (user@...).
CREATE FUNCTION pepsi.archive_obfuscate(list bigint, shown text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE (pepsi.archive_policy_of(list)).obfuscation
               WHEN 'none' THEN shown
               WHEN 'hide' THEN regexp_replace(shown, '([A-Za-z0-9._%+=-]+)@[A-Za-z0-9.-]+\.[A-Za-z]+', '\1@...', 'g')
               ELSE regexp_replace(shown, '([A-Za-z0-9._%+=-]+)@([A-Za-z0-9.-]+\.[A-Za-z]+)', '\1 at \2', 'g') END
$$;

-- Full-text search of a list's archive (websearch syntax: words, "a
-- phrase", -not, or), newest first.
CREATE FUNCTION pepsi.archive_search(list bigint, query text, max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, thread_id bigint, subject text, from_name text, sent_at timestamptz, excerpt text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT m.id, m.thread_id, pepsi.archive_obfuscate(list, m.subject),
           pepsi.archive_obfuscate(list, coalesce(m.from_name, m.from_address)), m.sent_at,
           pepsi.archive_obfuscate(list, ts_headline('simple', left(m.body_text, 20000),
               websearch_to_tsquery('simple', query), 'StartSel=«, StopSel=», MaxFragments=2'))
    FROM pepsi.archive_message m
    WHERE m.list_id = list AND m.search @@ websearch_to_tsquery('simple', query)
    ORDER BY m.sent_at DESC, m.id DESC LIMIT least(greatest(max_rows, 1), 1000)
$$;

-- How many messages of a list's archive match query.
-- (PL/pgSQL, so that the query is planned with its words: the GIN index.)
CREATE FUNCTION pepsi.archive_search_count(list bigint, query text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN (SELECT count(*) FROM pepsi.archive_message m
            WHERE m.list_id = list AND m.search @@ websearch_to_tsquery('simple', query));
END
$$;

-- The pages: the months of a list's archive, the threads started in a
-- month, a thread's messages in tree order, one message, an attachment.
CREATE FUNCTION pepsi.archive_months(list bigint) RETURNS TABLE (month date, messages integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT x.month, x.messages FROM pepsi.archive_month x WHERE x.list_id = list AND x.messages > 0 ORDER BY x.month DESC
$$;

CREATE FUNCTION pepsi.archive_threads(list bigint, month date)
RETURNS TABLE (id bigint, subject text, started_at timestamptz, last_at timestamptz, message_count integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT t.id, pepsi.archive_obfuscate(list, t.subject), t.started_at, t.last_at, t.message_count
    FROM pepsi.archive_thread t
    WHERE t.list_id = list AND t.started_at >= (month::timestamp AT TIME ZONE 'UTC')
      AND t.started_at < ((month + interval '1 month')::timestamp AT TIME ZONE 'UTC')
    ORDER BY t.started_at, t.id
$$;

CREATE FUNCTION pepsi.archive_thread_messages(list bigint, thread bigint)
RETURNS TABLE (id bigint, parent_id bigint, depth integer, subject text, from_name text, sent_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH RECURSIVE tree(id, depth, path) AS (
        SELECT m.id, 0, ARRAY[extract(epoch FROM m.sent_at), m.id::numeric]
        FROM pepsi.archive_message m
        WHERE m.thread_id = thread AND m.list_id = list
          AND (m.parent_id IS NULL OR NOT EXISTS (SELECT FROM pepsi.archive_message p
                                                   WHERE p.id = m.parent_id AND p.thread_id = thread))
        UNION ALL
        SELECT c.id, t.depth + 1, t.path || ARRAY[extract(epoch FROM c.sent_at), c.id::numeric]
        FROM pepsi.archive_message c JOIN tree t ON c.parent_id = t.id
        WHERE c.thread_id = thread AND t.depth < 100)
    SELECT m.id, m.parent_id, t.depth, pepsi.archive_obfuscate(list, m.subject),
           pepsi.archive_obfuscate(list, coalesce(m.from_name, m.from_address)), m.sent_at
    FROM tree t JOIN pepsi.archive_message m ON m.id = t.id ORDER BY t.path
$$;

CREATE FUNCTION pepsi.archive_message_show(list bigint, message bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT jsonb_build_object('id', m.id, 'thread', m.thread_id, 'parent', m.parent_id,
        'message_id', pepsi.archive_obfuscate(list, m.message_id), 'subject', pepsi.archive_obfuscate(list, m.subject),
        'from', pepsi.archive_obfuscate(list, coalesce(m.from_name || ' <' || m.from_address || '>', m.from_address, m.from_name)),
        'date', m.sent_at, 'text', pepsi.archive_obfuscate(list, m.body_text), 'problems', to_jsonb(m.problems),
        'attachments', coalesce((SELECT jsonb_agg(jsonb_build_object('position', a.position, 'filename', a.filename,
                                     'content_type', a.content_type, 'size', a.size, 'withheld', a.withheld)
                                     ORDER BY a.position)
                                 FROM pepsi.archive_attachment a WHERE a.message_id = m.id), '[]'))
    FROM pepsi.archive_message m WHERE m.id = message AND m.list_id = list
$$;

CREATE FUNCTION pepsi.archive_attachment_get(list bigint, message bigint, attachment integer)
RETURNS TABLE (filename text, content_type text, content bytea)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT a.filename, a.content_type, a.content FROM pepsi.archive_attachment a
    JOIN pepsi.archive_message m ON m.id = a.message_id
    WHERE m.list_id = list AND a.message_id = message AND a.position = attachment AND a.content IS NOT NULL
$$;

-- The members' login (pepsi-httpd): the list at address and whether its
-- archive needs one ({"id", "private"}), NULL when it keeps none.
CREATE FUNCTION pepsi.archive_list(address text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT jsonb_build_object('id', l.id, 'private', (pepsi.archive_policy_of(l.id)).visibility = 'private')
    FROM pepsi.mailing_list l
    WHERE l.address = lower(archive_list.address) AND (pepsi.archive_policy_of(l.id)).enabled
$$;

-- Mail a single-use login link (link || token) to address when it is a
-- member, owner or moderator of list, queued at stage; says nothing either
-- way (the page does not tell who is a member).  Pending links expire
-- after ttl; a day after, they go.
CREATE FUNCTION pepsi.archive_login_request(list bigint, address text, link text, stage text, ttl interval)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    who text := lower(btrim(address));
    l pepsi.mailing_list;
    request text;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.id = list;
    DELETE FROM pepsi.archive_login x WHERE x.expires_at < now() - interval '1 day';
    IF l.id IS NULL OR who !~ '^[^@\s<>]+@[^@\s<>]+$'
       OR NOT (EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list AND m.address = who)
               OR EXISTS (SELECT FROM pepsi.list_role r WHERE r.list_id = list AND r.address = who)) THEN
        RETURN;
    END IF;
    INSERT INTO pepsi.archive_login (token_hash, list_id, address, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), list, who, now() + ttl);
    request := split_part(l.address, '@', 1) || '-request@' || split_part(l.address, '@', 2);
    PERFORM pepsi.workqueue_inject(stage, split_part(l.address, '@', 1) || '-bounces@' || split_part(l.address, '@', 2),
        ARRAY[who],
        convert_to(format(E'From: <%s>\r\nTo: <%s>\r\nSubject: Your link to the archive of %s\r\n'
                          'Date: %s\r\nMessage-ID: <archive-login.%s@%s>\r\nAuto-Submitted: auto-generated\r\n'
                          'MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n',
                          request, who, l.address, to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "+0000"'),
                          left(token, 16), split_part(l.address, '@', 2)), 'UTF8'),
        convert_to(format(E'To read the archive of %s, open this link (once, within %s):\r\n\r\n%s%s\r\n',
                          l.address, ttl, link, token), 'UTF8'));
    PERFORM pepsi.event_log_write('archive_login_mailed', jsonb_build_object('list', list, 'address', who));
END
$$;

-- Use a login link, once: a new session of session_lifetime ({"session":
-- the cookie's value, "csrf"}), NULL when the link is unknown, used or
-- expired.
CREATE FUNCTION pepsi.archive_login_redeem(list bigint, token text, session_lifetime interval) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    x pepsi.archive_login;
    session text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    csrf text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    DELETE FROM pepsi.archive_login l WHERE l.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8'))
        AND l.list_id = list RETURNING * INTO x;
    IF x.token_hash IS NULL OR x.expires_at < now() THEN
        RETURN NULL;
    END IF;
    DELETE FROM pepsi.archive_session s WHERE s.expires_at < now();
    INSERT INTO pepsi.archive_session (token_hash, list_id, address, csrf, expires_at)
    VALUES (sha256(convert_to(session, 'UTF8')), list, x.address, csrf, now() + session_lifetime);
    PERFORM pepsi.event_log_write('archive_login', jsonb_build_object('list', list, 'address', x.address));
    RETURN jsonb_build_object('session', session, 'csrf', csrf);
END
$$;

-- Who a session cookie is on list: {"address", "csrf", "owner"}, NULL
-- when none (or expired, or no longer a member, owner or moderator).
CREATE FUNCTION pepsi.archive_session_check(list bigint, session text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT jsonb_build_object('address', s.address, 'csrf', s.csrf,
        'owner', EXISTS (SELECT FROM pepsi.list_role r WHERE r.list_id = list AND r.address = s.address AND r.role = 'owner'))
    FROM pepsi.archive_session s
    WHERE s.token_hash = sha256(convert_to(coalesce(session, ''), 'UTF8')) AND s.list_id = list AND s.expires_at > now()
      AND (EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list AND m.address = s.address)
           OR EXISTS (SELECT FROM pepsi.list_role r WHERE r.list_id = list AND r.address = s.address))
$$;

-- The owners' pages: the members, the moderation queue, and a decision,
-- each only for a session of an owner of list (NULL/nothing otherwise);
-- the decision also needs the session's CSRF token.
CREATE FUNCTION pepsi.archive_owner_members(list bigint, session text)
RETURNS TABLE (address text, display_name text, delivery text, disabled text, bounce_score real)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT m.address, m.display_name, m.delivery, m.disabled, m.bounce_score FROM pepsi.list_member m
    WHERE m.list_id = list AND (pepsi.archive_session_check(list, session) ->> 'owner')::boolean
    ORDER BY m.address
$$;

CREATE FUNCTION pepsi.archive_owner_held(list bigint, session text)
RETURNS TABLE (id bigint, sender text, subject text, reason text, held_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT h.id, h.sender, h.subject, h.reason, h.held_at FROM pepsi.list_held h
    WHERE h.list_id = list AND h.decision IS NULL AND (pepsi.archive_session_check(list, session) ->> 'owner')::boolean
    ORDER BY h.id
$$;

CREATE FUNCTION pepsi.archive_owner_decide(list bigint, session text, csrf text, held bigint, decision text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    who jsonb := pepsi.archive_session_check(list, session);
BEGIN
    IF who IS NULL OR NOT (who ->> 'owner')::boolean THEN
        RETURN 'only an owner of the list who logged in may moderate';
    ELSIF csrf IS NULL OR csrf <> who ->> 'csrf' THEN
        RETURN 'the form is stale or forged (CSRF token): reload the page';
    ELSIF NOT EXISTS (SELECT FROM pepsi.list_held h WHERE h.id = held AND h.list_id = list) THEN
        RETURN 'no such held post on this list';
    END IF;
    RETURN pepsi.list_decide(held, decision, who ->> 'address');
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'archive_post', '{EXECUTE}'),
    ('pepsi_config', 'table', 'archive_policy', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_thread', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_message', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_reference', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_attachment', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_month', '{SELECT}'),
    ('pepsi_config', 'table', 'archive_import', '{SELECT}'),
    ('pepsi_config', 'function', 'archive_store', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_import_begin', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_import_finish', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_exported', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_reindex', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_policy_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_search', '{EXECUTE}'),
    ('pepsi_config', 'function', 'archive_search_count', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_list', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_login_request', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_login_redeem', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_session_check', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_owner_members', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_owner_held', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_owner_decide', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_search', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_months', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_threads', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_thread_messages', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_message_show', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'archive_attachment_get', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('archive_store'), ('archive_post'), ('archive_import_begin'),
    ('archive_import_finish'), ('archive_exported'), ('archive_reindex'), ('archive_policy_set'), ('archive_search'),
    ('archive_search_count'), ('archive_list'), ('archive_login_request'),
    ('archive_login_redeem'), ('archive_session_check'), ('archive_owner_members'), ('archive_owner_held'),
    ('archive_owner_decide'), ('archive_months'), ('archive_threads'), ('archive_thread_messages'),
    ('archive_message_show'), ('archive_attachment_get');
INSERT INTO pepsi.grant_owner (name) VALUES ('archive_bytes_text'), ('archive_decode_charset'), ('archive_qp_decode'),
    ('archive_base64_decode'), ('archive_decode_words'), ('archive_header'), ('archive_header_parameter'),
    ('archive_message_ids'), ('archive_mime_parts'), ('archive_policy_of'), ('archive_index_message'),
    ('archive_thread_refresh'), ('archive_thread_message'), ('archive_obfuscate'), ('archive_month_recount'), ('archive_login'), ('archive_session');

SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_policy', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_thread', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_thread_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_message', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_message_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_reference', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_attachment', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_attachment_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_month', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_import', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_import_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_login', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.archive_session', '');
SELECT pepsi.grant_apply();
-- end of the mailing lists' web archive

UPDATE pepsi.schema_version SET version = '0.8';
