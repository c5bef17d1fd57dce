#!/usr/bin/env bash
# `udpx bench h3` on two commits, interleaved, with one summary: did a change move the figures?
#
#   scripts/bench-before-after.sh BEFORE AFTER [ROUNDS] -- [udpx bench h3 flags]
#
# Builds `udpx` in release for each commit (a git worktree under the output folder, the build
# in $CARGO_TARGET_DIR-before / -after, or target-before / target-after), then runs the bench
# ROUNDS times per commit (default 5), alternating which goes first in each round, one JSON per
# run, and prints per row the median CPU-s/GB of each commit over its runs not stolen (the
# bench's own mark: over 2 % steal) and the median of the after/before ratio. For the bulk
# table it also gives each row over nginx's curl row of the same run (a run's machine state
# cancels); for the scale table (--connections) the udpx / nginx ratio per run and the segment
# p50 and p99. Nothing is judged: read the spread. OUT=DIR keeps the runs there. Needs what
# `udpx bench h3` needs (root for veth, scripts/setup.sh's peers) and python3; nothing else
# should run meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: scripts/bench-before-after.sh BEFORE AFTER [ROUNDS] -- [udpx bench h3 flags]" >&2; exit 2; }
before=$1 after=$2
shift 2
rounds=5
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
[ "${1:-}" = "--" ] && shift
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
base=${CARGO_TARGET_DIR:-$PWD/target}

for side in before after; do
  rev=${!side}
  git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "bench-before-after: $rev is not a commit" >&2; exit 2; }
  tree="$out/tree-$side"
  [ -d "$tree" ] || git worktree add -q --detach "$tree" "$rev"
  echo "== building $side ($(git rev-parse --short "$rev"))" >&2
  (cd "$tree" && CARGO_TARGET_DIR="$base-$side" cargo build --release -q -p udpx-cli)
  cp "$base-$side/release/udpx" "$out/udpx-$side"
  git worktree remove --force "$tree"
done

for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for side in $order; do
    echo "== round $r/$rounds: $side" >&2
    "$out/udpx-$side" bench h3 "$@" --json >"$out/$side-$r.json" 2>"$out/$side-$r.err" \
      || { echo "bench-before-after: the $side run failed, see $out/$side-$r.err" >&2; exit 1; }
  done
done

python3 - "$out" <<'EOF'
import collections, glob, json, statistics, sys
out = sys.argv[1]
cpu = collections.defaultdict(lambda: collections.defaultdict(list))
rel = collections.defaultdict(lambda: collections.defaultdict(list))
lat = collections.defaultdict(lambda: collections.defaultdict(list))
stolen = total = 0
for f in sorted(glob.glob(out + "/*-*.json")):
    side = f.rsplit("/", 1)[1].split("-")[0]
    j = json.load(open(f))
    if "h3_scale" in j:
        clean = collections.defaultdict(list)
        for r in j["h3_scale"]["rows"]:
            for run in r.get("runs", []):
                total += 1
                if run.get("stolen") or run.get("client_limited"):
                    stolen += bool(run.get("stolen"))
                    continue
                name = "%s / %s at %s" % (r["server"], r["client"], r["connections"])
                cpu[name][side].append(run["server_cpu_s_per_gb"])
                l = run["load"]["latency"]
                lat[name][side].append((l["p50_ms"], l["p99_ms"]))
                clean[r["server"]].append(run["server_cpu_s_per_gb"])
        if clean.get("Udpx") and clean.get("NginxH2"):
            rel["udpx / nginx h2, this run"][side].append(statistics.median(clean["Udpx"]) / statistics.median(clean["NginxH2"]))
    for t in j.get("h3_bench", []):
        rows = {r["server"] + " / " + r["client"]: r for r in t["rows"]}
        base = rows.get("nginx https/tcp / curl")
        base_run = base["runs"][0] if base and base["runs"] else None
        for name, r in rows.items():
            for i, run in enumerate(r["runs"]):
                total += 1
                if run.get("stolen"):
                    stolen += 1
                    continue
                cpu[name][side].append(run["cpu_s_per_gb"])
                if i == 0 and base_run and not base_run.get("stolen"):
                    rel[name + " over nginx / curl, this run"][side].append(run["cpu_s_per_gb"] / base_run["cpu_s_per_gb"])
fm = lambda x: "%.3f [%.3f-%.3f] n=%d" % (statistics.median(x), min(x), max(x), len(x)) if x else "-"
print("runs stolen and left out: %d of %d" % (stolen, total))
print("%-62s %-28s %-28s %s" % ("CPU-s/GB", "before", "after", "after/before"))
for name, d in cpu.items():
    b, a = d.get("before", []), d.get("after", [])
    q = "%.3f" % (statistics.median(a) / statistics.median(b)) if a and b else "-"
    print("%-62s %-28s %-28s %s" % (name, fm(b), fm(a), q))
for name, d in rel.items():
    print("%-62s %-28s %-28s" % (name, fm(d.get("before", [])), fm(d.get("after", []))))
for name, d in lat.items():
    for i, what in ((0, "p50"), (1, "p99")):
        print("%-62s %-28s %-28s" % (name + " segment " + what + " ms", fm([x[i] for x in d.get("before", [])]), fm([x[i] for x in d.get("after", [])])))
EOF
echo "runs kept in $out" >&2
