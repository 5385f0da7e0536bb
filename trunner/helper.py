"""The sandbox helper: the single-threaded first stage of every jailed spawn.

Runs between spawn and exec as `trunner-worker helper PLAN FD -- ADAPTER...`,
where PLAN is one hex argv item, the marshal of the plan's plain values
(`trunner.linux.plan`), and FD the write end of the report pipe. The plan
is read once, before any step, into a `Plan`: its fields exactly
`abi.PLAN_FIELDS`, each checked, each item an instance of the slots class
of its kind (here; the root's and /proc's ops in `mounts`), so the steps
read typed attributes. Imports only posix and marshal (built in; `os`
alone costs ~1.5 ms here) and `trunner.kernel` (abi; install, the
raw system calls through `_kernel`; mounts); never trio, msgspec, typing
or ctypes.
Once pid 1 and pid 2 are forked, pid 1 and the helper confine themselves
and exec `trunner-waiter` (trunner/kernel/waiter.c), which waits and ends
the run in a few pages instead of an interpreter.

Every layer is mandatory: a plan without one of them is refused, never
read as "skip". Each step applies fully or the helper reports the step on
fd 3 (FD, moved), a close-on-exec pipe only it holds (EOF at a successful exec), and
exits SANDBOX_SETUP_EXIT (PROCESS_COUNT_EXIT when the process count cannot
be measured). The adapter cannot write that pipe, so it cannot forge a
refusal. The pipe also carries notes (`abi.NOTE_MARK`): the jail's pid 1,
which the parent waits on at teardown. The order is written once, in
`main`. Seccomp is last.
"""

import marshal
import posix

from trunner.kernel import abi, install, mounts
from trunner.kernel.abi import (
    PROCESS_COUNT_EXIT as PROCESS_COUNT_EXIT,
    REPORT_FD as REPORT_FD,
    SANDBOX_SETUP_EXIT as SANDBOX_SETUP_EXIT,
    SKIPPABLE as SKIPPABLE,
    WAITER_FD as WAITER_FD,
)

TYPE_CHECKING = False  # not from typing: importing it costs ~5 ms here
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn, TypeAlias, TypeVar

    from trunner.kernel.mounts import Data, ProcOp, RootOp, ScratchSize

    T = TypeVar("T")
    ProcessLimit: TypeAlias = "PidsCgroup | UsernsNproc | RlimitNproc"

class SetupError(Exception):
    """A step could not be applied; carries the step and the errno."""

    def __init__(self, step: str, err: int = 0, exit_code: int = SANDBOX_SETUP_EXIT) -> None:
        super().__init__(step)
        self.step, self.err, self.exit_code = step, err, exit_code


def main(argv: "list[str]", serve: "Callable[[str], object] | None" = None,
         mode: str = "") -> "NoReturn":
    """Apply the plan in argv[0], then exec argv after `--`, or (the fork
    server's runs) call `serve(mode)` in pid 2 instead. Never returns."""
    try:
        _take_report_fd(argv[1] if len(argv) > 1 else "")
        plan, adapter = _read_plan(argv)
        skip = plan.unsafe_skip
        steps: list[tuple[str, Callable[..., None], *tuple[object, ...]]] = [
            # In the helper (the host's PID namespace):
            # 0. the waiter's descriptor, while the host's tree is in view.
            ("waiter", _open_waiter),
            # 1. env: check first, nothing else depends on it.
            ("env", _check_env, plan.env),
            # 2. process limit: needs the host's view (real root for the
            #    cgroup, the real /proc for the count): before the namespaces.
            ("process_limit", _limit_processes, plan.process_limit, plan.jail_nproc),
            # 3. the run's memory cgroup, as root, likewise.
            ("memory", _limit_memory, plan.memory),
            # 3b. the run's CPU accounting cgroup (v1 cpuacct), likewise.
            ("cpu", _account_cpu, plan.cpu),
            *(_own_jail(plan) if plan.session is None else [
                # 4. rlimits, while the caller's rights hold.
                ("rlimits", _set_rlimits, plan.rlimits),
                # 5-8 in a session's command: its namespaces joined, a PID
                # namespace, a mount-namespace copy and a cgroup namespace
                # unshared (the root, its scratch and files are the session's).
                ("session", _enter_session, plan.session, plan.uid, plan.gid)]),
            # 9. the run's own process count: RLIMIT_NPROC counts per user
            #    namespace (5.14 on), so this one counts the run alone.
            ("jail_processes", _limit_jail_processes, plan.jail_nproc),
            # 10. parent-death signal after the helper's last credential change
            #    (a change of credentials clears it), then re-check the parent.
            ("parent_death", _die_with_parent, plan.parent_pid),
            # 11. fork pid 1 (a reaper) and pid 2 of the new PID namespace; the
            #    helper stays outside, confined (the waiters' own filter, as
            #    pid 1), waits for pid 2 and forwards its exit status. Only
            #    pid 2 returns from this step.
            ("pid_namespace", _enter_pid_namespace, plan.waiter_bpf, plan.landlock,
             adapter),
            # In pid 2:
            # 12. the jail's own /proc over the host's, masked; its devpts; hostname; cwd.
            ("proc", _enter_jail, plan.proc_ops, plan.hostname, plan.workdir,
             plan.session is not None),
            # 13. capabilities dropped, inside every namespace.
            ("capabilities", _drop_capabilities),
            # 14. descriptors: after every step that opens files.
            ("descriptors", _close_inherited_fds, plan.stdio),
            # 15. NO_NEW_PRIVS, required by Landlock and seccomp as non-root.
            ("no_new_privs", install.set_no_new_privs),
            # 16. Landlock on the jail's own paths (its syscalls must not be
            #     filtered yet).
            ("landlock", _restrict_filesystem, plan.landlock),
            # 17. seccomp last: after it only the allow-list runs, then exec.
            ("seccomp", install.install_seccomp, plan.seccomp_bpf),
        ]
        for name, fn, *args in steps:
            if name in skip:
                continue
            _apply(name, fn, *args)
        if serve is not None:
            serve(mode)
        try:
            posix.execv(adapter[0], adapter)
        except OSError as e:
            raise SetupError(f"exec: {adapter[0]}: {e.strerror}", e.errno or 0) from None
    except SetupError as e:
        _fail(e)
    except BaseException as e:  # a bug here must still refuse, and say so
        _fail(SetupError(f"helper: {type(e).__name__}: {e}"))


