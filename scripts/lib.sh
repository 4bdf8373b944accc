# Shared by the scripts: PostgreSQL's location and the unprivileged user.
# Sourced, not run.

PGBIN=${PGBIN:-$(/usr/lib/postgresql/15/bin/pg_config --bindir 2>/dev/null || pg_config --bindir)}
PGXS_DIR=$(dirname "$("$PGBIN/pg_config" --pgxs)")/..
PG_REGRESS="$PGXS_DIR/test/regress/pg_regress"
PG_TAP_LIB="$PGXS_DIR/test/perl"

# initdb refuses root, so as root the clusters belong to a system user.
PEPSI_USER=${PEPSI_USER:-pepsi}

ensure_unprivileged_user() {
    [ "$(id -u)" -eq 0 ] || return 0
    if ! id "$PEPSI_USER" >/dev/null 2>&1; then
        useradd --system --user-group --home-dir /var/lib/pepsi --create-home \
                --shell /usr/sbin/nologin "$PEPSI_USER"
    fi
}

# Run a command as the unprivileged user (as ourselves when not root).
as_user() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u "$PEPSI_USER" -- "$@"
    else
        "$@"
    fi
}

# Hand a directory to that user.
give_to_user() {
    [ "$(id -u)" -eq 0 ] && chown -R "$PEPSI_USER:" "$@"
    return 0
}

# The system user the daemons run as ([dispatch], [ingress], [httpd]
# USER): the unprivileged user as root, else whoever runs them.
daemon_user() {
    if [ "$(id -u)" -eq 0 ]; then echo "$PEPSI_USER"; else id -un; fi
}

# run_config_make RUN_DIR PGPORT BIN [PGHOST]: RUN_DIR/pepsi.conf, the
# system's configuration as `make run` starts it (docs/pepsi.conf.sample
# with the run's places filled in: the cluster at PGHOST, default
# 127.0.0.1, and PGPORT; the daemons as daemon_user), and what that graph
# reads, each made once: a self-signed certificate for STARTTLS, the DKIM
# key, the SRS secret (the last two the daemons' user's: the stages read
# them).  Remote mail goes to the smarthost stages, which hold it paused
# while no SMARTHOST is set: a demonstration never sends mail to the
# internet.  bench/fairness measures the same graph from the same function.
run_config_make() {
    local run_dir=$1 port=$2 bin=$3 host=${4:-127.0.0.1}
    local conf="$run_dir/pepsi.conf" tls="$run_dir/tls" record
    sed -e "s|@RUN_DIR@|$run_dir|g" -e "s|@PGPORT@|$port|g" -e "s|@PGHOST@|$host|g" \
        -e "s|^USER = pepsi$|USER = $(daemon_user)|" \
        -e "s|^NEXT_STAGE = internet$|NEXT_STAGE = smarthost|" \
        -e "s|^NEXT_STAGE = dsn-internet$|NEXT_STAGE = dsn-smarthost|" \
        "$(dirname "${BASH_SOURCE[0]}")/../docs/pepsi.conf.sample" >"$conf"
    # As root the maildir helper (without its bit here) never writes as
    # root: the mailboxes are the unprivileged user's.
    if [ "$(id -u)" -eq 0 ]; then
        sed -i "s|^#VIRTUAL_USER = vmail|VIRTUAL_USER = $PEPSI_USER|" "$conf"
    fi
    # Clients that verify will not trust the certificate; swaks -tls does not check.
    if [ ! -f "$tls/cert.pem" ]; then
        mkdir -p "$tls"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=localhost" \
            -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
            -keyout "$tls/key.pem" -out "$tls/cert.pem" >/dev/null 2>&1
        echo "TLS certificate made: $tls/cert.pem (self-signed)"
    fi
    # pepsi-ingress reads the key again at each reload, by then as the
    # daemons' user, and refuses one others may read: as root it is root's
    # with the daemons' group, mode 0640 (a key made by an older run too).
    if [ "$(id -u)" -eq 0 ]; then
        chown "root:$(id -gn "$PEPSI_USER")" "$tls/key.pem"
        chmod 640 "$tls/key.pem"
    else
        chmod 600 "$tls/key.pem"
    fi
    sed -i -e "s|^#CERTIFICATE = /etc/pepsi/tls/fullchain.pem|CERTIFICATE = $tls/cert.pem|" \
           -e "s|^#KEY = /etc/pepsi/tls/privkey.pem|KEY = $tls/key.pem|" "$conf"
    # The key outbound mail and DSNs are signed with; its TXT record printed
    # for whoever wants to publish it.
    if [ ! -f "$run_dir/dkim/example.org.pem" ]; then
        mkdir -p "$run_dir/dkim"
        record=$("$bin/pepsi-keys" generate -a rsa-sha256 -o "$run_dir/dkim/example.org.pem")
        echo "DKIM key made: publish at pepsi._domainkey.example.org TXT \"$record\""
    fi
    # The secret forwarded mail's senders are rewritten with.
    if [ ! -f "$run_dir/srs/secret" ]; then
        mkdir -p "$run_dir/srs"
        (umask 077 && head -c 24 /dev/urandom | base64 >"$run_dir/srs/secret")
    fi
    give_to_user "$run_dir/dkim" "$run_dir/srs"
}
