#!/usr/bin/env bash
# bench/metrics: how long a look at the queue costs a monitoring system,
# pepsi-httpd against Postfix's own tools, side by side in one run.
#
# Pepsi: a queue in the shape of a backlog (bench/backlog.sql) grown to
# 10,000, 100,000 and 1,000,000 rows (BENCH_SIZES); at each size,
# BENCH_SCRAPES (20) timed requests after a warm-up, each a whole HTTP
# request by curl: GET /metrics (what Prometheus scrapes) and GET
# /api/summary with a bearer token.  The maintenance worker runs, as in
# production: it refreshes the gauges' snapshot for a big queue
# (pepsi.queue_gauges); the time one refresh takes at each size is
# printed too, as the background cost.
#
# Postfix: a private, stock instance (bench/lib.sh) whose every delivery
# is refused at once, filled through its smtpd with BENCH_POSTFIX_MESSAGES
# (10,000) messages that all end deferred (bench/admin/fill-postfix.py);
# then "mailq | tail -1" (postqueue -p, the count a monitoring check
# greps) and "qshape deferred", BENCH_REPEATS (5) timed runs each.
# A Postfix queue of a million messages would take hours to fill here, so
# the comparison is per message: the time divided by the messages covered.
#
# Targets: /metrics under 50 ms at 1,000,000 rows, and per message at
# least 10x cheaper than qshape.  Reports, never fails the build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib.sh
. "$here/../lib.sh"

sizes=${BENCH_SIZES:-"10000 100000 1000000"}
scrapes=${BENCH_SCRAPES:-20}
repeats=${BENCH_REPEATS:-5}
postfix_messages=${BENCH_POSTFIX_MESSAGES:-10000}
httpd_bin="$bench_top/build/bin/pepsi-httpd"
log=$(bench_log metrics)

[ -x "$httpd_bin" ] || { echo "build pepsi-httpd first (make programs)" >&2; exit 1; }
command -v curl >/dev/null || { echo "bench/metrics needs curl" >&2; exit 1; }
bench_postfix_install

httpd_pid=
fill_pid=
cleanup() {
    [ -n "$fill_pid" ] && { kill "$fill_pid" 2>/dev/null || true; wait "$fill_pid" 2>/dev/null || true; }
    bench_stop_pid "$httpd_pid"
    bench_cleanup
}
bench_cluster_start
trap cleanup EXIT

# Postfix fills while Pepsi's rows load.
postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
postfix_port=$(bench_free_port)
closed_port=$(bench_free_port)
bench_postfix_start "$postfix_dir" "$postfix_port" \
    "relayhost = [127.0.0.1]:$closed_port" \
    "minimal_backoff_time = 1h" \
    "maximal_backoff_time = 4h" \
    "queue_run_delay = 1h"
python3 "$here/../admin/fill-postfix.py" 127.0.0.1 "$postfix_port" "$postfix_messages" 16 \
    >"$BENCH_DIR/fill.out" 2>&1 &
fill_pid=$!

# pepsi-httpd as it runs in production: its own role, the maintenance
# worker refreshing the gauges of a big queue.
bench_psql -c "CREATE ROLE bench_web LOGIN IN ROLE pepsi_httpd" -c "SELECT pepsi.start_maintenance()" >/dev/null
http_port=$(bench_free_port)
conf="$BENCH_DIR/pepsi.conf"
cat >"$conf" <<CONF
[database]
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
[httpd]
ADDRESS = 127.0.0.1
PORT = $http_port
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=bench_web
CONF
# Started as root, it becomes the benchmark's unprivileged user.
[ "$(id -u)" -eq 0 ] && echo "USER = $PEPSI_USER" >>"$conf"
give_to_user "$conf"
token=$("$httpd_bin" -c "$conf" token bench)
"$httpd_bin" -c "$conf" >>"$log" 2>&1 &
httpd_pid=$!
for ((i = 0; i < 100; i++)); do
    curl -s -o /dev/null "http://127.0.0.1:$http_port/metrics" && break
    sleep 0.1
done

# scrape_ms URL [HEADER]: one request's total time in milliseconds.
scrape_ms() {
    curl -s -o /dev/null -w '%{time_total}\n' ${2:+-H "$2"} "$1" | awk '{ printf "%.3f\n", $1 * 1000 }'
}
# median_of N CMD...: the median of N runs' printed times, after a warm-up.
median_of() {
    local n=$1 times=()
    shift
    "$@" >/dev/null
    for ((r = 0; r < n; r++)); do times+=("$("$@")"); done
    echo "$* : ${times[*]}" >>"$log"
    bench_median "${times[@]}"
}

