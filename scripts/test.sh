#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this):
#   setup (Debian packages the tests and bench need), the quiche patch series checked, format
#   check, clippy with warnings as errors, docs without broken links, micro benchmarks compiled,
#   quiche's own tests on the patched tree, then every test of the
#   workspace with the test-only fault-injection seam enabled (the send-path suites a second
#   time through the io_uring backend), a check that the tests left no
#   process running, and every fuzz target for FUZZ_SECS seconds (default 20; scripts/fuzz.sh).
# Tests that need something this machine lacks (root, a kernel feature) print `SKIP: <why>`
# and append a line to $UDPX_SKIP_LOG; the summary counts them as skipped, not passed.
set -euo pipefail
cd "$(dirname "$0")/.."
# A step that stops the script early (setup, fmt, clippy, docs, benches) still ends it with the
# one summary line a reader or CI looks for.
trap 'echo "summary: 0 passed, 1 failed, 0 skipped"' ERR

bash scripts/setup.sh
# One build, on a machine that starts empty: incremental caches would only take disk (they
# grew to several GB beside the test binaries, and a cold build ran out of CI's disk).
export CARGO_INCREMENTAL=0
# The tests of the benches check what their rows carry, never their figures: a round that
# makes up a stolen run (udpx_lab::stats::another_round) would only double their time on a
# machine a neighbour steals from.
export UDPX_BENCH_EXTRA_ROUNDS=0
# Disk, said at the start and the end: a build that outgrows the disk fails in the linker with
# a bus error, far from the cause (CI, 2026-11-29).
build_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
disk_free() { df -Pm "$(dirname "$build_dir")" 2>/dev/null | awk 'NR == 2 { print $4 }'; }
echo "disk: $(disk_free || echo '?') MB free beside $build_dir"
echo "== quiche: the published crate plus its numbered patches, nothing else"
bash scripts/check-quiche.sh
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --all-features -q -- -D warnings
# The README's first command builds the binary without the QUIC tools: it must build clean too.
cargo clippy -p udpx-cli --no-default-features -q -- -D warnings
echo "== docs build without broken links"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q
echo "== micro benchmarks compile"
# In the test profile: the bench targets' code is compiled (and so checked) with the artifacts
# the tests build anyway. `cargo bench --no-run` built the whole workspace a second time in
# release, BoringSSL included: about a third of the command's time on a fresh machine.
# Its messages as JSON: they name the directory boring-sys built BoringSSL in, which quiche's
# own tests below link rather than build it again.
bench_json=$(mktemp)
bench_out=$(cargo test --workspace --all-features --benches --no-run -q --message-format=json-render-diagnostics 2>&1 >"$bench_json") \
  || { echo "$bench_out"; rm -f "$bench_json"; false; }
[ -z "$bench_out" ] || echo "$bench_out"
boringssl=$(grep '"reason":"build-script-executed"' "$bench_json" | grep '#boring-sys@' | grep -o '"out_dir":"[^"]*"' | cut -d'"' -f4 | head -1 || true)
rm -f "$bench_json"
echo "== quiche's own tests on the patched tree (third_party/quiche)"
bash scripts/check-quiche.sh --tests ${boringssl:+--boringssl "$boringssl"}
# From here on every failure is counted into the summary below.
trap - ERR

