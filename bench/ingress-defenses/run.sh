#!/usr/bin/env bash
# bench/ingress-defenses: receiving mail through connection-level defences,
# Pepsi against a stock Postfix, side by side in one run (issue 38).
#
# smtp-clients.c (built here, the same load generator for both sides)
# sends MESSAGES (20,000) messages of about 2 KB from CLIENTS (20) source
# addresses, 127.0.0.11 to 127.0.0.30, one process each, PER_CONNECTION
# (5) transactions a connection, one recipient each; LISTED (2) of the
# addresses, the first ones, are listed on the test DNSBL, so a tenth of
# the messages are refused at RCPT (550 5.7.1) and the rest taken.  A
# client is one session at a time, but the listed ones, like spam bots,
# open BOT_SESSIONS (25) at a time each: postscreen keeps every connection
# of a client it does not pass waiting postscreen_greet_wait (6 s) before
# its banner, so one listed client one connection at a time would take
# 1,000 s for its share (postscreen lets a client have 50 connections).
#
#   pepsi:   pepsi-ingress, a MODE smtp listener with DNSBL_SITES and
#            DNSBL_THRESHOLD (postscreen's syntax, the same list, weight
#            and threshold as Postfix's) and, when this build has it, the
#            before-queue milter (listener option MILTERS); the queue a
#            durable cluster (bench/lib.sh), nothing delivered
#   postfix: a private stock Postfix (bench/lib.sh) with postscreen in
#            front of smtpd (postscreen_dnsbl_sites, _threshold,
#            postscreen_dnsbl_action = enforce) and smtpd_milters, every
#            taken message held (HOLD) as in bench/ingress
# Both ask the same milter, bench/milter/noop-milter.c (every step
# answered CONTINUE, in C: no filter work to measure), and its count
# checks that each side's taken messages went through it.  When this build
# of pepsi-ingress has no MILTERS option, neither side has a milter (the
# heading says so): DNSBL only.  BENCH_MILTER=no leaves it out anyway.
#
# Every run is checked: each side refuses exactly the listed clients'
# messages and takes the others', and holds as many messages as it took.
# The rate is the messages taken over the time until the last client whose
# messages are taken is done (the listed clients run beside them, and may
# end later on Postfix: their wait is postscreen's tarpit, not its
# throughput; the whole run's time is printed too).  The sides alternate,
# pepsi then postfix, BENCH_REPEATS (5) times; each
# run is printed, then each side's median rate of taken messages, its
# spread (min-max), the ratio of the medians pepsi/postfix (target >= 3)
# and the load average.  Before the measured runs one untimed connection
# from each client meets each side (cold caches: its time is printed): as
# servers that have seen these clients, both then keep their verdicts
# (Pepsi's DNSBL_TTL, postscreen's cache and its DNSBL TTL, both an hour
# here, the list's TTLs), so the runs measure the steady state, where
# postscreen asks again about a listed client at each connection (it
# keeps passes only) and Pepsi keeps the listing too.
#
# Pepsi runs at its defaults: [ingress] BULK_NICE is 0 (the pool ranks a
# new client's admissions first by its own order, admit.c).  It was 10
# when this bench was written, and on a machine that other jobs load (this
# one is shared) nice 10 measured those jobs, not Pepsi (at load 25-30:
# 82-95 msg/s at nice 10, 610-850 at nice 0); BENCH_BULK_NICE=N sets it.
#
# DNS: both sides ask the tests' DNS server (t/lib/testdns.py) on
# 127.0.53.1:53.  Pepsi is pointed at it (DNS_FORWARDER); Postfix's
# dnsblog asks the system resolver, so the whole benchmark runs in a
# private network and mount namespace (bench_private_network: unshare
# --net --mount, hence root) whose /etc/resolv.conf is a bind mount naming
# 127.0.53.1: the host's resolver and network are not touched, and the
# client addresses and port 53 are the namespace's own loopback.
#
# Measured on 2026-12-06 (2 cores shared with other builds and tests, load
# average 19-39 during the runs), with the before-queue milter:
#   pepsi 1018.2 msg/s taken (spread 524.3-1244.8), postfix 218.4 (138.6-
#   267.7), ratio 4.66; the same two clients refused on both sides in
#   every run; first contact 0.76 s against 8.2 s (postscreen's 6 s wait).
#   At BULK_NICE 10 (4,000 messages, 3 runs, load 11-23): pepsi 182.9
#   (179.4-200.9), postfix 166.5 (164.0-183.2), ratio 1.10.
# pepsi-ingress used about 7 s of CPU per run of 20,000 (70% of it in the
# kernel: replies written, connections, a thread per filtered
# transaction): the rate is bound by the machine's load, not by it.
#
# Needs: root, postfix (installed with debconf "No configuration" when
# missing), pepsi-ingress built, the extension installed, a C compiler.
set -euo pipefail
shopt -s inherit_errexit
here=$(cd "$(dirname "$0")" && pwd)

