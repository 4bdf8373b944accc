#!/usr/bin/env bash
# bench/ingress-attack: do the worst messages the ingress limits allow slow
# down everyone else?
#
# NORMAL sessions (20) send 2 KB DKIM-signed messages for SECONDS, each
# transaction timed from MAIL FROM to the 250 that accepts it; ATTACKERS
# sessions (4) meanwhile send, in a loop, the worst message the limits let
# through (make-attack.py): a header section of MAX_HEADER_FIELDS (1000)
# fields, 50 DKIM-Signatures and an ARC chain of 50 sets, every h= naming
# 128 fields (the cap) with a body hash that matches, so the header hashes
# are made, and keys published for them; a body of multiparts nested
# MIME_DEPTH (100) deep (ingress itself reads no MIME: no depth limit
# applies there).  pepsi-ingress has MESSAGE_AUTHENTICATION on (iprev,
# SPF, DKIM, DMARC, ARC) against the tests' DNS server.
#
# Beside it, the peer: a private Postfix with the OpenDKIM and OpenDMARC
# milters (Debian's packages, stock apart from where they listen and what
# they trust; OpenDMARC checks SPF itself), every message held (HOLD) as
# in bench/ingress-auth, under the same attack.
#
# Without and with the attackers, alternately, pepsi then postfix,
# BENCH_REPEATS (5) times; prints the medians and spreads, and for each
# side the ratios the target is set on: the normal sessions' p99 latency
# with the attackers over without (target <= 2) and their throughput with
# over without (target >= 0.8).  BENCH_PEER=none leaves Postfix out;
# BENCH_INGRESS_BEFORE=PATH adds a side "pepsi-before", another
# pepsi-ingress binary (an older build) on the same cluster and settings,
# to compare a change in the same runs.
#
# Both sides ask the same DNS server (t/lib/testdns.py): the whole
# benchmark runs in a private network and mount namespace (unshare; hence
# root), whose loopback has the server on 10.53.0.1:53 and whose
# /etc/resolv.conf points there (OpenDMARC and Postfix resolve through the
# system resolver; OpenDKIM's libunbound will not forward to a 127/8
# address); the host's network and resolver are not touched.
#
# The load generator is one Python process (load.py): on a small machine
# it may bound the normal sessions' rate itself, the same with and without
# the attackers.  The attack messages are taken and stored (about 250 KB
# each): the database's share of the slowdown is theirs to cause.  The CPU
# pepsi-ingress itself used in each run is printed too, to tell its event
# loop's share from the rest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

. "$here/../lib.sh"
# The namespace, with 10.53.0.1 for the DNS server.
dns=10.53.0.1
bench_private_network "$dns" "$0" "$@"

repeats=${BENCH_REPEATS:-5}
seconds=${BENCH_SECONDS:-20}
normal=${BENCH_SESSIONS:-20}
attackers=${BENCH_ATTACKERS:-4}
mime_depth=${BENCH_MIME_DEPTH:-100}
peer=${BENCH_PEER:-postfix}
ingress_bin="$bench_top/build/bin/pepsi-ingress"
out_dir="$bench_top/bench/out"
mkdir -p "$out_dir"
log="$out_dir/ingress-attack.log"
: >"$log"
[ -x "$ingress_bin" ] || { echo "build pepsi-ingress first (make programs)" >&2; exit 1; }

[ "$peer" = none ] || bench_postfix_install
bench_cluster_start "max_connections = 100"
work="$BENCH_DIR/attack"
mkdir -p "$work"
chmod 755 "$work"

#
# Keys, zone, messages
#
openssl genrsa -out "$work/dkim.pem" 2048 2>/dev/null
public=$(openssl rsa -in "$work/dkim.pem" -pubout -outform DER 2>/dev/null | base64 -w0)
key() { printf '%s 300 IN TXT "v=DKIM1; k=rsa; " "p=%s" "%s"\n' "$1" "${public:0:200}" "${public:200}"; }
{
    echo "1.0.0.127.in-addr.arpa. 300 IN PTR client.bench.example."
    echo "client.bench.example. 300 IN A 127.0.0.1"
    echo 'client.bench.example. 300 IN TXT "v=spf1 a -all"'
    echo 'd1.bench.example. 300 IN TXT "v=spf1 ip4:127.0.0.0/8 -all"'
    echo '_dmarc.d1.bench.example. 300 IN TXT "v=DMARC1; p=reject"'
    key sel._domainkey.d1.bench.example.
    echo 'evil.bench.example. 300 IN TXT "v=spf1 ip4:127.0.0.0/8 -all"'
    echo '_dmarc.evil.bench.example. 300 IN TXT "v=DMARC1; p=none"'
    key arc._domainkey.evil.bench.example.
    for s in 0 1 2 3 4 5 6 7; do key "sel$s._domainkey.evil.bench.example."; done
} >"$work/zone"
bench_dns_start "$dns" 53 "$work/zone"

