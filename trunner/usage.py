"""`Usage`: what a run's program used, on every result and every failure
after it started.

Its own module so that both the error type (`trunner.errors`) and the wire
(`trunner.protocol`, `ExecResult.usage`) can hold it without importing each
other. Pure: imports msgspec and nothing of trunner.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class Usage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a run's program used, start to end (docs/design.md, "Usage").

    For `exec`: the program's own process tree, never trunner's helper, the
    jail's pid 1 or the adapter (its interpreter start-up included), as root
    and not alike. For a `run()` mode, which has no separate program: the
    adapter process's own figures.
    """

    #: Wall time, from the program's start to its end (its exit, or its kill).
    wall_s: float
    #: CPU time in user mode, summed over the whole tree.
    cpu_user_s: float
    #: CPU time in the kernel, summed over the whole tree.
    cpu_sys_s: float
    #: The peak memory, in bytes: see `memory_source`.
    peak_memory_bytes: int
    #: Where `peak_memory_bytes` comes from (docs/figures.md): `cgroup`, the
    #: program's own cgroup's peak (the whole tree at once, its page cache,
    #: and on cgroup v2 its sockets' buffers); `max_rss`, where the run has
    #: no cgroup (and for a run() mode), the largest maximum resident set
    #: size of any one process of the tree (getrusage's `ru_maxrss`; a tree
    #: of several processes may have used more at once); `sampled`, on
    #: cgroup v2 before Linux 5.19, whose cgroups keep no peak: the most of
    #: the program's cgroup's current memory the parent saw, sampled every
    #: 10 ms, or the largest `ru_maxrss` if more (a lower bound).
    memory_source: Literal["max_rss", "cgroup", "sampled"] = "max_rss"
    #: Where the CPU times come from: `cgroup`, the program's own cgroup
    #: (every process of the tree, those the kernel reaped included);
    #: `rusage`, the reaped children's getrusage (a child reaped by the
    #: kernel, its parent ignoring SIGCHLD, is not counted).
    cpu_source: Literal["rusage", "cgroup"] = "rusage"

    @property
    def cpu_s(self) -> float:
        """User and system CPU time together: what `cpu_time_s` bounds."""
        return self.cpu_user_s + self.cpu_sys_s
