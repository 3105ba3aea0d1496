# shellcheck shell=bash
# A clean Debian 12 root for scripts/test-package --install, cached between
# runs. Needs root (debootstrap, chroot, mount).
#
# chroot_base           prints the cached root (building it when missing):
#                       debootstrap --variant=minbase bookworm, then
#                       dbus-daemon, dbus-bin, gnome-keyring, man-db and
#                       python3 (the test's tools, not vaultd's
#                       dependencies; a cached root without python3, from
#                       before the Python client was packaged, is made
#                       again) and a user
#                       'tester'. Kept in $VAULTD_CHROOT_CACHE (default
#                       /var/cache/vaultd-test); delete it to start afresh.
# mount_chroot DIR      mounts /proc and a small /dev in DIR, copies resolv.conf
# umount_chroot DIR     undoes mount_chroot
# in_chroot DIR CMD...  runs CMD as root in DIR with a clean environment
# file_list DIR         every path in DIR that a package may own, sorted:
#                       without /proc, /dev, /run, /tmp, /home and dpkg's,
#                       apt's and the logs' own state, which installing
#                       anything changes

chroot_cache=${VAULTD_CHROOT_CACHE:-/var/cache/vaultd-test}
# The Debian mirror: $VAULTD_DEBIAN_MIRROR, else the first bookworm archive
# (not the security one) that this machine's own apt sources name, in the
# deb822 form (sources.list.d/*.sources) or the one-line form (sources.list).
debian_mirror() {
    if [ -n "${VAULTD_DEBIAN_MIRROR:-}" ]; then
        printf '%s\n' "$VAULTD_DEBIAN_MIRROR"
        return
    fi
    local file uri
    for file in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        uri=$(awk '
            /^[ \t]*#/ { next }
            /^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }
            /^deb[ \t]/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } else break } }
        ' "$file")
        if [ -n "$uri" ]; then
            printf '%s\n' "$uri"
            return
        fi
    done
    echo "scripts/lib/chroot.sh: no Debian mirror in /etc/apt/sources.list*; set VAULTD_DEBIAN_MIRROR" >&2
    return 1
}

mount_chroot() {
    local dir=$1
    mkdir -p "$dir/proc" "$dir/dev"
    mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc"
    if ! mountpoint -q "$dir/dev"; then
        # A tmpfs of its own, not the host's /dev bound in: removing the root
        # can then never reach the host's device nodes.
        mount -t tmpfs -o mode=0755,size=1m tmpfs "$dir/dev"
        mknod -m 0666 "$dir/dev/null" c 1 3
        mknod -m 0666 "$dir/dev/zero" c 1 5
        mknod -m 0666 "$dir/dev/full" c 1 7
        mknod -m 0666 "$dir/dev/random" c 1 8
        mknod -m 0666 "$dir/dev/urandom" c 1 9
        mknod -m 0666 "$dir/dev/tty" c 5 0
        mkdir -m 1777 "$dir/dev/shm"
        ln -s /proc/self/fd "$dir/dev/fd"
    fi
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
}

umount_chroot() {
    local dir=$1 mount
    for mount in "$dir/dev" "$dir/proc"; do
        if mountpoint -q "$mount"; then umount "$mount" || umount -l "$mount"; fi
    done
}

in_chroot() {
    local dir=$1
    shift
    chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive "$@"
}

file_list() {
    (cd "$1" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./run -o -path ./tmp \
        -o -path ./home -o -path ./root -o -path ./var/lib/dpkg -o -path ./var/lib/apt -o -path ./var/cache \
        -o -path ./var/log -o -path ./etc/ld.so.cache -o -path ./etc/resolv.conf \) -prune -o -print) |
        sed 's|^\.||' | LC_ALL=C sort
}

chroot_base() {
    local minbase=$chroot_cache/bookworm-minbase base=$chroot_cache/bookworm-test
    if [ ! -e "$minbase/.complete" ]; then
        echo "debootstrap --variant=minbase bookworm (cached in $minbase)" >&2
        rm -rf --one-file-system "$minbase.tmp"
        mkdir -p "$chroot_cache"
        local mirror
        mirror=$(debian_mirror) || return 1
        debootstrap --variant=minbase bookworm "$minbase.tmp" "$mirror" >"$chroot_cache/debootstrap.log" 2>&1 || {
            tail -n 20 "$chroot_cache/debootstrap.log" >&2
            return 1
        }
        rm -rf --one-file-system "$minbase"
        mv "$minbase.tmp" "$minbase"
        touch "$minbase/.complete"
    fi
    if [ ! -e "$base/.complete" ] || [ ! -x "$base/usr/bin/python3" ]; then
        echo "adding the test's tools to a copy (cached in $base)" >&2
        rm -rf --one-file-system "$base.tmp"
        cp -a "$minbase" "$base.tmp"
        rm -f "$base.tmp/.complete"
        mount_chroot "$base.tmp"
        # Nothing is started inside the root.
        printf '#!/bin/sh\nexit 101\n' >"$base.tmp/usr/sbin/policy-rc.d"
        chmod 0755 "$base.tmp/usr/sbin/policy-rc.d"
        if ! { in_chroot "$base.tmp" apt-get update -q &&
            in_chroot "$base.tmp" apt-get install -y -q --no-install-recommends dbus-daemon dbus-bin gnome-keyring man-db python3 &&
            in_chroot "$base.tmp" useradd --create-home --user-group tester &&
            in_chroot "$base.tmp" apt-get clean; } >"$chroot_cache/base.log" 2>&1; then
            umount_chroot "$base.tmp"
            tail -n 20 "$chroot_cache/base.log" >&2
            return 1
        fi
        umount_chroot "$base.tmp"
        rm -rf --one-file-system "$base"
        mv "$base.tmp" "$base"
        touch "$base/.complete"
    fi
    printf '%s\n' "$base"
}
