"""Parent side: the caller's binds (`Runner(binds=...)`) and /etc entries
(`Runner(etc=...)`): read from the caller's arguments, and refused where
they would shadow the jail's own paths or, as root, where anyone but root
could change what they hold.

A bind is a host directory shown read-only, with exec allowed (Landlock's
read+exec rights), at its own path or at a target path. What is checked
here, and what a refusal raises:

- `parse_binds`, `parse_etc`: the arguments' shape (`ValueError`, as for
  `import_paths`);
- `shadow_refusal` (pure, on the paths the plan binds): a bind that would
  hide or land in one of the jail's own paths (in /tmp it may land, as an
  import path may), or move one host dir over another bound one
  (`sandbox_setup`);
- `writer_refusal` (as root, reads the host): a bind of a tree that a
  user other than root could write, itself, its parents or anything in it
  (`sandbox_setup`).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

#: One bind: (host dir, path in the jail).
HostBind = tuple[str, str]

#: /etc entries the jail synthesizes: never the host's (`plan._identity`).
ETC_SYNTHESIZED = frozenset({"/etc/passwd", "/etc/group", "/etc/hosts", "/etc/hostname"})


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _overlap(a: str, b: str) -> bool:
    return _inside(a, b) or _inside(b, a)


def parse_binds(binds: Iterable[str | Sequence[str]]) -> tuple[HostBind, ...]:
    """`binds` as (host dir, target) pairs: a host dir alone is bound at
    its own path; the host dir is resolved (symlinks followed, here, once),
    the target kept as given, normalized.

    Raises:
        ValueError: not a str or a (source, target) pair, a source that is
            not a directory, a target that is not absolute.
    """
    if isinstance(binds, str):
        raise ValueError(f"binds: expected a list of paths, got the str {binds!r}")
    out: list[HostBind] = []
    for item in binds:
        if isinstance(item, str):
            source, target = item, os.path.abspath(item)
        elif (isinstance(item, (tuple, list)) and len(item) == 2
              and all(isinstance(p, str) for p in item)):
            source, target = item
        else:
            raise ValueError(f"bind {item!r}: expected a path or a (source, target) pair")
        if not os.path.isabs(target) or "\0" in target:
            raise ValueError(f"bind target {target!r} is not an absolute path")
        if "\0" in source or not os.path.isdir(source):
            raise ValueError(f"bind source {source!r} is not a directory this process can reach")
        out.append((os.path.realpath(source), os.path.normpath(target)))
    return tuple(out)


def parse_etc(etc: Iterable[str]) -> tuple[str, ...]:
    """`etc` as normalized paths below /etc that exist on the host (a
    symlink is kept as a link, never followed).

    Raises:
        ValueError: not below /etc, one the jail synthesizes, or missing.
    """
    if isinstance(etc, str):
        raise ValueError(f"etc: expected a list of paths, got the str {etc!r}")
    out: list[str] = []
    for item in etc:
        if not isinstance(item, str) or "\0" in item:
            raise ValueError(f"etc entry {item!r} is not a path")
        path = os.path.normpath(item)
        if not path.startswith("/etc/"):
            raise ValueError(f"etc entry {item!r} is not a path below /etc")
        if any(_inside(path, s) for s in ETC_SYNTHESIZED):
            raise ValueError(f"etc entry {item!r}: the jail makes its own {path}")
        if not os.path.lexists(path):
            raise ValueError(f"etc entry {item!r} does not exist on this host")
        out.append(path)
    return tuple(sorted(set(out)))


def shadow_refusal(binds: Sequence[HostBind], built: Iterable[str], bound: Iterable[str],
                   scratch: Iterable[str] = ("/tmp",)) -> str | None:
    """Why `binds` cannot be planned, or None. `built`: the paths the jail
    makes itself (/dev, /etc, /proc, /tmp, the working dir, /sys/fs/cgroup);
    `bound`: the host paths it binds at their own path (the system dirs,
    the interpreter's, trunner's, import paths); `scratch`: the built dirs
    a bind may lie in, as an import path may (the helper keeps the dirs
    above it a read-only tmpfs of their own).

    A target may not be /, nor hold or be a built path, nor lie in one
    outside `scratch`. A bind at its own path may hold or lie in another
    bind at its own path (the same files, bound once); a bind moved to
    another path may overlap no other."""
    built, bound, scratch = list(built), list(bound), list(scratch)
    same = [*bound, *(target for source, target in binds if source == target)]
    for source, target in binds:
        if target == "/":
            return f"bind {source} on /: it would shadow the jail's whole root"
        clash = next((p for p in built if _overlap(target, p)
                      and not (p in scratch and target != p and _inside(target, p))), None)
        if clash is not None:
            return f"bind {source} on {target}: it would shadow the jail's own {clash}"
        if source == target:
            continue
        others = [*same, *(t for s, t in binds if (s, t) != (source, target) and s != t)]
        clash = next((p for p in others if _overlap(target, p)), None)
        if clash is not None:
            return f"bind {source} on {target}: it overlaps {clash}, which the jail binds too"
    return None


def _unsafe(st: os.stat_result, *, ancestor: bool) -> bool:
    """Whether someone but root may change what is at or below this entry:
    not root's, or writable by its group or others. An ancestor may be a
    sticky dir of root's (/tmp): there others cannot rename or remove what
    root owns in it."""
    if st.st_uid != 0:
        return True
    if not st.st_mode & 0o022:
        return False
    return not (ancestor and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX)


def writer_refusal(source: str, mounts: Iterable[str] = ()) -> str | None:
    """As root: why a bind of `source` (resolved) is refused, or None. It,
    each of its parents and everything in it (symlinks aside: a link's own
    mode means nothing; mount points below it are not walked, the bind
    does not carry them) must be root's and writable by no group or other
    (group writes are refused even for group root: the group bits are an
    ACL's mask)."""
    path = source
    while True:
        parent = os.path.dirname(path)
        st = os.lstat(path)
        if _unsafe(st, ancestor=path != source):
            return _writable(source, path, st)
        if parent == path:
            break
        path = parent
    skip = frozenset(mounts) - {source}
    pending = [source]
    while pending:
        top = pending.pop()
        with os.scandir(top) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    continue
                if _unsafe(st, ancestor=False):
                    return _writable(source, entry.path, st)
                if stat.S_ISDIR(st.st_mode) and entry.path not in skip:
                    pending.append(entry.path)
    return None


def _writable(source: str, path: str, st: os.stat_result) -> str:
    return (f"bind {source}: {path} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}) may"
            " be changed by a user other than root: as root, bind only trees root alone can"
            " write")
