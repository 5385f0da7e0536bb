"""Helpers every test module imports (not a test module).

tests/ is not a package: pytest puts this directory on `sys.path` (conftest.py
lives here), so test files import this as `support`. The same directory is on
the jail's import path (for `children`), so nothing here may shadow a module a
worker imports, and nothing here runs inside a jail.

- `fails`, `run_code`, `denied`, `syscall_denied` and `PRELUDE`: run a mode or a
  snippet in a real jailed child and get its response or its `RunnerError`.
  A call outside the seccomp allow-list fails with an errno (`PRELUDE`'s
  `attempt` and `syscall` name it); only a foreign architecture's or an x32
  syscall kills the worker (`syscall_denied`).
- `is_alive`, `group_alive`, `proc_status` and the like: observe real
  processes through /proc. `wait_until` is the one poll: it waits for a real
  condition, bounded, never for a fixed time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import pytest
import trio

from trunner import Reason, Runner, RunnerError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from trunner import Limits, Result
    from trunner.protocol import ExecFile, ExecResult

T = TypeVar("T")

#: Test-only switch (TRUNNER_TEST_VIA_POOL=1): `conftest.make_runner` builds a
#: `PooledRunner`, so every run of the suites that build runners through it is
#: served by a prewarmed worker of `runner.pool(...)` instead of a cold spawn.
#: `.ci/run` runs tests/security and tests/compat so, as root and as uid 65534.
VIA_POOL_VAR = "TRUNNER_TEST_VIA_POOL"
VIA_POOL = os.environ.get(VIA_POOL_VAR) == "1"
#: Likewise (TRUNNER_TEST_VIA_WARM=1): a `WarmRunner`, every run and exec
#: in a `runner.warm()` block of its own: its jail started by the block's
#: fork server. `.ci/run` runs tests/security and tests/compat so too.
VIA_WARM_VAR = "TRUNNER_TEST_VIA_WARM"
VIA_WARM = os.environ.get(VIA_WARM_VAR) == "1"


class PooledRunner(Runner):  # type: ignore[misc]  # Runner is final to callers; a test-only view
    """A `Runner` whose `run` and `exec` each open `self.pool(mode, size=1,
    limits=limits)` and serve the one call on its prewarmed worker: the same
    arguments, the same `Result`, the same `RunnerError` (the pool's `async
    with` lets the body's exception out as itself)."""

    @overload
    async def run(
        self, mode: str, request: object = None, *, limits: Limits | None = None
    ) -> Result[Any]: ...

    @overload
    async def run(
        self, mode: str, request: object = None, *, limits: Limits | None = None,
        response_type: type[T],
    ) -> Result[T]: ...

    async def run(
        self,
        mode: str,
        request: object = None,
        *,
        limits: Limits | None = None,
        response_type: Any = Any,
    ) -> Result[Any]:
        async with self.pool(mode, size=1, limits=limits) as pool:
            return await pool.run(request, response_type=response_type)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None,
        collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        capture_on_failure: bool = False,
    ) -> Result[ExecResult]:
        async with self.pool("exec", size=1, limits=limits) as pool:
            return await pool.exec(argv, stdin=stdin, files=files, collect=collect, env=env,
                                   capture_on_failure=capture_on_failure)


class WarmRunner(Runner):  # type: ignore[misc]  # as PooledRunner
    """A `Runner` whose `run` and `exec` each run in a `self.warm()` block of
    their own: the jail started by the block's fork server, nothing else
    changed."""

    async def run(self, *args: Any, **kw: Any) -> Result[Any]:
        async with self.warm():
            return await super().run(*args, **kw)

    async def exec(self, *args: Any, **kw: Any) -> Result[ExecResult]:
        async with self.warm():
            return await super().exec(*args, **kw)

# Prelude for child snippets: `attempt(fn)` returns the errno name or "OK:<value>";
# `syscall(nr, *args)` makes a raw syscall and answers the same way.
PRELUDE = """
import errno, os
def attempt(fn):
    try:
        return "OK:" + repr(fn())
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def syscall(nr, *args):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = libc.syscall(nr, *args)
    if rc != -1:
        return "OK:" + repr(rc)
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
"""

#: Attribute names under which an error could smuggle the child's output.
OUTPUT_NAMES = frozenset({"response", "result", "stdout", "stderr", "output"})


def assert_carries_no_output(e: RunnerError) -> None:
    """A `RunnerError` holds its reason and a one-line detail, never output
    bytes: its `output` is None (only `capture_on_failure` fills it)."""
    fields = dict(vars(e))
    assert fields.pop("output", None) is None, fields
    assert not OUTPUT_NAMES & set(fields), fields
    values = [*fields.values(), *e.args]
    assert not any(isinstance(v, (bytes, bytearray, memoryview)) for v in values), values
    assert len(e.args) == 1, e.args
    assert isinstance(e.args[0], str), e.args
    assert isinstance(e.reason, Reason), fields
    assert isinstance(e.detail, str), fields


async def fails(runner: Runner, mode: str, request: Any = None, **kw: Any) -> RunnerError:
    """Run `mode`; it must raise a `RunnerError` that carries no output."""
    with pytest.raises(RunnerError) as info:
        await runner.run(mode, request, **kw)
    assert_carries_no_output(info.value)
    return info.value


async def run_code(runner: Runner, code: str, **kw: Any) -> Any:
    """Run `code` (after `PRELUDE`) in a jailed worker; its `result` name."""
    src = PRELUDE + textwrap.dedent(code)
    return (await runner.run("children:run_code", src, **kw)).response


async def denied(runner: Runner, code: str, **kw: Any) -> RunnerError:
    """Run `code` (after `PRELUDE`) in a jailed worker; it must fail."""
    return await fails(runner, "children:run_code", PRELUDE + textwrap.dedent(code), **kw)


def kmsg_readable() -> bool:
    """Whether this process can read the kernel log (/dev/kmsg), where trunner
    finds the name of a syscall seccomp killed for: as root, or not root
    with kernel.dmesg_restrict = 0."""
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError:
        return False
    return True


async def syscall_denied(runner: Runner, code: str, name: str, **kw: Any) -> RunnerError:
    """Run `code`; seccomp must kill the worker (a foreign architecture's or an
    x32 syscall: nothing else kills), naming `name` when it can."""
    e = await denied(runner, code, **kw)
    assert e.reason is Reason.SYSCALL_DENIED, (e.reason, e.detail)
    assert e.signal == signal.SIGSYS
    # The name comes from the kernel's (rate-limited) audit record in /dev/kmsg;
    # when the record was logged it must name exactly this syscall. Without
    # access to the log there is no record to name it.
    if kmsg_readable():
        assert f"({name})" in e.detail or "number not logged" in e.detail, e.detail
    else:
        assert "number not logged" in e.detail, e.detail
    return e


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


#: Test-only knob: every time bound a test asserts or waits for is multiplied by
#: it (`scaled`), so a slow host (a guest kernel under emulation) runs the same
#: tests: TRUNNER_TEST_TIME_SCALE=5. Limits given to trunner are not scaled.
TIME_SCALE_VAR = "TRUNNER_TEST_TIME_SCALE"
TIME_SCALE = float(os.environ.get(TIME_SCALE_VAR) or 1)


def scaled(seconds: float) -> float:
    """A test's time bound of `seconds` on this host (`TIME_SCALE`)."""
    return seconds * TIME_SCALE


async def wait_until(
    pred: Callable[[], T | None], timeout_s: float, what: str | Callable[[], str]
) -> T:
    """Poll `pred()` every 5 ms until it returns something true, and return
    that. After `timeout_s` seconds (`scaled`) fail naming `what` (a
    callable is called then, to say what is still there)."""
    timeout_s = scaled(timeout_s)
    with trio.move_on_after(timeout_s):
        while not (value := pred()):  # noqa: ASYNC110  a plain predicate: nothing to await
            await trio.sleep(0.005)
        return value
    raise AssertionError(f"not within {timeout_s} s: {what if isinstance(what, str) else what()}")


# -- observing real processes ----------------------------------------------------


def is_alive(pid: int) -> bool:
    """Whether `pid` names a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in group `pgid`. A zombie holds
    no memory and no descriptor: a jail's pid 1 whose parent, the helper,
    was SIGKILLed first is reaped by the host's init, in its own time."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        exiting = int(fields[6]) & _PF_EXITING  # past exit: no memory, no files
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X") and not exiting:
            return True
    return False


_PF_EXITING = 0x4


def proc_status(pid: int) -> dict[str, str]:
    """`/proc/PID/status` as a mapping (empty once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.read().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def is_jailed(status: dict[str, str]) -> bool:
    """The jail's last layer is on: a seccomp filter (installed after Landlock)."""
    return status.get("Seccomp") == "2" and status.get("NoNewPrivs") == "1"


def ignores(status: dict[str, str], sig: int) -> bool:
    """Whether the process has `sig` set to SIG_IGN (from its `SigIgn` mask)."""
    return bool(int(status.get("SigIgn", "0"), 16) & (1 << (sig - 1)))


def live_status(pid: int) -> dict[str, str]:
    """`proc_status(pid)`; fails if the pid is gone (to wait on: it cannot
    come back)."""
    status = proc_status(pid)
    assert status, f"pid {pid} is gone"
    return status


def alive(pids: Iterable[int]) -> list[int]:
    """The pids of `pids` still alive (zombies count as gone)."""
    return [p for p in pids if is_alive(p)]


def proc_statuses() -> Iterator[tuple[int, dict[str, str]]]:
    """(pid, /proc/PID/status fields) of every process still there."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                yield int(name), dict(line.split(":", 1) for line in f if ":" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue


def zombies_of(uid: int) -> list[int]:
    """Zombie processes whose real uid is `uid`."""
    return [pid for pid, fields in proc_statuses()
            if fields["State"].split()[0] == "Z" and int(fields["Uid"].split()[0]) == uid]


def uid_settled() -> bool:
    """Where the process limit is RLIMIT_NPROC (`rlimit_nproc`: not root,
    before Linux 5.14), it is the uid's tasks at spawn + processes - 1. An
    orphan left by an earlier test stays a zombie until init reaps it (up to
    ~2 s on this host): it is counted at spawn and frees a slot when reaped
    mid-run. Settled: the uid has no zombie, so that a bound the test asserts
    is this run's own (wait for it). Elsewhere (a per-run pids cgroup as root,
    a per-user-namespace count) each run is bounded on its own: always
    settled, whatever other runs of the uid leave."""
    from trunner.linux.probe import probe_host

    limit = probe_host().process_limit
    return limit is None or limit.kind != "rlimit_nproc" or not zombies_of(os.getuid())


def user_xattrs_absent(directory: Path | None = None) -> str | None:
    """Why files in `directory` take no user xattrs (tmpfs before Linux 6.6,
    a filesystem mounted without them), or None where they do: probed on a
    file of our own there; with no directory, on a memfd (the kernel's own
    tmpfs, the filesystem of a jail's scratch, whatever the host mounts)."""
    if directory is None:
        fd, where = os.memfd_create("trunner-xattr-probe", os.MFD_CLOEXEC), "tmpfs"
    else:
        fd = os.open(directory / "xattr-probe", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.unlink(directory / "xattr-probe")
        where = f"the filesystem of {directory}"
    try:
        os.setxattr(fd, "user.probe", b"1")
    except OSError as e:
        if e.errno != errno.EOPNOTSUPP:
            raise
        return (f"{where} takes no user xattrs on this kernel ({os.uname().release}; tmpfs has"
                f" them from Linux 6.6): setxattr(user.*) fails {os.strerror(e.errno)}")
    finally:
        os.close(fd)
    return None


def owner_of(pid: int) -> str:
    """The owner id (`trunner.cleanup.owner_id`: pid, start time, PID
    namespace) that names the jail dirs and run cgroups of the live process
    `pid`, read while it lives: once it is reaped its pid may be another
    trunner's (another test run's, beside this one)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return f"{pid}-{fields[19]}-{os.stat('/proc/self/ns/pid').st_ino}"


#: Every hierarchy a run may get a cgroup in (v1; v2 has one).
ALL_CONTROLLERS = ("pids", "memory", "cpuacct", "cpu", "cpuset")


def run_cgroup_parents(controllers: Sequence[str] = ("pids", "memory")) -> list[Path]:
    """The dirs run cgroups go in (`trunner/` under the bases of
    `controllers`: one for all on cgroup v2); [] where runs get none (not
    root, or no delegated cgroup)."""
    from trunner.linux import cgroup
    from trunner.linux.probe import probe_host

    host = probe_host()
    limit = host.process_limit
    bases = {"pids": limit.cgroup_base if limit is not None and limit.kind == "pids_cgroup"
             else "", "memory": host.memory_cgroup_base, "cpuacct": host.cpu_cgroup_base,
             **{c: b for b, c in host.view_cgroup_bases}}
    return list(dict.fromkeys(Path(bases[c], cgroup.DIR_NAME) for c in controllers
                              if bases.get(c)))


def no_memory_cgroup_reason() -> str | None:
    """Why this caller's runs have no memory cgroup (not root on cgroup v1, no
    delegated cgroup), where memfd_create and landlock_create_ruleset fail
    ENOSYS in the jail (`seccomp.UNBOUNDED_WITHOUT_MEMORY_CGROUP`); None where
    they have one."""
    from trunner.linux.probe import probe_host

    host = probe_host()
    if host.memory_cgroup_base:
        return None
    return (f"no memory cgroup for this caller (uid {host.uid}): memfd_create and"
            " landlock_create_ruleset fail ENOSYS in its jails")


def run_cgroups_of(owner: str, controllers: Sequence[str] = ("pids", "memory")) -> list[str]:
    """The run cgroups `owner` holds (see `run_cgroup_parents`)."""
    return [str(p) for parent in run_cgroup_parents(controllers) if parent.is_dir()
            for p in parent.glob(f"{owner}-*") if p.is_dir()]


def jailed_under(root: str) -> list[int]:
    """Live processes whose cwd is (or was, if removed) a jail dir under `root`
    (the helpers and their jails' pid 1), and every live process in those
    jails' PID namespaces (the jail works in its own root's working dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd.startswith(root.rstrip("/") + "/") and is_alive(int(entry)):
            found.append(int(entry))
    host = os.readlink("/proc/self/ns/pid")
    spaces = set()
    for pid in found:  # a helper's children are in its pid_for_children
        for name in ("pid", "pid_for_children"):
            try:
                spaces.add(os.readlink(f"/proc/{pid}/ns/{name}"))
            except OSError:
                continue
    spaces.discard(host)
    members = {p for ns in spaces for p in pid_namespace_members(ns) if is_alive(p)}
    return sorted(set(found) | members)


# -- the jail's PID namespace -------------------------------------------------------
# Pids a jailed child reports are those of its own PID namespace (it is pid 2;
# pid 1 is the jail's reaper); the host sees the helper, outside. A child
# proves what of it is left by its namespace (`os.readlink("/proc/self/ns/pid")`,
# the same inode from the host): `pid_namespace_members(ns) == []` once the run
# returned means no process of the jail survived.

PID_NS = 'os.readlink("/proc/self/ns/pid")'


def pid_namespace_members(ns: str) -> list[int]:
    """Host pids in the PID namespace `ns` (e.g. 'pid:[4026532…]')."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/pid") == ns:
                    out.append(int(name))
            except OSError:
                continue  # gone, or a kernel thread
    return out


def ns_pids(pid: int) -> list[int]:
    """`NSpid` of a host pid: its pid in each nested namespace, host first."""
    return [int(p) for p in proc_status(pid).get("NSpid", "").split()]


def host_children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return out


def jail_pid(helper: int) -> int | None:
    """The host pid of the jail's pid 2 (the adapter): the child of the
    helper's child, the jail's pid 1. None while there is none."""
    for init in host_children(helper):
        for child in host_children(init):
            if ns_pids(child)[1:] == [2]:
                return child
    return None


# -- a handshake with a live jail --------------------------------------------------
# The worker calls `ready(info)` (define it with `READY`): it writes `info` as
# JSON to `ready` in its working dir and waits for `go`. The host reads it
# through the jail's pid 2's /proc cwd and creates `go` (`jail_ready`), so
# the test can act while the jail holds something, then let it go on.

READY = """
import json as _json, time as _time
def ready(info):
    with open("ready.tmp", "w") as f:
        _json.dump(info, f)
    os.rename("ready.tmp", "ready")
    while not os.path.exists("go"):
        _time.sleep(0.005)
"""


def ready_info(helper: int | None = None) -> tuple[int, Any] | None:
    """(the jail's pid 2, the `info` it passed to `ready`) of the jail under
    `helper`, or (None) under any child of this process that leads a jail
    (beside a pool's prewarmed worker or any other child); None until one
    has called `ready`."""
    if helper is None:
        for child in host_children(os.getpid()):
            if (found := ready_info(child)) is not None:
                return found
        return None
    jail = jail_pid(helper)
    if jail is None:
        return None
    try:
        return jail, json.loads(Path(f"/proc/{jail}/cwd/ready").read_text())
    except FileNotFoundError:
        return None


async def jail_ready(helper: int | None = None, *, go: bool = True, timeout_s: float = 30
                     ) -> tuple[int, Any]:
    """`ready_info` of the jail under `helper` (a pid of conftest.child_pids();
    None: whichever of them leads the jail that is ready) once it is ready;
    then `go` unless told not to (`let_go` later)."""
    under = "any child" if helper is None else f"helper {helper}"
    jail, info = await wait_until(lambda: ready_info(helper), timeout_s,
                                  f"the jail under {under} ready")
    if go:
        let_go(jail)
    return jail, info


def let_go(jail: int) -> None:
    """Create `go` in the jail's working dir: `ready()` returns."""
    Path(f"/proc/{jail}/cwd/go").touch()


# A probe that makes one getpid through another ABI (argv[1]: "x32", or "i386"
# through int 0x80), which seccomp kills; it prints "survived N" otherwise.
FOREIGN_ABI_C = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long r = -2;
    if (argc > 1 && strcmp(argv[1], "x32") == 0) {
        r = syscall(0x40000000L + 39);  /* __X32_SYSCALL_BIT + getpid */
    } else if (argc > 1 && strcmp(argv[1], "i386") == 0) {
        __asm__ volatile ("int $0x80" : "=a"(r) : "a"(20L)  /* i386 getpid */
                          : "memory", "r8", "r9", "r10", "r11");
    }
    printf("survived %ld\n", r);
    return 0;
}
"""


def rules_document(runner: Any, limits: Any = None) -> dict[str, Any]:
    """What `runner`'s rules version hashes (`JailBackend.rules_document`),
    as the plain dict the Linux backend returns, for tests to index."""
    document: dict[str, Any] = runner.backend.rules_document(
        runner.limits if limits is None else limits)
    return document


def plan_for(limits: Any, host: Any, profile: Any = None, **options: Any) -> Any:
    """`plan_jail` for `profile` (default: the default profile) on this
    host's paths, as the backend plans it."""
    from trunner.linux.plan import plan_jail, profile_paths
    from trunner.linux.probe import snapshot
    from trunner.linux.profile import DEFAULT_PROFILE

    profile = DEFAULT_PROFILE if profile is None else profile
    return plan_jail(limits, host, snapshot(profile_paths(profile)), profile, **options)


class Unjailed:
    """A `trunner.jail.Jail` that holds nothing: `spawn` and `supervise` on
    a plain child, to test the supervision mechanism alone, not the jail."""

    def __init__(self, argv: tuple[str, ...]) -> None:
        from trunner.jail import Command

        self.command = Command(argv=argv, env={}, cwd="/")
        self.jail_dir = "/"
        self.stage: tuple[str, ...] = ()
        self.in_process = ""

    def spawned(self, pgid: int) -> None:
        pass

    def killed(self, pgid: int) -> None:
        pass

    async def wait_gone(self, pgid: int, report: bytes) -> None:
        pass

    def oom_kills(self) -> tuple[int, bool]:
        return 0, False

    def admit(self, request_bytes: int) -> None:
        pass

    def usage_now(self, pgid: int, *, program_only: bool) -> None:
        return None

    memory_sample_s = None

    def sample_memory(self) -> None:
        return None

    def final_usage(self, report: bytes) -> None:
        return None

    async def release(self) -> None:
        pass

    def note_init(self, report: bytes) -> bool:
        return False

    def explain(self, exit_code: int, report: bytes, started_us: int) -> None:
        return None


async def a_killed_parent_leaves_nothing(program: str, root: Path) -> None:
    """Run `program` (`python -c`): it prints its fork server's pid, then
    starts two jailed `sleep`s with jail dirs under `root`. SIGKILL it once
    both sleep: the server, every jailed process and every dir under `root`
    must be gone within 1 s (as tests/test_faults.py's, for the cold path)."""
    import subprocess
    import sys

    parent = subprocess.Popen(  # noqa: ASYNC220  SIGKILLed and polled, never awaited
        [sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        with trio.fail_after(scaled(60)):  # the parent's server started: its pid
            line = await trio.to_thread.run_sync(parent.stdout.readline, abandon_on_cancel=True)
        assert line, "the parent ended before its server was started"
        server = int(line)

        def sleeping() -> bool:
            assert parent.poll() is None
            return sum(1 for p in jailed_under(str(root)) if comm(p) == "sleep") == 2

        await wait_until(sleeping, 60, "two jailed sleeps")
        jailed = jailed_under(str(root))
        parent.kill()
        await wait_until(lambda: parent.poll() is not None, 30, "the parent's exit")

        def left() -> list[str]:
            return ([f"process {p}" for p in [server, *jailed] if is_alive(p)]
                    + [f"dir {d}" for top, dirs, files in os.walk(root) for d in dirs + files])

        await wait_until(lambda: not left(), 1.0, lambda: f"nothing left: {left()}")
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        for stream in (parent.stdout, parent.stderr):
            if stream is not None:
                stream.close()


def comm(pid: int) -> str:
    """/proc/PID/comm, or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
