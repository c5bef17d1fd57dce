#!/usr/bin/env bash
# Checks that third_party/quiche/quiche is exactly quiche as published (the .crate whose SHA-256
# third_party/quiche/PRISTINE gives) plus the patches in third_party/quiche/patches, applied in
# their numbered order: nothing else changed, nothing left out. The test command runs it.
#
#   scripts/check-quiche.sh                    # check; exit 1 with the differing files if not
#   scripts/check-quiche.sh --pristine DIR     # also leave the unpatched source in DIR/quiche
#                                              # (for scripts/quiche-microbench.sh)
#   scripts/check-quiche.sh --write            # make the tree anew from the crate and the
#                                              # patches (after adding or changing a patch)
#   scripts/check-quiche.sh --tests            # check, then run quiche's own unit tests on
#                                              # the patched tree (a copy: no target/ in it)
#   scripts/check-quiche.sh --tests --boringssl OUT
#                                              # the same, linked with the BoringSSL the
#                                              # workspace built: OUT is its boring-sys build
#                                              # script's OUT_DIR (scripts/test.sh passes it)
#
# The .crate comes from cargo's cache when it is there, else from crates.io; either way its
# checksum is checked before anything is read from it.
set -euo pipefail
cd "$(dirname "$0")/.."
here=third_party/quiche
keep=""
write=""
tests=""
boringssl=""
if [ "${1:-}" = "--tests" ]; then
  tests=1
  if [ "${2:-}" = "--boringssl" ]; then
    boringssl="${3:?--boringssl needs the directory boring-sys built BoringSSL in}"
  fi
elif [ "${1:-}" = "--pristine" ]; then
  keep="${2:?--pristine needs a directory}"
elif [ "${1:-}" = "--write" ]; then
  write=1
elif [ -n "${1:-}" ]; then
  echo "check-quiche: unknown argument $1 (say --pristine DIR, --write, --tests [--boringssl OUT], or nothing)" >&2
  exit 2
fi
# shellcheck disable=SC1091
. <(grep -E '^(name|version|sha256|url)=' "$here/PRISTINE")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
crate="$work/$name-$version.crate"
cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -1 || true)
if [ -n "$cached" ]; then
  cp "$cached" "$crate"
else
  curl -fsSL --retry 3 -o "$crate" "$url"
fi
got=$(sha256sum "$crate" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
  echo "check-quiche: $name-$version.crate has SHA-256 $got, not $sha256 (PRISTINE): not the published crate" >&2
  exit 1
fi
tar xzf "$crate" -C "$work"
src="$work/$name-$version"
if [ -n "$keep" ]; then
  rm -rf "$keep/quiche"
  mkdir -p "$keep"
  cp -a "$src" "$keep/quiche"
fi
n=0
for p in "$here"/patches/[0-9][0-9][0-9][0-9]-*.patch; do
  [ -e "$p" ] || continue
  if ! patch -d "$src" -p1 --forward --no-backup-if-mismatch -s < "$p"; then
    echo "check-quiche: $(basename "$p") does not apply to $name $version plus the patches before it" >&2
    exit 1
  fi
  n=$((n + 1))
done
if [ -n "$write" ]; then
  rm -rf "$here/quiche"
  cp -a "$src" "$here/quiche"
  echo "check-quiche: wrote $here/quiche: $name $version plus $n patches"
  exit 0
fi
if ! diff -r -q "$src" "$here/quiche" > "$work/diff"; then
  sed 's/^/  /' "$work/diff" >&2
  echo "check-quiche: $here/quiche is not $name $version plus its $n patches (the files above differ)" >&2
  exit 1
fi
echo "check-quiche: $here/quiche is $name $version (sha256 ${sha256:0:12}...) plus $n patches"
if [ -n "$tests" ]; then
  # quiche's own lock file (--locked: the versions its tests were published with), in a
  # target directory of their own beside the workspace's.
  # The copy stays at one path: the test binary keeps the path it was built at (quiche's
  # tests find their certificates through it), and cargo does not rebuild for a new one.
  target="$(realpath -m "${CARGO_TARGET_DIR:-target}")/quiche-tests"
  mkdir -p "$target"
  rm -rf "$target/tree"
  cp -a "$here/quiche" "$target/tree"
  # The copy is a package of its own: without this, a target directory inside the checkout
  # (CI's default ./target) puts it under the workspace's root, and cargo refuses to build it.
  printf '\n[workspace]\n' >> "$target/tree/Cargo.toml"
  # BoringSSL's cmake build is the longest step of a cold test command (about 270 s here):
  # with --boringssl the tests link the one the workspace built (boring-sys then only makes
  # its bindings). Only when the workspace's lock holds the boring-sys quiche's tests were
  # published with: their expectations are byte-exact (two BBRv2 tests count the handshake's
  # bytes, which differ by 6 between boring-sys 5.2.0 and 5.4.0).
  bssl_env=()
  if [ -n "$boringssl" ]; then
    lock_version() { awk -v n=boring-sys '$0 == "name = \"" n "\"" { getline; gsub(/version = |"/, ""); print; exit }' "$1"; }
    ours=$(lock_version Cargo.lock)
    theirs=$(lock_version "$here/quiche/Cargo.lock")
    if [ "$ours" != "$theirs" ]; then
      echo "check-quiche: the workspace's Cargo.lock has boring-sys $ours, quiche's tests were published with $theirs: BoringSSL is built again for them (cargo update -p boring-sys --precise $theirs shares it)"
    elif [ ! -f "$boringssl/build/libcrypto.a" ] || [ ! -f "$boringssl/boringssl/include/openssl/ssl.h" ]; then
      echo "check-quiche: no BoringSSL build in $boringssl (build/libcrypto.a, boringssl/include): it is built again" >&2
    else
      bssl_env=(BORING_BSSL_PATH="$boringssl/build" BORING_BSSL_INCLUDE_PATH="$boringssl/boringssl/include")
      echo "check-quiche: linked with the workspace's BoringSSL (boring-sys $ours, $boringssl)"
    fi
  fi
  (cd "$target/tree" && env "${bssl_env[@]}" CARGO_TARGET_DIR="$target" cargo test --locked --lib -q 2>&1) | tee "$work/tests.log" | grep -E '^test result|FAILED|panicked' || true
  if ! grep -q '^test result: ok' "$work/tests.log" || grep -q '^test result: FAILED' "$work/tests.log"; then
    tail -n 30 "$work/tests.log" | sed 's/^/  /' >&2
    echo "check-quiche: quiche's own tests fail on the patched tree (the log's end is above)" >&2
    exit 1
  fi
  echo "check-quiche: quiche's own tests pass on $name $version plus $n patches"
fi
