#!/usr/bin/env bash
# Run every benchmark (bench/*/run.sh) in turn; "make bench" calls this.
# Benchmarks report and do not judge: a result below its target is printed,
# not an error.  The exit status is non-zero only when a benchmark itself
# broke, after the others have still run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

status=0
for run in "$here"/*/run.sh; do
    [ -x "$run" ] || continue
    name=$(basename "$(dirname "$run")")
    echo "== bench/$name"
    if ! "$run"; then
        echo "bench/$name: the benchmark broke (see its output above)" >&2
        status=1
    fi
    echo
done
exit $status
