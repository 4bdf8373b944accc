#!/usr/bin/env bash
# bench/relay/pooled.sh (bench/relay/run.sh with BENCH_POOLED=1): what
# connection pooling costs.  bench/relay's load (smtp-source, SESSIONS
# sessions, MESSAGES messages of 2 KB, one remote recipient each, through
# pepsi-ingress -> pepsi-dispatch -> init (route) -> relay-to-smarthost ->
# smtp-sink) against Pepsi twice:
#   direct:  every connection straight to the cluster (bench/relay as is)
#   pooled:  the stage workers through a PgBouncer (Debian's, 1.18) in
#            transaction mode on a free loopback port in front of the same
#            cluster ([database] STAGE_CONNINFO to it, STAGE_POOLED = yes);
#            the dispatcher and ingress stay direct, as docs/scaling.md says
# Pepsi is started afresh for each run (both sides pay the same start), the
# sides alternate (direct, pooled, ...) BENCH_REPEATS times (default 5).
# Printed per run: the rate (first message sent to the last one smtp-sink
# received), the peak of the cluster's client backends over the run (what
# pooling buys) and the 1-minute load average; then the medians, the
# spread and the ratio pooled/direct.
#
# default_pool_size (BENCH_POOL_SIZE, default 8): four server connections
# a core on this 2-core machine, enough for group commit to gather the
# workers' commits while they wait on the WAL flush, few enough that a
# graph of many workers shows the saving.  On this graph (ALLOW_FUSION =
# yes, the default) the relay runs fused into the 2 route workers' pass,
# so only 2 workers connect and the pool is never what binds: what is
# measured is the hop through the pooler and the unprepared statements.
# BENCH_FUSION=no (ALLOW_FUSION = no on both sides): the relay in 20
# workers of its own, 22 workers connected, the pool binding.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
relay_workers=${BENCH_RELAY_WORKERS:-20}
pool_size=${BENCH_POOL_SIZE:-8}
fusion=${BENCH_FUSION:-yes}
log=$(bench_log relay-pooled)

bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-smarthost
[ -x /usr/sbin/pgbouncer ] || { echo "install pgbouncer (apt-get install pgbouncer)" >&2; exit 1; }
bouncer_pid= watch_pid=

cleanup() {
    [ -z "$watch_pid" ] || watch_stop
    if [ -n "${BENCH_DIR:-}" ]; then
        cp "$BENCH_DIR/dispatch.log" "${log%.log}-dispatch.log" 2>/dev/null || true
        cp "$BENCH_DIR/pgbouncer.log" "${log%.log}-pgbouncer.log" 2>/dev/null || true
    fi
    bouncer_stop
    bench_cleanup
}
bench_cluster_start "max_connections = 200"
trap cleanup EXIT

sink_port=$(bench_free_port)
pepsi_port=$(bench_free_port)
bouncer_port=$(bench_free_port)
bench_sink_start "$sink_port"

# PgBouncer as the cluster's user, to the cluster's Unix socket (it
# listens on no TCP port: listen_addresses = '').  Started for each pooled
# run and stopped after it, so that its server connections do not linger
# into the next direct run's count.
as_user tee "$BENCH_DIR/pgbouncer.ini" >/dev/null <<INI
[databases]
$BENCH_DB = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = $BENCH_DIR/pgbouncer.log
pidfile = $BENCH_DIR/pgbouncer.pid
INI
bouncer_start() {
    as_user /usr/sbin/pgbouncer "$BENCH_DIR/pgbouncer.ini" >>"$log" 2>&1 &
    bouncer_pid=$!
    bench_wait_port "$bouncer_port" "pgbouncer (see $BENCH_DIR/pgbouncer.log)"
}
bouncer_stop() {
    [ -n "$bouncer_pid" ] || return 0
    # By its own pid: runuser, whose pid we have, passes no signal on.
    kill -TERM "$(cat "$BENCH_DIR/pgbouncer.pid")" 2>/dev/null || true
    wait "$bouncer_pid" 2>/dev/null || true
    bouncer_pid=
}

# start_pepsi direct|pooled
start_pepsi() {
    local database=
    [ "$1" = direct ] || database="[database]
STAGE_CONNINFO = host=127.0.0.1 port=$bouncer_port dbname=$BENCH_DB user=postgres
STAGE_POOLED = yes"
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
QUEUE_LIMIT = 4
$database" "" "ALLOW_FUSION = $fusion"
}

