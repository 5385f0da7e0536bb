"""Jailed process groups, their cgroups and jail dirs go with the parent.

The parent-death signal the helper arms reaches only the group leader. So
each parent process also keeps one small unjailed watchdog: this file, run
as a script (`python -I -S watchdog.py OWNER`, started once), reading
records from a pipe whose write end only the parent holds. It is not the
parent's child: a short-lived intermediate, in a new session, forks it and
exits, so it is reparented (to PID 1 or a subreaper) and a host that kills
the parent's direct children at its exit (Ray's workers do) does not take
it along. When the parent dies, for any reason, the watchdog sees it (a
pidfd on the parent, checked against its start time in OWNER, or the pipe
at EOF), reads the records left in the pipe, then SIGKILLs every listed
group, removes their cgroups, then their jail dirs and the owner dir.

A jail dir and its cgroup are listed before anything runs in them, and
unlisted once the parent has removed the dir. A group is listed at spawn and
unlisted after its kill, before the reap, so the watchdog never names a
recycled pgid. Both sides keep the same tables with
`apply`, so a restarted watchdog learns them by replay. The script imports
only the standard library, `trunner.cleanup` and `trunner.procfs`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time

TYPE_CHECKING = False  # not from typing: the watchdog script would pay ~5 ms for it
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

#: Live groups: pgid -> (cgroup, jail dir), "" for none.
Groups = dict[int, tuple[str, str]]
#: Killed groups whose cgroup or dir may remain: jail dir (or cgroup) -> both.
Leftovers = dict[str, tuple[str, str]]

#: How long a watchdog whose parent died retries a cgroup or dir it cannot remove.
GIVE_UP_S = 10.0
#: How long the watchdog lets records gather in its pipe after reading some.
#: It needs them only once the owner is dead, and reads every one left then;
#: its owner's death (its pidfd) still wakes it at once. A run's five records
#: then cost it one wake-up in many, not five (each ~50 us of host CPU).
GATHER_S = 0.05
#: The pipe's size asked for (records of ~1 KiB a run gather for GATHER_S).
PIPE_BYTES = 1 << 20


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


def main(fd: int = 0, owner: str = "") -> None:
    """Read records from `fd` until EOF or the death of `owner` (an owner id,
    see `trunner.cleanup.owner_id`; "" for EOF only), then clean up what is
    listed."""
    # Before the parent's death: no import then.
    from trunner.cleanup import remove_cgroup, remove_tree

    groups: Groups = {}
    leftovers: Leftovers = {}
    pending = b""

    def feed(chunk: bytes) -> None:
        nonlocal pending
        *fields, tail = (pending + chunk).split(b"\0")
        whole = len(fields) - len(fields) % 4
        for i in range(0, whole, 4):
            op, pgid, cgroup, jail_dir = (os.fsdecode(f) for f in fields[i : i + 4])
            apply(groups, leftovers, op, int(pgid), cgroup, jail_dir)
        pending = b"".join(f + b"\0" for f in fields[whole:]) + tail

    def drain() -> bool:
        """Feed what the pipe holds; whether it is at EOF."""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(fd, 65536):
                feed(chunk)
            return True
        return False

    pidfd = _watch_owner(owner)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    #: Only the owner's death (nothing registered without a pidfd: a sleep).
    death = select.poll()
    if pidfd is not None and pidfd >= 0:
        poller.register(pidfd, select.POLLIN)
        death.register(pidfd, select.POLLIN)
    os.set_blocking(fd, False)
    while pidfd != -1:
        if pidfd is not None and any(f == pidfd for f, _ in poller.poll()):
            break  # the owner is dead; a process it forked may still hold the pipe
        if drain() or death.poll(GATHER_S * 1000):
            break  # EOF, or the owner died while records gathered
    # What the owner wrote before it died is all in the pipe: read it all.
    drain()
    clean_up(groups, leftovers, remove_tree, remove_cgroup)


def _watch_owner(owner: str) -> int | None:
    """A pidfd on the owner; -1 if it is already dead; None if it cannot be
    watched that way (no owner given, no pidfd_open): then EOF alone tells."""
    from trunner.cleanup import owner_alive, parse_owner

    parsed = parse_owner(owner)
    if parsed is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        pidfd = os.pidfd_open(parsed[0])
    except ProcessLookupError:
        return -1
    except OSError:
        return None
    # Checked after the open: the pidfd is the owner's if it still lives now.
    return pidfd if owner_alive(owner) else -1


def clean_up(groups: Groups, leftovers: Leftovers, remove_tree: Callable[[str], bool],
             remove_cgroup: Callable[[str], bool]) -> None:
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
        cgroups = {c for c in cgroups if not remove_cgroup(c)}
        dirs = {d for d in dirs if not remove_tree(d)}
        if not (cgroups or dirs) or time.monotonic() > give_up:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


# -- the parent side -----------------------------------------------------------

_lock = threading.Lock()
#: The write end of the watchdog's pipe, and the watchdog's pid.
_fd: int | None = None
_pid: int | None = None
_intermediate: subprocess.Popen[bytes] | None = None
_groups: Groups = {}
_leftovers: Leftovers = {}

#: Run by the intermediate (`python -I -S -c DETACH PYTHON SCRIPT OWNER`): it
#: forks the watchdog, prints its pid and exits, so that the watchdog is
#: reparented. Its stdin, the pipe, is the watchdog's.
DETACH = """\
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.execv(sys.argv[1], [sys.argv[1], "-I", "-S", *sys.argv[2:]])
    finally:
        os._exit(127)
