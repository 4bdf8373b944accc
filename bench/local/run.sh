#!/usr/bin/env bash
# bench/local: local delivery, Pepsi against a stock Postfix, side by side
# on this machine, both into the same private Dovecot (bench/lib.sh).
#
#   bench/local/run.sh MODE      MODE: lmtp (default)
#
# BENCH_MESSAGES messages (default 20000) of 2 KB to BENCH_USERS local users
# (default 100, user<N>@local.bench.test, the same number each), sent by
# Postfix's smtp-source over BENCH_SESSIONS parallel sessions (default 20),
# one recipient a message:
#   lmtp   pepsi:   pepsi-ingress -> pepsi-dispatch -> init (route) ->
#                   relay-to-lmtp (BENCH_LOCAL_WORKERS workers, default 50,
#                   each with its LMTP session) -> Dovecot's LMTP socket,
#                   the queue a durable cluster (fsync, synchronous_commit:
#                   bench/lib.sh)
#          postfix: a private stock Postfix (its own config and queue,
#                   fsynced as usual) whose local_transport is lmtp(8) to
#                   the same socket, at its stock concurrency (20 sessions
#                   to one destination)
# Dovecot fsyncs every message it stores (mail_fsync = always): durable
# on both sides.  The time runs from the first message sent to the last
# one in a Maildir's new/.  Before each run Dovecot is restarted on empty
# Maildirs.  The sides alternate, BENCH_REPEATS times (default 5); each
# run's ratio is printed, then the medians in messages per second with the
# ratio pepsi/postfix and the spread (target: median ratio >= 1.5), and
# the load average before and after.
#
# Needs: postfix, dovecot-core and dovecot-lmtpd (scripts/deps.sh),
# pepsi-ingress, pepsi-dispatch and the stages built, the extension
# installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

mode=${1:-lmtp}
repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
users=${BENCH_USERS:-100}
workers=${BENCH_LOCAL_WORKERS:-50}
domain=local.bench.test
log=$(bench_log "local-$mode")

case $mode in
    lmtp) ;;
    *)
        echo "usage: $0 [lmtp]" >&2
        exit 2
        ;;
esac

bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-lmtp
[ -x /usr/sbin/dovecot ] && [ -x /usr/lib/dovecot/lmtp ] || {
    echo "install dovecot-core and dovecot-lmtpd first (scripts/deps.sh)" >&2
    exit 1
}
[ $((messages % users)) -eq 0 ] || { echo "BENCH_MESSAGES must be a multiple of BENCH_USERS" >&2; exit 2; }

bench_cluster_start "max_connections = 200"
dovecot_dir=$(mktemp -d /tmp/pepsi-bench-dovecot.XXXXXX)
postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)
socket=$dovecot_dir/run/lmtp

# ---------------------------------------------------------------------------
# The two sides, by mode
# ---------------------------------------------------------------------------

start_sides_lmtp() {
    bench_pepsi_start "$pepsi_port" "[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = $domain
LOCAL_STAGE = lmtp
REMOTE_STAGE = lmtp
PARALLELISM = 2
QUEUE_LIMIT = 256
[stage-lmtp]
PROGRAM = pepsi-stage-relay-to-lmtp
SERVER = $socket
PARALLELISM = $workers
QUEUE_LIMIT = 4"
    # Stock Postfix apart from where it lives (bench/lib.sh) and where local mail goes.
    bench_postfix_start "$postfix_dir" "$postfix_port" "mydestination = $domain" \
        "local_recipient_maps =" "local_transport = lmtp:unix:$socket"
}

# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------

