"""`Runner`: runs worker modes under the platform jail.

One call to `run()` is one invocation (invocation.py): a fresh 0700 temp dir
as the jail, the backend's jailed command, one supervised child
(nursery_run.py), then a verdict: a response only from a child that exited
0 after writing exactly one complete frame, otherwise a `RunnerError`.
Nothing but a `RunnerError` (or the caller's own cancellation) leaves
`run()`.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import re
from typing import TYPE_CHECKING, Any, TypeVar, final, overload

import trio

from trunner import cleanup, invocation, workdir
from trunner.adapters import BUILTIN_MODES
from trunner.errors import Reason, RunnerError
from trunner.invocation import Result
from trunner.jail import JailBackend, platform_backend
from trunner.limits import Limits
from trunner.protocol import (
    EXEC_COLLECT_MAX_FILES,
    ExecFile,
    ExecRequest,
    ExecResult,
    encode_frame,
    exec_frame_bytes,
)
from trunner.worker import adapter_argv, locate_worker

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from trunner.pool import WorkerPool

T = TypeVar("T")

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@final
class Runner:
    """Runs worker modes under the platform jail.

    Args:
        limits: default limits for every run (a run may pass its own).
        import_paths: directories user modes are imported from; the jail
            may read them and they become the worker's PYTHONPATH.
        temp_root: where jail dirs are made (default: the system temp dir);
            the leftovers of dead owners there, and their cgroups, are
            removed here (`trunner.cleanup.sweep`).
        worker: the worker binary (default: `locate_worker()`).
        provider: configure the provider profile (`ports`, `hosts`,
            `read_only`; see `trunner.profile.ProviderConfig`) instead of the
            default no-network profile. Checked here, before any spawn.
        host_ids: as root, the host ids (uid == gid) the jails run as, one
            per concurrent run (default `trunner.linux.ids.DEFAULT_RANGE`:
            1024 ids from 0x7A000000). Checked here against the host's
            users, groups and processes. Not root, jails run as the caller.

    Raises:
        RunnerError: `unsupported_platform`, `worker_not_found`,
            `sandbox_setup` or `process_limit_unavailable` when this host
            cannot run jailed; `host_ids_in_use` when something else on the
            host uses an id of `host_ids`; never falls back to running
            unjailed.
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        import_paths: Sequence[str] = (),
        temp_root: str | None = None,
        worker: str | None = None,
        provider: Mapping[str, Any] | None = None,
        backend: JailBackend | None = None,
        host_ids: range | None = None,
    ) -> None:
        self.limits = limits if limits is not None else Limits()
        if not isinstance(self.limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        self.temp_root = temp_root
        if backend is not None:
            if import_paths or worker is not None or provider is not None or host_ids is not None:
                raise ValueError("pass import_paths, worker, provider and host_ids to the backend")
            self._backend = backend
            self.worker = backend.worker
            self.import_paths = tuple(backend.import_paths)
        else:
            self.import_paths = tuple(os.path.abspath(p) for p in import_paths)
            for path in self.import_paths:
                if not os.path.isdir(path):
                    raise ValueError(f"import path {path!r} is not a directory")
            self.worker = worker if worker is not None else locate_worker()
            options: dict[str, Any] = {"import_paths": self.import_paths}
            if provider is not None:
                from trunner.profile import provider_profile

                options["profile"] = provider_profile(provider)
            if host_ids is not None:
                options["host_ids"] = host_ids
            self._backend = platform_backend(self.worker, **options)
        self._backend.check()
        # What dead owners (processes that used trunner here) left, never a live one's.
        cleanup.sweep(temp_root, cleanup.cgroup_parents(self._backend.probe()))
        self._versions: dict[Limits, str] = {}

    @property
    def backend(self) -> JailBackend:
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

    @overload
    async def run(
        self, mode: str, request: object = None, *, limits: Limits | None = None
    ) -> Result[Any]: ...

    @overload
    async def run(
        self, mode: str, request: object = None, *, limits: Limits | None = None,
        response_type: type[T],
    ) -> Result[T]: ...

    async def run(
        self,
        mode: str,
        request: object = None,
        *,
        limits: Limits | None = None,
        response_type: Any = Any,
    ) -> Result[Any]:
        """Run `mode` on `request` in a fresh jail and return its response,
        validated as `response_type`.

        Raises:
            RunnerError: with any `Reason`; never with a partial result.
        """
        limits = self._limits(limits)
        return await self._run(adapter_argv(self.worker, self.resolve_mode(mode)), request, limits,
                               invocation.Caps.of(limits), response_type)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None,
        collect: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> Result[ExecResult]:
        """Run a program inside the jail (`exec` mode), in the jail dir.

        `files` (relative path -> bytes, or an `ExecFile` for an executable
        one) are written there first; after the program exits, the regular
        files `collect` (globs) matches come back in `ExecResult.files`.
        The caps mean the program's own bytes: its stdout and the collected
        files' bytes share `stdout_max_bytes`; the frame around them is
        allowed for.

        Raises:
            RunnerError: `bad_request` for bad files or patterns (trunner.workdir),
                before anything is spawned; `stdout_cap` when the stdout and
                the collected files go over the cap, or more than
                `EXEC_COLLECT_MAX_FILES` files match; any other `Reason`.
        """
        limits = self._limits(limits)
        request, caps = exec_request(argv, stdin, files, collect, limits)
        result: Result[ExecResult] = await self._run(
            adapter_argv(self.worker, "exec"), request, limits, caps, ExecResult)
        check_exec_reply(result.response, limits, request.collect)
        return result

    def _limits(self, limits: Limits | None) -> Limits:
        limits = self.limits if limits is None else limits
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        return limits

    async def _run(
        self, adapter_argv: tuple[str, ...], request: object, limits: Limits,
        caps: invocation.Caps, response_type: Any,  # noqa: ANN401
    ) -> Result[Any]:
        await trio.lowlevel.checkpoint_if_cancelled()  # nothing starts in a cancelled scope
        with invocation.only_runner_errors():
            frame = encode_frame(request)
            rules_version = self.rules_version(limits)
            started = await invocation.start(self._backend, adapter_argv, limits,
                                             self.temp_root)
            outcome = await invocation.serve(started, frame, caps)
            response = invocation.judge(outcome, self._backend, caps.stdout_max_bytes,
                                        response_type)
        return Result(response, rules_version)

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


def exec_request(
    argv: Sequence[str], stdin: bytes, files: Mapping[str, bytes | ExecFile] | None,
    collect: Sequence[str], limits: Limits,
) -> tuple[ExecRequest, invocation.Caps]:
    """A checked `exec` request, and the caps the parent enforces for it.

    Raises:
        RunnerError: `bad_request`, before anything is spawned.
    """
    with invocation.only_runner_errors():
        placed = workdir.check_files(files, stdin_bytes=len(stdin),
                                     file_size_bytes=limits.file_size_bytes)
        patterns = workdir.check_patterns(collect)
        request = ExecRequest(
            argv=list(argv),
            stdin=stdin,
            files=placed,
            collect=patterns,
            stdout_max_bytes=limits.stdout_max_bytes,
            stderr_max_bytes=limits.stderr_max_bytes,
        )
    caps = invocation.Caps(limits.wall_time_s, exec_frame_bytes(
        limits.stdout_max_bytes, limits.stderr_max_bytes, patterns), limits.stderr_max_bytes)
    return request, caps


def check_exec_reply(response: ExecResult, limits: Limits, patterns: Sequence[str]) -> None:
    """The exec adapter returns one byte past a cap it saw crossed, and one
    file past the bound of collected files; it returns only files that the
    requested patterns match, and names only those patterns unmatched."""
    cap = limits.stdout_max_bytes
    if len(response.stdout) > cap:
        raise RunnerError(Reason.STDOUT_CAP,
                          f"the program's stdout went over its cap of {cap} bytes")
    err_cap = limits.stderr_max_bytes
    if len(response.stderr) > err_cap:
        raise RunnerError(Reason.STDERR_CAP,
                          f"the program's stderr went over its cap of {err_cap} bytes")
    if len(response.files) > EXEC_COLLECT_MAX_FILES:
        raise RunnerError(Reason.STDOUT_CAP, f"the collect patterns matched more than"
                          f" {EXEC_COLLECT_MAX_FILES} files")
    collected = sum(len(f.data) for f in response.files)
    if len(response.stdout) + collected > cap:
        raise RunnerError(Reason.STDOUT_CAP, f"the program's stdout ({len(response.stdout)} bytes)"
                          f" and the collected files went over the stdout cap of {cap} bytes")
    if not workdir.check_collected(response.files):
        raise RunnerError(Reason.BAD_FRAME, "a collected file's path or size is malformed")
    for file in response.files:
        if not any(workdir.matches(pattern, file.path) for pattern in patterns):
            raise RunnerError(Reason.BAD_FRAME,
                              f"collected {file.path!r}, which no requested pattern matches")
    if not set(response.unmatched) <= set(patterns):
        raise RunnerError(Reason.BAD_FRAME, "the reply names an unmatched pattern not requested")


@functools.cache
def _mode_entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="trunner.modes")}


def _site_paths() -> list[str]:
    import sys

    return [p for p in sys.path if p]
