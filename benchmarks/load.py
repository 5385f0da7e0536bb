#!/usr/bin/env python3
"""Load: N `echo` invocations at concurrency C through ONE Runner.

    python benchmarks/load.py [-n 10000] [-c 16] [--pad 256] [--json]

Every request is unique ({"i": i, "pad": random bytes}); every response must
equal its own request (no loss, no mix-up between concurrent invocations).
Afterwards the parent's open fds, child processes (trunner's watchdog not
counted), jail dirs under the Runner's temp_root and RSS (VmRSS) are compared
with a baseline taken after one warm-up run. Prints invocations/s, p50/p99
latency and the before/after figures; exits 1 on any loss, mix-up or leak.

`tests/test_load.py` imports `run_load()` and `leak_problems()` from this file.
On a 2-core machine expect ~10-25 invocations/s: 10,000 take ~10 minutes.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import trio

MiB = 1024 * 1024
#: RSS growth tolerated between the baseline and the end.
RSS_TOLERANCE_BYTES = 20 * MiB


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def child_pids() -> list[int]:
    """Our child processes, not counting trunner's own watchdog."""
    from trunner.linux.watchdog import watchdog_pid

    pids: list[int] = []
    for path in glob.glob("/proc/self/task/*/children"):
        try:
            with open(path) as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            continue  # a thread that ended between glob and open
    return [p for p in pids if p != watchdog_pid()]


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def snapshot(temp_root: str) -> dict[str, Any]:
    gc.collect()
    return {
        "fds": sorted(open_fds(), key=int),
        "children": child_pids(),
        "temp_dirs": sorted(os.listdir(temp_root)),
        "rss_bytes": rss_bytes(),
    }


