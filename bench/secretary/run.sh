#!/usr/bin/env bash
# bench/secretary: what the confirm-to-send secretary costs.  The same
# graph with and without pepsi-stage-check-whitelist, side by side:
#
#   secretary  pepsi-ingress -> init (route) -> secretary
#              (pepsi-stage-check-whitelist) -> done (pepsi-stage-discard);
#              its challenges injected at "challenges" (discard)
#   plain      pepsi-ingress -> init (route) -> done
#
# BENCH_MESSAGES messages (default 20000) of 2 KB from BENCH_SENDERS senders
# (default 2000, the same number each, sender<N>@senders.bench.test, whose
# SPF record passes 127.0.0.1: every sender is proven) to BENCH_USERS
# addresses (default 100, user<N>@local.bench.test; sender N writes to user
# N % USERS), sent by Postfix's smtp-source over BENCH_SESSIONS parallel
# sessions (default 20), one recipient a message.  On the secretary side
# every address has WHITELIST on (a domain row of pepsi.settings) and a
# tenth of the senders (N % 10 = 0) are on their address's whitelist:
# their mail passes to done, the rest is held, and each of those senders is
# sent one challenge.  The time runs from the first message sent until no
# row is left that is not held: every message taken by ingress and
# decided (held, or passed and discarded).  The sides alternate (secretary,
# plain, ...), BENCH_REPEATS times (default 5), on one durable cluster
# (bench/lib.sh), the queue and the secretary's held mail emptied before
# each run.  Printed: each run's rates and challenges sent, then the
# medians in messages per second with the spread, the ratio
# secretary/plain (target: >= 0.80, the secretary costing at most 20%),
# and the load average before and after, with the passes by stage in the
# log (pepsi.stage_stats: fused_hops at init are the rows route's pass
# took on, to check-whitelist or discard).  With BENCH_CPU_SPLIT=1 also
# each run's CPU a message, which the machine's load does not change as
# it changes the rates: the stage workers, the dispatcher and their
# backends (what the secretary adds), ingress and its backends, the rest
# of the cluster, by process into the log (cpu-split.pl, sampled every
# half second beside the run), with the WAL bytes a message.  Off by
# default: the sampling costs both sides CPU (a psql and a perl a half
# second), so the rates are measured without it.
#
# Figures (the issue's full count, PGBIN of the branch's extension, with
# pepsi.secretary_decide_many set-based), 2026-12-07: taken beside another
# long benchmark running in the background (about a core) on a machine
# shared with builds and tests; rounds of one run a side (secretary, then
# plain), the lock released between them; only 3 rounds of the 5 asked
# finished before the deadline:
#   round 1 (load 29-41): secretary 51.8 msg/s, plain 68.4, ratio 0.76
#   round 2 (load 35-21): secretary 184.9 msg/s, plain 155.7, ratio 1.19
#   round 3 (load 16-20): secretary 172.2 msg/s, plain 191.2, ratio 0.90
#   medians: secretary 172.2 msg/s (51.8 .. 184.9), plain 155.7
#   (68.4 .. 191.2); ratio 0.90 (0.76 .. 1.19), target >= 0.80
# Every run held 18,000 messages and sent 1,800 challenges (one a sender
# not whitelisted).  Before (at load 15): median 0.66 (0.61, 0.66, 0.83).
# Where the call's time went (BENCH_STATEMENTS=all, 2,000 messages): a
# workqueue_commit a held row was 31% of it; set-based, the holds are one
# statement a batch and 13%.  What remains is mostly the pair's challenge
# insert waiting for the batch that opened it, and ingress accepting more
# slowly beside the decisions (the two cores are shared with it).
#
# CPU a message, 2026-12-07 (branch secspeed; BENCH_MESSAGES=6000
# BENCH_SENDERS=600, one round a side, base = main's binaries at 7ba48ec,
# new = f561525, run back to back under the lock): stage workers,
# dispatcher and their backends, secretary / plain side:
#   load 34 (06:30): base 1.233 / 0.270 ms, new 1.045 / 0.395 ms; WAL
#     10,291 -> 8,515 bytes a message on the secretary side; route's
#     pass took 2,542 of 6,000 rows on to check-whitelist before (the
#     rest advanced unfused once a batch had run its second, to be
#     claimed, loaded and committed again), 4,502 after
#   load 7 (06:35): base 0.942 / 0.358 ms, new 0.803 / 0.377 ms; WAL
#     7,860 -> 7,045; fused 5,475 of 6,000 before, all 6,000 after
# So the secretary's own cost (secretary side less plain side) went from
# 0.96 to 0.65 ms a message at load 34 and from 0.58 to 0.43 at load 7.
# Then the full count at f561525, 3 rounds (06:38-06:41, load 12 to 20,
# builds and tests of others niced beside it): secretary 468.0 msg/s
# (407.8 .. 506.3), plain 592.2 (572.4 .. 619.1), ratio 0.82 at the
# median (0.69, 0.82, 0.82; the 0.69 round's decisions ended 9.6 s after
# its last acceptance); CPU a message of the stages side 1.060 ms
# (0.991 .. 1.087) against plain's 0.362 (0.336 .. 0.366), ingress 0.813
# / 0.805; WAL 7,403 / 4,526 bytes; route's pass fused 95% or more of
# the rows (19,614 to 21,074 hops of 22,000).  Before (05:27-05:31, a
# quiet machine, 5 rounds): 0.78 (0.74 .. 0.87).
# What remains a held row: its hold (a non-HOT update of the queue row,
# four index entries), its secretary_held row, and a tenth of a
# challenge (a new message, injected and discarded).
#
# Quiet runs, 2026-12-07, everything else paused or stopped, 5 rounds:
#   7ba48ec (05:27-05:31): secretary 773.7 msg/s (703.9..804.1), plain
#     945.9 (925.8..1024.7), ratio median 0.78 (0.74..0.87)
#   ba4d206 (06:54-06:59, with the late-fusion bound): secretary 645.2
#     (589.7..703.7), plain 747.0 (541.6..894.2), ratio median 0.79
#     (0.78, 0.79, 0.79, 0.90, 1.12); CPU ms a message, secretary /
#     plain: stages and dispatch with their backends 0.928 / 0.425 in
#     round 1, ingress and its backends 0.869 / 0.993.  Both sides ran
#     slower than at 05:27 (the per-process CPU sampling runs beside them
#     now; not separated), and the target (0.80) is still missed.
#
# Profile, 2026-12-07 (BENCH_STATEMENTS=all with auto_explain and
# log_lock_waits, 6,000 messages, niced beside others' work: the times
# are waits as much as work).  Of the secretary_decide_many call's time,
# the INSERT of a pair's new challenge was about half (20 ms on average:
# waiting for another batch that had opened the same pair's challenge
# and not yet committed, while this batch's own new challenges waited
# uncommitted for others in turn), the hold's UPDATE of the queue rows
# about a sixth (a plain index scan a row; not HOT: index_status goes
# from pending to paused and every index's predicate names it), the
# secretary_held insert with its foreign-key check a twentieth.  The
# COMMITs of the batches that inject challenges (a NOTIFY) waited for
# the database-wide notification lock, held meanwhile by other
# committing sessions, ingress's among them: 671 waits over 20 ms in the
# run (a lead; see the withdrawn attempt below).  And the stage workers and their backends
# run at nice 10 (pepsi-dispatch), so while ingress and its backends
# keep the two cores busy the decisions fall behind, and the secretary
# side's time ends with the tail of that backlog ("decided after" less
# "accepted after": 4 to 10 s at the issue's size, 0.1 s on the plain
# side).  Changed (0.12, "the secretary's held row made cheaper"): a
# batch leaves the rows of a pair another batch is opening the challenge
# of (advisory lock) to be decided alone after its commit, rather than
# wait for it; workqueue_paused_due leaves out the rows held with no
# time, so a hold writes three index entries, not four.  The per-process
# CPU sampling is off by default now (BENCH_CPU_SPLIT=1).
#
# The issue's size, 5 rounds, both builds in one hold of the lock
# (08:30-08:41), the same script (no CPU sampling), on a machine loaded
# by others' niced work (load average 21 to 42: archive imports and
# builds beside it), so slower than the quiet runs above:
#   branch secspeed2 (db573c0), 08:30-08:36, load 20.6 -> 33.4:
#     secretary 607.2 msg/s (590.0..662.5), plain 805.1 (781.1..882.8),
#     ratio median 0.76 (0.82, 0.76, 0.68, 0.76, 0.70); the decisions'
#     tail 3.6 to 6.1 s
#   main 11fd102, 08:36-08:41, load 32.5 -> 42.5:
#     secretary 607.0 msg/s (558.7..635.5), plain 821.4 (786.9..900.7),
#     ratio median 0.70 (0.65, 0.70, 0.74, 0.81, 0.70); the decisions'
#     tail 4.5 to 10.3 s
# Every run held 18,000 messages and sent 1,800 challenges.  So a little
# better than main beside it, and the target (0.80) still missed under
# that load; not measured on a quiet machine.
# 2026-12-07, on another machine of the same kind (both sides slower
# than the sets above: about 400 and 470 msg/s), main with the unguessable
# order reference (aefe0fa), 5 rounds a set, under bench.lock:
#   12:41-12:50, beside another's niced profiling (load 4.1 -> 15.0):
#     secretary 383.3 msg/s (333.5..412.8), plain 470.8 (412.8..485.6),
#     ratio median 0.84 (0.86, 0.86, 0.84, 0.69, 0.82)
#   13:02-13:10, nothing else running (load 0.4 before; the run's own
#     processes 11 after): secretary 401.5 msg/s (371.1..445.9), plain
#     469.4 (452.1..536.5), ratio median 0.86 (0.86, 0.69, 0.97, 0.86,
#     0.86)
# Every run held 18,000 messages and sent 1,800 challenges.  Over the 20
# rounds of the four sets recorded here (two the day before, these two)
# the median ratio is 0.84; 3 of 20 rounds fell below 0.75 (0.69, 0.69,
# 0.71), one of them with the plain side at its fastest (536.5 msg/s),
# one with the secretary side at its slowest (333.5 msg/s).
# Where the secretary's cost is not (6,000-message rounds, load 12-25):
# not WAL flushes (pg_stat_wal: 1,303 and 1,447 syncs a secretary round,
# 1,229 and 1,273 a plain one; the holds commit unflushed in
# secretary_decide_many's batch already); WAL volume is 8.1 against 4.5
# KB a message (pg_waldump --stats: the hold's non-HOT update logs the
# whole row, about 1.8 KB, as every claim does, its status and
# claim_digest being the row's third and last columns, so log_heap_update
# saves no prefix or suffix).  Tried and withdrawn: commits without the
# flush for the recomputable stages (route, discard, check-whitelist),
# which made the plain side faster and not the secretary side; and
# toast_tuple_target = 128 on the queue (PostgreSQL toasts only rows over
# 2 KB, whatever the target: WAL bytes unchanged).
# Tried and withdrawn: the batch injecting its challenges without a
# NOTIFY (a GUC, pepsi.inject_notify) and waking the dispatcher after its
# commit in a transaction of its own, so that its COMMIT would not wait
# for the NOTIFY lock.  5 rounds (08:52-08:58, load 36 to 44): secretary
# 620.7 msg/s (579.4..689.1), plain 844.4 (836.3..891.7), ratio median
# 0.73 (0.82, 0.71, 0.73, 0.69, 0.74): not distinguishable from the
# above under the heavier load, so not kept.
#
# Quiet runs, 2026-12-07, main at 0930b10 (the secretary's changes
# above and ingress's open pipeline), nothing else running, the issue's
# size, no CPU sampling, two sets of 5 rounds back to back:
#   09:39-09:43 (load 0.8 before): secretary 943.4 msg/s
#     (887.8..1095.7), plain 1175.0 (1108.0..1271.4), ratio median 0.85
#     (0.76, 0.92, 0.85, 0.71, 0.90)
#   09:43-09:47 (load 7.4 before, the first set's): secretary 906.6
#     (744.2..940.2), plain 1040.2 (914.6..1183.4), ratio median 0.79
#     (0.79, 0.87, 0.79, 0.83, 0.76)
# Over the ten rounds: the median of the rounds' ratios 0.81 (0.71 ..
# 0.92), the ratio of the sides' medians 914.4 / 1165.9 = 0.78.  The
# decisions now end 0.07 to 0.33 s after ingress's last acceptance (3.6
# to 10 s before): what the secretary costs is the CPU and WAL flushes
# its stage takes from ingress while it accepts (ingress's open pipeline
# made the plain side faster, 747 -> 1,175 msg/s, and the same stage's
# cost a larger share of it).  The target (0.80) sits inside the
# spread: met by one set and one way of counting, missed by the others.
# With 2 workers a stage (PARALLELISM's default; 09:47-09:51): secretary
# 711.1 (634.0..881.7), plain 1093.5 (907.9..1161.3), ratio 0.67 (0.63 ..
# 0.77), the decisions 6 to 7.5 s behind: 8 stays the bench's number.
#
# Needs: postfix's smtp-source (installed if missing), pepsi-ingress,
# pepsi-dispatch and the stages built, the extension installed in the
# PostgreSQL of PGBIN.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
senders=${BENCH_SENDERS:-2000}
users=${BENCH_USERS:-100}
workers=${BENCH_SECRETARY_WORKERS:-8}
domain=local.bench.test
sender_domain=senders.bench.test
log=$(bench_log secretary)

