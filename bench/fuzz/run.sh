#!/usr/bin/env bash
# bench/fuzz/run.sh [MINUTES]: fuzz each target of "make fuzz" (the SMTP
# parser, the authentication results, the milter protocol) for MINUTES
# minutes (default 1), seeded from its corpus in the repository; what a run
# finds new is kept under build/fuzz/corpus-*, a crash in build/ as
# crash-*.  make check only replays the corpora (make fuzz-replay); this is
# where they grow.  The exit status is non-zero when a target crashed.
set -euo pipefail
minutes=${1:-1}
case "$minutes" in
    '' | *[!0-9]*) echo "usage: $0 [MINUTES] (a whole number of minutes per target)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
make fuzz FUZZ_TIME=$((minutes * 60))
