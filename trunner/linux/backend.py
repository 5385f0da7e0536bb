"""Parent side: the Linux jail backend.

`LinuxBackend` probes the host once (`probe.probe_host`, `probe.snapshot`),
plans the jail once per `Limits` (`plan.plan_jail`: the plan and the rules
version it hashes to), and for each run makes the run's cgroups and takes
its host id (as root), puts them in the plan and builds the helper command:
a `LinuxJail`. The jail lists its group with the watchdog, reads the
helper's report pipe (its refusal and its notes), waits at teardown until
the jail's pid 1, and so its whole PID namespace, is gone, and frees what
it held.
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

import msgspec
import trio

from trunner import cleanup, procfs
from trunner.errors import Reason, RunnerError
from trunner.jail import Command, Failure, Figures, HostSupport
from trunner.kernel import abi
from trunner.linux import cgroup, delegation, kmsg, landlock, seccomp, sockets, watchdog
from trunner.linux.binds import HostBind, parse_binds, parse_etc, writer_refusal
from trunner.linux.ids import DEFAULT_RANGE, HostFiles, HostIds, IdLease
from trunner.linux.image import (
    HostInterpreter,
    ImageFacts,
    ImageRefusal,
    adapter_launch,
    host_interpreter,
    image_facts,
    in_host,
)
from trunner.linux.plan import (
    Bind,
    HelperPlan,
    InSession,
    PidsCgroup,
    bind_refusal,
    encode_plan,
    environment,
    for_run,
    hashed_plan,
    host_code_dirs,
    image_refusal,
    plain,
    plan_jail,
    profile_paths,
    run_bound,
    seccomp_policy_for,
    session_processes,
    with_masks,
)
from trunner.linux.probe import HostPaths, kernel_version, probe_host, snapshot
from trunner.linux.profile import DEFAULT_PROFILE, JailProfile, template_blake3
from trunner.rules import digest

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trunner.jail import Jail
    from trunner.limits import Limits
    from trunner.linux.forkclient import ForkServer

#: Bump when the meaning of a hashed field changes. 3: the typed plan (tagged
#: items with named fields), the libseccomp version, install locations
#: replaced longest first.
RULES_SCHEMA: int = 3
#: The first kernel that mounts overlayfs in a user namespace (a non-root
#: caller's image /etc).
OVERLAY_USERNS_KERNEL = (5, 11)
#: How many limits' plans a backend keeps (each a few KiB; making one
#: anew costs about a millisecond).
PREPARED_KEPT = 64
#: How long teardown waits for the jail's pid 1 (and so its PID namespace)
#: to be gone after the group kill; SIGKILL is delivered asynchronously.
GONE_BOUND_S = 1.0
#: How often the parent samples the program's cgroup's current memory where
#: the kernel keeps no peak of it (cgroup v2 before 5.19).
MEMORY_SAMPLE_S = 0.01


@dataclass(frozen=True)
class Prepared:
    """What the backend plans once per `Limits`: the plan (with placeholders
    for the per-run values), what its rules version hashes, and the version."""

    plan: HelperPlan
    document: dict[str, Any]
    version: str


def parse_report(report: bytes) -> tuple[dict[bytes, list[int]], str | None]:
    """The helper's report pipe: its notes (`abi.NOTE_MARK` lines, each a
    word and numbers) and its refusal (any other text), if it refused."""
    notes: dict[bytes, list[int]] = {}
    rest = b""
    while report:
        if report.startswith(abi.NOTE_MARK):
            line, _, report = report[len(abi.NOTE_MARK):].partition(b"\n")
            word, *numbers = line.split(b" ")
            if all(n.isdigit() for n in numbers):
                notes[word] = [int(n) for n in numbers]
                continue
            rest += line
        else:
            text, mark, report = report.partition(abi.NOTE_MARK)
            rest += text
            report = mark + report
    return notes, rest.decode(errors="replace") if rest else None


@dataclass
class LinuxJail:
    """One invocation's jail on Linux: its command, its cgroups (as root:
    pids, and memory where the host has it) and its host id (as root)."""

    command: Command
    jail_dir: str
    cgroups: tuple[str, ...] = ()
    memory_cgroup: str | None = None
    host_id: IdLease | None = None
    pgid: int = 0
    #: The helper's own argv (`PLAN {report_fd} -- ADAPTER...`): what the
    #: fork server's leader runs (`trunner.worker.forkserver`).
    stage: tuple[str, ...] = ()
    #: The built-in mode a fork server's pid 2 serves in-process ("": it
    #: execs its adapter): a reply then needs its ready note.
    in_process: str = ""
    #: A pidfd of the jail's pid 1 when it outlived `wait_gone`'s bound: the
    #: host id is given back only once it has exited.
    init_pidfd: int | None = None
    #: The run's limits (its whole cgroup's bound is made from them).
    limits: Limits | None = None
    #: The run's CPU accounting cgroup (v1 cpuacct; v2 the run's one).
    cpu_cgroup: str | None = None
    #: Its program's CPU time when the request was written (`admit`), and
    #: its figures read before `release` removed its cgroup.
    cpu_at_admit: tuple[int, int, int] | None = None
    final: Figures | None = None
    #: Where the kernel keeps no peak of `prog` (v2 before 5.19): its
    #: current-memory file, sampled (`sample_memory`), and the most seen.
    memory_now: str | None = None
    sampled_peak: int = 0
    #: A session's jail: (dir, controller) its commands' cgroups are made
    #: under, as a run's are under the host's bases (`views`: v1 cpu,
    #: cpuset); its pid 1 (host pid, start time), which they join, once
    #: its report says (`note_init`).
    session_bases: tuple[tuple[str, str], ...] = ()
    session_views: tuple[tuple[str, str], ...] = ()
    init: tuple[int, int] | None = None

    def note_init(self, report: bytes) -> bool:
        """Read the jail's pid 1 from its report so far; whether it was there."""
        init = parse_report(report)[0].get(abi.INIT_NOTE)
        if init is not None and len(init) == 2:
            self.init = (init[0], init[1])
        return self.init is not None

    @property
    def memory_sample_s(self) -> float | None:
        return MEMORY_SAMPLE_S if self.memory_now else None

    def sample_memory(self) -> int | None:
        if self.memory_now is None:
            return None
        text = cgroup.read_text(self.memory_now)
        if text is not None and text.isdigit():  # None once the cgroup is gone
            self.sampled_peak = max(self.sampled_peak, int(text))
        return self.sampled_peak

    def spawned(self, pgid: int) -> None:
        self.pgid = pgid
        watchdog.watch(pgid, "\n".join(self.cgroups) or None, self.jail_dir)

    def killed(self, pgid: int) -> None:
        watchdog.unwatch(pgid)

    async def wait_gone(self, pgid: int, report: bytes) -> None:
        """The jail's pid 1 gone means its whole PID namespace is: the kernel
        kills every process left in it when pid 1 dies (the helper's group
        kill reaches it, its parent-death signal too), and pid 1 becomes a
        zombie only once they are all gone; wherever they moved (another
        process group, a session of their own), they are in it. Waited on
        by its pidfd, an event; pid 1 is known by the helper's note (host
        pid and start time, so a reused pid is never mistaken for it). What
        else of the group remains (the helper refused before forking pid 1:
        nothing, but its group is checked) is polled, bounded."""
        deadline = trio.current_time() + GONE_BOUND_S
        init = parse_report(report)[0].get(abi.INIT_NOTE)
        if init is not None and len(init) == 2:
            pidfd = _pidfd_of(*init)
            if pidfd is not None:
                try:
                    with trio.move_on_at(deadline):
                        await trio.lowlevel.wait_readable(pidfd)
                finally:
                    if self.host_id is not None and self.init_pidfd is None:
                        self.init_pidfd, pidfd = pidfd, -1  # `release` decides
                    if pidfd >= 0:
                        os.close(pidfd)
        # No event for a process group: a bounded poll (usually one killpg(0)).
        while _group_alive(pgid) and trio.current_time() < deadline:  # noqa: ASYNC110
            await trio.sleep(0.001)

    async def release(self) -> None:
        if self.final is None:
            self.final = self._program_figures()
        try:
            for path in self.cgroups:
                await cgroup.remove(path, nested=bool(self.session_bases))
        finally:
            # The run is gone: the id is free for another run (once its
            # pid 1 has exited, if it outlived `wait_gone`).
            if self.host_id is not None:
                pidfd, self.init_pidfd = self.init_pidfd, None
                self.host_id.release(after=pidfd)

    def oom_kills(self) -> tuple[int, bool]:
        return cgroup.oom_kills(self.memory_cgroup) if self.memory_cgroup else (0, False)

    def admit(self, request_bytes: int) -> None:
        """Raise the run's whole cgroup's bound by its request (`run_bound`),
        before the request is written; its program's stays `memory_bytes`."""
        if self.cpu_cgroup is not None:
            self.cpu_at_admit = _prog_cpu(self.cpu_cgroup)
        limits = self.limits
        if self.memory_cgroup is None or limits is None:
            return
        try:
            cgroup.bound_memory(self.memory_cgroup, run_bound(
                limits.memory_bytes, limits.stdout_max_bytes, limits.stderr_max_bytes,
                request_bytes))
        except OSError as e:
            out_of_fds = e.errno in (errno.EMFILE, errno.ENFILE)
            raise RunnerError(Reason.SPAWN_FAILED if out_of_fds else Reason.SANDBOX_SETUP,
                              f"cannot bound cgroup {self.memory_cgroup}: {e.strerror}"
                              f" (errno {e.errno})") from None

    def usage_now(self, pgid: int, *, program_only: bool) -> Figures | None:
        """What the run's program used so far: its cgroup's CPU time since
        `admit` and its peak where the run has cgroups (`prog` holds the
        `exec` program's tree, or a `run()` mode's adapter and its
        children). Else read from the host's /proc while they run (user s,
        system s, the largest VmHWM in bytes): every descendant of the
        jail's pid 1 (the helper's child), each with its reaped children's
        times; `program_only`, without pid 2's own (the `exec` adapter: its
        children's times are its program's). None if there is no pid 1 to
        read."""
        figures = self._program_figures()
        if figures is not None and figures.memory_source != "max_rss":
            return figures
        init = procfs.children(pgid)
        if not init:
            return None
        user = system = peak = 0
        stack = [(pid, True) for pid in procfs.children(init[0])]
        while stack:
            pid, top = stack.pop()
            times = procfs.cpu_ticks(pid)
            if times is None:
                continue  # gone while we looked
            adapter = top and program_only and procfs.ns_pid(pid) == 2
            if not adapter:
                user, system = user + times[0], system + times[1]
                peak = max(peak, procfs.peak_rss_bytes(pid))
            user, system = user + times[2], system + times[3]
            stack.extend((child, False) for child in procfs.children(pid))
        tick = os.sysconf("SC_CLK_TCK")
        return Figures(user / tick, system / tick, peak)

    def final_usage(self, report: bytes) -> Figures | None:
        usage = parse_report(report)[0].get(abi.USAGE_NOTE)
        rusage = None
        if usage is not None and len(usage) == 3:
            rusage = Figures(usage[0] / 1e6, usage[1] / 1e6, usage[2] * 1024)
        final = self.final
        if final is None:
            return rusage
        if final.memory_source == "sampled" and rusage is not None:
            return final._replace(peak_bytes=max(final.peak_bytes, rusage.peak_bytes))
        return final

    def _program_figures(self) -> Figures | None:
        """The program's cgroup's CPU time since `admit` and (where the
        kernel has it) its peak; None without cgroups."""
        if self.cpu_cgroup is None:
            return None
        now = _prog_cpu(self.cpu_cgroup)
        if now is None:
            return None
        total, user, system = (a - b for a, b in zip(now, self.cpu_at_admit or (0, 0, 0),
                                                      strict=True))
        share = user / (user + system) if user + system > 0 else 1.0
        seconds = max(total, 0) / 1e9
        cpu = (seconds * share, seconds - seconds * share)
        sampled = self.sample_memory()
        if sampled is not None:
            return Figures(*cpu, sampled, "cgroup", "sampled")
        peak = _prog_peak(self.memory_cgroup) if self.memory_cgroup else None
        return Figures(*cpu, peak or 0, "cgroup", "max_rss" if peak is None else "cgroup")

    def explain(self, exit_code: int, report: bytes, started_us: int) -> Failure | None:
        notes, refusal = parse_report(report)
        if refusal is not None:  # only the helper (and pid 2 before its exec) can write it
            reason = (Reason.PROCESS_COUNT if exit_code == abi.PROCESS_COUNT_EXIT
                      else Reason.SANDBOX_SETUP)
            return Failure(reason, refusal, exit_status=exit_code if exit_code >= 0 else None)
        if self.in_process and exit_code == 0 and abi.READY_NOTE not in notes:
            return Failure(Reason.SANDBOX_SETUP, "the jail's pid 2 exited 0 without saying it"
                           " was confined and ready", exit_status=0)
        if exit_code >= 0:
            return None
        sig = -exit_code
        if sig == signal.SIGXCPU:  # RLIMIT_CPU: a run() mode's adapter is its program
            return Failure(Reason.CPU_TIME, "killed by SIGXCPU: past the per-process CPU"
                           " time bound (RLIMIT_CPU)", signal=sig)
        if sig != signal.SIGSYS:
            return Failure(Reason.KILLED_BY_SIGNAL, f"killed by {signal_name(sig)}", signal=sig)
        jail_pid = notes.get(abi.JAIL_PID_NOTE, [self.pgid])[0]
        nr = kmsg.denied_syscall(jail_pid, started_us)
        if nr is None:
            detail = "killed by SIGSYS: a syscall outside the allow-list (number not logged)"
        else:
            name = seccomp.syscall_name(nr) or "?"
            detail = f"killed by SIGSYS: syscall {nr} ({name}) is not allowed"
        return Failure(Reason.SYSCALL_DENIED, detail, signal=sig)


