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
skipped=0
# What failed, one line each, repeated at the very end: CI keeps only the
# tail of a long log, and the count alone does not say where to look.
failures="$scratch/failures"
: >"$failures"

# Unit tests (cmocka): one result per test case.  They and pg_regress
# run in the background, beside the TAP files' parallel pass (below), and
# are reported first once done.
skip unit && units= || units=$(find "$top/$PEPSI_UNIT_DIR" -path '*/tests/test_*' -type f -perm -u+x ! -name '*.d' 2>/dev/null | sort)
mkdir -p "$scratch/unit-out"
run_units() {
    local unit i=0
    for unit in $units; do
        i=$((i + 1))
        "$unit" >"$scratch/unit-out/$i.log" 2>&1
    done
}
report_units() {
    local unit i=0 log ok bad
    for unit in $units; do
        i=$((i + 1))
        log="$scratch/unit-out/$i.log"
        echo "== unit: ${unit#$top/build/}"
        cat "$log"
        # A binary may run several groups (the data-driven ones run one per data file).
        ok=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{n += $1} END {if (NR) print n}')
        bad=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{n += $1} END {if (NR) print n}')
        passed=$((passed + ${ok:-0}))
        failed=$((failed + ${bad:-0}))
        grep -E '^\[  FAILED  \] [^0-9]' "$log" | sed "s|^|unit ${unit#$top/build/}: |" >>"$failures"
        if [ -z "$ok" ] && [ -z "$bad" ]; then
            echo "unit test $unit ran no test"
            echo "unit ${unit#$top/build/}: ran no test" >>"$failures"
            failed=$((failed + 1))
        fi
    done
}

# pg_regress: one result per test file.
regress_tests=
skip regress || regress_tests=$(cd "$scratch/regress/sql" && ls *.sql 2>/dev/null | sed 's/\.sql$//' | sort)
run_regress() {
    as_user "$PG_REGRESS" \
        --temp-instance="$scratch/regress-instance" \
        --bindir="$PGBIN" \
        --inputdir="$scratch/regress" \
        --outputdir="$scratch/regress-out" \
        --dbname=pepsi_regress \
        $regress_tests >"$scratch/regress.log" 2>&1
}
report_regress() {
    local ok bad
    [ -n "$regress_tests" ] || return 0
    echo "== pg_regress"
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
}

# Seconds since the start, for the log.
started=$(date +%s)
elapsed() { echo "$(($(date +%s) - started)) s"; }
background=()
[ -n "$units" ] && { run_units & background+=($!); }
[ -n "$regress_tests" ] && { run_regress & background+=($!); }

# TAP: one result per assertion.  Each file runs once: the daemons' files
# of $SANITIZE_TAP against the programs built with ASan and UBSan
# (build/san/bin), where a sanitizer report fails the run even when the
# test's own assertions pass (a daemon's error is not always visible to its
# test), the others against the optimised build.  Every process writes its
# sanitizer reports to san-reports/ rather than to a stderr the test may
# swallow.  The files run $TAP_JOBS at a time, then those of $TAP_SERIAL
# one at a time, then the root ones $TAP_ROOT_JOBS at a time.
#
# No TAP file asserts an upper bound on a time (load stretches every one
# of them): how soon things happen is measured by bench/timing, and the
# files only assert what happens and in what order, so they run in the
# parallel pass, but for those of TAP_SERIAL, run alone after it, and why:
#   t/048_dispatch_light_lane.pl  that the lane's batches leave the
#       pipeline depth of the stage's worker as it was can only be seen
#       while that depth is above its floor, and the depth is fitted to
#       20 ms of the worker's work (daemons/dispatch/depth.c): beside two
#       other files at a load of 39 a row cost enough to put it at the
#       floor.  Alone on CI's machine it was always well above it.
TAP_SERIAL=${TAP_SERIAL-t/048_dispatch_light_lane.pl}
# TAP_OPTIMISED: files of $SANITIZE_TAP that run against the optimised
# build all the same (as do those of TAP_SERIAL).  They drain thousands of rows (t/046: 10,400,
# t/047: 10,000, t/048_dispatch_no_starvation.pl: 4,000...) or time what
# bench/timing reads from them, which the sanitizers would slow several
# times over; they ran there when they were the serial pass, and still do.
TAP_OPTIMISED=${TAP_OPTIMISED-t/032_ingress_limits.pl t/041_dispatch_workers.pl t/046_dispatch_fair.pl
    t/047_dispatch_queue_reset.pl t/048_dispatch_light_rows.pl t/048_dispatch_no_starvation.pl}
