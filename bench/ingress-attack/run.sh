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
# Without and with the attackers, alternately, BENCH_REPEATS (5) times;
# prints the medians, and the ratios the target is set on: the normal
# sessions' p99 latency with the attackers over without (target <= 2) and
# their throughput with over without (target >= 0.8).
#
# Not measured here: Postfix with OpenDKIM and OpenDMARC under the same
# attack (bench/ingress-auth runs that stack; this one does not yet).
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

repeats=${BENCH_REPEATS:-5}
seconds=${BENCH_SECONDS:-20}
normal=${BENCH_SESSIONS:-20}
attackers=${BENCH_ATTACKERS:-4}
mime_depth=${BENCH_MIME_DEPTH:-100}
ingress_bin="$bench_top/build/bin/pepsi-ingress"
out_dir="$bench_top/bench/out"
mkdir -p "$out_dir"
log="$out_dir/ingress-attack.log"
: >"$log"
[ -x "$ingress_bin" ] || { echo "build pepsi-ingress first (make programs)" >&2; exit 1; }

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
dns_port=$(bench_free_port)
bench_dns_start 127.0.0.1 "$dns_port" "$work/zone"

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
cat >"$work/pepsi.conf" <<CONF
[pepsi]
HOSTNAME = pepsi.bench.test
DNS_FORWARDER = 127.0.0.1@$dns_port
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
bench_ingress_start "$work/pepsi.conf"


# CPU seconds pepsi-ingress has used (user and system).
ingress_cpu() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$BENCH_INGRESS_PID/stat"
}
# CPU seconds the cluster's processes alive now have used.
db_cpu() {
    local postmaster
    postmaster=$(head -1 "$BENCH_DIR/data/postmaster.pid")
    awk -v hz="$(getconf CLK_TCK)" '{ t += $14 + $15 } END { printf "%.2f", t / hz }' \
        "/proc/$postmaster/stat" $(pgrep -P "$postmaster" | sed 's|.*|/proc/&/stat|')
}
run() {
    local with=$1 sessions=${2:-$normal} line before db_before
    bench_queue_empty
    before=$(ingress_cpu)
    db_before=$(db_cpu)
    line=$(/usr/bin/python3 "$here/load.py" "$port" "$seconds" "$sessions" "$with" "$work/normal.eml" "$work/attack.eml")
    line="$line ingress_cpu=$(awk -v a="$before" -v b="$(ingress_cpu)" 'BEGIN { printf "%.2f", b - a }')"
    line="$line db_cpu=$(awk -v a="$db_before" -v b="$(db_cpu)" 'BEGIN { printf "%.2f", b - a }')"
    echo "attackers=$with $line" >>"$log"
    echo "$line"
}
field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" <<<"$2"; }

# One attacker alone: what its messages cost.
echo "one attacker alone: $(run 1 0)"

echo "bench/ingress-attack: $normal normal sessions (2 KB signed messages), $attackers attacker sessions" \
    "($(wc -c <"$work/attack.eml") octets: 1000 fields, 50 DKIM + 50 ARC sets, h= of 128, MIME depth $mime_depth)," \
    "${seconds}s per run, $repeats runs each, alternating"
base_rate=() base_p99=() att_rate=() att_p99=() base_cpu=() att_cpu=()
for ((r = 1; r <= repeats; r++)); do
    base=$(run 0)
    att=$(run "$attackers")
    base_rate+=("$(field rate "$base")") base_p99+=("$(field p99 "$base")")
    att_rate+=("$(field rate "$att")") att_p99+=("$(field p99 "$att")")
    base_cpu+=("$(field ingress_cpu "$base")") att_cpu+=("$(field ingress_cpu "$att")")
    printf 'run %d: alone %s msg/s p99 %s ms; beside the attackers %s msg/s p99 %s ms (attack messages %s: %s)\n' \
        "$r" "${base_rate[-1]}" "${base_p99[-1]}" "${att_rate[-1]}" "${att_p99[-1]}" \
        "$(field attack "$att")" "$(field attack_replies "$att")"
    [ "$(field refused "$base")" = 0 ] && [ "$(field refused "$att")" = 0 ] \
        || { echo "normal messages were refused (see $log)" >&2; exit 1; }
done

br=$(bench_median "${base_rate[@]}")
bp=$(bench_median "${base_p99[@]}")
ar=$(bench_median "${att_rate[@]}")
ap=$(bench_median "${att_p99[@]}")
printf '%-36s %9s msg/s, p99 %8s ms\n' "normal sessions alone" "$br" "$bp" \
    "normal sessions beside the attackers" "$ar" "$ap"
printf "pepsi-ingress's CPU per %ss run: %s s alone, %s s beside the attackers (medians)\n" \
    "$seconds" "$(bench_median "${base_cpu[@]}")" "$(bench_median "${att_cpu[@]}")"
printf 'p99 latency with/without attackers: %s (target <= 2.00)\n' \
    "$(awk -v a="$ap" -v b="$bp" 'BEGIN { printf "%.2f", a / b }')"
printf 'throughput with/without attackers: %s (target >= 0.80)\n' \
    "$(awk -v a="$ar" -v b="$br" 'BEGIN { printf "%.2f", a / b }')"
