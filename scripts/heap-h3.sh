#!/usr/bin/env bash
# Where an idle HTTP/3 connection's memory goes in `udpx h3 serve`: runs the server under
# heaptrack on loopback, opens N idle connections to it with `udpx h3 load --interval 0`, and
# prints the heap at its peak per connection, grouped by the deepest frame in quiche, udpx or
# BoringSSL code that allocated it (the allocator's own frames left out).
#
#   scripts/heap-h3.sh [N (default 5000)] [more `udpx h3 serve` flags, e.g. --cc bbr2]
#
# Needs heaptrack (Debian: apt-get install heaptrack); the release binary is built first.
# The peak includes the connection table's spare capacity (it grows by doubling: with N
# connections up to N slots of the size `quiche::Connection` plus the file server's state,
# about 8.5 KiB each, are allocated but never touched, so not resident); the resident figure
# per connection is the scale bench's idle row (`udpx bench h3 --connections 100 --idle 50000`).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v heaptrack >/dev/null || { echo "heap-h3: heaptrack is not installed (Debian: apt-get install heaptrack)" >&2; exit 1; }
n=${1:-5000}
[ $# -gt 0 ] && shift
case $n in '' | *[!0-9]*) echo "heap-h3: give the number of connections first, not '$n'" >&2; exit 2 ;; esac
cargo build --release -q -p udpx-cli
udpx=$PWD/target/release/udpx

out=$(mktemp -d)
trap 'rm -rf "$out"; [ -n "${srv:-}" ] && kill "$srv" 2>/dev/null || true' EXIT
mkdir "$out/www"
head -c 16384 /dev/zero >"$out/www/segment"
port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 44331)
ramp=$(( n / 1000 + 3 ))
life=$(( ramp + 12 ))
heaptrack -o "$out/heap" "$udpx" h3 serve "$out/www" --listen "127.0.0.1:$port" --shards 1 -l "$life" "$@" \
    >"$out/serve.log" 2>&1 &
srv=$!
sleep 2
locals=()
for i in $(seq 2 129); do locals+=(--local "127.0.0.$i"); done
"$udpx" h3 load "127.0.0.1:$port" -n "$n" --interval 0 --ramp "$ramp" -l 5 "${locals[@]}" | tail -1
wait "$srv" || true
srv=
data=$(find "$out" -maxdepth 1 -name 'heap.*' -type f | head -1)
[ -n "$data" ] || { echo "heap-h3: heaptrack wrote no data; the server said:" >&2; cat "$out/serve.log" >&2; exit 1; }
heaptrack_print -f "$data" -p 0 -a 0 -T 0 -l 0 --flamegraph-cost-type peak -F "$out/stacks.txt" >/dev/null 2>&1
awk -v n="$n" '
{
    bytes = $NF; sub(/ [0-9]+$/, ""); k = split($0, f, ";"); who = "(other: the runtime, the allocator, libc)"
    for (i = k; i >= 1; i--) {
        if (f[i] ~ /(quiche|udpx|bssl|SSL_|ssl_|EVP_|evp_)/ && f[i] !~ /(alloc::|raw_vec|OPENSSL_(malloc|zalloc|calloc|realloc)|hashbrown|core::)/) {
            who = f[i]; sub(/::h[0-9a-f]+ /, " ", who); gsub(/\$LT\$/, "<", who); gsub(/\$GT\$/, ">", who)
            gsub(/\$u20\$/, " ", who); gsub(/\.\./, "::", who)
            if (who ~ /Host<A>::step/ && $0 ~ /grow/) who = who " [the connection table: slots grown by doubling]"
            break
        }
    }
    by[who] += bytes; total += bytes
}
END {
    printf "heap at its peak: %.1f KiB per connection (%d connections)\n\n", total / 1024 / n, n
    for (w in by) printf "%8.0f B  %s\n", by[w] / n, w | "sort -rn | head -30"
}' "$out/stacks.txt"
