--
-- The internet relay's bookkeeping (extension/sql, "Relay to the
-- internet"): pepsi.dns_address kept by dns_address_store and read by
-- dns_address_current, a destination's concurrency slots, rate limit and
-- backoff (destination_begin / destination_end), and the operator's
-- destination_set_limits and destination_reset, with their refusals.
--
\set SHOW_CONTEXT never

-- Addresses with their TTL; a second store keeps the health of those kept.
SELECT pepsi.dns_address_store('mx1.example.net', '{192.0.2.1,2001:db8::1}', 300);
SELECT host, address, failures, retry_in FROM pepsi.dns_address_current('{mx1.example.net}');
SELECT pepsi.destination_end('example.net', NULL, 'unreachable', 'connection refused',
    NULL, NULL, '{mx1.example.net}', '{192.0.2.1}', 3, 60, 3600);
SELECT address, failures, retry_in > 50 AS waits FROM pepsi.dns_address_current('{mx1.example.net}');
SELECT pepsi.dns_address_store('mx1.example.net', '{192.0.2.1,192.0.2.2}', 300);
SELECT address, failures FROM pepsi.dns_address_current('{mx1.example.net}');
-- Expired entries are not current.
SELECT pepsi.dns_address_store('old.example.net', '{192.0.2.9}', 0);
SELECT count(*) FROM pepsi.dns_address_current('{old.example.net}');
SELECT pepsi.dns_address_store(NULL, '{192.0.2.9}', 60);

-- A slot is a session advisory lock, so the slots of a worker that dies
-- are freed with its session.  (Several sessions competing for a limit
-- are t/101_relay_internet_scheduling.pl's.)
SELECT slot, wait_seconds, reason FROM pepsi.destination_begin('Example.NET', 2);
SELECT count(*) AS slots_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid();
SELECT pepsi.destination_end('example.net', 0, 'connected', NULL, 'mx1.example.net', '192.0.2.2',
    NULL, NULL, 3, 60, 3600);
SELECT count(*) AS slots_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid();
SELECT failures, backoff_until FROM pepsi.destination WHERE domain = 'example.net';

-- Backoff: from the third unreachable round on, the destination waits.
SELECT pepsi.destination_end('down.example', NULL, 'unreachable', 'timed out', NULL, NULL, NULL, NULL, 3, 60, 3600);
SELECT pepsi.destination_end('down.example', NULL, 'unreachable', 'timed out', NULL, NULL, NULL, NULL, 3, 60, 3600);
SELECT failures, backoff_until IS NULL AS no_backoff FROM pepsi.destination WHERE domain = 'down.example';
SELECT pepsi.destination_end('down.example', NULL, 'unreachable', 'timed out', NULL, NULL, NULL, NULL, 3, 60, 3600);
SELECT failures, backoff_until > now() + interval '50 seconds' AS backs_off FROM pepsi.destination WHERE domain = 'down.example';
SELECT slot, wait_seconds > 50 AS waits, reason FROM pepsi.destination_begin('down.example', 20);
-- A success ends it.
SELECT pepsi.destination_reset('down.example');
SELECT slot FROM pepsi.destination_begin('down.example', 20);
SELECT pepsi.destination_end('down.example', 0, 'connected', NULL, NULL, NULL, NULL, NULL, 3, 60, 3600);
SELECT failures, backoff_until FROM pepsi.destination WHERE domain = 'down.example';

-- Busy: a refusal while others deliver narrows the window to them (here
-- none are left, so to one), and a window limits the slots.
SELECT slot FROM pepsi.destination_begin('busy.example', 20);
SELECT pepsi.destination_end('busy.example', 0, 'busy', '421 too many connections', NULL, NULL, NULL, NULL, 3, 60, 3600);
SELECT window_limit, last_error FROM pepsi.destination WHERE domain = 'busy.example';
SELECT slot, reason FROM pepsi.destination_begin('busy.example', 20);
SELECT pepsi.destination_end('busy.example', 0, 'connected', NULL, NULL, NULL, NULL, NULL, 3, 60, 3600);

-- One call for a delivery: with the slot, the current addresses of the
-- MX hosts (none for a host not cached), whether the destination is
-- contended, and its cached MTA-STS policy (none here).
SELECT b.slot, b.contended, b.sts_policy_id, a->>'host' AS host, a->>'address' AS address,
       a->>'failures' AS failures
FROM pepsi.destination_begin('keep.example', 20, '{mx1.example.net,none.example.net}') b
LEFT JOIN LATERAL jsonb_array_elements(b.addresses) a ON true ORDER BY 5;
-- It also ends the worker's previous delivery: to the same domain the
-- slot carries over (still one held), to another it is freed first.
SELECT slot, contended FROM pepsi.destination_begin('keep.example', 20, NULL,
    'keep.example', 0, 'mx1.example.net', '192.0.2.2', 0.5);
SELECT count(*) AS slots_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid();
SELECT slot FROM pepsi.destination_begin('busy.example', 20, NULL,
    'keep.example', 0, 'mx1.example.net', '192.0.2.2', 0.5);
SELECT count(*) AS slots_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid();
SELECT pepsi.destination_end('busy.example', 0, 'connected', NULL, NULL, NULL, NULL, NULL, 3, 60, 3600);
SELECT count(*) AS slots_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid();

-- The operator's limits: a concurrency of one, a rate of one a minute.
SELECT pepsi.destination_set_limits('slow.example', 1, 1);
SELECT slot FROM pepsi.destination_begin('slow.example', 20);
SELECT pepsi.destination_end('slow.example', 0, 'connected', NULL, NULL, NULL, NULL, NULL, 3, 60, 3600);
SELECT slot, wait_seconds > 30 AS waits, reason FROM pepsi.destination_begin('slow.example', 20);
SELECT action, detail FROM pepsi.event_log WHERE action LIKE 'destination%' ORDER BY id;

-- A slow destination (its deliveries take slow_seconds or more) holds at
-- most slow_limit slots while other mail waits: a slot above them,
-- carried over from the worker's previous delivery there, is given up for
-- one within them.  With no other mail, the slot carries over.
INSERT INTO pepsi.destination (domain, service_seconds) VALUES ('pace.example', 2);
SELECT pg_advisory_lock(pepsi.destination_slot_key('pace.example', 5));
SELECT slot FROM pepsi.destination_begin('pace.example', 20, NULL,
    'pace.example', 5, NULL, NULL, 2.5, 1.0, 2);
SELECT pg_advisory_lock(pepsi.destination_slot_key('other.example', 0));
SELECT slot FROM pepsi.destination_begin('pace.example', 20, NULL,
    'pace.example', 5, NULL, NULL, 2.5, 1.0, 2);
SELECT pg_advisory_unlock(pepsi.destination_slot_key('other.example', 0));
SELECT count(*) AS slots_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid();
-- Not slow by a higher measure: the slot it holds carries over.
SELECT slot FROM pepsi.destination_begin('pace.example', 20, NULL,
    'pace.example', 0, NULL, NULL, 2.5, 5.0, 2);
SELECT count(*) AS slots_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid();
SELECT pepsi.destination_end('pace.example', 0, 'connected', NULL, NULL, NULL, NULL, NULL, 3, 60, 3600);

-- A delivery's TLS result: written with its outcome (a healthy destination
-- gets a row for it), again only when it changed.
SELECT pepsi.destination_end('tls.example', NULL, 'connected', NULL, NULL, NULL, NULL, NULL, 3, 60, 3600,
    0.1, 'dane', 'dane verified (usage 3)');
