-- (b) advance one running row from s1 to s2 through the native function;
-- each transaction takes the next preloaded row.
SELECT pepsi.workqueue_commit((SELECT nextval('bench_ids')), 's1', 'advance', 's2');
