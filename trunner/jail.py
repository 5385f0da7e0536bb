"""The jail contract every subprocess adapter runs under.

A `JailBackend` turns (worker, adapter argv, limits, jail dir) into a
`Command` whose first stage is the worker's helper mode with the backend's
setup plan: a cleared environment holding only the names the backend sets,
the jail dir as cwd. The spawn adds piped stdio and a fresh process group.
`platform_backend()` is the only place that reads `sys.platform`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping  # noqa: TC003  annotates the Command dataclass: kept real
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from trunner.errors import Reason, RunnerError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trunner.limits import Limits


@dataclass(frozen=True)
class Command:
    """What to start: argv, the complete environment, the working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    #: A run's cgroups (newline-separated: pids and memory are two on
    #: cgroup v1), which the watchdog removes if the parent dies.
    cgroup: str | None = None
    #: The jail dir, which the watchdog removes if the parent dies.
    jail_dir: str | None = None


@dataclass(frozen=True)
class ProcessLimit:
    """How the process limit is enforced on this host: `pids_cgroup` (root:
    per-run cgroups made under `cgroup_base`), `userns_nproc` (not root, a
    kernel that counts RLIMIT_NPROC per user namespace: 5.14 on), or
    `rlimit_nproc` (not root, older kernels: the uid's count at spawn plus
    the limit). Per-user-namespace counts also bound a root caller's runs,
    which run as an unprivileged uid, on top of the cgroup."""

    kind: Literal["pids_cgroup", "userns_nproc", "rlimit_nproc"]
    cgroup_base: str = ""


@dataclass(frozen=True)
class HostSupport:
    """What this host supports, and whether a run would be refused."""

    platform: str
    is_root: bool
    uid: int
    gid: int
    landlock_abi: int
    seccomp_filter: bool
    user_namespaces: bool
    network_namespaces: bool
    process_limit: ProcessLimit | None
    #: Whether the kernel counts RLIMIT_NPROC per user namespace (5.14 on).
    nproc_per_userns: bool = False
    #: Where per-run memory cgroups are made ("": no memory cgroup; the
    #: bound is then per process, RLIMIT_AS, and the scratch size).
    memory_cgroup_base: str = ""
    refusal: Reason | None = None
    refusal_detail: str = ""
    #: The namespace kinds this host lets a jail create (user, net, mount,
    #: pid, ipc, uts).
    namespaces: tuple[str, ...] = ()

    @property
    def can_run(self) -> bool:
        return self.refusal is None


class Jail(Protocol):
    """One invocation's jail: its command and the host resources it holds."""

    command: Command

    async def release(self) -> None:
        """Free what the jail holds on the host. Call once the process group
        is dead and reaped."""

    def oom_kills(self) -> int:
        """Processes the kernel killed for the run's memory bound (0 where
        there is no per-run memory bound). Call before `release`."""


class JailBackend(Protocol):
    """Builds jailed commands for one platform, and owns its platform facts.

    `open_jail()` returns a command with a cleared environment, the jail dir
    as cwd and the helper stage first; the child gets the helper's report
    pipe as fd 3. It raises `RunnerError` with `sandbox_setup`,
    `process_limit_unavailable` or `spawn_failed` where this host cannot
    apply the rules. It never returns a command that would run unconfined.
    """

    #: The worker binary whose helper mode starts every jail.
    worker: str
    #: Directories the jail may read user modes from.
    import_paths: tuple[str, ...]

    def probe(self) -> HostSupport:
        """What the host supports (cached; read-only: changes nothing)."""

    def check(self) -> None:
        """Raise the refusal `RunnerError` if a run here would be refused."""

    def open_jail(
        self,
        *,
        jail_dir: str,
        adapter_argv: Sequence[str],
        limits: Limits,
    ) -> Jail:
        """Build one invocation's jail. Raises `RunnerError` on refusal."""

    def rules_document(self, limits: Limits) -> dict[str, Any]:
        """What the effective rules version hashes for runs with `limits`."""

    def explain_death(self, signal: int, pid: int, started_us: int) -> tuple[Reason, str]:
        """The reason and detail for a worker killed by `signal`."""


def platform_backend(worker: str, **options: object) -> JailBackend:
    """The jail backend for this platform.

    Raises:
        RunnerError: `unsupported_platform` off Linux.
    """
    if sys.platform == "linux":
        from trunner.linux.backend import LinuxBackend

        return LinuxBackend(worker, **options)  # type: ignore[arg-type]
    raise RunnerError(
        Reason.UNSUPPORTED_PLATFORM, f"no jail backend for {sys.platform}; refusing to run unjailed"
    )
