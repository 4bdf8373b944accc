#!/usr/bin/env bash
# What an installation consists of, made and listed the same way for the
# Debian package and for make install, so the two can be compared
# (t/133_install_layout.pl, make deb-check):
#
#   install-layout.sh base ROOT
#       an empty root dpkg --root and the postinst can work in: a dpkg
#       database, and /etc/passwd and group with root's and nobody's accounts
#   install-layout.sh accounts ROOT
#       a root holding only the system accounts: ROOT/etc/passwd and group
#       with root's and nogroup, then the accounts debian/pepsi.postinst
#       makes there from dist/sysusers.d/pepsi.conf (DPKG_ROOT=ROOT)
#   install-layout.sh image ROOT
#       what the package's build stages (make install DESTDIR=ROOT
#       PREFIX=/usr ... SETID=no, as debian/rules), then what its postinst
#       does to it (DPKG_ROOT=ROOT): the accounts and the privileged
#       programs' bits
#   install-layout.sh make-install DIR ACCOUNTS [TARGET [VARIABLE=VALUE...]]
#       make install (or TARGET) DESTDIR=DIR (PREFIX /usr/local) as root, as on a host
#       whose accounts are ACCOUNTS/etc/passwd and group: they stand in for
#       the host's in a private mount namespace, so the host's are never
#       changed and its own accounts do not matter
#   install-layout.sh manifest DIR ACCOUNTS [LIST]
#       one line per file and symbolic link under DIR (or of LIST, paths
#       relative to DIR), "PATH f MODE OWNER GROUP" or "PATH l TARGET",
#       with the names of ACCOUNTS; /usr/local as /usr, /lib/systemd as
#       /usr/lib/systemd, compressed man pages as plain ones, sorted
#
# As root only (owners, modes, a mount namespace).  The project's
# Makefile is that of the tree above this script.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "install-layout.sh: needs root" >&2; exit 1; }

# The postinst's DPKG_ROOT needs a dpkg database there for
# dpkg-statoverride, and the few accounts every Debian system has.
base_root() {
    local root=$1
    mkdir -p "$root/etc" "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
    [ -e "$root/var/lib/dpkg/status" ] || : >"$root/var/lib/dpkg/status"
    [ -e "$root/etc/passwd" ] || printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
    [ -e "$root/etc/group" ] || printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    [ -e "$root/etc/shadow" ] || { printf 'root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n' >"$root/etc/shadow"; chmod 640 "$root/etc/shadow"; }
    [ -e "$root/etc/gshadow" ] || { printf 'root:*::\nnogroup:*::\n' >"$root/etc/gshadow"; chmod 640 "$root/etc/gshadow"; }
    [ -e "$root/etc/login.defs" ] || cp /etc/login.defs "$root/etc/login.defs"
}

# The postinst's configure step against ROOT (its #DEBHELPER# part is the
# package build's, and empty here).
run_postinst() {
    local root=$1
    DPKG_ROOT=$root DPKG_ADMINDIR=$root/var/lib/dpkg sh "$top/debian/pepsi.postinst" configure
}

cmd=${1:-}
case "$cmd" in
base)
    base_root "$2"
    ;;
accounts)
    root=$2
    base_root "$root"
    mkdir -p "$root/usr/lib/sysusers.d"
    cp "$top/dist/sysusers.d/pepsi.conf" "$root/usr/lib/sysusers.d/pepsi.conf"
    run_postinst "$root"
    ;;
image)
    root=$2
    base_root "$root"
    make -C "$top" --no-print-directory install DESTDIR="$root" PREFIX=/usr SYSCONFDIR=/etc \
        SYSTEMD_UNIT_DIR=/lib/systemd/system SETID=no >"$root.log" 2>&1 ||
        { tail -n 30 "$root.log" >&2; exit 1; }
    run_postinst "$root"
    ;;
make-install)
    dir=$2 accounts=$3 target=${4:-install}
    shift $(($# < 4 ? $# : 4))
    unshare --mount --propagation private bash -c '
        set -e
        mount --bind "$1/etc/passwd" /etc/passwd
        mount --bind "$1/etc/group" /etc/group
        make -C "$2" --no-print-directory "$4" DESTDIR="$3" "${@:5}"' \
        make-install "$accounts" "$top" "$dir" "$target" "$@" >"$dir.log" 2>&1 ||
        { tail -n 30 "$dir.log" >&2; exit 1; }
    ;;
manifest)
    dir=$2 accounts=$3 list=${4:-}
    # One find for them all (its %U and %G are numbers when the host has
    # no such account), then the names of ACCOUNTS.
    (cd "$dir" && if [ -n "$list" ]; then sed 's|^|.|' "$list"; else find . \( -type f -o -type l \); fi |
        { xargs -r -d '\n' sh -c 'exec find "$@" -maxdepth 0 -printf "%p\t%y\t%m\t%U\t%G\t%l\n"' find || true; }) |
        awk -F '\t' -v passwd="$accounts/etc/passwd" -v group="$accounts/etc/group" '
            BEGIN {
                FS = ":"
                while ((getline line < passwd) > 0) { split(line, f, ":"); user[f[3]] = f[1] }
                while ((getline line < group) > 0) { split(line, f, ":"); grp[f[3]] = f[1] }
                FS = "\t"
            }
            {
                path = substr($1, 2)
                if ($2 == "l") { print path " l " $6; next }
                if ($2 != "f") next
                printf "%s f %04d %s %s\n", path, $3, ($4 in user) ? user[$4] : $4, ($5 in grp) ? grp[$5] : $5
            }' |
        sed -e 's|^/usr/local/|/usr/|' -e 's|^/lib/systemd/|/usr/lib/systemd/|' \
            -e 's|^\(/usr/share/man/[^ ]*\)\.gz |\1 |' |
        LC_ALL=C sort
    ;;
*)
    echo "usage: install-layout.sh base ROOT | accounts ROOT | image ROOT | make-install DIR ACCOUNTS [TARGET [VARIABLE=VALUE...]] | manifest DIR ACCOUNTS [LIST]" >&2
    exit 2
    ;;
esac
