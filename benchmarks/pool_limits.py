#!/usr/bin/env python3
"""What a call with limits of its own costs in a pool (issue 35, item 3).

    python benchmarks/pool_limits.py [-n N] [--size S]

One process, one `Runner`, one `runner.pool("exec", size=S)`; N rounds, each
timing `exec(["/bin/true"])` four ways, interleaved so load drifts hit all:

- `pooled`: the pool's own limits, on a prewarmed worker (timed once the
  pool is full, as `ab_cold.py --pool`);
- `own`: other limits (cpu_time_s 3 instead of 10), once the pool is full: a
  jail started for the call through the pool's fork server, an idle worker
  ended for its slot;
- `own-b2b`: the same, back to back with the previous own call (the refill
  has just begun to replace the worker that call ended: it is waited for,
  then ended);
- `cold`: `Runner.exec` with the other limits (fork and exec of the helper).

Prints the p50 and p90 of each in ms, and the ratios of the p50s to
`pooled` and to `cold`, all from the same run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import trio

from trunner import Limits, Runner


async def main(n: int, size: int) -> None:
    runner = Runner(temp_root=tempfile.gettempdir(), limits=Limits(wall_time_s=10.0))
    other = runner.limits.replace(cpu_time_s=3.0)
    times: dict[str, list[float]] = {"pooled": [], "own": [], "own-b2b": [], "cold": []}
    async with runner.pool("exec", size=size) as pool:

        async def full() -> None:
            while pool.idle_workers < size:  # noqa: ASYNC110  a plain count: nothing to await
                await trio.sleep(0.002)
            await trio.sleep(0.05)  # the workers blocked reading their request

        async def timed(name: str, call: object) -> None:
            t = time.perf_counter()
            await call  # type: ignore[misc]
            times[name].append((time.perf_counter() - t) * 1000)

        await runner.exec(["/bin/true"], limits=other)  # the plan of `other`, made once
        await pool.exec(["/bin/true"], limits=other)
        for _ in range(n):
            await full()
            await timed("pooled", pool.exec(["/bin/true"]))
            await full()
            await timed("own", pool.exec(["/bin/true"], limits=other))
            await timed("own-b2b", pool.exec(["/bin/true"], limits=other))
            await timed("cold", runner.exec(["/bin/true"], limits=other))
    p50 = {k: statistics.median(v) for k, v in times.items()}
    for name, values in times.items():
        p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
        print(f"{name:8} p50 {p50[name]:7.2f} ms  p90 {p90:7.2f} ms  "
              f"x{p50[name] / p50['pooled']:.2f} of pooled  x{p50[name] / p50['cold']:.2f} of cold")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40)
    parser.add_argument("--size", type=int, default=1)
    args = parser.parse_args()
    trio.run(main, args.n, args.size)
