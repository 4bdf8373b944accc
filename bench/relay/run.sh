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
# received (its -c counter).  The sides alternate, BENCH_REPEATS times;
# the medians are printed in messages per second with the ratio
# pepsi/postfix (target: at least 1.5), and the peak resident memory of
# each side's processes together (Pepsi: ingress, the dispatcher and its
# workers; Postfix: master and its children), as VmRSS and as PSS (shared
# pages counted once).  PostgreSQL's own memory is printed beside Pepsi's.
#
# Needs: postfix (installed here with debconf "No configuration" when it
# is missing), pepsi-ingress, pepsi-dispatch and the stages built, the
# extension installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-2}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
relay_workers=${BENCH_RELAY_WORKERS:-20}
log=$(bench_log relay)

bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-smarthost
postfix_dir= sampler_pid=

cleanup() {
    bench_stop_pid "$sampler_pid"
    if [ -n "$postfix_dir" ]; then
        bench_postfix_stop "$postfix_dir"
    fi
    bench_cleanup
}

bench_cluster_start "max_connections = 200"
trap cleanup EXIT

sink_port=$(bench_free_port)
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)

bench_sink_start "$sink_port"
sink_count() { bench_sink_count; }

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

# measure PORT ROOT_PIDS...: send MESSAGES with smtp-source to PORT, wait
# until smtp-sink has them all; prints "rate rss pss" (msg/s, kB, kB) with
# the memory peak of the ROOT_PIDS' process trees meanwhile.
measure() {
    local port=$1 base start sent end peak
    shift
    base=$(sink_count)
    base=${base:-0}
    perl "$here/rss-sampler.pl" "$@" >"$BENCH_DIR/sampler.out" &
    sampler_pid=$!
    start=$(date +%s.%N)
    /usr/sbin/smtp-source -d -s "$sessions" -m "$messages" -l 2048 \
        -f sender@example.org -t rcpt@example.net "127.0.0.1:$port" >>"$log" 2>&1
    sent=$(date +%s.%N)
    for _ in $(seq 1 12000); do
        [ "$(sink_count)" -ge $((base + messages)) ] && break
        sleep 0.05
    done
    end=$(date +%s.%N)
    # Where the time went: accepting (smtp-source done) and then draining.
    awk -v p="$port" -v a="$start" -v s="$sent" -v b="$end" 'BEGIN {
        printf "port %s: all accepted after %.2f s, all relayed after %.2f s\n", p, s - a, b - a }' >>"$log"
    bench_stop_pid "$sampler_pid"
    sampler_pid=
    [ "$(sink_count)" -ge $((base + messages)) ] || {
        echo "only $(( $(sink_count) - base )) of $messages reached smtp-sink" >&2
        return 1
    }
    peak=$(cat "$BENCH_DIR/sampler.out")
    awk -v n="$messages" -v a="$start" -v b="$end" -v p="$peak" 'BEGIN {
        split(p, f, /[ =]/); printf "%.1f %s %s\n", n / (b - a), f[2], f[4] }'
}

postgres_pid() { head -1 "$BENCH_DIR/data/postmaster.pid"; }
postfix_master() { head -1 "$postfix_dir/spool/pid/master.pid" | tr -d ' '; }
pepsi_left() { bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue"; }
pepsi_reset() { bench_psql -c "TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY" -c CHECKPOINT >/dev/null; }

start_postfix
start_pepsi

echo "bench/relay: smtp-source -s $sessions -m $messages -l 2048 -> relay -> smtp-sink," \
    "$repeats runs each side, alternating; Pepsi as $BENCH_PEPSI_FLAVOUR, $relay_workers relay workers"
pepsi_rates=() postfix_rates=() pepsi_rss=() pepsi_pss=() postfix_rss=() postfix_pss=() pg_rss=() pg_pss=()
for ((r = 1; r <= repeats; r++)); do
    pepsi_reset
    # The cluster's memory is sampled by a second sampler over the same run.
    perl "$here/rss-sampler.pl" "$(postgres_pid)" >"$BENCH_DIR/pg-sampler.out" &
    pg_sampler=$!
    read -r rate rss pss < <(measure "$pepsi_port" "$BENCH_INGRESS_PID" "$BENCH_DISPATCH_PID")
    bench_stop_pid "$pg_sampler"
    read -r prss ppss < <(sed 's/rss=\([0-9]*\) pss=\([0-9]*\).*/\1 \2/' "$BENCH_DIR/pg-sampler.out")
    left=$(pepsi_left)
    [ "$left" -eq 0 ] || echo "warning: $left rows left in Pepsi's queue" >&2
    pepsi_rates+=("$rate") pepsi_rss+=("$rss") pepsi_pss+=("$pss") pg_rss+=("$prss") pg_pss+=("$ppss")

    sync
    read -r rate_pf rss_pf pss_pf < <(measure "$postfix_port" "$(postfix_master)")
    postfix_rates+=("$rate_pf") postfix_rss+=("$rss_pf") postfix_pss+=("$pss_pf")
    printf 'run %d: pepsi %s msg/s, postfix %s msg/s\n' "$r" "$rate" "$rate_pf"
done

pepsi_median=$(bench_median "${pepsi_rates[@]}")
postfix_median=$(bench_median "${postfix_rates[@]}")
printf '%-34s %10s msg/s\n' "pepsi (ingress -> relay)" "$pepsi_median" "postfix (smtpd -> smtp)" "$postfix_median"
printf 'ratio pepsi/postfix: %s (target >= 1.50)\n' \
    "$(awk -v a="$pepsi_median" -v b="$postfix_median" 'BEGIN { printf "%.2f", a / b }')"
kb_mb() { awk -v k="$1" 'BEGIN { printf "%.1f MB", k / 1024 }'; }
echo "peak memory, all processes of a side together (max over runs):"
max() { printf '%s\n' "$@" | sort -n | tail -1; }
printf '  %-30s RSS %10s   PSS %10s\n' \
    "pepsi (ingress, dispatch, workers)" "$(kb_mb "$(max "${pepsi_rss[@]}")")" "$(kb_mb "$(max "${pepsi_pss[@]}")")" \
    "postfix (master and children)" "$(kb_mb "$(max "${postfix_rss[@]}")")" "$(kb_mb "$(max "${postfix_pss[@]}")")" \
    "postgresql (pepsi's queue)" "$(kb_mb "$(max "${pg_rss[@]}")")" "$(kb_mb "$(max "${pg_pss[@]}")")"
