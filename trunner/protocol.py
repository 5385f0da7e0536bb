"""The framed stdin/stdout protocol between the runner and a worker.

Sans-IO: pure functions over bytes; never imports trio or os. A frame is a
4-byte big-endian unsigned length, then that many bytes of msgpack (msgspec).
The decoder takes a whole captured stdout and accepts exactly one complete
frame and nothing after it; every other shape is a `RunnerError` with its
own reason. The declared length is checked against the cap before anything
is sliced, so a hostile header never makes the parent allocate.
"""

from __future__ import annotations

import functools
from typing import Any, Final, TypeVar

import msgspec

from trunner.errors import Reason, RunnerError

T = TypeVar("T")

HEADER_BYTES: Final = 4
#: Largest body a 4-byte header can declare.
MAX_FRAME_BYTES: Final = 2**32 - 1

_ENCODER = msgspec.msgpack.Encoder()


@functools.lru_cache(maxsize=256)
def _decoder(response_type: Any) -> msgspec.msgpack.Decoder[Any]:
    """One msgspec Decoder per response type, built once."""
    return msgspec.msgpack.Decoder(response_type)


def encode_frame(obj: object) -> bytes:
    """Encode `obj` as one frame: length header then msgpack body.

    Raises:
        RunnerError: `bad_request` if msgspec cannot encode `obj` or the body
            is larger than a header can declare.
    """
    buf = bytearray(64)
    try:
        _ENCODER.encode_into(obj, buf, HEADER_BYTES)
    except (TypeError, ValueError, OverflowError, RecursionError) as e:
        raise RunnerError(Reason.BAD_REQUEST, f"cannot encode frame body: {e}") from None
    body_len = len(buf) - HEADER_BYTES
    if body_len > MAX_FRAME_BYTES:
        raise RunnerError(Reason.BAD_REQUEST, f"frame body of {body_len} bytes is too large")
    buf[:HEADER_BYTES] = body_len.to_bytes(HEADER_BYTES, "big")
    return bytes(buf)


def frame_body_length(header: bytes | bytearray | memoryview) -> int:
    """The body length a 4-byte header declares."""
    return int.from_bytes(header[:HEADER_BYTES], "big")


def decode_single_frame(
    data: bytes | bytearray | memoryview,
    response_type: type[T] | Any = Any,
    *,
    max_body_bytes: int = MAX_FRAME_BYTES,
) -> T:
    """Decode a whole captured output that must be exactly one frame.

    Args:
        data: everything the child wrote to stdout.
        response_type: the type msgspec validates the body against.
        max_body_bytes: the largest body the caller accepts.

    Raises:
        RunnerError: `no_frame`, `truncated_frame`, `oversized_frame`,
            `trailing_bytes` or `bad_frame` (keeping msgspec's message).
    """
    size = len(data)
    if size == 0:
        raise RunnerError(Reason.NO_FRAME, "the worker wrote nothing to stdout")
    if size < HEADER_BYTES:
        raise RunnerError(
            Reason.TRUNCATED_FRAME, f"truncated frame: {size} of {HEADER_BYTES} header bytes"
        )
    declared = frame_body_length(data)
    if declared > max_body_bytes:
        raise RunnerError(
            Reason.OVERSIZED_FRAME,
            f"frame declares {declared} body bytes, over the cap of {max_body_bytes}",
        )
    end = HEADER_BYTES + declared
    if size < end:
        raise RunnerError(
            Reason.TRUNCATED_FRAME,
            f"truncated frame: {size - HEADER_BYTES} of {declared} body bytes",
        )
    if size > end:
        raise RunnerError(
            Reason.TRAILING_BYTES, f"{size - end} bytes after the frame"
        )
    body = memoryview(data)[HEADER_BYTES:end]
    try:
        return _decoder(response_type).decode(body)  # type: ignore[arg-type, no-any-return]
    except (msgspec.DecodeError, RecursionError) as e:  # ValidationError is a DecodeError
        raise RunnerError(Reason.BAD_FRAME, f"bad frame body: {e}") from None


class ExecRequest(msgspec.Struct, tag="exec_request", frozen=True, kw_only=True):
    """The `exec` mode's request: run `argv` in the jail, feeding `stdin`."""

    argv: list[str]
    stdin: bytes = b""
    stdout_max_bytes: int = 1024 * 1024
    stderr_max_bytes: int = 64 * 1024


class ExecResult(msgspec.Struct, tag="exec_result", frozen=True, kw_only=True):
    """The `exec` mode's response: how the program ended and what it wrote."""

    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes


def _bin_header_bytes(n: int) -> int:
    return 2 if n < 2**8 else 3 if n < 2**16 else 5


def exec_frame_bytes(stdout_max_bytes: int, stderr_max_bytes: int) -> int:
    """The largest frame an `exec` reply can be: the program's output up to
    one byte past each cap (how the adapter reports a crossed cap), plus
    the frame around it. The parent caps the worker's stdout at this, so
    the caps the caller sets mean the program's own bytes."""
    empty = len(encode_frame(ExecResult(exit_code=None, signal=-(2**63), stdout=b"",
                                        stderr=b"")))
    out, err = stdout_max_bytes + 1, stderr_max_bytes + 1
    return empty + out + err + _bin_header_bytes(out) + _bin_header_bytes(err) - 4
