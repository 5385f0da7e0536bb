"""The one error type of trunner and its machine-readable reasons.

Pure: imports nothing from trunner and nothing heavy. `Reason` values are API
(callers match on them; the README names them, docs/api.md explains each);
the text is for people.
A `RunnerError` never carries a partial result. Its `.output` is None unless
the caller asked for it (`capture_on_failure`): then, for a limit, what the
program printed before it, as the adapter reported it (never a response).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from trunner.output import CapturedOutput
    from trunner.usage import Usage


class Reason(enum.StrEnum):
    """Why an invocation produced no result. The values are stable API."""

    # Limits the parent enforces.
    TIMEOUT = "timeout"
    #: The program's whole tree went past `cpu_time_s` of CPU (user + system).
    CPU_TIME = "cpu_time"
    STDOUT_CAP = "stdout_cap"
    STDERR_CAP = "stderr_cap"
    #: `exec`'s collect patterns matched more than `EXEC_COLLECT_MAX_FILES` files.
    TOO_MANY_FILES = "too_many_files"
    DRAIN_TIMEOUT = "drain_timeout"
    MEMORY_LIMIT = "memory_limit"
    # The child's end.
    NONZERO_EXIT = "nonzero_exit"
    KILLED_BY_SIGNAL = "killed_by_signal"
    SYSCALL_DENIED = "syscall_denied"
    # The one-frame protocol.
    NO_FRAME = "no_frame"
    TRUNCATED_FRAME = "truncated_frame"
    OVERSIZED_FRAME = "oversized_frame"
    TRAILING_BYTES = "trailing_bytes"
    BAD_FRAME = "bad_frame"
    # Before or while starting the child.
    SPAWN_FAILED = "spawn_failed"
    WORKER_NOT_FOUND = "worker_not_found"
    UNKNOWN_MODE = "unknown_mode"
    BAD_REQUEST = "bad_request"
    SANDBOX_SETUP = "sandbox_setup"
    PROCESS_COUNT = "process_count"
    PROCESS_LIMIT_UNAVAILABLE = "process_limit_unavailable"
    #: A root caller's range of host ids is used by something else on the
    #: host (a user, a group, a subordinate range, a process): `Runner()`.
    HOST_IDS_IN_USE = "host_ids_in_use"
    #: Every host id of the range is taken by a concurrent run (see
    #: `trunner.linux.ids`): refused, never shared.
    HOST_IDS_EXHAUSTED = "host_ids_exhausted"
    UNSUPPORTED_PLATFORM = "unsupported_platform"
    #: trio's API awaited outside a trio task (from asyncio: `trunner.aio`).
    NOT_IN_TRIO = "not_in_trio"
    #: A session (`Runner.session`) ended before or during the command:
    #: its `idle_s` or `lifetime_s` passed, its `async with` ended, or its
    #: jail did (the detail says which).
    SESSION_ENDED = "session_ended"
    # After the child.
    CLEANUP_FAILED = "cleanup_failed"
    # Beyond one host (trunner.ray).
    #: The Ray node (its raylet, or the actor holding its pool) was lost
    #: with the call in flight: the run may or may not have executed.
    NODE_LOST = "node_lost"
    # A bug in trunner, reported as a RunnerError (the cause is chained).
    INTERNAL_ERROR = "internal_error"


@final
class RunnerError(Exception):
    """An invocation failed closed.

    Attributes:
        reason: what went wrong, as a `Reason`.
        detail: one human-readable line; may hold a bounded stderr excerpt.
        exit_status: the child's exit code, when it exited.
        signal: the signal number that killed the child, when one did.
        usage: what the program used before it ended (`trunner.Usage`), for
            every failure after it started; None only when nothing ran (or
            the figures were lost: see docs/design.md, "Usage").
        output: with `exec(..., capture_on_failure=True)` and a limit's
            reason (`CAPTURED_REASONS`), the program's stdout and stderr
            before the failure, each within its cap (`CapturedOutput`),
            where its adapter reported them; else None (`detail` then says
            why). Never decoded, never a response.
    """

    def __init__(
        self,
        reason: Reason,
        detail: str,
        *,
        exit_status: int | None = None,
        signal: int | None = None,
        usage: Usage | None = None,
        output: CapturedOutput | None = None,
    ) -> None:
        super().__init__(f"{detail} [{reason}]")
        self.reason = reason
        self.detail = detail
        self.exit_status = exit_status
        self.signal = signal
        self.usage = usage
        self.output = output

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self.reason, self.detail, self.exit_status, self.signal, self.usage,
                           self.output))


#: The reasons a `RunnerError` may carry `.output` for, when asked: the
#: limits the `exec` adapter ends a program for and still reports.
CAPTURED_REASONS: frozenset[Reason] = frozenset({
    Reason.TIMEOUT, Reason.CPU_TIME, Reason.MEMORY_LIMIT, Reason.STDOUT_CAP,
    Reason.STDERR_CAP, Reason.TOO_MANY_FILES})


def _rebuild(
    reason: Reason, detail: str, exit_status: int | None, signal: int | None,
    usage: Usage | None = None, output: CapturedOutput | None = None,
) -> RunnerError:
    return RunnerError(reason, detail, exit_status=exit_status, signal=signal, usage=usage,
                       output=output)
