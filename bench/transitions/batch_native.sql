-- (c) advance 100 running rows from s1 to s2 in one call; each transaction
-- takes the next block of 100 preloaded rows (bench_batches counts by 100).
SELECT pepsi.workqueue_commit_many(b.ids, array_fill('s1'::text, ARRAY[100]), 'advance',
                                   array_fill('s2'::text, ARRAY[100]))
FROM (SELECT ARRAY(SELECT generate_series(n, n + 99)) AS ids
      FROM (SELECT nextval('bench_batches') AS n) s) b;