def _own_jail(plan: "Plan") -> "list[tuple[str, Callable[..., None], *tuple[object, ...]]]":
    """Steps 5-8b of a jail of its own: its namespaces, its root, its rlimits."""
    return [
        # 5. not root: a user namespace of the caller's own ids, for the
        #    right to mount (real root has it already).
        ("build_namespace", _enter_build_namespace, plan.build_userns, plan.uid,
         plan.gid),
        # 5b. the run's IPC namespace, sized (no memory cgroup bounds a
        #    non-root run's SysV objects): after 5, whose capabilities
        #    join it; before 6, while the host's /proc/sys is at hand.
        ("ipc", _limit_ipc, plan.ipc_limits, plan.build_userns, plan.uid,
         plan.gid),
        # 6. the root, built in a private mount namespace with the
        #    caller's rights (a bind is walked as the caller walks it),
        #    then pivoted into.
        ("root", _build_root, plan.staging, plan.scratch, plan.root_ops,
         plan.uid, plan.gid),
        # 6b. rlimits: after the root, whose own files are written under
        #     the caller's bounds (`file_size_bytes` 0 is the program's, not
        #     /etc/passwd's); before 7, while a root caller may still raise
        #     a hard limit.
        ("rlimits", _set_rlimits, plan.rlimits),
        # 7. the jail's host ids: a root caller drops to them here, groups
        #    cleared, before any namespace that would keep host uid 0.
        ("identity", _take_identity, plan.uid, plan.gid),
        # 8. every namespace in one unshare (the new user namespace owns
        #    the others; the mounts of step 5 become locked in it), the
        #    host ids mapped to the jail's one id (the same in every run).
        ("namespaces", _unshare_from_prog, plan.unshare_flags, plan.uid, plan.gid,
         plan.jail_id),
        # 8b. the run's network namespace: its loopback up, while this
        #     process holds every capability over it (it owns the new
        #     user namespace), long before seccomp.
        ("loopback", _bring_loopback_up, plan.loopback, plan.unshare_flags),
    ]


def _take_report_fd(text: str) -> None:
    """Move the report pipe to REPORT_FD, before anything can fail; in a
    streaming run (`FD,STREAM`), the program's stdout pipe to STREAM_FD.
    Each first goes through a descriptor on neither slot, so that neither
    move can close the other's source (the parent's numbers are any)."""
    try:
        report, _, stream = text.partition(",")
        moves = [(int(report), REPORT_FD)]
        if stream:
            moves.append((int(stream), abi.STREAM_FD))
            _streaming.append(abi.STREAM_FD)
        slots = {slot for _, slot in moves}
        held: list[tuple[int, int]] = []
        for fd, slot in moves:
            if fd == slot:
                continue
            spare = [posix.dup(fd)]
            while spare[-1] in slots:
                spare.append(posix.dup(fd))
            for extra in spare[:-1]:
                posix.close(extra)
            posix.close(fd)
            held.append((spare[-1], slot))
        for fd, slot in held:
            posix.dup2(fd, slot)
            posix.close(fd)
    except (ValueError, OSError) as e:
        posix.write(2, f"trunner-helper: no report pipe ({e})\n".encode())
        posix._exit(SANDBOX_SETUP_EXIT)


# -- the plan, as the helper reads it -------------------------------------------
# One slots class per item kind of `trunner.linux.plan` (the root's and
# /proc's ops: `mounts`): the fields of its Struct of the same name and its
# tag as TAG (tests/test_plan.py pins both; the meaning is documented
# there). Each reads its item's plain dict and raises ValueError at another
# shape; a "none" kind reads as None.


class PidsCgroup:
    __slots__ = ("cgroup", "max")
    TAG = "pids_cgroup"

    def __init__(self, d: "Data") -> None:
        cgroup, limit = d.get("cgroup"), d.get("max")
        if type(cgroup) is not str or type(limit) is not int or len(d) != 3:
            raise ValueError(self.TAG)
        self.cgroup, self.max = cgroup, limit


class UsernsNproc:
    __slots__ = ("max",)
    TAG = "userns_nproc"

    def __init__(self, d: "Data") -> None:
        limit = d.get("max")
        if type(limit) is not int or len(d) != 2:
            raise ValueError(self.TAG)
        self.max = limit


class RlimitNproc:
    __slots__ = ("max",)
    TAG = "rlimit_nproc"

    def __init__(self, d: "Data") -> None:
        limit = d.get("max")
        if type(limit) is not int or len(d) != 2:
            raise ValueError(self.TAG)
        self.max = limit


