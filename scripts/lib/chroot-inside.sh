# shellcheck shell=bash
# Run by scripts/test-package --install inside the clean Debian 12 root, as
# the ordinary user 'tester', after `apt-get install ./vaultd_*.deb`: the
# installed programs, man pages, the Python client and a login -> token -> logout against a
# private gnome-keyring (the installed /usr/libexec/vaultd/keyring.sh starts
# it on a private D-Bus bus). Every wait is bounded.
set -euo pipefail

step() { printf '  inside: %s\n' "$*"; }

step "vaultctl --version: $(vaultctl --version)"
step "vaultd --version: $(vaultd --version)"
[ "$(command -v vaultd)" = /usr/bin/vaultd ]
[ "$(command -v vaultctl)" = /usr/bin/vaultctl ]

step "vaultd --check-config"
vaultd --check-config

step "man vaultctl, man vaultd, man vaultd.conf"
MANWIDTH=80 man vaultctl 2>/dev/null | grep -q 'vaultctl - the command-line client of vaultd'
MANWIDTH=80 man 8 vaultd 2>/dev/null | grep -q 'vaultd - credential vault daemon'
MANWIDTH=80 man 5 vaultd.conf 2>/dev/null | grep -q 'vaultd.conf - configuration of vaultd'

step "bash completion"
bash -c 'source /usr/share/bash-completion/completions/vaultctl && complete -p vaultctl' | grep -q _vaultctl

step "private keyring"
# shellcheck source=scripts/lib/keyring.sh
source /usr/libexec/vaultd/keyring.sh
dir=$(mktemp -d)
vaultd_pid=
finish() {
    if [ -n "$vaultd_pid" ]; then kill -TERM "$vaultd_pid" 2>/dev/null || true; fi
    keyring_stop
}
trap finish EXIT
keyring_start "$dir"

step "vaultd (user instance, socket $dir/socket)"
vaultd --socket "$dir/socket" 2>"$dir/vaultd.log" &
vaultd_pid=$!
for _ in $(seq 1 200); do
    vaultctl --socket "$dir/socket" --timeout 5 list >/dev/null 2>&1 && break
    kill -0 "$vaultd_pid" 2>/dev/null || {
        cat "$dir/vaultd.log" >&2
        exit 1
    }
    sleep 0.1
done
vaultctl --socket "$dir/socket" --timeout 5 list >/dev/null

token=chroot-token-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
step "login -> token -> logout"
printf '%s' "$token" | vaultctl --socket "$dir/socket" login demo alice >/dev/null
[ "$(vaultctl --socket "$dir/socket" token demo alice)" = "$token" ]
step "the Python client (import vaultd_client) reads the same token"
[ "$(python3 -c 'import sys, vaultd_client
with vaultd_client.Client(sys.argv[1], timeout=5) as vault: print(vault.get_token("demo", "alice").value)' "$dir/socket")" = "$token" ]
vaultctl --socket "$dir/socket" logout demo alice >/dev/null
if vaultctl --socket "$dir/socket" token demo alice >/dev/null 2>&1; then
    echo "the token is still served after logout" >&2
    exit 1
fi

kill -TERM "$vaultd_pid"
status=0
wait "$vaultd_pid" || status=$?
vaultd_pid=
[ "$status" -eq 0 ] || {
    echo "vaultd exited $status on SIGTERM: $(cat "$dir/vaultd.log")" >&2
    exit 1
}
# The system instance's store, as vaultd.service runs it (VAULTD_STORE=sqlite,
# StateDirectory=, the credential data-key) but as this user and with no
# D-Bus at all: the installed vaultd finds libsqlite3 and libsodium, keeps the
# session in the database, and reads it back after a restart.
step "sqlite store (system instance's way): login -> restart -> token"
sys=$(mktemp -d)
mkdir -m 0700 "$sys/state" "$sys/credentials"
(umask 077 && head -c 32 /dev/urandom >"$sys/credentials/data-key")
start_sqlite_vaultd() {
    env -u DBUS_SESSION_BUS_ADDRESS VAULTD_STORE=sqlite STATE_DIRECTORY="$sys/state" \
        CREDENTIALS_DIRECTORY="$sys/credentials" vaultd --socket "$sys/socket" 2>>"$sys/vaultd.log" &
    vaultd_pid=$!
    for _ in $(seq 1 200); do
        vaultctl --socket "$sys/socket" --timeout 5 list >/dev/null 2>&1 && return 0
        kill -0 "$vaultd_pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$sys/vaultd.log" >&2
    exit 1
}
stop_sqlite_vaultd() {
    kill -TERM "$vaultd_pid"
    status=0
    wait "$vaultd_pid" || status=$?
    vaultd_pid=
    [ "$status" -eq 0 ] || {
        echo "vaultd (sqlite) exited $status on SIGTERM: $(cat "$sys/vaultd.log")" >&2
        exit 1
    }
}
start_sqlite_vaultd
printf '%s' "$token" | vaultctl --socket "$sys/socket" login demo bob >/dev/null
stop_sqlite_vaultd
[ "$(stat -c %a "$sys/state/sessions.db")" = 600 ]
start_sqlite_vaultd
[ "$(vaultctl --socket "$sys/socket" token demo bob)" = "$token" ]
stop_sqlite_vaultd
step "done"
