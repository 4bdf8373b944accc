#!/usr/bin/env bash
# bench/admin: the cost of looking at a big queue, Pepsi against Postfix.
#
# Pepsi: loads 1,000,000 rows (BENCH_ROWS) in the shape of a backlog: most
# rows deferred (paused) at the relay stage, the rest pending, running,
# failed, timed out or held across the other stages; one to five
# recipients each, spread unevenly over 1,000 domains; received over the
# last two days; about 600 bytes of headers per row, as ingress writes
# them.  Then times, each as a warm-up and BENCH_REPEATS (5) timed runs:
#   SELECT * FROM pepsi.queue_summary and pepsi.queue_shape, in one psql
#   session (the DBA's view; targets: under 300 ms and under 1.5 s);
#   pepsi-queue list --limit 100 (target: under 50 ms), pepsi-queue shape
#   and pepsi-queue list --limit 20000, each a whole run of the tool:
#   process start, connection, query and printing.
#
# Postfix: a private, stock instance (bench/lib.sh) whose relayhost is a
# closed loopback port, filled through its smtpd with 20,000 messages
# (BENCH_POSTFIX_MESSAGES) of about 2 KB to 1,000 recipient domains, while
# the Pepsi rows load; each delivery attempt is refused at once, so every
# message ends in the deferred queue, where the long backoff keeps it for
# the rest of the run.  Then qshape deferred and mailq (postqueue -p), timed
# the same way.
#
# Prints the medians, the cost per message of each (the time divided by the
# messages it covers: the whole queue, or those listed) and the ratios
# Postfix/Pepsi per message: qshape against pepsi-queue shape (target:
# Pepsi at least 10x cheaper per message), mailq against pepsi-queue list.
# Reports, never fails the build: exits 0 unless the benchmark itself broke.
#
# Needs: postfix (installed with debconf "No configuration" when missing),
# python3, pepsi-queue built, the extension installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib.sh
. "$here/../lib.sh"

rows=${BENCH_ROWS:-1000000}
repeats=${BENCH_REPEATS:-5}
postfix_messages=${BENCH_POSTFIX_MESSAGES:-20000}
list_long=${BENCH_LIST_LONG:-20000}
queue_bin="$bench_top/build/bin/pepsi-queue"
out_dir="$bench_top/bench/out"
mkdir -p "$out_dir"
log="$out_dir/admin.log"
: >"$log"

[ -x "$queue_bin" ] || { echo "build pepsi-queue first (make programs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench/admin needs python3" >&2; exit 1; }
bench_postfix_install

fill_pid=
cleanup() {
    if [ -n "$fill_pid" ]; then
        kill "$fill_pid" 2>/dev/null || true
        wait "$fill_pid" 2>/dev/null || true
    fi
    bench_cleanup
}
bench_cluster_start
trap cleanup EXIT

# The Postfix queue fills while the Pepsi rows load: nothing is timed
# until both are done.
postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
postfix_port=$(bench_free_port)
closed_port=$(bench_free_port)
bench_postfix_start "$postfix_dir" "$postfix_port" \
    "# Every delivery goes to a closed port on this host: refused at once," \
    "# deferred, and not tried again for an hour." \
    "relayhost = [127.0.0.1]:$closed_port" \
    "minimal_backoff_time = 1h" \
    "maximal_backoff_time = 4h" \
    "queue_run_delay = 1h"
python3 "$here/fill-postfix.py" 127.0.0.1 "$postfix_port" "$postfix_messages" 16 \
    >"$BENCH_DIR/fill.out" 2>&1 &
fill_pid=$!

echo "loading $rows rows ..."
bench_psql -v first=1 -v last="$rows" -f "$(bench_file "$here/../backlog.sql")"
bench_psql -At -c "SELECT 'rows: ' || count(*) || ', recipients: ' || sum(cardinality(rcpt_to))
                          || ', domains: ' || (SELECT count(*) FROM pepsi.queue_shape)
                          || ', queue table: ' || pg_size_pretty(pg_table_size('pepsi.workqueue'))
                   FROM pepsi.workqueue" | tee -a "$log"

# Postfix: every message accepted, then every one deferred.
if ! wait "$fill_pid"; then
    fill_pid=
    cat "$BENCH_DIR/fill.out" >&2
    exit 1
fi
fill_pid=
tee -a "$log" <"$BENCH_DIR/fill.out"
deferred=$(bench_postfix_wait_deferred "$postfix_dir" "$postfix_messages") || exit 1
echo "postfix: $deferred messages deferred" | tee -a "$log"
/usr/sbin/qshape -c "$postfix_dir/etc" deferred >"$BENCH_DIR/qshape.out"
head -n 5 "$BENCH_DIR/qshape.out" >>"$log"

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

