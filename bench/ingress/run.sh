#!/usr/bin/env bash
# bench/ingress: pepsi-ingress against a stock Postfix smtpd, side by side.
#
# Postfix's smtp-source sends SESSIONS parallel sessions, MESSAGES messages
# of 2 KB in all, one recipient each, over reused connections (-d), to:
#   pepsi:   pepsi-ingress on 127.0.0.1, admitting into a durable cluster
#            (fsync = on, synchronous_commit = on: bench/lib.sh)
#   postfix: a private Postfix instance (its own config and queue under the
#            scratch directory) whose smtpd/cleanup write and fsync every
#            message as usual; a HOLD action keeps the queue from being
#            drained, so neither side delivers anything
# alternately, BENCH_REPEATS times, and prints the medians in messages per
# second and the ratio pepsi/postfix (target: at least 5), and the CPU
# each side used a message, the client's apart.
#
# Then the group-commit choices (BENCH_VARIANTS, "connections:batch" each,
# one run each), and the resident memory of pepsi-ingress per idle session
# with IDLE_SESSIONS sessions open (target: under 64 KB).  Last, policy.sh:
# the same comparison with relay control and recipient validation on, the
# relayed share sent by authenticated sessions (STARTTLS, AUTH PLAIN).
# BENCH_PARTS=compare runs the side-by-side comparison alone (all: every
# part, the default).
#
# Measured (issue 37; 2 cores, BENCH_REPEATS=5, BENCH_PARTS=compare,
# medians with min..max, CPU ms a message of the servers' processes and
# children):
#   at 11fd102: pepsi 1,603.9 msg/s (1,415.4..1,882.3), CPU 0.34 ms;
#     postfix 694.4 (539.1..1,123.1), CPU 2.28 ms; ratio 2.31; load
#     average 27.06 23.55 13.31 (others' nice-19 builds and tests)
#   with the gathered commit (admit.c), 30f7b2a: pepsi 1,835.2 msg/s
#     (1,624.4..2,083.6), CPU 0.35 ms, smtp-source 0.08 ms; postfix
#     547.0 (540.2..1,161.6), CPU 3.05 ms, smtp-source 0.14 ms; ratio
#     3.36; load average 27.33 21.59 23.90
#   Postfix's rate and CPU a message swing by 2x from run to run (1.2 to
#   3.1 ms: at 547 msg/s it keeps 1.7 of the 2 cores busy), Pepsi's by
#   30%: the ratio moves with Postfix's runs more than with Pepsi's.
# Where a message's time goes (a profiled run, 20,000 messages, 1,528 msg/s
# before, 1,562 after): PostgreSQL 0.19-0.21 ms of CPU a message (0.16-0.18
# ms of it in pepsi.workqueue_add: 0.09-0.11 ms the INSERTs, 0.005 ms the
# foreign key's check), pepsi-ingress 0.09-0.10 ms, smtp-source 0.07 ms:
# about 0.37 ms of CPU in a message's 12.8 ms cycle (20 sessions / 1,560
# msg/s), 0.6 of the 2 cores.  Pepsi is not CPU-bound: the WAL flush took
# 3.3 ms (5.1 ms in another run: the disk is shared), and before the
# gathered commit 2,649 flushes (7.5 messages each) kept it busy 8.7 s
# of the 13 s run; after it 1,395 (14 each), 4.6 s, with no gain in rate.
# The rest is waiting to be run: during a run the others' nice-19 processes
# took 69% of the machine's CPU time (/proc/stat, 1,194 of 1,720 jiffies;
# the benchmark's own user and system time 480), and one session alone
# takes 8.9 ms a message (flush included).  Postfix spends 1.2-3.1 ms
# of CPU a message (smtpd, cleanup, trivial-rewrite and its master),
# Pepsi 0.35 ms with its backends (0.43 ms with smtp-source's share);
# at 5x Postfix's median (2,735 msg/s) a message's cycle would be 7.3 ms
# for 20 sessions, against 10.9 ms measured: one 3.3-5 ms flush plus four
# SMTP round trips, each a wake-up of smtp-source and of pepsi-ingress
# on a host whose cores are busy with other work.  5x is out of reach on
# this machine today: the limit is the flush's latency and the scheduling
# delay, not Pepsi's CPU.
#
# Quiet, 2026-12-07 10:04-10:07, main at 6e323ba, nothing else running
# (load 0.4 before), BENCH_REPEATS=5 BENCH_PARTS=compare: pepsi-ingress
# 2,786.7 msg/s (2,541.0..2,968.0), CPU 0.346 ms a message (client
# 0.083); Postfix 748.3 (643.6..1,358.7), CPU 2.374 ms (client 0.114);
# ratio 3.72.  Postfix's first run (1,358.7, 1.2 ms of CPU a message)
# is the outlier its CPU shows; without it Postfix's median is 706.
# Pepsi used 0.35 ms of CPU a message at 2,787 msg/s: about half of one
# core with its backends, so the quiet figure is bound by the flush and
# the round trips as above, not by CPU.
#
# Issue 37's earlier figures (5,709 msg/s at eb5908d, 6,555 before the
# admission sessions were niced) against today's, 2026-12-07 17:48-18:21,
# each commit built in a tree of its own and run by this script and
# bench/lib.sh as they are at 83aa7a9 (BENCH_PARTS=compare, 3 runs a set,
# sets in turn under the lock; others' nice-19 builds and tests ran
# beside, load 12-36):
#   eb5908d (bulk sessions at BULK_NICE 10): pepsi 1,019.7 msg/s
#     (988.1..1,208.5), CPU 0.389 ms; postfix 704.6 (641.1..732.4);
#     ratio 1.45; load 35.69 30.61 25.52
#   main 83aa7a9, just after: pepsi 1,772.9 (1,710.8..2,148.4), CPU 0.244
#     ms; postfix 784.8 (649.9..815.0); ratio 2.26; load 27.78
#   92742ce (the commit before 4c67cb4 niced them): pepsi 2,193.8
#     (2,055.9..2,517.1), CPU 0.334 ms; postfix 782.6 (704.7..813.9);
#     ratio 2.80; load 25.51 26.71 29.25
#   main 83aa7a9, just after: pepsi 2,177.4 (1,915.2..2,639.6), CPU 0.305
#     ms; postfix 753.4 (707.0..843.9); ratio 2.89; load 12.14
# The nice was a regression under load (eb5908d at 0.58 of main's rate in
# the next set), and d1dc749 already undid it ([ingress] BULK_NICE
# defaults to 0): in these sets main's rate is 92742ce's within the
# spread (but see the Pepsi-only runs below).  What halved is the host: Postfix's own median went
# from 1,272-1,486 msg/s then to 705-845 today, with the same
# smtp-source and the same private instance's settings.  This script's
# parameters (20 sessions, 20,000 messages of 2 KB, -d) and bench/lib.sh's
# cluster settings (fsync, synchronous_commit, full_page_writes,
# shared_buffers, max_wal_size, checkpoint_timeout, autovacuum) are
# unchanged since eb5908d.  pg_test_fsync (-s 3, in /tmp, 18:12, load
# 34): fdatasync, PostgreSQL's wal_sync_method here, 2,757 us for one 8
# kB write (362.7 ops/s), 3,001 us for two.  The flush time behind the
# earlier figures was not recorded; at 20 sessions 5,709 msg/s is a 3.5
# ms cycle a message, which today's 2.8-3 ms flush plus four round trips
# leaves no room for.
# The WAL of a Pepsi-only run (20 sessions, 20,000 messages, as above;
# track_wal_io_timing on; pg_stat_wal and pg_stat_database reset before
# each; 2 runs a commit, in turn, 18:38-18:39, load falling 18.6 -> 10.7):
#   main (4289907): 1,909.4 and 2,046.1 msg/s; 1,496 and 1,336 flushes
#     (13.4 and 15.0 messages each, 1,881 and 1,685 commits), 2.71 and
#     2.80 ms a flush, the disk flushing 4.1 s of 10.5 and 3.7 s of 9.8
#   92742ce: 2,515.4 and 2,659.6 msg/s; 3,036 and 3,048 flushes (6.6
#     each, 5,167 and 5,103 commits), 1.78 ms a flush, 5.4 s of 8.0 and
#     of 7.5
#   eb5908d: 2,323.5 and 2,514.6 msg/s; 2,576 and 2,568 flushes (7.8
#     each), 2.08 ms a flush, 5.4 s of 8.6 and of 8.0
# The gathered commit (bab2153) halves the flushes, but each carries
# twice the WAL and takes 1.5 times as long, and the disk stands idle
# 60% of the run against 30%: one gathered commit at a time, and the
# wait for the sessions it answered, leave the flush unused while the
# sessions are on their round trips.  The same in the other order
# (18:49-18:50, load 13.5 -> 9.0): 92742ce 2,661.5 and 2,918.2 msg/s
# (6.5 and 6.3 messages a flush, 1.66-1.76 ms each), then main 2,348.9
# and 2,112.7 (13.3 and 13.1 a flush, 2.18 and 2.44 ms, the disk busy
# 3.3 s of 8.5 and 3.7 s of 9.5).  Pepsi alone, main is 10-25% slower
# than 92742ce in both orders, while the compare sets above (Postfix's
# runs between Pepsi's) found them equal: the gathered commit is where
# to look next (a second batch committing while one flushes, so the
# disk is not left idle), measured with bench/fairness's five runs
# before and after; the nice is not the cause.
# So the 5x target is not met here today (3.72 quiet
# this morning, 2.26-2.89 under load now) and no change to Pepsi was made
# for it: what is left are changes to how many messages one flush
# carries (admit.c's gathered commit), each to be weighed with
# bench/fairness's five runs before and after.
#
# A second gathered commit while the first flushes (admit.c's
# admit_gather: the open batch commits at once when no gathered commit
# is in flight, and while one is, once the sessions the last one answered
# are back, so its commit waits behind that flush; at most two in
# flight), 2026-12-07, main b602daf built in a tree of its own against
# the branch (ee0603a; 20dd087 in set 2, which differs only in a closed
# session no longer being awaited), BENCH_REPEATS=5 BENCH_PARTS=compare,
# both in one hold of the lock, medians (min..max):
#   set 1, main first (21:25-21:32, load 10.4 -> 15.9, others' builds):
#     main: pepsi 3,362.0 msg/s (2,094.7..5,352.0), CPU 0.249 ms;
#       postfix 797.6 (685.2..969.7), CPU 2.170 ms; ratio 4.22
#     branch: pepsi 4,465.8 (2,909.2..4,976.1), CPU 0.223 ms; postfix
#       924.3 (767.0..979.0), CPU 1.819 ms; ratio 4.83
#   set 2, branch first (21:32-21:49, load 8.4 -> 30.2: a stress-ng on
#     both cores from 21:34 and others' builds; the branch's own TAP
#     files ran beside its runs, not beside main's):
#     branch: pepsi 1,799.0 (1,468.1..2,066.0), CPU 0.276 ms; postfix
#       772.2 (700.9..937.4), CPU 2.103 ms; ratio 2.33
#     main: pepsi 1,142.2 (956.3..1,844.4), CPU 0.400 ms; postfix 611.9
#       (510.4..1,000.4), CPU 2.659 ms; ratio 1.87
#   set 3 (22:01-22:06, load 1.95 -> 12.2): main: pepsi 2,424.7
#     (1,982.6..4,541.8), CPU 0.206 ms; postfix 788.6 (667.7..1,036.4);
#     ratio 3.07; the branch's half of the set was cut short by the
#     hold's time limit and is not recorded
# Pepsi alone (20 sessions, 20,000 messages, track_wal_io_timing on, the
# two in turn, 2 runs each, 21:16, load 8.9 -> 6.8): main 3,647.3 and
# 4,360.1 msg/s, 10.2 and 12.3 messages a flush; the branch 4,383.5 and
# 4,217.2, 8.7 and 7.1 a flush.  The flush took 0.57-0.69 ms at that hour
# (2.2-2.8 ms at 18:40, 2.8 ms in pg_test_fsync at 18:12): with the disk
# that quick it flushed only 1.0-2.0 s of a 4.6-5.5 s run on either
# side, so the gap the change closes mattered little then, and the
# rate was bound by the CPU and the round trips.  The 5x target is not
# met at these medians (4.83 the best, in set 1); the branch was ahead of
# main in both sets (1.33x and 1.58x Pepsi's median), the ratio's spread
# within a set (Pepsi 2,095..5,352 in one) larger than the gap.
#
# On a quiet machine (2026-12-08, a new host of the same size, nothing
# else running: load 0.2 before; pg_test_fsync's fdatasync 2.7 ms), main
# at 75e98eb, BENCH_REPEATS=5 BENCH_PARTS=compare, two sets, medians
# (min..max) and each run's ratio:
#   set 1 (00:35-00:37, the tail of a loaded test run before it: load
#     2.3): pepsi 5,807.6 msg/s (5,077.7..6,206.1), CPU 0.181 ms, client
#     0.044; postfix 1,124.5 (1,056.2..1,658.2), CPU 1.506 ms, client
#     0.141; ratio 5.16; runs 3.06, 5.27, 5.16, 4.76, 5.67
#   set 2 (00:46-00:48, load 0.2 before): pepsi 4,380.6 (4,282.8..5,007.9),
#     CPU 0.252 ms, client 0.055; postfix 905.7 (829.6..1,398.4), CPU
#     1.887 ms, client 0.174; ratio 4.84; runs 3.58, 5.16, 4.83, 5.35, 4.74
# Both sides spent about 30% more CPU a message in set 2 than in set 1
# (the host's other guests, which a quiet load average does not show), and
# the ratio held.  The ten runs' ratios: median 4.995 (3.06..5.67).  The
# runs far off are each set's first, both times because Postfix's first
# run is its fastest (1,658 and 1,398 msg/s at 1.0-1.2 ms of CPU a message,
# against 830-1,262 at 1.3-2.0 ms after): its first run writes into a new
# spool, the later ones into one from which 20,000 held files were just
# deleted.  Without the first runs: 5.22 and 4.995 (a hair under 5).  A
# system profile of one Pepsi run (perf record -a, 3 s) found the cores
# 33% idle (postgres 38%, pepsi-ingress 17%, smtp-source 11%): the rate
# is bound by the flush and the sessions' round trips, not by the CPU.
# Of PostgreSQL's share,
# about 4 points of all the samples are stringToNode (pg_strtok alone
# 2.6-3.2), which a call-graph profile (perf record -a -g) puts under
# ExecInitStoredGenerated (build_column_default: the generated columns
# sender_key and index_status) and ExecConstraints (the CHECK
# constraints): PostgreSQL reads them anew for every INSERT's executor
# state, and an admission is one statement a message.  What a change
# there could win is CPU, which is not what bounds the rate.
#
# Needs: postfix (installed here with debconf "No configuration" when it is
# missing, so no system instance is set up), pepsi-ingress built, the
# extension installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-3}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
idle_sessions=${BENCH_IDLE_SESSIONS:-1000}
variants=${BENCH_VARIANTS:-"4:64 1:64 20:1"}
parts=${BENCH_PARTS:-all}
case $parts in
all | compare) ;;
*) echo "BENCH_PARTS must be all or compare, not '$parts'" >&2; exit 2 ;;
esac
ingress_bin="$bench_top/build/bin/pepsi-ingress"
out_dir="$bench_top/bench/out"
mkdir -p "$out_dir"
log="$out_dir/ingress.log"
: >"$log"

