#!/usr/bin/env bash
# Install the Debian packages Pepsi needs, when they are missing.
# Idempotent and quiet when everything is present.
#   deps.sh run     what building and running need ("make run"): no test
#                   peer, so the host's MTA is never replaced and no
#                   service is started that Pepsi does not use
#   deps.sh check   that and what testing and benchmarking need ("make
#                   check", CI): the default
#   deps.sh deb     what building the Debian packages needs ("make deb",
#                   "make deb-check"): "run"'s, and the packaging tools
set -euo pipefail

set_name=${1:-check}
case "$set_name" in
run | check | deb) ;;
*)
    echo "usage: deps.sh [run|check|deb]" >&2
    exit 2
    ;;
esac

run_packages=(
    # build
    gcc make pkg-config
    postgresql-15 postgresql-server-dev-15 libpq-dev
    libssl-dev libev-dev libjansson-dev libinih-dev libcrypt-dev
    # DNS (libunbound), DKIM (libopendkim), DMARC (libopendmarc, libpsl)
    libunbound-dev libopendkim-dev libopendmarc-dev libpsl-dev
    # IDNA domains for the internet relay (libidn2)
    libidn2-dev
    # pepsi-httpd: HTTP (libmicrohttpd), passwords (libargon2), systemd's
    # sd_notify for every daemon (libsystemd)
    libmicrohttpd-dev libargon2-dev libsystemd-dev
    # the relay's MTA-STS policies over HTTPS (libcurl); pepsi-dmarc-report's
    # gzip (zlib)
    libcurl4-openssl-dev zlib1g-dev
    # pepsi-stage-detect-language: libexttextcat and its language models
    libexttextcat-dev libexttextcat-data
    # the public suffix list libpsl reads for DMARC's organizational domain
    publicsuffix
    # scripts/run.sh: its certificate and passwords (openssl), its users
    # (runuser, setpriv), and a client to send the first message with
    openssl util-linux swaks
    # the key store and the crypto stages (common/crypto/): OpenPGP through GPGME, with gpg itself
    libgpgme-dev gnupg
    librnp-dev # pepsi-stage-encrypt's OpenPGP encryption and signing, in process
)
# Test peers and tools, for make check only.
check_packages=(
    # the relay's DANE tests: a DNSSEC-signed zone (ldnsutils) served by
    # nsd, and its certificates (one of them expired) made with
    # python3-cryptography
    ldnsutils nsd python3-cryptography
    # the fuzz targets: clang, and libFuzzer in its runtime package
    clang libclang-rt-dev
    # tests: pg_regress ships in postgresql-server-dev-15, the TAP modules too
    libipc-run-perl perl libcmocka-dev
    # pepsi-ingress's clients: swaks, and IO::Socket::SSL for a scripted one
    swaks libio-socket-ssl-perl
    # delivery tests and bench/relay: Postfix's smtp-sink and smtp-source
    # (and Postfix itself, the benchmark's peer), MIME-tools to parse DSNs
    postfix libmime-tools-perl
    # pepsi-stage-relay-to-lmtp's tests and bench/local: a real Dovecot
    # LMTP server (its quota plugin ships in dovecot-core)
    dovecot-core dovecot-lmtpd
    # the tests' DNS server (t/lib/testdns.py)
    python3-dnslib
    # xmllint, which validates the DMARC aggregate reports against their schema
    libxml2-utils
    # the SPF evaluator's test suite (RFC 7208, shipped by python3-spf), read with PyYAML
    python3-spf python3-yaml
    # DKIM/ARC signing tests: independent verifiers (python3-dkim,
    # Mail::DKIM, opendkim-testmsg), and their keys served by a DNS server
    # (python3-dnslib) in a private namespace (unshare, ip)
    python3-dkim python3-dnspython libmail-dkim-perl opendkim-tools
    util-linux iproute2
    # SRS tests: Mail::SRS, the reference the format is checked against
    libmail-srs-perl
    # pepsi-stage-milter's tests: real filters (rspamd's milter proxy,
    # OpenDKIM signing, a scripted python3-milter one)
    rspamd opendkim python3-milter
    # the ingress tests: Ed25519 keys for python3-dkim, Net::DNS for Mail::DKIM
    python3-nacl libnet-dns-perl
    # the man pages: pandoc converts docs/*.[1-8].md, man(1) checks them
    pandoc man-db
    # the log read by Postfix's log summary (t/131_pflogsumm.pl)
    pflogsumm
    # the language tests' texts (t/136_language.pl, bench/language): the
    # translations of coreutils, tar, dpkg and apt, read from their
    # message catalogs with msgunfmt (gettext)
    gettext coreutils tar dpkg apt
    # make format, make format-check
    clang-format
    # pepsi-httpd's page tested in a browser: Debian's Chromium (driven by
    # playwright-core from npm, below), curl for bench/metrics, and the
    # Prometheus parser its /metrics is checked with
    chromium curl python3-prometheus-client
    # bench/ingress-attack's and bench/ingress-auth's peer: Postfix (above)
    # with OpenDKIM (above) and OpenDMARC
    opendmarc
    # the lists' archive (t/169): a real mlmmj list's archive, threaded by MHonArc
    mlmmj mhonarc
    # the failover test and bench/failover (scripts/ha.sh): etcd, Patroni, PgBouncer
    etcd-server patroni pgbouncer
    # bench/list's peer: mlmmj (with Postfix, above), the mailing-list manager compared
    mlmmj
    # scripts/check-under-load.sh: the suite under a CPU hog on every core
    stress-ng
    # benchmarks: pgbench ships in postgresql-15; bench/ingress/policy.sh
    # makes its certificate and password hash with openssl, and gives
    # Postfix SASL from Dovecot (dovecot-core, above)
    openssl
)

