#!/usr/bin/env bash
# bench/dispatch: pepsi-dispatch against the stage runtime driven directly.
#
# BENCH_MESSAGES (100,000) messages wait at s1 of a chain of three no-op
# METADATA stages, s1 -> s2 -> s3 -> done (pepsi-stage-if with a condition
# every message meets), and go through it twice per round, on the same
# private, durable cluster, from the same freshly loaded queue:
#
#   direct      the driver of bench/stages (bench/stages/driver.c): one
#               worker per stage, one pepsi.workqueue_claim per round for
#               all three stages, each stage's ids written to its worker and
#               the status lines read back, one worker working at a time
#   dispatcher  pepsi-dispatch, PARALLELISM 1 per stage (the same three
#               workers), the same QUEUE_LIMIT
#
# Both run the standalone pepsi-stage-if, so nothing fuses.  "done" has a
# section, as the dispatcher's graph check demands, whose PROGRAM does not
# exist and whose SPAWN_COOLDOWN is long: the dispatcher tries it once and
# then leaves the rows there, as the driver does.  Rounds alternate the two
# sides (BENCH_REPS, default 3) and the medians are reported.
#
# Then, on the dispatcher alone:
#   - CPU: its own utime+stime (/proc/PID/stat) against its workers'
#     (reaped and live children) and PostgreSQL's (the postmaster's tree),
#     over the timed run; the driver's side is shown as driver+workers
#   - resident memory with 1,000,000 rows pending from 10,000 senders, peak
#     VmHWM over BENCH_RSS_SECONDS (10) of work
#   - latency from a NOTIFY reaching it to the first id written to a
#     worker: strace -ttt on the dispatcher while BENCH_NOTIFIES (50)
#     single messages are injected, one at a time, into an idle pipeline
#     with warm workers (strace slows each system call, so the figure is an
#     upper bound)
#
# Targets: dispatcher/direct >= 0.7; dispatcher CPU < 20% of the total;
# RSS < 32 MB; median NOTIFY-to-write < 2 ms.  Reports, never judges: exits
# 0 unless the benchmark itself broke.
#
# Knobs: BENCH_MESSAGES, BENCH_QUEUE_LIMIT (100), BENCH_REPS (3),
# BENCH_PENDING (1000000), BENCH_RSS_SECONDS (10), BENCH_NOTIFIES (50).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib.sh
. "$here/../lib.sh"

messages=${BENCH_MESSAGES:-100000}
limit=${BENCH_QUEUE_LIMIT:-100}
reps=${BENCH_REPS:-3}
pending=${BENCH_PENDING:-1000000}
rss_seconds=${BENCH_RSS_SECONDS:-10}
notifies=${BENCH_NOTIFIES:-50}
bin="$bench_top/build/bin"
driver_source="$bench_top/bench/stages/driver.c"

for program in pepsi-dispatch pepsi-stage-if; do
    [ -x "$bin/$program" ] || { echo "bench/dispatch: $bin/$program is missing: run make" >&2; exit 1; }
done
[ -f "$driver_source" ] || { echo "bench/dispatch: $driver_source is missing" >&2; exit 1; }
command -v strace >/dev/null || { echo "bench/dispatch: strace is needed for the latency" >&2; exit 1; }

# track_functions: how many claims each side makes, and what they cost the
# server.
bench_cluster_start "track_functions = all"
dispatcher_pid=
stop_dispatcher() {
    [ -n "$dispatcher_pid" ] || return 0
    kill -TERM "$dispatcher_pid" 2>/dev/null || true
    wait "$dispatcher_pid" 2>/dev/null || true
    dispatcher_pid=
}
trap 'stop_dispatcher; bench_cleanup' EXIT

cc -O2 -Wall -o "$BENCH_DIR/driver" "$driver_source" -I"$("$PGBIN/pg_config" --includedir)" \
    -L"$("$PGBIN/pg_config" --libdir)" -lpq
# The programs side by side, as make builds them: the dispatcher execs the
# pepsi-stage-if beside it.
mkdir -p "$BENCH_DIR/bin"
cp "$bin/pepsi-dispatch" "$bin/pepsi-stage-if" "$BENCH_DIR/bin/"

conninfo="host=$BENCH_DIR port=$BENCH_PORT user=postgres dbname=$BENCH_DB"
config=$BENCH_DIR/pepsi.conf
cat >"$config" <<CONF
[pepsi]
ALLOW_FUSION = no

[database]
CONNINFO = $conninfo

[dispatch]
POLL_INTERVAL = 1s
WORKER_IDLE_TIMEOUT = 1h
SPAWN_COOLDOWN = 1h
STATS_INTERVAL = 1h
$(bench_dispatch_user)

