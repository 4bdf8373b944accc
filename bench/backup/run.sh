#!/usr/bin/env bash
# bench/backup: backing up a full queue and restoring it until the last
# restored message is delivered, Pepsi against a stock Postfix, side by
# side on this machine, both into the same Postfix smtp-sink.
#
# The queue: MESSAGES messages (BENCH_MESSAGES, default 1,000,000) of
# 2 KB, one remote recipient each, every one sent by smtp-source -l 2048
# or a copy of what it sent:
#   pepsi:   one message sent to pepsi-ingress (no dispatcher running, so
#            it waits at the init stage, as ingress and the graph made
#            it), then MESSAGES - 1 copies admitted server-side by
#            pepsi.workqueue_add, ingress's own admission, each with a
#            body of its own (one recipient per message: nothing to share)
#   postfix: one message sent to a private stock Postfix instance
#            (bench/lib.sh) with defer_transports = smtp, deferred, then
#            put on hold (postsuper -h), its queue file copied MESSAGES - 1
#            times under new queue ids, renamed to their inodes by postfix
#            start and counted by postqueue -p, the instance stopped
# The fill is not timed (its steps' times go to the log); at 1,000,000 it
# takes about half an hour on a loaded 2-core machine, most of it
# Postfix's renames and Pepsi's admissions.
# Each run, the sides alternating, BENCH_REPEATS times (default 5):
#   pepsi:   pg_dump -Fc of the queue's database (timed, its size), then,
#            timed from here: createdb and pg_restore --single-transaction
#            into a fresh cluster (initdb'd before the clock starts, with
#            the same postgresql.conf), pepsi-dispatch and pepsi-ingress
#            started on it (init: pepsi-stage-route, then
#            pepsi-stage-relay-to-smarthost to the sink), until smtp-sink
#            has the last message (docs/backup.md's procedure)
#   postfix: tar of the stopped instance's queue directory (timed, its
#            size), then, timed from here: tar extracted into a fresh
#            instance's queue directory (its configuration made before the
#            clock starts: relayhost = the sink, no defer_transports),
#            postfix start, postsuper -r ALL, until smtp-sink has the last
#            message
# Printed per run, then the medians and spread: backup time and size,
# restore time (to restored), restore to last delivered, and the ratio
# postfix/pepsi of the last (target: at least 1.00: Pepsi no slower).
# pg_dump syncs its output; the tar is synced (sync FILE) before its clock
# stops.  pg_dump -Fc compresses (zlib), tar does not; smtp-source's
# bodies compress well, so the dump's size is smaller than real mail's.
#
# Needs: postfix (installed here with debconf "No configuration" when it
# is missing), pepsi-ingress, pepsi-dispatch and the stages built, the
# extension installed; free space in /tmp for two copies of the queue
# (about 5 GB each at 1,000,000 messages).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

messages=${BENCH_MESSAGES:-1000000}
repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
relay_workers=${BENCH_RELAY_WORKERS:-20}
log=$(bench_log backup)

bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-route pepsi-stage-relay-to-smarthost
postfix_src= postfix_dst= restore_data=

cleanup() {
    if [ -n "${BENCH_DIR:-}" ]; then
        cp "$BENCH_DIR/dispatch.log" "${log%.log}-dispatch.log" 2>/dev/null || true
    fi
    bench_pepsi_stop
    if [ -n "$restore_data" ] && [ -f "$restore_data/postmaster.pid" ]; then
        as_user "$PGBIN/pg_ctl" -D "$restore_data" -m immediate stop >/dev/null 2>&1 || true
    fi
    [ -z "$postfix_src" ] || bench_postfix_stop "$postfix_src"
    [ -z "$postfix_dst" ] || bench_postfix_stop "$postfix_dst"
    bench_cleanup
}

bench_cluster_start "max_connections = 200"
trap cleanup EXIT
source_data=$BENCH_DIR/data
restore_data=$BENCH_DIR/restore-data

sink_port=$(bench_free_port)
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)
bench_sink_start "$sink_port"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
mb() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f", b / 1048576 }'; }
# Polls until the sink has taken WANT messages, for at most a second per
# 50 messages and 10 minutes more; fails with what it has.
wait_sink() {
    local want=$1 i limit=$((6000 + messages / 10))
    for ((i = 0; i < limit; i++)); do
        [ "$(bench_sink_count)" -ge "$want" ] && return 0
        sleep 0.2
    done
    echo "smtp-sink has $(bench_sink_count) of $want messages" >&2
    return 1
}

