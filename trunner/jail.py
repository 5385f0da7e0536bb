"""The jail contract every subprocess adapter runs under.

A `JailBackend` turns (worker, adapter argv, limits, jail dir) into a
`Command` whose first stage is the worker's helper mode with the backend's
setup plan: a cleared environment holding only the names the backend sets,
the jail dir as cwd. The spawn adds piped stdio and a fresh process group.
`platform_backend()` is the only place that reads `sys.platform`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trunner.errors import Reason, RunnerError

if TYPE_CHECKING:
    from trunner.limits import Limits


@dataclass(frozen=True)
class Command:
    """What to start: argv, the complete environment, the working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    #: A per-invocation cgroup the watchdog removes if the parent dies.
    cgroup: str | None = None
    #: The jail dir, which the watchdog removes if the parent dies.
    jail_dir: str | None = None


@dataclass(frozen=True)
class HostSupport:
    """What this host supports, and whether a run would be refused."""

    platform: str
    is_root: bool
    landlock_abi: int
    seccomp_filter: bool
    user_namespaces: bool
    network_namespaces: bool
    process_limit: str | None  # the mechanism, e.g. "rlimit_nproc" or "pids_cgroup"
    refusal: Reason | None = None
    refusal_detail: str = ""

    @property
    def can_run(self) -> bool:
        return self.refusal is None


class Jail(Protocol):
    """One invocation's jail: its command and the host resources it holds."""

    command: Command

    async def release(self) -> None:
        """Free what the jail holds on the host. Call once the process group
        is dead and reaped."""


class JailBackend(Protocol):
    """Builds jailed commands for one platform.

    `open_jail()` returns a command with a cleared environment, the jail dir
    as cwd and the helper stage first; it raises `RunnerError` with
    `sandbox_setup`, `process_limit_unavailable` or `unsupported_platform`
    where this host cannot apply the rules. It never returns a command that
    would run unconfined.
    """

    def probe(self) -> HostSupport:
        """What the host supports (cached; cheap after the first call)."""

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
