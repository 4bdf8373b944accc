#!/usr/bin/env bash
# bench/fairness: what a burst from one client does to the latency of light
# senders, end to end through `make run`'s graph (docs/pepsi.conf.sample:
# ingress -> init (route) -> forward -> vacation -> maildir).
#
# Ten light clients, each from its own loopback address (127.0.0.11-20),
# send one message every 0.5 s; one heavy client (smtp-source, 20
# sessions from 127.0.0.1) sends a burst of 20,000 messages.  Latency is
# from the start of a send to the commit that delivered the message, its
# file already in the maildir's new/ (drive.py).  Each repeat runs, after a queue reset (TRUNCATE ...
# RESTART IDENTITY, as bench/relay does):
#   light:  the light clients alone for 10 s
#   burst:  the burst alone
#   both:   the light clients, and 2 s later the burst
# (burst and both taking turns to go first, repeat by repeat)
# and prints the medians over the repeats of: the light clients' median
# and p99 latency alone and during the burst (messages sent while it was
# in flight), their largest, and the burst's throughput with and without
# them.  Targets: light median during the burst <= 2x alone, p99 < 2 s,
# burst throughput with light clients within 10% of without.
#
# Measured around pepsi-ingress's gathered commit (issue 37, admit.c),
# one repeat each (BENCH_REPEATS=1: the bench lock's queue left no time
# for more), pepsi-ingress the only program changed:
#   before (11fd102's pepsi-ingress): light median 0.0187 s alone,
#     0.0180 s during the burst (ratio 0.96), p99 0.093 s, max 0.471 s;
#     burst 236.7 msg/s alone, 191.0 with light clients (0.81; steal 7.3
#     and 8.2 s); load average 13.39 at the start, 11.39 at the end
#   after (30f7b2a): light median 0.0186 s alone, 0.0181 s during the
#     burst (ratio 0.97), p99 0.193 s, max 0.455 s; burst 203.0 msg/s
#     alone, 237.4 with light clients (1.17; steal 8.8 and 7.3 s); load
#     average 15.65 at the start, 8.93 at the end
# The light senders are new clients, stored on the express connection,
# which the gathered commit leaves alone: their median held; the p99 of
# the one run after (0.193 s) is twice the one before, within the target,
# and one run each cannot tell that from the hypervisor's steal.
#
# Where the light messages' time goes is printed beside (drive.py's file
# comment says what each part is): a trigger records, for rows of senders
# other than the burst's, when each became pending, was claimed, and moved
# on, so the claim wait and the pipeline wait are told apart per stage.
# The burst's own rows fire no trigger (its WHEN is false for them).
# And what each run cost the database per message (claims, rows per claim,
# worker commits, transactions: pg_stat_statements and pg_stat_database),
# so a change in throughput can be told from a change in work.
# And, once a second through each run, what can make a claim slow
# (sample.sql: who holds back the xmin horizon and for how long, the
# queue table's dead versions and vacuums, rows running and pending, the
# claim's server time), into bench/out/fairness.samples/REPEAT-MODE.tsv;
# the log gets each run's summary, and a run whose claims cost more than
# three times the median gets it printed with its likeliest cause.
#
# Environment: BENCH_REPEATS (5), BENCH_BURST (20000).  One repeat takes
# about 10 s of light traffic plus the burst twice; the full run prints
# how long it took.  BENCH_HOLD_SNAPSHOT=N holds a REPEATABLE READ snapshot
# open for the first N seconds of each "both" run, as a report left open
# would: what the queue must survive.  BENCH_STEAL_MAX (1): a repeat
# with more seconds of steal than this in either of its burst runs is
# named in the summary, and the others' ratio given beside.
# Recorded 2026-12-07, 5317a5e (issue 37: the light senders' latency),
# 5 repeats in two holds of the lock: BENCH_REPEATS=3 (14:57-15:14, load
# 29.9 -> 14.4) then BENCH_REPEATS=2 (15:15-15:21, load 5.4 -> 5.7), so
# repeats 1, 3, 4 ran the burst first, 2 and 5 the both run first;
# medians of the 5 (min..max), no steal in any run:
#   light median alone 0.0211 s (0.0207..0.0477); during the burst 0.0180 s
#     (0.0163..0.0216), ratio 0.85 (per repeat 0.77, 0.45..0.92)
#   light p99 during the burst 0.0950 s (0.0685..0.4040); max 0.2933 s
#     (0.1729..1.7918)
#   burst 193.5 msg/s alone (117.5..1174.8), 200.9 with light clients
#     (135.5..297.5), ratio 1.04 (per repeat 1.02, 0.25..1.15)
# All three targets met at the medians.  The 1174.8 is the last repeat's
# burst alone, on a nearly idle machine (load 5): accepted in 6.8 s,
# drained 10.3 s later, cpu.ms/msg 1.4 against 6.3 .. 17.0 in the other
# burst and both runs; the sampler saw the queue empty at its end, so
# the run was not cut short.  Its repeat's throughput ratio
# (0.25) says more about that than about the light clients.
# Around pepsi-ingress's second gathered commit in flight (issue 37,
# admit.c's admit_gather), 2026-12-07, BENCH_REPEATS=5 BENCH_BURST=5000
# (a quarter of the default burst: the lock's time left no more), main
# b602daf built apart, then the branch (e01e175), one
# hold each, medians of 5 (min..max):
#   main (21:48-21:55, load 14.4 -> 17.4, a stress-ng on both cores):
#     light alone 0.027 s (0.0202..0.0332); during the burst 0.022 s
#     (0.0176..0.0234), ratio 0.81; p99 0.081 s (0.0621..0.1292); max
#     0.238 s; burst 202.5 msg/s alone (192.0..224.8), 245.1 with light
#     clients (196.4..254.6), ratio 1.21
#   branch (21:55-21:59, load 12.5 -> 8.0, the stress-ng gone by its
#     second repeat): light alone 0.008 s (0.0062..0.0245); during the
#     burst 0.011 s (0.0088..0.0156), ratio 1.36; p99 0.062 s
#     (0.0244..0.2225); max 0.104 s; burst 736.8 msg/s alone
#     (265.5..905.4), 1,039.3 with light clients (204.2..1,419.5), ratio
#     1.41
# All three targets met on both sides.  The light senders' latency
# during the burst was not given back (0.011 s against 0.022 s, p99
# 0.062 against 0.081); the branch's ratio to alone is higher because its
# alone runs came on a quieter machine (0.008 s), not because the burst
# slowed them.  The light senders are new clients, stored on the express
# connection, which the change leaves as it was.
# At the default burst (20,000), on a quiet machine (2026-12-08, a new
# host of the same size, 00:37-00:42, main 75e98eb, the second gathered
# commit in; load 4.0 falling from a loaded test run before it, 3.0 at the
# end), BENCH_REPEATS=5, medians of 5 (min..max):
#   light median alone 0.005 s (0.0051..0.0067); during the burst 0.009 s
#     (0.0084..0.0225), ratio 1.59 (per repeat 1.69, 1.27..4.17)
#   light p99 during the burst 0.028 s (0.0267..0.0674); max 0.058 s
#     (0.0364..0.0966)
#   burst 1,135.7 msg/s alone (834.6..1,411.7), 1,381.2 with light
#     clients (891.8..1,602.6), ratio 1.22 (per repeat 1.36, 0.63..1.48)
# All three targets met at the medians.  Repeat 4 is the one far off
# (light 0.0225 s, p99 0.067 s, the burst at 0.63 of its alone run): its
# claims took 6.9 ms against 0.6 ms in the others' both runs, and it had
# the run's only steal (0.11 s).  The light senders during the burst wait
# 9 ms here against 11-22 ms in the sets above: not given back.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
steal_max=${BENCH_STEAL_MAX:-1}
[[ $steal_max =~ ^[0-9]+([.][0-9]+)?$ ]] ||
    { echo "BENCH_STEAL_MAX must be a number of seconds, not '$steal_max'" >&2; exit 2; }