[stage-s1]
PROGRAM = pepsi-stage-if
CONDITION = rcpt_count > 0
THEN_STAGE = s2
ELSE_STAGE = s2
PARALLELISM = 1
QUEUE_LIMIT = $limit
MAX_MESSAGES = 100000000

[stage-s2]
PROGRAM = pepsi-stage-if
CONDITION = mail_from != ""
THEN_STAGE = s3
ELSE_STAGE = s3
PARALLELISM = 1
QUEUE_LIMIT = $limit
MAX_MESSAGES = 100000000

[stage-s3]
PROGRAM = pepsi-stage-if
CONDITION = state.origin exists
THEN_STAGE = done
ELSE_STAGE = done
PARALLELISM = 1
QUEUE_LIMIT = $limit
MAX_MESSAGES = 100000000

# Where the chain ends: never started (see the top of run.sh).
[stage-done]
PROGRAM = $BENCH_DIR/no-such-program
CONF

# load_queue N SENDERS: N pending messages at s1 sharing one body, as
# ingress leaves them, from SENDERS client addresses, vacuumed and
# checkpointed.
load_queue() {
    bench_psql -q <<SQL
TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY CASCADE;
TRUNCATE pepsi.stage_stats;
INSERT INTO pepsi.workqueue_body (body) VALUES (convert_to(repeat('x', 2048), 'UTF8'));
INSERT INTO pepsi.workqueue (stage, mail_from, rcpt_to, headers, body_id, client_address, state)
SELECT 's1', 'sender@example.org', ARRAY['rcpt@example.net'],
       convert_to('Subject: bench ' || n || E'\r\n', 'UTF8'), 1,
       inet '10.0.0.0' + (n % $2),
       '{"origin": {"client": "192.0.2.1", "helo": "client.example.org"},
         "dsn": {"ret": "HDRS", "rcpt": [{"notify": "FAILURE"}]}}'
FROM generate_series(1, $1) AS n;
VACUUM (FREEZE, ANALYZE) pepsi.workqueue;
CHECKPOINT;
SQL
}

check_done() {
    local at_done
    at_done=$(bench_psql -At -c "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done' AND status = 'pending'")
    [ "$at_done" -eq "$messages" ] || { echo "bench/dispatch: $1: $at_done of $messages messages reached done" >&2; return 1; }
}

now() { date +%s.%N; }

