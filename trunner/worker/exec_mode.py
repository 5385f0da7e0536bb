"""The `exec` mode, worker side: place the request's files, run its argv in
this jail, capture its output within the caps, collect the files asked for.

Runs in the jailed adapter of every `exec` spawn, so it imports only
posix, time, select, resource and struct (fnmatch only for a wildcard pattern,
_socket only for a pty, before the program starts): no os
(~1.5 ms without site, which would have imported it), no subprocess
(~9 ms: locale, re, enum, threading), no msgspec, no typing. Request and
reply are plain values laid out as protocol.ExecRequest and ExecResult
(tests/test_wire.py checks the reply decodes strictly into ExecResult).

Collection never follows a symlink: the tree is walked without following
links, and each file is opened one component at a time with `O_NOFOLLOW`,
so a link swapped in by a process still running cannot lead it out of the
working dir. Patterns: `*`, `?` and `[...]` match within one path segment
(dotfiles included), a `**` segment matches any number of directories.
Names that are not UTF-8, and paths longer than `EXEC_PATH_MAX_BYTES`,
never match.

The program shares this process's uid, jail and Landlock domain, so before
it starts the adapter makes itself non-dumpable (its /proc/PID/fd and mem
become root's: the response pipe is out of the program's reach) and
imports everything it will need: after the spawn an audit hook ends the
adapter (exit 1, no frame) at any import, which would find modules on paths
the program could write.
"""

from __future__ import annotations

import posix
import resource
import select
import struct  # wire.pack's floats (elapsed_s), a pty's SCM_RIGHTS: a fork server's image holds it
import sys
import time

from trunner.kernel._kernel import NR, syscall
from trunner.kernel.abi import (
    ADAPTER_PID,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    S_IFDIR,
    S_IFMT,
    S_IFREG,
    SIGKILL,
    SIGPIPE,
    SIGXCPU,
    SIGXFSZ,
    STREAM_FD,
)
from trunner.worker import prog
from trunner.worker.wire import EXEC_COLLECT_MAX_FILES, EXEC_PATH_MAX_BYTES

TYPE_CHECKING = False  # not from typing: importing it costs the adapter ~5 ms
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from typing import Any

_CHUNK = 1 << 16
#: Exit code of an adapter that tried to import after its program started.
IMPORT_AFTER_START_EXIT = 1


class Request:
    """A decoded protocol.ExecRequest: its wire map, tag checked."""

    __slots__ = ("argv", "collect", "cpu_time_s", "env", "files", "stderr_max_bytes", "stdin",
                 "stdio", "stdout_max_bytes", "wall_time_s")

    def __init__(self, body: Any) -> None:  # noqa: ANN401  a decoded msgpack value
        if not isinstance(body, dict) or body.get("type") != "exec_request":
            raise ValueError("the request is not an exec_request")
        self.argv: list[str] = body["argv"]
        self.stdin: bytes = body["stdin"]
        #: path -> (data, executable)
        self.files: dict[str, tuple[bytes, bool]] = {
            path: (f["data"], f["executable"]) for path, f in body["files"].items()}
        self.collect: list[str] = body["collect"]
        #: The program's variables over the adapter's (checked by the parent).
        self.env: dict[str, str] = body["env"]
        self.stdout_max_bytes: int = body["stdout_max_bytes"]
        self.stderr_max_bytes: int = body["stderr_max_bytes"]
        self.wall_time_s: float = body["wall_time_s"]
        self.cpu_time_s: float = body["cpu_time_s"]
        #: "pipes"; streaming, "stream" or "pty" (`_run_streaming`).
        self.stdio: str = body["stdio"]


