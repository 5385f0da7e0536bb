"""Parent side: what this host offers a jail, read and never changed.

`probe_host` reads what the kernel supports (namespaces, Landlock, seccomp,
the process-limit and memory mechanisms); `snapshot` records what the host
has at every path a profile names (the plan is built from it, so
`plan.plan_jail` reads nothing); `host_layers` and `memory_bounds` say, for
`trunner doctor`, what holds here. Nothing is cached: the backend keeps
what it probed.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from trunner.errors import Reason
from trunner.jail import HostSupport, ProcessLimit
from trunner.linux import cgroup, landlock
from trunner.linux.ids import DEFAULT_RANGE
from trunner.linux.kernel import install

if TYPE_CHECKING:
    from collections.abc import Iterable


def _has_seccomp_filter() -> bool:
    status = cgroup.read_text("/proc/self/status") or ""
    actions = cgroup.read_text("/proc/sys/kernel/seccomp/actions_avail") or ""
    return "\nSeccomp:" in status and actions != ""


def kernel_version() -> tuple[int, int]:
    """(major, minor) of the running kernel; (0, 0) if unparsable."""
    parts = os.uname().release.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


#: Each namespace a jail unshares, and its /proc/sys/user/max_*_namespaces name.
_NAMESPACE_SYSCTLS = (("user", "user"), ("net", "net"), ("mount", "mnt"), ("pid", "pid"),
                      ("ipc", "ipc"), ("uts", "uts"), ("cgroup", "cgroup"))


def probe_host() -> HostSupport:
    """What this kernel supports. Reads only."""
    is_root = os.getuid() == 0
    abi = install.landlock_abi()
    enabled = {kind: (cgroup.read_text(f"/proc/sys/user/max_{sysctl}_namespaces") or "0") != "0"
               for kind, sysctl in _NAMESPACE_SYSCTLS}
    userns, netns = enabled["user"], enabled["net"]
    has_seccomp = _has_seccomp_filter()
    per_userns = kernel_version() >= (5, 14)
    limit, memory = None, ""
    if not is_root:
        limit = ProcessLimit("userns_nproc" if per_userns else "rlimit_nproc")
    else:
        base = cgroup.find_base("pids")
        if base is not None:
            limit = ProcessLimit("pids_cgroup", base)
        memory = cgroup.find_base("memory") or ""
    refusal, detail = None, ""
    disabled = [kind for kind, on in enabled.items() if not on]
    if abi < landlock.MIN_ABI:
        refusal, detail = Reason.SANDBOX_SETUP, (
            f"landlock ABI {abi} is below the required {landlock.MIN_ABI}"
            " (Landlock is absent or disabled)"
        )
    elif not has_seccomp:
        refusal, detail = Reason.SANDBOX_SETUP, "seccomp filters are not available"
    elif disabled:
        refusal, detail = Reason.SANDBOX_SETUP, (
            f"{', '.join(disabled)} namespaces are disabled"
            f" (/proc/sys/user/max_*_namespaces is 0)"
        )
    elif not os.access(install.WAITER, os.X_OK):
        refusal, detail = Reason.SANDBOX_SETUP, (
            f"{install.WAITER} is not built (reinstall trunner where a C compiler and a"
            " static C library are present)"
        )
    elif limit is None:
        refusal, detail = Reason.PROCESS_LIMIT_UNAVAILABLE, (
            "running as root, where RLIMIT_NPROC is not enforced, and no pids cgroup"
            " can be created"
        )
    return HostSupport(
        platform=sys.platform,
        is_root=is_root,
        uid=os.getuid(),
        gid=os.getgid(),
        landlock_abi=abi,
        seccomp_filter=has_seccomp,
        user_namespaces=userns,
        network_namespaces=netns,
        namespaces=tuple(kind for kind, on in enabled.items() if on),
        process_limit=limit,
        nproc_per_userns=per_userns,
        memory_cgroup_base=memory,
        refusal=refusal,
        refusal_detail=detail,
    )


def host_layers(host: HostSupport, landlock_abi: int | None = None) -> dict[str, dict[str, Any]]:
    """What holds on `host`, layer by layer (`trunner doctor`). Pure.

    `landlock_abi` is a cap on the ABI used, as `LinuxBackend(landlock_abi=)`.
    Each layer has `holds` (a run needs every one); Landlock lists each
    feature the ABI in use has, and for each it lacks, what covers it.
    """
    missing_ns = [kind for kind, _ in _NAMESPACE_SYSCTLS if kind not in host.namespaces]
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
        "seccomp": {"holds": host.seccomp_filter},
        "process_limit": {
            "holds": limit is not None,
            "kind": None if limit is None else limit.kind,
            "cgroup_base": None if limit is None else limit.cgroup_base,
            # RLIMIT_NPROC counted per user namespace: a bound per run.
            "per_run": host.nproc_per_userns or (limit is not None and limit.kind == "pids_cgroup"),
        },
        "memory": {
            "holds": True,  # RLIMIT_AS per process holds everywhere
            "kind": "memory_cgroup" if host.is_root and host.memory_cgroup_base else "rlimit_as",
            "detail": (f"a per-run memory cgroup of memory_bytes under {host.memory_cgroup_base}"
                       if host.is_root and host.memory_cgroup_base else
                       "no memory cgroup for this caller: address_space_bytes per process,"
                       " and scratch_bytes for the scratch"),
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



# -- paths ---------------------------------------------------------------------


class PathEntry(msgspec.Struct, frozen=True, kw_only=True):
    """What the host has at one path: a directory, a non-directory, a
    symlink (its target as written, and the path it resolves to), or none."""

    kind: Literal["dir", "file", "symlink", "missing"]
    target: str = ""
    real: str = ""


class HostPaths(msgspec.Struct, frozen=True, kw_only=True):
    """The host facts a plan is built from: where this interpreter and
    trunner live, and a snapshot of every path the plan may name."""

    #: This interpreter's prefixes and executable dir.
    python: tuple[str, ...]
    #: trunner's package dir (the only part of a checkout the jail sees).
    package: str
    #: The dir trunner is imported from (the package's parent, on sys.path).
    trunner_dir: str
    entries: dict[str, PathEntry]

    def kind(self, path: str) -> str:
        entry = self.entries.get(path)
        return "missing" if entry is None else entry.kind


def python_paths() -> tuple[str, ...]:
    """Where this interpreter, its stdlib and site-packages live."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return tuple(sorted(paths))


