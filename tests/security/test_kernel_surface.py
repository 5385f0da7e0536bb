"""Kernel surface reached through files and processes the jail can see: ioctl
on host files, leases and locks on host files, and clone(CLONE_PARENT).

The victim is a file the test owns, on the root filesystem, in a directory
passed as an import path (read-only in the jail). Where the host must act
while the jailed child holds something, the child binds a unix socket
`sync` in its jail dir once it is ready and waits for the host to connect."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from conftest import TESTS_DIR, child_pids, make_runner
from support import host_children, pid_namespace_members, run_code, scaled, wait_until
from trunner import Limits, Runner

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IOC_GETVERSION = 0x80087601
FS_IOC_SETVERSION = 0x40087602
FS_IOC_FSGETXATTR = 0x801C581F
FS_IOC_FSSETXATTR = 0x401C5820
FS_SYNC_FL, FS_NODUMP_FL, FS_NOATIME_FL, FS_EXTENT_FL = 0x8, 0x40, 0x80, 0x80000


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    ro = tmp_path / "ro"
    ro.mkdir()
    path = ro / "victim"
    path.write_bytes(b"host data\n")
    return path


@pytest.fixture
def host_runner(jail_root: Path, victim: Path) -> Runner:
    return make_runner(import_paths=[TESTS_DIR, str(victim.parent)], temp_root=str(jail_root),
                       limits=Limits(wall_time_s=20.0))


def _flags_and_version(path: Path) -> tuple[int, int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 4))[0]
        version = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETVERSION, b"\0" * 4))[0]
    finally:
        os.close(fd)
    return flags, version


async def test_inode_ioctls_on_a_host_file(host_runner: Runner, victim: Path) -> None:
    """FS_IOC_SETFLAGS/SETVERSION/FSSETXATTR on a host file opened read-only (the jail's
    root owns it): sync/nodump/noatime set, generation rewritten, extents migrated."""
    before = _flags_and_version(victim)
    new = (before[0] | FS_SYNC_FL | FS_NODUMP_FL | FS_NOATIME_FL) & ~FS_EXTENT_FL
    result = await run_code(host_runner, f"""
        import fcntl, struct
        fd = os.open({str(victim)!r}, os.O_RDONLY)
        result = {{
            "getflags": attempt(lambda: fcntl.ioctl(fd, {FS_IOC_GETFLAGS}, b"\\0" * 4)),
            "setflags": attempt(
                lambda: fcntl.ioctl(fd, {FS_IOC_SETFLAGS}, struct.pack("i", {new}))),
            "setversion": attempt(
                lambda: fcntl.ioctl(fd, {FS_IOC_SETVERSION}, struct.pack("i", 4242))),
            "fsgetxattr": attempt(lambda: fcntl.ioctl(fd, {FS_IOC_FSGETXATTR}, b"\\0" * 28)),
            "fssetxattr": attempt(lambda: fcntl.ioctl(fd, {FS_IOC_FSSETXATTR}, b"\\0" * 28)),
        }}
    """)
    assert result == dict.fromkeys(
        ("getflags", "setflags", "setversion", "fsgetxattr", "fssetxattr"), "ENOTTY"
    ), result
    assert _flags_and_version(victim) == before


async def test_ordinary_ioctls_still_work(runner: Runner) -> None:
    """The allow-list: FIONREAD, FIONBIO, FIOCLEX/FIONCLEX do their job; terminal queries
    reach the kernel (ENOTTY on a pipe); anything else is ENOTTY from the filter, even
    on the jail's own files."""
    result = await run_code(runner, """
        import fcntl, struct, termios
        r, w = os.pipe()
        os.write(w, b"abc")
        nread = struct.unpack("i", fcntl.ioctl(r, termios.FIONREAD, b"\\0" * 4))[0]
        fcntl.ioctl(r, termios.FIONBIO, struct.pack("i", 1))
        nonblock = bool(fcntl.fcntl(r, fcntl.F_GETFL) & os.O_NONBLOCK)
        fcntl.ioctl(r, termios.FIOCLEX)
        cloexec = fcntl.fcntl(r, fcntl.F_GETFD)
        fcntl.ioctl(r, termios.FIONCLEX)
        result = [nread, nonblock, cloexec, fcntl.fcntl(r, fcntl.F_GETFD),
                  attempt(lambda: fcntl.ioctl(r, termios.TCGETS, b"\\0" * 64)),
                  attempt(lambda: os.get_terminal_size(r))]
        with open("f", "wb") as f:  # FIOQSIZE (not listed) would answer 0 on a jail file
            result.append(attempt(lambda: fcntl.ioctl(f.fileno(), 0x5460, b"\\0" * 8)))
    """)
    assert result == [3, True, fcntl.FD_CLOEXEC, 0, "ENOTTY", "ENOTTY", "ENOTTY"], result


