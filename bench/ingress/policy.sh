#!/usr/bin/env bash
# bench/ingress/policy.sh: pepsi-ingress against Postfix's smtpd with relay
# control and recipient validation on, side by side.
#
# smtp-mix (beside this script) runs SESSIONS sessions and TRANSACTIONS
# transactions of SIZE octets in all, each session reused for many
# transactions: half to existing local mailboxes and a tenth to unknown
# local users (refused at RCPT, 550 5.1.1), both from 127.0.0.2, and the
# rest relayed to remote domains by authenticated sessions from 127.0.0.1:
# EHLO, STARTTLS, EHLO, AUTH PLAIN as one user, then their transactions.
# Neither side trusts any client address the benchmark uses, so a relayed
# recipient passes only thanks to AUTH; before the runs, smtp-mix -r
# checks that both sides refuse to relay for either address without AUTH,
# with and without TLS, so the benchmark cannot measure an open relay.
# The two sides are configured alike:
#   pepsi:   [pepsi] LOCAL_DOMAINS = bench.local, LOCAL_RECIPIENTS = virtual
#            (MAILBOXES rows of pepsi.virtual_mailbox), [ingress]
#            TRUSTED_NETWORKS = none, CREDENTIALS = the user's hash; the
#            listener with a self-signed CERTIFICATE and KEY (STARTTLS;
#            AUTH offered under TLS only)
#   postfix: mydestination = bench.local, local_recipient_maps = the same
#            MAILBOXES names (inline:), mynetworks = 192.0.2.1/32 (no
#            client of the benchmark), smtpd_relay_restrictions =
#            permit_sasl_authenticated, reject_unauth_destination; the same
#            certificate, smtpd_tls_security_level = may,
#            smtpd_tls_auth_only = yes, SASL from a private Dovecot
#            (smtpd_sasl_type = dovecot, a passwd-file passdb); every
#            message held (fsynced by cleanup, never delivered)
# The password is hashed once, as pepsi-ingress(8) says to (openssl passwd
# -6: SHA-512 crypt, 5000 rounds), and both sides check that same hash
# ({SHA512-CRYPT} in Dovecot's file), once a session.
# Each side first gets one unmeasured warm-up run of a quarter of the
# transactions (BENCH_WARMUP=0 skips it): without it, the first run after
# start-up was Postfix's fastest in both full measurements made, and once
# Pepsi's slowest, so the first pair's ratio stood apart from the others
# (3.48 and 3.29 against 4.47 to 5.68).  The
# sides then run alternately, BENCH_REPEATS times (default 5); the script
# prints each run with its ratio, the medians with their spread
# (min..max), the ratio of the medians (target >= 4) and the range of the
# runs' ratios.
#
# BENCH_RELAY=trusted measures the earlier variant instead: the relayed
# share unauthenticated, from a trusted client (TRUSTED_NETWORKS and
# mynetworks = 127.0.0.1/32, permit_mynetworks first), TLS and AUTH still
# offered but unused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-50}
transactions=${BENCH_TRANSACTIONS:-20000}
size=${BENCH_SIZE:-2048}
mailboxes=${BENCH_MAILBOXES:-1000}
relay=${BENCH_RELAY:-auth}
ingress_bin="$bench_top/build/bin/pepsi-ingress"
log=$(bench_log ingress-policy)
relay_address=127.0.0.1
other_address=127.0.0.2

case $relay in
auth) relayed_by="authenticated sessions (STARTTLS, AUTH PLAIN)" ;;
trusted) relayed_by="a trusted client" ;;
*) echo "BENCH_RELAY is auth or trusted, not $relay" >&2; exit 1 ;;
esac
bench_postfix_install
[ -x "$ingress_bin" ] || { echo "build pepsi-ingress first (make programs)" >&2; exit 1; }
bench_cluster_start "max_connections = 100"

mix="$BENCH_DIR/smtp-mix"
cc -O2 -o "$mix" "$here/smtp-mix.c" -lssl -lcrypto
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)
bench_tls_certificate "$BENCH_DIR"