skips=$(mktemp)
log=$(mktemp)
trap 'rm -f "$skips" "$log"' EXIT
export UDPX_SKIP_LOG="$skips"
echo "== cargo test"
# Every process the tests start inherits this marker in its environment (whatever its process
# group or session), so any still alive afterwards was started by this run and left behind.
run_id="$$-$(date +%s%N)"
left_behind() {
  grep -lsxz "UDPX_TEST_RUN=$run_id" /proc/[0-9]*/environ | cut -d/ -f3 | paste -sd, -
}
set +e
# Two test binaries at a time (scripts/test-lanes.sh: the tests mostly wait), each with two
# test threads; the tests that flood a veth pair run alone below. tee reads
# from a process substitution, not a pipeline, so a left-behind process still holding the
# output open cannot keep the script waiting: it is found and killed first. (The braces make
# the shell itself start tee, so that $! names it.)
{
  # --no-fail-fast: one failing test binary must not hide the others' results.
  UDPX_TEST_RUN="$run_id" bash scripts/test-lanes.sh --workspace --all-features --no-fail-fast -- --test-threads=2
  main_status=$?
  # Tests that flood a veth pair and must have both cores to themselves: their own step, one
  # at a time (they are #[ignore]d in the run above).
  echo "== tests that run alone"
  # --workspace, not -p: features are then unified as in the run above, so the artifacts it
  # built serve here (with -p udpx cargo resolved udpx's features alone and built it again).
  UDPX_TEST_RUN="$run_id" cargo test --workspace --all-features --test veth_alone --test veth -- --ignored --test-threads=1
  alone_status=$?
  # udpx stream's exact delivery to 1,000 flows over veth (it lost 9 of 60,000 datagrams once
  # beside other tests in the main run).
  UDPX_TEST_RUN="$run_id" cargo test --workspace --all-features --test stream -- --ignored --test-threads=1 \
    || alone_status=1
  # The send-path suites again, every socket sending through io_uring (the same tests: the
  # backend must keep every guarantee of the system-call path; zerocopy as SENDMSG_ZC).
  echo "== fault and loopback tests through io_uring"
  if [ "$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)" = "0" ]; then
    # udpx-h3 has a loopback suite of its own: excluded, so only udpx's runs again.
    UDPX_TEST_IO_URING=1 UDPX_TEST_RUN="$run_id" cargo test --workspace --exclude udpx-h3 --all-features --test faults --test loopback --test zerocopy -- --test-threads=2
    uring_status=$?
  else
    echo "SKIP: fault and loopback tests through io_uring: kernel.io_uring_disabled is not 0"
    echo "io_uring pass: kernel.io_uring_disabled is not 0" >> "$UDPX_SKIP_LOG"
    uring_status=0
  fi
  [ "$main_status" -eq 0 ] && [ "$alone_status" -eq 0 ] && [ "$uring_status" -eq 0 ]
} > >(tee "$log") 2>&1
status=$?
test_status=$status
tee_pid=$!
set -e
left=$(left_behind || true)
if [ -n "$left" ]; then
  ps -o pid=,args= -p "$left" | sed 's/^/  left running: /' || true
  kill -KILL ${left//,/ } 2>/dev/null || true
fi
wait "$tee_pid" 2>/dev/null || true
if [ -n "$left" ]; then
  echo "FAIL: the tests left the processes above running (killed now); a test must end what it starts"
  status=1
  left_failure=1
else
  left_failure=0
fi

echo "== fuzz targets, ${FUZZ_SECS:-20} s each"
fuzz_log=$(mktemp)
set +e
bash scripts/fuzz.sh 2>&1 | tee "$fuzz_log"
fuzz_status=${PIPESTATUS[0]}
set -e
fuzz_line=$(grep -E '^fuzz: [0-9]+ passed' "$fuzz_log" | tail -1 || true)
grep -E '^SKIP: fuzz' "$fuzz_log" | sed 's/^SKIP: //' >>"$skips" || true
rm -f "$fuzz_log"
fuzz_passed=$(echo "$fuzz_line" | grep -Eo '[0-9]+ passed' | grep -Eo '[0-9]+' || echo 0)
fuzz_failed=$(echo "$fuzz_line" | grep -Eo '[0-9]+ failed' | grep -Eo '[0-9]+' || echo 0)
if [ "$fuzz_status" -ne 0 ]; then
  status=1
  [ "$fuzz_failed" -gt 0 ] || fuzz_failed=1
fi

passed=$( (grep -Eo '^test result: [A-Za-z]+\. [0-9]+ passed' "$log" || true) | awk '{s+=$4} END {print s+0}')
failed=$( (grep -Eo '[0-9]+ failed;' "$log" || true) | awk '{s+=$1} END {print s+0}')
skipped=$(sort -u "$skips" | grep -c . || true)
# Skipped tests ran (and "passed") under cargo; skipped fuzz targets did not run at all.
skipped_tests=$(sort -u "$skips" | grep -vc '^fuzz ' || true)
if [ "$test_status" -ne 0 ] && [ "$failed" -eq 0 ] && [ -z "$left" ]; then
  failed=1 # a test binary that crashed or failed to build
fi
echo
if [ "$skipped" -gt 0 ]; then
  echo "skipped tests:"
  sort -u "$skips" | sed 's/^/  SKIP: /'
fi
# Each failed test's panic, at the end where a reader (or CI's excerpt of the output) sees it:
# the test's name, where it panicked and the message's first 400 characters.
if grep -q '^---- .* stdout ----$' "$log"; then
  echo "failed tests, where and why:"
  awk '/^---- .* stdout ----$/ { name = $2; want = 0; next }
       name != "" && /panicked at / { at = $0; sub(/.*panicked at /, "", at); msg = ""; want = 3; next }
       want > 0 && (/^stack backtrace:/ || /^note: / || /^$/) { want = 0 }
       want > 0 { msg = msg (msg == "" ? "" : " | ") $0; want--; if (want > 0) next }
       want == 0 && name != "" && msg != "" { printf "  %s at %s %s\n", name, at, substr(msg, 1, 400); name = ""; msg = "" }' "$log"
fi
echo "disk: $build_dir holds $(du -sm "$build_dir" 2>/dev/null | cut -f1 || echo '?') MB; $(disk_free || echo '?') MB free"
left_n=$(echo "$left" | tr , '\n' | grep -c . || true)
echo "processes left running by the tests: $left_n"
echo "summary: $((passed + fuzz_passed - skipped_tests)) passed, $((failed + fuzz_failed + left_failure)) failed, $skipped skipped"
exit "$status"