def _prog_cpu(run: str) -> tuple[int, int, int] | None:
    """The run's `prog`'s CPU time (ns) and its user and system shares (any
    unit), as the exec adapter reads them (`trunner.worker.prog.cpu_s`)."""
    prog = os.path.join(run, abi.PROG_CGROUP)
    stat = cgroup.flat_keyed(os.path.join(prog, "cpu.stat"))
    if stat:  # v2: microseconds
        return (stat.get(b"usage_usec", 0) * 1000, stat.get(b"user_usec", 0),
                stat.get(b"system_usec", 0))
    total = cgroup.read_text(os.path.join(prog, "cpuacct.usage"))
    if total is None or not total.isdigit():
        return None
    split = cgroup.flat_keyed(os.path.join(prog, "cpuacct.stat"))
    return int(total), split.get(b"user", 0), split.get(b"system", 0)


def _prog_peak(run: str) -> int | None:
    """The most memory the run's `prog` held at once, where the kernel keeps
    it (v2 `memory.peak` from 5.19; v1 `memory.max_usage_in_bytes`)."""
    prog = os.path.join(run, abi.PROG_CGROUP)
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        text = cgroup.read_text(os.path.join(prog, name))
        if text is not None and text.isdigit():
            return int(text)
    return None


def _pidfd_of(pid: int, start: int) -> int | None:
    """A pidfd of process `pid` if it is still the one that started at
    `start` (clock ticks after boot); None if that one is gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    if procfs.start_time(pid) == start:
        return pidfd
    os.close(pidfd)
    return None


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is alive (not a zombie)."""
    try:
        os.killpg(pgid, 0)  # the usual case: no member at all
    except (ProcessLookupError, PermissionError):
        return False
    for pid in procfs.pids():
        fields = procfs.stat(pid)
        if not procfs.exited(fields) and int(fields[procfs.PGRP]) == pgid:
            return True
    return False


