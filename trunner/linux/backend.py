"""The Linux jail backend: user and network namespaces, resource limits,
Landlock filesystem rules and a seccomp allow-list.

Pure builders (limits to rlimits, paths to Landlock rules, the helper plan)
are kept apart from the few functions that touch the host (the probe and the
per-invocation pids cgroup). The BPF program is compiled once per policy here
in the parent; the helper only installs the bytes.

Process limit: as non-root, RLIMIT_NPROC (measured count + `processes`). The
kernel never applies RLIMIT_NPROC to real root, and a user namespace does not
change that, so as root each invocation gets its own pids cgroup whose
`pids.max` is `processes`; without one, root runs are refused.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from trunner.linux import landlock, seccomp, watchdog
from trunner.errors import Reason, RunnerError
from trunner.jail import Command, HostSupport
from trunner.limits import Limits
from trunner.profile import DEFAULT_PROFILE, PYTHON_PATHS, TRUNNER_PATH, JailProfile

CGROUP_DIR_NAME = "trunner"


# -- pure builders ---------------------------------------------------------


def rlimits_for(limits: Limits) -> tuple[tuple[str, int, int], ...]:
    """`Limits` to (resource, soft, hard); units are converted here only."""
    return (
        # SIGXCPU at the soft limit, SIGKILL one second later.
        ("CPU", limits.cpu_time_s, limits.cpu_time_s + 1),
        ("AS", limits.address_space_bytes, limits.address_space_bytes),
        ("FSIZE", limits.file_size_bytes, limits.file_size_bytes),
        ("NOFILE", limits.open_files, limits.open_files),
        ("CORE", 0, 0),
    )


def environment(
    jail_dir: str, names: Sequence[str], import_paths: Sequence[str] = ()
) -> dict[str, str]:
    """The whole environment of a jailed process: nothing is inherited."""
    known = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": jail_dir,
        "TMPDIR": jail_dir,
        "LANG": "C.UTF-8",
    }
    env = {name: known[name] for name in names}
    if import_paths:
        env["PYTHONPATH"] = os.pathsep.join(import_paths)
    return env


def _trunner_dir() -> str:
    import trunner

    return os.path.dirname(os.path.dirname(os.path.abspath(trunner.__file__)))


def python_read_exec_paths() -> tuple[str, ...]:
    """Where this interpreter, its stdlib and site-packages live."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return tuple(sorted(paths))


def resolve_paths(paths: Sequence[str]) -> list[str]:
    """Expand the profile's symbolic paths; drop system paths this host lacks
    (e.g. no /lib64), which cannot then be reached anyway."""
    out: list[str] = []
    for path in paths:
        if path == PYTHON_PATHS:
            out += python_read_exec_paths()
        elif path == TRUNNER_PATH:
            out.append(_trunner_dir())
        elif os.path.exists(path):
            out.append(path)
    return out


def landlock_ruleset(
    abi: int, jail_dir: str, profile: JailProfile, import_paths: Sequence[str] = ()
) -> landlock.Ruleset:
    """The filesystem (and TCP) rules for one invocation."""
    return landlock.plan_ruleset(
        abi,
        read_exec=resolve_paths(profile.read_exec),
        read_only=[*resolve_paths(profile.read_only), *import_paths],
        read_write=[jail_dir, *resolve_paths(profile.read_write)],
        connect_tcp_ports=profile.tcp_connect_ports,
    )


def helper_plan(
    *,
    env_names: Sequence[str],
    ids: tuple[int, int],
    netns: bool,
    cgroup: str | None,
    nproc_extra: int | None,
    rlimits: Sequence[tuple[str, int, int]],
    ruleset: landlock.Ruleset,
    bpf: bytes,
    parent_pid: int,
    fail_step: str | None = None,
) -> list[str]:
    """The helper's argv items (before `--`), in the format helper.Plan reads."""
    plan = [f"env={name}" for name in sorted(env_names)]
    if cgroup is not None:
        plan.append(f"cgroup={cgroup}")
    if nproc_extra is not None:
        plan.append(f"nproc={nproc_extra}")
    plan += [f"rlimit={name}:{soft}:{hard}" for name, soft, hard in rlimits]
    plan += [f"userns={ids[0]}:{ids[1]}", f"netns={int(netns)}", "dropcaps=1"]
    plan += [f"ll={item}" for item in landlock.encode_ruleset(ruleset)]
    plan += [f"parent={parent_pid}", f"seccomp={bpf.hex()}"]
    if fail_step is not None:
        plan.append(f"fail={fail_step}")
    return plan


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
    return (interpreter, "-I", "-S", worker, "--path", _trunner_dir())