# CPU ticks of a process: own (utime+stime) and reaped children's
# (cutime+cstime); of its live children (utime+stime).
proc_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13, $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo "0 0"; }
children_ticks() {
    local parent=$1 total=0 stat
    for stat in /proc/[0-9]*/stat; do
        read -r line 2>/dev/null <"$stat" || continue
        line=${line##*) }
        set -- $line
        [ "${2:-}" = "$parent" ] && total=$((total + ${12} + ${13}))
    done
    echo "$total"
}
# Everything the cluster has used: the postmaster, its reaped children and
# its live ones (backends, walwriter, checkpointer ...): bench_tree_ticks.
postgres_ticks() {
    bench_tree_ticks "$(head -1 "$BENCH_DIR/data/postmaster.pid")"
}
ticks_per_second=$(getconf CLK_TCK)

# Wait for the chain to drain, polling every 20 ms from one session (a
# connection per poll would cost the server more than some of what is
# measured): first the cheap probes of the pending index, then the running
# rows.
wait_drained() {
    local left
    while read -r left; do
        [ "$left" = 0 ] && return 0
    done < <(echo "SELECT CASE
            WHEN EXISTS (SELECT 1 FROM pepsi.workqueue WHERE stage IN ('s1', 's2', 's3') AND status = 'pending')
            THEN 1
            WHEN EXISTS (SELECT 1 FROM pepsi.workqueue WHERE status = 'running') THEN 1
            ELSE 0 END \\watch 0.02" | bench_psql -At 2>/dev/null)
    echo "bench/dispatch: the poll of the queue ended early" >&2
    return 1
}

# The claims made since the last reset: "calls total_ms", once the
# sessions that made them have gone and reported.
claim_stats() {
    sleep 1
    bench_psql -At -F ' ' -c "SELECT coalesce(sum(calls), 0), coalesce(round(sum(total_time)::numeric, 1), 0)
        FROM pg_stat_user_functions WHERE funcname IN ('workqueue_claim', 'workqueue_claim_tokens')"
}

# run_direct: prints "seconds cpu_driver_and_workers cpu_postgres claims claim_ms".
run_direct() {
    local start end pg0 pg1 cpu
    load_queue "$messages" 1000
    bench_psql -q -c "SELECT pg_stat_reset()" >/dev/null
    pg0=$(postgres_ticks)
    start=$(now)
    cpu=$( { /usr/bin/time -f '%U %S' "$BENCH_DIR/driver" run "$conninfo" "$config" \
        "$BENCH_DIR/bin/pepsi-stage-if" "$limit" 1 s1 s2 s3 >/dev/null; } 2>&1 | tail -1)
    end=$(now)
    # The sessions' backends exit after their clients: once reaped, their
    # time is in the postmaster's cutime.
    sleep 1
    pg1=$(postgres_ticks)
    check_done direct
    awk -v s="$start" -v e="$end" -v c="$cpu" -v p=$((pg1 - pg0)) -v hz="$ticks_per_second" \
        -v claims="$(claim_stats)" \
        'BEGIN { split(c, t, " "); printf "%.3f %.2f %.2f %s\n", e - s, t[1] + t[2], p / hz, claims }'
}

start_dispatcher() {
    "$BENCH_DIR/bin/pepsi-dispatch" -c "$config" 2>>"$BENCH_DIR/dispatch.log" &
    dispatcher_pid=$!
}

# run_dispatcher: prints "seconds cpu_dispatcher cpu_workers cpu_postgres
# claims claim_ms".
run_dispatcher() {
    local start end pg0 pg1 own reaped live
    load_queue "$messages" 1000
    bench_psql -q -c "SELECT pg_stat_reset()" >/dev/null
    pg0=$(postgres_ticks)
    start=$(now)
    start_dispatcher
    wait_drained
    end=$(now)
    read -r own reaped < <(proc_ticks "$dispatcher_pid")
    live=$(children_ticks "$dispatcher_pid")
    stop_dispatcher
    sleep 1
    pg1=$(postgres_ticks)
    check_done dispatcher
    awk -v s="$start" -v e="$end" -v d="$own" -v w=$((reaped + live)) -v p=$((pg1 - pg0)) \
        -v hz="$ticks_per_second" -v claims="$(claim_stats)" \
        'BEGIN { printf "%.3f %.2f %.2f %.2f %s\n", e - s, d / hz, w / hz, p / hz, claims }'
}

echo "bench/dispatch: $messages messages through s1 -> s2 -> s3 (pepsi-stage-if), QUEUE_LIMIT $limit, $reps rounds" >&2
declare -a direct_rate dispatch_rate dispatch_share direct_cpu dispatch_cpu
declare -a direct_claims dispatch_claims direct_claim_ms dispatch_claim_ms
for ((r = 0; r < reps; r++)); do
    read -r seconds cpu_side cpu_pg claims claim_ms < <(run_direct)
    echo "  direct:     $seconds s; driver+workers ${cpu_side} s CPU, postgres ${cpu_pg} s;" \
        "$claims claims, $claim_ms ms in them" >&2
    direct_rate+=("$(awk -v n="$messages" -v s="$seconds" 'BEGIN { printf "%.1f", n / s }')")
    direct_cpu+=("$(awk -v a="$cpu_side" -v b="$cpu_pg" -v n="$messages" 'BEGIN { printf "%.1f", (a + b) * 1e6 / n }')")
    direct_claims+=("$claims")
    direct_claim_ms+=("$(awk -v c="$claims" -v t="$claim_ms" 'BEGIN { printf "%.3f", c ? t / c : 0 }')")
    read -r seconds cpu_dispatch cpu_workers cpu_pg claims claim_ms < <(run_dispatcher)
    echo "  dispatcher: $seconds s; dispatcher ${cpu_dispatch} s CPU, workers ${cpu_workers} s," \
        "postgres ${cpu_pg} s; $claims claims, $claim_ms ms in them" >&2
    dispatch_rate+=("$(awk -v n="$messages" -v s="$seconds" 'BEGIN { printf "%.1f", n / s }')")
    dispatch_share+=("$(awk -v d="$cpu_dispatch" -v w="$cpu_workers" -v p="$cpu_pg" 'BEGIN { printf "%.1f", 100 * d / (d + w + p) }')")
    dispatch_cpu+=("$(awk -v d="$cpu_dispatch" -v w="$cpu_workers" -v p="$cpu_pg" -v n="$messages" 'BEGIN { printf "%.1f", (d + w + p) * 1e6 / n }')")
    dispatch_claims+=("$claims")
    dispatch_claim_ms+=("$(awk -v c="$claims" -v t="$claim_ms" 'BEGIN { printf "%.3f", c ? t / c : 0 }')")
done
direct=$(bench_median "${direct_rate[@]}")
dispatched=$(bench_median "${dispatch_rate[@]}")
share=$(bench_median "${dispatch_share[@]}")

#
# Resident memory with a million rows pending.
#
echo "bench/dispatch: loading $pending pending rows from 10,000 senders" >&2
load_queue "$pending" 10000
start_dispatcher
peak=0
for ((i = 0; i < rss_seconds * 4; i++)); do
    sleep 0.25
    rss=$(awk '/^VmHWM:/ { print $2 }' "/proc/$dispatcher_pid/status")
    [ "$rss" -gt "$peak" ] && peak=$rss
done
worked=$(bench_psql -At -c "SELECT count(*) FROM pepsi.workqueue WHERE stage <> 's1'")
still=$(bench_psql -At -c "SELECT count(*) FROM pepsi.workqueue WHERE stage = 's1' AND status = 'pending'")
stop_dispatcher
echo "  peak VmHWM ${peak} kB over ${rss_seconds} s; $worked rows moved on, $still still pending at s1" >&2

#
# NOTIFY to the first id written, under strace.
#
echo "bench/dispatch: $notifies single messages into an idle pipeline, under strace" >&2
bench_psql -q -c "TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY CASCADE"
start_dispatcher
inject="SELECT pepsi.workqueue_inject('s1', 'sender@example.org', ARRAY['rcpt@example.net'], 'Subject: x'::bytea, 'x'::bytea);"
# Warm: a worker per stage is up and idle.
for ((i = 0; i < 3; i++)); do bench_psql -q -c "$inject" >/dev/null; sleep 0.2; done
strace -ttt -e trace=recvfrom,write -s 64 -o "$BENCH_DIR/strace.out" -p "$dispatcher_pid" 2>/dev/null &
strace_pid=$!
sleep 0.5
{
    for ((i = 0; i < notifies; i++)); do
        echo "$inject"
        echo "SELECT pg_sleep(0.2);"
    done
} | bench_psql -q >/dev/null
sleep 0.5
kill -INT "$strace_pid" 2>/dev/null || true
wait "$strace_pid" 2>/dev/null || true
stop_dispatcher
# For each read that brought a notification, the first write of an id line.
mapfile -t latencies < <(awk '
    /recvfrom\(.*pepsi_workqueue/ { t = $1; next }
    t != "" && /write\([0-9]+, "[0-9]+\\n"/ { printf "%.3f\n", ($1 - t) * 1000; t = "" }' "$BENCH_DIR/strace.out")
[ "${#latencies[@]}" -gt 0 ] || { echo "bench/dispatch: no NOTIFY seen under strace" >&2; exit 1; }
latency=$(bench_median "${latencies[@]}")
latency_max=$(max "${latencies[@]}")

echo
echo "$messages messages through s1 -> s2 -> s3, QUEUE_LIMIT $limit, median of $reps rounds"
printf '%-34s %14s %14s %8s\n' "" direct dispatcher ratio
printf '%-34s %14.0f %14.0f %8.2f\n' "messages/s" "$direct" "$dispatched" \
    "$(awk -v a="$dispatched" -v b="$direct" 'BEGIN { print a / b }')"
printf '%-34s %14.0f %14.0f %8.2f\n' "stage hops/s" \
    "$(awk -v a="$direct" 'BEGIN { print a * 3 }')" "$(awk -v a="$dispatched" 'BEGIN { print a * 3 }')" \
    "$(awk -v a="$dispatched" -v b="$direct" 'BEGIN { print a / b }')"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
printf '%-34s %14.0f %14.0f %8.2f\n' "claims" "$(bench_median "${direct_claims[@]}")" \
    "$(bench_median "${dispatch_claims[@]}")" \
    "$(ratio "$(bench_median "${dispatch_claims[@]}")" "$(bench_median "${direct_claims[@]}")")"
printf '%-34s %14.3f %14.3f %8.2f\n' "server ms per claim" "$(bench_median "${direct_claim_ms[@]}")" \
    "$(bench_median "${dispatch_claim_ms[@]}")" \
    "$(ratio "$(bench_median "${dispatch_claim_ms[@]}")" "$(bench_median "${direct_claim_ms[@]}")")"
printf '%-34s %14.1f %14.1f %8.2f\n' "CPU us per message (all processes)" \
    "$(bench_median "${direct_cpu[@]}")" "$(bench_median "${dispatch_cpu[@]}")" \
    "$(awk -v a="$(bench_median "${dispatch_cpu[@]}")" -v b="$(bench_median "${direct_cpu[@]}")" 'BEGIN { print a / b }')"
echo
printf '%-46s %10s %10s\n' "dispatcher" measured target
printf '%-46s %9.1f%% %10s\n' "CPU share (self / self+workers+postgres)" "$share" "< 20%"
printf '%-46s %7.1f MB %10s\n' "RSS, $pending rows pending (peak VmHWM)" \
    "$(awk -v k="$peak" 'BEGIN { print k / 1024 }')" "< 32 MB"
printf '%-46s %7.3f ms %10s\n' "NOTIFY -> first id written (median of ${#latencies[@]})" "$latency" "< 2 ms"
printf '%-46s %7.3f ms\n' "                          (slowest)" "$latency_max"
printf '%-46s %10.2f %10s\n' "throughput ratio dispatcher/direct" \
    "$(awk -v a="$dispatched" -v b="$direct" 'BEGIN { print a / b }')" ">= 0.70"
