"""Process and kernel-interface escapes: signals, ptrace, sessions, namespaces,
dangerous syscalls, terminal injection, inherited fds, setuid binaries."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from conftest import child_pids, landlock_abi_in_force
from support import (
    denied,
    is_alive,
    pid_namespace_members,
    proc_status,
    run_code,
    syscall_denied,
    wait_jailed,
)
from trunner import Reason, Runner

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

# A host process of the test's uid, outside any jail: it answers SIGUSR1 with a line.
# (os.write, not print: the handler may run while the main thread is still writing.)
VICTIM = """
import os, signal
signal.signal(signal.SIGUSR1, lambda *_: os.write(1, b"alive\\n"))
os.write(1, b"ready\\n")
while True:
    signal.pause()
"""


class Victim:
    """A stand-in for the parent or a sibling, which a jailed child tries to harm."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._buffer = b""

    async def line(self) -> bytes:
        """Its next stdout line; b"" once it is dead (EOF)."""
        assert self.proc.stdout is not None
        with trio.fail_after(30):
            while b"\n" not in self._buffer:
                chunk = await self.proc.stdout.receive_some()
                if not chunk:
                    return b""
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    async def answers(self) -> bool:
        """Whether it still lives and handles signals.

        A signal the jail managed to send was queued before the run returned, and
        the kernel starts a fatal one's group exit at send time: a SIGUSR1 sent
        after it is never handled, and the pipe reaches EOF instead.
        """
        os.kill(self.pid, signal.SIGUSR1)
        return await self.line() == b"alive"


@pytest.fixture
async def victim() -> AsyncIterator[Victim]:
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-I", "-c", VICTIM], stdout=subprocess.PIPE
    )
    try:
        v = Victim(proc)
        assert await v.line() == b"ready"  # its handler is installed
        yield v
    finally:
        proc.kill()
        await proc.wait()
        assert proc.stdout is not None
        await proc.stdout.aclose()


async def test_signal_the_test_process_and_a_sibling(runner: Runner, victim: Victim) -> None:
    """Kill the supervising parent or a sibling process (Landlock signal scoping; pid, pgid, -1)."""
    got: list[int] = []
    old_term = signal.signal(signal.SIGTERM, lambda *_: got.append(signal.SIGTERM))
    old_urg = signal.signal(signal.SIGURG, lambda *_: got.append(signal.SIGURG))
    try:
        me, pgid = os.getpid(), os.getpgrp()
        result = await run_code(runner, f"""
            import signal
            result = [attempt(lambda: os.kill({me}, 0)),
                      attempt(lambda: os.kill({me}, signal.SIGTERM)),
                      attempt(lambda: os.killpg({pgid}, signal.SIGTERM)),
                      attempt(lambda: os.kill({victim.pid}, signal.SIGKILL)),
                      attempt(lambda: os.kill(1, 0)),
                      # broadcast a harmless signal (default action: ignore) to everything
                      attempt(lambda: os.kill(-1, signal.SIGURG))]
        """)
        assert await victim.answers(), "the sibling was killed"
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGURG, old_urg)
    # Host pids are not in the jail's PID namespace (ESRCH), at every Landlock ABI.
    assert result[:4] == ["ESRCH"] * 4
    # Its pid 1, the jail's reaper, is outside the adapter's Landlock domain
    # (EPERM) from ABI 6 (signal scope); below, it is the jail's own process,
    # in the jail's PID namespace (see test_the_reaper_ignores_the_jails_kills).
    assert result[4] == ("EPERM" if landlock_abi_in_force() >= 6 else "OK:None")
    # kill(-1, sig) reports success when every target answered EPERM (kernel
    # semantics); what matters is that nothing outside received the signal.
    assert result[5] in ("OK:None", "EPERM", "ESRCH"), result
    assert got == []


async def test_the_reaper_ignores_the_jails_kills(runner: Runner) -> None:
    """SIGKILL, SIGTERM, SIGINT and SIGSTOP to the jail's pid 1 (which would end
    the jail early, or stop its reaping; pid 1 is forked from the helper's
    interpreter, whose SIGINT handler it resets to the default). From Landlock
    ABI 6 the signal scope refuses them (EPERM); below, they are delivered to
    the init of the jail's own PID namespace,
    which the kernel shields from its namespace's signals it has no handler for:
    pid 1 runs on either way."""
    result = await run_code(runner, """
        import signal, time
        result = [attempt(lambda: os.kill(1, sig))
                  for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP)]
        time.sleep(0.1)
        with open("/proc/1/status") as f:
            result.append(f.read().split("State:")[1].split()[0])
    """)
    sent = "EPERM" if landlock_abi_in_force() >= 6 else "OK:None"
    assert result == [sent] * 4 + ["S"]  # sleeping in waitid(), not stopped, not dead