# -- host facts --------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _has_seccomp_filter() -> bool:
    status = _read("/proc/self/status") or ""
    return "\nSeccomp:" in status and (_read("/proc/sys/kernel/seccomp/actions_avail") or "") != ""


def find_pids_cgroup() -> str | None:
    """A directory under which this process may create pids cgroups, or None.

    cgroup v1: the pids hierarchy at our own pids cgroup. cgroup v2: our own
    cgroup, if it is the root or already delegates `pids` to children.
    """
    own = {}
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, options = (right.split(" ") + ["", "", ""])[:3]
        mount_point = left.split(" ")[4]
        if fstype == "cgroup" and "pids" in options.split(","):
            for controllers, path in own.items():
                if "pids" in controllers.split(","):
                    return os.path.join(mount_point, path.lstrip("/"))
        if fstype == "cgroup2" and "" in own:
            base = os.path.join(mount_point, own[""].lstrip("/"))
            enabled = (_read(os.path.join(base, "cgroup.subtree_control")) or "").split()
            if "pids" in enabled:
                return base
            if own[""] == "/" and "pids" in (_read(os.path.join(base, "cgroup.controllers")) or ""):
                try:
                    with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                        f.write("+pids")
                    return base
                except OSError:
                    pass
    return None


@functools.cache
def probe_host() -> HostSupport:
    """Probe the kernel once per process."""
    is_root = os.getuid() == 0
    abi = landlock.abi_version()
    userns = (_read("/proc/sys/user/max_user_namespaces") or "0") != "0"
    netns = (_read("/proc/sys/user/max_net_namespaces") or "0") != "0"
    has_seccomp = _has_seccomp_filter()
    mechanism = None
    if not is_root:
        mechanism = "rlimit_nproc"
    else:
        base = find_pids_cgroup()
        if base is not None and _can_make_cgroup(base):
            mechanism = f"pids_cgroup:{base}"
    refusal, detail = None, ""
    if abi < landlock.MIN_ABI:
        refusal, detail = Reason.SANDBOX_SETUP, (
            f"landlock ABI {abi} is below the required {landlock.MIN_ABI}"
        )
    elif not has_seccomp:
        refusal, detail = Reason.SANDBOX_SETUP, "seccomp filters are not available"
    elif not (userns and netns):
        refusal, detail = Reason.SANDBOX_SETUP, "user or network namespaces are disabled"
    elif mechanism is None:
        refusal, detail = Reason.PROCESS_LIMIT_UNAVAILABLE, (
            "running as root, where RLIMIT_NPROC is not enforced, and no pids cgroup"
            " can be created"
        )
    return HostSupport(
        platform=sys.platform,
        is_root=is_root,
        landlock_abi=abi,
        seccomp_filter=has_seccomp,
        user_namespaces=userns,
        network_namespaces=netns,
        process_limit=mechanism,
        refusal=refusal,
        refusal_detail=detail,
    )


def _can_make_cgroup(base: str) -> bool:
    parent = os.path.join(base, CGROUP_DIR_NAME)
    try:
        os.makedirs(parent, exist_ok=True)
        return os.access(parent, os.W_OK)
    except OSError:
        return False


def denied_syscall(pid: int, since_us: int) -> int | None:
    """The syscall the seccomp filter killed `pid` for, from the kernel log
    (audit type 1326), or None where no such record can be read.

    Only records stamped at or after `since_us` (CLOCK_MONOTONIC, the clock of
    /dev/kmsg's timestamps) count: an older one is of an earlier process that
    had the same pid. Records may be missing (rate limits, no access).
    """
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    needle, found = f" pid={pid} ".encode(), None
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record was overwritten while we read
                continue
            if b"type=1326" not in record or needle not in record:
                continue
            prefix, _, message = record.partition(b";")
            fields = prefix.split(b",")
            if len(fields) < 3 or int(fields[2]) < since_us or b" syscall=" not in message:
                continue
            found = int(message.split(b" syscall=")[1].split()[0])
    finally:
        os.close(fd)
    return found


