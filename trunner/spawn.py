"""Starting a jail's first stage and owning its leader until nothing of it is left.

One interface, `Spawner`, starts every jail: the cold spawner here (a
fork and exec of the helper each run, a session's commands too: their
jail, not the spawner, says to join the session's namespaces) and a pool's
fork server (`trunner.linux.forkclient`). Each
hands back a `Child`, made by `Child.adopt` only once its leader is the
parent's own unreaped child, in a session and group of its own, listed
with the watchdog; before that, `abandon` is the one cleanup. Every fork
here happens on one long-lived thread, so that a parent-death signal
armed in the child (it follows the forking *thread*) fires only when the
process dies; trio's own spawn forks from a worker thread it retires
after idling. The parent keeps a pidfd so it can wait for exit without
reaping, kill the group while the leader's pid is still held, then reap.
Besides stdio, the child gets the write end of a report pipe; its number
is put in argv's helper stage (`{report_fd}`). `Child.aclose()` is the one
teardown, on every path. What a spawner needs of a jail is `Spawnable`
(a `trunner.jail.Jail` is one): this module imports no jail type.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping  # noqa: TC003  annotates the Command dataclass: kept real
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, Self, TypeVar

import outcome
import trio

from trunner.errors import Reason, RunnerError

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

#: Pipe buffer asked for on stdout: 1 MiB reads then move a whole pipe at once.
PIPE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Command:
    """What to start: argv, the complete environment, the working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str


class Ending(Protocol):
    """What a `Child` tells its jail at its end."""

    def killed(self, pgid: int) -> None:
        """The group was SIGKILLed; its leader is about to be reaped."""

    async def wait_gone(self, pgid: int, report: bytes) -> None:
        """After the leader's reap: wait, bounded, until no process of the
        run is left."""


class Spawnable(Ending, Protocol):
    """What a spawner needs of a jail (`trunner.jail.Jail` has it all)."""

    #: The cold start: argv (its helper stage holding `{report_fd}`), env, cwd.
    command: Command
    #: The host dir the jail's first stage runs in.
    jail_dir: str
    #: The helper's own argv (`PLAN {report_fd} -- ADAPTER...`): what a
    #: fork server's leader runs.
    stage: tuple[str, ...]
    #: The built-in mode its pid 2 serves in-process instead of exec'ing
    #: its adapter ("": none), decided when the jail was opened.
    in_process: str

    def spawned(self, pgid: int) -> None:
        """The command runs as group `pgid`: list it with the watchdog."""


class Spawner(Protocol):
    """Starts jails' first stages as the parent's children. An async
    context manager: at its end it stops what it started (a fork server);
    it starts again on the next `spawn`."""

    #: The built-in mode its jails' pid 2 serve in-process ("": each execs
    #: its adapter): what the jail is opened with.
    in_process: str
    @property
    def losses(self) -> int:
        """Requests that failed because a server died with them."""

    async def spawn(self, jail: S, *, stdio: str = "pipes") -> Child[S]:
        """Start `jail`'s first stage as the parent's child, its group
        listed with the watchdog; with `stdio` "stream", with a fifth pipe,
        the program's own stdout, with "pty" a socket, on which the pty
        comes (`Child.program_stdout`, `RunPipes`). Raises `RunnerError`."""

    async def start(self) -> None:
        """Start what it serves from now (a fork server), not on first use."""

    def serving(self, mode: str) -> Spawner:
        """This spawner, for jails of `mode` (a built-in mode's pid 2 served
        in-process by a fork server): one server serves every mode."""

    async def aclose(self) -> object:
        """Stop what it started."""

    async def __aenter__(self) -> Spawner: ...

    async def __aexit__(self, *exc: object) -> object: ...


class Pipes(NamedTuple):
    """The parent's ends of one run's pipes."""

    stdin: int
    stdout: int
    stderr: int
    report: int
    #: A streaming run's program stdout, or a pty's socket (`abi.STREAM_FD`
    #: in the jail), else -1.
    program_stdout: int = -1