@pytest.mark.parametrize(
    ("code", "name"),
    [
        ("ctypes.CDLL(None).ptrace(16, PID, 0, 0)", "ptrace"),  # PTRACE_ATTACH
        ("ctypes.CDLL(None).syscall(310, PID, 0, 0, 0, 0, 0)", "process_vm_readv"),
        ("ctypes.CDLL(None).syscall(311, PID, 0, 0, 0, 0, 0)", "process_vm_writev"),
        ("ctypes.CDLL(None).syscall(438, os.pidfd_open(PID), 0, 0)", "pidfd_getfd"),
        ("ctypes.CDLL(None).syscall(424, os.pidfd_open(PID), 15, 0, 0)", "pidfd_send_signal"),
        ("ctypes.CDLL(None).syscall(312, PID, PID, 0, 0, 0)", "kcmp"),
    ],
)
async def test_ptrace_family_on_the_test_process(runner: Runner, code: str, name: str) -> None:
    """Ptrace of a sibling / the parent, and its cousins (memory read/write, fd theft)."""
    # A pidfd can name only a process of the jail's PID namespace: its pid 1.
    code = code.replace("os.pidfd_open(PID)", "os.pidfd_open(1)")
    await syscall_denied(runner, "import ctypes\n" + code.replace("PID", str(os.getpid())), name)
    assert proc_status(os.getpid())["TracerPid"] == "0"  # nothing attached to the test


@pytest.mark.parametrize(
    ("code", "name"),
    [
        # setsid, setpgid and unshare(CLONE_NEWUSER): test_jail.py's forbidden syscalls
        ("libc.syscall(308, 0, 0)", "setns"),
        ("libc.mount(b'none', b'.', b'tmpfs', 0, None)", "mount"),
        ("libc.syscall(155, b'.', b'.')", "pivot_root"),
        ("libc.chroot(b'.')", "chroot"),  # chroot + fchdir escape
        ("libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)", "clone"),  # clone(CLONE_NEWUSER)
        ("libc.syscall(428, -100, b'/', 0)", "open_tree"),  # new mount API
        ("libc.syscall(430, b'tmpfs', 0)", "fsopen"),
        ("libc.syscall(321, 0, 0, 0)", "bpf"),  # eBPF verifier bugs
        ("libc.syscall(298, 0, 0, -1, -1, 0)", "perf_event_open"),  # CVE-2013-2094
        ("libc.syscall(425, 1, 0)", "io_uring_setup"),  # io_uring CVEs
        ("libc.syscall(323, 0)", "userfaultfd"),  # race-widening primitive
        ("libc.syscall(250, 0, 0, 0, 0, 0)", "keyctl"),  # CVE-2016-0728
        ("libc.syscall(248, b'user', b'x', b'y', 1, 0)", "add_key"),
        ("libc.syscall(313, 0, b'', 0)", "finit_module"),
        ("libc.syscall(246, 0, 0, 0, 0)", "kexec_load"),
        ("libc.syscall(135, 0x0400000)", "personality"),  # READ_IMPLIES_EXEC / ASLR off
        ("libc.syscall(275, 0, 0, 1, 0, 1, 0)", "splice"),  # Dirty Pipe CVE-2022-0847
        ("libc.syscall(278, 0, 0, 0, 0)", "vmsplice"),
        ("libc.syscall(103, 3, 0, 0)", "syslog"),  # kernel log / kASLR leak
        ("libc.syscall(105, 0)", "setuid"),
        ("libc.syscall(227, 0, 0)", "clock_settime"),
    ],
)
async def test_dangerous_syscalls(runner: Runner, code: str, name: str) -> None:
    """Namespace/mount/kernel-attack-surface syscalls: all killed by seccomp."""
    await syscall_denied(runner, "import ctypes\nlibc = ctypes.CDLL(None)\n" + code, name)


async def test_clone3_namespace_smuggling(runner: Runner) -> None:
    """clone3 with flags in a struct the filter cannot read: ENOSYS, no new process."""
    result = await run_code(runner, """
        import ctypes, struct
        libc = ctypes.CDLL(None, use_errno=True)
        clone_args = struct.pack("<11Q", 0x10000000, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
        args = ctypes.create_string_buffer(clone_args, 88)
        rc = libc.syscall(435, args, 88)
        if rc == 0:
            os._exit(0)
        result = [rc, errno.errorcode[ctypes.get_errno()]]
    """)
    assert result == [-1, "ENOSYS"]


