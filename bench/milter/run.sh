#!/usr/bin/env bash
# bench/milter: content filtering through a milter, Pepsi against a stock
# Postfix, side by side on this machine, both asking the same filter and
# both relaying into the same Postfix smtp-sink.
#
# The filter is bench/milter/noop-milter.c: every protocol step, each
# answered CONTINUE, in C with a thread per connection, so that what is
# measured is the MTAs' side of the protocol (a Python filter would be the
# bottleneck of both).  Postfix's smtp-source sends SESSIONS parallel
# sessions, MESSAGES messages of 2 KB in all, one recipient each:
#   pepsi:   pepsi-ingress -> pepsi-dispatch -> init (pepsi-stage-milter,
#            MILTER_WORKERS workers, a kept filter connection each) ->
#            relay-to-smarthost -> smtp-sink; the queue a durable cluster
#   postfix: a private stock Postfix with smtpd_milters = the same filter
#            (one filter connection per SMTP session, as Postfix does) and
#            relayhost = the same smtp-sink
# The time runs from the first message sent to the last one smtp-sink
# received.  The sides alternate, BENCH_REPEATS times (default 5); each
# side's median, its spread (min-max) and the ratio of the medians
# pepsi/postfix (target: at least 2) are printed.  The filter's own count
# checks that every message of both sides went through it.
#
# Needs: postfix (installed with debconf "No configuration" when missing),
# pepsi-ingress, pepsi-dispatch and the stages built, the extension
# installed, a C compiler for the filter.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
milter_workers=${BENCH_MILTER_WORKERS:-8}
relay_workers=${BENCH_RELAY_WORKERS:-20}
log=$(bench_log milter)

bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-milter pepsi-stage-relay-to-smarthost

postfix_dir=

# Autovacuum on, as any cluster a postmaster runs has it: a run of 20,000
# messages churns the queue table through some 60,000 dead row versions,
# and without ANALYZE the statements planned while it was empty keep
# plans that scan it whole (measured: 110 msg/s against 500 with it on).
bench_cluster_start "max_connections = 200" "autovacuum = on" "autovacuum_naptime = 1s"

sink_port=$(bench_free_port)
milter_port=$(bench_free_port)
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)

bench_noop_milter_start "$milter_port"
milter_count() { bench_noop_milter_count; }
bench_sink_start "$sink_port"

start_pepsi() {
    bench_pepsi_start "$pepsi_port" "[stage-init]
PROGRAM = pepsi-stage-milter
MILTERS = inet:127.0.0.1:$milter_port
NEXT_STAGE = smarthost
PARALLELISM = $milter_workers
QUEUE_LIMIT = 8
[stage-smarthost]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$sink_port
TLS = none
PARALLELISM = $relay_workers
QUEUE_LIMIT = 4"
}

# measure PORT: MESSAGES through PORT until smtp-sink has them all; the
# filter must have seen as many.  Prints the rate in messages per second.
measure() {
    local port=$1 base filtered start end
    base=$(bench_sink_count)
    base=${base:-0}
    filtered=$(milter_count)
    filtered=${filtered:-0}
    start=$(date +%s.%N)
    /usr/sbin/smtp-source -d -s "$sessions" -m "$messages" -l 2048 \
        -f sender@example.org -t rcpt@example.net "127.0.0.1:$port" >>"$log" 2>&1
    for _ in $(seq 1 12000); do
        [ "$(bench_sink_count)" -ge $((base + messages)) ] && break
        sleep 0.05
    done
    end=$(date +%s.%N)
    [ "$(bench_sink_count)" -ge $((base + messages)) ] || {
        echo "only $(( $(bench_sink_count) - base )) of $messages reached smtp-sink" >&2
        return 1
    }
    [ "$(milter_count)" -ge $((filtered + messages)) ] || {
        echo "the filter saw $(( $(milter_count) - filtered )) of $messages messages" >&2
        return 1
    }
    awk -v n="$messages" -v a="$start" -v b="$end" 'BEGIN { printf "%.1f\n", n / (b - a) }'
}

pepsi_reset() { bench_queue_empty; }

postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
bench_postfix_start "$postfix_dir" "$postfix_port" "relayhost = [127.0.0.1]:$sink_port" \
    "smtpd_milters = inet:127.0.0.1:$milter_port" "milter_default_action = tempfail"
start_pepsi

echo "bench/milter: smtp-source -s $sessions -m $messages -l 2048 -> milter (C no-op) -> relay" \
    "-> smtp-sink, $repeats runs each side, alternating; Pepsi as $BENCH_PEPSI_FLAVOUR, $milter_workers milter workers"
pepsi_rates=() postfix_rates=()
for ((r = 1; r <= repeats; r++)); do
    pepsi_reset
    rate=$(measure "$pepsi_port")
    left=$(bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue")
    [ "$left" -eq 0 ] || echo "warning: $left rows left in Pepsi's queue" >&2
    sync
    rate_pf=$(measure "$postfix_port")
    pepsi_rates+=("$rate") postfix_rates+=("$rate_pf")
    printf 'run %d: pepsi %s msg/s, postfix %s msg/s\n' "$r" "$rate" "$rate_pf"
done

spread() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s-%s", lo, hi }'; }
pepsi_median=$(bench_median "${pepsi_rates[@]}")
postfix_median=$(bench_median "${postfix_rates[@]}")
printf '%-36s %10s msg/s (spread %s)\n' \
    "pepsi (ingress -> milter -> relay)" "$pepsi_median" "$(spread "${pepsi_rates[@]}")" \
    "postfix (smtpd_milters -> smtp)" "$postfix_median" "$(spread "${postfix_rates[@]}")"
printf 'ratio pepsi/postfix: %s (target >= 2.00)\n' \
    "$(awk -v a="$pepsi_median" -v b="$postfix_median" 'BEGIN { printf "%.2f", a / b }')"
