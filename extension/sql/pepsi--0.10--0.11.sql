/*
 * pepsi 0.10 -> 0.11: the schema changes made since 0.10.
 *
 * 0.10 was released with the S/MIME keys learnt from signed mail, the
 * archive's phrase search and batched import, and the secretary's
 * set-based batch; every schema change since is a block here, placed
 * before the final UPDATE of pepsi.schema_version, and folded into
 * pepsi--0.11.sql (new objects at its end).  An existing 0.10 database
 * reaches 0.11 with ALTER EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi
 * installs pepsi--0.11.sql.  Both paths must end in the same schema:
 * t/003_extension_upgrade.pl compares their catalogs and tests the upgrade
 * with a filled queue.  The scheme (blocks, grants as data, every
 * statement safe on a live queue) is the one pepsi--0.1--0.2.sql describes
 * and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.11'" to load this file. \quit

-- ===========================================================================
-- A portal link opens a bounded number of times (issue 41): a link whose
-- session was started (a right code) PORTAL_OPENS times (default 1: the
-- recipient reads and replies within the session) is then refused for its
-- page, a code and a code's check, with the reason (when it was used, and
-- whom to ask for the message again), audited as secure_link_reused; a
-- session already open goes on until it ends.  The limit is the link's
-- own, pepsi.secure_link.open_limit, set when pepsi-stage-encrypt stores
-- it (the new overload of secure_link_store); a link stored before, or by
-- the old signature, has none (NULL) and works as it did.  The column is
-- NULL for every existing row: adding it with its CHECK reads the table
-- once (the portal's links, not the queue).  secure_link_list gains the
-- column open_limit and the state "used" (dropped and made again: its
-- result changed; its grant is data).
-- ===========================================================================
ALTER TABLE pepsi.secure_link ADD COLUMN open_limit integer CHECK (open_limit > 0);

-- Why the link l starts no new session, or NULL: it was redeemed (a right
-- code, a session) open_limit times, PORTAL_OPENS when it was made; NULL,
-- a link made before 0.11, has no limit.  Unlike secure_link_refusal it
-- leaves a session already open alone: the recipient reads and replies
-- within it, and only a link forwarded or replayed after is refused.
CREATE FUNCTION pepsi.secure_link_reuse_refusal(l pepsi.secure_link) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN l.open_limit IS NOT NULL AND l.opened >= l.open_limit THEN
        format('this link was used already (opened %s of %s times) on %s: ask %s to send the message again',
               l.opened, l.open_limit,
               coalesce(to_char(l.last_opened_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'), 'an earlier visit'),
               coalesce(nullif(l.sender, ''), 'the sender'))
    END
$$;

-- pepsi-stage-encrypt: store a sealed message (the identifier and nonce
-- are the stage's, derived from the link's secret) whose link starts at
-- most opens sessions (PORTAL_OPENS; NULL: no limit); its row id.
CREATE FUNCTION pepsi.secure_link_store(link_id bytea, recipient text, sender text, portal_address text,
                                        notice_stage text, queue_id text, nonce bytea, sealed bytea, lifetime interval,
                                        opens integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    id bigint;
BEGIN
    IF lifetime IS NULL OR lifetime <= interval '0' THEN
        RAISE EXCEPTION 'a secure link''s lifetime must be positive, not %', lifetime
            USING ERRCODE = 'invalid_parameter_value', HINT = '[stage-*] PORTAL_LIFETIME sets it.';
    END IF;
    IF opens < 1 THEN
        RAISE EXCEPTION 'a secure link opens at least once, not % times', opens
            USING ERRCODE = 'invalid_parameter_value', HINT = '[stage-*] PORTAL_OPENS sets it (0 there: no limit).';
    END IF;
    IF portal_address IS NULL OR portal_address !~ '^[^@\s<>]+@[^@\s<>]+$' THEN
        RAISE EXCEPTION 'the portal''s address "%" is not an address', portal_address
            USING ERRCODE = 'invalid_parameter_value', HINT = '[stage-*] PORTAL_ADDRESS sets it.';
    END IF;
    INSERT INTO pepsi.secure_link AS l (link_id, recipient, sender, portal_address, notice_stage, queue_id, nonce,
                                        sealed, expires_at, open_limit)
    VALUES (link_id, lower(recipient), sender, portal_address, notice_stage, queue_id, nonce, sealed, now() + lifetime,
            opens)
    RETURNING l.id INTO id;
    PERFORM pepsi.event_log_write('secure_link_stored',
        jsonb_build_object('id', id, 'recipient', lower(recipient), 'sender', sender, 'queue_id', queue_id,
                           'opens', opens));
    RETURN id;
END
$$;

-- The same, as pepsi-stage-encrypt before 0.11 called it: a link without
-- a limit, as every link was then.
CREATE OR REPLACE FUNCTION pepsi.secure_link_store(link_id bytea, recipient text, sender text, portal_address text,
                                        notice_stage text, queue_id text, nonce bytea, sealed bytea, lifetime interval)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT pepsi.secure_link_store(link_id, recipient, sender, portal_address, notice_stage, queue_id, nonce, sealed,
                                   lifetime, NULL::integer)
$$;

-- The link page: {"state": "open"} or {"state": "refused", "reason"},
-- with the recipient (whom the code goes to) and the expiry; an open link
-- that starts no new session (its opens spent) says why in "used", and
-- its pages for a session already open go on working.
CREATE OR REPLACE FUNCTION pepsi.secure_link_status(link_id bytea) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE WHEN pepsi.secure_link_refusal(l) IS NULL
                THEN jsonb_strip_nulls(jsonb_build_object('state', 'open', 'recipient', l.recipient,
                                                          'expires_at', l.expires_at,
                                                          'used', pepsi.secure_link_reuse_refusal(l)))
                ELSE jsonb_build_object('state', 'refused', 'reason', pepsi.secure_link_refusal(l)) END
    FROM (SELECT 1) one LEFT JOIN pepsi.secure_link l ON l.link_id = secure_link_status.link_id
$$;

-- Mail a one-time code to the link's recipient (through the stage after
-- the encryption stage, like the notice): NULL, or why not.  A link whose
-- opens are spent gets no code (audited: secure_link_reused).
CREATE OR REPLACE FUNCTION pepsi.secure_link_code_request(link_id bytea, code_lifetime interval, per_hour integer)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    code text;
    domain text;
    reused text;
BEGIN
    SELECT * INTO l FROM pepsi.secure_link s WHERE s.link_id = secure_link_code_request.link_id FOR UPDATE;
    IF pepsi.secure_link_refusal(l) IS NOT NULL THEN
        RETURN pepsi.secure_link_refusal(l);
    END IF;
    reused := pepsi.secure_link_reuse_refusal(l);
    IF reused IS NOT NULL THEN
        PERFORM pepsi.event_log_write('secure_link_reused', jsonb_build_object('id', l.id, 'recipient', l.recipient,
            'asked', 'code', 'opened', l.opened, 'opens', l.open_limit));
        RETURN reused;
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
-- lifetime and SECURE_LINK_CODE_ATTEMPTS tries (attempts), and none is
-- once the link's opens are spent (audited: secure_link_reused), even a
-- code mailed before: the row's lock makes the count exact under
-- concurrent checks.
CREATE OR REPLACE FUNCTION pepsi.secure_link_code_check(link_id bytea, code text, session_lifetime interval, attempts integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.secure_link;
    session text := replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '');
    csrf text := replace(gen_random_uuid()::text, '-', '');
    reused text;
BEGIN
    SELECT * INTO l FROM pepsi.secure_link s WHERE s.link_id = secure_link_code_check.link_id FOR UPDATE;
    reused := pepsi.secure_link_reuse_refusal(l);
    IF pepsi.secure_link_refusal(l) IS NOT NULL THEN
        RETURN jsonb_build_object('refused', pepsi.secure_link_refusal(l));
    ELSIF reused IS NOT NULL THEN
        PERFORM pepsi.event_log_write('secure_link_reused', jsonb_build_object('id', l.id, 'recipient', l.recipient,
            'asked', 'session', 'opened', l.opened, 'opens', l.open_limit));
        RETURN jsonb_build_object('refused', reused);
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
    PERFORM pepsi.event_log_write('secure_link_opened', jsonb_build_object('id', l.id, 'recipient', l.recipient,
        'opened', l.opened + 1, 'opens', l.open_limit));
    RETURN jsonb_build_object('session', session, 'csrf', csrf);
END
$$;

-- The sealed message for a session of the link: one row, or none (and
-- refusal says why) when the session is not one of this link's or ended
-- (and why no new one starts when the link's opens are spent).
CREATE OR REPLACE FUNCTION pepsi.secure_link_open(link_id bytea, session text)
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
            refusal := coalesce(pepsi.secure_link_reuse_refusal(l),
                                'no session: enter the code mailed to you first (a session lasts a few minutes)');
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
CREATE OR REPLACE FUNCTION pepsi.secure_link_reply(link_id bytea, session text, csrf text, stage text, subject text,
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
        RETURN coalesce(pepsi.secure_link_reuse_refusal(l), 'no session: enter the code mailed to you first');
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

-- pepsi-secure-link list: the links (all, or those still open: that may
-- start a session).  A link whose opens are spent is "used" (a session it
-- started may still run); open_limit is NULL for a link without a limit.
DROP FUNCTION pepsi.secure_link_list(boolean);
CREATE FUNCTION pepsi.secure_link_list(open_only boolean DEFAULT false)
RETURNS TABLE (id bigint, recipient text, sender text, queue_id text, created_at timestamptz, expires_at timestamptz,
               state text, opened integer, open_limit integer, replies integer, reason text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT l.id, l.recipient, l.sender, l.queue_id, l.created_at, l.expires_at,
           CASE WHEN l.revoked_at IS NOT NULL THEN 'revoked' WHEN l.expires_at <= now() OR l.sealed IS NULL THEN 'expired'
                WHEN pepsi.secure_link_reuse_refusal(l) IS NOT NULL THEN 'used' ELSE 'open' END,
           l.opened, l.open_limit, l.replies, l.revoked_reason
    FROM pepsi.secure_link l
    WHERE NOT open_only OR (l.revoked_at IS NULL AND l.expires_at > now() AND l.sealed IS NOT NULL
                            AND pepsi.secure_link_reuse_refusal(l) IS NULL)
    ORDER BY l.id
$$;

INSERT INTO pepsi.grant_owner (name) VALUES ('secure_link_reuse_refusal');
SELECT pepsi.grant_apply();
-- end of a portal link that opens a bounded number of times
-- The archive's import at 100,000 messages: word pairs in C (issue 40)
--
-- archive_word_pairs (a message's word pairs, 'a b', for the phrase
-- search) was a SQL function: the tsvector unnested to a row a position,
-- lead() over them, the pairs aggregated; about 1.3 ms of CPU a message,
-- half of what parsing one cost, the largest part of an import after the
-- GIN index's own entries.  The same function in C
-- (extension/src/archive_search.c): one sort of the positions, one pass,
-- the same tsvector (array_to_tsvector makes it).  Same signature; a
-- message already archived keeps its tsvector (it is the same).
-- ===========================================================================
CREATE OR REPLACE FUNCTION pepsi.archive_word_pairs(words tsvector) RETURNS tsvector
    AS 'MODULE_PATHNAME', 'archive_word_pairs' LANGUAGE C IMMUTABLE PARALLEL SAFE;
-- end of the archive's import at 100,000 messages: word pairs in C
-- The grants' check made cheaper (issue 37): grant_expected() and
-- grant_verify() read pepsi.grant_rule instead of pepsi.grant_policy(),
-- which, having a SET clause, is never inlined, so each of their EXISTS
-- and IN tests ran it again and scanned every rule.  Same rows, same
-- result; grant_verify() went from about 5 s of backend CPU a call to
-- about 1.3 s, and every CREATE EXTENSION pepsi and apply_grants() run it.
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
    roles AS (SELECT DISTINCT g.role FROM pepsi.grant_rule g
              WHERE EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role))
    SELECT r.role, o.classid, o.objid, o.kind, a.privilege,
           EXISTS (SELECT FROM pepsi.grant_rule g
                   WHERE (g.role = r.role
                          OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                     AND g.object_kind = o.object_kind
                     AND g.object_name = o.name AND a.privilege = ANY (g.privileges))
    FROM objects o CROSS JOIN roles r CROSS JOIN LATERAL unnest(o.applicable) AS a (privilege)
$$;

CREATE OR REPLACE FUNCTION pepsi.grant_verify()
RETURNS TABLE (grantee text, object text, privilege text, expected boolean, actual boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    WITH checked AS (
        SELECT e.role::text AS grantee, e.classid, e.objid, e.privilege, e.expected,
               CASE e.kind
                   WHEN 'f' THEN has_function_privilege(e.role, e.objid, e.privilege)
                   WHEN 'n' THEN has_schema_privilege(e.role, e.objid, e.privilege)
                   WHEN 'S' THEN has_sequence_privilege(e.role, e.objid, e.privilege)
                   ELSE has_table_privilege(e.role, e.objid, e.privilege)
                        OR (NOT e.expected AND e.privilege IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')
                            AND has_any_column_privilege(e.role, e.objid, e.privilege)
                            AND NOT EXISTS (SELECT FROM pepsi.grant_column g
                                            WHERE to_regclass(format('pepsi.%I', g.object_name)) = e.objid
                                              AND g.privilege = e.privilege
                                              AND (g.role = e.role
                                                   OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m
                                                                 WHERE m.member = e.role))))
               END AS actual
        FROM pepsi.grant_expected() e),
    -- The tables with column-level grants, column by column: a role may
    -- use a column if the policy grants it the table or the column.
    columns AS (
        SELECT r.role::text AS grantee, c.oid AS objid, a.attnum, p.privilege,
               EXISTS (SELECT FROM pepsi.grant_rule g
                       WHERE (g.role = r.role
                              OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                         AND g.object_kind = 'table' AND g.object_name = c.relname::text
                         AND p.privilege = ANY (g.privileges))
               OR EXISTS (SELECT FROM pepsi.grant_column g
                          WHERE (g.role = r.role
                                 OR g.role IN (SELECT m.granted FROM pepsi.grant_membership m WHERE m.member = r.role))
                            AND g.object_name = c.relname::text AND g.privilege = p.privilege
                            AND NOT a.attname = ANY (g.withheld)) AS expected,
               has_column_privilege(r.role, c.oid, a.attnum, p.privilege) AS actual
        FROM (SELECT DISTINCT g.object_name, g.privilege FROM pepsi.grant_column g) p
        JOIN pg_class c ON c.relnamespace = 'pepsi'::regnamespace AND c.relname = p.object_name
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        CROSS JOIN (SELECT DISTINCT g.role FROM pepsi.grant_rule g
                    WHERE EXISTS (SELECT FROM pg_roles x WHERE x.rolname = g.role)) r),
    acls AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid, 0 AS subid, c.relowner AS owner,
               coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner)) AS acl
        FROM pg_class c WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
        UNION ALL
        SELECT 'pg_class'::regclass, c.oid, t.attnum, c.relowner, t.attacl
        FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid
        WHERE c.relnamespace = 'pepsi'::regnamespace AND t.attacl IS NOT NULL
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid, 0, p.proowner, coalesce(p.proacl, acldefault('f', p.proowner))
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
        UNION ALL
        SELECT 'pg_namespace'::regclass, n.oid, 0, n.nspowner, coalesce(n.nspacl, acldefault('n', n.nspowner))
        FROM pg_namespace n WHERE n.nspname = 'pepsi'),
    strangers AS (
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee,
               x.classid, x.objid, x.subid, a.privilege_type AS privilege
        FROM acls x CROSS JOIN LATERAL aclexplode(x.acl) AS a
        WHERE a.grantee <> x.owner
          AND a.grantee NOT IN (SELECT r.oid FROM pg_roles r
                                WHERE r.rolname IN (SELECT g.role FROM pepsi.grant_rule g))),
    unclassified AS (
        SELECT 'pg_class'::regclass AS classid, c.oid AS objid FROM pg_class c
        WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
          AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype = 'i')
          AND c.relname NOT IN (SELECT g.object_name FROM pepsi.grant_rule g)
          AND c.relname NOT IN (SELECT * FROM pepsi.grant_owner_only())
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p
        WHERE p.pronamespace = 'pepsi'::regnamespace AND p.prorettype <> 'trigger'::regtype
          AND p.proname NOT IN (SELECT g.object_name FROM pepsi.grant_rule g)
          AND p.proname NOT IN (SELECT * FROM pepsi.grant_owner_only())),
    definers AS (
        SELECT p.oid AS objid, p.proname IN (SELECT * FROM pepsi.grant_definer_functions()) AS wanted,
               p.prosecdef,
               coalesce('search_path=pg_catalog, pepsi, pg_temp' = ANY (p.proconfig), false) AS pinned
        FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace)
    SELECT c.grantee, pepsi.grant_object_name(c.classid, c.objid, 0), c.privilege, c.expected, c.actual
    FROM checked c WHERE c.expected <> c.actual
    UNION ALL
    SELECT c.grantee, pepsi.grant_object_name('pg_class'::regclass, c.objid, c.attnum), c.privilege, c.expected, c.actual
    FROM columns c WHERE c.expected <> c.actual
    UNION ALL
    SELECT DISTINCT g.role::text, 'role ' || g.role, 'exists', true, false
    FROM pepsi.grant_rule g WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = g.role)
    UNION ALL
    SELECT s.grantee, pepsi.grant_object_name(s.classid, s.objid, s.subid), s.privilege, false, true
    FROM strangers s
    UNION ALL
    SELECT NULL, pepsi.grant_object_name(u.classid, u.objid, 0), 'named in grant_policy()', true, false
    FROM unclassified u
    UNION ALL
    SELECT DISTINCT NULL, g.object_kind || ' pepsi.' || g.object_name, 'exists', true, false
    FROM pepsi.grant_rule g
    WHERE CASE WHEN g.object_kind = 'function'
               THEN NOT EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace
                                AND p.proname = g.object_name)
               WHEN g.object_kind = 'schema' THEN false
               ELSE to_regclass(format('pepsi.%I', g.object_name)) IS NULL END
    UNION ALL
    SELECT NULL, pepsi.grant_object_name('pg_proc'::regclass, d.objid, 0), 'SECURITY DEFINER', d.wanted, d.prosecdef
    FROM definers d WHERE d.wanted <> d.prosecdef
    UNION ALL
    SELECT NULL, pepsi.grant_object_name('pg_proc'::regclass, d.objid, 0), 'SET search_path', true, false
    FROM definers d WHERE d.wanted AND NOT d.pinned
    ORDER BY 2, 1, 3
$$;
-- end of the grants' check made cheaper

UPDATE pepsi.schema_version SET version = '0.11';
