"""Parent side: one pids, one memory and one cpuacct cgroup per run, as root.

As root (and, on cgroup v2, any caller a cgroup is delegated to) each
invocation gets its own pids cgroup whose `pids.max` bounds its processes,
its own memory cgroup, and (v1) its own cpuacct cgroup, and cpu and cpuset
cgroups where those are hierarchies of their own, for the jail's view only
(the JVM reads v1 limits only with all four shown). On cgroup v2 they
are one directory, under the delegated cgroup `delegation.place` finds.
A run's cgroup holds no process: its leaf `sup` holds the helper, the
jail's pid 1 and the adapter, its leaf `prog` the program, whose limit is
`memory_bytes` and whose CPU time and peak are the run's figures (the
scratch tmpfs's pages are charged to whichever wrote them). `find_base` (v1) only
reads (the doctor's probe must not change the host); a backend's
`RunCgroups` sets up a base on its first run (on v2, giving the controller
to the base's children and to `trunner/`'s) and makes the `trunner`
directory every run's cgroup lives in whenever it is missing.
"""

from __future__ import annotations

import errno
import os
import uuid
from typing import TYPE_CHECKING

import trio

from trunner import procfs
from trunner.cleanup import owner_id, remove_cgroup
from trunner.errors import Reason, RunnerError
from trunner.kernel.abi import PROG_CGROUP, SUP_CGROUP

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

DIR_NAME = "trunner"


def read_text(path: str) -> str | None:
    """A small kernel file's text, stripped; None if it cannot be read."""
    try:  # os.open, not open(): read after every run, on its critical path
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace").strip()


def find_base(controller: str = "pids") -> str | None:
    """Where this process may create cgroups with the cgroup v1 `controller`
    ("pids" or "memory"): the controller's hierarchy at our own cgroup in
    it, if writable; None otherwise (and on v2: `delegation.place`). Reads
    only."""
    own = procfs.cgroups()
    for mount in procfs.mounts():
        if mount.fstype != "cgroup" or controller not in mount.super_options.split(","):
            continue
        for controllers, path in own.items():
            if controller in controllers.split(","):
                base = os.path.join(mount.point, path.lstrip("/"))
                if os.access(base, os.W_OK):
                    return base
    return None


