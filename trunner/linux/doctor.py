"""Parent side: what `trunner doctor` says about this host.

`host_layers` says, layer by layer, what holds here (and, for a Landlock
feature the ABI lacks, which layer covers it); `memory_bounds` what bounds
one run's memory with the default `Limits`. Reads only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from trunner.linux import landlock
from trunner.linux.ids import DEFAULT_RANGE
from trunner.linux.probe import NAMESPACE_SYSCTLS, probe_host

if TYPE_CHECKING:
    from trunner.jail import HostSupport
    from trunner.limits import Limits


def host_layers(host: HostSupport, landlock_abi: int | None = None,
                libseccomp: str | None = None) -> dict[str, dict[str, Any]]:
    """What holds on `host`, layer by layer (`trunner doctor`). Pure.

    `landlock_abi` is a cap on the ABI used, as `LinuxBackend(landlock_abi=)`;
    `libseccomp` why libseccomp cannot compile the filter, if it cannot.
    Each layer has `holds` (a run needs every one); Landlock lists each
    feature the ABI in use has, and for each it lacks, what covers it.
    """
    missing_ns = [kind for kind, _ in NAMESPACE_SYSCTLS if kind not in host.namespaces]
    used = min(host.landlock_abi if landlock_abi is None else landlock_abi, landlock.KNOWN_ABI)
    if used >= landlock.MIN_ABI:
        features = landlock.features_for_abi(used)
        without = {f.name: f.without for f in landlock.FEATURES if not features[f.name]}
        provider = landlock.host_network_refusal(used)
    else:
        features, without = {f.name: False for f in landlock.FEATURES}, {}
        provider = "landlock is absent"
    limit = host.process_limit
    return {
        "namespaces": {
            "holds": not missing_ns,
            "available": list(host.namespaces),
            "missing": missing_ns,
        },
        "landlock": {
            "holds": landlock.MIN_ABI <= used <= host.landlock_abi,
            "kernel_abi": host.landlock_abi,
            "abi_used": used,
            "known_abi": landlock.KNOWN_ABI,
            "features": features,
            "covered_by_other_layers": without,
        },
        "seccomp": {
            "holds": host.seccomp_filter and libseccomp is None,
            "detail": ("" if host.seccomp_filter and libseccomp is None else
                       "the kernel has no seccomp filters" if not host.seccomp_filter else
                       f"libseccomp cannot compile the filter: {libseccomp}"),
        },
        "process_limit": {
            "holds": limit is not None,
            "kind": None if limit is None else limit.kind,
            "cgroup_base": None if limit is None else limit.cgroup_base,
            # RLIMIT_NPROC counted per user namespace: a bound per run.
            "per_run": host.nproc_per_userns or (limit is not None and limit.kind == "pids_cgroup"),
            # cgroup v2: the leaf this process moves into first; else why runs
            # get no cgroup of their own, and the fix.
            "cgroup_leaf": host.cgroup_leaf or None,
            "cgroup_note": host.cgroup_note or None,
        },
        "memory": {
            "holds": True,  # RLIMIT_AS per process holds everywhere
            "kind": "memory_cgroup" if host.memory_cgroup_base else "rlimit_as",
            "detail": (f"a per-run memory cgroup of memory_bytes under {host.memory_cgroup_base}"
                       if host.memory_cgroup_base else
                       "no memory cgroup for this caller: address_space_bytes per process,"
                       " and scratch_bytes for the scratch"),
        },
        # What runtimes that size themselves from their cgroup see (the JVM,
        # Node, Go): the program's own cgroup, read-only at /sys/fs/cgroup.
        "cgroup_view": {
            "holds": True,
            "mounts": [f"{fstype} {options}".strip() for fstype, options in host.cgroup_views],
            "detail": _view_detail(host),
        },
        "identity": {
            "holds": True,
            "detail": ("a root caller's jails each run as their own host uid/gid, taken from"
                       f" {DEFAULT_RANGE.start}..{DEFAULT_RANGE.stop - 1} by default"
                       " (Runner(host_ids=)) and released when the run ends"
                       if host.is_root else f"jails run as the caller, uid {host.uid}"),
        },
        # Not a layer of the default jail: whether the provider profile (host
        # network) can run here.
        "provider_profile": {"holds": provider is None, "detail": provider or ""},
    }


def _view_detail(host: HostSupport) -> str:
    views = host.cgroup_views
    if not views:
        return ("no view: runs have no cgroup of their own here, so the JVM and Node size"
                " themselves from the host's RAM; pass -XX:MaxRAM=BYTES (JAVA_TOOL_OPTIONS)"
                " and NODE_OPTIONS=--max-old-space-size=MIB in the run's env")
    if views == (("cgroup2", ""),):
        return "the program's cgroup (cgroup2) at /sys/fs/cgroup: its memory.max and cpu.max"
    shown = {c for _, options in views for c in options.split(",")}
    missing = sorted({"memory", "cpu", "cpuacct", "cpuset"} - shown)
    return (f"cgroup v1: the program's {', '.join(sorted(shown))} cgroups under /sys/fs/cgroup"
            + (f"; the JVM also needs {', '.join(missing)} (pass -XX:MaxRAM=BYTES in"
               " JAVA_TOOL_OPTIONS)" if missing else ""))


def _sysctl(name: str) -> str:
    try:
        with open(f"/proc/sys/{name.replace('.', '/')}") as f:
            return " ".join(f.read().split())
    except OSError as e:
        return f"unreadable ({e.strerror})"


def memory_bounds(host: HostSupport) -> list[dict[str, str]]:
    """What bounds one run's memory on this host, layer by layer, with the
    default `Limits` (docs/jail.md: "What bounds a run's memory")."""
    from trunner.limits import Limits, MiB
    from trunner.linux.plan import (
        MSGQUEUE_BYTES,
        RLIM_INFINITY,
        SIGPENDING,
        address_space_for,
        ipc_limits_for,
    )

    cgroup = bool(host.memory_cgroup_base)
    limits = Limits()
    space = address_space_for(limits, memory_cgroup=cgroup)
    ipc = {sysctl.name: sysctl.value for sysctl in ipc_limits_for(limits)}
    semmsl, semmns, _semopm, semmni = ipc["sem"].split()
    fds = limits.open_files * limits.processes
    every = (f"the program's own memory cgroup: memory_bytes ({limits.memory_bytes // MiB}"
             " MiB, memory_limit) for all of the below together; the run's (trunner's helper"
             " and adapter with it): memory_bytes + 2 x the output caps + 3 x the request"
             " + 64 MiB" if cgroup else
             "no memory cgroup for this caller: each bound below holds alone")
    wmem_max = _sysctl("net.core.wmem_max")
    wmem = int(wmem_max) if wmem_max.isdigit() else 0
    return [
        {"what": "cgroup", "bound": every},
        {"what": "processes", "bound": (
            f"address_space_bytes {limits.address_space_bytes!r}: "
            + ("no RLIMIT_AS (the cgroup bounds them)" if space == RLIM_INFINITY
               else f"{space // MiB} MiB each (RLIMIT_AS)")
            + f", {limits.processes} processes (RLIMIT_NPROC)")},
        {"what": "scratch", "bound": f"scratch_bytes ({limits.scratch_bytes // MiB} MiB tmpfs:"
         " working dir, /tmp, /dev/shm)"},
        {"what": "sysv shm", "bound": f"shmall {int(ipc['shmall']) * 4096 // MiB} MiB"
         " (memory_bytes/4, the run's IPC namespace)"},
        {"what": "sysv semaphores", "bound": f"SEMMNS {semmns}, SEMMNI {semmni}, SEMMSL {semmsl}"
         f" (memory_bytes/16 with undo lists)"},
        {"what": "sysv messages", "bound": f"msgmni {ipc['msgmni']} x msgmnb {ipc['msgmnb']}"
         " (memory_bytes/16)"},
        {"what": "signals, timers", "bound": f"RLIMIT_SIGPENDING {SIGPENDING} per run"},
        {"what": "posix mqueues", "bound": f"RLIMIT_MSGQUEUE {MSGQUEUE_BYTES} bytes per run"
         " (and Landlock refuses mq_open)"},
        {"what": "pipe buffers", "bound": "per host uid, not per run: pipe-user-pages-soft"
         f" {_sysctl('fs.pipe-user-pages-soft')} pages, then 2 pages a pipe;"
         f" pipes <= open_files x processes / 2 ({fds // 2})"},
        {"what": "fds in flight", "bound": "per host uid: RLIMIT_NOFILE"
         f" ({limits.open_files}) of the sender, each a pipe or socket with its buffers"},
        {"what": "memfds, landlock rulesets", "bound": (
            "the memory cgroup (their pages and slab are charged to it)" if cgroup else
            "refused: memfd_create and landlock_create_ruleset fail ENOSYS (seccomp)")},
        {"what": "tcp and udp buffers", "bound": _inet_sockets_bound(host, limits)},
        {"what": "unix sockets", "bound": ("the memory cgroup (their buffers are charged to it);"
         if cgroup else "NOT BOUNDED per run: net.core.wmem_max is host-global;")
         + f" up to {fds} sockets of 2 x wmem_max ({2 * wmem // MiB} MiB) each"},
    ]


def _inet_sockets_bound(host: HostSupport, limits: Limits) -> str:
    base = host.memory_cgroup_base
    if not base:
        return ("NOT BOUNDED per run: only the host-wide net.ipv4.tcp_mem and udp_mem"
                f" ({_sysctl('net.ipv4.tcp_mem')} pages)")
    if os.path.exists(os.path.join(base, "memory.max")) or os.path.exists(
            os.path.join(base, "cgroup.controllers")):
        return "cgroup v2: charged to the program's memory cgroup, inside memory_bytes"
    if os.path.exists(os.path.join(base, "memory.kmem.tcp.limit_in_bytes")):
        return (f"cgroup v1: the program's memory.kmem.tcp.limit_in_bytes = memory_bytes"
                f" ({limits.memory_bytes >> 20} MiB), TCP and UDP alike, on top of memory_bytes")
    return ("NOT BOUNDED per run: this cgroup v1 kernel has no memory.kmem.tcp.limit_in_bytes;"
            " only the host-wide net.ipv4.tcp_mem and udp_mem")


def host_report() -> dict[str, Any]:
    """`trunner doctor`'s view of this host: what holds, layer by layer,
    and what bounds a run's memory."""
    from trunner.linux.seccomp import libseccomp_problem

    host = probe_host()
    return {"layers": host_layers(host, libseccomp=libseccomp_problem()),
            "memory_bounds": memory_bounds(host)}