class MemoryCgroup:
    __slots__ = ("bytes", "cgroup", "peak", "socket_bytes")
    TAG = "memory_cgroup"

    def __init__(self, d: "Data") -> None:
        cgroup, limit, sockets = d.get("cgroup"), d.get("bytes"), d.get("socket_bytes")
        peak = d.get("peak")
        if (type(cgroup) is not str or type(limit) is not int or type(sockets) is not int
                or type(peak) is not bool or len(d) != 5):
            raise ValueError(self.TAG)
        self.cgroup, self.bytes, self.socket_bytes, self.peak = cgroup, limit, sockets, peak


class CpuCgroup:
    __slots__ = ("cgroup", "views")
    TAG = "cpu_cgroup"

    def __init__(self, d: "Data") -> None:
        cgroup, views = d.get("cgroup"), d.get("views")
        if type(cgroup) is not str or not isinstance(views, (list, tuple)) or len(d) != 3:
            raise ValueError(self.TAG)
        self.cgroup, self.views = cgroup, [view for view in views if type(view) is str]
        if len(self.views) != len(views):
            raise ValueError(self.TAG)


class InSession:
    __slots__ = ("pid", "start")
    TAG = "session"

    def __init__(self, d: "Data") -> None:
        pid, start = d.get("pid"), d.get("start")
        if type(pid) is not int or type(start) is not int or len(d) != 3:
            raise ValueError(self.TAG)
        self.pid, self.start = pid, start


def _none(d: "Data") -> None:
    if len(d) != 1:
        raise ValueError("none")


class Rlimit:
    __slots__ = ("hard", "resource", "soft")

    def __init__(self, d: "Data") -> None:
        resource, soft, hard = d.get("resource"), d.get("soft"), d.get("hard")
        if (type(resource) is not int or type(soft) is not int or type(hard) is not int
                or len(d) != 3):
            raise ValueError("rlimit")
        self.resource, self.soft, self.hard = resource, soft, hard


class Sysctl:
    __slots__ = ("name", "value")

    def __init__(self, d: "Data") -> None:
        name, value = d.get("name"), d.get("value")
        if type(name) is not str or type(value) is not str or len(d) != 2:
            raise ValueError("sysctl")
        self.name, self.value = name, value


class LandlockPlan:
    """Its rules as `install.restrict_filesystem` takes them: `paths` of
    (path, dir_access, file_access), `ports` of (port, access), the fields
    of `PathRule` and `PortRule` in order."""

    __slots__ = ("abi", "handled_fs", "handled_net", "paths", "ports", "scoped")

    def __init__(self, d: "Data") -> None:
        abi, fs, net, scoped = d.get("abi"), d.get("handled_fs"), d.get("handled_net"), \
            d.get("scoped")
        paths, ports = d.get("paths"), d.get("ports")
        if (type(abi) is not int or type(fs) is not int or type(net) is not int
                or type(scoped) is not int or not isinstance(paths, (list, tuple))
                or not isinstance(ports, (list, tuple)) or len(d) != 6):
            raise ValueError("ruleset")
        self.abi, self.handled_fs, self.handled_net, self.scoped = abi, fs, net, scoped
        self.paths: list[tuple[str, int, int]] = []
        for rule in paths:
            if type(rule) is not dict:
                raise ValueError("path rule")
            path, dir_access, file_access = rule.get("path"), rule.get("dir_access"), \
                rule.get("file_access")
            if (type(path) is not str or type(dir_access) is not int
                    or type(file_access) is not int or len(rule) != 3):
                raise ValueError("path rule")
            self.paths.append((path, dir_access, file_access))
        self.ports: list[tuple[int, int]] = []
        for rule in ports:
            if type(rule) is not dict:
                raise ValueError("port rule")
            port, access = rule.get("port"), rule.get("access")
            if type(port) is not int or type(access) is not int or len(rule) != 2:
                raise ValueError("port rule")
            self.ports.append((port, access))


_PROCESS_LIMITS: "dict[object, Callable[[Data], ProcessLimit]]" = {
    PidsCgroup.TAG: PidsCgroup, UsernsNproc.TAG: UsernsNproc, RlimitNproc.TAG: RlimitNproc}
_MEMORY: "dict[object, Callable[[Data], MemoryCgroup | None]]" = {
    MemoryCgroup.TAG: MemoryCgroup, "none": _none}
_CPU: "dict[object, Callable[[Data], CpuCgroup | None]]" = {CpuCgroup.TAG: CpuCgroup, "none": _none}
_SESSION: "dict[object, Callable[[Data], InSession | None]]" = {
    InSession.TAG: InSession, "none": _none}


def _malformed(what: str, value: object, kind: object = "") -> ValueError:
    """`value` refused as `what` (an item of `kind`), by the types it holds."""
    if type(value) is dict:
        shown = "{" + ", ".join(f"{k}: {type(v).__name__}" for k, v in value.items()) + "}"
    else:
        shown = f"({type(value).__name__})"
    return ValueError(f"{what}: malformed {kind} {shown}" if kind else f"{what}: malformed {shown}")


def _items(values: object, what: str, tag: str,
           kinds: "dict[object, Callable[[Data], T]]") -> "list[T]":
    """Each of `values` read as the class its `tag` names among `kinds`
    (untagged: as `kinds[""]`)."""
    if not isinstance(values, (list, tuple)):
        raise _malformed(what, values)
    out: list[T] = []
    for value in values:
        if type(value) is not dict:
            raise _malformed(what, value)
        read = kinds.get(value.get(tag) if tag else "")
        if read is None:
            raise ValueError(f"{what}: unknown {tag} {value.get(tag)!r}")
        try:
            out.append(read(value))
        except ValueError as e:
            raise _malformed(what, value, e) from None
    return out


def _item(data: "Data", what: str, tag: str,
          kinds: "dict[object, Callable[[Data], T]]") -> "T":
    return _items((data[what],), what, tag, kinds)[0]