stages="[stage-init]
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

# ---- The queues, filled once (not timed) ----------------------------------
echo "bench/backup: $messages messages of 2 KB, $repeats runs each side, alternating" | tee -a "$log"
fill_start=$(now)
# Postfix: one message through its smtpd into the deferred queue
# (defer_transports = smtp), put on hold (postsuper -h: the queue manager
# leaves held mail alone, so the instance can run to count the copies),
# then, the instance stopped, copies of that queue file under new queue
# ids.  The copies' names follow no inode: postfix start renames them
# (postsuper), as it renames every file of a restored queue.  Then
# postqueue -p must list them all: Postfix takes the copies as its own.
# Each step's time goes to the log (fill: ...), so a slow fill says where.
step_start=$(now)
step() { # label: the time since the previous step
    echo "fill: $1 $(since "$step_start") s" >>"$log"
    step_start=$(now)
}
postfix_stop_wait() { # DIR: stop the instance, wait until it has stopped
    local i
    /usr/sbin/postfix -c "$1/etc" stop >/dev/null 2>&1
    for ((i = 0; i < 600; i++)); do
        /usr/sbin/postfix -c "$1/etc" status >/dev/null 2>&1 || return 0
        sleep 0.1
    done
    echo "postfix in $1 did not stop" >&2
    return 1
}
postfix_src=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
bench_postfix_start "$postfix_src" "$postfix_port" "defer_transports = smtp" \
    "relayhost = [127.0.0.1]:$sink_port"
/usr/sbin/smtp-source -s 1 -m 1 -l 2048 -f sender@example.org -t rcpt@example.net \
    "127.0.0.1:$postfix_port" >>"$log" 2>&1
bench_postfix_wait_deferred "$postfix_src" 1 >/dev/null
/usr/sbin/postsuper -c "$postfix_src/etc" -h ALL >>"$log" 2>&1
postfix_stop_wait "$postfix_src"
[ "$(bench_postfix_count "$postfix_src" hold)" -eq 1 ] || { echo "postfix holds no seed message" >&2; exit 1; }
step "postfix: the seed message deferred and held, the instance stopped"
python3 - "$postfix_src/spool/hold" "$messages" <<'PY'
import glob, os, sys
hold, n = sys.argv[1], int(sys.argv[2])
(seed,) = glob.glob(os.path.join(hold, "**", "*"), recursive=True)
seed_dir = os.path.dirname(seed)
st = os.stat(seed)
data = open(seed, "rb").read()
for i in range(1, n):
    # A short queue id's shape (hexadecimal); postsuper renames it.
    path = os.path.join(seed_dir, "%012X" % (0xF00000000000 + i))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, st.st_mode & 0o7777)
    os.write(fd, data)
    os.fchown(fd, st.st_uid, st.st_gid)
    os.close(fd)
PY
sync
step "postfix: $((messages - 1)) copies of its queue file"
# postfix start runs postsuper, which renames the copies to their inodes
# and writes the log file itself, as the mail owner.
chown postfix: "$postfix_src/maillog"
/usr/sbin/postfix -c "$postfix_src/etc" start >>"$log" 2>&1
listed=$(/usr/sbin/postqueue -c "$postfix_src/etc" -p | awk '/^-- .* in [0-9]+ Requests?\.$/ { print $(NF - 1) }')
postfix_stop_wait "$postfix_src"
[ "${listed:-0}" -eq "$messages" ] || { echo "postqueue -p lists ${listed:-0} of $messages messages" >&2; exit 1; }
step "postfix: postfix start (postsuper renames the copies), postqueue -p lists $listed"
echo "postfix: $listed messages held, spool $(du -sh "$postfix_src/spool" | cut -f1)" | tee -a "$log"

# Pepsi: one message through ingress (the dispatcher is not running: it
# stays pending at init), then copies of it admitted server-side by the
# extension's own admission, pepsi.workqueue_add, as ingress admits
# (each its row and its body, as the graph makes them: one recipient per
# message, so no body is shared), in statements of 100,000.  A copy has
# no queue_id of its own in its state (it is named by its row id, as a
# row admitted in SQL is).
bench_pepsi_start "$pepsi_port" "$stages"
bench_stop_pid "$BENCH_DISPATCH_PID"
BENCH_DISPATCH_PID=
/usr/sbin/smtp-source -s 1 -m 1 -l 2048 -f sender@example.org -t rcpt@example.net \
    "127.0.0.1:$pepsi_port" >>"$log" 2>&1
