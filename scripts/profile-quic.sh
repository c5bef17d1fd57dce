#!/usr/bin/env bash
# Where the server's CPU goes in `udpx bench quic`, row by row: runs the bench under
# `perf record -e cpu-clock -a -g` (software clock: no hardware counters needed) and prints,
# for each server thread (srv-quinn-udp, srv-udpx-sys, srv-udpx-uring: the bench names them by
# row), its samples on the server CPU and the inclusive samples of the functions that tell the
# datapaths apart, per 1000 samples of the quinn-udp row.
#
#   scripts/profile-quic.sh [bench flags...]     default: --loopback --rounds 10
#
# Needs root (or perf_event_paranoid <= -1) and perf; the release binary is built first.
# Nothing else should run meanwhile: the bench's CPU accounting and the profile share the CPUs.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v perf >/dev/null || { echo "profile-quic: perf is not installed (Debian: apt-get install linux-perf)" >&2; exit 1; }
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--loopback --rounds 10)
cargo build --release -q -p udpx-cli
server_cpu=$(awk '/^cpu[0-9]/ {n++} END {print (n > 1) ? 1 : 0}' /proc/stat)

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
perf record -q -e cpu-clock -a -g -o "$out/perf.data" -- ./target/release/udpx bench quic "${args[@]}" \
    >"$out/bench.md" 2>"$out/bench.log"
grep -E '^\s*(datapath|quinn-udp |udpx )|\[(met|MISSED|inconclusive)\]' "$out/bench.md" || true
echo
perf report -i "$out/perf.data" --cpu "$server_cpu" --children --sort comm,sym --stdio -g none 2>/dev/null \
    >"$out/children.txt"

# Inclusive samples ("Children" column) of each function per row; the rows' totals from the
# self column ("Self") summed over every symbol of the thread.
awk -v funcs="__sys_sendmsg __do_sys_io_uring_enter udp_sendmsg __x64_sys_recvmmsg task_work_run net_rx_action sock_def_readable __udp_enqueue_schedule_skb io_cqring_wait fget" '
BEGIN {
    n = split(funcs, F, " ")
    R[1] = "srv-quinn-udp"; R[2] = "srv-udpx-sys"; R[3] = "srv-udpx-uring"
}
/^ +[0-9.]+% +[0-9.]+% / {
    children = $1 + 0; self = $2 + 0; comm = $3; sym = $5
    total[comm] += self
    key = comm SUBSEP sym
    if (!(key in seen)) { seen[key] = 1; incl[key] += children }
}
END {
    base = total[R[1]]
    if (base == 0) { print "profile-quic: no samples of srv-quinn-udp on the server CPU" > "/dev/stderr"; exit 1 }
    printf "%-32s %14s %14s %14s\n", "per 1000 samples of quinn-udp", R[1], R[2], R[3]
    printf "%-32s %14.0f %14.0f %14.0f\n", "all (self, every symbol)", 1000, total[R[2]] * 1000 / base, total[R[3]] * 1000 / base
    for (i = 1; i <= n; i++) {
        printf "%-32s", F[i]
        for (r = 1; r <= 3; r++) printf " %14.1f", incl[R[r] SUBSEP F[i]] * 1000 / base
        printf "\n"
    }
}' "$out/children.txt"