# Three at a time: most files wait more than they compute (a daemon's
# poll interval, a retry delay, a peer's reply delay, Patroni's failover),
# so two at a time left about 40% of the two cores idle.  Measured as each
# file's process-tree CPU (the times printed at the end; load changes it
# little) against its wall time on a quiet machine (t/tap-times): the
# longest eleven took 242 s of CPU in 400 s of wall, 0.6 cores each, so
# three at a time fill the two cores and four only queue for them.
TAP_JOBS=${TAP_JOBS:-3}
TAP_ROOT_JOBS=${TAP_ROOT_JOBS:-1}
# The order the files start in: the longest first, so that a pass does not
# end on one of them alone while the other core idles (by t/tap-times,
# their last measured times), and before those the files it does not
# name, new and not yet measured.  TAP_FIRST: files to start before all.
TAP_TIMES=${TAP_TIMES:-$top/t/tap-times}
TAP_FIRST=${TAP_FIRST-}
# in_list FILE LIST: whether FILE is a word of LIST.
in_list() { case " $(echo $2) " in *" $1 "*) return 0 ;; esac; return 1; }
# PEPSI_NO_SKIP (set by make check): every file must run, and a file that
# skips as a whole (for a program not built, a dependency missing that
# scripts/deps.sh installs: Chromium, systemd-analyze...) fails; only the
# root files skip, and only when we are not root.  So does an assertion
# skipped for a dependency scripts/deps.sh installs (its reason names
# scripts/deps.sh); one skipped for what the machine lacks (an IPv6
# loopback, autogroups) is counted as skipped, not failed.
PEPSI_NO_SKIP=${PEPSI_NO_SKIP:-}
tap_bad=

# tap_count LOG LABEL: add LOG's results (prove -v output of one or more
# files) to the counts.
tap_count() {
    local ok bad dubious skips file_skips
    ok=$(grep -cE '^\s*ok [0-9]+' "$1")
    bad=$(grep -cE '^\s*not ok [0-9]+' "$1")
    # A script that dies before planning counts as one failure.
    dubious=$(grep -cE 'Dubious|Parse errors|No subtests run|Bad plan' "$1")
    skips=$(grep -cE '^\s*ok [0-9]+.*# [Ss][Kk][Ii][Pp]' "$1")
    file_skips=$(grep -cE '^t/[^ ]*\.pl \.\. skipped:' "$1")
    passed=$((passed + ok - skips))
    skipped=$((skipped + skips + file_skips))
    failed=$((failed + bad + dubious))
    [ $((bad + dubious)) -gt 0 ] && tap_bad=1
    tap_failures "$1" "$2" >>"$failures"
    dubious_logs "$1" "$scratch/tap" >>"$failures"
    # A file that skipped where everything must run.
    if [ -n "$PEPSI_NO_SKIP" ]; then
        awk -v label="$2" -v root="$(id -u)" '
            /^t\/[^ ]*\.pl \.\./ { file = $1 }
            /^t\/[^ ]*\.pl \.\. skipped:/ && !(root != 0 && /needs root/) { print label " " $0 }
            /^[[:space:]]*ok [0-9]+.*# [Ss][Kk][Ii][Pp].*scripts\/deps\.sh/ { sub(/^[[:space:]]*/, ""); print label " " file ": " $0 }
        ' "$1" >"$scratch/must-run"
        cat "$scratch/must-run" >>"$failures"
        failed=$((failed + $(grep -c . "$scratch/must-run")))
        # (those skipped assertions count as failed, not as skipped too)
        skipped=$((skipped - $(grep -c ' # [Ss][Kk][Ii][Pp]' "$scratch/must-run")))
    fi
}

