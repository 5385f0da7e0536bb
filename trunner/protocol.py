"""The framed stdin/stdout protocol between the runner and a worker.

Sans-IO: pure functions over bytes; never imports trio or os. A frame is a
4-byte big-endian unsigned length, then that many bytes of msgpack (msgspec
here; a built-in adapter writes the same bytes with wire.py).
The decoder takes a whole captured stdout and accepts exactly one complete
frame and nothing after it; every other shape is a `RunnerError` with its
own reason. The declared length is checked against the cap before anything
is sliced, so a hostile header never makes the parent allocate.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, TypeVar

import msgspec

from trunner.errors import Reason, RunnerError
from trunner.usage import Usage as Usage
from trunner.worker.wire import (
    EXEC_COLLECT_MAX_FILES as EXEC_COLLECT_MAX_FILES,
    EXEC_COLLECT_MAX_PATTERNS as EXEC_COLLECT_MAX_PATTERNS,
    EXEC_ENV_MAX_BYTES as EXEC_ENV_MAX_BYTES,
    EXEC_INPUT_MAX_BYTES as EXEC_INPUT_MAX_BYTES,
    EXEC_INPUT_MAX_FILES as EXEC_INPUT_MAX_FILES,
    EXEC_NAME_MAX_BYTES as EXEC_NAME_MAX_BYTES,
    EXEC_PATH_MAX_BYTES as EXEC_PATH_MAX_BYTES,
    FILES_DEFAULT_BUDGET_BYTES as FILES_DEFAULT_BUDGET_BYTES,
    FILES_DETAIL_MAX_BYTES as FILES_DETAIL_MAX_BYTES,
    FILES_MAX_OPS as FILES_MAX_OPS,
    HEADER_BYTES as HEADER_BYTES,
    MAX_FRAME_BYTES as MAX_FRAME_BYTES,
)

T = TypeVar("T")

_ENCODER = msgspec.msgpack.Encoder()


@functools.lru_cache(maxsize=256)
def _decoder(response_type: Any) -> msgspec.msgpack.Decoder[Any]:  # noqa: ANN401
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
    response_type: type[T] | Any = Any,  # noqa: ANN401
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


class ExecFile(msgspec.Struct, frozen=True, kw_only=True):
    """A file `exec` places in the working dir before the program starts."""

    data: bytes
    executable: bool = False


class ExecRequest(msgspec.Struct, tag="exec_request", frozen=True, kw_only=True):
    """The `exec` mode's request: place `files`, run `argv` feeding `stdin`,
    then return the regular files that `collect` (globs) matches."""

    argv: list[str]
    stdin: bytes = b""
    files: dict[str, ExecFile] = {}
    collect: list[str] = []
    #: Variables set for the program only, over the jail's PATH, HOME,
    #: TMPDIR and LANG (not the adapter's; not part of the rules version).
    env: dict[str, str] = {}
    stdout_max_bytes: int = 1024 * 1024
    stderr_max_bytes: int = 64 * 1024
    #: The program's own wall time (from its start) and its tree's CPU time
    #: (user + system), both enforced by the adapter, which then still
    #: reports the usage; the parent's deadline stays as a backstop.
    wall_time_s: float = 10.0
    cpu_time_s: float = 10.0
    #: The program's stdio (`abi.STDIO_KINDS`): "pipes", the adapter's; in a
    #: streaming run (`Runner.open_process`) "stream", the parent's own
    #: pipes, or "pty", a pty whose controlling side the adapter sends to
    #: the parent. Streaming, `stdin` and `collect` are empty and the reply
    #: carries no output.
    stdio: str = "pipes"


class CollectedFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A file the program left that a `collect` pattern matched."""

    path: str
    size: int
    data: bytes
    #: Its permission bits (`st_mode & 0o7777`) in the jail.
    mode: int = 0o644


