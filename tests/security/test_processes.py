"""Process and kernel-interface escapes: signals, ptrace, sessions, namespaces,
dangerous syscalls, terminal injection, inherited fds, setuid binaries."""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from conftest import child_pids, landlock_abi_in_force
from support import (
    FOREIGN_ABI_C,
    READY,
    denied,
    is_alive,
    is_jailed,
    jail_ready,
    jailed_under,
    live_status,
    pid_namespace_members,
    proc_status,
    run_code,
    scaled,
    wait_until,
)
from trunner import Reason, Runner
from trunner.linux.plan import JAIL_ID

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
        with trio.fail_after(scaled(30)):
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
    the jail early, or stop its reaping; pid 1 is `trunner-waiter init`,
    which installs no signal handler). From Landlock
    ABI 6 the signal scope refuses them (EPERM); below, they are delivered to
    the init of the jail's own PID namespace,
    which the kernel shields from its namespace's signals it has no handler for:
    pid 1 runs on either way. Settled: pid 1 sleeps with no signal pending (a
    signal queued to it would be handled, stopping or ending it, before it
    sleeps again with the pending masks empty)."""
    result = await run_code(runner, f"""
        import signal, time
        result = [attempt(lambda: os.kill(1, sig))
                  for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP)]
        def pid1():
            with open("/proc/1/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
            return [fields["State"].split()[0], pending]
        give_up = time.monotonic() + {scaled(10)}
        while (state := pid1()) != ["S", 0] and time.monotonic() < give_up:
            time.sleep(0.005)
        result.append(state)
    """)
    sent = "EPERM" if landlock_abi_in_force() >= 6 else "OK:None"
    # Sleeping in waitid() with nothing pending: not stopped, not dead, nothing to come.
    assert result == [sent] * 4 + [["S", 0]]


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        # ptrace, process_vm_* and pidfd_send_signal are allowed: test_new_calls.py shows
        # the host's processes out of view and pid 1 and the adapter out of reach
        ("syscall(101, 16, PID, 0, 0)", "ESRCH"),  # ptrace(PTRACE_ATTACH): not in view
        ("syscall(101, 16, 1, 0, 0)", "EPERM"),  # the jail's pid 1: Landlock's scope
        ("syscall(438, os.pidfd_open(1), 0, 0)", "EPERM"),  # pidfd_getfd: fd theft
        ("syscall(312, PID, PID, 0, 0, 0)", "EPERM"),  # kcmp
        ("syscall(440, os.pidfd_open(1), 0, 0, 0, 0)", "EPERM"),  # process_madvise
    ],
)
async def test_ptrace_family_on_the_test_process(
    runner: Runner, call: str, expected: str
) -> None:
    """Ptrace of the test process / the jail's pid 1, and its cousins (fd theft,
    kcmp, memory advice). A pidfd can name only a process of the jail's PID
    namespace: its pid 1."""
    result = await run_code(runner, f"""
        tracer = open("/proc/1/status").read().split("TracerPid:")[1].split()[0]
        result = [{call.replace("PID", str(os.getpid()))}, tracer]
    """)
    assert result == [expected, "0"]
    assert proc_status(os.getpid())["TracerPid"] == "0"  # nothing attached to the test


# The state a jailed child can see change: its mounts, namespaces, root, personality,
# descriptors, keyrings and capabilities. Each denied call must leave it as it was.
STATE = """
def state():
    ns = {n: os.readlink("/proc/self/ns/" + n) for n in sorted(os.listdir("/proc/self/ns"))}
    status = open("/proc/self/status").read()
    caps = [line for line in status.splitlines() if line.startswith("Cap")]
    return [open("/proc/self/mountinfo").read(), ns, os.stat("/").st_ino,
            open("/proc/self/personality").read(), sorted(os.listdir("/proc/self/fd")), caps,
            os.getresuid(), os.getresgid()]
