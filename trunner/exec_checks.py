"""The `exec` mode's checks, parent side, all of them: the request's (the
files into the working dir, argv, stdin, env, the patterns) and the reply's
(the files out of it).

Pure: `exec_request` normalises the paths (`check_files`, `check_patterns`)
and refuses bad input with `bad_request` before anything is spawned, and
sizes the caps the parent enforces; `check_exec_reply` holds a reply to the
caps and to what was asked for. The worker side (placing the files,
running the program, matching and reading what is collected) is
trunner/worker/exec_mode.py, which the jailed adapter imports without msgspec.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from trunner.errors import Reason, RunnerError
from trunner.invocation import Caps, attach_output, only_runner_errors
from trunner.limits import file_size_for
from trunner.protocol import (
    EXEC_COLLECT_MAX_FILES,
    EXEC_COLLECT_MAX_PATTERNS,
    EXEC_ENV_MAX_BYTES,
    EXEC_INPUT_MAX_BYTES,
    EXEC_INPUT_MAX_FILES,
    EXEC_NAME_MAX_BYTES,
    EXEC_PATH_MAX_BYTES,
    CollectedFile,
    ExecFile,
    ExecRequest,
    ExecResult,
    exec_frame_bytes,
)

if TYPE_CHECKING:
    from trunner.limits import Limits

#: How long after `wall_time_s` the parent's deadline falls for an `exec`
#: run: the adapter ends the program at its wall time, counted from the
#: program's start, and still reports; the parent's deadline, counted from
#: the request's write, is the backstop of an adapter that cannot.
EXEC_DEADLINE_GRACE_S = 1.0
#: The fewest `processes` an exec run may have: the adapter (the jail's
#: pid 2, in the run's count) and the program it starts.
EXEC_PROCESSES = 2


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
    `EXEC_INPUT_MAX_FILES` files or `EXEC_INPUT_MAX_BYTES` with stdin
    (stdin alone too)."""
    if files is not None and not isinstance(files, Mapping):
        raise _refuse(f"files must be a mapping of path to bytes or ExecFile, not a"
                      f" {type(files).__name__}")
    if not files:
        files = {}
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


def check_argv(argv: Sequence[str]) -> list[str]:
    """The program's argv: a non-empty sequence of str without NUL bytes."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        raise _refuse(f"argv must be a sequence of str, not a {type(argv).__name__}")
    if not argv:
        raise _refuse("argv is empty: it must name the program")
    for i, item in enumerate(argv):
        if not isinstance(item, str):
            raise _refuse(f"argv[{i}] is a {type(item).__name__}, not a str")
        if "\0" in item:
            raise _refuse(f"argv[{i}] contains a NUL byte")
    if not argv[0]:
        raise _refuse("argv[0] is empty: it must name the program")
    return list(argv)


def check_stdin(stdin: bytes) -> bytes:
    """The program's stdin: bytes (a bytearray or memoryview is copied)."""
    if isinstance(stdin, (bytearray, memoryview)):
        stdin = bytes(stdin)
    if not isinstance(stdin, bytes):
        raise _refuse(f"stdin must be bytes, not a {type(stdin).__name__}")
    return stdin


#: What an env name may be: a shell's.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The program's own variables: names `[A-Za-z_][A-Za-z0-9_]*`, str
    values without NUL, all of them (`NAME=VALUE` and a NUL each, UTF-8)
    within `EXEC_ENV_MAX_BYTES`. Nothing is reserved: they reach the
    program only, never the adapter or the helper."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise _refuse(f"env must be a mapping of str to str, not a {type(env).__name__}")
    out: dict[str, str] = {}
    total = 0
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise _refuse(f"env name {name!r} is not [A-Za-z_][A-Za-z0-9_]*")
        if not isinstance(value, str):
            raise _refuse(f"env {name}: the value is a {type(value).__name__}, not a str")
        if "\0" in value:
            raise _refuse(f"env {name}: the value contains a NUL byte")
        try:
            total += len(name) + len(value.encode()) + 2
        except UnicodeEncodeError:
            raise _refuse(f"env {name}: the value is not valid UTF-8") from None
        out[name] = value
    if total > EXEC_ENV_MAX_BYTES:
        raise _refuse(f"env is {total} bytes, over the bound of {EXEC_ENV_MAX_BYTES}")
    return out


def check_patterns(collect: Sequence[str]) -> list[str]:
    """The collect patterns, normalised, under the same rules as file paths;
    at most `EXEC_COLLECT_MAX_PATTERNS` of them, none repeated."""
    if isinstance(collect, str):
        raise _refuse("collect must be a sequence of patterns, not one str")
    patterns = [normal_path(p, "collect pattern") for p in collect]
    if len(patterns) > EXEC_COLLECT_MAX_PATTERNS:
        raise _refuse(f"{len(patterns)} collect patterns, over the bound of"
                      f" {EXEC_COLLECT_MAX_PATTERNS}")
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