burst=${BENCH_BURST:-20000}
bin="$bench_top/build/bin"
log=$(bench_log fairness)
samples_dir="${log%.log}.samples" # the sampler's, one file a run (sample.sql)
rm -rf "$samples_dir"
mkdir -p "$samples_dir"

bench_postfix_install
for p in pepsi-ingress pepsi-dispatch pepsi-keys pepsi-stage-route pepsi-stage-dot-forward \
    pepsi-stage-vacation pepsi-stage-relay-to-maildir pepsi-helper-maildir-writer; do
    [ -x "$bin/$p" ] || { echo "build $p first (make programs)" >&2; exit 1; }
done
# As scripts/run.sh: the multi-call binary when it is built.
if [ -x "$bin/pepsi" ]; then program() { echo "$bin/pepsi $1"; }; else program() { echo "$bin/$1"; }; fi

ingress_pid= dispatch_pid=
cleanup() {
    sampler_stop
    bench_stop_pid "$ingress_pid"
    bench_stop_pid "$dispatch_pid"
    bench_cleanup
}
bench_cluster_start "max_connections = 200" "shared_preload_libraries = 'pg_stat_statements'"
trap cleanup EXIT

port=$(bench_free_port)
run_dir="$BENCH_DIR/run"
maildir="$run_dir/maildir"
mkdir -p "$run_dir"
conf="$run_dir/pepsi.conf"
# `make run`'s configuration (scripts/lib.sh), with this cluster, port and user.
run_config_make "$run_dir" "$BENCH_PORT" "$bin" >/dev/null
sed -i -e "s|^CONNINFO = .*|CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres|" \
    -e "s|^PORT = 2525|PORT = $port\nMAX_SESSIONS_PER_CLIENT = 0|" \
    -e "s|^USER = pepsi|USER = $PEPSI_USER|" "$conf"