[ $((messages % senders)) -eq 0 ] || { echo "BENCH_MESSAGES must be a multiple of BENCH_SENDERS" >&2; exit 2; }
bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-check-whitelist pepsi-stage-discard

# BENCH_STATEMENTS=1: the secretary side's statements per message over
# each run (pg_stat_statements, into the log), and how often a session
# waited for a lock (pg_locks, sampled at each poll); BENCH_STATEMENTS=all:
# the statements inside functions too.
stmt_mode=${BENCH_STATEMENTS:-0}
[ "$stmt_mode" = all ] && BENCH_STATEMENTS=1
if [ "${BENCH_STATEMENTS:-0}" = 1 ]; then
    bench_cluster_start "max_connections = 200" \
        "shared_preload_libraries = 'pg_stat_statements'" "pg_stat_statements.track_utility = off" \
        "pg_stat_statements.track = $([ "$stmt_mode" = all ] && echo all || echo top)"
    bench_psql -c "CREATE EXTENSION pg_stat_statements" >/dev/null
else
    bench_cluster_start "max_connections = 200"
fi
dns_port=$(bench_free_port)
cat >"$BENCH_DIR/zone" <<ZONE
1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.bench.test.
mx.client.bench.test. 300 IN A 127.0.0.1
$sender_domain. 300 IN TXT "v=spf1 ip4:127.0.0.1 -all"
ZONE
bench_dns_start 127.0.0.1 "$dns_port" "$BENCH_DIR/zone"
pepsi_port=$(bench_free_port)

