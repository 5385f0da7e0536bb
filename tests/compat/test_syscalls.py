"""Ordinary system calls that answered ENOSYS or EPERM in the jail before the
allow-list was anchored on Docker's default profile (issue 19): each newly
allowed call really works, run in a real jail, its real output asserted.
The attacks the old denials stopped, and the layers that stop them now,
are in tests/security/test_new_calls.py."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import pytest

from support import no_memory_cgroup_reason, run_code

if TYPE_CHECKING:
    from trunner import ExecResult, Limits, Runner


def _need(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not on this host: {', '.join(missing)} (scripts/setup installs them)")


async def _sh(runner: Runner, script: str, limits: Limits | None = None) -> ExecResult:
    done = (await runner.exec(["/bin/sh", "-c", script], limits=limits)).response
    assert done.exit_code == 0, (done.exit_code, done.signal, done.stdout, done.stderr)
    return done


@pytest.mark.skipif(no_memory_cgroup_reason() is not None,
                    reason=f"{no_memory_cgroup_reason()} (tests/security/test_new_calls.py)")
async def test_memfd_create_holds_and_maps_bytes(runner: Runner) -> None:
    result = await run_code(runner, """
        import mmap
        fd = os.memfd_create("buf", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.write(fd, b"in memory")
        with mmap.mmap(fd, 9) as m:
            mapped = bytes(m[:9])
        result = [mapped, os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size]
        os.close(fd)
    """)
    assert result == [b"in memory", "/memfd:buf (deleted)", 9]


async def test_preadv_pwritev_and_their_v2_forms(runner: Runner) -> None:
    result = await run_code(runner, """
        fd = os.open("v", os.O_RDWR | os.O_CREAT, 0o600)
        wrote = os.pwritev(fd, [b"ab", b"cd"], 0)
        wrote2 = os.pwritev(fd, [b"EF"], 4, os.RWF_DSYNC)  # pwritev2
        a, b = bytearray(3), bytearray(3)
        read = os.preadv(fd, [a, b], 0)
        c = bytearray(2)
        read2 = os.preadv(fd, [c], 4, os.RWF_HIPRI)  # preadv2
        os.close(fd)
        result = [wrote, wrote2, read, bytes(a + b), read2, bytes(c)]
    """)
    assert result == [4, 2, 6, b"abcdEF", 2, b"EF"]


async def test_posix_fallocate_reserves_the_bytes(runner: Runner) -> None:
    result = await run_code(runner, """
        fd = os.open("big", os.O_RDWR | os.O_CREAT, 0o600)
        os.posix_fallocate(fd, 0, 1 << 20)
        st = os.fstat(fd)
        os.close(fd)
        result = [st.st_size, st.st_blocks * 512 >= 1 << 20]
    """)
    assert result == [1 << 20, True]


async def test_sigpending_sigtimedwait_sigwait_and_pause(runner: Runner) -> None:
    result = await run_code(runner, """
        import signal, time
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGUSR2])
        os.kill(os.getpid(), signal.SIGUSR1)
        pending = sorted(signal.sigpending())
        info = signal.sigtimedwait([signal.SIGUSR1], 5)
        none = signal.sigtimedwait([signal.SIGUSR1], 0.01)
        os.kill(os.getpid(), signal.SIGUSR2)
        waited = signal.sigwait([signal.SIGUSR2])
        # the itimer case of CPython's test_signal: pause() until SIGALRM's handler ran
        fired = []
        signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        signal.pause()
        result = [pending == [signal.SIGUSR1], info.si_signo == signal.SIGUSR1,
                  info.si_pid == os.getpid(), none, waited == signal.SIGUSR2, fired,
                  time.monotonic() - start >= 0.15]
    """)
    assert result == [True, True, True, None, True, [1], True]


async def test_nice_and_setpriority_of_a_child(runner: Runner) -> None:
    result = await run_code(runner, """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        os.setpriority(os.PRIO_PROCESS, child.pid, 7)
        theirs = os.getpriority(os.PRIO_PROCESS, child.pid)
        child.kill()
        child.wait()
        mine = os.nice(3)
        back = attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, mine - 3))  # raising: EACCES
        result = [theirs, mine, os.getpriority(os.PRIO_PROCESS, 0), back]
    """)
    assert result[0] == 7
    assert result[1] == result[2] >= 3
    assert result[3] in ("EACCES", "EPERM")  # the kernel's: no CAP_SYS_NICE


async def test_sched_setaffinity_and_setscheduler(runner: Runner) -> None:
    result = await run_code(runner, """
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[-1]})
        pinned = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        batch = os.sched_getscheduler(0) == os.SCHED_BATCH
        os.sched_setparam(0, os.sched_param(0))
        fifo = attempt(lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)))
        result = [pinned == cpus[-1:], batch, fifo]
    """)
    assert result == [True, True, "EPERM"]  # realtime: the kernel's, no CAP_SYS_NICE


async def test_taskset_and_nice_tools(runner: Runner) -> None:
    _need("taskset", "nice")
    done = await _sh(runner, "taskset -c 0 sh -c 'taskset -p $$' && nice -n 5 nice")
    lines = done.stdout.decode().splitlines()
    assert lines[0].endswith("current affinity mask: 1"), lines
    assert lines[1] == "5", lines


async def test_mkfifo_and_a_unix_socket_node(runner: Runner) -> None:
    result = await run_code(runner, """
        import socket, stat
        os.mkfifo("fifo", 0o600)
        pid = os.fork()
        if pid == 0:
            with open("fifo", "wb") as f:
                f.write(b"through the fifo")
            os._exit(0)
        with open("fifo", "rb") as f:
            got = f.read()
        os.waitpid(pid, 0)
        os.mknod("sock", 0o600 | stat.S_IFSOCK)
        os.mknod("plain", 0o600 | stat.S_IFREG)
        result = [got, stat.S_ISFIFO(os.stat("fifo").st_mode),
                  stat.S_ISSOCK(os.stat("sock").st_mode), stat.S_ISREG(os.stat("plain").st_mode)]
    """)
    assert result == [b"through the fifo", True, True, True]


async def test_mkfifo_tool(runner: Runner) -> None:
    _need("mkfifo")
    done = await _sh(runner, "mkfifo p && (echo piped > p &) && cat p && ls -l p | cut -c1")
    assert done.stdout == b"piped\np\n"


async def test_ptrace_of_an_own_child(runner: Runner) -> None:
    """What a debugger does: the child asks to be traced, stops; the parent reads its
    memory (PTRACE_PEEKDATA and process_vm_readv), writes it (process_vm_writev) and
    lets it go on."""
    result = await run_code(runner, """
        import ctypes, signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.restype = ctypes.c_long
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        secret = ctypes.create_string_buffer(b"child's bytes")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            libc.ptrace(0, 0, None, None)  # PTRACE_TRACEME
            os.kill(os.getpid(), signal.SIGSTOP)
            os.write(w, secret.value)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        stopped = os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGSTOP
        addr = ctypes.addressof(secret)
        word = libc.ptrace(2, pid, addr, None)  # PTRACE_PEEKDATA: the same address
        class iovec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(13)
        local, remote = iovec(ctypes.addressof(buf), 13), iovec(addr, 13)
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        read = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        new = ctypes.create_string_buffer(b"tracer's word")
        local = iovec(ctypes.addressof(new), 13)
        libc.process_vm_writev.restype = ctypes.c_ssize_t
        wrote = libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        libc.ptrace(7, pid, None, None)  # PTRACE_CONT
        _, status = os.waitpid(pid, 0)
        result = [stopped, word.to_bytes(8, "little"), read, buf.raw, wrote,
                  os.read(r, 64), os.WEXITSTATUS(status)]
    """)
    assert result == [True, b"child's ", 13, b"child's bytes", 13, b"tracer's word", 0]


async def test_strace_of_a_command(runner: Runner) -> None:
    _need("strace")
    done = await _sh(runner, "strace -f -qq -e trace=write -o trace echo traced && cat trace")
    out = done.stdout.decode()
    assert out.startswith("traced\n"), out
    call = out.splitlines()[1].split(None, 1)[1]  # past the pid strace -f prefixes
    assert call.startswith('write(1, "traced\\n", 7)'), out
    assert call.endswith("= 7"), out


async def test_pty_openpty_and_a_program_reading_its_own_pty(runner: Runner) -> None:
    result = await run_code(runner, """
        import pty, termios, tty
        master, slave = pty.openpty()
        name = os.ttyname(slave)
        tty.setraw(slave)
        raw = termios.tcgetattr(slave)[3] & termios.ECHO == 0
        os.write(master, b"typed")
        got = os.read(slave, 5)
        os.write(slave, b"shown")
        shown = os.read(master, 5)
        pid, fd = pty.fork()
        if pid == 0:  # a session leader with the pty as controlling terminal
            with open("/dev/tty", "rb+", buffering=0) as t:
                t.write(b"%d %s" % (os.isatty(0), os.ttyname(0).encode()))
            os._exit(0)
        said = os.read(fd, 64)
        _, status = os.waitpid(pid, 0)
        result = [name.startswith("/dev/pts/"), raw, got, shown, said.split()[0],
                  said.split()[1].startswith(b"/dev/pts/"), status,
                  os.readlink("/dev/ptmx"), sorted(os.listdir("/dev/pts"))[-1]]
    """)
    assert result == [True, True, b"typed", b"shown", b"1", True, 0, "pts/ptmx", "ptmx"]


async def test_script_runs_a_command_on_a_pty(runner: Runner) -> None:
    _need("script", "stty")
    done = await _sh(runner, "script -qc 'echo hi; tty; stty size' /dev/null")
    lines = done.stdout.decode().split("\r\n")
    assert lines[0] == "hi", lines
    assert lines[1].startswith("/dev/pts/"), lines
    assert lines[2] == "0 0", lines


async def test_terminal_window_size_and_job_control_ioctls(runner: Runner) -> None:
    result = await run_code(runner, """
        import fcntl, pty, signal, struct, termios
        master, slave = pty.openpty()
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        size = os.get_terminal_size(slave)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
                ok = os.tcgetpgrp(slave) == os.getpgrp() == os.getsid(0)
                os.tcsetpgrp(slave, os.getpgrp())
                signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a leader's TIOCNOTTY hangs up
                fcntl.ioctl(slave, termios.TIOCNOTTY)
                ok = ok and attempt(lambda: os.tcgetpgrp(slave)) == "ENOTTY"
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        termios.tcdrain(slave)
        termios.tcflush(slave, termios.TCIOFLUSH)
        result = [(size.lines, size.columns), status]
    """)
    assert result == [[40, 120], 0]


@pytest.mark.skipif(no_memory_cgroup_reason() is not None,
                    reason=f"{no_memory_cgroup_reason()} (tests/security/test_new_calls.py)")
async def test_seccomp_and_landlock_confine_a_program_further(runner: Runner) -> None:
    """A nested sandbox: a child installs its own filter (getppid fails EPERM) and
    its own Landlock ruleset (no file may be read); both only add to the jail's."""
    result = await run_code(runner, """
        import ctypes, struct
        libc = ctypes.CDLL(None, use_errno=True)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            # BPF: getcwd (79) -> ERRNO(EPERM), anything else allowed.
            prog = [(0x20, 0, 0, 0), (0x15, 0, 1, 79), (0x06, 0, 0, 0x50001),
                    (0x06, 0, 0, 0x7FFF0000)]
            code = b"".join(struct.pack("HBBI", *insn) for insn in prog)
            buf = ctypes.create_string_buffer(code)
            fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
            rc = libc.syscall(317, 1, 0, fprog)  # seccomp(SET_MODE_FILTER)
            cwd = attempt(os.getcwd)
            attr = struct.pack("QQQ", 1 << 2, 0, 0)  # handled: READ_FILE
            ruleset = libc.syscall(444, attr, 24, 0)
            restricted = libc.syscall(446, ruleset, 0)
            read = attempt(lambda: open("/etc/hostname").read())
            os.write(w, repr([rc, cwd, ruleset > 0, restricted, read]).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        result = [eval(os.read(r, 200)), attempt(os.getcwd)]
    """)
    assert result == [[0, "EPERM", True, 0, "EACCES"], "OK:'/home/trunner'"]