"""


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        # unshare and setns: test_jail.py's forbidden syscalls
        ("syscall(308, nsfd, 0)", "EPERM"),  # setns to a namespace file it holds
        ("syscall(165, b'none', b'.', b'tmpfs', 0, None)", "EPERM"),  # mount
        ("syscall(166, b'/usr', 2)", "EPERM"),  # umount2(MNT_DETACH)
        ("syscall(155, b'.', b'.')", "EPERM"),  # pivot_root
        ("syscall(161, b'.')", "EPERM"),  # chroot + fchdir escape
        ("syscall(56, 0x10000000 | 17, 0, 0, 0, 0)", "EPERM"),  # clone(CLONE_NEWUSER)
        ("syscall(56, 0x20008000 | 17, 0, 0, 0, 0)", "EPERM"),  # CLONE_NEWPID|CLONE_PARENT
        ("syscall(428, -100, b'/', 0)", "EPERM"),  # open_tree: the new mount API
        ("syscall(430, b'tmpfs', 0)", "EPERM"),  # fsopen
        ("syscall(429, -100, b'', -100, b'/tmp', 0)", "EPERM"),  # move_mount
        ("syscall(304, -100, None, 0)", "EPERM"),  # open_by_handle_at: shocker
        ("syscall(321, 0, 0, 0)", "EPERM"),  # bpf: eBPF verifier bugs
        ("syscall(298, 0, 0, -1, -1, 0)", "EPERM"),  # perf_event_open: CVE-2013-2094
        ("syscall(425, 1, 0)", "EPERM"),  # io_uring_setup: io_uring CVEs
        ("syscall(323, 0)", "EPERM"),  # userfaultfd: race-widening primitive
        ("syscall(250, 0, 0, 0, 0, 0)", "EPERM"),  # keyctl: CVE-2016-0728
        ("syscall(248, b'user', b'x', b'y', 1, -3)", "EPERM"),  # add_key to the session ring
        ("syscall(249, b'user', b'x', None, 0)", "EPERM"),  # request_key
        ("syscall(313, 0, b'', 0)", "EPERM"),  # finit_module
        ("syscall(176, b'ext4', 0)", "EPERM"),  # delete_module
        ("syscall(246, 0, 0, 0, 0)", "EPERM"),  # kexec_load
        ("syscall(135, 0x0400000)", "EPERM"),  # personality: READ_IMPLIES_EXEC
        ("syscall(135, 0x0040000)", "EPERM"),  # personality: ADDR_NO_RANDOMIZE
        ("syscall(103, 3, 0, 0)", "EPERM"),  # syslog: kernel log / kASLR leak
        ("syscall(227, 0, 0)", "EPERM"),  # clock_settime
        ("syscall(163, None)", "EPERM"),  # acct(NULL)
        ("syscall(169, 0xfee1dead, 672274793, 0x1234567, 0)", "EPERM"),  # reboot(RESTART)
        ("syscall(167, b'/dev/null', 0)", "EPERM"),  # swapon
        # capset, memfd_create, splice/vmsplice/tee, seccomp and landlock_* are allowed:
        # test_new_calls.py has the attacks their denials stopped
        ("syscall(206, 1, 0)", "ENOSYS"),  # io_setup: the host-wide fs.aio-max-nr
        ("syscall(2000)", "ENOSYS"),  # a number no kernel has
    ],
)
async def test_dangerous_syscalls(runner: Runner, call: str, expected: str) -> None:
    """Namespace/mount/kernel-attack-surface syscalls: each fails with its errno (EPERM
    for the dangerous families, ENOSYS for what the jail does not offer), the child
    carries on, and nothing it can see changed."""
    result = await run_code(runner, STATE + textwrap.dedent(f"""
        nsfd = os.open("/proc/self/ns/uts", os.O_RDONLY)
        before = state()
        got = {call}
        result = [got, state() == before]
    """))
    assert result == [expected, True]


async def test_setuid_family_reaches_only_held_ids(runner: Runner) -> None:
    """setuid/setresuid/setgid/setgroups are allowed (make, git and coreutils call them
    to the ids they hold): with no capabilities and one id mapped, any other id fails
    (EINVAL: unmapped; EPERM: no CAP_SETUID) and nothing changes."""
    result = await run_code(runner, STATE + textwrap.dedent("""
        before = state()
        uid, gid = os.getuid(), os.getgid()
        other = 0 if uid else 1
        result = {"same": [attempt(lambda: os.setuid(uid)), attempt(lambda: os.setgid(gid)),
                           attempt(lambda: os.setresuid(uid, uid, uid)),
                           attempt(lambda: os.setresgid(gid, gid, gid))],
                  "other": [attempt(lambda: os.setuid(other)),
                            attempt(lambda: os.setresuid(-1, other, -1)),
                            attempt(lambda: os.setgid(other)),
                            attempt(lambda: os.setgroups([other])),
                            attempt(lambda: os.setgroups([]))],
                  "overflow": [attempt(lambda: os.setuid(65534)) if uid != 65534 else "EINVAL"],
                  "unchanged": state() == before}
    """))
    assert result["same"] == ["OK:None"] * 4
    assert all(r in ("EINVAL", "EPERM") for r in result["other"]), result
    assert result["overflow"] in (["EINVAL"], ["EPERM"]), result
    assert result["unchanged"] is True


@pytest.fixture(scope="module")
def foreign_abi_probe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The probe's source, once this host runs both ABIs unfiltered."""
    if shutil.which("cc") is None or platform.machine() != "x86_64":
        pytest.skip("needs cc on x86_64")
    d = tmp_path_factory.mktemp("abi")
    (d / "probe.c").write_text(FOREIGN_ABI_C)
    subprocess.run(["cc", "-O0", "-o", str(d / "probe"), str(d / "probe.c")], check=True,
                   capture_output=True, timeout=scaled(60))
    for abi in ("x32", "i386"):
        out = subprocess.run([str(d / "probe"), abi], capture_output=True, timeout=scaled(30))
        if out.returncode != 0:
            pytest.skip(f"{abi} syscalls unusable here even unfiltered: {out.returncode}")
    return FOREIGN_ABI_C


