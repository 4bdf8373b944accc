#!/usr/bin/env bash
# Start (or stop) Pepsi on a private PostgreSQL cluster under ./run/.
# The cluster listens on 127.0.0.1:${PEPSI_PGPORT:-5433} and on a socket in
# ./run/, holds database "pepsi" with the extension created, and preloads
# the library so the maintenance worker runs.  Then the mail system runs in
# the foreground from ./run/pepsi.conf (made from docs/pepsi.conf.sample):
# pepsi-dispatch, and pepsi-ingress on 127.0.0.1:2525 when it is built.
# Ctrl-C stops the daemons cleanly, then the cluster.
set -euo pipefail
# The daemons run in this terminal: their logs go to it, not to syslog.
export PEPSI_LOG=stderr
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

run_dir="$top/run"
port=${PEPSI_PGPORT:-5433}
action=${1:-start}

ensure_unprivileged_user
mkdir -p "$run_dir"

# The cluster's owner, who is also the daemons' user, must reach ./run
# (the data, the configuration, keys, mailboxes); when the checkout sits
# somewhere it cannot (under /root, say), ./run links to its home.
data="$run_dir/pgdata"
if [ ! -e "$data" ]; then
    give_to_user "$run_dir"
    if ! as_user test -w "$run_dir"; then
        elsewhere="/var/lib/pepsi/run-$(echo "$top" | md5sum | cut -c1-8)"
        mkdir -p "$elsewhere"
        give_to_user "$elsewhere"
        if [ ! -L "$run_dir" ] && rmdir "$run_dir" 2>/dev/null; then
            ln -s "$elsewhere" "$run_dir"
        else
            ln -s "$elsewhere/pgdata" "$data"
        fi
        echo "run.sh: $PEPSI_USER cannot write $run_dir; it lives in $elsewhere"
    fi
fi
sockdir=$(dirname "$(readlink -f "$data")")
pg_ctl_as_user() { as_user "$PGBIN/pg_ctl" -D "$data" "$@"; }

case "$action" in
stop)
    if [ -f "$data/postmaster.pid" ]; then
        pg_ctl_as_user -m fast stop
    else
        echo "Pepsi's cluster is not running."
    fi
    exit 0
    ;;
start) ;;
*)
    echo "usage: run.sh start|stop" >&2
    exit 2
    ;;
esac

if [ ! -f "$data/PG_VERSION" ]; then
    echo "Creating the cluster in $data"
    as_user "$PGBIN/initdb" -D "$data" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
        --no-instructions >/dev/null
    as_user tee -a "$data/postgresql.conf" >/dev/null <<CONF
# Pepsi's private cluster (scripts/run.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sockdir'
shared_preload_libraries = 'pepsi'
pepsi.database = 'pepsi'
CONF
fi

# No trust: over the socket each system user may be only the roles
# pg_ident.conf maps it to (peer), over TCP only a role with a password
# (none here has one).  Whoever runs make run is the superuser and the
# operator tools' roles; the daemons' user is the roles of the daemons.
# Written at every start, so a cluster made before is brought in line.
operator=$(id -un)
daemons=$(daemon_user)
as_user tee "$data/pg_hba.conf" >/dev/null <<HBA
# Pepsi's private cluster (scripts/run.sh): no trust.
local all all peer map=pepsi
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
HBA
as_user tee "$data/pg_ident.conf" >/dev/null <<IDENT
# MAP  SYSTEM-USER  ROLE (scripts/run.sh; the roles' grants: docs/pepsi-admin.7.md)
pepsi  $operator  postgres
pepsi  $operator  pepsi_viewer
pepsi  $operator  pepsi_operator
pepsi  $operator  pepsi_smtpd
pepsi  $daemons  pepsi_dispatch
pepsi  $daemons  pepsi_smtpd
pepsi  $daemons  pepsi_web
IDENT
if ! as_user "$PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    pg_ctl_as_user -l "$sockdir/postgresql.log" -w start >/dev/null
else
    pg_ctl_as_user reload >/dev/null
fi
if [ "$("$PGBIN/pg_config" --pkglibdir)/pepsi.so" -nt "$data/postmaster.pid" ]; then
    # The library is preloaded: a newer build needs a restart to be used.
    echo "Restarting the cluster for the newly installed pepsi library"
    pg_ctl_as_user -l "$sockdir/postgresql.log" -m fast -w restart >/dev/null
