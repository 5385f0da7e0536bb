"""Parent side: what this host offers a jail, read and never changed.

`probe_host` reads what the kernel supports (namespaces, Landlock, seccomp,
the process-limit and memory mechanisms); `snapshot` records what the host
has at every path a profile names (the plan is built from it, so
`plan.plan_jail` reads nothing). Nothing is cached: the backend keeps
what it probed. (`doctor.py` says what holds here, for `trunner doctor`.)
"""

from __future__ import annotations

import glob
import os
import sys
from typing import TYPE_CHECKING, Literal

import msgspec

from trunner import procfs
from trunner.errors import Reason
from trunner.jail import HostSupport, ProcessLimit
from trunner.kernel import install
from trunner.linux import cgroup, delegation, landlock

if TYPE_CHECKING:
    from collections.abc import Iterable


def _has_seccomp_filter() -> bool:
    actions = cgroup.read_text("/proc/sys/kernel/seccomp/actions_avail") or ""
    return "Seccomp" in procfs.status("self") and actions != ""


#: Tries unshare(CLONE_NEWUSER) and exits with its errno (0: allowed).
_TRY_USERNS = ("import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True);"
               " sys.exit(0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno())")


def container_blocks() -> list[str]:
    """What a container's confinement of this process forbids the jail,
    each with the fix: a read-only /proc/sys (the jail sets its own IPC
    namespace's limits there), an AppArmor profile in force, a seccomp
    filter that forbids unshare. Docker's defaults do all three. Reads,
    but for the last: under a seccomp filter, a child process tries
    unshare(CLONE_NEWUSER) (a namespace of its own, gone when it exits)."""
    found = []
    if any(mount.point == "/proc/sys" and "ro" in mount.options.split(",")
           for mount in procfs.mounts()):
        found.append("/proc/sys is read-only (Docker: --security-opt systempaths=unconfined)")
    profile = (cgroup.read_text("/proc/self/attr/apparmor/current")
               or cgroup.read_text("/proc/self/attr/current") or "").strip()
    if profile.endswith("(enforce)"):
        found.append(f"AppArmor confines this process ({profile}), forbidding mounts"
                     " (Docker: --security-opt apparmor=unconfined)")
    if procfs.status("self").get("Seccomp") == "2":  # a filter
        import subprocess

        tried = subprocess.run([sys.executable, "-I", "-S", "-c", _TRY_USERNS], env={},
                               stdin=subprocess.DEVNULL, capture_output=True, check=False)
        if tried.returncode != 0:
            found.append(f"a seccomp filter forbids unshare ({os.strerror(tried.returncode)};"
                         " Docker: --security-opt seccomp=unconfined)")
    return found


def kernel_version() -> tuple[int, int]:
    """(major, minor) of the running kernel; (0, 0) if unparsable."""
    parts = os.uname().release.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


#: Each namespace a jail unshares, and its /proc/sys/user/max_*_namespaces name.
NAMESPACE_SYSCTLS = (("user", "user"), ("net", "net"), ("mount", "mnt"), ("pid", "pid"),
                      ("ipc", "ipc"), ("uts", "uts"), ("cgroup", "cgroup"))


def probe_host(cgroup_leaf: str | None = None) -> HostSupport:
    """What this kernel supports. Reads only (but see `container_blocks`).
    `cgroup_leaf`: the leaf a
    cgroup v2 caller may move into (`Runner(cgroup_leaf=)`; None: the
    environment's `TRUNNER_CGROUP_LEAF`)."""
    is_root = os.getuid() == 0
    abi = install.landlock_abi()
    enabled = {kind: (cgroup.read_text(f"/proc/sys/user/max_{sysctl}_namespaces") or "0") != "0"
               for kind, sysctl in NAMESPACE_SYSCTLS}
    userns, netns = enabled["user"], enabled["net"]
    has_seccomp = _has_seccomp_filter()
    per_userns = kernel_version() >= (5, 14)
    limit, memory, cpu, leaf, note = None, "", "", "", ""
    views: list[tuple[str, str]] = []
    base = cgroup.find_base("pids") if is_root else None  # v1: root's only
    if base is not None:
        limit = ProcessLimit("pids_cgroup", base)
        memory = cgroup.find_base("memory") or ""
        cpu = cgroup.find_base("cpuacct") or ""
        # The JVM reads v1 limits only with cpu and cpuset shown too.
        seen = {base, memory, cpu}
        for controller in ("cpu", "cpuset"):
            view = cgroup.find_base(controller)
            if view and view not in seen and memory:
                views.append((view, controller))
                seen.add(view)
    else:
        if cgroup_leaf is None:
            cgroup_leaf = os.environ.get(delegation.LEAF_VAR, "")
        placed = delegation.place(("pids", "memory"), cgroup_leaf, is_root=is_root)
        if placed.base:
            limit = ProcessLimit("pids_cgroup", placed.base)
            memory = placed.base if "memory" in placed.controllers else ""
            cpu = placed.base  # v2: cpu.stat's usage is in every cgroup
            leaf = placed.leaf
        note = placed.refusal
    # A leaf named asks for per-run cgroups: refused, not RLIMIT_NPROC instead.
    if limit is None and not is_root and not cgroup_leaf:
        limit = ProcessLimit("userns_nproc" if per_userns else "rlimit_nproc")
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
    elif blocks := container_blocks():
        refusal, detail = Reason.SANDBOX_SETUP, (
            f"this process's confinement forbids the jail: {'; '.join(blocks)}")
    elif not os.access(install.WAITER, os.X_OK):
        refusal, detail = Reason.SANDBOX_SETUP, (
            f"{install.WAITER} is not built (reinstall trunner where a C compiler and a"
            " static C library are present)"
        )
    elif limit is None:
        why = ("running as root, where RLIMIT_NPROC is not enforced," if is_root
               else f"the cgroup leaf {cgroup_leaf!r} was named,")
        refusal, detail = Reason.PROCESS_LIMIT_UNAVAILABLE, (
            f"{why} and no pids cgroup can be created{': ' + note if note else ''}"
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
        cpu_cgroup_base=cpu,
        view_cgroup_bases=tuple(views),
        cgroup_views=cgroup.views([limit.cgroup_base if limit and limit.kind == "pids_cgroup"
                                   else "", memory, cpu, *(b for b, _ in views)]),
        cgroup_leaf=leaf,
        cgroup_note=note,
        refusal=refusal,
        refusal_detail=detail,
    )


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
    #: What a user mode's adapter imports beside trunner (msgspec's package
    #: dir) where no interpreter path holds it: a `--target` or `--user`
    #: layout. Bound with the package.
    beside: tuple[str, ...] = ()
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


def beside_dirs(python: tuple[str, ...]) -> tuple[str, ...]:
    """msgspec's package dir, unless an interpreter path holds it."""
    import importlib.util

    spec = importlib.util.find_spec("msgspec")
    if spec is None or not spec.submodule_search_locations:
        return ()
    where = os.path.abspath(next(iter(spec.submodule_search_locations)))
    if any(where.startswith(path.rstrip("/") + "/") for path in python):
        return ()
    return (where,)


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
    interpreter's own paths are added; a path with a `*` is a pattern,
    the host's matches are added)."""
    python, package = python_paths(), package_dir()
    beside = beside_dirs(python)
    every = {*python, package, *beside}
    for path in paths:
        every.update(glob.glob(path) if "*" in path else (path,))
    return HostPaths(python=python, package=package, trunner_dir=trunner_dir(), beside=beside,
                     entries={path: _entry(path) for path in sorted(every)})