_SYNC = f"""
import socket
s = socket.socket(socket.AF_UNIX)
s.bind("sync.tmp")
s.listen()
os.rename("sync.tmp", "sync")  # seen by the host only once it listens
s.settimeout({scaled(15)})
s.accept()[0].recv(1)
"""


async def _while_held(
    runner: Runner, jail_root: Path, code: str, host: Callable[[], Awaitable[Any]]
) -> tuple[Any, Any]:
    """Run `code` in the jail; once it binds `sync`, run `host()`, then release it."""
    out: dict[str, Any] = {}

    async def jailed() -> None:
        out["child"] = await run_code(runner, textwrap.dedent(code) + _SYNC)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(jailed)
        # The jail binds `sync` in its working dir (its own scratch):
        # reached from the host through the jail's /proc/PID/cwd.
        hits = await wait_until(_jail_sockets, 15, "the jail's `sync` socket")
        try:
            out["host"] = await host()
        finally:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(hits[0])
                s.sendall(b"x")
    return out["child"], out["host"]


def _jail_sockets() -> list[str]:
    hits = []
    for helper in child_pids():
        for init in host_children(helper):
            for jail in host_children(init):
                path = f"/proc/{jail}/cwd/sync"
                if os.path.exists(path):
                    hits.append(path)
    return hits


def _open_for_write_nonblocking(path: Path) -> str:
    # O_NONBLOCK: an open that would wait for a lease break fails EWOULDBLOCK instead.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        return errno.errorcode[e.errno or 0]
    os.close(fd)
    return "opened"


async def test_lease_on_a_host_file(host_runner: Runner, jail_root: Path, victim: Path) -> None:
    """F_SETLEASE(F_RDLCK) on a host file opened read-only: every host writer's open()
    would wait for the jail (up to lease-break-time) or fail EWOULDBLOCK."""
    code = f"""
        import fcntl
        fd = os.open({str(victim)!r}, os.O_RDONLY)
        result = [attempt(lambda: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)),
                  attempt(lambda: fcntl.fcntl(fd, fcntl.F_GETLEASE))]
    """

    async def host() -> str:
        return _open_for_write_nonblocking(victim)

    child, opened = await _while_held(host_runner, jail_root, code, host)
    assert child == ["EPERM", f"OK:{fcntl.F_UNLCK}"], child
    assert opened == "opened"


def _host_locks(path: Path) -> list[str]:
    out = []
    fd = os.open(path, os.O_RDWR)
    try:
        for lock in (lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB),
                     lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)):
            try:
                lock()
                out.append("locked")
            except OSError as e:
                out.append(errno.errorcode[e.errno or 0])
    finally:
        os.close(fd)
    return out