if ! skip tap && ls "$scratch"/t/*.pl >/dev/null 2>&1; then
    all_taps=$(cd "$scratch" && for f in ${PEPSI_TAP:-t/*.pl}; do
        if [ -d "$f" ]; then ls "$f"/*.pl; else echo "$f"; fi; done | sort)
    # A file PEPSI_TAP names that is not there (a typo, a pattern that
    # matched nothing) fails the run by name: it would otherwise run no
    # test and pass unseen.
    missing_taps=$(cd "$scratch" && for f in $all_taps; do [ -f "$f" ] || echo "$f"; done)
    for f in $missing_taps; do
        echo "PEPSI_TAP: $f: no such test file"
        echo "PEPSI_TAP: $f: no such test file" >>"$failures"
        failed=$((failed + 1))
    done
    all_taps=$(cd "$scratch" && for f in $all_taps; do [ -f "$f" ] && echo "$f"; done)
elif ! skip sanitize; then
    # make sanitize: only the sanitized files.
    all_taps=$(echo $SANITIZE_TAP | tr ' ' '\n' | sort)
    TAP_SERIAL= TAP_OPTIMISED=
else
    all_taps=
fi
sanitized() {
    ! skip sanitize && [ -d "$scratch/san-bin" ] && in_list "$1" "$SANITIZE_TAP" &&
        ! in_list "$1" "$TAP_SERIAL" && ! in_list "$1" "$TAP_OPTIMISED"
}
if [ -n "$all_taps" ]; then
    echo "== TAP"
    # The files that "use RootTest" test privilege itself (setuid helpers,
    # files owned by several users): as root they run as root, their
    # clusters as $PEPSI_USER (t/lib/RootTest.pm); the others run as that
    # user.  Not as root, all run as ourselves and those skip.
    root_taps=
    [ "$(id -u)" -eq 0 ] && root_taps=$(cd "$scratch" && grep -l '^use RootTest' $all_taps 2>/dev/null)
    # One initdb for the run: each cluster's data directory is a copy
    # (t/lib/PepsiTest.pm).
    as_user "$PGBIN/initdb" -D "$scratch/initdb-template" -A trust -N >"$scratch/initdb.log" 2>&1 ||
        { cat "$scratch/initdb.log"; echo "initdb failed" >>"$failures"; failed=$((failed + 1)); }
    # And a copy with the pepsi extension created in database postgres, for
    # the clusters of the tests that start with it (pepsi_node's extension
    # option, t/lib/PepsiTest.pm): its script runs once, not once a test.
    # Without it they create the extension themselves.
    pepsi_template="$scratch/initdb-template-pepsi"
    if as_user cp -RPp "$scratch/initdb-template" "$pepsi_template" &&
        as_user mkdir "$scratch/template-socket" &&
        as_user "$PGBIN/pg_ctl" -D "$pepsi_template" -l "$scratch/template.log" -w \
            -o "-c listen_addresses= -c unix_socket_directories=$scratch/template-socket" start >>"$scratch/initdb.log" 2>&1; then
        as_user "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$scratch/template-socket" -d postgres \
            -c 'CREATE EXTENSION pepsi' >>"$scratch/initdb.log" 2>&1 || pepsi_template=
        as_user "$PGBIN/pg_ctl" -D "$scratch/initdb-template-pepsi" -m fast -w stop >>"$scratch/initdb.log" 2>&1 ||
            pepsi_template=
    else
        pepsi_template=
    fi
    [ -n "$pepsi_template" ] ||
        { cat "$scratch/initdb.log" "$scratch/template.log" 2>/dev/null; echo "(no template with the extension: the tests create it)"; }
    # TEMP_CONFIG: postgresql.conf lines PostgreSQL::Test::Cluster adds to
    # every test cluster's, after its own.  Its log_statement = all logged
    # every statement of the daemons with its parameters (whole messages):
    # the files that read statements in the server log ask for them
    # (log_statement in their conf, t/039_ingress_wake.pl say).
    if [ -z "${TEMP_CONFIG:-}" ]; then
        echo "log_statement = none" >"$scratch/test-postgresql.conf"
        export TEMP_CONFIG="$scratch/test-postgresql.conf"
    fi
    # PEPSI_LOG: the daemons log to stderr, where the tests read them.
    # PG_TEST_PORT_DIR: one set of port reservations for files that run at once.
    export PATH="$PGBIN:$PATH" TESTDIR="$scratch/tap" PEPSI_LOG=stderr PEPSI_TOP="$top" \
        PG_REGRESS PERL5LIB="$PG_TAP_LIB:$scratch/t/lib" PEPSI_CLUSTER_USER="$PEPSI_USER" \
        PEPSI_INITDB_TEMPLATE="$scratch/initdb-template" PEPSI_INITDB_TEMPLATE_PEPSI="$pepsi_template" \
        PG_TEST_PORT_DIR="$scratch/portlock" \
        ASAN_OPTIONS="log_path=$scratch/san-reports/asan:detect_leaks=1:abort_on_error=0" \
        UBSAN_OPTIONS="log_path=$scratch/san-reports/ubsan:print_stacktrace=1:halt_on_error=1"
    mkdir -p "$scratch/portlock" "$scratch/tap-out"
    give_to_user "$scratch/portlock" "$scratch/tap-out"
    # One line per file, "WHO BIN FILE", for scripts/tap-file.sh.
    # The root files last: the port reservations they leave are root's.
    parallel= serial= root_serial=
    ordered=$(for f in $TAP_FIRST; do in_list "$f" "$all_taps" && echo "$f"; done
              for f in $all_taps; do
                  in_list "$f" "$TAP_FIRST" && continue
                  t=$(awk -v f="$f" '$2 == f { print $1; exit }' "$TAP_TIMES" 2>/dev/null)
                  echo "${t:-999999} $f"
              done | sort -k1,1rn -k2,2 | cut -d' ' -f2)
    for f in $ordered; do
        if in_list "$f" "$root_taps"; then root_serial+="self $scratch/bin $f"$'\n'
        elif in_list "$f" "$TAP_SERIAL"; then serial+="user $scratch/bin $f"$'\n'
        elif sanitized "$f"; then parallel+="user $scratch/san-bin $f"$'\n'
        else parallel+="user $scratch/bin $f"$'\n'
        fi
    done
    echo "== TAP: $(echo -n "$parallel" | grep -c .) files $TAP_JOBS at a time ($(elapsed))"
    (cd "$scratch" && printf '%s' "$parallel" | xargs -r -P "$TAP_JOBS" -L 1 "$top/scripts/tap-file.sh" "$scratch/tap-out")
    # The serial pass with nothing of ours beside it.
    [ ${#background[@]} -gt 0 ] && wait "${background[@]}"
    background=()
    echo "== TAP: $(echo -n "$serial" | grep -c .) files one at a time ($(elapsed))"
    (cd "$scratch" && printf '%s' "$serial" | xargs -r -P 1 -L 1 "$top/scripts/tap-file.sh" "$scratch/tap-out")
    # The root files last, $TAP_ROOT_JOBS at a time (one by default):
    # they change the host itself (system users and groups, make install
    # into images whose accounts stand in for the host's), and at three at
    # a time t/137_install_layout.pl found the helpers' groups missing
    # while others ran; one at a time costs about 40 s.  After the others,
    # as the port reservations they leave are root's, which the
    # unprivileged user cannot take over.
    echo "== TAP: $(echo -n "$root_serial" | grep -c .) root files $TAP_ROOT_JOBS at a time ($(elapsed))"
    (cd "$scratch" && printf '%s' "$root_serial" | xargs -r -P "$TAP_ROOT_JOBS" -L 1 "$top/scripts/tap-file.sh" "$scratch/tap-out")
    echo "== TAP: done ($(elapsed))"
fi
[ ${#background[@]} -gt 0 ] && wait "${background[@]}"
report_units
report_regress

if [ -n "$all_taps" ]; then
    # The logs in the files' order, the sanitized ones apart.
    : >"$scratch/tap.log"
    : >"$scratch/san-tap.log"
    for f in $all_taps; do
        log="$scratch/tap-out/$(basename "$f" .pl).log"
        [ -f "$log" ] || { echo "$f .. no log: the file did not run" >>"$scratch/tap.log"; continue; }
        if sanitized "$f" && ! in_list "$f" "$root_taps"; then cat "$log" >>"$scratch/san-tap.log"; else cat "$log" >>"$scratch/tap.log"; fi
    done
    if [ -s "$scratch/tap.log" ]; then
        echo "== TAP against the optimised build"
        cat "$scratch/tap.log"
        tap_count "$scratch/tap.log" TAP
        norun='^t/[^ ]*\.pl \.\. no log: the file did not run$'
        grep -E "$norun" "$scratch/tap.log" | sed 's/^/TAP /' >>"$failures"
        failed=$((failed + $(grep -cE "$norun" "$scratch/tap.log")))
    fi
    if [ -s "$scratch/san-tap.log" ]; then
        echo "== TAP under ASan and UBSan"
        cat "$scratch/san-tap.log"
        tap_count "$scratch/san-tap.log" "TAP (sanitized)"
    fi
    reports=$(find "$scratch/san-reports" -type f | sort)
    for report in $reports; do
        echo "== sanitizer report $(basename "$report")"
        cat "$report"
        echo "sanitizer report: $(basename "$report")" >>"$failures"
        failed=$((failed + 1))
    done
    if [ -n "$tap_bad" ]; then
        for log in "$scratch"/tap/tmp_check/log/*.log; do
            [ -f "$log" ] || continue
            echo "== $(basename "$log") (last 40 lines)"
            tail -n 40 "$log"
        done
    fi
    # Each file's wall time and the CPU time of all it started (its
    # clusters and daemons too: scripts/tree-time.pl); a file far under
    # its wall time waits.  All of them in $scratch's times, the longest here.
    for f in $all_taps; do
        t="$scratch/tap-out/$(basename "$f" .pl).time"
        [ -f "$t" ] && echo "$(cat "$t") $f"
    done | sort -rn >"$scratch/times"
    echo "== TAP files' wall and CPU times (seconds; all files: $(awk '{ w += $1; c += $2 } END { printf "%.0f wall, %.0f CPU", w, c }' "$scratch/times"))"
    head -n 25 "$scratch/times"
    # TAP_TIMES_OUT: where to keep all of them (t/tap-times is refreshed
    # from a full run's).
    [ -z "${TAP_TIMES_OUT:-}" ] || cp "$scratch/times" "$TAP_TIMES_OUT"
fi

if [ -s "$failures" ]; then
    echo "== what failed"
    cat "$failures"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
