"""Parent side: the one plan the helper enforces, and its codec.

`plan_jail` is pure: from the limits, the host facts, the profile and the
per-run values it resolves every number, path and BPF byte the helper will
apply, as a `HelperPlan`. `encode_plan` turns it into the single argv item
the helper reads (hex of a marshal dict: marshal is built in and already
loaded in the helper). The effective rules version hashes the same plan,
with per-run values (jail dir, cgroup, parent pid, host uid and gid) and
install locations replaced by placeholders: what is hashed is exactly what
is enforced.
"""

from __future__ import annotations

import marshal
import os
import resource
import sys
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from trunner.helper import PLAN_VERSION, SKIPPABLE
from trunner.linux import landlock, seccomp
from trunner.linux.ids import DEFAULT_RANGE
from trunner.profile import PYTHON_PATHS, TRUNNER_PATH, JailProfile

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from trunner.jail import HostSupport
    from trunner.limits import Limits

#: Placeholders for per-run values in the hashed plan.
JAIL_DIR: Final = "@jail"
CGROUP: Final = "@cgroup"
MEMORY_CGROUP: Final = "@memory_cgroup"
#: The run's host uid and gid: a root caller's is per run (`ids.HostIds`),
#: anyone else's the caller's; neither is part of the rules.
HOST_UID: Final = "@uid"
HOST_GID: Final = "@gid"

_CLONE_NEWNS: Final = 0x00020000
_CLONE_NEWCGROUP: Final = 0x02000000
_CLONE_NEWUTS: Final = 0x04000000
_CLONE_NEWIPC: Final = 0x08000000
_CLONE_NEWUSER: Final = 0x10000000
_CLONE_NEWPID: Final = 0x20000000
_CLONE_NEWNET: Final = 0x40000000
_NAMESPACE_FLAGS: Final = {"user": _CLONE_NEWUSER, "net": _CLONE_NEWNET, "mount": _CLONE_NEWNS,
                           "pid": _CLONE_NEWPID, "ipc": _CLONE_NEWIPC, "uts": _CLONE_NEWUTS,
                           "cgroup": _CLONE_NEWCGROUP}
#: Namespaces every jail has (the provider profile only shares the network).
#: cgroup: unshared after the helper joined the run's cgroups, so they are the
#: jail's root and /proc/self/cgroup shows "/", not the host's path with the
#: parent's pid in it.
REQUIRED_NAMESPACES: Final = ("cgroup", "ipc", "mount", "pid", "user", "uts")
_PATH: Final = "/usr/local/bin:/usr/bin:/bin"

#: The working dir inside the jail (cwd, HOME, TMPDIR): fixed, so a run's
#: paths and outputs do not depend on where the host keeps its jail dirs.
WORKDIR: Final = "/home/trunner"
#: The jail's hostname (its own UTS namespace).
HOSTNAME: Final = "trunner"
#: Where the helper mounts its staging tmpfs, in its own mount namespace
#: (bubblewrap's base path): an existing host dir, hidden only from the jail.
STAGING: Final = "/tmp"
#: What the jail's /etc holds of the host's, when the host has it: the
#: loader's cache, time zone, name-service and TLS configuration. Never
#: /etc whole: no shadow, no ssh keys, no host passwd.
ETC_FILES: Final = (
    "/etc/alternatives", "/etc/ca-certificates", "/etc/ca-certificates.conf",
    "/etc/crypto-policies",
    "/etc/gai.conf", "/etc/host.conf", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/etc/localtime", "/etc/mime.types", "/etc/networks", "/etc/nsswitch.conf", "/etc/os-release",
    "/etc/pki", "/etc/protocols", "/etc/services", "/etc/ssl", "/etc/timezone",
)
#: Device nodes bound from the host's /dev (bubblewrap's `--dev` list).
DEV_NODES: Final = ("full", "null", "random", "tty", "urandom", "zero")
#: /proc entries made read-only (runc's readonlyPaths).
PROC_READ_ONLY: Final = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
#: /proc entries hidden (runc's maskedPaths, plus the host's boot command line
#: and kernel build config): /dev/null over files, an empty read-only tmpfs over
#: directories. /proc/stat, /proc/loadavg and /proc/pressure stay: ps and top
#: read them (README: what they reveal).
PROC_MASKED: Final = (
    "/proc/acpi", "/proc/asound", "/proc/cmdline", "/proc/config.gz", "/proc/interrupts",
    "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/sched_debug", "/proc/scsi",
    "/proc/timer_list", "/proc/timer_stats",
)
#: Paths the jail builds itself; a profile naming them means the built one.
#: (Host paths inside /tmp or /etc are bound there.)
_BUILT: Final = ("/dev", "/etc", "/proc", "/tmp", WORKDIR)
_WRITABLE: Final = 1  # mounts.WRITABLE
_DEVICE: Final = 2  # mounts.DEVICE

