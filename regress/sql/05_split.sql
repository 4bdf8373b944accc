--
-- Fan-out: workqueue_split (groups of recipients, or new addresses, onto
-- sibling rows), and its shorthands workqueue_split_off and
-- workqueue_split_one_per_row.  Siblings are the same message: they share
-- the body and keep the arrival time, except a pending group of new
-- addresses (a forward), which is a new delivery.
--
ALTER TABLE pepsi.workqueue ALTER COLUMN id RESTART WITH 5001;
ALTER TABLE pepsi.workqueue_body ALTER COLUMN id RESTART WITH 5001;

-- A message to five recipients with their DSN parameters, received long ago.
CREATE FUNCTION pg_temp.five_recipients(at_stage text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    row_id bigint;
BEGIN
    row_id := pepsi.workqueue_add('alice@example.org',
        '{a@example.net,b@example.net,c@example.net,d@example.net,e@example.net}',
        'Subject: five', 'Body.',
        '{"dsn": {"ret": "FULL", "rcpt": [{"n": "A"}, {"n": "B"}, {"n": "C"}, {"n": "D"}, {"n": "E"}]}, "k": 1}',
        '192.0.2.1');
    UPDATE pepsi.workqueue SET status = 'running', stage = at_stage,
           received_at = '2000-01-01 00:00:00+00' WHERE id = row_id;
    RETURN row_id;
END;
$$;

CREATE TEMP VIEW family AS
SELECT w.id, w.stage, w.status, w.timeout IS NOT NULL AS has_timeout,
       w.received_at = '2000-01-01 00:00:00+00' AS received_kept, w.mail_from, w.rcpt_to, w.state
FROM pepsi.workqueue w;

-- ---------------------------------------------------------------------------
-- workqueue_split
-- ---------------------------------------------------------------------------

SELECT pg_temp.five_recipients('route') AS s \gset
SELECT body_id AS s_body FROM pepsi.workqueue WHERE id = :s \gset

-- The row keeps a; b and c go on to relay; d is greylisted for an hour;
-- e is refused (5.0 is the number 5, as a JSON encoder may write it).  New
-- addresses: a list expansion forwarded now, one parked failed, and one
-- retried at once from the null sender under a token.  The sibling ids come
-- back in group order.
SELECT array(SELECT x - :s FROM unnest(pepsi.workqueue_split(:s, 'route', '{1}',
    '[{"rcpt_indices": [2, 3], "stage": "relay"},
      {"rcpt_indices": [4], "status": "retry", "retry_seconds": 3600, "state": {"why": "greylisted"}},
      {"rcpt_indices": [5.0], "status": "failed", "state": {"why": "5.1.1"}},
      {"rcpt_to": ["d1@example.org", "d2@example.org"], "stage": "relay"},
      {"rcpt_to": ["c-copy@example.org"], "status": "failed"},
      {"rcpt_to": ["later@example.org"], "status": "retry", "retry_seconds": 0,
       "mail_from": "", "token": "fwd-later"}]')) x) AS siblings;
SELECT id - :s AS n, stage, status, has_timeout, received_kept, mail_from, rcpt_to, state
FROM family ORDER BY id;

-- All share the one body, headers and sender; the row itself is still
-- running at its stage, and can be committed.
SELECT count(DISTINCT body_id) AS bodies, bool_and(body_id = :s_body) AS all_share,
       bool_and(headers = 'Subject: five') AS same_headers,
       count(DISTINCT sender_key) AS sender_keys
FROM pepsi.workqueue;
SELECT clone_token, timeout <= now() AS due_now FROM pepsi.workqueue WHERE clone_token IS NOT NULL;
SELECT timeout > now() + interval '3590 seconds' AS greylisted_an_hour
FROM pepsi.workqueue WHERE rcpt_to = '{d@example.net}';
SELECT pepsi.workqueue_commit(:s, 'route', 'advance', 'deliver');
SELECT count(*) FROM pepsi.workqueue_body;

DELETE FROM pepsi.workqueue;

-- A recipient that no list names is dropped, as an alias replaced by its
-- expansion must be; one named in two lists would be delivered twice and
-- is refused (below).
SELECT pg_temp.five_recipients('route') AS s \gset
SELECT cardinality(pepsi.workqueue_split(:s, 'route', '{5,1}',
    '[{"rcpt_to": ["list-member@example.org"]}, {"rcpt_indices": [3]}]')) AS siblings;
SELECT id - :s AS n, rcpt_to, state -> 'dsn' -> 'rcpt' AS dsn_rcpt FROM pepsi.workqueue ORDER BY id;
DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- Refusals of workqueue_split: the row unchanged, no sibling made
-- ---------------------------------------------------------------------------

SELECT pg_temp.five_recipients('route') AS s \gset
SELECT pepsi.workqueue_add('alice@example.org', '{a@example.net}', 'h', 'b') AS idle \gset
SELECT pepsi.workqueue_inject('bounce', '', '{alice@example.org}', 'h', 'b', '{}', 'live-token')
    IS NOT NULL AS live;
SELECT jsonb_agg(to_jsonb(w) ORDER BY id) AS before FROM pepsi.workqueue w \gset

-- the row and the arguments
SELECT pepsi.workqueue_split(NULL, 'route', '{1}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(-1, 'route', '{1}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:idle, 'init', '{1}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:s, 'relay', '{1}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:s, '', '{1}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:s, 'route', NULL, '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', NULL);

-- keep_indices
SELECT pepsi.workqueue_split(:s, 'route', '{}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{6}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{0}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1,NULL}', '[{"rcpt_indices": [2]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{2,2}', '[{"rcpt_indices": [1]}]');

-- an index named twice, across keep and a group, or across groups
SELECT pepsi.workqueue_split(:s, 'route', '{1,2}', '[{"rcpt_indices": [3, 2]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}',
    '[{"rcpt_indices": [2, 3]}, {"rcpt_indices": [4]}, {"rcpt_indices": [5, 3]}]');

-- groups
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '{"rcpt_indices": [2]}');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[[2]]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"stage": "relay"}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [2], "rcpt_to": ["x@example.org"]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [6]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [-1]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": ["2"]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [2.5]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": []}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_to": []}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_to": "x@example.org"}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_to": [null]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_to": ["x@example.org", "y@example.org\r\nDATA"]}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_to": ["x@example.org"], "mail_from": "a@example.org\u0007"}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [2], "status": "running"}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [2], "status": "retry"}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}',
    '[{"rcpt_indices": [2], "status": "retry", "retry_seconds": "60"}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}',
    '[{"rcpt_indices": [2], "status": "retry", "retry_seconds": -1}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [2], "retry_seconds": 60}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}',
    '[{"rcpt_indices": [2], "status": "failed", "retry_seconds": 60}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [2], "stage": ""}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [2], "state": "x"}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}', '[{"rcpt_indices": [2], "priority": 1}]');
