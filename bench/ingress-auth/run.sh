#!/usr/bin/env bash
# bench/ingress-auth: receiving authenticated mail.  Postfix's smtp-source
# sends SESSIONS sessions (spread over DOMAINS sender domains), MESSAGES
# DKIM-signed messages of about 2 KB in all, one recipient each, from
# domains with SPF, DKIM and DMARC records, to:
#   pepsi:    pepsi-ingress with MESSAGE_AUTHENTICATION on (iprev, SPF for
#             MAIL FROM and HELO, DKIM, DMARC, ARC), DMARC_POLICY enforce
#   postfix:  a private Postfix with the OpenDKIM and OpenDMARC milters and
#             postfix-policyd-spf-python (Debian's packages, stock apart
#             from where they listen), every message held (HOLD) as in
#             bench/ingress
#   pepsi-off: the same pepsi-ingress, on a listener with it off
# alternately, BENCH_REPEATS times, and prints the medians and spreads,
# the ratio pepsi/postfix (target >= 3) and what verification costs Pepsi
# (target: at most 40% of its rate without it).  Every run is checked:
# every stored or held message must say dkim=pass, spf=pass, dmarc=pass.
#
# Both sides ask the same DNS server: the whole benchmark runs in a private
# network and mount namespace (unshare; hence root), whose loopback has an
# unbound serving the zones on 10.53.0.1:53 and whose /etc/resolv.conf
# points there, since OpenDMARC and policyd-spf resolve through the system
# resolver; the host's network and resolver are not touched.  OpenDKIM
# (Nameservers) and Pepsi (DNS_FORWARDER) are pointed at it explicitly.  The filters, unbound and Pepsi run
# as the unprivileged user (bench/lib.sh); Postfix as itself.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

. "$here/../lib.sh"
# The namespace, with 10.53.0.1 for the DNS server (not a 127/8 address:
# OpenDKIM's libunbound would refuse to forward there).
dns=10.53.0.1
bench_private_network "$dns" "$0" "$@"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-20}
messages=${BENCH_MESSAGES:-20000}
domains=${BENCH_DOMAINS:-4}
ingress_bin="$bench_top/build/bin/pepsi-ingress"
out_dir="$bench_top/bench/out"
mkdir -p "$out_dir"
log="$out_dir/ingress-auth.log"
: >"$log"
[ -x "$ingress_bin" ] || { echo "build pepsi-ingress first (make programs)" >&2; exit 1; }
[ $((sessions % domains)) -eq 0 ] && [ $((messages % domains)) -eq 0 ] \
    || { echo "SESSIONS and MESSAGES must be multiples of DOMAINS" >&2; exit 1; }

bench_postfix_install
bench_cluster_start "max_connections = 100"
work="$BENCH_DIR/auth"
mkdir -p "$work"
chmod 755 "$work"

#
# Keys, messages and zones.  The domains are under example. rather than
# test.: OpenDKIM's libunbound answers test. names itself (RFC 6761).
#
openssl genrsa -out "$work/dkim.pem" 2048 2>/dev/null
public=$(openssl rsa -in "$work/dkim.pem" -pubout -outform DER 2>/dev/null | base64 -w0)
body_line="Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt."
zone="$work/zone.conf"
{
    echo '    local-zone: "bench.example." static'
    echo '    local-zone: "127.in-addr.arpa." static'
    echo '    local-data: "1.0.0.127.in-addr.arpa. 300 IN PTR client.bench.example."'
    echo '    local-data: "client.bench.example. 300 IN A 127.0.0.1"'
    echo "    local-data: 'client.bench.example. 300 IN TXT \"v=spf1 a -all\"'"
    for ((d = 1; d <= domains; d++)); do
        domain="d$d.bench.example"
        echo "    local-data: '$domain. 300 IN TXT \"v=spf1 ip4:127.0.0.0/8 -all\"'"
        echo "    local-data: '_dmarc.$domain. 300 IN TXT \"v=DMARC1; p=reject\"'"
        echo "    local-data: 'sel._domainkey.$domain. 300 IN TXT \"v=DKIM1; k=rsa; \" \"p=${public:0:200}\" \"${public:200}\"'"
        # One signed message per domain, 2 KB, as smtp-source sends it (-F).
        {
            printf 'From: Sender <sender@%s>\r\nTo: <rcpt@example.net>\r\nSubject: benchmark\r\n' "$domain"
            printf 'Date: Tue, 1 Dec 2026 12:00:00 +0000\r\nMessage-ID: <bench-%d@%s>\r\n\r\n' "$d" "$domain"
            for _ in $(seq 1 17); do printf '%s\r\n' "$body_line"; done
        } >"$work/plain-$d.eml"
        /usr/bin/python3 -c '
import sys, dkim
m = open(sys.argv[1], "rb").read()
k = open(sys.argv[2], "rb").read()
s = dkim.sign(m, b"sel", sys.argv[3].encode(), k, include_headers=[b"from", b"to", b"subject", b"date", b"message-id"])
# smtp-source ends each line of the file with CRLF itself
open(sys.argv[4], "wb").write((s + m).replace(b"\r\n", b"\n"))' "$work/plain-$d.eml" "$work/dkim.pem" "$domain" "$work/signed-$d.eml"
    done
} >"$zone"

