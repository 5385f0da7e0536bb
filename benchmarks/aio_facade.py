#!/usr/bin/env python3
"""What asyncio callers pay for the facade (issue 39): trio on a thread
(`trunner.aio`'s portal) against trio's guest mode on the running asyncio
loop, against the trio API itself.

    python benchmarks/aio_facade.py [-n ROUNDS] [--noop-calls K] [--only KIND,...] [--json]

One process, one asyncio loop, one `Runner`. Three ways to await the same
trio call:

- `trio`: the trio API, awaited by a trio task (in the portal's trio run)
  and timed there: the reference;
- `thread`: `trunner.aio` as shipped, from an asyncio task: the call runs
  as a task of the portal (a trio run on a thread of its own), its outcome
  comes back by `call_soon_threadsafe`;
- `guest`: the same bridge, but the trio run is a guest of the asyncio loop
  (`trio.lowlevel.start_guest_run`): its tasks run in the loop's thread, its
  I/O waits in a thread of trio's, every wake-up handed to the loop.

Workloads, every round running each way in turn (the first one rotating),
so that load drifts hit all:

- `noop`: `trio.lowlevel.checkpoint()`, K calls in a row: the bridge alone;
- `c1`: `pool.run(n)` on an `echo` pool of 8 (the trio and thread ways share
  one pool, the guest way has its own), the pool full before the call;
- `c8`: 8 such calls at once, the pool full before them;
- `cold1`, `cold8`: `Runner.run("echo", n)`, one, and 8 at once: no pool,
  so no refill runs after the call.

Prints, for each way and workload, the p50 latency per call and the CPU per
call (this process's user + system, every thread, `getrusage(RUSAGE_SELF)`
around the timed calls, over the calls), and each way's difference from
`trio`: the facade's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import resource
import statistics
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

import trio

from trunner import Limits
from trunner.aio import AsyncioRunner, Held, Portal, _settle, _unwrap, _wait_out

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trunner.aio import Outcome
    from trunner.pool import WorkerPool

SIZE = 8
WAYS = ("trio", "thread", "guest")
KINDS = ("noop", "c1", "c8", "cold1", "cold8")


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class GuestPortal(Portal):
    """The portal's interface over a trio guest run on this asyncio loop."""

    def __init__(self) -> None:  # no thread: see `open`
        self._token = None
        self._nursery = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[object] = loop.create_future()
        trio.lowlevel.start_guest_run(
            self._serve_guest, ready,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=self._done.set_result,
            host_uses_signal_set_wakeup_fd=True)
        await ready

    async def _serve_guest(self, ready: asyncio.Future[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            ready.set_result(None)
            await trio.sleep_forever()

    async def close(self) -> None:
        assert self._nursery is not None
        self.soon(self._nursery.cancel_scope.cancel)
        await self._done

    def start(self, scope: trio.CancelScope, fn: Callable[[], Awaitable[object]],
              done: asyncio.Future[Outcome]) -> None:
        # The loop's own thread: the outcome is set directly, no hand-off.
        self.soon(self._start, scope, fn, functools.partial(_settle, done))


async def guest_call(portal: GuestPortal, fn: Callable[..., Awaitable[Any]],
                     *args: object) -> Any:  # noqa: ANN401
    """`trunner.aio.call`, through the guest portal."""
    done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
    scope = trio.CancelScope()
    portal.start(scope, functools.partial(fn, *args), done)
    try:
        outcome = await asyncio.shield(done)
    except asyncio.CancelledError:
        portal.soon(scope.cancel)
        await _wait_out(done)
        raise
    return _unwrap(outcome)


async def guest_hold(portal: GuestPortal, pool: WorkerPool, opened: asyncio.Future[Any],
                     stop: asyncio.Future[None]) -> None:
    """Hold `pool` open in the guest run until `stop` (the loop's thread)."""
    async with pool:
        event = trio.Event()
        stop.add_done_callback(lambda _: portal.soon(event.set))
        opened.set_result(None)
        await event.wait()


async def main(rounds: int, noop_calls: int, kinds: tuple[str, ...] = KINDS
               ) -> dict[str, dict[str, float]]:
    runner = AsyncioRunner(temp_root=tempfile.gettempdir(), limits=Limits(wall_time_s=30.0))
    trio_pool = runner.runner.pool("echo", size=SIZE)
    guest_pool = runner.runner.pool("echo", size=SIZE)
    held = Held("bench", trio_pool)
    await held.enter()
    guest = GuestPortal()
    await guest.open()
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[Any] = loop.create_future()
    stop: asyncio.Future[None] = loop.create_future()
    guest_held = loop.create_future()
    guest.start(trio.CancelScope(),
                functools.partial(guest_hold, guest, guest_pool, opened, stop), guest_held)
    await opened
    portal = Portal.get()

    async def thread_call(fn: Callable[..., Awaitable[Any]], *args: object) -> Any:  # noqa: ANN401
        from trunner.aio import call
        return await call("bench", fn, *args)

    lat: dict[str, list[float]] = {f"{w}/{k}": [] for w in WAYS for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in lat}

    async def full(pool: WorkerPool) -> None:
        while pool.idle_workers < SIZE:  # noqa: ASYNC110  a plain count: nothing to await
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)  # the workers blocked reading their request

    async def noop(_: int) -> None:
        await trio.lowlevel.checkpoint()

    async def cold(i: int) -> None:
        await runner.runner.run("echo", i)

    def target(way: str, kind: str) -> Callable[[int], Awaitable[object]]:
        if kind == "noop":
            return noop
        if kind.startswith("cold"):
            return cold
        return guest_pool.run if way == "guest" else trio_pool.run

    async def trio_block(fn: Callable[[int], Awaitable[object]], calls: int, at_once: int
                         ) -> tuple[list[float], float]:
        """In a trio task: `calls` calls, `at_once` at a time, each timed."""
        times: list[float] = []

        async def one(i: int) -> None:
            t = time.perf_counter()
            await fn(i)
            times.append(time.perf_counter() - t)

        c = cpu_s()
        for start in range(0, calls, at_once):
            async with trio.open_nursery() as n:
                for i in range(start, min(calls, start + at_once)):
                    n.start_soon(one, i)
        return times, cpu_s() - c

    async def asyncio_block(way: str, fn: Callable[[int], Awaitable[object]], calls: int,
                            at_once: int) -> tuple[list[float], float]:
        times: list[float] = []
        bridge = thread_call if way == "thread" else functools.partial(guest_call, guest)

        async def one(i: int) -> None:
            t = time.perf_counter()
            await bridge(fn, i)
            times.append(time.perf_counter() - t)

        c = cpu_s()
        for start in range(0, calls, at_once):
            await asyncio.gather(*(one(i) for i in range(start, min(calls, start + at_once))))
        return times, cpu_s() - c

    async def measure(way: str, kind: str) -> None:
        calls, at_once = {"noop": (noop_calls, 1), "c1": (1, 1), "c8": (SIZE, SIZE),
                          "cold1": (1, 1), "cold8": (SIZE, SIZE)}[kind]
        if kind in ("c1", "c8"):
            await full(guest_pool if way == "guest" else trio_pool)
        if way == "trio":
            times, used = await thread_call(trio_block, target(way, kind), calls, at_once)
        else:
            times, used = await asyncio_block(way, target(way, kind), calls, at_once)
        lat[f"{way}/{kind}"].extend(times)
        cpu[f"{way}/{kind}"].append(used / calls)

    for kind in kinds:  # warm-up, untimed
        for way in WAYS:
            await measure(way, kind)
    for k in lat:
        lat[k].clear()
        cpu[k].clear()
    for r in range(rounds):
        order = WAYS[r % 3:] + WAYS[:r % 3]
        for kind in kinds:
            for way in order:
                await measure(way, kind)
        print(f"round {r + 1}/{rounds}", file=sys.stderr)

    stop.set_result(None)
    await guest_held
    await guest.close()
    await held.exit(None)
    del portal
    return {k: {"p50_ms": statistics.median(lat[k]) * 1000,
                "cpu_ms": statistics.mean(cpu[k]) * 1000} for k in lat}


def show(report: dict[str, dict[str, float]]) -> None:
    for kind in dict.fromkeys(k.split("/")[1] for k in report):
        base = report[f"trio/{kind}"]
        for way in WAYS:
            row = report[f"{way}/{kind}"]
            extra = "" if way == "trio" else (
                f"   facade +{row['p50_ms'] - base['p50_ms']:.3f} ms p50,"
                f" +{row['cpu_ms'] - base['cpu_ms']:.3f} ms CPU")
            print(f"{kind:4} {way:6} p50 {row['p50_ms']:8.3f} ms  CPU/call"
                  f" {row['cpu_ms']:7.3f} ms{extra}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="rounds")
    parser.add_argument("--noop-calls", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", default=",".join(KINDS),
                        help=f"the calls to time, comma-separated (of {', '.join(KINDS)})")
    parser.add_argument("--switch-interval-s", type=float, default=None,
                        help="sys.setswitchinterval: how long a thread waits for the GIL")
    args = parser.parse_args()
    if args.switch_interval_s is not None:
        sys.setswitchinterval(args.switch_interval_s)
    kinds = tuple(args.only.split(","))
    if not set(kinds) <= set(KINDS):
        parser.error(f"--only takes {', '.join(KINDS)}")
    report = asyncio.run(main(args.n, args.noop_calls, kinds))
    if args.json:
        print(json.dumps(report))
    else:
        show(report)
