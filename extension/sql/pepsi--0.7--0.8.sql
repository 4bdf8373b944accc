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

UPDATE pepsi.schema_version SET version = '0.8';