def matches(pattern: str, path: str) -> bool:
    """Whether `pattern` matches `path` as the exec adapter matches: `*`, `?`
    and `[...]` within one segment (dotfiles included), a `**` segment any
    number of directories (parent side: what a reply may hold)."""
    from fnmatch import fnmatchcase

    segments, parts = pattern.split("/"), path.split("/")
    # (segment index, part index) pairs still alive, as in an NFA.
    states = {(0, 0)}
    while states:
        i, j = states.pop()
        if i == len(segments):
            if j == len(parts):
                return True
            continue
        if segments[i] == "**":
            states.add((i + 1, j))  # no more directories
            # One more part: a directory, or, for a last `**`, the file too.
            if j < len(parts) - (i < len(segments) - 1):
                states.add((i, j + 1))
        elif j < len(parts) and fnmatchcase(parts[j], segments[i]):
            states.add((i + 1, j + 1))
    return False


def exec_request(
    argv: Sequence[str], stdin: bytes, files: Mapping[str, bytes | ExecFile] | None,
    collect: Sequence[str], limits: Limits, env: Mapping[str, str] | None = None,
) -> tuple[ExecRequest, Caps]:
    """A checked `exec` request, and the caps the parent enforces for it.
    `Runner.exec` and `WorkerPool.exec` both come here.

    Raises:
        RunnerError: `bad_request`, before anything is spawned.
    """
    if limits.processes < EXEC_PROCESSES:
        raise _refuse(f"processes={limits.processes}: an exec run's processes are its adapter,"
                      f" which starts the program, and the program: {EXEC_PROCESSES} at least")
    with only_runner_errors():
        checked_argv = check_argv(argv)
        stdin = check_stdin(stdin)
        placed = check_files(files, stdin_bytes=len(stdin),
                             file_size_bytes=file_size_for(limits))
        patterns = check_patterns(collect)
        request = ExecRequest(
            argv=checked_argv,
            stdin=stdin,
            files=placed,
            collect=patterns,
            env=check_env(env),
            stdout_max_bytes=limits.stdout_max_bytes,
            stderr_max_bytes=limits.stderr_max_bytes,
            wall_time_s=limits.wall_time_s,
            cpu_time_s=limits.cpu_time_s,
        )
    # The adapter ends the program at its wall time and reports its usage;
    # the parent's deadline is the backstop, EXEC_DEADLINE_GRACE_S later.
    caps = Caps(limits.wall_time_s + EXEC_DEADLINE_GRACE_S, exec_frame_bytes(
        limits.stdout_max_bytes, limits.stderr_max_bytes, patterns), limits.stderr_max_bytes,
        program_only=True)
    return request, caps


def check_exec_reply(response: ExecResult, limits: Limits, patterns: Sequence[str], *,
                     capture_on_failure: bool = False) -> None:
    """The exec adapter returns one byte past a cap it saw crossed, and one
    file past the bound of collected files; it returns only files that the
    requested patterns match, and names only those patterns unmatched.
    With `capture_on_failure`, a limit's error carries the program's output
    (`attach_output`)."""
    try:
        _check_exec_reply(response, limits, patterns)
    except RunnerError as e:
        if capture_on_failure:
            attach_output(e, response, limits)
        raise


def _check_exec_reply(response: ExecResult, limits: Limits, patterns: Sequence[str]) -> None:
    usage = response.usage
    if response.limit == "timeout":
        raise RunnerError(Reason.TIMEOUT, f"the program ran past its wall time of"
                          f" {limits.wall_time_s} s", usage=usage)
    if response.limit == "cpu_time":
        raise RunnerError(Reason.CPU_TIME, f"the program's processes used more than"
                          f" {limits.cpu_time_s} s of CPU time", usage=usage)
    cap = limits.stdout_max_bytes
    if len(response.stdout) > cap:
        raise RunnerError(Reason.STDOUT_CAP,
                          f"the program's stdout went over its cap of {cap} bytes", usage=usage)
    err_cap = limits.stderr_max_bytes
    if len(response.stderr) > err_cap:
        raise RunnerError(Reason.STDERR_CAP,
                          f"the program's stderr went over its cap of {err_cap} bytes",
                          usage=usage)
    if len(response.files) > EXEC_COLLECT_MAX_FILES:
        raise RunnerError(Reason.TOO_MANY_FILES, f"the collect patterns matched more than"
                          f" {EXEC_COLLECT_MAX_FILES} files", usage=usage)
    collected = sum(len(f.data) for f in response.files)
    if len(response.stdout) + collected > cap:
        raise RunnerError(Reason.STDOUT_CAP, f"the program's stdout ({len(response.stdout)} bytes)"
                          f" and the collected files went over the stdout cap of {cap} bytes",
                          usage=usage)
    if not check_collected(response.files):
        raise RunnerError(Reason.BAD_FRAME, "a collected file's path or size is malformed")
    for file in response.files:
        if not any(matches(pattern, file.path) for pattern in patterns):
            raise RunnerError(Reason.BAD_FRAME,
                              f"collected {file.path!r}, which no requested pattern matches")
    if not set(response.unmatched) <= set(patterns):
        raise RunnerError(Reason.BAD_FRAME, "the reply names an unmatched pattern not requested")
