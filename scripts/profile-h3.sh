#!/usr/bin/env bash
# Where the server's CPU goes in `udpx bench h3` on equal footing, udpx beside nginx: runs the
# bench (software profile, one round, a 2 GB file so a row lasts seconds) and records
# `perf record -e cpu-clock -C <server CPU> -g` for 2.5 s inside the `gso +GRO / udpx h3 get`
# row and 1.2 s inside the nginx row (started from the bench's progress lines), then prints
# each profile's samples by process and by kind of work (the patterns are below).
#
#   scripts/profile-h3.sh [--size 2G] [more `udpx bench h3` flags, e.g. --defer-flush off]
#
# Needs root (namespaces; perf on a CPU) and perf; the release binary is built first. Nothing
# else should run meanwhile. The windows are timed from progress lines: on a much faster or
# slower machine a window can miss its row (the process table then says so).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v perf >/dev/null || { echo "profile-h3: perf is not installed (Debian: apt-get install linux-perf)" >&2; exit 1; }
size=2G
if [ "${1:-}" = --size ]; then size=$2; shift 2; fi
cargo build --release -q -p udpx-cli
server_cpu=$(awk '/^cpu[0-9]/ {n++} END {print (n > 1) ? n - 1 : 0}' /proc/stat)

out=$(mktemp -d)
trap 'rm -rf "$out"; [ -n "${bench:-}" ] && kill "$bench" 2>/dev/null || true' EXIT
./target/release/udpx bench h3 --size "$size" --repeat 1 --profile software "$@" >"$out/bench.md" 2>"$out/bench.log" &
bench=$!
u=0 n=0
while kill -0 "$bench" 2>/dev/null; do
    if [ $u = 0 ] && grep -q "gso-mmsg / udpx h3 get" "$out/bench.log"; then
        sleep 1.5
        perf record -q -e cpu-clock -C "$server_cpu" -g -o "$out/udpx.data" -- sleep 2.5 >/dev/null 2>&1
        u=1
    fi
    if [ $n = 0 ] && grep -q "quinn h3 / udpx h3 get" "$out/bench.log"; then
        sleep 0.8
        perf record -q -e cpu-clock -C "$server_cpu" -g -o "$out/nginx.data" -- sleep 1.2 >/dev/null 2>&1
        n=1
    fi
    sleep 0.05
done
bench=
grep -E '^(gso \+GRO +udpx h3 get|nginx https/tcp)' "$out/bench.md" || true

for who in udpx nginx; do
    [ -f "$out/$who.data" ] || { echo "profile-h3: no $who profile (its row was missed)"; continue; }
    echo
    echo "== $who row: samples on CPU $server_cpu by process"
    perf report -i "$out/$who.data" --no-children --sort comm -g none -q 2>/dev/null | head -4
    echo "== $who row: by kind of work"
    perf report -i "$out/$who.data" --no-children --sort dso,sym -g none -q 2>/dev/null | awk -f scripts/perf-kinds.awk | sort -rn
done
