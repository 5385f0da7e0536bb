"""Processes you can talk to: `Runner.open_process`, an `exec` run whose
program's stdin, stdout and stderr are the caller's streams while it runs.

The program's three pipes are the parent's own: stdin is the helper's fd 0
after the request frame, stdout a fifth pipe (`abi.STREAM_FD` in the jail),
stderr the helper's fd 2; the exec adapter hands them to the program and
keeps only fd 1, on which it writes its one reply frame (exit and usage, no
output) once the program's tree is gone. The parent caps what the caller
reads (`CappedStream`) and, after the `async with` body, drains and caps
the rest; a cap, the deadline or a limit the adapter reports ends the run
with the same `RunnerError` as `exec`, and no result. Streamed bytes are
unverified output: only `StreamingProcess.result` is a verdict.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import termios
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, final

import msgspec
import trio

from trunner import exec_checks, invocation
from trunner.errors import Reason, RunnerError
from trunner.nursery_run import Drain
from trunner.protocol import ExecResult, encode_frame
from trunner.spawn import COLD

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping, Sequence

    from trunner.invocation import Result
    from trunner.jail import JailBackend
    from trunner.limits import Limits
    from trunner.protocol import ExecFile
    from trunner.spawn import Spawner

#: Largest single read a `CappedStream` asks of its pipe.
READ_CHUNK_BYTES = 64 * 1024


@final
class CappedStream(trio.abc.ReceiveStream):
    """A program's output stream as the caller reads it: unverified bytes,
    at most `cap_bytes` of them; the read that would go past the cap ends
    the run instead (`on_breach`) and raises `trio.Cancelled` in the body
    (the `async with` then raises the cap's `RunnerError`)."""

    def __init__(self, stream: trio.abc.ReceiveStream, cap_bytes: int, reason: Reason,
                 on_breach: Callable[[Reason, str], None], *, pty: bool = False) -> None:
        self._stream = stream
        self._pty = pty
        self.cap_bytes = cap_bytes
        #: Bytes received so far.
        self.received_bytes = 0
        self._reason = reason
        self._on_breach = on_breach

    @property
    def left_bytes(self) -> int:
        return max(self.cap_bytes - self.received_bytes, 0)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        want = self.cap_bytes - self.received_bytes + 1  # one past the cap shows a breach
        want = min(want, max_bytes or READ_CHUNK_BYTES, READ_CHUNK_BYTES)
        try:
            chunk = await self._stream.receive_some(want)
        except trio.BrokenResourceError as e:
            # A pty's controlling side reads EIO once no process holds the
            # other side: its end of file.
            if self._pty and isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.EIO:
                return b""
            raise
        self.received_bytes += len(chunk)
        if self.received_bytes > self.cap_bytes:
            name = self._reason.value.removesuffix("_cap")
            self._on_breach(self._reason, f"{name} went over its cap of {self.cap_bytes} bytes")
            await trio.lowlevel.checkpoint()  # raises Cancelled: the body's scope is cancelled
            raise trio.BrokenResourceError(f"{name} went over its cap")  # a shielded reader
        return chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


@final
class _Ended(trio.abc.ReceiveStream):
    """A stream at its end: a pty's `stderr` (its output is all on `stdout`)."""

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        return b""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@final
class StreamingProcess:
    """A jailed program the caller talks to (`Runner.open_process`).

    `stdin` is a trio `SendStream` (close it for EOF; with a pty, send
    b"\\x04" instead: closing it closes the pty); `stdout` and `stderr` are
    `CappedStream`s (with a pty, `stdout` carries both, and `stderr` is at
    its end). Their bytes are unverified output, never a result. `result`
    is None until the `async with` ends cleanly: then the exec adapter's
    verified `ExecResult` (exit, usage; no output) with the rules version."""

    def __init__(self, stdin: trio.abc.SendStream, stdout: CappedStream,
                 stderr: trio.abc.ReceiveStream, pty_fd: int = -1) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.result: Result[ExecResult] | None = None
        self._pty_fd = pty_fd

    @property
    def is_pty(self) -> bool:
        return self._pty_fd >= 0

    def set_window_size(self, *, rows: int, columns: int) -> None:
        """Set the pty's window size (the program gets SIGWINCH).

        Raises:
            ValueError: not a pty (`open_process(..., pty=True)`), or a size
                out of 0..65535.
        """
        if self._pty_fd < 0:
            raise ValueError("set_window_size needs open_process(..., pty=True)")
        if not (0 <= rows <= 0xFFFF and 0 <= columns <= 0xFFFF):
            raise ValueError("rows and columns must be within 0..65535")
        fcntl.ioctl(self._pty_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


@asynccontextmanager
async def open_process(
    backend: JailBackend, adapter_argv: Sequence[str], limits: Limits, temp_root: str | None,
    argv: Sequence[str], *, files: Mapping[str, bytes | ExecFile] | None = None,
    env: Mapping[str, str] | None = None, pty: bool = False, spawner: Spawner = COLD,
) -> AsyncIterator[StreamingProcess]:
    """`Runner.open_process`'s pipeline: check, start cold with a stream
    pipe (or a socket, for a pty), send the request frame, (receive the
    pty,) hand the streams to the body, then see the run to its end and
    judge it."""
    stdio = "pty" if pty else "stream"
    with invocation.only_runner_errors():
        request, caps = exec_checks.exec_request(argv, b"", files, (), limits, env)
        request = msgspec.structs.replace(request, stdio=stdio)
        frame = encode_frame(request)
        version = backend.rules_version(limits, stdio=stdio)
    started = await invocation.start(backend, adapter_argv, limits, temp_root, spawner,
                                     stdio=stdio)
    child = started.child
    assert child.program_stdout is not None
    breach: list[tuple[Reason, str]] = []
    body = trio.CancelScope()

    def on_breach(reason: Reason, detail: str) -> None:
        if not breach:
            breach.append((reason, detail))
        child.kill_group()
        body.cancel(reason=reason.value)

    control: trio.lowlevel.FdStream | None = None
    concluded = False  # the run was seen to its end (and its jail closed) before the body
    deadline = trio.current_time() + caps.wall_time_s
    try:
        with invocation.only_runner_errors():
            started.jail.admit(len(frame))
            # The frame goes first on the program's stdin pipe: the adapter
            # reads exactly its length, the program everything after it.
            sent, fd = False, None
            with trio.move_on_at(deadline):
                try:
                    await child.stdin.send_all(frame)
                    sent = True
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the helper or the adapter ended first: its end says why
                if sent and pty:
                    fd = await _receive_pty(child.program_stdout)
            if not sent or (pty and fd is None):
                # Refused, failed, or past the deadline: the run's end says which.
                outcome = await invocation.serve(
                    started, b"", invocation.Caps(
                        max(deadline - trio.current_time(), 0.0), caps.stdout_max_bytes,
                        caps.stderr_max_bytes, program_only=True))
                concluded = True
                invocation.judge(outcome, started.jail, caps.stdout_max_bytes, ExecResult)
                raise RunnerError(Reason.INTERNAL_ERROR, "the exec adapter took no request"
                                  " or sent no pty, yet replied")
            if fd is not None:
                control = trio.lowlevel.FdStream(fd)
        if control is not None:
            process = StreamingProcess(
                control,
                CappedStream(control, limits.stdout_max_bytes, Reason.STDOUT_CAP, on_breach,
                             pty=True),
                _Ended(), control.fileno())
        else:
            process = StreamingProcess(
                child.stdin,
                CappedStream(child.program_stdout, limits.stdout_max_bytes, Reason.STDOUT_CAP,
                             on_breach),
                CappedStream(child.stderr, limits.stderr_max_bytes, Reason.STDERR_CAP,
                             on_breach))
        body.deadline = deadline
        with body:
            yield process
        if body.cancelled_caught and not breach:
            breach.append((Reason.TIMEOUT, "the wall-clock deadline passed"))
    except BaseException:
        # The caller's own exception or cancellation: nothing of the run is
        # left when it propagates.
        with trio.CancelScope(shield=True):
            if control is not None:
                await control.aclose()
            if not concluded:
                await invocation.discard(started)
        raise
    left = 0.0 if breach else max(deadline - trio.current_time(), 0.0)
    unread = control if control is not None else child.program_stdout
    streams = [Drain(unread, process.stdout.left_bytes, Reason.STDOUT_CAP,
                     limits.stdout_max_bytes)]
    try:
        outcome = await invocation.serve(
            started, b"", invocation.Caps(
                left, caps.stdout_max_bytes,
                process.stderr.left_bytes if isinstance(process.stderr, CappedStream)
                else limits.stderr_max_bytes, program_only=True), streams=streams)
    finally:
        if control is not None:
            with trio.CancelScope(shield=True):
                await control.aclose()
    if outcome.failure is Reason.STDERR_CAP:
        outcome.detail = f"stderr went over its cap of {limits.stderr_max_bytes} bytes"
    if breach:  # the first breach, in the body, wins over the kill that followed it
        outcome.failure, outcome.detail = breach[0]
    with invocation.only_runner_errors():
        response: Any = invocation.judge(outcome, started.jail, caps.stdout_max_bytes,
                                         ExecResult)
        exec_checks.check_exec_reply(response, limits, ())
        usage = invocation.exec_usage(response.usage, started.jail)
        if usage is not response.usage:
            response = msgspec.structs.replace(response, usage=usage)
        process.result = invocation.Result(response, version, usage)


async def _receive_pty(link: trio.lowlevel.FdStream) -> int | None:
    """The pty's controlling side, as the exec adapter sends it on `link`
    (one byte and one descriptor); None if it closes the link instead."""
    sock = trio.socket.from_stdlib_socket(socket.socket(fileno=os.dup(link.fileno())))
    with sock:
        data, ancillary, _, _ = await sock.recvmsg(1, socket.CMSG_SPACE(4))
    fds = [fd for level, kind, payload in ancillary
           if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
           for fd in struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])]
    for extra in fds[1:]:
        os.close(extra)
    if data != b"p" or not fds:
        if fds:
            os.close(fds[0])
        return None
    control: int = fds[0]
    return control
