"""`Runner`: runs worker modes under the platform jail.

One call to `run()` is one invocation: a fresh 0700 temp dir as the jail,
the backend's jailed command, one supervised child (nursery_run.py), then a
verdict: a response only from a child that exited 0 after writing exactly
one complete frame, otherwise a `RunnerError`. The jail dir and every host
resource are released on every path, cancellation included.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import re
import signal
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, final

import msgspec
import trio

from trunner import jail as _jail
from trunner.adapters import BUILTIN_MODES
from trunner.cleanup import make_jail_dir, remove_jail_dir
from trunner.errors import Reason, RunnerError
from trunner.helper import PROCESS_COUNT_EXIT, SANDBOX_SETUP_EXIT
from trunner.limits import Limits
from trunner.nursery_run import Outcome, supervise
from trunner.protocol import HEADER_BYTES, ExecRequest, ExecResult, decode_single_frame, encode_frame
from trunner.spawn import Child, spawn
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from trunner.pool import WorkerPool

T = TypeVar("T")

#: Most stderr bytes quoted in a `RunnerError.detail`.
STDERR_EXCERPT_BYTES: Final = 2000
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@final
class Result(msgspec.Struct, Generic[T], frozen=True):
    """A verified response and the rules version it was produced under."""

    response: T
    rules_version: str


@final
class Runner:
    """Runs worker modes under the platform jail.

    Args:
        limits: default limits for every run (a run may pass its own).
        import_paths: directories user modes are imported from; the jail
            may read them and they become the worker's PYTHONPATH.
        temp_root: where jail dirs are made (default: the system temp dir).
        worker: the worker binary (default: `locate_worker()`).
        provider: configure the provider profile (`ports`, `hosts`,
            `read_only`; see `trunner.profile.ProviderConfig`) instead of the
            default no-network profile. Checked here, before any spawn.

    Raises:
        RunnerError: `unsupported_platform`, `worker_not_found`,
            `sandbox_setup` or `process_limit_unavailable` when this host
            cannot run jailed; never falls back to running unjailed.
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        import_paths: Sequence[str] = (),
        temp_root: str | None = None,
        worker: str | None = None,
        provider: Mapping[str, Any] | None = None,
        _backend_options: dict[str, Any] | None = None,
    ) -> None:
        self.limits = limits if limits is not None else Limits()
        if not isinstance(self.limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        self.import_paths = tuple(os.path.abspath(p) for p in import_paths)
        for path in self.import_paths:
            if not os.path.isdir(path):
                raise ValueError(f"import path {path!r} is not a directory")
        self.temp_root = temp_root
        self.worker = worker if worker is not None else locate_worker()
        options = dict(_backend_options or {})
        if provider is not None:
            from trunner.profile import provider_profile

            options["profile"] = provider_profile(provider)
        self._backend = _jail.platform_backend(
            self.worker, import_paths=self.import_paths, **options
        )
        self._backend.check()
        self._versions: dict[Limits, str] = {}

    @property
    def backend(self) -> _jail.JailBackend:
        return self._backend

    def rules_version(self, limits: Limits | None = None) -> str:
        """The effective rules version for runs with `limits`."""
        from trunner.rules import effective_rules_version

        limits = limits or self.limits
        if limits not in self._versions:
            self._versions[limits] = effective_rules_version(self._backend, limits)
        return self._versions[limits]

    def resolve_mode(self, mode: str) -> str:
        """The mode as the worker understands it.

        Raises:
            RunnerError: `unknown_mode`.
        """
        if mode in BUILTIN_MODES:
            return mode
        entry_points = _mode_entry_points()
        if mode in entry_points:
            return entry_points[mode]
        if _SPEC.match(mode):
            top = mode.split(":")[0].split(".")[0]
            search = [*self.import_paths, *_site_paths()]
            if importlib.machinery.PathFinder.find_spec(top, search) is not None:
                return mode
            raise RunnerError(Reason.UNKNOWN_MODE, f"no module {top!r} for mode {mode!r}")
        raise RunnerError(
            Reason.UNKNOWN_MODE,
            f"unknown mode {mode!r}: not built in ({', '.join(BUILTIN_MODES)}), not an entry"
            " point in group 'trunner.modes', not a 'package.module:function' spec",
        )

    async def run(
        self,
        mode: str,
        request: object = None,
        *,
        limits: Limits | None = None,
        response_type: type[T] | Any = Any,
    ) -> Result[T]:
        """Run `mode` on `request` in a fresh jail and return its response.

        Raises:
            RunnerError: with any `Reason`; never with a partial result.
        """
        await trio.lowlevel.checkpoint_if_cancelled()  # nothing starts in a cancelled scope
        limits = self.limits if limits is None else limits
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        adapter_argv = (self.worker, self.resolve_mode(mode))
        frame = encode_frame(request)
        rules_version = self.rules_version(limits)
        outcome = await self._invoke(adapter_argv, frame, limits)
        return Result(judge(outcome, limits, response_type), rules_version)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"", limits: Limits | None = None
    ) -> Result[ExecResult]:
        """Run a program inside the jail (`exec` mode)."""
        limits = self.limits if limits is None else limits
        request = ExecRequest(
            argv=list(argv),
            stdin=stdin,
            stdout_max_bytes=limits.stdout_max_bytes,
            stderr_max_bytes=limits.stderr_max_bytes,
        )
        return await self.run("exec", request, limits=limits, response_type=ExecResult)

    async def _invoke(self, adapter_argv: Sequence[str], frame: bytes, limits: Limits) -> Outcome:
        deadline = trio.current_time() + limits.wall_time_s  # set at spawn
        return await self._serve(await self._start(adapter_argv, limits), frame, limits, deadline)

    async def _start(self, adapter_argv: Sequence[str], limits: Limits) -> Started:
        """Make a jail dir and a jail, and spawn the helper into them."""
        try:
            jail_dir = make_jail_dir(self.temp_root)
        except OSError as e:
            raise RunnerError(
                Reason.SPAWN_FAILED, f"cannot make the jail dir: {e.strerror} (errno {e.errno})"
            ) from None
        try:
            jail = self._backend.open_jail(
                jail_dir=jail_dir, adapter_argv=adapter_argv, limits=limits
            )
            try:
                return Started(jail_dir, jail, await spawn(jail.command))
            except BaseException:
                with trio.CancelScope(shield=True):
                    await jail.release()
                raise
        except BaseException:
            await remove_jail_dir(jail_dir)  # the error in flight is the reason
            raise

    async def _serve(
        self, started: Started, frame: bytes, limits: Limits, deadline: float
    ) -> Outcome:
        """Supervise a started child to its end, then free its jail."""
        try:
            outcome = await supervise(
                started.child,
                frame,
                deadline=deadline,
                stdout_max_bytes=limits.stdout_max_bytes,
                stderr_max_bytes=limits.stderr_max_bytes,
            )
        finally:
            with trio.CancelScope(shield=True):
                await started.jail.release()
            gone = await remove_jail_dir(started.jail_dir)
        if not gone and outcome.exit_code == 0:  # else the run already failed: that reason wins
            outcome.fail(Reason.CLEANUP_FAILED, f"cannot remove the jail dir {started.jail_dir}")
        return outcome

    async def _discard(self, started: Started) -> None:
        """End a started child that will serve nothing (an idle pooled worker)."""
        with trio.CancelScope(shield=True):
            child = started.child
            try:
                child.kill_group()
                await child.wait_exit()
                child.reap()
                await child.aclose_streams()
                await started.jail.release()
            finally:
                await remove_jail_dir(started.jail_dir)

    def pool(
        self, mode: str, *, size: int = 2, limits: Limits | None = None, idle_s: float = 60.0
    ) -> WorkerPool:
        """Keep `size` jailed workers of `mode` spawned and waiting for a
        request: `async with runner.pool("echo") as pool: await pool.run(x)`.

        Each still serves one invocation in its own process, group and jail
        dir, with the same caps, deadline (from the moment the request is
        written) and verdict. Idle workers are ended after `idle_s` without
        use; the pool refills on the next use, in a nursery the `async with`
        opens in the caller's task.
        """
        from trunner.pool import WorkerPool

        limits = self.limits if limits is None else limits
        return WorkerPool(self, self.resolve_mode(mode), size=size, limits=limits, idle_s=idle_s)


