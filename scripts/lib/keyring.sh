# shellcheck shell=bash
# Starts a private D-Bus session bus with an unlocked gnome-keyring, for
# scripts/run and scripts/test. Source it, then call keyring_start DIR.
#
# keyring_start DIR   exports DBUS_SESSION_BUS_ADDRESS and keeps the keyring's
#                     files under DIR; the password comes from
#                     VAULTD_KEYRING_PASSWORD, else is generated and printed.
# keyring_stop        stops the bus and the keyring started here.

keyring_start() {
    local dir="$1"
    mkdir -p "$dir/data" "$dir/runtime"
    chmod 700 "$dir" "$dir/runtime"
    local out
    # The forked bus must not keep the caller's stdin or stderr open: a caller
    # that reads those to their end would wait for the bus to exit.
    out=$(dbus-daemon --session --fork --nopidfile --print-address=1 --print-pid=1 \
        --address="unix:path=$dir/runtime/bus" </dev/null 2>"$dir/dbus.log") || return 1
    VAULTD_KEYRING_BUS_PID=$(printf '%s\n' "$out" | sed -n 2p)
    export DBUS_SESSION_BUS_ADDRESS
    DBUS_SESSION_BUS_ADDRESS=$(printf '%s\n' "$out" | sed -n 1p)
    if [ -z "${VAULTD_KEYRING_PASSWORD:-}" ]; then
        VAULTD_KEYRING_PASSWORD=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
        VAULTD_KEYRING_PASSWORD_GENERATED=1
    fi
    # The keyring keeps its files under XDG_DATA_HOME and its control socket
    # under XDG_RUNTIME_DIR; both point into DIR so nothing of the user's is touched.
    # In a session of its own (setsid, as dbus-daemon --fork is): a Ctrl-C in
    # the caller's terminal signals the whole foreground process group and
    # would end the keyring while vaultd still needs it (scripts/run logs
    # sessions out at that moment); keyring_stop ends it with its bus.
    printf '%s' "$VAULTD_KEYRING_PASSWORD" |
        XDG_DATA_HOME="$dir/data" XDG_RUNTIME_DIR="$dir/runtime" \
            setsid --wait gnome-keyring-daemon --unlock --components=secrets >"$dir/keyring.env" 2>"$dir/keyring.log" || {
        echo "gnome-keyring-daemon failed to start: $(cat "$dir/keyring.log")" >&2
        return 1
    }
    # Wait (bounded) until the Secret Service name is owned on the bus.
    local i
    for i in $(seq 1 100); do
        if dbus-send --session --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \
            org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null | grep -q 'boolean true'; then
            return 0
        fi
        sleep 0.05
    done
    echo "gnome-keyring did not take org.freedesktop.secrets on $DBUS_SESSION_BUS_ADDRESS" >&2
    return 1
}

keyring_stop() {
    if [ -n "${VAULTD_KEYRING_BUS_PID:-}" ]; then
        # gnome-keyring-daemon exits when its bus goes away. SIGKILL, because a
        # bus started from a process that blocks SIGTERM (a test runner does)
        # inherits that mask and would ignore it.
        kill -KILL "$VAULTD_KEYRING_BUS_PID" 2>/dev/null || true
        VAULTD_KEYRING_BUS_PID=
    fi
}

# True when a Secret Service answers on the current session bus.
keyring_reachable() {
    [ -n "${DBUS_SESSION_BUS_ADDRESS:-}" ] &&
        dbus-send --session --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \
            org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null | grep -q 'boolean true'
}
