#!/usr/bin/env bash
# Before and after: two `udpx` binaries (say, release builds of two commits) run the HTTP/3
# benches alternately, ROUNDS times each (default 3): the bulk table (software profile, one
# 100 MB round per run) and the scale table (PLAYERS players, default 10000, 16 KiB every
# 10 s). JSON goes to OUT (default a new temporary directory), one file per run, named
# <kind>-<a|b>-<round>.json; stderr beside it. Root: the benches use veth namespaces.
#   bash scripts/ab-h3.sh OLD/udpx NEW/udpx [OUT]
# Compare the runs with the tables' own fields (rows[].median.cpu_s_per_gb for the bulk
# table, rows[].runs[0].server_cpu_s_per_gb and server_process_s_per_gb for the scale table),
# and against nginx in the same run: the VM's own noise moves every server alike.
set -euo pipefail
a=${1:?give the first udpx binary}; b=${2:?give the second udpx binary}
out=${3:-$(mktemp -d)}
rounds=${ROUNDS:-3}; players=${PLAYERS:-10000}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for v in a b; do
    bin=$a; [ "$v" = b ] && bin=$b
    echo "== $(date +%T) bulk $v round $r"
    "$bin" bench h3 --profile software --repeat 1 --size 100M --json >"$out/bulk-$v-$r.json" 2>"$out/bulk-$v-$r.err"
    echo "== $(date +%T) scale $v round $r"
    "$bin" bench h3 --connections "$players" --idle 0 --interval 10 --ramp 10 --window 15 --rounds 1 --json \
      >"$out/scale-$v-$r.json" 2>"$out/scale-$v-$r.err"
  done
done
echo "== done $(date +%T): $out"
