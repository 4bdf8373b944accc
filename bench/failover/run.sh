#!/usr/bin/env bash
# bench/failover: bench/relay's load (SESSIONS parallel SMTP sessions, 2 KB
# messages, one remote recipient) while the database host is lost, Pepsi
# on the Patroni cluster of scripts/ha.sh against a stock Postfix whose
# spool host is lost.  Each run, alternating the sides:
#
#   pepsi kill:        pepsi-ingress and pepsi-dispatch (route ->
#                      relay-to-smarthost -> smtp-sink) given all three
#                      nodes in one conninfo; EVENT_AT seconds into the
#                      load the leader's Patroni and postmaster are
#                      SIGKILLed (ha.sh kill-leader: the host is gone) and
#                      Patroni promotes a synchronous standby
#   pepsi switchover:  the same with `patronictl switchover` (ha.sh
#                      switchover) instead of the kill
#   postfix kill:      two stock Postfix instances (mx1, mx2, each its own
#                      spool) relaying to the sink, the client preferring
#                      mx1 as a sending MTA prefers the lower MX; EVENT_AT
#                      seconds in, mx1's master and every child are
#                      SIGKILLed (its host is gone).  What mx1 had accepted
#                      and not relayed waits in its spool: counted, then
#                      mx1 is started again (the host comes back) and must
#                      deliver it
#
# The client (load.py) retries a message answered 4xx or left without an
# answer, the same tag, as an MTA would (sooner: 0.1 s).  Every message is
# tagged, the sink dumps each (smtp-sink -d) and analyze.py matches them:
# messages lost (a 250 never delivered; target 0), duplicated (copies
# beyond the first: at most the messages in flight at the event, counted
# too, plus the relay rows running then), the longest time without a 250
# after the event (target under 15 s), the acceptance rates over the 15 s
# before the event and after the gap; when another node answered as
# primary (promoted), the promotions in the run (more than one: a spurious
# failover), and how long the case took (took).  A fresh Patroni cluster
# per Pepsi run.  BENCH_REPEATS rounds (default 5; creating
# bench/out/failover.stop ends the run after the round under way); medians
# and spread at the end.
# The Patroni cluster runs with fsync off (scripts/ha.sh): what is measured
# is the failover, not the disk.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
event_at=${BENCH_EVENT_AT:-10}
kill_duration=${BENCH_KILL_DURATION:-75}
switch_duration=${BENCH_SWITCH_DURATION:-45}
relay_workers=${BENCH_RELAY_WORKERS:-20}
sides=${BENCH_SIDES:-kill switchover postfix}
log=$(bench_log failover)

bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-smarthost
if ! command -v patroni >/dev/null || ! command -v etcd >/dev/null; then
    echo "bench/failover needs patroni and etcd (scripts/deps.sh)" >&2
    exit 1
fi

