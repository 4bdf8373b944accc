# shellcheck shell=bash
# Shared by the benchmarks: a throwaway, durable PostgreSQL cluster with the
# pepsi extension, and helpers to drive it.  Sourced, not run.
#
#   bench_cluster_start       initdb + start a cluster in a scratch directory
#                             under /tmp, create database "bench" with
#                             CREATE EXTENSION pepsi; stopped and removed on
#                             exit (it sets an EXIT trap: call bench_cleanup
#                             yourself if you replace the trap)
#   bench_psql ARGS...        psql on database $BENCH_DB ("bench", where
#                             the extension was created), stopping on error
#   bench_pgbench ARGS...     pgbench against database $BENCH_DB
#   bench_fresh_db TMPL NAME  (re)create database NAME as a file copy of
#                             TMPL, load its own tables and indexes into
#                             shared buffers and checkpoint, so every run
#                             starts from the same state, warm, with no
#                             checkpoint debt
#   bench_file PATH           copy PATH where the cluster's user can read
#                             it (a pgbench script) and print the copy's path
#   bench_tps FILE            the tps a pgbench output file reports
#   bench_median N...         the median of the numbers given (unrounded:
#                             the middle one as given, or the mean of the
#                             middle two)
#   min N... / max N...       the least / the greatest of the numbers given
#                             (as given; nothing when none)
#   bench_free_port           a free TCP port on 127.0.0.1
#   bench_log NAME            create bench/out/NAME.log empty and print its path
#   bench_stop_pid PID        SIGTERM a daemon started in the background, and
#                             wait for it (nothing when PID is empty)
#   bench_postfix_install     install postfix (and its smtp-source) if
#                             missing, answering debconf "No configuration"
#                             so that no system instance is set up
#   bench_postfix_start DIR PORT [main.cf line]...
#                             a private, stock Postfix instance in DIR (a
#                             new directory: its own etc/, spool/, data/,
#                             maillog), its smtpd on 127.0.0.1:PORT, the
#                             extra main.cf lines after the common ones
#                             (a line setting a common parameter again
#                             overrides it); with BENCH_POSTFIX_POSTSCREEN=1
#                             postscreen on that port, handing over to
#                             smtpd; waits for it to answer.  Stopped and
#                             removed by bench_cleanup (or
#                             bench_postfix_stop DIR)
#   bench_postfix_stop DIR    stop that instance and remove DIR
#   bench_postfix_count DIR QUEUE   the messages in one of its queues
#   bench_postfix_wait_deferred DIR N
#                             wait (up to 2 minutes) until all N messages
#                             sit in its deferred queue and no other; print N
#   bench_wait_port PORT WHAT [ADDRESS]
#                             wait (10 s at most) until 127.0.0.1:PORT (or
#                             ADDRESS:PORT) takes a connection; else say
#                             WHAT did not
#   bench_sink_start PORT     Postfix's smtp-sink on 127.0.0.1:PORT, counting
#                             what it takes (-c); stopped by bench_cleanup
#   bench_sink_count          how many messages the sink has taken so far
#   bench_sink_start_at ADDRESS PORT OUT [ARG]...
#                             another smtp-sink, on ADDRESS:PORT (an MX host
#                             of a simulated internet), counting into OUT,
#                             smtp-sink's ARGs (-w 1: slow) before the
#                             address; stopped by bench_cleanup
#   bench_sink_count_in OUT   how many messages that sink has taken
#   bench_sinks_count OUT...  how many messages those sinks have taken in
#                             all (two processes however many sinks: cheap
#                             enough to poll while a run is measured)
#   bench_dns_start ADDRESS PORT ZONE
#                             the tests' DNS server (t/lib/testdns.py) on
#                             ADDRESS:PORT serving the master-file lines of
#                             ZONE (re-read when it changes), as a recursive
#                             server answers; stopped by bench_cleanup
#   bench_require_programs P...  refuse to run unless build/bin has them
#   bench_pepsi_start PORT STAGES [LISTENER] [PEPSI]
#                             pepsi-dispatch and pepsi-ingress (its smtp
#                             listener on 127.0.0.1:PORT, with the extra
#                             lines LISTENER in its section) on the cluster,
#                             with the sections STAGES ([stage-*] and any
#                             other, e.g. [dkim-key-*]), and the [pepsi]
#                             lines PEPSI; the
#                             multi-call binary when it links (workers share
#                             one text, stages fuse), else the standalone
#                             programs ($BENCH_PEPSI_FLAVOUR says which).
#                             Sets BENCH_INGRESS_PID and BENCH_DISPATCH_PID;
#                             stopped by bench_cleanup or bench_pepsi_stop
#                             The configuration is $BENCH_DIR/pepsi.conf,
#                             or $BENCH_PEPSI_CONF when set; its [database]
#                             CONNINFO the cluster's, or $BENCH_CONNINFO
#   bench_pepsi_stop          stop them (to start again with other stages)
#   bench_root_dir            make BENCH_ROOT_DIR, a directory under /tmp
#                             that only root may write (a set-user-id
#                             helper trusts a configuration only when root
#                             owns its whole path); removed by bench_cleanup
#   bench_ingress_start CONF [CONNECTIONS]
#                             pepsi-ingress alone, from CONF (its stderr in
#                             $BENCH_DIR/ingress-stderr.log); waits until its
#                             CONNECTIONS (default 4) database connections
#                             are ready.  Sets BENCH_INGRESS_PID; stopped by
#                             bench_cleanup or bench_ingress_stop
#   bench_ingress_stop        stop it
#   bench_tree_ticks PID      the CPU clock ticks (getconf CLK_TCK a second)
#                             a process has used, with its reaped children's
#                             and its live children's: the difference of two
#                             calls is what the process and its children
#                             (a postmaster's backends, Postfix's master's
#                             smtpd and cleanup) used between them
#   bench_queue_rows          the rows of pepsi.workqueue
#   bench_queue_empty [TABLE...]
#                             empty the queue, its bodies and TABLEs (tried
#                             again after a deadlock), and checkpoint
#   bench_postfix_drop_held DIR
#                             delete the messages an instance holds, sync
#   bench_dispatch_user       the [dispatch] USER line as root (the
#                             unprivileged user: pepsi-dispatch refuses to
#                             run stages as root), nothing otherwise; what
#                             the stages read must be readable by that user
#                             (give_to_user)
#   bench_dovecot_start DIR [PASSWD_FILE]
#                             a private Dovecot in DIR (a new directory,
#                             made if missing: under BENCH_DIR it goes with
#                             the scratch directory even if the run ends
#                             before Dovecot starts; base_dir, Maildirs
#                             under DIR/mail/<user>, static userdb) as the
#                             unprivileged user,
#                             LMTP on the Unix socket DIR/run/lmtp (mode
#                             0666, so Postfix's lmtp(8) reaches it too);
#                             mail is fsynced (mail_fsync = always: durable).
#                             With PASSWD_FILE (user:{SCHEME}hash lines,
#                             readable by that user) its passdb, and SASL
#                             for Postfix's smtpd (smtpd_sasl_type =
#                             dovecot) on DIR/run/auth-client (mode 0666).
#                             Stopped and removed by bench_cleanup (or
#                             bench_dovecot_stop DIR)
#   bench_dovecot_stop DIR    stop that instance (DIR stays: bench_cleanup
#                             removes it)
#   bench_dovecot_delivered DIR   the messages in its Maildirs' new/
#   bench_private_network DNS_ADDRESS COMMAND...
#                             run the rest of the benchmark in a private
#                             network and mount namespace (unshare; root
#                             only): re-executes COMMAND ("$0" "$@") there
#                             unless already in it, then brings loopback
#                             up with DNS_ADDRESS on it too, lets anyone
#                             bind ports below 1024, and points
#                             /etc/resolv.conf (bind-mounted, the host's
#                             untouched) at DNS_ADDRESS
#   bench_daemon LOG COMMAND...
#                             start COMMAND in the background, its stderr
#                             appended to LOG; stopped by bench_cleanup (or
#                             bench_daemons_stop), with the child of an
#                             as_user COMMAND (runuser's) too
#   bench_daemons_stop        stop what bench_daemon started
#   bench_opendkim_start DIR PORT DNS_ADDRESS
#                             Debian's OpenDKIM verifying, as a milter on
#                             127.0.0.1:PORT, resolving through
#                             DNS_ADDRESS, as the unprivileged user; its
#                             configuration and log in DIR
#   bench_opendmarc_start DIR PORT [opendmarc.conf line]...
#                             Debian's OpenDMARC the same way, with the
#                             extra lines after the common ones
#                             (both filters check loopback clients too)
#   bench_noop_milter_start PORT
#                             bench/milter/noop-milter.c (a C milter that
#                             asks for every step and answers CONTINUE)
#                             built and started on 127.0.0.1:PORT;
#                             stopped by bench_cleanup
#   bench_noop_milter_count   how many messages it has seen so far
#   bench_tls_certificate DIR a self-signed certificate for 127.0.0.1,
#                             DIR/cert.pem, and its key DIR/key.pem (mode
#                             0600, the pepsi user's when run as root:
#                             pepsi-ingress refuses a key its USER could not
#                             read again on a reload; Postfix reads it as
#                             root before it drops privileges)
#
# To aim psql or pgbench at another database: BENCH_DB=name bench_psql ...
#
# The cluster is durable on purpose (fsync and synchronous_commit on, full
# page writes on): commit latency is part of what a queue costs.  Autovacuum
# is on with the server's defaults, as a user's cluster has it: a queue
# table churns, and what vacuum costs it (and what it costs to go without)
# is part of the measure.  It has no
# TCP listener, only a socket in the scratch directory, so several can run
# at once.  As root it belongs to the unprivileged user of scripts/lib.sh,
# since initdb refuses root.

