"""Adapter modes: read one request frame from stdin, write one response frame.

Built in: `echo` (returns its request) and `exec` (exec_mode.py). They read
and write with wire.py, a standard-library codec, so a jailed built-in
adapter imports neither msgspec nor typing (it starts as `python -I -S`,
see `adapter_argv`). A user mode, a `package.module:function` spec, gets
msgspec, imported only then, so it may return anything msgspec encodes
(Structs, dataclasses, datetimes). An exception exits 1 with its traceback
on stderr and no frame. After the frame is written the process leaves with
`posix._exit(0)`, skipping interpreter teardown.
"""

import posix
import sys

from trunner.worker.wire import HEADER_BYTES, frame, unpack

TYPE_CHECKING = False  # not from typing: importing it costs the adapter ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable

BUILTIN_MODES = ("echo", "exec")


def echo(request: object) -> object:
    return request


def serve(mode: str) -> int:
    """Serve one request in `mode`. Returns only on a usage error."""
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
        sys.stderr.flush()
        posix._exit(1)
    _write_all(1, reply)
    posix._exit(0)


def _resolve(mode: str) -> "Callable[[bytes], bytes]":
    """How `mode` turns a request body into a reply frame."""
    if mode == "echo":
        return lambda body: frame(echo(unpack(body)))
    if mode == "exec":
        from trunner.worker.exec_mode import run_exec

        return lambda body: frame(run_exec(unpack(body)))
    module, sep, attr = mode.partition(":")
    if not sep or not module or not attr:
        raise ValueError("expected 'echo', 'exec' or 'package.module:function'")
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
