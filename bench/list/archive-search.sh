#!/usr/bin/env bash
# bench/list/archive-search.sh: searching a list's archive, Pepsi against
# grep -c over the same messages as an mbox (issue 40: "archive search over
# 100,000 messages at least 20x faster at the median than grep -c").
#
# Makes an mbox of BENCH_ARCHIVE_MESSAGES (100,000) list posts: threads of
# one to eight messages, each reply quoting its parent's text as mail does,
# a few hundred to a few thousand bytes of words from a 5,000-word
# vocabulary (make_mbox.py, seeded: the same mbox every run), then imports
# it with pepsi-archive import (timed, one transaction).  Then for each of
# BENCH_ARCHIVE_WORDS it runs, interleaved, BENCH_REPEATS (5) times each
# after a warm-up (A, B, A, B ...): A, `pepsi-archive count LIST WORD`, a
# whole run of the tool (process start, connection, the GIN-indexed
# full-text query); B, `grep -c -w WORD MBOX` with the mbox in the page
# cache.  Prints per word the medians, the spread (min-max), the ratio of
# the medians (target: at least 20), both counts (Pepsi counts messages,
# grep lines), and the load average.  Reports; exits 0 unless the
# benchmark itself broke.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib.sh
. "$here/../lib.sh"

messages=${BENCH_ARCHIVE_MESSAGES:-100000}
repeats=${BENCH_REPEATS:-5}
words=${BENCH_ARCHIVE_WORDS:-"quokka wombat w1234"}
archive_bin="$bench_top/build/bin/pepsi-archive"
log=$(bench_log archive-search)
[ -x "$archive_bin" ] || { echo "build pepsi-archive first (make programs)" >&2; exit 1; }

bench_cluster_start
conf="$BENCH_DIR/pepsi.conf"
cat >"$conf" <<CONF
[database]
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
CONF
bench_psql -c "SELECT pepsi.list_create('bench@lists.test', 'owner@lists.test')" >/dev/null

mbox="$BENCH_DIR/archive.mbox"
python3 "$here/make_mbox.py" "$messages" >"$mbox"
give_to_user "$mbox"
echo "mbox: $messages messages, $(du -m "$mbox" | cut -f1) MB" | tee -a "$log"

start=$EPOCHREALTIME
"$archive_bin" -C "$conf" import bench@lists.test "$mbox" | tee -a "$log"
end=$EPOCHREALTIME
awk -v a="$start" -v b="$end" -v n="$messages" \
    'BEGIN { printf "import: %.1f s (%.0f messages/s)\n", b - a, n / (b - a) }' | tee -a "$log"
bench_psql -c "VACUUM ANALYZE pepsi.archive_message" >/dev/null

# run_ms CMD...: CMD's wall time in milliseconds, its output in $BENCH_DIR/last.out.
run_ms() {
    local start end
    start=$EPOCHREALTIME
    "$@" >"$BENCH_DIR/last.out" 2>>"$BENCH_DIR/commands.err" || [ $? -eq 1 ]
    end=$EPOCHREALTIME
    awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", (b - a) * 1000 }'
}
spread() { printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | paste -sd- ; }

cat "$mbox" >/dev/null
printf '%-10s %8s %8s %10s %17s %10s %17s %7s\n' word pepsi grep "pepsi ms" spread "grep ms" spread ratio | tee -a "$log"
for word in $words; do
    pepsi_times=() grep_times=()
    run_ms "$archive_bin" -C "$conf" count bench@lists.test "$word" >/dev/null
    run_ms grep -c -w "$word" "$mbox" >/dev/null
    for ((r = 0; r < repeats; r++)); do
        pepsi_times+=("$(run_ms "$archive_bin" -C "$conf" count bench@lists.test "$word")")
        pepsi_count=$(cat "$BENCH_DIR/last.out")
        grep_times+=("$(run_ms grep -c -w "$word" "$mbox")")
        grep_count=$(cat "$BENCH_DIR/last.out")
    done
    pepsi_median=$(bench_median "${pepsi_times[@]}")
    grep_median=$(bench_median "${grep_times[@]}")
    echo "$word: pepsi ${pepsi_times[*]} ms; grep ${grep_times[*]} ms" >>"$log"
    printf '%-10s %8s %8s %10s %17s %10s %17s %7s\n' "$word" "$pepsi_count" "$grep_count" "$pepsi_median" \
        "$(spread "${pepsi_times[@]}")" "$grep_median" "$(spread "${grep_times[@]}")" \
        "$(awk -v a="$grep_median" -v b="$pepsi_median" 'BEGIN { printf "%.1fx", a / b }')" | tee -a "$log"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); target: grep/pepsi at least 20x" | tee -a "$log"