# The cluster's client backends, every 0.2 s, into $BENCH_DIR/backends
# (the watching session itself left out).
watch_start() {
    printf '%s\n' "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()" \
        '\watch 0.2' | bench_psql -tA >"$BENCH_DIR/backends" 2>/dev/null &
    watch_pid=$!
}
watch_stop() {
    # as_user's runuser does not pass SIGTERM on: end the psql by the pid
    # of its session instead.
    bench_psql -tA -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
        WHERE query LIKE 'SELECT count(*) FROM pg_stat_activity WHERE backend_type%'
          AND pid <> pg_backend_pid()" >/dev/null
    wait "$watch_pid" 2>/dev/null || true
    watch_pid=
}

# measure PORT: bench/relay's measured run (measure.sh), no memory sampled.
# shellcheck source=measure.sh
. "$here/measure.sh"

# measure_backends: measure against Pepsi with its cluster's client
# backends counted meanwhile; sets result to "rate peak_backends load1"
# (in this shell, not a subshell: the psql watch it starts is this
# shell's to stop).
measure_backends() {
    local rate peak
    watch_start
    rate=$(measure "$pepsi_port" | cut -d' ' -f1) || { watch_stop; return 1; }
    watch_stop
    peak=$(sort -n "$BENCH_DIR/backends" | tail -1)
    { echo "client backends, every 0.2 s:"; tr '\n' ' ' <"$BENCH_DIR/backends"; echo; } >>"$log"
    result="$rate $peak $(cut -d' ' -f1 /proc/loadavg)"
}

# run direct|pooled: one measured run of Pepsi started afresh.
run() {
    bench_queue_empty
    [ "$1" = direct ] || bouncer_start
    start_pepsi "$1"
    sleep 1
    measure_backends
    bench_pepsi_stop
    bouncer_stop
    local left
    left=$(bench_queue_rows)
    [ "$left" -eq 0 ] || echo "warning: $left rows left in Pepsi's queue" >&2
}

echo "bench/relay pooled: smtp-source -s $sessions -m $messages -l 2048 -> relay -> smtp-sink," \
    "$repeats runs each side, alternating; 2 route workers, $relay_workers relay (ALLOW_FUSION = $fusion);" \
    "pooled: PgBouncer $(/usr/sbin/pgbouncer --version | head -1 | awk '{ print $2 }'), transaction mode, default_pool_size $pool_size"
direct=() pooled=() ratios=() conn_direct=() conn_pooled=()
for ((r = 1; r <= repeats; r++)); do
    run direct
    read -r rate_d conn_d load_d <<<"$result"
    run pooled
    read -r rate_p conn_p load_p <<<"$result"
    direct+=("$rate_d") pooled+=("$rate_p") conn_direct+=("$conn_d") conn_pooled+=("$conn_p")
    ratios+=("$(awk -v a="$rate_p" -v b="$rate_d" 'BEGIN { printf "%.2f", a / b }')")
    printf 'run %d: direct %s msg/s (%s server connections at peak, load %s), pooled %s msg/s (%s, load %s), ratio %s\n' \
        "$r" "$rate_d" "$conn_d" "$load_d" "$rate_p" "$conn_p" "$load_p" "${ratios[-1]}"
done

printf '%-8s median %8s msg/s (runs %s .. %s), server connections at peak: median %s (%s .. %s)\n' \
    direct "$(bench_median "${direct[@]}")" "$(min "${direct[@]}")" "$(max "${direct[@]}")" \
    "$(bench_median "${conn_direct[@]}")" "$(min "${conn_direct[@]}")" "$(max "${conn_direct[@]}")" \
    pooled "$(bench_median "${pooled[@]}")" "$(min "${pooled[@]}")" "$(max "${pooled[@]}")" \
    "$(bench_median "${conn_pooled[@]}")" "$(min "${conn_pooled[@]}")" "$(max "${conn_pooled[@]}")"
printf 'ratio pooled/direct: median %s, runs %s .. %s\n' \
    "$(bench_median "${ratios[@]}")" "$(min "${ratios[@]}")" "$(max "${ratios[@]}")"
