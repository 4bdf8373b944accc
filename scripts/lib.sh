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

# ---- make run (scripts/run.sh) ----------------------------------------------
# As root the cluster runs as its own user, the daemons as $PEPSI_USER;
# not as root, both as whoever runs make run.
PEPSI_RUN_CLUSTER_USER=${PEPSI_RUN_CLUSTER_USER:-pepsi-pg}

run_users() {
    [ "$(id -u)" -eq 0 ] || return 0
    ensure_unprivileged_user
    if ! id "$PEPSI_RUN_CLUSTER_USER" >/dev/null 2>&1; then
        useradd --system --user-group --no-create-home --home-dir /nonexistent \
                --shell /usr/sbin/nologin "$PEPSI_RUN_CLUSTER_USER"
    fi
}

run_as_cluster() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u "$PEPSI_RUN_CLUSTER_USER" -- "$@"; else "$@"; fi
}

run_as_daemons() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u "$PEPSI_USER" -- "$@"; else "$@"; fi
}

# Hand a directory just made (never one another user could have filled) to
# the cluster's user, or the daemons'.
run_give_cluster() {
    [ "$(id -u)" -ne 0 ] || chown -h "$PEPSI_RUN_CLUSTER_USER:" "$@"
}

run_give_daemons() {
    [ "$(id -u)" -ne 0 ] || chown -h "$PEPSI_USER:" "$@"
}

# run_path_trusted PATH: whether PATH and every directory on the way to it
# are root's and writable by nobody else (a root-owned sticky directory,
# /tmp, excepted), as the set-id programs check (privilege_path_trusted),
# and open to the cluster's and the daemons' users (not under /root, say).
run_path_trusted() {
    local path=$1 at=/ part owner mode
    local -a parts
    IFS=/ read -r -a parts <<<"${path#/}"
    for part in "" "${parts[@]}"; do
        [ -z "$part" ] || at="${at%/}/$part"
        [ -e "$at" ] && [ ! -L "$at" ] || return 1
        read -r owner mode < <(stat -c '%u %a' "$at")
        [ "$owner" -eq 0 ] || return 1
        if [ $((8#$mode & 8#022)) -ne 0 ] && { [ ! -d "$at" ] || [ $((8#$mode & 8#1000)) -eq 0 ]; }; then
            return 1
        fi
        [ ! -d "$at" ] || [ $((8#$mode & 8#001)) -ne 0 ] || return 1
    done
}

# run_dir_choose TOP: the run's directory, made if missing.  TOP/run; as
# root, one of root's alone, so TOP/run when the way to TOP is root's (and
# open to the other users), else
# /var/lib/pepsi-run/<hash of TOP>, which TOP/run then links to.
run_dir_choose() {
    local top=$1 dir="$1/run" elsewhere
    if [ "$(id -u)" -ne 0 ]; then
        mkdir -p "$dir"
        echo "$dir"
        return
    fi
    elsewhere="/var/lib/pepsi-run/$(printf '%s' "$top" | md5sum | cut -c1-12)"
    if [ -L "$dir" ] && [ "$(readlink "$dir")" = "$elsewhere" ]; then
        :
    elif run_path_trusted "$top"; then
        [ -L "$dir" ] && rm -f "$dir"
        mkdir -p "$dir"
        # A directory an older run.sh gave the daemons' user becomes root's.
        chown -h root:root "$dir"
        chmod 755 "$dir"
        echo "$dir"
        return
    fi
    install -d -o root -g root -m 755 /var/lib/pepsi-run "$elsewhere"
    if [ -L "$dir" ] || [ ! -e "$dir" ]; then
        ln -sfn "$elsewhere" "$dir"
    fi
    if [ "$(readlink "$dir")" = "$elsewhere" ]; then
        echo "run.sh: the way to $top is not root's alone (or not open to $PEPSI_USER): the run lives in $elsewhere ($dir links to it)" >&2
    else
        echo "run.sh: the way to $top is not root's alone (or not open to $PEPSI_USER): the run lives in $elsewhere ($dir is in the way of a link to it)" >&2
    fi
    echo "$elsewhere"
}

# run_conf_value CONF SECTION KEY: KEY's value in [SECTION] of CONF.
run_conf_value() {
    awk -v section="[$2]" -v key="$3" '
        /^\[/ { inside = ($1 == section) }
        inside && $1 == key && $2 == "=" { value = $3 }
        END { print value }' "$1"
}

# run_port_free PORT WHAT ENV-VAR ELSE: true when nothing answers on
# 127.0.0.1:PORT; else says which port is taken and how to choose another.
run_port_free() {
    local port=$1 what=$2 var=$3 where=$4
    [ -n "$port" ] || return 0
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "run.sh: port $port ($what) is taken: stop what listens there, or choose another port:" \
             "$var=PORT make run before the run's configuration is made, or afterwards $where" >&2
        return 1
    fi
}

# run_pid_ours PID RUN_DIR: whether PID is run.sh or a program of RUN_DIR/bin.
run_pid_ours() {
    local pid=$1 run_dir=$2 exe
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
    case "$exe" in
    "$run_dir/bin/"*) return 0 ;;
    esac
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "scripts/run.sh"
}

# run_stop RUN_DIR: stops what run.sh started there (its pid files in
# RUN_DIR/pids): run.sh itself, which stops its daemons and the cluster,
# then whatever is left, each waited for (bounded).
run_stop() {
    local run_dir=$1 file pid i data="$1/pg/data" stopped=0
    for file in "$run_dir/pids/run.pid" "$run_dir"/pids/*.pid; do
        [ -f "$file" ] || continue
        pid=$(cat "$file")
        if run_pid_ours "$pid" "$run_dir"; then
            kill -TERM "$pid" 2>/dev/null || true
            for ((i = 0; i < 300; i++)); do
                run_pid_ours "$pid" "$run_dir" || break
                sleep 0.1
            done
            if run_pid_ours "$pid" "$run_dir"; then
                echo "run.sh: pid $pid ($(basename "$file" .pid)) did not stop in 30 s: killed" >&2
                kill -KILL "$pid" 2>/dev/null || true
            fi
            stopped=1
        fi
        rm -f "$file"
    done
    if [ -f "$data/postmaster.pid" ] && run_as_cluster "$PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        run_as_cluster "$PGBIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null
        stopped=1
    fi
    if [ "$stopped" -eq 1 ]; then echo "Pepsi stopped."; else echo "Pepsi is not running."; fi
}

# run_config_make RUN_DIR PGPORT BIN [PGHOST]: RUN_DIR/pepsi.conf, the
# system's configuration as `make run` starts it (docs/pepsi.conf.sample
# with the run's places filled in: the cluster at PGHOST, default
# 127.0.0.1, and PGPORT; SMTP on $PEPSI_SMTP_PORT and the web page on
# $PEPSI_HTTP_PORT, default 2525 and 8025; the daemons as daemon_user), and what that graph
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
        -e "/^\[listener-smtp\]/,/^\[/s|^PORT = 2525$|PORT = ${PEPSI_SMTP_PORT:-2525}|" \
        -e "/^\[httpd\]/,/^\[/s|^PORT = 8025$|PORT = ${PEPSI_HTTP_PORT:-8025}|" \
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
        give_to_user "$run_dir/dkim"
    fi
    # The secret forwarded mail's senders are rewritten with.
    if [ ! -f "$run_dir/srs/secret" ]; then
        mkdir -p "$run_dir/srs"
        (umask 077 && head -c 24 /dev/urandom | base64 >"$run_dir/srs/secret")
        give_to_user "$run_dir/srs"
    fi
}