@pytest.mark.parametrize("abi", ["x32", "i386"])
async def test_foreign_abi_syscall_kills_the_worker(
    runner: Runner, foreign_abi_probe: str, abi: str
) -> None:
    """The one kind of call that still kills: another architecture's (int 0x80) or an
    x32 number. The worker compiles the probe in its working dir and becomes it."""
    e = await denied(runner, f"""
        import subprocess
        open("probe.c", "w").write({foreign_abi_probe!r})
        subprocess.run(["cc", "-O0", "-o", "probe", "probe.c"], check=True)
        os.execv("./probe", ["./probe", {abi!r}])
    """)
    assert e.reason is Reason.SYSCALL_DENIED, (e.reason, e.detail)
    assert e.signal == signal.SIGSYS
    assert "SIGSYS" in e.detail


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
    """CVE-2017-5226 TIOCSTI (and TIOCLINUX, and the high-bits-smuggled TIOCSTI) on fds 0/1/2:
    EPERM from the filter (on a pipe the kernel itself would answer ENOTTY)."""
    result = await run_code(runner, f"""
        import ctypes
        c = ctypes.c_char(b"!")
        result = syscall(16, {fd}, ctypes.c_ulong({request_code}), ctypes.byref(c))
    """)
    assert result == "EPERM"


async def test_ordinary_ioctl_still_answers_enotty(runner: Runner) -> None:
    """Control for TIOCSTI: a harmless tty ioctl on the pipes gets ENOTTY, not a terminal."""
    result = await run_code(
        runner, "result = [attempt(lambda: os.tcgetpgrp(fd)) for fd in (0, 1, 2)]"
    )
    assert result == ["ENOTTY"] * 3


# Item 7 of issue 10: setsid is allowed, so a descendant can leave the worker's
# session and process group. Each of these must be dead when run() returns,
# however the run ends. Each descendant writes "pid sid ppid" (its own PID
# namespace's view) once it is set up; the worker checks it, then ends its way.
DESCENDANTS = {
    # a daemon: the child leaves the session; the worker carries on
    "setsid_daemon": """
        if os.fork() == 0:
            os.setsid()
            report()
            time.sleep(1000)
        """,
    # a double fork into its own session: the middle child exits, the grandchild is
    # the jail pid 1's orphan, in the middle child's session
    "double_fork_setsid": """
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                orphaned()
                report()
                time.sleep(1000)
            os._exit(0)
        os.wait()
        """,
    # a pid-1 orphan: its parent exits, it stays in the worker's session
    "pid1_orphan": """
        if os.fork() == 0:
            if os.fork() == 0:
                orphaned()
                report()
                time.sleep(1000)
            os._exit(0)
        os.wait()
        """,
}

DESCENDANT_PRELUDE = """
import json, time
r, w = os.pipe()
def report():
    os.write(w, b"%d %d %d" % (os.getpid(), os.getsid(0), os.getppid()))
def orphaned():
    while os.getppid() != 1:  # reparented to the jail's pid 1 once its parent is reaped
        time.sleep(0.005)
"""