@dataclass(eq=False)
class Started:
    """A spawned child in its jail, not yet given its request."""

    jail_dir: str
    jail: _jail.Jail
    child: Child


def judge(outcome: Outcome, limits: Limits, response_type: Any = Any) -> Any:
    """The verdict on one finished invocation: its response, or the error."""
    if outcome.failure is not None:
        raise RunnerError(outcome.failure, outcome.detail, **_status(outcome.exit_code))
    code = outcome.exit_code
    assert code is not None
    excerpt = outcome.stderr[-STDERR_EXCERPT_BYTES:].decode(errors="replace").strip()
    # The helper's refusal is the last thing it writes before it exits.
    last_line = excerpt.splitlines()[-1] if excerpt else ""
    if code in (SANDBOX_SETUP_EXIT, PROCESS_COUNT_EXIT) and last_line.startswith(
        "trunner-helper:"
    ):
        reason = Reason.SANDBOX_SETUP if code == SANDBOX_SETUP_EXIT else Reason.PROCESS_COUNT
        raise RunnerError(reason, last_line.removeprefix("trunner-helper: "), exit_status=code)
    if code < 0:
        sig = -code
        if sig == signal.SIGSYS:
            raise RunnerError(Reason.SYSCALL_DENIED, _denied_detail(outcome.pid, outcome.started_us), signal=sig)
        raise RunnerError(
            Reason.KILLED_BY_SIGNAL, f"killed by {signal.Signals(sig).name}; stderr: {excerpt}",
            signal=sig,
        )
    if code != 0:
        raise RunnerError(
            Reason.NONZERO_EXIT, f"exited {code}; stderr: {excerpt}", exit_status=code
        )
    return decode_single_frame(
        outcome.stdout, response_type,
        max_body_bytes=max(limits.stdout_max_bytes - HEADER_BYTES, 0),
    )


def _denied_detail(pid: int, since_us: int) -> str:
    from trunner.linux import backend as linux, seccomp

    nr = linux.denied_syscall(pid, since_us)
    if nr is None:
        return "killed by SIGSYS: a syscall outside the allow-list (number not logged)"
    return f"killed by SIGSYS: syscall {nr} ({seccomp.syscall_name(nr) or '?'}) is not allowed"


def _status(code: int | None) -> dict[str, int | None]:
    if code is None:
        return {}
    return {"signal": -code} if code < 0 else {"exit_status": code}


@functools.cache
def _mode_entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="trunner.modes")}


def _site_paths() -> list[str]:
    import sys

    return [p for p in sys.path if p]
