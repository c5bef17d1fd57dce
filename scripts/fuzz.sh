#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (FUZZ_SECS each, default 20) on the nightly
# toolchain, starting from the seeds in fuzz/seeds/<target>/ (new inputs go to a scratch
# corpus, not the repository). A crash fails the run; libFuzzer saves the reproducer in
# fuzz/artifacts/<target>/, and the line says how to replay it. Ends with
# `fuzz: N passed, N failed` (or N skipped without cargo-fuzz or a nightly toolchain).
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${FUZZ_SECS:-20}"
targets=(cmsg_decode zerocopy_tracker gro_split gso_plan echo_request cid_steering netlink_qdisc stream_wire)
if ! cargo fuzz --version >/dev/null 2>&1 || ! rustup run nightly rustc --version >/dev/null 2>&1; then
  for t in "${targets[@]}"; do echo "SKIP: fuzz $t: cargo-fuzz or the nightly toolchain is missing (scripts/setup.sh installs cargo-fuzz)"; done
  echo "fuzz: 0 passed, 0 failed, ${#targets[@]} skipped"
  exit 0
fi
echo "== fuzz targets build"
if ! cargo +nightly fuzz build -O >/dev/null 2>build.log; then
  tail -30 build.log
  echo "fuzz: 0 passed, ${#targets[@]} failed"
  exit 1
fi
rm -f build.log
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# One target per core at a time (libFuzzer runs one process, one thread): on 2 cores the 8
# targets take 4 x FUZZ_SECS rather than 8 x. Each writes its own log; the lines below come in
# the targets' order.
par=$(nproc 2>/dev/null || echo 1)
run_one() {
  local t=$1 out="$scratch/$1.log"
  # A target whose seeds folder is missing (git keeps no empty folder) still runs.
  mkdir -p "$scratch/$t" "artifacts/$t" "seeds/$t"
  cargo +nightly fuzz run -O "$t" "$scratch/$t" "seeds/$t" -- -max_total_time="$secs" -print_final_stats=1 >"$out" 2>&1
  echo $? >"$scratch/$t.status"
}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$par" ]; do wait -n || true; done
  run_one "$t" &
done
wait
passed=0 failed=0
for t in "${targets[@]}"; do
  out="$scratch/$t.log"
  if [ "$(cat "$scratch/$t.status" 2>/dev/null)" = 0 ]; then
    runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$out" | grep -Eo '[0-9]+$')
    echo "fuzz $t: ok (${runs:-?} inputs in ${secs} s)"
    passed=$((passed + 1))
  else
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$out" | head -8 | sed 's/^/  /'
    grep -qE 'panicked|ERROR|SUMMARY' "$out" || tail -5 "$out" | sed 's/^/  /'
    echo "fuzz $t: FAILED; replay: (cd fuzz && cargo +nightly fuzz run $t artifacts/$t/<file>)"
    failed=$((failed + 1))
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