bench_postfix_install
[ -x "$ingress_bin" ] || { echo "build pepsi-ingress first (make programs)" >&2; exit 1; }

bench_cluster_start "max_connections = 100"

pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)

# start_ingress CONNECTIONS BATCH: (re)start pepsi-ingress with that pool.
start_ingress() {
    local connections=$1 batch=$2 conf="$BENCH_DIR/ingress.conf"
    cat >"$conf" <<CONF
[pepsi]
HOSTNAME = bench.test
[database]
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
[ingress]
USER = $PEPSI_USER
DATABASE_CONNECTIONS = $connections
BATCH_SIZE = $batch
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $pepsi_port
MAX_SESSIONS = $((idle_sessions + 100))
MAX_SESSIONS_PER_CLIENT = 0
IDLE_TIMEOUT = 10m
CONF
    bench_ingress_start "$conf" "$connections"
}

# The private Postfix (bench/lib.sh): every accepted message is put on
# hold, written and fsynced by cleanup like any other, and never handed to
# a delivery agent.
start_postfix() {
    postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
    bench_postfix_start "$postfix_dir" "$postfix_port" \
        "smtpd_recipient_restrictions = permit_mynetworks, reject" \
        "smtpd_end_of_data_restrictions = check_client_access static:HOLD"
}