ensure_unprivileged_user
BENCH_DIR=$(mktemp -d /tmp/pepsi-bench.XXXXXX)
chmod 755 "$BENCH_DIR"
give_to_user "$BENCH_DIR"
ha_dir= mx1= mx2=
cleanup() {
    [ -z "$ha_dir" ] || "$bench_top/scripts/ha.sh" stop "$ha_dir" >/dev/null 2>&1 || true
    cp "$BENCH_DIR/dispatch.log" "${log%.log}-dispatch.log" 2>/dev/null || true
    cp "$BENCH_DIR/ingress.log" "${log%.log}-ingress.log" 2>/dev/null || true
    bench_cleanup
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ha() { "$bench_top/scripts/ha.sh" "$@"; }
ha_psql() {
    as_user "$PGBIN/psql" -XAtq -h 127.0.0.1 -p "$(ha leader "$ha_dir")" -d postgres "$@"
}

# The port of the node that takes writes now, found as a client finds it.
primary_port() {
    as_user "$PGBIN/psql" -XAtq -c 'SELECT inet_server_port()' \
        "host=127.0.0.1,127.0.0.1,127.0.0.1 port=$1 dbname=postgres connect_timeout=2 target_session_attrs=read-write" 2>/dev/null
}

# A sink of its own for each side of each run, dumping every message.
sink_start() {
    local dir=$BENCH_DIR/sink-$1
    mkdir -p "$dir"
    give_to_user "$dir"
    sink_port=$(bench_free_port)
    bench_sink_start_at 127.0.0.1 "$sink_port" "$dir.out" -d "$dir/%M."
    sink_dir=$dir
}
sink_stop() { bench_stop_pid "${BENCH_SINK_PIDS[-1]}"; }

# wait_until SECONDS COMMAND...: until COMMAND succeeds (or the time is up).
wait_until() {
    local deadline=$((SECONDS + $1))
    shift
    while [ $SECONDS -lt $deadline ]; do
        "$@" && return 0
        sleep 0.5
    done
    return 1
}
pepsi_drained() { [ "$(ha_psql -c "SELECT count(*) FROM pepsi.workqueue" 2>/dev/null)" = 0 ]; }
# A Postfix instance holds nothing: every queue file is relayed.
postfix_drained() {
    [ $(($(bench_postfix_count "$1" incoming) + $(bench_postfix_count "$1" active) + $(bench_postfix_count "$1" maildrop) + $(bench_postfix_count "$1" deferred))) -eq 0 ]
}

# pepsi_run KIND (kill | switchover) NAME: analyze.py's words, and
# running=N (the relay rows claimed just before the event), into
# $BENCH_DIR/result (not a command substitution: a subshell would keep
# what cleanup must stop).
pepsi_run() {
    local kind=$1 name=$2 duration running event port old promoted timeline
    duration=$([ "$kind" = kill ] && echo "$kill_duration" || echo "$switch_duration")
    ha_dir=$BENCH_DIR/ha-$name
    ha start "$ha_dir" $((20000 + RANDOM % 30000)) >/dev/null
    ha_psql -c "CREATE EXTENSION pepsi" >/dev/null
    sink_start "$name"
    port=$(bench_free_port)
    BENCH_CONNINFO="host=127.0.0.1,127.0.0.1,127.0.0.1 port=$(ha ports "$ha_dir") dbname=postgres user=$PEPSI_USER connect_timeout=2" \
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
    python3 "$here/load.py" --sessions "$sessions" --duration "$duration" --prefix "$name" \
        --targets "127.0.0.1:$port" --out "$BENCH_DIR/$name.events" &
    local load=$!
    sleep "$event_at"
    running=$(ha_psql -c "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'" || echo '?')
    # The time of the kill, or of the switchover's start, as ha.sh saw it
    # (starting a command can take seconds on a loaded machine).
    case $kind in
    kill) read -r old event < <(ha kill-leader "$ha_dir") ;;
    switchover) read -r old event < <(ha switchover "$ha_dir") ;;
    esac
    # When another node answered as primary (not in recovery): the part
    # of the gap that is Patroni's; the rest is the clients' reconnect.
    local deadline=$((SECONDS + 120)) ports new
    ports=$(ha ports "$ha_dir")
    until new=$(primary_port "$ports") && [ -n "$new" ] && [ "$new" != "$old" ]; do
        [ $SECONDS -lt $deadline ] || break
        sleep 0.1
    done
    promoted=$(echo "$(date +%s.%N) - $event" | bc)
    wait "$load"
    # Until the queue is empty: every row delivered (or, past 10 minutes, counted lost).
    wait_until 600 pepsi_drained || echo "warning: $name: the queue did not drain in 10 minutes" >&2
    sleep 1
    # Every promotion moves the timeline on: more than one is a spurious
    # failover (a leader that did not renew its key in time).
    timeline=$(ha_psql -c "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int" || echo 0)
    echo "$(python3 "$here/analyze.py" "$BENCH_DIR/$name.events" "$sink_dir" "$event") running=$running" \
        "promoted=$(printf '%.2f' "$promoted") promotions=$((timeline - 1))" >"$BENCH_DIR/result"
    # Kept beside the log: each message's events, and when the event was.
    { echo "E $event event"; cat "$BENCH_DIR/$name.events"; } >"${log%.log}-$name.events"
    bench_pepsi_stop
    cat "$BENCH_DIR/ingress.log" >>"${log%.log}-ingress.log"
    cat "$BENCH_DIR/dispatch.log" >>"${log%.log}-dispatch.log"
    : >"$BENCH_DIR/ingress.log"
    : >"$BENCH_DIR/dispatch.log"
    sink_stop
    ha stop "$ha_dir" >/dev/null 2>&1 || true
    ha_dir=
}