#
# The DNS server both sides ask
#
cat >"$work/unbound.conf" <<CONF
server:
    interface: $dns
    port: 53
    username: ""
    chroot: ""
    directory: "$work"
    pidfile: "$work/unbound.pid"
    do-daemonize: no
    use-syslog: no
    logfile: "$work/unbound.log"
    num-threads: 1
    module-config: "iterator"
    access-control: 127.0.0.0/8 allow
    access-control: $dns/32 allow
$(cat "$zone")
remote-control:
    control-enable: no
CONF
give_to_user "$work"
bench_daemon "$work/unbound-stderr.log" as_user /usr/sbin/unbound -c "$work/unbound.conf"
for _ in $(seq 1 100); do
    drill @"$dns" TXT d1.bench.example 2>/dev/null | grep -q "v=spf1" && break
    sleep 0.1
done

#
# pepsi-ingress: one listener checking, one not
#
pepsi_on=$(bench_free_port)
pepsi_off=$(bench_free_port)
cat >"$work/pepsi.conf" <<CONF
[pepsi]
HOSTNAME = pepsi.bench.test
DNS_FORWARDER = $dns
[database]
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
[ingress]
USER = $PEPSI_USER
[listener-on]
ADDRESS = 127.0.0.1
PORT = $pepsi_on
MAX_SESSIONS_PER_CLIENT = 0
MESSAGE_AUTHENTICATION = on
DMARC_POLICY = enforce
[listener-off]
ADDRESS = 127.0.0.1
PORT = $pepsi_off
MAX_SESSIONS_PER_CLIENT = 0
CONF
bench_ingress_start "$work/pepsi.conf"

#
# Postfix with OpenDKIM, OpenDMARC and policyd-spf
#
dkim_port=$(bench_free_port)
dmarc_port=$(bench_free_port)
postfix_port=$(bench_free_port)
cat >"$work/policyd-spf.conf" <<CONF
debugLevel = 0
TestOnly = 1
HELO_reject = False
Mail_From_reject = False
PermError_reject = False
TempError_Defer = False
skip_addresses = 192.0.2.255/32
CONF
bench_opendkim_start "$work" "$dkim_port" "$dns"
bench_opendmarc_start "$work" "$dmarc_port" "SPFIgnoreResults    false" "SPFSelfValidate     false" \
    "RejectFailures      true"

postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
bench_postfix_start "$postfix_dir" "$postfix_port" \
    "smtpd_recipient_restrictions = check_policy_service unix:private/policyd-spf, permit_mynetworks, reject" \
    "policyd-spf_time_limit = 3600s" \
    "smtpd_milters = inet:127.0.0.1:$dkim_port, inet:127.0.0.1:$dmarc_port" \
    "milter_default_action = tempfail" \
    "smtpd_end_of_data_restrictions = check_client_access static:HOLD"
cat >>"$postfix_dir/etc/master.cf" <<CONF
policyd-spf unix - n n - 0 spawn
  user=$PEPSI_USER argv=/usr/bin/policyd-spf $work/policyd-spf.conf
CONF
/usr/sbin/postfix -c "$postfix_dir/etc" reload >/dev/null 2>&1

#
# Runs
#
# send PORT: DOMAINS smtp-source processes at once, one per sender domain;
# prints messages per second over the whole.
send() {
    local port=$1 start end d
    local per_sessions=$((sessions / domains)) per_messages=$((messages / domains))
    local senders=()
    start=$(date +%s.%N)
    for ((d = 1; d <= domains; d++)); do
        /usr/sbin/smtp-source -d -s "$per_sessions" -m "$per_messages" -F "$work/signed-$d.eml" \
            -M client.bench.example -f "sender@d$d.bench.example" -t rcpt@example.net \
            "127.0.0.1:$port" >>"$log" 2>&1 &
        senders+=($!)
    done
    for pid in "${senders[@]}"; do wait "$pid"; done
    end=$(date +%s.%N)
    awk -v n="$messages" -v a="$start" -v b="$end" 'BEGIN { printf "%.1f\n", n / (b - a) }'
}

