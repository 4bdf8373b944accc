#!/usr/bin/env bash
# bench/limits: what one message of the relay graph costs the primary, and
# what synchronous replication costs group commit (docs/scaling.md,
# "Measured limits").
#
# bench/relay's Pepsi side (smtp-source, SESSIONS sessions, MESSAGES
# messages of 2 KB, one remote recipient; pepsi-ingress -> pepsi-dispatch
# -> route -> relay-to-smarthost -> smtp-sink) on the durable cluster of
# bench/lib.sh, with a streaming standby (pg_basebackup, its own socket)
# attached.  The modes alternate, BENCH_REPEATS times (default 5):
#
#   async: the standby streams, synchronous_standby_names empty
#   sync:  synchronous_standby_names = '*': every commit waits for the
#          standby's flush, as under Patroni's synchronous_mode
#
# Per run, per message: PostgreSQL's CPU (every process of the primary's
# tree, walsender and autovacuum included: /proc), WAL bytes and records
# (pg_stat_wal), commits (pg_stat_database), WAL flushes (pg_stat_wal
# wal_sync: commits / flushes is the group commit), and the CPU of the
# dispatcher process alone per hop (two hops a message: route, relay)
# and of its workers, and the rate.  Then the medians and spread, and the
# projections: messages per second of a primary with N cores where its CPU
# binds (N * 1000 / PostgreSQL ms per message), and of one dispatcher (1000
# / (its ms per hop * 2)).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-5000}
relay_workers=${BENCH_RELAY_WORKERS:-20}
hops=2
log=$(bench_log limits)

bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-smarthost
bench_cluster_start "max_connections = 200" "wal_level = replica" "max_wal_senders = 4"
standby_port=$((BENCH_PORT + 1))
cleanup() {
    # Commits would wait forever for a synchronous standby stopped first.
    bench_psql -c "ALTER SYSTEM SET synchronous_standby_names = ''" -c "SELECT pg_reload_conf()" >/dev/null 2>&1 || true
    bench_pepsi_stop
    if [ -f "$BENCH_DIR/standby/postmaster.pid" ]; then
        as_user "$PGBIN/pg_ctl" -D "$BENCH_DIR/standby" -m immediate stop >/dev/null 2>&1 || true
    fi
    bench_cleanup
}
trap cleanup EXIT

# The standby: a base backup streaming from the primary's socket.
as_user "$PGBIN/pg_basebackup" -h "$BENCH_DIR" -p "$BENCH_PORT" -U postgres -D "$BENCH_DIR/standby" \
    -R -X stream --checkpoint fast >/dev/null
