"""Sessions: one jail that lives across commands (`Runner.session`).

A session's jail is opened as a run's is (`invocation.start`, cold), with
`abi.HOLD_MODE` as its adapter: its pid 2 says it is ready, then holds the
jail's namespaces, scratch (the working dir, /tmp) and cgroup until the
session ends. Each command is an invocation of its own through the same
pipeline, whose backend is the session's (`_Joined`): its jail joins the
session's (the helper `setns`es into the namespaces of the session's pid
1, then unshares a PID, mount and cgroup namespace of its own), its
cgroups are made in the session's, its leader is forked by the session's
own fork server (as a pool's), and it keeps the runner's contract: its
own deadline, caps, usage and verdict. A session ends, exactly as a run
does (group kill, cgroups, host id, dir), when its `async with` ends, when
`idle_s` passes with no command, or when `lifetime_s` passes; a command
then in flight ends `session_ended`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, final

import msgspec
import trio

from trunner import exec_checks, invocation
from trunner.backend import close_jail
from trunner.errors import Reason, RunnerError
from trunner.kernel.abi import HOLD_MODE, HOLD_READY, SESSION_COMMANDS
from trunner.limits import Limits
from trunner.protocol import (
    ExecResult,
    Export,
    FileEntry,
    FilesResult,
    Import,
    ReadFiles,
    WriteFiles,
)
from trunner.spawn import COLD

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from trunner.invocation import Result, Started
    from trunner.jail import Jail, JailBackend
    from trunner.protocol import ExecFile, FilesOp
    from trunner.spawn import Spawner
    from trunner.streaming import StreamingProcess

#: What a command may set in its own `limits` (any other field it sets,
#: other than the session's value, is refused): a field left at its default
#: takes the session's. `memory_bytes` at most the session's.
COMMAND_FIELDS: Final = ("wall_time_s", "cpu_time_s", "stdout_max_bytes", "stderr_max_bytes",
                         "memory_bytes")
_DEFAULT: Final = Limits()


@final
class Session:
    """A jail that lives across commands. Made by `Runner.session`."""

    def __init__(self, backend: JailBackend, adapter_argv: Sequence[str], limits: Limits,
                 temp_root: str | None, *, idle_s: float, lifetime_s: float) -> None:
        self.limits = limits
        self.idle_s, self.lifetime_s = idle_s, lifetime_s
        self._backend, self._exec_argv, self._temp_root = backend, adapter_argv, temp_root
        self._started: Started | None = None
        self._nursery: trio.Nursery | None = None
        #: Commands start as a pool's runs do: a leader forked by a fork
        #: server of the session's own (its pid 2 serves `exec` in-process).
        self._spawner = backend.fork_server("exec")
        #: The same server for its files API (`files`, in-process likewise).
        self._files_spawner = self._spawner.serving("files")
        self._joined: _Joined | None = None
        #: Why it ended ("": it serves).
        self.ended = ""
        self._slots = trio.Semaphore(SESSION_COMMANDS)
        self._scopes: set[trio.CancelScope] = set()
        self._running = 0
        self._idle_from = self._expires = 0.0
        self._changed = trio.Event()
        self._quiet = trio.Event()
        self._closed = trio.Event()
        self._closing = False

    # -- what a caller runs ----------------------------------------------

    def rules_version(self, limits: Limits | None = None) -> str:
        """The effective rules version of this session's commands."""
        return self._backend.rules_version(self._command_limits(limits), session=True)

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
        """`Runner.exec` in the session: the same arguments, result and
        errors; the working dir and everything else the session's earlier
        commands left are there. `limits`: see `COMMAND_FIELDS`.

        Raises:
            RunnerError: as `Runner.exec`; `session_ended`; `bad_request`
                for a limit only the session sets.
        """
        invocation.require_trio("Session.exec", "trunner.aio.AsyncioRunner.session")
        limits = self._command_limits(limits)
        request, caps = exec_checks.exec_request(argv, stdin, files, collect, limits, env)
        async with self._command():
            result: Result[ExecResult] = await invocation.invoke(
                self._in_session(), self._exec_argv, limits, self._temp_root, request, caps,
                ExecResult, spawner=self._spawner, capture_on_failure=capture_on_failure)
        exec_checks.check_exec_reply(result.response, limits, request.collect,
                                     capture_on_failure=capture_on_failure)
        return result

    @asynccontextmanager
    async def open_process(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes | ExecFile] | None = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        pty: bool = False,
    ) -> AsyncIterator[StreamingProcess]:
        """`Runner.open_process` in the session."""
        async with self._open(argv, files=files, env=env, limits=self._command_limits(limits),
                              pty=pty) as process:
            yield process

    @asynccontextmanager
    async def _open(self, argv: Sequence[str], *, files: Mapping[str, bytes | ExecFile] | None,
                    env: Mapping[str, str] | None, limits: Limits, pty: bool = False,
                    active: bool = True) -> AsyncIterator[StreamingProcess]:
        from trunner import streaming

        async with self._command(active=active), streaming.open_process(
                self._in_session(), self._exec_argv, limits, self._temp_root, argv,
                files=files, env=env, pty=pty, spawner=self._spawner) as process:
            yield process

    async def files(self, ops: Sequence[FilesOp], *, limits: Limits | None = None,
                    budget_bytes: int | None = None) -> Result[FilesResult]:
        """Run `ops` (`ReadFiles`, `WriteFiles`, `Export`, `Import`) in order
        in the working dir, as one command of the built-in `files` mode
        (`trunner.files`: paths as `exec`'s files, never through a
        symlink; what the reads return within `budget_bytes`, by default
        the stdout cap's room).

        Raises:
            RunnerError: `bad_request` for a bad op before anything runs, or
                for the op that failed (`.detail` names it and its path: the
                ops before it took effect); `stdout_cap` past the budget;
                `session_ended`; any other `Reason`.
        """
        from trunner import files

        limits = self._command_limits(limits)
        request = files.request(ops, limits, budget_bytes=budget_bytes)
        argv = self._backend.adapter_argv("files", builtin=True)
        async with self._command():
            result: Result[FilesResult] = await invocation.invoke(
                self._in_session(), argv, limits, self._temp_root, request,
                invocation.Caps.of(limits), FilesResult, spawner=self._files_spawner)
        files.check_reply(request, result.response, usage=result.usage)
        return result

    async def read_files(self, patterns: Sequence[str], *,
                         limits: Limits | None = None) -> list[FileEntry]:
        """The files, symlinks (not followed) and dirs (empty ones too)
        `patterns` (`exec`'s `collect` globs) match: each a `FileEntry`
        with its type, mode, mtime and data or target, sorted by path."""
        result = await self.files([ReadFiles(patterns=list(patterns))], limits=limits)
        entries = result.response.results[0]
        assert isinstance(entries, list)
        return entries

    async def write_files(self, entries: Mapping[str, bytes] | Sequence[FileEntry], *,
                          limits: Limits | None = None) -> None:
        """Write `entries` (`FileEntry`s as `read_files` returns them, or
        path -> bytes for plain files, mode 0o644, mtime now), parents
        made as needed, replacing what is at each path (never written
        through a symlink)."""
        if isinstance(entries, Mapping):
            now = time.time_ns()
            entries = [FileEntry(path=path, type="file", mode=0o644, mtime_ns=now, data=data)
                       for path, data in entries.items()]
        await self.files([WriteFiles(entries=list(entries))], limits=limits)

    async def export(self, path: str = ".", *, limits: Limits | None = None,
                     chunk_bytes: int = 1 << 16) -> AsyncIterator[bytes]:
        """An uncompressed POSIX (pax) tar of the dir `path`, relative names,
        no count limit, in chunks: `async for chunk in s.export("work")`.
        Within the stdout cap (a bigger tar fails `stdout_cap`: give the
        call `limits=` with a bigger `stdout_max_bytes`)."""
        result = await self.files([Export(path=path)], limits=limits)
        tar = result.response.results[0]
        assert isinstance(tar, bytes)
        for at in range(0, len(tar), chunk_bytes):
            yield tar[at:at + chunk_bytes]

    async def import_(self, tar: bytes, path: str = ".", *,
                      limits: Limits | None = None) -> int:
        """Extract a tar into the dir `path` (no absolute names, `..`,
        devices or fifos; never through a symlink); the members written."""
        result = await self.files([Import(path=path, tar=tar)], limits=limits)
        count = result.response.results[0]
        assert isinstance(count, int)
        return count

    async def start_background(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes | ExecFile] | None = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
    ) -> Background:
        """Start `argv` in the background (an agent's dev server): a command
        of its own, in the session's network, working dir and cgroup, whose
        stdout and stderr are kept, each within its cap. It ends at its own
        `wall_time_s` (by default what is left of the session's lifetime),
        at `Background.stop()`, or with the session; it does not keep the
        session from its `idle_s` end. Returns once it runs.

        Raises:
            RunnerError: as `open_process` would, before it runs.
        """
        if limits is None or limits.wall_time_s == _DEFAULT.wall_time_s:
            left = max(self._expires - trio.current_time(), 0.001)
            limits = msgspec.structs.replace(limits or self.limits, wall_time_s=left)
        limits = self._command_limits(limits)
        assert self._nursery is not None
        background = Background(argv)
        await self._nursery.start(background._serve, self, argv, files, env, limits)
        return background

    # -- its life ----------------------------------------------------------

    def _in_session(self) -> _Joined:
        if self.ended:
            raise RunnerError(Reason.SESSION_ENDED, self.ended)
        assert self._joined is not None
        return self._joined

    def _command_limits(self, limits: Limits | None) -> Limits:
        if limits is None:
            return self.limits
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        changes: dict[str, Any] = {}
        refused: list[str] = []
        for name in limits.__struct_fields__:
            value = getattr(limits, name)
            if value == getattr(_DEFAULT, name) or value == getattr(self.limits, name):
                continue
            if name in COMMAND_FIELDS:
                changes[name] = value
            else:
                refused.append(name)
        if refused:
            raise RunnerError(Reason.BAD_REQUEST, f"{', '.join(refused)}: the session's, set by"
                              f" Runner.session(limits=); a command sets only"
                              f" {', '.join(COMMAND_FIELDS)}")
        if changes.get("memory_bytes", 0) > self.limits.memory_bytes:
            raise RunnerError(Reason.BAD_REQUEST, f"memory_bytes {changes['memory_bytes']} is"
                              f" over the session's {self.limits.memory_bytes}")
        return msgspec.structs.replace(self.limits, **changes)

    @asynccontextmanager
    async def _command(self, *, active: bool = True) -> AsyncIterator[None]:
        """One command's slot and scope: the session's end cancels it, as
        `session_ended`. `active`: it counts as activity (no idle end
        meanwhile); a background process does not."""
        self._in_session()
        async with self._slots:
            self._in_session()
            self._running += active
            self._changed.set()
            scope = trio.CancelScope(deadline=self._expires)
            self._scopes.add(scope)
            try:
                with scope:
                    yield
            finally:
                self._scopes.discard(scope)
                self._running -= active
                self._idle_from = trio.current_time()
                self._changed.set()
                if not self._scopes:
                    self._quiet.set()
            if scope.cancelled_caught:
                raise RunnerError(Reason.SESSION_ENDED, self.ended or "its lifetime_s passed")

    async def _start(self) -> None:
        """Open the session's jail and wait until its pid 2 holds it."""
        backend = _Holding(self._backend)
        argv = self._backend.adapter_argv(HOLD_MODE, builtin=True)
        started = await invocation.start(backend, argv, self.limits, self._temp_root, COLD)
        self._started = started
        child, jail = started.child, started.jail
        ready = b""
        try:
            with trio.move_on_after(self.limits.wall_time_s):
                ready = await child.stdout.receive_some(len(HOLD_READY))
            if ready != HOLD_READY or not jail.note_init(child.report_so_far()):
                await self._fail_start()
        except BaseException:
            await self._close_jail()
            raise
        self._joined = _Joined(self._backend, jail)
        now = trio.current_time()
        self._idle_from, self._expires = now, now + self.lifetime_s

    async def _fail_start(self) -> None:
        """The session's jail did not come up: its end says why."""
        assert self._started is not None
        child, jail = self._started.child, self._started.jail
        await child.aclose()
        assert child.exit_code is not None
        failure = jail.explain(child.exit_code, child.report, child.started_us)
        if failure is not None:
            raise failure.error()
        raise RunnerError(Reason.SANDBOX_SETUP, "the session's jail did not say it was ready"
                          f" within wall_time_s (exit {child.exit_code})")

    async def _watch(self, pidfd: int) -> None:
        """End the session at `lifetime_s`, after `idle_s` without a command,
        or when its jail ends by itself (`pidfd`, the jail's leader's: a
        copy of its own, as `aclose` waits on and closes the child's)."""
        why = ""
        async with trio.open_nursery() as nursery:

            async def jail_ended() -> None:
                nonlocal why
                await trio.lowlevel.wait_readable(pidfd)
                why = why or "its jail ended (its pid 2 exited)"
                nursery.cancel_scope.cancel()

            nursery.start_soon(jail_ended)
            while True:
                wake = self._expires
                if not self._running:
                    wake = min(wake, self._idle_from + self.idle_s)
                with trio.move_on_at(wake):
                    await self._changed.wait()
                self._changed = trio.Event()
                now = trio.current_time()
                if now >= self._expires:
                    why = f"its lifetime_s ({self.lifetime_s:g} s) passed"
                elif not self._running and now >= self._idle_from + self.idle_s:
                    why = f"idle_s ({self.idle_s:g} s) passed with no command"
                if why:
                    nursery.cancel_scope.cancel()
                    break
        await self.aclose(why)

    async def aclose(self, why: str = "its async with ended") -> None:
        """End the session: its commands in flight (`session_ended`), then
        its jail, as a run's ends. Shielded; a second call waits for the first."""
        with trio.CancelScope(shield=True):
            if self._closing:
                await self._closed.wait()
                return
            self._closing = True
            self.ended = self.ended or why
            try:
                if self._scopes:
                    self._quiet = trio.Event()
                    for scope in list(self._scopes):
                        scope.cancel()
                    await self._quiet.wait()
                await self._close_jail()
            finally:
                self._closed.set()

    async def _close_jail(self) -> None:
        if self._started is not None:
            try:
                await self._started.child.aclose()
            finally:
                await close_jail(self._started.jail)