def _strs(data: "Data", what: str) -> "list[str]":
    values = data[what]
    if not isinstance(values, (list, tuple)):
        raise _malformed(what, values)
    out = [value for value in values if type(value) is str]
    if len(out) != len(values):
        raise _malformed(what, next(value for value in values if type(value) is not str))
    return out


def _field(data: "Data", what: str, kind: "type[T]") -> "T":
    value = data[what]
    if type(value) is not kind:  # exactly: a bool is no int here
        raise _malformed(what, value)
    return value


class Plan:
    """The plan, `abi.PLAN_FIELDS` as typed attributes, read from its plain
    values. ValueError names what is wrong: not a plan of this version, a
    field missing or one too many, an item of another shape or kind."""

    __slots__ = abi.PLAN_FIELDS

    def __init__(self, data: object) -> None:
        if type(data) is not dict or data.get("version") != abi.PLAN_VERSION:
            raise ValueError(f"not a plan of version {abi.PLAN_VERSION}")
        missing = [key for key in abi.PLAN_FIELDS if key not in data]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        unknown = sorted(set(data) - set(abi.PLAN_FIELDS))
        if unknown:
            raise ValueError(f"unknown {', '.join(map(str, unknown))}")
        self.version = abi.PLAN_VERSION
        self.env = _strs(data, "env")
        self.process_limit = _item(data, "process_limit", "kind", _PROCESS_LIMITS)
        self.jail_nproc = _field(data, "jail_nproc", int)
        self.memory = _item(data, "memory", "kind", _MEMORY)
        self.cpu = _item(data, "cpu", "kind", _CPU)
        self.rlimits = _items(data["rlimits"], "rlimits", "", {"": Rlimit})
        self.ipc_limits = _items(data["ipc_limits"], "ipc_limits", "", {"": Sysctl})
        self.build_userns = _field(data, "build_userns", bool)
        self.unshare_flags = _field(data, "unshare_flags", int)
        self.uid = _field(data, "uid", int)
        self.gid = _field(data, "gid", int)
        self.jail_id = _field(data, "jail_id", int)
        self.loopback = _field(data, "loopback", str)
        self.root_ops = _items(data["root_ops"], "root_ops", "op", mounts.ROOT_OPS)
        self.proc_ops = _items(data["proc_ops"], "proc_ops", "op", mounts.PROC_OPS)
        self.scratch = _item(data, "scratch", "", {"": mounts.ScratchSize})
        self.staging = _field(data, "staging", str)
        self.hostname = _field(data, "hostname", str)
        self.workdir = _field(data, "workdir", str)
        self.landlock = _item(data, "landlock", "", {"": LandlockPlan})
        self.parent_pid = _field(data, "parent_pid", int)
        self.seccomp_bpf = _field(data, "seccomp_bpf", bytes)
        self.waiter_bpf = _field(data, "waiter_bpf", bytes)
        self.unsafe_skip = _strs(data, "unsafe_skip")
        self.stdio = _field(data, "stdio", str)
        self.session = _item(data, "session", "kind", _SESSION)
        if self.stdio not in abi.STDIO_KINDS:
            raise ValueError(f"stdio {self.stdio!r} is not one of {', '.join(abi.STDIO_KINDS)}")
        skipped = [name for name in self.unsafe_skip if name not in SKIPPABLE]
        if skipped:
            raise ValueError(f"cannot skip {', '.join(skipped)}")


def _read_plan(argv: "list[str]") -> "tuple[Plan, list[str]]":
    """The plan in argv[0], typed (every item read and checked, before any
    step), and the adapter's argv."""
    if len(argv) < 4 or argv[2] != "--":
        raise SetupError("plan: expected PLAN FD -- ADAPTER...")
    try:
        data = marshal.loads(bytes.fromhex(argv[0]))
    except (ValueError, EOFError, TypeError) as e:
        raise SetupError(f"plan: not a plan ({e})") from None
    try:
        plan = Plan(data)
    except (ValueError, TypeError) as e:  # TypeError: an unhashable tag
        raise SetupError(f"plan: {e}") from None
    return plan, argv[3:]


def _apply(name: str, fn: "Callable[..., None]", *args: object) -> None:
    try:
        fn(*args)
    except SetupError:
        raise
    except OSError as e:
        what = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
        raise SetupError(f"{name}: {what}", e.errno or 0) from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as e:
        raise SetupError(f"{name}: malformed plan item ({type(e).__name__}: {e})") from None


def _fail(e: SetupError) -> "NoReturn":
    err = f" (errno {e.err})" if e.err else ""
    try:
        posix.write(REPORT_FD, f"{e.step}{err}".encode(errors="replace")[:4000])
    finally:
        posix._exit(e.exit_code)


# -- steps ---------------------------------------------------------------


def _open_waiter() -> None:
    fd = posix.open(install.WAITER, posix.O_PATH | posix.O_CLOEXEC)
    if fd != WAITER_FD:
        posix.dup2(fd, WAITER_FD, inheritable=False)
        posix.close(fd)


def _exec_waiter(argv: "list[str]") -> "NoReturn":
    # fexecve: execveat(WAITER_FD, "", AT_EMPTY_PATH), in the jail's filter too.
    posix.execve(WAITER_FD, argv, posix.environ)


def _check_env(allowed: "list[str]") -> None:
    names = {name.decode("utf-8", "surrogateescape") for name in posix.environ}
    extra = sorted(names - set(allowed))
    if extra:
        raise SetupError(f"env: unexpected variables {', '.join(extra)}")