as_user tee -a "$BENCH_DIR/standby/postgresql.conf" >/dev/null <<CONF
port = $standby_port
hot_standby = on
primary_conninfo = 'host=$BENCH_DIR port=$BENCH_PORT user=postgres application_name=standby'
CONF
as_user "$PGBIN/pg_ctl" -D "$BENCH_DIR/standby" -l "$BENCH_DIR/standby.log" -w start >/dev/null
for _ in $(seq 1 100); do
    [ "$(bench_psql -tA -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ] && break
    sleep 0.1
done
[ "$(bench_psql -tA -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ] || {
    echo "the standby does not stream (see $BENCH_DIR/standby.log)" >&2
    exit 1
}

sink_port=$(bench_free_port)
pepsi_port=$(bench_free_port)
bench_sink_start "$sink_port"
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

postgres_pid() { head -1 "$BENCH_DIR/data/postmaster.pid"; }
cpu_ms() { perl "$here/../relay/cpu-time.pl" "$@"; }
# wal_bytes wal_records wal_sync xact_commit, cumulative.
counters() {
    bench_psql -tA -F' ' -c "SELECT w.wal_bytes, w.wal_records, w.wal_sync, d.xact_commit
        FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()"
}
set_mode() {
    local names=
    [ "$1" = sync ] && names='*'
    bench_psql -c "ALTER SYSTEM SET synchronous_standby_names = '$names'" -c "SELECT pg_reload_conf()" >/dev/null
    for _ in $(seq 1 50); do
        [ "$(bench_psql -tA -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = '$([ "$1" = sync ] && echo sync || echo async)'")" = 1 ] && return 0
        sleep 0.1
    done
    echo "the standby did not become $1" >&2
    return 1
}

# run MODE: prints "rate pg_ms wal_bytes wal_records commits commits_per_flush dispatcher_ms_per_hop workers_ms"
run() {
    local base start end c0 c1 p0 p1 d0 d1 s0 s1
    set_mode "$1"
    bench_queue_empty
    sleep 1
    base=$(bench_sink_count)
    read -r -a c0 < <(counters)
    read -r p0 d0 s0 < <(cpu_ms "$(postgres_pid)" "=$BENCH_DISPATCH_PID" "$BENCH_DISPATCH_PID")
    start=$(date +%s.%N)
    /usr/sbin/smtp-source -d -s "$sessions" -m "$messages" -l 2048 \
        -f sender@example.org -t rcpt@example.net "127.0.0.1:$pepsi_port" >>"$log" 2>&1
    for _ in $(seq 1 12000); do
        [ "$(bench_sink_count)" -ge $((base + messages)) ] && break
        sleep 0.05
    done
    end=$(date +%s.%N)
    read -r p1 d1 s1 < <(cpu_ms "$(postgres_pid)" "=$BENCH_DISPATCH_PID" "$BENCH_DISPATCH_PID")
    # Counters a backend reports when it goes idle (at most once a second).
    sleep 1.5
    read -r -a c1 < <(counters)
    [ "$(bench_sink_count)" -ge $((base + messages)) ] || echo "warning: only $(($(bench_sink_count) - base)) of $messages relayed" >&2
    awk -v n="$messages" -v a="$start" -v b="$end" -v pg=$((p1 - p0)) -v d=$((d1 - d0)) -v s=$((s1 - s0)) \
        -v wb=$((c1[0] - c0[0])) -v wr=$((c1[1] - c0[1])) -v ws=$((c1[2] - c0[2])) -v xc=$((c1[3] - c0[3])) -v h=$hops 'BEGIN {
        printf "%.1f %.3f %.0f %.1f %.2f %.2f %.4f %.3f\n", n / (b - a), pg / n, wb / n, wr / n, xc / n,
            (ws > 0 ? xc / ws : 0), d / (n * h), (s - d) / n }'
}

echo "bench/limits: smtp-source -s $sessions -m $messages -l 2048 -> relay -> smtp-sink, a streaming standby," \
    "$repeats runs of each mode, alternating; $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
declare -A series
keys=(rate pg_ms wal_bytes wal_records commits commits_per_flush dispatcher_ms_per_hop workers_ms)
for ((r = 1; r <= repeats; r++)); do
    for mode in async sync; do
        read -r -a v < <(run "$mode")
        line="run $r $mode:"
        for i in "${!keys[@]}"; do
            line+=" ${keys[$i]}=${v[$i]}"
            series[$mode.${keys[$i]}]+="${v[$i]} "
        done
        echo "$line (load average $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$log"
    done
done

echo "medians (runs min .. max), per message unless said:" | tee -a "$log"
for mode in async sync; do
    line="  $mode:"
    for key in "${keys[@]}"; do
        # shellcheck disable=SC2086
        line+=" $key $(bench_median ${series[$mode.$key]}) ($(min ${series[$mode.$key]}) .. $(max ${series[$mode.$key]}))"
    done
    echo "$line" | tee -a "$log"
done
# shellcheck disable=SC2086
{
    pg=$(bench_median ${series[sync.pg_ms]})
    disp=$(bench_median ${series[sync.dispatcher_ms_per_hop]})
    awk -v pg="$pg" -v d="$disp" -v h=$hops 'BEGIN {
        printf "projection (sync medians; where CPU alone binds): one primary %.0f msg/s per core", 1000 / pg
        printf " (4 cores %.0f, 16 cores %.0f, 64 cores %.0f); one dispatcher %.0f msg/s\n",
            4000 / pg, 16000 / pg, 64000 / pg, 1000 / (d * h) }'
} | tee -a "$log"
