#!/usr/bin/env bash
# Installs what udpx needs that a fresh machine may lack. Idempotent; safe to run twice.
#   - ethtool: the bench and tests switch veth offloads (tx-udp-segmentation, GRO forwarding)
#   - iproute2: `ip netns` and veth pairs for the namespace tests and the bench path
#   - nftables: `udpx lb nft` rules are checked with `nft -c` and the lb lab's balancer runs them
#   - iperf3, sockperf: independent peers the bench compares against
#   - libclang-dev: bindgen in boring-sys (BoringSSL under quiche, crates/udpx-quic) needs it;
#     without it the build fails after about 1.5 min with "Unable to find libclang"
#   - ngtcp2-client (gtlsclient), ngtcp2-server (gtlsserver): an independent HTTP/3 client and
#     server (C, GnuTLS) that the udpx-h3 tests download from and upload to
#   - nginx, curl: HTTPS over TCP beside HTTP/3 in `udpx bench h3` (nginx serves the same file
#     with TLS 1.3, curl downloads it; the bench runs its own instance on a free port, while
#     Debian's package also enables a system service on port 80 where systemd runs)
#   - chromium: the first real client of `udpx h3 serve` (crates/udpx-h3/tests/browser.rs runs
#     it headless: a page over HTTP/3, and Alt-Svc discovery from HTTPS over TCP)
#   - tshark (Wireshark's command line; dumpcap comes with it): crates/udpx-h3/tests/keylog.rs
#     captures a download on loopback and decrypts it with the server's key log
#     (`--keylog-file`); installed without the setuid dumpcap (debconf answered first), the
#     tests capture as root
#   - cargo-fuzz (from crates.io): the fuzz targets under fuzz/, run by scripts/fuzz.sh
#   - udpx-quicgo-load: the independent load client (peers/quicgo-load: our Go program on
#     quic-go from the Go module proxy, versions pinned by its go.sum), built with the machine's
#     Go into /usr/local/bin (root) or target/peers; the scale bench and the h3 tests use it
# Rust itself (stable, and the nightly that cargo-fuzz needs) comes from rustup, which the
# machine image provides; without a nightly the fuzz targets are skipped, not failed.
#
#   bash scripts/setup.sh          # everything above (the test command runs this)
#   bash scripts/setup.sh bench    # only what `udpx bench` runs: ethtool, iproute2, iperf3,
#                                  # sockperf (the README's first command)
set -euo pipefail

only_bench=""
case "${1:-}" in
  "") ;;
  bench) only_bench=1 ;;
  *) echo "setup: unknown argument $1 (say bench, or nothing for everything)" >&2; exit 2 ;;
esac

need=()
command -v ethtool  >/dev/null 2>&1 || need+=(ethtool)
command -v ip       >/dev/null 2>&1 || need+=(iproute2)
command -v iperf3   >/dev/null 2>&1 || need+=(iperf3)
command -v sockperf >/dev/null 2>&1 || need+=(sockperf)
if [ -z "$only_bench" ]; then
  command -v nft      >/dev/null 2>&1 || need+=(nftables)
  dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
  command -v gtlsclient >/dev/null 2>&1 || need+=(ngtcp2-client)
  command -v gtlsserver >/dev/null 2>&1 || need+=(ngtcp2-server)
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
  command -v curl  >/dev/null 2>&1 || need+=(curl)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v tshark >/dev/null 2>&1 || need+=(tshark)
fi

# Each step announces itself (`== setup: ...`): scripts/time-commands.sh times them.
phase() { echo "== setup: $*"; }

if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing ${need[*]}; not root, so not installing (tests that need them will SKIP)" >&2
  else
    phase "Debian packages"
    echo "setup: installing ${need[*]} from Debian packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    # wireshark-common asks whether non-root users may capture (a setuid dumpcap): no.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -qq >/dev/null
    # Chromium apart: the largest download by far, timed on its own.
    rest=()
    for p in "${need[@]}"; do [ "$p" = chromium ] || rest+=("$p"); done
    [ "${#rest[@]}" -eq 0 ] || apt-get install -y -qq --no-install-recommends "${rest[@]}" >/dev/null
    if [ "${#rest[@]}" -ne "${#need[@]}" ]; then
      phase "Chromium"
      apt-get install -y -qq --no-install-recommends chromium >/dev/null
    fi
  fi
fi

if [ -n "$only_bench" ]; then
  phase done
  exit 0
fi

# The independent load client: rebuilt every time (Go's cache makes a rebuild of unchanged
# code about a second), so a change to peers/quicgo-load reaches the tests.
root="$(cd "$(dirname "$0")/.." && pwd)"
if command -v go >/dev/null 2>&1; then
  phase "Go modules and the quic-go client"
  if [ "$(id -u)" -eq 0 ]; then out=/usr/local/bin; else out="$root/target/peers"; fi
  mkdir -p "$out"
  if ! (cd "$root/peers/quicgo-load" && GOFLAGS=-mod=readonly go build -trimpath -o "$out/udpx-quicgo-load" .); then
    echo "setup: peers/quicgo-load did not build; the independent client's rows and tests will SKIP" >&2
  fi
else
  echo "setup: no Go toolchain; the independent client's rows and tests will SKIP" >&2
fi

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  phase "cargo-fuzz"
  echo "setup: installing cargo-fuzz from crates.io" >&2
  cargo install cargo-fuzz --locked -q || echo "setup: cargo-fuzz did not install; the fuzz targets will be skipped" >&2
fi
phase done
