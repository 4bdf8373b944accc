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
#
# To aim psql or pgbench at another database: BENCH_DB=name bench_psql ...
#
# The cluster is durable on purpose (fsync and synchronous_commit on, full
# page writes on): commit latency is part of what a queue costs.  It has no
# TCP listener, only a socket in the scratch directory, so several can run
# at once.  As root it belongs to the unprivileged user of scripts/lib.sh,
# since initdb refuses root.

bench_top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$bench_top/scripts/lib.sh"

BENCH_DIR=
BENCH_PORT=${BENCH_PORT:-5432}
BENCH_DB=bench

bench_cleanup() {
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
autovacuum = off
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

bench_median() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) exit 1
              if (NR % 2) print v[(NR + 1) / 2]
              else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
