"""Parent side: the one plan the helper enforces, typed, and its one encoding.

`plan_jail` is pure: from the limits, the host facts (`probe.HostSupport`,
`probe.HostPaths`), the profile and the per-run values, it resolves every
number, path and BPF byte the helper will apply, as a `HelperPlan` of
tagged structs. `plain` turns it into plain values (dicts, lists, ints,
str, bytes), the one form both uses take: the helper gets them as one argv
item (`encode_plan`: hex of marshal, which the helper has built in), and
the rules version hashes the same values (`hashed_plan`), with per-run
values (cgroups, parent pid, host uid and gid) and install locations
replaced by placeholders: what is hashed is exactly what is enforced.
"""

from __future__ import annotations

import fnmatch
import marshal
import math
import os
import resource
from typing import TYPE_CHECKING, Any, Final

import msgspec

from trunner.kernel import abi
from trunner.limits import AUTO, AUTO_ADDRESS_SPACE_BYTES, file_size_for
from trunner.linux import landlock, seccomp
from trunner.linux.binds import shadow_refusal
from trunner.linux.ids import DEFAULT_RANGE
from trunner.linux.image import ETC_LAYER, TRUNNER_DIR, VENV, in_host
from trunner.linux.profile import PYTHON_PATHS, TRUNNER_PATH, JailProfile

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trunner.jail import HostSupport
    from trunner.limits import Limits
    from trunner.linux.binds import HostBind
    from trunner.linux.image import HostInterpreter, ImageFacts
    from trunner.linux.probe import HostPaths

#: Placeholders for per-run values in the hashed plan.
CGROUP: Final = "@cgroup"
MEMORY_CGROUP: Final = "@memory_cgroup"
CPU_CGROUP: Final = "@cpu_cgroup"
VIEW_CGROUP: Final = "@view_cgroup"
#: The run's host uid and gid: a root caller's is per run (`ids.HostIds`),
#: anyone else's the caller's; neither is part of the rules.
HOST_UID: Final = "@uid"
HOST_GID: Final = "@gid"

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
#: loader's cache, time zone, name-service and TLS configuration, and
#: OpenJDK's conf (its conf/security/java.security links there: javac,
#: `java Main.java` and SecureRandom need it; Debian's and Ubuntu's
#: /etc/java-17-openjdk, Fedora's /etc/java/java-17-openjdk). Of /etc/ssl
#: only the certificates and openssl.cnf: never its private/ (keys, group
#: ssl-cert). Never /etc whole: no shadow, no ssh keys, no host passwd. A
#: `*` matches within one name (`probe.snapshot` expands it on the host).
ETC_FILES: Final = (
    "/etc/alternatives", "/etc/ca-certificates", "/etc/ca-certificates.conf",
    "/etc/crypto-policies",
    "/etc/gai.conf", "/etc/host.conf", "/etc/java-*-openjdk", "/etc/java/java-*-openjdk",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/etc/localtime", "/etc/mime.types", "/etc/networks", "/etc/nsswitch.conf", "/etc/os-release",
    "/etc/pki", "/etc/protocols", "/etc/services", "/etc/ssl/certs", "/etc/ssl/openssl.cnf",
    "/etc/timezone",
)
#: Device nodes bound from the host's /dev (bubblewrap's `--dev` list).
DEV_NODES: Final = ("full", "null", "random", "tty", "urandom", "zero")
#: The jail's own devpts instance, and /dev/ptmx a link into it.
PTS_DIR: Final = "/dev/pts"
#: Ptys one run may hold at once (devpts `max`): the host-wide kernel.pty.max
#: (4096 by default; kernel.pty.reserve of them kept for the host's own
#: instance) is shared by every instance, so a run takes at most this many.
PTY_MAX: Final = 64
#: /proc entries made read-only (runc's readonlyPaths).
PROC_READ_ONLY: Final = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
#: /proc entries hidden (runc's maskedPaths, plus the host's boot command line
#: and kernel build config, its OFD and flock locks, and the machine's boot id):
#: /dev/null over files, an empty read-only tmpfs over directories. /proc/stat,
#: /proc/loadavg and /proc/pressure stay: ps and top read them (docs/jail.md:
#: what it still sees of the host).
PROC_MASKED: Final = (
    "/proc/acpi", "/proc/asound", "/proc/cmdline", "/proc/config.gz", "/proc/interrupts",
    "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/locks", "/proc/sched_debug",
    "/proc/scsi", "/proc/sys/kernel/random/boot_id", "/proc/timer_list", "/proc/timer_stats",
)
#: Paths the jail builds itself; a profile naming them means the built one.
#: (Host paths inside /tmp or /etc are bound there.)
_BUILT: Final = ("/dev", "/etc", "/proc", "/tmp", WORKDIR)

#: The uid and gid every jail has inside its user namespace, whatever its
#: host ids: one value in every run (`trunner` in the jail's /etc/passwd).
#: Not 65534: that is the overflow id host files of unmapped users show as.
JAIL_ID: Final = 1000
#: Processes of every run that are trunner's own: the helper (waiting
#: outside the PID namespace) and the jail's pid 1 (its reaper).
TRUNNER_PROCESSES: Final = 2