# The daemons a benchmark starts log to stderr (its log files), not syslog.
export PEPSI_LOG=stderr

bench_top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$bench_top/scripts/lib.sh"

BENCH_DIR=
BENCH_PORT=${BENCH_PORT:-5432}
BENCH_DB=bench
BENCH_POSTFIX_DIRS=()
BENCH_DOVECOT_DIRS=()
BENCH_SINK_PID=
BENCH_SINK_PIDS=()
BENCH_DNS_PID=
BENCH_MILTER_PID=
BENCH_INGRESS_PID=
BENCH_DISPATCH_PID=
BENCH_PEPSI_FLAVOUR=
BENCH_PEPSI_CONF=
BENCH_ROOT_DIR=
BENCH_DAEMON_PIDS=()
BENCH_RESOLV=

bench_cleanup() {
    local dir pid
    bench_daemons_stop
    bench_stop_pid "$BENCH_INGRESS_PID"
    bench_stop_pid "$BENCH_DISPATCH_PID"
    bench_stop_pid "$BENCH_SINK_PID"
    for pid in ${BENCH_SINK_PIDS[@]+"${BENCH_SINK_PIDS[@]}"}; do
        bench_stop_pid "$pid"
    done
    bench_stop_pid "$BENCH_DNS_PID"
    bench_stop_pid "$BENCH_MILTER_PID"
    BENCH_INGRESS_PID= BENCH_DISPATCH_PID= BENCH_SINK_PID= BENCH_SINK_PIDS=() BENCH_DNS_PID= BENCH_MILTER_PID=
    for dir in ${BENCH_POSTFIX_DIRS[@]+"${BENCH_POSTFIX_DIRS[@]}"}; do
        bench_postfix_stop "$dir"
    done
    for dir in ${BENCH_DOVECOT_DIRS[@]+"${BENCH_DOVECOT_DIRS[@]}"}; do
        bench_dovecot_stop "$dir"
        rm -rf "$dir"
    done
    BENCH_DOVECOT_DIRS=()
    [ -z "$BENCH_ROOT_DIR" ] || rm -rf "$BENCH_ROOT_DIR"
    BENCH_ROOT_DIR=
    [ -z "$BENCH_RESOLV" ] || rm -f "$BENCH_RESOLV"
    BENCH_RESOLV=
    [ -n "$BENCH_DIR" ] && [ -d "$BENCH_DIR" ] || return 0
    if [ -f "$BENCH_DIR/data/postmaster.pid" ]; then
        as_user "$PGBIN/pg_ctl" -D "$BENCH_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    fi
    rm -rf "$BENCH_DIR"
    BENCH_DIR=
}

