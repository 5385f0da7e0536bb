#!/usr/bin/env python3
"""Where a pooled run's CPU goes: who spends it, and what each layer costs.

    python benchmarks/pool_steps.py [--mode exec|echo] [-n N] [--rounds R]

Each variant is a `runner.pool(MODE, size=1)` served back to back (`exec
/bin/true`, or `echo` of 1 byte), in blocks of N runs, R rounds, the order
rotating. Per run, medians over rounds:

  host      /proc/stat busy time over the block (every process, the kernel)
  parent    this process (RUSAGE_SELF)
  children  what this process reaped: each run's leader and what it reaped
            (the waiters, pid 1 and 2, the program)
  server    the fork server (/proc/PID/stat)
  watchdog  this process's watchdog (/proc/PID/stat): the records each run
            sends it (`trunner.linux.watchdog`)

Variants: `full` (the plan as shipped), then one per layer the plan can
leave out (`LinuxBackend(unsafe_skip=(layer,))`, benchmarks only): the
difference to `full` is what that layer costs a run, its kernel work
included. Layers are never left out by `Runner`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from typing import Any

import trio

from trunner import Runner
from trunner.kernel.abi import SKIPPABLE
from trunner.linux import watchdog
from trunner.linux.backend import LinuxBackend
from trunner.worker import locate_worker

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def host_busy_ms() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) * TICK_MS


def process_ms(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_MS


def rusage_ms(who: int) -> float:
    r = resource.getrusage(who)
    return (r.ru_utime + r.ru_stime) * 1000


def sample(server: int | None, guard: int | None) -> list[float]:
    return [time.monotonic() * 1000, host_busy_ms(), rusage_ms(resource.RUSAGE_SELF),
            rusage_ms(resource.RUSAGE_CHILDREN), process_ms(server), process_ms(guard)]


async def block(pool: Any, mode: str, n: int) -> list[float]:  # noqa: ANN401  a WorkerPool
    async def call() -> None:
        if mode == "exec":
            await pool.exec(["/bin/true"])
        else:
            await pool.run(b"x")

    for _ in range(3):
        await call()
    server, guard = pool._spawner.pid, watchdog.watchdog_pid()
    before = sample(server, guard)
    for _ in range(n):
        await call()
    after = sample(server, guard)
    return [(a - b) / n for a, b in zip(after, before, strict=True)]


async def main(mode: str, n: int, rounds: int) -> None:
    names = ["full", *SKIPPABLE]
    runners = {name: Runner(backend=LinuxBackend(
        locate_worker(), unsafe_skip=() if name == "full" else (name,))) for name in names}
    figures: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            async with runners[name].pool(mode, size=1) as pool:
                figures[name].append(await block(pool, mode, n))
    head = ("wall", "host", "parent", "children", "server", "watchdog")
    print(f"pool {mode}: {rounds} rounds x {n} runs, ms per run (medians)")
    print(f"  {'variant':<16}" + "".join(f"{h:>10}" for h in head) + f"{'host - full':>13}")
    full_host = statistics.median(f[1] for f in figures["full"])
    for name in names:
        med = [statistics.median(f[i] for f in figures[name]) for i in range(len(head))]
        label = name if name == "full" else f"no {name}"
        delta = "" if name == "full" else f"{med[1] - full_host:>+13.2f}"
        print(f"  {label:<16}" + "".join(f"{v:>10.2f}" for v in med) + delta)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("exec", "echo"), default="exec")
    parser.add_argument("-n", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trio.run(main, args.mode, args.n, args.rounds)