class _Item(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A plan item: named fields, no positions."""


# -- the process limit and memory: one kind each -------------------------------

class PidsCgroup(_Item, frozen=True, tag="pids_cgroup", tag_field="kind"):
    """As root: the run's own pids cgroup, `pids.max` = `max`."""

    cgroup: str
    max: int


class UsernsNproc(_Item, frozen=True, tag="userns_nproc", tag_field="kind"):
    """Not root, kernel 5.14 on: RLIMIT_NPROC counted per user namespace
    (the plan's `jail_nproc`) is the bound."""

    max: int


class RlimitNproc(_Item, frozen=True, tag="rlimit_nproc", tag_field="kind"):
    """Not root, older kernels: the uid's tasks at spawn + `max` - 1."""

    max: int


ProcessLimitPlan = PidsCgroup | UsernsNproc | RlimitNproc


class MemoryCgroup(_Item, frozen=True, tag="memory_cgroup", tag_field="kind"):
    """Where the host has a memory controller: the run's cgroup. Its `prog`
    leaf (the program) is bounded by `bytes`, and on cgroup v1 its socket
    buffers by `socket_bytes` besides (`memory.kmem.tcp.limit_in_bytes`, a
    counter of its own: TCP and UDP alike; on v2 they count in `bytes`).
    The run's whole cgroup is bounded by the parent (`run_bound`). With
    `peak`, the helper hands the exec adapter `prog`'s peak file where the
    kernel keeps one; without (cgroup v2 before 5.19 has none; tests plan
    that on any kernel), the parent samples `prog`'s current memory."""

    cgroup: str
    bytes: int
    socket_bytes: int
    peak: bool = True


class NoMemoryCgroup(_Item, frozen=True, tag="none", tag_field="kind"):
    """No memory cgroup: RLIMIT_AS per process, the scratch size and the IPC sizes."""


MemoryPlan = MemoryCgroup | NoMemoryCgroup


class CpuCgroup(_Item, frozen=True, tag="cpu_cgroup", tag_field="kind"):
    """The run's CPU accounting cgroup (v1 cpuacct; on v2 the run's one
    cgroup): its `prog` leaf's CPU time is the program's whole tree's.
    `views`: v1 cpu and cpuset cgroups of the run's, without leaves or
    limits (default shares, the caller's cpus), which the helper joins for
    the jail's view alone."""

    cgroup: str
    views: tuple[str, ...] = ()


class NoCpuCgroup(_Item, frozen=True, tag="none", tag_field="kind"):
    """No cgroup: the program's CPU time is polled from /proc and rusage."""


CpuPlan = CpuCgroup | NoCpuCgroup


class InSession(_Item, frozen=True, tag="session", tag_field="kind"):
    """A command in a live session: the helper joins the namespaces of the
    session's pid 1 (host pid and start time: a reused pid is refused)
    instead of making them and the root (`abi.SESSION_JOINED`)."""

    pid: int
    start: int


class NoSession(_Item, frozen=True, tag="none", tag_field="kind"):
    """A jail of its own."""


SessionPlan = InSession | NoSession

#: What the run's cgroup holds beyond its program's `memory_bytes` and the
#: output caps: the helper, pid 1 and the adapter's interpreter (measured:
#: tests/test_accounting.py).
ADAPTER_ALLOWANCE_BYTES: Final = 64 << 20


def run_bound(memory_bytes: int, stdout_max_bytes: int, stderr_max_bytes: int,
              request_bytes: int = 0) -> int:
    """The bound of a run's whole cgroup, set by the parent: its program's,
    the output caps twice (the adapter's buffers and its reply), three
    times the request (the frame, its decoded copy, the placed files; added
    before the request is written) and `ADAPTER_ALLOWANCE_BYTES`."""
    return (memory_bytes + 2 * (stdout_max_bytes + stderr_max_bytes) + 3 * request_bytes
            + ADAPTER_ALLOWANCE_BYTES)


class Rlimit(_Item, frozen=True):
    resource: int
    soft: int
    hard: int


class Sysctl(_Item, frozen=True):
    """A value written under /proc/sys/kernel in the run's IPC namespace."""

    name: str
    value: str


# -- the jail's root: one op each ----------------------------------------------

class Scratch(_Item, frozen=True, tag="scratch", tag_field="op"):
    """A dir `name` of the run's scratch tmpfs, bound on `path`."""

    name: str
    path: str
    mode: int


class Bind(_Item, frozen=True, tag="bind", tag_field="op"):
    """The host's `source` bound on `path`, read-only unless `flags` says."""

    source: str
    path: str
    flags: int = 0


class Dir(_Item, frozen=True, tag="dir", tag_field="op"):
    path: str
    mode: int


class Symlink(_Item, frozen=True, tag="symlink", tag_field="op"):
    target: str
    path: str


class File(_Item, frozen=True, tag="file", tag_field="op"):
    content: str
    path: str
    mode: int


class HostProc(_Item, frozen=True, tag="host_proc", tag_field="op"):
    """The host's /proc, until pid 2 mounts the jail's own over it."""

    path: str


class MaskSocket(_Item, frozen=True, tag="mask_socket", tag_field="op"):
    """What a bind would show at `path` hidden, after every bind: an empty
    file over a unix socket (a connect answers ECONNREFUSED), an empty
    read-only tmpfs over a directory the parent could not list
    (`trunner.linux.sockets`). Gone since it was found: nothing to hide."""

    path: str


class Overlay(_Item, frozen=True, tag="overlay", tag_field="op"):
    """A read-only overlay on `path`: the root's dir `top` (made by the ops
    before it) over the host's dir `lower`, no upper layer (an image's
    /etc, with the jail's own files on top)."""

    path: str
    top: str
    lower: str


RootOp = Scratch | Bind | Dir | Symlink | File | HostProc | MaskSocket | Overlay


class Mask(_Item, frozen=True, tag="mask", tag_field="op"):
    path: str


class ReadOnly(_Item, frozen=True, tag="read_only", tag_field="op"):
    path: str


class Devpts(_Item, frozen=True, tag="devpts", tag_field="op"):
    """A private devpts instance on `path`, mounted by pid 2 in the jail's own
    user namespace: its ptys are the run's alone, none of the host's is in it.
    `ptmx_mode` is its ptmx's mode, `mode` each new pty's, `max` how many
    ptys the run may hold at once."""

    path: str
    ptmx_mode: int
    mode: int
    max: int


class CgroupView(_Item, frozen=True, tag="cgroup_view", tag_field="op"):
    """The program's own cgroup, shown read-only on `path` (pid 2 mounts
    `fstype` with `options` in the jail's cgroup namespace, rooted at the
    run's `prog`): runtimes that size themselves from their cgroup (the
    JVM, Node, Go's CPU quota) see their limits."""

    path: str
    fstype: str
    options: str


ProcOp = Mask | ReadOnly | Devpts | CgroupView

#: Where the jail shows its program's cgroup (`CgroupView`).
CGROUP_VIEW_DIR: Final = "/sys/fs/cgroup"


class ScratchSize(_Item, frozen=True):
    bytes: int
    inodes: int


class PathRule(_Item, frozen=True):
    """Landlock rights beneath `path`: on a directory, or on a file (the
    kernel refuses directory-only rights on a file)."""

    path: str
    dir_access: int
    file_access: int


class PortRule(_Item, frozen=True):
    port: int
    access: int


class LandlockPlan(_Item, frozen=True):
    """`landlock.LandlockRuleset`, as the helper installs it."""

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int
    paths: tuple[PathRule, ...]
    ports: tuple[PortRule, ...]

    @classmethod
    def of(cls, rules: landlock.LandlockRuleset) -> LandlockPlan:
        return cls(
            abi=rules.abi, handled_fs=rules.handled_fs, handled_net=rules.handled_net,
            scoped=rules.scoped,
            paths=tuple(PathRule(path=p, dir_access=a,
                                 file_access=landlock.path_rule_access(a, is_dir=False))
                        for p, a in rules.path_rules),
            ports=tuple(PortRule(port=p, access=a) for p, a in rules.port_rules),
        )


class HelperPlan(_Item, frozen=True, kw_only=True):
    """Everything one helper run applies, resolved. See `trunner.helper`;
    the fields are `abi.PLAN_FIELDS`, in that order."""

    version: int = abi.PLAN_VERSION
    #: The only environment names the helper accepts.
    env: tuple[str, ...]
    process_limit: ProcessLimitPlan
    #: RLIMIT_NPROC set in the jail's own user namespace, where the kernel
    #: counts it per user namespace (so per run); 0 on older kernels.
    jail_nproc: int
    memory: MemoryPlan
    cpu: CpuPlan
    #: CORE 0 included.
    rlimits: tuple[Rlimit, ...]
    #: The run's IPC namespace sizes (see `ipc_limits_for`), written by the
    #: helper into the namespace it makes for the run; `unshare_flags` then
    #: leaves CLONE_NEWIPC out.
    ipc_limits: tuple[Sysctl, ...]
    #: Not root: a user namespace of the caller's own to build the root in.
    build_userns: bool
    unshare_flags: int
    #: The host ids the jail runs as: a root caller's per-run id
    #: (`ids.HostIds`, uid == gid), anyone else's own.
    uid: int
    gid: int
    #: The one uid and gid the jail's user namespace maps them to (`JAIL_ID`).
    jail_id: int
    #: "up": the run's own network namespace, its loopback brought up by the
    #: helper (a refusal refuses the run); "host": the host's, shared.
    loopback: str
    #: The jail's root, built by `trunner.kernel.mounts.build_root`.
    root_ops: tuple[RootOp, ...]
    #: What pid 2 does to its fresh /proc, and its devpts.
    proc_ops: tuple[ProcOp, ...]
    #: The run's scratch tmpfs; holds WORKDIR, /tmp, /dev/shm.
    scratch: ScratchSize
    staging: str
    hostname: str
    workdir: str
    landlock: LandlockPlan
    parent_pid: int
    seccomp_bpf: bytes
    #: The waiting helper's and pid 1's own filter (`seccomp.waiter_bpf`).
    waiter_bpf: bytes
    #: Layers left out, for benchmarks that measure one layer at a time.
    unsafe_skip: tuple[str, ...] = ()
    #: What the program's stdio are (`abi.STDIO_KINDS`); hashed only when
    #: not "pipes", so the versions of plain runs stay as they were.
    stdio: str = "pipes"
    #: A session's command (`InSession`), or a jail of its own; hashed
    #: only in a session, without the per-session pid.
    session: SessionPlan = NoSession()


#: POSIX message queue bytes per run (RLIMIT_MSGQUEUE, the kernel's default;
#: Landlock refuses mq_open in the jail today, this bounds it if not).
MSGQUEUE_BYTES: Final = 819200
#: Queued signals and POSIX timers per run (RLIMIT_SIGPENDING), ~100-350
#: bytes of kernel memory each.
SIGPENDING: Final = 4096


#: prlimit64's RLIM_INFINITY, as `install.set_rlimit` takes it.
RLIM_INFINITY: Final = -1


def address_space_for(limits: Limits, *, memory_cgroup: bool) -> int:
    """RLIMIT_AS for `limits`: a number as given; "auto" none (RLIM_INFINITY)
    where the run has a memory cgroup, which bounds what it really uses,
    and `AUTO_ADDRESS_SPACE_BYTES` where nothing else bounds a process."""
    value = limits.address_space_bytes
    if value != AUTO:
        assert isinstance(value, int)
        return value
    return RLIM_INFINITY if memory_cgroup else AUTO_ADDRESS_SPACE_BYTES


def session_processes(limits: Limits) -> int:
    """A session's process bound: its programs' `processes` (one count
    for all its commands: RLIMIT_NPROC counts per user namespace), its own
    helper, pid 1 and pid 2, and trunner's two of each of the
    `abi.SESSION_COMMANDS` commands it may run at once."""
    return limits.processes + TRUNNER_PROCESSES + 1 + TRUNNER_PROCESSES * abi.SESSION_COMMANDS


def seccomp_policy_for(profile: JailProfile, host: HostSupport) -> seccomp.SeccompPolicy:
    """The jail's seccomp policy on `host`: the profile's, less what only a
    memory cgroup bounds where the run has none (`seccomp.without_memory_cgroup`:
    memfds and Landlock rulesets fail ENOSYS)."""
    if host.memory_cgroup_base:
        return profile.seccomp
    return seccomp.without_memory_cgroup(profile.seccomp)


def rlimits_for(limits: Limits, *, memory_cgroup: bool) -> tuple[Rlimit, ...]:
    """`Limits` to rlimits; units are converted here only, and "auto"
    resolved (`address_space_for`, `file_size_for`): the plan, and so the rules version,
    holds the number applied.

    SIGPENDING and MSGQUEUE are counted per (user namespace, uid) from
    kernel 5.14: set before the namespaces exist, they bound the run
    alone, and what it takes from the caller's own per-uid count."""
    def rlimit(res: int, soft: int, hard: int | None = None) -> Rlimit:
        return Rlimit(resource=res, soft=soft, hard=soft if hard is None else hard)

    return (
        # A per-process backstop of the whole tree's `cpu_time_s` (which the
        # exec adapter or the parent polls): SIGXCPU a whole second past the
        # next whole second, SIGKILL one second later. The kernel checks it
        # on tick-sampled time, which at ceil(cpu_time_s) itself fired before
        # the bound (0.93 s reported at 1 s): never first now.
        rlimit(resource.RLIMIT_CPU, math.ceil(limits.cpu_time_s) + 1,
               math.ceil(limits.cpu_time_s) + 2),
        rlimit(resource.RLIMIT_AS, address_space_for(limits, memory_cgroup=memory_cgroup)),
        rlimit(resource.RLIMIT_FSIZE, file_size_for(limits)),
        rlimit(resource.RLIMIT_NOFILE, limits.open_files),
        rlimit(resource.RLIMIT_CORE, 0),
        rlimit(resource.RLIMIT_SIGPENDING, SIGPENDING),
        rlimit(resource.RLIMIT_MSGQUEUE, MSGQUEUE_BYTES),
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


def ipc_limits_for(limits: Limits) -> tuple[Sysctl, ...]:
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
    values = (
        # SEMMSL SEMMNS SEMOPM SEMMNI
        ("sem", f"{min(semmns, _IPCMNI)} {semmns} 500 {semmni}"),
        ("msgmni", str(msgmni)),
        ("msgmnb", str(_MSGMNB)),
        ("msgmax", str(_MSGMAX)),
        ("shmall", str(shm_bytes // _PAGE)),
        ("shmmax", str(shm_bytes)),
        ("shmmni", "4096"),
    )
    return tuple(Sysctl(name=name, value=value) for name, value in values)


def environment(names: Sequence[str], import_paths: Sequence[str] = ()) -> dict[str, str]:
    """The whole environment of a jailed process: nothing is inherited."""
    known = {"PATH": _PATH, "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8"}
    env = {name: known[name] for name in names}
    if import_paths:
        env["PYTHONPATH"] = os.pathsep.join(import_paths)
    return env


def profile_paths(profile: JailProfile, import_paths: Sequence[str] = (),
                  etc: Sequence[str] = ()) -> list[str]:
    """Every host path a plan for `profile` may look at (`probe.snapshot`;
    a `*` in an /etc pattern is expanded there)."""
    named = [*profile.read_exec, *profile.read_only, *profile.read_write, *import_paths]
    return [p for p in named if p not in (PYTHON_PATHS, TRUNNER_PATH)] + [*ETC_FILES, *etc]


def etc_paths(host: HostPaths, etc: Sequence[str] = ()) -> list[str]:
    """The host's /etc entries the jail holds: `ETC_FILES` (patterns
    matched within one name) and the caller's `etc`, those the host has,
    the outermost of nested ones."""
    found: list[str] = []
    for pattern in (*ETC_FILES, *etc):
        depth = pattern.count("/")
        found += [path for path, entry in host.entries.items()
                  if entry.kind != "missing" and path.count("/") == depth
                  and fnmatch.fnmatchcase(path, pattern)]
    return _outermost(found)


def built_paths() -> tuple[str, ...]:
    """The paths the jail makes itself: no bind may hold or land in them."""
    return (*_BUILT, CGROUP_VIEW_DIR)


def bind_refusal(binds: Sequence[HostBind], profile: JailProfile, host: HostPaths,
                 import_paths: Sequence[str] = ()) -> str | None:
    """Why the caller's `binds` cannot be planned with `profile` on `host`
    (`binds.shadow_refusal`), or None."""
    named = [*profile.read_exec, *profile.read_only, *profile.read_write]
    bound = [p for p in resolve_paths(named, host) if not _is_built(p)]
    return shadow_refusal(binds, built_paths(), [*bound, *import_paths])


def image_refusal(image: ImageFacts, interpreter: HostInterpreter | None,
                  profile: JailProfile, binds: Sequence[HostBind], etc: Sequence[str],
                  import_paths: Sequence[str] = ()) -> str | None:
    """Why a jail on `image` cannot be planned with these, or None: no
    interpreter facts; `etc` (the image's /etc is the jail's: put the
    files in the image); a profile sharing the host network (its extra
    read-only host paths have no place in an image); a bind or import path
    on /.trunner, or on or above one of the image's top-level entries (one
    may lie inside them: where the image has the dir, `backend` checks)."""
    if interpreter is None:
        return "root=: no facts about the host's interpreter"
    if etc:
        return ("etc= with root=: the jail's /etc is the image's own (with its passwd, group,"
                " hosts and hostname on top): put the entries in the image's /etc")
    if "net" not in profile.namespaces:
        return f"root= with the {profile.name} profile: not supported (it shares the host network)"
    tops = [f"/{e.name}" for e in image.entries]
    # An import path is bound at its own path, as such a bind is.
    every = [*binds, *((path, path) for path in import_paths)]
    return shadow_refusal(every, [*built_paths(), TRUNNER_DIR, *tops], (),
                          scratch=("/tmp", *tops))


def resolve_paths(paths: Sequence[str], host: HostPaths) -> list[str]:
    """Expand the profile's symbolic paths; drop system paths this host lacks
    (e.g. no /lib64), which cannot then be reached anyway."""
    out: list[str] = []
    for path in paths:
        if path == PYTHON_PATHS:
            out += host.python
        elif path == TRUNNER_PATH:
            out += [host.package, *host.beside]
        elif host.kind(path) != "missing":
            out.append(path)
    return out


def _outermost(paths: Sequence[str], keep: str = "") -> list[str]:
    """Sorted, with every path inside another one dropped (one bind covers
    it), except `keep`, which stays a bind of its own wherever it is."""
    out: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths}):
        if path == keep or not any(
                path == kept or path.startswith(kept.rstrip("/") + "/") for kept in out):
            out.append(path)
    return out


def _is_built(path: str) -> bool:
    return path in _BUILT or path.startswith(("/dev/", "/proc/", CGROUP_VIEW_DIR))


def _identity() -> tuple[str, str]:
    """/etc/passwd and /etc/group of the jail: its own user (`trunner`,
    `JAIL_ID` whatever its host uid, so the same in every run) and nobody."""
    passwd = (f"trunner:x:{JAIL_ID}:{JAIL_ID}:trunner:{WORKDIR}:/bin/sh\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    return passwd, f"trunner:x:{JAIL_ID}:\nnogroup:x:65534:\n"


def cgroup_views(host: HostSupport) -> tuple[tuple[CgroupView, ...], tuple[RootOp, ...]]:
    """The program's cgroup as the jail shows it (`host.cgroup_views`: v2
    one cgroup2 mount; v1 each hierarchy the run has a cgroup of its own
    in, with a link for each of a co-mounted hierarchy's controllers), and
    the root's mount points and links for them. None where the run has no
    cgroup: never a hierarchy not rooted at the run's own."""
    views: list[CgroupView] = []
    ops: list[RootOp] = []
    for fstype, options in host.cgroup_views:
        if fstype == "cgroup2":
            views.append(CgroupView(path=CGROUP_VIEW_DIR, fstype=fstype, options=""))
            ops.append(Dir(path=CGROUP_VIEW_DIR, mode=0o555))
            continue
        path = f"{CGROUP_VIEW_DIR}/{options}"
        views.append(CgroupView(path=path, fstype=fstype, options=options))
        ops.append(Dir(path=path, mode=0o555))
        controllers = options.split(",")
        if len(controllers) > 1:  # cpu,cpuacct: `cpu` and `cpuacct` link to it, as on hosts
            ops.extend(Symlink(target=options, path=f"{CGROUP_VIEW_DIR}/{c}")
                       for c in controllers)
    return tuple(views), tuple(ops)


def _scratch_ops() -> list[RootOp]:
    return [
        Scratch(name="work", path=WORKDIR, mode=0o700),
        Scratch(name="tmp", path="/tmp", mode=0o1777),
        Scratch(name="shm", path="/dev/shm", mode=0o1777),
    ]


def _identity_files(etc: str = "/etc") -> list[RootOp]:
    """The jail's own passwd, group, hosts and hostname, in `etc`."""
    passwd, group = _identity()
    return [
        File(content=passwd, path=f"{etc}/passwd", mode=0o644),
        File(content=group, path=f"{etc}/group", mode=0o644),
        File(content=f"127.0.0.1 localhost\n::1 localhost\n127.0.1.1 {HOSTNAME}\n",
             path=f"{etc}/hosts", mode=0o644),
        File(content=HOSTNAME + "\n", path=f"{etc}/hostname", mode=0o644),
    ]


def _dev_and_proc_ops() -> list[RootOp]:
    ops: list[RootOp] = [Bind(source=f"/dev/{name}", path=f"/dev/{name}",
                              flags=abi.BIND_WRITABLE | abi.BIND_DEVICE) for name in DEV_NODES]
    ops += [Dir(path=PTS_DIR, mode=0o755), Symlink(target="pts/ptmx", path="/dev/ptmx")]
    ops.append(Symlink(target="/proc/self/fd", path="/dev/fd"))
    ops += [Symlink(target=f"/proc/self/fd/{fd}", path=f"/dev/{name}")
            for fd, name in enumerate(("stdin", "stdout", "stderr"))]
    ops.append(HostProc(path="/proc"))
    return ops


def root_ops(binds: Sequence[str], host: HostPaths, *, moved: Sequence[HostBind] = (),
             etc: Sequence[str] = ()) -> tuple[RootOp, ...]:
    """The operations that build the jail's root: scratch dirs first (binds
    may land inside /tmp), then read-only binds of `binds` (host paths; a
    symlink such as /bin -> usr/bin is recreated, its target bound) and of
    `moved` ((host dir, target) pairs), the short /etc (`etc_paths`; a
    symlink recreated, never followed), the synthesized identity files,
    /dev and the host's /proc (pid 2 mounts the jail's own over it:
    `PROC_OPS`)."""
    ops = _scratch_ops()
    links: list[RootOp] = []
    real: list[str] = []
    for path in binds:
        entry = host.entries.get(path)
        if entry is not None and entry.kind == "symlink":
            links.append(Symlink(target=entry.target, path=path))
            real.append(entry.real)
        else:
            real.append(path)
    # The package is bound on its own even inside the interpreter's prefix (a
    # wheel in a venv), as in an editable checkout: the same rules version.
    ops += [Bind(source=path, path=path) for path in _outermost(real, keep=host.package)]
    ops += [Bind(source=source, path=target) for source, target in sorted(moved)]
    ops += links
    ops.append(Dir(path="/etc", mode=0o755))
    for path in etc_paths(host, etc):
        entry = host.entries[path]
        if entry.kind == "symlink":
            ops.append(Symlink(target=entry.target, path=path))
        else:
            ops.append(Bind(source=path, path=path))
    ops += _identity_files()
    ops += _dev_and_proc_ops()
    return tuple(ops)


def host_code_dirs(host: HostPaths, interpreter: HostInterpreter) -> list[str]:
    """The host dirs an image's jail binds under `image.HOST_PREFIX`: /usr
    and the real /lib* dirs (the loader and the libraries), the
    interpreter's prefixes but its venv (its site-packages are trunner's
    venv's), trunner's package and what it imports beside it."""
    python = [p for p in host.python if p != interpreter.venv]
    return _outermost([*interpreter.system_dirs, *python, host.package, *host.beside],
                      keep=host.package)


def image_root_ops(image: ImageFacts, interpreter: HostInterpreter, host: HostPaths,
                   same_path: Sequence[str], moved: Sequence[HostBind]) -> tuple[RootOp, ...]:
    """The root of an image's jail: the scratch dirs; the image's top-level
    entries (`image.IMAGE_SKIPPED` aside) bound read-only at `/`, its links
    recreated; the host's code under `image.HOST_PREFIX` (`host_code_dirs`)
    and trunner's venv (a pyvenv.cfg naming the host's interpreter there,
    the host venv's site-packages); the caller's binds and import paths
    (`same_path`, `moved`) as without an image; /etc the image's own under
    a read-only overlay whose top layer holds the jail's passwd, group,
    hosts and hostname and an empty ld.so.preload (the image's is never
    loaded into the host's interpreter); /dev and /proc as always."""
    ops = _scratch_ops()
    for entry in image.entries:
        path = "/" + entry.name
        if entry.kind == "symlink":
            ops.append(Symlink(target=entry.target, path=path))
        else:
            ops.append(Bind(source=f"{image.path}/{entry.name}", path=path))
    ops += [Bind(source=path, path=in_host(path))
            for path in host_code_dirs(host, interpreter)]
    if interpreter.venv_site:
        home = in_host(os.path.dirname(interpreter.python))
        ops.append(File(content=(f"home = {home}\ninclude-system-site-packages = false\n"
                                 f"version = {interpreter.version}\n"),
                        path=f"{VENV}/pyvenv.cfg", mode=0o644))
        ops += [Bind(source=source, path=f"{VENV}/{below}")
                for source, below in interpreter.venv_site]
    ops += [Bind(source=path, path=path) for path in _outermost(same_path)]
    ops += [Bind(source=source, path=target) for source, target in sorted(moved)]
    ops += [*_identity_files(ETC_LAYER),
            File(content="", path=f"{ETC_LAYER}/ld.so.preload", mode=0o644),
            Overlay(path="/etc", top=ETC_LAYER, lower=f"{image.path}/etc")]
    ops += _dev_and_proc_ops()
    return tuple(ops)


#: What pid 2 does to the jail's fresh /proc, then its own devpts (ptmx 0666,
#: as containers have it: any jailed process may open a pty; each pty 0620).
PROC_OPS: Final[tuple[ProcOp, ...]] = (*(ReadOnly(path=path) for path in PROC_READ_ONLY),
                                       *(Mask(path=path) for path in PROC_MASKED),
                                       Devpts(path=PTS_DIR, ptmx_mode=0o666, mode=0o620,
                                              max=PTY_MAX))


def plan_jail(
    limits: Limits,
    host: HostSupport,
    paths: HostPaths,
    profile: JailProfile,
    *,
    import_paths: Sequence[str] = (),
    binds: Sequence[HostBind] = (),
    etc: Sequence[str] = (),
    cgroup: str = CGROUP,
    memory_cgroup: str = MEMORY_CGROUP,
    cpu_cgroup: str = CPU_CGROUP,
    parent_pid: int = 0,
    landlock_abi: int | None = None,
    unsafe_skip: Sequence[str] = (),
    host_id: int | None = None,
    seccomp_bpf: bytes | None = None,
    sample_memory: bool = False,
    image: ImageFacts | None = None,
    interpreter: HostInterpreter | None = None,
) -> HelperPlan:
    """The helper plan for one run, from what is passed in only. `cgroup`
    and `memory_cgroup` are the run's cgroups where the host's process
    limit and memory bound are cgroups; `host_id` the host uid and gid a
    root caller's jail runs as (anyone else's runs as its caller); None
    plans with the first of `ids.DEFAULT_RANGE` (the rules version hashes
    a placeholder for it). `seccomp_bpf` is `seccomp_policy_for(profile,
    host)` compiled (by default, here). `binds`: the caller's (host dir,
    target) pairs (`binds.parse_binds`), read+exec at their target; `etc`:
    the caller's /etc entries beside `ETC_FILES`. `image`: the jail's system
    root is that tree (`image_root_ops`; `interpreter` says how the host's
    interpreter starts there); `etc` must then be empty.

    Raises:
        ValueError: the host has no process-limit mechanism, a namespace or
            a skipped layer is unknown, the Landlock ABI is too old (for
            a profile sharing the host network: `landlock.HOST_NETWORK_FEATURES`),
            or a bind would shadow the jail's paths (`bind_refusal`).
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
    process_limit: ProcessLimitPlan
    if limit.kind == "pids_cgroup":
        process_limit = PidsCgroup(cgroup=cgroup, max=processes)
    elif limit.kind == "userns_nproc":
        process_limit = UsernsNproc(max=processes)
    else:
        process_limit = RlimitNproc(max=processes)
    memory: MemoryPlan = NoMemoryCgroup()
    if host.memory_cgroup_base:
        memory = MemoryCgroup(cgroup=memory_cgroup, bytes=limits.memory_bytes,
                              socket_bytes=limits.memory_bytes, peak=not sample_memory)
    cpu: CpuPlan = NoCpuCgroup()
    if host.cpu_cgroup_base:
        cpu = CpuCgroup(cgroup=cpu_cgroup,
                        views=tuple(VIEW_CGROUP for _ in host.view_cgroup_bases))
    flags = 0
    for name in profile.namespaces:
        flags |= abi.NAMESPACE_FLAGS[name]
    # The helper's `ipc` step makes the IPC namespace (sized) before this unshare.
    flags &= ~abi.CLONE_NEWIPC
    missing = [name for name in REQUIRED_NAMESPACES if name not in profile.namespaces]
    if missing:
        raise ValueError(f"a jail always has its own {', '.join(missing)} namespace")
    unknown = sorted(set(unsafe_skip) - set(abi.SKIPPABLE))
    if unknown:
        raise ValueError(f"cannot skip {unknown}")
    if image is None:
        refusal = bind_refusal(binds, profile, paths, import_paths)
    else:
        refusal = image_refusal(image, interpreter, profile, binds, etc, import_paths)
    if refusal is not None:
        raise ValueError(refusal)
    ll_abi = min(host.landlock_abi if landlock_abi is None else landlock_abi, landlock.KNOWN_ABI)
    if image is None:
        read_exec = [*resolve_paths(profile.read_exec, paths), *(target for _, target in binds)]
        read_only = [*resolve_paths(profile.read_only, paths), *import_paths]
    else:
        assert interpreter is not None  # image_refusal said so otherwise
        # The image's dirs read and exec; of the host's code under
        # HOST_PREFIX only the loader file execs (the interpreter and its
        # libraries it maps, which Landlock does not gate), the rest reads.
        read_exec = [*(f"/{e.name}" for e in image.entries if e.kind == "dir"),
                     in_host(interpreter.loader), *(target for _, target in binds)]
        read_only = [*(f"/{e.name}" for e in image.entries if e.kind == "file"),
                     TRUNNER_DIR, *resolve_paths(profile.read_only, paths), *import_paths]
    views, view_dirs = cgroup_views(host)
    if views:
        read_only.append(CGROUP_VIEW_DIR)
    moved = [(source, target) for source, target in binds if source != target]
    if image is None:
        binds_ro = [p for p in [*read_exec, *read_only]
                    if not _is_built(p) and p not in {t for _, t in moved}]
    else:
        binds_ro = [*import_paths, *(target for source, target in binds if source == target)]
    if TRUNNER_PATH in profile.read_exec and image is None:
        # Its parent, on sys.path, must be listable; in the jail it holds
        # only mount points (the package, a venv), never the checkout.
        read_only.append(os.path.dirname(paths.package))
    read_write = [WORKDIR, "/tmp", "/dev/shm", *resolve_paths(profile.read_write, paths)]
    same_path = [*binds_ro, *(p for p in read_write if not _is_built(p))]
    if image is None:
        ops = root_ops(same_path, paths, moved=moved, etc=etc)
    else:
        assert interpreter is not None
        ops = image_root_ops(image, interpreter, paths, same_path, moved)
    # Landlock stays on top of the binds, on the paths as the jail sees them.
    ruleset = landlock.plan_ruleset(
        ll_abi,
        read_exec=read_exec,
        read_only=read_only,
        read_write=read_write,
        # The jail's root is its own (binds and built dirs): listing any dir
        # in it shows names only, as `ls /` in bubblewrap does.
        list_only=["/"],
        # The run's own ptys, and /dev/tty (the controlling one, which can only be one
        # of them): read, write and ioctl (seccomp's list bounds the requests).
        ttys=[PTS_DIR, "/dev/tty"],
        connect_tcp_ports=profile.tcp_connect_ports,
        host_network="net" not in profile.namespaces,
        # A network namespace of its own holds only the run's loopback: its
        # servers and clients bind and connect there; Landlock's TCP rules
        # are the provider's, which shares the host's.
        handle_tcp="net" not in profile.namespaces,
    )
    env = environment(profile.environment, import_paths)
    return HelperPlan(
        env=tuple(sorted(env)),
        process_limit=process_limit,
        jail_nproc=processes if host.nproc_per_userns else 0,
        memory=memory,
        cpu=cpu,
        rlimits=rlimits_for(limits, memory_cgroup=isinstance(memory, MemoryCgroup)),
        ipc_limits=ipc_limits_for(limits),
        build_userns=not host.is_root,
        unshare_flags=flags,
        uid=uid,
        gid=gid,
        jail_id=JAIL_ID,
        loopback=abi.LOOPBACK_UP if flags & abi.CLONE_NEWNET else abi.LOOPBACK_HOST,
        root_ops=(*ops, *view_dirs),
        proc_ops=(*PROC_OPS, *views),
        scratch=ScratchSize(bytes=limits.scratch_bytes,
                            inodes=max(1024, limits.scratch_bytes // 4096)),
        staging=STAGING,
        hostname=HOSTNAME,
        workdir=WORKDIR,
        landlock=LandlockPlan.of(ruleset),
        parent_pid=parent_pid,
        seccomp_bpf=(seccomp.build_bpf(seccomp_policy_for(profile, host))
                     if seccomp_bpf is None else seccomp_bpf),
        waiter_bpf=seccomp.waiter_bpf(),
        unsafe_skip=tuple(sorted(set(unsafe_skip))),
    )


def with_masks(plan: HelperPlan, paths: Sequence[str]) -> HelperPlan:
    """`plan` with `paths` (sockets and unlistable dirs its binds show, as
    `trunner.linux.sockets` found them) masked, after every other root op."""
    if not paths:
        return plan
    masks = tuple(MaskSocket(path=path) for path in sorted(set(paths)))
    return msgspec.structs.replace(plan, root_ops=(*plan.root_ops, *masks))


def for_run(plan: HelperPlan, *, cgroup: str | None, memory_cgroup: str | None,
            host_id: int | None, parent_pid: int, cpu_cgroup: str | None = None,
            view_cgroups: tuple[str, ...] = ()) -> HelperPlan:
    """`plan` (planned once per `Limits`) with one run's own values."""
    changes: dict[str, object] = {"parent_pid": parent_pid}
    if isinstance(plan.process_limit, PidsCgroup) and cgroup is not None:
        changes["process_limit"] = msgspec.structs.replace(plan.process_limit, cgroup=cgroup)
    if isinstance(plan.memory, MemoryCgroup) and memory_cgroup is not None:
        changes["memory"] = msgspec.structs.replace(plan.memory, cgroup=memory_cgroup)
    if isinstance(plan.cpu, CpuCgroup) and cpu_cgroup is not None:
        changes["cpu"] = msgspec.structs.replace(plan.cpu, cgroup=cpu_cgroup,
                                                 views=view_cgroups or plan.cpu.views)
    if host_id is not None:
        changes["uid"] = changes["gid"] = host_id
    return msgspec.structs.replace(plan, **changes)


def plain(plan: HelperPlan) -> dict[str, Any]:
    """The plan as plain values: what the helper reads and what is hashed."""
    data: dict[str, Any] = msgspec.to_builtins(plan, builtin_types=(bytes,))
    return data


def encode_plan(plan: HelperPlan) -> str:
    """The helper's plan argv item: hex of marshal of `plain(plan)`."""
    return marshal.dumps(plain(plan)).hex()


def hashed_plan(data: dict[str, Any], host: HostPaths, env: dict[str, str]) -> dict[str, Any]:
    """Plain plan values as hashed: per-run values (cgroups, parent pid,
    host uid and gid) and install locations (the interpreter's prefixes,
    trunner's dir; the longest first) replaced by placeholders, so that any
    clone of the same rules, and any two concurrent runs, have the same
    version; the root's ops and the Landlock path rules sorted (their order
    follows where the install lives). `env` is the jail's environment, hashed beside the plan."""
    names = {host.trunner_dir: TRUNNER_PATH, **dict.fromkeys(host.python, PYTHON_PATHS)}
    # An image's jail shows them under HOST_PREFIX.
    names.update({in_host(path): in_host(name) for path, name in names.items()})
    prefixes = sorted(names, key=len, reverse=True)

    def name(value: object) -> object:
        if isinstance(value, str):
            for path in prefixes:
                if value == path or value.startswith(path.rstrip("/") + "/"):
                    return names[path] + value[len(path.rstrip("/")):]
            return value
        if isinstance(value, dict):
            return {key: name(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [name(item) for item in value]
        return value

    out: dict[str, Any] = name(data)  # type: ignore[assignment]
    # Their order follows where the install lives; a ruleset is a set.
    by_value = msgspec.msgpack.Encoder(order="sorted").encode
    for op in out["root_ops"]:
        if op["op"] == "file":  # trunner's venv's pyvenv.cfg names the interpreter's dir
            for path in prefixes:
                op["content"] = op["content"].replace(path, names[path])
    out["root_ops"] = sorted(out["root_ops"], key=by_value)
    out["landlock"]["paths"] = sorted(out["landlock"]["paths"], key=by_value)
    if out["process_limit"]["kind"] == "pids_cgroup":
        out["process_limit"]["cgroup"] = CGROUP
    if out["memory"]["kind"] == "memory_cgroup":
        out["memory"]["cgroup"] = MEMORY_CGROUP
    if out["cpu"]["kind"] == "cpu_cgroup":
        out["cpu"]["cgroup"] = CPU_CGROUP
        out["cpu"]["views"] = [VIEW_CGROUP for _ in out["cpu"]["views"]]
    out["parent_pid"] = 0
    if out["stdio"] == "pipes":  # the default, as before the field existed
        del out["stdio"]
    if out["session"]["kind"] == "none":  # likewise
        del out["session"]
    else:
        out["session"] = {"kind": out["session"]["kind"]}
    out["uid"], out["gid"] = HOST_UID, HOST_GID
    out["env"] = name(env)
    return out