# bench_cluster_start [postgresql.conf line]...: extra lines go after ours.
bench_cluster_start() {
    ensure_unprivileged_user
    BENCH_DIR=$(mktemp -d /tmp/pepsi-bench.XXXXXX)
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
    chmod 755 "$BENCH_DIR"
    give_to_user "$BENCH_DIR"

    as_user "$PGBIN/initdb" -D "$BENCH_DIR/data" -U postgres --auth=trust \
        --no-instructions -E UTF8 --locale=C >"$BENCH_DIR/initdb.log" 2>&1 || {
        cat "$BENCH_DIR/initdb.log" >&2
        return 1
    }
    {
        cat <<CONF
# Throwaway benchmark cluster (bench/lib.sh)
listen_addresses = ''
port = $BENCH_PORT
unix_socket_directories = '$BENCH_DIR'
fsync = on
synchronous_commit = on
full_page_writes = on
shared_buffers = 1536MB
# Checkpoints only where a benchmark asks for them (CHECKPOINT before each
# run), so no run pays for one the other side did not.
max_wal_size = 8GB
checkpoint_timeout = 1h
# Autovacuum as users run it (the server's defaults): the extension sets
# pepsi.workqueue's own thresholds, and a queue must do well with them.
autovacuum = on
log_min_messages = warning
CONF
        printf '%s\n' "$@"
    } | as_user tee -a "$BENCH_DIR/data/postgresql.conf" >/dev/null

    as_user "$PGBIN/pg_ctl" -D "$BENCH_DIR/data" -l "$BENCH_DIR/postgresql.log" -w start >/dev/null || {
        cat "$BENCH_DIR/postgresql.log" >&2
        return 1
    }
    as_user "$PGBIN/psql" -X -q -h "$BENCH_DIR" -p "$BENCH_PORT" -U postgres -d postgres \
        -c "CREATE DATABASE $BENCH_DB" >/dev/null
    bench_psql -c "CREATE EXTENSION pepsi" -c "CREATE EXTENSION pg_prewarm" >/dev/null
}

