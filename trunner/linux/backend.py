"""Parent side: the Linux jail backend.

`probe_host` reads what the kernel supports (once, changing nothing);
`LinuxBackend.open_jail` makes the run's pids cgroup (as root), plans the
jail (`plan.plan_jail`) and builds the helper command. The backend also
owns the platform facts other modules need: the rules document that the
effective rules version hashes, and what a signal death means here.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import signal
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trunner.errors import Reason, RunnerError
from trunner.jail import Command, HostSupport, ProcessLimit
from trunner.linux import cgroup, install, kmsg, landlock, seccomp, watchdog
from trunner.linux.ids import DEFAULT_RANGE, HostFiles, HostIds, IdLease
from trunner.linux.plan import (
    HelperPlan,
    encode_plan,
    environment,
    hashed_plan,
    plan_jail,
    trunner_dir,
)
from trunner.profile import DEFAULT_PROFILE, JailProfile

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trunner.limits import Limits

#: Bump when the meaning of a hashed field changes.
RULES_SCHEMA: int = 2


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


@functools.cache
def probe_host() -> HostSupport:
    """What this kernel supports, probed once per process. Reads only."""
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


@functools.cache
def helper_launch(worker: str) -> tuple[str, ...]:
    """How to start the worker binary in helper mode.

    A Python worker script runs under its own shebang interpreter with
    `-I -S`: the helper needs only the standard library and trunner's own
    modules (found through `--path`), so it skips `site` and every `.pth`
    file, about a third of its start-up. Any other worker is run as is.
    """
    try:
        with open(worker, "rb") as f:
            first = f.readline(512)
    except OSError:
        return (worker,)
    interpreter = first[2:].strip().decode(errors="replace")
    if not first.startswith(b"#!") or " " in interpreter or "python" not in interpreter:
        return (worker,)
    return (interpreter, "-I", "-S", worker, "--path", trunner_dir())


@dataclass
class LinuxJail:
    """One invocation's jail on Linux: its command, its cgroups (as root:
    pids, and memory where the host has it) and its host id (as root)."""

    command: Command
    cgroups: tuple[str, ...] = ()
    memory_cgroup: str | None = None
    host_id: IdLease | None = None

    async def release(self) -> None:
        try:
            for path in self.cgroups:
                await cgroup.remove(path)
        finally:
            # The group is dead and reaped: the id is free for another run.
            if self.host_id is not None:
                self.host_id.release()

    def oom_kills(self) -> int:
        return cgroup.oom_kills(self.memory_cgroup) if self.memory_cgroup else 0


@dataclass
class LinuxBackend:
    """The Linux jail backend.

    Args:
        worker: the worker binary.
        import_paths: directories the jail may read (user modes).
        profile: the jail profile.
        landlock_abi: plan for this ABI instead of the kernel's (refused
            if the kernel has less): a cap, so the jail can be tested as on
            an older kernel (tests read TRUNNER_TEST_LANDLOCK_ABI for it).
        fail_at: test hook: the helper refuses at this step.
        unsafe_skip: benchmark hook: layers the helper leaves out. Named in
            the plan and in the rules version; never set by `Runner`.
        host_ids: the host ids (uid == gid) a root caller's jails run as,
            one per concurrent run (`trunner.linux.ids`); checked against
            the host at `check()`. A caller that is not root runs its jails
            as itself.
        host_files: test hook: where the host's users, groups, processes
            and id locks are read.
    """

    worker: str
    import_paths: tuple[str, ...] = ()
    profile: JailProfile = DEFAULT_PROFILE
    landlock_abi: int | None = None
    fail_at: str = ""
    unsafe_skip: tuple[str, ...] = ()
    host_ids: range = DEFAULT_RANGE
    host_files: HostFiles = field(default_factory=HostFiles)
    _versions: dict[Limits, dict[str, Any]] = field(default_factory=dict, repr=False)
    _ids_checked: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self._ids = HostIds(self.host_ids, self.host_files)  # ValueError for a bad range

    def probe(self) -> HostSupport:
        return probe_host()

    def check(self) -> None:
        host = self.probe()
        if host.refusal is not None:
            raise RunnerError(host.refusal, host.refusal_detail)
        abi = self.abi()
        if abi < landlock.MIN_ABI:
            raise RunnerError(
                Reason.SANDBOX_SETUP,
                f"landlock: ABI {abi} is below the required {landlock.MIN_ABI}",
            )
        if self.landlock_abi is not None and self.landlock_abi > host.landlock_abi:
            raise RunnerError(
                Reason.SANDBOX_SETUP,
                f"landlock: ABI {self.landlock_abi} asked, the kernel has {host.landlock_abi}",
            )
        if "net" not in self.profile.namespaces:
            # The host network is shared: no namespace covers TCP or abstract sockets.
            refusal = landlock.host_network_refusal(abi)
            if refusal is not None:
                raise RunnerError(Reason.SANDBOX_SETUP, f"{self.profile.name} profile: {refusal}")
        if host.is_root and not self._ids_checked:
            self._ids.check()  # once: it reads every process's ids
            self._ids_checked = True

    def abi(self) -> int:
        """The Landlock ABI in force: the kernel's, or `landlock_abi` if given
        (a cap: more than the kernel has is refused), at most KNOWN_ABI."""
        abi = self.probe().landlock_abi if self.landlock_abi is None else self.landlock_abi
        return min(abi, landlock.KNOWN_ABI)

    def _plan(
        self, limits: Limits, jail_dir: str, cgroup_dir: str | None, memory_dir: str | None,
        host_id: int | None = None,
    ) -> HelperPlan:
        return plan_jail(
            limits, self.probe(), self.profile, jail_dir,
            import_paths=self.import_paths, cgroup=cgroup_dir, memory_cgroup=memory_dir,
            parent_pid=os.getpid(),
            landlock_abi=self.abi(), unsafe_skip=self.unsafe_skip, fail_at=self.fail_at,
            host_id=host_id,
        )

    def open_jail(
        self, *, jail_dir: str, adapter_argv: Sequence[str], limits: Limits
    ) -> LinuxJail:
        self.check()
        launch = helper_launch(self.worker)
        if len(launch) > 1 and not os.access(self.worker, os.X_OK):
            # Run through its interpreter it would start; it must still be
            # executable, as the adapter stage execs it directly.
            raise RunnerError(
                Reason.SPAWN_FAILED,
                f"cannot start {self.worker}: {os.strerror(errno.EACCES)} (errno {errno.EACCES})",
            )
        host = self.probe()
        limit = host.process_limit
        assert limit is not None  # check() refused otherwise
        paths: list[str] = []
        pids_dir = memory_dir = None
        # As root, the run's own host id, held until `LinuxJail.release`.
        lease = self._ids.acquire() if host.is_root else None
        try:
            if limit.kind == "pids_cgroup":
                bases = [(limit.cgroup_base, "pids")]
                if host.memory_cgroup_base:
                    bases.append((host.memory_cgroup_base, "memory"))
                # Listed with the watchdog before they exist.
                paths = cgroup.make(bases, lambda joined: watchdog.hold(joined, jail_dir))
                pids_dir = paths[0]
                memory_dir = paths[-1] if host.memory_cgroup_base else None
            plan = self._plan(limits, jail_dir, pids_dir, memory_dir,
                              None if lease is None else lease.id)
            env = environment(jail_dir, self.profile.environment, self.import_paths)
        except BaseException:
            try:
                for path in paths:
                    os.rmdir(path)
            finally:
                if lease is not None:
                    lease.release()
            raise
        argv = (*launch, "helper", encode_plan(plan), "{report_fd}", "--", *adapter_argv)
        command = Command(argv=argv, env=env, cwd=jail_dir, cgroup="\n".join(paths) or None,
                          jail_dir=jail_dir)
        return LinuxJail(command, tuple(paths), memory_dir, lease)

    def rules_document(self, limits: Limits) -> dict[str, Any]:
        doc = self._versions.get(limits)
        if doc is None:
            jail_dir = "/nonexistent/trunner-jail"  # replaced by a placeholder
            plan = self._plan(limits, jail_dir, None, None)
            env = environment(jail_dir, self.profile.environment, self.import_paths)
            doc = {
                "schema": RULES_SCHEMA,
                "backend": "linux",
                "machine": platform.machine(),
                "plan": hashed_plan(plan, env, jail_dir),
                # Enforced by the parent, not the helper.
                "parent": {
                    "wall_time_s": limits.wall_time_s,
                    "stdout_max_bytes": limits.stdout_max_bytes,
                    "stderr_max_bytes": limits.stderr_max_bytes,
                },
                # Documented intent, not enforced: Landlock filters TCP by port.
                "provider_hosts": list(self.profile.provider_hosts),
            }
            if self.profile.name == "provider":
                from trunner.rules import provider_profile_template_blake3

                doc["provider_template_blake3"] = provider_profile_template_blake3()
            self._versions[limits] = doc
        return doc

    def explain_death(self, sig: int, pid: int, started_us: int) -> tuple[Reason, str]:
        if sig != signal.SIGSYS:
            return Reason.KILLED_BY_SIGNAL, f"killed by {signal_name(sig)}"
        nr = kmsg.denied_syscall(pid, started_us)
        if nr is None:
            return Reason.SYSCALL_DENIED, (
                "killed by SIGSYS: a syscall outside the allow-list (number not logged)"
            )
        return Reason.SYSCALL_DENIED, (
            f"killed by SIGSYS: syscall {nr} ({seccomp.syscall_name(nr) or '?'}) is not allowed"
        )


def signal_name(sig: int) -> str:
    """`SIGSEGV`, `SIGRTMIN+6`, or `signal 99` where the number has no name."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        pass
    if signal.SIGRTMIN <= sig <= signal.SIGRTMAX:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"
    return f"signal {sig}"
