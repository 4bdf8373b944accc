#!/usr/bin/env bash
# A highly available PostgreSQL on one machine, for tests and bench/failover:
# one etcd and a three-node Patroni cluster with synchronous replication,
# every port on 127.0.0.1, every file under DIR, run as the calling
# (unprivileged) user with the PostgreSQL binaries of $PGBIN (else
# pg_config's).  What it stands for in production is docs/scaling.md.
#
#   ha.sh start DIR [BASE_PORT]   etcd on BASE_PORT (default 23790) and +1,
#                                 the nodes' PostgreSQL on BASE_PORT+11..13 and
#                                 their REST APIs on BASE_PORT+21..23; returns
#                                 once a leader accepts writes and both
#                                 standbys stream (at most HA_START_TIMEOUT
#                                 seconds, default 120)
#   ha.sh stop DIR                every process started under DIR (killed:
#                                 nothing is kept), then etcd
#   ha.sh ports DIR               the nodes' PostgreSQL ports, "a,b,c"
#   ha.sh leader DIR              the leader's PostgreSQL port (none: exit 1)
#   ha.sh kill-leader DIR         SIGKILL the leader's Patroni and postmaster
#                                 (a host lost); prints the port it had, and
#                                 the time of the kill (epoch seconds)
#   ha.sh switchover DIR          patronictl switchover from the leader to a
#                                 streaming standby (a planned move); prints
#                                 the port the leader had, and the time the
#                                 switchover was asked for
#
# The timing settings bound a failover (docs/scaling.md has the
# arithmetic): a dead leader's key lapses ttl seconds after its last
# renewal, which came at most loop_wait before the death; a standby
# watching the key (etcd3) takes it at once and promotes (about 1-2 s);
# the clients then find it within a tenth of the outage (pgconn.c).  So
# at most about ttl + 2 s: 10 s measured with ttl 10.  Patroni 3.0.2 sets no floor on ttl
# (its validator takes any integer); its documented rule is
# ttl >= loop_wait + 2 * retry_timeout, which 10 >= 1 + 2 * 3 keeps, with
# 9 s of slack for a leader on a busy machine to renew its key
# (each loop, every loop_wait) before a spurious failover.  HA_TTL,
# HA_LOOP_WAIT and HA_RETRY_TIMEOUT override them.
set -euo pipefail

HA_TTL=${HA_TTL:-10}
HA_LOOP_WAIT=${HA_LOOP_WAIT:-1}
HA_RETRY_TIMEOUT=${HA_RETRY_TIMEOUT:-3}
[ "$HA_TTL" -ge $((HA_LOOP_WAIT + 2 * HA_RETRY_TIMEOUT)) ] ||
    { echo "ha.sh: HA_TTL ($HA_TTL) must be at least HA_LOOP_WAIT + 2 * HA_RETRY_TIMEOUT ($((HA_LOOP_WAIT + 2 * HA_RETRY_TIMEOUT))), Patroni's rule" >&2; exit 1; }
HA_START_TIMEOUT=${HA_START_TIMEOUT:-120}

die() {
    echo "ha.sh: $*" >&2
    exit 1
}

