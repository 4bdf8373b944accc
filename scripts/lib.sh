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