# The run's end, once the host has read `ready` (it then creates `go`).
DESCENDANT_ENDINGS = {
    "exit": "",
    "deadline": "time.sleep(1000)\n",
    "cap": "os.write(1, b'x' * (1 << 20))\ntime.sleep(1000)\n",  # past stdout_max_bytes
}


def _check_setup(kind: str, info: dict[str, int]) -> None:
    """What the descendant reported: the escape was really set up."""
    pid, sid, ppid = info["pid"], info["sid"], info["ppid"]
    if kind == "setsid_daemon":
        assert (sid, ppid) == (pid, info["worker"]), info  # its own session
    elif kind == "double_fork_setsid":
        assert ppid == 1, info
        assert sid not in (pid, info["worker_sid"]), info  # the middle child's session
    else:
        assert (ppid, sid) == (1, info["worker_sid"]), info


def live_members(ns: str) -> list[int]:
    """Host pids in PID namespace `ns` that are not zombies (a zombie is dead: it
    holds no memory and no descriptor)."""
    return [pid for pid in pid_namespace_members(ns) if is_alive(pid)]


@pytest.mark.parametrize("ending", [
    pytest.param(e, marks=pytest.mark.slow) if e == "deadline" else e for e in DESCENDANT_ENDINGS])
@pytest.mark.parametrize("kind", DESCENDANTS)
async def test_descendants_are_dead_when_run_returns(
    runner: Runner, kind: str, ending: str
) -> None:
    """A setsid daemon, a double fork into its own session and a pid-1 orphan are all
    dead when run() returns: after a clean exit, on the deadline and on a cap breach
    (the kernel kills a PID namespace with its pid 1; the helper kills pid 1)."""
    code = READY + DESCENDANT_PRELUDE + textwrap.dedent(DESCENDANTS[kind]) + """
info = dict(zip(("pid", "sid", "ppid"), map(int, os.read(r, 64).split())))
info.update(worker=os.getpid(), worker_sid=os.getsid(0), ns=os.readlink("/proc/self/ns/pid"))
result = info
""" + ("ready(info)\n" if ending != "exit" else "") + DESCENDANT_ENDINGS[ending]
    limits = runner.limits.replace(wall_time_s=6 if ending == "deadline" else 30,
                                   stdout_max_bytes=64 << 10)
    if ending == "exit":
        info = await run_code(runner, code, limits=limits)
    else:
        errors: list[Reason] = []

        async def run() -> None:
            errors.append((await denied(runner, code, limits=limits)).reason)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            _, info = await jail_ready()
        assert errors == [Reason.TIMEOUT if ending == "deadline" else Reason.STDOUT_CAP]
    _check_setup(kind, info)
    assert live_members(info["ns"]) == [], (kind, ending)


async def test_a_descendant_slow_to_die_is_dead_when_run_returns(runner: Runner) -> None:
    """A grandchild that let go of the pipes and holds memory that takes a
    while to free: nothing waits on its pipes, yet it must be dead, not
    merely SIGKILLed, when run() returns (as root the cgroup is emptied;
    not root, only the group is there to wait on)."""
    result = await run_code(runner, """
        import time
        r, w = os.pipe()
        if os.fork() == 0:
            if os.fork() == 0:
                ballast = b"\\1" * (384 << 20)  # touched pages: exit has to free them
                os.write(w, str(os.getpid()).encode())
                os.closerange(0, 1024)
                time.sleep(1000)
            os._exit(0)
        os.wait()
        os.close(w)
        result = [int(os.read(r, 32)), os.readlink("/proc/self/ns/pid")]
    """)
    pid, ns = result
    assert pid > 2  # its pid in the jail's namespace: the host knows it by another
    # Not a zombie, and not still exiting (freeing its ballast): gone or a zombie.
    assert live_members(ns) == []


# A daemon as `daemon(3)` makes one, run by `exec`: the program is in a session
# of its own (issue 19), and this escapes that too: a new session, a new
# process group in it, a double fork, stdio on /dev/null, every catchable
# signal ignored. Only the PID namespace, which ends with pid 1, holds it.
DAEMON = """
import os, signal, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.setpgid(0, 0)
        for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
            try:
                signal.signal(sig, signal.SIG_IGN)
            except OSError:
                pass
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.write(w, b"%d %d %d" % (os.getpid(), os.getsid(0), os.getpgid(0)))
        os.close(w)
        time.sleep(1000)
    os._exit(0)
os.wait()
os.close(w)
pid, sid, pgid = map(int, os.read(r, 64).split())
print(pid, sid, pgid, os.getpid(), os.getsid(0), os.readlink("/proc/self/ns/pid"))
"""