. "$here/../lib.sh"
dns=127.0.53.1
bench_private_network "$dns" "$0" "$@"

repeats=${BENCH_REPEATS:-5}
messages=${BENCH_MESSAGES:-20000}
clients=${BENCH_CLIENTS:-20}
listed=${BENCH_LISTED:-2}
per_connection=${BENCH_PER_CONNECTION:-5}
bot_sessions=${BENCH_BOT_SESSIONS:-25}
bulk_nice=${BENCH_BULK_NICE:-0} # the default
# BENCH_SIDES=pepsi or postfix runs one side alone (to profile it).
read -r -a sides <<<"${BENCH_SIDES:-pepsi postfix}"
size=2048
first_client=127.0.0.11
zone_name=dnsbl.bench.example
# The same list, filter, weight and threshold on both sides.
dnsbl_sites="$zone_name=127.0.0.2*3"
dnsbl_threshold=3
log=$(bench_log ingress-defenses)

bench_require_programs pepsi-ingress
bench_postfix_install
# postscreen's dummy SMTP engine (which refuses a listed client's RCPTs)
# closes the connection after postscreen_command_count_limit (20)
# commands: EHLO, MAIL, RCPT, RSET each transaction and QUIT must fit.
((1 + 3 * per_connection + 1 <= 20)) \
    || { echo "BENCH_PER_CONNECTION must be at most 6 (postscreen_command_count_limit)" >&2; exit 1; }
((messages % clients == 0 && listed < clients)) \
    || { echo "BENCH_MESSAGES must be a multiple of BENCH_CLIENTS, BENCH_LISTED below it" >&2; exit 1; }
((listed * bot_sessions <= 80 && bot_sessions <= 40)) \
    || { echo "BENCH_BOT_SESSIONS must be at most 40 and BENCH_LISTED times it at most 80" \
        "(postscreen_client_connection_count_limit 50, postscreen_pre_queue_limit 100)" >&2; exit 1; }

milter=yes
if [ "${BENCH_MILTER:-yes}" = no ]; then
    milter="no (BENCH_MILTER=no)"
elif ! grep -q '^OPTION("listener-\*", "MILTERS"' "$bench_top/schema/options.def"; then
    milter="no (this pepsi-ingress has no listener option MILTERS)"
fi

bench_cluster_start "max_connections = 100"
work="$BENCH_DIR/defenses"
mkdir -p "$work"
chmod 755 "$work"
cc -O2 -Wall -o "$work/smtp-clients" "$here/smtp-clients.c"

#
# The DNSBL: the first LISTED clients, with an SOA so that a resolver keeps
# the answers that a client is not listed (RFC 2308) as long as the
# listings (an hour).
#
client_address() { awk -v f="$first_client" -v i="$1" 'BEGIN { split(f, o, "."); print o[1] "." o[2] "." o[3] "." o[4] + i }'; }
reversed() { awk -F. '{ print $4 "." $3 "." $2 "." $1 }' <<<"$1"; }
listed_clients=()
{
    echo "$zone_name. 3600 IN SOA ns.bench.example. hostmaster.bench.example. 1 3600 600 86400 3600"
    for ((i = 0; i < listed; i++)); do
        a=$(client_address "$i")
        listed_clients+=("$a")
        echo "$(reversed "$a").$zone_name. 3600 IN A 127.0.0.2"
        echo "$(reversed "$a").$zone_name. 3600 IN TXT \"listed for the benchmark\""
    done
} >"$work/zone"
bench_dns_start "$dns" 53 "$work/zone"

milter_port=$(bench_free_port)
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)
milter_line='' postfix_milter=()
if [ "$milter" = yes ]; then
    bench_noop_milter_start "$milter_port"
    milter_line="MILTERS = inet:127.0.0.1:$milter_port"
    postfix_milter=("smtpd_milters = inet:127.0.0.1:$milter_port" "milter_default_action = tempfail")
fi