def leak_problems(
    before: dict[str, Any], after: dict[str, Any], rss_tolerance: int = RSS_TOLERANCE_BYTES
) -> list[str]:
    """What differs between two snapshots beyond the tolerances ([] = none)."""
    problems = []
    if set(after["fds"]) != set(before["fds"]):
        extra = sorted(set(after["fds"]) - set(before["fds"]), key=int)
        targets = {}
        for fd in extra[:10]:
            try:
                targets[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                targets[fd] = "?"
        problems.append(f"fds: {len(before['fds'])} -> {len(after['fds'])}, extra {targets}")
    if after["children"]:
        problems.append(f"child processes left: {after['children']}")
    if after["temp_dirs"] != before["temp_dirs"]:
        problems.append(f"temp dirs left: {after['temp_dirs'][:10]}")
    growth = after["rss_bytes"] - before["rss_bytes"]
    if growth > rss_tolerance:
        problems.append(
            f"RSS grew {growth / MiB:.1f} MiB (> {rss_tolerance / MiB:.0f} MiB tolerated)"
        )
    return problems


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


async def run_load(
    n: int,
    concurrency: int,
    *,
    temp_root: str,
    pad_max: int = 256,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """N echo invocations at `concurrency` through one Runner; the figures.

    The result's `lost`, `mixed_up`, `errors` and `leaks` lists are all empty
    on success.
    """
    from trunner import Limits, Runner, RunnerError
    from trunner.linux.watchdog import ensure_running

    ensure_running()
    runner = Runner(temp_root=temp_root, limits=Limits(wall_time_s=60.0))
    rng = random.Random(seed)
    requests = [{"i": i, "pad": rng.randbytes(rng.randint(0, pad_max))} for i in range(n)]
    # Warm-up: caches (rules version, entry points) and the spawn thread.
    warm = {"i": -1, "pad": b"warm"}
    assert (await runner.run("echo", warm)).response == warm
    before = snapshot(temp_root)

    responses: dict[int, Any] = {}
    latencies: list[float] = []
    errors: list[str] = []
    mixed_up: list[int] = []
    send, receive = trio.open_memory_channel[int](n)
    for i in range(n):
        send.send_nowait(i)
    send.close()

    async def worker() -> None:
        async for i in receive:
            start = time.perf_counter()
            try:
                result = await runner.run("echo", requests[i])
            except RunnerError as e:
                errors.append(f"{i}: {e.reason}: {e.detail[:200]}")
                continue
            latencies.append(time.perf_counter() - start)
            if result.response != requests[i]:
                mixed_up.append(i)
            if i in responses:
                mixed_up.append(i)
            responses[i] = result.response
            if progress and len(responses) % 500 == 0:
                print(f"  {len(responses)}/{n}", file=sys.stderr, flush=True)

    wall_start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    wall = time.perf_counter() - wall_start
    # The drains and reaps are done when run() returns; let trio settle anyway.
    await trio.lowlevel.checkpoint()
    after = snapshot(temp_root)

    lat = sorted(latencies)
    lost = [i for i in range(n) if i not in responses]
    return {
        "n": n,
        "concurrency": concurrency,
        "ok": len(responses) - len(set(mixed_up)),
        "lost": lost,
        "mixed_up": sorted(set(mixed_up)),
        "errors": errors,
        "wall_s": wall,
        "invocations_per_s": n / wall if wall > 0 else float("nan"),
        "latency_ms": {
            "p50": percentile(lat, 0.50) * 1000,
            "p99": percentile(lat, 0.99) * 1000,
            "max": (lat[-1] * 1000) if lat else float("nan"),
            "mean": (statistics.fmean(lat) * 1000) if lat else float("nan"),
        },
        "before_full": before,
        "after_full": after,
        "before": {**before, "fds": len(before["fds"])},
        "after": {**after, "fds": len(after["fds"])},
        "rss_growth_mib": (after["rss_bytes"] - before["rss_bytes"]) / MiB,
        "leaks": leak_problems(before, after),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000, help="invocations (default 10000)")
    parser.add_argument("-c", type=int, default=16, help="concurrency (default 16)")
    parser.add_argument("--pad", type=int, default=256, help="largest random pad, bytes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()

    temp_root = tempfile.mkdtemp(prefix="trunner-load-")
    try:
        figures = trio.run(
            lambda: run_load(
                args.n, args.c, temp_root=temp_root, pad_max=args.pad, seed=args.seed,
                progress=not args.json,
            )
        )
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)
    failed = bool(figures["lost"] or figures["mixed_up"] or figures["errors"] or figures["leaks"])
    if args.json:
        compact = {k: v for k, v in figures.items() if not k.endswith("_full")}
        print(json.dumps({**compact, "passed": not failed}))
        return 1 if failed else 0
    b, a, lat = figures["before"], figures["after"], figures["latency_ms"]
    print(f"invocations:     {figures['n']} at concurrency {figures['concurrency']}")
    print(f"ok:              {figures['ok']}  lost: {len(figures['lost'])}  "
          f"mixed up: {len(figures['mixed_up'])}  errors: {len(figures['errors'])}")
    print(f"wall:            {figures['wall_s']:.1f} s")
    print(f"invocations/s:   {figures['invocations_per_s']:.1f}")
    print(f"latency ms:      p50 {lat['p50']:.1f}  p99 {lat['p99']:.1f}  "
          f"max {lat['max']:.1f}  mean {lat['mean']:.1f}")
    print(f"open fds:        {b['fds']} -> {a['fds']}")
    print(f"child processes: {len(b['children'])} -> {len(a['children'])}")
    print(f"temp dirs:       {len(b['temp_dirs'])} -> {len(a['temp_dirs'])}")
    print(f"RSS:             {b['rss_bytes'] / MiB:.1f} MiB -> {a['rss_bytes'] / MiB:.1f} MiB "
          f"({figures['rss_growth_mib']:+.1f} MiB, tolerance +{RSS_TOLERANCE_BYTES // MiB} MiB)")
    for e in figures["errors"][:10]:
        print(f"error: {e}")
    for problem in figures["leaks"]:
        print(f"LEAK: {problem}")
    print("PASS" if not failed else "FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
