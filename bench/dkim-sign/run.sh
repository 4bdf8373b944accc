#!/usr/bin/env bash
# bench/dkim-sign: DKIM signing, Pepsi against Postfix with the OpenDKIM
# milter, side by side on this machine, both signing the same messages
# with the same key and relaying them into the same Postfix smtp-sink.
#
#   pepsi:    pepsi-ingress -> init (route) -> sign (pepsi-stage-dkim-sign)
#             -> relay-to-smarthost -> smtp-sink, the queue a durable
#             cluster (bench/lib.sh)
#   postfix:  a private stock Postfix (bench/lib.sh) whose smtpd calls
#             opendkim (Debian's, sign mode, a private configuration) as a
#             milter, relayhost = the same smtp-sink
#
# Both sign relaxed/relaxed, d=example.org, the same key, From, To,
# Subject and Date oversigned.  Postfix's smtp-source sends MESSAGES
# messages of each SIZES (2 KB and 100 KB by default), for each of
# ALGORITHMS (rsa-sha256 with a 2048-bit key, ed25519-sha256); the time
# runs from the first message sent to the last one smtp-sink received.
# The sides alternate, BENCH_REPEATS times; medians (and the spread,
# min..max) in signed messages per second, and the ratio pepsi/postfix
# (target: at least 2).
#
# Then the cost of signing inside Pepsi: bench/relay's graph (route ->
# relay) against the same graph with the signing stage added, 2 KB
# messages, with each of ALGORITHMS (the issue's case: RSA-2048): the rate
# lost to signing, 1 - with/without (target: at most 25%).  Each run
# measures the graph without signing and then with each algorithm, back to
# back, and prints the load average at the start of each, since on a shared
# machine the rates follow the load of the moment; and the CPU per message
# of Pepsi's own processes apart from PostgreSQL's, where signing's CPU is.
# For the cost alone:  BENCH_PARTS=cost (a quick look: BENCH_MESSAGES=5000
# BENCH_REPEATS=1; the issue's: BENCH_MESSAGES=20000 BENCH_REPEATS=5).
# Each cost run also prints the share of the machine's CPU left idle
# (/proc/stat): a signed run that left a core idle would be bound by
# route's two workers, where the signing runs, and not by the CPU.
#
# The cost's arithmetic (docs/pepsi-stage-dkim-sign.8.md, COST): quiet, at
# 7ac6ad3, 20,000 messages, medians of 5 runs: 2,296.8 msg/s without
# signing (1,805.9-2,674.3), 1,286.3 with RSA-2048 (44.0%), 2,152.8 with
# Ed25519 (6.3%).  Without signing the graph uses 0.78 ms of CPU per
# message, ~90% of the 2 cores; a cost of 25% (1,722 msg/s) allows 1.16 ms
# per message with no core idle (1.04 ms at 90%), i.e. signing may add
# 0.38 ms (0.26 ms).  The RSA-2048 private-key operation is 0.26 ms here
# (openssl speed; OpenSSL 3.0's AVX-512 IFMA code, 2.2 times as slow
# without it; blinding kept).  Signing adds 0.38 ms of CPU per message (load average
# 6, 3 runs of 5,000: 0.86 ms without, 1.24 with RSA-2048; 0.32 of it in
# Pepsi's processes, 0.06 in PostgreSQL): 31% if both runs
# kept both cores busy.  perf of route's workers when signing: libcrypto
# 57% of the samples, the kernel 19%, libc 15%, Jansson 4%, Pepsi 3.5%
# (canonicalization and hashing under 1%).  So RSA-2048 cannot meet 25% on
# 2 cores; Ed25519 (0.03 ms a signature) does.  At load average 30-41 the
# cost was 64% (322.6 and 116.4 msg/s, 3 runs of 5,000), a third of the
# messages signed outside route's pass.  At load average 2-4 (3 runs of
# 5,000, this graph most of the load) every run left 0-2% of the CPU idle,
# signed or not, and the rates followed the CPU per message: 0.89 ms
# without signing (1,329.4 msg/s), 1.47 with RSA-2048 (778.2, 41.5%), 1.18
# with Ed25519 (1,037.7, 21.9%).
#
# Each run also prints CPU milliseconds per message: each side's process
# trees (Pepsi with its PostgreSQL; Postfix with OpenDKIM), and the
# harness's (smtp-source and smtp-sink), which both sides share: when the
# harness's share is small the rate measures the MTAs, not the client or
# the sink.  For Pepsi also the WAL bytes per message.  CPU time per
# message is what to compare on a loaded machine, where rates follow the
# load.  BENCH_STATEMENTS=1 logs Pepsi's statements per message
# (pg_stat_statements) of each run into bench/out/dkim-sign.log.
#
# Environment: BENCH_REPEATS (5), BENCH_MESSAGES (20000), BENCH_SESSIONS
# (20), BENCH_SIZES ("2048 102400"), BENCH_ALGORITHMS ("rsa-sha256
# ed25519-sha256"), BENCH_RELAY_WORKERS (20), BENCH_SIGN_WORKERS and
# BENCH_ROUTE_WORKERS (as many as relay workers), BENCH_ROUTE_QUEUE (16), BENCH_PARTS (compare, cost or both).
#
# Duration: the issue's full size (the defaults: 20,000 messages, 5 runs
# each side, 4 cases, then 5 x 3 cost runs: without signing, RSA, Ed25519) is 1,100,000 messages, about
# 100 minutes on a loaded 2-core machine, nearly all of it the measured
# runs themselves (Postfix+OpenDKIM's at 100 KB the slowest: at 40-100
# msg/s under load most of the time); the run prints what it took.  The
# compare part alone (BENCH_PARTS=compare), 800,000 messages, at the
# medians of 5 runs measured with the load average at 6-17 (100 KB: Pepsi
# 194-254 msg/s, Postfix+OpenDKIM 102-115; 2 KB: Pepsi 400-1,100,
# Postfix 110-195): about 46 minutes for the two 100 KB cases and 25 for
# the 2 KB ones, two thirds of it Postfix's side, plus a minute of
# start-up; on a quiet machine Postfix's rate, hence the time, is better.
# For a
# quick look at the ratios: BENCH_MESSAGES=2000 (about a tenth of that);
# one case: BENCH_SIZES=102400 BENCH_ALGORITHMS=rsa-sha256 BENCH_PARTS=compare,
# or any of them: BENCH_CASES="rsa-sha256/102400 ed25519-sha256/102400"
# (shell patterns of ALGORITHM/SIZE: "*/102400" is both 100 KB cases).
# Each case prints what it took, and the run what the issue's full size of
# the cases it ran would take at its medians.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
sizes=${BENCH_SIZES:-2048 102400}
algorithms=${BENCH_ALGORITHMS:-rsa-sha256 ed25519-sha256}
relay_workers=${BENCH_RELAY_WORKERS:-20}
# The signing stage may be fused with the relay that follows it (both
# Load::Full, one binary): it gets as many workers as the relay.
sign_workers=${BENCH_SIGN_WORKERS:-$relay_workers}
# Route is bench/relay's (2 workers of up to 256 rows): the signing stage
# and the relay run fused in its pass (they load late, docs/architecture.md
# 3.4), so on a loaded machine the rate of a slow case (RSA-2048, 100 KB)
# follows what CPU its 2 workers get.  One run, load average ~30, 100 KB
# RSA-2048: 63 msg/s with 2 x 256, 220 with 20 workers of 16 rows, the same
# CPU per message; but 20 x 16 doubled the CPU per message at 2 KB (more,
# smaller batches).  BENCH_ROUTE_WORKERS and BENCH_ROUTE_QUEUE change it.
# Under load the 100 KB rate is bimodal: runs that keep up (300-600 msg/s,
# 1.5-2.1 CPU ms/msg) and runs where route falls behind (50-100 msg/s,
# 3.3-4 ms/msg: 100-180 rows in flight on its 1-2 workers, over 1,000
# pending at init, the loads' statements 10-30 ms a call for want of CPU,
# their plans index scans).  Letting route's pool grow to the relay's
# PARALLELISM when it runs the relay fused (tried: 20 route workers, the
# same backlog) cost 1.25-2.2x the CPU per message at 100 KB and 1.27x at
# 2 KB without raising the rate, so the dispatcher does not do it.
route_workers=${BENCH_ROUTE_WORKERS:-2}
route_queue=${BENCH_ROUTE_QUEUE:-256}
# compare, cost or both (default): the side-by-side runs, the cost runs.
parts=${BENCH_PARTS:-both}
bin="$bench_top/build/bin"
log=$(bench_log dkim-sign)