fi
psql_admin() { "$PGBIN/psql" -X -q -h "$sockdir" -p "$port" -U postgres "$@"; }
if ! psql_admin -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'pepsi'" | grep -q 1; then
    psql_admin -d postgres -c "CREATE DATABASE pepsi"
fi
psql_admin -d pepsi -c "CREATE EXTENSION IF NOT EXISTS pepsi"
# The worker started with the server before the extension existed; it polls
# for it, but starting it now is harmless (it returns the running one).
psql_admin -d pepsi -tAc "SELECT pepsi.start_maintenance()" >/dev/null
# A login role per program, each a member of the one group role that
# grants what it needs (docs/pepsi-admin.7.md, "Roles"); none superuser.
psql_admin -d pepsi -v ON_ERROR_STOP=1 -tA >/dev/null <<'SQL'
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM (VALUES ('pepsi_dispatch', 'pepsi_stage'), ('pepsi_smtpd', 'pepsi_ingress'),
        ('pepsi_web', 'pepsi_httpd'), ('pepsi_viewer', 'pepsi_monitor'),
        ('pepsi_operator', 'pepsi_config')) AS v (login, member_of)
    LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r.login) THEN
            EXECUTE format('CREATE ROLE %I LOGIN IN ROLE %I', r.login, r.member_of);
        END IF;
    END LOOP;
END
$$;
SQL

# The system's configuration: the sample with this run's places filled in
# (scripts/lib.sh), and the one mailbox of the demonstration: ingress
# refuses unknown local recipients (LOCAL_RECIPIENTS = maildir) and relays
# only for this host.
bin="$top/build/bin"
# The daemons' user runs the programs (a stage worker is the dispatcher's
# own binary): a build it cannot reach is copied where it can.
if ! as_user test -x "$bin/pepsi-dispatch"; then
    rm -rf "$run_dir/bin"
    cp -r "$bin" "$run_dir/bin"
    chmod -R a+rX "$run_dir/bin"
    bin="$run_dir/bin"
fi
conf="$run_dir/pepsi.conf"
run_config_make "$run_dir" "$port" "$bin" "$sockdir"
mkdir -p "$run_dir/maildir/you@example.org/"{tmp,new,cur}
[ "$(id -u)" -ne 0 ] || give_to_user "$run_dir/maildir"
daemon() {
    # The multi-call binary when it is built (workers can then fuse stages).
    if [ -x "$bin/pepsi" ]; then echo "$bin/pepsi $1"; else echo "$bin/$1"; fi
}

# The web page: pepsi-httpd connects as pepsi_web, a member of
# pepsi_httpd and nothing more; the administrator "admin" gets a password
# made on the first start and shown once.
admin_password=
if [ -x "$bin/pepsi-httpd" ] && [ -z "$(psql_admin -d pepsi -tAc "SELECT 1 FROM pepsi.admin_account WHERE name = 'admin'")" ]; then
    admin_password=$(openssl rand -base64 15)
    echo "$admin_password" | "$bin/pepsi-httpd" -c "$conf" passwd admin
fi

cat <<MSG
Pepsi's cluster is running (log: $sockdir/postgresql.log).
  Connect:  psql -h $sockdir -p $port -U postgres pepsi   (as $operator)
  Config:   $conf
MSG

pids=()
stop_all() {
    trap - INT TERM
    echo "Stopping Pepsi..."
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pg_ctl_as_user -m fast stop >/dev/null && echo "Stopped."
    exit 0
}
trap stop_all INT TERM

$(daemon pepsi-dispatch) -c "$conf" &
pids+=($!)
if [ -x "$bin/pepsi-ingress" ]; then
    $(daemon pepsi-ingress) -c "$conf" &
    pids+=($!)
    echo "  SMTP:     127.0.0.1:2525 (swaks --server 127.0.0.1:2525 --to you@example.org)"
fi
if [ -x "$bin/pepsi-httpd" ]; then
    $(daemon pepsi-httpd) -c "$conf" &
    pids+=($!)
    echo "  Web:      http://127.0.0.1:8025/ (log in as admin; metrics at /metrics)"
    if [ -n "$admin_password" ]; then
        echo "            admin's password, shown this once: $admin_password"
        echo "            (a new one: echo NEW-PASSWORD | build/bin/pepsi-httpd -c run/pepsi.conf passwd admin)"
    fi
fi
echo "Running; Ctrl-C stops everything."
wait
stop_all