pepsi_reset() { bench_queue_empty; }
pepsi_rows() { bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue"; }
# Rows whose every verdict passed.
pepsi_passed() {
    bench_psql -tA -c "SELECT count(*) FROM pepsi.workqueue
        WHERE state #>> '{auth,dkim,0,result}' = 'pass' AND state #>> '{auth,spf,result}' = 'pass'
          AND state #>> '{auth,dmarc,result}' = 'pass' AND state #>> '{auth,iprev,result}' = 'pass'"
}
postfix_reset() { /usr/sbin/postsuper -c "$postfix_dir/etc" -d ALL hold >/dev/null 2>&1 || true; sync; }
postfix_held() { find "$postfix_dir/spool/hold" -type f | wc -l; }
# Held messages whose headers say every check passed (a sample of 20);
# the first that does not is left in $work/postfix-failed.
postfix_passed() {
    local n=0 f headers
    for f in $(find "$postfix_dir/spool/hold" -type f | head -20); do
        headers=$(/usr/sbin/postcat -c "$postfix_dir/etc" -h -q "$(basename "$f")" 2>/dev/null)
        if grep -q 'dkim=pass' <<<"$headers" && grep -q 'dmarc=pass' <<<"$headers" \
            && grep -q '^Received-SPF: Pass' <<<"$headers"; then
            n=$((n + 1))
        elif [ ! -s "$work/postfix-failed" ]; then
            printf '%s\n' "$headers" >"$work/postfix-failed"
        fi
    done
    echo "$n"
}

echo "bench/ingress-auth: $sessions sessions ($domains sender domains), $messages DKIM-signed 2 KB messages, $repeats runs each, alternating"
on_rates=() off_rates=() postfix_rates=()
for ((r = 1; r <= repeats; r++)); do
    pepsi_reset
    on=$(send "$pepsi_on")
    [ "$(pepsi_rows)" -eq "$messages" ] || { echo "pepsi stored $(pepsi_rows) of $messages" >&2; exit 1; }
    passed=$(pepsi_passed)
    [ "$passed" -eq "$messages" ] || { echo "pepsi: only $passed of $messages passed every check" >&2; exit 1; }
    pepsi_reset
    off=$(send "$pepsi_off")
    [ "$(pepsi_rows)" -eq "$messages" ] || { echo "pepsi (off) stored $(pepsi_rows) of $messages" >&2; exit 1; }
    postfix_reset
    pf=$(send "$postfix_port")
    held=$(postfix_held)
    [ "$held" -eq "$messages" ] || { echo "postfix held $held of $messages (see $postfix_dir/maillog)" >&2; exit 1; }
    sample=$(postfix_passed)
    if [ "$sample" -ne 20 ]; then
        echo "postfix: $sample of 20 sampled messages passed every check; one that did not:" >&2
        cat "$work/postfix-failed" >&2
        exit 1
    fi
    on_rates+=("$on") off_rates+=("$off") postfix_rates+=("$pf")
    printf 'run %d: pepsi %s msg/s, pepsi without checks %s msg/s, postfix+opendkim+opendmarc+policyd-spf %s msg/s\n' \
        "$r" "$on" "$off" "$pf"
done

spread() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s-%s", lo, hi }'; }
on_median=$(bench_median "${on_rates[@]}")
off_median=$(bench_median "${off_rates[@]}")
pf_median=$(bench_median "${postfix_rates[@]}")
printf '%-44s %9s msg/s (spread %s)\n' \
    "pepsi-ingress, checks on" "$on_median" "$(spread "${on_rates[@]}")" \
    "pepsi-ingress, checks off" "$off_median" "$(spread "${off_rates[@]}")" \
    "postfix + opendkim + opendmarc + policyd-spf" "$pf_median" "$(spread "${postfix_rates[@]}")"
printf 'ratio pepsi/postfix stack: %s (target >= 3.00)\n' \
    "$(awk -v a="$on_median" -v b="$pf_median" 'BEGIN { printf "%.2f", a / b }')"
printf 'cost of the checks to pepsi: %s%% of its rate without them (target <= 40%%)\n' \
    "$(awk -v a="$on_median" -v b="$off_median" 'BEGIN { printf "%.1f", 100 * (1 - a / b) }')"