#: The uid and gid every jail has inside its user namespace, whatever its
#: host ids: one value in every run (`trunner` in the jail's /etc/passwd).
#: Not 65534: that is the overflow id host files of unmapped users show as.
JAIL_ID: Final = 1000
#: Processes of every run that are trunner's own: the helper (waiting
#: outside the PID namespace) and the jail's pid 1 (its reaper).
TRUNNER_PROCESSES: Final = 2

RootOp = tuple[str, str, str, int]


class HelperPlan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything one helper run applies, resolved. See `trunner.helper`."""

    version: int = PLAN_VERSION
    #: The only environment names the helper accepts.
    env: tuple[str, ...]
    #: ("pids_cgroup", cgroup dir, pids.max), ("userns_nproc", "", n) (the
    #: bound is `jail_nproc` alone) or ("rlimit_nproc", "", processes).
    process_limit: tuple[Literal["pids_cgroup", "userns_nproc", "rlimit_nproc"], str, int]
    #: RLIMIT_NPROC set in the jail's own user namespace, where the kernel
    #: counts it per user namespace (so per run); 0 on older kernels.
    jail_nproc: int
    #: ("memory_cgroup", cgroup dir, bytes) as root where the host has a
    #: memory controller, else ("none", "", 0): the bound is then RLIMIT_AS
    #: per process and the scratch size.
    memory: tuple[Literal["memory_cgroup", "none"], str, int]
    #: (resource number, soft, hard), CORE 0 included.
    rlimits: tuple[tuple[int, int, int], ...]
    #: The run's IPC namespace sizes, (name under /proc/sys/kernel, value),
    #: written by the helper into the namespace it makes for the run (see
    #: `ipc_limits_for`); `unshare_flags` then leaves CLONE_NEWIPC out.
    ipc_limits: tuple[tuple[str, str], ...]
    #: Not root: a user namespace of the caller's own to build the root in.
    build_userns: bool
    unshare_flags: int
    #: The host ids the jail runs as: a root caller's per-run id
    #: (`ids.HostIds`, uid == gid), anyone else's own.
    uid: int
    gid: int
    #: The one uid and gid the jail's user namespace maps them to (`JAIL_ID`).
    jail_id: int
    #: The jail's root, built by `trunner.linux.mounts.build_root`:
    #: (operation, source or content, path inside, mode or flags).
    root_ops: tuple[RootOp, ...]
    #: What pid 2 does to its fresh /proc: ("mask" | "read_only", path).
    proc_ops: tuple[tuple[str, str], ...]
    #: The run's scratch tmpfs: (bytes, inodes); holds WORKDIR, /tmp, /dev/shm.
    scratch: tuple[int, int]
    staging: str
    hostname: str
    workdir: str
    landlock: landlock.LandlockRuleset
    parent_pid: int
    seccomp_bpf: bytes
    #: Layers left out, for benchmarks that measure one layer at a time.
    unsafe_skip: tuple[str, ...] = ()
    #: Test hook: refuse at this step, as if it had failed.
    fail_at: str = ""


#: POSIX message queue bytes per run (RLIMIT_MSGQUEUE, the kernel's default;
#: Landlock refuses mq_open in the jail today, this bounds it if not).
MSGQUEUE_BYTES: Final = 819200
#: Queued signals and POSIX timers per run (RLIMIT_SIGPENDING), ~100-350
#: bytes of kernel memory each.
SIGPENDING: Final = 4096


def rlimits_for(limits: Limits) -> tuple[tuple[int, int, int], ...]:
    """`Limits` to (resource, soft, hard); units are converted here only.

    SIGPENDING and MSGQUEUE are counted per (user namespace, uid) from
    kernel 5.14: set before the namespaces exist, they bound the run
    alone, and what it takes from the caller's own per-uid count."""
    return (
        # SIGXCPU at the soft limit, SIGKILL one second later.
        (resource.RLIMIT_CPU, limits.cpu_time_s, limits.cpu_time_s + 1),
        (resource.RLIMIT_AS, limits.address_space_bytes, limits.address_space_bytes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_SIGPENDING, SIGPENDING, SIGPENDING),
        (resource.RLIMIT_MSGQUEUE, MSGQUEUE_BYTES, MSGQUEUE_BYTES),
    )