#
# pepsi-ingress: the clients are not in TRUSTED_NETWORKS (a trusted client
# is not screened), so they may send only to LOCAL_DOMAINS.
#
cat >"$work/pepsi.conf" <<CONF
[pepsi]
HOSTNAME = pepsi.bench.test
LOCAL_DOMAINS = bench.example
DNS_FORWARDER = $dns@53
[database]
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
[ingress]
USER = $PEPSI_USER
TRUSTED_NETWORKS = 127.0.0.1/32
DNSBL_SITES = $dnsbl_sites
DNSBL_THRESHOLD = $dnsbl_threshold
BULK_NICE = $bulk_nice
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $pepsi_port
MODE = smtp
MAX_SESSIONS_PER_CLIENT = 0
$milter_line
${BENCH_PEPSI_LISTENER:-}
CONF
bench_ingress_start "$work/pepsi.conf"

#
# Postfix: postscreen before smtpd; mynetworks narrowed to 127.0.0.1 as
# Pepsi's TRUSTED_NETWORKS (postscreen_access_list permits mynetworks
# unscreened); bench.example relayed (nothing leaves: HOLD).
#
postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
BENCH_POSTFIX_POSTSCREEN=1 bench_postfix_start "$postfix_dir" "$postfix_port" \
    "mynetworks = 127.0.0.1/32" \
    "relay_domains = bench.example" \
    "postscreen_dnsbl_sites = $dnsbl_sites" \
    "postscreen_dnsbl_threshold = $dnsbl_threshold" \
    "postscreen_dnsbl_action = enforce" \
    ${postfix_milter[@]+"${postfix_milter[@]}"} \
    "smtpd_end_of_data_restrictions = check_client_access static:HOLD"

# CPU seconds a process has used (user and system).
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"; }
# CPU seconds the cluster's processes alive now have used.
db_cpu() {
    local postmaster
    postmaster=$(head -1 "$BENCH_DIR/data/postmaster.pid")
    awk -v hz="$(getconf CLK_TCK)" '{ t += $14 + $15 } END { printf "%.2f", t / hz }' \
        "/proc/$postmaster/stat" $(pgrep -P "$postmaster" | sed 's|.*|/proc/&/stat|')
}
field() { sed -n "s/.*\\b$1 \\([^ ]*\\).*/\\1/p" <<<"$2"; }
milter_seen() { if [ "$milter" = yes ]; then bench_noop_milter_count; else echo 0; fi; }

# send SIDE COUNT [smtp-clients option...]: COUNT messages to that side;
# the clients' output in $work/SIDE.out, the "total" line printed.
send() {
    local side=$1 count=$2 port=$pepsi_port
    shift 2
    [ "$side" = pepsi ] || port=$postfix_port
    if ! "$work/smtp-clients" "$@" 127.0.0.1 "$port" "$first_client" "$clients" "$count" \
        "$per_connection" "$size" rcpt@bench.example >"$work/$side.out" 2>"$work/$side.err"; then
        echo "$side: the clients failed:" >&2
        cat "$work/$side.err" >&2
        [ "$side" = pepsi ] || tail -n 20 "$postfix_dir/maillog" >&2
        exit 1
    fi
    cat "$work/$side.out" >>"$log"
    grep '^total ' "$work/$side.out"
}

# check SIDE COUNT: every listed client's messages refused, every other's
# taken.  The refused clients are printed, comma-separated (to compare the
# sides).
check() {
    local side=$1 count=$2 per=$(($2 / clients)) address accepted refused want_a want_r found=()
    while read -r _ address _ accepted _ refused _; do
        want_a=$per want_r=0
        if printf '%s\n' "${listed_clients[@]}" | grep -qx "$address"; then
            want_a=0 want_r=$per
        fi
        [ "$accepted" -eq "$want_a" ] && [ "$refused" -eq "$want_r" ] || {
            echo "$side: client $address: $accepted taken, $refused refused; expected $want_a and $want_r" >&2
            exit 1
        }
        [ "$refused" -eq 0 ] || found+=("$address")
    done < <(grep '^client ' "$work/$side.out")
    (IFS=,; echo "${found[*]}")
}

# reset SIDE: an empty queue (Pepsi) or hold queue (Postfix), synced.
reset() {
    if [ "$1" = pepsi ]; then
        bench_queue_empty
    else
        bench_postfix_drop_held "$postfix_dir"
    fi
}

# held SIDE: the messages the side holds (Postfix's cleanup files a
# message straight into the hold queue before the 250).
held() {
    if [ "$1" = pepsi ]; then
        bench_queue_rows
    else
        bench_postfix_count "$postfix_dir" hold
    fi
}

