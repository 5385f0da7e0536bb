"""The pipeline of one invocation: start, serve, judge. `Runner` and the pool
both go through `invoke`.

`start` opens a jail (a fresh 0700 jail dir and the backend's jail in it)
and spawns the helper into it; `serve` supervises the started child to its
end (nursery_run.py) and closes the jail; `discard` ends a started child
that will serve nothing; `judge` turns the outcome into a response or a
`RunnerError`. The jail dir and every host resource are released on every
path, cancellation included; a jail dir that cannot be removed fails an
otherwise clean run with `cleanup_failed`.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, final

import msgspec
import trio

from trunner.backend import close_jail, open_jail
from trunner.errors import CAPTURED_REASONS, Reason, RunnerError
from trunner.jail import Jail  # noqa: TC001  annotates Started
from trunner.nursery_run import Drain, Outcome, supervise
from trunner.output import CapturedOutput
from trunner.protocol import HEADER_BYTES, ExecResult, Usage, decode_single_frame, encode_frame
from trunner.spawn import Child  # noqa: TC001  annotates Started

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from trunner.jail import Figures, JailBackend
    from trunner.limits import Limits
    from trunner.spawn import Spawner

#: Most stderr bytes quoted in a `RunnerError.detail`.
STDERR_EXCERPT_BYTES: Final = 2000

T = TypeVar("T")


@final
class Result(msgspec.Struct, Generic[T], frozen=True):
    """A verified response, the rules version it was produced under, and
    what the run used (`Usage`: for `exec` the program's tree, for a
    `run()` mode the adapter process's own figures; None where the host
    could not measure)."""

    response: T
    rules_version: str
    usage: Usage | None = None


@dataclass(frozen=True)
class Caps:
    """What the parent enforces for one run."""

    wall_time_s: float
    stdout_max_bytes: int
    stderr_max_bytes: int
    #: The run's CPU time, polled by the parent (a `run()` mode: the adapter
    #: is the program); None where the adapter bounds its program (`exec`).
    cpu_time_s: float | None = None
    #: What the parent measures at a kill: the program's tree without the
    #: adapter (`exec`), or with it.
    program_only: bool = False

    @classmethod
    def of(cls, limits: Limits) -> Caps:
        return cls(limits.wall_time_s, limits.stdout_max_bytes, limits.stderr_max_bytes,
                   limits.cpu_time_s)


@dataclass(eq=False)
class Started:
    """A spawned child in its jail, not yet given its request."""

    jail: Jail
    child: Child[Jail]


async def start(backend: JailBackend, adapter_argv: Sequence[str], limits: Limits,
                temp_root: str | None, spawner: Spawner, *, stdio: str = "pipes") -> Started:
    """Open a jail for `spawner` and start its first stage through it (with
    `stdio` other than "pipes", a streaming run: `Spawner.spawn`).

    Raises:
        RunnerError: `spawn_failed`, or the backend's refusal.
    """
    jail = await open_jail(backend, adapter_argv, limits, temp_root, spawner.in_process, stdio)
    try:
        return Started(jail, await spawner.spawn(jail, stdio=stdio))
    except BaseException:
        await close_jail(jail)
        raise


async def serve(started: Started, frame: bytes, caps: Caps,
                *, streams: Sequence[Drain] = ()) -> Outcome:
    """Feed `frame` to a started child, see it to its end, close its jail.
    The deadline starts now. `streams`: more pipes to drain, each capped
    (`supervise`)."""
    deadline = trio.current_time() + caps.wall_time_s
    try:
        started.jail.admit(len(frame))
        outcome = await supervise(
            started.child,
            frame,
            deadline=deadline,
            stdout_max_bytes=caps.stdout_max_bytes,
            stderr_max_bytes=caps.stderr_max_bytes,
            cpu_time_s=caps.cpu_time_s,
            program_only=caps.program_only,
            streams=streams,
        )
    finally:
        oom_kills = started.jail.oom_kills()
        gone = await close_jail(started.jail)
    kills, trunners_side = oom_kills
    if kills:  # a breach fails the run, as a cap does, whatever the exit
        where = ("the run's own bound (trunner's side: its adapter, request and output"
                 " buffers), not the program's memory_bytes," if trunners_side
                 else "memory_bytes:")
        outcome.fail(Reason.MEMORY_LIMIT, f"the run went past {where} the kernel killed"
                     f" {kills} of its processes")
    if not gone and outcome.exit_code == 0:  # else the run already failed: that reason wins
        outcome.fail(Reason.CLEANUP_FAILED, f"cannot remove the jail dir {started.jail.jail_dir}")
    return outcome


async def discard(started: Started) -> None:
    """End a started child that will serve nothing (an idle pooled worker)."""
    try:
        await started.child.aclose()
    finally:
        await close_jail(started.jail)


def judge(outcome: Outcome, jail: Jail, stdout_max_bytes: int,
          response_type: Any = Any) -> Any:  # noqa: ANN401  a msgspec type form, and its value
    """The verdict on one finished invocation: its response, or the error."""
    code = outcome.exit_code
    if outcome.failure is not None:
        exit_status, signal = _status(code)
        raise RunnerError(outcome.failure, outcome.detail, exit_status=exit_status,
                          signal=signal,
                          usage=failed_usage(outcome, jail, stdout_max_bytes, response_type))
    assert code is not None
    failure = jail.explain(code, outcome.report, outcome.started_us)
    excerpt = outcome.stderr[-STDERR_EXCERPT_BYTES:].decode(errors="replace").strip()
    if failure is not None:
        if failure.reason is Reason.KILLED_BY_SIGNAL:
            failure = dataclasses.replace(failure, detail=f"{failure.detail}; stderr: {excerpt}")
        error = failure.error()
        error.usage = failed_usage(outcome, jail, stdout_max_bytes, response_type)
        raise error
    if code != 0:
        raise RunnerError(
            Reason.NONZERO_EXIT, f"exited {code}; stderr: {excerpt}", exit_status=code,
            usage=failed_usage(outcome, jail, stdout_max_bytes, response_type),
        )
    return decode_single_frame(
        outcome.stdout, response_type, max_body_bytes=max(stdout_max_bytes - HEADER_BYTES, 0)
    )


def failed_usage(outcome: Outcome, jail: Jail, stdout_max_bytes: int,
                 response_type: Any) -> Usage | None:  # noqa: ANN401  as in judge
    """The usage a failed run still reports: an `exec` adapter's frame, if
    it wrote one (it ends the program before it reports); else, for a
    `run()` mode, what the jail read after its end (`Jail.final_usage`);
    else what the parent read just before its kill
    (`Outcome.at_kill`); else None."""
    if response_type is ExecResult:
        reply = exec_reply(outcome, stdout_max_bytes)
        if reply is not None and reply.usage is not None:
            return exec_usage(reply.usage, jail)
    else:
        usage = run_usage(outcome, jail)
        if usage is not None:
            return usage
    return _usage(outcome.at_kill, outcome.wall_s)


def exec_reply(outcome: Outcome, stdout_max_bytes: int) -> ExecResult | None:
    """The `exec` adapter's reply in a failed run's stdout, if it wrote one
    whole (it ends its program for a limit, then reports), else None."""
    try:
        reply: ExecResult = decode_single_frame(
            outcome.stdout, ExecResult, max_body_bytes=max(stdout_max_bytes - HEADER_BYTES, 0))
    except RunnerError:
        return None
    return reply


def attach_output(error: RunnerError, reply: ExecResult | None, limits: Limits) -> None:
    """`capture_on_failure`: give a limit's `error` the program's output, as
    its adapter reported it in `reply` (each stream cut to its cap, marked
    if cut), or say in its detail why there is none. Other reasons are left
    as they are: they carry no output."""
    if error.reason not in CAPTURED_REASONS:
        return
    if reply is None:
        error.detail += ("; no output captured: the adapter wrote no reply (it was ended"
                         " before it could report: the parent's backstop deadline, a kill"
                         " of trunner's side of the run)")
        error.args = (f"{error.detail} [{error.reason}]",)
        return
    error.output = CapturedOutput.within(reply.stdout, reply.stderr,
                                         stdout_max_bytes=limits.stdout_max_bytes,
                                         stderr_max_bytes=limits.stderr_max_bytes)


def exec_usage(usage: Usage | None, jail: Jail) -> Usage | None:
    """An `exec` adapter's usage, with the peak the parent sampled where the
    kernel keeps none of the program's cgroup (`Jail.sample_memory`): the
    adapter then had only its tree's largest `ru_maxrss`."""
    sampled = jail.sample_memory()
    if usage is None or sampled is None or usage.memory_source != "max_rss":
        return usage
    return msgspec.structs.replace(usage, memory_source="sampled",
                                   peak_memory_bytes=max(sampled, usage.peak_memory_bytes))