body_line="Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt."
{
    printf 'From: Sender <sender@d1.bench.example>\r\nTo: <rcpt@example.net>\r\nSubject: benchmark\r\n'
    printf 'Date: Tue, 1 Dec 2026 12:00:00 +0000\r\nMessage-ID: <bench@d1.bench.example>\r\n\r\n'
    for _ in $(seq 1 17); do printf '%s\r\n' "$body_line"; done
} >"$work/plain.eml"
/usr/bin/python3 -c '
import sys, dkim
m = open(sys.argv[1], "rb").read()
s = dkim.sign(m, b"sel", b"d1.bench.example", open(sys.argv[2], "rb").read(),
              include_headers=[b"from", b"to", b"subject", b"date", b"message-id"])
open(sys.argv[3], "wb").write(s + m)' "$work/plain.eml" "$work/dkim.pem" "$work/normal.eml"
/usr/bin/python3 "$here/make-attack.py" "$work/attack.eml" 1000 50 128 "$mime_depth" evil.bench.example

#
# pepsi-ingress
#
port=$(bench_free_port)
before_port=$(bench_free_port)
cat >"$work/pepsi.conf" <<CONF
[pepsi]
HOSTNAME = pepsi.bench.test
DNS_FORWARDER = $dns@53
[database]
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
[ingress]
USER = $PEPSI_USER
${BENCH_INGRESS_EXTRA:-}
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
MAX_SESSIONS_PER_CLIENT = 0
MESSAGE_AUTHENTICATION = on
DMARC_POLICY = report
CONF
if [ -n "${BENCH_INGRESS_BEFORE:-}" ]; then
    sed "s/^PORT = $port\$/PORT = $before_port/" "$work/pepsi.conf" >"$work/pepsi-before.conf"
    bench_daemon "$work/ingress-before.log" "$BENCH_INGRESS_BEFORE" -c "$work/pepsi-before.conf"
    before_pid=${BENCH_DAEMON_PIDS[-1]}
    for _ in $(seq 1 100); do
        grep -q "database connection 3 ready" "$work/ingress-before.log" && break
        sleep 0.1
    done
fi
bench_ingress_start "$work/pepsi.conf"

# CPU seconds a pepsi-ingress (PID) has used (user and system).
ingress_cpu() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}
# CPU seconds the cluster's processes alive now have used.
db_cpu() {
    local postmaster
    postmaster=$(head -1 "$BENCH_DIR/data/postmaster.pid")
    awk -v hz="$(getconf CLK_TCK)" '{ t += $14 + $15 } END { printf "%.2f", t / hz }' \
        "/proc/$postmaster/stat" $(pgrep -P "$postmaster" | sed 's|.*|/proc/&/stat|')
}
# Postfix with OpenDKIM and OpenDMARC
if [ "$peer" != none ]; then
    dkim_port=$(bench_free_port)
    dmarc_port=$(bench_free_port)
    postfix_port=$(bench_free_port)
    bench_opendkim_start "$work" "$dkim_port" "$dns"
    bench_opendmarc_start "$work" "$dmarc_port" "SPFIgnoreResults    true" "SPFSelfValidate     true"
    postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
    bench_postfix_start "$postfix_dir" "$postfix_port" \
        "smtpd_milters = inet:127.0.0.1:$dkim_port, inet:127.0.0.1:$dmarc_port" \
        "milter_default_action = tempfail" \
        "smtpd_end_of_data_restrictions = check_client_access static:HOLD"
fi