def views(bases: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """How a jail shows its program's cgroups made under `bases` ("": none):
    one ("cgroup2", "") where they are v2; else ("cgroup", CONTROLLERS) for
    each v1 hierarchy among them, its controllers as mounted (`cpu,cpuacct`).
    Reads only."""
    bases = [b for b in dict.fromkeys(bases) if b]
    if not bases:
        return ()
    if os.path.exists(os.path.join(bases[0], "cgroup.controllers")):
        return (("cgroup2", ""),)
    shown: list[tuple[str, str]] = []
    for mount in procfs.mounts():
        if mount.fstype != "cgroup" or not any(
                b == mount.point or b.startswith(mount.point + "/") for b in bases):
            continue
        controllers = [o for o in mount.super_options.split(",") if o in V1_CONTROLLERS]
        if controllers and ("cgroup", ",".join(controllers)) not in shown:
            shown.append(("cgroup", ",".join(controllers)))
    return tuple(shown)


#: cgroup v1 controllers, as mount options name them.
V1_CONTROLLERS = frozenset({"cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "devices",
                            "freezer", "net_cls", "net_prio", "perf_event", "hugetlb",
                            "rdma", "misc"})


class RunCgroups:
    """Where one backend makes its runs' cgroups: `prepare` sets up a base
    (enabling the controller for children of a v2 root, making the
    `trunner` dir) when it is not set up already, so a dir removed under a
    live backend is made again on the next run."""

    def __init__(self) -> None:
        self._enabled: set[tuple[str, str]] = set()

    def prepare(self, base: str, controller: str = "pids", *, remember: bool = True,
                again: bool = False) -> str:
        """The dir runs' cgroups go in under `base` (`remember`: set up
        once for this backend; a session's cgroup, which goes with it, is
        looked at again each time; `again`: a run's cgroup could not be made
        in it, so it is made again if it was removed).

        Raises:
            OSError: the setup was refused.
        """
        parent = os.path.join(base, DIR_NAME)
        first = (base, controller) not in self._enabled
        if not (first or again):
            return parent  # set up: a run's mkdir finds out whether it is gone
        if first:
            _give(base, controller)
            if remember:
                self._enabled.add((base, controller))
        try:
            os.mkdir(parent)
            made = True
        except FileExistsError:
            made = False
        if first or made:
            # v2: the base and `trunner/` each give the controller to their
            # children (a run's cgroup has `pids.max` only then), a `trunner/`
            # made again under a live backend too.
            _give(parent, controller)
            if controller == "cpuset":
                _fill_cpuset(base, parent)
        return parent

    def make(self, bases: Sequence[tuple[str, str]],
             before_mkdir: Callable[[str], None],
             views: Sequence[tuple[str, str]] = (), *, remember: bool = True) -> list[str]:
        """New cgroups for one run, one under each (base, controller) (one for
        both on v2, where the bases are the same), each with its leaves: the
        helper sets their limits (the plan holds the numbers, so the rules
        version covers them). Then one under each of `views` (v1 cpu and
        cpuset), without leaves: the whole run joins it, so that its jail can
        show the program a cgroup of its own there. `before_mkdir` is called
        with all their paths, newline-separated, first (the watchdog lists them).

        Raises:
            RunnerError: `spawn_failed` when out of fds, else
                `process_limit_unavailable`.
        """
        name = f"{owner_id()}-{uuid.uuid4().hex}"  # a sweep can tell whether its owner lives
        paths: list[str] = []
        made: list[str] = []
        try:
            with_leaves = set()
            #: Each path's (base, controller)s: `trunner/` made again if it is gone.
            under: dict[str, list[tuple[str, str]]] = {}
            for i, (base, controller) in enumerate([*bases, *views]):
                path = os.path.join(self.prepare(base, controller, remember=remember), name)
                if path not in paths:
                    paths.append(path)
                under.setdefault(path, []).append((base, controller))
                if i < len(bases):
                    with_leaves.add(path)
            before_mkdir("\n".join(paths))
            for path in paths:
                try:
                    os.mkdir(path)
                except FileNotFoundError:  # its `trunner/` was removed under a live backend
                    for base, controller in under[path]:
                        self.prepare(base, controller, remember=remember, again=True)
                    os.mkdir(path)
                made.append(path)
                if path not in with_leaves:
                    continue
                _give_leaves(path)
                for leaf in LEAVES:
                    os.mkdir(os.path.join(path, leaf))
                    made.append(os.path.join(path, leaf))
        except OSError as e:
            for path in reversed(made):
                os.rmdir(path)
            out_of_fds = e.errno in (errno.EMFILE, errno.ENFILE)
            raise RunnerError(
                Reason.SPAWN_FAILED if out_of_fds else Reason.PROCESS_LIMIT_UNAVAILABLE,
                f"cannot create a run's cgroup under {', '.join(b for b, _ in bases)}:"
                f" {e.strerror} (errno {e.errno})",
            ) from None
        return paths


#: A run's leaves, made after and removed before it.
LEAVES = (SUP_CGROUP, PROG_CGROUP)


def _give_leaves(path: str) -> None:
    """On cgroup v2, give a run's leaves its pids and memory controllers
    (the run's cgroup holds no process, so the kernel allows it)."""
    control = os.path.join(path, "cgroup.subtree_control")
    if not os.path.exists(control):
        return  # v1: every cgroup has its hierarchy's controller
    have = (read_text(os.path.join(path, "cgroup.controllers")) or "").split()
    wanted = [c for c in ("pids", "memory") if c in have]
    if wanted:
        with open(control, "w") as f:
            f.write(" ".join("+" + c for c in wanted))


def _fill_cpuset(base: str, parent: str) -> None:
    """v1: a new cpuset cgroup starts with no cpus and no mems (it could hold
    no process): `trunner/` takes its base's, and its children copy theirs
    (`cgroup.clone_children`), so a run's cpuset is the caller's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        value = read_text(os.path.join(parent, name))
        if not value:
            write(os.path.join(parent, name), (read_text(os.path.join(base, name)) or "").encode())
    write(os.path.join(parent, "cgroup.clone_children"), b"1")


def _give(path: str, controller: str) -> None:
    """On cgroup v2, let `path`'s children have `controller` (no-op on v1,
    and for a controller v2 does not have: cpuacct, whose figures are in
    every v2 cgroup's `cpu.stat`)."""
    control = os.path.join(path, "cgroup.subtree_control")
    if controller == "cpuacct":
        return
    if os.path.exists(control) and controller not in (read_text(control) or "").split():
        with open(control, "w") as f:
            f.write("+" + controller)


def oom_kills(path: str) -> tuple[int, bool]:
    """Processes the kernel killed for want of memory in the run's memory
    cgroup `path` and its leaves, and whether the run's own bound (not its
    program's, in `prog`) was reached: trunner's side. v2 counts up the
    tree; v1 counts each cgroup alone, and its run's `memory.failcnt` says
    its own bound was hit."""
    if os.path.exists(os.path.join(path, "memory.events")):
        own = _counter(os.path.join(path, "memory.events.local"), b"oom")
        return _counter(os.path.join(path, "memory.events"), b"oom_kill"), own > 0
    kills = sum(_counter(os.path.join(p, "memory.oom_control"), b"oom_kill")
                for p in (path, *(os.path.join(path, leaf) for leaf in LEAVES)))
    return kills, _number(os.path.join(path, "memory.failcnt")) > 0


def _number(path: str) -> int:
    text = read_text(path) or ""
    return int(text) if text.isdigit() else 0


def _counter(path: str, key: bytes) -> int:
    """The `key VALUE` line of a flat-keyed cgroup file; 0 if unreadable."""
    return flat_keyed(path).get(key, 0)


def flat_keyed(path: str) -> dict[bytes, int]:
    """A flat-keyed cgroup file's `key VALUE` lines ({} if unreadable)."""
    try:  # os.open, not open(): this runs after every run, on its critical path
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        text = os.read(fd, 4096)
    except OSError:
        text = b""
    finally:
        os.close(fd)
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if value.strip().isdigit():
            values[name] = int(value)
    return values


def bound_memory(path: str, limit: int) -> None:
    """Set the memory bound of the cgroup `path` (swap none on v2, and on v1
    memory+swap equal to it, where swap is accounted).

    Raises:
        OSError: the cgroup refused it.
    """
    value = b"%d" % limit
    if os.path.exists(f"{path}/memory.max"):
        write(f"{path}/memory.max", value)
        if os.path.exists(f"{path}/memory.swap.max"):
            write(f"{path}/memory.swap.max", b"0")
        return
    swap = f"{path}/memory.memsw.limit_in_bytes"
    if not os.path.exists(swap):
        write(f"{path}/memory.limit_in_bytes", value)
        return
    # v1 keeps the limit at most memory+swap's: raise that first, lower it last.
    try:
        write(swap, value)
        write(f"{path}/memory.limit_in_bytes", value)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        write(f"{path}/memory.limit_in_bytes", value)
        write(swap, value)


def write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def remove_now(path: str) -> None:
    """Remove a run's cgroup that never held a process, its leaves first.

    Raises:
        OSError: it is still there.
    """
    if not remove_cgroup(path, LEAVES):
        raise OSError(errno.EBUSY, f"cannot remove cgroup {path}")


async def remove(path: str, *, nested: bool = False) -> None:
    """Remove a run's cgroup, its leaves first, once its group is dead and
    reaped. A descendant reparented to init may still be leaving: each try
    (`cleanup.remove_cgroup`) kills what is listed, and trio sleeps 5 ms
    between tries. `nested`: a session's, whose commands' cgroups were in
    its `trunner/` (each removed at its command's end).

    Raises:
        RunnerError: `sandbox_setup` if one cannot be removed within ~1 s.
    """
    leaves = (*LEAVES, DIR_NAME) if nested else LEAVES  # a session's: its commands' dir
    for _ in range(200):
        if remove_cgroup(path, leaves):
            return
        await trio.sleep(0.005)
    raise RunnerError(Reason.SANDBOX_SETUP, f"cannot remove cgroup {path}")
