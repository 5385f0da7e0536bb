#!/usr/bin/env python3
"""Two trunner builds interleaved in one run: cold or prewarmed latency, cold throughput.

    python benchmarks/ab_cold.py OLD_PYTHON NEW_PYTHON [--rounds R] [-n N] [--pool | --exec]
    python benchmarks/ab_cold.py OLD_PYTHON NEW_PYTHON --concurrency C [--rounds R]

Each python is a venv's interpreter with its own trunner installed (e.g. a
`git worktree` of an older commit set up with `scripts/setup`). Rounds
alternate old, new, new, old, ... so load drifts hit both; each round is one
process running N sequential `Runner.run("echo")` (with --exec,
`Runner.exec(["/bin/true"])`) after one warm-up. Prints
the p50 and p90 per build and the new/old ratio of the p50s. With --pool,
each call goes to a prewarmed worker of `runner.pool("echo", size=1)`,
timed only once the worker is blocked reading its request. With
--concurrency C, each round runs C closed-loop callers of cold
`Runner.run("echo")` for WINDOW_S and counts the calls that end in it after
a RAMP_S ramp: invocations/s per build and the new/old ratio of the medians
(issue 12's cold throughput at concurrency 4, both builds in one run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

ROUND = r"""
import json, sys, tempfile, time, trio
from trunner import Runner
n, mode = int(sys.argv[1]), sys.argv[2]
async def main():
    r = Runner(temp_root=tempfile.gettempdir())
    call = (lambda i: r.exec(["/bin/true"])) if mode == "exec" else (lambda i: r.run("echo", i))
    await call(0)
    out = []
    for i in range(n):
        t = time.perf_counter()
        await call(i)
        out.append((time.perf_counter() - t) * 1000)
    print(json.dumps(out))
trio.run(main)
"""
RAMP_S, WINDOW_S = 0.5, 3.0
THROUGHPUT_ROUND = r"""
import json, sys, tempfile, time, trio
from trunner import Runner
c, ramp, window = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
async def main():
    r = Runner(temp_root=tempfile.gettempdir())
    await r.run("echo", 0)
    start = time.perf_counter() + ramp
    ends = []
    async def caller():
        while time.perf_counter() < start + window:
            await r.run("echo", 0)
            ends.append(time.perf_counter())
    async with trio.open_nursery() as nursery:
        for _ in range(c):
            nursery.start_soon(caller)
    print(json.dumps([sum(start <= t < start + window for t in ends) / window]))
trio.run(main)
"""
POOL_ROUND = r"""
import json, sys, tempfile, time, trio
from trunner import Runner
n = int(sys.argv[1])
async def main():
    r = Runner(temp_root=tempfile.gettempdir())
    out = []
    async with r.pool("echo", size=1) as pool:
        for i in range(n + 1):
            while pool.idle_workers < 1:
                await trio.sleep(0.005)
            await trio.sleep(0.03)  # its adapter is blocked reading the request
            t = time.perf_counter()
            await pool.run(i)
            out.append((time.perf_counter() - t) * 1000)
    print(json.dumps(out[1:]))
trio.run(main)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--pool", action="store_true", help="prewarmed workers, not cold")
    parser.add_argument("--exec", action="store_true",
                        help="cold `exec` of /bin/true, not `echo` (latency only)")
    parser.add_argument("--concurrency", type=int, default=0,
                        help="measure cold invocations/s with this many callers instead")
    args = parser.parse_args()
    code, round_args = (POOL_ROUND if args.pool else ROUND), [str(args.n)]
    if not args.pool:
        round_args.append("exec" if args.exec else "echo")
    if args.concurrency:
        code = THROUGHPUT_ROUND
        round_args = [str(args.concurrency), str(RAMP_S), str(WINDOW_S)]
    times: dict[str, list[float]] = {"old": [], "new": []}
    order = ["old", "new", "new", "old"] * ((args.rounds + 1) // 2)
    for i, which in enumerate(order[: 2 * args.rounds]):
        python = getattr(args, which)
        out = subprocess.run([python, "-c", code, *round_args], capture_output=True,
                             text=True, check=True, cwd=tempfile.gettempdir())
        times[which] += json.loads(out.stdout)
        print(f"round {i + 1}: {which}", file=sys.stderr)
    ratio = statistics.median(times["new"]) / statistics.median(times["old"])
    if args.concurrency:
        for which, xs in times.items():
            rounds = ", ".join(f"{x:.1f}" for x in xs)
            print(f"{which}: {statistics.median(xs):.1f} invocations/s at concurrency"
                  f" {args.concurrency} (median of rounds: {rounds})")
        print(f"new/old invocations/s: {ratio:.2f}")
        return 0
    for which, xs in times.items():
        q = statistics.quantiles(xs, n=10)
        print(f"{which}: p50 {statistics.median(xs):.1f} ms, p90 {q[8]:.1f} ms ({len(xs)} runs)")
    print(f"new/old p50: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