class ExecResult(
    msgspec.Struct, tag="exec_result", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """The `exec` mode's response: how the program ended, what it wrote, and
    the collected files (sorted by path) and the patterns that matched none."""

    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    files: list[CollectedFile] = []
    unmatched: list[str] = []
    #: The program's wall time, start to exit, measured in the jail.
    elapsed_s: float = 0.0
    #: What the program's tree used (None only from an adapter that did not
    #: measure).
    usage: Usage | None = None
    #: The limit the adapter ended the program for: `timeout` (its wall
    #: time), `cpu_time` (its tree's CPU time), or None. The parent turns
    #: either into a `RunnerError`, never into a result.
    limit: Literal["timeout", "cpu_time"] | None = None


def _bin_header_bytes(n: int) -> int:
    return 2 if n < 2**8 else 3 if n < 2**16 else 5


def exec_frame_bytes(
    stdout_max_bytes: int, stderr_max_bytes: int, collect: list[str] | None = None
) -> int:
    """The largest frame an `exec` reply can be: the program's stdout and the
    collected files' bytes together up to one byte past the stdout cap, its
    stderr up to one past its cap (how the adapter reports a crossed cap),
    up to `EXEC_COLLECT_MAX_FILES + 1` collected files, plus the frame
    around them. The parent caps the worker's stdout at this, so the caps
    the caller sets mean the program's own bytes. Counted, not encoded: the
    reply without files, plus the worst file's bytes times their number and
    the larger array header (3 bytes, not 1)."""
    n_files = EXEC_COLLECT_MAX_FILES + 1 if collect else 0
    worst = ExecResult(exit_code=None, signal=-(2**63), stdout=b"", stderr=b"",
                       files=[], unmatched=list(collect or ()),
                       elapsed_s=0.0, limit="cpu_time",
                       usage=Usage(wall_s=0.0, cpu_user_s=0.0, cpu_sys_s=0.0,
                                   peak_memory_bytes=-(2**63)))
    files = n_files * (_worst_file_bytes() + 3) + (2 if n_files else 0)  # bin32, array16
    out, err = stdout_max_bytes + 1, stderr_max_bytes + 1
    headers = _bin_header_bytes(out) + _bin_header_bytes(err) - 2 * 2
    return len(encode_frame(worst)) + files + out + err + headers


@functools.cache
def _worst_file_bytes() -> int:
    """The encoded size of a collected file with the longest path and the
    widest ints, its data empty (a bin8 header of 2 bytes)."""
    return len(_ENCODER.encode(CollectedFile(path="x" * EXEC_PATH_MAX_BYTES, size=-(2**63),
                                             data=b"", mode=-(2**63))))


# -- the `files` mode (trunner/files.py, worker/files_mode.py) -------------------


class FileEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One path of the working dir as the `files` mode reads and writes it:
    a regular file (its `data`), a symlink (its `target`, never followed) or
    a directory. `path` is relative and normal (`exec_checks.normal_path`)."""

    path: str
    type: Literal["file", "symlink", "dir"]
    #: Its permission bits, `st_mode & 0o7777` (a symlink's are 0o777 and
    #: never set: Linux has no lchmod).
    mode: int
    #: Its modification time, nanoseconds since the epoch (the access time
    #: is written equal to it).
    mtime_ns: int
    data: bytes = b""
    target: str = ""


class ReadFiles(msgspec.Struct, tag="read_files", frozen=True, kw_only=True,
                forbid_unknown_fields=True):
    """Read every path `patterns` (exec's `collect` globs) match: files,
    symlinks (not followed) and directories, empty ones too. Its result is
    a `list[FileEntry]`, sorted by path, each path once; `**` matches zero
    or more directories, so `out/**` has `out` itself."""

    patterns: list[str]


class WriteFiles(msgspec.Struct, tag="write_files", frozen=True, kw_only=True,
                 forbid_unknown_fields=True):
    """Write `entries` (parents made as needed, 0o755), each with its mode
    and mtime exactly; a directory's are set after its contents. A file or
    symlink replaces what is at its path (a rename: never written through),
    but never a directory. Its result is the count written (an `int`)."""

    entries: list[FileEntry]


class Export(msgspec.Struct, tag="export", frozen=True, kw_only=True,
             forbid_unknown_fields=True):
    """An uncompressed pax tar of the directory `path` ("." the working dir),
    names relative to it, symlinks as symlinks, hard links as links. Its
    result is the tar (`bytes`)."""

    path: str


class Import(msgspec.Struct, tag="import", frozen=True, kw_only=True,
             forbid_unknown_fields=True):
    """Extract `tar` (uncompressed) into the directory `path`, made as needed.
    Every member is checked before anything is written; files, dirs,
    symlinks and hard links only, never written through. Its result is the
    count of members written (an `int`)."""

    path: str
    tar: bytes


FilesOp = ReadFiles | WriteFiles | Export | Import


class FilesRequest(msgspec.Struct, tag="files_request", frozen=True, kw_only=True,
                   forbid_unknown_fields=True):
    """The `files` mode's request: `ops`, run in order in one process; the
    first that fails ends the run (`FilesResult.error`). `budget_bytes`
    bounds what the reads return, all ops together, each entry counted at
    its encoded size at most (`trunner.files.request` sets it from the
    run's stdout cap; this default suits the default cap)."""

    ops: list[FilesOp]
    budget_bytes: int = FILES_DEFAULT_BUDGET_BYTES


class FilesError(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Why the op at index `op` failed: `over_budget` (the reads passed
    `budget_bytes`), `refused` (a symlink in a path, a path that is not
    plain, an archive or a member of it), `os_error` (the errno's name and
    text in `detail`).
    The ops before it took effect, and so did its own writes before the
    failing path."""

    op: int
    kind: Literal["over_budget", "refused", "os_error"]
    path: str = ""
    detail: str = ""


class FilesResult(msgspec.Struct, tag="files_result", frozen=True, kw_only=True,
                  forbid_unknown_fields=True):
    """The `files` mode's reply: one result per op done, in order (entries,
    a count or a tar: see each op), and the error that ended it, if any."""

    results: list[list[FileEntry] | int | bytes]
    error: FilesError | None = None


def files_headroom_bytes(n_ops: int) -> int:
    """What of the stdout cap a `files` reply needs beside its entries and
    tars (which the worker counts against `budget_bytes`): the frame, its
    fields, the worst error (a path of `EXEC_PATH_MAX_BYTES`, a detail of
    `FILES_DETAIL_MAX_BYTES`), and each op's result at its widest (an int
    of 9 bytes; a list's or a tar's header is at most 5)."""
    return _files_envelope_bytes() + 4 + 9 * n_ops


@functools.cache
def _files_envelope_bytes() -> int:
    worst = FilesError(op=-(2**63), kind="over_budget", path="x" * EXEC_PATH_MAX_BYTES,
                       detail="x" * FILES_DETAIL_MAX_BYTES)
    return len(encode_frame(FilesResult(results=[], error=worst)))
