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
-- Mailing lists (pepsi-stage-list(8), pepsi-list(8); issue 40, items 1-3)
--
-- A list is a row of pepsi.mailing_list (its posting address, list@domain);
-- its subscribers, owners and moderators, bans, pending confirmations,
-- held posts and bounces are rows of the list_* tables.  The list stage
-- reads and changes them only through the SECURITY DEFINER functions
-- below (pepsi_stage may not touch the tables), pepsi-list through the
-- audited list_* administration functions (pepsi_config), pepsi-httpd's
-- one-click unsubscribe (RFC 8058) through list_unsubscribe_one_click.
-- Tokens mailed out (confirmations, moderation) are kept as their SHA-256
-- only; the one-click token is a keyed hash of the list's secret and the
-- subscriber, so nothing per post needs storing.
-- ===========================================================================

CREATE TABLE pepsi.mailing_list (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    address          text NOT NULL UNIQUE
                     CHECK (address = lower(address) AND address ~ '^[a-z0-9][a-z0-9._-]*@[a-z0-9][a-z0-9.-]*$'
                            AND address !~ '-(request|owner|subscribe|unsubscribe|bounces)@'),
    description      text NOT NULL DEFAULT '',
    posting_policy   text NOT NULL DEFAULT 'members'
                     CHECK (posting_policy IN ('members', 'moderated', 'announce', 'open')),
    subject_tag      text CHECK (length(subject_tag) BETWEEN 1 AND 64 AND subject_tag !~ '[\r\n]'),
    header_text      text,
    footer_text      text,
    verp             boolean NOT NULL DEFAULT true,
    dmarc_mitigation text NOT NULL DEFAULT 'from' CHECK (dmarc_mitigation IN ('from', 'none')),
    bounce_threshold real NOT NULL DEFAULT 5 CHECK (bounce_threshold > 0),
    bounce_reset     interval NOT NULL DEFAULT '30 days' CHECK (bounce_reset > interval '0'),
    unsubscribe_url  text CHECK (unsubscribe_url ~ '^https?://[^\s?#]+$'),
    secret           bytea NOT NULL DEFAULT decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'),
    created_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pepsi.mailing_list IS
    'The mailing lists: posting address, policy, headers and footers, VERP, DMARC mitigation, bounce threshold';

CREATE TABLE pepsi.list_member (
    list_id        bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address        text NOT NULL CHECK (address = lower(address) AND address ~ '^[^@\s<>]+@[^@\s<>]+$'),
    display_name   text,
    delivery       text NOT NULL DEFAULT 'each' CHECK (delivery IN ('each', 'digest', 'nomail')),
    disabled       text CHECK (disabled IN ('bounce', 'owner')),
    bounce_score   real NOT NULL DEFAULT 0,
    last_bounce_at timestamptz,
    subscribed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (list_id, address)
);
COMMENT ON TABLE pepsi.list_member IS
    'Subscribers: delivery mode (each, digest, nomail), why delivery stopped (bounce, owner), bounce score';

CREATE TABLE pepsi.list_role (
    list_id bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address text NOT NULL CHECK (address = lower(address) AND address ~ '^[^@\s<>]+@[^@\s<>]+$'),
    role    text NOT NULL CHECK (role IN ('owner', 'moderator')),
    PRIMARY KEY (list_id, address, role)
);
COMMENT ON TABLE pepsi.list_role IS 'Owners and moderators of each list';

CREATE TABLE pepsi.list_ban (
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    pattern    text NOT NULL CHECK (pattern = lower(pattern) AND pattern ~ '^([^@\s]+@)?[^@\s]+$' AND pattern LIKE '%@%'),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (list_id, pattern)
);
COMMENT ON TABLE pepsi.list_ban IS 'Addresses (user@domain) and domains (@domain) that may neither post nor subscribe';

CREATE TABLE pepsi.list_pending (
    token_hash bytea PRIMARY KEY,
    list_id    bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address    text NOT NULL,
    action     text NOT NULL CHECK (action IN ('subscribe', 'unsubscribe')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX list_pending_expires_at ON pepsi.list_pending (expires_at);
COMMENT ON TABLE pepsi.list_pending IS
    'Subscriptions and unsubscriptions waiting for the single-use token mailed to the address (double opt-in)';

CREATE TABLE pepsi.list_held (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id      bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    workqueue_id bigint NOT NULL UNIQUE,
    token_hash   bytea NOT NULL UNIQUE,
    sender       text NOT NULL,
    subject      text,
    reason       text NOT NULL,
    held_at      timestamptz NOT NULL DEFAULT now(),
    decision     text CHECK (decision IN ('approve', 'reject')),
    decided_by   text,
    decided_at   timestamptz
);
COMMENT ON TABLE pepsi.list_held IS
    'The moderation queue: posts held on hold in pepsi.workqueue until a moderator approves or rejects them';

CREATE TABLE pepsi.list_bounce (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    list_id     bigint NOT NULL REFERENCES pepsi.mailing_list ON DELETE CASCADE,
    address     text NOT NULL,
    status      text,
    diagnostic  text,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX list_bounce_member ON pepsi.list_bounce (list_id, address);
COMMENT ON TABLE pepsi.list_bounce IS 'Bounces received at the lists'' -bounces+ (VERP) addresses';

-- Every address a list answers at (ingress's RCPT check, pepsi-list):
-- list@, and its -request, -owner, -subscribe, -unsubscribe and -bounces
-- forms; a -bounces+... address is recognised by its -bounces base.
CREATE FUNCTION pepsi.list_addresses() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN s.suffix = '' THEN l.address
                ELSE split_part(l.address, '@', 1) || s.suffix || '@' || split_part(l.address, '@', 2) END
    FROM pepsi.mailing_list l,
         (VALUES (''), ('-request'), ('-owner'), ('-subscribe'), ('-unsubscribe'), ('-bounces')) AS s(suffix)
$$;

-- The list an address belongs to and what it asks for: NULL when none,
-- else {"id", "list", "kind": post | request | owner | subscribe |
-- unsubscribe | bounces, "verp": the subscriber of a -bounces+ address,
-- and the list's settings}.
CREATE FUNCTION pepsi.list_resolve(recipient text) RETURNS jsonb
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
        'dmarc_mitigation', l.dmarc_mitigation, 'unsubscribe_url', l.unsubscribe_url);
END
$$;

-- Is address (or its domain) banned from list?
CREATE FUNCTION pepsi.list_banned(list bigint, address text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT EXISTS (SELECT FROM pepsi.list_ban b WHERE b.list_id = list
                   AND (b.pattern = lower(address) OR b.pattern = '@' || split_part(lower(address), '@', 2)))
$$;

-- May sender post to list?  {"decision": accept | hold | reject, "reason"}.
-- Owners and moderators always may; then the policy: open (anyone),
-- members (subscribers; others held), moderated (every post held),
-- announce (no one else).
CREATE FUNCTION pepsi.list_post_check(list bigint, sender text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    policy text;
    who text := lower(coalesce(sender, ''));
BEGIN
    SELECT l.posting_policy INTO policy FROM pepsi.mailing_list l WHERE l.id = list;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('decision', 'reject', 'reason', 'no such list');
    ELSIF pepsi.list_banned(list, who) THEN
        RETURN jsonb_build_object('decision', 'reject', 'reason', 'the sender is banned');
    ELSIF EXISTS (SELECT FROM pepsi.list_role r WHERE r.list_id = list AND r.address = who) THEN
        RETURN jsonb_build_object('decision', 'accept', 'reason', 'an owner or moderator');
    ELSIF policy = 'open' THEN
        RETURN jsonb_build_object('decision', 'accept', 'reason', 'an open list');
    ELSIF policy = 'announce' THEN
        RETURN jsonb_build_object('decision', 'reject', 'reason', 'an announce-only list');
    ELSIF policy = 'moderated' THEN
        RETURN jsonb_build_object('decision', 'hold', 'reason', 'a moderated list');
    ELSIF EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = list AND m.address = who) THEN
        RETURN jsonb_build_object('decision', 'accept', 'reason', 'a member');
    END IF;
    RETURN jsonb_build_object('decision', 'hold', 'reason', 'the sender is not a member');
END
$$;

-- The keyed token of a subscriber's one-click unsubscribe URL.
CREATE FUNCTION pepsi.list_member_token(list bigint, address text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT left(encode(sha256(l.secret || convert_to(lower($2), 'UTF8')), 'hex'), 32)
    FROM pepsi.mailing_list l WHERE l.id = $1
$$;

-- The split groups (pepsi.workqueue_split) of a post to list, for stage:
-- with VERP one per subscriber, sent from list-bounces+user=domain@ with
-- its own List-Unsubscribe (RFC 8058 one-click when the list has an
-- unsubscribe_url); without, one per destination domain from
-- list-bounces@.  Only subscribers who take each message.
CREATE FUNCTION pepsi.list_fanout(list bigint, stage text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    local text;
    domain text;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.id = list;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    local := split_part(l.address, '@', 1);
    domain := split_part(l.address, '@', 2);
    IF l.verp THEN
        RETURN coalesce((SELECT jsonb_agg(jsonb_build_object(
                'rcpt_to', jsonb_build_array(m.address), 'stage', stage,
                'mail_from', local || '-bounces+' || replace(m.address, '@', '=') || '@' || domain,
                'prepend_headers', CASE WHEN l.unsubscribe_url IS NOT NULL THEN
                    'List-Unsubscribe: <' || l.unsubscribe_url || '?l=' || l.id || '&a='
                    || replace(replace(m.address, '%', '%25'), '+', '%2B') || '&t='
                    || left(encode(sha256(l.secret || convert_to(m.address, 'UTF8')), 'hex'), 32)
                    || '>, <mailto:' || local || '-unsubscribe@' || domain || '>' || E'\r\n'
                    || E'List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n'
                  ELSE 'List-Unsubscribe: <mailto:' || local || '-unsubscribe@' || domain || E'>\r\n' END)
                ORDER BY m.address)
            FROM pepsi.list_member m
            WHERE m.list_id = list AND m.delivery = 'each' AND m.disabled IS NULL), '[]');
    END IF;
    RETURN coalesce((SELECT jsonb_agg(jsonb_build_object(
            'rcpt_to', g.rcpt, 'stage', stage, 'mail_from', local || '-bounces@' || domain,
            'prepend_headers', 'List-Unsubscribe: <mailto:' || local || '-unsubscribe@' || domain || E'>\r\n')
            ORDER BY g.dom)
        FROM (SELECT split_part(m.address, '@', 2) AS dom, jsonb_agg(m.address ORDER BY m.address) AS rcpt
              FROM pepsi.list_member m
              WHERE m.list_id = list AND m.delivery = 'each' AND m.disabled IS NULL
              GROUP BY 1) g), '[]');
END
$$;

-- Hold a post (row workqueue_id) for moderation: returns {"token", "id",
-- "moderators": the moderators, else the owners}.  Holding the same row
-- again (its stage ran again) makes a new token for it.
CREATE FUNCTION pepsi.list_hold(list bigint, workqueue_id bigint, sender text, subject text, reason text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    token text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    held bigint;
BEGIN
    INSERT INTO pepsi.list_held AS h (list_id, workqueue_id, token_hash, sender, subject, reason)
    VALUES (list, list_hold.workqueue_id, sha256(convert_to(token, 'UTF8')), lower(list_hold.sender),
            left(list_hold.subject, 500), list_hold.reason)
    ON CONFLICT ON CONSTRAINT list_held_workqueue_id_key DO UPDATE SET token_hash = excluded.token_hash
    RETURNING h.id INTO held;
    RETURN jsonb_build_object('token', token, 'id', held, 'moderators', coalesce(
        (SELECT jsonb_agg(r.address ORDER BY r.address) FROM pepsi.list_role r
         WHERE r.list_id = list AND r.role = 'moderator'),
        (SELECT jsonb_agg(r.address ORDER BY r.address) FROM pepsi.list_role r
         WHERE r.list_id = list AND r.role = 'owner'), '[]'));
END
$$;

-- The moderators' decision on the held row workqueue_id: approve, reject,
-- or NULL (none yet, or never held).
CREATE FUNCTION pepsi.list_held_decision(workqueue_id bigint) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT h.decision FROM pepsi.list_held h WHERE h.workqueue_id = list_held_decision.workqueue_id
$$;

-- Decide on held post (its id), as moderator by (an address, or NULL for
-- an administrator): records the decision and releases the row, whose
-- stage then sends or drops it.  NULL when done, else why not.
CREATE FUNCTION pepsi.list_decide(held bigint, decision text, actor text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    h pepsi.list_held;
BEGIN
    IF list_decide.decision NOT IN ('approve', 'reject') THEN
        RAISE EXCEPTION 'decision must be approve or reject, not %', list_decide.decision USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO h FROM pepsi.list_held x WHERE x.id = held FOR UPDATE;
    IF NOT FOUND THEN
        RETURN format('no held post %s', held);
    ELSIF h.decision IS NOT NULL THEN
        RETURN format('held post %s was already decided (%s)', held, h.decision);
    ELSIF actor IS NOT NULL AND NOT EXISTS (SELECT FROM pepsi.list_role r
                                         WHERE r.list_id = h.list_id AND r.address = lower(actor)) THEN
        RETURN format('%s is not a moderator or owner of the list', actor);
    END IF;
    UPDATE pepsi.list_held x SET decision = list_decide.decision, decided_by = coalesce(lower(actor), pepsi.event_principal()),
        decided_at = now() WHERE x.id = held;
    PERFORM pepsi.queue_release(ARRAY[h.workqueue_id]);
    PERFORM pepsi.event_log_write('list_' || list_decide.decision,
        jsonb_build_object('held', held, 'list', h.list_id, 'sender', h.sender, 'by', coalesce(lower(actor), 'operator')));
    RETURN NULL;
END
$$;

-- A moderator's reply carrying the token of a held post.
CREATE FUNCTION pepsi.list_decide_by_token(token text, decision text, actor text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    held bigint;
BEGIN
    SELECT h.id INTO held FROM pepsi.list_held h WHERE h.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8'));
    IF NOT FOUND THEN
        RETURN 'the token names no held post';
    END IF;
    RETURN pepsi.list_decide(held, list_decide_by_token.decision, coalesce(actor, ''));
END
$$;

-- Add address to list now (an operator, or a confirmed request).  False
-- when it was a member already.
CREATE FUNCTION pepsi.list_member_add(list bigint, address text, delivery text DEFAULT 'each',
                                      display_name text DEFAULT NULL, actor text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    added boolean;
BEGIN
    IF pepsi.list_banned(list, address) THEN
        RAISE EXCEPTION '% is banned from list %', address, list USING ERRCODE = 'insufficient_privilege';
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

-- Remove address from list.  False when it was not a member.
CREATE FUNCTION pepsi.list_member_remove(list bigint, address text, actor text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    DELETE FROM pepsi.list_member m WHERE m.list_id = list AND m.address = lower(list_member_remove.address);
    IF FOUND THEN
        PERFORM pepsi.event_log_write('list_unsubscribe',
            jsonb_build_object('list', list, 'address', lower(list_member_remove.address), 'by', coalesce(actor, 'operator')));
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- Start delivery to a member again (stopped by bounces or an owner),
-- its bounce score cleared; audited.  False when it is not a member.
CREATE FUNCTION pepsi.list_member_enable(list bigint, address text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    UPDATE pepsi.list_member m SET disabled = NULL, bounce_score = 0
    WHERE m.list_id = list AND m.address = lower(list_member_enable.address);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pepsi.event_log_write('list_member_enable',
        jsonb_build_object('list', list, 'address', lower(list_member_enable.address)));
    RETURN true;
END
$$;

-- A subscribe or unsubscribe request by mail: the token that confirms it
-- within ttl (only its hash is kept); NULL when there is nothing to
-- confirm (already a member, or not one), or the address is banned.
-- Requests that expired a day ago go.
CREATE FUNCTION pepsi.list_request(list bigint, address text, action text, ttl interval) RETURNS text
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
    DELETE FROM pepsi.list_pending p WHERE p.expires_at < now() - interval '1 day';
    INSERT INTO pepsi.list_pending (token_hash, list_id, address, action, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), list, lower(list_request.address), list_request.action, now() + ttl);
    RETURN token;
END
$$;

-- Carry out the request token confirms, once, for address: NULL when
-- done, else why not.
CREATE FUNCTION pepsi.list_confirm(list bigint, address text, token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    p pepsi.list_pending;
BEGIN
    DELETE FROM pepsi.list_pending x
    WHERE x.token_hash = sha256(convert_to(coalesce(token, ''), 'UTF8')) AND x.list_id = list
      AND x.address = lower(list_confirm.address)
    RETURNING * INTO p;
    IF NOT FOUND THEN
        RETURN 'the token is not one this address was sent for this list, or was used';
    ELSIF p.expires_at < now() THEN
        RETURN 'the token has expired: ask again';
    ELSIF p.action = 'subscribe' THEN
        PERFORM pepsi.list_member_add(list, p.address, 'each', NULL, 'confirmed by mail');
    ELSE
        PERFORM pepsi.list_member_remove(list, p.address, 'confirmed by mail');
    END IF;
    RETURN NULL;
END
$$;

-- RFC 8058 one-click unsubscribe (pepsi-httpd's POST): NULL when address
-- is no longer a member of list, else why not.
CREATE FUNCTION pepsi.list_unsubscribe_one_click(list bigint, address text, token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF token IS NULL OR token <> coalesce(pepsi.list_member_token(list, address), '') THEN
        RETURN 'the link is not valid';
    END IF;
    PERFORM pepsi.list_member_remove(list, address, 'one-click');
    RETURN NULL;
END
$$;

-- A bounce of a post to subscriber address (a DSN at list-bounces+...):
-- adds to its score (a score older than the list's bounce_reset starts
-- over) and stops delivery at the threshold.  {"member": false} when not
-- a member, else {"score", "disabled": just now, "owners"}.
CREATE FUNCTION pepsi.list_bounce_record(list bigint, address text, status text, diagnostic text, weight real)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    m pepsi.list_member;
    now_disabled boolean := false;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list x WHERE x.id = list;
    INSERT INTO pepsi.list_bounce (list_id, address, status, diagnostic)
    VALUES (list, lower(list_bounce_record.address), left(list_bounce_record.status, 32),
            left(list_bounce_record.diagnostic, 1000));
    UPDATE pepsi.list_member x
    SET bounce_score = CASE WHEN x.last_bounce_at < now() - l.bounce_reset THEN 0 ELSE x.bounce_score END + weight,
        last_bounce_at = now()
    WHERE x.list_id = list AND x.address = lower(list_bounce_record.address)
    RETURNING * INTO m;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('member', false);
    END IF;
    IF m.disabled IS NULL AND m.bounce_score >= l.bounce_threshold THEN
        UPDATE pepsi.list_member x SET disabled = 'bounce' WHERE x.list_id = list AND x.address = m.address;
        now_disabled := true;
        PERFORM pepsi.event_log_write('list_member_disabled',
            jsonb_build_object('list', list, 'address', m.address, 'score', m.bounce_score, 'by', 'bounces'));
    END IF;
    RETURN jsonb_build_object('member', true, 'score', m.bounce_score, 'threshold', l.bounce_threshold,
        'disabled', now_disabled, 'owners', coalesce((SELECT jsonb_agg(r.address ORDER BY r.address)
            FROM pepsi.list_role r WHERE r.list_id = list AND r.role = 'owner'), '[]'));
END
$$;

-- The owners of list (mail to list-owner@).
CREATE FUNCTION pepsi.list_owners(list bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(jsonb_agg(r.address ORDER BY r.address), '[]') FROM pepsi.list_role r
    WHERE r.list_id = list AND r.role = 'owner'
$$;

-- pepsi-list(8): create a list, audited.  Returns its id.
CREATE FUNCTION pepsi.list_create(address text, owner text, description text DEFAULT '') RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    list bigint;
BEGIN
    INSERT INTO pepsi.mailing_list AS l (address, description)
    VALUES (lower(list_create.address), coalesce(list_create.description, ''))
    RETURNING l.id INTO list;
    INSERT INTO pepsi.list_role VALUES (list, lower(owner), 'owner');
    PERFORM pepsi.event_log_write('list_create', jsonb_build_object('list', list, 'address', lower(list_create.address),
                                                                    'owner', lower(owner)));
    RETURN list;
END
$$;

-- pepsi-list(8): set one of a list's settings (a column of
-- pepsi.mailing_list other than id, address, secret and created_at),
-- NULL to reset it; audited.
CREATE FUNCTION pepsi.list_configure(list bigint, setting text, value text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    changed integer;
BEGIN
    IF setting NOT IN ('description', 'posting_policy', 'subject_tag', 'header_text', 'footer_text', 'verp',
                       'dmarc_mitigation', 'bounce_threshold', 'bounce_reset', 'unsubscribe_url') THEN
        RAISE EXCEPTION 'a list has no setting "%"', setting USING ERRCODE = 'invalid_parameter_value',
            HINT = 'The settings: description, posting_policy, subject_tag, header_text, footer_text, verp, '
                   'dmarc_mitigation, bounce_threshold, bounce_reset, unsubscribe_url.';
    END IF;
    IF value IS NULL THEN
        EXECUTE format('UPDATE pepsi.mailing_list SET %I = DEFAULT WHERE id = $1', setting) USING list;
    ELSE
        EXECUTE format('UPDATE pepsi.mailing_list SET %I = $2::%s WHERE id = $1', setting,
                       CASE setting WHEN 'verp' THEN 'boolean' WHEN 'bounce_threshold' THEN 'real'
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

-- pepsi-list(8): give or take an owner or moderator role; audited.
CREATE FUNCTION pepsi.list_role_set(list bigint, address text, role text, present boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF present THEN
        INSERT INTO pepsi.list_role VALUES (list, lower(list_role_set.address), list_role_set.role) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM pepsi.list_role r WHERE r.list_id = list AND r.address = lower(list_role_set.address)
                                        AND r.role = list_role_set.role;
    END IF;
    PERFORM pepsi.event_log_write(CASE WHEN present THEN 'list_role_add' ELSE 'list_role_remove' END,
        jsonb_build_object('list', list, 'address', lower(list_role_set.address), 'role', list_role_set.role));
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'list_addresses', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_resolve', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_post_check', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_fanout', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_hold', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_held_decision', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_decide_by_token', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_request', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_confirm', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_bounce_record', '{EXECUTE}'),
    ('pepsi_stage', 'function', 'list_owners', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'list_unsubscribe_one_click', '{EXECUTE}'),
    ('pepsi_config', 'table', 'mailing_list', '{SELECT}'),
    ('pepsi_config', 'table', 'list_member', '{SELECT}'),
    ('pepsi_config', 'table', 'list_role', '{SELECT}'),
    ('pepsi_config', 'table', 'list_ban', '{SELECT,INSERT,DELETE}'),
    ('pepsi_config', 'table', 'list_pending', '{SELECT}'),
    ('pepsi_config', 'table', 'list_held', '{SELECT}'),
    ('pepsi_config', 'table', 'list_bounce', '{SELECT}'),
    ('pepsi_config', 'function', 'list_addresses', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_create', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_configure', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_role_set', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_member_add', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_member_remove', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_member_enable', '{EXECUTE}'),
    ('pepsi_config', 'function', 'list_decide', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_addresses'), ('list_resolve'),
    ('list_post_check'), ('list_fanout'), ('list_hold'), ('list_held_decision'),
    ('list_decide'), ('list_decide_by_token'), ('list_member_add'), ('list_member_remove'), ('list_member_enable'), ('list_request'),
    ('list_confirm'), ('list_unsubscribe_one_click'), ('list_bounce_record'), ('list_owners'), ('list_create'),
    ('list_configure'), ('list_role_set');
INSERT INTO pepsi.grant_owner (name) VALUES ('list_banned'), ('list_member_token');

SELECT pg_catalog.pg_extension_config_dump('pepsi.mailing_list', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.mailing_list_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_member', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_role', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_ban', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_pending', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_held', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_held_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_bounce', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.list_bounce_id_seq', '');
SELECT pepsi.grant_apply();
-- end of mailing lists

UPDATE pepsi.schema_version SET version = '0.7';
