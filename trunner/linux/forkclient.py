"""Parent side of the fork server (`trunner.worker.forkserver`): start it, hand
it one run at a time, hold each run's leader.

One `ForkServer` serves one pool. The server is started on first use, from
the spawn thread (its parent-death signal follows that thread), in a session
of its own listed with the watchdog, and found dead (its pidfd) is started
again on the next request. A request it dies in fails `spawn_failed`.

Each run's leader is cloned as the parent's own child (CLONE_PARENT), so
the parent waits for it, kills its group and reaps it as it does a cold
helper (`spawn.Child`). Per run, in this order, shielded and bounded:

1. the run's pipes, its link (a socketpair) and an O_PATH descriptor of its
   jail dir, sent with the stage's argv; our copies of the run's ends closed;
2. the server's answer: `ok PID`, or `refused WHY` (`sandbox_setup`);
3. PID must be our child (its parent in /proc is us): unreaped, its pid
   cannot be another process's, so the pidfd taken now is the leader's;
4. `S` and PID on the link: the leader is in a session of its own, so its
   group is PID and a group kill reaches all of it;
5. `jail.spawned(PID)`: the watchdog lists the group;
6. `G` on the link: only now does the leader start the chain (EOF instead,
   as when the parent dies first: it exits).

A failure at 3-6 SIGKILLs the leader by its pid (it has forked nothing
before `G`) and reaps it. A request left unanswered (the server died, or is
stopped after REPLY_BOUND_S) may still have forked a leader: its `S` and pid
on the link, our unreaped child's, name it to kill and reap; EOF says there
is none.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from trunner.errors import Reason, RunnerError
from trunner.kernel import abi
from trunner.linux import watchdog
from trunner.procfs import parent as _parent_of
from trunner.spawn import Child, RunPipes, S, Unowned, abandon, on_spawn_thread

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from trunner.spawn import Spawnable, Spawner

#: How long the server's answer and the leader's `S` may take.
REPLY_BOUND_S = 10.0
#: How long a closed server may take to exit before it is killed.
STOP_BOUND_S = 1.0


@dataclass(eq=False)
class _Server:
    popen: subprocess.Popen[bytes]
    pidfd: int
    control: socket.socket
    stderr: int

    def exited(self) -> bool:
        return bool(_poll(self.pidfd))

    def said(self) -> str:
        """Its exit and the end of its stderr, once it is reaped."""
        code = self.popen.returncode
        text = f"exited {code}" if code is None or code >= 0 else f"was killed by signal {-code}"
        with contextlib.suppress(OSError):
            tail = os.read(self.stderr, 1 << 16)[-500:].decode(errors="replace").strip()
            if tail:
                text += f" (stderr: {tail})"
        return text


class ForkServer:
    """The fork server of one pool; `spawn(jail)` starts one run's leader."""

    def __init__(self, launch: Sequence[str], env: Mapping[str, str], mode: str) -> None:
        self._launch = tuple(launch)
        self._env = dict(env)
        #: A built-in mode is served in the run's pid 2 without an exec.
        self.in_process = mode if mode in abi.BUILTIN_MODES else ""
        self._server: _Server | None = None
        self._lock = trio.Lock()
        #: Servers started (the first one included).
        self.starts = 0
        #: Requests that failed because the server died with them.
        self.losses = 0
        #: Leaders forked by a server lost before its answer, found and reaped.
        self.strays = 0
        #: What the last server stopped said (its exit, its stderr).
        self._said = ""

    @property
    def pid(self) -> int | None:
        """The live server's pid (tests: what a run must not reach)."""
        return None if self._server is None else self._server.popen.pid

    async def __aenter__(self) -> ForkServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> str:
        """Close the channel and see the server gone (what it said: its exit,
        its stderr). Shielded, idempotent."""
        said = ""
        with trio.CancelScope(shield=True):
            server, self._server = self._server, None
            if server is not None:
                said = self._said = await _stop(server)
        return said

    async def start(self) -> None:
        """Start the server now, not on the first run (a warm Runner's block:
        its failure leaves the `async with`, and no run waits for it).

        Raises:
            RunnerError: `spawn_failed`, naming the errno.
        """
        async with self._lock:
            if self._server is None:
                try:
                    self._server = await on_spawn_thread(self._start)
                except OSError as e:
                    raise RunnerError(Reason.SPAWN_FAILED, f"fork server: {e.strerror} (errno"
                                      f" {e.errno})") from None
                self.starts += 1

    def serving(self, mode: str) -> Spawner:
        """This server, for jails of `mode`: one server serves every mode (the
        mode is in each run's message), pid 2 in-process for a built-in one."""
        return _Serving(self, mode)

    async def spawn(self, jail: S, *, stdio: str = "pipes") -> Child[S]:
        """Start `jail`'s leader through the server (see the module's steps).
        With `stdio` other than "pipes", the message carries the program's
        stdout pipe (or a pty's socket) too (`abi.STREAM_RUN_FDS`).

        Raises:
            RunnerError: `sandbox_setup` (refused), `spawn_failed`.
        """
        fds = str(abi.REPORT_FD) if stdio == "pipes" else f"{abi.REPORT_FD},{abi.STREAM_FD}"
        stage = [arg.replace("{report_fd}", fds) for arg in jail.stage]
        message = marshal.dumps((stage, jail.in_process))
        link, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with trio.CancelScope(shield=True):
            try:
                with trio.fail_after(REPLY_BOUND_S):
                    child = await self._spawn(jail, message, link, theirs, stdio)
            except OSError as e:
                raise RunnerError(Reason.SPAWN_FAILED, f"fork server: {e.strerror} (errno"
                                  f" {e.errno})") from None
            except trio.TooSlowError:
                raise RunnerError(Reason.SPAWN_FAILED, f"fork server: no leader within"
                                  f" {REPLY_BOUND_S} s; it {self._said or 'was stopped'}"
                                  ) from None
            finally:
                link.close()
        return child

    async def _spawn(self, jail: S, message: bytes, link: socket.socket,
                     theirs: socket.socket, stdio: str) -> Child[S]:
        started_us = time.monotonic_ns() // 1000
        with RunPipes(stdio=stdio) as pipes, contextlib.ExitStack() as sent:
            sent.callback(theirs.close)
            jail_dir = os.open(jail.jail_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            sent.callback(os.close, jail_dir)
            fds = [*pipes.theirs[:4], theirs.fileno(), jail_dir]
            if stdio != "pipes":
                fds.append(pipes.theirs.program_stdout)
            assert len(fds) == (abi.RUN_FDS if stdio == "pipes" else abi.STREAM_RUN_FDS)
            unanswered = False
            try:
                async with self._lock:
                    pid = await self._request(message, fds)
            except (RunnerError, trio.Cancelled) as e:
                unanswered = isinstance(e, trio.Cancelled) or e.reason is Reason.SPAWN_FAILED
                raise
            finally:
                sent.close()  # the server has its copies, or will never use them
                pipes.close_theirs()
                if unanswered:  # the server is gone, or is stopped now (it may
                    await self.aclose()  # answer late: never to the next run)
                    self.strays += await _reap_stray(link)
            pidfd = await _hold(pid, link, jail)
            return Child.adopt(pid, pidfd, pipes.take(), jail, started_us)

    async def _request(self, message: bytes, fds: list[int]) -> int:
        """One message on the channel, one answer: the leader's pid."""
        if self._server is not None and self._server.exited():
            await self.aclose()  # died between runs: a new one serves this run
        if self._server is None:
            self._server = await on_spawn_thread(self._start)
            self.starts += 1
        server = self._server
        try:
            socket.send_fds(server.control, [message], fds)
            answer = await _receive(server.control, 4096)
        except (BrokenPipeError, ConnectionResetError):
            answer = b""
        if not answer:  # EOF: it died with the request
            self.losses += 1
            said = await self.aclose()
            raise RunnerError(Reason.SPAWN_FAILED, f"the fork server {said} before it started"
                              " the run; the next run starts a new one")
        word, _, rest = answer.partition(b" ")
        if word == abi.SERVER_OK and rest.isdigit():
            return int(rest)
        if word == abi.SERVER_REFUSED:
            raise RunnerError(Reason.SANDBOX_SETUP,
                              f"fork server: {rest.decode(errors='replace')}")
        await self.aclose()
        raise RunnerError(Reason.SPAWN_FAILED, f"fork server: unexpected answer {answer[:80]!r}")

    def _start(self) -> _Server:
        """On the spawn thread: the server process and its channel."""
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            popen = subprocess.Popen(
                [*self._launch, "server", str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_w, cwd="/",
                env=self._env, close_fds=True, pass_fds=(theirs.fileno(),),
                start_new_session=True)
        except BaseException:
            control.close()
            os.close(err_r)
            raise
        finally:
            theirs.close()
            os.close(err_w)
        try:
            watchdog.watch(popen.pid, None)
            pidfd = os.pidfd_open(popen.pid)
        except BaseException:
            os.killpg(popen.pid, signal.SIGKILL)
            watchdog.unwatch(popen.pid)
            popen.wait()
            control.close()
            os.close(err_r)
            raise
        control.setblocking(False)
        os.set_blocking(err_r, False)
        return _Server(popen, pidfd, control, err_r)


class _Serving(Unowned):
    """A `ForkServer` for jails of one mode; its owner closes the server."""

    def __init__(self, server: ForkServer, mode: str) -> None:
        self._server = server
        self.in_process = mode if mode in abi.BUILTIN_MODES else ""

    @property
    def losses(self) -> int:
        return self._server.losses

    async def spawn(self, jail: S, *, stdio: str = "pipes") -> Child[S]:
        return await self._server.spawn(jail, stdio=stdio)

    async def start(self) -> None:
        await self._server.start()

    def serving(self, mode: str) -> Spawner:
        return self._server.serving(mode)


async def _hold(pid: int, link: socket.socket, jail: Spawnable) -> int:
    """Steps 3-6 of the module's docstring: a pidfd of the leader."""
    listed = False
    pidfd = -1
    try:
        if not _is_child(pid):
            raise RunnerError(Reason.SANDBOX_SETUP, f"fork server: pid {pid} is not the"
                              " runner's child")
        pidfd = os.pidfd_open(pid)
        link.setblocking(False)
        if await _receive(link, 32) != abi.LEADER_IN_SESSION + b"%d" % pid:
            raise RunnerError(Reason.SPAWN_FAILED, "the run's leader exited before its session"
                              " was made")
        jail.spawned(pid)
        listed = True
        link.send(abi.LEADER_GO)
        return pidfd
    except BaseException:
        if pidfd >= 0:  # our unreaped child: the pid is its
            await abandon(pid, pidfd, jail if listed else None)
        raise


def _is_child(pid: int) -> bool:
    """Whether `pid` is our unreaped child (its parent in /proc is us): a
    `waitid` that neither waits nor reaps, one syscall where /proc/PID/stat
    is a file the kernel formats."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


async def _receive(sock: socket.socket, size: int) -> bytes:
    """One message from a non-blocking socket: at once if it is there (the
    peer usually answered while our send woke it), else once it comes."""
    try:
        return sock.recv(size)
    except BlockingIOError:
        await trio.lowlevel.wait_readable(sock)
        return sock.recv(size)


async def _reap_stray(link: socket.socket) -> bool:
    """After the server was lost with a request: a leader it forked first
    says `S` and its pid on the link (EOF if there is none, the server's copy
    of the link being closed with it); it is our unreaped child, killed by
    its pid and reaped (True)."""
    link.setblocking(False)
    with trio.CancelScope(shield=True), trio.move_on_after(REPLY_BOUND_S):
        await trio.lowlevel.wait_readable(link)
        said = link.recv(32)
        mark = abi.LEADER_IN_SESSION
        if said[:1] == mark and said[1:].isdigit() and _parent_of(pid := int(said[1:])) == (
                os.getpid()):
            await abandon(pid, -1, None)
            return True
    return False


def _poll(fd: int) -> int:
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return len(poller.poll(0))


async def _stop(server: _Server) -> str:
    """EOF on the channel ends the server; a bounded wait, then its group's
    kill, its unlisting and its reap; what it said."""
    server.control.close()
    with trio.move_on_after(STOP_BOUND_S):
        await trio.lowlevel.wait_readable(server.pidfd)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.popen.pid, signal.SIGKILL)  # unreaped: the group is its
    watchdog.unwatch(server.popen.pid)
    await trio.lowlevel.wait_readable(server.pidfd)
    server.popen.wait()  # it has exited (its pidfd said so)
    os.close(server.pidfd)
    try:
        return server.said()
    finally:
        os.close(server.stderr)