grep -q "PORT = $port" "$conf" || { echo "docs/pepsi.conf.sample has no listener on 2525" >&2; exit 1; }

# The light rows' trace (see above).
bench_psql >/dev/null <<'SQL'
CREATE EXTENSION pg_stat_statements;
CREATE TABLE bench_trace (id bigint, stage text, status text, sent float8, at float8);
CREATE FUNCTION bench_trace() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO public.bench_trace VALUES (OLD.id, OLD.stage, 'deleted', NULL,
            extract(epoch FROM clock_timestamp()));
    ELSE
        INSERT INTO public.bench_trace VALUES (NEW.id, NEW.stage, NEW.status::text,
            CASE WHEN TG_OP = 'INSERT' THEN substring(encode(NEW.headers, 'escape')
                FROM 'X-Bench-Sent: ([0-9.]+)')::float8 END,
            extract(epoch FROM clock_timestamp()));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER bench_trace AFTER INSERT OR UPDATE ON pepsi.workqueue FOR EACH ROW
    WHEN (NEW.sender_key <> 'ip:127.0.0.1') EXECUTE FUNCTION bench_trace();
CREATE TRIGGER bench_trace_delete AFTER DELETE ON pepsi.workqueue FOR EACH ROW
    WHEN (OLD.sender_key <> 'ip:127.0.0.1') EXECUTE FUNCTION bench_trace();
SQL
psql_command="$PGBIN/psql -h $BENCH_DIR -p $BENCH_PORT -U postgres -d $BENCH_DB"

# The last run's mail is moved aside, not deleted, until the bench ends
# (bench_cleanup removes $BENCH_DIR).  On ext4 without a journal (this
# machine's root), a file created within about 30 s of many deletions
# makes the kernel pass over every recently freed inode of its group
# (recently_deleted): measured here, creating and fsyncing a file cost
# 0.49 ms of CPU, and 1.8-2.1 ms right after deleting 20,000 files.  With
# an rm -rf before each run, each run paid that for the files of the runs
# before it, more or less by how recently they went: CPU no mail server
# spends on a burst, and noise between the runs a ratio compares.  Each
# run's mail gets a directory of its own from mktemp: run() is called in
# a command substitution, where a counter would not outlive the call.
# The mailboxes must be empty before a run: drive.py counts the files in
# them, so a run over the last one's mail ends its burst early and mixes
# in old messages' latencies.
reset_mailboxes() {
    if [ -d "$maildir" ]; then
        mkdir -p "$BENCH_DIR/spent-mail"
        local spent
        spent=$(mktemp -d "$BENCH_DIR/spent-mail/run.XXXXXX")
        mv "$maildir" "$spent/maildir" ||
            { echo "bench/fairness: cannot move the last run's mail aside" >&2; exit 1; }
    fi
    mkdir -p "$maildir"/{light,heavy}@example.org/{tmp,new,cur}
    # The maildir helper writes as the mailboxes' owner (VIRTUAL_USER, the
    # unprivileged user as root); the run's keys and secret stay private.
    chmod a+rx "$run_dir"
    [ "$(id -u)" -ne 0 ] || give_to_user "$maildir"
}
reset_mailboxes
$(program pepsi-dispatch) -c "$conf" 2>>"$BENCH_DIR/dispatch.log" &
dispatch_pid=$!
$(program pepsi-ingress) -c "$conf" 2>>"$BENCH_DIR/ingress.log" &
ingress_pid=$!
for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done