@final
class Background:
    """A session's background process (`Session.start_background`)."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = tuple(argv)
        self._out: list[bytearray] = [bytearray(), bytearray()]
        #: Its verdict once it ended cleanly (`ExecResult`, no output: that
        #: is `stdout`, `stderr`), or why not.
        self.result: Result[ExecResult] | None = None
        self.error: RunnerError | None = None
        self._scope = trio.CancelScope()
        self._stopped = False
        self._done = trio.Event()

    @property
    def stdout(self) -> bytes:
        """What it wrote to stdout so far (unverified, within its cap)."""
        return bytes(self._out[0])

    @property
    def stderr(self) -> bytes:
        return bytes(self._out[1])

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    async def wait(self) -> Result[ExecResult] | None:
        """Its end: the result, its `RunnerError` raised, or None if it
        was stopped."""
        await self._done.wait()
        if self.error is not None:
            raise self.error
        return self.result

    async def stop(self) -> None:
        """Kill it (its whole PID namespace) and wait until it is gone; it
        then has no verdict."""
        self._stopped = True
        self._scope.cancel()
        await self._done.wait()

    async def _serve(self, session: Session, argv: Sequence[str],
                     files: Mapping[str, bytes | ExecFile] | None,
                     env: Mapping[str, str] | None, limits: Limits,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        try:
            with self._scope:
                async with session._open(argv, files=files, env=env, limits=limits,
                                         active=False) as process:
                    started = True
                    task_status.started()
                    async with trio.open_nursery() as nursery:
                        for stream, kept in ((process.stdout, self._out[0]),
                                             (process.stderr, self._out[1])):
                            nursery.start_soon(_keep, stream, kept)
                self.result = process.result
        except RunnerError as e:
            if not started:
                raise
            self.error = e
        finally:
            if self.result is None and self.error is None and session.ended and not self._stopped:
                self.error = RunnerError(Reason.SESSION_ENDED, session.ended)
            self._done.set()


async def _keep(stream: trio.abc.ReceiveStream, kept: bytearray) -> None:
    while chunk := await stream.receive_some():
        kept += chunk


@asynccontextmanager
async def open_session(backend: JailBackend, exec_argv: Sequence[str], limits: Limits,
                       temp_root: str | None, *, idle_s: float,
                       lifetime_s: float) -> AsyncIterator[Session]:
    """`Runner.session`'s pipeline: start the session's jail, serve the
    body, end it whatever happens."""
    invocation.require_trio("`async with runner.session()`", "trunner.aio.AsyncioRunner")
    for name, value in (("idle_s", idle_s), ("lifetime_s", lifetime_s)):
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise RunnerError(Reason.BAD_REQUEST, f"{name} must be a positive number of seconds")
    if limits.processes < exec_checks.EXEC_PROCESSES:
        raise RunnerError(Reason.BAD_REQUEST, f"processes={limits.processes}: a session's commands"
                          f" are exec runs, {exec_checks.EXEC_PROCESSES} processes at least")
    session = Session(backend, exec_argv, limits, temp_root, idle_s=idle_s,
                      lifetime_s=lifetime_s)
    raised: BaseException | None = None
    with invocation.only_runner_errors():
        async with session._spawner, session._files_spawner:
            await session._start()  # its refusal leaves as itself
            assert session._started is not None
            # Taken now: the watcher may first run once the body has ended
            # and `aclose` has closed the child's own.
            pidfd = os.dup(session._started.child.pidfd)
            try:
                async with trio.open_nursery() as nursery:
                    session._nursery = nursery
                    nursery.start_soon(session._watch, pidfd)
                    try:
                        yield session
                    except BaseException as e:  # re-raised below, outside the nursery: as itself
                        raised = e
                    finally:
                        session.ended = session.ended or "its async with ended"
                        nursery.cancel_scope.cancel()
                        await session.aclose()
            finally:
                os.close(pidfd)
    if raised is not None:
        try:
            raise raised
        finally:
            raised = None  # no reference cycle through the frame


class _Delegate:
    """A backend that is another one, but for how it opens jails."""

    def __init__(self, backend: JailBackend) -> None:
        self._backend = backend
        self.worker, self.import_paths = backend.worker, backend.import_paths

    def probe(self) -> Any:  # noqa: ANN401  the backend's HostSupport
        return self._backend.probe()

    def check(self) -> None:
        self._backend.check()

    def settle(self) -> None:
        self._backend.settle()

    def adapter_argv(self, mode: str, *, builtin: bool) -> tuple[str, ...]:
        return self._backend.adapter_argv(mode, builtin=builtin)

    def rules_document(self, limits: Limits, *, stdio: str = "pipes",
                       session: bool = False) -> Mapping[str, object]:
        return self._backend.rules_document(limits, stdio=stdio, session=session)

    def sweep(self, temp_root: str | None) -> list[str]:
        return self._backend.sweep(temp_root)

    def fork_server(self, mode: str) -> Spawner:
        raise RunnerError(Reason.BAD_REQUEST, "a session's commands are not pooled")


class _Holding(_Delegate):
    """Opens a session's own jail."""

    def open_jail(self, *, jail_dir: str, adapter_argv: Sequence[str], limits: Limits,
                  in_process: str = "", stdio: str = "pipes", session: Jail | None = None,
                  holds_session: bool = False) -> Jail:
        return self._backend.open_jail(jail_dir=jail_dir, adapter_argv=adapter_argv,
                                       limits=limits, holds_session=True)

    def rules_version(self, limits: Limits, *, stdio: str = "pipes", session: bool = False) -> str:
        return self._backend.rules_version(limits, stdio=stdio)


class _Joined(_Delegate):
    """Opens jails that join the session's `jail` (its commands')."""

    def __init__(self, backend: JailBackend, jail: Jail) -> None:
        super().__init__(backend)
        self._jail = jail

    def open_jail(self, *, jail_dir: str, adapter_argv: Sequence[str], limits: Limits,
                  in_process: str = "", stdio: str = "pipes", session: Jail | None = None,
                  holds_session: bool = False) -> Jail:
        return self._backend.open_jail(jail_dir=jail_dir, adapter_argv=adapter_argv,
                                       limits=limits, in_process=in_process, stdio=stdio,
                                       session=self._jail)

    def rules_version(self, limits: Limits, *, stdio: str = "pipes", session: bool = False) -> str:
        return self._backend.rules_version(limits, stdio=stdio, session=True)