# send PORT SERVER_PID...: smtp-source's run; prints messages per second,
# then the CPU milliseconds a message the servers (the processes given and
# their children: the postmaster's backends, Postfix's master's smtpd and
# cleanup; pepsi-ingress) and smtp-source itself used.
ticks_per_second=$(getconf CLK_TCK)
server_ticks() {
    local pid total=0
    for pid in "$@"; do total=$((total + $(bench_tree_ticks "$pid"))); done
    echo "$total"
}
send() {
    local port=$1 start end ticks0 ticks1 client
    shift
    ticks0=$(server_ticks "$@")
    start=$(date +%s.%N)
    /usr/bin/time -o "$BENCH_DIR/client-time" -f '%U %S' /usr/sbin/smtp-source -d -s "$sessions" \
        -m "$messages" -l 2048 -f sender@example.org -t rcpt@example.net "127.0.0.1:$port" >>"$log" 2>&1
    client=$(tail -1 "$BENCH_DIR/client-time")
    end=$(date +%s.%N)
    ticks1=$(server_ticks "$@")
    awk -v n="$messages" -v a="$start" -v b="$end" -v t=$((ticks1 - ticks0)) -v hz="$ticks_per_second" \
        -v c="$client" 'BEGIN { split(c, u, " ")
            printf "%.1f %.3f %.3f\n", n / (b - a), 1000 * t / hz / n, 1000 * (u[1] + u[2]) / n }'
}