bench_psql() {
    as_user "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$BENCH_DIR" -p "$BENCH_PORT" \
        -U postgres -d "$BENCH_DB" "$@"
}

bench_pgbench() {
    as_user "$PGBIN/pgbench" -h "$BENCH_DIR" -p "$BENCH_PORT" -U postgres "$@" "$BENCH_DB"
}

bench_fresh_db() {
    local template=$1 name=$2
    BENCH_DB=postgres bench_psql -c "SET client_min_messages = warning" \
        -c "DROP DATABASE IF EXISTS $name" \
        -c "CREATE DATABASE $name TEMPLATE $template STRATEGY FILE_COPY" >/dev/null
    BENCH_DB=$name bench_psql -c "
        SELECT count(pg_prewarm(oid)) FROM pg_class
        WHERE relkind IN ('r', 'i', 't') AND oid >= 16384" \
        -c "CHECKPOINT" >/dev/null
}

bench_file() {
    local copy
    copy="$BENCH_DIR/$(basename "$1")"
    cp "$1" "$copy"
    give_to_user "$copy"
    printf '%s\n' "$copy"
}

bench_tps() {
    sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$1"
}

# (sed -n 1p, not head -1: under set -o pipefail, a head that leaves
# early can kill sort with SIGPIPE and fail the caller.)
min() { printf '%s\n' "$@" | sort -g | sed -n 1p; }
max() { printf '%s\n' "$@" | sort -g | tail -n 1; }

bench_median() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) exit 1
              if (NR % 2) print v[(NR + 1) / 2]
              else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

bench_log() {
    mkdir -p "$bench_top/bench/out"
    : >"$bench_top/bench/out/$1.log"
    printf '%s\n' "$bench_top/bench/out/$1.log"
}