J = TypeVar("J", bound=Ending, covariant=True)
E = TypeVar("E", bound=Ending)
S = TypeVar("S", bound=Spawnable)


@dataclass(eq=False)
class Child(Generic[J]):
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
    jail: J
    #: A streaming run's program stdout (its stdin and stderr are `stdin`
    #: and `stderr`; `stdout` carries the adapter's reply alone), or, for a
    #: pty, the socket the pty's controlling side comes on; else None.
    program_stdout: trio.lowlevel.FdStream | None = None
    #: Once closed: the leader's exit code (negative: killed by that
    #: signal) and everything the report pipe carried.
    exit_code: int | None = None
    report: bytes = b""
    _closed: bool = False

    @classmethod
    def adopt(cls, pid: int, pidfd: int, pipes: Pipes, jail: E, started_us: int) -> Child[E]:
        """The `Child` of a leader that is the parent's unreaped child, in a
        session of its own, listed with the watchdog; it owns `pidfd` and
        `pipes` from now on."""
        return Child(pid=pid, pidfd=pidfd, started_us=started_us,
                     stdin=trio.lowlevel.FdStream(pipes.stdin),
                     stdout=trio.lowlevel.FdStream(pipes.stdout),
                     stderr=trio.lowlevel.FdStream(pipes.stderr), report_fd=pipes.report,
                     jail=jail,
                     program_stdout=(trio.lowlevel.FdStream(pipes.program_stdout)
                                     if pipes.program_stdout >= 0 else None))

    def report_so_far(self) -> bytes:
        """What the report pipe carries until now (kept in `report`): a
        session reads its jail's pid 1 there while the jail lives."""
        self.report += _read_all(self.report_fd)
        return self.report

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
                os.close(self.pidfd)
                self.report += _read_all(self.report_fd)
                await self.jail.wait_gone(self.pid, self.report)
            finally:
                os.close(self.report_fd)
                for stream in (self.stdin, self.stdout, self.stderr, self.program_stdout):
                    if stream is not None:
                        await stream.aclose()


async def abandon(pid: int, pidfd: int, listed: Ending | None) -> None:
    """The one cleanup of a leader that failed before its `Child` existed.
    It is the parent's unreaped child, so its pid (and a group of that id)
    is still its own: SIGKILL both, unlist it (`listed`: the jail it was
    listed with), wait for its exit (by `pidfd`, if any: -1 for none) and
    reap it. Shielded."""
    with trio.CancelScope(shield=True):
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)
        if listed is not None:
            listed.killed(pid)
        if pidfd >= 0:
            await trio.lowlevel.wait_readable(pidfd)
            os.close(pidfd)
        # It has exited (its pidfd said so), or will at once: SIGKILLed, it
        # has started nothing of the run yet.
        os.waitpid(pid, 0)  # noqa: ASYNC222


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


_thread: _SpawnThread | None = None
_thread_lock = threading.Lock()


def _spawn_thread() -> _SpawnThread:
    global _thread
    with _thread_lock:
        if _thread is None or not _thread._thread.is_alive():
            _thread = _SpawnThread()
        return _thread


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


