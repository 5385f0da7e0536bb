"""One invocation: one nursery supervising one jailed child.

The process wait, the stdout drain, the stderr drain, the stdin feeder and
the deadline-scoped killer are siblings in one nursery. A deadline or a cap
breach records its reason (the first one wins) and cancels the scope; on
every path, clean exit included, the whole process group is SIGKILLed while
the leader is still unreaped, then the leader is reaped. The post-exit drain
join is bounded, so an escaped descendant holding a pipe costs at most
`DRAIN_GRACE_S`. Uses trio time only, so a MockClock drives every timeout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import trio

from trunner.errors import Reason
from trunner.spawn import Child

#: How long the drains may take to reach EOF once the child has exited and
#: its group was killed. Only a process that escaped the group can hold a
#: pipe that long.
DRAIN_GRACE_S = 1.0
#: Largest single read from a pipe.
READ_CHUNK_BYTES = 1024 * 1024


@dataclass
class Outcome:
    """What happened, before anyone judges it. Holds at most cap + 1 bytes
    per stream."""

    pid: int = 0
    started_us: int = 0  # CLOCK_MONOTONIC at spawn
    exit_code: int | None = None  # negative: killed by that signal
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    failure: Reason | None = None
    detail: str = ""

    def fail(self, reason: Reason, detail: str) -> None:
        """Record a failure; the first one recorded wins."""
        if self.failure is None:
            self.failure, self.detail = reason, detail


async def supervise(
    child: Child,
    request: bytes,
    *,
    deadline: float,
    stdout_max_bytes: int,
    stderr_max_bytes: int,
    drain_grace_s: float = DRAIN_GRACE_S,
) -> Outcome:
    """Feed `request`, drain both streams, and see `child` to its end.

    Returns only once the leader is reaped and its group SIGKILLed; on
    cancellation from outside, does the same before `Cancelled` propagates.
    `deadline` is absolute, on trio's clock.
    """
    result = Outcome(pid=child.pid, started_us=child.started_us)
    try:
        async with trio.open_nursery() as nursery:
            # The feeder and the killer have nothing to do once the child exits.
            until_exit = (trio.CancelScope(), trio.CancelScope())
            nursery.start_soon(_until_exit, until_exit[0], _feed, child.stdin, request)
            nursery.start_soon(
                _until_exit, until_exit[1], _kill_at, deadline, child, result, nursery.cancel_scope
            )
            nursery.start_soon(
                _drain, child.stdout, stdout_max_bytes, result.stdout, Reason.STDOUT_CAP,
                child, result, nursery.cancel_scope,
            )
            nursery.start_soon(
                _drain, child.stderr, stderr_max_bytes, result.stderr, Reason.STDERR_CAP,
                child, result, nursery.cancel_scope,
            )
            await child.wait_exit()
            child.kill_group()
            for scope in until_exit:
                scope.cancel()
            nursery.cancel_scope.deadline = trio.current_time() + drain_grace_s
        if nursery.cancel_scope.cancelled_caught:
            result.fail(
                Reason.DRAIN_TIMEOUT,
                f"a pipe stayed open {drain_grace_s} s after the worker exited"
                " and its process group was killed",
            )
    finally:
        with trio.CancelScope(shield=True):
            child.kill_group()
            await child.wait_exit()
            result.exit_code = os.waitstatus_to_exitcode(child.reap())
            await child.aclose_streams()
    return result


async def _until_exit(scope: trio.CancelScope, fn, *args) -> None:  # type: ignore[no-untyped-def]
    with scope:
        await fn(*args)


async def _feed(stdin: trio.lowlevel.FdStream, request: bytes) -> None:
    try:
        async with stdin:
            await stdin.send_all(request)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the child stopped reading; its exit status will tell why


async def _kill_at(
    deadline: float, child: Child, result: Outcome, scope: trio.CancelScope
) -> None:
    await trio.sleep_until(deadline)
    result.fail(Reason.TIMEOUT, "the wall-clock deadline passed")
    child.kill_group()
    scope.cancel()


async def _drain(
    stream: trio.lowlevel.FdStream,
    cap: int,
    buf: bytearray,
    reason: Reason,
    child: Child,
    result: Outcome,
    scope: trio.CancelScope,
) -> None:
    try:
        # Never ask for more than one byte past the cap.
        while chunk := await stream.receive_some(min(READ_CHUNK_BYTES, cap - len(buf) + 1)):
            buf += chunk
            if len(buf) > cap:
                result.fail(reason, f"{reason.value.split('_')[0]} went over its cap of {cap} bytes")
                child.kill_group()
                scope.cancel()
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
