#!/usr/bin/env bash
# Where the server's CPU goes serving Chromium, udpx beside nginx, per packet and per byte
# (issue 47: "the profile that shows the floor, per pass and per packet, against nginx's").
#
#   scripts/profile-chromium.sh [ROUNDS] [more `udpx bench h3` flags]
#
# Runs `udpx bench h3 --profile software --repeat 1 --chromium-repeat ROUNDS --cache-size 0`
# (default 5 rounds) with `perf record -e cpu-clock -a` for the whole run (on every CPU: a
# process's mappings are recorded only on the CPU that made them, and the servers start on
# the client's) and reads the server's CPU's samples,
# the clock CLOCK_MONOTONIC, and stamps each of the bench's progress lines with the same
# clock. Each row's run is the time between its progress line and the one before (its server's
# start and stop included: a few percent). For the Chromium pair and udpx's own client it
# prints, over the rounds not stolen, each kind of work's share of the samples
# (scripts/perf-kinds.awk) applied to the bench's own measure of the server's CPU over the
# download: microseconds per packet sent (udpx: datagrams, its counters; nginx: TCP segments of
# at most 1,448 body bytes, the least it can send) and CPU-ms per MB. Needs root and perf;
# nothing else should run meanwhile. OUT=DIR keeps the data there.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v perf >/dev/null || { echo "profile-chromium: perf is not installed (Debian: apt-get install linux-perf)" >&2; exit 1; }
rounds=5
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p udpx-cli
server_cpu=$(awk '/^cpu[0-9]/ {n++} END {print (n > 1) ? n - 1 : 0}' /proc/stat)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
perf_pid=
cleanup() { [ -n "$perf_pid" ] && kill -INT "$perf_pid" 2>/dev/null; [ -z "${OUT:-}" ] && rm -rf "$out"; true; }
trap cleanup EXIT

perf record -q -e cpu-clock -a -k CLOCK_MONOTONIC -o "$out/perf.data" >/dev/null 2>&1 &
perf_pid=$!
sleep 1
# Each progress line, stamped with CLOCK_MONOTONIC (perf's clock above).
"$target/release/udpx" bench h3 --profile software --repeat 1 --chromium-repeat "$rounds" --cache-size 0 --json "$@" \
    >"$out/bench.json" 2> >(python3 -u -c '
import sys, time
for line in sys.stdin:
    print("%.6f %s" % (time.clock_gettime(time.CLOCK_MONOTONIC), line.rstrip("\n")), flush=True)
' >"$out/progress.log")
kill -INT "$perf_pid"
wait "$perf_pid" 2>/dev/null || true
perf_pid=
sleep 0.5

python3 - "$out" "$server_cpu" <<'EOF'
import json, re, subprocess, sys, collections
out, cpu = sys.argv[1], sys.argv[2]
bench = json.load(open(out + "/bench.json"))["h3_bench"][0]
rows = {r["server"] + " / " + r["client"]: r for r in bench["rows"]}
# Progress lines only: "round K/N: LABEL: ..." (warnings between them are not boundaries).
lines = []
for l in open(out + "/progress.log"):
    t, _, text = l.partition(" ")
    m = re.search(r"round (\d+)/\d+: (.+?): (-?[0-9.]+ CPU-s/GB|failed)", text)
    if m:
        lines.append((float(t), int(m.group(1)) - 1, m.group(2)))
want = [k for k in rows if "chromium" in k.lower() or k in ("gso +GRO / udpx h3 get", "nginx https/tcp / curl")]
kinds = collections.defaultdict(lambda: collections.defaultdict(float))
per = collections.defaultdict(lambda: {"cpu_s": 0.0, "packets": 0.0, "bytes": 0.0, "rounds": 0, "seconds": 0.0})
prev = None
for t, rnd, label in lines:
    start, prev = prev, t
    if start is None or label not in want:
        continue
    row = rows[label]
    run = row["runs"][rnd] if rnd < len(row["runs"]) else None
    if not run or run.get("stolen"):
        continue
    rep = subprocess.run(["perf", "report", "-i", out + "/perf.data", "--cpu", cpu, "--time", "%.6f,%.6f" % (start, t),
                          "--no-children", "--sort", "dso,sym", "-g", "none", "-q"],
                         capture_output=True, text=True).stdout
    shares = subprocess.run(["awk", "-f", "scripts/perf-kinds.awk"], input=rep, capture_output=True, text=True).stdout
    if "nginx" in label:
        packets = run["bytes"] / 1448.0
    else:
        packets = (run.get("send_calls") or 0) * (run.get("packets_per_call") or 0)
    p = per[label]
    p["cpu_s"] += run["server_cpu_s"]; p["packets"] += packets; p["bytes"] += run["bytes"]; p["rounds"] += 1
    p["seconds"] += t - start
    for l in shares.splitlines():
        pct, _, kind = l.strip().partition("%")
        kinds[label][kind.strip()] += float(pct) / 100 * run["server_cpu_s"]
print("server CPU %s, rounds not stolen; us/packet and CPU-ms/MB of the server's CPU over the download," % cpu)
print("split by perf's share of each kind of work (cpu-clock samples over the row's run)\n")
for label in sorted(per, key=lambda k: ("chromium" not in k.lower(), "nginx" in k, k)):
    p = per[label]
    if not p["packets"]:
        continue
    print("== %s: %d rounds, %.0f packets of %.0f body bytes each, %.2f us/packet, %.2f CPU-ms/MB" % (
        label, p["rounds"], p["packets"] / p["rounds"], p["bytes"] / p["packets"],
        p["cpu_s"] / p["packets"] * 1e6, p["cpu_s"] / p["bytes"] * 1e9))
    for kind, s in sorted(kinds[label].items(), key=lambda x: -x[1]):
        print("  %7.3f us/packet  %6.2f ms/MB  %s" % (s / p["packets"] * 1e6, s / p["bytes"] * 1e9, kind))
EOF
