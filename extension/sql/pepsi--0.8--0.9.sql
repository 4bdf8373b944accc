/*
 * pepsi 0.8 -> 0.9: the schema changes made since 0.8.
 *
 * 0.8 was released with auto-pay, the lists' archive and digests, S/MIME
 * and key discovery, and the telemetry tables; every schema change since
 * is a block here, placed before the final UPDATE of pepsi.schema_version,
 * and folded into pepsi--0.9.sql (new objects at its end).  An existing
 * 0.8 database reaches 0.9 with ALTER EXTENSION pepsi UPDATE; CREATE
 * EXTENSION pepsi installs pepsi--0.9.sql.  Both paths must end in the
 * same schema: t/003_extension_upgrade.pl compares their catalogs and
 * tests the upgrade with a filled queue.  The scheme (blocks, grants as
 * data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.9'" to load this file. \quit

-- ====================================================================
-- The secure-link portal (pepsi-secure-link(8), pepsi-stage-encrypt(8),
-- pepsi-httpd(8) "The secure-link portal")
--
-- A recipient whose POLICY requires encryption and who has no key gets,
-- when NO_KEY = portal, a notice with a link instead of the message.  The
-- link carries a secret of 256 random bits that never reaches the
-- database: pepsi-stage-encrypt derives from it (HKDF-SHA256, two labels)
-- the message's AES-256-GCM key and the link's identifier, and stores
-- only the identifier and the ciphertext (whose additional data is the
-- identifier and the recipient, so a row's ciphertext opens under no
-- other row).  Neither a dump nor pepsi_httpd's role reads a message
-- without the link; pepsi-httpd, given the link, opens it in memory.
-- (A plain hash of the secret would do for the lookup; a second HKDF
-- label keeps the identifier and the key apart by construction.)
--
-- The recipient proves control of the address with a one-time code
-- mailed to it (secure_link_code_request): the code is kept as a hash
-- salted with the link's identifier, good for CODE_LIFETIME and
-- SECURE_LINK_CODE_ATTEMPTS tries; at most SECURE_LINK_CODES_PER_HOUR
-- codes an hour.  A right code starts a session bound to the link (its
-- cookie kept as its SHA-256) with a CSRF token that is used once.
-- Replies go back into the queue from the portal's own address with the
-- recipient in Reply-To (mail "from" the recipient's domain would fail
-- its DMARC).  pepsi-secure-link lists, expires and revokes links; an
-- ended link's ciphertext is wiped, not only marked.
-- ====================================================================

CREATE TABLE pepsi.secure_link (
    id              bigserial PRIMARY KEY,
    link_id         bytea NOT NULL UNIQUE CHECK (octet_length(link_id) = 32),
    recipient       text NOT NULL,
    sender          text NOT NULL,
    portal_address  text NOT NULL,
    notice_stage    text NOT NULL,
    queue_id        text,
    nonce           bytea NOT NULL CHECK (octet_length(nonce) = 12),
    sealed          bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_reason  text,
    code_hash       bytea,
    code_expires_at timestamptz,
    code_attempts   integer NOT NULL DEFAULT 0,
    code_used_at    timestamptz,
    codes_window    timestamptz,
    codes_sent      integer NOT NULL DEFAULT 0,
    opened          integer NOT NULL DEFAULT 0,
    last_opened_at  timestamptz,
    replies         integer NOT NULL DEFAULT 0
);
CREATE INDEX secure_link_expires_at ON pepsi.secure_link (expires_at) WHERE sealed IS NOT NULL;

CREATE TABLE pepsi.secure_link_session (
    token_hash      bytea PRIMARY KEY,
    link            bigint NOT NULL REFERENCES pepsi.secure_link (id) ON DELETE CASCADE,
    csrf            text NOT NULL,
    expires_at      timestamptz NOT NULL
);
CREATE INDEX secure_link_session_link ON pepsi.secure_link_session (link);

-- Why the link of identifier link_id cannot be used now, or NULL (the
-- reasons the pages show: unknown, revoked, expired).
CREATE FUNCTION pepsi.secure_link_refusal(l pepsi.secure_link) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE
        WHEN l.id IS NULL THEN 'unknown: this server sent no such link (check that it was copied whole)'
        WHEN l.revoked_at IS NOT NULL THEN format('revoked on %s: %s',
            to_char(l.revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'), coalesce(l.revoked_reason, 'by the administrator'))
        WHEN l.expires_at <= now() OR l.sealed IS NULL THEN format('expired on %s: ask the sender to send the message again',
            to_char(l.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'))
    END
$$;

-- pepsi-stage-encrypt: store a sealed message (the identifier and nonce
-- are the stage's, derived from the link's secret); its row id.
CREATE FUNCTION pepsi.secure_link_store(link_id bytea, recipient text, sender text, portal_address text,
                                        notice_stage text, queue_id text, nonce bytea, sealed bytea, lifetime interval)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    id bigint;
BEGIN
    IF lifetime IS NULL OR lifetime <= interval '0' THEN
        RAISE EXCEPTION 'a secure link''s lifetime must be positive, not %', lifetime
            USING ERRCODE = 'invalid_parameter_value', HINT = '[stage-*] PORTAL_LIFETIME sets it.';
    END IF;
    IF portal_address IS NULL OR portal_address !~ '^[^@\s<>]+@[^@\s<>]+$' THEN
        RAISE EXCEPTION 'the portal''s address "%" is not an address', portal_address
            USING ERRCODE = 'invalid_parameter_value', HINT = '[stage-*] PORTAL_ADDRESS sets it.';
    END IF;
    INSERT INTO pepsi.secure_link AS l (link_id, recipient, sender, portal_address, notice_stage, queue_id, nonce,
                                        sealed, expires_at)
    VALUES (link_id, lower(recipient), sender, portal_address, notice_stage, queue_id, nonce, sealed, now() + lifetime)
    RETURNING l.id INTO id;
    PERFORM pepsi.event_log_write('secure_link_stored',
        jsonb_build_object('id', id, 'recipient', lower(recipient), 'sender', sender, 'queue_id', queue_id));
    RETURN id;
END
$$;

-- The link page: {"state": "open"} or {"state": "refused", "reason"},
-- with the recipient (whom the code goes to) and the expiry.
CREATE FUNCTION pepsi.secure_link_status(link_id bytea) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN pepsi.secure_link_refusal(l) IS NULL
                THEN jsonb_build_object('state', 'open', 'recipient', l.recipient, 'expires_at', l.expires_at)
                ELSE jsonb_build_object('state', 'refused', 'reason', pepsi.secure_link_refusal(l)) END
    FROM (SELECT 1) one LEFT JOIN pepsi.secure_link l ON l.link_id = secure_link_status.link_id
$$;

-- Mail a one-time code to the link's recipient (through the stage after
-- the encryption stage, like the notice): NULL, or why not.
CREATE FUNCTION pepsi.secure_link_code_request(link_id bytea, code_lifetime interval, per_hour integer)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    code text;
    domain text;
BEGIN
    SELECT * INTO l FROM pepsi.secure_link s WHERE s.link_id = secure_link_code_request.link_id FOR UPDATE;
    IF pepsi.secure_link_refusal(l) IS NOT NULL THEN
        RETURN pepsi.secure_link_refusal(l);
    END IF;
    IF l.codes_window IS NULL OR l.codes_window <= now() - interval '1 hour' THEN
        l.codes_window := now();
        l.codes_sent := 0;
    END IF;
    IF l.codes_sent >= per_hour THEN
        RETURN format('%s codes were mailed for this link in the last hour (the most): use the last one, or try again after %s',
                      per_hour, to_char((l.codes_window + interval '1 hour') AT TIME ZONE 'UTC', 'HH24:MI "UTC"'));
    END IF;
    -- 8 decimal digits from 30 random bits.
    code := lpad(((('x' || substr(md5(gen_random_uuid()::text), 1, 8))::bit(32)::bigint & 1073741823) % 100000000)::text,
                 8, '0');
    UPDATE pepsi.secure_link s SET code_hash = sha256(l.link_id || convert_to(code, 'UTF8')),
        code_expires_at = now() + code_lifetime, code_attempts = 0, code_used_at = NULL,
        codes_window = l.codes_window, codes_sent = l.codes_sent + 1
    WHERE s.id = l.id;
    domain := split_part(l.portal_address, '@', 2);
    PERFORM pepsi.workqueue_inject(l.notice_stage, l.portal_address, ARRAY[l.recipient],
        convert_to(format(E'From: <%s>\r\nTo: <%s>\r\nSubject: Your code for the encrypted message: %s\r\n'
                          'Date: %s\r\nMessage-ID: <secure-link-code.%s@%s>\r\nAuto-Submitted: auto-generated\r\n'
                          'MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n',
                          l.portal_address, l.recipient, code,
                          to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "+0000"'),
                          replace(gen_random_uuid()::text, '-', ''), domain), 'UTF8'),
        convert_to(format(E'Your one-time code to read the encrypted message waiting for %s is\r\n\r\n    %s\r\n\r\n'
                          'It is good for %s, once.  If you did not ask for it, ignore this mail.\r\n',
                          l.recipient, code, code_lifetime), 'UTF8'));
    PERFORM pepsi.event_log_write('secure_link_code_mailed', jsonb_build_object('id', l.id, 'recipient', l.recipient));
    RETURN NULL;
END
$$;

-- Check a code: {"session", "csrf"} (a new session of session_lifetime,
-- bound to the link), or {"refused": why}.  A code is good once, for its
-- lifetime and SECURE_LINK_CODE_ATTEMPTS tries (attempts).
CREATE FUNCTION pepsi.secure_link_code_check(link_id bytea, code text, session_lifetime interval, attempts integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    session text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    csrf text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    SELECT * INTO l FROM pepsi.secure_link s WHERE s.link_id = secure_link_code_check.link_id FOR UPDATE;
    IF pepsi.secure_link_refusal(l) IS NOT NULL THEN
        RETURN jsonb_build_object('refused', pepsi.secure_link_refusal(l));
    ELSIF l.code_hash IS NULL AND l.code_used_at IS NOT NULL THEN
        RETURN jsonb_build_object('refused', 'this code was used already: ask for a new one');
    ELSIF l.code_hash IS NULL THEN
        RETURN jsonb_build_object('refused', 'no code was mailed for this link: ask for one');
    ELSIF l.code_expires_at <= now() THEN
        RETURN jsonb_build_object('refused', 'the code has expired: ask for a new one');
    ELSIF l.code_attempts >= attempts THEN
        RETURN jsonb_build_object('refused', format('%s wrong codes: this one no longer counts; ask for a new one', attempts));
    ELSIF sha256(l.link_id || convert_to(coalesce(code, ''), 'UTF8')) <> l.code_hash THEN
        UPDATE pepsi.secure_link s SET code_attempts = s.code_attempts + 1 WHERE s.id = l.id;
        PERFORM pepsi.event_log_write('secure_link_code_wrong', jsonb_build_object('id', l.id, 'attempt', l.code_attempts + 1));
        RETURN jsonb_build_object('refused', CASE WHEN l.code_attempts + 1 >= attempts
            THEN format('wrong code, the %sth: this code no longer counts; ask for a new one', attempts)
            ELSE format('wrong code (%s of %s tries left)', attempts - l.code_attempts - 1, attempts) END);
    END IF;
    UPDATE pepsi.secure_link s SET code_hash = NULL, code_used_at = now(), opened = s.opened + 1,
        last_opened_at = now() WHERE s.id = l.id;
    DELETE FROM pepsi.secure_link_session x WHERE x.expires_at < now();
    INSERT INTO pepsi.secure_link_session (token_hash, link, csrf, expires_at)
    VALUES (sha256(convert_to(session, 'UTF8')), l.id, csrf, now() + session_lifetime);
    PERFORM pepsi.event_log_write('secure_link_opened', jsonb_build_object('id', l.id, 'recipient', l.recipient));
    RETURN jsonb_build_object('session', session, 'csrf', csrf);
END
$$;

-- The sealed message for a session of the link: one row, or none (and
-- refusal says why) when the session is not one of this link's or ended.
CREATE FUNCTION pepsi.secure_link_open(link_id bytea, session text)
RETURNS TABLE (refusal text, recipient text, sender text, nonce bytea, sealed bytea, csrf text, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    s pepsi.secure_link_session;
BEGIN
    SELECT * INTO l FROM pepsi.secure_link x WHERE x.link_id = secure_link_open.link_id;
    refusal := pepsi.secure_link_refusal(l);
    IF refusal IS NULL THEN
        SELECT * INTO s FROM pepsi.secure_link_session x
        WHERE x.token_hash = sha256(convert_to(coalesce(session, ''), 'UTF8')) AND x.link = l.id AND x.expires_at > now();
        IF s.link IS NULL THEN
            refusal := 'no session: enter the code mailed to you first (a session lasts a few minutes)';
        ELSE
            recipient := l.recipient;
            sender := l.sender;
            nonce := l.nonce;
            sealed := l.sealed;
            csrf := s.csrf;
            expires_at := s.expires_at;
        END IF;
    END IF;
    RETURN NEXT;
END
$$;

-- A reply written on the page: queued at stage from the portal's
-- address, To the message's sender, Reply-To the recipient.  The
-- session's CSRF token is used once (a new one is made); NULL, or why not.
CREATE FUNCTION pepsi.secure_link_reply(link_id bytea, session text, csrf text, stage text, subject text,
                                        in_reply_to text, body text, max_replies integer)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    s pepsi.secure_link_session;
    clean text := regexp_replace(left(coalesce(subject, ''), 200), '[\x01-\x1f\x7f]', ' ', 'g');
    encoded text;
    domain text;
    id text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    SELECT * INTO l FROM pepsi.secure_link x WHERE x.link_id = secure_link_reply.link_id FOR UPDATE;
    IF pepsi.secure_link_refusal(l) IS NOT NULL THEN
        RETURN pepsi.secure_link_refusal(l);
    END IF;
    SELECT * INTO s FROM pepsi.secure_link_session x
    WHERE x.token_hash = sha256(convert_to(coalesce(session, ''), 'UTF8')) AND x.link = l.id AND x.expires_at > now()
    FOR UPDATE;
    IF s.link IS NULL THEN
        RETURN 'no session: enter the code mailed to you first';
    ELSIF s.csrf IS DISTINCT FROM csrf THEN
        RETURN 'the form is stale or not this page''s (its CSRF token): reload the message and write again';
    ELSIF l.sender = '' THEN
        RETURN 'the message has no sender to reply to';
    ELSIF l.replies >= max_replies THEN
        RETURN format('%s replies were sent from this link already (the most)', max_replies);
    ELSIF btrim(coalesce(body, '')) = '' THEN
        RETURN 'the reply is empty';
    END IF;
    UPDATE pepsi.secure_link_session x SET csrf = replace(gen_random_uuid()::text, '-', '') WHERE x.token_hash = s.token_hash;
    UPDATE pepsi.secure_link x SET replies = x.replies + 1 WHERE x.id = l.id;
    IF clean ~ '[^\x20-\x7e]' THEN
        encoded := '=?UTF-8?B?' || replace(encode(convert_to(clean, 'UTF8'), 'base64'), E'\n', '') || '?=';
    ELSE
        encoded := clean;
    END IF;
    domain := split_part(l.portal_address, '@', 2);
    PERFORM pepsi.workqueue_inject(stage, l.portal_address, ARRAY[l.sender],
        convert_to(format(E'From: "%s via the secure portal" <%s>\r\nReply-To: <%s>\r\nTo: <%s>\r\nSubject: %s\r\n'
                          'Date: %s\r\nMessage-ID: <secure-link-reply.%s@%s>\r\n%s'
                          'MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n'
                          'Content-Transfer-Encoding: base64\r\n',
                          replace(l.recipient, '"', ''), l.portal_address, l.recipient, l.sender, encoded,
                          to_char(now() AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "+0000"'), id, domain,
                          CASE WHEN in_reply_to ~ '^<[!-;=?-~]+>$'
                               THEN format(E'In-Reply-To: %s\r\nReferences: %s\r\n', in_reply_to, in_reply_to) ELSE '' END),
                   'UTF8'),
        convert_to(replace(encode(convert_to(replace(replace(body, E'\r\n', E'\n'), E'\n', E'\r\n'), 'UTF8'), 'base64'),
                           E'\n', E'\r\n') || E'\r\n', 'UTF8'));
    PERFORM pepsi.event_log_write('secure_link_replied', jsonb_build_object('id', l.id, 'recipient', l.recipient,
                                                                            'to', l.sender));
    RETURN NULL;
END
$$;

-- pepsi-secure-link list: the links (all, or those still open).
CREATE FUNCTION pepsi.secure_link_list(open_only boolean DEFAULT false)
RETURNS TABLE (id bigint, recipient text, sender text, queue_id text, created_at timestamptz, expires_at timestamptz,
               state text, opened integer, replies integer, reason text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT l.id, l.recipient, l.sender, l.queue_id, l.created_at, l.expires_at,
           CASE WHEN l.revoked_at IS NOT NULL THEN 'revoked' WHEN l.expires_at <= now() OR l.sealed IS NULL THEN 'expired'
                ELSE 'open' END,
           l.opened, l.replies, l.revoked_reason
    FROM pepsi.secure_link l
    WHERE NOT open_only OR (l.revoked_at IS NULL AND l.expires_at > now() AND l.sealed IS NOT NULL)
    ORDER BY l.id
$$;

-- pepsi-secure-link expire / revoke: end links now (ids), or with no ids
-- (expire only) wipe the ciphertext of every link whose time is up.  The
-- ciphertext and the sessions go; the row stays for the list and the
-- audit.  How many links were ended; an unknown id is an error.
CREATE FUNCTION pepsi.secure_link_end(ids bigint[], revoking boolean, reason text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    missing bigint;
    n integer;
BEGIN
    IF ids IS NULL AND revoking THEN
        RAISE EXCEPTION 'revoke needs the ids of the links to revoke' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT i INTO missing FROM unnest(ids) i WHERE NOT EXISTS (SELECT FROM pepsi.secure_link l WHERE l.id = i) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'no secure link has id %', missing USING ERRCODE = 'no_data_found',
            HINT = 'pepsi-secure-link list shows them.';
    END IF;
    DELETE FROM pepsi.secure_link_session s
    WHERE (ids IS NULL AND s.link IN (SELECT l.id FROM pepsi.secure_link l WHERE l.expires_at <= now()))
       OR s.link = ANY (ids);
    UPDATE pepsi.secure_link l SET sealed = NULL, code_hash = NULL,
        expires_at = CASE WHEN ids IS NULL OR revoking THEN l.expires_at ELSE least(l.expires_at, now()) END,
        revoked_at = CASE WHEN revoking THEN coalesce(l.revoked_at, now()) ELSE l.revoked_at END,
        revoked_reason = CASE WHEN revoking THEN coalesce(reason, 'by the administrator') ELSE l.revoked_reason END
    WHERE CASE WHEN ids IS NULL THEN l.expires_at <= now() AND l.sealed IS NOT NULL ELSE l.id = ANY (ids) END;
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM pepsi.event_log_write(CASE WHEN revoking THEN 'secure_link_revoked' ELSE 'secure_link_expired' END,
        jsonb_build_object('ids', to_jsonb(ids), 'count', n, 'reason', reason));
    RETURN n;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_crypto', 'function', 'secure_link_store', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_status', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_code_request', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_code_check', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_open', '{EXECUTE}'),
    ('pepsi_httpd', 'function', 'secure_link_reply', '{EXECUTE}'),
    ('pepsi_config', 'function', 'secure_link_list', '{EXECUTE}'),
    ('pepsi_config', 'function', 'secure_link_end', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('secure_link_store'), ('secure_link_status'),
    ('secure_link_code_request'), ('secure_link_code_check'), ('secure_link_open'), ('secure_link_reply'),
    ('secure_link_list'), ('secure_link_end');
INSERT INTO pepsi.grant_owner (name) VALUES ('secure_link'), ('secure_link_id_seq'), ('secure_link_session'),
    ('secure_link_refusal');

SELECT pg_catalog.pg_extension_config_dump('pepsi.secure_link', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.secure_link_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.secure_link_session', '');
SELECT pepsi.grant_apply();
-- end of the secure-link portal

-- ===========================================================================
-- Auto-pay's helper claims its payment (issue 39)
--
-- pepsi-helper-auto-pay (set-user-id root) used to pay whatever address
-- and amount its caller named: the limits were checked only here, by
-- auto_pay_reserve, which the stage calls, so anyone who could run the
-- helper (its group, the stage's user) could pay anything to anyone.  Now
-- the helper takes only a payment id, connects itself over the local
-- socket with peer authentication as a member of the group role
-- pepsi_autopay, and calls auto_pay_claim, which marks a payment that
-- auto_pay_reserve recorded pending (within the limits) as claimed, once,
-- and returns its address, amount and URI: what the wallet is asked to pay
-- comes from here, never from the helper's caller.  An unknown id, one
-- that was refused or finished, one claimed already, or one reserved more
-- than 10 minutes ago is refused with the reason.  The helper then
-- records what the wallet did itself (auto_pay_settle), and auto_pay_finish
-- (the stage's) no longer touches a claimed payment: a caller that is not
-- the helper cannot record a payment made as failed, which would free its
-- amount under the limits again.  pepsi_autopay may execute these two and
-- nothing else of the schema; pepsi_stage may execute neither.
-- ===========================================================================
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_autopay', 'Pepsi: pepsi-helper-auto-pay (set-user-id root, peer authentication): claims a reserved payment, once');
SELECT pepsi.grant_roles_create();

-- When pepsi-helper-auto-pay claimed the payment (auto_pay_claim).
ALTER TABLE pepsi.payment ADD COLUMN claimed_at timestamptz;

-- Claim pending payment id for the helper: {"pay": true, "address",
-- "amount" (CURRENCY:VALUE), "uri"}, the payment marked claimed, or
-- {"pay": false, "why": ...} with nothing changed.
CREATE FUNCTION pepsi.auto_pay_claim(id bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    p pepsi.payment;
BEGIN
    SELECT * INTO p FROM pepsi.payment q WHERE q.id = auto_pay_claim.id AND q.direction = 'out' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('pay', false, 'why', format('no payment %s was reserved', id));
    ELSIF p.claimed_at IS NOT NULL THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s was claimed already, at %s', id, p.claimed_at));
    ELSIF p.outcome <> 'pending' THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s is %s, not pending%s', id, p.outcome,
                                                coalesce(' (' || p.reason || ')', '')));
    ELSIF p.created_at < now() - interval '10 minutes' THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s was reserved at %s, more than 10 minutes ago', id,
                                                p.created_at));
    END IF;
    UPDATE pepsi.payment q SET claimed_at = now() WHERE q.id = p.id;
    RETURN jsonb_build_object('pay', true, 'id', p.id, 'address', p.address,
                              'amount', p.currency || ':' || p.amount::text, 'uri', p.uri);
END
$$;

-- What became of payment id, which the helper claimed: 'paid' or
-- 'failed', with the reason.  True when it was recorded (a payment not
-- claimed, or settled already, is left as it is).
CREATE FUNCTION pepsi.auto_pay_settle(id bigint, outcome text, reason text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF outcome NOT IN ('paid', 'failed') THEN
        RAISE EXCEPTION 'invalid outcome "%"', outcome USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pepsi.payment p SET outcome = auto_pay_settle.outcome, reason = auto_pay_settle.reason, finished_at = now()
    WHERE p.id = auto_pay_settle.id AND p.direction = 'out' AND p.outcome = 'pending' AND p.claimed_at IS NOT NULL;
    RETURN FOUND;
END
$$;

-- What became of pending payment id: 'paid' or 'failed', with the reason.
-- Not of one pepsi-helper-auto-pay claimed (auto_pay_claim): that one is
-- the helper's to settle (auto_pay_settle), which alone knows what the
-- wallet did.
CREATE OR REPLACE FUNCTION pepsi.auto_pay_finish(id bigint, outcome text, reason text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF outcome NOT IN ('paid', 'failed') THEN
        RAISE EXCEPTION 'invalid outcome "%"', outcome USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pepsi.payment p SET outcome = auto_pay_finish.outcome, reason = auto_pay_finish.reason, finished_at = now()
    WHERE p.id = auto_pay_finish.id AND p.outcome = 'pending' AND p.claimed_at IS NULL;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_autopay', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_autopay', 'function', 'auto_pay_claim', '{EXECUTE}'),
    ('pepsi_autopay', 'function', 'auto_pay_settle', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('auto_pay_claim'), ('auto_pay_settle');
SELECT pepsi.grant_apply();
-- end of auto-pay's helper claims its payment

-- ===========================================================================
-- keydisc_release finds the parked rows by an index (issue 41)
--
-- keydisc_release resumes the rows parked for an address
-- (state.encrypt.waiting_for); it scanned every row of the queue for them.
-- workqueue_keydisc_waiting indexes the address of the paused rows that
-- wait for a key only, so it stays small and the lookup is an index scan.
-- Its predicate names index_status, not status, like the queue's other
-- indexes: the claim, which changes only status, stays a HOT update.
-- ===========================================================================
CREATE OR REPLACE FUNCTION pepsi.keydisc_release(address text, found boolean, negative_seconds integer DEFAULT 86400,
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
    -- index_status, not status: workqueue_keydisc_waiting's predicate (paused either way).
    SELECT array_agg(w.id) INTO ids FROM pepsi.workqueue w
     WHERE w.index_status = 'paused' AND w.state -> 'encrypt' ->> 'waiting_for' = a;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    RETURN pepsi.workqueue_resume(ids);
END
$$;
CREATE INDEX workqueue_keydisc_waiting ON pepsi.workqueue (((state -> 'encrypt') ->> 'waiting_for'))
    WHERE index_status = 'paused' AND ((state -> 'encrypt') ->> 'waiting_for') IS NOT NULL;
-- end of keydisc_release finds the parked rows by an index

-- ===========================================================================
-- The archive's search and import at scale (issue 40)
--
-- Search: the archive's GIN index is on archive_search_key(list_id,
-- search), the message's tsvector and one lexeme naming its list
-- ('#list' and the id: no parser makes a word of '#'), so that a list's
-- search is one condition on the index and a count is answered by the
-- index's bitmap without reading the rows (only a page not all-visible,
-- or a phrase's word positions, send it to the table).  The index on
-- search alone goes.  archive_search and archive_search_count plan each
-- query with its words (EXECUTE), and the count never scans the whole
-- table: that reads every message's tsvector, seconds for a common word
-- at 100,000 messages.
-- Import: archive_store_batch archives many messages in one call, so
-- pepsi-archive import makes one round trip a batch, not one a message.
-- ===========================================================================

DROP INDEX pepsi.archive_message_search;
-- The raw copy, the text and the tsvector out of line as soon as a row
-- passes 128 bytes: a row is then its few short fields, about 35 to a
-- page, and the count of a common word visits some 3,000 pages for
-- 100,000 messages where it visited 16,000.  Rows archived before keep
-- their layout until they are written again (pepsi-archive reindex).
ALTER TABLE pepsi.archive_message SET (toast_tuple_target = 128);

-- The key the archive's GIN index is on: a message's tsvector and its
-- list's lexeme.
CREATE FUNCTION pepsi.archive_search_key(list bigint, search tsvector) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT search OPERATOR(pg_catalog.||) pg_catalog.array_to_tsvector(ARRAY['#list' OPERATOR(pg_catalog.||) list::text])
$$;

-- A reader's query (websearch syntax) within list, for archive_search_key;
-- a query with no words matches nothing, as before.
CREATE FUNCTION pepsi.archive_search_query(list bigint, query text) RETURNS tsquery
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_catalog.numnode(q) = 0 THEN q
                ELSE q OPERATOR(pg_catalog.&&) ('#list' OPERATOR(pg_catalog.||) list::text)::tsquery END
    FROM pg_catalog.websearch_to_tsquery('simple', query) AS q
$$;

CREATE INDEX archive_message_list_search ON pepsi.archive_message
    USING gin (pepsi.archive_search_key(list_id, search));

-- pepsi-archive import's call: messages (each as archive_store takes it)
-- archived in order in one call; how many were new (the others the list
-- had already).  A NULL message is refused, and the whole batch with it.
CREATE FUNCTION pepsi.archive_store_batch(list bigint, messages bytea[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    message bytea;
    stored integer := 0;
BEGIN
    IF array_position(messages, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'message % of the batch is NULL', array_position(messages, NULL)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOREACH message IN ARRAY coalesce(messages, '{}') LOOP
        IF pepsi.archive_store(list, message, 'import') IS NOT NULL THEN
            stored := stored + 1;
        END IF;
    END LOOP;
    RETURN stored;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'archive_store_batch', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('archive_store_batch');
INSERT INTO pepsi.grant_owner (name) VALUES ('archive_search_key'), ('archive_search_query');

-- Full-text search of a list's archive (websearch syntax: words, "a
-- phrase", -not, or), newest first.  The list and the words are one
-- condition on the GIN index archive_message_list_search (see
-- archive_search_key); EXECUTE plans each query with its words; the list
-- named again lets a common word's newest matches come in date order from
-- archive_message_list_sent, checked one by one, not all sorted.
CREATE OR REPLACE FUNCTION pepsi.archive_search(list bigint, query text, max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, thread_id bigint, subject text, from_name text, sent_at timestamptz, excerpt text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT m.id, m.thread_id, pepsi.archive_obfuscate($1, m.subject),
                pepsi.archive_obfuscate($1, coalesce(m.from_name, m.from_address)), m.sent_at,
                pepsi.archive_obfuscate($1, ts_headline(''simple'', left(m.body_text, 20000),
                    websearch_to_tsquery(''simple'', $2), ''StartSel=«, StopSel=», MaxFragments=2''))
         FROM pepsi.archive_message m
         WHERE m.list_id = $1 AND pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)
         ORDER BY m.sent_at DESC, m.id DESC LIMIT $3'
        USING list, query, least(greatest(max_rows, 1), 1000);
END
$$;

-- How many messages of a list's archive match query: counted from the
-- GIN index's bitmap, never reading a row the index answers for (a heap
-- page is read only when not all-visible, or to check a phrase's word
-- positions); never a sequential scan, which reads every message's
-- tsvector (seconds at 100,000 messages for a common word).
CREATE OR REPLACE FUNCTION pepsi.archive_search_count(list bigint, query text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp
    SET enable_seqscan = off SET jit = off AS $$
DECLARE
    found bigint;
BEGIN
    EXECUTE 'SELECT count(*) FROM pepsi.archive_message m
             WHERE pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)'
        INTO found USING list, query;
    RETURN found;
END
$$;

SELECT pepsi.grant_apply();
-- end of the archive's search and import at scale

-- ===========================================================================
-- pepsi-list digest: a list's digest sent now (issue 40)
--
-- list_digest_now(list, stage) is what the schedule's row does when it is
-- due (list_digest_send: the digest built, queued at stage for the digest
-- members, the posts taken, in one transaction), for pepsi-list as
-- pepsi_config, and audited (event_log list_digest).  It refuses, naming
-- the reason, a list that does not exist, one with no digest member (no
-- enabled member whose delivery is digest) and one with no post waiting,
-- so nothing is queued for nobody and no empty issue is counted.
-- ===========================================================================
CREATE FUNCTION pepsi.list_digest_now(list text, stage text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    sent jsonb;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.address = lower(list_digest_now.list);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list_digest_now.list USING ERRCODE = 'no_data_found',
            HINT = 'pepsi-list lists shows the lists.';
    END IF;
    IF NOT EXISTS (SELECT FROM pepsi.list_member m WHERE m.list_id = l.id AND m.delivery = 'digest'
                   AND m.disabled IS NULL) THEN
        RAISE EXCEPTION 'list % has no digest member: no digest to send', l.address USING ERRCODE = 'no_data_found',
            HINT = 'A member gets digests after pepsi-list add LIST ADDRESS digest.';
    END IF;
    IF NOT EXISTS (SELECT FROM pepsi.list_digest x WHERE x.list_id = l.id) THEN
        RAISE EXCEPTION 'list % has no post waiting for a digest: none sent', l.address USING ERRCODE = 'no_data_found';
    END IF;
    sent := pepsi.list_digest_send(l.id, stage);
    PERFORM pepsi.event_log_write('list_digest', jsonb_build_object('list', l.address, 'stage', stage) || sent);
    RETURN sent;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'function', 'list_digest_now', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_digest_now');
SELECT pepsi.grant_apply();
-- end of pepsi-list digest

-- ===========================================================================
-- The list stage's fan-out in one call (issue 40)
--
-- Before its commit, the list stage made three calls for an accepted
-- post: its copy for the next digest (list_digest_add), the archive's
-- copy (archive_post) and the subscribers' groups (list_fanout).
-- list_fanout_post is the three in one round trip, each as it was (the
-- copies keyed by the row, so a fan-out that runs again adds nothing
-- twice); the commit (workqueue_finish_with_clones) stays the one call
-- that makes the subscribers' rows and ends the post's.
-- ===========================================================================
CREATE FUNCTION pepsi.list_fanout_post(list bigint, row_id bigint, stage text, subject text, author text,
                                       sent_date text, message_id text, content_type text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    kept boolean;
    archived bigint;
BEGIN
    kept := pepsi.list_digest_add(list, row_id, subject, author, sent_date, message_id, content_type);
    archived := pepsi.archive_post(list, row_id);
    RETURN jsonb_build_object('kept', kept, 'archived', archived, 'groups', pepsi.list_fanout(list, stage));
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_stage', 'function', 'list_fanout_post', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('list_fanout_post');
SELECT pepsi.grant_apply();
-- end of the list stage's fan-out in one call

-- ===========================================================================
-- The secretary's hold in its batch's transaction
--
-- pepsi.secretary_decide_many also holds the rows it decides to hold when
-- the stage passes each row's claim ("hold": pepsi_hold_args), in the
-- transaction that records the decision: one commit for a batch of
-- pepsi-stage-check-whitelist where each held row had a commit of its own
-- after the batch's decision (bench/secretary), and no row is ever
-- recorded as held without being held.  The signature is unchanged.
-- pepsi.secretary_decide takes the pair's challenge FOR SHARE when the
-- message only waits under it (challenged, in time, no token to try),
-- so batches holding the same pair's mail, whose transactions are now
-- longer, do not wait for each other's commit.
-- ===========================================================================

-- The secretary's decision on the row row_id, from sender to owner (an
-- address that turned WHITELIST on), as a JSON object:
--   {"action": "pass"}      the sender is on the owner's whitelist
--   {"action": "released"}  the row is the sender's reply carrying the
--                           token of its open challenge (token, else, when
--                           look_in_text (the row refers to a challenge),
--                           one found in its text): the held mail is
--                           released and the sender whitelisted; the
--                           reply itself is done with
--   {"action": "hold", "token": T or null, "why": ...}
--                           the row is recorded as held (the stage then
--                           holds it); T is the new challenge's token when
--                           one is to be sent now: only when verified
--                           (the stage found the sender's address proven
--                           and the message one an auto-reply may
--                           answer), no challenge of the pair is open yet
--                           (or its mail came unverified), and the owner
--                           sent fewer than max_per_hour in the last hour.
-- ttl is how long held mail waits for its release.
CREATE OR REPLACE FUNCTION pepsi.secretary_decide(owner text, sender text, row_id bigint, verified boolean,
                                       token text, look_in_text boolean, ttl interval, max_per_hour integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
#variable_conflict use_column
DECLARE
    key text := pepsi.secretary_address(owner);
    from_key text := lower(coalesce(sender, ''));
    challenge pepsi.secretary_challenge;
    new_token text;
    sent_last_hour bigint := 0;
    open_found boolean;
BEGIN
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '365 days' THEN
        RAISE EXCEPTION 'invalid hold time %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to a year (HOLD_TIME).';
    END IF;
    IF from_key <> '' AND EXISTS (SELECT FROM pepsi.whitelist w WHERE w.owner = key AND w.sender = from_key) THEN
        RETURN '{"action": "pass"}';
    END IF;
    -- The common case: mail of a pair already challenged, which only
    -- waits (no token to try, the challenge in time).  FOR SHARE, so the
    -- batches holding the pair's mail do not wait for each other's commit
    -- (their transactions hold the rows and inject challenges too), while
    -- a release or an expiry (which updates the row) still waits for them.
    IF NOT (verified AND (token IS NOT NULL OR look_in_text)) THEN
        SELECT * INTO challenge FROM pepsi.secretary_challenge c
        WHERE c.owner = key AND c.sender = from_key AND c.released_at IS NULL
          AND c.challenged_at IS NOT NULL AND c.expires_at > now() FOR SHARE;
        IF FOUND THEN
            INSERT INTO pepsi.secretary_held (row_id, challenge_id) VALUES (row_id, challenge.id)
            ON CONFLICT ON CONSTRAINT secretary_held_pkey DO UPDATE SET challenge_id = excluded.challenge_id;
            RETURN jsonb_build_object('action', 'hold', 'token', NULL, 'challenge', challenge.id,
                                      'expires_at', challenge.expires_at,
                                      'why', CASE WHEN verified THEN 'challenged before'
                                                  ELSE 'not verified: no challenge' END);
        END IF;
    END IF;
    -- FOR NO KEY UPDATE: two decisions of the pair still take turns, but
    -- another message's secretary_held insert (its foreign key's KEY SHARE
    -- on this row) no longer waits for this whole call (bench/secretary).
    SELECT * INTO challenge FROM pepsi.secretary_challenge c
    WHERE c.owner = key AND c.sender = from_key AND c.released_at IS NULL FOR NO KEY UPDATE;
    open_found := FOUND;
    -- A verified reply to the open challenge releases it.
    IF verified AND open_found AND challenge.challenged_at IS NOT NULL AND challenge.expires_at > now() THEN
        IF (token IS NOT NULL AND sha256(convert_to(token, 'UTF8')) = challenge.token_hash)
           OR (look_in_text AND EXISTS (SELECT FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id,
                              regexp_matches(encode(substring(b.body FOR 65536), 'escape'), '[0-9a-f]{64}', 'g') m
                      WHERE w.id = row_id AND sha256(convert_to(m[1], 'UTF8')) = challenge.token_hash)) THEN
            PERFORM pepsi.secretary_release_challenge(challenge.id, 'reply');
            RETURN '{"action": "released"}';
        END IF;
    END IF;
    IF open_found AND challenge.expires_at <= now() THEN
        -- Its time is up (secretary_expire has not come by yet): a new hold.
        DELETE FROM pepsi.workqueue w USING pepsi.secretary_held h
        WHERE h.challenge_id = challenge.id AND w.id = h.row_id AND w.status = 'paused' AND w.timeout = 'infinity';
        DELETE FROM pepsi.secretary_challenge c WHERE c.id = challenge.id;
        open_found := false;
    END IF;
    IF verified AND NOT (open_found AND challenge.challenged_at IS NOT NULL) THEN
        SELECT count(*) INTO sent_last_hour FROM pepsi.secretary_challenge c
        WHERE c.owner = key AND c.challenged_at > now() - interval '1 hour';
        IF sent_last_hour < max_per_hour THEN
            new_token := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
        END IF;
    END IF;
    IF NOT open_found THEN
        INSERT INTO pepsi.secretary_challenge (owner, sender, token_hash, expires_at, challenged_at)
        VALUES (key, from_key, sha256(convert_to(coalesce(new_token, gen_random_uuid()::text), 'UTF8')),
                now() + ttl, CASE WHEN new_token IS NOT NULL THEN now() END)
        ON CONFLICT (owner, sender) WHERE released_at IS NULL DO NOTHING
        RETURNING * INTO challenge;
        IF NOT FOUND THEN
            -- Another message of the pair opened it meanwhile: join that one.
            SELECT * INTO challenge FROM pepsi.secretary_challenge c
            WHERE c.owner = key AND c.sender = from_key AND c.released_at IS NULL FOR NO KEY UPDATE;
            open_found := true;
        END IF;
    END IF;
    IF open_found AND new_token IS NOT NULL THEN
        IF challenge.challenged_at IS NULL THEN
            UPDATE pepsi.secretary_challenge c
            SET token_hash = sha256(convert_to(new_token, 'UTF8')), challenged_at = now()
            WHERE c.id = challenge.id;
        ELSE
            new_token := NULL;
        END IF;
    END IF;
    INSERT INTO pepsi.secretary_held (row_id, challenge_id) VALUES (row_id, challenge.id)
    ON CONFLICT ON CONSTRAINT secretary_held_pkey DO UPDATE SET challenge_id = excluded.challenge_id;
    RETURN jsonb_build_object('action', 'hold', 'token', new_token, 'challenge', challenge.id,
                              'expires_at', challenge.expires_at,
                              'why', CASE WHEN new_token IS NOT NULL THEN 'challenged'
                                          WHEN NOT verified THEN 'not verified: no challenge'
                                          WHEN challenge.challenged_at IS NOT NULL THEN 'challenged before'
                                          ELSE format('%s challenges in the last hour (MAX_CHALLENGES_PER_HOUR)',
                                                      sent_last_hour) END);
END
$$;

-- The secretary's decisions on a batch of rows: rows is a JSON array of
-- objects {owner, sender, row_id, verified, token, look_in_text} (the
-- arguments of pepsi.secretary_decide, ttl and max_per_hour shared);
-- returns secretary_decide's answers as a JSON array in the same order.
-- A row may also carry "hold": {expected_stage, at_stage, claim_token,
-- merge} (the stage's pepsi_hold_args): when its answer is to hold, the
-- row is then held here (pepsi.workqueue_commit's pause with no retry
-- time, its state merged with merge and {"secretary": {owner,
-- challenge}}), in the decision's own transaction, and its answer says
-- "held": true; if one row's hold fails (its claim is stale), the call
-- fails and nothing of the batch is decided or held.
CREATE OR REPLACE FUNCTION pepsi.secretary_decide_many(rows jsonb, ttl interval, max_per_hour integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    r record;
    answer jsonb;
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
        answer := pepsi.secretary_decide(r.e->>'owner', r.e->>'sender', (r.e->>'row_id')::bigint,
                                         coalesce((r.e->>'verified')::boolean, false), r.e->>'token',
                                         coalesce((r.e->>'look_in_text')::boolean, false),
                                         ttl, max_per_hour);
        IF answer->>'action' = 'hold' AND jsonb_typeof(r.e->'hold') = 'object' THEN
            PERFORM pepsi.workqueue_commit((r.e->>'row_id')::bigint, r.e->'hold'->>'expected_stage', 'pause',
                NULL, CASE WHEN jsonb_typeof(r.e->'hold'->'merge') = 'object' THEN r.e->'hold'->'merge'
                           ELSE '{}' END
                      || jsonb_build_object('secretary', jsonb_build_object('owner', r.e->>'owner',
                                                                             'challenge', answer->'challenge')),
                'Infinity', NULL, NULL, NULL, NULL, NULL, r.e->'hold'->>'at_stage',
                (r.e->'hold'->>'claim_token')::uuid);
            answer := answer || '{"held": true}';
        END IF;
        answers[r.o] := answer;
    END LOOP;
    RETURN to_jsonb(answers);
END
$$;

SELECT pepsi.grant_apply();
-- end of the secretary's hold in its batch's transaction

UPDATE pepsi.schema_version SET version = '0.9';
