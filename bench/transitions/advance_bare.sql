-- (b) the same advance as a bare guarded UPDATE.
UPDATE pepsi.workqueue SET stage = 's2', status = 'pending'
WHERE id = (SELECT nextval('bench_ids')) AND status = 'running' AND stage = 's1';