# The tools, each run as an operator runs it.
conf="$BENCH_DIR/pepsi.conf"
cat >"$conf" <<CONF
[database]
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
CONF

# run_ms CMD...: run CMD, its output thrown away; prints its wall time in
# milliseconds.
run_ms() {
    local start end
    start=$EPOCHREALTIME
    "$@" >/dev/null 2>>"$BENCH_DIR/commands.err" || {
        echo "failed: $*" >&2
        tail -n 5 "$BENCH_DIR/commands.err" >&2
        return 1
    }
    end=$EPOCHREALTIME
    awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", (b - a) * 1000 }'
}

# timed NAME CMD...: a warm-up run, then $repeats timed ones; sets
# median[NAME] and logs the times.
declare -A median
timed() {
    local name=$1 t times=()
    shift
    run_ms "$@" >/dev/null
    for ((r = 0; r < repeats; r++)); do
        t=$(run_ms "$@")
        times+=("$t")
    done
    median[$name]=$(bench_median "${times[@]}")
    echo "$name: ${times[*]} ms (median ${median[$name]})" >>"$log"
}

timed list100 "$queue_bin" -C "$conf" list --limit 100
timed shape_tool "$queue_bin" -C "$conf" shape
timed list_long "$queue_bin" -C "$conf" list --limit "$list_long"
listed=$("$queue_bin" -C "$conf" list --limit "$list_long" | tail -n +2 | wc -l)
[ "$listed" -eq "$list_long" ] || { echo "pepsi-queue listed $listed rows of $list_long" >&2; exit 1; }

timed qshape /usr/sbin/qshape -c "$postfix_dir/etc" deferred
timed mailq /usr/sbin/postqueue -c "$postfix_dir/etc" -p
mailq_listed=$(/usr/sbin/postqueue -c "$postfix_dir/etc" -p | tail -n 1)
echo "mailq: $mailq_listed" >>"$log"
[ "$(bench_postfix_count "$postfix_dir" deferred)" -eq "$postfix_messages" ] \
    || { echo "the Postfix queue changed while it was measured" >&2; exit 1; }

# shellcheck disable=SC2046 # one time per line
median[summary]=$(bench_median $(times queue_summary))
# shellcheck disable=SC2046
median[shape]=$(bench_median $(times queue_shape))

# row LABEL MESSAGES MEDIAN [TARGET]: one line of the table.
row() {
    local verdict=
    if [ -n "${4:-}" ]; then
        verdict=$(awk -v m="$3" -v t="$4" 'BEGIN { printf "< %-6s %s", t, (m < t) ? "met" : "MISSED" }')
    fi
    awk -v l="$1" -v n="$2" -v m="$3" -v v="$verdict" \
        'BEGIN { printf "%-34s %9d %11.1f %13.6f%s\n", l, n, m, m / n, v == "" ? "" : "   " v }'
}
per() { awk -v a="$1" -v n="$2" -v b="$3" -v k="$4" 'BEGIN { printf "%.1f", (a / n) / (b / k) }'; }

{
    echo
    printf '%-34s %9s %11s %13s   %s\n' "" messages "median ms" "ms/message" "target ms"
    row "pepsi.queue_summary (SQL)" "$rows" "${median[summary]}" 300
    row "pepsi.queue_shape (SQL)" "$rows" "${median[shape]}" 1500
    row "pepsi-queue list --limit 100" 100 "${median[list100]}" 50
    row "pepsi-queue shape" "$rows" "${median[shape_tool]}"
    row "pepsi-queue list --limit $list_long" "$list_long" "${median[list_long]}"
    row "postfix qshape deferred" "$postfix_messages" "${median[qshape]}"
    row "postfix mailq (postqueue -p)" "$postfix_messages" "${median[mailq]}"
    ratio=$(per "${median[qshape]}" "$postfix_messages" "${median[shape_tool]}" "$rows")
    printf 'per message, qshape / pepsi-queue shape: %sx (target >= 10x: %s)\n' "$ratio" \
        "$(awk -v r="$ratio" 'BEGIN { print (r >= 10) ? "met" : "MISSED" }')"
    printf 'per message, qshape / pepsi.queue_shape: %sx\n' \
        "$(per "${median[qshape]}" "$postfix_messages" "${median[shape]}" "$rows")"
    printf 'per message, mailq / pepsi-queue list:   %sx\n' \
        "$(per "${median[mailq]}" "$postfix_messages" "${median[list_long]}" "$list_long")"
    echo "(median of $repeats runs after a warm-up; Pepsi at $rows rows, Postfix at $postfix_messages" \
        "deferred messages; raw times and plans in bench/out/admin.log)"
} | tee -a "$log"