def result(code: int, stdout: bytes, stderr: bytes, files: list[dict[str, object]],
           unmatched: list[str], elapsed_s: float, usage: dict[str, object] | None = None,
           limit: str | None = None) -> dict[str, object]:
    """The reply for a program that ended with `code` (negative: killed by
    that signal): protocol.ExecResult's wire map, its fields in order."""
    return {
        "type": "exec_result",
        "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else None,
        "stdout": stdout,
        "stderr": stderr,
        "files": files,
        "unmatched": unmatched,
        "elapsed_s": elapsed_s,
        "usage": usage,
        "limit": limit,
    }


class Meter:
    """The program's limits, enforced here so that its usage is still
    reported: its wall time from its start, and its whole tree's CPU time,
    polled from /proc (every process of this PID namespace but pid 1 and
    this adapter is the program's: the adapter is its subreaper) plus what
    this adapter reaped. A poll comes when the tree could first have
    reached the limit at full speed on every CPU, so polls are rare while
    far from it and close together near it (at least `MIN_POLL_S` apart)."""

    MIN_POLL_S = 0.005

    def __init__(self, began: float, wall_time_s: float, cpu_time_s: float) -> None:
        self.deadline = began + wall_time_s
        self.cpu_time_s = cpu_time_s
        self.cpus = max(len(posix.sched_getaffinity(0)), 1)
        self.tick = posix.sysconf("SC_CLK_TCK")
        self.me = posix.getpid()
        self.next_poll = began + max(cpu_time_s / self.cpus, self.MIN_POLL_S)

    def timeout_ms(self) -> int:
        """How long poll() may sleep before the next check is due."""
        left = min(self.deadline, self.next_poll) - time.monotonic()
        return max(int(left * 1000) + 1, 0)

    def check(self) -> str | None:
        """The limit the program went past ("timeout", "cpu_time"), if any."""
        now = time.monotonic()
        if now >= self.deadline:
            return "timeout"
        if now >= self.next_poll:
            used = self.tree_cpu_s()
            if used >= self.cpu_time_s:
                return "cpu_time"
            self.next_poll = now + max((self.cpu_time_s - used) / self.cpus, self.MIN_POLL_S)
        return None

    def tree_cpu_s(self) -> float:
        """The tree's CPU time so far: its cgroup's (`prog`), where it has
        one; else each live process's own and its reaped children's
        (/proc/PID/stat, clock ticks), and what we reaped."""
        if prog.has_cpu():
            user, system = prog.cpu_s()
            return user + system
        ticks = 0
        for name in posix.listdir("/proc"):
            if not name.isdigit() or int(name) in (1, self.me):
                continue
            try:
                fd = posix.open(f"/proc/{name}/stat", posix.O_RDONLY | posix.O_CLOEXEC)
            except OSError:
                continue  # gone
            try:
                data = posix.read(fd, 4096)
            except OSError:
                data = b""
            finally:
                posix.close(fd)
            fields = data.rpartition(b")")[2].split()  # the name may hold spaces
            if len(fields) > 14:  # utime, stime, cutime, cstime: fields 14-17
                ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ticks / self.tick + reaped.ru_utime + reaped.ru_stime