# The secretary's state: WHITELIST on for the domain, a tenth of the senders whitelisted.
bench_psql -c "INSERT INTO pepsi.settings (address, option, value) VALUES ('@$domain', 'WHITELIST', 'yes')" \
    -c "INSERT INTO pepsi.whitelist (owner, sender, source)
        SELECT format('user%s@$domain', s % $users), format('sender%s@$sender_domain', s), 'operator'
        FROM generate_series(0, $senders - 1) s WHERE s % 10 = 0" >/dev/null

listener="MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on"
common_stages="[stage-done]
PROGRAM = pepsi-stage-discard
PARALLELISM = $workers
QUEUE_LIMIT = 256"

# start_side secretary|plain: pepsi-ingress and pepsi-dispatch with that graph.
start_side() {
    local stages
    bench_stop_pid "$BENCH_INGRESS_PID"
    bench_stop_pid "$BENCH_DISPATCH_PID"
    BENCH_INGRESS_PID= BENCH_DISPATCH_PID=
    if [ "$1" = secretary ]; then
        stages="[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = $domain
LOCAL_STAGE = secretary
REMOTE_STAGE = done
PARALLELISM = $workers
QUEUE_LIMIT = 256
[stage-secretary]
PROGRAM = pepsi-stage-check-whitelist
NEXT_STAGE = done
REPLY_STAGE = challenges
MAX_CHALLENGES_PER_HOUR = 100000
PARALLELISM = $workers
QUEUE_LIMIT = 256
[stage-challenges]
PROGRAM = pepsi-stage-discard
PARALLELISM = 2
$common_stages"
    else
        stages="[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = $domain
LOCAL_STAGE = done
REMOTE_STAGE = done
PARALLELISM = $workers
QUEUE_LIMIT = 256
$common_stages"
    fi
    bench_pepsi_start "$pepsi_port" "$stages" "$listener" "DNS_FORWARDER = 127.0.0.1@$dns_port"
}

