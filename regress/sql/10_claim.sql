--
-- workqueue_claim: fair-share selection among senders, the FIFO share,
-- and its argument checks.  Time here is simulated: after each round the
-- test charges every claimed row one unit of worker time to its sender,
-- as the dispatcher would, and finishes the rows.
--
SET client_min_messages = warning;

CREATE TABLE claim_account (stage text, sender_key text, used float8, PRIMARY KEY (stage, sender_key));
CREATE TABLE claim_log (round int, id bigint, sender_key text);

-- Admit count messages at stage from one client address.
CREATE FUNCTION claim_admit(stage text, address inet, count int) RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(pepsi.workqueue_add('s@example.org', ARRAY['r@example.net'], ''::bytea, ''::bytea,
                                     '{}', address, NULL, stage))
    FROM generate_series(1, count)
$$;

-- One dispatcher round: claim with the current accounting, log the rows,
-- charge one unit per row, finish the rows.  Returns the rows claimed.
CREATE FUNCTION claim_round(round int, stage text, capacity int, fifo int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    claimed int;
BEGIN
    INSERT INTO claim_log
    SELECT round, c.id, c.sender_key
    FROM pepsi.workqueue_claim(ARRAY[stage], ARRAY[capacity],
                               (SELECT array_agg(a.stage) FROM claim_account a),
                               (SELECT array_agg(a.sender_key) FROM claim_account a),
                               (SELECT array_agg(a.used) FROM claim_account a),
                               fifo, ARRAY[1.0]) AS c;
    GET DIAGNOSTICS claimed = ROW_COUNT;
    INSERT INTO claim_account
    SELECT stage, l.sender_key, count(*) FROM claim_log l WHERE l.round = claim_round.round
    GROUP BY l.sender_key
    ON CONFLICT ON CONSTRAINT claim_account_pkey DO UPDATE SET used = claim_account.used + excluded.used;
    DELETE FROM pepsi.workqueue w USING claim_log l WHERE l.round = claim_round.round AND w.id = l.id;
    RETURN claimed;
END;
$$;

-- A burst of 10,000 from one sender, then 10 each from 20 others.
SELECT claim_admit('relay', '192.0.2.1', 10000);
SELECT sum(claim_admit('relay', ('198.51.100.' || n)::inet, 10)) FROM generate_series(1, 20) AS n;

SELECT sum(claim_round(r, 'relay', 50, 10)) AS claimed FROM generate_series(1, 12) AS r;

-- Every one of the 200 light rows is claimed within the first 10 rounds.
SELECT count(*) AS light_rows_claimed, max(round) <= 10 AS all_within_ten_rounds
FROM claim_log WHERE sender_key <> 'ip:192.0.2.1';
-- With FAIR_FIFO_PERCENT = 10 the burst still gets at least 10% of every round.
SELECT bool_and(burst >= 5) AS burst_gets_its_share, min(burst) AS fewest_burst_rows
FROM (SELECT round, count(*) FILTER (WHERE sender_key = 'ip:192.0.2.1') AS burst
      FROM claim_log GROUP BY round) r;
-- Once the light senders are served the burst has the stage to itself.
SELECT count(*) AS round_12_burst_rows FROM claim_log WHERE round = 12 AND sender_key = 'ip:192.0.2.1';
-- Light senders interleave: no light sender takes all its 10 in the first round.
SELECT max(n) < 10 AS light_senders_interleave
FROM (SELECT count(*) AS n FROM claim_log WHERE round = 1 AND sender_key <> 'ip:192.0.2.1'
      GROUP BY sender_key) s;

DELETE FROM pepsi.workqueue;
TRUNCATE claim_account, claim_log;

-- A sender whose accounting is high gets nothing while lighter senders
-- have pending rows, except through the FIFO share.
SELECT claim_admit('relay', '192.0.2.7', 100);
SELECT sum(claim_admit('relay', ('198.51.100.' || n)::inet, 10)) FROM generate_series(1, 5) AS n;
INSERT INTO claim_account VALUES ('relay', 'ip:192.0.2.7', 1000), ('relay', 'ip:198.51.100.1', 3);
SELECT claim_round(1, 'relay', 20, 0) AS claimed;
SELECT count(*) FILTER (WHERE sender_key = 'ip:192.0.2.7') AS heavy_rows_without_fifo FROM claim_log WHERE round = 1;
SELECT claim_round(2, 'relay', 20, 10) AS claimed;
SELECT count(*) FILTER (WHERE sender_key = 'ip:192.0.2.7') AS heavy_rows_with_fifo FROM claim_log WHERE round = 2;
-- Newcomers start level with the least-served waiting sender (198.51.100.1
-- at 3 units), not at zero: all five share round 1 evenly.  (Started at
-- zero, the four newcomers would have taken 3 slots each before it got one.)
SELECT count(*) FILTER (WHERE sender_key = 'ip:198.51.100.1') AS least_served_round_1 FROM claim_log WHERE round = 1;
-- Within a sender, oldest first.
SELECT bool_and(ordered) AS oldest_first FROM (
    SELECT id > lag(id) OVER (PARTITION BY sender_key ORDER BY round, id) IS NOT FALSE AS ordered
    FROM claim_log) s;
DELETE FROM pepsi.workqueue;
TRUNCATE claim_account, claim_log;

-- IPv6 senders in one /64 count as one sender: the two addresses of
-- 2001:db8:1:2::/64 share its heavy account, and the other /64 goes first.
SELECT claim_admit('relay', '2001:db8:1:2::1', 5);
SELECT claim_admit('relay', '2001:db8:1:2:ffff::9', 5);
SELECT claim_admit('relay', '2001:db8:1:3::1', 5);
SELECT DISTINCT sender_key FROM pepsi.workqueue ORDER BY 1;
INSERT INTO claim_account VALUES ('relay', 'ip:2001:db8:1:2::/64', 1000), ('relay', 'ip:2001:db8:1:3::/64', 0);
SELECT claim_round(1, 'relay', 8, 0) AS claimed;
SELECT sender_key, count(*) FROM claim_log GROUP BY 1 ORDER BY 1;
DELETE FROM pepsi.workqueue;
TRUNCATE claim_account, claim_log;

-- Several stages in one call, each up to its own capacity; rows go running.
SELECT claim_admit('a', '192.0.2.1', 3);
SELECT claim_admit('b', '192.0.2.1', 3);
SELECT stage, count(*) FROM pepsi.workqueue_claim('{a,b,c}', '{2,5,4}') GROUP BY stage ORDER BY stage;
SELECT stage, status, count(*) FROM pepsi.workqueue GROUP BY 1, 2 ORDER BY 1, 2;
-- A row that became pending again is claimed again.
UPDATE pepsi.workqueue SET status = 'pending' WHERE stage = 'a';
SELECT count(*) FROM pepsi.workqueue_claim('{a}', '{10}');
DELETE FROM pepsi.workqueue;

-- The claim reads the stage's oldest rows once (its window) and the
-- arrivals past them.  A sender that appears behind more rows than the
-- window holds is found by that read and served in the very next claim:
-- with no FIFO share, only a fair pick can take its row.
SELECT claim_admit('w', '192.0.2.1', 30);
SELECT count(*) AS first_claim FROM pepsi.workqueue_claim('{w}', '{5}', fifo_percent => 0);
SELECT claim_admit('w', '198.51.100.7', 1);
SELECT sender_key, count(*) FROM pepsi.workqueue_claim('{w}', '{2}', fifo_percent => 0)
GROUP BY 1 ORDER BY 1;
-- When the window holds every pending row, a sender with fewer rows than
-- its share has no more, and the others fill the slots; a sender that ran
-- out and comes back is served again.
DELETE FROM pepsi.workqueue;
SELECT claim_admit('w', '192.0.2.1', 3), claim_admit('w', '198.51.100.7', 1);
SELECT sender_key, count(*) FROM pepsi.workqueue_claim('{w}', '{10}', fifo_percent => 0)
GROUP BY 1 ORDER BY 1;
SELECT claim_admit('w', '198.51.100.7', 2);
SELECT sender_key, count(*) FROM pepsi.workqueue_claim('{w}', '{10}', fifo_percent => 0)
GROUP BY 1 ORDER BY 1;
DELETE FROM pepsi.workqueue;

-- Edge cases: zero capacity, unknown stage, empty queue.
SELECT claim_admit('relay', '192.0.2.1', 3);
SELECT count(*) AS zero_capacity FROM pepsi.workqueue_claim('{relay}', '{0}');
SELECT count(*) AS unknown_stage FROM pepsi.workqueue_claim('{nosuchstage}', '{10}');
SELECT count(*) AS no_stages FROM pepsi.workqueue_claim('{}', '{}');
DELETE FROM pepsi.workqueue;
SELECT count(*) AS empty_queue FROM pepsi.workqueue_claim('{relay}', '{10}');

-- Bad arguments.
SELECT * FROM pepsi.workqueue_claim(NULL, '{1}');
SELECT * FROM pepsi.workqueue_claim('{relay}', NULL);
SELECT * FROM pepsi.workqueue_claim('{relay,other}', '{1}');
SELECT * FROM pepsi.workqueue_claim('{relay}', '{-1}');
SELECT * FROM pepsi.workqueue_claim('{relay}', ARRAY[NULL]::int[]);
SELECT * FROM pepsi.workqueue_claim(ARRAY[NULL]::text[], '{1}');
SELECT * FROM pepsi.workqueue_claim('{""}', '{1}');
SELECT * FROM pepsi.workqueue_claim('{relay,relay}', '{1,2}');
SELECT * FROM pepsi.workqueue_claim('{relay}', '{1}', '{relay}', NULL, '{1}');
SELECT * FROM pepsi.workqueue_claim('{relay}', '{1}', '{relay,relay}', '{ip:a}', '{1,2}');
SELECT * FROM pepsi.workqueue_claim('{relay}', '{1}', '{relay}', '{ip:a}', '{1,2}');
SELECT * FROM pepsi.workqueue_claim('{relay}', '{1}', '{relay}', '{ip:a}', '{-5}');
SELECT * FROM pepsi.workqueue_claim('{relay}', '{1}', '{relay}', '{ip:a}', '{NaN}');
SELECT * FROM pepsi.workqueue_claim('{relay}', '{1}', fifo_percent => 101);
SELECT * FROM pepsi.workqueue_claim('{relay}', '{1}', fifo_percent => NULL);
SELECT * FROM pepsi.workqueue_claim('{relay}', '{1}', row_costs => '{1,2}');

-- A claim is a HOT update: it changes status alone, which no index names
-- (they name index_status, status with running read as pending), so it
-- adds no index entry.  The rows it leaves running stay in the pending
-- indexes, yet are not claimed again, and count as running.
SELECT claim_admit('hot', '192.0.2.7', 20);
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd AS upd_before, n_tup_hot_upd AS hot_before
FROM pg_stat_user_tables WHERE relid = 'pepsi.workqueue'::regclass \gset
SELECT count(*) AS claimed FROM pepsi.workqueue_claim('{hot}', '{50}');
SELECT pg_stat_force_next_flush();
SELECT n_tup_upd - :upd_before AS updates, n_tup_hot_upd - :hot_before AS hot_updates
FROM pg_stat_user_tables WHERE relid = 'pepsi.workqueue'::regclass;
SELECT count(*) AS claimed_again FROM pepsi.workqueue_claim('{hot}', '{50}');
SELECT status, messages FROM pepsi.queue_summary WHERE stage = 'hot';
DELETE FROM pepsi.workqueue;

DROP TABLE claim_account, claim_log;
DROP FUNCTION claim_round, claim_admit;
