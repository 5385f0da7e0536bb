"""The sandbox helper: the single-threaded first stage of every jailed spawn.

Runs between spawn and exec as `trunner-worker helper PLAN... -- ADAPTER...`.
It imports only os, sys, ctypes and resource (and trunner's landlock and
seccomp installers, which import nothing more); it never imports trio,
msgspec or the binding libraries: the parent precomputes everything. Each
step either fully applies or the helper writes one stderr line naming the
step and exits SANDBOX_SETUP_EXIT (PROCESS_COUNT_EXIT when the process count
cannot be measured). The order is written once, in `main`. Seccomp is last.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not from typing: importing it costs ~5 ms here
if TYPE_CHECKING:
    from typing import NoReturn

#: Exit code of a refused jail (some setup step failed), so the parent can
#: tell a refused jail from an adapter crash.
SANDBOX_SETUP_EXIT = 121
#: Exit code when the real uid's process count cannot be measured.
PROCESS_COUNT_EXIT = 122

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_CLOSE_RANGE = 436
_SIGKILL = 9  # literal: importing signal costs the helper ~1 ms
_S_IFIFO = 0o010000
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}


class SetupError(Exception):
    """A step could not be applied; carries the step name and errno."""

    def __init__(self, step: str, err: int = 0, exit_code: int = SANDBOX_SETUP_EXIT) -> None:
        super().__init__(step)
        self.step, self.err, self.exit_code = step, err, exit_code


class Plan:
    """The setup plan, parsed from `key=value` argv items before `--`."""

    def __init__(self, argv: list[str]) -> None:
        self.env_names: set[str] = set()
        self.userns: tuple[int, int] | None = None
        self.netns = False
        self.cgroup: str | None = None
        self.nproc_extra: int | None = None
        self.rlimits: list[tuple[str, int, int]] = []
        self.landlock: list[str] = []
        self.seccomp: bytes | None = None
        self.drop_caps = False
        self.parent_pid: int | None = None
        self.fail_step: str | None = None
        try:
            split = argv.index("--")
        except ValueError:
            raise SetupError("plan: no '--' before the adapter argv") from None
        self.argv = argv[split + 1 :]
        if not self.argv:
            raise SetupError("plan: empty adapter argv")
        for item in argv[:split]:
            key, sep, value = item.partition("=")
            if not sep:
                raise SetupError(f"plan: malformed item {item!r}")
            self._set(key, value)

    def _set(self, key: str, value: str) -> None:
        if key == "env":
            self.env_names.add(value)
        elif key == "userns":
            uid, gid = value.split(":")
            self.userns = (int(uid), int(gid))
        elif key == "netns":
            self.netns = value == "1"
        elif key == "cgroup":
            self.cgroup = value
        elif key == "nproc":
            self.nproc_extra = int(value)
        elif key == "rlimit":
            name, soft, hard = value.split(":")
            self.rlimits.append((name, int(soft), int(hard)))
        elif key == "ll":
            self.landlock.append(value)
        elif key == "seccomp":
            self.seccomp = bytes.fromhex(value)
        elif key == "dropcaps":
            self.drop_caps = value == "1"
        elif key == "parent":
            self.parent_pid = int(value)
        elif key == "fail":  # test hook: fail closed at a named step
            self.fail_step = value
        else:
            raise SetupError(f"plan: unknown item {key!r}")


def main(argv: list[str]) -> NoReturn:
    """Apply the plan, then exec the adapter. Never returns."""
    try:
        plan = Plan(argv)
        # Order, and why:
        # 1. env: check first, nothing else depends on it.
        # 2. cgroup and process count: need the host's view (real root, real
        #    /proc), so they come before the user namespace.
        # 3. rlimits before unshare: RLIMIT_NPROC then also bounds the count
        #    the kernel keeps for the new namespace.
        # 4. namespaces; 5. capabilities dropped inside them;
        # 6. descriptors: after every step that opens files;
        # 7. NO_NEW_PRIVS, required by Landlock and seccomp as non-root;
        # 8. Landlock (its syscalls must not be filtered yet);
        # 9. parent-death signal after the last credential change (a change
        #    of credentials clears it), then re-check the parent;
        # 10. seccomp last: after it, only the allow-list runs, then exec.
        _step(plan, "env", _check_env, plan.env_names)
        if plan.cgroup is not None:
            _step(plan, "cgroup", _join_cgroup, plan.cgroup)
        nproc = None
        if plan.fail_step == "process_count":
            raise SetupError("process_count: forced failure", 0, PROCESS_COUNT_EXIT)
        if plan.nproc_extra is not None:
            count = _count_processes(os.getuid())
            nproc = count + plan.nproc_extra - 1
        _step(plan, "rlimit", _set_rlimits, plan.rlimits, nproc)
        if plan.userns is not None:
            _step(plan, "namespaces", _unshare, plan.userns, plan.netns)
        if plan.drop_caps:
            _step(plan, "capabilities", _drop_capabilities)
        _step(plan, "descriptors", _close_inherited_fds)
        _step(plan, "no_new_privs", _set_no_new_privs)
        if plan.landlock:
            _step(plan, "landlock", _restrict_filesystem, plan.landlock)
        if plan.parent_pid is not None:
            _step(plan, "parent_death", _die_with_parent, plan.parent_pid)
        if plan.seccomp is not None:
            _step(plan, "seccomp", _install_seccomp, plan.seccomp)
        _exec(plan.argv)
    except SetupError as e:
        _fail(e)


def _step(plan: Plan, name: str, fn: object, *args: object) -> None:
    if plan.fail_step == name:
        raise SetupError(f"{name}: forced failure (plan item fail={name})")
    try:
        fn(*args)  # type: ignore[operator]
    except SetupError:
        raise
    except OSError as e:
        raise SetupError(f"{name}: {e.filename or e.strerror}", e.errno or 0) from None
    except (ValueError, OverflowError) as e:
        raise SetupError(f"{name}: {e}") from None


def _fail(e: SetupError) -> NoReturn:
    err = f": {os.strerror(e.err)} (errno {e.err})" if e.err else ""
    try:
        os.write(2, f"trunner-helper: {e.step}{err}\n".encode(errors="replace"))
    finally:
        os._exit(e.exit_code)


# -- steps ---------------------------------------------------------------


def _check_env(allowed: set[str]) -> None:
    extra = sorted(set(os.environ) - allowed)
    if extra:
        raise SetupError(f"env: unexpected variables {', '.join(extra)}")


def _join_cgroup(path: str) -> None:
    # Writing 0 moves the writer; children inherit the cgroup. On cgroup v1,
    # `tasks` moves only the calling thread (all of us: single-threaded) and
    # skips the global threadgroup lock whose RCU sync costs ~10 ms.
    tasks = os.path.join(path, "tasks")
    name = tasks if os.path.exists(tasks) else os.path.join(path, "cgroup.procs")
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def _count_processes(uid: int) -> int:
    """Tasks (threads count: RLIMIT_NPROC counts tasks) of the real `uid`."""
    total = 0
    try:
        names = os.listdir("/proc")
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


def _set_rlimits(rlimits: list[tuple[str, int, int]], nproc: int | None) -> None:
    import resource

    items = list(rlimits)
    if nproc is not None:
        items.append(("NPROC", nproc, nproc))
    for name, soft, hard in items:
        res = getattr(resource, f"RLIMIT_{name}")
        try:
            resource.setrlimit(res, (soft, hard))
        except (OSError, ValueError) as e:
            errno = e.errno if isinstance(e, OSError) else 0
            raise SetupError(f"rlimit: setrlimit(RLIMIT_{name}, {soft}, {hard}): {e}",
                             errno or 0) from None


_LIBC: list[object] = []


def _libc() -> object:
    """libc through ctypes, loaded once (ctypes is imported only when a step
    needs a syscall that `os` lacks)."""
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _check(ret: int, what: str) -> None:
    if ret < 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), what)


def _unshare(ids: tuple[int, int], netns: bool) -> None:
    libc = _libc()
    flags = _CLONE_NEWUSER | (_CLONE_NEWNET if netns else 0)
    _check(libc.unshare(flags), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")  # type: ignore[attr-defined]
    uid, gid = ids
    # The real ids map to themselves; setgroups must be denied before gid_map.
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        except OSError as e:
            raise OSError(e.errno, e.strerror, f"/proc/self/{name}") from None
        finally:
            os.close(fd)


def _drop_capabilities() -> None:
    import ctypes

    libc = _libc()
    with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"prctl(PR_CAPBSET_DROP, {cap})")  # type: ignore[attr-defined]
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0),  # type: ignore[attr-defined]
           "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two zeroed __user_cap_data_struct
    nr = _SYS_CAPSET[os.uname().machine]
    _check(libc.syscall(nr, header, data), "capset(0)")  # type: ignore[attr-defined]


def _close_inherited_fds() -> None:
    for fd in (0, 1, 2):
        if os.fstat(fd).st_mode & 0o170000 != _S_IFIFO:
            raise SetupError(f"descriptors: fd {fd} is not the runner's pipe")
    libc = _libc()
    _check(libc.syscall(_SYS_CLOSE_RANGE, 3, 0xFFFFFFFF, 0), "close_range(3, ~0)")  # type: ignore[attr-defined]


def _set_no_new_privs() -> None:
    _check(_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")  # type: ignore[attr-defined]


def _restrict_filesystem(items: list[str]) -> None:
    from trunner.linux import landlock

    landlock.restrict_self(landlock.decode_ruleset(items))


def _die_with_parent(parent_pid: int) -> None:
    _check(_libc().prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0),  # type: ignore[attr-defined]
           "prctl(PR_SET_PDEATHSIG)")
    # The parent may have died before the signal was armed.
    if os.getppid() != parent_pid:
        raise SetupError("parent_death: the parent exited before the signal was armed")


def _install_seccomp(bpf: bytes) -> None:
    from trunner.linux import install

    install.install_seccomp(bpf)


def _exec(argv: list[str]) -> NoReturn:
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        raise SetupError(f"exec: {argv[0]}", e.errno or 0) from None
