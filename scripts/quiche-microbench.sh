#!/usr/bin/env bash
# quiche's send path, pristine against patched (third_party/quiche/PATCHES.md): builds the
# microbench (crates/udpx-quiche-bench) twice, once on quiche 0.30.0 as published (the
# .crate checked by scripts/check-quiche.sh) and once on the patched tree the workspace uses,
# then runs them in turn, ROUNDS times each (default 5), and prints each run's rows with the
# steal time of the run (from /proc/stat; a run that lost more than 2 % is marked and left out
# of the medians).
#
#   scripts/quiche-microbench.sh [PACKETS] [COLD_MIB] [ROUNDS]
#
# BASE=N compares against quiche 0.30.0 with the series' first N patches instead (BASE=9: what
# patch 0010 alone does); the table still calls that side "pristine".
#
# Run it on a machine with nothing else to do: it measures time.
set -euo pipefail
cd "$(dirname "$0")/.."
packets="${1:-200000}"
cold="${2:-256}"
rounds="${3:-5}"
target="${CARGO_TARGET_DIR:-target}"
pristine_dir="$target/quiche-pristine"
bash scripts/check-quiche.sh --pristine "$pristine_dir"
base="${BASE:-0}"
if [ "$base" -gt 0 ]; then
  for p in $(ls third_party/quiche/patches/*.patch | head -n "$base"); do
    patch -d "$pristine_dir/quiche" -p1 --forward --no-backup-if-mismatch -s < "$p"
  done
  echo "== the \"pristine\" side: quiche 0.30.0 plus the first $base patches"
fi
echo "== build: patched"
cargo build --release -q -p udpx-quiche-bench
cp "$target/release/udpx-quiche-bench" "$target/udpx-quiche-bench-patched"
echo "== build: pristine"
CARGO_TARGET_DIR="$target/pristine-build" cargo build --release -q -p udpx-quiche-bench \
  --config "patch.crates-io.quiche.path=\"$pristine_dir/quiche\""
cp "$target/pristine-build/release/udpx-quiche-bench" "$target/udpx-quiche-bench-pristine"
steal() { awk '/^cpu /{print $9+0, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for side in pristine patched; do
    read -r s0 t0 < <(steal)
    json=$("$target/udpx-quiche-bench-$side" "$packets" "$cold" | tail -1)
    read -r s1 t1 < <(steal)
    pct=$(awk -v s="$((s1 - s0))" -v t="$((t1 - t0))" 'BEGIN{printf "%.2f", t ? 100*s/t : 0}')
    echo "$side round $r steal $pct % $json" | tee -a "$out" | cut -c1-120
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, _, r, _, pct, _, js = line.split(" ", 6)
    if float(pct) > 2.0:
        print(f"left out: {side} round {r} (steal {pct} %)")
        continue
    for m in json.loads(js)["quiche_microbench"]:
        key = (str(m["source"]), m["cc"])
        rows.setdefault(key, {}).setdefault(side, []).append(m)
print("| source | cc | ns/packet pristine | patched | patched/pristine [range of rounds] | allocs/packet in send() pristine | patched | ns/ACK pristine | patched | allocs/ACK pristine | patched |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for (src, cc), sides in rows.items():
    if "pristine" not in sides or "patched" not in sides:
        continue
    med = lambda side, f: statistics.median(f(m) for m in sides[side])
    ns = lambda m: m["ns_per_packet"]
    al = lambda m: m["allocs_per_packet"] - m["stream_send_allocs_per_packet"]
    na = lambda m: m["ns_per_ack"]
    aa = lambda m: m["allocs_per_ack"]
    p, q = med("pristine", ns), med("patched", ns)
    # Each round's patched run over the pristine run before it.
    per = [ns(b) / ns(a) for a, b in zip(sides["pristine"], sides["patched"])]
    print(f"| {src} | {cc} | {p:.0f} | {q:.0f} | {q/p:.3f} [{min(per):.3f}-{max(per):.3f}] | {med('pristine', al):.3f} | {med('patched', al):.3f} "
          f"| {med('pristine', na):.0f} | {med('patched', na):.0f} | {med('pristine', aa):.3f} | {med('patched', aa):.3f} |")
PY
