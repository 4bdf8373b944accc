#!/usr/bin/env bash
# bench/ingress/policy.sh: pepsi-ingress against Postfix's smtpd with relay
# control and recipient validation on, side by side.
#
# smtp-mix (beside this script) runs SESSIONS sessions and TRANSACTIONS
# transactions of SIZE octets in all: half to existing local mailboxes and
# a tenth to unknown local users (refused at RCPT, 550 5.1.1), both from an
# untrusted address (127.0.0.2), and the rest relayed to remote domains by
# a client the server trusts (127.0.0.1).  The two sides are configured
# alike:
#   pepsi:   [pepsi] LOCAL_DOMAINS = bench.local, LOCAL_RECIPIENTS = virtual
#            (MAILBOXES rows of pepsi.virtual_mailbox), [ingress]
#            TRUSTED_NETWORKS = 127.0.0.1/32
#   postfix: mydestination = bench.local, local_recipient_maps = the same
#            MAILBOXES names (inline:), mynetworks = 127.0.0.1/32,
#            smtpd_relay_restrictions = permit_mynetworks,
#            permit_sasl_authenticated, reject_unauth_destination; every
#            message held (fsynced by cleanup, never delivered)
# alternately, BENCH_REPEATS times (default 5), and prints each run, the
# medians with their spread (min..max), and the ratio (target >= 4).
#
# The relayed share comes from a trusted network, not from an SMTP AUTH
# session: AUTH needs TLS on Pepsi and a SASL server on Postfix, whose
# costs would then be measured instead of the policy's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
sessions=${BENCH_SESSIONS:-50}
transactions=${BENCH_TRANSACTIONS:-20000}
size=${BENCH_SIZE:-2048}
mailboxes=${BENCH_MAILBOXES:-1000}
ingress_bin="$bench_top/build/bin/pepsi-ingress"
log=$(bench_log ingress-policy)

bench_postfix_install
[ -x "$ingress_bin" ] || { echo "build pepsi-ingress first (make programs)" >&2; exit 1; }
bench_cluster_start "max_connections = 100"

mix="$BENCH_DIR/smtp-mix"
cc -O2 -o "$mix" "$here/smtp-mix.c"
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)

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
TRUSTED_NETWORKS = 127.0.0.1/32
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $pepsi_port
MAX_SESSIONS_PER_CLIENT = 0
MAX_ERRORS = 1000000
CONF
bench_ingress_start "$conf" 4

postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
names=$(seq -s, -f 'u%g=ok' 1 "$mailboxes")
bench_postfix_start "$postfix_dir" "$postfix_port" \
    "mydestination = bench.local" \
    "mynetworks = 127.0.0.1/32" \
    "local_recipient_maps = inline:{$names}" \
    "smtpd_relay_restrictions = permit_mynetworks, permit_sasl_authenticated, reject_unauth_destination" \
    "smtpd_recipient_restrictions =" \
    "smtpd_hard_error_limit = 1000000" \
    "smtpd_soft_error_limit = 1000000" \
    "smtpd_error_sleep_time = 0" \
    "smtpd_end_of_data_restrictions = check_client_access static:HOLD"

# run PORT: one smtp-mix run; prints transactions per second.
run() {
    local out
    out=$("$mix" 127.0.0.1 "$1" "$sessions" "$transactions" "$size" bench.local "$mailboxes" \
        127.0.0.1 127.0.0.2 2>>"$log") || { echo "smtp-mix failed against port $1 (see $log)" >&2; exit 1; }
    echo "$out" >>"$log"
    awk -v t="$transactions" '{ printf "%.1f\n", t / $3 }' <<<"$out"
}
accepted=$((transactions - transactions / sessions * (sessions / 10)))
pepsi_rows() { bench_queue_rows; }
pepsi_reset() { bench_queue_empty; }
postfix_held() { bench_postfix_count "$postfix_dir" hold; }
postfix_reset() { bench_postfix_drop_held "$postfix_dir"; }

echo "bench/ingress/policy: $sessions sessions, $transactions transactions of $size octets" \
    "(50% local, 10% unknown local, 40% relayed), $repeats runs each side, alternating"
pepsi_rates=()
postfix_rates=()
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
    printf 'run %d: pepsi %s tx/s, postfix %s tx/s\n' "$r" "$rate" "$rate_pf"
done
spread() { printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | paste -sd' ' | awk '{ print $1 ".." $2 }'; }
pepsi_median=$(bench_median "${pepsi_rates[@]}")
postfix_median=$(bench_median "${postfix_rates[@]}")
printf '%-16s median %10s tx/s (spread %s)\n' "pepsi-ingress" "$pepsi_median" "$(spread "${pepsi_rates[@]}")"
printf '%-16s median %10s tx/s (spread %s)\n' "postfix smtpd" "$postfix_median" "$(spread "${postfix_rates[@]}")"
printf 'ratio pepsi/postfix: %s (target >= 4.00)\n' \
    "$(awk -v a="$pepsi_median" -v b="$postfix_median" 'BEGIN { printf "%.2f", a / b }')"
