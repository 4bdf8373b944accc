-- (c) the same 100 rows advanced by one bare guarded UPDATE.
UPDATE pepsi.workqueue SET stage = 's2', status = 'pending'
WHERE id = ANY (ARRAY(SELECT generate_series(n, n + 99) FROM (SELECT nextval('bench_batches') AS n) s))
  AND status = 'running' AND stage = 's1';
