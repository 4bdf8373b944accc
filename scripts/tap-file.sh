#!/usr/bin/env bash
# tap-file.sh OUT WHO BIN FILE: run one TAP file with prove -v from the
# current directory (scripts/check.sh's scratch copy), as the unprivileged
# user (WHO=user) or as ourselves (WHO=self), against the programs of BIN;
# its output goes to OUT/NAME.log and its wall time in seconds to
# OUT/NAME.time.  scripts/check.sh runs several at once (xargs -P) with the
# rest of the tests' environment exported; one log per file keeps each
# file's output in one piece whatever ran beside it.
set -uo pipefail
out=$1 who=$2 bin=$3 file=$4
. "$(dirname "$0")/lib.sh"
name=$(basename "$file" .pl)
start=$(date +%s.%N)
if [ "$who" = user ]; then
    as_user env PEPSI_BIN="$bin" prove -v --ext=.pl "$file" >"$out/$name.log" 2>&1
else
    env PEPSI_BIN="$bin" prove -v --ext=.pl "$file" >"$out/$name.log" 2>&1
fi
echo "$start $(date +%s.%N)" | awk '{ printf "%.1f\n", $2 - $1 }' >"$out/$name.time"
exit 0
