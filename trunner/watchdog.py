"""Jailed process groups die with the parent process, descendants included.

The parent-death signal the helper arms reaches only the group leader. So
each parent process also keeps one small unjailed watchdog (started once,
in its own session) that holds the read end of a pipe and a list of live
jailed groups. When the parent dies, for any reason, the pipe reaches EOF and
the watchdog SIGKILLs every listed group and removes their cgroups. Groups
are listed right after spawn and unlisted after their kill, before the reap,
so the watchdog never names a recycled pgid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

_CODE = r"""
import os, time
groups = {}
buf = b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\n")
    for line in lines:
        op, pgid, cgroup = line.decode().split(" ", 2)
        if op == "+":
            groups[int(pgid)] = cgroup
        else:
            groups.pop(int(pgid), None)
for pgid in groups:
    try:
        os.killpg(pgid, 9)
    except OSError:
        pass
for cgroup in filter(None, groups.values()):
    for _ in range(200):
        try:
            with open(cgroup + "/cgroup.procs") as f:
                pids = f.read().split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
            os.rmdir(cgroup)
            break
        except FileNotFoundError:
            break
        except OSError:
            time.sleep(0.01)
"""

_lock = threading.Lock()
_proc: subprocess.Popen[bytes] | None = None
_groups: dict[int, str] = {}


def ensure_running() -> int:
    """Start the watchdog if it does not run; returns its pid."""
    with _lock:
        _send("")
        assert _proc is not None
        return _proc.pid


def _send(line: str) -> None:
    global _proc
    if _proc is None or _proc.poll() is not None:
        _proc = subprocess.Popen(
            [os.path.realpath(sys.executable), "-I", "-S", "-c", _CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env={},
            start_new_session=True,
        )
        assert _proc.stdin is not None
        # A new watchdog learns every group still alive.
        for pgid, cgroup in _groups.items():
            os.write(_proc.stdin.fileno(), f"+ {pgid} {cgroup}\n".encode())
    assert _proc.stdin is not None
    if line:
        os.write(_proc.stdin.fileno(), line.encode())


def watch(pgid: int, cgroup: str | None) -> None:
    """List a jailed process group (and its cgroup) with the watchdog."""
    with _lock:
        _groups[pgid] = cgroup or ""
        _send(f"+ {pgid} {cgroup or ''}\n")


def unwatch(pgid: int) -> None:
    """Unlist a group once it has been SIGKILLed, before its leader is reaped."""
    with _lock:
        if _groups.pop(pgid, None) is not None:
            try:
                _send(f"- {pgid} \n")
            except OSError:
                pass


def watchdog_pid() -> int | None:
    """The watchdog's pid, if one runs (tests exclude it from leak checks)."""
    return _proc.pid if _proc is not None and _proc.poll() is None else None