def run_usage(outcome: Outcome, jail: Jail) -> Usage | None:
    """A `run()` mode's usage (`Jail.final_usage`: its program's cgroup, or
    the adapter's own rusage), over the wall time the parent saw from the
    request's write to the adapter's end."""
    return _usage(jail.final_usage(outcome.report), outcome.wall_s)


def _usage(figures: Figures | None, wall_s: float) -> Usage | None:
    if figures is None:
        return None
    return Usage(wall_s=wall_s, cpu_user_s=figures.user_s, cpu_sys_s=figures.system_s,
                 peak_memory_bytes=figures.peak_bytes, cpu_source=figures.cpu_source,
                 memory_source=figures.memory_source)


async def invoke(
    backend: JailBackend, adapter_argv: Sequence[str], limits: Limits, temp_root: str | None,
    request: object, caps: Caps, response_type: Any = Any,  # noqa: ANN401  as in judge
    *, spawner: Spawner, started: Started | None = None, capture_on_failure: bool = False,
) -> Result[Any]:
    """One invocation: `request` served by `started` (a prewarmed child) or
    by a child started now, judged. Nothing but a `RunnerError` (or the
    caller's cancellation) leaves it. With `capture_on_failure` (`exec`
    only), a limit's error carries the output the adapter reported
    (`attach_output`)."""
    with only_runner_errors():
        try:
            await trio.lowlevel.checkpoint_if_cancelled()  # nothing starts in a cancelled scope
            frame = encode_frame(request)
            version = backend.rules_version(limits)
        except BaseException:
            if started is not None:  # a prewarmed child that will serve nothing
                await discard(started)
            raise
        if started is None:
            started = await start(backend, adapter_argv, limits, temp_root, spawner)
        outcome = await serve(started, frame, caps)
        try:
            response = judge(outcome, started.jail, caps.stdout_max_bytes, response_type)
        except RunnerError as e:
            if capture_on_failure and response_type is ExecResult:
                attach_output(e, exec_reply(outcome, caps.stdout_max_bytes), limits)
            raise
        if response_type is not ExecResult:
            return Result(response, version, run_usage(outcome, started.jail))
        usage = exec_usage(response.usage, started.jail)
        if usage is not response.usage:
            response = msgspec.structs.replace(response, usage=usage)
        return Result(response, version, usage)


def require_trio(api: str, asyncio_api: str) -> None:
    """Refuse a call awaited outside a trio task (`not_in_trio`), naming the
    asyncio API to use instead. A task's, not the run's: an asyncio task on
    a thread that hosts a trio guest run sees that run's token.

    Raises:
        RunnerError: `not_in_trio`.
    """
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        raise RunnerError(Reason.NOT_IN_TRIO, f"{api} was awaited outside a trio task (from"
                          f" asyncio?): asyncio callers use {asyncio_api}, which takes the same"
                          " arguments") from None


@contextmanager
def only_runner_errors() -> Iterator[None]:
    """The contract: nothing but a `RunnerError` (or the caller's own
    cancellation, a BaseException) leaves an invocation. Anything else is a
    bug in trunner, reported as `internal_error` with the cause chained."""
    try:
        yield
    except RunnerError:
        raise
    except Exception as e:
        raise RunnerError(Reason.INTERNAL_ERROR, f"{type(e).__name__}: {e}") from e


def _status(code: int | None) -> tuple[int | None, int | None]:
    """The exit status and the signal an exit code means."""
    if code is None:
        return None, None
    return (None, -code) if code < 0 else (code, None)
