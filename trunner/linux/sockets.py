"""Parent side: the unix sockets a jail's binds would show, to be masked.

In the default profile a jailed process may `connect()` and `sendto()` on
AF_UNIX sockets, and nothing in seccomp or Landlock (to ABI 7) checks a
connect to a *pathname* socket: only the socket file's own mode does
(connect needs write permission on it). So the guarantee that no host
socket is reachable comes from the tree: every read-only bind the plan
makes is walked here, and each socket found is masked in the plan (an
empty file bound over it: a connect answers ECONNREFUSED), as is a
directory the walk cannot list but the jail could enter (an empty
read-only tmpfs: what it holds is unknown).

The walk never follows a symlink (a link in a bind resolves in the jail's
own root, so it reaches only what the binds hold, which are walked where
they are), stays off mount points below a bind's top (a bind is not
recursive, so the jail sees the directory beneath them, not what is
mounted there), and uses `d_type` (os.scandir), so only entries that are
neither directories, regular files nor symlinks are stat'ed.

The system dirs (/usr, /lib*, the interpreter's prefixes, trunner's own
dir: what every plan binds) are walked once per process (`system_walk`), a
fact about the host like the probe: ~0.2 s for ~200,000 entries here, which
a `Runner` each would pay again. The caller's paths (import paths, a
profile's additions) are walked at every plan.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trunner import procfs

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Found", "find_sockets", "mount_points", "system_walk"]


@dataclass(frozen=True)
class Found:
    """What one walk found: socket files, and directories it could not list
    but the caller may enter (search permission without read); `entries`
    is how many names it looked at."""

    sockets: tuple[str, ...] = ()
    unlistable: tuple[str, ...] = ()
    entries: int = 0


def mount_points(mountinfo: str = "/proc/self/mountinfo") -> frozenset[str]:
    """Every mount point of this process's mount namespace."""
    return frozenset(mount.point for mount in procfs.mounts(mountinfo))


def find_sockets(top: str, mounts: Iterable[str] = ()) -> Found:
    """The sockets beneath `top` (itself included) as a non-recursive bind
    of `top` shows them: directories in `mounts` below `top` are not
    entered. A directory the caller cannot list is reported in
    `unlistable` if the caller may enter it (it could hold a socket the
    jail reaches by name), else skipped (the jail cannot reach into it
    either: it runs with the caller's rights or, as root, fewer). An entry
    that vanishes while walked is skipped."""
    skip = frozenset(mounts) - {top}
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return Found()
    if stat.S_ISSOCK(st.st_mode):
        return Found(sockets=(top,), entries=1)
    if not stat.S_ISDIR(st.st_mode):
        return Found(entries=1)
    sockets: list[str] = []
    unlistable: list[str] = []
    entries = 0
    pending = [top]
    while pending:
        path = pending.pop()
        try:
            it = os.scandir(path)
        except PermissionError:
            if os.access(path, os.X_OK):
                unlistable.append(path)
            continue
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for entry in it:
                entries += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.path not in skip:
                            pending.append(entry.path)
                    elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                        continue
                    elif stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                        sockets.append(entry.path)
                except (FileNotFoundError, PermissionError):
                    continue  # gone, or beyond the caller's reach (the jail's too)
    return Found(tuple(sorted(sockets)), tuple(sorted(unlistable)), entries)


#: `system_walk`'s answers, by dir: one walk per process (see the module's doc).
_SYSTEM: dict[str, Found] = {}


def system_walk(top: str, mounts: Iterable[str]) -> Found:
    """`find_sockets(top, mounts)` for a system dir, walked once per process."""
    done = _SYSTEM.get(top)
    if done is None:
        done = _SYSTEM[top] = find_sockets(top, mounts)
    return done