bench_stop_pid() {
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

bench_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

bench_postfix_install() {
    if ! command -v /usr/sbin/smtp-source >/dev/null || ! command -v /usr/sbin/postfix >/dev/null; then
        echo "installing postfix (no system configuration)"
        echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postfix >/dev/null
    fi
}

bench_postfix_start() {
    local dir=$1 port=$2
    shift 2
    bench_postfix_install
    mkdir -p "$dir/etc" "$dir/spool" "$dir/data"
    chmod 755 "$dir"
    chown postfix: "$dir/data"
    BENCH_POSTFIX_DIRS+=("$dir")
    # The stock master.cf: its smtpd on our loopback port, and no chroot
    # (Debian's init script would have to furnish one in our queue).  With
    # BENCH_POSTFIX_POSTSCREEN=1, postscreen on that port instead, as
    # master.cf's comments enable it (postscreen, smtpd pass, dnsblog,
    # tlsproxy).
    awk -v listen="127.0.0.1:$port" -v postscreen="${BENCH_POSTFIX_POSTSCREEN:-}" '
        postscreen && /^smtp +inet .* smtpd$/ { $0 = "#" $0 }
        postscreen && /^#smtp +inet .* postscreen$/ { sub(/^#/, "") }
        postscreen && /^#(smtpd +pass|dnsblog +unix|tlsproxy +unix) / { sub(/^#/, "") }
        /^smtp +inet / { $1 = listen }
        /^[a-z0-9]/ && NF >= 8 && $5 == "y" { $5 = "n" }
        { print }' /usr/share/postfix/master.cf.dist >"$dir/etc/master.cf"
    grep -q "^127.0.0.1:$port inet" "$dir/etc/master.cf"
    {
        cat <<CONF
# Stock Postfix apart from where it lives (bench/lib.sh), then the
# benchmark's own lines.
compatibility_level = 3.6
queue_directory = $dir/spool
data_directory = $dir/data
command_directory = /usr/sbin
daemon_directory = /usr/lib/postfix/sbin
meta_directory = /etc/postfix
mail_owner = postfix
setgid_group = postdrop
myhostname = postfix.bench.test
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mydestination =
mynetworks = 127.0.0.0/8
alias_maps =
alias_database =
maillog_file_prefixes = $dir
maillog_file = $dir/maillog
CONF
        printf '%s\n' "$@"
    } >"$dir/etc/main.cf"
    /usr/sbin/postfix -c "$dir/etc" check >/dev/null 2>&1 || true
    /usr/sbin/postfix -c "$dir/etc" start >/dev/null 2>&1
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "postfix did not come up (see $dir/maillog)" >&2
    return 1
}

bench_postfix_stop() {
    local dir=$1 i
    [ -n "$dir" ] && [ -d "$dir" ] || return 0
    /usr/sbin/postfix -c "$dir/etc" stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    for i in "${!BENCH_POSTFIX_DIRS[@]}"; do
        [ "${BENCH_POSTFIX_DIRS[$i]}" = "$dir" ] && unset 'BENCH_POSTFIX_DIRS[i]'
    done
    return 0
}

bench_wait_port() {
    for _ in $(seq 1 100); do
        # In a subshell: a failed exec of a redirection must not end this shell.
        (exec 3<>"/dev/tcp/${3:-127.0.0.1}/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1: $2" >&2
    return 1
}

# The sink writes "... mesg=N\r" as it goes (-c); its output is in the
# scratch directory.
bench_sink_start() {
    /usr/sbin/smtp-sink -u "$PEPSI_USER" -c "127.0.0.1:$1" 256 >"$BENCH_DIR/sink.out" 2>&1 &
    BENCH_SINK_PID=$!
    bench_wait_port "$1" smtp-sink
}

bench_sink_count() {
    bench_sink_count_in "$BENCH_DIR/sink.out"
}

bench_sink_start_at() {
    local address=$1 port=$2 out=$3
    shift 3
    /usr/sbin/smtp-sink -u "$PEPSI_USER" -c "$@" "$address:$port" 256 >"$out" 2>&1 &
    BENCH_SINK_PIDS+=($!)
    bench_wait_port "$port" "smtp-sink on $address" "$address"
}

bench_sink_count_in() {
    local n
    n=$(tail -c 200 "$1" | tr '\r' '\n' | sed -n 's/.*mesg=\([0-9]*\).*/\1/p' | tail -1)
    printf '%s\n' "${n:-0}"
}

bench_sinks_count() {
    tail -c 200 -- "$@" 2>/dev/null | awk 'BEGIN { RS = "[\r\n]" }
        /^==> .* <==$/ { file = $0; next }
        match($0, /mesg=[0-9]+/) { last[file] = substr($0, RSTART + 5, RLENGTH - 5) }
        END { for (f in last) n += last[f]; print n + 0 }'
}

bench_dns_start() {
    local address=$1 port=$2 zone=$3 out="$BENCH_DIR/dns.out"
    /usr/bin/python3 "$bench_top/t/lib/testdns.py" "$zone" "$port" "$address" >"$out" 2>&1 &
    BENCH_DNS_PID=$!
    for _ in $(seq 1 100); do
        grep -q ready "$out" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "the DNS server did not start: $(cat "$out")" >&2
    return 1
}

bench_noop_milter_start() {
    cc -O2 -o "$BENCH_DIR/noop-milter" "$bench_top/bench/milter/noop-milter.c" -lpthread
    "$BENCH_DIR/noop-milter" "$1" >"$BENCH_DIR/milter.out" 2>&1 &
    BENCH_MILTER_PID=$!
    bench_wait_port "$1" noop-milter
}

# It prints its count on SIGUSR1: wait (a second at most) for the new line.
bench_noop_milter_count() {
    local before
    before=$(grep -c '^messages ' "$BENCH_DIR/milter.out" || true)
    kill -USR1 "$BENCH_MILTER_PID"
    for _ in $(seq 1 100); do
        [ "$(grep -c '^messages ' "$BENCH_DIR/milter.out" || true)" -gt "$before" ] && break
        sleep 0.01
    done
    sed -n 's/^messages //p' "$BENCH_DIR/milter.out" | tail -1
}

bench_pepsi_start() {
    local port=$1 stages=$2 listener=${3:-} pepsi_lines=${4:-} bin="$bench_top/build/bin" conf=${BENCH_PEPSI_CONF:-$BENCH_DIR/pepsi.conf} run
    if [ -x "$bin/pepsi" ] && { "$bin/pepsi" 2>&1 || true; } | grep -q pepsi-dispatch; then
        run="$bin/pepsi"
        BENCH_PEPSI_FLAVOUR="multi-call binary"
    else
        run=
        BENCH_PEPSI_FLAVOUR="standalone programs"
    fi
    cat >"$conf" <<CONF
[pepsi]
HOSTNAME = pepsi.bench.test
$pepsi_lines
[database]
CONNINFO = ${BENCH_CONNINFO:-host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres}
[dispatch]
POLL_INTERVAL = 1s
WORKER_IDLE_TIMEOUT = 60s
$(bench_dispatch_user)
[ingress]
USER = $PEPSI_USER
DISPATCH_WAKE_INTERVAL = 5ms
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
MAX_SESSIONS_PER_CLIENT = 0
$listener
$stages
CONF
    ${run:-$bin/pepsi-dispatch} ${run:+pepsi-dispatch} -c "$conf" 2>>"$BENCH_DIR/dispatch.log" &
    BENCH_DISPATCH_PID=$!
    ${run:-$bin/pepsi-ingress} ${run:+pepsi-ingress} -c "$conf" 2>>"$BENCH_DIR/ingress.log" &
    BENCH_INGRESS_PID=$!
    bench_wait_port "$port" "pepsi-ingress (see $BENCH_DIR/ingress.log)"
}

bench_ingress_start() {
    local conf=$1 connections=${2:-4} log="$BENCH_DIR/ingress-stderr.log" seen=0
    bench_ingress_stop
    # Only this start's lines count: a restart appends to the same log.
    [ ! -f "$log" ] || seen=$(wc -l <"$log")
    "$bench_top/build/bin/pepsi-ingress" -c "$conf" 2>>"$log" &
    BENCH_INGRESS_PID=$!
    for _ in $(seq 1 100); do
        tail -n +$((seen + 1)) "$log" | grep -q "database connection $((connections - 1)) ready" && return 0
        sleep 0.1
    done
    echo "pepsi-ingress did not come up:" >&2
    tail -n 20 "$log" >&2
    return 1
}

bench_ingress_stop() {
    bench_stop_pid "$BENCH_INGRESS_PID"
    BENCH_INGRESS_PID=
}

bench_tree_ticks() {
    # cat, not awk's own files: a process may end between the glob and the
    # read.  Fields after the command name (which may hold spaces) from 3.
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v parent="$1" '
        { pid = $1; sub(/^.*\) /, ""); split($0, f, " ") }
        pid == parent || f[2] == parent { total += f[12] + f[13] + f[14] + f[15] }
        END { print total + 0 }'
}

bench_queue_rows() {
    bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue"
}

# The TRUNCATE can deadlock with a session that holds the bodies' table
# and then reads the queue (the maintenance worker's body GC does), the
# other order from TRUNCATE's: it is tried again, and a bench whose queue
# cannot be emptied stops rather than measure over the last run's rows.
bench_queue_empty() {
    local tables="pepsi.workqueue, pepsi.workqueue_body" table attempt
    for table in "$@"; do tables+=", $table"; done
    for attempt in 1 2 3 4 5; do
        bench_psql -c "TRUNCATE $tables RESTART IDENTITY" >/dev/null && break
        ((attempt < 5)) || { echo "bench: cannot empty the queue ($tables)" >&2; exit 1; }
        sleep 1
    done
    bench_psql -c CHECKPOINT >/dev/null
}

bench_postfix_drop_held() {
    /usr/sbin/postsuper -c "$1/etc" -d ALL hold >/dev/null 2>&1 || true
    sync
}

bench_root_dir() {
    BENCH_ROOT_DIR=$(mktemp -d /tmp/pepsi-bench-root.XXXXXX)
    chmod 755 "$BENCH_ROOT_DIR"
}

bench_dispatch_user() {
    [ "$(id -u)" -ne 0 ] || echo "USER = $PEPSI_USER"
}

bench_pepsi_stop() {
    bench_stop_pid "$BENCH_INGRESS_PID"
    bench_stop_pid "$BENCH_DISPATCH_PID"
    BENCH_INGRESS_PID= BENCH_DISPATCH_PID=
}

bench_require_programs() {
    local p
    for p in "$@"; do
        [ -x "$bench_top/build/bin/$p" ] || { echo "build $p first (make programs)" >&2; exit 1; }
    done
}

bench_postfix_count() {
    find "$1/spool/$2" -type f 2>/dev/null | wc -l
}

bench_postfix_wait_deferred() {
    local dir=$1 want=$2 deferred=0 i
    for ((i = 0; i < 1200; i++)); do
        deferred=$(bench_postfix_count "$dir" deferred)
        if [ "$deferred" -ge "$want" ] \
            && [ $(($(bench_postfix_count "$dir" incoming) + $(bench_postfix_count "$dir" active) \
                    + $(bench_postfix_count "$dir" maildrop))) -eq 0 ]; then
            break
        fi
        sleep 0.1
    done
    if [ "$deferred" -ne "$want" ]; then
        echo "postfix deferred $deferred messages of $want (incoming $(bench_postfix_count "$dir" incoming)," \
            "active $(bench_postfix_count "$dir" active)); see $dir/maillog" >&2
        return 1
    fi
    echo "$deferred"
}

bench_dovecot_start() {
    local dir=$1 passwd=${2:-} user group uid gid passdb sasl=
    user=$PEPSI_USER
    [ "$(id -u)" -eq 0 ] || user=$(id -un)
    group=$(id -gn "$user") uid=$(id -u "$user") gid=$(id -g "$user")
    mkdir -p "$dir/run" "$dir/mail" "$dir/state"
    chmod 755 "$dir"
    give_to_user "$dir"
    BENCH_DOVECOT_DIRS+=("$dir")
    # LMTP needs only the userdb; auth refuses to start without a passdb.
    passdb="driver = static
  args = nopassword=y"
    if [ -n "$passwd" ]; then
        passdb="driver = passwd-file
  args = $passwd"
        sasl="unix_listener auth-client {
    mode = 0666
  }"
    fi
    cat >"$dir/dovecot.conf" <<CONF
# A private Dovecot for the benchmarks (bench/lib.sh): LMTP, and SASL when
# it has a passwd file.
base_dir = $dir/run
state_dir = $dir/state
log_path = $dir/dovecot.log
instance_name = pepsi-bench-$$
default_internal_user = $user
default_internal_group = $group
default_login_user = $user
first_valid_uid = $uid
last_valid_uid = $uid
protocols = lmtp
ssl = no
listen = 127.0.0.1
auth_username_format = %Ln
mail_location = maildir:~/Maildir
mail_fsync = always
passdb {
  $passdb
}
userdb {
  driver = static
  args = uid=$uid gid=$gid home=$dir/mail/%n
}
service lmtp {
  unix_listener lmtp {
    mode = 0666
  }
}
service auth {
  user = $user
  $sasl
}
service auth-worker {
  user = $user
}
service anvil {
  chroot =
}
service stats {
  chroot =
}
CONF
    give_to_user "$dir/dovecot.conf"
    as_user /usr/sbin/dovecot -c "$dir/dovecot.conf" || {
        cat "$dir/dovecot.log" >&2
        return 1
    }
    for _ in $(seq 1 100); do
        [ -S "$dir/run/lmtp" ] && return 0
        sleep 0.1
    done
    echo "dovecot did not come up (see $dir/dovecot.log)" >&2
    return 1
}

