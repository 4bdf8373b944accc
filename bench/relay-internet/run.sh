#!/usr/bin/env bash
# bench/relay-internet: direct delivery to the internet, Pepsi against a
# stock Postfix, side by side on this machine, on a simulated internet:
# MESSAGES messages of 2 KB to DOMAINS domains (200) whose MX records
# spread them over 20 MX hosts, each a Postfix smtp-sink on 127.0.0.10-29
# port 25, all served by one DNS server on 127.0.0.99:53 (t/lib/testdns.py).
#
#   pepsi:   smtp-source -> pepsi-ingress -> init (route) ->
#            relay-to-internet (MX lookup through DNS_FORWARDER = the DNS
#            server, pepsi.dns_address, per-destination slots) -> the MX
#            hosts; the queue a durable cluster (bench/lib.sh)
#   postfix: smtp-source -> a private stock Postfix (queue files fsynced as
#            usual) whose smtp client resolves MX records through the same
#            DNS server: it runs chrooted in its queue directory, whose
#            etc/resolv.conf names 127.0.0.99
#
# The senders: one smtp-source per domain (MESSAGES/DOMAINS messages over
# one session each), SESSIONS of them at once.  The time runs from the
# first message sent to the last one the MX hosts received.  The sides
# alternate, BENCH_REPEATS times (default 5); each run's ratio is printed,
# then the medians, the spread and the ratio pepsi/postfix (target >= 2).
# Each side first makes one unmeasured warm-up run.
#
# And a slow destination: the same load, but one domain's MX is an
# smtp-sink that waits a second before answering DATA (1 message a second
# per connection).  The first BENCH_SLOW_REPEATS runs (default 3) are each
# followed by such a run a side, which measures the other 199 domains'
# rate (until their last message arrived); its drop is against the normal
# run just before it, on a machine about as loaded (target: a median drop
# of at most 10%).  The load average is printed before and after.
#
# Each normal run also prints each side's CPU time per message (its
# process trees, bench/relay/cpu-time.pl: for Pepsi PostgreSQL, ingress and
# the dispatcher with its workers; for Postfix its master and children;
# the DNS server and the sinks, shared, in neither) and their ratio
# postfix/pepsi: what the rates would be where CPU alone binds, and far
# less noisy than the rates on a loaded machine.
#
# BENCH_STATEMENTS=1 loads pg_stat_statements and prints, after each normal
# Pepsi run, the statements each message cost (calls per message, mean ms).
#
# Run as root (port 25 and 53 on loopback addresses; postfix).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
slow_repeats=${BENCH_SLOW_REPEATS:-3}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
domains=${BENCH_DOMAINS:-200}
workers=${BENCH_RELAY_WORKERS:-30}
per_domain=$((messages / domains))
messages=$((per_domain * domains))
dns_address=127.0.0.99
log=$(bench_log relay-internet)

[ "$(id -u)" = 0 ] || { echo "bench/relay-internet runs as root (ports 25 and 53)" >&2; exit 1; }
bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-internet
postfix_dir=

cleanup() {
    if [ -n "$postfix_dir" ]; then
        bench_postfix_stop "$postfix_dir"
    fi
    bench_cleanup
}
if [ -n "${BENCH_STATEMENTS:-}" ]; then
    bench_cluster_start "max_connections = 200" "shared_preload_libraries = 'pg_stat_statements'" \
        "pg_stat_statements.track = all"
    bench_psql -c "CREATE EXTENSION pg_stat_statements" >/dev/null
else
    bench_cluster_start "max_connections = 200"
fi
trap cleanup EXIT

