#!/usr/bin/env bash
# The whole suite, several times in a row, with a CPU hog on every core:
# how a test that only passes on a quiet machine is found before CI finds
# it (issue 37: "five times in a row under load").
#
#   scripts/check-under-load.sh [RUNS]     RUNS: 5 by default
#
# Each run is what CI runs: a fresh clone of this repository's HEAD and
# `CI=true bash .ci/run` in it (so make check: the clean build, the
# sanitizers, pg_regress, every TAP file).  Beside all of them, stress-ng
# (scripts/deps.sh check installs it) keeps one CPU hog per core busy at
# the normal priority, in a session of its own: with the kernel's
# autogroups (Debian's default) the hog then holds about half the machine
# whatever the suite runs, and without them it competes per thread.  The
# hog is bounded in time (45 minutes a run) and stopped on exit.
#
# Prints one line per run (its commit, wall time, the load average at its
# end and its "N passed, N failed, N skipped" line) and keeps each run's
# whole log in $UNDER_LOAD_DIR (./under-load by default), named by run.
# Exits non-zero when any run failed.  Run it as CI runs (root, so that
# the root tests run too), on a machine with nothing else to do.
set -euo pipefail

runs=${1:-5}
case $runs in
'' | *[!0-9]* | 0)
    echo "usage: check-under-load.sh [RUNS]: RUNS is a positive number of runs, not '$runs'" >&2
    exit 2
    ;;
esac
top=$(cd "$(dirname "$0")/.." && pwd)
out=${UNDER_LOAD_DIR:-$top/under-load}
command -v stress-ng >/dev/null ||
    { echo "check-under-load.sh: stress-ng is missing (scripts/deps.sh check installs it)" >&2; exit 1; }
mkdir -p "$out"
clone=$(mktemp -d /tmp/pepsi-under-load.XXXXXX)
# mktemp's 0700 would keep the tests' unprivileged user (scripts/check.sh's
# PEPSI_USER, as root) out of the clone it runs them from.
chmod 0755 "$clone"
hog=
stop() {
    [ -z "$hog" ] || kill -- "-$hog" 2>/dev/null || kill "$hog" 2>/dev/null || true
    rm -rf "$clone"
}
trap stop EXIT

setsid stress-ng --cpu "$(nproc)" --timeout "$((runs * 45))m" >"$out/stress-ng.log" 2>&1 &
hog=$!
commit=$(git -C "$top" rev-parse --short HEAD)
failed=0
for ((i = 1; i <= runs; i++)); do
    rm -rf "$clone/repo"
    git clone -q "$top" "$clone/repo"
    log="$out/run-$i.log"
    start=$(date +%s)
    status=0
    (cd "$clone/repo" && CI=true bash .ci/run) >"$log" 2>&1 </dev/null || status=$?
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    [ "$status" -eq 0 ] || failed=$((failed + 1))
    printf 'run %d of %d: %s, %d s, exit %d, load %s: %s\n' "$i" "$runs" "$commit" \
        "$(($(date +%s) - start))" "$status" "$(cut -d' ' -f1-3 /proc/loadavg)" \
        "${summary:-no summary line (see $log)}"
done
echo "$((runs - failed)) of $runs runs passed under load (logs in $out)"
[ "$failed" -eq 0 ]
