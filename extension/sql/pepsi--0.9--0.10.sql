/*
 * pepsi 0.9 -> 0.10: the schema changes made since 0.9.
 *
 * 0.9 was released with auto-pay's claim by id, the keydisc index, the
 * secure-link portal, the archive's search index and batched import with
 * the digest command, and the secretary's batch hold; every schema change
 * since is a block here, placed before the final UPDATE of
 * pepsi.schema_version, and folded into pepsi--0.10.sql (new objects at
 * its end).  An existing 0.9 database reaches 0.10 with ALTER EXTENSION
 * pepsi UPDATE; CREATE EXTENSION pepsi installs pepsi--0.10.sql.  Both
 * paths must end in the same schema: t/003_extension_upgrade.pl compares
 * their catalogs and tests the upgrade with a filled queue.  The scheme
 * (blocks, grants as data, every statement safe on a live queue) is the
 * one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.10'" to load this file. \quit

-- ===========================================================================
-- S/MIME certificates learnt from signed mail (issue 41): peer_key.source
-- 'smime-signed', a correspondent's certificate that
-- pepsi-stage-autocrypt-learn took from a good S/MIME signature of theirs,
-- with the ciphers its SMIMECapabilities announced.  The CHECK is replaced
-- in one statement (its name as CREATE TABLE gave it, so both paths agree);
-- every existing row satisfies the wider one.
-- ===========================================================================
ALTER TABLE pepsi.peer_key DROP CONSTRAINT peer_key_source_check,
    ADD CONSTRAINT peer_key_source_check CHECK (source IN ('wkd-advanced', 'wkd-direct', 'openpgpkey', 'smimea',
                                                           'keyserver', 'autocrypt', 'import', 'smime-signed'));
-- end of S/MIME certificates learnt from signed mail

-- ===========================================================================
-- The archive's phrase search, excerpts and import at 100,000 messages
-- (issue 40)
--
-- Phrases: a message's tsvector holds, besides its words, each two words
-- at adjacent positions as one lexeme of their own, 'a b' (no lexeme of the
-- 'simple' configuration holds a space; archive_word_pairs), made from the
-- tsvector's own positions, so a pair is there exactly when the phrase
-- "a b" matches the words.  archive_search_query turns a two-word phrase
-- into its pair: one lookup in the GIN index like a word, and a count from
-- the index's bitmap (no recheck), where a phrase's <-> sent every message
-- having both words to the table to read its positions back (seconds for
-- two common words at 100,000 messages).  A longer phrase is all its pairs
-- AND the phrase, checked on the few messages that have every pair.
-- Chosen over the other way, the tsvectors in a narrow table of their
-- own (not measured here): that makes the positions cheaper to read back,
-- but still reads one back per message having both words; the pairs read
-- none.  Measured: the count of "w0 w1" at 10,000 messages takes 2 ms from
-- the index (7.3 s at 100,000 through the positions).  The price is at
-- import: the pairs, stored without positions, are more entries in the
-- index than the words, nearly all of them distinct.
-- Excerpts: ts_headline over 600 characters around the query's first word
-- (archive_search_pattern, archive_excerpt_window), not the whole text.
-- Planner: archive_search_key declares its cost (it reads a message's
-- tsvector back from TOAST), so the planner itself takes the GIN index
-- for every query but the commonest words' pages; no enable_* override.
-- Import: a message is parsed (archive_parse) before it is written, and
-- written once with its thread (archive_store_message); a batch recounts
-- its threads once, at its end, not once a message.
-- ===========================================================================

-- The word pairs of a message's tsvector: the lexemes at positions p and
-- p + 1 as one lexeme 'a b' each, without positions (each position's next
-- one, in position order).  A pair over 100 bytes is left out
-- (archive_search_query leaves such a phrase to the positions).  The
-- pairs stay under 400,000 bytes, the first ones kept (more than the
-- 16,383 positions a tsvector counts give in mail's text), so that the
-- tsvector stays under its 1 MB.
CREATE FUNCTION pepsi.archive_word_pairs(words tsvector) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT coalesce(array_to_tsvector(CASE WHEN sum(octet_length(a.pair)) < 400000 THEN array_agg(a.pair)
                                           ELSE (array_agg(a.pair ORDER BY a.p))[1:3800] END), ''::tsvector)
    FROM (SELECT x.lexeme || ' ' || x.next AS pair, x.p
          FROM (SELECT y.lexeme, y.p, lead(y.lexeme) OVER w AS next, lead(y.p) OVER w AS np
                FROM (SELECT z.lexeme, unnest(z.positions) AS p FROM unnest(words) AS z) y WINDOW w AS (ORDER BY y.p)) x
          WHERE x.np = x.p + 1 AND octet_length(x.lexeme) + octet_length(x.next) < 100) a
$$;

-- A message's fields from its raw copy (named: its Message-Id): subject,
-- sender, date (NULL when unreadable), text, tsvector with its word
-- pairs, what was wrong with it, the Message-Ids it names (the last 100,
-- References then In-Reply-To) and its attachments (list's limit applied).
CREATE FUNCTION pepsi.archive_parse(list bigint, named text, raw bytea,
    OUT subject text, OUT from_name text, OUT from_address text, OUT sent_at timestamptz, OUT body_text text,
    OUT search tsvector, OUT problems text[], OUT refs text[], OUT attachments pepsi.archive_attachment[])
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    policy pepsi.archive_policy := pepsi.archive_policy_of(list);
    entity text := replace(pepsi.archive_bytes_text(raw), E'\r\n', E'\n');
    head text;
    field text;
    body text := '';
    words tsvector;
    part record;
    attached integer := 0;
BEGIN
    problems := '{}';
    attachments := '{}';
    head := CASE WHEN position(E'\n\n' IN entity) > 0 THEN left(entity, position(E'\n\n' IN entity)) ELSE entity END;
    IF named LIKE 'no-message-id.%@archive.invalid' THEN
        problems := problems || ('no Message-Id: archived as <' || named || '>');
    END IF;
    field := pepsi.archive_header(head, 'Date');
    BEGIN
        sent_at := regexp_replace(field, '\s*\([^)]*\)\s*$', '')::timestamptz;
    EXCEPTION WHEN OTHERS THEN
        sent_at := NULL;
    END;
    IF sent_at IS NULL THEN
        problems := problems || ('no readable Date: (' || coalesce(left(field, 80), 'none') || '): the archiving time stands for it');
    END IF;
    field := pepsi.archive_decode_words(pepsi.archive_header(head, 'From'));
    from_address := lower(coalesce((regexp_match(field, '<([^<>\s]+@[^<>\s]+)>'))[1],
                                   (regexp_match(field, '([^<>\s"]+@[^<>\s"]+)'))[1]));
    from_name := CASE WHEN field LIKE '%<%' THEN nullif(btrim(regexp_replace(field, '\s*<[^<>]*>\s*$', ''), E' \t"'), '') END;
    refs := pepsi.archive_message_ids(pepsi.archive_header(head, 'References'));
    refs := refs || ARRAY(SELECT i FROM unnest(pepsi.archive_message_ids(pepsi.archive_header(head, 'In-Reply-To'))) i
                          WHERE i <> ALL (refs));
    refs := refs[greatest(1, cardinality(refs) - 99):];
    FOR part IN SELECT * FROM pepsi.archive_mime_parts(entity, 0) LOOP
        IF part.problem IS NOT NULL THEN
            problems := problems || part.problem;
        END IF;
        IF part.content IS NULL THEN
            CONTINUE;
        ELSIF part.is_text AND part.filename IS NULL THEN
            body := body || pepsi.archive_decode_charset(part.content, part.charset) || E'\n';
        ELSE
            attached := attached + 1;
            IF length(part.content) > policy.max_attachment THEN
                problems := problems || format('attachment %s (%s, %s bytes) is over the list''s max_attachment (%s bytes): not kept',
                                               attached, part.content_type, length(part.content), policy.max_attachment);
            END IF;
            attachments := attachments || ROW(NULL, NULL, attached, left(part.filename, 255),
                coalesce(part.content_type, 'application/octet-stream'), length(part.content),
                CASE WHEN length(part.content) <= policy.max_attachment THEN part.content END,
                CASE WHEN length(part.content) > policy.max_attachment
                     THEN format('over the list''s max_attachment (%s bytes)', policy.max_attachment) END)::pepsi.archive_attachment;
        END IF;
    END LOOP;
    IF length(body) > 500000 THEN
        problems := problems || 'a text over 500000 characters: only its start is searchable';
    END IF;
    subject := left(pepsi.archive_decode_words(pepsi.archive_header(head, 'Subject')), 1000);
    body_text := body;
    words := setweight(to_tsvector('simple', coalesce(pepsi.archive_decode_words(pepsi.archive_header(head, 'Subject')), '')), 'A')
             || setweight(to_tsvector('simple', left(body, 500000)), 'B');
    search := words || pepsi.archive_word_pairs(words);
END
$$;

-- Keep a message's references (not its own Message-Id) and attachments,
-- as archive_parse gave them.
CREATE FUNCTION pepsi.archive_keep_parts(message bigint, list bigint, named text, refs text[],
                                         attachments pepsi.archive_attachment[]) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pepsi, pg_temp AS $$
    INSERT INTO pepsi.archive_reference (message_id, position, list_id, referenced)
    SELECT message, x.n, list, x.r FROM unnest(refs) WITH ORDINALITY AS x(r, n) WHERE x.r <> named;
    INSERT INTO pepsi.archive_attachment (message_id, position, filename, content_type, size, content, withheld)
    SELECT message, a.position, a.filename, a.content_type, a.size, a.content, a.withheld FROM unnest(attachments) AS a;
$$;

-- A message (named, in thread under parent) just placed adopts the
-- messages that name it more nearly than their present parent (they
-- arrived first), their replies moving with it; the threads they left
-- (for archive_thread_refresh).
CREATE FUNCTION pepsi.archive_thread_adopt(message bigint, list bigint, named text, thread bigint, parent bigint)
RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    adopted bigint[];
    moved bigint[];
BEGIN
    WITH RECURSIVE ancestor(id) AS (SELECT parent UNION SELECT a.parent_id FROM pepsi.archive_message a
                                    JOIN ancestor x ON a.id = x.id WHERE a.parent_id IS NOT NULL)
    SELECT array_agg(DISTINCT c.id) INTO adopted
    FROM pepsi.archive_reference r JOIN pepsi.archive_message c ON c.id = r.message_id
    WHERE r.list_id = list AND r.referenced = named AND c.id <> message
      AND c.id NOT IN (SELECT x.id FROM ancestor x WHERE x.id IS NOT NULL)
      AND r.position > coalesce((SELECT max(r2.position) FROM pepsi.archive_reference r2
                                 JOIN pepsi.archive_message p ON p.id = c.parent_id
                                 WHERE r2.message_id = c.id AND r2.referenced = p.message_id), 0);
    IF adopted IS NULL THEN
        RETURN '{}';
    END IF;
    UPDATE pepsi.archive_message a SET parent_id = message WHERE a.id = ANY (adopted);
    WITH RECURSIVE subtree(id) AS (SELECT unnest(adopted) UNION SELECT a.id FROM pepsi.archive_message a
                                   JOIN subtree s ON a.parent_id = s.id)
    SELECT array_agg(DISTINCT a.thread_id) INTO moved FROM pepsi.archive_message a
    WHERE a.id IN (SELECT id FROM subtree);
    WITH RECURSIVE subtree(id) AS (SELECT unnest(adopted) UNION SELECT a.id FROM pepsi.archive_message a
                                   JOIN subtree s ON a.parent_id = s.id)
    UPDATE pepsi.archive_message a SET thread_id = thread WHERE a.id IN (SELECT id FROM subtree);
    RETURN coalesce(moved, '{}');
END
$$;

-- Archive one message as archive_store does, but leave the threads it
-- touched (threads) to the caller's archive_thread_refresh: parsed first,
-- then written once with its parent and thread (the nearest message it
-- names that is archived, References then In-Reply-To, last first; else a
-- new thread), then its references and attachments, then its adoptions.
CREATE FUNCTION pepsi.archive_store_message(list bigint, raw bytea, source text, OUT stored bigint, OUT threads bigint[])
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    entity text := replace(pepsi.archive_bytes_text(raw), E'\r\n', E'\n');
    named text;
    p record;
    parent bigint;
    thread bigint;
BEGIN
    threads := '{}';
    IF NOT EXISTS (SELECT FROM pepsi.mailing_list l WHERE l.id = list) THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    entity := CASE WHEN position(E'\n\n' IN entity) > 0 THEN left(entity, position(E'\n\n' IN entity)) ELSE entity END;
    named := left((pepsi.archive_message_ids(pepsi.archive_header(entity, 'Message-Id')))[1], 900);
    IF named IS NULL THEN
        named := 'no-message-id.' || encode(sha256(raw), 'hex') || '@archive.invalid';
    END IF;
    IF EXISTS (SELECT FROM pepsi.archive_message a WHERE a.list_id = list AND a.message_id = named) THEN
        RETURN;
    END IF;
    p := pepsi.archive_parse(list, named, raw);
    SELECT a.id, a.thread_id INTO parent, thread FROM pepsi.archive_message a
    WHERE a.list_id = list AND a.message_id = ANY (p.refs) AND a.message_id <> named
    ORDER BY (SELECT max(r.n) FROM unnest(p.refs) WITH ORDINALITY AS r(referenced, n) WHERE r.referenced = a.message_id) DESC
    LIMIT 1;
    IF thread IS NULL THEN
        INSERT INTO pepsi.archive_thread (list_id, subject, started_at, last_at)
        VALUES (list, p.subject, coalesce(p.sent_at, now()), coalesce(p.sent_at, now())) RETURNING id INTO thread;
    END IF;
    threads := ARRAY[thread];
    INSERT INTO pepsi.archive_message AS a (list_id, message_id, thread_id, parent_id, subject, from_name, from_address,
                                            sent_at, raw, body_text, search, problems)
    VALUES (list, named, thread, parent, p.subject, p.from_name, p.from_address, coalesce(p.sent_at, now()), raw,
            p.body_text, p.search, p.problems)
    ON CONFLICT ON CONSTRAINT archive_message_list_id_message_id_key DO NOTHING
    RETURNING a.id INTO stored;
    IF stored IS NULL THEN
        RETURN;
    END IF;
    PERFORM pepsi.archive_keep_parts(stored, list, named, p.refs, p.attachments);
    threads := threads || pepsi.archive_thread_adopt(stored, list, named, thread, parent);
    -- An import recounts the months once at its end (archive_import_finish):
    -- a row updated per message of one transaction would grow a chain of
    -- dead versions that every later update walks.
    IF source <> 'import' THEN
        INSERT INTO pepsi.archive_month AS x (list_id, month, messages)
        VALUES (list, date_trunc('month', coalesce(p.sent_at, now()) AT TIME ZONE 'UTC')::date, 1)
        ON CONFLICT ON CONSTRAINT archive_month_pkey DO UPDATE SET messages = x.messages + 1;
    END IF;
    IF cardinality(p.problems) > 0 THEN
        PERFORM pepsi.event_log_write('archive_problem', jsonb_build_object('list', list, 'message', stored,
            'message_id', named, 'source', source, 'problems', to_jsonb(p.problems)));
    END IF;
END
$$;

-- shown with its addresses obfuscated as obfuscation says (a list's
-- archive_policy): none, at (user at example.org), hide (user@...).
CREATE FUNCTION pepsi.archive_obfuscated(obfuscation text, shown text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT CASE obfuscation
               WHEN 'none' THEN shown
               WHEN 'hide' THEN regexp_replace(shown, '([A-Za-z0-9._%+=-]+)@[A-Za-z0-9.-]+\.[A-Za-z]+', '\1@...', 'g')
               ELSE regexp_replace(shown, '([A-Za-z0-9._%+=-]+)@([A-Za-z0-9.-]+\.[A-Za-z]+)', '\1 at \2', 'g') END
$$;

-- The words of a reader's query as one regular expression (each a whole
-- word), for archive_excerpt_window; NULL when it has none.
CREATE FUNCTION pepsi.archive_search_pattern(query text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT '\m(' || string_agg(regexp_replace((tsvector_to_array(w.m[1]::tsvector))[1], '([^[:alnum:]_])', '\\\1', 'g'), '|')
           || ')\M'
    FROM regexp_matches(websearch_to_tsquery('simple', query)::text, '(''(?:[^'' ]|'''')*'')', 'g') AS w(m)
$$;

-- The 600 characters of a message's text its excerpt is made from: around
-- the first of the query's words (pattern) in its first 20,000, else its
-- start.
CREATE FUNCTION pepsi.archive_excerpt_window(body text, pattern text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT substr(body, greatest(1, coalesce(nullif(regexp_instr(left(body, 20000), pattern, 1, 1, 0, 'i'), 0), 1) - 200), 600)
$$;

-- Text shown to readers, its addresses obfuscated by the list's policy:
-- none, at (user at example.org), hide (user@...); archive_obfuscated.
CREATE OR REPLACE FUNCTION pepsi.archive_obfuscate(list bigint, shown text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    RETURN pepsi.archive_obfuscated((pepsi.archive_policy_of(list)).obfuscation, shown);
END
$$;

-- The key the archive's GIN index is on: a message's tsvector and its
-- list's lexeme.  Checked on a row, it reads the message's tsvector (5 to
-- 12 KB with its word pairs) back from TOAST, several pages, and
-- decompresses it: its COST says so, where an inlined expression counted
-- a few operators and a sequential scan, which checks every message,
-- looked cheaper than the index's bitmap for a common word
-- (archive_search_count needed enable_seqscan = off).  Measured at 10,000
-- messages: with COST 1000 a word in 98.6% of them still went to a
-- sequential scan (0.6 to 4.7 s), with 10000 to the bitmap (3 to 5 ms).
-- A word in more than 99% of the messages still gets the sequential
-- scan: the planner takes costs within 1% of each other as equal.  SET
-- keeps the function from being inlined, so the planner sees its cost.
CREATE OR REPLACE FUNCTION pepsi.archive_search_key(list bigint, search tsvector) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE COST 10000 SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT search OPERATOR(pg_catalog.||) pg_catalog.array_to_tsvector(ARRAY['#list' OPERATOR(pg_catalog.||) list::text])
$$;

-- A reader's query (websearch syntax) within list, for archive_search_key;
-- a query with no words matches nothing, as before.  A phrase (words
-- adjacent and in order, "a b c") is looked up by its word pairs, which
-- the message's tsvector holds as lexemes of their own ('a b',
-- archive_word_pairs): two words are the one pair, answered by the index
-- alone like a word; three or more are their pairs, all of them, and the
-- phrase itself, checked on the few messages that have every pair.  A
-- pair over 100 bytes is not indexed, so its phrase is left as it was
-- (checked on every message with its words).
CREATE OR REPLACE FUNCTION pepsi.archive_search_query(list bigint, query text) RETURNS tsquery
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    -- a run of quoted lexemes joined by <->, as tsquery's text shows a
    -- phrase (no lexeme of the 'simple' configuration holds a space)
    run constant text := '(?:^|(?<=[ (!]))''(?:[^'' ]|'''')*''(?: <-> ''(?:[^'' ]|'''')*'')+';
    q tsquery := websearch_to_tsquery('simple', query);
    rest text := q::text;
    done text := '';
    phrase text;
    words text[];
    pairs text[];
    at integer;
BEGIN
    IF numnode(q) = 0 THEN
        RETURN q;
    END IF;
    LOOP
        at := regexp_instr(rest, run);
        EXIT WHEN at = 0;
        phrase := regexp_substr(rest, run);
        words := ARRAY(SELECT (tsvector_to_array(w.m[1]::tsvector))[1]
                       FROM regexp_matches(phrase, '(''(?:[^'' ]|'''')*'')', 'g') WITH ORDINALITY AS w(m, n) ORDER BY w.n);
        pairs := ARRAY(SELECT words[i] || ' ' || words[i + 1] FROM generate_series(1, cardinality(words) - 1) AS i);
        done := done || left(rest, at - 1);
        rest := substr(rest, at + length(phrase));
        IF right(done, 4) = '<-> ' OR left(rest, 4) = ' <->' OR EXISTS (SELECT FROM unnest(pairs) p WHERE octet_length(p) > 100) THEN
            done := done || phrase;
        ELSE
            done := done || '( ' || (SELECT string_agg('''' || replace(replace(p, '\', '\\'), '''', '''''') || '''', ' & ')
                                     FROM unnest(pairs) p)
                    || CASE WHEN cardinality(words) > 2 THEN ' & ' || phrase ELSE '' END || ' )';
        END IF;
    END LOOP;
    RETURN (done || rest)::tsquery && ('#list' || list::text)::tsquery;
END
$$;

-- (Re)build an archived message's fields from its raw copy: subject,
-- sender, date, text, tsvector, attachments, references, problems.
CREATE OR REPLACE FUNCTION pepsi.archive_index_message(message bigint) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m pepsi.archive_message;
    p record;
BEGIN
    SELECT * INTO m FROM pepsi.archive_message a WHERE a.id = message;
    p := pepsi.archive_parse(m.list_id, m.message_id, m.raw);
    UPDATE pepsi.archive_message a SET subject = p.subject, from_address = p.from_address, from_name = p.from_name,
        sent_at = coalesce(p.sent_at, a.archived_at), body_text = p.body_text, search = p.search, problems = p.problems
    WHERE a.id = message;
    DELETE FROM pepsi.archive_reference r WHERE r.message_id = message;
    DELETE FROM pepsi.archive_attachment a WHERE a.message_id = message;
    PERFORM pepsi.archive_keep_parts(message, m.list_id, m.message_id, p.refs, p.attachments);
    RETURN p.problems;
END
$$;

-- Put an archived message in its thread: under the nearest message it
-- names that is archived (References then In-Reply-To, last first), else
-- at the root of a new thread; then adopt the messages that name it more
-- nearly than their present parent (they arrived first), their replies
-- moving with them (archive_thread_adopt).
CREATE OR REPLACE FUNCTION pepsi.archive_thread_message(message bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    m pepsi.archive_message;
    parent pepsi.archive_message;
    thread bigint;
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
    PERFORM pepsi.archive_thread_refresh(pepsi.archive_thread_adopt(message, m.list_id, m.message_id, thread, parent.id)
                                         || thread);
    RETURN thread;
END
$$;

-- Archive one message (raw: headers, blank line, body) in list, once: the
-- archive's id of it, or NULL when the list has it already (same
-- Message-Id; a message without one is named by its SHA-256).  What was
-- wrong with it is written to event_log.
CREATE OR REPLACE FUNCTION pepsi.archive_store(list bigint, raw bytea, source text DEFAULT 'post') RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    s record;
BEGIN
    s := pepsi.archive_store_message(list, raw, source);
    PERFORM pepsi.archive_thread_refresh(s.threads);
    RETURN s.stored;
END
$$;

-- pepsi-archive import's call: messages (each as archive_store takes it)
-- archived in order in one call; how many were new (the others the list
-- had already).  A NULL message is refused, and the whole batch with it.
-- Each message is written once, with its thread; the threads the batch
-- touched are recounted once, at its end.
CREATE OR REPLACE FUNCTION pepsi.archive_store_batch(list bigint, messages bytea[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    message bytea;
    s record;
    stored integer := 0;
    threads bigint[] := '{}';
BEGIN
    IF array_position(messages, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'message % of the batch is NULL', array_position(messages, NULL)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    FOREACH message IN ARRAY coalesce(messages, '{}') LOOP
        s := pepsi.archive_store_message(list, message, 'import');
        IF s.stored IS NOT NULL THEN
            stored := stored + 1;
        END IF;
        threads := threads || s.threads;
    END LOOP;
    PERFORM pepsi.archive_thread_refresh(ARRAY(SELECT DISTINCT t FROM unnest(threads) AS t));
    RETURN stored;
END
$$;

-- Full-text search of a list's archive (websearch syntax: words, "a
-- phrase", -not, or), newest first.  The list and the words are one
-- condition on the GIN index archive_message_list_search (see
-- archive_search_key; a phrase is looked up by its word pairs, see
-- archive_search_query); EXECUTE plans each query with its words, so the
-- planner weighs them with the index's statistics and chooses alone: a
-- common word's newest matches come in date order from
-- archive_message_list_sent, checked one by one (a few hundred rows for a
-- page), a rare word's or a phrase's from the index's bitmap, sorted.  The
-- excerpt is ts_headline over 600 characters of the text around the first
-- of the query's words (archive_search_pattern), not over the whole text:
-- the headline parses every character it is given, and the page's 100
-- excerpts over whole texts were most of a rare word's page.  Only the
-- page's rows get one (ts_headline is costly, so the planner computes it
-- after the LIMIT); the list's obfuscation is looked up once, not three
-- times a row.
CREATE OR REPLACE FUNCTION pepsi.archive_search(list bigint, query text, max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, thread_id bigint, subject text, from_name text, sent_at timestamptz, excerpt text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT m.id, m.thread_id, pepsi.archive_obfuscated($5, m.subject),
                pepsi.archive_obfuscated($5, coalesce(m.from_name, m.from_address)), m.sent_at,
                pepsi.archive_obfuscated($5, ts_headline(''simple'', pepsi.archive_excerpt_window(m.body_text, $4),
                    websearch_to_tsquery(''simple'', $2), ''StartSel=«, StopSel=», MaxFragments=2''))
         FROM pepsi.archive_message m
         WHERE m.list_id = $1 AND pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)
         ORDER BY m.sent_at DESC, m.id DESC LIMIT $3'
        USING list, query, least(greatest(max_rows, 1), 1000), pepsi.archive_search_pattern(query),
              (pepsi.archive_policy_of(list)).obfuscation;
END
$$;

-- How many messages of a list's archive match query: counted from the
-- GIN index's bitmap, never reading a row the index answers for (a heap
-- page is read only when not all-visible, or to check the word positions
-- of a phrase of three words or more).  The planner chooses the index
-- alone: archive_search_key declares what checking a row costs (its
-- tsvector read back from TOAST), so a sequential scan, which checks
-- every message, is not taken for cheap.
CREATE OR REPLACE FUNCTION pepsi.archive_search_count(list bigint, query text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp SET jit = off AS $$
DECLARE
    found bigint;
BEGIN
    EXECUTE 'SELECT count(*) FROM pepsi.archive_message m
             WHERE pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($1, $2)'
        INTO found USING list, query;
    RETURN found;
END
$$;

-- The word pairs of the messages archived before: a phrase finds them too.
UPDATE pepsi.archive_message m SET search = m.search || pepsi.archive_word_pairs(m.search);

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_httpd', 'function', 'archive_search_count', '{EXECUTE}');
INSERT INTO pepsi.grant_owner (name) VALUES ('archive_word_pairs'), ('archive_parse'), ('archive_keep_parts'),
    ('archive_thread_adopt'), ('archive_store_message'), ('archive_search_pattern'), ('archive_excerpt_window'),
    ('archive_obfuscated');
SELECT pepsi.grant_apply();
-- end of the archive's phrase search, excerpts and import at 100,000 messages

-- ===========================================================================
-- The secretary's batch, set-based (bench/secretary)
--
-- pepsi.secretary_decide_many reads the whitelist once for the batch,
-- takes each pair (owner, sender) once in that order, and a pair whose
-- rows only wait under its open challenge is one lookup whatever its
-- number of rows; the rows held are recorded and held with one statement
-- each instead of a pepsi.workqueue_commit a row.  pepsi.secretary_decide
-- joins a challenge another batch opened meanwhile FOR SHARE when its row
-- only waits under it.  Same answers, same guarantees (one transaction,
-- nothing held on a stale claim).
-- ===========================================================================

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
--
-- Set-based where the batch allows (bench/secretary): the whitelist is
-- read once for the batch, the pairs (owner, sender) are taken in that
-- order (so two batches that need the same challenges wait for each other
-- and never deadlock), and a pair whose rows only wait under its open
-- challenge (the common case: no token to try, the challenge sent and in
-- time) is one lookup, FOR SHARE, whatever its number of rows; only the
-- other pairs' rows are decided one by one (pepsi.secretary_decide).  The
-- rows held are then recorded in pepsi.secretary_held and held with one
-- statement each; a row whose claim is stale is put through
-- pepsi.workqueue_commit, which names it in the error.
CREATE OR REPLACE FUNCTION pepsi.secretary_decide_many(rows jsonb, ttl interval, max_per_hour integer)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    q jsonb[];
    keys text[];
    froms text[];
    waits boolean[];
    answers jsonb[];
    waiting_rows bigint[] := '{}';
    waiting_challenges bigint[] := '{}';
    held bigint[];
    p record;
    c pepsi.secretary_challenge;
    i integer;
    n integer;
BEGIN
    IF jsonb_typeof(rows) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'the rows to decide must be a JSON array, not %', coalesce(jsonb_typeof(rows), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    n := jsonb_array_length(rows);
    IF n = 0 THEN
        RETURN '[]';
    END IF;
    IF ttl IS NULL OR ttl < interval '1 minute' OR ttl > interval '365 days' THEN
        RAISE EXCEPTION 'invalid hold time %', ttl
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'From a minute to a year (HOLD_TIME).';
    END IF;
    -- Each row's owner and sender as secretary_decide keys them, and
    -- whether it only waits under an open challenge (no token to try).
    SELECT array_agg(a.e ORDER BY a.o), array_agg(pepsi.secretary_address(a.e->>'owner') ORDER BY a.o),
           array_agg(lower(coalesce(a.e->>'sender', '')) ORDER BY a.o),
           array_agg(NOT (coalesce((a.e->>'verified')::boolean, false)
                          AND (a.e->>'token' IS NOT NULL OR coalesce((a.e->>'look_in_text')::boolean, false)))
                     ORDER BY a.o)
    INTO q, keys, froms, waits
    FROM jsonb_array_elements(rows) WITH ORDINALITY AS a (e, o);
    answers := array_fill(NULL::jsonb, ARRAY[n]);
    -- Senders on their owner's whitelist pass: one lookup for the batch.
    FOR i IN SELECT u.o FROM unnest(keys, froms) WITH ORDINALITY AS u (k, f, o)
             JOIN pepsi.whitelist w ON w.owner = u.k AND w.sender = u.f WHERE u.f <> ''
    LOOP
        answers[i] := '{"action": "pass"}';
    END LOOP;
    FOR p IN SELECT u.k, u.f, bool_and(u.w) AS waits, array_agg(u.o ORDER BY u.o) AS os
             FROM unnest(keys, froms, waits) WITH ORDINALITY AS u (k, f, w, o)
             WHERE answers[u.o] IS NULL GROUP BY u.k, u.f ORDER BY u.k, u.f
    LOOP
        IF p.waits THEN
            -- FOR SHARE, as secretary_decide's own wait (which see).
            SELECT * INTO c FROM pepsi.secretary_challenge x
            WHERE x.owner = p.k AND x.sender = p.f AND x.released_at IS NULL
              AND x.challenged_at IS NOT NULL AND x.expires_at > now() FOR SHARE;
            IF FOUND THEN
                FOREACH i IN ARRAY p.os LOOP
                    answers[i] := jsonb_build_object('action', 'hold', 'token', NULL, 'challenge', c.id,
                                                     'expires_at', c.expires_at,
                                                     'why', CASE WHEN coalesce((q[i]->>'verified')::boolean, false)
                                                                 THEN 'challenged before'
                                                                 ELSE 'not verified: no challenge' END);
                    waiting_rows := waiting_rows || (q[i]->>'row_id')::bigint;
                    waiting_challenges := waiting_challenges || c.id;
                END LOOP;
                CONTINUE;
            END IF;
        END IF;
        FOREACH i IN ARRAY p.os LOOP
            answers[i] := pepsi.secretary_decide(q[i]->>'owner', q[i]->>'sender', (q[i]->>'row_id')::bigint,
                                                 coalesce((q[i]->>'verified')::boolean, false), q[i]->>'token',
                                                 coalesce((q[i]->>'look_in_text')::boolean, false),
                                                 ttl, max_per_hour);
        END LOOP;
    END LOOP;
    INSERT INTO pepsi.secretary_held (row_id, challenge_id)
    SELECT DISTINCT ON (u.r) u.r, u.c FROM unnest(waiting_rows, waiting_challenges) WITH ORDINALITY AS u (r, c, o)
    ORDER BY u.r, u.o DESC
    ON CONFLICT ON CONSTRAINT secretary_held_pkey DO UPDATE SET challenge_id = excluded.challenge_id;
    -- The rows to hold with their claims (pepsi.workqueue_commit's guard), all at once.
    WITH h AS (
        SELECT (q[o]->>'row_id')::bigint AS id, q[o]->'hold'->>'expected_stage' AS expected,
               q[o]->'hold'->>'at_stage' AS at_stage, (q[o]->'hold'->>'claim_token')::uuid AS token,
               CASE WHEN jsonb_typeof(q[o]->'hold'->'merge') = 'object' THEN q[o]->'hold'->'merge' ELSE '{}' END
               || jsonb_build_object('secretary', jsonb_build_object('owner', q[o]->>'owner',
                                                                     'challenge', answers[o]->'challenge')) AS merge
        FROM generate_subscripts(q, 1) AS o
        WHERE answers[o]->>'action' = 'hold' AND jsonb_typeof(q[o]->'hold') = 'object'
    ), done AS (
        UPDATE pepsi.workqueue w
        SET status = 'paused', timeout = 'infinity', state = w.state || h.merge, stage = coalesce(h.at_stage, w.stage)
        FROM h
        WHERE w.id = h.id AND h.at_stage IS DISTINCT FROM ''
          AND (w.status = 'running' AND w.stage = h.expected
               AND w.claim_digest IS NOT DISTINCT FROM sha256(uuid_send(h.token))) IS TRUE
        RETURNING w.id
    )
    SELECT array_agg(d.id) INTO held FROM done d;
    FOR i IN 1 .. n LOOP
        CONTINUE WHEN (answers[i]->>'action' = 'hold' AND jsonb_typeof(q[i]->'hold') = 'object') IS NOT TRUE;
        IF NOT (q[i]->>'row_id')::bigint = ANY (coalesce(held, '{}')) THEN
            -- Its claim is stale (or its hold malformed): the commit names why, and the call fails.
            PERFORM pepsi.workqueue_commit((q[i]->>'row_id')::bigint, q[i]->'hold'->>'expected_stage', 'pause',
                NULL, '{}', 'Infinity', NULL, NULL, NULL, NULL, NULL, q[i]->'hold'->>'at_stage',
                (q[i]->'hold'->>'claim_token')::uuid);
            RAISE EXCEPTION 'row % of the batch could not be held', q[i]->>'row_id';
        END IF;
        answers[i] := answers[i] || '{"held": true}';
    END LOOP;
    RETURN to_jsonb(answers);
END
$$;

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
            -- Another message of the pair opened it meanwhile (this call
            -- waited for its commit): join that one.  A row that only
            -- waits under it, sent and in time, takes it FOR SHARE as
            -- above, so that the pair's later batches do not queue behind
            -- this one's commit too (bench/secretary).
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

-- end of the secretary's batch, set-based

UPDATE pepsi.schema_version SET version = '0.10';
