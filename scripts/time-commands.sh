#!/usr/bin/env bash
# Times the README's two commands by phase, as a new user runs them, and prints a table:
#   bash scripts/time-commands.sh            # the first command, then the second
#   bash scripts/time-commands.sh first      # only `setup.sh bench && cargo run --release -p udpx-cli --no-default-features -- bench`
#   bash scripts/time-commands.sh second     # only `scripts/test.sh`
#   bash scripts/time-commands.sh --log F    # the table of a log this script wrote before
# Every line the commands print is stamped with the time since the command began; a phase
# starts at a marker line (setup's `== setup: ...`, cargo's `Finished` and `Running`, the test
# script's `== ...` steps) and ends where the next begins. On a fresh machine (nothing
# installed, no target/) this is the issue's measurement (issue 49: the first command under 10
# minutes, the second under 20); on a used one it shows what is left when caches are warm.
# The logs stay in $OUT (default /tmp/udpx-time-<time>) for a second look.
set -euo pipefail
cd "$(dirname "$0")/.."

# The phase table of a stamped log: lines "SECONDS<TAB>TEXT"; the markers below name phases.
table() {
  awk -F '\t' '
    function mark(name) { if (cur != "") { dur[cur] += $1 - start } if (!(name in dur)) { order[++n] = name; dur[name] = 0 } cur = name; start = $1 }
    /^[0-9.]+\tcommand: / { first = ($2 ~ /cargo run/); t = $2; sub(/^command: /, "", t); mark("[" t "]"); next }
    /^[0-9.]+\t== setup: done$/ { if (first) mark("release build"); next }
    /^[0-9.]+\t== setup: / { t = $2; sub(/^== /, "", t); mark(t); next }
    /^[0-9.]+\t *Finished `release` profile/ && first { mark("udpx bench (the run)"); next }
    /^[0-9.]+\t== cargo test$/ { mark("tests: cargo test (build)"); next }
    /^[0-9.]+\t *Running / && cur == "tests: cargo test (build)" { mark("tests: cargo test (run)"); next }
    /^[0-9.]+\t== / && !first { t = $2; sub(/^== /, "", t); mark("tests: " t); next }
    { last = $1 }
    END {
      if (cur != "" && last > start) dur[cur] += last - start
      total = 0
      printf "| phase | seconds |\n| --- | ---: |\n"
      for (i = 1; i <= n; i++) { printf "| %s | %.0f |\n", order[i], dur[order[i]]; total += dur[order[i]] }
      printf "| **all** | **%.0f** (%.1f min) |\n", total, total / 60
    }' "$1"
}

# Runs a command with every output line stamped (seconds since it began) into $1, which it
# starts afresh (an $OUT used before would otherwise add the old run's phases to this one's).
stamped() {
  local log=$1; shift
  local t0=${EPOCHREALTIME/./} us
  printf '0.000\tcommand: %s\n' "$*" >"$log"
  set +e
  "$@" 2>&1 | while IFS= read -r line; do
    printf '%s\n' "$line"
    us=$(( ${EPOCHREALTIME/./} - t0 ))
    printf '%d.%06d\t%s\n' $((us / 1000000)) $((us % 1000000)) "$line" >>"$log"
  done
  local status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

if [ "${1:-}" = "--log" ]; then
  table "${2:?--log FILE}"
  exit 0
fi
which=${1:-both}
case $which in both|first|second) ;; *) echo "time-commands: give first, second, both or --log FILE" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/udpx-time-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
status=0
if [ "$which" != second ]; then
  stamped "$OUT/first.log" bash -c 'bash scripts/setup.sh bench && cargo run --release -p udpx-cli --no-default-features -- bench' || status=$?
fi
if [ "$which" != first ]; then
  stamped "$OUT/second.log" bash scripts/test.sh || status=$?
fi
echo
for f in "$OUT"/first.log "$OUT"/second.log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .log) command ($f)"
  table "$f"
done
exit "$status"