#: The kernel's cost of SysV objects, in bytes, as `ipc_limits_for` counts
#: them (6.x): a semaphore is one cache line (64) and 2 in each process's
#: undo list; an array ~512 and a ~96-byte undo header per process; a
#: message at least a 64-byte allocation, and a queue holds as many as
#: msgmnb (its byte limit counts messages too).
_SEM_BYTES, _SEM_UNDO_BYTES = 64, 2
_SEM_ARRAY_BYTES, _SEM_ARRAY_UNDO_BYTES = 512, 96
_MSG_BYTES = 64
_MSGMNB = 16384  # the kernel's default queue size
_MSGMAX = 8192  # the kernel's default message size
_IPCMNI = 32000  # the kernel's default array and queue counts (32768 at most)
_PAGE = 4096


def ipc_limits_for(limits: Limits) -> tuple[tuple[str, str], ...]:
    """The run's SysV IPC sizes (its own IPC namespace's sysctls), from
    `memory_bytes`: shared memory at most a quarter of it (shmall),
    semaphores (their undo lists included) and message queues a sixteenth
    each. Without them one run held 2.1 GB of semaphore arrays and 0.5 GB
    of messages as a non-root caller, who has no memory cgroup."""
    processes = limits.processes + TRUNNER_PROCESSES
    share = limits.memory_bytes // 16
    semmni = share // 2 // (_SEM_ARRAY_BYTES + _SEM_ARRAY_UNDO_BYTES * processes)
    semmns = share // 2 // (_SEM_BYTES + _SEM_UNDO_BYTES * processes)
    semmni, semmns = max(1, min(_IPCMNI, semmni)), max(1, semmns)
    msgmni = max(1, min(_IPCMNI, share // ((_MSG_BYTES + 1) * _MSGMNB)))
    shm_bytes = limits.memory_bytes // 4
    return (
        # SEMMSL SEMMNS SEMOPM SEMMNI
        ("sem", f"{min(semmns, _IPCMNI)} {semmns} 500 {semmni}"),
        ("msgmni", str(msgmni)),
        ("msgmnb", str(_MSGMNB)),
        ("msgmax", str(_MSGMAX)),
        ("shmall", str(shm_bytes // _PAGE)),
        ("shmmax", str(shm_bytes)),
        ("shmmni", "4096"),
    )


def environment(
    jail_dir: str, names: Sequence[str], import_paths: Sequence[str] = ()
) -> dict[str, str]:
    """The whole environment of a jailed process: nothing is inherited."""
    known = {"PATH": _PATH, "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8"}
    env = {name: known[name] for name in names}
    if import_paths:
        env["PYTHONPATH"] = os.pathsep.join(import_paths)
    return env


def trunner_dir() -> str:
    """The directory trunner is imported from."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def package_dir() -> str:
    """trunner's own package directory: the only part of a checkout the jail sees."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_paths() -> tuple[str, ...]:
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
            out += python_paths()
        elif path == TRUNNER_PATH:
            out.append(package_dir())
        elif os.path.exists(path):
            out.append(path)
    return out


def _outermost(paths: Sequence[str]) -> list[str]:
    """Sorted, with every path inside another one dropped (one bind covers it)."""
    out: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths}):
        if not any(path == kept or path.startswith(kept.rstrip("/") + "/") for kept in out):
            out.append(path)
    return out


def _is_built(path: str) -> bool:
    return path in _BUILT or path.startswith(("/dev/", "/proc/"))


def _identity() -> tuple[str, str]:
    """/etc/passwd and /etc/group of the jail: its own user (`trunner`,
    `JAIL_ID` whatever its host uid, so the same in every run) and nobody."""
    passwd = (f"trunner:x:{JAIL_ID}:{JAIL_ID}:trunner:{WORKDIR}:/bin/sh\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    return passwd, f"trunner:x:{JAIL_ID}:\nnogroup:x:65534:\n"


def root_ops(binds: Sequence[str]) -> tuple[RootOp, ...]:
    """The operations that build the jail's root: scratch dirs first (binds
    may land inside /tmp), then read-only binds of `binds` (host paths; a
    symlink such as /bin -> usr/bin is recreated, its target bound), the
    short /etc, the synthesized identity files, /dev and the host's /proc
    (pid 2 mounts the jail's own over it: `PROC_OPS`)."""
    ops: list[RootOp] = [
        ("scratch", "work", WORKDIR, 0o700),
        ("scratch", "tmp", "/tmp", 0o1777),
        ("scratch", "shm", "/dev/shm", 0o1777),
    ]
    links: list[RootOp] = []
    real: list[str] = []
    for path in binds:
        if os.path.islink(path):
            links.append(("symlink", os.readlink(path), path, 0))
            real.append(os.path.realpath(path))
        else:
            real.append(path)
    ops += [("bind", path, path, 0) for path in _outermost(real)]
    ops += links
    ops.append(("dir", "", "/etc", 0o755))
    for path in ETC_FILES:
        if os.path.islink(path):
            ops.append(("symlink", os.readlink(path), path, 0))
        elif os.path.exists(path):
            ops.append(("bind", path, path, 0))
    passwd, group = _identity()
    ops += [
        ("file", passwd, "/etc/passwd", 0o644),
        ("file", group, "/etc/group", 0o644),
        ("file", f"127.0.0.1 localhost\n::1 localhost\n127.0.1.1 {HOSTNAME}\n", "/etc/hosts",
         0o644),
        ("file", HOSTNAME + "\n", "/etc/hostname", 0o644),
    ]
    ops += [("bind", f"/dev/{name}", f"/dev/{name}", _WRITABLE | _DEVICE) for name in DEV_NODES]
    ops += [("symlink", "/proc/self/fd", "/dev/fd", 0)]
    ops += [("symlink", f"/proc/self/fd/{fd}", f"/dev/{name}", 0)
            for fd, name in enumerate(("stdin", "stdout", "stderr"))]
    ops.append(("host_proc", "", "/proc", 0))
    return tuple(ops)


#: What pid 2 does to the jail's fresh /proc.
PROC_OPS: Final = (*(("read_only", path) for path in PROC_READ_ONLY),
                   *(("mask", path) for path in PROC_MASKED))


def plan_jail(
    limits: Limits,
    host: HostSupport,
    profile: JailProfile,
    jail_dir: str,
    *,
    import_paths: Sequence[str] = (),
    cgroup: str | None = None,
    memory_cgroup: str | None = None,
    parent_pid: int = 0,
    landlock_abi: int | None = None,
    unsafe_skip: Sequence[str] = (),
    fail_at: str = "",
    host_id: int | None = None,
) -> HelperPlan:
    """The helper plan for one run. `cgroup` is the run's pids cgroup when
    the host's process limit is a cgroup; `host_id` the host uid and gid a
    root caller's jail runs as (anyone else's runs as its caller); None
    plans with the first of `ids.DEFAULT_RANGE` (the rules version hashes
    a placeholder for it).

    Raises:
        ValueError: the host has no process-limit mechanism, a namespace or
            a skipped layer is unknown, or the Landlock ABI is too old (for
            a profile sharing the host network: `landlock.HOST_NETWORK_FEATURES`).
    """
    limit = host.process_limit
    if limit is None:
        raise ValueError("no process-limit mechanism on this host")
    if host.is_root:
        uid = gid = DEFAULT_RANGE.start if host_id is None else host_id
    else:
        uid, gid = host.uid, host.gid
    if uid == 0 or gid == 0:
        raise ValueError("a jail never runs as host uid or gid 0")
    # The helper and the jail's pid 1 are trunner's, not the run's.
    processes = limits.processes + TRUNNER_PROCESSES
    process_limit: tuple[Literal["pids_cgroup", "userns_nproc", "rlimit_nproc"], str, int]
    if limit.kind == "pids_cgroup":
        process_limit = ("pids_cgroup", CGROUP if cgroup is None else cgroup, processes)
    else:
        process_limit = (limit.kind, "", processes)
    memory: tuple[Literal["memory_cgroup", "none"], str, int] = ("none", "", 0)
    if host.is_root and host.memory_cgroup_base:
        where = MEMORY_CGROUP if memory_cgroup is None else memory_cgroup
        memory = ("memory_cgroup", where, limits.memory_bytes)
    flags = 0
    for name in profile.namespaces:
        flags |= _NAMESPACE_FLAGS[name]
    # The helper's `ipc` step makes the IPC namespace (sized) before this unshare.
    flags &= ~_CLONE_NEWIPC
    missing = [name for name in REQUIRED_NAMESPACES if name not in profile.namespaces]
    if missing:
        raise ValueError(f"a jail always has its own {', '.join(missing)} namespace")
    unknown = sorted(set(unsafe_skip) - set(SKIPPABLE))
    if unknown:
        raise ValueError(f"cannot skip {unknown}")
    abi = min(host.landlock_abi if landlock_abi is None else landlock_abi, landlock.KNOWN_ABI)
    read_exec = resolve_paths(profile.read_exec)
    read_only = [*resolve_paths(profile.read_only), *import_paths]
    binds_ro = [p for p in [*read_exec, *read_only] if not _is_built(p)]
    if TRUNNER_PATH in profile.read_exec:
        # Its parent, on sys.path, must be listable; in the jail it holds
        # only mount points (the package, a venv), never the checkout.
        read_only.append(os.path.dirname(package_dir()))
    read_write = [WORKDIR, "/tmp", "/dev/shm", *resolve_paths(profile.read_write)]
    binds = [*binds_ro, *(p for p in read_write if not _is_built(p))]
    # Landlock stays on top of the binds, on the paths as the jail sees them.
    ruleset = landlock.plan_ruleset(
        abi,
        read_exec=read_exec,
        read_only=read_only,
        read_write=read_write,
        # The jail's root is its own (binds and built dirs): listing any dir
        # in it shows names only, as `ls /` in bubblewrap does.
        list_only=["/"],
        connect_tcp_ports=profile.tcp_connect_ports,
        host_network="net" not in profile.namespaces,
    )
    env = environment(jail_dir, profile.environment, import_paths)
    return HelperPlan(
        env=tuple(sorted(env)),
        process_limit=process_limit,
        jail_nproc=processes if host.nproc_per_userns else 0,
        memory=memory,
        rlimits=rlimits_for(limits),
        ipc_limits=ipc_limits_for(limits),
        build_userns=not host.is_root,
        unshare_flags=flags,
        uid=uid,
        gid=gid,
        jail_id=JAIL_ID,
        root_ops=root_ops(binds),
        proc_ops=PROC_OPS,
        scratch=(limits.scratch_bytes, max(1024, limits.scratch_bytes // 4096)),
        staging=STAGING,
        hostname=HOSTNAME,
        workdir=WORKDIR,
        landlock=ruleset,
        parent_pid=parent_pid,
        seccomp_bpf=seccomp.build_bpf(profile.seccomp),
        unsafe_skip=tuple(sorted(set(unsafe_skip))),
        fail_at=fail_at,
    )


def encode_plan(plan: HelperPlan) -> str:
    """The helper's plan argv item: hex of a marshal dict of plain values."""
    data: dict[str, Any] = msgspec.structs.asdict(plan)
    data["landlock"] = plan.landlock.install_args()
    data = msgspec.to_builtins(data, builtin_types=(bytes,))
    return marshal.dumps(data).hex()


def hashed_plan(plan: HelperPlan, env: Mapping[str, str], jail_dir: str) -> dict[str, Any]:
    """The plan and environment as hashed: per-run values (jail dir,
    cgroups, parent pid, host uid and gid) and install locations replaced
    by placeholders (so any clone of the same rules, and any two concurrent
    runs, have the same version)."""
    names = {jail_dir: JAIL_DIR, trunner_dir(): TRUNNER_PATH}
    names.update((path, PYTHON_PATHS) for path in python_paths())

    def name(value: object) -> object:
        if not isinstance(value, str):
            return value
        if value in names:
            return names[value]
        for path, placeholder in names.items():  # inside an install location
            if value.startswith(path.rstrip("/") + "/"):
                return placeholder + value[len(path.rstrip("/")):]
        return value

    rules = plan.landlock
    path_rules = sorted({(name(path), access) for path, access in rules.path_rules})
    data: dict[str, Any] = msgspec.structs.asdict(plan)
    data["landlock"] = msgspec.structs.replace(rules, path_rules=tuple(path_rules))
    # Sorted: the order of the binds follows where the install lives (a
    # checkout under /tmp sorts apart from one under /work); the set is what
    # the placeholders make the same.
    data["root_ops"] = sorted((op, name(a) if op == "bind" else a, name(b), n)
                              for op, a, b, n in plan.root_ops)
    if plan.process_limit[0] == "pids_cgroup":
        data["process_limit"] = ("pids_cgroup", CGROUP, plan.process_limit[2])
    if plan.memory[0] == "memory_cgroup":
        data["memory"] = ("memory_cgroup", MEMORY_CGROUP, plan.memory[2])
    data["parent_pid"] = 0
    data["uid"], data["gid"] = HOST_UID, HOST_GID
    data["env"] = {key: name(value) for key, value in env.items()}
    return data