def tree_usage(wall_s: float) -> dict[str, object]:
    """`trunner.Usage`'s wire map for the program's tree, once all of it is
    reaped: its cgroup's figures (`prog`) where the run has one; else this
    adapter's children's rusage, which is the tree's and nothing else (it
    reaped every process of it, directly or as their subreaper), but for
    the processes the kernel reaped (a tree that ignores SIGCHLD)."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system, cpu_source = reaped.ru_utime, reaped.ru_stime, "rusage"
    if prog.has_cpu():
        (user, system), cpu_source = prog.cpu_s(), "cgroup"
    peak, memory_source = reaped.ru_maxrss * 1024, "max_rss"
    if prog.has_peak():
        peak, memory_source = prog.peak_bytes(), "cgroup"
    return {"wall_s": wall_s, "cpu_user_s": user, "cpu_sys_s": system,
            "peak_memory_bytes": peak, "memory_source": memory_source,
            "cpu_source": cpu_source}


def run_exec(body: object) -> dict[str, object]:
    """Place the request's files, run its argv in this jail, capture its
    output, bounded, then collect the files its patterns match.

    When a stream crosses its cap the program is killed and the reply holds
    that stream's first cap + 1 bytes: the parent sees the cap crossed and
    reports `stdout_cap` / `stderr_cap`, never the output. Collected files
    share what is left of the stdout cap, with the same rule (`collect`).
    """
    _refuse_outside_a_jail()
    request = Request(body)
    place(request.files)
    # A pty's controlling side goes to the parent before anything of the
    # program exists (and before `_prepare` refuses imports: `_socket`).
    pty = _pty_to_parent() if request.stdio == "pty" else None
    _prepare(request.collect)
    began = time.monotonic()
    if request.stdio != "pipes":
        return _run_streaming(request, began, pty)
    try:
        pid, stdin_w, out_r, err_r = _spawn(request.argv, request.env)
    except NotRun as e:  # as a shell answers: 127 or 126, one line on stderr
        elapsed_s = time.monotonic() - began
        return result(e.code, b"", e.line, [], [], elapsed_s, tree_usage(elapsed_s))
    meter = Meter(began, request.wall_time_s, request.cpu_time_s)
    caps = {out_r: request.stdout_max_bytes, err_r: request.stderr_max_bytes}
    bufs = {fd: bytearray() for fd in caps}
    crossed, limit = _pump(pid, request.stdin, stdin_w, caps, bufs, meter)
    # The leader has exited, or a limit or a cap was crossed: everything of
    # the tree goes now (whatever left its group too), and is reaped here, so
    # that its times and peak are ours to report.
    _kill_tree(pid)
    code = posix.waitstatus_to_exitcode(posix.waitpid(pid, 0)[1])
    elapsed_s = time.monotonic() - began
    _reap_all()
    # Every writer is gone now: what the program wrote and we had not read
    # yet (a limit came first) is read to the end, within the caps.
    # After a crossed cap, the other stream stays within its own: the first
    # cap crossed is the one the parent reports.
    _drain_rest(caps, bufs, past_cap=not crossed)
    usage = tree_usage(elapsed_s)
    cpu_s = usage["cpu_user_s"] + usage["cpu_sys_s"]  # type: ignore[operator]
    if limit is None and (cpu_s >= request.cpu_time_s or code == -SIGXCPU):
        limit = "cpu_time"  # past it between two polls, or RLIMIT_CPU's backstop
    stdout = bytes(bufs[out_r])
    files: list[dict[str, object]] = []
    unmatched: list[str] = []
    if not crossed and limit is None and request.collect:
        files, unmatched = collect(request.collect, request.stdout_max_bytes - len(stdout))
    return result(code, stdout, bytes(bufs[err_r]), files, unmatched, elapsed_s, usage, limit)


def _run_streaming(request: Request, began: float,
                   pty: tuple[str, int] | None) -> dict[str, object]:
    """A streaming run (`Runner.open_process`): the program's stdin is fd 0
    (after the request frame), its stdout STREAM_FD, its stderr fd 2, all
    the parent's own pipes, which the parent reads and caps; or, with
    `pty` (its path, from `_pty_to_parent`), that pty on all three, as its
    controlling terminal. This adapter reads none of them and keeps only
    fd 1, the reply's pipe (the program's fd 1 is STREAM_FD's copy or the
    pty, and this process is not dumpable: the program cannot reach the
    reply pipe). Enforces the wall and CPU time as `run_exec` does, then
    replies with the exit and the usage, no output (a NotRun's line goes
    to the program's stderr, as a shell's)."""
    try:
        pid = _spawn_streaming(request.argv, request.env, pty)
    except NotRun as e:
        elapsed_s = time.monotonic() - began
        return result(e.code, b"", b"", [], [], elapsed_s, tree_usage(elapsed_s))
    meter = Meter(began, request.wall_time_s, request.cpu_time_s)
    exited = posix.pidfd_open(pid)
    poller = select.poll()
    poller.register(exited, select.POLLIN)
    limit = None
    try:
        while not poller.poll(meter.timeout_ms()):
            limit = meter.check()
            if limit is not None:
                break
    finally:
        posix.close(exited)
    _kill_tree(pid)
    code = posix.waitstatus_to_exitcode(posix.waitpid(pid, 0)[1])
    elapsed_s = time.monotonic() - began
    _reap_all()
    usage = tree_usage(elapsed_s)
    cpu_s = usage["cpu_user_s"] + usage["cpu_sys_s"]  # type: ignore[operator]
    if limit is None and (cpu_s >= request.cpu_time_s or code == -SIGXCPU):
        limit = "cpu_time"
    return result(code, b"", b"", [], [], elapsed_s, usage, limit)


def _pty_to_parent() -> tuple[str, int]:
    """Allocate a pty in the run's own devpts (/dev/ptmx links into it: no
    host pty is in the jail), send its controlling side to the parent over
    the socket at STREAM_FD (SCM_RIGHTS) and close it and the socket here;
    the path of the other side, which the program opens as its controlling
    terminal, and that side, held (close-on-exec) until the program has
    it: with no process holding it, the parent's reads end (EIO)."""
    import _socket

    control, terminal = posix.openpty()
    try:
        path = posix.ttyname(terminal)
        link = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, STREAM_FD)
        try:
            link.sendmsg([b"p"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                   struct.pack("i", control))])
        finally:
            link.close()  # STREAM_FD: the program never gets it
    except BaseException:
        posix.close(terminal)
        raise
    finally:
        posix.close(control)
    return path, terminal


