# shellcheck shell=bash
# For scripts/run: before a temporary keyring (one whose password was
# generated for the run) is discarded, log out every session left in it while
# vaultd still runs, so each token is revoked at its provider instead of
# staying valid in a keyring nobody can open again.
#
# logout_every_session VAULTCTL SOCKET
#   lists the sessions (vaultctl --json list) and runs vaultctl logout for
#   each, with --owner for another uid's session (root sees every session).
#   Prints one line per session and a summary; never fails the caller.
logout_every_session() {
    local ctl=$1 socket=$2 listing sessions provider user owner me count=0 failed=0
    if ! listing=$("$ctl" --socket "$socket" --timeout 30 --json list 2>&1); then
        echo "scripts/run: could not list the sessions of the temporary keyring: $listing" >&2
        return 0
    fi
    # One "provider TAB user TAB owner uid" line per session: account names
    # hold no control characters (vaultd refuses them), so a tab separates them.
    if ! sessions=$(printf '%s' "$listing" | python3 -c '
import json, sys
for s in json.load(sys.stdin).get("sessions", []):
    print("%s\t%s\t%s" % (s["provider"], s["user"], s.get("ownerUid", "")))
'); then
        echo "scripts/run: could not read vaultctl's list of sessions; none was logged out" >&2
        return 0
    fi
    me=$(id -u)
    if [ -z "$sessions" ]; then
        echo "scripts/run: the keyring is temporary and holds no session; nothing to log out"
        return 0
    fi
    echo "scripts/run: the keyring is temporary: logging out every session left in it"
    echo "  (revoking the tokens at the provider) before it is discarded"
    while IFS=$'\t' read -r provider user owner; do
        count=$((count + 1))
        local args=(--socket "$socket" --timeout 30)
        if [ -n "$owner" ] && [ "$owner" != "$me" ]; then args+=(--owner "$owner"); fi
        local out
        if out=$("$ctl" "${args[@]}" logout "$provider" "$user" 2>&1); then
            echo "  logged out $provider $user"
        else
            failed=$((failed + 1))
            echo "  could not log out $provider $user: $out" >&2
        fi
    done <<<"$sessions"
    echo "scripts/run: logged out $((count - failed)) of $count session(s)"
    wait_for_revocations
}

# The items of vaultd's sessions and queued revocations in the keyring of the
# session bus: while a logged-out session's revocation has not been accepted
# by its provider, one of them remains.
vaultd_items_left() {
    local schema total=0 found
    for schema in io.vaultd.Session io.vaultd.PendingRevocation; do
        found=$(secret-tool search --all xdg:schema "$schema" 2>/dev/null | grep -c '^\[' || true)
        total=$((total + found))
    done
    echo "$total"
}

# A logout returns before the provider answered the revocation: wait (at most
# 20 s) until none is left in the keyring, so none is discarded with it.
wait_for_revocations() {
    command -v secret-tool >/dev/null 2>&1 || return 0
    local left
    for _ in $(seq 1 200); do
        left=$(vaultd_items_left)
        [ "$left" -eq 0 ] && return 0
        sleep 0.1
    done
    echo "scripts/run: $left session(s) or revocation(s) are still waiting for the provider after 20 s;" >&2
    echo "  they are discarded with the keyring, and those tokens stay valid until they expire" >&2
}
