#!/usr/bin/env bash
# Start (or stop) Pepsi on a private PostgreSQL cluster.
#
# The run's directory is ./run/, or, as root when a directory on the way to
# the checkout is not root's alone (a home directory), one of root's under
# /var/lib/pepsi-run/ that ./run/ links to: the set-id stages and the
# Maildir helper read only a configuration nobody but root can change
# (common/process/privilege.c privilege_path_trusted).  As root three parties are
# kept apart: root owns the programs (run/bin) and the configuration
# (run/pepsi.conf), the cluster runs as its own user ($PEPSI_RUN_CLUSTER_USER,
# pepsi-pg) in run/pg/, and the daemons as $PEPSI_USER (pepsi), which owns
# only what they write (the mailboxes, the DKIM key and the SRS secret).
# Nothing root writes or runs lies in a directory those users can change.
#
# The cluster listens on 127.0.0.1:${PEPSI_PGPORT:-5433} and on a socket in
# run/pg/, holds database "pepsi" with the extension created, and preloads
# the library so the maintenance worker runs.  Then the mail system runs in
# the foreground from run/pepsi.conf: pepsi-dispatch, pepsi-ingress on
# 127.0.0.1:${PEPSI_SMTP_PORT:-2525} and pepsi-httpd on
# 127.0.0.1:${PEPSI_HTTP_PORT:-8025}.  The configuration is made once, from
# docs/pepsi.conf.sample; later starts keep it, with your edits.  Ctrl-C,
# or "run.sh stop" from elsewhere (pid files in run/pids/), stops the
# daemons cleanly, then the cluster; so does a daemon that ends (one that
# could not bind its port, say), with the reason.
set -euo pipefail
# The daemons run in this terminal: their logs go to it, not to syslog.
export PEPSI_LOG=stderr
top=$(cd "$(dirname "$0")/.." && pwd -P)
. "$top/scripts/lib.sh"

action=${1:-start}
case "$action" in
start | stop) ;;
*)
    echo "usage: run.sh start|stop" >&2
    exit 2
    ;;
esac

run_users
run_dir=$(run_dir_choose "$top")
pg="$run_dir/pg"
data="$pg/data"
pids="$run_dir/pids"
conf="$run_dir/pepsi.conf"
pg_ctl_as_cluster() { run_as_cluster "$PGBIN/pg_ctl" -D "$data" "$@"; }

if [ "$action" = stop ]; then
    run_stop "$run_dir"
    exit 0
fi

if [ -s "$pids/run.pid" ] && run_pid_ours "$(cat "$pids/run.pid")" "$run_dir"; then
    echo "run.sh: Pepsi is running already (pid $(cat "$pids/run.pid")); make stop stops it" >&2
    exit 1
fi
mkdir -p "$pids"
echo $$ >"$pids/run.pid"

# The ports: the cluster's as made, the daemons' as the configuration has
# them; one that is taken is named, with how to choose another.
port=${PEPSI_PGPORT:-5433}
[ -f "$data/postgresql.conf" ] && port=$(sed -n 's/^port = \([0-9]*\)$/\1/p' "$data/postgresql.conf" | tail -1)
smtp_port=${PEPSI_SMTP_PORT:-2525}
http_port=${PEPSI_HTTP_PORT:-8025}
if [ -f "$conf" ]; then
    smtp_port=$(run_conf_value "$conf" listener-smtp PORT)
    http_port=$(run_conf_value "$conf" httpd PORT)
fi
# A variable given for a run made before changes nothing: say so.
for setting in "PEPSI_PGPORT $port the cluster's port in $data/postgresql.conf" \
    "PEPSI_SMTP_PORT $smtp_port PORT in [listener-smtp] of $conf" \
    "PEPSI_HTTP_PORT $http_port PORT in [httpd] of $conf"; do
    read -r var value where <<<"$setting"
    if [ -n "${!var:-}" ] && [ "${!var}" != "$value" ]; then
        echo "run.sh: $var=${!var} ignored: this run was made with $value ($where)" >&2
    fi
done
taken=0
run_as_cluster "$PGBIN/pg_ctl" -D "$data" status >/dev/null 2>&1 \
    || run_port_free "$port" "the cluster" "PEPSI_PGPORT" "port in $data/postgresql.conf and every CONNINFO in $conf" || taken=1
run_port_free "$smtp_port" "SMTP (pepsi-ingress)" "PEPSI_SMTP_PORT" "PORT in [listener-smtp] of $conf" || taken=1
run_port_free "$http_port" "the web page (pepsi-httpd)" "PEPSI_HTTP_PORT" "PORT in [httpd] of $conf" || taken=1
[ "$taken" -eq 0 ] || { rm -f "$pids/run.pid"; exit 1; }

[ -d "$pg" ] || { mkdir -p "$pg" && run_give_cluster "$pg" && chmod 755 "$pg"; }
if [ ! -f "$data/PG_VERSION" ]; then
    echo "Creating the cluster in $data"
    run_as_cluster "$PGBIN/initdb" -D "$data" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
        --no-instructions >/dev/null
    run_as_cluster tee -a "$data/postgresql.conf" >/dev/null <<CONF
