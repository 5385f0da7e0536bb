"""Worker modes for tests: each misbehaves in one precise way.

Imported inside the jail as user modes (`children:NAME`); the tests put this
directory on the Runner's import paths. Only stdlib and trunner here.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from trunner.protocol import encode_frame
from trunner.worker.adapters import reply_fd


def _out(data: bytes, fd: int | None = None) -> None:
    """Write `data` to `fd`, by default (and for fd 1) the response pipe: a
    user mode's fd 1 is the run's stderr, the pipe is elsewhere."""
    fd = reply_fd() if fd in (None, 1) else fd
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def frame_then_byte(req: Any) -> None:
    _out(encode_frame(req) + b"x")
    os._exit(0)


def two_frames(req: Any) -> Any:
    _out(encode_frame(req))
    return req  # the worker writes the second frame


def half_header(req: Any) -> None:
    _out(b"\x00\x00")
    os._exit(0)


def huge_length(req: Any) -> None:
    _out(b"\xff\xff\xff\xff")
    os._exit(0)


def frame_then_exit1(req: Any) -> None:
    _out(encode_frame(req))
    os._exit(1)


def frame_then_signal(req: Any) -> None:
    _out(encode_frame(req))
    os.kill(os.getpid(), req)


def raise_error(req: Any) -> None:
    raise RuntimeError("boom from the child")


def sleep_ignoring_term(req: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(10**6)


def write_then_sleep(req: dict[str, int]) -> None:
    """Write req['n'] bytes to fd req['fd'] then hang: only a cap can end it."""
    _out(b"a" * req["n"], req["fd"])
    time.sleep(10**6)


def stderr_then_reply(req: dict[str, int]) -> str:
    _out(b"e" * req["n"], 2)
    return "ok"


def exact_stdout(req: int) -> None:
    """Write one frame whose total length is exactly `req` bytes."""
    for header in (6, 7, 9):  # msgpack bin8, bin16, bin32 headers
        frame = encode_frame(b"x" * max(req - header, 0))
        if len(frame) == req:
            _out(frame)
            os._exit(0)
    raise ValueError(f"no frame of exactly {req} bytes")


def grandchild_holds_stdout(req: Any) -> str:
    """Fork a grandchild that holds stdout; return the jail's PID namespace."""
    pid = os.fork()
    if pid == 0:
        time.sleep(10**6)
        os._exit(0)
    return os.readlink("/proc/self/ns/pid")


def spin(req: Any) -> None:
    while True:
        pass


def status(req: Any) -> dict[str, Any]:
    with open("/proc/self/status") as f:
        text = f.read()
    return {
        "status": text,
        "environ": dict(os.environ),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "uid": os.getuid(),
        "pidns": os.readlink("/proc/self/ns/pid"),
        "reply_fd": reply_fd(),
    }


def sleep(req: float) -> str:
    time.sleep(req)
    return "slept"


def pid_then_sleep(req: Any) -> None:
    """Announce the pid on stderr, then hang."""
    _out(f"pid={os.getpid()}\n".encode(), 2)
    time.sleep(10**6)


def run_code(req: str) -> Any:
    """Run `req` as Python in this worker process; returns the `result` name.
    Its fd 1 is the response pipe again, as for hostile code that finds it
    (a snippet's stray output fails the run, as it would any frame)."""
    os.dup2(reply_fd(), 1)
    scope: dict[str, Any] = {}
    exec(req, scope)
    return scope.get("result")


def chatty(req: int) -> dict[str, int]:
    """print() `req` bytes, and write more to sys.stdout, then reply."""
    import sys

    print("p" * (req // 2))
    sys.stdout.write("w" * (req - req // 2 - 1))
    return {"ok": 1}


def files_then_list(req: Any) -> dict[str, Any]:
    """Run a FilesRequest's ops on the working dir in this process, as a
    session's command runs them in its jail, and list, before and after,
    everything the run's scratch holds (the working dir, /tmp, /dev/shm;
    not the binds on it) and the dir above the working dir."""
    from trunner.worker.files_mode import run_files

    def listing() -> dict[str, list[str]]:
        cwd = os.getcwd()
        found = {"above": sorted(os.listdir(os.path.dirname(cwd)))}
        for top in (cwd, "/tmp", "/dev/shm"):
            dev, paths = os.lstat(top).st_dev, []
            for dirpath, dirs, names in os.walk(top):
                dirs[:] = [d for d in dirs if os.lstat(os.path.join(dirpath, d)).st_dev == dev]
                paths += [os.path.relpath(os.path.join(dirpath, n), top) for n in dirs + names]
            found[top] = sorted(paths)
        return found

    before = listing()
    reply = run_files(req)
    return {"reply": reply, "before": before, "after": listing(), "cwd": os.getcwd()}
