# shellcheck shell=bash
# bench/relay's one measured run, shared by run.sh and pooled.sh (sourced
# after bench/lib.sh, with $sessions, $messages and $log set).
#
# measure PORT [ROOT_PIDS...]: send MESSAGES of 2 KB over SESSIONS sessions
# with smtp-source to PORT, wait until smtp-sink has them all; prints
# "rate rss pss accepted relayed" (msg/s, kB, kB, s, s): the rate from the
# first message sent to the last one smtp-sink received, the memory peak
# of the ROOT_PIDS' process trees meanwhile (rss-sampler.pl; "- -" when
# none are given, and no sampler runs), and when the last message was
# accepted and relayed.  Fails, saying so, when smtp-sink did not get them
# all within 10 minutes.
measure_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
measure() {
    local port=$1 base start sent end peak="rss=- pss=-" sampler=
    shift
    base=$(bench_sink_count)
    base=${base:-0}
    if [ $# -gt 0 ]; then
        perl "$measure_dir/rss-sampler.pl" "$@" >"$BENCH_DIR/sampler.out" &
        sampler=$!
    fi
    start=$(date +%s.%N)
    /usr/sbin/smtp-source -d -s "$sessions" -m "$messages" -l 2048 \
        -f sender@example.org -t rcpt@example.net "127.0.0.1:$port" >>"$log" 2>&1
    sent=$(date +%s.%N)
    for _ in $(seq 1 12000); do
        [ "$(bench_sink_count)" -ge $((base + messages)) ] && break
        sleep 0.05
    done
    end=$(date +%s.%N)
    # Where the time went: accepting (smtp-source done) and then draining.
    awk -v p="$port" -v a="$start" -v s="$sent" -v b="$end" 'BEGIN {
        printf "port %s: all accepted after %.2f s, all relayed after %.2f s\n", p, s - a, b - a }' >>"$log"
    if [ -n "$sampler" ]; then
        bench_stop_pid "$sampler"
        peak=$(cat "$BENCH_DIR/sampler.out")
    fi
    [ "$(bench_sink_count)" -ge $((base + messages)) ] || {
        echo "only $(($(bench_sink_count) - base)) of $messages reached smtp-sink" >&2
        return 1
    }
    awk -v n="$messages" -v a="$start" -v s="$sent" -v b="$end" -v p="$peak" 'BEGIN {
        split(p, f, /[ =]/); printf "%.1f %s %s %.2f %.2f\n", n / (b - a), f[2], f[4], s - a, b - a }'
}
