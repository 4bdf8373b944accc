#!/usr/bin/env bash
# Native queue functions against bare SQL making the same writes, side by
# side on one private, durable cluster:
#
#   add 4KB         pepsi.workqueue_add of a 4 KB message, against the body
#                   and queue rows inserted by one bare CTE statement
#   advance 1       pepsi.workqueue_commit(id, 's1', 'advance', 's2') of a
#                   running row, against the bare guarded UPDATE
#   advance 100     pepsi.workqueue_commit_many of 100 running rows, against
#                   one bare guarded UPDATE of the same 100 rows
#
# Each pair runs native, bare, native, bare, ... (BENCH_REPS times each),
# every run on a fresh file copy of the same template database (same table
# state on both sides, warm buffers, checkpoint just taken).  Prints the
# median tps of each side and native/bare; the target is >= 0.80.  Reports,
# never fails the build: exits 0 unless the benchmark itself broke.
#
# Knobs: BENCH_SECONDS (per run, default 5), BENCH_REPS (runs per side,
# default 5), BENCH_CLIENTS (4), BENCH_THREADS (2), BENCH_ROWS and
# BENCH_ROWS100 (running rows preloaded for the single and batch advances;
# by default 40000 and 200000 per second of run), BENCH_PAIRS (which pairs
# to run: "add advance batch").
# Raw pgbench output goes to bench/out/transitions-<time>/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib.sh
. "$here/../lib.sh"

seconds=${BENCH_SECONDS:-5}
reps=${BENCH_REPS:-5}
clients=${BENCH_CLIENTS:-4}
threads=${BENCH_THREADS:-2}
# Each row advances once, so the preloads must outlast the fastest run.
rows1=${BENCH_ROWS:-$((seconds * 40000))}
rows100=${BENCH_ROWS100:-$((seconds * 200000))}
pairs=${BENCH_PAIRS:-add advance batch}
target=0.80

out="$bench_top/bench/out/transitions-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"

# shellcheck disable=SC2119
bench_cluster_start

# The message: a 4 KB body (base64 text, as an attachment travels) and
# about 600 bytes of headers, passed as bytea parameters in hex.
hex() { od -An -v -tx1 | tr -d ' \n'; }
body=$(head -c 4096 /dev/urandom | base64 -w 76 | head -c 4096 | hex)
headers=$(for i in $(seq 1 8); do
              printf 'Received: from mx%d.example.net (mx%d.example.net [192.0.2.%d])\r\n' "$i" "$i" "$i"
          done | head -c 600 | hex)
message=(-D mail_from=sender@example.org -D 'rcpt_to={rcpt@example.net}'
         -D "headers=\\x$headers" -D "body=\\x$body")

# Templates: "bench" (empty queue) for admission; "bench_rows1" and
# "bench_rows100" with rows running at stage s1, all sharing one body, for
# the single and batch advances.  The sequences hand out those rows' ids:
# one per advance, 100 per batch.
bench_psql -c "CREATE SEQUENCE bench_ids" -c "CREATE SEQUENCE bench_batches INCREMENT 100" \
    -c "VACUUM ANALYZE" >/dev/null
load_rows() {
    local db=$1 n=$2
    echo "Loading $n running rows into $db ..."
    BENCH_DB=postgres bench_psql -c "CREATE DATABASE $db TEMPLATE bench STRATEGY FILE_COPY"
    BENCH_DB=$db bench_psql >/dev/null <<SQL
INSERT INTO pepsi.workqueue_body (body) VALUES ('\\x$body');
INSERT INTO pepsi.workqueue (stage, status, mail_from, rcpt_to, headers, body_id)
SELECT 's1', 'running', 'sender@example.org', '{rcpt@example.net}', '\\x$headers', 1
FROM generate_series(1, $n);
VACUUM ANALYZE;
SQL
}
case " $pairs " in *" advance "*) load_rows bench_rows1 "$rows1" ;; esac
case " $pairs " in *" batch "*) load_rows bench_rows100 "$rows100" ;; esac