# send: each sender's share in one smtp-source session, the senders spread
# over SESSIONS parallel loops.
send() {
    local per_sender=$((messages / senders)) s n pids=()
    for ((s = 0; s < sessions; s++)); do
        (
            for ((n = s; n < senders; n += sessions)); do
                /usr/sbin/smtp-source -d -s 1 -m "$per_sender" -l 2048 -f "sender$n@$sender_domain" \
                    -t "user$((n % users))@$domain" "127.0.0.1:$pepsi_port"
            done
        ) >>"$log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
}

# Rows not yet decided: anything but a held row (and a challenge on its way).
undecided() {
    bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue
        WHERE NOT (status = 'paused' AND timeout = 'infinity') AND stage <> 'challenges'"
}

# cpu_snapshot FILE: CPU so far by who spent it (cpu-split.pl: each
# backend by its application_name, each stage worker, ingress, the
# dispatcher, the cluster's whole tree) and the WAL position, appended to
# FILE after a "snapshot" line.
cpu_snapshot() {
    local backends
    backends=$(bench_psql -tA -F= -c "SELECT pid, coalesce(nullif(application_name, ''), backend_type)
        FROM pg_stat_activity WHERE pid <> pg_backend_pid()") || return 0
    {
        echo snapshot
        # shellcheck disable=SC2046 # one PID=GROUP word a backend
        perl "$here/cpu-split.pl" "$(head -1 "$BENCH_DIR/data/postmaster.pid")" "$BENCH_INGRESS_PID" \
            "$BENCH_DISPATCH_PID" $(tr ' ' '_' <<<"$backends")
        printf 'total\twal\t\t%s\n' "$(bench_psql -tA -c "SELECT pg_current_wal_insert_lsn() - '0/0'")"
    } >>"$1"
}
# cpu_sampler FILE: cpu_snapshot every half second, so that a worker
# recycled during the run (MAX_MESSAGES) and its backend keep all but
# the last half second of their time.
# Stopped by creating FILE.stop (not by a signal, which could cut a
# snapshot short).
cpu_sampler() {
    while sleep 0.5 && [ ! -e "$1.stop" ]; do cpu_snapshot "$1"; done
}
# cpu_report FILE SIDE: the run's CPU per message by group (each pid's
# last figure less its first, 0 for a pid born in the run) into the log,
# and prints "stages ingress other wal": the milliseconds a message of
# the stage workers, the dispatcher and their backends; of ingress and
# its backends; of the rest of the cluster (WAL writer, checkpointer,
# autovacuum, the bench's own psql); and the WAL bytes a message.
cpu_report() {
    awk -F'\t' -v n="$messages" -v side="$2" -v logfile="$log" -v hz="$(getconf CLK_TCK)" '
        $1 == "snapshot" { snap++; next }
        $1 == "pid" { key = $2 SUBSEP $3; group[key] = $3; last[key] = $4
                      if (snap == 1) first[key] = $4; next }
        $1 == "total" { if (snap == 1) tfirst[$2] = $4; tlast[$2] = $4 }
        END {
            for (k in last) { d = last[k] - first[k]; by[group[k]] += d
                              if (group[k] ~ /^backend /) backends += d }
            by["dispatch"] = tlast["dispatch"] - tfirst["dispatch"]
            by["ingress"] = tlast["ingress"] - tfirst["ingress"]
            by["postgres other"] = tlast["postgres"] - tfirst["postgres"] - backends
            for (g in by) {
                ms = by[g] * 1000 / hz
                printf "  %-60s %8.3f ms/message\n", side ": " g, ms / n >>logfile
                if (g ~ /^ingress$|^backend pepsi-ingress/) ingress += ms
                else if (g ~ /^dispatch$|^worker |^backend pepsi-/) stages += ms
                else other += ms }
            wal = tlast["wal"] - tfirst["wal"]
            printf "  %s: WAL %.0f bytes/message\n", side, wal / n >>logfile
            printf "%.3f %.3f %.3f %.0f\n", stages / n, ingress / n, other / n, wal / n }' "$1"
}

# measure: prints "rate accepted decided stages_ms ingress_ms other_ms
# wal_bytes" (msg/s, s, s, the CPU milliseconds a message of cpu_report's
# groups, WAL bytes a message; those four "-" without BENCH_CPU_SPLIT=1).
cpu_split=${BENCH_CPU_SPLIT:-0}
measure() {
    local start sent end n=1 failed sampler= cpu_pid= cpu="- - - -"
    if [ "${BENCH_STATEMENTS:-0}" = 1 ]; then
        for _ in $(seq 1 6000); do
            bench_psql -tA -c "SELECT count(*) FILTER (WHERE NOT granted),
                string_agg(DISTINCT locktype || ':' || mode, ' ') FILTER (WHERE NOT granted) FROM pg_locks"
            sleep 0.2
        done >>"$BENCH_DIR/locks" 2>/dev/null &
        sampler=$!
    fi
    if [ "$cpu_split" = 1 ]; then
        : >"$BENCH_DIR/cpu"
        rm -f "$BENCH_DIR/cpu.stop"
        cpu_snapshot "$BENCH_DIR/cpu"
        cpu_sampler "$BENCH_DIR/cpu" &
        cpu_pid=$!
    fi
    start=$(date +%s.%N)
    send
    sent=$(date +%s.%N)
    for _ in $(seq 1 6000); do
        n=$(undecided)
        [ "$n" -eq 0 ] && break
        failed=$(bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue WHERE status = 'failed'")
        [ "$failed" -eq 0 ] || { echo "$failed rows failed (see $BENCH_DIR/dispatch.log)" >&2; return 1; }
        sleep 0.1
    done
    end=$(date +%s.%N)
    if [ "$cpu_split" = 1 ]; then
        touch "$BENCH_DIR/cpu.stop"
        wait "$cpu_pid"
        cpu_snapshot "$BENCH_DIR/cpu"
        cpu=$(cpu_report "$BENCH_DIR/cpu" "$1")
    fi
    bench_stop_pid "$sampler"
    [ "$n" -eq 0 ] || { echo "$n rows still undecided" >&2; return 1; }
    awk -v n="$messages" -v a="$start" -v s="$sent" -v b="$end" -v cpu="$cpu" 'BEGIN {
        printf "%.1f %.2f %.2f %s\n", n / (b - a), s - a, b - a, cpu }'
}

# reset: the previous run's passes by stage (pepsi.stage_stats, flushed
# when its dispatcher stopped: fused_hops are the rows a stage's pass took
# on to the next stage) into the log, then everything emptied.
reset() {
    bench_psql -c "SELECT stage, messages, fused_hops FROM pepsi.stage_stats ORDER BY stage" >>"$log"
    bench_psql -c "TRUNCATE pepsi.secretary_held, pepsi.secretary_challenge, pepsi.stage_stats RESTART IDENTITY" >/dev/null
    bench_queue_empty
}
# With BENCH_STATEMENTS=1: the run's statements per message, into the log.
statements() {
    [ "${BENCH_STATEMENTS:-0}" = 1 ] || return 0
    bench_psql -c "SELECT round(calls::numeric / $messages, 3) AS per_message,
                          round(total_exec_time::numeric / calls, 3) AS mean_ms,
                          round(total_exec_time::numeric / $messages, 3) AS ms_per_message,
                          left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS query
                   FROM pg_stat_statements WHERE calls > $messages / 100 ORDER BY total_exec_time DESC LIMIT 25" >>"$log"
    awk -F'|' '{ n++; w += $1; if ($1 > 0) { busy++; kinds[$2]++ } }
        END { printf "lock waits: %d of %d samples saw a session waiting (%.1f waiting on average)\n", busy, n, n ? w / n : 0
              for (k in kinds) printf "  %s: %d samples\n", k, kinds[k] }' "$BENCH_DIR/locks" >>"$log"
    : >"$BENCH_DIR/locks"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench/secretary: $messages messages of 2 KB from $senders senders (every one SPF-proven, a tenth whitelisted)" \
    "to $users addresses over $sessions sessions; $repeats runs a side, alternating; $workers workers a stage"
sec_rates=() plain_rates=() ratios=() challenges=()
sec_cpu=() plain_cpu=() sec_ingress=() plain_ingress=() sec_wal=() plain_wal=()
for ((r = 1; r <= repeats; r++)); do
    start_side secretary
    reset
    [ "${BENCH_STATEMENTS:-0}" = 1 ] && bench_psql -c "SELECT pg_stat_statements_reset()" >/dev/null && : >"$BENCH_DIR/locks"
    sleep 1
    read -r rate accepted decided cpu_stages cpu_ingress cpu_other wal < <(measure secretary)
    echo "run $r: secretary side's statements:" >>"$log"
    statements
    sent_challenges=$(bench_psql -tA -c "SELECT count(*) FROM pepsi.secretary_challenge WHERE challenged_at IS NOT NULL")
    held=$(bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue WHERE status = 'paused' AND timeout = 'infinity'")
    sec_rates+=("$rate") challenges+=("$sent_challenges")
    sec_cpu+=("$cpu_stages") sec_ingress+=("$cpu_ingress") sec_wal+=("$wal")

    start_side plain
    reset
    sleep 1
    read -r rate_plain accepted_plain decided_plain cpu_stages_plain cpu_ingress_plain cpu_other_plain wal_plain < <(measure plain)
    plain_rates+=("$rate_plain")
    plain_cpu+=("$cpu_stages_plain") plain_ingress+=("$cpu_ingress_plain") plain_wal+=("$wal_plain")
    ratios+=("$(ratio "$rate" "$rate_plain")")
    printf 'run %d: secretary %s msg/s (accepted after %s s, decided after %s s; %s held, %s challenges),' \
        "$r" "$rate" "$accepted" "$decided" "$held" "$sent_challenges" | tee -a "$log"
    printf ' plain %s msg/s (accepted after %s s, done after %s s), ratio %s\n' \
        "$rate_plain" "$accepted_plain" "$decided_plain" "${ratios[-1]}" | tee -a "$log"
    [ "$cpu_split" = 1 ] || continue
    printf '  CPU ms a message: stages+dispatch and their backends %s / %s, ingress and its backends %s / %s,' \
        "$cpu_stages" "$cpu_stages_plain" "$cpu_ingress" "$cpu_ingress_plain" | tee -a "$log"
    printf ' rest of the cluster %s / %s; WAL bytes a message %s / %s (secretary / plain)\n' \
        "$cpu_other" "$cpu_other_plain" "$wal" "$wal_plain" | tee -a "$log"
done

printf '%-40s %10s msg/s (runs %s .. %s)\n' \
    "secretary (ingress -> check-whitelist)" "$(bench_median "${sec_rates[@]}")" \
    "$(min "${sec_rates[@]}")" "$(max "${sec_rates[@]}")" \
    "plain (ingress -> route -> discard)" "$(bench_median "${plain_rates[@]}")" \
    "$(min "${plain_rates[@]}")" "$(max "${plain_rates[@]}")"
printf 'challenges sent a run: median %s (runs %s .. %s; expected %s: one a sender not whitelisted)\n' \
    "$(bench_median "${challenges[@]}")" "$(min "${challenges[@]}")" "$(max "${challenges[@]}")" \
    "$((senders - (senders + 9) / 10))"
printf 'ratio secretary/plain: median %s, runs %s .. %s (target: median >= 0.80)\n' \
    "$(bench_median "${ratios[@]}")" "$(min "${ratios[@]}")" "$(max "${ratios[@]}")"
if [ "$cpu_split" = 1 ]; then
    printf 'CPU ms a message, stages+dispatch and their backends: secretary %s (%s .. %s), plain %s (%s .. %s)\n' \
        "$(bench_median "${sec_cpu[@]}")" "$(min "${sec_cpu[@]}")" "$(max "${sec_cpu[@]}")" \
        "$(bench_median "${plain_cpu[@]}")" "$(min "${plain_cpu[@]}")" "$(max "${plain_cpu[@]}")"
    printf 'CPU ms a message, ingress and its backends: secretary %s (%s .. %s), plain %s (%s .. %s)\n' \
        "$(bench_median "${sec_ingress[@]}")" "$(min "${sec_ingress[@]}")" "$(max "${sec_ingress[@]}")" \
        "$(bench_median "${plain_ingress[@]}")" "$(min "${plain_ingress[@]}")" "$(max "${plain_ingress[@]}")"
    printf 'WAL bytes a message: secretary %s, plain %s (medians)\n' \
        "$(bench_median "${sec_wal[@]}")" "$(bench_median "${plain_wal[@]}")"
fi
echo "load average: before $load_before, after $(cut -d' ' -f1-3 /proc/loadavg)"