# The simulated internet: n<i>.bench.test for the normal runs, s<i> for
# the slow ones, whose s0 has the slow MX host.
zone="$BENCH_DIR/internet.zone"
{
    # Its SOA makes negative answers (no MTA-STS TXT record) cacheable, as
    # they are on the internet, for both sides.
    echo "bench.test. 3600 IN SOA ns.bench.test. hostmaster.bench.test. 1 3600 600 86400 3600"
    for ((h = 0; h < 20; h++)); do
        echo "mx$h.bench.test. 3600 IN A 127.0.0.$((10 + h))"
    done
    echo "mxslow.bench.test. 3600 IN A 127.0.0.30"
    for ((i = 0; i < domains; i++)); do
        echo "n$i.bench.test. 3600 IN MX 10 mx$((i % 20)).bench.test."
        if ((i == 0)); then
            echo "s$i.bench.test. 3600 IN MX 10 mxslow.bench.test."
        else
            echo "s$i.bench.test. 3600 IN MX 10 mx$((i % 20)).bench.test."
        fi
    done
} >"$zone"
bench_dns_start "$dns_address" 53 "$zone"
for ((h = 0; h < 20; h++)); do
    bench_sink_start_at "127.0.0.$((10 + h))" 25 "$BENCH_DIR/sink$h.out"
done
bench_sink_start_at 127.0.0.30 25 "$BENCH_DIR/sinkslow.out" -w 1
fast_sinks=()
for ((h = 0; h < 20; h++)); do fast_sinks+=("$BENCH_DIR/sink$h.out"); done
# (Two processes a count: polled every 50 ms while a run is measured, a
# process per sink was a load of its own on the machine being measured.)
fast_count() { bench_sinks_count "${fast_sinks[@]}"; }
slow_count() { bench_sinks_count "$BENCH_DIR/sinkslow.out"; }

pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)
bench_pepsi_start "$pepsi_port" "[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = pepsi.bench.test
LOCAL_STAGE = internet
REMOTE_STAGE = internet
PARALLELISM = 2
QUEUE_LIMIT = 256
[stage-internet]
PROGRAM = pepsi-stage-relay-to-internet
PARALLELISM = $workers
QUEUE_LIMIT = 4
SESSION_CACHE = 20
RETRY_BASE = 10s" "" "DNS_FORWARDER = $dns_address@53"

# Stock Postfix, delivering by MX; its smtp client chrooted so that it
# reads the queue directory's etc/resolv.conf.
postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
bench_postfix_start "$postfix_dir" "$postfix_port"
mkdir -p "$postfix_dir/spool/etc"
echo "nameserver $dns_address" >"$postfix_dir/spool/etc/resolv.conf"
printf 'hosts: files dns\n' >"$postfix_dir/spool/etc/nsswitch.conf"
: >"$postfix_dir/spool/etc/hosts"
cp /etc/services "$postfix_dir/spool/etc/services"
postconf -c "$postfix_dir/etc" -F smtp/unix/chroot=y
/usr/sbin/postfix -c "$postfix_dir/etc" reload >/dev/null 2>&1

# send PORT PREFIX: every domain's messages, SESSIONS senders at once.
send() {
    local port=$1 prefix=$2
    for ((i = 0; i < domains; i++)); do echo "$prefix$i.bench.test"; done |
        xargs -P "$sessions" -I{} /usr/sbin/smtp-source -d -s 1 -m "$per_domain" -l 2048 \
            -f sender@example.org -t rcpt@{} "127.0.0.1:$port" >>"$log" 2>&1
}

# measure PORT PREFIX: prints "rate other_rate" (msg/s): all messages, and
# the messages of the domains whose MX is fast (all but s0).
measure() {
    local port=$1 prefix=$2 base_fast base_slow start fast_end end want_fast want_slow
    base_fast=$(fast_count) base_slow=$(slow_count)
    if [ "$prefix" = s ]; then
        want_fast=$((messages - per_domain)) want_slow=$per_domain
    else
        want_fast=$messages want_slow=0
    fi
    start=$(date +%s.%N)
    send "$port" "$prefix"
    for _ in $(seq 1 24000); do
        [ "$(fast_count)" -ge $((base_fast + want_fast)) ] && break
        sleep 0.05
    done
    fast_end=$(date +%s.%N)
    for _ in $(seq 1 12000); do
        [ "$(slow_count)" -ge $((base_slow + want_slow)) ] && break
        sleep 0.05
    done
    end=$(date +%s.%N)
    if [ "$(fast_count)" -lt $((base_fast + want_fast)) ] || [ "$(slow_count)" -lt $((base_slow + want_slow)) ]; then
        echo "only $(($(fast_count) - base_fast)) + $(($(slow_count) - base_slow)) of $messages were delivered" >&2
        return 1
    fi
    awk -v n="$messages" -v f="$want_fast" -v a="$start" -v e="$end" -v m="$fast_end" 'BEGIN {
        printf "%.1f %.1f\n", n / (e - a), f / (m - a) }'
}