bench_dovecot_stop() {
    [ -f "$1/dovecot.conf" ] && [ -f "$1/run/master.pid" ] || return 0
    as_user /usr/sbin/dovecot -c "$1/dovecot.conf" stop >/dev/null 2>&1 || true
    for _ in $(seq 1 100); do
        [ -f "$1/run/master.pid" ] || return 0
        sleep 0.1
    done
}

bench_dovecot_delivered() {
    find "$1/mail" -path '*/new/*' -type f 2>/dev/null | wc -l
}

bench_tls_certificate() {
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=localhost" \
        -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
        -keyout "$1/key.pem" -out "$1/cert.pem" >/dev/null 2>&1
    chmod 600 "$1/key.pem"
    if [ "$(id -u)" -eq 0 ]; then chown "$PEPSI_USER" "$1/key.pem"; fi
}

bench_private_network() {
    local address=$1
    shift
    if [ -z "${BENCH_IN_NAMESPACE:-}" ]; then
        [ "$(id -u)" -eq 0 ] || {
            echo "bench/$(basename "$(dirname "$1")") runs as root (it unshares a network namespace)" >&2
            exit 1
        }
        exec unshare --net --mount --propagation private env BENCH_IN_NAMESPACE=1 "$@"
    fi
    ip link set lo up
    ip addr add "$address/32" dev lo
    sysctl -qw net.ipv4.ip_unprivileged_port_start=0
    ensure_unprivileged_user
    BENCH_RESOLV=$(mktemp /tmp/pepsi-bench-resolv.XXXXXX)
    echo "nameserver $address" >"$BENCH_RESOLV"
    chmod 644 "$BENCH_RESOLV"
    mount --bind "$BENCH_RESOLV" /etc/resolv.conf
}