[ $# -ge 2 ] || die "usage: ha.sh start|stop|ports|leader|kill-leader|switchover DIR [BASE_PORT]"
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
if [ "$(id -u)" -eq 0 ]; then
    # initdb refuses root: the cluster belongs to the unprivileged user (lib.sh).
    ensure_unprivileged_user
    if [ "$1" = start ]; then
        mkdir -p "$2"
        give_to_user "$2"
    fi
    exec runuser -u "$PEPSI_USER" -- env PGBIN="$PGBIN" "$0" "$@"
fi
command=$1
dir=$2
pgbin=$PGBIN

node_port() { echo $((base + 10 + $1)); }
rest_port() { echo $((base + 20 + $1)); }

load_base() {
    [ -f "$dir/base_port" ] || die "$dir holds no cluster (no $dir/base_port)"
    base=$(cat "$dir/base_port")
}

# psql ARGS... on the node that is primary now (not in recovery), found
# by one psql given the three hosts (target_session_attrs).
primary_psql() {
    "$pgbin/psql" -XAtq -d "host=127.0.0.1,127.0.0.1,127.0.0.1 port=$(node_port 1),$(node_port 2),$(node_port 3) dbname=postgres target_session_attrs=primary connect_timeout=5" "$@"
}

# The port of the node that is primary now, or nothing (exit 1).
leader_port() {
    local port
    port=$(primary_psql -c 'SHOW port' 2>/dev/null) && [ -n "$port" ] || return 1
    echo "$port"
}

# PEPSI_INITDB_TEMPLATE (scripts/check.sh's template data directory, one
# initdb for the whole run): the first node's data directory is a copy
# of it (Patroni's custom bootstrap) rather than an initdb of its own.
# HA_TEMPLATE, when set, is copied instead: t/161 gives check.sh's copy
# with the pepsi extension already created in database postgres, whose
# script (seconds of CPU, half a minute on a loaded machine) then runs
# once for the whole run, not once more on the leader.
template=${HA_TEMPLATE:-${PEPSI_INITDB_TEMPLATE:-}}
[ -n "$template" ] && [ -r "$template/PG_VERSION" ] || template=

# The bootstrap section's method: initdb, or the copy of the template.
bootstrap_method() {
    [ -n "$template" ] || return 0
    cat >"$dir/copy-template" <<SCRIPT
#!/bin/sh
# Patroni's custom bootstrap (ha.sh): the data directory, a copy of the template.
for arg; do case \$arg in --datadir=*) data=\${arg#--datadir=} ;; esac; done
cp -RPp '$template' "\$data" && chmod 700 "\$data"
SCRIPT
    chmod 755 "$dir/copy-template"
    printf '  method: template\n  template:\n    command: %s\n' "$dir/copy-template"
}

write_node_config() {
    local i=$1 user
    user=$(id -un)
    mkdir -p "$dir/node$i"
    cat >"$dir/node$i/patroni.yml" <<EOF
scope: pepsi-ha
name: node$i
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:$(rest_port "$i")
  connect_address: 127.0.0.1:$(rest_port "$i")
etcd3:
  hosts: 127.0.0.1:$base
bootstrap:
$(bootstrap_method)
  dcs:
    ttl: $HA_TTL
    loop_wait: $HA_LOOP_WAIT
    retry_timeout: $HA_RETRY_TIMEOUT
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 100
        max_worker_processes: 16
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 128MB
        # After a promotion the other standby must stream from the new
        # primary before a synchronous commit returns; it tries again
        # every wal_retrieve_retry_interval (5 s by default).
        wal_retrieve_retry_interval: 500ms
        fsync: "off"
  # No fsync of the new data directories (initdb, and pg_basebackup
  # below): the nodes run with fsync off, and a sync that waits on a disk
  # other work keeps busy only lengthens a start.
  initdb:
    - encoding: UTF8
    - locale: C
    - no-sync
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - local replication all trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$(node_port "$i")
  connect_address: 127.0.0.1:$(node_port "$i")
  data_dir: $dir/node$i/data
  basebackup:
    - no-sync
  bin_dir: $pgbin
  pgpass: $dir/node$i/pgpass
  authentication:
    superuser:
      username: $user
    replication:
      username: $user
  parameters:
    unix_socket_directories: $dir/node$i
EOF
}

case "$command" in
start)
    base=${3:-23790}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    echo "$base" >"$dir/base_port"
    # etcd's data in memory when it can be (/dev/shm): the nodes run with
    # fsync off, and an etcd write that waits seconds for a disk other
    # benchmarks keep busy would cost the leader its key (a spurious
    # failover).  In production etcd has a disk of its own.
    etcd_data=$(mktemp -d /dev/shm/pepsi-ha-etcd.XXXXXX 2>/dev/null) || etcd_data=$dir/etcd
    echo "$etcd_data" >"$dir/etcd_data"
    etcd --name ha --data-dir "$etcd_data" \
        --listen-client-urls "http://127.0.0.1:$base" \
        --advertise-client-urls "http://127.0.0.1:$base" \
        --listen-peer-urls "http://127.0.0.1:$((base + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((base + 1))" \
        --initial-cluster "ha=http://127.0.0.1:$((base + 1))" \
        >"$dir/etcd.log" 2>&1 &
    echo $! >"$dir/etcd.pid"
    for i in 1 2 3; do
        write_node_config "$i"
        patroni "$dir/node$i/patroni.yml" >"$dir/node$i/patroni.log" 2>&1 &
        echo $! >"$dir/node$i/patroni.pid"
    done
    deadline=$((SECONDS + HA_START_TIMEOUT))
    # One psql a round, not up to four.
    while :; do
        if [ "$(primary_psql -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'" 2>/dev/null)" = 2 ]; then
            break
        fi
        [ $SECONDS -lt $deadline ] || die "no leader with two streaming standbys after ${HA_START_TIMEOUT} s; see $dir/node*/patroni.log and $dir/etcd.log"
        sleep 0.2
    done
    ;;