def _refuse_locked_submounts(plan: HelperPlan) -> None:
    """A non-root caller's jail is a user namespace it owns, where the kernel
    locks every mount copied in to its parent: a dir with a mount below it
    cannot be bound alone (EINVAL), and trunner binds no more than the dir.
    So such a bind is refused, naming the mount (Docker's `--init` puts
    docker-init under /usr)."""
    mounts = sockets.mount_points()
    for op in plan.root_ops:
        if not isinstance(op, Bind):
            continue
        top = op.source.rstrip("/") + "/"
        below = sorted(m for m in mounts if m.startswith(top))
        if below:
            raise RunnerError(Reason.SANDBOX_SETUP, (
                f"{below[0]} is a mount below {op.source}, which the jail binds: a non-root"
                " caller's jail cannot bind a dir without the mounts below it (the kernel"
                " locks them in a new user namespace): unmount it, or run as root (Docker:"
                " run without --init, whose docker-init is mounted under /usr)"))


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
        sample_memory: plan as on a cgroup v2 kernel before 5.19, which
            keeps no peak of a cgroup: the parent samples the program's
            cgroup's current memory instead (`LinuxJail.sample_memory`), on
            any kernel, so that path is tested here.
        unsafe_skip: benchmark hook: layers the helper leaves out. Named in
            the plan and in the rules version; never set by `Runner`.
        host_ids: the host ids (uid == gid) a root caller's jails run as,
            one per concurrent run (`trunner.linux.ids`); checked against
            the host at `check()`. A caller that is not root runs its jails
            as itself.
        host_files: test hook: where the host's users, groups, processes
            and id locks are read.
        cgroup_leaf: cgroup v2: the name of a leaf of the delegated cgroup
            this process lives in, which it moves itself into at `settle()`
            (its first run or pool) so that runs' cgroups can be made beside it
            (`trunner.linux.delegation`; None: `TRUNNER_CGROUP_LEAF`).
        binds: host dirs the jail reads and execs, each a path or a (host
            dir, target) pair (`trunner.linux.binds`); checked at `check()`.
        etc: /etc entries the jail holds beside `plan.ETC_FILES`.
        root: an image (a directory tree) as the jail's system root
            (`trunner.linux.image`; docs/images.md); checked at `check()`.
        root_statement: the caller's statement of `root`'s contents (an
            image digest, say), hashed into the rules version; required
            with `root`.
    """

    worker: str
    import_paths: tuple[str, ...] = ()
    profile: JailProfile = DEFAULT_PROFILE
    landlock_abi: int | None = None
    sample_memory: bool = False
    unsafe_skip: tuple[str, ...] = ()
    host_ids: range = DEFAULT_RANGE
    host_files: HostFiles = field(default_factory=HostFiles)
    cgroup_leaf: str | None = None
    binds: Sequence[str | tuple[str, str]] = ()
    etc: Sequence[str] = ()
    root: str | None = None
    root_statement: str | None = None
    _host: HostSupport | None = field(default=None, repr=False)
    _paths: HostPaths | None = field(default=None, repr=False)
    #: The compiled filters, by `seccomp_policy_for`'s policy (it follows the
    #: host's memory cgroup, which `settle()` may change).
    _bpf: dict[seccomp.SeccompPolicy, bytes] = field(default_factory=dict, repr=False)
    _launch: tuple[str, ...] | None = field(default=None, repr=False)
    #: The plans made, by limits, the most recently used last: at most
    #: `PREPARED_KEPT` (a caller may pass new limits on every call).
    _prepared: dict[Limits | tuple[Limits, str, bool], Prepared] = field(default_factory=dict,
                                                                    repr=False)
    _ids_checked: bool = field(default=False, repr=False)
    _binds_checked: bool = field(default=False, repr=False)
    #: `prog`'s current-memory file's name where it is sampled ("": the
    #: kernel keeps a peak), from the first run.
    _memory_now_name: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._binds: tuple[HostBind, ...] = parse_binds(self.binds)  # ValueError: a bad one
        self._etc = parse_etc(self.etc)
        if self.root is not None and (not isinstance(self.root_statement, str)
                                      or not self.root_statement):
            raise ValueError("root= needs root_statement=: a statement of the image's contents"
                             " (its digest, say), which the rules version hashes")
        if self.root is None and self.root_statement is not None:
            raise ValueError("root_statement= without root=")
        self._image: ImageFacts | None = None
        self._interpreter: HostInterpreter | None = None
        self._ids = HostIds(self.host_ids, self.host_files)  # ValueError for a bad range
        self._cgroups = cgroup.RunCgroups()

    def probe(self) -> HostSupport:
        if self._host is None:
            self._host = probe_host(self.cgroup_leaf)
        return self._host

    def settle(self) -> None:
        """cgroup v2: move this process into its leaf of the delegated cgroup
        (`cgroup_leaf`) if it is to move and has not: before the watchdog, a
        fork server or any run starts. The probe, `check()` and `trunner
        doctor` only predict it.

        Raises:
            RunnerError: `process_limit_unavailable` when the kernel refuses
                the move, or what the move reveals (another process left in
                the delegated cgroup).
        """
        leaf = self.probe().cgroup_leaf
        if not leaf:
            return
        try:
            delegation.enter_leaf(leaf)
        except OSError as e:
            raise RunnerError(Reason.PROCESS_LIMIT_UNAVAILABLE,
                              f"cannot move into cgroup {leaf}: {e.strerror} (errno {e.errno})"
                              ) from None
        self._host = None
        self.check()

    def check(self) -> None:
        host = self.probe()
        if host.refusal is not None:
            raise RunnerError(host.refusal, host.refusal_detail)
        abi_used = self.abi()
        if abi_used < landlock.MIN_ABI:
            raise RunnerError(
                Reason.SANDBOX_SETUP,
                f"landlock: ABI {abi_used} is below the required {landlock.MIN_ABI}",
            )
        if self.landlock_abi is not None and self.landlock_abi > host.landlock_abi:
            raise RunnerError(
                Reason.SANDBOX_SETUP,
                f"landlock: ABI {self.landlock_abi} asked, the kernel has {host.landlock_abi}",
            )
        if "net" not in self.profile.namespaces:
            # The host network is shared: no namespace covers TCP or abstract sockets.
            refusal = landlock.host_network_refusal(abi_used)
            if refusal is not None:
                raise RunnerError(Reason.SANDBOX_SETUP, f"{self.profile.name} profile: {refusal}")
        if host.is_root and not self._ids_checked:
            self._ids.check()  # once: it reads every process's ids
            self._ids_checked = True
        if not self._binds_checked:
            if self.root is not None:
                self._check_image(host.is_root)
            self._check_binds(host.is_root)
            self._binds_checked = True

    def _check_image(self, is_root: bool) -> None:
        """`root`: an image a jail can stand on (`image.image_facts`), a host
        whose interpreter can start there (`image.host_interpreter`), a
        kernel that lets this caller mount its /etc overlay, trunner's own
        worker; as root, a tree only root can write (as a bind)."""
        assert self.root is not None
        try:
            facts = image_facts(self.root)
            interpreter = host_interpreter()
        except ImageRefusal as e:
            raise RunnerError(Reason.SANDBOX_SETUP, str(e)) from None
        if not is_root and kernel_version() < OVERLAY_USERNS_KERNEL:
            raise RunnerError(Reason.SANDBOX_SETUP, (
                "root=: a non-root caller's jail mounts the image's /etc as an overlay in a user"
                f" namespace, which needs Linux {OVERLAY_USERNS_KERNEL[0]}."
                f"{OVERLAY_USERNS_KERNEL[1]}: run as root, or on a newer kernel"))
        package = self.host_paths().package
        if len(self.helper_launch()) == 1 or not os.path.realpath(self.worker).startswith(
                package.rstrip("/") + "/"):
            raise RunnerError(Reason.SANDBOX_SETUP, (
                f"root=: the worker {self.worker} is not trunner's own (in {package}), which"
                " the image's jail binds: pass no worker="))
        targets = [target for _, target in self._binds] + list(self.import_paths)
        for target in targets:
            top = "/" + target.strip("/").split("/")[0]
            inside = os.path.join(facts.path, target.lstrip("/"))
            if (any(f"/{e.name}" == top for e in facts.entries) and target != top
                    and (os.path.realpath(inside) != inside or not os.path.isdir(inside))):
                raise RunnerError(Reason.SANDBOX_SETUP, (
                    f"root=: {target} lies in the image's {top}, which has no directory"
                    f" {inside} to mount it on (the image is read-only in the jail): make"
                    " that directory in the image, or bind elsewhere"))
        if is_root:
            try:
                refusal = writer_refusal(facts.path, sockets.mount_points())
            except OSError as e:
                refusal = f"cannot walk it: {e}"
            if refusal is not None:
                raise RunnerError(Reason.SANDBOX_SETUP, f"root=: {refusal}")
        self._image, self._interpreter = facts, interpreter

    def _ensure_image(self) -> None:
        """With `root`, never plan or start as if on the host's root: the
        image is checked (`check()`) before its facts are used."""
        if self.root is not None and self._image is None:
            self.check()

    def _check_binds(self, is_root: bool) -> None:
        """The caller's binds: none shadows the jail's paths; as root, none
        holds what a user but root could change (walked once: the tree
        may be large)."""
        if self._image is not None:
            refusal = image_refusal(self._image, self._interpreter, self.profile, self._binds,
                                    self._etc, self.import_paths)
        else:
            refusal = bind_refusal(self._binds, self.profile, self.host_paths(),
                                   self.import_paths)
        if refusal is None and is_root:
            mounts = sockets.mount_points()
            for source in dict.fromkeys(source for source, _ in self._binds):
                try:
                    refusal = writer_refusal(source, mounts)
                except OSError as e:
                    refusal = f"bind {source}: cannot walk it: {e}"
                if refusal is not None:
                    break
        if refusal is not None:
            raise RunnerError(Reason.SANDBOX_SETUP, refusal)

    def abi(self) -> int:
        """The Landlock ABI in force: the kernel's, or `landlock_abi` if given
        (a cap: more than the kernel has is refused), at most KNOWN_ABI."""
        abi_used = self.probe().landlock_abi if self.landlock_abi is None else self.landlock_abi
        return min(abi_used, landlock.KNOWN_ABI)

    def helper_launch(self) -> tuple[str, ...]:
        """How to start the worker binary in helper mode.

        A Python worker script (a `#!` line naming python, as the package's
        own) runs under this interpreter, which the jail always sees, with
        `-I -S`: the helper needs only the standard library and trunner's own
        modules (found through `--path`), so it skips `site` and every `.pth`
        file, about a third of its start-up. Any other worker is run as is.
        """
        if self._launch is None:
            self._launch = _launch(self.worker, self.host_paths().trunner_dir)
        return self._launch

    def adapter_argv(self, mode: str, *, builtin: bool) -> tuple[str, ...]:
        """A `builtin` mode needs only the standard library and trunner, so a
        Python worker runs it as the helper runs: `python -I -S WORKER --path
        DIR MODE` (no site, no .pth files). A user mode keeps site-packages
        and PYTHONPATH, where its code is found, with trunner's dir after
        them: `python -P WORKER --path DIR MODE`."""
        launch = self.helper_launch()
        if self.root is not None:
            return self._image_adapter_argv(mode, builtin=builtin)
        if len(launch) == 1:
            return (self.worker, mode)
        if builtin:
            return (*launch, mode)
        python, _isolated, _no_site, *worker_and_path = launch
        return (python, "-P", *worker_and_path, mode)

    def _image_adapter_argv(self, mode: str, *, builtin: bool) -> tuple[str, ...]:
        """On an image, the adapter starts through the host's loader
        (`image.adapter_launch`), the worker and trunner's dir under
        `image.HOST_PREFIX`; the flags as on the host's root."""
        self._ensure_image()
        assert self._interpreter is not None
        _python, _isolated, _no_site, worker, path_flag, trunner_dir = self.helper_launch()
        bound = tuple(host_code_dirs(self.host_paths(), self._interpreter))
        flags = ("-I", "-S") if builtin else ("-P",)
        return (*adapter_launch(self._interpreter, bound), *flags, in_host(worker), path_flag,
                in_host(trunner_dir), mode)

    @functools.cached_property
    def _jail_env(self) -> dict[str, str]:
        """The jail's whole environment: it follows the profile and the
        import paths only, so it is made once."""
        return environment(self.profile.environment, self.import_paths)

    def host_paths(self) -> HostPaths:
        if self._paths is None:
            self._paths = snapshot(profile_paths(self.profile, self.import_paths, self._etc))
        return self._paths

    def prepared(self, limits: Limits, stdio: str = "pipes", session: bool = False) -> Prepared:
        """The plan and the rules version for runs with `limits` (and
        `stdio`, `abi.STDIO_KINDS`; `session`: a session's command, whose
        plan joins a session's pid 1), made once."""
        key = limits if stdio == "pipes" and not session else (limits, stdio, session)
        done = self._prepared.pop(key, None)
        if done is None:
            done = self._prepare(limits, stdio, session)
            if len(self._prepared) >= PREPARED_KEPT:
                del self._prepared[next(iter(self._prepared))]  # the least recently used
        self._prepared[key] = done
        return done

    def _prepare(self, limits: Limits, stdio: str, session: bool) -> Prepared:
        if stdio != "pipes" or session:
            plan = msgspec.structs.replace(self.prepared(limits).plan, stdio=stdio)
            if session:  # a command's, its session's pid 1 a placeholder
                plan = _session_plan(plan, limits, (0, 0))
            document = self._document(limits, plan, self.host_paths())
            return Prepared(plan, document, digest(document))
        self._ensure_image()
        policy = seccomp_policy_for(self.profile, self.probe())
        if policy not in self._bpf:
            try:
                self._bpf[policy] = seccomp.build_bpf(policy)
            except RuntimeError as e:  # libseccomp unusable: a layer that does not hold
                raise RunnerError(Reason.SANDBOX_SETUP, f"seccomp: {e}") from e
        paths = self.host_paths()
        plan = plan_jail(limits, self.probe(), paths, self.profile,
                         import_paths=self.import_paths, binds=self._binds, etc=self._etc,
                         parent_pid=os.getpid(),
                         landlock_abi=self.abi(), unsafe_skip=self.unsafe_skip,
                         seccomp_bpf=self._bpf[policy], sample_memory=self.sample_memory,
                         image=self._image, interpreter=self._interpreter)
        if not self.probe().is_root:
            _refuse_locked_submounts(plan)
        plan = with_masks(plan, self._sockets_shown(plan))
        document = self._document(limits, plan, paths)
        return Prepared(plan, document, digest(document))

    def _caller_paths(self) -> list[str]:
        """The paths bound at their own path that are the caller's, not the
        system's: import paths, binds, and any path the profile adds to the
        default profile's."""
        ours = {*DEFAULT_PROFILE.read_exec, *DEFAULT_PROFILE.read_only,
                *DEFAULT_PROFILE.read_write}
        named = [*self.profile.read_exec, *self.profile.read_only, *self.profile.read_write]
        same = [source for source, target in self._binds if source == target]
        return sorted({os.path.normpath(p) for p in (*self.import_paths, *named, *same)
                       if p not in ours})

    def _sockets_shown(self, plan: HelperPlan) -> list[str]:
        """Every unix socket (and unlistable dir) the plan's binds would show,
        as the jail sees it: the system dirs walked once per process, the
        caller's paths now (a bind moved to a target: found at the target)."""
        caller = self._caller_paths()

        def is_caller(path: str) -> bool:
            return any(path == c or path.startswith(c.rstrip("/") + "/") for c in caller)

        mounts = sockets.mount_points()
        found: list[sockets.Found] = []
        moved = set(self._binds)
        for op in plan.root_ops:
            if (not isinstance(op, Bind) or op.flags & abi.BIND_DEVICE or is_caller(op.source)
                    or (op.source, op.path) in moved):
                continue
            if op.source == op.path:
                found.append(sockets.system_walk(op.source, mounts))
                continue
            # An image's entry (walked now: the caller's), or the host's code
            # under HOST_PREFIX (the system's, once): found where it is shown.
            image = self._image.path.rstrip("/") + "/" if self._image else "/"
            system = op.path == in_host(op.source) and not op.source.startswith(image)
            f = (sockets.system_walk if system else sockets.find_sockets)(op.source, mounts)
            shown_at = [op.path + path[len(op.source):] for path in (*f.sockets, *f.unlistable)]
            found.append(sockets.Found(tuple(shown_at)))
        found += [sockets.find_sockets(path, mounts) for path in caller]
        shown = [path for f in found for path in (*f.sockets, *f.unlistable)]
        for source, target in self._binds:
            if source != target:
                f = sockets.find_sockets(source, mounts)
                shown += [target + path[len(source):] for path in (*f.sockets, *f.unlistable)]
        return shown

    def _document(self, limits: Limits, plan: HelperPlan, paths: HostPaths) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": RULES_SCHEMA,
            "backend": "linux",
            "machine": platform.machine(),
            "plan": hashed_plan(plain(plan), paths, self._jail_env),
            # What compiled the seccomp filter: the same policy may compile
            # to other bytes under another libseccomp.
            "libseccomp": seccomp.libseccomp_version(),
            # Enforced by the parent, not the helper (cpu_time_s: polled by the
            # parent for a run() mode, by the exec adapter for its program;
            # the plan's RLIMIT_CPU is only its whole-second backstop).
            "parent": {
                "wall_time_s": limits.wall_time_s,
                "cpu_time_s": limits.cpu_time_s,
                "stdout_max_bytes": limits.stdout_max_bytes,
                "stderr_max_bytes": limits.stderr_max_bytes,
            },
            # Documented intent, not enforced: Landlock filters TCP by port.
            "provider_hosts": list(self.profile.provider_hosts),
        }
        if self.profile.name == "provider":
            doc["provider_template_blake3"] = template_blake3()
        if self._image is not None:
            import blake3

            # The tree is never hashed: the caller states what it holds.
            assert self.root_statement is not None
            doc["root"] = {"path": self._image.path, "statement_blake3":
                           blake3.blake3(self.root_statement.encode()).hexdigest()}
        return doc

    def rules_document(self, limits: Limits, *, stdio: str = "pipes",
                       session: bool = False) -> dict[str, Any]:
        return self.prepared(limits, stdio, session).document

    def rules_version(self, limits: Limits, *, stdio: str = "pipes", session: bool = False) -> str:
        return self.prepared(limits, stdio, session).version

    def _memory_now(self, run: str | None) -> str | None:
        """Where the kernel keeps no peak of the run's `prog` (or
        `sample_memory`): its current-memory file, to sample. Looked up at
        the first run: the kernel's, so the same for every run."""
        if run is None:
            return None
        prog = os.path.join(run, abi.PROG_CGROUP)
        if self._memory_now_name is None:
            v2 = os.path.exists(os.path.join(prog, "memory.max"))
            peak = "memory.peak" if v2 else "memory.max_usage_in_bytes"
            keeps_peak = not self.sample_memory and os.path.exists(os.path.join(prog, peak))
            self._memory_now_name = ("" if keeps_peak else
                                     "memory.current" if v2 else "memory.usage_in_bytes")
        return os.path.join(prog, self._memory_now_name) if self._memory_now_name else None

    def _plan_for_run(self, limits: Limits, cgroup_dir: str | None, memory_dir: str | None,
                      host_id: int | None, cpu_dir: str | None = None,
                      view_dirs: tuple[str, ...] = ()) -> HelperPlan:
        """One run's plan (tests override this to edit it)."""
        return for_run(self.prepared(limits).plan, cgroup=cgroup_dir, memory_cgroup=memory_dir,
                       host_id=host_id, parent_pid=os.getpid(), cpu_cgroup=cpu_dir,
                       view_cgroups=view_dirs)

    def open_jail(
        self, *, jail_dir: str, adapter_argv: Sequence[str], limits: Limits, in_process: str = "",
        stdio: str = "pipes", session: Jail | None = None, holds_session: bool = False,
    ) -> LinuxJail:
        self.check()
        launch = self.helper_launch()
        if len(launch) > 1 and not os.access(self.worker, os.X_OK):
            # Run through its interpreter it would start; it must still be
            # executable, as the adapter stage execs it directly.
            raise RunnerError(
                Reason.SPAWN_FAILED,
                f"cannot start {self.worker}: {os.strerror(errno.EACCES)} (errno {errno.EACCES})",
            )
        within = session
        if within is not None:
            assert isinstance(within, LinuxJail)
            if within.init is None:
                raise RunnerError(Reason.SANDBOX_SETUP, "the session has no pid 1 to join")
        host = self.probe()
        limit = host.process_limit
        assert limit is not None  # check() refused otherwise
        paths: list[str] = []
        pids_dir = memory_dir = cpu_dir = None
        view_dirs: tuple[str, ...] = ()
        bases: list[tuple[str, str]] = []
        views: tuple[tuple[str, str], ...] = ()
        # As root, the run's own host id, held until `LinuxJail.release`; a
        # session's command runs as its session's.
        lease = self._ids.acquire() if host.is_root and within is None else None
        try:
            if limit.kind == "pids_cgroup":
                if within is None:
                    bases = [(b, c) for b, c in [(limit.cgroup_base, "pids"),
                                                 (host.memory_cgroup_base, "memory"),
                                                 (host.cpu_cgroup_base, "cpuacct")] if b]
                    views = host.view_cgroup_bases
                else:  # in the session's cgroup, beside its own leaves
                    bases, views = list(within.session_bases), within.session_views
                # Listed with the watchdog before they exist.
                paths = self._cgroups.make(bases, lambda joined: watchdog.hold(joined, jail_dir),
                                           views, remember=within is None)
                # v2: one dir for all (the bases are the same).
                made = dict(zip([b for b, _ in bases], paths, strict=False))
                by_controller = {c: made[b] for b, c in bases}
                pids_dir = paths[0]
                memory_dir = by_controller.get("memory")
                cpu_dir = by_controller.get("cpuacct")
                view_dirs = tuple(paths[len(paths) - len(views):])
            jail = LinuxJail(Command(argv=(), env={}, cwd=jail_dir), jail_dir,
                             memory_cgroup=memory_dir, limits=limits)
            jail.admit(0)  # the run's whole bound; its program's is the helper's
            host_id = (lease.id if lease is not None else
                       within.host_id.id if within is not None and within.host_id else None)
            plan = self._plan_for_run(limits, pids_dir, memory_dir, host_id, cpu_dir, view_dirs)
            if stdio != "pipes":
                plan = msgspec.structs.replace(plan, stdio=stdio)
            if within is not None or holds_session:
                plan = _session_plan(plan, limits, None if within is None else within.init)
            env = self._jail_env
        except BaseException:
            try:
                for path in paths:
                    cgroup.remove_now(path)
            finally:
                if lease is not None:
                    lease.release()
            raise
        stage = (encode_plan(plan), "{report_fd}", "--", *adapter_argv)
        jail = LinuxJail(Command(argv=(*launch, "helper", *stage), env=env, cwd=jail_dir),
                         jail_dir, tuple(paths), memory_dir, lease, stage=stage, limits=limits,
                         cpu_cgroup=cpu_dir, in_process=in_process,
                         memory_now=self._memory_now(memory_dir))
        if holds_session and paths:
            jail.session_bases = tuple((made[b], c) for b, c in bases)
            jail.session_views = tuple(zip(view_dirs, (c for _, c in views), strict=True))
        return jail

    def fork_server(self, mode: str) -> ForkServer:
        """A fork server for a pool of `mode` (`trunner.linux.forkclient`),
        started on first use, stopped at the `async with`'s end."""
        from trunner.linux.forkclient import ForkServer

        self.check()
        self.settle()
        return ForkServer(self.helper_launch(), self._jail_env, mode)

    def sweep(self, temp_root: str | None) -> list[str]:
        """What dead owners of this uid left: their jail dirs under
        `temp_root` and, as root, their run cgroups."""
        host = self.probe()
        limit = host.process_limit
        bases = [limit.cgroup_base if limit is not None and limit.kind == "pids_cgroup" else "",
                 host.memory_cgroup_base, host.cpu_cgroup_base,
                 *(b for b, _ in host.view_cgroup_bases)]
        dirs = dict.fromkeys(os.path.join(b, cgroup.DIR_NAME) for b in bases if b)
        return cleanup.sweep(temp_root, list(dirs))