def _limit_processes(limit: "ProcessLimit", jail_nproc: int) -> None:
    if isinstance(limit, PidsCgroup):
        path = limit.cgroup
        _has_controller(path, "pids.max")
        install.write_file(f"{path}/pids.max", b"%d" % limit.max)
        _join_run(path)
    elif isinstance(limit, UsernsNproc):
        if jail_nproc < 1:
            raise SetupError("process_limit: userns_nproc without a jail_nproc")
    else:  # rlimit_nproc
        nproc = _count_processes(posix.getuid()) + limit.max - 1
        install.set_rlimit(abi.RLIMIT_NPROC, nproc, nproc)


def _limit_memory(memory: "MemoryCgroup | None") -> None:
    if memory is None:
        return  # no memory cgroup: RLIMIT_AS per process and the scratch size
    path = memory.cgroup
    prog = f"{path}/{abi.PROG_CGROUP}"
    _has_controller(path, "memory.max")
    _has_controller(prog, "memory.max")
    _bound_memory(prog, memory.bytes)  # the run's whole bound is the parent's
    v2 = _exists(f"{prog}/memory.max")
    tcp = f"{prog}/memory.kmem.tcp.limit_in_bytes"
    if not v2 and _exists(tcp):  # v1: charged only once a limit is set
        install.write_file(tcp, b"%d" % memory.socket_bytes)
    peak = f"{prog}/memory.peak" if v2 else f"{prog}/memory.max_usage_in_bytes"
    if memory.peak and _exists(peak):  # v2 before 5.19 has none: the parent samples
        _open_at(peak, posix.O_RDONLY, abi.PROG_PEAK_FD)
    _join_run(path)


def _bound_memory(path: str, limit: int) -> None:
    write = install.write_file
    if _exists(f"{path}/memory.max"):  # v2: no swap either
        write(f"{path}/memory.max", b"%d" % limit)
        swap = f"{path}/memory.swap.max"
        if _exists(swap):
            write(swap, b"0")
    else:  # v1; memory+swap too where swap is accounted (set after the limit)
        write(f"{path}/memory.limit_in_bytes", b"%d" % limit)
        swap = f"{path}/memory.memsw.limit_in_bytes"
        if _exists(swap):
            write(swap, b"%d" % limit)


def _account_cpu(cpu: "CpuCgroup | None") -> None:
    if cpu is None:
        return  # the program's CPU time is polled from /proc and rusage
    prog = f"{cpu.cgroup}/{abi.PROG_CGROUP}"
    if _exists(f"{prog}/cpu.stat"):  # v2: in every cgroup
        _open_at(f"{prog}/cpu.stat", posix.O_RDONLY, abi.PROG_CPU_FD)
    else:
        _open_at(f"{prog}/cpuacct.usage", posix.O_RDONLY, abi.PROG_CPU_FD)
        _open_at(f"{prog}/cpuacct.stat", posix.O_RDONLY, abi.PROG_CPU_SPLIT_FD)
    _join_run(cpu.cgroup)
    for view in cpu.views:  # v1 cpu, cpuset: the whole run, for the jail's view
        install.write_file(f"{view}/tasks", b"0")


#: Run cgroups (one per hierarchy: one on v2) whose `sup` this process
#: joined, in the order of their slots in `abi.PROG_JOIN_FDS`.
_runs_joined: "list[str]" = []


def _join_run(path: str) -> None:
    """Join the run's `sup` leaf, and hold its `prog` and `sup` join files at
    their slots for pid 2 (`abi.PROG_JOIN_FDS`, `abi.SUP_JOIN_FDS`).
    Writing 0 moves the writer; children inherit the cgroup. On cgroup v1,
    `tasks` moves only the calling thread (all of us: single-threaded) and
    skips the global threadgroup lock whose RCU sync costs ~10 ms."""
    if path in _runs_joined:
        return  # v2: one cgroup for every controller
    slot = len(_runs_joined)
    _runs_joined.append(path)
    for leaf, fds in ((abi.PROG_CGROUP, abi.PROG_JOIN_FDS), (abi.SUP_CGROUP, abi.SUP_JOIN_FDS)):
        tasks = f"{path}/{leaf}/tasks"
        _open_at(tasks if _exists(tasks) else f"{path}/{leaf}/cgroup.procs", posix.O_WRONLY,
                 fds[slot])
    posix.write(abi.SUP_JOIN_FDS[slot], b"0")


#: The slots of `abi.CGROUP_FDS` this process filled.
_slots_held: "set[int]" = set()


def _open_at(path: str, flags: int, fd: int) -> None:
    got = posix.open(path, flags | posix.O_CLOEXEC)
    if got != fd:
        posix.dup2(got, fd, inheritable=False)
        posix.close(got)
    _slots_held.add(fd)


def _limit_jail_processes(jail_nproc: int) -> None:
    if jail_nproc:
        install.set_rlimit(abi.RLIMIT_NPROC, jail_nproc, jail_nproc)


def _has_controller(path: str, v2_file: str) -> None:
    # On cgroup v2 a controller's files exist only where the parent gives it
    # to its children: without them the limit would not hold.
    if _exists(f"{path}/cgroup.controllers") and not _exists(f"{path}/{v2_file}"):
        raise SetupError(f"cgroup: {path} has no {v2_file} (cgroup v2: the controller is"
                         " not enabled in its parent's cgroup.subtree_control)")


def _exists(path: str) -> bool:
    try:
        posix.stat(path)
    except OSError:
        return False
    return True


