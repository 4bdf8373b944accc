#!/usr/bin/env bash
# tap-file.sh OUT WHO BIN FILE: run one TAP file with prove -v from the
# current directory (scripts/check.sh's scratch copy), as the unprivileged
# user (WHO=user) or as ourselves (WHO=self), against the programs of BIN;
# its output goes to OUT/NAME.log and its wall time and CPU time in
# seconds to OUT/NAME.time (scripts/tree-time.pl).  scripts/check.sh runs several at once (xargs -P) with the
# rest of the tests' environment exported; one log per file keeps each
# file's output in one piece whatever ran beside it.
set -uo pipefail
out=$1 who=$2 bin=$3 file=$4
. "$(dirname "$0")/lib.sh"
name=$(basename "$file" .pl)
# (as_user, which tree-time.pl cannot call, spelt out)
user=()
[ "$who" = user ] && [ "$(id -u)" -eq 0 ] && user=(runuser -u "$PEPSI_USER" --)
"$(dirname "$0")/tree-time.pl" "$out/$name.time" "${user[@]}" \
    env PEPSI_BIN="$bin" prove -v --ext=.pl "$file" >"$out/$name.log" 2>&1
exit 0
