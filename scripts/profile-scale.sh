#!/usr/bin/env bash
# Where the server's CPU goes in a scale row, udpx beside nginx under the same players: runs
# `udpx bench h3 --connections N --idle 0 --interval 10 --servers udpx,nginx-h2 --clients quinn
# --rounds 1 --napi threaded` (for the viewers `--connections 100 --segment 1048576 --interval
# 1`) under `perf record -e cpu-clock -C <server CPU> -g -k
# CLOCK_REALTIME`, takes 10 s of each server's measured window (from its first sample: the
# ramp, N/500 s and at least 5, then 2 s), and prints for each its samples there by process
# and by kind of work (scripts/perf-kinds.awk, shared with scripts/profile-h3.sh).
#
#   scripts/profile-scale.sh [N, default 5000]   N players, 16 KiB every 10 s each
#   scripts/profile-scale.sh viewers              100 viewers, 1 MiB every second each
#
# Needs root (namespaces; perf on a CPU) and perf; the release binary is built first. Nothing
# else should run meanwhile. perf's own work runs on the server's CPU too: compare the two
# servers' samples with each other, not with the bench's CPU figures. OUT=DIR keeps the data
# (perf.data, the bench's table and log) there.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v perf >/dev/null || { echo "profile-scale: perf is not installed (Debian: apt-get install linux-perf)" >&2; exit 1; }
n=${1:-5000}
load=(--interval 10)
if [ "$n" = viewers ]; then n=100; load=(--segment 1048576 --interval 1); fi
case $n in '' | *[!0-9]*) echo "profile-scale: give the players as a number, e.g. 5000, or 'viewers'" >&2; exit 2 ;; esac
cargo build --release -q -p udpx-cli
udpx=${CARGO_TARGET_DIR:-target}/release/udpx
server_cpu=$(awk '/^cpu[0-9]/ {k++} END {print (k > 1) ? k - 1 : 0}' /proc/stat)
ramp=$((n / 500 > 5 ? n / 500 : 5))

out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -n "${OUT:-}" ] || trap 'rm -rf "$out"' EXIT
perf record -q -F 2000 -k CLOCK_REALTIME -e cpu-clock -C "$server_cpu" -g -o "$out/perf.data" -- \
    "$udpx" bench h3 --connections "$n" --idle 0 "${load[@]}" --servers udpx,nginx-h2 \
    --clients quinn --rounds 1 --napi threaded >"$out/bench.md" 2>"$out/bench.log"
grep -E '^\| (udpx h3|nginx h2/tcp) ' "$out/bench.md" | cut -d'|' -f2,4,8,11,12 || true

for who in udpx-quic-0 nginx; do
    first=$(perf script -i "$out/perf.data" -F comm,time 2>/dev/null | awk -v c="$who" '$1 == c { sub(":", "", $2); print $2; exit }' || true)
    [ -n "$first" ] || { echo "profile-scale: no samples of $who"; continue; }
    from=$(awk -v t="$first" -v r="$ramp" 'BEGIN { printf "%.3f", t + r + 2 }')
    to=$(awk -v t="$from" 'BEGIN { printf "%.3f", t + 10 }')
    echo
    echo "== $who's window ($from-$to): samples on CPU $server_cpu by process"
    perf report -i "$out/perf.data" --time "$from,$to" --no-children -n --sort comm -g none -q 2>/dev/null | head -5 || true
    echo "== $who's own samples there, by kind of work"
    perf report -i "$out/perf.data" --time "$from,$to" --comm "$who" --no-children --sort dso,sym -g none -q 2>/dev/null \
        | awk -f scripts/perf-kinds.awk | sort -rn
done