async def test_a_daemon_that_left_every_group_is_dead_when_exec_returns(
    runner: Runner, jail_root: Path
) -> None:
    result = (await runner.exec([sys.executable, "-c", DAEMON])).response
    assert result.exit_code == 0, result.stderr
    pid, sid, pgid, program, program_sid, ns = result.stdout.decode().split()
    # It left the program's session and group, and the adapter's (pid 2).
    assert pid == pgid, result
    assert sid not in (pid, program, "2"), result
    assert program_sid == program, result
    assert live_members(ns) == []
    assert jailed_under(str(jail_root)) == []


async def test_execute_setuid_binary(runner: Runner) -> None:
    """Executing a setuid-root binary under NO_NEW_PRIVS (privilege gain via suid exec):
    it runs as the jail's uid, refuses (exit 1), shows nothing of root's, and what it
    would do as root is not done. Its wording is not asserted: it depends on the
    host's nsswitch.conf, PAM stack and shadow version."""
    suids = [p for p in ("/usr/bin/passwd", "/usr/bin/su") if os.path.exists(p)
             and os.stat(p).st_mode & 0o4000]
    if not suids:
        pytest.skip("no setuid binary (passwd, su) on this host")
    status: str = (await runner.run("children:status")).response["status"]
    # No privilege can be gained by any exec: NNP set, bounding set empty. The
    # jail is uid 1000 whoever the caller is (root too), and stays it.
    assert "NoNewPrivs:\t1" in status
    assert "CapBnd:\t0000000000000000" in status
    assert f"Uid:\t{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}\n" in status
    for suid in suids:
        if suid.endswith("passwd"):
            argv = [suid, "-S", "root"]  # root's password status: root may read it, no one else
        else:  # as root, it would leave its euid in `gained` and print the shadow file
            argv = [suid, "root", "-c", "id -u > gained; cat /etc/shadow"]
        done = (await runner.exec(argv, collect=["gained"])).response
        # The setuid bit gave nothing: each refuses the jail's uid (passwd's E_NOPERM,
        # su's authentication failure: no password on stdin), both exit 1.
        assert (done.exit_code, done.signal) == (1, None), (suid, done)
        assert done.stdout == b"", (suid, done.stdout)
        # No line of root's: a shadow entry ("root:...") or passwd -S's status ("root P ...").
        assert not re.search(rb"(?m)^root[: ]", done.stderr), (suid, done.stderr)
        # su's command never ran: no `gained`, with or without euid 0 in it.
        assert (done.files, done.unmatched) == ([], ["gained"]), (suid, done)


def _nofile(pid: int) -> str:
    line = next(row for row in Path(f"/proc/{pid}/limits").read_text().splitlines()
                if row.startswith("Max open files"))
    return " ".join(line.split()[3:5])


async def test_prlimit_of_a_host_process(runner: Runner, victim: Victim) -> None:
    """prlimit64 on a host process of the same uid (cross-process DoS: shrink its limits),
    or on the jail's pid 1 (its reaper)."""
    # Found by this suite (prlimit64 was allowed on any pid); now self-only: EPERM for
    # any other pid, before the kernel would say ESRCH (the host pid is not in view).
    before = _nofile(victim.pid)
    result = await run_code(runner, f"""
        import resource
        result = [attempt(lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, *new))
                  for pid in ({victim.pid}, 1) for new in ((), ((7, 7),))]
        result.append(resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # its own: readable
        result.append(open("/proc/1/limits").read().count("Max open files       7 "))
    """)
    assert result[:4] == ["EPERM"] * 4
    assert result[4] > 0
    assert result[5] == 0
    assert _nofile(victim.pid) == before


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
        def sibling() -> tuple[str, int] | None:
            dirs = list(jail_root.iterdir())
            pids = [p for p in child_pids() if b"children:sleep" in _cmdline(p)]
            return (str(dirs[0]), pids[0]) if dirs and pids else None

        sibling_dir, sibling_pid = await wait_until(sibling, 60, "the sibling's dir and helper")
        # The sibling is past its jail setup.
        await wait_until(lambda: is_jailed(live_status(sibling_pid)), 30, "the sibling jailed")
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