# Pepsi's private cluster (scripts/run.sh)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$pg'
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
run_as_cluster tee "$data/pg_hba.conf" >/dev/null <<HBA
# Pepsi's private cluster (scripts/run.sh): no trust.
local all all peer map=pepsi
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
HBA
run_as_cluster tee "$data/pg_ident.conf" >/dev/null <<IDENT
# MAP  SYSTEM-USER  ROLE (scripts/run.sh; the roles' grants: docs/pepsi-admin.7.md)
pepsi  $operator  postgres
pepsi  $operator  pepsi_viewer
pepsi  $operator  pepsi_operator
pepsi  $operator  pepsi_smtpd
pepsi  $daemons  pepsi_dispatch
pepsi  $daemons  pepsi_smtpd
pepsi  $daemons  pepsi_web
pepsi  root  pepsi_payer
IDENT
if ! pg_ctl_as_cluster status >/dev/null 2>&1; then
    pg_ctl_as_cluster -l "$pg/postgresql.log" -w start >/dev/null
else
    pg_ctl_as_cluster reload >/dev/null
fi
if [ "$("$PGBIN/pg_config" --pkglibdir)/pepsi.so" -nt "$data/postmaster.pid" ]; then
    # The library is preloaded: a newer build needs a restart to be used.
    echo "Restarting the cluster for the newly installed pepsi library"
    pg_ctl_as_cluster -l "$pg/postgresql.log" -m fast -w restart >/dev/null
fi
psql_admin() { "$PGBIN/psql" -X -q -h "$pg" -p "$port" -U postgres "$@"; }
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
        ELSIF NOT (SELECT rolcanlogin FROM pg_roles WHERE rolname = r.login) THEN
            -- pepsi_dispatch: the extension's group role, which the dispatcher logs in as.
            EXECUTE format('ALTER ROLE %I LOGIN', r.login);
        END IF;
    END LOOP;
END
$$;
SQL
# pepsi-helper-auto-pay's login (set-user-id root, peer authentication as
# root through the map above): a member of pepsi_autopay alone, with no
# password, so the map is its only way in (as pepsi-setup init makes it).
psql_admin -d pepsi -v ON_ERROR_STOP=1 -tA >/dev/null <<'SQL'
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pepsi_payer') THEN
        CREATE ROLE pepsi_payer LOGIN IN ROLE pepsi_autopay;
    END IF;
    ALTER ROLE pepsi_payer LOGIN PASSWORD NULL;
END
$$;
SQL

# The programs: a copy of the build, root's as root (the daemons' user
# runs them, a stage worker is the dispatcher's own binary, and none of
# them may change what root starts).  Copied at every start: a new build
# is run.
rm -rf "$run_dir/bin.new"
cp -r "$top/build/bin" "$run_dir/bin.new"
chmod -R go-w,a+rX "$run_dir/bin.new"
rm -rf "$run_dir/bin"
mv "$run_dir/bin.new" "$run_dir/bin"
bin="$run_dir/bin"

# The system's configuration, made once: the sample with this run's places
# filled in (scripts/lib.sh), and the one mailbox of the demonstration:
# ingress refuses unknown local recipients (LOCAL_RECIPIENTS = maildir)
# and relays only for this host.  One made by an older run.sh (without
# this run's mark) is set aside.
mark="# Made by scripts/run.sh for $run_dir"
if [ -f "$conf" ] && [ "$(head -1 "$conf")" = "$mark" ]; then
    echo "Keeping $conf (your edits included; remove it to have it made again)"
else
    if [ -f "$conf" ]; then
        mv "$conf" "$conf.old"
        echo "run.sh: $conf was made for another layout: set aside as $conf.old"
    fi
    PEPSI_SMTP_PORT=$smtp_port PEPSI_HTTP_PORT=$http_port run_config_make "$run_dir" "$port" "$bin" "$pg"
    sed -i "1i $mark" "$conf"
fi
[ -d "$run_dir/maildir" ] || { mkdir "$run_dir/maildir" && run_give_daemons "$run_dir/maildir"; }
run_as_daemons mkdir -p "$run_dir/maildir/you@example.org/"{tmp,new,cur}
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
Pepsi's cluster is running (log: $pg/postgresql.log).
  Connect:  psql -h $pg -p $port -U postgres pepsi   (as $operator)
  Config:   $conf
MSG

started=()
names=()
stop_all() {
    local status=${1:-0}
    trap - INT TERM
    echo "Stopping Pepsi..."
    for pid in "${started[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${started[@]}"; do wait "$pid" 2>/dev/null || true; done
    pg_ctl_as_cluster -m fast stop >/dev/null && echo "Stopped."
    rm -f "$pids"/*.pid
    exit "$status"
}
trap stop_all INT TERM

start_daemon() {
    local name=$1
    $(daemon "$name") -c "$conf" &
    started+=($!)
    names[$!]=$name
    echo $! >"$pids/$name.pid"
}
start_daemon pepsi-dispatch
if [ -x "$bin/pepsi-ingress" ]; then
    start_daemon pepsi-ingress
    echo "  SMTP:     127.0.0.1:$smtp_port (swaks --server 127.0.0.1:$smtp_port --to you@example.org)"
fi
if [ -x "$bin/pepsi-httpd" ]; then
    start_daemon pepsi-httpd
    echo "  Web:      http://127.0.0.1:$http_port/ (log in as admin; metrics at /metrics)"
    if [ -n "$admin_password" ]; then
        echo "            admin's password, shown this once: $admin_password"
        echo "            (a new one: echo NEW-PASSWORD | $bin/pepsi-httpd -c $conf passwd admin)"
    fi
fi
echo "Running; Ctrl-C (or make stop) stops everything."
# A daemon that ends (one that could not bind its port, say) ends the run.
ended=
status=0
wait -n -p ended "${started[@]}" || status=$?
echo "run.sh: ${names[$ended]:-a daemon} ended (exit status $status; its reason is above): stopping everything" >&2
stop_all 1
