"""`Runner`: runs worker modes under the platform jail.

The runner knows modes and limits; what one call does is invocation.py's
pipeline: a fresh 0700 temp dir as the jail, the backend's jailed command,
one supervised child (nursery_run.py), then a verdict: a response only from
a child that exited 0 after writing exactly one complete frame, otherwise a
`RunnerError`. Nothing but a `RunnerError` (or the caller's own
cancellation) leaves `run()`.
"""

from __future__ import annotations

import os
import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar, final, overload

from trunner import exec_checks, invocation
from trunner.backend import platform_backend
from trunner.errors import Reason, RunnerError
from trunner.kernel.abi import BUILTIN_MODES
from trunner.limits import Limits
from trunner.modes import check_spec
from trunner.protocol import ExecFile, ExecResult
from trunner.warm import Warm
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence
    from contextlib import AbstractAsyncContextManager

    from trunner.invocation import Result
    from trunner.jail import JailBackend
    from trunner.pool import WorkerPool
    from trunner.session import Session
    from trunner.streaming import StreamingProcess

T = TypeVar("T")

#: What `not_in_trio` names: the same API for asyncio callers.
_ASYNCIO_RUNNER = "trunner.aio.AsyncioRunner"

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@final
class Runner:
    """Runs worker modes under the platform jail.

    Args:
        limits: default limits for every run (a run may pass its own).
        import_paths: directories user modes are imported from; the jail
            may read them and they become the worker's PYTHONPATH.
        binds: host directories the jail may read and execute (toolchains
            outside /usr: rustup, pyenv, an SDK), read-only, each a path
            (bound at its own path) or a `(host_dir, path_in_jail)` pair.
            Part of the rules version (the paths, not the contents). Refused
            (`sandbox_setup`) where one would shadow the jail's own paths
            (/, or on, above or in /dev, /etc, /proc, /sys/fs/cgroup, the
            working dir; on or above /tmp) or move over another bound dir,
            and as root where a user other than root could write it, its
            parents or anything in it. docs/toolchains.md.
        etc: host /etc entries the jail holds beside its short default list
            (a symlink stays a link, never followed). Not with `root`.
        root: a directory tree (an unpacked image, a debootstrap or
            busybox tree) whose top-level entries are the jail's system
            root instead of the host's /usr, /bin, /lib*; its /etc the
            jail's, with the jail's own passwd, group, hosts and hostname
            on top. The adapter still runs on the host's interpreter, bound
            read-only under /.trunner/host. docs/images.md.
        root_statement: with `root`, required: the caller's statement of
            the tree's contents (its digest, say). The rules version hashes
            it and the root's path, never the tree.
        temp_root: where jail dirs are made (default: the system temp dir);
            the leftovers of dead owners there, and their cgroups, are
            removed here (`JailBackend.sweep`).
        worker: the worker binary (default: `locate_worker()`).
        provider: configure the provider profile (`ports`, `hosts`,
            `read_only`; see `trunner.linux.profile.ProviderConfig`) instead of the
            default no-network profile. Checked here, before any spawn.
        host_ids: as root, the host ids (uid == gid) the jails run as, one
            per concurrent run (default `trunner.linux.ids.DEFAULT_RANGE`:
            1024 ids from 0x7A000000). Checked here against the host's
            users, groups and processes. Not root, jails run as the caller.
        cgroup_leaf: on cgroup v2, when this process lives in a delegated
            cgroup (`Delegate=yes`), the name of a leaf of it to move this
            process (only it) into here, so that runs' cgroups can be made
            beside it (default: `TRUNNER_CGROUP_LEAF`; none: refused with
            the fix). Idempotent.

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
        cgroup_leaf: str | None = None,
        binds: Sequence[str | tuple[str, str]] = (),
        etc: Sequence[str] = (),
        root: str | None = None,
        root_statement: str | None = None,
    ) -> None:
        self.limits = limits if limits is not None else Limits()
        if not isinstance(self.limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        self.temp_root = temp_root
        if backend is not None:
            if (import_paths or worker is not None or provider is not None
                    or host_ids is not None or cgroup_leaf is not None or binds or etc
                    or root is not None or root_statement is not None):
                raise ValueError("pass import_paths, worker, provider, host_ids, cgroup_leaf,"
                                 " binds, etc, root and root_statement to the backend")
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
            if binds:
                options["binds"] = binds
            if etc:
                options["etc"] = etc
            if root is not None or root_statement is not None:
                options["root"], options["root_statement"] = root, root_statement
            if host_ids is not None:
                options["host_ids"] = host_ids
            if cgroup_leaf is not None:
                options["cgroup_leaf"] = cgroup_leaf
            self._backend = platform_backend(self.worker, provider=provider, **options)
        self._backend.check()
        # What dead owners (processes that used trunner here) left, never a live one's.
        self._backend.sweep(temp_root)
        self._entry_points: dict[str, str] | None = None
        self._warm = Warm(self._backend)
        self._entered: list[AbstractAsyncContextManager[Runner]] = []

    @property
    def backend(self) -> JailBackend:
        return self._backend

    def rules_version(self, limits: Limits | None = None) -> str:
        """The effective rules version for runs with `limits`."""
        return self._backend.rules_version(limits or self.limits)

    def resolve_mode(self, mode: str) -> str:
        """The mode as the worker understands it.

        Raises:
            RunnerError: `unknown_mode`.
        """
        if mode in BUILTIN_MODES:
            return mode
        if self._entry_points is None:
            from importlib.metadata import entry_points

            self._entry_points = {ep.name: ep.value for ep in entry_points(group="trunner.modes")}
        if mode in self._entry_points:
            return self._entry_points[mode]
        if _SPEC.match(mode):
            # Found and parsed, never imported here: importing runs it unjailed.
            check_spec(mode, [*self.import_paths, *_site_paths()])
            return mode
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
        invocation.require_trio("Runner.run", _ASYNCIO_RUNNER)
        limits = self._limits(limits)
        mode = self.resolve_mode(mode)
        argv = self._adapter_argv(mode)
        async with self._warm.spawner(mode) as spawner:
            return await invocation.invoke(self._backend, argv, limits, self.temp_root, request,
                                           invocation.Caps.of(limits), response_type,
                                           spawner=spawner)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None,
        collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        capture_on_failure: bool = False,
    ) -> Result[ExecResult]:
        """Run a program inside the jail (`exec` mode), in the jail dir.

        `files` (relative path -> bytes, or an `ExecFile` for an executable
        one) are written there first; after the program exits, the regular
        files `collect` (globs) matches come back in `ExecResult.files`.
        The caps mean the program's own bytes: its stdout and the collected
        files' bytes share `stdout_max_bytes`; the frame around them is
        allowed for. `env` sets variables for the program only, over the
        jail's PATH, HOME, TMPDIR and LANG (not in the rules version).

        A program that is not found ends with exit code 127, one that cannot
        be executed with 126, each with one `trunner: NAME: ...` line on its
        stderr: an ordinary `ExecResult`, as a shell answers.

        With `capture_on_failure`, a `RunnerError` for a limit (`timeout`,
        `cpu_time`, `memory_limit`, `stdout_cap`, `stderr_cap`,
        `too_many_files`) carries `.output`: the program's stdout and stderr
        before the failure, each within its cap, marked if cut, where its
        adapter reported them (else None, and `.detail` says why). A
        diagnostic: never decoded, never a response. Off by default.

        Raises:
            RunnerError: `bad_request` for an empty or non-str argv, a non-bytes
                stdin, bad files, patterns or env (trunner.exec_checks), before
                anything is spawned; `stdout_cap` when the stdout and
                the collected files go over the cap; `too_many_files` when
                more than `EXEC_COLLECT_MAX_FILES` files match; any other
                `Reason`.
        """
        invocation.require_trio("Runner.exec", _ASYNCIO_RUNNER)
        limits = self._limits(limits)
        request, caps = exec_checks.exec_request(argv, stdin, files, collect, limits, env)
        async with self._warm.spawner("exec") as spawner:
            result: Result[ExecResult] = await invocation.invoke(
                self._backend, self._adapter_argv("exec"), limits, self.temp_root, request,
                caps, ExecResult, spawner=spawner, capture_on_failure=capture_on_failure)
        exec_checks.check_exec_reply(result.response, limits, request.collect,
                                     capture_on_failure=capture_on_failure)
        return result

    def open_process(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes | ExecFile] | None = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        pty: bool = False,
    ) -> AbstractAsyncContextManager[StreamingProcess]:
        """Run a program inside the jail, as `exec` does, and talk to it
        while it runs: `async with runner.open_process(argv) as p:`, then
        `p.stdin` (a trio SendStream), `p.stdout` and `p.stderr` (trio
        ReceiveStreams), docs/streaming.md.

        Streamed bytes are unverified output, each stream capped by
        `stdout_max_bytes` / `stderr_max_bytes` (a read past the cap ends
        the run). When the body ends, stdin is closed, what the caller left
        unread is drained (still capped), and the run is seen to its end
        within its limits. `p.result` (the exit and the usage, verified:
        `ExecResult` with no output) is set only after a clean end.

        With `pty`, the program runs on a pty of the run's own devpts (its
        controlling terminal) whose other side is `p.stdin` and `p.stdout`:
        stdout and stderr are one stream, capped by `stdout_max_bytes`;
        `p.set_window_size(rows=, columns=)` sets its size. The plan names
        the stdio (`stream`, `pty`), so such runs have a rules version of
        their own.

        Raises:
            RunnerError: from the `async with`, as `exec` would: `bad_request`
                before anything is spawned; `timeout`, `cpu_time`,
                `memory_limit`, `stdout_cap`, `stderr_cap`, any other
                `Reason`; never with a result.
        """
        return self._open_process(argv, files, env, self._limits(limits), pty)

    @asynccontextmanager
    async def _open_process(
        self, argv: Sequence[str], files: Mapping[str, bytes | ExecFile] | None,
        env: Mapping[str, str] | None, limits: Limits, pty: bool,
    ) -> AsyncIterator[StreamingProcess]:
        from trunner import streaming

        async with self._warm.spawner("exec") as spawner, streaming.open_process(
                self._backend, self._adapter_argv("exec"), limits, self.temp_root, argv,
                files=files, env=env, pty=pty, spawner=spawner) as process:
            yield process

    def session(
        self, *, limits: Limits | None = None, idle_s: float = 300.0, lifetime_s: float = 3600.0,
    ) -> AbstractAsyncContextManager[Session]:
        """A jail that lives across commands: `async with runner.session()
        as s:`, then `s.exec(...)` as `Runner.exec`, `s.open_process(...)`,
        each command its own invocation (deadline, caps, usage, verdict) in
        the session's namespaces, working dir, network and cgroup
        (docs/sessions.md). It ends, as a run does, when the `async with`
        ends, `idle_s` passes with no command, or `lifetime_s` passes; a
        command then in flight fails `session_ended`. `limits` are the
        session's: its processes, scratch, open files and memory bound; a
        command may set its own deadlines, caps and a lower memory_bytes.

        Raises:
            RunnerError: from the `async with`: the jail's refusal
                (`host_ids_exhausted` with every host id held, ...).
        """
        from trunner.session import open_session

        return open_session(self._backend, self._adapter_argv("exec"), self._limits(limits),
                            self.temp_root, idle_s=idle_s, lifetime_s=lifetime_s)

    def warm(self) -> AbstractAsyncContextManager[Runner]:
        """Keep a fork server for the block: `async with runner.warm():`
        (or `async with Runner(...) as runner:`), and `run`, `exec` and
        `open_process` there start their jails through it, as a pool's calls
        do: the same jail, plan, rules version and verdict, at a pooled
        run's cost, nothing spawned ahead. Blocks nest and overlap; the
        server starts on entry and stops when the last block ends, once each
        run begun in one is spawned. Outside every block runs are cold.
        As root the server holds uid 0 with full capabilities (as a pool's
        does: docs/design.md). Sessions and pools keep their own servers.

        Raises:
            RunnerError: `spawn_failed`, from the `async with`, when the
                server cannot be started.
        """
        return self._warm_block()

    @asynccontextmanager
    async def _warm_block(self) -> AsyncIterator[Runner]:
        invocation.require_trio("`async with runner.warm()`", _ASYNCIO_RUNNER)
        async with self._warm.block():
            yield self

    async def __aenter__(self) -> Runner:
        block = self._warm_block()
        await block.__aenter__()
        self._entered.append(block)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._entered.pop().__aexit__(None, None, None)

    def _adapter_argv(self, mode: str) -> tuple[str, ...]:
        return self._backend.adapter_argv(mode, builtin=mode in BUILTIN_MODES)

    def _limits(self, limits: Limits | None) -> Limits:
        limits = self.limits if limits is None else limits
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        return limits

    def pool(
        self, mode: str, *, size: int = 2, limits: Limits | None = None, idle_s: float = 60.0
    ) -> WorkerPool:
        """Keep `size` jailed workers of `mode` spawned and waiting for a
        request: `async with runner.pool("echo") as pool: await pool.run(x)`.

        Each still serves one invocation in its own process, group and jail
        dir, with the same caps, deadline (from the moment the request is
        written) and verdict. Idle workers are ended after `idle_s` without
        use; the pool refills on the next use, in a nursery the `async with`
        opens in the caller's task. An exception of the body leaves the
        `async with` as itself; a refill that cannot spawn cancels the body
        and leaves it as that one `RunnerError`. A call's own `limits=`
        (`pool.run`, `pool.exec`) other than these gets a jail started for
        it, in one of the `size` slots (docs/pool.md, "Limits per call").

        Raises:
            RunnerError: `unknown_mode`, here; the pool's own failure, from
                the `async with`.
        """
        from trunner.pool import WorkerPool

        mode = self.resolve_mode(mode)
        return WorkerPool(self._backend, mode, self._adapter_argv(mode),
                          self._limits(limits), self.temp_root, size=size, idle_s=idle_s)


def _site_paths() -> list[str]:
    import sys

    return [p for p in sys.path if p]