# run SIDE ATTACKERS [NORMAL]: one run against pepsi or postfix; prints load.py's line.
run() {
    local side=$1 with=$2 sessions=${3:-$normal} line before db_before target pid
    if [ "$side" != postfix ]; then
        bench_queue_empty
        pid=$BENCH_INGRESS_PID target=$port
        [ "$side" = pepsi ] || pid=$before_pid target=$before_port
        before=$(ingress_cpu "$pid")
        db_before=$(db_cpu)
    else
        bench_postfix_drop_held "$postfix_dir"
        target=$postfix_port
    fi
    line=$(/usr/bin/python3 "$here/load.py" "$target" "$seconds" "$sessions" "$with" "$work/normal.eml" "$work/attack.eml")
    if [ "$side" != postfix ]; then
        line="$line ingress_cpu=$(awk -v a="$before" -v b="$(ingress_cpu "$pid")" 'BEGIN { printf "%.2f", b - a }')"
        line="$line db_cpu=$(awk -v a="$db_before" -v b="$(db_cpu)" 'BEGIN { printf "%.2f", b - a }')"
    fi
    echo "$side attackers=$with $line load=$(cut -d' ' -f1 /proc/loadavg)" >>"$log"
    echo "$line load=$(cut -d' ' -f1 /proc/loadavg)"
}
field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" <<<"$2"; }

# One attacker alone: what its messages cost each side.
echo "one attacker alone, pepsi: $(run pepsi 1 0)"
[ "$peer" = none ] || echo "one attacker alone, postfix: $(run postfix 1 0)"

echo "bench/ingress-attack: $normal normal sessions (2 KB signed messages), $attackers attacker sessions" \
    "($(wc -c <"$work/attack.eml") octets: 1000 fields, 50 DKIM + 50 ARC sets, h= of 128, MIME depth $mime_depth)," \
    "${seconds}s per run, $repeats runs each, alternating; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
sides=(pepsi)
[ -z "${BENCH_INGRESS_BEFORE:-}" ] || sides+=(pepsi-before)
[ "$peer" = none ] || sides+=(postfix)
declare -A rates p99s
pepsi_base_cpu=() pepsi_att_cpu=()
for ((r = 1; r <= repeats; r++)); do
    for side in "${sides[@]}"; do
        base=$(run "$side" 0)
        att=$(run "$side" "$attackers")
        rates[$side,0]+=" $(field rate "$base")" p99s[$side,0]+=" $(field p99 "$base")"
        rates[$side,1]+=" $(field rate "$att")" p99s[$side,1]+=" $(field p99 "$att")"
        if [ "$side" != postfix ]; then
            if [ "$side" = pepsi ]; then
                pepsi_base_cpu+=("$(field ingress_cpu "$base")") pepsi_att_cpu+=("$(field ingress_cpu "$att")")
            fi
            [ "$(field refused "$base")" = 0 ] && [ "$(field refused "$att")" = 0 ] \
                || { echo "normal messages were refused by pepsi (see $log)" >&2; exit 1; }
        fi
        printf 'run %d %-12s: alone %s msg/s p99 %s ms; beside the attackers %s msg/s p99 %s ms (attack messages %s: %s; normal refused %s/%s; load %s/%s)\n' \
            "$r" "$side" "$(field rate "$base")" "$(field p99 "$base")" "$(field rate "$att")" "$(field p99 "$att")" \
            "$(field attack "$att")" "$(field attack_replies "$att")" "$(field refused "$base")" "$(field refused "$att")" \
            "$(field load "$base")" "$(field load "$att")"
    done
done

# min-max of the numbers given
spread() { printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | paste -sd- -; }
for side in "${sides[@]}"; do
    read -ra br <<<"${rates[$side,0]}"
    read -ra bp <<<"${p99s[$side,0]}"
    read -ra ar <<<"${rates[$side,1]}"
    read -ra ap <<<"${p99s[$side,1]}"
    mbr=$(bench_median "${br[@]}") mbp=$(bench_median "${bp[@]}")
    mar=$(bench_median "${ar[@]}") map=$(bench_median "${ap[@]}")
    echo "$side:"
    printf '  %-36s %9s msg/s (%s), p99 %8s ms (%s)\n' "normal sessions alone" "$mbr" "$(spread "${br[@]}")" \
        "$mbp" "$(spread "${bp[@]}")" \
        "normal sessions beside the attackers" "$mar" "$(spread "${ar[@]}")" "$map" "$(spread "${ap[@]}")"
    printf '  p99 latency with/without attackers: %s (target <= 2.00)\n' \
        "$(awk -v a="$map" -v b="$mbp" 'BEGIN { printf "%.2f", a / b }')"
    printf '  throughput with/without attackers: %s (target >= 0.80)\n' \
        "$(awk -v a="$mar" -v b="$mbr" 'BEGIN { printf "%.2f", a / b }')"
done
printf "pepsi-ingress's CPU per %ss run: %s s alone, %s s beside the attackers (medians)\n" \
    "$seconds" "$(bench_median "${pepsi_base_cpu[@]}")" "$(bench_median "${pepsi_att_cpu[@]}")"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
