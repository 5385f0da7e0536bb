"""Adapter modes: read one request frame from stdin, write one response frame.

Built in: `echo` (returns its request) and `exec` (places files, runs an
argv inside the same jail, collects files). A user mode is a
`package.module:function` spec. An exception exits 1 with its traceback on
stderr and no frame. After the frame is written the process leaves with
`os._exit(0)`, skipping interpreter teardown.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from trunner.protocol import HEADER_BYTES, ExecRequest, ExecResult, encode_frame

if TYPE_CHECKING:
    from collections.abc import Callable

    from trunner.protocol import CollectedFile

BUILTIN_MODES = ("echo", "exec")


def echo(request: Any) -> Any:  # noqa: ANN401
    return request


def serve(mode: str) -> int:
    """Serve one request in `mode`. Returns only on a usage error."""
    try:
        fn, request_type = _resolve(mode)
    except (ImportError, AttributeError, ValueError) as e:
        sys.stderr.write(f"trunner-worker: unknown mode {mode!r}: {e}\n")
        return 2
    try:
        request = msgspec.msgpack.decode(_read_request(), type=request_type)
        frame = encode_frame(fn(request))
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    _write_all(1, frame)
    os._exit(0)


def _resolve(mode: str) -> tuple[Callable[[Any], Any], Any]:
    if mode == "echo":
        return echo, Any
    if mode == "exec":
        return run_exec, ExecRequest
    module, sep, attr = mode.partition(":")
    if not sep or not module or not attr:
        raise ValueError("expected 'echo', 'exec' or 'package.module:function'")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise ValueError(f"{mode} is not callable")
    return fn, Any


def _read_exact(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
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
        view = view[os.write(fd, view) :]


def run_exec(request: ExecRequest) -> ExecResult:
    """Place `request.files`, run `request.argv` in this jail, capture its
    output, bounded, then collect the files `request.collect` matches.

    When a stream crosses its cap the program is killed and the reply holds
    that stream's first cap + 1 bytes: the parent sees the cap crossed and
    reports `stdout_cap` / `stderr_cap`, never the output. Collected files
    share what is left of the stdout cap, with the same rule
    (workdir.collect).
    """
    import selectors
    import subprocess
    import time

    from trunner import workdir

    workdir.place(request.files)
    began = time.monotonic()
    proc = subprocess.Popen(
        request.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin
    assert proc.stdout
    assert proc.stderr
    caps = {proc.stdout.fileno(): request.stdout_max_bytes,
            proc.stderr.fileno(): request.stderr_max_bytes}
    bufs: dict[int, bytearray] = {fd: bytearray() for fd in caps}
    pending = memoryview(request.stdin)
    with selectors.DefaultSelector() as sel:
        for fd in caps:
            sel.register(fd, selectors.EVENT_READ)
        if pending:
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        crossed = False
        while sel.get_map() and not crossed:
            for key, _ in sel.select():
                fd = key.fd
                if fd not in caps:
                    try:
                        pending = pending[os.write(fd, pending[: 1 << 16]) :]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                buf = bufs[fd]
                chunk = os.read(fd, min(1 << 16, caps[fd] + 1 - len(buf)))
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf += chunk
                if len(buf) > caps[fd]:
                    proc.kill()
                    crossed = True
                    break
    code = proc.wait()
    elapsed = time.monotonic() - began
    stdout = bytes(bufs[proc.stdout.fileno()])
    files: list[CollectedFile] = []
    unmatched: list[str] = []
    if not crossed and request.collect:
        files, unmatched = workdir.collect(request.collect,
                                           request.stdout_max_bytes - len(stdout))
    return ExecResult(
        exit_code=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        stdout=stdout,
        stderr=bytes(bufs[proc.stderr.fileno()]),
        files=files,
        unmatched=unmatched,
        elapsed_s=elapsed,
    )