bench_postfix_install
command -v /usr/sbin/opendkim >/dev/null || {
    echo "installing opendkim"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq opendkim >/dev/null
}
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-dkim-sign \
    pepsi-stage-relay-to-smarthost pepsi-keys

postfix_dir= opendkim_pid=

stop_sides() {
    bench_pepsi_stop
    bench_stop_pid "$opendkim_pid"
    opendkim_pid=
    if [ -n "$postfix_dir" ]; then
        bench_postfix_stop "$postfix_dir"
        postfix_dir=
    fi
}

cleanup() {
    stop_sides
    bench_cleanup
}

# Autovacuum on, as any cluster a postmaster runs has it: a run of 20,000
# messages churns the queue table through some 60,000 dead row versions,
# and without ANALYZE the statements planned while it was empty keep
# plans that scan it whole (measured: 110 msg/s against 500 with it on).
# BENCH_STATEMENTS=1: Pepsi's statements by calls and time per message
# over each Pepsi run (pg_stat_statements, into the log).
if [ "${BENCH_STATEMENTS:-0}" = 1 ]; then
    bench_cluster_start "max_connections = 200" "autovacuum = on" "autovacuum_naptime = 1s" \
        "shared_preload_libraries = 'pg_stat_statements'" "pg_stat_statements.track_utility = off"
    bench_psql -c "CREATE EXTENSION pg_stat_statements" >/dev/null