bench_daemon() {
    local log=$1
    shift
    "$@" 2>>"$log" &
    BENCH_DAEMON_PIDS+=($!)
}

bench_daemons_stop() {
    local pid
    for pid in ${BENCH_DAEMON_PIDS[@]+"${BENCH_DAEMON_PIDS[@]}"}; do
        pkill -TERM -P "$pid" 2>/dev/null || true
        bench_stop_pid "$pid"
    done
    BENCH_DAEMON_PIDS=()
}

# The filters skip loopback clients by default; the benchmarks' come from
# there, so the hosts they skip are one no client has.
bench_milter_ignore_hosts() {
    echo 192.0.2.255 >"$1/ignore-hosts"
}

bench_opendkim_start() {
    local dir=$1 port=$2 dns=$3
    bench_milter_ignore_hosts "$dir"
    cat >"$dir/opendkim.conf" <<CONF
Mode                v
Socket              inet:$port@127.0.0.1
Background          no
PidFile             $dir/opendkim.pid
AuthservID          postfix.bench.test
Nameservers         $dns
InternalHosts       $dir/ignore-hosts
Syslog              no
CONF
    give_to_user "$dir"
    bench_daemon "$dir/opendkim.log" as_user /usr/sbin/opendkim -f -x "$dir/opendkim.conf"
    bench_wait_port "$port" "opendkim (see $dir/opendkim.log)"
}

bench_opendmarc_start() {
    local dir=$1 port=$2
    shift 2
    bench_milter_ignore_hosts "$dir"
    {
        cat <<CONF
Socket              inet:$port@127.0.0.1
Background          false
PidFile             $dir/opendmarc.pid
AuthservID          postfix.bench.test
TrustedAuthservIDs  postfix.bench.test
PublicSuffixList    /usr/share/publicsuffix/public_suffix_list.dat
IgnoreHosts         $dir/ignore-hosts
Syslog              false
CONF
        printf '%s\n' "$@"
    } >"$dir/opendmarc.conf"
    give_to_user "$dir"
    bench_daemon "$dir/opendmarc.log" as_user /usr/sbin/opendmarc -f -c "$dir/opendmarc.conf"
    bench_wait_port "$port" "opendmarc (see $dir/opendmarc.log)"
}
