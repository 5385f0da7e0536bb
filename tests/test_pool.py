"""Prewarmed workers: same jail, same caps, same verdict, one use each."""

from __future__ import annotations

import pytest
import trio

from conftest import child_pids
from support import pid_namespace_members, wait_until
from trunner import Reason, Runner, RunnerError


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


async def test_deadline_starts_when_the_request_is_written(runner: Runner) -> None:
    limits = runner.limits.replace(wall_time_s=1.0)
    async with runner.pool("echo", size=1, limits=limits) as pool:
        await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
        await trio.sleep(1.5)  # idle longer than the wall time
        assert (await pool.run("late")).response == "late"


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


async def test_idle_workers_are_ended_and_refilled_on_use(runner: Runner) -> None:
    async with runner.pool("echo", size=2, idle_s=1.0) as pool:
        await wait_until(lambda: pool.idle_workers == 2, 60, "2 idle workers")
        # idle_s passed: taken out of the pool...
        await wait_until(lambda: pool.idle_workers == 0, 30, "no idle worker")
        # ...and ended and reaped: the discard finishes after the count drops (a
        # dead helper stays among our children, a zombie, until the discard reaps it).
        await wait_until(lambda: not child_pids(), 10, "the ended helpers reaped")
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