def _count_processes(uid: int) -> int:
    """Tasks (threads count: RLIMIT_NPROC counts tasks) of the real `uid`."""
    total = 0
    try:
        names = posix.listdir("/proc")
    except OSError as e:
        raise SetupError(f"process_count: /proc: {e.strerror}", e.errno or 0,
                         PROCESS_COUNT_EXIT) from None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
        except OSError as e:
            raise SetupError(f"process_count: /proc/{name}/status: {e.strerror}",
                             e.errno or 0, PROCESS_COUNT_EXIT) from None
        real_uid = threads = None
        for line in status.split(b"\n"):
            if line.startswith(b"Uid:"):
                real_uid = int(line.split()[1])
            elif line.startswith(b"Threads:"):
                threads = int(line.split()[1])
        if real_uid is None or threads is None:
            raise SetupError(f"process_count: /proc/{name}/status unreadable",
                             0, PROCESS_COUNT_EXIT)
        if real_uid == uid:
            total += threads
    if total < 1:  # we are running, so at least this process must show
        raise SetupError("process_count: own process not found in /proc", 0, PROCESS_COUNT_EXIT)
    return total


def _set_rlimits(rlimits: "list[Rlimit]") -> None:
    set_rlimit = install.set_rlimit
    for limit in rlimits:
        res, soft, hard = limit.resource, limit.soft, limit.hard
        try:
            set_rlimit(res, soft, hard)
        except OSError as e:
            raise SetupError(f"rlimits: setrlimit({res}, {soft}, {hard}): {e.strerror}",
                             e.errno or 0) from None


def _enter_build_namespace(wanted: bool, uid: int, gid: int) -> None:
    if wanted:
        _unshare(abi.CLONE_NEWUSER, uid, gid)
    elif posix.getuid() != 0:
        raise SetupError("build_namespace: not root, and the plan has no user namespace")


