"""The invocation contract end to end, with real children under the real jail."""

from __future__ import annotations

import os
import signal
import tracemalloc
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from conftest import child_pids
from support import (
    fails,
    group_alive,
    ignores,
    is_alive,
    is_jailed,
    jail_pid,
    live_status,
    pid_namespace_members,
    scaled,
    wait_until,
)
from trunner import ExecResult, Limits, Reason, Result, Runner, RunnerError
from trunner.protocol import encode_frame

if TYPE_CHECKING:
    from pathlib import Path

KiB = 1024


async def test_echo_round_trip(runner: Runner) -> None:
    request = {"hello": [1, 2.5, "x", b"\x00\xff"], "n": None}
    result: Result[Any] = await runner.run("echo", request)
    assert result.response == request
    assert len(result.rules_version) == 64
    int(result.rules_version, 16)


async def test_exec_mode_runs_a_program_in_the_jail(runner: Runner) -> None:
    result = await runner.exec(["/bin/sh", "-c", "cat; echo err >&2; exit 3"], stdin=b"in\n")
    elapsed = result.response.elapsed_s
    assert 0 < elapsed < scaled(20)
    usage = result.response.usage
    assert usage is not None
    assert usage == result.usage
    assert usage.wall_s == elapsed
    assert result.response == ExecResult(exit_code=3, signal=None, stdout=b"in\n", stderr=b"err\n",
                                         elapsed_s=elapsed, usage=usage)


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("children:frame_then_byte", Reason.TRAILING_BYTES),
        ("children:two_frames", Reason.TRAILING_BYTES),
        ("children:half_header", Reason.TRUNCATED_FRAME),
    ],
)
async def test_frame_violations(runner: Runner, mode: str, reason: Reason) -> None:
    assert (await fails(runner, mode, {"a": 1})).reason is reason


async def test_huge_length_prefix_is_oversized_without_allocating(runner: Runner) -> None:
    limits = runner.limits.replace(stdout_max_bytes=1 * KiB)
    tracemalloc.start()
    try:
        e = await fails(runner, "children:huge_length", limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.reason is Reason.OVERSIZED_FRAME
    assert str(2**32 - 1) in e.detail
    assert peak < 16 * 1024 * KiB, peak  # the header declares 4 GiB


async def test_frame_then_exit_1_is_nonzero_exit(runner: Runner) -> None:
    e = await fails(runner, "children:frame_then_exit1", "x")
    assert (e.reason, e.exit_status) == (Reason.NONZERO_EXIT, 1)


async def test_exception_in_mode_is_nonzero_exit_with_excerpt(runner: Runner) -> None:
    e = await fails(runner, "children:raise_error")
    assert e.reason is Reason.NONZERO_EXIT
    assert "boom from the child" in e.detail


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL])
async def test_frame_then_signal_is_killed_by_signal(runner: Runner, sig: int) -> None:
    e = await fails(runner, "children:frame_then_signal", int(sig))
    assert (e.reason, e.signal) == (Reason.KILLED_BY_SIGNAL, sig)
    assert signal.Signals(sig).name in e.detail


@pytest.mark.slow
async def test_deadline_is_the_wall_time_on_the_trio_clock(
    runner: Runner, autojump_clock: trio.testing.MockClock
) -> None:
    # autojump: the deadline may pass before the child is even up (P19); the
    # real-clock test below shows a running child is killed.
    from trunner.linux.backend import GONE_BOUND_S
    from trunner.nursery_run import DRAIN_GRACE_S

    limits = runner.limits.replace(wall_time_s=5.0)
    start = trio.current_time()
    e = await fails(runner, "children:sleep_ignoring_term", limits=limits)
    assert e.reason is Reason.TIMEOUT
    # The deadline fires at 5.0 on this clock. What follows it is teardown's
    # own bounded waits (the jail gone, the pipes drained, then each of the
    # run's cgroups removed: 200 polls of 5 ms), and the autojump clock jumps
    # through them whenever the real kill takes longer than nothing (a busy
    # host): up to their bounds, not 0.5 s.
    teardown_s = GONE_BOUND_S + DRAIN_GRACE_S + 2 * 1.0
    assert 5.0 <= trio.current_time() - start <= 5.0 + teardown_s


@pytest.mark.slow
async def test_deadline_sigkills_a_running_child_that_ignores_sigterm(runner: Runner) -> None:
    seen: list[int] = []
    ignoring: list[int] = []

    async def watch_it_ignore_sigterm() -> None:
        seen.extend(await wait_until(child_pids, 30, "a child process"))
        # The helper's child in the PID namespace.
        jail = await wait_until(lambda: jail_pid(seen[0]), 30, "the jail's pid 2")
        seen.append(jail)

        def ignoring_sigterm() -> bool:
            status = live_status(jail)
            return is_jailed(status) and ignores(status, signal.SIGTERM)

        await wait_until(ignoring_sigterm, 30, "the child jailed, ignoring SIGTERM")
        ignoring.append(seen[0])

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_it_ignore_sigterm)
        e = await fails(
            runner, "children:sleep_ignoring_term", limits=runner.limits.replace(wall_time_s=4.0)
        )
    assert e.reason is Reason.TIMEOUT
    assert ignoring == seen[:1], "the child was not seen running with SIGTERM ignored"
    assert not any(is_alive(p) or group_alive(p) for p in seen)
    assert trio.current_time() - start < scaled(30)  # a generous bound on a 4 s deadline