def _session_plan(plan: HelperPlan, limits: Limits, init: tuple[int, int] | None) -> HelperPlan:
    """A session's own plan (`init` None) or its command's, which joins the
    session's pid 1 `init` (host pid, start time): RLIMIT_NPROC counts the
    whole session (`session_processes`: trunner's own processes of every
    command it may run at once too), as does the session's pids cgroup; a
    command's own pids cgroup keeps its run's bound."""
    bound = session_processes(limits)
    changes: dict[str, object] = {"jail_nproc": bound if plan.jail_nproc else 0}
    if init is None and isinstance(plan.process_limit, PidsCgroup):
        changes["process_limit"] = msgspec.structs.replace(plan.process_limit, max=bound)
    if init is not None:
        changes["session"] = InSession(pid=init[0], start=init[1])
    return msgspec.structs.replace(plan, **changes)


def _launch(worker: str, trunner_dir: str) -> tuple[str, ...]:
    try:
        with open(worker, "rb") as f:
            first = f.readline(512)
    except OSError:
        return (worker,)
    if not first.startswith(b"#!") or b"python" not in first or not sys.executable:
        return (worker,)
    return (sys.executable, "-I", "-S", worker, "--path", trunner_dir)


def signal_name(sig: int) -> str:
    """`SIGSEGV`, `SIGRTMIN+6`, or `signal 99` where the number has no name."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        pass
    if signal.SIGRTMIN <= sig <= signal.SIGRTMAX:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"
    return f"signal {sig}"