os.write(1, str(pid).encode())
"""


def _alive() -> bool:
    """Whether the watchdog still reads its pipe (POLLERR: no reader left)."""
    if _fd is None:
        return False
    poller = select.poll()
    poller.register(_fd, 0)
    return not poller.poll(0)


def _start() -> None:
    """Start a watchdog and replay the tables to it. Returns once the
    intermediate has forked it and exited, reaped: a child left to be
    reaped later would show among the caller's children (a zombie) after
    its own runs are gone. Once per process: ~15 ms, an interpreter start."""
    global _fd, _pid, _intermediate
    import subprocess

    from trunner.cleanup import owner_id

    if _fd is not None:
        os.close(_fd)
        _fd = _pid = None
    with contextlib.suppress(OSError):  # a former intermediate, if it is still there
        _reap(block=True)
    python = os.path.realpath(sys.executable)
    read, write = os.pipe()
    try:
        # In a new session: neither the watchdog nor its intermediate is in
        # a process group of the parent's.
        _intermediate = subprocess.Popen(
            [python, "-I", "-S", "-c", DETACH, python, os.path.abspath(__file__), owner_id()],
            stdin=read, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd="/", env={}, start_new_session=True,
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    _fd = write
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: the default
        import fcntl

        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    # A new watchdog learns the whole state, the record being sent included.
    replay = [_record("+", p, *entry) for p, entry in _groups.items()]
    replay += [_record("=", 0, *entry) for entry in _leftovers.values()]
    _write(b"".join(replay))
    _reap(block=True)


def _reap(block: bool) -> None:
    """Reap the intermediate once it has exited (or wait for it, if
    `block`) and learn the watchdog's pid from it.

    Raises:
        OSError: (only if `block`) it failed: no watchdog was forked.
    """
    global _intermediate, _pid
    proc = _intermediate
    if proc is None or (proc.wait() if block else proc.poll()) is None:
        return
    _intermediate = None
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    out = b""
    with contextlib.suppress(BlockingIOError):  # written before it exited, or never
        out = os.read(proc.stdout.fileno(), 32)
    proc.stdout.close()
    if proc.returncode == 0 and out.isdigit():
        _pid = int(out)
    elif block:
        raise OSError(f"the watchdog did not start (exit status {proc.returncode})")


def _send(op: str = "", pgid: int = 0, cgroup: str = "", jail_dir: str = "") -> None:
    if op:
        apply(_groups, _leftovers, op, pgid, cgroup, jail_dir)
    _reap(block=False)
    if not _alive():
        _start()
    elif op:
        try:
            _write(_record(op, pgid, cgroup, jail_dir))
        except BrokenPipeError:  # it died since _alive(): a new one gets the replay
            _start()


def _write(data: bytes) -> None:
    assert _fd is not None
    view = memoryview(data)
    while view:
        view = view[os.write(_fd, view) :]


def _forget_at_fork() -> None:
    # A forked child is another owner: it neither holds the parent's pipe
    # (the parent's watchdog must see the parent's death) nor its tables.
    global _fd, _pid, _lock, _intermediate
    if _fd is not None:
        with contextlib.suppress(OSError):
            os.close(_fd)
    _fd = _pid = _intermediate = None
    _lock = threading.Lock()
    _groups.clear()
    _leftovers.clear()


os.register_at_fork(after_in_child=_forget_at_fork)


def ensure_running() -> int:
    """Start the watchdog if it does not run, and wait until it is forked
    (its intermediate reaped); returns its pid.

    Raises:
        OSError: it cannot be started.
    """
    with _lock:
        _send()
        _reap(block=True)
        if _pid is None or not _alive():
            raise OSError("the watchdog is not running")
        return _pid


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
    """The watchdog's pid, if one runs and is known (not a child: it is
    reparented)."""
    with _lock:
        _reap(block=False)
        return _pid if _alive() else None


if __name__ == "__main__":
    # -I keeps the script's own directory off sys.path; trunner's root is 3 up.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main(0, sys.argv[1] if len(sys.argv) > 1 else "")