# run SIDE: one measured run; prints its line.
run() {
    local side=$1 total seen cpu_before db_before rate extra='' refused_by stored
    reset "$side"
    seen=$(milter_seen)
    if [ "$side" = pepsi ]; then
        cpu_before=$(cpu_of "$BENCH_INGRESS_PID")
        db_before=$(db_cpu)
    fi
    total=$(send "$side" "$messages" -b "$listed" -s "$bot_sessions")
    if [ "$side" = pepsi ]; then
        extra=" ingress_cpu=$(awk -v a="$cpu_before" -v b="$(cpu_of "$BENCH_INGRESS_PID")" 'BEGIN { printf "%.2f", b - a }')"
        extra+=" db_cpu=$(awk -v a="$db_before" -v b="$(db_cpu)" 'BEGIN { printf "%.2f", b - a }')"
    fi
    refused_by=$(check "$side" "$messages")
    stored=$(held "$side")
    [ "$stored" -eq "$(field accepted "$total")" ] \
        || { echo "$side: took $(field accepted "$total") messages but holds $stored" >&2; exit 1; }
    if [ "$milter" = yes ]; then
        seen=$(($(milter_seen) - seen))
        [ "$seen" -eq "$(field accepted "$total")" ] \
            || { echo "$side: the milter saw $seen messages of $(field accepted "$total") taken" >&2; exit 1; }
    fi
    rate=$(awk -v n="$(field accepted "$total")" -v s="$(field accepted_seconds "$total")" 'BEGIN { printf "%.1f", n / s }')
    printf '%s rate=%s accepted=%s refused=%s accepted_seconds=%s seconds=%s client_cpu=%s%s milter=%s refused_clients=%s load=%s\n' \
        "$side" "$rate" "$(field accepted "$total")" "$(field refused "$total")" \
        "$(field accepted_seconds "$total")" "$(field seconds "$total")" \
        "$(field cpu "$total")" "$extra" "$seen" "$refused_by" "$(cut -d' ' -f1 /proc/loadavg)"
}

echo "bench/ingress-defenses: $messages messages of $size octets from $clients clients ($listed listed on" \
    "$zone_name, $bot_sessions sessions at a time each), $per_connection a connection, $repeats runs each side, alternating; milter: $milter; Pepsi's BULK_NICE $bulk_nice;" \
    "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"

# First contact: one connection from each client, caches cold.
for side in "${sides[@]}"; do
    reset "$side"
    total=$(send "$side" "$((clients * per_connection))")
    check "$side" "$((clients * per_connection))" >/dev/null
    echo "first contact (one connection from each client, cold caches): $side $(field seconds "$total") s" | tee -a "$log"
done

declare -A rates refused_clients
for ((r = 1; r <= repeats; r++)); do
    for side in "${sides[@]}"; do
        line=$(run "$side")
        echo "run $r: $line" | tee -a "$log"
        rates[$side]+=" $(sed -n 's/.* rate=\([^ ]*\).*/\1/p' <<<"$line")"
        refused_clients[$side]=$(sed -n 's/.* refused_clients=\([^ ]*\).*/\1/p' <<<"$line")
    done
    [ "${refused_clients[pepsi]-x}" = "${refused_clients[postfix]-x}" ] || ((${#sides[@]} == 1)) || {
        echo "run $r: the sides refused different clients: pepsi ${refused_clients[pepsi]}, postfix ${refused_clients[postfix]}" >&2
        exit 1
    }
done

spread() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s-%s", lo, hi }'; }
declare -A medians names=(
    [pepsi]="pepsi (DNSBL$([ "$milter" = yes ] && echo ", MILTERS"))"
    [postfix]="postfix (postscreen$([ "$milter" = yes ] && echo ", smtpd_milters"))")
for side in "${sides[@]}"; do
    # shellcheck disable=SC2086
    medians[$side]=$(bench_median ${rates[$side]})
    # shellcheck disable=SC2086
    printf '%-44s %8s msg/s taken (spread %s)\n' "${names[$side]}" "${medians[$side]}" "$(spread ${rates[$side]})" \
        | tee -a "$log"
done
{
    printf 'clients refused in every run: %s%s\n' "${refused_clients[${sides[0]}]}" \
        "$( ((${#sides[@]} == 1)) || echo ", the same on both sides")"
    ((${#sides[@]} == 1)) || printf 'ratio pepsi/postfix: %s (target >= 3.00)\n' \
        "$(awk -v a="${medians[pepsi]}" -v b="${medians[postfix]}" 'BEGIN { printf "%.2f", a / b }')"
    echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$log"