pepsi_rows() { bench_queue_rows; }
pepsi_reset() { bench_queue_empty; }
postfix_held() { bench_postfix_count "$postfix_dir" hold; }
postfix_reset() { bench_postfix_drop_held "$postfix_dir"; }

start_postfix
start_ingress 4 64

postmaster_pid=$(head -1 "$BENCH_DIR/data/postmaster.pid")
postfix_master_pid=$(head -1 "$postfix_dir/spool/pid/master.pid" | tr -d ' ')

echo "bench/ingress: smtp-source -s $sessions -m $messages -l 2048, $repeats runs each side, alternating"
echo "(CPU ms a message: the server's processes with their children, and smtp-source's own)"
pepsi_rates=() pepsi_cpus=() pepsi_clients=()
postfix_rates=() postfix_cpus=() postfix_clients=()
for ((r = 1; r <= repeats; r++)); do
    pepsi_reset
    read -r rate cpu client < <(send "$pepsi_port" "$BENCH_INGRESS_PID" "$postmaster_pid")
    stored=$(pepsi_rows)
    [ "$stored" -eq "$messages" ] || { echo "pepsi stored $stored of $messages" >&2; exit 1; }
    pepsi_rates+=("$rate") pepsi_cpus+=("$cpu") pepsi_clients+=("$client")
    postfix_reset
    read -r rate_pf cpu_pf client_pf < <(send "$postfix_port" "$postfix_master_pid")
    held=$(postfix_held)
    [ "$held" -eq "$messages" ] || { echo "postfix queued $held of $messages" >&2; exit 1; }
    postfix_rates+=("$rate_pf") postfix_cpus+=("$cpu_pf") postfix_clients+=("$client_pf")
    printf 'run %d: pepsi %s msg/s (CPU %s ms, client %s), postfix %s msg/s (CPU %s ms, client %s)\n' \
        "$r" "$rate" "$cpu" "$client" "$rate_pf" "$cpu_pf" "$client_pf"