async def test_pidfd_send_signal_to_an_own_child(runner: Runner) -> None:
    result = await run_code(runner, """
        import signal, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        fd = os.pidfd_open(child.pid)
        signal.pidfd_send_signal(fd, signal.SIGTERM)
        os.close(fd)
        result = child.wait()
    """)
    assert result == -15


async def test_splice_tee_and_vmsplice(runner: Runner) -> None:
    result = await run_code(runner, """
        import ctypes
        with open("src", "wb") as f:
            f.write(b"spliced bytes")
        src = os.open("src", os.O_RDONLY)
        r, w = os.pipe()
        moved = os.splice(src, w, 13)
        r2, w2 = os.pipe()
        libc = ctypes.CDLL(None, use_errno=True)
        teed = libc.tee(r, w2, 13, 0)
        class iovec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        data = ctypes.create_string_buffer(b"!")
        vm = libc.vmsplice(w2, ctypes.byref(iovec(ctypes.addressof(data), 1)), 1, 0)
        result = [moved, os.read(r, 64), teed, vm, os.read(r2, 64)]
    """)
    assert result == [13, b"spliced bytes", 13, 1, b"spliced bytes!"]


async def test_name_to_handle_at_names_a_file(runner: Runner) -> None:
    result = await run_code(runner, """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        open("f", "w").close()
        handle = ctypes.create_string_buffer(struct_size := 8 + 128)
        ctypes.memmove(handle, (128).to_bytes(4, "little"), 4)
        mount_id = ctypes.c_int()
        rc = libc.name_to_handle_at(-100, b"f", handle, ctypes.byref(mount_id), 0)
        result = [rc, int.from_bytes(handle.raw[:4], "little") > 0]
    """)
    assert result == [0, True]


