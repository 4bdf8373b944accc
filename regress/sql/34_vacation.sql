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

SELECT action, detail FROM pepsi.event_log WHERE id > :events_before ORDER BY id;