done
range() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { a = $1 } { b = $1 } END { printf "%s..%s", a, b }'; }
pepsi_median=$(bench_median "${pepsi_rates[@]}")
postfix_median=$(bench_median "${postfix_rates[@]}")
printf '%-26s %10s msg/s (%s), CPU %s ms a message, client %s ms\n' \
    "pepsi-ingress (4 x 64)" "$pepsi_median" "$(range "${pepsi_rates[@]}")" \
    "$(bench_median "${pepsi_cpus[@]}")" "$(bench_median "${pepsi_clients[@]}")" \
    "postfix smtpd" "$postfix_median" "$(range "${postfix_rates[@]}")" \
    "$(bench_median "${postfix_cpus[@]}")" "$(bench_median "${postfix_clients[@]}")"
printf 'ratio pepsi/postfix: %s (target >= 5.00); load average %s\n' \
    "$(awk -v a="$pepsi_median" -v b="$postfix_median" 'BEGIN { printf "%.2f", a / b }')" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"

[ "$parts" = all ] || exit 0

echo
echo "group commit: DATABASE_CONNECTIONS x BATCH_SIZE, one run each"
for v in $variants; do
    start_ingress "${v%%:*}" "${v##*:}"
    pepsi_reset
    read -r rate _ < <(send "$pepsi_port")
    printf '%-26s %10s msg/s (%s rows)\n' "pepsi-ingress (${v%%:*} x ${v##*:})" "$rate" "$(pepsi_rows)"
