#!/usr/bin/env bash
# Runs a workspace's test binaries LANES at a time (default 2), as `cargo test` would run them
# one after another:
#
#   scripts/test-lanes.sh [cargo test options] -- [test binary options]
#
# e.g. `scripts/test-lanes.sh --workspace --all-features -- --test-threads=2`. It builds them with
# `cargo test --no-run` (the same options, so the same artifacts), runs each in its package's
# folder as cargo does, longest first by the last run's times ($CARGO_TARGET_DIR/test-lanes.times;
# a binary never timed goes first, in cargo's order), and prints each binary's output whole
# when it ends, behind the line cargo prints (`Running <target> (<path>)`), so the lines a
# reader or test.sh's summary looks for read as under `cargo test`. The doc tests run after, by
# `cargo test --doc`. Exits 1 if any binary failed or crashed, 101 if the build failed.
#
# Why: the tests spend most of their time waiting (timeouts, pauses, peers' round trips; the
# CPUs were 30 % busy over their 570 s on a 2-core VM), and the longest binaries (a minute's
# pause, the CLI's bench rows) set the pace of a run that takes them one by one.
set -uo pipefail
cd "$(dirname "$0")/.."

cargo_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cargo_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
bin_args=("$@")
lanes=${LANES:-2}
build_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
times="$build_dir/test-lanes.times"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One line per test binary: package folder, label (as cargo prints it), executable.
cargo test "${cargo_args[@]}" --no-run --message-format=json-render-diagnostics >"$work/build.json" || exit 101
# Test harnesses only: the profile says `"test":true` (a binary target's own executable, which
# the integration tests run, says false).
grep '"executable":"/' "$work/build.json" | grep '"profile":{[^}]*"test":true}' | while IFS= read -r line; do
  manifest=$(grep -o '"manifest_path":"[^"]*"' <<<"$line" | cut -d'"' -f4)
  src=$(grep -o '"src_path":"[^"]*"' <<<"$line" | cut -d'"' -f4)
  kind=$(grep -o '"kind":\["[^"]*"' <<<"$line" | cut -d'"' -f4)
  exe=$(grep -o '"executable":"[^"]*"' <<<"$line" | cut -d'"' -f4)
  dir=$(dirname "$manifest")
  rel=${src#"$dir"/}
  case $kind in lib | bin) label="unittests $rel" ;; *) label=$rel ;; esac
  printf '%s\t%s\t%s\n' "$dir" "$label" "$exe"
done >"$work/list"

# Longest first by the last run's seconds (keyed by package folder and label: a rebuilt binary
# keeps its key); a binary never timed goes first.
key() { printf '%s %s' "$(basename "$1")" "$2"; }
n=0
while IFS=$'\t' read -r dir label exe; do
  n=$((n + 1))
  secs=$(awk -F'\t' -v k="$(key "$dir" "$label")" '$1 == k { s = $2 } END { print (s == "") ? 1e9 : s }' "$times" 2>/dev/null || echo 1e9)
  printf '%s\t%05d\t%s\t%s\t%s\n' "$secs" "$n" "$dir" "$label" "$exe"
done <"$work/list" | sort -t$'\t' -k1,1gr -k2,2n >"$work/order"

run_one() {
  local i=$1 dir=$2 label=$3 exe=$4 start end status
  start=$(date +%s.%N)
  (cd "$dir" && "$exe" "${bin_args[@]}") </dev/null >"$work/$i.out" 2>&1
  status=$?
  end=$(date +%s.%N)
  echo "$status" >"$work/$i.rc"
  printf '%s\t%s\n' "$(key "$dir" "$label")" "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')" >"$work/$i.time"
  # One binary's output at a time, whole.
  {
    flock 9
    printf '     Running %s (%s)\n' "$label" "$exe"
    cat "$work/$i.out"
    [ "$status" -eq 0 ] || echo "error: test failed: $label exited with status $status"
  } 9>"$work/lock"
}

# The line that ends the build (scripts/time-commands.sh starts the tests' run at a `Running`).
echo "     Running $(wc -l <"$work/order") test binaries, $lanes at a time (scripts/test-lanes.sh)"
started=$(date +%s.%N)
i=0
while IFS=$'\t' read -r _ _ dir label exe; do
  while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do wait -n || true; done
  i=$((i + 1))
  run_one "$i" "$dir" "$label" "$exe" &
done <"$work/order"
wait

status=0
for f in "$work"/*.rc; do
  [ "$(cat "$f")" = 0 ] || status=1
done
[ "$(find "$work" -name '*.rc' | wc -l)" -eq "$i" ] || status=1
cat "$work"/*.time >"$times.new" 2>/dev/null && mv "$times.new" "$times"
awk -F'\t' -v n="$i" -v a="$started" -v b="$(date +%s.%N)" -v l="$lanes" \
  '{ s += $2 } END { printf "test-lanes: %d test binaries in %.0f s, %d at a time (their own times add up to %.0f s)\n", n, b - a, l, s }' "$times"

echo "   Doc-tests (cargo test --doc)"
cargo test "${cargo_args[@]}" --doc || status=1
exit "$status"
