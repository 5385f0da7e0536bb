#!/usr/bin/env python3
"""What a session's command costs against a pooled `exec` (issue 38).

    python benchmarks/session_cost.py [-n CALLS] [--rounds R] [--quick] [--json]

One process, one `Runner`. Each round runs three blocks of CALLS
`exec(["/bin/true"])` each, in a rotating order so that load drifts hit
all:

- `session`: `async with runner.session()`, the calls in it, its end;
- `pool`: `async with runner.pool("exec", size=2)`, the calls once it is
  full, its end;
- `cold`: `Runner.exec`, for reference.

Per block: the p50 wall time of one call, and the host CPU per call: this
process's and every reaped descendant's user + system time
(`getrusage(SELF)` + `getrusage(CHILDREN)`) over the whole block, its
opening and closing included (the session's jail, the pool's fork server
and its prewarmed workers are reaped at the block's end), divided by
CALLS. The watchdog (one per process, never reaped) is left out of both.
Prints the median over rounds of each figure and the ratios of session to
pool and to cold. Nothing is asserted; run it on a quiet host.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
from typing import TYPE_CHECKING, Any

import trio

from trunner import Limits, Runner

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

WAYS = ("session", "pool", "cold")


def cpu_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


async def block(runner: Runner, way: str, calls: int) -> dict[str, float]:
    walls: list[float] = []

    async def timed(call: Callable[[], Awaitable[object]]) -> None:
        began = trio.current_time()
        await call()
        walls.append(trio.current_time() - began)

    began_cpu = cpu_s()
    if way == "session":
        async with runner.session() as s:
            for _ in range(calls):
                await timed(lambda: s.exec(["/bin/true"]))
    elif way == "pool":
        async with runner.pool("exec", size=2) as pool:
            for _ in range(calls):
                while pool.idle_workers < 2:  # noqa: ASYNC110  timed full, as ab_cold.py --pool
                    await trio.sleep(0.001)
                await timed(lambda: pool.exec(["/bin/true"]))
    else:
        for _ in range(calls):
            await timed(lambda: runner.exec(["/bin/true"]))
    return {"wall_ms": statistics.median(walls) * 1e3,
            "cpu_ms": (cpu_s() - began_cpu) / calls * 1e3}


async def measure(calls: int, rounds: int) -> dict[str, Any]:
    runner = Runner(temp_root=tempfile.gettempdir(), limits=Limits(wall_time_s=10.0))
    seen: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for r in range(rounds):
        for way in WAYS[r % 3:] + WAYS[:r % 3]:
            seen[way].append(await block(runner, way, calls))
    report: dict[str, Any] = {
        way: {key: statistics.median(f[key] for f in figures) for key in ("wall_ms", "cpu_ms")}
        for way, figures in seen.items()}
    for other in ("pool", "cold"):
        report[f"session/{other}"] = {key: report["session"][key] / report[other][key]
                                      for key in ("wall_ms", "cpu_ms")}
    report["calls"], report["rounds"] = calls, rounds
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50, help="calls per block (default 50)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="5 calls, 1 round (CI's shape check)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    report = trio.run(measure, *((5, 1) if args.quick else (args.n, args.rounds)))
    if args.json:
        print(json.dumps(report))
        return
    for way in WAYS:
        print(f"{way:>8}: wall p50 {report[way]['wall_ms']:7.2f} ms"
              f"   host CPU {report[way]['cpu_ms']:7.2f} ms/call")
    for other in ("pool", "cold"):
        ratio = report[f"session/{other}"]
        print(f"session/{other}: wall {ratio['wall_ms']:.2f} x   CPU {ratio['cpu_ms']:.2f} x")


if __name__ == "__main__":
    main()
