"""Prewarmed workers: same jail, same caps, same verdict, one use each."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from conftest import child_pids
from support import pid_namespace_members, wait_until
from trunner import Reason, Runner, RunnerError
from trunner.linux.forkclient import ForkServer


async def test_each_request_gets_its_own_prewarmed_jailed_process(runner: Runner) -> None:
    async with runner.pool("children:status", size=2) as pool:
        await wait_until(lambda: pool.idle_workers == 2, 60, "2 idle workers")
        first = (await pool.run(None)).response
        second = (await pool.run(None)).response
    assert first["pidns"] != second["pidns"]  # each its own jail (each is pid 2 in it)
    for status in (first, second):
        assert status["pid"] == 2
        assert status["pgid"] == 0  # the group's leader, the helper, is outside
        assert "Seccomp:\t2" in status["status"]
        assert "NoNewPrivs:\t1" in status["status"]
        assert pid_namespace_members(status["pidns"]) == []
    assert child_pids() == []


async def test_deadline_starts_when_the_request_is_written(
    runner: Runner, mock_clock: trio.testing.MockClock
) -> None:
    """A worker idle longer than its wall time still serves. The deadline
    is on trio's clock (nursery_run.supervise), and a built-in mode has no
    other: a clock jump is that idle time, without waiting it out. Rate 1:
    the clock runs as the real one besides, so every bound of trunner's and
    of the test's own still holds."""
    mock_clock.rate = 1.0
    wall = runner.limits.wall_time_s
    async with runner.pool("echo", size=1) as pool:  # idle_s 60: no idle end below
        await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
        idle_since = trio.current_time()
        mock_clock.jump(wall + 1)  # idle longer than the wall time
        assert trio.current_time() - idle_since > wall
        result = await pool.run("late")
        assert result.response == "late"
        assert result.usage is not None
        assert result.usage.wall_s < wall  # counted from the request's write, not the spawn


async def test_pooled_workers_keep_every_reason(runner: Runner) -> None:
    async with runner.pool("children:frame_then_byte", size=1) as pool:
        await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
        with pytest.raises(RunnerError) as info:
            await pool.run({"a": 1})
        assert info.value.reason is Reason.TRAILING_BYTES
    limits = runner.limits.replace(stdout_max_bytes=1000)
    async with runner.pool("children:write_then_sleep", size=1, limits=limits) as pool:
        await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
        with pytest.raises(RunnerError) as info:
            await pool.run({"n": 1001, "fd": 1})
        assert info.value.reason is Reason.STDOUT_CAP


async def test_idle_workers_are_ended_and_refilled_on_use(
    runner: Runner, mock_clock: trio.testing.MockClock
) -> None:
    """idle_s is on trio's clock: a jump past it ends the idle workers and
    the fork server, however long the host took to warm them (a real idle_s
    short enough to wait out would be shorter than a loaded host's warm-up,
    and the pool would never be seen full). Rate 1: real time besides."""
    mock_clock.rate = 1.0
    async with runner.pool("echo", size=2, idle_s=60.0) as pool:
        await wait_until(lambda: pool.idle_workers == 2, 60, "2 idle workers")
        assert child_pids()
        mock_clock.jump(60)  # idle_s passed: taken out of the pool...
        await wait_until(lambda: pool.idle_workers == 0, 30, "no idle worker")
        # ...and ended and reaped, the server too: the discard finishes after the
        # count drops (a dead helper stays among our children, a zombie, until
        # the discard reaps it).
        await wait_until(lambda: not child_pids(), 10, "the ended helpers and server reaped")
        assert isinstance(pool._spawner, ForkServer)
        assert pool._spawner.pid is None
        assert (await pool.run(1)).response == 1  # served cold, wakes the refill
        await wait_until(lambda: pool.idle_workers == 2, 60, "2 idle workers")


async def test_pool_outside_async_with_is_refused(runner: Runner) -> None:
    pool = runner.pool("echo")
    with pytest.raises(RuntimeError):
        await pool.run(1)


async def test_an_exec_pool_keeps_the_exec_caps_to_the_byte(runner: Runner) -> None:
    import sys

    limits = runner.limits.replace(stdout_max_bytes=1000)
    argv = [sys.executable, "-c", "import os, sys; os.write(1, b'o' * int(sys.argv[1]))"]
    async with runner.pool("exec", size=1, limits=limits) as pool:
        assert (await pool.exec([*argv, "1000"])).response.stdout == b"o" * 1000
        with pytest.raises(RunnerError) as info:
            await pool.exec([*argv, "1001"])
        assert info.value.reason is Reason.STDOUT_CAP
        with pytest.raises(RuntimeError, match=r"pool\.exec"):
            await pool.run({"argv": ["true"]})