stop)
    load_base
    # A throwaway cluster, with nothing to hand over: each Patroni is
    # killed rather than asked to stop (its orderly shutdown took some
    # 12 s of a loaded machine at the end of every t/161), first, so that
    # it restarts no PostgreSQL, and then each postmaster stops at once.
    for i in 1 2 3; do
        if [ -f "$dir/node$i/patroni.pid" ]; then
            kill -9 "$(cat "$dir/node$i/patroni.pid")" 2>/dev/null || :
        fi
    done
    for i in 1 2 3; do
        if [ -f "$dir/node$i/data/postmaster.pid" ]; then
            "$pgbin/pg_ctl" -D "$dir/node$i/data" -m immediate stop >/dev/null 2>&1 || :
        fi
    done
    deadline=$((SECONDS + 30))
    for i in 1 2 3; do
        pid=$(cat "$dir/node$i/patroni.pid" 2>/dev/null || :)
        while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
            sleep 0.1
        done
        [ -z "$pid" ] || kill -9 "$pid" 2>/dev/null || :
    done
    if [ -f "$dir/etcd.pid" ]; then
        pid=$(cat "$dir/etcd.pid")
        kill "$pid" 2>/dev/null || :
        deadline=$((SECONDS + 10))
        while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
            sleep 0.1
        done
    fi
    if [ -f "$dir/etcd_data" ]; then
        case $(cat "$dir/etcd_data") in
        /dev/shm/pepsi-ha-etcd.*) rm -rf "$(cat "$dir/etcd_data")" ;;
        esac
    fi
    ;;
ports)
    load_base
    echo "$(node_port 1),$(node_port 2),$(node_port 3)"
    ;;
leader)
    load_base
    leader_port || exit 1
    ;;
kill-leader)
    load_base
    port=$(leader_port) || die "no leader to kill"
    i=$((port - base - 10))
    kill -9 "$(cat "$dir/node$i/patroni.pid")" 2>/dev/null || :
    kill -9 "$(head -1 "$dir/node$i/data/postmaster.pid")" 2>/dev/null || :
    echo "$port $(date +%s.%N)"
    ;;
switchover)
    load_base
    port=$(leader_port) || die "no leader to switch over from"
    i=$((port - base - 10))
    at=$(date +%s.%N)
    # No candidate: under synchronous_mode Patroni takes the synchronous
    # standby (another is refused, and patronictl would still exit 0).
    patronictl -c "$dir/node$i/patroni.yml" switchover --leader "node$i" --force pepsi-ha \
        >"$dir/switchover.log" 2>&1 || die "patronictl switchover: $(cat "$dir/switchover.log")"
    deadline=$((SECONDS + 60))
    until new=$(leader_port) && [ "$new" != "$port" ]; do
        [ $SECONDS -lt $deadline ] || die "no new leader 60 s after the switchover: $(cat "$dir/switchover.log")"
        sleep 0.2
    done
    echo "$port $at"
    ;;
*)
    die "unknown command $command (start, stop, ports, leader, kill-leader, switchover)"
    ;;
esac
