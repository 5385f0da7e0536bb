#!/usr/bin/env python3
"""What an exec of trunner-waiter costs: start-up and exit, nothing else.

    .venv/bin/python benchmarks/waiter_start.py [-n N] [--json] [BINARY ...]

Each binary (default: the built `trunner/kernel/trunner-waiter`) is
spawned with no arguments, which it refuses at once (exit 121): what is timed
is the spawn, the exec, the C library's start-up, that refusal, the exit and
the reap, from this process (`posix_spawn` + `waitpid`). Binaries are
interleaved (each round runs every one once, the first one rotating), so a
noisy host's drift hits all alike. Prints, per binary, its size and the p10,
p50 and p90 in microseconds. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

WAITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trunner", "linux",
                      "kernel", "trunner-waiter")
#: The waiter's refusal of an argv it does not know (abi.SANDBOX_SETUP_EXIT).
REFUSED = 121


def one_exec_us(binary: str) -> float:
    """Spawn `binary` with no arguments, reap it; the time taken, in us."""
    start = time.perf_counter_ns()
    pid = os.posix_spawn(binary, [binary], {})
    _, status = os.waitpid(pid, 0)
    took = (time.perf_counter_ns() - start) / 1000
    if os.waitstatus_to_exitcode(status) != REFUSED:
        raise SystemExit(f"{binary}: exit status {status:#x}, not a refusal ({REFUSED})")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binaries", nargs="*", default=[os.path.normpath(WAITER)])
    parser.add_argument("-n", type=int, default=3000, help="execs of each binary (default 3000)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {b: [] for b in args.binaries}
    for binary in args.binaries:  # warm-up: page cache, the first exec's faults
        for _ in range(50):
            one_exec_us(binary)
    for i in range(args.n):
        k = i % len(args.binaries)
        for binary in args.binaries[k:] + args.binaries[:k]:
            samples[binary].append(one_exec_us(binary))
    report = {}
    for binary, times in samples.items():
        deciles = statistics.quantiles(times, n=10)
        report[binary] = {"bytes": os.path.getsize(binary), "n": len(times),
                          "p10_us": round(deciles[0], 1), "p50_us": round(deciles[4], 1),
                          "p90_us": round(deciles[8], 1)}
    if args.json:
        json.dump(report, sys.stdout)
        print()
        return
    print(f"{'binary':<48} {'bytes':>7} {'p10 us':>8} {'p50 us':>8} {'p90 us':>8}")
    for binary, r in report.items():
        print(f"{binary:<48} {r['bytes']:>7} {r['p10_us']:>8} {r['p50_us']:>8} {r['p90_us']:>8}")


if __name__ == "__main__":
    main()
