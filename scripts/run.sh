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

# The cluster's owner must reach ./run; when the checkout sits somewhere it
# cannot (under /root, say), the data lives in its home and ./run links to it.
data="$run_dir/pgdata"
if [ ! -e "$data" ]; then
    give_to_user "$run_dir"
    if ! as_user test -w "$run_dir"; then
        elsewhere="/var/lib/pepsi/run-$(echo "$top" | md5sum | cut -c1-8)"
        mkdir -p "$elsewhere"
        give_to_user "$elsewhere"
        ln -s "$elsewhere/pgdata" "$data"
        echo "run.sh: $PEPSI_USER cannot write $run_dir; the cluster lives in $elsewhere"
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
    as_user "$PGBIN/initdb" -D "$data" -U postgres --auth=trust --no-instructions >/dev/null
    as_user tee -a "$data/postgresql.conf" >/dev/null <<CONF
# Pepsi's private cluster (scripts/run.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sockdir'
shared_preload_libraries = 'pepsi'
pepsi.database = 'pepsi'
CONF
fi

if ! as_user "$PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    pg_ctl_as_user -l "$sockdir/postgresql.log" -w start >/dev/null
elif [ "$("$PGBIN/pg_config" --pkglibdir)/pepsi.so" -nt "$data/postmaster.pid" ]; then
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

# The system's configuration: the sample with this run's places filled in
# (scripts/lib.sh), and the one mailbox of the demonstration: ingress
# refuses unknown local recipients (LOCAL_RECIPIENTS = maildir) and relays
# only for this host.
bin="$top/build/bin"
conf="$run_dir/pepsi.conf"
run_config_make "$run_dir" "$port" "$bin"
mkdir -p "$run_dir/maildir/you@example.org/"{tmp,new,cur}
[ "$(id -u)" -ne 0 ] || give_to_user "$run_dir/maildir"
daemon() {
    # The multi-call binary when it is built (workers can then fuse stages).
    if [ -x "$bin/pepsi" ]; then echo "$bin/pepsi $1"; else echo "$bin/$1"; fi
}

# The web page: pepsi-httpd connects as pepsi_web, a member of
# pepsi_httpd and nothing more; the administrator "admin" gets a password
# made on the first start and shown once.
psql_admin -d pepsi -tAc "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pepsi_web')
    THEN CREATE ROLE pepsi_web LOGIN IN ROLE pepsi_httpd; END IF; END \$\$" >/dev/null
admin_password=
if [ -x "$bin/pepsi-httpd" ] && [ -z "$(psql_admin -d pepsi -tAc "SELECT 1 FROM pepsi.admin_account WHERE name = 'admin'")" ]; then
    admin_password=$(openssl rand -base64 15)
    echo "$admin_password" | "$bin/pepsi-httpd" -c "$conf" passwd admin
fi

cat <<MSG
Pepsi's cluster is running (log: $sockdir/postgresql.log).
  Connect:  psql -h 127.0.0.1 -p $port -U postgres pepsi
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