else
    bench_cluster_start "max_connections = 200" "autovacuum = on" "autovacuum_naptime = 1s"
fi
trap cleanup EXIT

sink_port=$(bench_free_port)
bench_sink_start "$sink_port"
relay_to=$sink_port

# One key per algorithm, the same for both sides: each side's copy
# readable by its signer alone (the dispatcher's user, opendkim).
keys="$BENCH_DIR/keys"
opendkim_keys="$BENCH_DIR/opendkim-keys"
mkdir -p "$keys"
for a in $algorithms; do
    "$bin/pepsi-keys" generate -a "$a" -o "$keys/$a.pem" >/dev/null
done
cp -a "$keys" "$opendkim_keys"
give_to_user "$keys"
chown -R opendkim: "$opendkim_keys" 2>/dev/null || true

# start_pepsi ALGORITHM SIGN(yes|no): bench/relay's graph, with the
# signing stage between route and relay when SIGN is yes.
start_pepsi() {
    local algorithm=$1 sign=$2 remote=smarthost
    pepsi_port=$(bench_free_port)
    [ "$sign" = yes ] && remote=sign
    bench_pepsi_start "$pepsi_port" "[dkim-key-bench]
DOMAIN = example.org
SELECTOR = bench
ALGORITHM = $algorithm
KEY_FILE = $keys/$algorithm.pem
[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = pepsi.bench.test
LOCAL_STAGE = smarthost
REMOTE_STAGE = $remote
PARALLELISM = $route_workers
QUEUE_LIMIT = $route_queue
[stage-sign]
PROGRAM = pepsi-stage-dkim-sign
NEXT_STAGE = smarthost
PARALLELISM = $sign_workers
QUEUE_LIMIT = 4
[stage-smarthost]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$relay_to
TLS = none
PARALLELISM = $relay_workers
QUEUE_LIMIT = 4" "MAX_SIZE = 10485760"
}

# start_postfix ALGORITHM: opendkim signing as Postfix's milter.
start_postfix() {
    local algorithm=$1 milter_port
    milter_port=$(bench_free_port)
    postfix_port=$(bench_free_port)
    cat >"$BENCH_DIR/opendkim.conf" <<CONF
Mode                s
Domain              example.org
Selector            bench
KeyFile             $opendkim_keys/$algorithm.pem
SignatureAlgorithm  $algorithm
Canonicalization    relaxed/relaxed
OversignHeaders     From,To,Subject,Date
Socket              inet:$milter_port@127.0.0.1
UserID              opendkim
RequireSafeKeys     false
Syslog              no
Background          no
PidFile             $BENCH_DIR/opendkim.pid
CONF
    /usr/sbin/opendkim -f -x "$BENCH_DIR/opendkim.conf" 2>>"$BENCH_DIR/opendkim.log" &
    opendkim_pid=$!
    bench_wait_port "$milter_port" "opendkim (see $BENCH_DIR/opendkim.log)"
    postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
    bench_postfix_start "$postfix_dir" "$postfix_port" "relayhost = [127.0.0.1]:$relay_to" \
        "smtpd_milters = inet:127.0.0.1:$milter_port" "milter_default_action = tempfail" \
        "message_size_limit = 10485760"
}

# CPU milliseconds used so far by each PID's process tree (bench/relay/cpu-time.pl).
cpu_ms() { perl "$here/../relay/cpu-time.pl" "$@"; }
postgres_pid() { head -1 "$BENCH_DIR/data/postmaster.pid"; }
postfix_master() { head -1 "$postfix_dir/spool/pid/master.pid" | tr -d ' '; }
# side_cpu SIDE: the CPU time so far of the processes of one side: Pepsi
# with its PostgreSQL, or Postfix with OpenDKIM.
side_cpu() {
    if [ "$1" = pepsi ]; then
        cpu_ms "$(postgres_pid)" "$BENCH_INGRESS_PID" "$BENCH_DISPATCH_PID" | awk '{ print $1 + $2 + $3 }'
    else
        cpu_ms "$(postfix_master)" "$opendkim_pid" | awk '{ print $1 + $2 }'
    fi
}

# Pepsi's own processes (ingress, dispatcher, stages) without PostgreSQL.
pepsi_own_cpu() { cpu_ms "$BENCH_INGRESS_PID" "$BENCH_DISPATCH_PID" | awk '{ print $1 + $2 }'; }
# The machine's idle and total CPU time so far (/proc/stat, clock ticks):
# the share left idle during a run says whether its rate was bound by CPU.
machine_cpu() { awk '$1 == "cpu" { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }

# measure SIDE PORT SIZE: prints msg/s from the first message sent to the
# last received, then the CPU milliseconds per message of the side and of
# the harness (smtp-source and smtp-sink), and for Pepsi the WAL bytes per
# message.  The harness's share says whether it, and not the MTA, could be
# the limit.
measure() {
    local side=$1 port=$2 size=$3 base start end side0 side1 sink0 sink1 wal0 wal1=0 source_ms pepsi0 idle0 total0 idle1 total1
    base=$(bench_sink_count)
    base=${base:-0}
    side0=$(side_cpu "$side")
    [ "$side" = pepsi ] && pepsi0=$(pepsi_own_cpu)
    read -r idle0 total0 < <(machine_cpu)
    sink0=$(cpu_ms "=$BENCH_SINK_PID")
    [ "$side" = pepsi ] && wal0=$(bench_psql -tA -c "SELECT pg_current_wal_insert_lsn() - '0/0'")
    start=$(date +%s.%N)
    /usr/bin/time -f '%U %S' -o "$BENCH_DIR/source.time" /usr/sbin/smtp-source -d -s "$sessions" -m "$messages" -l "$size" \
        -f sender@example.org -t rcpt@example.net "127.0.0.1:$port" >>"$log" 2>&1
    for _ in $(seq 1 24000); do
        [ "$(bench_sink_count)" -ge $((base + messages)) ] && break
        sleep 0.05
    done
    end=$(date +%s.%N)
    [ "$(bench_sink_count)" -ge $((base + messages)) ] || {
        echo "only $(( $(bench_sink_count) - base )) of $messages reached smtp-sink" >&2
        return 1
    }
    read -r idle1 total1 < <(machine_cpu)
    awk -v i="$((idle1 - idle0))" -v t="$((total1 - total0))" 'BEGIN { printf "%.0f\n", t ? 100 * i / t : 0 }' \
        >"$BENCH_DIR/measure.idle"
    side1=$(side_cpu "$side")
    [ "$side" = pepsi ] && awk -v a="$pepsi0" -v b="$(pepsi_own_cpu)" -v n="$messages" \
        'BEGIN { printf "%.2f\n", (b - a) / n }' >"$BENCH_DIR/measure.pepsi-own"
    sink1=$(cpu_ms "=$BENCH_SINK_PID")
    [ "$side" = pepsi ] && wal1=$(bench_psql -tA -c "SELECT pg_current_wal_insert_lsn() - '0/0' - $wal0")
    source_ms=$(awk '{ printf "%.0f", ($1 + $2) * 1000 }' "$BENCH_DIR/source.time")
    awk -v n="$messages" -v a="$start" -v b="$end" -v s="$((side1 - side0))" -v h="$((source_ms + sink1 - sink0))" \
        -v w="$wal1" 'BEGIN { printf "%.1f %.2f %.2f %.0f\n", n / (b - a), s / n, h / n, w / n }'
}

# case_selected ALGORITHM SIZE: is the case ALGORITHM/SIZE one BENCH_CASES
# names (shell patterns, e.g. "*/102400" or "rsa-sha256/2048"; default all)?
case_selected() {
    local pattern patterns
    read -ra patterns <<<"${BENCH_CASES:-*}" # (split, but not globbed against files)
    for pattern in "${patterns[@]}"; do
        # shellcheck disable=SC2254
        case "$1/$2" in $pattern) return 0 ;; esac
    done
    return 1
}

pepsi_reset() {
    bench_queue_empty
    [ "${BENCH_STATEMENTS:-0}" = 1 ] && bench_psql -c "SELECT pg_stat_statements_reset()" >/dev/null
    return 0
}
# With BENCH_STATEMENTS=1: the run's statements per message, into the log.
statements() {
    [ "${BENCH_STATEMENTS:-0}" = 1 ] || return 0
    bench_psql -c "SELECT round(calls::numeric / $messages, 3) AS per_message,
                          round(total_exec_time::numeric / calls, 3) AS mean_ms,
                          round(total_exec_time::numeric / $messages, 3) AS ms_per_message,
                          round(wal_bytes::numeric / $messages) AS wal_per_message,
                          left(regexp_replace(query, '\s+', ' ', 'g'), 100) AS query
                   FROM pg_stat_statements WHERE calls > $messages / 100 ORDER BY total_exec_time DESC" >>"$log"
}
pepsi_left() { bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue"; }
spread() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s..%s", lo, hi }'; }

# Both sides must really sign: before the runs of an algorithm, one
# message through each goes to a second sink that writes what it receives,
# and must carry a DKIM-Signature of that algorithm for d=example.org.
check_signed() {
    local algorithm=$1 dir="$BENCH_DIR/check-$algorithm" dump_port dump_pid n
    mkdir -p "$dir"
    chmod 777 "$dir"
    dump_port=$(bench_free_port)
    /usr/sbin/smtp-sink -u "$PEPSI_USER" -d "$dir/%M." "127.0.0.1:$dump_port" 16 >/dev/null 2>&1 &
    dump_pid=$!
    bench_wait_port "$dump_port" "the checking smtp-sink"
    relay_to=$dump_port
    start_pepsi "$algorithm" yes
    start_postfix "$algorithm"
    /usr/sbin/smtp-source -m 1 -l 2048 -f sender@example.org -t rcpt@example.net "127.0.0.1:$pepsi_port"
    /usr/sbin/smtp-source -m 1 -l 2048 -f sender@example.org -t rcpt@example.net "127.0.0.1:$postfix_port"
    for _ in $(seq 1 200); do
        [ "$(find "$dir" -type f | wc -l)" -ge 2 ] && break
        sleep 0.1
    done
    stop_sides
    bench_stop_pid "$dump_pid"
    relay_to=$sink_port
    n=$(grep -l "^DKIM-Signature: .*a=$algorithm" -r "$dir" | xargs -r grep -l "d=example.org" | wc -l)
    if [ "$n" -ne 2 ]; then
        echo "$algorithm: $n of the 2 checked messages carry a signature of that algorithm (see $dir)" >&2
        grep -h "^DKIM-Signature" -r "$dir" >&2 || true
        return 1
    fi
    echo "$algorithm: both sides sign (a=$algorithm, d=example.org)"
}

echo "bench/dkim-sign: smtp-source -s $sessions -m $messages, sizes: $sizes; algorithms: $algorithms;" \
    "$repeats runs each side, alternating"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
summary=()
# The issue's full size for the compare part, estimated from each case's
# medians: 20,000 messages a run, 5 runs a side (seconds).
full_compare_seconds=0
[ "$parts" = cost ] && algorithms_compared= || algorithms_compared=$algorithms
for algorithm in $algorithms_compared; do
    case_sizes=
    for size in $sizes; do
        ! case_selected "$algorithm" "$size" || case_sizes+=" $size"
    done
    [ -n "$case_sizes" ] || continue
    check_signed "$algorithm"
    for size in $case_sizes; do
        case_started=$SECONDS
        start_pepsi "$algorithm" yes
        start_postfix "$algorithm"
        pepsi_rates=() postfix_rates=() pepsi_cpus=() postfix_cpus=()
        for ((r = 1; r <= repeats; r++)); do
            pepsi_reset
            read -r rate cpu harness wal < <(measure pepsi "$pepsi_port" "$size")
            statements
            left=$(pepsi_left)
            [ "$left" -eq 0 ] || echo "warning: $left rows left in Pepsi's queue" >&2
            sync
            read -r rate_pf cpu_pf harness_pf _ < <(measure postfix "$postfix_port" "$size")
            pepsi_rates+=("$rate") postfix_rates+=("$rate_pf") pepsi_cpus+=("$cpu") postfix_cpus+=("$cpu_pf")
            printf '%s %6s B run %d: pepsi %s msg/s, postfix+opendkim %s msg/s;' \
                "$algorithm" "$size" "$r" "$rate" "$rate_pf"
            printf ' CPU ms/msg pepsi %s (harness %s, WAL %s B/msg), postfix+opendkim %s (harness %s)\n' \
                "$cpu" "$harness" "$wal" "$cpu_pf" "$harness_pf"
        done
        stop_sides
        pm=$(bench_median "${pepsi_rates[@]}")
        fm=$(bench_median "${postfix_rates[@]}")
        summary+=("$(printf '%-15s %7s B  pepsi %8s msg/s (%s)  postfix+opendkim %8s msg/s (%s)  ratio %s;  CPU ms/msg %s vs %s;  %d s' \
            "$algorithm" "$size" "$pm" "$(spread "${pepsi_rates[@]}")" "$fm" "$(spread "${postfix_rates[@]}")" \
            "$(awk -v a="$pm" -v b="$fm" 'BEGIN { printf "%.2f", a / b }')" \
            "$(bench_median "${pepsi_cpus[@]}")" "$(bench_median "${postfix_cpus[@]}")" $((SECONDS - case_started)))")
        echo "$algorithm $size B: the case took $((SECONDS - case_started)) s"
        full_compare_seconds=$(awk -v t="$full_compare_seconds" -v a="$pm" -v b="$fm" \
            'BEGIN { printf "%.0f", t + 5 * 20000 * (1 / a + 1 / b) }')
    done
done

# The signing stage's cost in bench/relay's graph (2 KB): each run, the
# graph without signing, then with the signing stage for each of ALGORITHMS,
# one after the other (so that each pair shares the machine's load of the
# moment); the load average at each run's start is printed with it.
#
# Signing runs inside route's pass; the signing stage's own workers take
# only the rows a route pass leaves them when it has run for a second
# (common/runtime/stage.c, stage_late_fusion), which happens under heavy load.  A
# run that signed any message there says how many: on this shared machine
# those were the slow runs (one loaded 5-run set, RSA-2048: 781, 1406, 128,
# 184 and 0 messages signed outside route's pass at 363, 289, 514, 404 and
# 666 msg/s), and with them PostgreSQL's CPU per message rose too (0.6-0.8
# ms against 0.45); with 2 signing workers of 16 rows instead of 20 of 4
# they still came (3,240 messages, 188 msg/s), so the count is a symptom
# of slow passes more than their cause.
cost_variants="none $algorithms"
declare -A cost_rates=() cost_cpus=() cost_pepsi_cpus=() cost_idles=()
[ "$parts" = compare ] && cost_runs=0 || cost_runs=$repeats
for ((r = 1; r <= cost_runs; r++)); do
    line="relay graph run $r:"
    for variant in $cost_variants; do
        if [ "$variant" = none ]; then start_pepsi "${algorithms%% *}" no; else start_pepsi "$variant" yes; fi
        pepsi_reset
        load=$(cut -d' ' -f1 /proc/loadavg)
        read -r rate cpu _ _ < <(measure pepsi "$pepsi_port" 2048)
        pepsi_cpu=$(cat "$BENCH_DIR/measure.pepsi-own")
        idle=$(cat "$BENCH_DIR/measure.idle")
        statements
        stop_sides
        # Signing runs inside route's pass (fused); a message signed by the
        # signing stage's own workers instead is claimed, loaded and
        # committed once more, and has its relay fused into the sign pass:
        # counted (from the dispatcher's totals, complete once it stopped).
        own=$(bench_psql -tA -c "SELECT coalesce(sum(fused_hops), 0) FROM pepsi.stage_stats WHERE stage = 'sign'")
        outside=$((own - ${own_before:-0}))
        own_before=$own
        cost_rates[$variant]+=" $rate" cost_cpus[$variant]+=" $cpu" cost_pepsi_cpus[$variant]+=" $pepsi_cpu" cost_idles[$variant]+=" $idle"
        line+=" $([ "$variant" = none ] && echo "without signing" || echo "$variant") $rate msg/s (CPU ms/msg $cpu, of it Pepsi's processes $pepsi_cpu; CPU idle $idle%; load $load"
        [ "$outside" -eq 0 ] || line+="; $outside signed outside route's pass"
        line+=");"
    done
    echo "${line%;}"
done

# Whether the relay ran fused into the signing stage's pass (one load and
# one commit for both), as the dispatcher counted it over every run.
echo
echo "pepsi.stage_stats over all runs (messages run at each stage, hops fused into its passes):"
bench_psql -c "SELECT stage, messages, fused_hops FROM pepsi.stage_stats ORDER BY stage"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "took $SECONDS s"
[ "$full_compare_seconds" -eq 0 ] || echo "at these medians the issue's full size of these cases" \
    "(BENCH_MESSAGES=20000 BENCH_REPEATS=5) would measure for about $((full_compare_seconds / 60)) min"
echo "medians of $repeats runs (min..max), $messages messages each, Pepsi as $BENCH_PEPSI_FLAVOUR:"
[ ${#summary[@]} -eq 0 ] || printf '  %s\n' "${summary[@]}"
[ ${#summary[@]} -eq 0 ] || echo "  target: pepsi/postfix+opendkim >= 2.00"
if [ "$cost_runs" -gt 0 ]; then
    # shellcheck disable=SC2086 # the lists are space-separated numbers
    plain=$(bench_median ${cost_rates[none]})
    # shellcheck disable=SC2086
    printf '  relay graph, 2 KB, without signing: %s msg/s (%s), CPU ms/msg %s (Pepsi processes %s, the rest PostgreSQL), CPU idle %s%%\n' \
        "$plain" "$(spread ${cost_rates[none]})" "$(bench_median ${cost_cpus[none]})" "$(bench_median ${cost_pepsi_cpus[none]})" \
        "$(bench_median ${cost_idles[none]})"
    for algorithm in $algorithms; do
        # shellcheck disable=SC2086
        signed=$(bench_median ${cost_rates[$algorithm]})
        # shellcheck disable=SC2086
        printf '  relay graph, 2 KB, with %s signing: %s msg/s (%s), CPU ms/msg %s (Pepsi processes %s), CPU idle %s%%: cost %s%% (target <= 25%%)\n' \
            "$algorithm" "$signed" "$(spread ${cost_rates[$algorithm]})" "$(bench_median ${cost_cpus[$algorithm]})" \
            "$(bench_median ${cost_pepsi_cpus[$algorithm]})" "$(bench_median ${cost_idles[$algorithm]})" "$(awk -v a="$plain" -v b="$signed" 'BEGIN { printf "%.1f", 100 * (a - b) / a }')"
    done
fi
