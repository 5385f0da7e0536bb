"""Starting a jail's command and owning its pid until nothing of it is left.

Every child is forked from one long-lived thread, so that a parent-death
signal armed in the child (it follows the forking *thread*) fires only when
the process dies; trio's own spawn forks from a worker thread it retires
after idling. The parent keeps a pidfd so it can wait for exit without
reaping, kill the group while the leader's pid is still held, then reap.
Besides stdio, the child gets the write end of a report pipe; its number is
put in argv's helper stage (`{report_fd}`). `Child.aclose()` is the one
teardown, on every path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import outcome
import trio

from trunner.errors import Reason, RunnerError

if TYPE_CHECKING:
    from collections.abc import Callable

    from trunner.jail import Jail

T = TypeVar("T")

#: Pipe buffer asked for on stdout: 1 MiB reads then move a whole pipe at once.
PIPE_BYTES = 1024 * 1024


@dataclass(eq=False)
class Child:
    """A spawned process-group leader in its jail, until `aclose()`."""

    pid: int
    pidfd: int
    #: CLOCK_MONOTONIC at spawn, in microseconds (kernel log records of this
    #: pid from before then belong to an earlier process with the same pid).
    started_us: int
    stdin: trio.lowlevel.FdStream
    stdout: trio.lowlevel.FdStream
    stderr: trio.lowlevel.FdStream
    #: Read end of the helper's report pipe (non-blocking).
    report_fd: int
    jail: Jail
    #: None for a leader the fork server cloned (`trunner.linux.forkclient`).
    _popen: subprocess.Popen[bytes] | None
    #: Once closed: the leader's exit code (negative: killed by that
    #: signal) and everything the report pipe carried.
    exit_code: int | None = None
    report: bytes = b""
    _closed: bool = False

    async def wait_exit(self) -> None:
        """Wait until the leader exits, without reaping it."""
        await trio.lowlevel.wait_readable(self.pidfd)

    def kill_group(self) -> None:
        """SIGKILL the whole process group. Safe until the reap: the
        unreaped leader holds the pgid, so it cannot name another group."""
        if self.exit_code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    async def aclose(self) -> None:
        """End the child, whatever state it is in, and see everything of it
        gone: SIGKILL the group, wait for the leader's exit, unlist and reap
        it, read the report pipe, wait (bounded) until no process of the run
        is left, close every pipe. Shielded and idempotent."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            try:
                self.kill_group()
                await self.wait_exit()
                self.jail.killed(self.pid)
                # The leader has exited (its pidfd said so): this does not block.
                _, status = os.waitpid(self.pid, 0)  # noqa: ASYNC222
                self.exit_code = os.waitstatus_to_exitcode(status)
                if self._popen is not None:
                    self._popen.returncode = self.exit_code
                os.close(self.pidfd)
                self.report = _read_all(self.report_fd)
                await self.jail.wait_gone(self.pid, self.report)
            finally:
                os.close(self.report_fd)
                for stream in (self.stdin, self.stdout, self.stderr):
                    await stream.aclose()


def _read_all(fd: int) -> bytes:
    """What a non-blocking pipe holds (all of it, once its writers are gone)."""
    data = b""
    with contextlib.suppress(BlockingIOError):  # a writer is left: impossible once reaped
        while chunk := os.read(fd, 4096):
            data += chunk
    return data


class _SpawnThread:
    """One daemon thread that does every fork, for the life of the process."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Callable[[object], None]]]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="trunner-spawn", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job, done = self._jobs.get()
            done(outcome.capture(job))

    def submit(self, job: Callable[[], object], done: Callable[[object], None]) -> None:
        self._jobs.put((job, done))


_spawner: _SpawnThread | None = None
_spawner_lock = threading.Lock()


def _spawn_thread() -> _SpawnThread:
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner._thread.is_alive():
            _spawner = _SpawnThread()
        return _spawner


_Fds = tuple[int, int, int, int]


def run_pipes() -> list[int]:
    """A run's four pipes, close-on-exec: stdin, stdout (PIPE_BYTES where
    allowed), stderr, report (its read end non-blocking), as `in_r, in_w,
    out_r, out_w, err_r, err_w, rep_r, rep_w`."""
    fds: list[int] = []
    try:
        for _ in range(4):
            fds.extend(os.pipe2(os.O_CLOEXEC))
        os.set_blocking(fds[6], False)
        # Above /proc/sys/fs/pipe-max-size for this user: keep the default.
        with contextlib.suppress(OSError):
            fcntl.fcntl(fds[3], fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _popen(jail: Jail) -> tuple[subprocess.Popen[bytes], int, _Fds]:
    cmd = jail.command
    fds = run_pipes()
    try:
        in_r, in_w, out_r, out_w, err_r, err_w, rep_r, rep_w = fds
        argv = [arg.replace("{report_fd}", str(rep_w)) for arg in cmd.argv]
        popen = subprocess.Popen(
            argv,
            stdin=in_r,
            stdout=out_w,
            stderr=err_w,
            cwd=cmd.cwd,
            env=dict(cmd.env),
            close_fds=True,
            pass_fds=(rep_w,),
            start_new_session=True,
        )
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    for fd in (in_r, out_w, err_w, rep_w):
        os.close(fd)
    try:
        jail.spawned(popen.pid)
        pidfd = os.pidfd_open(popen.pid)
    except BaseException:
        os.killpg(popen.pid, signal.SIGKILL)
        jail.killed(popen.pid)
        popen.wait()
        for fd in (in_w, out_r, err_r, rep_r):
            os.close(fd)
        raise
    return popen, pidfd, (in_w, out_r, err_r, rep_r)


async def on_spawn_thread(job: Callable[[], T]) -> T:
    """Run `job` (a fork) on the spawn thread; shielded: a cancel here
    would orphan a child that is being born."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list[outcome.Outcome[T]] = []

    def finish(result: object) -> None:
        box.append(result)  # type: ignore[arg-type]
        token.run_sync_soon(done.set)

    _spawn_thread().submit(job, finish)
    with trio.CancelScope(shield=True):
        await done.wait()
    return box[0].unwrap()


async def spawn(jail: Jail) -> Child:
    """Start the jail's command as the leader of a new session and group.

    Raises:
        RunnerError: `spawn_failed`, naming the errno.
    """
    started_us = time.monotonic_ns() // 1000
    try:
        popen, pidfd, (in_w, out_r, err_r, rep_r) = await on_spawn_thread(lambda: _popen(jail))
    except OSError as e:
        raise RunnerError(
            Reason.SPAWN_FAILED,
            f"cannot start {jail.command.argv[0]}: {e.strerror} (errno {e.errno})",
        ) from None
    return Child(
        pid=popen.pid,
        started_us=started_us,
        pidfd=pidfd,
        stdin=trio.lowlevel.FdStream(in_w),
        stdout=trio.lowlevel.FdStream(out_r),
        stderr=trio.lowlevel.FdStream(err_r),
        report_fd=rep_r,
        jail=jail,
        _popen=popen,
    )
