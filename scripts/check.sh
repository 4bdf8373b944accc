#!/usr/bin/env bash
# Run every test suite against throwaway clusters and end with one line,
# "N passed, N failed".  The extension must already be built and installed
# (the top-level "make check" does both).  As root, the suites run as an
# unprivileged user from a scratch copy, since initdb refuses root and the
# checkout may not be readable by that user.
set -uo pipefail
# While working on one part, PEPSI_TAP="t/0NN_a.pl t/0NN_b.pl" runs only
# those TAP files, and PEPSI_SKIP may name suites to skip (unit, regress,
# tap).  make check sets neither, and runs everything.
PEPSI_TAP=${PEPSI_TAP:-}
PEPSI_SKIP=${PEPSI_SKIP:-}
skip() { case " $PEPSI_SKIP " in *" $1 "*) return 0 ;; esac; return 1; }
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

ensure_unprivileged_user
scratch=$(mktemp -d /tmp/pepsi-check.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
cp -r "$top/regress" "$top/t" "$scratch/"
# The programs under test: the multi-call binary and the standalone builds.
[ -d "$top/build/bin" ] && cp -r "$top/build/bin" "$scratch/bin"
mkdir -p "$scratch/regress-out" "$scratch/tap"
give_to_user "$scratch"
chmod 755 "$scratch"

passed=0
failed=0

# Unit tests (cmocka): one result per test case.
skip unit && units= || units=$(find "$top/build" -path '*/tests/test_*' -type f -perm -u+x 2>/dev/null | sort)
for unit in $units; do
    echo "== unit: ${unit#$top/build/}"
    "$unit" >"$scratch/unit.log" 2>&1
    cat "$scratch/unit.log"
    # A binary may run several groups (the data-driven ones run one per data file).
    ok=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$scratch/unit.log" | awk '{n += $1} END {if (NR) print n}')
    bad=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$scratch/unit.log" | awk '{n += $1} END {if (NR) print n}')
    passed=$((passed + ${ok:-0}))
    failed=$((failed + ${bad:-0}))
    if [ -z "$ok" ] && [ -z "$bad" ]; then
        echo "unit test $unit ran no test"
        failed=$((failed + 1))
    fi
done

# pg_regress: one result per test file.
regress_tests=
skip regress || regress_tests=$(cd "$scratch/regress/sql" && ls *.sql 2>/dev/null | sed 's/\.sql$//' | sort)
if [ -n "$regress_tests" ]; then
    echo "== pg_regress"
    as_user "$PG_REGRESS" \
        --temp-instance="$scratch/regress-instance" \
        --bindir="$PGBIN" \
        --inputdir="$scratch/regress" \
        --outputdir="$scratch/regress-out" \
        --dbname=pepsi_regress \
        $regress_tests >"$scratch/regress.log" 2>&1
    cat "$scratch/regress.log"
    ok=$(grep -cE '^(ok|test) .* ok( |$)|\.\.\. ok' "$scratch/regress.log")
    bad=$(grep -cE 'FAILED|failed \(ignored\)' "$scratch/regress.log")
    passed=$((passed + ok))
    failed=$((failed + bad))
    if [ -f "$scratch/regress-out/regression.diffs" ]; then
        echo "== regression.diffs"
        cat "$scratch/regress-out/regression.diffs"
    fi
    if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
        echo "pg_regress ran no test"
        failed=$((failed + 1))
    fi
fi

# TAP: one result per assertion.
if ! skip tap && ls "$scratch"/t/*.pl >/dev/null 2>&1; then
    echo "== TAP"
    (cd "$scratch" && as_user env PATH="$PGBIN:$PATH" TESTDIR="$scratch/tap" \
        PEPSI_TOP="$top" PEPSI_BIN="$scratch/bin" PG_REGRESS="$PG_REGRESS" \
        PERL5LIB="$PG_TAP_LIB:$scratch/t/lib" \
        prove -v --ext=.pl ${PEPSI_TAP:-t/} >"$scratch/tap.log" 2>&1)
    cat "$scratch/tap.log"
    ok=$(grep -cE '^\s*ok [0-9]+' "$scratch/tap.log")
    bad=$(grep -cE '^\s*not ok [0-9]+' "$scratch/tap.log")
    # A script that dies before planning counts as one failure.
    dubious=$(grep -cE 'Dubious|Parse errors|No subtests run|Bad plan' "$scratch/tap.log")
    passed=$((passed + ok))
    failed=$((failed + bad + dubious))
    if [ "$bad" -gt 0 ] || [ "$dubious" -gt 0 ]; then
        for log in "$scratch"/tap/tmp_check/log/*.log; do
            [ -f "$log" ] || continue
            echo "== $(basename "$log") (last 40 lines)"
            tail -n 40 "$log"
        done
    fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