@pytest.mark.parametrize("fd", [0, 1, 2])
@pytest.mark.parametrize("request_code", [0x5412, 0x1_0000_5412, 0x541C])
async def test_tiocsti_terminal_injection(runner: Runner, fd: int, request_code: int) -> None:
    """CVE-2017-5226 TIOCSTI (and TIOCLINUX, and the high-bits-smuggled TIOCSTI) on fds 0/1/2."""
    e = await denied(runner, f"""
        import ctypes
        c = ctypes.c_char(b"!")
        ctypes.CDLL(None).syscall(16, {fd}, ctypes.c_ulong({request_code}), ctypes.byref(c))
    """)
    assert e.reason is Reason.SYSCALL_DENIED, e.detail
    assert e.signal == signal.SIGSYS, e.detail
    assert "(ioctl)" in e.detail or "number not logged" in e.detail


async def test_ordinary_ioctl_still_answers_enotty(runner: Runner) -> None:
    """Control for TIOCSTI: a harmless tty ioctl on the pipes gets ENOTTY, not a terminal."""
    result = await run_code(
        runner, "result = [attempt(lambda: os.tcgetpgrp(fd)) for fd in (0, 1, 2)]"
    )
    assert result == ["ENOTTY"] * 3


@pytest.mark.parametrize("setsid", [True, False])
async def test_double_forked_daemon(runner: Runner, setsid: bool) -> None:
    """Double-forked daemon holding stdout after the worker exits (persistence past the run)."""
    result = await run_code(runner, f"""
        import time
        r, w = os.pipe()
        if os.fork() == 0:
            if os.fork() == 0:
                os.write(w, str(os.getpid()).encode())
                if {setsid}:
                    os.setsid()  # killed by seccomp
                time.sleep(1000)  # holds stdout/stderr
            os._exit(0)
        os.wait()
        os.read(r, 32)
        result = os.readlink("/proc/self/ns/pid")
    """)
    assert pid_namespace_members(result) == []  # the whole jail is gone


async def test_a_descendant_slow_to_die_is_dead_when_run_returns(runner: Runner) -> None:
    """A grandchild that let go of the pipes and holds memory that takes a
    while to free: nothing waits on its pipes, yet it must be dead, not
    merely SIGKILLed, when run() returns (as root the cgroup is emptied;
    not root, only the group is there to wait on)."""
    # Its pid inside is of the jail's PID namespace: the host finds it by a
    # name of its own.
    tag = f"t{os.getpid() % 10000}-{secrets.token_hex(3)}"
    result = await run_code(runner, f"""
        import ctypes, time
        r, w = os.pipe()
        if os.fork() == 0:
            if os.fork() == 0:
                ctypes.CDLL(None).prctl(15, {tag.encode()!r}, 0, 0, 0)  # PR_SET_NAME
                ballast = b"\\1" * (384 << 20)  # touched pages: exit has to free them
                with open("/proc/self/comm") as f:
                    os.write(w, f.read().strip().encode())
                os.closerange(0, 1024)
                time.sleep(1000)
            os._exit(0)
        os.wait()
        os.close(w)
        result = os.read(r, 32).decode()
    """)
    assert result == tag  # the grandchild took the name, then the run returned
    assert _live_named(tag) == []