class RunPipes:
    """A run's four pipes, close-on-exec (stdout PIPE_BYTES where allowed,
    the report's read end non-blocking), built under an ExitStack as trio's
    own spawn does: `theirs` are the child's ends, closed once it has them
    (`close_theirs`); `take()` hands ours to a `Child`; on an error, whatever
    is still held is closed."""

    def __init__(self, *, stdio: str = "pipes") -> None:
        self._stack = contextlib.ExitStack()
        ours: list[int] = []
        theirs: list[int] = []
        try:
            for i in range(4 if stdio == "pipes" else 5):
                if i == 4 and stdio == "pty":
                    r, w = (s.detach() for s in socket.socketpair(socket.AF_UNIX,
                                                                  socket.SOCK_STREAM))
                    os.set_inheritable(r, False)
                    os.set_inheritable(w, False)
                else:
                    r, w = os.pipe2(os.O_CLOEXEC)
                self._stack.callback(_close_quietly, r)
                self._stack.callback(_close_quietly, w)
                ours.append(w if i == 0 else r)
                theirs.append(r if i == 0 else w)
            os.set_blocking(ours[3], False)
            # Above /proc/sys/fs/pipe-max-size for this user: keep the default.
            with contextlib.suppress(OSError):
                fcntl.fcntl(theirs[1], fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except BaseException:
            self._stack.close()
            raise
        self.ours = Pipes(*ours)
        #: stdin's read end, stdout's and stderr's write ends, the report's write end.
        self.theirs = Pipes(*theirs)

    def __enter__(self) -> RunPipes:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def close_theirs(self) -> None:
        for fd in self.theirs:
            _close_quietly(fd)
        self.theirs = Pipes(-1, -1, -1, -1, -1)

    def take(self) -> Pipes:
        """Ours, now the caller's to close; nothing is closed at exit."""
        self._stack.pop_all()
        self.close_theirs()
        return self.ours


def _close_quietly(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


class Unowned:
    """A spawner that stops nothing itself (the cold one, a view of a fork
    server its owner closes): `aclose` and its `async with` do nothing."""

    async def aclose(self) -> None:
        pass

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


class ColdSpawner(Unowned):
    """The cold spawner: a fork and exec of the jail's command each run."""

    in_process = ""
    losses = 0

    async def spawn(self, jail: S, *, stdio: str = "pipes") -> Child[S]:
        """Start the jail's command as the leader of a new session and group
        (with `stdio`, as `Spawner.spawn`).

        Raises:
            RunnerError: `spawn_failed`, naming the errno.
        """
        started_us = time.monotonic_ns() // 1000
        try:
            with RunPipes(stdio=stdio) as pipes:
                theirs = pipes.theirs
                pid = await on_spawn_thread(lambda: _popen(jail.command, theirs))
                pipes.close_theirs()
                pidfd, listed = -1, False
                try:
                    jail.spawned(pid)
                    listed = True
                    pidfd = os.pidfd_open(pid)
                except BaseException:
                    await abandon(pid, pidfd, jail if listed else None)
                    raise
                return Child.adopt(pid, pidfd, pipes.take(), jail, started_us)
        except OSError as e:
            raise RunnerError(
                Reason.SPAWN_FAILED,
                f"cannot start {jail.command.argv[0]}: {e.strerror} (errno {e.errno})",
            ) from None

    async def start(self) -> None:
        pass

    def serving(self, mode: str) -> ColdSpawner:
        return self


#: The one cold spawner (it holds nothing).
COLD = ColdSpawner()


async def spawn(jail: S) -> Child[S]:
    """`COLD.spawn(jail)`."""
    return await COLD.spawn(jail)


def _popen(cmd: Command, theirs: Pipes) -> int:
    """On the spawn thread: `cmd` as our child, the leader of a new session."""
    fds = str(theirs.report)
    if theirs.program_stdout >= 0:  # the helper's `FD,STREAM`
        fds += f",{theirs.program_stdout}"
    argv = [arg.replace("{report_fd}", fds) for arg in cmd.argv]
    popen = subprocess.Popen(
        argv,
        stdin=theirs.stdin,
        stdout=theirs.stdout,
        stderr=theirs.stderr,
        cwd=cmd.cwd,
        env=dict(cmd.env),
        close_fds=True,
        pass_fds=tuple(fd for fd in (theirs.report, theirs.program_stdout) if fd >= 0),
        start_new_session=True,
    )
    # `Child.aclose` reaps the leader by its pid. A Popen never waited on
    # would reap it behind our back once collected: it is marked done.
    popen.returncode = 0
    return popen.pid