# Every process of a Postfix instance, its master first.
postfix_tree() {
    local pids=("$1") i=0
    while [ $i -lt ${#pids[@]} ]; do
        for child in $(pgrep -P "${pids[$i]}" || true); do pids+=("$child"); done
        i=$((i + 1))
    done
    echo "${pids[@]}"
}

# postfix_run NAME: analyze.py's words (before mx1 comes back), held=N
# (accepted by mx1 and waiting in its spool while it was down) and
# lost_after_return=N, into $BENCH_DIR/result.
postfix_run() {
    local name=$1 p1 p2 event master held
    sink_start "$name"
    mx1=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
    mx2=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
    p1=$(bench_free_port)
    p2=$(bench_free_port)
    bench_postfix_start "$mx1" "$p1" "relayhost = [127.0.0.1]:$sink_port"
    bench_postfix_start "$mx2" "$p2" "relayhost = [127.0.0.1]:$sink_port"
    python3 "$here/load.py" --sessions "$sessions" --duration "$switch_duration" --prefix "$name" \
        --targets "127.0.0.1:$p1,127.0.0.1:$p2" --out "$BENCH_DIR/$name.events" &
    local load=$!
    sleep "$event_at"
    master=$(head -1 "$mx1/spool/pid/master.pid" | tr -d ' ')
    event=$(date +%s.%N)
    # shellcheck disable=SC2046
    kill -KILL $(postfix_tree "$master") 2>/dev/null || true
    wait "$load"
    # What mx2 took is relayed; what mx1 held stays until it is back.
    wait_until 600 postfix_drained "$mx2" || echo "warning: $name: mx2 did not drain in 10 minutes" >&2
    sleep 1
    python3 "$here/analyze.py" "$BENCH_DIR/$name.events" "$sink_dir" "$event" "$BENCH_DIR/$name.held" | tr '\n' ' ' >"$BENCH_DIR/result"
    held=$(wc -l <"$BENCH_DIR/$name.held")
    { echo "E $event event"; cat "$BENCH_DIR/$name.events"; } >"${log%.log}-$name.events"
    # The host comes back: the same spool, started again.
    /usr/sbin/postfix -c "$mx1/etc" start >/dev/null 2>&1 || true
    /usr/sbin/postfix -c "$mx1/etc" flush >/dev/null 2>&1 || true
    wait_until 600 postfix_drained "$mx1" || echo "warning: $name: mx1 did not drain in 10 minutes" >&2
    sleep 1
    python3 "$here/analyze.py" "$BENCH_DIR/$name.events" "$sink_dir" "$event" |
        sed 's/.*lost=\([0-9]*\) duplicated=\([0-9]*\).*/held='"$held"' lost_after_return=\1 duplicated_after_return=\2/' >>"$BENCH_DIR/result"
    bench_postfix_stop "$mx1"
    bench_postfix_stop "$mx2"
    sink_stop
}

word() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"; }
declare -A series
keys="accepted lost duplicated unanswered in_flight running promoted gap promotions before after held lost_after_return duplicated_after_return took"

echo "bench/failover: $sessions sessions of 2 KB messages; the event $event_at s in;" \
    "$repeats runs, alternating; load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
# The file bench/out/failover.stop ends the run after the round under way,
# with the medians of the runs done (a run that must end by a deadline).
stop_file=${log%.log}.stop
rm -f "$stop_file"
for ((r = 1; r <= repeats; r++)); do
    for side in $sides; do
        started=$SECONDS
        if [ "$side" = postfix ]; then
            postfix_run "postfix$r"
        else
            pepsi_run "$side" "$side$r"
        fi
        out="$(tr '\n' ' ' <"$BENCH_DIR/result")took=$((SECONDS - started))"
        echo "run $r $side: $out (load average $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$log"
        for key in $keys; do
            value=$(word "$key" "$out")
            [ -z "$value" ] || series[$side.$key]+="$value "
        done
    done
    if [ -e "$stop_file" ] && [ $r -lt $repeats ]; then
        echo "stopped after $r of $repeats rounds ($stop_file)" | tee -a "$log"
        break
    fi
done

echo "medians (runs min .. max):" | tee -a "$log"
for side in $sides; do
    line="  $side:"
    for key in $keys; do
        [ -n "${series[$side.$key]:-}" ] || continue
        # shellcheck disable=SC2086
        line+=" $key $(bench_median ${series[$side.$key]}) ($(min ${series[$side.$key]}) .. $(max ${series[$side.$key]}))"
    done
    echo "$line" | tee -a "$log"
done