@pytest.mark.parametrize(("fd", "reason"), [(1, Reason.STDOUT_CAP), (2, Reason.STDERR_CAP)])
async def test_cap_crossed_by_one_byte(runner: Runner, fd: int, reason: Reason) -> None:
    cap = 100 * KiB
    limits = runner.limits.replace(stdout_max_bytes=cap, stderr_max_bytes=cap)
    e = await fails(runner, "children:write_then_sleep", {"n": cap + 1, "fd": fd}, limits=limits)
    assert e.reason is reason
    # The exact cap is not a breach: the child then hangs until the deadline.
    limits = limits.replace(wall_time_s=3.0)
    e = await fails(runner, "children:write_then_sleep", {"n": cap, "fd": fd}, limits=limits)
    assert e.reason is Reason.TIMEOUT


async def test_output_of_exactly_the_cap_succeeds(runner: Runner) -> None:
    cap = 4 * KiB
    limits = runner.limits.replace(stdout_max_bytes=cap, stderr_max_bytes=cap)
    result: Result[Any] = await runner.run("children:exact_stdout", cap, limits=limits)
    assert len(encode_frame(result.response)) == cap
    result = await runner.run("children:stderr_then_reply", {"n": cap}, limits=limits)
    assert result.response == "ok"


async def test_grandchild_holding_stdout_is_killed_after_clean_exit(runner: Runner) -> None:
    result: Result[str] = await runner.run("children:grandchild_holds_stdout")
    assert result.response.startswith("pid:[")
    assert pid_namespace_members(result.response) == []


async def test_caller_cancellation_kills_group_and_removes_jail(
    runner: Runner, jail_root: Path
) -> None:
    seen: list[int] = []
    jail_dirs: list[Path] = []

    async def cancel_once_jailed(scope: trio.CancelScope) -> None:
        seen.extend(await wait_until(child_pids, 60, "a child process"))
        await wait_until(lambda: is_jailed(live_status(seen[0])), 30, "the helper jailed")
        jail_dirs.extend(jail_root.iterdir())
        scope.cancel()

    with trio.fail_after(scaled(60)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_jailed, nursery.cancel_scope)
            await runner.run("children:sleep", 1000)
    assert nursery.cancel_scope.cancelled_caught
    assert len(jail_dirs) == 1, "the child was running in its jail dir"
    assert not any(is_alive(p) or group_alive(p) for p in seen)
    assert not jail_dirs[0].exists()


@pytest.fixture
def unspawnable(jail_root: Path) -> Runner:
    """A runner that fails `spawn_failed` as soon as it makes a jail dir or spawns."""
    return Runner(temp_root=str(jail_root / "missing"), worker="/nonexistent/trunner-worker")


async def test_unknown_mode_is_refused_before_spawn(runner: Runner, unspawnable: Runner) -> None:
    assert (await fails(unspawnable, "echo", 1)).reason is Reason.SPAWN_FAILED  # the control
    for mode in ("nope", "no_such_module_xyz:fn", "bad spec:"):
        for r in (runner, unspawnable):
            e = await fails(r, mode)
            assert e.reason is Reason.UNKNOWN_MODE, (mode, e.reason, e.detail)


async def test_unencodable_request_is_refused_before_spawn(
    runner: Runner, unspawnable: Runner
) -> None:
    assert (await fails(unspawnable, "echo", 1)).reason is Reason.SPAWN_FAILED  # the control
    for r in (runner, unspawnable):
        e = await fails(r, "echo", object())
        assert e.reason is Reason.BAD_REQUEST, (e.reason, e.detail)


def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="wall_time_s"):
        Limits(wall_time_s=0)
    with pytest.raises(TypeError):
        Runner(limits={"wall_time_s": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("inside", ["nothing", "not-executable"])
def test_no_worker_inside_the_package_is_worker_not_found(
    jail_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inside: str
) -> None:
    # A package dir with no usable trunner-worker in it.
    # (An explicit worker path that is missing is spawn_failed: test_faults.py.)
    import trunner.worker

    here = tmp_path / "trunner" / "worker"
    here.mkdir(parents=True)
    if inside == "not-executable":
        (here / "trunner-worker").write_text("#!/bin/sh\n")
        (here / "trunner-worker").chmod(0o644)
    monkeypatch.setattr(trunner.worker, "__file__", str(here / "__init__.py"))
    with pytest.raises(RunnerError) as info:
        Runner(temp_root=str(jail_root))
    assert info.value.reason is Reason.WORKER_NOT_FOUND
    assert info.value.detail == f"no executable trunner-worker at {here / 'trunner-worker'}"
    assert child_pids() == []
    assert os.listdir(jail_root) == []
