"""The program's cgroup, as the jailed adapter holds it.

Where the run has cgroups, the helper hands pid 2 descriptors at fixed
slots (`abi.CGROUP_FDS`): the `prog` leaf's CPU and peak-memory files, and
the `tasks` files of `prog` and `sup` in each hierarchy. `take` makes them
close-on-exec first thing, so no program ever holds one. The `exec` adapter
joins `prog` for its program's spawn only (the child is born there, before
its exec) and reads the program's figures from it; a run() mode's adapter
is its own program and joins it for good, closing them all (`settle`).
Imports only posix and abi.
"""

import posix

from trunner.kernel.abi import (
    CGROUP_FDS,
    PROG_CPU_FD,
    PROG_CPU_SPLIT_FD,
    PROG_JOIN_FDS,
    PROG_PEAK_FD,
    SUP_JOIN_FDS,
)

#: The slots the helper filled (`take`).
_held: "set[int]" = set()


def take() -> None:
    """Find the slots the helper filled and make them close-on-exec."""
    for fd in CGROUP_FDS:
        try:
            posix.set_inheritable(fd, False)
        except OSError:
            continue  # EBADF: not filled (no cgroup, or not this hierarchy)
        _held.add(fd)


def settle() -> None:
    """Join `prog` for good (a run() mode: the adapter is the program) and
    close every slot."""
    enter()
    for fd in _held:
        posix.close(fd)
    _held.clear()


def enter() -> None:
    """Move this process (single-threaded) into `prog` in every hierarchy."""
    _join(PROG_JOIN_FDS)


def leave() -> None:
    """Move this process back into `sup`."""
    _join(SUP_JOIN_FDS)


def _join(fds: "tuple[int, ...]") -> None:
    for fd in fds:
        if fd in _held:
            posix.write(fd, b"0")


def has_cpu() -> bool:
    return PROG_CPU_FD in _held


def has_peak() -> bool:
    return PROG_PEAK_FD in _held


def cpu_s() -> "tuple[float, float]":
    """The program's tree's CPU time so far (user s, system s): every
    process `prog` held, reaped or not, auto-reaped ones included. The sum
    is the kernel's exact runtime (v2 `usage_usec`, v1 `cpuacct.usage`);
    its split follows the tick-sampled user and system shares."""
    if PROG_CPU_SPLIT_FD in _held:  # v1: nanoseconds, and cpuacct.stat's ticks
        total = _number(PROG_CPU_FD) / 1e9
        split = _fields(PROG_CPU_SPLIT_FD)
        user, system = int(split[b"user"]), int(split[b"system"])
    else:  # v2 cpu.stat: microseconds
        fields = _fields(PROG_CPU_FD)
        total = int(fields[b"usage_usec"]) / 1e6
        user, system = int(fields[b"user_usec"]), int(fields[b"system_usec"])
    share = user / (user + system) if user + system else 1.0
    return total * share, total - total * share


def _fields(fd: int) -> "dict[bytes, bytes]":
    fields = {}
    for line in posix.pread(fd, 4096, 0).splitlines():
        key, _, value = line.partition(b" ")
        fields[key] = value
    return fields


def peak_bytes() -> int:
    """The most memory `prog` held at once (v2 memory.peak, v1
    memory.max_usage_in_bytes): the tree's, page cache and (v2) sockets
    included."""
    return _number(PROG_PEAK_FD)


def _number(fd: int) -> int:
    return int(posix.pread(fd, 64, 0))
