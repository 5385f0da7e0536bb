"""Starting a child and owning its pid until it is reaped.

Every child is forked from one long-lived thread, so that a parent-death
signal armed in the child (it follows the forking *thread*) fires only when
the process dies; trio's own spawn forks from a worker thread it retires
after idling. The parent keeps a pidfd so it can wait for exit without
reaping, kill the group while the leader's pid is still held, then reap.
Besides stdio, the child gets the write end of a report pipe; its number is
appended to argv's helper stage by the backend's command (`{report_fd}`).
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
from typing import TYPE_CHECKING

import outcome
import trio

from trunner.errors import Reason, RunnerError
from trunner.helper import JAIL_PID_NOTE
from trunner.linux import watchdog

if TYPE_CHECKING:
    from collections.abc import Callable

    from trunner.jail import Command

#: Pipe buffer asked for on stdout: 1 MiB reads then move a whole pipe at once.
PIPE_BYTES = 1024 * 1024


def _live_members(pgid: int) -> bool:
    """Whether a process of group `pgid` is alive (not a zombie): /proc/PID/stat
    has the state and the pgrp after the command's closing parenthesis."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state, _ppid, pgrp = f.read().rsplit(b")", 1)[1].split()[:3]
        except OSError:
            continue  # gone while we looked
        if int(pgrp) == pgid and state not in (b"Z", b"X"):
            return True
    return False


@dataclass(eq=False)
class Child:
    """A spawned process-group leader that has not been reaped yet."""

    pid: int
    pidfd: int
    #: CLOCK_MONOTONIC at spawn, in microseconds (kernel log records of this
    #: pid from before then belong to an earlier process with the same pid).
    started_us: int
    stdin: trio.lowlevel.FdStream
    stdout: trio.lowlevel.FdStream
    stderr: trio.lowlevel.FdStream
    #: Read end of the helper's report pipe (non-blocking).
    report: int
    _popen: subprocess.Popen[bytes]
    wait_status: int | None = None
    #: The jail's own host pid (the helper's child in the PID namespace),
    #: when the helper noted it on the report pipe (a seccomp death).
    jail_pid: int | None = None

    async def wait_exit(self) -> None:
        """Wait until the leader exits, without reaping it."""
        await trio.lowlevel.wait_readable(self.pidfd)

    def kill_group(self) -> None:
        """SIGKILL the whole process group. Safe until `reap()`: the
        unreaped leader holds the pgid, so it cannot name another group."""
        if self.wait_status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    def reap(self) -> int:
        """Collect the exited leader, after `kill_group()`; returns the raw
        wait status."""
        if self.wait_status is None:
            watchdog.unwatch(self.pid)
            _, status = os.waitpid(self.pid, 0)
            self.wait_status = status
            self._popen.returncode = os.waitstatus_to_exitcode(status)
            os.close(self.pidfd)
        return self.wait_status

    async def wait_group_gone(self, bound_s: float = 1.0) -> None:
        """After `kill_group()` and `reap()`: wait, at most `bound_s`, until
        no member of the group is alive (a zombie is dead). SIGKILL is
        delivered asynchronously: a descendant may still be exiting when the
        leader is reaped (as root the run's cgroup is emptied too; not root,
        this is the only wait). Members cannot leave the group (setsid and
        setpgid are denied) nor fork once killed. Only signal 0 is sent after
        the reap: the pgid names this group while any member holds it."""
        deadline = trio.current_time() + bound_s
        while True:
            try:
                os.killpg(self.pid, 0)  # the usual case: no member at all
            except (ProcessLookupError, PermissionError):
                return
            if not _live_members(self.pid) or trio.current_time() >= deadline:
                return
            await trio.sleep(0.001)

    def read_report(self) -> str | None:
        """After `reap()`: the helper's refusal, or None if it exec'd the
        adapter (the pipe reached EOF with nothing in it). Closes the pipe."""
        data = b""
        try:
            while chunk := os.read(self.report, 4096):
                data += chunk
        except BlockingIOError:
            pass  # a writer is left (impossible once reaped): no report
        finally:
            os.close(self.report)
        if data.startswith(JAIL_PID_NOTE):  # a note, not a refusal
            note, _, data = data.partition(b"\n")
            self.jail_pid = int(note[len(JAIL_PID_NOTE):])
        return data.decode(errors="replace") if data else None

    async def aclose_streams(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            await stream.aclose()


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


def _popen(cmd: Command) -> tuple[subprocess.Popen[bytes], int, _Fds]:
    fds: list[int] = []
    try:
        for _ in range(4):
            fds.extend(os.pipe2(os.O_CLOEXEC))
        in_r, in_w, out_r, out_w, err_r, err_w, rep_r, rep_w = fds
        os.set_blocking(rep_r, False)
        # Above /proc/sys/fs/pipe-max-size for this user: keep the default.
        with contextlib.suppress(OSError):
            fcntl.fcntl(out_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
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
        watchdog.watch(popen.pid, cmd.cgroup, cmd.jail_dir)
        pidfd = os.pidfd_open(popen.pid)
    except BaseException:
        watchdog.unwatch(popen.pid)
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        for fd in (in_w, out_r, err_r, rep_r):
            os.close(fd)
        raise
    return popen, pidfd, (in_w, out_r, err_r, rep_r)


async def spawn(cmd: Command) -> Child:
    """Start `cmd` as the leader of a new session and process group.

    Raises:
        RunnerError: `spawn_failed`, naming the errno.
    """
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list[outcome.Outcome[tuple[subprocess.Popen[bytes], int, _Fds]]] = []

    def finish(result: object) -> None:
        box.append(result)  # type: ignore[arg-type]
        token.run_sync_soon(done.set)

    started_us = time.monotonic_ns() // 1000
    _spawn_thread().submit(lambda: _popen(cmd), finish)
    # Shielded: a cancel here would orphan a child that is being born.
    with trio.CancelScope(shield=True):
        await done.wait()
    try:
        popen, pidfd, (in_w, out_r, err_r, rep_r) = box[0].unwrap()
    except OSError as e:
        raise RunnerError(
            Reason.SPAWN_FAILED, f"cannot start {cmd.argv[0]}: {e.strerror} (errno {e.errno})"
        ) from None
    return Child(
        pid=popen.pid,
        started_us=started_us,
        pidfd=pidfd,
        stdin=trio.lowlevel.FdStream(in_w),
        stdout=trio.lowlevel.FdStream(out_r),
        stderr=trio.lowlevel.FdStream(err_r),
        report=rep_r,
        _popen=popen,
    )