async def test_advisory_locks_on_a_host_file_end_with_the_run(
    host_runner: Runner, jail_root: Path, victim: Path
) -> None:
    """Advisory locks stay allowed (sqlite in the jail dir needs F_SETLK): a jailed
    flock/F_SETLK on a readable host file holds only while the run lasts."""
    code = f"""
        import fcntl
        fd = os.open({str(victim)!r}, os.O_RDONLY)
        result = [attempt(lambda: fcntl.flock(fd, fcntl.LOCK_EX)),
                  attempt(lambda: fcntl.lockf(fd, fcntl.LOCK_SH))]
    """

    async def host() -> list[str]:
        return _host_locks(victim)

    child, during = await _while_held(host_runner, jail_root, code, host)
    assert child == ["OK:None", "OK:None"]
    assert during == [errno.errorcode[errno.EAGAIN]] * 2, during
    assert _host_locks(victim) == ["locked", "locked"]  # the run is over: so are its locks


def _zombies_of(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == pid:
            out.add(int(entry))
    return out


@pytest.mark.parametrize("exit_signal", [17, 0])  # SIGCHLD; none (a "clone" child)
async def test_clone_parent_leaves_no_child_in_the_host(runner: Runner, exit_signal: int) -> None:
    """clone(CLONE_PARENT) from the worker: once a zombie of trunner's (the worker was
    the group leader), it is now allowed. The worker is the jail's pid 2: the new
    process is a child of the jail's pid 1, which reaps it, or the kernel with the
    namespace. Nothing reaches the test process, and the namespace ends empty."""
    before = _zombies_of(os.getpid())
    try:
        result = await run_code(runner, f"""
            import ctypes, time
            r, w = os.pipe()
            libc = ctypes.CDLL(None, use_errno=True)
            pid = libc.syscall(56, 0x8000 | {exit_signal}, 0, 0, 0, 0)  # CLONE_PARENT
            if pid == 0:
                os.write(w, b"%d %d" % (os.getpid(), os.getppid()))
                if {exit_signal} == 0:
                    time.sleep(1000)  # outlives the worker: the namespace's end kills it
                os._exit(0)
            child, parent = map(int, os.read(r, 64).split())
            result = [pid > 0, child == pid, parent, attempt(lambda: os.waitpid(pid, os.WNOHANG)),
                      os.readlink("/proc/self/ns/pid")]
        """)
        # A sibling of the worker: pid 1's child, not the worker's (ECHILD).
        assert result[:4] == [True, True, 1, "ECHILD"], result
        assert pid_namespace_members(result[4]) == []
        assert child_pids() == []
    finally:
        new = _zombies_of(os.getpid()) - before
        for pid in new:
            # Not trio's: reaped so that a failure leaves nothing behind (a zombie: no wait).
            os.waitpid(pid, 0)  # noqa: ASYNC222
    assert not new, new


@pytest.fixture
def blocked_victim() -> Iterator[subprocess.Popen[str]]:
    """A host process in its own group with SIGUSR1 blocked, so a delivered one stays
    visible as pending in /proc/PID/status."""
    code = ("import signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1}); "
            "print('ready', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()


def _pending(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


async def test_sigio_with_f_setsig_to_a_host_process_and_group(
    runner: Runner, blocked_victim: subprocess.Popen[str]
) -> None:
    """F_SETSIG picks the signal, F_SETOWN_EX aims it at a host pid or process group,
    O_ASYNC fires it on every write: recording is allowed, delivery is not (Landlock's
    signal scope covers the SIGIO path too)."""
    pid = blocked_victim.pid
    result = await run_code(runner, f"""
        import fcntl, signal, struct
        r, w = os.pipe()
        result = [attempt(lambda: fcntl.fcntl(r, 10, signal.SIGUSR1))]  # F_SETSIG
        fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)
        for kind in (1, 2):  # F_OWNER_PID, F_OWNER_PGRP
            owner = struct.pack("iI", kind, {pid})
            result.append(attempt(lambda: fcntl.fcntl(r, 15, owner) and None))  # F_SETOWN_EX
            os.write(w, b"x")
            os.read(r, 1)
    """)
    # The host pid is not in the jail's PID namespace: no owner can name it.
    assert result == ["OK:0", "ESRCH", "ESRCH"], result
    # Sent (or not) synchronously by the write: pending by the time the run is over.
    assert _pending(pid) & (1 << (signal.SIGUSR1 - 1)) == 0, "SIGUSR1 reached the host process"