# One user, one hash, both sides.
user=relay
password=$(openssl rand -hex 16)
hash=$(openssl passwd -6 "$password")
(umask 077 && echo "$user:$hash" >"$BENCH_DIR/credentials")
sasl_passwd="$BENCH_DIR/sasl-passwd"
(umask 077 && echo "$user:{SHA512-CRYPT}$hash" >"$sasl_passwd")
give_to_user "$sasl_passwd"

if [ "$relay" = auth ]; then
    pepsi_trusted=none
    postfix_trusted=192.0.2.1/32
    postfix_relay="permit_sasl_authenticated, reject_unauth_destination"
    mix_auth=(-u "$user" -p "$password")
else
    pepsi_trusted=$relay_address/32
    postfix_trusted=$relay_address/32
    postfix_relay="permit_mynetworks, permit_sasl_authenticated, reject_unauth_destination"
    mix_auth=()
fi

bench_psql -c "SELECT count(pepsi.virtual_mailbox_add('u' || i || '@bench.local')) FROM generate_series(1, $mailboxes) i" >/dev/null
conf="$BENCH_DIR/ingress.conf"
cat >"$conf" <<CONF
[pepsi]
HOSTNAME = bench.test
LOCAL_DOMAINS = bench.local
LOCAL_RECIPIENTS = virtual
[database]
CONNINFO = host=$BENCH_DIR port=$BENCH_PORT dbname=$BENCH_DB user=postgres
[ingress]
USER = $PEPSI_USER
TRUSTED_NETWORKS = $pepsi_trusted
CREDENTIALS = $BENCH_DIR/credentials
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $pepsi_port
MAX_SESSIONS_PER_CLIENT = 0
MAX_ERRORS = 1000000
CERTIFICATE = $BENCH_DIR/cert.pem
KEY = $BENCH_DIR/key.pem
CONF
bench_ingress_start "$conf" 4

dovecot_dir=$(mktemp -d /tmp/pepsi-bench-dovecot.XXXXXX)
bench_dovecot_start "$dovecot_dir" "$sasl_passwd"
postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
names=$(seq -s, -f 'u%g=ok' 1 "$mailboxes")
bench_postfix_start "$postfix_dir" "$postfix_port" \
    "mydestination = bench.local" \
    "mynetworks = $postfix_trusted" \
    "local_recipient_maps = inline:{$names}" \
    "smtpd_relay_restrictions = $postfix_relay" \
    "smtpd_recipient_restrictions =" \
    "smtpd_tls_cert_file = $BENCH_DIR/cert.pem" \
    "smtpd_tls_key_file = $BENCH_DIR/key.pem" \
    "smtpd_tls_security_level = may" \
    "smtpd_tls_auth_only = yes" \
    "smtpd_sasl_auth_enable = yes" \
    "smtpd_sasl_type = dovecot" \
    "smtpd_sasl_path = $dovecot_dir/run/auth-client" \
    "smtpd_hard_error_limit = 1000000" \
    "smtpd_soft_error_limit = 1000000" \
    "smtpd_error_sleep_time = 0" \
    "smtpd_end_of_data_restrictions = check_client_access static:HOLD"

# no_open_relay NAME PORT PATTERN: a client that did not authenticate may
# not relay, from the address the relayed share comes from (unless that
# one is trusted: BENCH_RELAY=trusted) nor from the other, in the clear or
# under TLS; the refusal must match PATTERN.
no_open_relay() {
    local name=$1 port=$2 pattern=$3 address tls answer addresses=("$other_address")
    [ "$relay" = trusted ] || addresses+=("$relay_address")
    for address in "${addresses[@]}"; do
        for tls in "" -t; do
            answer=$("$mix" -r $tls 127.0.0.1 "$port" "$address" 2>>"$log") || true
            if ! grep -Eq "$pattern" <<<"$answer"; then
                echo "$name: relaying without AUTH from $address${tls:+ under TLS} was not refused" \
                    "as expected ($pattern): ${answer:-no answer (see $log)}" >&2
                exit 1
            fi
            echo "$name, $address${tls:+ under TLS}, no AUTH: $answer" >>"$log"
        done
    done
}
no_open_relay pepsi-ingress "$pepsi_port" '^554 5\.7\.1 .*Relay access denied'
no_open_relay postfix "$postfix_port" '^(454|554) .*Relay access denied'