def _spawn_streaming(argv: list[str], env: Mapping[str, str],
                     pty: tuple[str, int] | None) -> int:
    """`_spawn` on the parent's pipes: fd 0 and 2 as they are, STREAM_FD as
    fd 1; or, with `pty`, that pty opened on fd 0 (in the program's new
    session, so it becomes its controlling terminal) and copied to 1 and 2.
    Closes fd 0 and STREAM_FD here (the program holds them now); fd 2
    stays, for this adapter's own last words. Raises NotRun."""
    environ: dict[bytes, bytes | str] = dict(posix.environ)
    for name, value in env.items():
        environ[name.encode()] = value
    if "PATH" in env:
        posix.putenv("PATH", env["PATH"])
    actions: list[tuple[int | str, ...]]
    if pty is None:
        posix.set_inheritable(STREAM_FD, False)  # dup2 onto fd 1 makes the program's copy
        actions = [(posix.POSIX_SPAWN_DUP2, STREAM_FD, 1)]
    else:  # glibc's posix_spawn runs setsid before the file actions
        posix.set_inheritable(0, False)
        actions = [(posix.POSIX_SPAWN_OPEN, 0, pty[0], posix.O_RDWR, 0),
                   (posix.POSIX_SPAWN_DUP2, 0, 1), (posix.POSIX_SPAWN_DUP2, 0, 2)]
    prog.enter()
    try:
        return posix.posix_spawnp(argv[0], argv, environ, file_actions=actions,
                                  setsigdef=(SIGPIPE, SIGXFSZ), setsid=True)
    except OSError as e:
        error = _not_run(argv[0], e)
        _write_all(2 if pty is None else pty[1], error.line)  # where its stderr would be
        raise error from None
    finally:
        prog.leave()
        for fd in (0, STREAM_FD) if pty is None else (0, pty[1]):
            posix.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[posix.write(fd, view) :]
    except OSError:
        pass  # the parent stopped reading: the reply still tells


def _reap_all() -> None:
    """Reap every child left (the tree's orphans come to us, its subreaper)."""
    while True:
        try:
            posix.waitpid(-1, 0)
        except ChildProcessError:
            return