{
    echo "commit: $(git -C "$bench_top" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "date: $(date -Is)"
    echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "postgres: $("$PGBIN/postgres" --version)"
    echo "pgbench: -M prepared -c $clients -j $threads -T $seconds, $reps runs per side"
    echo "preloaded running rows: $rows1 (advance 1), $rows100 (advance 100)"
} >"$out/summary.txt"

# run PAIR SIDE REP: one pgbench run on a fresh copy; sets tps.
run() {
    local pair=$1 side=$2 rep=$3 template per_tx=1 extra=() log processed written
    case $pair in
    add) template=bench extra=("${message[@]}") ;;
    advance) template=bench_rows1 ;;
    batch) template=bench_rows100 per_tx=100 ;;
    esac
    log="$out/$pair-$side-$rep.txt"
    bench_fresh_db "$template" bench_run
    BENCH_DB=bench_run bench_pgbench -n -M prepared -c "$clients" -j "$threads" -T "$seconds" \
        -f "$(bench_file "$here/${pair}_$side.sql")" "${extra[@]}" >"$log" 2>&1 || true
    tps=$(bench_tps "$log")
    processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log")
    if [ -z "$tps" ] || grep -qE 'aborted|^pgbench: error' "$log"; then
        echo "$pair $side run $rep broke; its output:" >&2
        cat "$log" >&2
        exit 1
    fi
    # Check the run did what it claims: every transaction admitted a row or
    # advanced its rows, and the preload did not run out.
    if [ "$pair" = add ]; then
        written=$(BENCH_DB=bench_run bench_psql -tAc "SELECT count(*) FROM pepsi.workqueue")
    else
        written=$(BENCH_DB=bench_run bench_psql -tAc "SELECT count(*) FROM pepsi.workqueue WHERE stage = 's2'")
        if [ "$(BENCH_DB=bench_run bench_psql -tAc "SELECT count(*) FROM pepsi.workqueue WHERE stage = 's1'")" -eq 0 ]; then
            echo "$pair $side run $rep used up its preloaded rows; raise BENCH_ROWS or BENCH_ROWS100" >&2
            exit 1
        fi
    fi
    if [ "$written" -ne $((processed * per_tx)) ]; then
        echo "$pair $side run $rep: $processed transactions but $written rows written (expected $((processed * per_tx)))" >&2
        exit 1
    fi
    printf '%-8s %-6s run %d: %9.1f tps\n' "$pair" "$side" "$rep" "$tps" | tee -a "$out/summary.txt"
}

declare -A tps_of
for pair in $pairs; do
    for rep in $(seq 1 "$reps"); do
        for side in native bare; do
            run "$pair" "$side" "$rep"
            tps_of[$pair.$side]+="$tps "
        done
    done
done
BENCH_DB=postgres bench_psql -c "DROP DATABASE bench_run"

table() {
    printf '%-25s %-12s %-10s %-7s %s\n' pair "native tps" "bare tps" ratio target
    for pair in $pairs; do
        case $pair in
        add) label="add 4KB" ;;
        advance) label="advance 1 row" ;;
        batch) label="advance 100 rows (batch)" ;;
        esac
        # shellcheck disable=SC2086
        native=$(printf '%.1f' "$(bench_median ${tps_of[$pair.native]})")
        # shellcheck disable=SC2086
        bare=$(printf '%.1f' "$(bench_median ${tps_of[$pair.bare]})")
        ratio=$(awk -v n="$native" -v b="$bare" 'BEGIN { printf "%.2f", n / b }')
        note=$(awk -v r="$ratio" -v t="$target" 'BEGIN { if (r < t) print "  (below target)" }')
        printf '%-25s %-12s %-10s %-7s >= %s%s\n' "$label" "$native" "$bare" "$ratio" "$target" "$note"
    done
    echo "(median of $reps runs per side, ${seconds}s each, pgbench -M prepared -c $clients -j $threads;" \
         "batch tps counts 100-row transactions)"
}
echo
table | tee -a "$out/summary.txt"
echo "Raw output: $out"