done

echo
start_ingress 4 64
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$BENCH_INGRESS_PID/status"; }
# open_idle N: N idle sessions, held by a background client ($idle_pid).
open_idle() {
    perl "$here/idle-sessions.pl" 127.0.0.1 "$pepsi_port" "$1" >"$BENCH_DIR/idle.out" 2>&1 &
    idle_pid=$!
    for _ in $(seq 1 600); do
        grep -q '^ready' "$BENCH_DIR/idle.out" 2>/dev/null && break
        kill -0 "$idle_pid" 2>/dev/null || break
        sleep 0.1
    done
    grep -q '^ready' "$BENCH_DIR/idle.out" || { cat "$BENCH_DIR/idle.out" >&2; exit 1; }
}
close_idle() {
    kill "$idle_pid" 2>/dev/null || true
    wait "$idle_pid" 2>/dev/null || true
}
# A first round touches the code and the loop's tables once, so that the
# measured round counts what the sessions themselves hold.
open_idle 50
close_idle
sleep 1
before=$(rss)
open_idle "$idle_sessions"
after=$(rss)
close_idle
printf 'idle sessions: %d open, VmRSS %d kB -> %d kB: %.1f KB per session (target < 64)\n' \
    "$idle_sessions" "$before" "$after" "$(awk -v a="$before" -v b="$after" -v n="$idle_sessions" 'BEGIN { printf "%.1f", (b - a) / n }')"

echo
bench_ingress_stop
"$here/policy.sh"
