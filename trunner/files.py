"""The `files` mode's parent side: a checked `FilesRequest`, and its reply
held to what was asked.

`request` refuses bad ops with `bad_request` before anything is spawned
(exec's path rules: `exec_checks.normal_path`, `check_patterns`) and sets
the read budget from the run's stdout cap; `check_reply` accepts only a
reply of the shape the ops ask for, and turns the worker's error into a
`RunnerError`; `Session.files` does both around a command of the mode. The
worker side is trunner/worker/files_mode.py; the types are protocol.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from trunner.errors import Reason, RunnerError
from trunner.exec_checks import check_patterns, matches, normal_path
from trunner.invocation import only_runner_errors
from trunner.limits import file_size_for
from trunner.protocol import (
    EXEC_INPUT_MAX_BYTES,
    EXEC_PATH_MAX_BYTES,
    FILES_DETAIL_MAX_BYTES,
    FILES_MAX_OPS,
    Export,
    FileEntry,
    FilesOp,
    FilesRequest,
    FilesResult,
    Import,
    ReadFiles,
    WriteFiles,
    files_headroom_bytes,
)

if TYPE_CHECKING:
    from trunner.limits import Limits
    from trunner.usage import Usage

_TYPES = ("file", "symlink", "dir")
_INT64 = range(-(2**63), 2**63)


def _refuse(detail: str) -> RunnerError:
    return RunnerError(Reason.BAD_REQUEST, detail)


def dir_path(path: object, what: str = "path") -> str:
    """A directory to export or import into: "." (the working dir) or a
    normal relative path."""
    return "." if path == "." else normal_path(path, what)


def _entry(entry: object, file_size_bytes: int) -> FileEntry:
    if not isinstance(entry, FileEntry):
        raise _refuse(f"an entry is a {type(entry).__name__}, not a FileEntry")
    path = normal_path(entry.path, "entry")
    if entry.type not in _TYPES:
        raise _refuse(f"entry {path!r}: type {entry.type!r} is not one of {', '.join(_TYPES)}")
    if type(entry.mode) is not int or not 0 <= entry.mode <= 0o7777:
        raise _refuse(f"entry {path!r}: mode {entry.mode!r} is not an int in 0..0o7777")
    if type(entry.mtime_ns) is not int or entry.mtime_ns not in _INT64:
        raise _refuse(f"entry {path!r}: mtime_ns {entry.mtime_ns!r} is not a 64-bit int")
    data, target = entry.data, entry.target
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes) or not isinstance(target, str):
        raise _refuse(f"entry {path!r}: data must be bytes and target a str")
    if data and entry.type != "file":
        raise _refuse(f"entry {path!r}: only a file has data")
    if len(data) > file_size_bytes:
        raise _refuse(f"entry {path!r} is {len(data)} bytes, over file_size_bytes"
                      f" ({file_size_bytes})")
    if (entry.type == "symlink") != bool(target):
        raise _refuse(f"entry {path!r}: a symlink, and only a symlink, has a target")
    if "\0" in target:
        raise _refuse(f"entry {path!r}: the target contains a NUL byte")
    return msgspec.structs.replace(entry, path=path, data=data)


def _entries(entries: object, file_size_bytes: int) -> list[FileEntry]:
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise _refuse("entries must be a sequence of FileEntry")
    out = [_entry(e, file_size_bytes) for e in entries]
    kinds = {e.path: e.type for e in out}
    if len(kinds) != len(out):
        raise _refuse("an entry's path is given twice")
    for e in out:
        parent = e.path.rpartition("/")[0]
        while parent:
            if kinds.get(parent, "dir") != "dir":
                raise _refuse(f"{e.path!r} lies under {parent!r}, a {kinds[parent]} of the"
                              " same op: never written through")
            parent = parent.rpartition("/")[0]
    return out


def _op(op: object, file_size_bytes: int) -> FilesOp:
    if isinstance(op, ReadFiles):
        return ReadFiles(patterns=check_patterns(op.patterns))
    if isinstance(op, WriteFiles):
        return WriteFiles(entries=_entries(op.entries, file_size_bytes))
    if isinstance(op, Export):
        return Export(path=dir_path(op.path))
    if isinstance(op, Import):
        tar = bytes(op.tar) if isinstance(op.tar, (bytearray, memoryview)) else op.tar
        if not isinstance(tar, bytes):
            raise _refuse(f"Import's tar must be bytes, not a {type(tar).__name__}")
        return Import(path=dir_path(op.path), tar=tar)
    raise _refuse(f"an op is a {type(op).__name__}, not ReadFiles, WriteFiles, Export or"
                  " Import")


def _input_bytes(op: FilesOp) -> int:
    if isinstance(op, WriteFiles):
        return sum(len(e.data) + len(e.path.encode()) + len(e.target.encode())
                   for e in op.entries)
    return len(op.tar) if isinstance(op, Import) else 0


def request(ops: Sequence[FilesOp], limits: Limits, *,
            budget_bytes: int | None = None) -> FilesRequest:
    """A checked `files` request for a run under `limits`.

    Args:
        ops: run in order, in one process.
        limits: the run's; its stdout cap sets the read budget.
        budget_bytes: what the reads may return, all ops together (default,
            and most: the stdout cap less `files_headroom_bytes`).

    Raises:
        RunnerError: `bad_request`, naming the rule: a bad op, path, pattern
            or entry (exec's rules), a path twice or under a file or symlink
            of the same op, an entry over `file_size_bytes`, more than
            `FILES_MAX_OPS` ops, inputs (entries and tars) over
            `EXEC_INPUT_MAX_BYTES`, a budget over the cap's room.
    """
    with only_runner_errors():
        if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
            raise _refuse("ops must be a sequence of ReadFiles, WriteFiles, Export, Import")
        if len(ops) > FILES_MAX_OPS:
            raise _refuse(f"{len(ops)} ops, over the bound of {FILES_MAX_OPS}")
        size = file_size_for(limits)
        checked = [_op(op, size) for op in ops]
        total = sum(map(_input_bytes, checked))
        if total > EXEC_INPUT_MAX_BYTES:
            raise _refuse(f"the entries and tars are {total} bytes, over the bound of"
                          f" {EXEC_INPUT_MAX_BYTES}")
        most = max(limits.stdout_max_bytes - files_headroom_bytes(len(checked)), 0)
        if budget_bytes is None:
            budget_bytes = most
        if type(budget_bytes) is not int or not 0 <= budget_bytes <= most:
            raise _refuse(f"budget_bytes {budget_bytes!r} is not an int in 0..{most} (the"
                          f" stdout cap of {limits.stdout_max_bytes} less the reply's frame)")
        return FilesRequest(ops=checked, budget_bytes=budget_bytes)


def _bad(detail: str) -> RunnerError:
    return RunnerError(Reason.BAD_FRAME, f"files reply: {detail}")


def _check_entries(entries: list[FileEntry], patterns: list[str]) -> int:
    """The entries' data bytes, once each is held to the ReadFiles rules."""
    paths = [e.path for e in entries]
    if paths != sorted(set(paths)):
        raise _bad("the entries are not sorted by path, each once")
    for e in entries:
        try:
            if normal_path(e.path) != e.path:
                raise _bad(f"entry path {e.path!r} is not normal")
        except RunnerError:
            raise _bad(f"entry path {e.path[:64]!r} is not a plain relative path") from None
        if (e.data and e.type != "file") or (e.type == "symlink") != bool(e.target):
            raise _bad(f"entry {e.path!r}: data on what is not a file, or a target on what"
                       " is not a symlink")
        if not 0 <= e.mode <= 0o7777:
            raise _bad(f"entry {e.path!r}: mode {e.mode} is out of 0..0o7777")
        if not any(matches(p, e.path) for p in patterns):
            raise _bad(f"entry {e.path!r}, which no requested pattern matches")
    return sum(len(e.data) for e in entries)


def check_reply(req: FilesRequest, reply: FilesResult, *, usage: Usage | None = None) -> None:
    """Hold `reply` to `req`: one result per op done, of the op's kind
    (ReadFiles' entries normal, sorted, each matched by a pattern, data only
    on files, a target only on symlinks; WriteFiles' count its entries'),
    the reads within the budget. Then the worker's error, if any.

    Raises:
        RunnerError: `bad_frame` for a reply of another shape; for the
            error of the op that failed (`.detail` names it, its path and
            why; the ops before it took effect, and so did its own writes
            before that path): `stdout_cap` for `over_budget`, `bad_request`
            for `refused` (a symlink in a path, an archive member refused)
            and `os_error` (the errno).
    """
    error, results = reply.error, reply.results
    done = len(req.ops) if error is None else error.op
    if not 0 <= done <= len(req.ops) or len(results) != done or (
            error is not None and done == len(req.ops)):
        raise _bad(f"{len(results)} results for {len(req.ops)} ops"
                   f"{'' if error is None else f', failed at op {error.op}'}")
    read = 0
    for i, (op, result) in enumerate(zip(req.ops[:done], results, strict=True)):
        if isinstance(op, ReadFiles) and isinstance(result, list):
            read += _check_entries(result, op.patterns)
        elif isinstance(op, WriteFiles) and type(result) is int:
            if result != len(op.entries):
                raise _bad(f"op {i} wrote {result} of {len(op.entries)} entries")
        elif isinstance(op, Import) and type(result) is int:
            if result < 0:
                raise _bad(f"op {i} imported {result} members")
        elif isinstance(op, Export) and isinstance(result, bytes):
            read += len(result)
        else:
            raise _bad(f"op {i} ({type(op).__name__}) has a {type(result).__name__} result")
    if read > req.budget_bytes:
        raise _bad(f"the reads are {read} bytes, over the budget of {req.budget_bytes}")
    if error is None:
        return
    if len(error.path.encode()) > EXEC_PATH_MAX_BYTES or len(
            error.detail.encode()) > FILES_DETAIL_MAX_BYTES:
        raise _bad("the error's path or detail is over its bound")
    op = req.ops[error.op]
    reason = Reason.STDOUT_CAP if error.kind == "over_budget" else Reason.BAD_REQUEST
    raise RunnerError(reason, f"files op {error.op} ({type(op).__name__}) {error.kind}"
                      f" at {error.path!r}: {error.detail}", usage=usage)