# run PORT: one smtp-mix run; prints transactions per second.
# run PORT [TRANSACTIONS]: one smtp-mix run; prints transactions per second.
run() {
    local out count=${2:-$transactions}
    out=$("$mix" ${mix_auth[@]+"${mix_auth[@]}"} 127.0.0.1 "$1" "$sessions" "$count" "$size" \
        bench.local "$mailboxes" "$relay_address" "$other_address" 2>>"$log") \
        || { echo "smtp-mix failed against port $1 (see $log)" >&2; exit 1; }
    echo "$out" >>"$log"
    awk -v t="$count" '{ printf "%.1f\n", t / $3 }' <<<"$out"
}
accepted=$((transactions - transactions / sessions * (sessions / 10)))
pepsi_rows() { bench_queue_rows; }
pepsi_reset() { bench_queue_empty; }
postfix_held() { bench_postfix_count "$postfix_dir" hold; }
postfix_reset() { bench_postfix_drop_held "$postfix_dir"; }

echo "bench/ingress/policy: $sessions sessions, $transactions transactions of $size octets" \
    "(50% local, 10% unknown local, 40% relayed by $relayed_by), $repeats runs each side, alternating"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${BENCH_WARMUP:-1}" != 0 ]; then
    pepsi_reset
    warm=$(run "$pepsi_port" $((transactions / 4)))
    postfix_reset
    warm_pf=$(run "$postfix_port" $((transactions / 4)))
    printf 'warm-up (not counted): pepsi %s tx/s, postfix %s tx/s\n' "$warm" "$warm_pf"
fi
pepsi_rates=()
postfix_rates=()
run_ratios=()
for ((r = 1; r <= repeats; r++)); do
    pepsi_reset
    rate=$(run "$pepsi_port")
    stored=$(pepsi_rows)
    [ "$stored" -eq "$accepted" ] || { echo "pepsi stored $stored of $accepted" >&2; exit 1; }
    pepsi_rates+=("$rate")
    postfix_reset
    rate_pf=$(run "$postfix_port")
    held=$(postfix_held)
    [ "$held" -eq "$accepted" ] || { echo "postfix held $held of $accepted" >&2; exit 1; }
    postfix_rates+=("$rate_pf")
    run_ratios+=("$(awk -v a="$rate" -v b="$rate_pf" 'BEGIN { printf "%.2f", a / b }')")
    printf 'run %d: pepsi %s tx/s, postfix %s tx/s, ratio %s\n' "$r" "$rate" "$rate_pf" "${run_ratios[-1]}"
done
spread() { printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | paste -sd' ' | awk '{ print $1 ".." $2 }'; }
pepsi_median=$(bench_median "${pepsi_rates[@]}")
postfix_median=$(bench_median "${postfix_rates[@]}")
printf '%-16s median %10s tx/s (spread %s)\n' "pepsi-ingress" "$pepsi_median" "$(spread "${pepsi_rates[@]}")"
printf '%-16s median %10s tx/s (spread %s)\n' "postfix smtpd" "$postfix_median" "$(spread "${postfix_rates[@]}")"
printf 'ratio pepsi/postfix: %s (target >= 4.00)\n' \
    "$(awk -v a="$pepsi_median" -v b="$postfix_median" 'BEGIN { printf "%.2f", a / b }')"
printf 'ratios of the runs: median %s, spread %s\n' "$(bench_median "${run_ratios[@]}")" "$(spread "${run_ratios[@]}")"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
