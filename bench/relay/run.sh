#!/usr/bin/env bash
# bench/relay: relaying end to end, Pepsi against a stock Postfix, side by
# side on this machine, both into the same Postfix smtp-sink.
#
# Postfix's smtp-source sends SESSIONS parallel sessions, MESSAGES messages
# of 2 KB in all, one remote recipient each, over reused connections (-d):
#   pepsi:   pepsi-ingress -> pepsi-dispatch -> init (route) ->
#            relay-to-smarthost -> smtp-sink, the queue a durable cluster
#            (fsync = on, synchronous_commit = on: bench/lib.sh)
#   postfix: a private stock Postfix instance (its own config and queue
#            under a scratch directory; queue files fsynced as usual) with
#            relayhost = the same smtp-sink
# The time runs from the first message sent to the last one smtp-sink
# received (its -c counter); each run also says when the last message was
# accepted and when the last was relayed.  The sides alternate,
# BENCH_REPEATS times (default 5); each run's ratio is printed, then the
# medians in messages per second with the ratio pepsi/postfix and the
# spread (target: median at least 2.5, no run below 2.0).  Pepsi's
# database commits per message (pg_stat_database.xact_commit over its run,
# read once every backend has reported, divided by the messages; target:
# at most 3) are printed per run and as a median, then the peak resident
# memory of each side's processes together (Pepsi: ingress, the dispatcher
# and its workers; Postfix: master and its children), as VmRSS and as PSS
# (shared pages counted once).  PostgreSQL's own memory is printed beside Pepsi's.
# Each side's CPU time per message (its process trees, cpu-time.pl; for
# Pepsi PostgreSQL's included, split in the log into PostgreSQL, ingress,
# the dispatcher and its workers) is printed with the ratio postfix/pepsi:
# what the rates would be where CPU alone binds, and less noisy than the
# rates on a loaded machine.  BENCH_STATEMENTS=1 logs pg_stat_statements
# per message; BENCH_PERF=1 logs perf's CPU time by process name and keeps
# the perf.data of each run beside the log (BENCH_PERF_GRAPH=1: with call
# graphs).  The daemons' logs are kept beside it too.  BENCH_POOLED=1
# runs bench/relay/pooled.sh instead: Pepsi direct against Pepsi with its
# stage workers through PgBouncer, on the same load.  BENCH_RELAY_ENCRYPT=1
# runs bench/relay/encrypt.sh instead: Pepsi as here against Pepsi with
# pepsi-stage-encrypt between the route and the relay (POLICY = required,
# SIGN = yes: every message encrypted to the recipient's key in
# pepsi.peer_key and signed with the sender's identity, the key store set
# up as bench/crypto's), the runs interleaved, each side's rate and CPU
# time per message and the stage's cost in percent of the relay's rate
# (BENCH_KEY_TYPE ed25519 or rsa3072, BENCH_ENCRYPT_WORKERS 2).
#
# Before and after the per-message PL/pgSQL moved to C (issue 37: the
# merge 018c18c, destination_begin, dsn_rate_take, autoreply_due and
# queue_gauge_refresh in C), each commit's own build and this script, 5
# runs each, one set after the other, nothing else running, 2026-12-07:
#   018c18c^1 (10:19-10:26): pepsi 1,127.5 msg/s (953.8..1,397.6), CPU
#     0.988 ms a message; postfix 394.4 (353.1..402.4); ratio 2.86
#   018c18c   (10:26-10:33): pepsi 1,247.6 msg/s (1,058.8..1,389.6), CPU
#     0.910 ms a message; postfix 384.8 (365.4..427.7); ratio 3.23
# The move made the relay 10.7% faster at the median and 7.9% cheaper in
# CPU a message: not slower.
#
# Needs: postfix (installed here with debconf "No configuration" when it
# is missing), pepsi-ingress, pepsi-dispatch and the stages built, the
# extension installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ "${BENCH_POOLED:-0}" != 1 ] || exec "$here/pooled.sh"
[ "${BENCH_RELAY_ENCRYPT:-0}" != 1 ] || exec "$here/encrypt.sh"
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
relay_workers=${BENCH_RELAY_WORKERS:-20}
log=$(bench_log relay)

bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-smarthost
postfix_dir= perf_pid=

cleanup() {
    bench_stop_pid "$perf_pid"
    # The daemons' logs outlive the scratch directory, beside the run's log.
    if [ -n "${BENCH_DIR:-}" ]; then
        cp "$BENCH_DIR/dispatch.log" "${log%.log}-dispatch.log" 2>/dev/null || true
        cp "$BENCH_DIR/ingress.log" "${log%.log}-ingress.log" 2>/dev/null || true
    fi
    if [ -n "$postfix_dir" ]; then
        bench_postfix_stop "$postfix_dir"
    fi
    bench_cleanup
}

# BENCH_STATEMENTS=1: where Pepsi's commits come from, by statement
# (pg_stat_statements calls per message over each Pepsi run, in the log).
if [ "${BENCH_STATEMENTS:-0}" = 1 ]; then
    bench_cluster_start "max_connections = 200" "shared_preload_libraries = 'pg_stat_statements'" \
        "pg_stat_statements.track_utility = off"
    bench_psql -c "CREATE EXTENSION pg_stat_statements" >/dev/null
else
    bench_cluster_start "max_connections = 200"
fi
trap cleanup EXIT

sink_port=$(bench_free_port)
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)

bench_sink_start "$sink_port"

start_pepsi() {
    bench_pepsi_start "$pepsi_port" "[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = pepsi.bench.test
LOCAL_STAGE = smarthost
REMOTE_STAGE = smarthost
PARALLELISM = 2
QUEUE_LIMIT = 256
[stage-smarthost]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$sink_port
TLS = none
PARALLELISM = $relay_workers
QUEUE_LIMIT = 4"
}

start_postfix() {
    # Stock Postfix apart from where it lives (bench/lib.sh) and where it relays to.
    postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
    bench_postfix_start "$postfix_dir" "$postfix_port" "relayhost = [127.0.0.1]:$sink_port"
}

# measure PORT ROOT_PIDS...: one measured run (bench/relay/measure.sh).
# shellcheck source=measure.sh
. "$here/measure.sh"

# BENCH_PERF=1: where each side's CPU time goes, by process name (perf
# record -a over each run; in the log as CPU milliseconds per message).
# The machine's other load shows too: run it on a quiet machine.
perf_start() {
    [ "${BENCH_PERF:-0}" = 1 ] || return 0
    perf record -a -F 499 ${BENCH_PERF_GRAPH:+-g} -o "$BENCH_DIR/perf.data" >/dev/null 2>&1 &
    perf_pid=$!
    sleep 1
}
perf_stop() {
    [ -n "$perf_pid" ] || return 0
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    perf_pid=
    echo "$1: CPU ms per message by process (perf, all CPUs; swapper is idle time):" >>"$log"
    perf report -i "$BENCH_DIR/perf.data" --sort comm --stdio -F sample,comm 2>/dev/null \
        | awk -v n="$messages" '$1 ~ /^[0-9]+$/ { printf "  %8.3f  %s\n", $1 / 499 * 1000 / n, $2 }' \
        | sort -rn | head -15 >>"$log"
    # Kept for perf report -i (by process: --sort comm,pid; call graphs: BENCH_PERF_GRAPH=1).
    mv "$BENCH_DIR/perf.data" "${log%.log}-perf-${1// /-}.data"
}

# CPU milliseconds used so far by each PID's process tree (cpu-time.pl).
cpu_ms() { perl "$here/cpu-time.pl" "$@"; }
per_message() { awk -v ms="$1" -v n="$messages" 'BEGIN { printf "%.3f", ms / n }'; }

