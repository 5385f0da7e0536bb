"""1000 runs through a warm Runner and through a pool leave nothing (issue
40): no descriptor, process, jail dir, cgroup or host id of the parent's
grows over the churn, and nothing is left after it. Four at a time, mixed:
clean exits, a failing exit, a stdout cap, cancellations at random points.
10,000 of each are `slow`."""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING

import pytest
import trio

from conftest import cgroup_dirs, child_pids, open_fds
from support import scaled, wait_until
from trunner import Limits, Reason, RunnerError
from trunner.linux import ids

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from trunner import Result, Runner
    from trunner.protocol import ExecResult

    Exec = Callable[..., Awaitable[Result[ExecResult]]]

CONCURRENCY = 4


async def _churn(exec_: Exec, limits: Limits, n: int, *, seed: int) -> Counter[str]:
    """`n` runs, four at a time; what each ended as."""
    rng = random.Random(seed)
    capped = limits.replace(stdout_max_bytes=100)
    seen: Counter[str] = Counter()
    todo = iter(range(n))

    async def one(i: int) -> None:
        kind = i % 10
        if kind == 9:  # a cancellation at a random point of its run
            with trio.move_on_after(rng.uniform(0, 0.03)):
                await exec_(["/bin/true"])
                seen["finished before its cancel"] += 1
                return
            seen["cancelled"] += 1
            return
        try:
            if kind == 8:
                await exec_(["/bin/sh", "-c", "head -c 2000 /dev/zero"], limits=capped)
            else:
                code = 3 if kind == 7 else 0
                result = await exec_(["/bin/sh", "-c", f"exit {code}"])
                seen[f"exit {result.response.exit_code}"] += 1
        except RunnerError as e:
            seen[e.reason.value] += 1

    async def worker() -> None:
        for i in todo:
            await one(i)

    async with trio.open_nursery() as nursery:
        for _ in range(CONCURRENCY):
            nursery.start_soon(worker)
    return seen


def _check(seen: Counter[str], n: int) -> None:
    tenth = n // 10
    assert seen["exit 0"] == 7 * tenth, seen
    assert seen["exit 3"] == tenth, seen
    assert seen[Reason.STDOUT_CAP.value] == tenth, seen
    assert seen["cancelled"] + seen["finished before its cancel"] == tenth, seen
    assert sum(seen.values()) == n, seen


def _held() -> tuple[set[str], list[int], set[str]]:
    return open_fds(), child_pids(), cgroup_dirs()


async def _through_a_warm_runner(runner: Runner, jail_root: Path, n: int) -> None:
    async with runner.warm():
        server = runner._warm.server
        assert server is not None
        await runner.exec(["/bin/true"])  # trio's own descriptors opened once
        before = _held()
        seen = await _churn(runner.exec, runner.limits, n, seed=n)
        assert ids.settle(scaled(10)) == 0
        assert _held() == before  # the server, its channel: nothing more
        assert list(jail_root.iterdir()) == []
        assert (server.starts, server.losses) == (1, 0)  # type: ignore[attr-defined]
    _check(seen, n)


async def _through_a_pool(runner: Runner, jail_root: Path, n: int) -> None:
    async with runner.pool("exec", size=2) as pool:
        await pool.exec(["/bin/true"])
        seen = await _churn(pool.exec, runner.limits, n, seed=n)
        spawner = pool._spawner
        assert (spawner.starts, spawner.losses) == (1, 0)  # type: ignore[attr-defined]
        # Its idle workers (two, refilled) and the server, nothing more.
        await wait_until(lambda: pool.idle_workers == 2, 60, "the pool refilled to 2")
        assert len(child_pids()) == 3
        assert len([d for owner in jail_root.iterdir() for d in owner.iterdir()]) == 2
    _check(seen, n)


async def test_1000_runs_through_a_warm_runner_leave_nothing(
        runner: Runner, jail_root: Path) -> None:
    await _through_a_warm_runner(runner, jail_root, 1000)


async def test_1000_runs_through_a_pool_leave_nothing(runner: Runner, jail_root: Path) -> None:
    await _through_a_pool(runner, jail_root, 1000)


@pytest.mark.slow
async def test_10000_runs_through_a_warm_runner_leave_nothing(
        runner: Runner, jail_root: Path) -> None:
    await _through_a_warm_runner(runner, jail_root, 10_000)


@pytest.mark.slow
async def test_10000_runs_through_a_pool_leave_nothing(runner: Runner, jail_root: Path) -> None:
    await _through_a_pool(runner, jail_root, 10_000)