# CPU milliseconds used so far by each PID's process tree.
cpu_ms() { perl "$here/../relay/cpu-time.pl" "$@"; }
postgres_pid() { head -1 "$BENCH_DIR/data/postmaster.pid"; }
postfix_master() { head -1 "$postfix_dir/spool/pid/master.pid" | tr -d ' '; }
per_message() { awk -v ms="$1" -v n="$messages" 'BEGIN { printf "%.3f", ms / n }'; }

pepsi_reset() { bench_queue_empty pepsi.destination; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
drop() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f%%", 100 * (1 - a / b) }'; }

echo "bench/relay-internet: $messages messages of 2 KB to $domains domains over 20 MX hosts," \
    "$sessions sending sessions, $repeats runs each side alternating; Pepsi as $BENCH_PEPSI_FLAVOUR," \
    "$workers relay workers"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
bench_started=$(date +%s)
# One unmeasured run a side first: the first run of either side otherwise
# pays for what every later one finds ready (the DNS server's first
# answers, each side's resolver cache and first connections, PostgreSQL's
# and the programs' first pages), and came out far below the others.
pepsi_reset
read -r warm _ < <(measure "$pepsi_port" n)
sync
read -r warm_pf _ < <(measure "$postfix_port" n)
echo "warm-up (not counted): pepsi $warm msg/s, postfix $warm_pf msg/s"
pepsi_rates=() postfix_rates=() ratios=() cpus_pepsi=() cpus_pf=() cpu_ratios=()
pepsi_other=() postfix_other=() pepsi_drops=() postfix_drops=()
for ((r = 1; r <= repeats; r++)); do
    pepsi_reset
    sleep 1
    [ -z "${BENCH_STATEMENTS:-}" ] || bench_psql -c "SELECT pg_stat_statements_reset()" >/dev/null
    read -r pg0 ingress0 dispatch0 < <(cpu_ms "$(postgres_pid)" "$BENCH_INGRESS_PID" "$BENCH_DISPATCH_PID")
    read -r rate _ < <(measure "$pepsi_port" n)
    read -r pg1 ingress1 dispatch1 < <(cpu_ms "$(postgres_pid)" "$BENCH_INGRESS_PID" "$BENCH_DISPATCH_PID")
    pepsi_rates+=("$rate")
    cpus_pepsi+=("$(per_message $((pg1 - pg0 + ingress1 - ingress0 + dispatch1 - dispatch0)))")
    echo "run $r: pepsi CPU ms per message: postgresql $(per_message $((pg1 - pg0))), ingress" \
        "$(per_message $((ingress1 - ingress0))), dispatcher and workers $(per_message $((dispatch1 - dispatch0)))" >>"$log"
    if [ -n "${BENCH_STATEMENTS:-}" ]; then
        # What each message asked of the server: statements per message and their time.
        bench_psql -c "SELECT round(calls::numeric / $messages, 2) AS per_message,
                round(mean_exec_time::numeric, 3) AS ms, toplevel,
                left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS statement
            FROM pg_stat_statements WHERE calls >= $messages / 10
            ORDER BY toplevel DESC, calls DESC LIMIT 25"
    fi
    sync
    read -r pf0 < <(cpu_ms "$(postfix_master)")
    read -r rate_pf _ < <(measure "$postfix_port" n)
    read -r pf1 < <(cpu_ms "$(postfix_master)")
    postfix_rates+=("$rate_pf")
    cpus_pf+=("$(per_message $((pf1 - pf0)))")
    cpu_ratios+=("$(ratio "${cpus_pf[-1]}" "${cpus_pepsi[-1]}")")
    ratios+=("$(ratio "$rate" "$rate_pf")")
    printf 'run %d: pepsi %s msg/s, postfix %s msg/s, ratio %s; CPU ms per message pepsi %s, postfix %s, postfix/pepsi %s (load %s)\n' \
        "$r" "$rate" "$rate_pf" "${ratios[-1]}" "${cpus_pepsi[-1]}" "${cpus_pf[-1]}" "${cpu_ratios[-1]}" \
        "$(cut -d' ' -f1 /proc/loadavg)"
    ((r <= slow_repeats)) || continue
    # The slow destination's run right after the normal one, so that the
    # drop compares two runs under about the same load of the machine.
    pepsi_reset
    sleep 1
    read -r _ other < <(measure "$pepsi_port" s)
    pepsi_other+=("$other")
    pepsi_drops+=("$(drop "$other" "$rate")")
    sync
    read -r _ other_pf < <(measure "$postfix_port" s)
    postfix_other+=("$other_pf")
    postfix_drops+=("$(drop "$other_pf" "$rate_pf")")
    printf 'slow run %d: the other %d domains: pepsi %s msg/s (%s below run %d), postfix %s msg/s (%s below) (load %s)\n' \
        "$r" $((domains - 1)) "$other" "${pepsi_drops[-1]}" "$r" "$other_pf" "${postfix_drops[-1]}" \
        "$(cut -d' ' -f1 /proc/loadavg)"
done
pepsi_median=$(bench_median "${pepsi_rates[@]}")
postfix_median=$(bench_median "${postfix_rates[@]}")
printf '%-28s %8s msg/s (runs %s .. %s)\n' \
    "pepsi (ingress -> MX)" "$pepsi_median" "$(min "${pepsi_rates[@]}")" "$(max "${pepsi_rates[@]}")" \
    "postfix (smtpd -> MX)" "$postfix_median" "$(min "${postfix_rates[@]}")" "$(max "${postfix_rates[@]}")"
printf 'ratio pepsi/postfix: median %s, runs %s .. %s (target: median >= 2.00)\n' \
    "$(bench_median "${ratios[@]}")" "$(min "${ratios[@]}")" "$(max "${ratios[@]}")"
printf 'CPU ms per message: pepsi %s (runs %s .. %s), postfix %s (runs %s .. %s);\n' \
    "$(bench_median "${cpus_pepsi[@]}")" "$(min "${cpus_pepsi[@]}")" "$(max "${cpus_pepsi[@]}")" \
    "$(bench_median "${cpus_pf[@]}")" "$(min "${cpus_pf[@]}")" "$(max "${cpus_pf[@]}")"
printf '  postfix/pepsi median %s, runs %s .. %s (what the rates would be where CPU alone binds)\n' \
    "$(bench_median "${cpu_ratios[@]}")" "$(min "${cpu_ratios[@]}")" "$(max "${cpu_ratios[@]}")"

took() { echo "the benchmark took $(($(date +%s) - bench_started)) s"; }
[ "$slow_repeats" -gt 0 ] || { echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"; took; exit 0; }
pepsi_other_median=$(bench_median "${pepsi_other[@]}")
postfix_other_median=$(bench_median "${postfix_other[@]}")
pct() { printf '%s\n' "$@" | tr -d %; }
printf 'one destination slowed to 1 msg/s per connection: the other %d domains\n' $((domains - 1))
printf '  pepsi   %8s msg/s (runs %s .. %s); drop from the run before: median %s%%, runs %s%% .. %s%% (target: <= 10%%)\n' \
    "$pepsi_other_median" "$(min "${pepsi_other[@]}")" "$(max "${pepsi_other[@]}")" \
    "$(bench_median $(pct "${pepsi_drops[@]}"))" "$(min $(pct "${pepsi_drops[@]}"))" "$(max $(pct "${pepsi_drops[@]}"))"
printf '  postfix %8s msg/s (runs %s .. %s); drop from the run before: median %s%%, runs %s%% .. %s%%\n' \
    "$postfix_other_median" "$(min "${postfix_other[@]}")" "$(max "${postfix_other[@]}")" \
    "$(bench_median $(pct "${postfix_drops[@]}"))" "$(min $(pct "${postfix_drops[@]}"))" "$(max $(pct "${postfix_drops[@]}"))"
printf 'ratio pepsi/postfix with the slow destination: %s\n' "$(ratio "$pepsi_other_median" "$postfix_other_median")"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
took
