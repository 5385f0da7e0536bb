"""A jail dir's life on the host: made, listed with the watchdog, removed
whatever the child left in it; and the leftovers of a dead owner swept.

`remove_tree` is iterative and fd-relative: any depth, a few fds, never a
symlink followed, modes the child took away given back. The watchdog process
runs it too, so this module imports only the standard library at its top
(and `trunner.procfs`, which does too).
The jail seam (`trunner.jail`) calls `make_jail_dir` and
`remove_jail_dir` with the watchdog's `hold` and `forget`, so that this
module knows no platform.

Every jail dir lives in its owner's dir, `TEMP/trunner-OWNER-RAND/`, and
every run cgroup is named `OWNER-HEX`, where OWNER (`owner_id`) is the
owning process's pid, its start time and its PID namespace: whoever finds
them can tell whether their owner still lives, even after its pid was
reused. The owner dir exists while the owner has jail dirs (it is removed
with its last one), is listed with the watchdog like them, and takes a
random suffix so that another local user cannot make it first. `sweep`
removes what dead owners of this uid left (a `Runner` calls it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time

from trunner import procfs

TYPE_CHECKING = False  # not from typing: the watchdog script would pay for it
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    #: Lists a path with the watchdog (before it exists), or unlists it.
    Hold = Callable[[str], None]

#: An owner dir's name is this, the owner id, "-" and 8 random hex digits.
OWNER_DIR_PREFIX = "trunner-"
#: How long `sweep` retries a dead owner's cgroup that still holds processes.
SWEEP_CGROUP_S = 1.0

#: A directory to list and unlink in; O_NOFOLLOW: a symlink is never entered.
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A handle on a directory that needs no permission on it.
_HANDLE = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> bool:
    """Remove `path` and everything under it; returns whether it is gone.

    Never recurses and holds at most four fds at any depth. A symlink is
    removed, never followed. A directory lacking owner rwx (a child may make
    one 000) is given it first. Stops at the first error it cannot fix, and
    so is safe on failure paths: it never raises `OSError`.
    """
    parent, name = os.path.split(os.path.abspath(path))
    if not name:
        return False
    try:
        top = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        with contextlib.suppress(OSError):
            _remove(top, name)
        os.stat(name, dir_fd=top, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        pass
    finally:
        os.close(top)
    return False


def _remove(top: int, name: str) -> None:
    fd = _enter(top, name)
    if fd is None:
        _unlink(top, name)
        return
    # One frame per directory from `name` down to the open one: its name in
    # its parent, its identity (to check that ".." leads back), and its
    # subdirectories still to remove. Only the deepest directory is open.
    try:
        frames = [(name, _identity(fd), _clear(fd))]
        while frames:
            subdirs = frames[-1][2]
            if subdirs:
                sub = subdirs.pop()
                child = _enter(fd, sub)
                if child is None:  # replaced by a non-directory, or gone
                    _unlink(fd, sub)
                    continue
                os.close(fd)
                fd = child
                frames.append((sub, _identity(fd), _clear(fd)))
                continue
            done = frames.pop()[0]
            if not frames:
                os.rmdir(done, dir_fd=top)
                break
            up = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            if _identity(fd) != frames[-1][1]:
                raise OSError(f"{done!r} was moved during its removal")
            os.rmdir(done, dir_fd=fd)
    finally:
        os.close(fd)


def _enter(parent: int, name: str) -> int | None:
    """An fd to list directory `name` and unlink in it; None if `name` is
    not a directory (a symlink to one included) or is gone."""
    try:
        handle = os.open(name, _HANDLE, dir_fd=parent)
    except (NotADirectoryError, FileNotFoundError):
        return None
    try:
        if os.fstat(handle).st_mode & 0o700 != 0o700:
            # Through the handle, so the directory checked is the one changed.
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        return os.open(".", _DIR, dir_fd=handle)
    finally:
        os.close(handle)


def _clear(fd: int) -> list[str]:
    """Unlink every non-directory in `fd`; returns the subdirectories."""
    with os.scandir(fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in entries:
        if not is_dir:
            _unlink(fd, name)
    return [name for name, is_dir in entries if is_dir]


def _unlink(fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=fd)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


# -- owners --------------------------------------------------------------------

_owner: str | None = None


def owner_id() -> str:
    """This process as the owner of jail dirs and cgroups: `PID-START-PIDNS`
    (its start time in clock ticks after boot, its PID namespace's inode)."""
    global _owner
    if _owner is None:
        pid = os.getpid()
        start = procfs.start_time(pid)
        if start is None:
            raise OSError(f"cannot read /proc/{pid}/stat")
        _owner = f"{pid}-{start}-{os.stat('/proc/self/ns/pid').st_ino}"
    return _owner


def parse_owner(text: str) -> tuple[int, int, int] | None:
    """(pid, start time, PID namespace inode) from an owner id; None if
    `text` is not one."""
    parts = text.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    pid, start, ns = (int(p) for p in parts)
    return pid, start, ns


def owner_alive(owner: str) -> bool:
    """Whether the owner `owner` names may still live: True unless its pid
    is gone, a zombie, or another process's (another start time). An owner
    of another PID namespace cannot be checked: it counts as alive."""
    parsed = parse_owner(owner)
    if parsed is None:
        return True
    pid, start, ns = parsed
    try:
        if ns != os.stat("/proc/self/ns/pid").st_ino:
            return True
    except OSError:
        return True
    fields = procfs.stat(pid)
    return not procfs.exited(fields) and int(fields[procfs.START_TIME]) == start


def _owner_of_dir(name: str) -> str | None:
    """The owner id in an owner dir's name, or None if `name` is not one."""
    if not name.startswith(OWNER_DIR_PREFIX):
        return None
    owner, _, suffix = name[len(OWNER_DIR_PREFIX):].rpartition("-")
    if len(suffix) != 8 or parse_owner(owner) is None:
        return None
    return owner


def _owner_of_cgroup(name: str) -> str | None:
    owner, _, suffix = name.rpartition("-")
    return owner if len(suffix) == 32 and parse_owner(owner) is not None else None


# -- jail dirs -------------------------------------------------------------------

_lock = threading.Lock()
#: This process's owner dir in each temp root.
_owner_dirs: dict[str, str] = {}
#: How many jail dirs each owner dir holds.
_counts: dict[str, int] = {}


def _forget_at_fork() -> None:
    # A forked child is another owner: the parent's dirs are not its own.
    global _owner, _lock
    _owner, _lock = None, threading.Lock()
    _owner_dirs.clear()
    _counts.clear()


os.register_at_fork(after_in_child=_forget_at_fork)


def make_jail_dir(temp_root: str | None, hold: Hold, forget: Hold) -> str:
    """A fresh 0700 jail dir in this process's owner dir under `temp_root`
    (default: the system temp dir), listed (`hold`) before it exists: a
    parent dying at any moment after this call leaves it to the watchdog.

    Raises:
        OSError: the dir cannot be made, or the watchdog cannot be told.
    """
    root = os.path.abspath(tempfile.gettempdir() if temp_root is None else temp_root)
    for attempt in (1, 2):
        with _lock:
            owner_dir = _owner_dirs.get(root)
            if owner_dir is None:
                owner_dir = _make_dir(root, f"{OWNER_DIR_PREFIX}{owner_id()}-", 4, hold, forget)
                _owner_dirs[root], _counts[owner_dir] = owner_dir, 0
            _counts[owner_dir] += 1
        try:
            return _make_dir(owner_dir, "", 8, hold, forget)
        except FileNotFoundError:
            # The owner dir was removed under us (a temp cleaner): a new one.
            _release(owner_dir, forget, vanished=True)
            if attempt == 2:
                raise
        except BaseException:
            _release(owner_dir, forget)
            raise
    raise AssertionError("unreachable")


def _make_dir(parent: str, prefix: str, random_bytes: int, hold: Hold, forget: Hold) -> str:
    while True:
        path = os.path.join(parent, f"{prefix}{os.urandom(random_bytes).hex()}")
        hold(path)
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            forget(path)  # not ours: never the watchdog's to remove
        except BaseException:
            forget(path)
            raise


def _release(owner_dir: str, forget: Hold, vanished: bool = False) -> None:
    """One jail dir fewer in `owner_dir`: the last one removes it. A
    `vanished` one is no longer used, whatever it holds."""
    with _lock:
        if owner_dir not in _counts:
            return
        _counts[owner_dir] -= 1
        if _counts[owner_dir] > 0 and not vanished:
            return
        try:
            os.rmdir(owner_dir)
        except FileNotFoundError:
            pass
        except OSError:
            if not vanished:
                return  # kept (listed) for the next jail dir, or for the watchdog
        del _counts[owner_dir], _owner_dirs[os.path.dirname(owner_dir)]
        forget(owner_dir)


async def remove_jail_dir(path: str, forget: Hold) -> bool:
    """Remove a jail dir without blocking the event loop; returns whether it
    is gone. Shielded, so it runs to the end under cancellation too. Once
    the dir is gone, it is unlisted (`forget`)."""
    import trio

    try:
        os.rmdir(path)  # the common case, empty: one syscall, no thread
        gone = True
    except FileNotFoundError:
        gone = True
    except OSError:
        with trio.CancelScope(shield=True):
            gone = await trio.to_thread.run_sync(remove_tree, path)
    if gone:
        forget(path)
        _release(os.path.dirname(path), forget)
    return gone


# -- cgroups and sweeping ------------------------------------------------------


def remove_cgroup(path: str, leaves: Iterable[str] | None = None) -> bool:
    """One try at removing a run's cgroup: its leaves first (`leaves`, their
    names, where the caller knows them; else every subdir it has), then it.
    What a cgroup still holds is SIGKILLed on the way, so that a later try
    can succeed: killed processes take a moment to leave, and each caller
    retries a while (`sweep`, the watchdog, the Linux backend after a run).
    Whether it is gone; never raises `OSError`."""
    if leaves is None:
        try:
            leaves = [entry.name for entry in os.scandir(path)
                      if entry.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return True
        except OSError:
            leaves = []
    gone = [_remove_one(os.path.join(path, leaf)) for leaf in leaves]
    return all(gone) and _remove_one(path)


def _remove_one(path: str) -> bool:
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


def sweep(temp_root: str | None, cgroup_dirs: Iterable[str] = ()) -> list[str]:
    """Remove the leftovers of dead owners: their owner dirs under
    `temp_root` (default: the system temp dir) and their run cgroups in
    `cgroup_dirs`, after SIGKILLing what those still hold. Only what this
    uid owns, and never a live owner's (`owner_alive`). Best effort: never
    raises `OSError`; returns what it removed.
    """
    root = os.path.abspath(tempfile.gettempdir() if temp_root is None else temp_root)
    uid = os.geteuid()
    removed: list[str] = []
    cgroups = [path for parent in cgroup_dirs
               for path in _dead(parent, uid, _owner_of_cgroup)]
    give_up, pause = time.monotonic() + SWEEP_CGROUP_S, 0.001
    while cgroups:
        left = [c for c in cgroups if not remove_cgroup(c)]
        removed += [c for c in cgroups if c not in left]
        cgroups = left
        if not cgroups or time.monotonic() > give_up:
            break
        time.sleep(pause)  # SIGKILLed processes take a moment to leave
        pause = min(pause * 2, 0.1)
    removed += [path for path in _dead(root, uid, _owner_of_dir) if remove_tree(path)]
    return removed


def _dead(parent: str, uid: int, owner_of: Callable[[str], str | None]) -> list[str]:
    """The dirs in `parent` named for a dead owner, owned by `uid`."""
    found = []
    try:
        with os.scandir(parent) as it:
            for entry in it:
                owner = owner_of(entry.name)
                if owner is None or owner_alive(owner):
                    continue
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False) and \
                            entry.stat(follow_symlinks=False).st_uid == uid:
                        found.append(entry.path)
    except OSError:
        pass
    return found