declare -A metrics summary refresh
loaded=0
for size in $sizes; do
    echo "loading rows $((loaded + 1)) to $size ..."
    bench_psql -v first=$((loaded + 1)) -v last="$size" -f "$(bench_file "$here/../backlog.sql")" >/dev/null
    loaded=$size
    # What the maintenance worker does for a queue this big, timed once.
    refresh[$size]=$(bench_psql -At -c "SELECT pepsi.queue_gauge_refresh(true)" \
        -c "SELECT round(extract(epoch FROM duration) * 1000, 1) FROM pepsi.queue_gauge_refresh" | tail -n 1)
    counted=$(curl -s "http://127.0.0.1:$http_port/metrics" \
        | awk '/^pepsi_queue_messages\{/ { n += $2 } END { printf "%d", n }')
    [ "$counted" -eq "$size" ] || { echo "/metrics counts $counted messages of $size" >&2; exit 1; }
    metrics[$size]=$(median_of "$scrapes" scrape_ms "http://127.0.0.1:$http_port/metrics")
    summary[$size]=$(median_of "$scrapes" scrape_ms "http://127.0.0.1:$http_port/api/summary" \
        "Authorization: Bearer $token")
done

if ! wait "$fill_pid"; then
    fill_pid=
    cat "$BENCH_DIR/fill.out" >&2
    exit 1
fi
fill_pid=
deferred=$(bench_postfix_wait_deferred "$postfix_dir" "$postfix_messages") || exit 1
run_ms() {
    local start=$EPOCHREALTIME
    "$@" >/dev/null 2>&1
    awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f\n", (b - a) * 1000 }'
}
mailq_tail() { /usr/sbin/postqueue -c "$postfix_dir/etc" -p | tail -n 1; }
mailq_ms=$(median_of "$repeats" run_ms mailq_tail)
qshape_ms=$(median_of "$repeats" run_ms /usr/sbin/qshape -c "$postfix_dir/etc" deferred)
echo "postfix: $deferred deferred; $(mailq_tail)" >>"$log"

largest=${sizes##* }
{
    echo
    printf '%-28s %10s %12s %14s\n' "" messages "median ms" "us/message"
    for size in $sizes; do
        printf '%-28s %10d %12.2f %14.4f\n' "pepsi /metrics" "$size" "${metrics[$size]}" \
            "$(awk -v m="${metrics[$size]}" -v n="$size" 'BEGIN { print m * 1000 / n }')"
        printf '%-28s %10d %12.2f %14.4f\n' "pepsi /api/summary" "$size" "${summary[$size]}" \
            "$(awk -v m="${summary[$size]}" -v n="$size" 'BEGIN { print m * 1000 / n }')"
        printf '%-28s %10d %12.2f   (background, at most every max(1 s, 20x this))\n' \
            "  gauge refresh (worker)" "$size" "${refresh[$size]}"
    done
    printf '%-28s %10d %12.2f %14.4f\n' "postfix mailq | tail -1" "$postfix_messages" "$mailq_ms" \
        "$(awk -v m="$mailq_ms" -v n="$postfix_messages" 'BEGIN { print m * 1000 / n }')"
    printf '%-28s %10d %12.2f %14.4f\n' "postfix qshape deferred" "$postfix_messages" "$qshape_ms" \
        "$(awk -v m="$qshape_ms" -v n="$postfix_messages" 'BEGIN { print m * 1000 / n }')"
    awk -v m="${metrics[$largest]}" -v n="$largest" -v q="$qshape_ms" -v k="$postfix_messages" -v t="$mailq_ms" 'BEGIN {
        printf "/metrics at %d rows: %.2f ms (target < 50 ms: %s)\n", n, m, (m < 50) ? "met" : "MISSED"
        r = (q / k) / (m / n)
        printf "per message, qshape / /metrics: %.0fx (target >= 10x: %s)\n", r, (r >= 10) ? "met" : "MISSED"
        printf "per message, mailq | tail -1 / /metrics: %.0fx\n", (t / k) / (m / n)
    }'
    echo "(medians: $scrapes requests per size for Pepsi, $repeats runs for Postfix, each after a warm-up;" \
        "raw times in $log)"
} | tee -a "$log"