async def test_eventfd_timerfd_signalfd_and_netlink(runner: Runner) -> None:
    result = await run_code(runner, """
        import ctypes, socket, struct
        libc = ctypes.CDLL(None, use_errno=True)
        efd = os.eventfd(0)
        os.eventfd_write(efd, 3)
        counted = os.eventfd_read(efd)
        tfd = libc.timerfd_create(1, 0)  # CLOCK_MONOTONIC
        spec = struct.pack("qqqq", 0, 0, 0, 1000)  # once, in 1 us
        libc.timerfd_settime(tfd, 0, spec, None)
        expirations = struct.unpack("Q", os.read(tfd, 8))[0]
        mask = ctypes.create_string_buffer(8)
        sfd = libc.signalfd(-1, mask, 0)
        result = [counted, expirations >= 1, sfd > 0, socket.if_nameindex()]
    """)
    assert result == [3, True, True, [[1, "lo"]]]


@pytest.mark.slow  # long: CPython's own test cases, itimers of seconds
async def test_cpython_test_signal_itimer_and_pending_cases(runner: Runner) -> None:
    """CPython's own ItimerTest (test_itimer_real used to fail: signal.pause() came
    back at once, ENOSYS) and PendingSignalsTests, run in the jail."""
    if not os.path.exists("/usr/lib/python3.11/test/test_signal.py"):
        pytest.skip("no CPython test suite here (apt-get install libpython3.11-testsuite)")
    limits = runner.limits.replace(wall_time_s=120, cpu_time_s=100)
    done = (await runner.exec(
        ["/usr/bin/python3.11", "-m", "unittest", "-v", "test.test_signal.ItimerTest",
         "test.test_signal.PendingSignalsTests"], limits=limits)).response
    err = done.stderr.decode()
    assert done.exit_code == 0, err
    assert "test_itimer_real (test.test_signal.ItimerTest.test_itimer_real) ... ok" in err, err
    assert "test_sigtimedwait (" in err, err
    assert "FAIL" not in err, err
    assert "ERROR" not in err, err


async def test_adjtimex_queries_the_clock(runner: Runner) -> None:
    result = await run_code(runner, """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        timex = ctypes.create_string_buffer(208)  # modes 0: a query
        state = libc.adjtimex(timex)
        timex = ctypes.create_string_buffer(b"\\x01\\x00\\x00\\x00" + bytes(204))  # ADJ_OFFSET
        set_ = libc.adjtimex(timex)
        result = [state >= 0, set_, errno.errorcode[ctypes.get_errno()]]
    """)
    assert result == [True, -1, "EPERM"]  # the kernel's: no CAP_SYS_TIME over the host
