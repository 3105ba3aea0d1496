#!/usr/bin/env bash
# Where vaultd's start-up goes with a large SQLite store (issue 16): runs a
# release vaultd under callgrind on DATABASE (sealed under the credential in
# CREDENTIALS_DIR, e.g. one bench/storescale.py seeded) until it says
# `ready`, stops it, and prints the instructions and the functions that
# cost most (inclusive, then self). User space only; every thread counted.
#   bench/callgrind_startup.sh VAULTD CONFIG DATABASE CREDENTIALS_DIR [OUT]
set -uo pipefail
vaultd=$1 conf=$2 db=$3 cred=$4
tmp=$(mktemp -d /tmp/vaultd-cgstart.XXXXXX)
chmod 700 "$tmp"
trap 'rm -rf "$tmp"' EXIT
out=${5:-$tmp/callgrind.out}
# valgrind 3.19 cannot read the toolchain's DWARF 5: a copy without debug info (symbols kept).
strip --strip-debug -o "$tmp/vaultd" "$vaultd" || exit 1
VAULTD_STORE=sqlite VAULTD_DATABASE=$db CREDENTIALS_DIRECTORY=$cred \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$tmp/vaultd" \
    --socket "$tmp/vaultd.sock" --config "$conf" 2>"$tmp/vaultd.log" &
vp=$!
for _ in $(seq 1 6000); do
    grep -q "ready" "$tmp/vaultd.log" 2>/dev/null && break
    kill -0 "$vp" 2>/dev/null || { cat "$tmp/vaultd.log" >&2; exit 1; }
    sleep 0.1
done
grep -m1 "ready" "$tmp/vaultd.log" >&2
kill -TERM "$vp"
wait "$vp"
echo "instructions, exec to stop: $(awk '/^(summary|totals):/ {print $2; exit}' "$out")"
callgrind_annotate --inclusive=yes "$out" 2>/dev/null | sed -n '1,60p' | cut -c1-200
callgrind_annotate "$out" 2>/dev/null | sed -n '1,45p' | cut -c1-200
