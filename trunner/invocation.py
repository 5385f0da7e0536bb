"""One invocation, in four steps that `Runner` and the pool share.

`start` makes a fresh 0700 jail dir and the backend's jail and spawns the
helper into them; `serve` supervises the started child to its end
(nursery_run.py) and frees the jail; `discard` ends a started child that
will serve nothing; `judge` turns the outcome into a response or a
`RunnerError`. The jail dir and every host resource are released on every
path, cancellation included; a jail dir that cannot be removed fails an
otherwise clean run with `cleanup_failed`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, final

import msgspec
import trio

from trunner.cleanup import make_jail_dir, remove_jail_dir
from trunner.errors import Reason, RunnerError
from trunner.helper import PROCESS_COUNT_EXIT
from trunner.jail import Jail  # noqa: TC001  annotates the Started dataclass: kept real
from trunner.nursery_run import Outcome, supervise
from trunner.protocol import HEADER_BYTES, decode_single_frame
from trunner.spawn import Child, spawn

if TYPE_CHECKING:
    from collections.abc import Iterator

    from trunner.jail import JailBackend
    from trunner.limits import Limits

#: Most stderr bytes quoted in a `RunnerError.detail`.
STDERR_EXCERPT_BYTES: Final = 2000

T = TypeVar("T")


@final
class Result(msgspec.Struct, Generic[T], frozen=True):
    """A verified response and the rules version it was produced under."""

    response: T
    rules_version: str


@dataclass(frozen=True)
class Caps:
    """What the parent enforces for one run."""

    wall_time_s: float
    stdout_max_bytes: int
    stderr_max_bytes: int

    @classmethod
    def of(cls, limits: Limits) -> Caps:
        return cls(limits.wall_time_s, limits.stdout_max_bytes, limits.stderr_max_bytes)


@dataclass(eq=False)
class Started:
    """A spawned child in its jail, not yet given its request."""

    jail_dir: str
    jail: Jail
    child: Child


async def start(
    backend: JailBackend, adapter_argv: tuple[str, ...], limits: Limits, temp_root: str | None
) -> Started:
    """Make a jail dir and a jail, and spawn the helper into them.

    Raises:
        RunnerError: `spawn_failed`, or the backend's refusal.
    """
    try:
        jail_dir = make_jail_dir(temp_root)
    except OSError as e:
        raise RunnerError(
            Reason.SPAWN_FAILED, f"cannot make the jail dir: {e.strerror} (errno {e.errno})"
        ) from None
    try:
        jail = backend.open_jail(jail_dir=jail_dir, adapter_argv=adapter_argv, limits=limits)
        try:
            return Started(jail_dir, jail, await spawn(jail.command))
        except BaseException:
            with trio.CancelScope(shield=True):
                await jail.release()
            raise
    except BaseException:
        await remove_jail_dir(jail_dir)  # the error in flight is the reason
        raise


async def serve(started: Started, frame: bytes, caps: Caps) -> Outcome:
    """Feed `frame` to a started child, see it to its end, free its jail.
    The deadline starts now."""
    deadline = trio.current_time() + caps.wall_time_s
    try:
        outcome = await supervise(
            started.child,
            frame,
            deadline=deadline,
            stdout_max_bytes=caps.stdout_max_bytes,
            stderr_max_bytes=caps.stderr_max_bytes,
        )
    finally:
        with trio.CancelScope(shield=True):
            oom_kills = started.jail.oom_kills()
            await started.jail.release()
        gone = await remove_jail_dir(started.jail_dir)
    if oom_kills:  # a breach fails the run, as a cap does, whatever the exit
        outcome.fail(Reason.MEMORY_LIMIT, f"the run went past memory_bytes: the kernel killed"
                     f" {oom_kills} of its processes")
    if not gone and outcome.exit_code == 0:  # else the run already failed: that reason wins
        outcome.fail(Reason.CLEANUP_FAILED, f"cannot remove the jail dir {started.jail_dir}")
    return outcome


async def discard(started: Started) -> None:
    """End a started child that will serve nothing (an idle pooled worker)."""
    with trio.CancelScope(shield=True):
        child = started.child
        try:
            child.kill_group()
            await child.wait_exit()
            child.reap()
            child.read_report()
            await child.aclose_streams()
            await started.jail.release()
        finally:
            await remove_jail_dir(started.jail_dir)


def judge(
    outcome: Outcome,
    backend: JailBackend,
    stdout_max_bytes: int,
    response_type: Any = Any,  # noqa: ANN401  a msgspec type form, as in Runner.run
) -> Any:  # noqa: ANN401  whatever `response_type` decodes to
    """The verdict on one finished invocation: its response, or the error."""
    code = outcome.exit_code
    if outcome.failure is not None:
        raise RunnerError(outcome.failure, outcome.detail, **_status(code))
    assert code is not None
    if outcome.report is not None:  # only the helper can write it
        reason = Reason.PROCESS_COUNT if code == PROCESS_COUNT_EXIT else Reason.SANDBOX_SETUP
        raise RunnerError(reason, outcome.report, exit_status=code if code >= 0 else None)
    excerpt = outcome.stderr[-STDERR_EXCERPT_BYTES:].decode(errors="replace").strip()
    if code < 0:
        reason, detail = backend.explain_death(-code, outcome.pid, outcome.started_us)
        if reason is Reason.KILLED_BY_SIGNAL:
            detail += f"; stderr: {excerpt}"
        raise RunnerError(reason, detail, signal=-code)
    if code != 0:
        raise RunnerError(
            Reason.NONZERO_EXIT, f"exited {code}; stderr: {excerpt}", exit_status=code
        )
    return decode_single_frame(
        outcome.stdout, response_type, max_body_bytes=max(stdout_max_bytes - HEADER_BYTES, 0)
    )


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


def _status(code: int | None) -> dict[str, int | None]:
    if code is None:
        return {}
    return {"signal": -code} if code < 0 else {"exit_status": code}
