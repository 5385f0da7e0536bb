"""Parent side: one pids cgroup per run, the process limit as root.

The kernel never applies RLIMIT_NPROC to real root, and a user namespace
does not change that, so as root each invocation gets its own pids cgroup
whose `pids.max` is the `processes` limit. `find_base` only reads (the
doctor's probe must not change the host); `prepare` does the one-time setup
on the first run: enabling `pids` for children of a v2 root, and making the
`trunner` directory every run's cgroup lives in.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import uuid
from typing import TYPE_CHECKING

import trio

from trunner.errors import Reason, RunnerError

if TYPE_CHECKING:
    from collections.abc import Callable

DIR_NAME = "trunner"


def read_text(path: str) -> str | None:
    """A small kernel file's text, stripped; None if it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def find_base() -> str | None:
    """A directory under which this process may create pids cgroups, or
    None. Reads only.

    cgroup v1: the pids hierarchy at our own pids cgroup. cgroup v2: our own
    cgroup, if it delegates `pids` to children already, or is the root and
    has the controller (`prepare` then enables it).
    """
    own = {}
    for line in (read_text("/proc/self/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    for line in (read_text("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, options = [*right.split(" "), "", "", ""][:3]
        mount_point = left.split(" ")[4]
        base = None
        if fstype == "cgroup" and "pids" in options.split(","):
            for controllers, path in own.items():
                if "pids" in controllers.split(","):
                    base = os.path.join(mount_point, path.lstrip("/"))
        elif fstype == "cgroup2" and "" in own:
            base = os.path.join(mount_point, own[""].lstrip("/"))
            enabled = (read_text(os.path.join(base, "cgroup.subtree_control")) or "").split()
            available = (read_text(os.path.join(base, "cgroup.controllers")) or "").split()
            if "pids" not in enabled and not (own[""] == "/" and "pids" in available):
                base = None
        if base is not None and os.access(base, os.W_OK):
            return base
    return None


@functools.cache
def prepare(base: str) -> str:
    """Set up `base` once per process; returns the dir runs' cgroups go in.

    Raises:
        OSError: the setup was refused.
    """
    control = os.path.join(base, "cgroup.subtree_control")
    if os.path.exists(control) and "pids" not in (read_text(control) or "").split():
        with open(control, "w") as f:
            f.write("+pids")
    parent = os.path.join(base, DIR_NAME)
    os.makedirs(parent, exist_ok=True)
    return parent


def make(base: str, before_mkdir: Callable[[str], None]) -> str:
    """A new cgroup for one run (the helper sets its `pids.max`: the plan
    holds the number, so the rules version covers it). `before_mkdir` is
    called with its path first (the watchdog lists it).

    Raises:
        RunnerError: `spawn_failed` when out of fds, else
            `process_limit_unavailable`.
    """
    path = ""
    try:
        path = os.path.join(prepare(base), f"{os.getpid()}-{uuid.uuid4().hex}")
        before_mkdir(path)
        os.mkdir(path)
    except OSError as e:
        if path and os.path.isdir(path):
            os.rmdir(path)
        out_of_fds = e.errno in (errno.EMFILE, errno.ENFILE)
        raise RunnerError(
            Reason.SPAWN_FAILED if out_of_fds else Reason.PROCESS_LIMIT_UNAVAILABLE,
            f"cannot create a pids cgroup under {base}: {e.strerror} (errno {e.errno})",
        ) from None
    return path


def kill_all(path: str) -> None:
    for pid in (read_text(os.path.join(path, "cgroup.procs")) or "").split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


async def remove(path: str) -> None:
    """Remove a run's cgroup once its group is dead and reaped. A descendant
    reparented to init may still be leaving: kill what is listed, retry.

    Raises:
        RunnerError: `sandbox_setup` if it cannot be removed within ~1 s.
    """
    for _ in range(200):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            kill_all(path)
            await trio.sleep(0.005)
    raise RunnerError(Reason.SANDBOX_SETUP, f"cannot remove cgroup {path}")
