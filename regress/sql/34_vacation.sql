--
-- Vacation notices (pepsi-stage-vacation): pepsi.vacation_set writes the
-- owner's per-address settings, checked and audited; vacation_unset
-- removes them; pepsi.autoreply_due answers once per interval per pair.
--
\set SHOW_CONTEXT never

SELECT coalesce(max(id), 0) AS events_before FROM pepsi.event_log \gset

SELECT pepsi.vacation_set('Alice@Example.ORG', E'Away.\nBack soon.', 'Away', '2 days');
SELECT address, option, value FROM pepsi.settings ORDER BY option;
-- Again without a subject: the subject row goes, the rest is replaced.
SELECT pepsi.vacation_set('alice@example.org', 'Away again.');
SELECT address, option, value FROM pepsi.settings ORDER BY option;

-- Refused: no message, a control character, a subject of two lines, a
-- bad interval, not an address, NULL.
SELECT pepsi.vacation_set('alice@example.org', '  ');
SELECT pepsi.vacation_set('alice@example.org', E'bell\x07');
SELECT pepsi.vacation_set('alice@example.org', 'x', E'two\nlines');
SELECT pepsi.vacation_set('alice@example.org', 'x', NULL, '0 seconds');
SELECT pepsi.vacation_set('alice@example.org', 'x', NULL, '400 days');
SELECT pepsi.vacation_set('alice', 'x');
SELECT pepsi.vacation_set(NULL, 'x');

-- Once per pair and interval, case-insensitive.
SELECT pepsi.autoreply_due('alice@example.org', 'Bob@Example.org', '1 hour') AS first,
       pepsi.autoreply_due('alice@example.org', 'bob@example.org', '1 hour') AS again,
       pepsi.autoreply_due('alice@example.org', 'carol@example.org', '1 hour') AS other;
UPDATE pepsi.autoreply_sent SET sent_at = now() - interval '2 hours';
SELECT pepsi.autoreply_due('alice@example.org', 'bob@example.org', '1 hour') AS after_the_interval;
SELECT pepsi.autoreply_due('alice@example.org', NULL, '1 hour');
-- A new notice answers everyone afresh; unset ends it.
SELECT pepsi.vacation_set('alice@example.org', 'New notice.');
SELECT count(*) AS remembered FROM pepsi.autoreply_sent;
SELECT pepsi.vacation_unset('alice@example.org');
SELECT pepsi.vacation_unset('alice@example.org');
SELECT count(*) AS settings_left FROM pepsi.settings;

-- Pruning (the maintenance worker calls pepsi.autoreply_prune): a row goes
-- once its own interval has passed, not before; a row without keep_until
-- (older than the column) once it is older than 365 days.
SELECT pepsi.autoreply_due('dan@example.org', 'x@example.org', '1 hour') AS x,
       pepsi.autoreply_due('dan@example.org', 'y@example.org', '1 day') AS y;
SELECT recipient, keep_until - sent_at AS kept_for FROM pepsi.autoreply_sent
WHERE responder = 'dan@example.org' ORDER BY recipient;
SELECT pepsi.autoreply_prune() AS pruned_at_once;
UPDATE pepsi.autoreply_sent SET sent_at = sent_at - interval '2 hours', keep_until = keep_until - interval '2 hours'
WHERE responder = 'dan@example.org';
INSERT INTO pepsi.autoreply_sent (responder, recipient, sent_at) VALUES
    ('old@example.org', 'a@example.org', now() - interval '400 days'),
    ('old@example.org', 'b@example.org', now() - interval '30 days');
SELECT pepsi.autoreply_prune() AS pruned;
SELECT responder, recipient FROM pepsi.autoreply_sent ORDER BY responder, recipient;
-- A reply due again starts a new interval; a batch takes at most its size.
SELECT pepsi.autoreply_due('dan@example.org', 'x@example.org', '1 hour') AS x_again;
UPDATE pepsi.autoreply_sent SET keep_until = now() - interval '1 second' WHERE responder = 'dan@example.org';
SELECT pepsi.autoreply_prune(1) AS first_batch;
SELECT pepsi.autoreply_prune(1) AS second_batch;
SELECT pepsi.autoreply_prune(1) AS nothing_left;
SELECT pepsi.autoreply_prune(0);
DELETE FROM pepsi.autoreply_sent;

SELECT action, detail FROM pepsi.event_log WHERE id > :events_before ORDER BY id;
