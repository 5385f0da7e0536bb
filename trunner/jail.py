"""The jail contract every subprocess adapter runs under.

A `JailBackend` turns (adapter argv, limits, jail dir) into a `Jail`: the
`Command` whose first stage is the worker's helper mode with the backend's
setup plan (a cleared environment holding only the names the backend sets,
the jail dir as cwd), the rules version it enforces, and what the jail
holds on the host until `release`. The `Jail` also reads the run's end: it
explains the helper's exit and report (`explain`), and waits, at teardown,
until nothing of the run is left (`wait_gone`). Types and protocols only:
`trunner.backend` picks the platform's backend and makes the jail's dir.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from trunner.errors import Reason, RunnerError
from trunner.spawn import Command, Spawnable

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from trunner.limits import Limits
    from trunner.spawn import Spawner

__all__ = ["Command", "Failure", "Figures", "HostSupport", "Jail", "JailBackend", "ProcessLimit"]


@dataclass(frozen=True)
class ProcessLimit:
    """How the process limit is enforced on this host: `pids_cgroup` (root,
    or on cgroup v2 a caller a cgroup is delegated to: per-run cgroups made
    under `cgroup_base`), `userns_nproc` (not root, a
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
    #: Where per-run CPU accounting cgroups are made (v1 cpuacct; on v2 the
    #: runs' one cgroup; "": none, the program's CPU time is then rusage's).
    cpu_cgroup_base: str = ""
    #: v1: (base, controller) where runs get a cgroup for the jail's view
    #: only (cpu and cpuset, where each is a hierarchy of its own).
    view_cgroup_bases: tuple[tuple[str, str], ...] = ()
    #: How the jail shows its program's cgroup, each (fstype, options): one
    #: ("cgroup2", "") on v2; on v1 ("cgroup", CONTROLLERS) for each
    #: hierarchy runs get a cgroup in. Empty: runs have no cgroup to show.
    cgroup_views: tuple[tuple[str, str], ...] = ()
    refusal: Reason | None = None
    refusal_detail: str = ""
    #: The namespace kinds this host lets a jail create (user, net, mount,
    #: pid, ipc, uts, cgroup).
    namespaces: tuple[str, ...] = ()
    #: cgroup v2: the leaf of the delegated cgroup this process must move
    #: into before its first run ("": none; `trunner.linux.delegation`).
    cgroup_leaf: str = ""
    #: Why runs get no cgroup of their own here ("": they do), with the fix.
    cgroup_note: str = ""

    @property
    def can_run(self) -> bool:
        return self.refusal is None


class Figures(NamedTuple):
    """What a run's processes used, and where each figure was read."""

    user_s: float
    system_s: float
    peak_bytes: int
    cpu_source: Literal["rusage", "cgroup"] = "rusage"
    memory_source: Literal["max_rss", "cgroup", "sampled"] = "max_rss"


@dataclass(frozen=True)
class Failure:
    """Why a child's end is not a reply: a reason, a detail, and the exit
    code or signal to carry on the `RunnerError`."""

    reason: Reason
    detail: str
    exit_status: int | None = None
    signal: int | None = None

    def error(self) -> RunnerError:
        return RunnerError(self.reason, self.detail, exit_status=self.exit_status,
                           signal=self.signal)


class Jail(Spawnable, Protocol):
    """One invocation's jail: how to start it (`Spawnable`: its command,
    its helper stage, what its pid 2 serves in-process, its dir, made by
    `open_jail`) and the host resources it holds."""

    def oom_kills(self) -> tuple[int, bool]:
        """Processes the kernel killed for the run's memory bounds (0 where
        there is no per-run memory bound), and whether the bound reached
        was the run's whole one (trunner's side), not its program's. Call
        before `release`."""

    def admit(self, request_bytes: int) -> None:
        """Before the request is written: make room for it in the run's
        bound (never in its program's)."""

    def usage_now(self, pgid: int, *, program_only: bool) -> Figures | None:
        """While the run's processes live, what its program used so far:
        where the run has cgroups, its program's cgroup's CPU time since
        `admit` and its peak; else, from /proc, the processes' CPU time and
        their largest peak resident set, with `program_only` without the
        adapter's own (an `exec` program's tree). None if it cannot be read."""

    @property
    def memory_sample_s(self) -> float | None:
        """How often `sample_memory` is to be called while the run lives;
        None where the kernel keeps the program's peak (or there is no
        cgroup to sample)."""

    def sample_memory(self) -> int | None:
        """Where the kernel keeps no peak of the program's cgroup (cgroup
        v2 before 5.19): sample its current memory; the most seen so far.
        None elsewhere."""

    def final_usage(self, report: bytes) -> Figures | None:
        """After `release`, what a `run()` mode (whose adapter is its
        program) used: its program's cgroup's figures, read before
        `release` removed it, where the run has one; else the adapter's own
        rusage from `report`, its reaped children's included; None if
        neither (a kill ended the jail first)."""

    async def release(self) -> None:
        """Free what the jail holds on the host (not the jail dir). Call
        once the run is gone."""

    def note_init(self, report: bytes) -> bool:
        """A session's jail: read its pid 1 (which its commands join) from
        its report so far; whether it was there."""

    def explain(self, exit_code: int, report: bytes, started_us: int) -> Failure | None:
        """What the first stage's end means: its refusal (from `report`), a
        signal death, or None for a program that exited `exit_code` >= 0."""


class JailBackend(Protocol):
    """Builds jailed commands for one platform, and owns its platform facts.

    `open_jail()` returns a jail whose command has a cleared environment,
    the jail dir as cwd and the helper stage first; the child gets the
    helper's report pipe as fd 3. It raises `RunnerError` with
    `sandbox_setup`, `process_limit_unavailable` or `spawn_failed` where
    this host cannot apply the rules. It never returns a command that would
    run unconfined.
    """

    #: The worker binary whose helper mode starts every jail.
    worker: str
    #: Directories the jail may read user modes from.
    import_paths: tuple[str, ...]

    def probe(self) -> HostSupport:
        """What the host supports (read once, changes nothing)."""

    def check(self) -> None:
        """Raise the refusal `RunnerError` if a run here would be refused."""

    def settle(self) -> None:
        """Make the one change to this process a run needs first, if any
        (cgroup v2: move into its leaf), before anything is started."""

    def adapter_argv(self, mode: str, *, builtin: bool) -> tuple[str, ...]:
        """How the helper execs the adapter of `mode` (`builtin`: a mode of
        trunner's own, which needs no site-packages)."""

    def open_jail(self, *, jail_dir: str, adapter_argv: Sequence[str], limits: Limits,
                  in_process: str = "", stdio: str = "pipes", session: Jail | None = None,
                  holds_session: bool = False) -> Jail:
        """Build one invocation's jail, its pid 2 serving the built-in mode
        `in_process` without an exec (a fork server's runs; "": none), its
        program's stdio `stdio` (`abi.STDIO_KINDS`); `holds_session`: a
        session's own jail (its pid 2 holds it, `abi.HOLD_MODE`), `session`:
        a command in that one, which joins it. Raises `RunnerError` on
        refusal."""

    def rules_document(self, limits: Limits, *, stdio: str = "pipes",
                       session: bool = False) -> Mapping[str, object]:
        """What the effective rules version hashes for runs with `limits`
        (and `stdio`; `session`: a session's commands)."""

    def rules_version(self, limits: Limits, *, stdio: str = "pipes", session: bool = False) -> str:
        """The effective rules version for runs with `limits` (and `stdio`;
        `session`: a session's commands)."""

    def sweep(self, temp_root: str | None) -> list[str]:
        """Remove what dead owners of this uid left (jail dirs, cgroups)."""

    def fork_server(self, mode: str) -> Spawner:
        """What a pool of `mode` starts its jails' commands with instead of
        a spawn each: the platform's fork server, started on first use."""