def _prepare(patterns: Sequence[str]) -> None:
    """What must happen before the program exists: every import the rest
    of the run makes, this process out of the program's reach, and any
    later import refused (struct, for wire.pack's floats, is this module's)."""
    if any(c in p for p in patterns for c in "*?["):
        import fnmatch  # noqa: F401  _match's wildcards

    # Not dumpable: /proc/PID/{fd,mem,...} of this process become root's
    # and ptrace-checked, so the program (same uid, same Landlock domain)
    # cannot open the response pipe or this memory. The program's own exec
    # makes it dumpable again.
    syscall(NR["prctl"], PR_SET_DUMPABLE, 0, 0, 0, 0)
    # The subreaper of the program's tree: its orphans come to us, not to
    # pid 1, so that every process of it is reaped here and its times and
    # peak count in our children's rusage, which is the tree's alone.
    syscall(NR["prctl"], PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    sys.addaudithook(_refuse_imports)


def _refuse_imports(event: str, args: tuple[object, ...]) -> None:
    if event == "import":
        posix.write(2, b"trunner-worker: import of %r after the program started\n" % (args[0],))
        posix._exit(IMPORT_AFTER_START_EXIT)


class NotRun(Exception):
    """The program could not be started: `code` is a shell's (127 not found,
    126 cannot execute), `line` what goes on its stderr."""

    def __init__(self, code: int, line: bytes) -> None:
        super().__init__(code, line)
        self.code, self.line = code, line


#: errnos of exec that mean "no such program" (a shell's 127); any other is 126.
_NOT_FOUND = frozenset({2, 20})  # ENOENT, ENOTDIR


def _not_run(name: str, error: OSError) -> NotRun:
    shown = name.encode(errors="backslashreplace")
    if error.errno in _NOT_FOUND:
        return NotRun(127, b"trunner: %s: not found\n" % shown)
    why = posix.strerror(error.errno) if error.errno else str(error)
    return NotRun(126, b"trunner: %s: cannot execute: %s\n" % (shown, why.encode()))


def _spawn(argv: list[str], env: Mapping[str, str]) -> tuple[int, int, int, int]:
    """Start `argv` (searched on PATH) on three new pipes, as subprocess would
    (SIGPIPE and SIGXFSZ back to default; every other fd is close-on-exec),
    in a session and process group of its own: its `kill(0, ...)` and
    `killpg(0, ...)` reach its own tree, never this adapter. Whatever leaves
    that group too still dies with the run: the jail's pid 1 exits when this
    adapter does, and the kernel then kills the whole PID namespace.
    `env` is set over this adapter's environment for the program only; a
    PATH there is also the one `argv[0]` is searched on, as `env` does.
    Returns the pid and our ends: stdin, stdout, stderr.

    Raises:
        NotRun: the program was not found (127) or cannot be executed (126):
            ENOEXEC, EACCES, a directory, ... (posix_spawnp reports the
            exec's errno here).
    """
    environ: dict[bytes, bytes | str] = dict(posix.environ)
    for name, value in env.items():
        environ[name.encode()] = value
    if "PATH" in env:
        # posix_spawnp searches this process's PATH, not the program's.
        posix.putenv("PATH", env["PATH"])
    in_r, in_w = posix.pipe()
    out_r, out_w = posix.pipe()
    err_r, err_w = posix.pipe()
    prog.enter()  # the program is born in its cgroup; we return at once
    try:
        pid = posix.posix_spawnp(
            argv[0], argv, environ,
            file_actions=[(posix.POSIX_SPAWN_DUP2, in_r, 0), (posix.POSIX_SPAWN_DUP2, out_w, 1),
                          (posix.POSIX_SPAWN_DUP2, err_w, 2)],
            setsigdef=(SIGPIPE, SIGXFSZ),
            setsid=True,  # its own session and group: its `kill 0` cannot reach us
        )
    except BaseException as e:
        for fd in (in_w, out_r, err_r):
            posix.close(fd)
        if isinstance(e, OSError):
            raise _not_run(argv[0], e) from None
        raise
    finally:
        prog.leave()
        for fd in (in_r, out_w, err_w):
            posix.close(fd)
    return pid, in_w, out_r, err_r


def _pump(pid: int, stdin: bytes, stdin_w: int, caps: dict[int, int],
          bufs: dict[int, bytearray], meter: Meter) -> tuple[bool, str | None]:
    """Feed stdin and read both streams until EOF and the leader's exit, or
    until a stream crosses its cap (True) or the program a limit (its name):
    then kill the program. Closes every fd but the streams' (`_drain_rest`)."""
    pending = memoryview(stdin)
    poller = select.poll()
    live = set(caps)
    for fd in caps:
        poller.register(fd, select.POLLIN)
    exited = posix.pidfd_open(pid)
    poller.register(exited, select.POLLIN)
    live.add(exited)
    if pending:
        posix.set_blocking(stdin_w, False)
        poller.register(stdin_w, select.POLLOUT)
        live.add(stdin_w)
    else:
        posix.close(stdin_w)
    crossed, limit = False, None
    try:
        while live and not crossed and limit is None:
            for fd, _ in poller.poll(meter.timeout_ms()):
                if fd == exited:
                    poller.unregister(fd)
                    live.discard(fd)
                    continue
                if fd == stdin_w:
                    try:
                        pending = pending[posix.write(fd, pending[:_CHUNK]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        poller.unregister(fd)
                        live.discard(fd)
                        posix.close(fd)
                    continue
                buf = bufs[fd]
                chunk = posix.read(fd, min(_CHUNK, caps[fd] + 1 - len(buf)))
                if not chunk:
                    poller.unregister(fd)
                    live.discard(fd)
                    continue
                buf += chunk
                if len(buf) > caps[fd]:
                    _kill_tree(pid)
                    crossed = True
                    break
            if not crossed:
                limit = meter.check()
        if limit is not None:
            _kill_tree(pid)
    finally:
        for fd in (exited, *(live & {stdin_w})):
            posix.close(fd)
    return crossed, limit


def _drain_rest(caps: dict[int, int], bufs: dict[int, bytearray], *, past_cap: bool) -> None:
    """Read what is left in both streams, each up to its cap (one byte past
    it with `past_cap`), then close them: after a limit or a cap, what the
    program wrote that `_pump` had not read yet (after its exit, both are
    at EOF already). Called once the whole tree is reaped: no writer is
    left, so each read ends at EOF; non-blocking all the same."""
    for fd, cap in caps.items():
        buf, most = bufs[fd], cap + 1 if past_cap else cap
        try:
            posix.set_blocking(fd, False)
            while len(buf) < most:
                chunk = posix.read(fd, min(_CHUNK, most - len(buf)))
                if not chunk:
                    break
                buf += chunk
        except OSError:
            pass  # EAGAIN: nothing more
        finally:
            posix.close(fd)


def _refuse_outside_a_jail() -> None:
    """This adapter ends its program's tree with kill(-1): run by hand on a
    host, as root, that would kill every process the caller may signal. It
    serves only as pid 2 of a jail's own PID namespace."""
    if posix.getpid() != ADAPTER_PID:
        raise SystemExit(f"trunner exec adapter: pid {posix.getpid()}, not {ADAPTER_PID}:"
                         " it runs only inside a trunner jail")


def _kill_tree(pid: int) -> None:
    """SIGKILL the program's whole tree: every process of this PID namespace
    but pid 1 and this adapter (kill(-1) skips both), whatever group or
    session it left for. `pid`, its leader, stays ours to reap."""
    del pid
    _refuse_outside_a_jail()
    try:  # noqa: SIM105  contextlib is one more import for the adapter
        posix.kill(-1, SIGKILL)
    except ProcessLookupError:
        pass


def place(files: Mapping[str, tuple[bytes, bool]]) -> None:
    """Write `files` (path -> (data, executable)) into the working dir (the
    cwd), making parent dirs. The exec bit comes from the mode at creation:
    chmod is denied in the jail."""
    old = posix.umask(0o022)
    try:
        for path, (data, executable) in files.items():
            parent = path.rpartition("/")[0]
            if parent:
                _makedirs(parent)
            flags = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW
            flags |= posix.O_CLOEXEC
            fd = posix.open(path, flags, 0o755 if executable else 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[posix.write(fd, view) :]
            finally:
                posix.close(fd)
    finally:
        posix.umask(old)


def _makedirs(path: str) -> None:
    """`os.makedirs(path, 0o755, exist_ok=True)` for a relative path."""
    current = ""
    for part in path.split("/"):
        current = f"{current}/{part}" if current else part
        try:
            posix.mkdir(current, 0o755)
        except FileExistsError:
            if posix.stat(current).st_mode & S_IFMT != S_IFDIR:
                raise


def collect(patterns: Sequence[str], budget: int) -> tuple[list[dict[str, object]], list[str]]:
    """The regular files `patterns` match, as protocol.CollectedFile maps
    (sorted by path, each once), and the patterns that matched none. Reading
    stops past `budget` bytes or `EXEC_COLLECT_MAX_FILES` files: the last
    file is then cut one byte past the budget, or one file too many is
    listed, without reading any (the parent fails the run with
    `stdout_cap`, or `too_many_files`); it never returns a cut file."""
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
    out: list[dict[str, object]] = []
    if len(found) > EXEC_COLLECT_MAX_FILES:  # the run fails: their names say why
        names = sorted(found)[: EXEC_COLLECT_MAX_FILES + 1]
        return [{"path": p, "size": 0, "data": b"", "mode": 0} for p in names], unmatched
    for path in sorted(found):
        read = _read_file_no_follow(path, budget + 1)
        if read is None:  # gone, or no longer a regular file
            continue
        data, mode = read
        out.append({"path": path, "size": len(data), "data": data, "mode": mode})
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
            from fnmatch import fnmatchcase  # imports re: only for a wildcard

            names = [e.name for e in _entries(prefix) if fnmatchcase(e.name, seg)]
        else:
            names = [seg]
        for name in names:
            path = prefix + name
            try:
                mode = posix.lstat(path).st_mode
            except (OSError, ValueError):
                continue
            if rest and mode & S_IFMT == S_IFDIR:
                stack.append((path + "/", rest))
            elif not rest and mode & S_IFMT == S_IFREG and _plain(path):
                yield path


def _entries(prefix: str) -> list[posix.DirEntry[str]]:
    try:
        with posix.scandir(prefix or ".") as it:
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
    read = _read_file_no_follow(path, most)
    return None if read is None else read[0]


def _read_file_no_follow(path: str, most: int) -> tuple[bytes, int] | None:
    """`_read_no_follow`, and the file's permission bits."""
    parts = path.split("/")
    nofollow = posix.O_NOFOLLOW | posix.O_CLOEXEC
    try:
        dir_fd = posix.open(".", posix.O_RDONLY | posix.O_DIRECTORY | posix.O_CLOEXEC)
    except OSError:
        return None
    try:
        for name in parts[:-1]:
            fd = posix.open(name, posix.O_RDONLY | posix.O_DIRECTORY | nofollow, dir_fd=dir_fd)
            posix.close(dir_fd)
            dir_fd = fd
        fd = posix.open(parts[-1], posix.O_RDONLY | posix.O_NONBLOCK | nofollow, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        posix.close(dir_fd)
    try:
        mode = posix.fstat(fd).st_mode
        if mode & S_IFMT != S_IFREG:
            return None
        chunks, left = [], most
        while left > 0:
            chunk = posix.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), mode & 0o7777
    finally:
        posix.close(fd)
