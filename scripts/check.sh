#!/usr/bin/env bash
# Run every test suite against throwaway clusters and end with one line,
# "N passed, N failed".  The extension must already be built and installed
# (the top-level "make check" does both).  As root, the suites run as an
# unprivileged user from a scratch copy, since initdb refuses root and the
# checkout may not be readable by that user.
set -uo pipefail
# While working on one part, PEPSI_TAP="t/0NN_a.pl t/0NN_b.pl" runs only
# those TAP files, and PEPSI_SKIP may name suites to skip (unit, regress,
# tap, sanitize).  make check sets neither, and runs everything.
# PEPSI_UNIT_DIR: where to look for unit test binaries (default build/,
# which holds build/san/ too).  SANITIZE_TAP (set by the Makefile): the
# TAP files run a second time against the programs of build/san/bin.
PEPSI_TAP=${PEPSI_TAP:-}
PEPSI_SKIP=${PEPSI_SKIP:-}
PEPSI_UNIT_DIR=${PEPSI_UNIT_DIR:-build}
SANITIZE_TAP=${SANITIZE_TAP:-}
skip() { case " $PEPSI_SKIP " in *" $1 "*) return 0 ;; esac; return 1; }
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

ensure_unprivileged_user
scratch=$(mktemp -d /tmp/pepsi-check.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
cp -r "$top/regress" "$top/t" "$scratch/"
# The programs under test: the multi-call binary and the standalone builds.
[ -d "$top/build/bin" ] && cp -r "$top/build/bin" "$scratch/bin"
[ -d "$top/build/san/bin" ] && cp -r "$top/build/san/bin" "$scratch/san-bin"
mkdir -p "$scratch/regress-out" "$scratch/tap" "$scratch/san-tap" "$scratch/san-reports"
give_to_user "$scratch"
chmod 755 "$scratch"

# tap_failures LOG LABEL: every "not ok" and every dubious script of a
# prove -v log, each with the file it came from (prove's closing summary
# names each failed file again, "t/x.pl (Wstat: ...", before its parse errors).
tap_failures() {
    awk -v label="$2" '
        /^t\/[^ ]*\.pl \.\./ { file = $1 }
        /^t\/[^ ]*\.pl +\(Wstat/ { file = $1 }
        /^[[:space:]]*not ok [0-9]+/ { sub(/^[[:space:]]*/, ""); print label " " file ": " $0 }
        /Dubious|Parse errors|No subtests run|Bad plan/ { print label " " file ": " $0 }
    ' "$1"
}

# The end of the own log of each test file of $1 (prove's output) that
# exited with a status of its own ("Dubious"): whatever made it so (a
# death after its last assertion, an END block's status) is said there,
# and CI keeps only the tail of a long log.  $2: the tests' TESTDIR.
dubious_logs() {
    local file name log
    for file in $(awk '/^t\/[^ ]*\.pl \.\./ { file = $1 } /Dubious/ { print file }' "$1"); do
        name=$(basename "$file" .pl)
        log="$2/tmp_check/log/regress_log_$name"
        [ -f "$log" ] || continue
        echo "  the end of $file's log:"
        tail -n 15 "$log" | sed 's/^/    /'
    done
}

passed=0
failed=0
# What failed, one line each, repeated at the very end: CI keeps only the
# tail of a long log, and the count alone does not say where to look.
failures="$scratch/failures"
: >"$failures"

# Unit tests (cmocka): one result per test case.
skip unit && units= || units=$(find "$top/$PEPSI_UNIT_DIR" -path '*/tests/test_*' -type f -perm -u+x ! -name '*.d' 2>/dev/null | sort)
for unit in $units; do
    echo "== unit: ${unit#$top/build/}"
    "$unit" >"$scratch/unit.log" 2>&1
    cat "$scratch/unit.log"
    # A binary may run several groups (the data-driven ones run one per data file).
    ok=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$scratch/unit.log" | awk '{n += $1} END {if (NR) print n}')
    bad=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$scratch/unit.log" | awk '{n += $1} END {if (NR) print n}')
    passed=$((passed + ${ok:-0}))
    failed=$((failed + ${bad:-0}))
    grep -E '^\[  FAILED  \] [^0-9]' "$scratch/unit.log" | sed "s|^|unit ${unit#$top/build/}: |" >>"$failures"
    if [ -z "$ok" ] && [ -z "$bad" ]; then
        echo "unit test $unit ran no test"
        echo "unit ${unit#$top/build/}: ran no test" >>"$failures"
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
    grep -E 'FAILED|failed \(ignored\)' "$scratch/regress.log" | sed 's/^/pg_regress: /' >>"$failures"
    if [ -f "$scratch/regress-out/regression.diffs" ]; then
        echo "== regression.diffs"
        cat "$scratch/regress-out/regression.diffs"
    fi
    if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
        echo "pg_regress ran no test"
        echo "pg_regress: ran no test" >>"$failures"
        failed=$((failed + 1))
    fi
fi

# TAP: one result per assertion.
if ! skip tap && ls "$scratch"/t/*.pl >/dev/null 2>&1; then
    echo "== TAP"
    # The files that "use RootTest" test privilege itself (setuid helpers,
    # files owned by several users): as root they run as root, their
    # clusters as $PEPSI_USER (t/lib/RootTest.pm); the others run as that
    # user.  Not as root, all run as ourselves and those skip.
    all_taps=$(cd "$scratch" && for f in ${PEPSI_TAP:-t/*.pl}; do
        if [ -d "$f" ]; then ls "$f"/*.pl; else echo "$f"; fi; done | sort)
    root_taps=
    [ "$(id -u)" -eq 0 ] && root_taps=$(cd "$scratch" && grep -l '^use RootTest' $all_taps 2>/dev/null)
    user_taps=$(echo "$all_taps" | grep -vxF -e "${root_taps:-/}")
    # PEPSI_LOG: the daemons log to stderr, where the tests read them.
    tap_env=(env PATH="$PGBIN:$PATH" TESTDIR="$scratch/tap" PEPSI_LOG=stderr
        PEPSI_TOP="$top" PEPSI_BIN="$scratch/bin" PG_REGRESS="$PG_REGRESS"
        PERL5LIB="$PG_TAP_LIB:$scratch/t/lib" PEPSI_CLUSTER_USER="$PEPSI_USER")
    : >"$scratch/tap.log"
    [ -n "$user_taps" ] && (cd "$scratch" && as_user "${tap_env[@]}" prove -v --ext=.pl $user_taps >>"$scratch/tap.log" 2>&1)
    [ -n "$root_taps" ] && (cd "$scratch" && "${tap_env[@]}" prove -v --ext=.pl $root_taps >>"$scratch/tap.log" 2>&1)
    cat "$scratch/tap.log"
    ok=$(grep -cE '^\s*ok [0-9]+' "$scratch/tap.log")
    bad=$(grep -cE '^\s*not ok [0-9]+' "$scratch/tap.log")
    # A script that dies before planning counts as one failure.
    dubious=$(grep -cE 'Dubious|Parse errors|No subtests run|Bad plan' "$scratch/tap.log")
    passed=$((passed + ok))
    failed=$((failed + bad + dubious))
    tap_failures "$scratch/tap.log" TAP >>"$failures"
    dubious_logs "$scratch/tap.log" "$scratch/tap" >>"$failures"
    if [ "$bad" -gt 0 ] || [ "$dubious" -gt 0 ]; then
        for log in "$scratch"/tap/tmp_check/log/*.log; do
            [ -f "$log" ] || continue
            echo "== $(basename "$log") (last 40 lines)"
            tail -n 40 "$log"
        done
    fi
fi

# The daemons' TAP tests again, against the programs built with ASan and
# UBSan: a sanitizer report fails the run even when the test's own
# assertions pass (a daemon's error is not always visible to its test).
# Every process writes its reports to san-reports/ rather than to a
# stderr the test may swallow.
if ! skip sanitize && [ -n "$SANITIZE_TAP" ] && [ -d "$scratch/san-bin" ]; then
    echo "== TAP under ASan and UBSan: $SANITIZE_TAP"
    (cd "$scratch" && as_user env PATH="$PGBIN:$PATH" TESTDIR="$scratch/san-tap" PEPSI_LOG=stderr \
        PEPSI_TOP="$top" PEPSI_BIN="$scratch/san-bin" PG_REGRESS="$PG_REGRESS" \
        PERL5LIB="$PG_TAP_LIB:$scratch/t/lib" \
        ASAN_OPTIONS="log_path=$scratch/san-reports/asan:detect_leaks=1:abort_on_error=0" \
        UBSAN_OPTIONS="log_path=$scratch/san-reports/ubsan:print_stacktrace=1:halt_on_error=1" \
        prove -v --ext=.pl $SANITIZE_TAP >"$scratch/san-tap.log" 2>&1)
    cat "$scratch/san-tap.log"
    ok=$(grep -cE '^\s*ok [0-9]+' "$scratch/san-tap.log")
    bad=$(grep -cE '^\s*not ok [0-9]+' "$scratch/san-tap.log")
    dubious=$(grep -cE 'Dubious|Parse errors|No subtests run|Bad plan' "$scratch/san-tap.log")
    reports=$(find "$scratch/san-reports" -type f | sort)
    for report in $reports; do
        echo "== sanitizer report $(basename "$report")"
        cat "$report"
    done
    passed=$((passed + ok))
    failed=$((failed + bad + dubious + $(echo "$reports" | grep -c .)))
    tap_failures "$scratch/san-tap.log" "TAP (sanitized)" >>"$failures"
    dubious_logs "$scratch/san-tap.log" "$scratch/san-tap" >>"$failures"
    for report in $reports; do echo "sanitizer report: $(basename "$report")"; done >>"$failures"
    if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
        echo "TAP under sanitizers ran no test"
        echo "TAP (sanitized): ran no test" >>"$failures"
        failed=$((failed + 1))
    fi
fi

if [ -s "$failures" ]; then
    echo "== what failed"
    cat "$failures"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