# -- the backend -------------------------------------------------------------


@dataclass
class LinuxJail:
    """One invocation's jail on Linux."""

    command: Command
    cgroup: str | None = None

    async def release(self) -> None:
        if self.cgroup is None:
            return
        # The group is dead and reaped; a descendant reparented to init may
        # still be leaving. Kill what is listed, then remove the cgroup.
        for _ in range(200):
            try:
                os.rmdir(self.cgroup)
                return
            except FileNotFoundError:
                return
            except OSError:
                _kill_cgroup(self.cgroup)
                await trio.sleep(0.005)
        raise RunnerError(Reason.SANDBOX_SETUP, f"cannot remove cgroup {self.cgroup}")


def _kill_cgroup(path: str) -> None:
    import signal

    for pid in (_read(os.path.join(path, "cgroup.procs")) or "").split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class LinuxBackend:
    """The Linux jail backend. Options are for tests of the fail-closed paths:
    `fail_step` makes the helper refuse at that step, `landlock_abi` asks for
    an ABI (refused if the kernel has less)."""

    worker: str
    import_paths: tuple[str, ...] = ()
    profile: JailProfile = DEFAULT_PROFILE
    fail_step: str | None = None
    landlock_abi: int | None = None

    def probe(self) -> HostSupport:
        return probe_host()

    def check(self) -> None:
        host = self.probe()
        if host.refusal is not None:
            raise RunnerError(host.refusal, host.refusal_detail)
        if self.profile.tcp_connect_ports and self.abi() < 4:
            raise RunnerError(
                Reason.SANDBOX_SETUP, "landlock: TCP port rules need ABI 4 or newer"
            )
        if self.abi() < landlock.MIN_ABI:
            raise RunnerError(
                Reason.SANDBOX_SETUP,
                f"landlock: ABI {self.abi()} is below the required {landlock.MIN_ABI}",
            )

    def abi(self) -> int:
        if self.landlock_abi is not None:
            return self.landlock_abi
        return min(self.probe().landlock_abi, landlock.KNOWN_ABI)

    def bpf(self) -> bytes:
        return seccomp.build_bpf(self.profile.seccomp)

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
        env = environment(jail_dir, self.profile.environment, self.import_paths)
        ruleset = landlock_ruleset(self.abi(), jail_dir, self.profile, self.import_paths)
        cgroup = None
        assert host.process_limit is not None
        if host.process_limit.startswith("pids_cgroup:"):
            base = host.process_limit.split(":", 1)[1]
            cgroup = os.path.join(base, CGROUP_DIR_NAME, f"{os.getpid()}-{uuid.uuid4().hex}")
            try:
                watchdog.hold(cgroup, jail_dir)  # listed before it exists
                os.mkdir(cgroup)
                Path(cgroup, "pids.max").write_text(str(limits.processes))
            except OSError as e:
                if os.path.isdir(cgroup):
                    os.rmdir(cgroup)
                out_of_fds = e.errno in (errno.EMFILE, errno.ENFILE)
                raise RunnerError(
                    Reason.SPAWN_FAILED if out_of_fds else Reason.PROCESS_LIMIT_UNAVAILABLE,
                    f"cannot create pids cgroup {cgroup}: {e.strerror} (errno {e.errno})",
                ) from None
        plan = helper_plan(
            env_names=list(env),
            ids=(os.getuid(), os.getgid()),
            netns="net" in self.profile.namespaces,
            cgroup=cgroup,
            # As root the kernel ignores RLIMIT_NPROC: the cgroup is the limit,
            # and the /proc scan to measure the count would cost ~3 ms for nothing.
            nproc_extra=None if cgroup is not None else limits.processes,
            rlimits=rlimits_for(limits),
            ruleset=ruleset,
            bpf=self.bpf(),
            parent_pid=os.getpid(),
            fail_step=self.fail_step,
        )
        argv = (*launch, "helper", *plan, "--", *adapter_argv)
        return LinuxJail(
            Command(argv=argv, env=env, cwd=jail_dir, cgroup=cgroup, jail_dir=jail_dir), cgroup
        )