# The Debian packages (make deb, make deb-check): dpkg-buildpackage and
# debhelper, lintian, fakeroot, and pandoc for the man pages (debian/control's
# Build-Depends are "run"'s and these).
deb_packages=(
    dpkg-dev debhelper lintian fakeroot pandoc
)

packages=("${run_packages[@]}")
case "$set_name" in
check) packages+=("${check_packages[@]}") ;;
deb) packages+=("${deb_packages[@]}") ;;
esac

missing=()
for pkg in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done
# bench/stages's peer, Graphile Worker, comes from npm: Debian's nodejs and
# npm, unless a node and an npm are installed already (Debian's npm
# package conflicts with a NodeSource nodejs, which bundles its own npm).
if [ "$set_name" = check ] && { ! command -v node >/dev/null || ! command -v npm >/dev/null; }; then
    missing+=(nodejs npm)
fi

# playwright-core (npm) drives that Chromium: no browser of its own is
# downloaded.  The
# browser test skips, saying so, if the registry could not be reached.
# Installed globally (npm root -g), where the test finds it.
playwright_core=1.65.1
install_playwright_core() {
    local root
    [ "$set_name" = check ] || return 0
    command -v npm >/dev/null || return 0
    root=$(npm root -g 2>/dev/null)
    [ -f "$root/playwright-core/package.json" ] \
        && grep -q "\"version\": \"$playwright_core\"" "$root/playwright-core/package.json" \
        && return 0
    [ "$(id -u)" -eq 0 ] || { echo "deps.sh: playwright-core is missing (npm install -g playwright-core@$playwright_core)" >&2; return 0; }
    echo "deps.sh: installing playwright-core@$playwright_core (npm)"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install -g --no-audit --no-fund "playwright-core@$playwright_core" >/dev/null 2>&1 \
        || echo "deps.sh: npm could not install playwright-core: the browser test will be skipped" >&2
}

if [ ${#missing[@]} -eq 0 ]; then
    install_playwright_core
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "deps.sh: missing packages: ${missing[*]}" >&2
    echo "deps.sh: run as root (or: sudo apt-get install ${missing[*]})" >&2
    exit 1
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Postfix is a test peer, run privately by the tests and benchmarks: it must
# not configure (and start) a system mail server on port 25.
echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
# A fresh machine has empty package lists; refresh them once if needed.
if ! apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi
install_playwright_core
