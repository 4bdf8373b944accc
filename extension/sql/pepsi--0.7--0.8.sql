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