def _build_root(staging: str, scratch: "ScratchSize", ops: "list[RootOp]", uid: int,
                gid: int) -> None:
    # The helper keeps its host jail dir as its cwd (outside the new root),
    # so the host sees which jail a helper serves; pid 1 and pid 2 leave it.
    here = posix.open(".", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    try:
        install.unshare(abi.CLONE_NEWNS)
        mounts.build_root(staging, scratch, ops, (uid, gid))
        posix.fchdir(here)
    finally:
        posix.close(here)


def _limit_ipc(sysctls: "list[Sysctl]", in_userns: bool, uid: int, gid: int) -> None:
    """Enter a new IPC namespace with `sysctls` written in it. Only the uid
    that is root of the namespace's owning user namespace may write them:
    real root, or (not root) the caller in a user namespace mapping its 0 to
    the caller. That one is made by a child, whose IPC namespace the helper
    joins (the helper keeps its own ids); the jail's user namespace, made
    later, owns neither, so the jail gets no capability over them, and its
    /proc/sys is read-only."""
    if not in_userns:
        install.unshare(abi.CLONE_NEWIPC)
        _write_sysctls(sysctls)
        return
    report_r, report_w = posix.pipe2(posix.O_CLOEXEC)
    hold_r, hold_w = posix.pipe2(posix.O_CLOEXEC)
    child = posix.fork()
    if child == 0:
        try:
            posix.close(report_r)
            posix.close(hold_w)
            install.unshare(abi.CLONE_NEWUSER | abi.CLONE_NEWIPC)
            install.write_file("/proc/self/setgroups", b"deny")
            install.write_file("/proc/self/uid_map", b"0 %d 1" % uid)
            install.write_file("/proc/self/gid_map", b"0 %d 1" % gid)
            _write_sysctls(sysctls)
            posix.write(report_w, b"ok")
            posix.read(hold_r, 1)  # alive until the helper holds the namespace
        except BaseException as e:
            posix.write(report_w, f"{type(e).__name__}: {e}".encode(errors="replace")[:500])
        posix._exit(0)
    posix.close(report_w)
    posix.close(hold_r)
    try:
        said = posix.read(report_r, 600)
        if said != b"ok":
            raise SetupError(f"ipc: {said.decode(errors='replace') or 'no answer'}")
        ns = posix.open(f"/proc/{child}/ns/ipc", posix.O_RDONLY | posix.O_CLOEXEC)
        try:
            install.call("setns", ns, abi.CLONE_NEWIPC)
        finally:
            posix.close(ns)
    finally:
        posix.close(report_r)
        posix.close(hold_w)
        posix.waitpid(child, 0)


def _write_sysctls(sysctls: "list[Sysctl]") -> None:
    write = install.write_file
    for sysctl in sysctls:
        write(f"/proc/sys/kernel/{sysctl.name}", sysctl.value.encode())


def _take_identity(uid: int, gid: int, maps: bool = True) -> None:
    """Become host `uid`/`gid` with no supplementary groups (a root caller),
    or check that this is who we are (anyone else). `maps`: this process
    writes its user namespace's id maps next."""
    if uid == 0 or gid == 0:
        raise SetupError("identity: a jail never runs as host uid or gid 0")
    if posix.getuid() == 0:
        posix.setgroups([])
        posix.setresgid(gid, gid, gid)
        posix.setresuid(uid, uid, uid)
        if maps:
            # The uid change cleared "dumpable", which makes /proc/self/*_map
            # root's: this process writes its own maps next.
            install.set_dumpable(True)
    if posix.getresuid() != (uid, uid, uid) or posix.getresgid() != (gid, gid, gid):
        raise SetupError(f"identity: running as {posix.getresuid()}/{posix.getresgid()}, "
                         f"the plan says {uid}/{gid}")


def _unshare(flags: int, uid: int, gid: int, inside: "int | None" = None) -> None:
    install.unshare(flags)
    install.map_ids(uid, gid, inside)


def _unshare_from_prog(flags: int, uid: int, gid: int, inside: int) -> None:
    """`_unshare` from the run's `prog` leaf, then back to `sup`: the jail's
    cgroup namespace is rooted at `prog`, so the program (and a run() mode's
    adapter) sees itself at `/`, and its cgroup mounts would show its own
    cgroup's files; trunner's processes, in `sup`, show `/../sup`. The moves
    go through the files opened before (their opener's rights and cgroup
    namespace are what the kernel checks, from 5.16)."""
    joined = range(len(_runs_joined))
    for slot in joined:
        posix.write(abi.PROG_JOIN_FDS[slot], b"0")
    _unshare(flags, uid, gid, inside)
    for slot in joined:
        posix.write(abi.SUP_JOIN_FDS[slot], b"0")


#: The host's /proc (O_PATH), opened before a session's namespaces are
#: joined: pid 1's note and the waiter read it (`_enter_pid_namespace`).
_host_proc: "list[int]" = []


def _enter_session(session: "InSession", uid: int, gid: int) -> None:
    """Join the session's namespaces by a pidfd of its pid 1, checked by
    start time, then unshare this command's PID, mount and cgroup
    namespaces (`_unshare_from_prog`: the cgroup one rooted at its `prog`).
    Not dumpable from before the first setns to the exec: no process of
    the session may ptrace or read this one. The IPC namespace is owned by
    the host's user namespace (a root caller's) or by a sibling of the
    session's (anyone else's): root joins it (and the mount namespace, to
    be back in its jail dir, root's, 0700) first, while it still has the
    right; anyone else joins it with the rest, as the owner of both."""
    _last_cap()
    proc = posix.open("/proc", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    _host_proc.append(proc)
    # As a run's helper, it keeps its host jail dir as its cwd (setns into
    # a mount namespace moves it to that namespace's root): the host sees
    # which jail a helper serves.
    here = posix.open(".", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    pidfd = posix.pidfd_open(session.pid)
    try:
        if _start_time(session.pid, proc) != session.start:
            raise SetupError("session: the session's pid 1 is gone")
        install.set_dumpable(False)
        if posix.getuid() == 0:
            install.call("setns", pidfd, abi.CLONE_NEWIPC | abi.CLONE_NEWNS)
            posix.fchdir(here)
            _take_identity(uid, gid, maps=False)
            install.call("setns", pidfd, abi.SESSION_JOINED & ~abi.CLONE_NEWNS)
        else:
            _take_identity(uid, gid, maps=False)
            install.call("setns", pidfd, abi.SESSION_JOINED | abi.CLONE_NEWIPC)
            posix.fchdir(here)
    finally:
        posix.close(pidfd)
        posix.close(here)
    joined = range(len(_runs_joined))
    for slot in joined:
        posix.write(abi.PROG_JOIN_FDS[slot], b"0")
    install.unshare(abi.SESSION_UNSHARED)
    for slot in joined:
        posix.write(abi.SUP_JOIN_FDS[slot], b"0")


def _start_time(pid: int, proc: int) -> int:
    """A process's start time (clock ticks after boot), read through `proc`."""
    fd = posix.open(f"{pid}/stat", posix.O_RDONLY | posix.O_CLOEXEC, dir_fd=proc)
    try:
        return int(posix.read(fd, 4096).rsplit(b")", 1)[1].split()[19])
    finally:
        posix.close(fd)


def _bring_loopback_up(loopback: str, flags: int) -> None:
    own = bool(flags & abi.CLONE_NEWNET)
    if loopback == abi.LOOPBACK_UP and own:
        install.bring_loopback_up()
    elif loopback == abi.LOOPBACK_HOST and not own:
        return  # the host's network, shared: nothing of it is ours to change
    else:
        raise SetupError(f"loopback: {loopback!r} does not fit the plan's namespaces "
                         f"(network namespace of its own: {own})")


def _enter_jail(proc_ops: "list[ProcOp]", hostname: str, workdir: str,
                in_session: bool) -> None:
    mounts.enter_jail(proc_ops, hostname, workdir, again=in_session)


_LAST_CAP: "list[int]" = []


def _last_cap() -> int:
    if not _LAST_CAP:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            _LAST_CAP.append(int(f.read()))
    return _LAST_CAP[0]


def _drop_capabilities() -> None:
    install.drop_capabilities(_last_cap())


def _enter_pid_namespace(bpf: bytes, ruleset: "LandlockPlan", adapter: "list[str]") -> None:
    """Start pid 1 of the PID namespace the helper unshared and pid 2, the
    jail, its child; only pid 2 returns. Pid 1 reaps every orphan, hands pid
    2's end to the helper and is then killed, which makes the kernel kill
    (and pid 1 reap) whatever is left inside: nothing of the jail outlives
    it. Pid 1 dies with the helper (parent-death signal), the helper with
    the group. The helper notes pid 1 (`abi.INIT_NOTE`) for the parent.

    Pid 1 is a vfork child that runs no Python (`_kernel.fork_init`), so no
    page of the interpreter is copied for it: it closes `ends` and the
    host's /proc, resets the signals the interpreter catches (the kernel
    shields a namespace's init from its namespace's signals it has no
    handler for), forks pid 2, then holds no descriptor of the run but
    `done` (as fd 0), confines itself (`_waiter_landlock`) and becomes
    `trunner-waiter init` (waiter.c), which reaps orphans, writes pid 2's
    end ("CODE STATUS" of waitid) on fd 0, then exits, which ends the
    namespace; after a seccomp kill it blocks until killed instead (pid 2
    stays a zombie, for the helper to name). A failure of pid 1 is written
    on the report pipe, and pid 1 exits SANDBOX_SETUP_EXIT."""
    _last_cap()
    # A session's command: its mount namespace shows the session's /proc.
    proc = _host_proc[0] if _host_proc else posix.open(
        "/proc", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    ends, done = posix.pipe2(posix.O_CLOEXEC)
    init = install.fork_init(done, (ends, proc), bpf, _waiter_landlock(ruleset),
                             (install.WAITER, "init"))
    if init == 0:
        return  # pid 2: on with the chain (the descriptors step closes `done`)
    posix.close(done)
    _note_init(init, proc)
    _wait_and_forward(init, ends, proc, bpf, adapter)


def _note_init(init: int, proc: int) -> None:
    """Tell the parent which process is the jail's pid 1: its host pid and
    start time (read through the host's /proc, while it is our child)."""
    try:
        start = _start_time(init, proc)
        posix.write(REPORT_FD, abi.NOTE_MARK + abi.INIT_NOTE + b" %d %d\n" % (init, start))
    except BaseException as e:
        posix.kill(init, abi.SIGKILL)
        raise SetupError(f"pid_namespace: cannot note pid 1: {type(e).__name__}: {e}") from None


def _waiter_landlock(ruleset: "LandlockPlan") -> "tuple[int, int, int, int, int, int]":
    """What pid 1 and the waiting helper keep of the jail
    (`install.confine_waiter`): no capabilities (the sets emptied; both exec
    only trunner-waiter, under NO_NEW_PRIVS, so the bounding set is moot),
    NO_NEW_PRIVS, the waiters' seccomp filter (`plan.waiter_bpf`: what they
    call, and nothing else); pid 1 also this Landlock ruleset, which grants
    nothing but reading and executing trunner-waiter, so no jailed process
    may ptrace it or read its /proc/1/mem: Landlock allows that only into a
    nested domain; signals unscoped, the helper must kill it. The rule is on
    the very file WAITER_FD holds (Landlock rules bind inodes)."""
    return (ruleset.abi, ruleset.handled_fs, ruleset.handled_net,
            ruleset.scoped & ~abi.SCOPE_SIGNAL, WAITER_FD,
            abi.ACCESS_FS_EXECUTE | abi.ACCESS_FS_READ_FILE)


def _wait_and_forward(init: int, ends: int, proc: int, bpf: bytes,
                      adapter: "list[str]") -> "NoReturn":
    """The helper, once pid 1 is forked: confine itself, then become
    `trunner-waiter` (trunner/kernel/waiter.c), which reads pid 2's end on
    `ends`, kills and reaps pid 1 (which ends the namespace), and leaves
    with pid 2's exit code, or, after a seccomp kill, writes JAIL_PID_NOTE
    and pid 2's host pid (found through `proc`) and dies of its signal. A
    static binary of a few pages waits and exits last, not an interpreter:
    a Python process's exit costs ~0.5 ms more on every run's path."""
    try:
        for fd in (0, 1, 2, *_streaming):  # the jail's pipes are the jail's alone
            posix.close(fd)
        install.confine_waiter(bpf, None)
        for fd in (ends, proc):
            posix.set_inheritable(fd, True)
        _exec_waiter([install.WAITER, str(ends), str(init), str(proc), str(REPORT_FD), "--",
                      *adapter])
    except BaseException as e:
        posix.kill(init, abi.SIGKILL)
        _fail(SetupError(f"pid_namespace: helper: {type(e).__name__}: {e}"))


#: [STREAM_FD] in a streaming run, else empty.
_streaming: "list[int]" = []


def _close_inherited_fds(stdio: str) -> None:
    # The plan says what the parent hands over; nothing else passes.
    if bool(_streaming) != (stdio != "pipes"):
        raise SetupError(f"descriptors: stdio {stdio!r} but"
                         f" {'a' if _streaming else 'no'} stream descriptor")
    for fd in (0, 1, 2, REPORT_FD, *_streaming):
        kind = abi.S_IFSOCK if fd == abi.STREAM_FD and stdio == "pty" else abi.S_IFIFO
        if posix.fstat(fd).st_mode & abi.S_IFMT != kind:
            raise SetupError(f"descriptors: fd {fd} is not the runner's"
                             f" {'socket' if kind == abi.S_IFSOCK else 'pipe'}")
    install.set_cloexec(REPORT_FD)  # closed by the exec: EOF tells the parent it happened
    # The program's cgroup files pass to the adapter (which makes them
    # close-on-exec before any program runs); every other slot is closed.
    for fd in range(REPORT_FD + 1, abi.CGROUP_FDS[-1] + 1):
        if fd in _slots_held:
            posix.set_inheritable(fd, True)
        else:
            try:  # noqa: SIM105  no contextlib in the helper
                posix.close(fd)
            except OSError:
                pass
    if _streaming:  # the program's stdout, for the adapter to hand on
        posix.set_inheritable(abi.STREAM_FD, True)
    install.close_from(abi.STREAM_FD + 1 if _streaming else abi.CGROUP_FDS[-1] + 1)


def _restrict_filesystem(ruleset: "LandlockPlan") -> None:
    install.restrict_filesystem(ruleset.abi, ruleset.handled_fs, ruleset.handled_net,
                                ruleset.scoped, ruleset.paths, ruleset.ports)


def _die_with_parent(parent_pid: int) -> None:
    install.set_parent_death_signal(abi.SIGKILL)
    # The parent may have died before the signal was armed.
    if posix.getppid() != parent_pid:
        raise SetupError("parent_death: the parent exited before the signal was armed")
