# shellcheck shell=bash
# The encrypt stage's key store for a benchmark, shared by bench/crypto
# and bench/relay (BENCH_RELAY_ENCRYPT=1).  Sourced after bench/lib.sh,
# with the cluster started (bench_cluster_start) and $bench_top's
# build/bin holding pepsi-keys (or PEPSI_BIN another build/bin).
#
#   bench_keystore_kek CONF OWNER
#       a key-encryption key ([crypto] KEK, pepsi-keys kek-generate) in
#       the fragment crypto.conf of the secrets.d beside CONF, mode 0640,
#       owned by OWNER: "user", the unprivileged user, for a CONF only
#       that user loads (bench/crypto's worker), or "root" with the
#       unprivileged user's group, for a CONF root loads too (a
#       dispatcher started as root, its workers running as USER)
#   bench_keystore_identity CONF ADDRESS
#       ADDRESS's identity (an Ed25519 OpenPGP key sealed under the KEK,
#       pepsi-keys identity generate: what the stage signs with); CONF has
#       [crypto] CONNINFO, and is loaded by whoever owns its KEK
#   bench_keystore_gpg_start
#       a GnuPG home in $BENCH_DIR/g as the unprivileged user: gpg_ runs
#       gpg there, fingerprint ADDRESS prints a key's; its agent is
#       stopped by bench_keystore_gpg_stop
#   bench_keystore_peer_key ADDRESS TYPE
#       a key for ADDRESS made with that gpg (TYPE ed25519: an Ed25519
#       primary key with a Curve25519 encryption subkey; rsa3072) and put
#       in pepsi.peer_key as imported and valid for ever (what the stage
#       encrypts to); prints its fingerprint

bench_keystore_bin() { echo "${PEPSI_BIN:-$bench_top/build/bin}"; }

bench_keystore_kek() {
    local secrets
    secrets="$(dirname "$1")/secrets.d"
    case $2 in
    user)
        as_user mkdir -p "$secrets"
        as_user chmod 755 "$secrets"
        as_user "$(bench_keystore_bin)/pepsi-keys" kek-generate bench | as_user tee "$secrets/crypto.conf" >/dev/null
        as_user chmod 640 "$secrets/crypto.conf"
        ;;
    root)
        mkdir -p "$secrets"
        chmod 755 "$secrets"
        (umask 027 && "$(bench_keystore_bin)/pepsi-keys" kek-generate bench >"$secrets/crypto.conf")
        [ "$(id -u)" -ne 0 ] || chgrp "$(id -gn "$PEPSI_USER")" "$secrets/crypto.conf"
        chmod 640 "$secrets/crypto.conf"
        ;;
    *)
        echo "bench_keystore_kek: the owner is user or root, not $2" >&2
        return 1
        ;;
    esac
}

bench_keystore_identity() {
    local conf=$1 address=$2 owner
    owner=$(stat -c %U "$(dirname "$conf")/secrets.d/crypto.conf")
    if [ "$owner" = root ]; then
        "$(bench_keystore_bin)/pepsi-keys" identity generate -c "$conf" "$address" >/dev/null
    else
        as_user "$(bench_keystore_bin)/pepsi-keys" identity generate -c "$conf" "$address" >/dev/null
    fi
}

gpg_() { as_user env TMPDIR=/tmp gpg --batch --homedir "$BENCH_DIR/g" --pinentry-mode loopback --passphrase '' "$@"; }
fingerprint() { gpg_ --with-colons --list-keys "<$1>" 2>/dev/null | sed -n 's/^fpr:*\([0-9A-F]\{40\}\):.*/\1/p' | head -n 1; }

bench_keystore_gpg_start() {
    as_user mkdir -p "$BENCH_DIR/g"
    as_user chmod 700 "$BENCH_DIR/g"
}

bench_keystore_gpg_stop() {
    [ -d "$BENCH_DIR/g" ] || return 0
    as_user gpgconf --homedir "$BENCH_DIR/g" --kill gpg-agent || true
}

bench_keystore_peer_key() {
    local address=$1 type=$2 primary sub fpr hex
    case $type in
    ed25519) primary=ed25519 sub=cv25519 ;;
    rsa3072) primary=rsa3072 sub=rsa3072 ;;
    *)
        echo "bench_keystore_peer_key: a key type is ed25519 or rsa3072, not $type" >&2
        return 1
        ;;
    esac
    gpg_ --quick-gen-key "<$address>" "$primary" sign,cert never 2>/dev/null
    fpr=$(fingerprint "$address")
    gpg_ --quick-add-key "$fpr" "$sub" encr never 2>/dev/null
    hex=$(gpg_ --export "$fpr" | od -An -v -tx1 | tr -d ' \n')
    bench_psql -c "INSERT INTO pepsi.peer_key (address, protocol, fingerprint, key_data, source, verdict, cache_until)
                   VALUES ('$address', 'openpgp', '$fpr', '\\x$hex', 'import', 'valid', 'infinity')" >/dev/null
    echo "$fpr"
}
