#!/usr/bin/env bash
# Instructions per GetToken under callgrind: stable on a loaded machine, where
# wall-clock figures are not. Runs a release vaultd (in-memory store, one
# static session) under callgrind twice, serving CONNS connections that each
# send N1, then N2, GetToken calls one at a time; prints the instructions of
# each run and (I2 - I1) / (CONNS * (N2 - N1)), the cost of one call with
# start-up, login and shutdown taken out. Counts user space only (the kernel's
# send/recv are not in it); threads are all counted (the log writer's too).
#   bench/callgrind.sh [VAULTD] [CONNS] [N1] [N2]
set -uo pipefail
root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
vaultd=${1:-$root/.build/release/vaultd}
conns=${2:-32} n1=${3:-500} n2=${4:-2500}
tmp=$(mktemp -d /tmp/vaultd-callgrind.XXXXXX)
chmod 700 "$tmp"
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -pthread -o "$tmp/count_client" "$root/bench/count_client.c" || exit 1
printf '[Provider demo]\nType=static\n' >"$tmp/vaultd.conf"
req='{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"demo","user":"u1"}}'

# valgrind 3.19 cannot read the toolchain's DWARF 5: a copy without debug info (symbols kept).
strip --strip-debug -o "$tmp/vaultd" "$vaultd" || exit 1
vaultd=$tmp/vaultd

run() { # N -> prints total instructions
    local n=$1 sock=$tmp/vaultd.sock out=$tmp/cg.$1
    rm -f "$sock"
    valgrind --tool=callgrind --callgrind-out-file="$out" "$vaultd" --memory-store \
        --socket "$sock" --config "$tmp/vaultd.conf" 2>"$tmp/vaultd.$n.log" &
    local vp=$!
    for _ in $(seq 1 600); do grep -q "ready" "$tmp/vaultd.$n.log" 2>/dev/null && break; kill -0 "$vp" 2>/dev/null || { cat "$tmp/vaultd.$n.log" >&2; return 1; }; sleep 0.1; done
    python3 "$root/bench/vutil.py" login "$sock" u 1 1 "$tmp/login.json" || { kill "$vp"; return 1; }
    "$tmp/count_client" "$sock" "$conns" "$n" "$req" >&2 || { kill "$vp"; return 1; }
    kill -TERM "$vp"
    wait "$vp"
    awk '/^(summary|totals):/ {print $2; exit}' "$out"
    [ -n "${CALLGRIND_KEEP:-}" ] && cp "$out" "$CALLGRIND_KEEP.$n"
    true
}
i1=$(run "$n1") || exit 1
i2=$(run "$n2") || exit 1
echo "instructions: $n1 calls/conn: $i1; $n2 calls/conn: $i2"
echo "per GetToken: $(( (i2 - i1) / (conns * (n2 - n1)) ))"
