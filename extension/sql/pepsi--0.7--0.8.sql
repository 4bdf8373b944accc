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

UPDATE pepsi.schema_version SET version = '0.8';
