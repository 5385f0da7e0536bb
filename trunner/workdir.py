"""Files into and out of the `exec` working dir (the jail dir).

Parent side, pure: `check_files` and `check_patterns` normalise the paths
and refuse bad input with `bad_request` before anything is spawned. Worker
side: `place` writes the files before the program starts; `collect` finds
the regular files the patterns match after it exits and reads them within
what is left of the stdout cap. Collection never follows a symlink: the
tree is walked without following links, and each file is opened one
component at a time with `O_NOFOLLOW`, so a link swapped in by a process
still running cannot lead it out of the working dir.

Patterns: `*`, `?` and `[...]` match within one path segment (dotfiles
included), a `**` segment matches any number of directories. Names that
are not UTF-8, and paths longer than `EXEC_PATH_MAX_BYTES`, never match.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator, Mapping, Sequence

from trunner.errors import Reason, RunnerError
from trunner.protocol import (
    EXEC_COLLECT_MAX_FILES,
    EXEC_INPUT_MAX_BYTES,
    EXEC_INPUT_MAX_FILES,
    EXEC_NAME_MAX_BYTES,
    EXEC_PATH_MAX_BYTES,
    CollectedFile,
    ExecFile,
)


def _refuse(detail: str) -> RunnerError:
    return RunnerError(Reason.BAD_REQUEST, detail)


def normal_path(path: object, what: str = "path") -> str:
    """`path` as a plain relative path (`a/b`), or `bad_request` naming the rule."""
    if not isinstance(path, str):
        raise _refuse(f"{what} {path!r} is not a str")
    if "\0" in path:
        raise _refuse(f"{what} {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise _refuse(f"{what} {path!r} is absolute; paths are relative to the working dir")
    if path.endswith("/"):
        raise _refuse(f"{what} {path!r} ends with '/': it must name a file")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(f"{what} {path!r} has a '..' component")
    if not parts:
        raise _refuse(f"{what} {path!r} is empty")
    norm = "/".join(parts)
    try:
        size = len(norm.encode())
    except UnicodeEncodeError:
        raise _refuse(f"{what} {path!r} is not valid UTF-8") from None
    if size > EXEC_PATH_MAX_BYTES or any(len(p.encode()) > EXEC_NAME_MAX_BYTES for p in parts):
        raise _refuse(f"{what} {path[:64]!r}... is longer than {EXEC_PATH_MAX_BYTES} bytes"
                      f" or has a name over {EXEC_NAME_MAX_BYTES}")
    return norm


def check_files(
    files: Mapping[str, bytes | ExecFile] | None, *, stdin_bytes: int, file_size_bytes: int
) -> dict[str, ExecFile]:
    """The files to place, normalised; refused with `bad_request` when a path
    is bad or repeated, a file is both a file and a directory, a file is over
    `file_size_bytes` (the jail's RLIMIT_FSIZE), or there are more than
    `EXEC_INPUT_MAX_FILES` files or `EXEC_INPUT_MAX_BYTES` with stdin."""
    if not files:
        return {}
    if not isinstance(files, Mapping):
        raise _refuse("files must be a mapping of path to bytes or ExecFile")
    if len(files) > EXEC_INPUT_MAX_FILES:
        raise _refuse(f"{len(files)} files, over the bound of {EXEC_INPUT_MAX_FILES}")
    out: dict[str, ExecFile] = {}
    total = stdin_bytes
    for path, value in files.items():
        norm = normal_path(path, "file")
        if norm in out:
            raise _refuse(f"file {path!r} is given twice (as {norm!r})")
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = ExecFile(data=bytes(value))
        if not (isinstance(value, ExecFile) and isinstance(value.data, bytes)
                and isinstance(value.executable, bool)):
            raise _refuse(f"file {path!r}: the content must be bytes or an ExecFile"
                          " (bytes data, bool executable)")
        if len(value.data) > file_size_bytes:
            raise _refuse(f"file {path!r} is {len(value.data)} bytes, over file_size_bytes"
                          f" ({file_size_bytes})")
        total += len(value.data)
        out[norm] = value
    if total > EXEC_INPUT_MAX_BYTES:
        raise _refuse(f"files and stdin are {total} bytes, over the bound of"
                      f" {EXEC_INPUT_MAX_BYTES}")
    for norm in out:
        parent = norm.rpartition("/")[0]
        while parent:
            if parent in out:
                raise _refuse(f"{parent!r} is given as a file and as the directory of {norm!r}")
            parent = parent.rpartition("/")[0]
    return out


def check_patterns(collect: Sequence[str]) -> list[str]:
    """The collect patterns, normalised, under the same rules as file paths;
    at most `EXEC_COLLECT_MAX_FILES` of them, none repeated."""
    if isinstance(collect, str):
        raise _refuse("collect must be a sequence of patterns, not one str")
    patterns = [normal_path(p, "collect pattern") for p in collect]
    if len(patterns) > EXEC_COLLECT_MAX_FILES:
        raise _refuse(f"{len(patterns)} collect patterns, over the bound of"
                      f" {EXEC_COLLECT_MAX_FILES}")
    seen: set[str] = set()
    for pattern in patterns:
        if pattern in seen:
            raise _refuse(f"collect pattern {pattern!r} is given twice")
        seen.add(pattern)
    return patterns


def check_collected(files: list[CollectedFile]) -> bool:
    """Whether a reply's collected files are well formed (parent side)."""
    paths = [f.path for f in files]
    if len(set(paths)) != len(paths) or any(f.size != len(f.data) for f in files):
        return False
    try:
        return all(normal_path(p) == p for p in paths)
    except RunnerError:
        return False


# -- worker side -------------------------------------------------------------------


def place(files: Mapping[str, ExecFile]) -> None:
    """Write `files` into the working dir (the cwd), making parent dirs. The
    exec bit comes from the mode at creation: chmod is denied in the jail."""
    old = os.umask(0o022)
    try:
        for path, file in files.items():
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, mode=0o755, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags, 0o755 if file.executable else 0o644)
            try:
                view = memoryview(file.data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
    finally:
        os.umask(old)


def collect(patterns: Sequence[str], budget: int) -> tuple[list[CollectedFile], list[str]]:
    """The regular files `patterns` match (sorted by path, each once) and the
    patterns that matched none. Reading stops past `budget` bytes or
    `EXEC_COLLECT_MAX_FILES` files: the last file is then cut one byte past
    the budget, or one file too many is listed, and the parent fails the
    run with `stdout_cap`; it never returns a cut file."""
    found: set[str] = set()
    unmatched = []
    for pattern in patterns:
        matched = False
        segments = pattern.split("/")
        # `**/**` is `**`: collapse runs, which would only repeat the walk.
        segments = [g for i, g in enumerate(segments) if g != "**" or segments[i - 1 : i] != [g]]
        for path in _match(segments):
            matched = True
            found.add(path)
            if len(found) > EXEC_COLLECT_MAX_FILES:
                break
        if not matched:
            unmatched.append(pattern)
        if len(found) > EXEC_COLLECT_MAX_FILES:
            break
    out = []
    for path in sorted(found):
        data = _read_no_follow(path, budget + 1)
        if data is None:  # gone, or no longer a regular file
            continue
        out.append(CollectedFile(path=path, size=len(data), data=data))
        budget -= len(data)
        if budget < 0:
            break
    return out, unmatched


def _match(segments: list[str]) -> Iterator[str]:
    """Paths of regular files that `segments` match, walked with a stack
    (no recursion, whatever the depth); symlinks are neither matched nor
    entered."""
    stack = [("", segments)]
    while stack:
        prefix, segs = stack.pop()  # prefix: '' or a directory path ending '/'
        seg, rest = segs[0], segs[1:]
        if seg == "**":
            if rest:
                stack.append((prefix, rest))
            for entry in _entries(prefix):
                if entry.is_dir(follow_symlinks=False):
                    stack.append((f"{prefix}{entry.name}/", segs))
                elif not rest and entry.is_file(follow_symlinks=False):
                    yield prefix + entry.name
            continue
        if any(c in seg for c in "*?["):
            names = [e.name for e in _entries(prefix) if fnmatch.fnmatchcase(e.name, seg)]
        else:
            names = [seg]
        for name in names:
            path = prefix + name
            try:
                mode = os.lstat(path).st_mode
            except (OSError, ValueError):
                continue
            if rest and stat.S_ISDIR(mode):
                stack.append((path + "/", rest))
            elif not rest and stat.S_ISREG(mode) and _plain(path):
                yield path


def _entries(prefix: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(prefix or ".") as it:
            return [e for e in it if _plain(prefix + e.name)]
    except OSError:
        return []


def _plain(path: str) -> bool:
    """A path that can travel back: UTF-8 and within the length bound."""
    try:
        return len(path.encode()) <= EXEC_PATH_MAX_BYTES
    except UnicodeEncodeError:
        return False


def _read_no_follow(path: str, most: int) -> bytes | None:
    """Up to `most` bytes of the regular file at `path`, opened one component
    at a time, each with O_NOFOLLOW; None if any component is a symlink, a
    non-directory, or the file is not regular."""
    parts = path.split("/")
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for name in parts[:-1]:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = fd
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | nofollow, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], most
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