SELECT tls_policy, tls_outcome, tls_at IS NOT NULL AS written FROM pepsi.destination WHERE domain = 'tls.example';
UPDATE pepsi.destination SET tls_at = '2000-01-01 00:00:00+00' WHERE domain = 'tls.example';
SELECT pepsi.destination_end('tls.example', NULL, 'connected', NULL, NULL, NULL, NULL, NULL, 3, 60, 3600,
    0.1, 'dane', 'dane verified (usage 3)');
SELECT tls_at = '2000-01-01 00:00:00+00' AS not_written_again FROM pepsi.destination WHERE domain = 'tls.example';
SELECT pepsi.destination_end('tls.example', NULL, 'unreachable', 'certificate mismatch', NULL, NULL, NULL, NULL,
    3, 60, 3600, NULL, 'dane', 'dane failed: validation-failure');
SELECT failures, tls_policy, tls_outcome, tls_at > '2000-01-01 00:00:00+00' AS written
FROM pepsi.destination WHERE domain = 'tls.example';
SELECT domain, tls_policy, tls_outcome FROM pepsi.destination_overview() WHERE domain = 'tls.example';

-- destination_begin says what TLS result is recorded (a worker whose
-- delivery got the same writes nothing), and whether each message must
-- ask for its turn: not for a healthy domain, nor one without a row; yes
-- with a rate limit.
SELECT slot, tls_policy, tls_outcome, per_message FROM pepsi.destination_begin('tls.example', 20);
SELECT pg_advisory_unlock(pepsi.destination_slot_key('tls.example', 0));
SELECT slot, tls_policy, per_message FROM pepsi.destination_begin('fresh.example', 20);
SELECT pg_advisory_unlock(pepsi.destination_slot_key('fresh.example', 0));
SELECT pepsi.destination_set_limits('rate.example', NULL, 600);
SELECT slot, per_message FROM pepsi.destination_begin('rate.example', 20);
SELECT pg_advisory_unlock(pepsi.destination_slot_key('rate.example', 0));

-- Refusals.
SELECT pepsi.destination_set_limits('Slow.Example', 1, 1);
SELECT pepsi.destination_set_limits('slow.example', 0, NULL);
SELECT pepsi.destination_set_limits('slow.example', NULL, -5);
SELECT pepsi.destination_begin('', 20);
SELECT pepsi.destination_begin('example.net', 0);
SELECT pepsi.destination_end('example.net', NULL, 'gone', NULL, NULL, NULL, NULL, NULL, 3, 60, 3600);
SELECT pepsi.destination_begin('example.net', 20, NULL, NULL, NULL, NULL, NULL, NULL, 1.0, 0);
