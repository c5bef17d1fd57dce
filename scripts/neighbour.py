#!/usr/bin/env python3
"""A noisy neighbour, for reproducing what a hypervisor's steal does to a run.

    scripts/neighbour.py [--share 0.25] [--burst-ms 40] -- COMMAND...

Runs COMMAND while, on every CPU, a real-time (SCHED_FIFO) busy loop takes the CPU for bursts
of about --burst-ms, --share of the time in all, at random moments: whatever COMMAND runs on
that CPU (its threads, the kernel's softirq threads) waits, as when the host runs another guest.
Unlike steal it shows in /proc/stat as the guest's own time, so the suites' steal checks do not
see it: it is for finding tests that a stolen run fails, never for figures. Stops with COMMAND
(its exit status is this script's), or on Ctrl-C; the kernel's real-time throttling
(sched_rt_runtime_us) bounds it in any case. Needs root.
"""
import argparse
import ctypes
import os
import random
import signal
import subprocess
import sys
import time


def hog(cpu: int, share: float, burst: float, seed: int) -> None:
    # Dies with this script whatever kills it (PR_SET_PDEATHSIG, SIGKILL): a real-time loop
    # left behind would keep a quarter of every CPU.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    rnd = random.Random(seed)
    gap = burst * (1.0 - share) / share
    while True:
        time.sleep(rnd.uniform(0.5, 1.5) * gap)
        end = time.monotonic() + rnd.uniform(0.5, 1.5) * burst
        while time.monotonic() < end:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--share", type=float, default=0.25, help="the part of each CPU taken, 0.01-0.8")
    ap.add_argument("--burst-ms", type=float, default=40.0, help="a burst's mean length, 1-1000 ms")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command to run after --")
    if not 0.01 <= a.share <= 0.8:
        ap.error(f"--share {a.share}: give a part between 0.01 and 0.8")
    if not 1.0 <= a.burst_ms <= 1000.0:
        ap.error(f"--burst-ms {a.burst_ms}: give 1 to 1000")
    if os.geteuid() != 0:
        ap.error("a real-time neighbour needs root")
    hogs = []
    for i, cpu in enumerate(sorted(os.sched_getaffinity(0))):
        pid = os.fork()
        if pid == 0:
            try:
                hog(cpu, a.share, a.burst_ms / 1000.0, os.getpid() + i)
            finally:
                os._exit(0)
        hogs.append(pid)
    try:
        return subprocess.call(cmd)
    finally:
        for pid in hogs:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    sys.exit(main())
