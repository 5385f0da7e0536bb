"""Adapter modes: read one request frame from stdin, write one response frame.

Built in: `echo` (returns its request), `exec` (exec_mode.py) and `files`
(files_mode.py: the working dir's files, read and written). They read
and write with wire.py, a standard-library codec, so a jailed built-in
adapter imports neither msgspec nor typing (it starts as `python -I -S`,
see `adapter_argv`). A user mode, a `package.module:function` spec, gets
msgspec, imported only then, so it may return anything msgspec encodes
(Structs, dataclasses, datetimes). An exception exits 1 with its traceback
on stderr and no frame. After the frame is written the process leaves with
`posix._exit(0)`, skipping interpreter teardown.

A user mode's stdout is the user's: before its module is imported, the
response pipe (fd 1) moves to a private descriptor (close-on-exec) and fd 1
becomes a copy of stderr, so `print()` and `sys.stdout` writes land on the
run's stderr (within its cap) and never in the frame. Code in the same
process could still find that descriptor: this keeps stray output out of
the frame, it is no wall (a user mode writes its own reply anyway).
"""

import posix
import sys

from trunner.kernel.abi import BUILTIN_MODES, HOLD_MODE, HOLD_READY
from trunner.worker import prog
from trunner.worker.wire import HEADER_BYTES, frame, unpack

TYPE_CHECKING = False  # not from typing: importing it costs the adapter ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

__all__ = ["BUILTIN_MODES", "serve"]

#: Where the reply frame goes: fd 1, or where a user mode moved it.
_reply_fd = 1


def echo(request: object) -> object:
    return request


def serve(mode: str) -> int:
    """Serve one request in `mode`. Returns only on a usage error."""
    prog.take()
    if mode == HOLD_MODE:
        hold()
    if mode != "exec":
        prog.settle()  # the adapter is the program: in its cgroup, before any of its code
    try:
        handle = _resolve(mode)
    except (ImportError, AttributeError, ValueError) as e:
        sys.stderr.write(f"trunner-worker: unknown mode {mode!r}: {e}\n")
        return 2
    try:
        reply = handle(_read_request())
    except BaseException:
        # The interpreter's own display, in C: no import (the exec mode
        # refuses any once its program has started).
        sys.excepthook(*sys.exc_info())
        _flush()
        posix._exit(1)
    _flush()  # a user mode's print()s, now on stderr, before the frame ends the run
    _write_all(_reply_fd, reply)
    posix._exit(0)


def hold() -> "NoReturn":
    """A session's pid 2 (`abi.HOLD_MODE`): in its `prog`, say it is ready,
    then keep the session's namespaces alive until stdin ends (the session
    ends it by killing the group)."""
    prog.settle()
    posix.write(1, HOLD_READY)
    while posix.read(0, 4096):
        pass
    posix._exit(0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  contextlib is one more import
            stream.flush()
        except (OSError, ValueError):
            pass


def reply_fd() -> int:
    """The descriptor the reply frame goes to (fd 1 for a built-in mode). A
    user mode that writes its own frame, as tests/children.py does, uses it."""
    return _reply_fd


def _private_stdout() -> None:
    """Move the response pipe off fd 1 and point fd 1 at stderr."""
    global _reply_fd
    _reply_fd = posix.dup(1)  # non-inheritable: the user's children never get it
    posix.dup2(2, 1)


def _resolve(mode: str) -> "Callable[[bytes], bytes]":
    """How `mode` turns a request body into a reply frame."""
    if mode == "echo":
        return lambda body: frame(echo(unpack(body)))
    if mode == "exec":
        from trunner.worker.exec_mode import run_exec

        return lambda body: frame(run_exec(unpack(body)))
    if mode == "files":
        from trunner.worker.files_mode import run_files

        return lambda body: frame(run_files(unpack(body)))
    module, sep, attr = mode.partition(":")
    if not sep or not module or not attr:
        raise ValueError("expected 'echo', 'exec', 'files' or 'package.module:function'")
    _private_stdout()
    import importlib

    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise ValueError(f"{mode} is not callable")
    import msgspec

    from trunner.protocol import encode_frame

    return lambda body: encode_frame(fn(msgspec.msgpack.decode(body)))


def _read_exact(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = posix.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"request truncated: {n - left} of {n} bytes")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _read_request() -> bytes:
    size = int.from_bytes(_read_exact(0, HEADER_BYTES), "big")
    return _read_exact(0, size)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view) :]