bench_pepsi_stop
[ "$(bench_queue_rows)" -eq 1 ] || { echo "the seed message is not in Pepsi's queue" >&2; exit 1; }
step "pepsi: cluster, extension and the seed message through ingress"
bench_psql -c "CREATE TABLE bench_seed AS SELECT w.mail_from, w.rcpt_to, w.headers, b.body,
                   w.state - 'queue_id' AS state, w.client_address, w.auth_account, w.stage
               FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id" >/dev/null
for ((from = 2; from <= messages; from += 100000)); do
    to=$((from + 99999 < messages ? from + 99999 : messages))
    bench_psql -c "SELECT count(pepsi.workqueue_add(mail_from, rcpt_to, headers, body, state,
                                                   client_address, auth_account, stage))
                   FROM bench_seed, generate_series($from, $to)" >/dev/null
done
bench_psql -c "DROP TABLE bench_seed" -c "VACUUM ANALYZE pepsi.workqueue" \
    -c "VACUUM ANALYZE pepsi.workqueue_body" -c CHECKPOINT >/dev/null
step "pepsi: $((messages - 1)) copies admitted by pepsi.workqueue_add, vacuum, checkpoint"
rows=$(bench_queue_rows)
[ "$rows" -eq "$messages" ] || { echo "Pepsi's queue has $rows rows, not $messages" >&2; exit 1; }
echo "pepsi: $rows rows pending at init, database $(bench_psql -tA -c \
    "SELECT pg_size_pretty(pg_database_size(current_database()))");" \
    "both queues filled in $(since "$fill_start") s" | tee -a "$log"

# ---- The runs -------------------------------------------------------------
# Each step sets took (s) and size (MB), or restored and delivered (s from
# the start of the restore).
pepsi_dump() {
    local start
    start=$(now)
    as_user "$PGBIN/pg_dump" -Fc -h "$BENCH_DIR" -p "$BENCH_PORT" -U postgres \
        -f "$BENCH_DIR/pepsi.dump" "$BENCH_DB"
    took=$(since "$start") size=$(mb "$BENCH_DIR/pepsi.dump")
}

# A fresh cluster in place of the source one, on the same socket, with the
# same configuration; the source is stopped meanwhile (one cluster's
# shared_buffers at a time).
fresh_cluster() {
    as_user "$PGBIN/pg_ctl" -D "$source_data" -m fast -w stop >/dev/null
    rm -rf "$restore_data"
    as_user "$PGBIN/initdb" -D "$restore_data" -U postgres --auth=trust \
        --no-instructions -E UTF8 --locale=C >"$BENCH_DIR/initdb-restore.log" 2>&1
    as_user cp "$source_data/postgresql.conf" "$restore_data/postgresql.conf"
    as_user "$PGBIN/pg_ctl" -D "$restore_data" -l "$BENCH_DIR/postgresql-restore.log" -w start >/dev/null
}

source_cluster() {
    as_user "$PGBIN/pg_ctl" -D "$restore_data" -m fast -w stop >/dev/null
    rm -rf "$restore_data"
    as_user "$PGBIN/pg_ctl" -D "$source_data" -l "$BENCH_DIR/postgresql.log" -w start >/dev/null
}

pepsi_restore() {
    local base start left
    base=$(bench_sink_count)
    fresh_cluster
    sync
    start=$(now)
    as_user "$PGBIN/createdb" -h "$BENCH_DIR" -p "$BENCH_PORT" -U postgres "$BENCH_DB"
    as_user "$PGBIN/pg_restore" --single-transaction -h "$BENCH_DIR" -p "$BENCH_PORT" -U postgres \
        -d "$BENCH_DB" "$BENCH_DIR/pepsi.dump"
    restored=$(since "$start")
    bench_pepsi_start "$pepsi_port" "$stages"
    wait_sink $((base + messages))
    delivered=$(since "$start")
    echo "pepsi: restored in $restored s, the last message delivered at $delivered s" >>"$log"
    bench_pepsi_stop
    left=$(bench_queue_rows)
    [ "$left" -eq 0 ] || echo "warning: $left rows left in Pepsi's restored queue" >&2
    source_cluster
}

