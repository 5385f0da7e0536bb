"""What the parent side reads about processes in /proc: one parser for each
file (`stat`, `status`, the children list, `cgroup`, `mountinfo`), for the
cleanup and the watchdog, the Linux backend, the fork server's client, the
host-id check, the probe, the cgroup setup and the socket walk.

Imports only `os`: the watchdog script imports it (through
`trunner.cleanup`) at an interpreter's start, so not even typing. A process
may end between two reads: every reader answers for one that is gone, or a
file it cannot read, with an empty value, never an OSError. `proc` is where
proc is mounted (tests point it elsewhere). The child side (the helper,
`trunner/kernel/`, `trunner/worker/`) reads /proc with its own code.
"""

from __future__ import annotations

import os

#: Indices into `stat`'s fields: proc(5)'s field numbers less 3 (the fields
#: from the state on).
STATE, PPID, PGRP, FLAGS = 0, 1, 2, 6
UTIME, STIME, CUTIME, CSTIME = 11, 12, 13, 14
START_TIME = 19


def stat(pid: int | str, proc: str = "/proc") -> list[bytes]:
    """/proc/PID/stat's fields from the state on, indexed by the names
    above (the command before them, in parentheses, may hold anything); []
    if there is no such process."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []
    return fields if len(fields) > START_TIME else []


def exited(fields: list[bytes]) -> bool:
    """Whether the process whose `stat` is `fields` is gone, a zombie or
    dead: it holds nothing but its pid."""
    return not fields or fields[STATE] in (b"Z", b"X")


def start_time(pid: int | str) -> int | None:
    """When `pid` started, in clock ticks after boot; None if it is gone."""
    fields = stat(pid)
    return int(fields[START_TIME]) if fields else None


def parent(pid: int) -> int:
    """`pid`'s parent's pid; 0 if it is gone."""
    fields = stat(pid)
    return int(fields[PPID]) if fields else 0


def cpu_ticks(pid: int) -> tuple[int, int, int, int] | None:
    """`pid`'s user and system time, and its reaped children's (utime,
    stime, cutime, cstime), in clock ticks; None if it is gone."""
    fields = stat(pid)
    if not fields:
        return None
    return int(fields[UTIME]), int(fields[STIME]), int(fields[CUTIME]), int(fields[CSTIME])


def status(pid: int | str, proc: str = "/proc") -> dict[str, str]:
    """/proc/PID/status as {name: value}, the values stripped; {} if there
    is no such process."""
    try:
        with open(f"{proc}/{pid}/status", encoding="utf-8", errors="replace") as f:
            return {name: value.strip()
                    for name, colon, value in (line.partition(":") for line in f) if colon}
    except OSError:
        return {}


def ns_pid(pid: int) -> int:
    """`pid`'s pid in its innermost PID namespace; 0 if it is gone."""
    ids = status(pid).get("NSpid", "").split()
    return int(ids[-1]) if ids and ids[-1].isdigit() else 0


def peak_rss_bytes(pid: int) -> int:
    """`pid`'s peak resident set (VmHWM), in bytes; 0 if it is gone."""
    kib = status(pid).get("VmHWM", "").split()
    return int(kib[0]) * 1024 if kib and kib[0].isdigit() else 0


def children(pid: int) -> list[int]:
    """The children of `pid`'s main thread (/proc/PID/task/PID/children);
    [] if it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(child) for child in f.read().split()]
    except (OSError, ValueError):
        return []


def pids(proc: str = "/proc") -> list[int]:
    """Every process's pid, as /proc lists them."""
    try:
        return [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def cgroups(pid: int | str = "self") -> dict[str, str]:
    """/proc/PID/cgroup: each hierarchy's controllers as named there
    (`cpu,cpuacct`; "" for the unified v2 one) and the process's cgroup in
    it; {} if there is no such process."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        _, colon, rest = line.partition(":")
        controllers, colon2, path = rest.partition(":")
        if colon and colon2:
            found[controllers] = path
    return found


class Mount:
    """One mount of mountinfo (proc(5)): its mount point (unescaped), its
    options, its type and its superblock's options (where a cgroup v1
    hierarchy names its controllers)."""

    __slots__ = ("fstype", "options", "point", "super_options")

    def __init__(self, point: str, options: str, fstype: str, super_options: str) -> None:
        self.point = point
        self.options = options
        self.fstype = fstype
        self.super_options = super_options


def mounts(mountinfo: str = "/proc/self/mountinfo") -> list[Mount]:
    """This process's mounts, in mountinfo's order; [] if it cannot be read."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if len(fields) > 5 and len(tail) > 2:
            found.append(Mount(_unescape(fields[4]), fields[5], tail[0], tail[2]))
    return found


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \\ooo.
    out, i = [], 0
    while i < len(field):
        digits = field[i + 1:i + 4]
        if field[i] == "\\" and len(digits) == 3 and digits.isdigit():
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