# The sampler: sample.sql once a second through one psql session (idle
# between samples, so it holds no snapshot), into FILE, for at most 15
# minutes; sampler_stop ends it (within a second: psql then sees the end
# of its input and writes out what it has).
sampler_pid=
sampler_start() {
    rm -f "$BENCH_DIR/sampler.stop"
    (for _ in $(seq 1 900); do
        [ ! -e "$BENCH_DIR/sampler.stop" ] || break
        cat "$here/sample.sql"
        sleep 1
    done | bench_psql -At -F $'\t' >"$1" 2>&1) &
    sampler_pid=$!
}
sampler_stop() {
    [ -n "$sampler_pid" ] || return 0
    touch "$BENCH_DIR/sampler.stop"
    wait "$sampler_pid" 2>/dev/null || true
    sampler_pid=
}

# run MODE: one run after a reset; prints drive.py's line.
run() {
    bench_queue_empty bench_trace 2>>"$log"
    reset_mailboxes
    local file="$samples_dir/$r-$1.tsv"
    sampler_start "$file"
    local holder=
    if [ "$1" = both ] && [ -n "${BENCH_HOLD_SNAPSHOT:-}" ]; then
        bench_psql -c "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pepsi.workqueue;
            SELECT pg_sleep(${BENCH_HOLD_SNAPSHOT//[^0-9]/}); COMMIT" >/dev/null &
        holder=$!
    fi
    python3 "$here/drive.py" "$1" --port "$port" --maildir "$maildir" --burst "$burst" \
        --psql "$psql_command" 2>>"$log" | tee -a "$log"
    [ -z "$holder" ] || wait "$holder"
    sampler_stop
    echo "  samples: $(python3 "$here/drive.py" diagnose "$file")" >>"$log"
    # What outlives the reset, in case the runs drift.
    bench_psql -At -c "SELECT '  tables: ' || string_agg(format('%s %s/%s', relname,
        pg_size_pretty(pg_total_relation_size(relid)), n_live_tup + n_dead_tup), ', '
        ORDER BY pg_total_relation_size(relid) DESC)
        FROM (SELECT * FROM pg_stat_user_tables ORDER BY pg_total_relation_size(relid) DESC LIMIT 6) t" >>"$log"
}
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
spread() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s..%s", lo, hi }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench/fairness: 10 light clients (1 msg / 0.5 s each), a $burst-message burst;" \
    "$repeats repeats through docs/pepsi.conf.sample's graph"
started=$(date +%s)
alone_lines=() burst_lines=() both_lines=() claim_runs=()
alone_med=() alone_p99=() both_med=() both_p99=() both_max=() rate_alone=() rate_both=()
pair_latency=() pair_rate=() # each repeat's own ratios: its runs are minutes apart, not the whole run
pair_steal=()                 # each repeat's steal.s, burst alone and with light clients
for ((r = 1; r <= repeats; r++)); do
    repeat_started=$(date +%s)
    l=$(run light)
    # The burst alone and with the light clients take turns going first,
    # so a drift from run to run does not favour either side.
    if ((r % 2)); then
        b=$(run burst)
        m=$(run both)
    else
        m=$(run both)
        b=$(run burst)
    fi
    alone_med+=("$(field median "$l")") alone_p99+=("$(field p99 "$l")")
    rate_alone+=("$(field rate "$b")")
    both_med+=("$(field median "$m")") both_p99+=("$(field p99 "$m")") both_max+=("$(field max "$m")")
    rate_both+=("$(field rate "$m")")
    pair_latency+=("$(ratio "${both_med[-1]}" "${alone_med[-1]}")")
    pair_rate+=("$(ratio "${rate_both[-1]}" "${rate_alone[-1]}")")
    pair_steal+=("$(field steal.s "$b") $(field steal.s "$m")")
    alone_lines+=("$l") burst_lines+=("$b") both_lines+=("$m")
    claim_runs+=("$r burst $(field claim.ms "$b")" "$r both $(field claim.ms "$m")")
    printf 'run %d: light alone median %s s; during the burst median %s s, p99 %s s, max %s s;' \
        "$r" "${alone_med[-1]}" "${both_med[-1]}" "${both_p99[-1]}" "${both_max[-1]}"
    printf ' burst %s msg/s alone, %s msg/s with light clients (%s); %d s\n' "${rate_alone[-1]}" \
        "${rate_both[-1]}" "$(ratio "${rate_both[-1]}" "${rate_alone[-1]}")" \
        "$(($(date +%s) - repeat_started))"
    printf '  %s\n' "$l" "$b" "$m"