def _live_named(comm: str) -> list[int]:
    """Live host processes whose name is `comm`."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != comm:
                    continue
        except (OSError, ValueError):
            continue
        if is_alive(int(entry)):
            pids.append(int(entry))
    return pids


async def test_execute_setuid_binary(runner: Runner) -> None:
    """Executing a setuid-root binary under NO_NEW_PRIVS (privilege gain via suid exec)."""
    suids = [p for p in ("/usr/bin/passwd", "/usr/bin/su") if os.path.exists(p)
             and os.stat(p).st_mode & 0o4000]
    if not suids:
        pytest.skip("no setuid binary on this host")
    status: str = (await runner.run("children:status")).response["status"]
    # No privilege can be gained by any exec: NNP set, bounding set empty.
    assert "NoNewPrivs:\t1" in status
    assert "CapBnd:\t0000000000000000" in status
    for suid in suids:
        if suid.endswith("passwd"):
            argv = [suid, "-S", "root"]
        else:
            argv = [suid, "root", "-c", "cat /etc/shadow"]
        done = (await runner.exec(argv)).response
        # (As root the jail is uid 0 of its user namespace already: nothing
        # to gain, and /etc/shadow is not in its root, so passwd -S says L.)
        assert done.exit_code != 0 or os.getuid() == 0, (suid, done)
        assert b"root:" not in done.stdout, done.stdout
        assert b" P " not in done.stdout, done.stdout


def _nofile(pid: int) -> str:
    line = next(row for row in Path(f"/proc/{pid}/limits").read_text().splitlines()
                if row.startswith("Max open files"))
    return " ".join(line.split()[3:5])


async def test_prlimit_of_a_host_process(runner: Runner, victim: Victim) -> None:
    """prlimit64 on a host process of the same uid (cross-process DoS: shrink its limits)."""
    # Found by this suite (prlimit64 was allowed on any pid); now self-only.
    before = _nofile(victim.pid)
    for call in (f"resource.prlimit({victim.pid}, resource.RLIMIT_NOFILE)",
                 f"resource.prlimit({victim.pid}, resource.RLIMIT_NOFILE, (7, 7))"):
        await syscall_denied(runner, f"import resource; {call}", "prlimit64")
        assert _nofile(victim.pid) == before
    # The worker's own limits stay readable.
    assert await run_code(runner, "import resource; result = resource.getrlimit(7)[0]") > 0


async def test_tgkill_of_a_host_process(runner: Runner, victim: Victim) -> None:
    """tgkill (the thread-directed kill that bypasses a kill()-only filter) on a host process."""
    result = await run_code(runner, f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall(234, {victim.pid}, {victim.pid}, 9)  # tgkill(pid, pid, SIGKILL)
        result = [rc, errno.errorcode[ctypes.get_errno()]]
    """)
    assert result == [-1, "ESRCH"]  # not in the jail's PID namespace
    assert await victim.answers()


async def test_fsetown_sigio_to_a_host_process(runner: Runner, victim: Victim) -> None:
    """F_SETOWN + O_ASYNC: make the kernel send SIGIO (default: terminate) to a host process."""
    result = await run_code(runner, f"""
        import fcntl
        r, w = os.pipe()
        own = attempt(lambda: fcntl.fcntl(r, fcntl.F_SETOWN, {victim.pid}))
        fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)
        os.write(w, b"x")
        result = own
    """)
    assert result == "ESRCH"  # the host pid is not in the jail's PID namespace
    # SIGIO is sent in the write() itself, and its default action ends the victim.
    assert await victim.answers(), "SIGIO reached the host process"


async def test_kill_the_watchdog(runner: Runner) -> None:
    """Kill trunner's own watchdog (disable the parent-death cleanup before escaping)."""
    from trunner.linux.watchdog import watchdog_pid

    wd = watchdog_pid()
    if wd is None:
        pytest.skip("no watchdog process on this host")
    result = await run_code(runner, f"""
        import signal
        result = [attempt(lambda: os.kill({wd}, signal.SIGKILL)),
                  attempt(lambda: os.kill({wd}, signal.SIGSTOP))]
    """)
    assert result == ["ESRCH", "ESRCH"]  # not in the jail's PID namespace
    assert is_alive(wd)


async def test_concurrent_sibling_run(runner: Runner, jail_root: Path) -> None:
    """Another tenant's live run: write into its jail dir, signal it, read its /proc."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(runner.run, "children:sleep", 120.0,
                                    limits=runner.limits.replace(wall_time_s=150)))
        with trio.fail_after(60):
            while True:
                dirs = list(jail_root.iterdir())
                pids = [p for p in child_pids() if b"children:sleep" in _cmdline(p)]
                if dirs and pids:
                    break
                await trio.sleep(0.05)
        sibling_dir, sibling_pid = str(dirs[0]), pids[0]
        await wait_jailed(sibling_pid)  # the sibling is past its jail setup
        result = await run_code(runner, f"""
            import signal
            d = {sibling_dir!r}
            result = [attempt(lambda: open(d + "/planted", "w")),
                      attempt(lambda: os.listdir(d)),
                      attempt(lambda: os.kill({sibling_pid}, signal.SIGKILL)),
                      attempt(lambda: open("/proc/{sibling_pid}/environ").read()),
                      attempt(lambda: os.symlink("/", d + "/escape"))]
        """)
        # Neither its dir nor its processes are in this jail's root or PID namespace.
        assert result == ["ENOENT"] * 2 + ["ESRCH"] + ["ENOENT"] * 2
        assert not os.path.exists(sibling_dir + "/planted")
        assert is_alive(sibling_pid)
        nursery.cancel_scope.cancel()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