def package_dir() -> str:
    """trunner's own package directory."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trunner_dir() -> str:
    """The directory trunner is imported from."""
    return os.path.dirname(package_dir())


def _entry(path: str) -> PathEntry:
    if os.path.islink(path):
        return PathEntry(kind="symlink", target=os.readlink(path), real=os.path.realpath(path))
    if os.path.isdir(path):
        return PathEntry(kind="dir")
    if os.path.exists(path):
        return PathEntry(kind="file")
    return PathEntry(kind="missing")


def snapshot(paths: Iterable[str]) -> HostPaths:
    """The host facts for a plan naming `paths` (trunner's and the
    interpreter's own paths are added)."""
    python, package = python_paths(), package_dir()
    every = {*paths, *python, package}
    return HostPaths(python=python, package=package, trunner_dir=trunner_dir(),
                     entries={path: _entry(path) for path in sorted(every)})


# -- what `trunner doctor` prints ------------------------------------------------


def _sysctl(name: str) -> str:
    try:
        with open(f"/proc/sys/{name.replace('.', '/')}") as f:
            return " ".join(f.read().split())
    except OSError as e:
        return f"unreadable ({e.strerror})"


def memory_bounds(host: HostSupport) -> list[dict[str, str]]:
    """What bounds one run's memory on this host, layer by layer, with the
    default `Limits` (README: "What bounds a run's memory")."""
    from trunner.limits import Limits, MiB
    from trunner.linux.plan import MSGQUEUE_BYTES, SIGPENDING, ipc_limits_for

    cgroup = host.is_root and bool(host.memory_cgroup_base)
    limits = Limits()
    ipc = {sysctl.name: sysctl.value for sysctl in ipc_limits_for(limits)}
    semmsl, semmns, _semopm, semmni = ipc["sem"].split()
    fds = limits.open_files * limits.processes
    every = (f"the run's memory cgroup: memory_bytes ({limits.memory_bytes // MiB} MiB,"
             " memory_limit) for all of the below together" if cgroup else
             "no memory cgroup for this caller: each bound below holds alone")
    wmem_max = _sysctl("net.core.wmem_max")
    wmem = int(wmem_max) if wmem_max.isdigit() else 0
    return [
        {"what": "cgroup", "bound": every},
        {"what": "processes", "bound": f"address_space_bytes ({limits.address_space_bytes // MiB}"
         f" MiB) each, {limits.processes} processes (RLIMIT_AS, RLIMIT_NPROC)"},
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
        {"what": "unix sockets", "bound": ("the memory cgroup (their buffers are charged to it);"
         if cgroup else "NOT BOUNDED per run: net.core.wmem_max is host-global;")
         + f" up to {fds} sockets of 2 x wmem_max ({2 * wmem // MiB} MiB) each"},
    ]


def host_report() -> dict[str, Any]:
    """`trunner doctor`'s view of this host: what holds, layer by layer,
    and what bounds a run's memory."""
    host = probe_host()
    return {"layers": host_layers(host), "memory_bounds": memory_bounds(host)}
