#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this):
#   setup (Debian packages the tests and bench need), format check, clippy with warnings as
#   errors, docs without broken links, micro benchmarks compiled, then every test of the workspace with the test-only
#   fault-injection seam enabled.
# Tests that need something this machine lacks (root, a kernel feature) print `SKIP: <why>`
# and append a line to $UDPX_SKIP_LOG; the summary counts them as skipped, not passed.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --all-features -q -- -D warnings
echo "== docs build without broken links"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q
echo "== micro benchmarks compile"
cargo bench --workspace --no-run -q 2>&1 | grep -v '^ *Executable' || true

skips=$(mktemp)
log=$(mktemp)
trap 'rm -f "$skips" "$log"' EXIT
export UDPX_SKIP_LOG="$skips"
echo "== cargo test"
set +e
# One test thread per core at most: several tests build veth pairs and flood them.
cargo test --workspace --all-features -- --test-threads=2 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

passed=$(grep -Eo '^test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
skipped=$(sort -u "$skips" | grep -c . || true)
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1 # a test binary that crashed or failed to build
fi
echo
if [ "$skipped" -gt 0 ]; then
  echo "skipped tests:"
  sort -u "$skips" | sed 's/^/  SKIP: /'
fi
echo "summary: $((passed - skipped)) passed, $failed failed, $skipped skipped"
exit "$status"
