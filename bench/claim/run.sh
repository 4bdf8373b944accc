#!/usr/bin/env bash
# bench/claim: the fair-share claim against the usual PostgreSQL queue.
#
# Builds a queue at one stage where one sender owns 90% of the rows and the
# rest come from many others (10,000 senders at 1M rows), shuffled together,
# then times, in one session (as the dispatcher's one connection would):
#   fair: SELECT * FROM pepsi.workqueue_claim(...) with a realistic
#         accounting (the heavy sender far ahead, 1,000 light ones known)
#   fifo: UPDATE ... WHERE id IN (SELECT id ... ORDER BY id LIMIT n
#         FOR UPDATE SKIP LOCKED) RETURNING id   (no fairness)
# alternately, restoring the queue between runs, and prints the medians
# and the ratio fair/fifo.  Sizes: claims of 64, 512 and 4,096 rows at 1M
# pending, and 512 rows at 10k and 100k pending (growth with queue size).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-7}
out_dir="$bench_top/bench/out"
mkdir -p "$out_dir"
log="$out_dir/claim.log"
: >"$log"

bench_cluster_start

# load_queue TOTAL SENDERS: TOTAL rows at stage relay; 90% from 10.0.0.1,
# the rest spread over SENDERS other addresses; arrival order shuffled.
load_queue() {
    local total=$1 senders=$2
    bench_psql -q <<SQL
TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY CASCADE;
INSERT INTO pepsi.workqueue_body (body) VALUES (convert_to(repeat('x', 2048), 'UTF8'));
INSERT INTO pepsi.workqueue (stage, mail_from, rcpt_to, headers, body_id, client_address)
SELECT 'relay', 'sender@example.org', ARRAY['rcpt@example.net'], '\x'::bytea, 1,
       CASE WHEN n <= $total * 9 / 10 THEN inet '10.0.0.1'
            ELSE ('10.1.0.0'::inet + (n % $senders)) END
FROM generate_series(1, $total) AS n ORDER BY random();
VACUUM ANALYZE pepsi.workqueue;
SQL
}

# The accounting the dispatcher would pass: the heavy sender far ahead and
# 1,000 light senders with a little used time.  The dispatcher holds these
# arrays in memory; here they are built once per session into a temporary
# table, so the timed call pays for passing them, not for making them.
accounting_setup="CREATE TEMP TABLE accounting AS SELECT
  (SELECT array_agg('relay'::text) FROM generate_series(0, 1000)) AS stages,
  (SELECT array_agg(CASE WHEN n = 0 THEN 'ip:10.0.0.1' ELSE 'ip:' || host('10.1.0.0'::inet + n) END)
     FROM generate_series(0, 1000) AS n) AS senders,
  (SELECT array_agg(CASE WHEN n = 0 THEN 1e9::float8 ELSE (n % 7) * 1000.0::float8 END)
     FROM generate_series(0, 1000) AS n) AS used;"
accounting_args="(SELECT stages FROM accounting), (SELECT senders FROM accounting),
  (SELECT used FROM accounting), 10, ARRAY[50000.0::float8]"

# run_sizes PENDING CLAIM...: time fair and fifo claims of each size.
run_sizes() {
    local pending=$1
    shift
    local script="$BENCH_DIR/claim-$pending.sql"
    {
        echo "$accounting_setup"
        echo '\timing on'
        echo "\\echo COLD fair 512"
        echo "SELECT count(*) FROM pepsi.workqueue_claim(ARRAY['relay'], ARRAY[512], $accounting_args);"
        echo "UPDATE pepsi.workqueue SET status = 'pending' WHERE status = 'running';"
        for claim in "$@"; do
            for ((r = 0; r < repeats; r++)); do
                echo "\\echo TIMED fair $claim"
                echo "SELECT count(*) FILTER (WHERE sender_key = 'ip:10.0.0.1') AS heavy, count(*) FROM pepsi.workqueue_claim(ARRAY['relay'], ARRAY[$claim], $accounting_args);"
                echo "UPDATE pepsi.workqueue SET status = 'pending' WHERE status = 'running';"
                echo "\\echo TIMED fifo $claim"
                echo "UPDATE pepsi.workqueue SET status = 'running' WHERE id IN (SELECT id FROM pepsi.workqueue WHERE stage = 'relay' AND status = 'pending' ORDER BY id LIMIT $claim FOR UPDATE SKIP LOCKED) RETURNING id \\g /dev/null"
                echo "UPDATE pepsi.workqueue SET status = 'pending' WHERE status = 'running';"
            done
            echo "VACUUM pepsi.workqueue;"
        done
    } >"$script"
    give_to_user "$script"
    if ! bench_psql -f "$script" >"$BENCH_DIR/claim-$pending.out" 2>&1; then
        tail -n 20 "$BENCH_DIR/claim-$pending.out" >&2
        return 1
    fi
    cat "$BENCH_DIR/claim-$pending.out" >>"$log"
}

# times KIND CLAIM FILE: the statement times after each "TIMED KIND CLAIM" marker.
times() {
    awk -v want="$1 $2 $3" '
        /^(TIMED|COLD) / { mark = $0; next }
        /^Time: / && mark != "" { if (mark == want) print $2; mark = "" }' "$4"
}

printf '%-10s %-7s %-11s %-11s %-9s %s\n' pending claim "fair ms" "fifo ms" fair/fifo "heavy rows in fair claim"
for spec in "1000000 10000 64 512 4096" "100000 10000 512" "10000 1000 512"; do
    set -- $spec
    pending=$1 senders=$2
    shift 2
    load_queue "$pending" "$senders"
    run_sizes "$pending" "$@"
    out="$BENCH_DIR/claim-$pending.out"
    for claim in "$@"; do
        fair=$(bench_median $(times TIMED fair "$claim" "$out"))
        fifo=$(bench_median $(times TIMED fifo "$claim" "$out"))
        heavy=$(awk -v c="$claim" '/^TIMED fair/ { want = ($3 == c); next } want && /^ *[0-9]+ \| *[0-9]+$/ { print $1; want = 0 }' "$out" | head -1)
        printf '%-10s %-7s %-11s %-11s %-9s %s\n' "$pending" "$claim" "$fair" "$fifo" \
            "$(awk -v a="$fair" -v b="$fifo" 'BEGIN { printf "%.2f", a / b }')" "$heavy of $claim"
    done
    echo "           (first claim on a fresh connection, rebuilding the sender set: $(times COLD fair 512 "$out") ms)"
done
echo "target: fair 512 <= 2.00 x fifo 512 at 1M pending; fair grows sub-linearly with pending rows"