SELECT pepsi.workqueue_split(:s, 'route', '{1}',
    '[{"rcpt_indices": [2], "token": "t"}, {"rcpt_indices": [3], "token": "t"}]');
-- A group whose token a live row carries cannot be skipped as a clone
-- would be: its recipients would be dropped with no row to carry them.
SELECT pepsi.workqueue_split(:s, 'route', '{1}',
    '[{"rcpt_indices": [2, 4]}, {"rcpt_indices": [3], "token": "live-token"}]');

SELECT jsonb_agg(to_jsonb(w) ORDER BY id) = :'before'::jsonb AS untouched FROM pepsi.workqueue w;
DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- workqueue_split_off
-- ---------------------------------------------------------------------------

SELECT pg_temp.five_recipients('route') AS s \gset

-- b and d go on to relay; the row keeps the others, in order.
SELECT pepsi.workqueue_split_off(:s, 'route', '{4,2}', 'relay') - :s AS sibling;
-- without a target the sibling stays at this stage, pending
SELECT pepsi.workqueue_split_off(:s, 'route', '{3}') - :s AS sibling;
SELECT id - :s AS n, stage, status, has_timeout, received_kept, mail_from, rcpt_to, state
FROM family ORDER BY id;
SELECT count(DISTINCT body_id) AS bodies FROM pepsi.workqueue;

-- Refusals: the row unchanged, no sibling made.
SELECT jsonb_agg(to_jsonb(w) ORDER BY id) AS before FROM pepsi.workqueue w \gset
SELECT pepsi.workqueue_split_off(:s, 'route', '{1,2}');
SELECT pepsi.workqueue_split_off(:s, 'route', '{2,1}', 'relay');
SELECT pepsi.workqueue_split_off(:s, 'route', NULL);
SELECT pepsi.workqueue_split_off(:s, 'route', '{}');
SELECT pepsi.workqueue_split_off(:s, 'route', '{3}');
SELECT pepsi.workqueue_split_off(:s, 'route', '{0}');
SELECT pepsi.workqueue_split_off(:s, 'route', '{1,1}');
SELECT pepsi.workqueue_split_off(:s, 'route', '{1,NULL}');
SELECT pepsi.workqueue_split_off(:s, 'route', '{1}', '');
SELECT pepsi.workqueue_split_off(:s, 'relay', '{1}');
SELECT pepsi.workqueue_split_off(:s + 1, 'relay', '{1}');
SELECT pepsi.workqueue_split_off(NULL, 'route', '{1}');
SELECT pepsi.workqueue_split_off(:s, NULL, '{1}');
SELECT jsonb_agg(to_jsonb(w) ORDER BY id) = :'before'::jsonb AS untouched FROM pepsi.workqueue w;
DELETE FROM pepsi.workqueue;

-- ---------------------------------------------------------------------------
-- workqueue_split_one_per_row
-- ---------------------------------------------------------------------------

SELECT pg_temp.five_recipients('smtp-relay') AS s \gset
SELECT array(SELECT x - :s FROM unnest(pepsi.workqueue_split_one_per_row(:s, 'smtp-relay')) x)
    AS siblings;
SELECT id - :s AS n, stage, status, has_timeout, received_kept, rcpt_to, state -> 'dsn' AS dsn
FROM family ORDER BY id;
SELECT count(DISTINCT body_id) AS bodies FROM pepsi.workqueue;

-- A single recipient: nothing to peel, the row unchanged.
SELECT jsonb_agg(to_jsonb(w) ORDER BY id) AS before FROM pepsi.workqueue w \gset
SELECT pepsi.workqueue_split_one_per_row(:s, 'smtp-relay');
SELECT jsonb_agg(to_jsonb(w) ORDER BY id) = :'before'::jsonb AS untouched FROM pepsi.workqueue w;

-- Refusals.
SELECT pepsi.workqueue_split_one_per_row(:s + 1, 'smtp-relay');
SELECT pepsi.workqueue_split_one_per_row(:s, 'route');
SELECT pepsi.workqueue_split_one_per_row(-1, 'smtp-relay');
SELECT pepsi.workqueue_split_one_per_row(NULL, 'smtp-relay');
SELECT pepsi.workqueue_split_one_per_row(:s, NULL);
SELECT pepsi.workqueue_split_one_per_row(:s, '');

-- Leave the queue empty, every body released.
DELETE FROM pepsi.workqueue;
SELECT count(*) AS bodies_left FROM pepsi.workqueue_body;