postfix_backup() {
    local start
    start=$(now)
    tar -C "$postfix_src" --warning=no-file-ignored -cf "$BENCH_DIR/postfix-spool.tar" spool
    sync "$BENCH_DIR/postfix-spool.tar"
    took=$(since "$start") size=$(mb "$BENCH_DIR/postfix-spool.tar")
}

postfix_restore() {
    local base start
    base=$(bench_sink_count)
    # The fresh instance: its configuration, and a first start that makes
    # its own queue directory, which the backup then replaces.
    postfix_dst=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
    bench_postfix_start "$postfix_dst" "$postfix_port" "relayhost = [127.0.0.1]:$sink_port" >/dev/null
    postfix_stop_wait "$postfix_dst"
    rm -rf "$postfix_dst/spool"
    # postsuper writes the log file itself when it runs as part of
    # postfix start (renaming the restored queue files to their new
    # inode numbers), as the mail owner.
    chown postfix: "$postfix_dst/maillog"
    sync
    start=$(now)
    tar -C "$postfix_dst" --warning=no-timestamp -xpf "$BENCH_DIR/postfix-spool.tar"
    # Started first: postsuper logs through the instance's postlogd.
    /usr/sbin/postfix -c "$postfix_dst/etc" start >>"$log" 2>&1
    /usr/sbin/postsuper -c "$postfix_dst/etc" -r ALL >>"$log" 2>&1
    restored=$(since "$start")
    echo "postfix: restored (tar -x, postfix start, postsuper -r ALL) in $restored s" >>"$log"
    wait_sink $((base + messages))
    delivered=$(since "$start")
    echo "postfix: the last message delivered at $delivered s" >>"$log"
    bench_postfix_stop "$postfix_dst"
    postfix_dst=
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
p_dump=() p_size=() p_restored=() p_delivered=() f_tar=() f_size=() f_restored=() f_delivered=() ratios=()
for ((r = 1; r <= repeats; r++)); do
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    pepsi_dump
    dump=$took dump_size=$size
    pepsi_restore
    p_dump+=("$dump") p_size+=("$dump_size") p_restored+=("$restored") p_delivered+=("$delivered")
    postfix_backup
    tar_s=$took tar_size=$size
    postfix_restore
    restored_pf=$restored delivered_pf=$delivered
    restored=${p_restored[-1]} delivered=${p_delivered[-1]}
    f_tar+=("$tar_s") f_size+=("$tar_size") f_restored+=("$restored_pf") f_delivered+=("$delivered_pf")
    ratios+=("$(ratio "$delivered_pf" "$delivered")")
    printf 'run %d (load %s): pepsi dump %s s %s MB, restored %s s, delivered %s s;' \
        "$r" "$load" "$dump" "$dump_size" "$restored" "$delivered" | tee -a "$log"
    printf ' postfix tar %s s %s MB, restored %s s, delivered %s s; ratio %s\n' \
        "$tar_s" "$tar_size" "$restored_pf" "$delivered_pf" "${ratios[-1]}" | tee -a "$log"
done

row() { # label values...
    local label=$1
    shift
    printf '  %-44s %8s (runs %s .. %s)\n' "$label" "$(bench_median "$@")" "$(min "$@")" "$(max "$@")"
}
{
    echo "medians of $repeats runs, $messages messages:"
    row "pepsi backup: pg_dump -Fc, s" "${p_dump[@]}"
    row "pepsi backup size, MB" "${p_size[@]}"
    row "postfix backup: tar of the spool, s" "${f_tar[@]}"
    row "postfix backup size, MB" "${f_size[@]}"
    row "pepsi restore: createdb + pg_restore, s" "${p_restored[@]}"
    row "postfix restore: tar -x + postsuper -r ALL, s" "${f_restored[@]}"
    row "pepsi restore to last delivered, s" "${p_delivered[@]}"
    row "postfix restore to last delivered, s" "${f_delivered[@]}"
    printf 'ratio postfix/pepsi (restore to last delivered): median %s, runs %s .. %s (target >= 1.00)\n' \
        "$(bench_median "${ratios[@]}")" "$(min "${ratios[@]}")" "$(max "${ratios[@]}")"
} | tee -a "$log"