# Empty Maildirs and a fresh Dovecot before each run, so no run inherits
# the other side's mailboxes.
fresh_dovecot() {
    bench_dovecot_stop "$dovecot_dir"
    rm -rf "${dovecot_dir:?}/mail"
    mkdir -p "$dovecot_dir/mail"
    give_to_user "$dovecot_dir/mail"
    if [ ${#BENCH_DOVECOT_DIRS[@]} -eq 0 ]; then
        bench_dovecot_start "$dovecot_dir"
    else
        as_user /usr/sbin/dovecot -c "$dovecot_dir/dovecot.conf"
        for _ in $(seq 1 100); do [ -S "$socket" ] && break; sleep 0.1; done
    fi
}

# send PORT: MESSAGES over SESSIONS parallel senders.  Sender s serves the
# users u with u % SESSIONS = s, BENCH_BURST messages (default 10) to one
# user per smtp-source session, round after round, so mail to all users
# arrives interleaved as it would on a mail host (one user's whole share
# in one burst would measure Dovecot's lock on one mailbox instead).
send() {
    local port=$1 per_user=$((messages / users)) burst=${BENCH_BURST:-10} s u round pids=()
    for ((s = 0; s < sessions; s++)); do
        (
            for ((round = 0; round < per_user; round += burst)); do
                for ((u = s; u < users; u += sessions)); do
                    /usr/sbin/smtp-source -d -s 1 -m "$((per_user - round < burst ? per_user - round : burst))" \
                        -l 2048 -f sender@example.org -t "user$u@$domain" "127.0.0.1:$port"
                done
            done
        ) >>"$log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
}

# measure PORT: prints "rate accepted delivered" (msg/s, s, s).
measure() {
    local port=$1 start sent end n
    start=$(date +%s.%N)
    send "$port"
    sent=$(date +%s.%N)
    for _ in $(seq 1 6000); do
        n=$(bench_dovecot_delivered "$dovecot_dir")
        [ "$n" -ge "$messages" ] && break
        sleep 0.1
    done
    end=$(date +%s.%N)
    [ "$n" -ge "$messages" ] || { echo "only $n of $messages reached the Maildirs" >&2; return 1; }
    awk -v p="$port" -v a="$start" -v s="$sent" -v b="$end" 'BEGIN {
        printf "port %s: all accepted after %.2f s, all delivered after %.2f s\n", p, s - a, b - a }' >>"$log"
    awk -v n="$messages" -v a="$start" -v s="$sent" -v b="$end" 'BEGIN {
        printf "%.1f %.2f %.2f\n", n / (b - a), s - a, b - a }'
}

pepsi_reset() { bench_psql -c "TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY" -c CHECKPOINT >/dev/null; }
pepsi_left() { bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
min() { printf '%s\n' "$@" | sort -g | head -1; }
max() { printf '%s\n' "$@" | sort -g | tail -1; }

fresh_dovecot
"start_sides_$mode"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench/local $mode: $messages messages of 2 KB to $users users over $sessions sessions," \
    "$repeats runs each side, alternating; Pepsi as $BENCH_PEPSI_FLAVOUR, $workers delivery workers;" \
    "Postfix lmtp concurrency $(/usr/sbin/postconf -c "$postfix_dir/etc" -h lmtp_destination_concurrency_limit 2>/dev/null \
        | sed "s/\$default_destination_concurrency_limit/$(/usr/sbin/postconf -c "$postfix_dir/etc" -h default_destination_concurrency_limit)/")"
pepsi_rates=() postfix_rates=() ratios=()
for ((r = 1; r <= repeats; r++)); do
    pepsi_reset
    fresh_dovecot
    sleep 1
    read -r rate accepted delivered < <(measure "$pepsi_port")
    left=$(pepsi_left)
    [ "$left" -eq 0 ] || echo "warning: $left rows left in Pepsi's queue" >&2
    pepsi_rates+=("$rate")

    fresh_dovecot
    sync
    sleep 1
    read -r rate_pf accepted_pf delivered_pf < <(measure "$postfix_port")
    postfix_rates+=("$rate_pf")
    ratios+=("$(ratio "$rate" "$rate_pf")")
    printf 'run %d: pepsi %s msg/s (all accepted after %s s, delivered after %s s),' \
        "$r" "$rate" "$accepted" "$delivered"
    printf ' postfix %s msg/s (all accepted after %s s, delivered after %s s), ratio %s\n' \
        "$rate_pf" "$accepted_pf" "$delivered_pf" "${ratios[-1]}"
done

printf '%-34s %10s msg/s (runs %s .. %s)\n' \
    "pepsi (ingress -> relay-to-lmtp)" "$(bench_median "${pepsi_rates[@]}")" \
    "$(min "${pepsi_rates[@]}")" "$(max "${pepsi_rates[@]}")" \
    "postfix (smtpd -> lmtp)" "$(bench_median "${postfix_rates[@]}")" \
    "$(min "${postfix_rates[@]}")" "$(max "${postfix_rates[@]}")"
printf 'ratio pepsi/postfix: median %s, runs %s .. %s (target: median >= 1.50)\n' \
    "$(bench_median "${ratios[@]}")" "$(min "${ratios[@]}")" "$(max "${ratios[@]}")"
echo "load average: before $load_before, after $(cut -d' ' -f1-3 /proc/loadavg)"
[ "${BENCH_KEEP_LOG:-0}" = 1 ] && cp "$BENCH_DIR/dispatch.log" "$bench_top/bench/out/local-$mode-dispatch.log"