done

m_alone=$(bench_median "${alone_med[@]}")
m_both=$(bench_median "${both_med[@]}")
p_both=$(bench_median "${both_p99[@]}")
r_alone=$(bench_median "${rate_alone[@]}")
r_both=$(bench_median "${rate_both[@]}")
echo "medians of $repeats runs (spread):"
printf '  light median latency alone:        %8.3f s  (%s)\n' "$m_alone" "$(spread "${alone_med[@]}")"
printf '  light median latency during burst: %8.3f s  (%s)  ratio %s (target <= 2.00)\n' \
    "$m_both" "$(spread "${both_med[@]}")" "$(ratio "$m_both" "$m_alone")"
printf '  light p99 latency during burst:    %8.3f s  (%s)  (target < 2 s)\n' "$p_both" "$(spread "${both_p99[@]}")"
printf '  light max latency during burst:    %8.3f s  (%s)\n' "$(bench_median "${both_max[@]}")" "$(spread "${both_max[@]}")"
printf '  burst throughput alone:            %8.1f msg/s (%s)\n' "$r_alone" "$(spread "${rate_alone[@]}")"
printf '  burst throughput with light:       %8.1f msg/s (%s)  ratio %s (target >= 0.90)\n' \
    "$r_both" "$(spread "${rate_both[@]}")" "$(ratio "$r_both" "$r_alone")"
# The same ratios taken within each repeat, whose runs follow one another:
# a machine that drifts from repeat to repeat moves both sides of these.
printf '  per repeat: latency ratio median %s (%s), throughput ratio median %s (%s)\n' \
    "$(bench_median "${pair_latency[@]}")" "$(spread "${pair_latency[@]}")" \
    "$(bench_median "${pair_rate[@]}")" "$(spread "${pair_rate[@]}")"
# On a shared machine the hypervisor can take seconds of CPU from one run
# of a repeat and not the other (steal.s, drive.py), which moves that
# repeat's ratio whichever way: name those repeats, and give the ratio of
# the others, so that a far-off repeat can be told from a far-off system.
stolen=() calm_rate=()
for ((i = 0; i < repeats; i++)); do
    read -r steal_alone steal_both <<<"${pair_steal[i]}"
    if awk -v a="$steal_alone" -v b="$steal_both" -v max="$steal_max" 'BEGIN { exit !(a > max || b > max) }'; then
        stolen+=("run $((i + 1)): ${pair_rate[i]} (steal ${steal_alone} s alone, ${steal_both} s with light)")
    else
        calm_rate+=("${pair_rate[i]}")
    fi
done
if ((${#stolen[@]})); then
    echo "  repeats the hypervisor slowed (steal over $steal_max s in either run), throughput ratio:"
    printf '    %s\n' "${stolen[@]}"
    if ((${#calm_rate[@]})); then
        printf '  per repeat, the other %d: throughput ratio median %s (%s)\n' "${#calm_rate[@]}" \
            "$(bench_median "${calm_rate[@]}")" "$(spread "${calm_rate[@]}")"
    fi
fi
echo "the database's work per message, and where the light messages' time went"
echo "(s; medians of the runs' medians; see drive.py):"
echo "  light alone:  $(python3 "$here/drive.py" summary "${alone_lines[@]}")"
echo "  burst alone:  $(python3 "$here/drive.py" summary "${burst_lines[@]}")"
echo "  during burst: $(python3 "$here/drive.py" summary "${both_lines[@]}")"
# A run whose claims cost far more than the others': what the sampler saw.
claim_median=$(bench_median $(printf '%s\n' "${claim_runs[@]}" | cut -d' ' -f3))
for c in "${claim_runs[@]}"; do
    read -r cr cmode cms <<<"$c"
    if awk -v a="$cms" -v m="$claim_median" 'BEGIN { exit !(a > 3 * m && a > 2) }'; then
        echo "run $cr $cmode: the claim cost $cms ms, $(ratio "$cms" "$claim_median")x the median" \
            "($claim_median ms); $(python3 "$here/drive.py" diagnose "$samples_dir/$cr-$cmode.tsv")"
    fi
done
echo "$repeats runs took $(($(date +%s) - started)) s; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