postgres_pid() { head -1 "$BENCH_DIR/data/postmaster.pid"; }
postfix_master() { head -1 "$postfix_dir/spool/pid/master.pid" | tr -d ' '; }
pepsi_left() { bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue"; }
pepsi_reset() { bench_queue_empty; }
# Transactions committed in the bench database so far.  A backend reports
# its counts when it goes idle, at most once a second, and an idle one
# within 10 s (PostgreSQL 15): read after that.
xact_commits() { bench_psql -tA -c "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

start_postfix
start_pepsi

echo "bench/relay: smtp-source -s $sessions -m $messages -l 2048 -> relay -> smtp-sink," \
    "$repeats runs each side, alternating; Pepsi as $BENCH_PEPSI_FLAVOUR, $relay_workers relay workers"
pepsi_rates=() postfix_rates=() pepsi_rss=() pepsi_pss=() postfix_rss=() postfix_pss=() pg_rss=() pg_pss=()
ratios=() commits=() cpus_pepsi=() cpus_pf=() cpu_ratios=()
for ((r = 1; r <= repeats; r++)); do
    pepsi_reset
    sleep 1
    [ "${BENCH_STATEMENTS:-0}" = 1 ] && bench_psql -c "SELECT pg_stat_statements_reset()" >/dev/null
    commits_before=$(xact_commits)
    # The cluster's memory is sampled by a second sampler over the same run.
    perl "$here/rss-sampler.pl" "$(postgres_pid)" >"$BENCH_DIR/pg-sampler.out" &
    pg_sampler=$!
    perf_start
    read -r pg_cpu0 ingress_cpu0 dispatch_cpu0 dispatcher_cpu0 < <(cpu_ms "$(postgres_pid)" "$BENCH_INGRESS_PID" "$BENCH_DISPATCH_PID" "=$BENCH_DISPATCH_PID")
    read -r rate rss pss accepted relayed < <(measure "$pepsi_port" "$BENCH_INGRESS_PID" "$BENCH_DISPATCH_PID")
    read -r pg_cpu1 ingress_cpu1 dispatch_cpu1 dispatcher_cpu1 < <(cpu_ms "$(postgres_pid)" "$BENCH_INGRESS_PID" "$BENCH_DISPATCH_PID" "=$BENCH_DISPATCH_PID")
    perf_stop "run $r pepsi"
    cpu_pg=$(per_message $((pg_cpu1 - pg_cpu0)))
    cpu_pepsi=$(per_message $((ingress_cpu1 - ingress_cpu0 + dispatch_cpu1 - dispatch_cpu0)))
    cpu_split="ingress $(per_message $((ingress_cpu1 - ingress_cpu0))), dispatcher $(per_message $((dispatcher_cpu1 - dispatcher_cpu0))), workers $(per_message $((dispatch_cpu1 - dispatch_cpu0 - dispatcher_cpu1 + dispatcher_cpu0)))"
    bench_stop_pid "$pg_sampler"
    read -r prss ppss < <(sed 's/rss=\([0-9]*\) pss=\([0-9]*\).*/\1 \2/' "$BENCH_DIR/pg-sampler.out")
    sleep 11
    # Less this session's own read and the idle heartbeat's claims over the
    # wait (POLL_INTERVAL = 1s).
    per_message=$(awk -v a="$commits_before" -v b="$(xact_commits)" -v n="$messages" \
        'BEGIN { printf "%.2f", (b - a - 12) / n }')
    if [ "${BENCH_STATEMENTS:-0}" = 1 ]; then
        echo "run $r: pepsi's statements, calls per message:" >>"$log"
        bench_psql -c "SELECT round(calls::numeric / $messages, 3) AS per_message,
                              round(total_exec_time::numeric / calls, 3) AS mean_ms,
                              round(total_exec_time::numeric / $messages, 3) AS ms_per_message,
                              left(query, 100) AS query
                       FROM pg_stat_statements WHERE calls > $messages / 100 ORDER BY calls DESC" >>"$log"
    fi
    left=$(pepsi_left)
    [ "$left" -eq 0 ] || echo "warning: $left rows left in Pepsi's queue" >&2
    pepsi_rates+=("$rate") pepsi_rss+=("$rss") pepsi_pss+=("$pss") pg_rss+=("$prss") pg_pss+=("$ppss")
    commits+=("$per_message")

    sync
    perf_start
    read -r pf_cpu0 < <(cpu_ms "$(postfix_master)")
    read -r rate_pf rss_pf pss_pf accepted_pf relayed_pf < <(measure "$postfix_port" "$(postfix_master)")
    read -r pf_cpu1 < <(cpu_ms "$(postfix_master)")
    perf_stop "run $r postfix"
    cpu_pf=$(per_message $((pf_cpu1 - pf_cpu0)))
    cpu_pepsi_all=$(awk -v a="$cpu_pg" -v b="$cpu_pepsi" 'BEGIN { printf "%.3f", a + b }')
    cpus_pepsi+=("$cpu_pepsi_all") cpus_pf+=("$cpu_pf") cpu_ratios+=("$(ratio "$cpu_pf" "$cpu_pepsi_all")")
    printf 'run %d: CPU ms per message: pepsi %s (postgresql %s, %s), postfix %s\n' \
        "$r" "$cpu_pepsi_all" "$cpu_pg" "$cpu_split" "$cpu_pf" >>"$log"
    postfix_rates+=("$rate_pf") postfix_rss+=("$rss_pf") postfix_pss+=("$pss_pf")
    ratios+=("$(ratio "$rate" "$rate_pf")")
    printf 'run %d: pepsi %s msg/s (all accepted after %s s, all relayed after %s s, %s commits/message),' \
        "$r" "$rate" "$accepted" "$relayed" "$per_message"
    printf ' postfix %s msg/s (all accepted after %s s, all relayed after %s s), ratio %s\n' \
        "$rate_pf" "$accepted_pf" "$relayed_pf" "${ratios[-1]}"
done

pepsi_median=$(bench_median "${pepsi_rates[@]}")
postfix_median=$(bench_median "${postfix_rates[@]}")
printf '%-34s %10s msg/s (runs %s .. %s)\n' \
    "pepsi (ingress -> relay)" "$pepsi_median" "$(min "${pepsi_rates[@]}")" "$(max "${pepsi_rates[@]}")" \
    "postfix (smtpd -> smtp)" "$postfix_median" "$(min "${postfix_rates[@]}")" "$(max "${postfix_rates[@]}")"
printf 'ratio pepsi/postfix: median %s, runs %s .. %s (target: median >= 2.50, every run >= 2.00)\n' \
    "$(bench_median "${ratios[@]}")" "$(min "${ratios[@]}")" "$(max "${ratios[@]}")"
printf 'CPU ms per message (the side'"'"'s processes, PostgreSQL included for Pepsi): pepsi %s, postfix %s,\n' \
    "$(bench_median "${cpus_pepsi[@]}")" "$(bench_median "${cpus_pf[@]}")"
printf '  postfix/pepsi median %s, runs %s .. %s (what the rates would be where CPU is all that binds)\n' \
    "$(bench_median "${cpu_ratios[@]}")" "$(min "${cpu_ratios[@]}")" "$(max "${cpu_ratios[@]}")"
printf 'pepsi database commits per message: median %s, runs %s .. %s (target <= 3)\n' \
    "$(bench_median "${commits[@]}")" "$(min "${commits[@]}")" "$(max "${commits[@]}")"
kb_mb() { awk -v k="$1" 'BEGIN { printf "%.1f MB", k / 1024 }'; }
echo "peak memory, all processes of a side together (max over runs):"
printf '  %-30s RSS %10s   PSS %10s\n' \
    "pepsi (ingress, dispatch, workers)" "$(kb_mb "$(max "${pepsi_rss[@]}")")" "$(kb_mb "$(max "${pepsi_pss[@]}")")" \
    "postfix (master and children)" "$(kb_mb "$(max "${postfix_rss[@]}")")" "$(kb_mb "$(max "${postfix_pss[@]}")")" \
    "postgresql (pepsi's queue)" "$(kb_mb "$(max "${pg_rss[@]}")")" "$(kb_mb "$(max "${pg_pss[@]}")")"
