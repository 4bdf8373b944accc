#!/usr/bin/env bash
# bench/admin: the cost of the DBA's queue views on a big queue.
#
# Loads 1,000,000 rows (BENCH_ROWS) in the shape of a backlog: most rows
# deferred (paused) at the relay stage, the rest pending, running, failed,
# timed out or held across the other stages; one to five recipients each,
# spread unevenly over 1,000 domains; received over the last two days; about
# 600 bytes of headers per row, as ingress writes them.  Then times, in one
# session, SELECT * FROM pepsi.queue_summary and pepsi.queue_shape, a
# warm-up and BENCH_REPEATS (5) timed runs each, and prints the medians
# against the targets: queue_summary under 300 ms, queue_shape under 1.5 s.
# Reports, never fails the build: exits 0 unless the benchmark itself broke.
#
# TODO(issue 8, CLI half): time "pepsi-queue list --limit 100" (target
# under 50 ms) on the same queue, and run Postfix's qshape and mailq on a
# Postfix queue of 20,000 deferred messages side by side, printing the cost
# per message of each and the ratio (target: pepsi at least 10x cheaper per
# message).  Those need the pepsi-queue tool and a Postfix queue fixture.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib.sh
. "$here/../lib.sh"

rows=${BENCH_ROWS:-1000000}
repeats=${BENCH_REPEATS:-5}
out_dir="$bench_top/bench/out"
mkdir -p "$out_dir"
log="$out_dir/admin.log"
: >"$log"

bench_cluster_start

echo "loading $rows rows ..."
bench_psql <<SQL
-- A thousand bodies, shared as splits and clones share them.
INSERT INTO pepsi.workqueue_body (body)
SELECT convert_to(repeat(md5(n::text), 64), 'UTF8') FROM generate_series(1, 1000) AS n;

CREATE TEMP TABLE shape AS
SELECT n,
       random() AS r_status,
       random() AS r_stage,
       -- skewed, as real destinations are: a few big providers, a long tail
       (floor(power(random(), 3) * 1000))::int AS domain_no,
       CASE WHEN n % 20 = 0 THEN 5 WHEN n % 10 = 0 THEN 2 ELSE 1 END AS recipients
FROM generate_series(1, $rows) AS n;

INSERT INTO pepsi.workqueue (stage, status, timeout, received_at, mail_from, rcpt_to,
                             headers, body_id, client_address, auth_account)
SELECT CASE WHEN r_status < 0.60 THEN 'relay'
            WHEN r_stage < 0.10 THEN 'init' WHEN r_stage < 0.40 THEN 'route'
            WHEN r_stage < 0.60 THEN 'dkim-sign' WHEN r_stage < 0.90 THEN 'relay'
            ELSE 'bounce' END,
       status::pepsi.status,
       CASE status WHEN 'paused' THEN CASE WHEN r_stage < 0.02 THEN 'infinity'
                                           ELSE now() + random() * interval '1 hour' END END,
       now() - random() * interval '2 days',
       'sender' || (n % 5000) || '@example.org',
       (SELECT array_agg('user' || ((n + k) % 997) || '@d' || ((domain_no + k * 37) % 1000) || '.example')
        FROM generate_series(0, recipients - 1) AS k),
       convert_to(
           'Received: from mx' || (n % 97) || '.example.org (mx.example.org [192.0.2.' || (n % 250) || '])' || E'\r\n'
           || E'\tby pepsi.example.net with ESMTPS id ' || md5(n::text) || E';\r\n'
           || E'\tMon, 30 Nov 2026 09:00:00 +0000\r\n'
           || 'Authentication-Results: pepsi.example.net; spf=pass smtp.mailfrom=example.org;' || E'\r\n'
           || E'\tdkim=pass header.d=example.org\r\n'
           || 'DKIM-Signature: v=1; a=rsa-sha256; d=example.org; s=s1; h=from:to:subject:date;' || E'\r\n'
           || E'\tb=' || repeat(md5((n * 7)::text), 5) || E'\r\n'
           || 'From: Sender <sender' || (n % 5000) || E'@example.org>\r\n'
           || 'To: <user' || (n % 997) || '@d' || domain_no || E'.example>\r\n'
           || 'Subject: Benchmark message ' || n || E'\r\n'
           || 'Message-ID: <' || md5(n::text) || E'@example.org>\r\n', 'UTF8'),
       1 + n % 1000,
       CASE WHEN n % 10 <> 0 THEN '10.0.0.0'::inet + (n % 10000) END,
       CASE WHEN n % 10 = 0 THEN 'account' || (n % 300) END
FROM (SELECT *, CASE WHEN r_status < 0.60 THEN 'paused'
                     WHEN r_status < 0.90 THEN 'pending'
                     WHEN r_status < 0.93 THEN 'running'
                     WHEN r_status < 0.99 THEN 'failed'
                     ELSE 'timeout' END AS status
      FROM shape) AS s;
DROP TABLE shape;
VACUUM ANALYZE pepsi.workqueue;
SQL
bench_psql -At -c "SELECT 'rows: ' || count(*) || ', recipients: ' || sum(cardinality(rcpt_to))
                          || ', domains: ' || (SELECT count(*) FROM pepsi.queue_shape)
                          || ', queue table: ' || pg_size_pretty(pg_table_size('pepsi.workqueue'))
                   FROM pepsi.workqueue" | tee -a "$log"

# One session: a warm-up, then the timed runs, each marked for times().
script="$BENCH_DIR/admin.sql"
{
    echo '\timing on'
    for view in queue_summary queue_shape; do
        echo "\\echo WARM $view"
        echo "SELECT * FROM pepsi.$view \\g /dev/null"
        for ((r = 0; r < repeats; r++)); do
            echo "\\echo TIMED $view"
            echo "SELECT * FROM pepsi.$view \\g /dev/null"
        done
        echo "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT * FROM pepsi.$view;"
    done
} >"$script"
give_to_user "$script"
bench_psql -f "$script" >"$BENCH_DIR/admin.out" 2>&1 || {
    tail -n 20 "$BENCH_DIR/admin.out" >&2
    exit 1
}
cat "$BENCH_DIR/admin.out" >>"$log"

# times VIEW: the statement times after each "TIMED VIEW" marker.
times() {
    awk -v want="TIMED $1" '
        /^(TIMED|WARM) / { mark = $0; next }
        /^Time: / && mark != "" { if (mark == want) print $2; mark = "" }' "$BENCH_DIR/admin.out"
}

printf '%-15s %-12s %-10s %s\n' view "median ms" "target ms" verdict
for spec in "queue_summary 300" "queue_shape 1500"; do
    set -- $spec
    median=$(bench_median $(times "$1"))
    verdict=$(awk -v m="$median" -v t="$2" 'BEGIN { print (m < t) ? "met" : "MISSED" }')
    printf '%-15s %-12s %-10s %s\n' "$1" "$median" "$2" "$verdict" | tee -a "$log"
done
echo "(median of $repeats runs at $rows rows; plans and raw times in bench/out/admin.log)"
