#!/usr/bin/env bash
# bench/failover/dispatcher.sh: the standby dispatcher's takeover.  On one
# PostgreSQL cluster, pepsi-ingress, an active pepsi-dispatch and a
# standby ([dispatch] STANDBY = yes) relay bench/relay's load (SESSIONS
# sessions of 2 KB messages, load.py, each message tagged) to smtp-sink.
# EVENT_AT seconds in, the active dispatcher's process group (it and its
# workers, as a host loss would) is SIGKILLed.  Per run: takeover (s from
# the kill to the standby's "standby: took over" line), delivery_gap (s
# from the kill to the next message the sink receives), and analyze.py's
# accepted, lost (target 0), duplicated, before/after rates.
# BENCH_REPEATS runs (default 5); medians and spread at the end.
#
# The bound: the standby blocks in pg_advisory_lock (no polling), so it
# takes over as soon as PostgreSQL ends the dead session (at once when the
# process dies on this host: its socket closes); then it resets the
# orphaned running rows and starts workers.  Measured (5 runs, load 12 to
# 16 on two cores): takeover 0.35 s (0.25 .. 0.56), delivery gap 1.24 s
# (0.97 .. 2.82), nothing lost; duplicates at most the rows running at the
# kill (0 in three runs, 22 of 50 and 133 of 533 in the others).  The
# bound it states: takeover under 1 s, delivery back within 3 s, nothing
# lost, duplicates at most the running rows (docs/scaling.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
event_at=${BENCH_EVENT_AT:-10}
duration=${BENCH_DURATION:-30}
relay_workers=${BENCH_RELAY_WORKERS:-20}
log=$(bench_log failover-dispatcher)
result=$(mktemp /tmp/pepsi-takeover.XXXXXX)
bin=$bench_top/build/bin
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-smarthost

word() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"; }
drained() { [ "$(bench_psql -Atc "SELECT count(*) FROM pepsi.workqueue")" = 0 ]; }

run_once() {
    local name=$1 sink_dir port conf standby_pid active_pid load event t_over next workers running
    bench_cluster_start "max_connections = 200"
    sink_dir=$BENCH_DIR/sink
    mkdir -p "$sink_dir"
    give_to_user "$sink_dir"
    sink_port=$(bench_free_port)
    bench_sink_start_at 127.0.0.1 "$sink_port" "$BENCH_DIR/sink.out" -d "$sink_dir/%M."
    port=$(bench_free_port)
    bench_pepsi_start "$port" "[stage-init]
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
    active_pid=$BENCH_DISPATCH_PID
    conf=$BENCH_DIR/standby.conf
    sed 's/^\[dispatch\]$/[dispatch]\nSTANDBY = yes/' "$BENCH_DIR/pepsi.conf" >"$conf"
    # Its own process group, so that the kill below spares it.
    setsid "$bin/pepsi-dispatch" -c "$conf" 2>>"$BENCH_DIR/standby.log" &
    standby_pid=$!
    python3 "$here/load.py" --sessions "$sessions" --duration "$duration" --prefix "$name" \
        --targets "127.0.0.1:$port" --out "$BENCH_DIR/$name.events" &
    load=$!
    sleep "$event_at"
    # The relay rows running at the kill: what may be delivered twice (a
    # worker killed between the sink's 250 and its commit; the standby puts
    # the row back to pending and it is sent again).
    running=$(bench_psql -Atc "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'")
    event=$(date +%s.%N)
    # The dispatcher shares this script's process group: kill it and its
    # workers by pid (the workers found first, while it is their parent).
    workers=$(pgrep -P "$active_pid" | tr '\n' ' ')
    # shellcheck disable=SC2086
    kill -KILL "$active_pid" $workers 2>/dev/null || true
    BENCH_DISPATCH_PID=
    for _ in $(seq 1 600); do
        grep -q 'standby: took over' "$BENCH_DIR/standby.log" && break
        sleep 0.05
    done
    t_over=$(date +%s.%N)
    wait "$load"
    for _ in $(seq 1 600); do drained && break; sleep 0.5; done
    sleep 1
    # Delivery resumed: the first message the sink received after the
    # standby took over (the killed workers' last SMTP transactions may
    # still end at the sink after the kill: those do not count).
    next=$(find "$sink_dir" -type f -newermt "@$t_over" -printf '%T@\n' | sort -g | sed -n 1p)
    echo "takeover=$(echo "$t_over - $event" | bc) delivery_gap=$(echo "${next:-$event} - $event" | bc) running=$running" \
        "$(python3 "$here/analyze.py" "$BENCH_DIR/$name.events" "$sink_dir" "$event")" >"$result"
    cat "$BENCH_DIR/standby.log" >>"${log%.log}-standby.log"
    bench_stop_pid "$standby_pid"
    bench_cleanup
}

declare -A series
keys="takeover delivery_gap running accepted lost duplicated before after"
echo "bench/failover/dispatcher: $sessions sessions of 2 KB messages; kill at $event_at s;" \
    "$repeats runs; load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
for ((r = 1; r <= repeats; r++)); do
    run_once "takeover$r"
    out=$(cat "$result")
    echo "run $r: $out (load average $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$log"
    for key in $keys; do
        value=$(word "$key" "$out")
        [ -z "$value" ] || series[$key]+="$value "
    done
done
line="medians (min .. max):"
for key in $keys; do
    # shellcheck disable=SC2086
    line+=" $key $(bench_median ${series[$key]}) ($(min ${series[$key]}) .. $(max ${series[$key]}))"
done
echo "$line" | tee -a "$log"
