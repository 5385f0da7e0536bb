"""One invocation: one nursery supervising one jailed child.

The process wait, the stdout drain, the stderr drain and the
deadline-scoped killer are siblings in one nursery (and the stdin feeder,
when the request did not fit the pipe at once). A deadline or a cap
breach records its reason (the first one wins) and cancels the scope; on
every path, clean exit included, the whole process group is SIGKILLed while
the leader is still unreaped, then `Child.aclose()` reaps it and waits until
nothing of the run is left. The post-exit drain join is bounded, so an
escaped descendant holding a pipe costs at most `DRAIN_GRACE_S`. Uses trio
time only, so a MockClock drives every timeout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from trunner.errors import Reason

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trunner.jail import Figures, Jail
    from trunner.spawn import Child

#: How long the drains may take to reach EOF once the child has exited and
#: its group was killed. Only a process that escaped the group can hold a
#: pipe that long.
DRAIN_GRACE_S = 1.0
#: Largest single read from a pipe.
READ_CHUNK_BYTES = 1024 * 1024
#: The closest two polls of a run's CPU time come.
MIN_CPU_POLL_S = 0.005


@dataclass(frozen=True)
class Drain:
    """One more stream `supervise` reads to its end and discards, up to
    `cap_bytes` (one byte past it is a breach, with `reason`): a streaming
    run's program output the caller left unread."""

    stream: trio.abc.ReceiveStream
    cap_bytes: int
    reason: Reason
    #: The cap as the caller set it (`cap_bytes` may be what is left of it).
    full_cap_bytes: int


@dataclass
class Outcome:
    """What happened, before anyone judges it. Holds at most cap + 1 bytes
    per stream."""

    started_us: int = 0  # CLOCK_MONOTONIC at spawn
    exit_code: int | None = None  # negative: killed by that signal
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    #: What the helper's report pipe carried (its notes, and its refusal
    #: if it refused); the jail reads it.
    report: bytes = b""
    failure: Reason | None = None
    detail: str = ""
    #: Trio seconds from the request's write to the leader's exit (or the
    #: kill that ended it).
    wall_s: float = 0.0
    #: What the run's processes had used when the parent killed them for a
    #: breach (`Jail.usage_now`), read just before the kill.
    at_kill: Figures | None = None

    def fail(self, reason: Reason, detail: str) -> None:
        """Record a failure; the first one recorded wins."""
        if self.failure is None:
            self.failure, self.detail = reason, detail


async def supervise(
    child: Child[Jail],
    request: bytes,
    *,
    deadline: float,
    stdout_max_bytes: int,
    stderr_max_bytes: int,
    drain_grace_s: float = DRAIN_GRACE_S,
    cpu_time_s: float | None = None,
    program_only: bool = False,
    streams: Sequence[Drain] = (),
) -> Outcome:
    """Feed `request`, drain both streams, and see `child` to its end.

    Returns only once the leader is reaped and its group SIGKILLed; on
    cancellation from outside, does the same before `Cancelled` propagates.
    `deadline` is absolute, on trio's clock. With `cpu_time_s`, the run's
    processes' CPU time is polled (`Jail.usage_now`) and a breach is
    `cpu_time`. Before a breach's kill, what the run used is read
    (`Outcome.at_kill`; `program_only` as in `Jail.usage_now`).
    """
    result = Outcome(started_us=child.started_us)
    began = trio.current_time()

    def breach(reason: Reason, detail: str) -> None:
        if result.failure is None:
            result.at_kill = child.jail.usage_now(child.pid, program_only=program_only)
            result.wall_s = trio.current_time() - began
        result.fail(reason, detail)
        child.kill_group()
        nursery.cancel_scope.cancel(reason=reason.value)

    # The request goes out at once, before any task starts (a pipe takes 64
    # KiB without blocking); the feeder sends the rest, if any, and closes.
    sent = 0
    try:
        sent = os.write(child.stdin.fileno(), request) if request else 0
    except BlockingIOError:
        pass
    except BrokenPipeError:  # the child is gone; its exit status will tell why
        sent = len(request)

    async def feed(scope: trio.CancelScope) -> None:
        with scope:
            try:
                async with child.stdin:
                    if sent < len(request):
                        await child.stdin.send_all(memoryview(request)[sent:])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the child stopped reading; its exit status will tell why

    async def kill_at(scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep_until(deadline)
            breach(Reason.TIMEOUT, "the wall-clock deadline passed")

    async def watch_cpu(scope: trio.CancelScope, limit: float) -> None:
        # A poll when the run could first have reached the limit at full
        # speed on every CPU: rare while far from it, close together near it.
        cpus = max(len(os.sched_getaffinity(0)), 1)
        with scope:
            used = 0.0
            while True:
                await trio.sleep(max((limit - used) / cpus, MIN_CPU_POLL_S))
                now = child.jail.usage_now(child.pid, program_only=program_only)
                used = now[0] + now[1] if now is not None else used
                if used >= limit:
                    breach(Reason.CPU_TIME, f"the run's processes used more than {limit} s"
                           " of CPU time")
                    return

    async def sample_memory(scope: trio.CancelScope, every: float) -> None:
        with scope:
            while True:
                child.jail.sample_memory()
                await trio.sleep(every)

    async def drain(
        stream: trio.abc.ReceiveStream, cap: int, buf: bytearray, reason: Reason,
        full_cap: int | None = None, keep: bool = True,
    ) -> None:
        seen = 0
        try:
            # Never ask for more than one byte past the cap.
            while chunk := await stream.receive_some(min(READ_CHUNK_BYTES, cap - seen + 1)):
                seen += len(chunk)
                if keep:
                    buf += chunk
                if seen > cap:
                    name = reason.value.removesuffix("_cap")
                    breach(reason, f"{name} went over its cap of"
                           f" {cap if full_cap is None else full_cap} bytes")
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    try:
        async with trio.open_nursery() as nursery:
            # The feeder, the killer and the watchers have nothing to do once
            # the child exits.
            until_exit = tuple(trio.CancelScope() for _ in range(4))
            if sent < len(request):
                nursery.start_soon(feed, until_exit[0])
            else:  # all of it is in the pipe: no feeder
                child.stdin.close()
            nursery.start_soon(kill_at, until_exit[1])
            if cpu_time_s is not None:
                nursery.start_soon(watch_cpu, until_exit[2], cpu_time_s)
            if child.jail.memory_sample_s is not None:  # v2 before 5.19: no peak kept
                nursery.start_soon(sample_memory, until_exit[3], child.jail.memory_sample_s)
            nursery.start_soon(drain, child.stdout, stdout_max_bytes, result.stdout,
                               Reason.STDOUT_CAP)
            nursery.start_soon(drain, child.stderr, stderr_max_bytes, result.stderr,
                               Reason.STDERR_CAP)
            for more in streams:
                nursery.start_soon(drain, more.stream, more.cap_bytes, bytearray(), more.reason,
                                   more.full_cap_bytes, False)
            await child.wait_exit()
            if result.failure is None:
                result.wall_s = trio.current_time() - began
            child.kill_group()
            for scope in until_exit:
                scope.cancel(reason="the worker exited")
            nursery.cancel_scope.deadline = trio.current_time() + drain_grace_s
        if nursery.cancel_scope.cancelled_caught:
            result.fail(
                Reason.DRAIN_TIMEOUT,
                f"a pipe stayed open {drain_grace_s} s after the worker exited"
                " and its process group was killed",
            )
    finally:
        await child.aclose()
        result.exit_code, result.report = child.exit_code, child.report
    return result
