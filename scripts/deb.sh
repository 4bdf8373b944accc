#!/usr/bin/env bash
# The Debian packages (debian/), built from a copy of the tree, and their
# checks.
#   deb.sh build DIR   dpkg-buildpackage -us -uc -b in DIR/src/ (a copy of
#                      the tree's files, tracked or new, without build/), the
#                      packages in DIR (make deb)
#   deb.sh check DIR   build, then: lintian; the packages installed into a
#                      scratch root (dpkg --root, the maintainer scripts
#                      chrootless); there, the privileged programs' owners,
#                      groups and modes those of debian/pepsi.postinst's
#                      table, no other file with a set-id bit, the accounts
#                      of dist/sysusers.d made; and the packages' files and
#                      modes the same as make install's (make deb-check)
# DEB_JOBS: the build's parallel jobs (2).  DEB_REUSE=1: check the
# packages DIR holds, without building them again.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
dir=${2:-$top/build/deb}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

build() {
    local src="$dir/src/pepsi"
    rm -rf "$dir/src" "$dir"/*.deb "$dir"/*.ddeb "$dir"/*.changes "$dir"/*.buildinfo
    mkdir -p "$src"
    (cd "$top" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -xf - -C "$src"
    echo "deb: dpkg-buildpackage -us -uc -b in $src (log: $dir/build.log)"
    if ! (cd "$src" && DEB_BUILD_OPTIONS="parallel=${DEB_JOBS:-2}" dpkg-buildpackage -us -uc -b) \
        >"$dir/build.log" 2>&1; then
        tail -n 40 "$dir/build.log"
        echo "deb: the build failed (the whole log: $dir/build.log)" >&2
        exit 1
    fi
    mv "$dir"/src/*.deb "$dir"/src/*.changes "$dir"/src/*.buildinfo "$dir"/
    mv "$dir"/src/*.ddeb "$dir"/ 2>/dev/null || true
    echo "deb: built $(cd "$dir" && ls ./*.deb | sed 's|^\./||' | tr '\n' ' ')"
}

# debian/pepsi.postinst's table, "NAME OWNER GROUP MODE" per line, as the
# Makefile reads it.
privileged_rows() {
    make -s --no-print-directory -C "$top" privileged-table
}

check() {
    local failures=0 root lint
    [ "$(id -u)" -eq 0 ] || { echo "deb-check: needs root (owners and modes)" >&2; exit 1; }
    if [ "${DEB_REUSE:-}" = 1 ] && ls "$dir"/pepsi_*.deb >/dev/null 2>&1; then
        echo "deb: checking the packages already in $dir (DEB_REUSE=1)"
    else
        build
    fi
    scratch=$(mktemp -d /tmp/pepsi-deb-check.XXXXXX)
    trap 'rm -rf "$scratch"' EXIT

    echo "== lintian"
    lint="$dir/lintian.log"
    # Every tag down to info, each either fixed or overridden with its
    # reason (debian/*.lintian-overrides): any tag shown fails.
    lintian --display-info --show-overrides "$dir"/*.changes >"$lint" 2>&1 || true
    if grep -q '^[EWIP]:' "$lint"; then
        grep -v '^N:' "$lint"
        echo "lintian: $(grep -c '^[EWIP]:' "$lint") tag(s) (above; $lint)"
        failures=$((failures + 1))
    else
        echo "lintian: clean ($(grep -c '^O:' "$lint" || true) tags overridden, each with its reason in debian/*.lintian-overrides)"
    fi

    echo "== dpkg --root (maintainer scripts chrootless)"
    root="$scratch/root"
    "$top/scripts/install-layout.sh" base "$root"
    if dpkg --root="$root" --force-script-chrootless --force-not-root --force-depends \
        -i "$dir"/pepsi_*.deb "$dir"/postgresql-15-pepsi_*.deb "$dir"/pepsi-telemetry_*.deb >"$scratch/dpkg.log" 2>&1; then
        echo "installed into $root: $(dpkg --root="$root" -l 'pepsi' 'postgresql-15-pepsi' 'pepsi-telemetry' | awk '/^ii/ { printf "%s %s  ", $2, $3 }')"
    else
        cat "$scratch/dpkg.log"
        echo "deb-check: dpkg -i into the scratch root failed" >&2
        exit 1
    fi

    echo "== accounts (dist/sysusers.d/pepsi.conf)"
    local kind name
    while read -r kind name _; do
        case "$kind" in
        u) file=passwd ;;
        g) file=group ;;
        *) continue ;;
        esac
        if grep -q "^$name:" "$root/etc/$file"; then
            echo "ok: $file $name"
        else
            echo "MISSING: $file $name"
            failures=$((failures + 1))
        fi
    done < <(grep -E '^[ug] ' "$top/dist/sysusers.d/pepsi.conf")

    echo "== the privileged programs' bits (debian/pepsi.postinst's table)"
    local owner group mode got want
    while read -r name owner group mode; do
        [ -e "$root/usr/bin/$name" ] || { echo "MISSING: /usr/bin/$name"; failures=$((failures + 1)); continue; }
        got=$("$top/scripts/install-layout.sh" manifest "$root" "$root" <(echo "/usr/bin/$name"))
        want="/usr/bin/$name f $mode $owner $group"
        if [ "$got" = "$want" ]; then echo "ok: $got"; else
            echo "DIFFERS: $got (the table: $mode $owner $group)"
            failures=$((failures + 1))
        fi
    done < <(privileged_rows)
    local extra
    extra=$(cd "$root" && find . -perm /6000 ! -type d | sed 's|^\.||' | sort |
        grep -v -x -F -f <(privileged_rows | awk '{ print "/usr/bin/" $1 }') || true)
    if [ -n "$extra" ]; then
        echo "set-id files the table does not name: $extra"
        failures=$((failures + 1))
    else
        echo "ok: no other file carries a setuid or setgid bit"
    fi

    echo "== the packages' files against make install's"
    # The packages' files and links (dpkg's lists), but their
    # documentation (/usr/share/doc: dh_installdocs's, not make install's).
    cat "$root"/var/lib/dpkg/info/pepsi.list "$root"/var/lib/dpkg/info/postgresql-15-pepsi.list \
        "$root"/var/lib/dpkg/info/pepsi-telemetry.list |
        grep -v -e '^/usr/share/doc/' -e '^/usr/share/lintian/' | sort -u |
        while read -r path; do [ -d "$root$path" ] && [ ! -L "$root$path" ] || echo "$path"; done \
            >"$scratch/package.list"
    "$top/scripts/install-layout.sh" manifest "$root" "$root" "$scratch/package.list" >"$scratch/package.manifest"
    "$top/scripts/install-layout.sh" make-install "$scratch/make" "$root"
    "$top/scripts/install-layout.sh" manifest "$scratch/make" "$root" >"$scratch/make.manifest"
    if diff -u "$scratch/make.manifest" "$scratch/package.manifest" >"$scratch/diff"; then
        echo "ok: the same $(wc -l <"$scratch/package.manifest") files and links, owners and modes (make install as root, PREFIX /usr/local)"
    else
        echo "make install (-) and the packages (+) differ:"
        cat "$scratch/diff"
        failures=$((failures + 1))
    fi

    if [ "$failures" -eq 0 ]; then
        echo "deb-check: passed"
    else
        echo "deb-check: $failures check(s) failed"
        exit 1
    fi
}

case "$cmd" in
build) build ;;
check) check ;;
*)
    echo "usage: deb.sh build|check [DIR]" >&2
    exit 2
    ;;
esac
