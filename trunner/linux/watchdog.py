"""Jailed process groups, their cgroups and jail dirs go with the parent.

The parent-death signal the helper arms reaches only the group leader. So
each parent process also keeps one small unjailed watchdog: this file, run
as a script (`python -I -S watchdog.py`, started once, in its own session),
reading records from a pipe whose write end only the parent holds. When the
parent dies, for any reason, the pipe reaches EOF and the watchdog SIGKILLs
every listed group, removes their cgroups, then their jail dirs.

A jail dir and its cgroup are listed before anything runs in them, and
unlisted once the parent has removed the dir. A group is listed at spawn and
unlisted after its kill, before the reap, so the watchdog never names a
recycled pgid. Both sides keep the same tables with
`apply`, so a restarted watchdog learns them by replay. The script imports
only the standard library and `trunner.cleanup`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False  # not from typing: the watchdog script would pay ~5 ms for it
if TYPE_CHECKING:
    from collections.abc import Callable

#: Live groups: pgid -> (cgroup, jail dir), "" for none.
Groups = dict[int, tuple[str, str]]
#: Killed groups whose cgroup or dir may remain: jail dir (or cgroup) -> both.
Leftovers = dict[str, tuple[str, str]]

#: How long a watchdog whose parent died retries a cgroup or dir it cannot remove.
GIVE_UP_S = 10.0


def apply(
    groups: Groups, leftovers: Leftovers, op: str, pgid: int, cgroup: str, jail_dir: str
) -> None:
    """One record: `=` a jail dir (and cgroup) held before any spawn, or a
    killed group's leftovers on replay; `+` a group spawned into them; `-`
    the group killed; `x` the jail dir removed."""
    if op == "+":
        groups[pgid] = (cgroup, jail_dir)
    elif op == "-":
        entry = groups.pop(pgid, None)
        if entry is not None and entry != ("", ""):
            leftovers[entry[1] or entry[0]] = entry
    elif op == "=":
        leftovers[jail_dir or cgroup] = (cgroup, jail_dir)
    elif op == "x":
        leftovers.pop(jail_dir, None)


def _record(op: str, pgid: int = 0, cgroup: str = "", jail_dir: str = "") -> bytes:
    # NUL-terminated fields: no path can hold a NUL.
    return b"".join(os.fsencode(f) + b"\0" for f in (op, str(pgid), cgroup, jail_dir))


# -- the watchdog process ------------------------------------------------------


def main(fd: int = 0) -> None:
    """Read records from `fd` until EOF, then clean up what is listed."""
    from trunner.cleanup import remove_tree  # before EOF: no import at the parent's death

    groups: Groups = {}
    leftovers: Leftovers = {}
    pending = b""
    while chunk := os.read(fd, 65536):
        *fields, tail = (pending + chunk).split(b"\0")
        whole = len(fields) - len(fields) % 4
        for i in range(0, whole, 4):
            op, pgid, cgroup, jail_dir = (os.fsdecode(f) for f in fields[i : i + 4])
            apply(groups, leftovers, op, int(pgid), cgroup, jail_dir)
        pending = b"".join(f + b"\0" for f in fields[whole:]) + tail
    clean_up(groups, leftovers, remove_tree)


def clean_up(groups: Groups, leftovers: Leftovers, remove_tree: Callable[[str], bool]) -> None:
    """SIGKILL every group, then remove the cgroups and jail dirs, retrying
    what is still busy (a process not yet dead) for up to GIVE_UP_S."""
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    entries = [*groups.values(), *leftovers.values()]
    # A run's cgroups (pids and memory on v1) are one newline-separated field.
    cgroups = {path for cgroup, _ in entries for path in cgroup.split("\n") if path}
    dirs = {jail_dir for _, jail_dir in entries if jail_dir}
    give_up, pause = time.monotonic() + GIVE_UP_S, 0.001
    while True:
        cgroups = {c for c in cgroups if not _remove_cgroup(c)}
        dirs = {d for d in dirs if not remove_tree(d)}
        if not (cgroups or dirs) or time.monotonic() > give_up:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _remove_cgroup(path: str) -> bool:
    """Remove an empty cgroup, or SIGKILL what it still holds; whether it is gone."""
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = f.read().split()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(int(pid), signal.SIGKILL)
    return False


# -- the parent side -----------------------------------------------------------

_lock = threading.Lock()
_proc: subprocess.Popen[bytes] | None = None
_groups: Groups = {}
_leftovers: Leftovers = {}


def _send(op: str = "", pgid: int = 0, cgroup: str = "", jail_dir: str = "") -> None:
    global _proc
    if op:
        apply(_groups, _leftovers, op, pgid, cgroup, jail_dir)
    if _proc is None or _proc.poll() is not None:
        _proc = subprocess.Popen(
            [os.path.realpath(sys.executable), "-I", "-S", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env={},
            start_new_session=True,
        )
        # A new watchdog learns the whole state, this record included.
        replay = [_record("+", p, *entry) for p, entry in _groups.items()]
        replay += [_record("=", 0, *entry) for entry in _leftovers.values()]
        _write(b"".join(replay))
    elif op:
        _write(_record(op, pgid, cgroup, jail_dir))


def _write(data: bytes) -> None:
    assert _proc is not None
    assert _proc.stdin is not None
    view = memoryview(data)
    while view:
        view = view[os.write(_proc.stdin.fileno(), view) :]


def ensure_running() -> int:
    """Start the watchdog if it does not run; returns its pid."""
    with _lock:
        _send()
        assert _proc is not None
        return _proc.pid


def watch(pgid: int, cgroup: str | None, jail_dir: str | None = None) -> None:
    """List a jailed process group, its cgroup and its jail dir."""
    with _lock:
        _send("+", pgid, cgroup or "", jail_dir or "")


def hold(cgroup: str | None, jail_dir: str) -> None:
    """List a jail dir, and the cgroup about to be made for it, before
    anything is spawned into them."""
    with _lock:
        _send("=", 0, cgroup or "", jail_dir)


def unwatch(pgid: int) -> None:
    """Unlist a group once it has been SIGKILLed, before its leader is
    reaped; its cgroup and jail dir stay listed until `forget`."""
    with _lock:
        if pgid in _groups:
            with contextlib.suppress(OSError):
                _send("-", pgid)


def forget(jail_dir: str) -> None:
    """Unlist a jail dir (and its group's cgroup) once the dir is gone."""
    with _lock:
        if jail_dir in _leftovers:
            with contextlib.suppress(OSError):
                _send("x", jail_dir=jail_dir)


def watchdog_pid() -> int | None:
    """The watchdog's pid, if one runs (tests exclude it from leak checks)."""
    return _proc.pid if _proc is not None and _proc.poll() is None else None


if __name__ == "__main__":
    # -I keeps the script's own directory off sys.path; trunner's root is 3 up.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main()
