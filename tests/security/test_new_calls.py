"""The calls issue 19 allowed (the seccomp list anchored on Docker's default
profile, and the jail's own ptys): for each family, the attack its old
denial stopped, and the layer that stops it now. Each runs in a real jail
and asserts the real outcome from inside and, where there is one, the
host's state from outside."""

from __future__ import annotations

import os
import socket
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from conftest import landlock_abi_in_force
from support import PRELUDE, no_memory_cgroup_reason, proc_status, run_code, sha256

if TYPE_CHECKING:
    from trunner import Runner


def _count(path: str) -> int:
    """A host-wide count from /proc/sys (ptys, AIO contexts): any process on
    the host moves it (another test run's jails too), so only a quiet_host
    test asserts it."""
    with open(path) as f:
        return int(f.read())


async def _program(runner: Runner, code: str) -> Any:
    """Run `code` (after PRELUDE) as the exec adapter's program: a child of the
    adapter (the jail's pid 2), so the adapter is a process apart. Its
    `result` is printed and read back."""
    src = PRELUDE + textwrap.dedent(code) + "\nprint(repr(result))\n"
    done = (await runner.exec(["/usr/bin/env", "python3", "-c", src])).response
    assert done.exit_code == 0, (done.stdout, done.stderr)
    import ast

    return ast.literal_eval(done.stdout.decode())


# -- ptrace and process_vm_*: a tracer reaches only the jail's own dumpable tasks -----------

PTRACE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
def vm(nr, pid):
    # process_vm_readv (310) / writev (311) of 8 bytes at the caller's own stack address
    buf = ctypes.create_string_buffer(8)
    local = iovec(ctypes.addressof(buf), 8)
    one, none = ctypes.c_ulong(1), ctypes.c_ulong(0)  # full words: the kernel reads longs
    return syscall(nr, pid, ctypes.byref(local), one, ctypes.byref(local), one, none)
def attach(pid):
    ctypes.set_errno(0)
    rc = libc.ptrace(0x4206, pid, None, None)  # PTRACE_SEIZE
    return "OK" if rc == 0 else errno.errorcode[ctypes.get_errno()]
"""


async def test_ptrace_reaches_no_process_outside_the_jail(runner: Runner) -> None:
    """A host process (the test itself, same uid when not root) is not in the
    jail's PID namespace: nothing to attach to or read, and nothing attached."""
    host = os.getpid()
    result = await _program(runner, PTRACE + textwrap.dedent(f"""
        result = [attach({host}), vm(310, {host}), vm(311, {host}),
                  sorted(int(p) for p in os.listdir("/proc") if p.isdigit())]
    """))
    assert result[:3] == ["ESRCH", "ESRCH", "ESRCH"]
    assert result[3] == [1, 2, result[3][2]]  # pid 1, the adapter, the program
    assert proc_status(os.getpid())["TracerPid"] == "0"


async def test_ptrace_of_pid_1_and_the_adapter_is_denied(runner: Runner) -> None:
    """Pid 1 (trunner-waiter) is in a Landlock domain of its own, which the
    program's does not nest (Landlock allows ptrace only into a nested domain,
    from ABI 1); the adapter (pid 2) is non-dumpable and the program has no
    CAP_SYS_PTRACE. Attach, memory read and write, and /proc/PID/mem: denied;
    neither is traced afterwards."""
    result = await _program(runner, PTRACE + textwrap.dedent("""
        def mem(pid):
            return attempt(lambda: os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR)))
        def tracer(pid):
            return open(f"/proc/{pid}/status").read().split("TracerPid:")[1].split()[0]
        result = [[attach(pid), vm(310, pid), vm(311, pid), mem(pid), tracer(pid)]
                  for pid in (1, os.getppid())]
    """))
    assert result == [["EPERM", "EPERM", "EPERM", "EACCES", "0"]] * 2


async def test_a_tracer_cannot_rewrite_a_call_past_the_filter(runner: Runner) -> None:
    """The tracer turns its stopped child's getppid() into unshare(CLONE_NEWUSER)
    at the syscall-entry stop. The kernel runs seccomp after the tracer (since
    4.8): the child gets EPERM, and its user namespace is the one it had."""
    result = await run_code(runner, PTRACE + textwrap.dedent("""
        import signal
        regs = (ctypes.c_ulong * 27)()  # struct user_regs_struct, x86_64
        ORIG_RAX, RAX, RDI = 15, 10, 14
        before = os.readlink("/proc/self/ns/user")
        pid = os.fork()
        if pid == 0:
            libc.ptrace(0, 0, None, None)  # PTRACE_TRACEME
            os.kill(os.getpid(), signal.SIGSTOP)
            rc = libc.syscall(110)  # getppid, rewritten by the tracer
            err = ctypes.get_errno()
            same = os.readlink("/proc/self/ns/user") == before
            os._exit(1 if rc != -1 else 2 if err != errno.EPERM else 0 if same else 3)
        os.waitpid(pid, 0)
        rewritten = False
        while True:
            libc.ptrace(24, pid, None, None)  # PTRACE_SYSCALL
            _, status = os.waitpid(pid, 0)
            if os.WIFEXITED(status):
                break
            libc.ptrace(12, pid, None, ctypes.byref(regs))  # PTRACE_GETREGS
            if regs[ORIG_RAX] == 110 and not rewritten:
                regs[ORIG_RAX], regs[RDI] = 272, 0x10000000  # unshare(CLONE_NEWUSER)
                libc.ptrace(13, pid, None, ctypes.byref(regs))  # PTRACE_SETREGS
                rewritten = True
        result = [rewritten, os.WEXITSTATUS(status)]
    """))
    assert result == [True, 0]


# -- mknod: FIFOs and sockets, never devices -----------------------------------------------

async def test_mknod_of_a_device_fails_and_leaves_no_node(runner: Runner) -> None:
    """A char device (/dev/mem's 1:1, /dev/null's 1:3, an overlay whiteout 0:0) or a
    block device (sda's 8:0), by mknod and mknodat, in the working dir, /tmp and
    /dev/shm: EPERM from the filter, and no node exists afterwards."""
    result = await run_code(runner, """
        import stat
        out = []
        for where in (".", "/tmp", "/dev/shm"):
            for mode, dev in ((stat.S_IFCHR, (1, 1)), (stat.S_IFCHR, (1, 3)),
                              (stat.S_IFCHR, (0, 0)), (stat.S_IFBLK, (8, 0))):
                path = f"{where}/node"
                out.append(attempt(lambda: os.mknod(path, mode | 0o666, os.makedev(*dev))))
                out.append(attempt(lambda: os.mknod("node", mode | 0o666, os.makedev(*dev),
                                                    dir_fd=os.open(where, os.O_PATH))))
                out.append(os.path.lexists(path))
        result = out
    """)
    assert result == ["EPERM", "EPERM", False] * 12


# -- ptys: the run's own devpts, no injection ------------------------------------------------

async def test_tiocsti_on_an_own_pty_injects_nothing(runner: Runner) -> None:
    """TIOCSTI (and TIOCLINUX) on a pty the program opened, master and slave:
    EPERM, and no byte reached either side's input."""
    result = await run_code(runner, """
        import ctypes, fcntl, pty
        libc = ctypes.CDLL(None, use_errno=True)
        master, slave = pty.openpty()
        c = ctypes.c_char(b"!")
        out = [syscall(16, fd, req, ctypes.byref(c))
               for fd in (master, slave) for req in (0x5412, 0x541C)]
        for fd in (master, slave):
            os.set_blocking(fd, False)
            out.append(attempt(lambda: os.read(fd, 16)))
        result = out
    """)
    assert result == ["EPERM"] * 4 + ["EAGAIN", "EAGAIN"]


async def test_a_line_discipline_cannot_be_set(runner: Runner) -> None:
    """TIOCSETD (n_gsm, n_hdlc and the like: a CVE class) stays off the ioctl list:
    ENOTTY, and the pty keeps N_TTY."""
    result = await run_code(runner, """
        import ctypes, pty
        master, slave = pty.openpty()
        n_gsm = ctypes.c_int(21)
        ldisc = ctypes.c_int(-1)
        set_ = syscall(16, slave, 0x5423, ctypes.byref(n_gsm))  # TIOCSETD
        get = syscall(16, slave, 0x5424, ctypes.byref(ldisc))  # TIOCGETD
        result = [set_, get, ldisc.value]
    """)
    assert result == ["ENOTTY", "OK:0", 0]


#: Opens ptys until the jail's devpts is full: `held`, and the errno `full`.
FILL_PTYS = """
held = []
while True:
    try:
        held.append(os.openpty())
    except OSError as e:
        full = errno.errorcode[e.errno]
        break
"""


async def test_the_jail_sees_only_its_own_ptys(runner: Runner) -> None:
    """The jail's /dev/pts is a devpts instance of its own (not the host's: another
    device, none of the host's ptys in it), holding at most 64 ptys; /dev/tty,
    without a controlling terminal, is no host terminal (ENXIO). (The host's
    pty count afterwards: the quiet_host test below.)"""
    host_dev = os.stat("/dev/pts").st_dev if os.path.isdir("/dev/pts") else None
    result = await run_code(runner, """
        names = sorted(os.listdir("/dev/pts"))
        dev = os.stat("/dev/pts").st_dev
    """ + textwrap.indent(FILL_PTYS, " " * 8) + """
        line = [m for m in open("/proc/self/mountinfo").read().splitlines()
                if " /dev/pts " in m][0]
        result = [names, dev, len(held), full, attempt(lambda: os.open("/dev/tty", os.O_RDWR)),
                  line.split(" - ")[1].split()[0], "max=64" in line, "ptmxmode=666" in line]
    """)
    assert result[0] == ["ptmx"]
    if host_dev is not None:
        assert result[1] != host_dev
    assert result[2:] == [64, "ENOSPC", "ENXIO", "devpts", True, True]


@pytest.mark.quiet_host
async def test_a_runs_ptys_leave_the_hosts_pty_count_where_it_was(runner: Runner) -> None:
    """quiet_host: /proc/sys/kernel/pty/nr counts every pty of the host, in
    every devpts instance (another test run's jails too). The 64 ptys a run
    held are given back once it ended."""
    before = _count("/proc/sys/kernel/pty/nr")
    result = await run_code(runner, FILL_PTYS + "result = [len(held), full]")
    assert result == [64, "ENOSPC"]
    assert _count("/proc/sys/kernel/pty/nr") <= before


# -- seccomp and Landlock stacked by the program: only ever stricter ------------------------

async def test_self_confinement_cannot_loosen_the_outer_layers(runner: Runner) -> None:
    """The program stacks a filter that allows everything, and a Landlock ruleset
    that grants every right it handles on /: the jail's filter still answers
    mount EPERM and io_setup ENOSYS, and the jail's ruleset still refuses a
    write to /proc/self/comm (EACCES), as before the stacking. (Without a
    memory cgroup there is no ruleset to stack: ENOSYS, then EBADF.)"""
    result = await run_code(runner, """
        import ctypes, struct
        libc = ctypes.CDLL(None, use_errno=True)
        def probe():
            return [syscall(165, b"none", b"/tmp", b"tmpfs", 0, None),
                    syscall(206, 1, ctypes.byref(ctypes.c_ulong(0))),
                    attempt(lambda: open("/proc/self/comm", "w").write("x"))]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            before = probe()
            allow_all = struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000)
            buf = ctypes.create_string_buffer(allow_all)
            seccomp = syscall(317, 1, 0, struct.pack("HxxxxxxQ", 1, ctypes.addressof(buf)))
            abi = libc.syscall(444, None, 0, 1)
            fs = (1 << 13) - 1  # every ABI 1 right
            ruleset = libc.syscall(444, struct.pack("QQQ", fs, 0, 0), 24, 0)
            root = os.open("/", os.O_PATH)
            rule = struct.pack("=Qi", fs, root)  # landlock_path_beneath_attr, packed
            added = syscall(445, ruleset, 1, rule, 0)
            restricted = syscall(446, ruleset, 0)
            os.write(w, repr([before, seccomp, added, restricted, probe()]).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        result = eval(os.read(r, 1000))
    """)
    denied = ["EPERM", "ENOSYS", "EACCES"]
    stacked = ["OK:0", "OK:0"] if no_memory_cgroup_reason() is None else ["EBADF", "EBADF"]
    assert result == [denied, "OK:0", *stacked, denied]


# -- file handles: names, never opens --------------------------------------------------------

async def test_a_file_handle_names_a_host_file_but_never_opens_it(runner: Runner) -> None:
    """Shocker (CVE-2014-3519) needs both calls: name_to_handle_at now answers
    (a handle of /usr, a host bind), open_by_handle_at stays EPERM (and needs
    CAP_DAC_READ_SEARCH over the host anyway): no descriptor appears."""
    result = await run_code(runner, """
        import ctypes
        handle = ctypes.create_string_buffer(8 + 128)
        handle[0:4] = (128).to_bytes(4, "little")
        mount_id = ctypes.c_int()
        named = syscall(303, -100, b"/usr", handle, ctypes.byref(mount_id), 0)
        fds = os.listdir("/proc/self/fd")
        opened = syscall(304, os.open("/usr", os.O_PATH), handle, 0)
        result = [named, opened, len(os.listdir("/proc/self/fd")) == len(fds) + 1]
    """)
    assert result == ["OK:0", "EPERM", True]


# -- the network namespace: packet sockets and netlink ----------------------------------------

async def test_no_packet_socket_and_no_host_interface(runner: Runner) -> None:
    """AF_PACKET (a sniffer of the host's traffic, CVE-2017-7308 class) stays
    EAFNOSUPPORT (and needs CAP_NET_RAW, which no jailed process has); the
    only interface netlink shows is the run's own loopback."""
    result = await run_code(runner, """
        import socket
        result = [attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300)),
                  attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300)),
                  socket.if_nameindex()]
    """)
    assert result == ["EAFNOSUPPORT", "EAFNOSUPPORT", [[1, "lo"]]]


async def test_netlink_cannot_change_an_interface(runner: Runner) -> None:
    """NETLINK_ROUTE may read the run's own namespace, but a change (an address on
    lo, lo's state) is refused EPERM (CAP_NET_ADMIN over the namespace), and no
    other netlink protocol opens (netfilter, generic, xfrm, audit, uevents:
    EPROTONOSUPPORT). The host's interfaces are as they were."""
    host_before = socket.if_nameindex()
    result = await run_code(runner, """
        import socket, struct
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        s.bind((0, 0))
        def request(kind, body, attrs=b""):
            # nlmsghdr + body + attrs, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE
            msg = body + attrs
            s.send(struct.pack("=IHHII", 16 + len(msg), kind, 0x1 | 0x4 | 0x400, 1, 0) + msg)
            reply = s.recv(4096)
            return errno.errorcode.get(-struct.unpack("=i", reply[16:20])[0], "OK")
        # RTM_NEWADDR 10.99.0.1/32 on lo: ifaddrmsg + IFA_LOCAL
        addr = request(20, struct.pack("=BBBBI", 2, 32, 0, 0, 1),
                       struct.pack("=HH4s", 8, 2, bytes([10, 99, 0, 1])))
        # RTM_NEWLINK: lo down (ifinfomsg, change IFF_UP)
        link = request(16, struct.pack("=BxHiII", 0, 0, 1, 0, 1))
        others = [attempt(lambda p=p: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, p))
                  for p in (12, 16, 6, 9, 15)]
        result = [addr, link, others, socket.if_nameindex()]
    """)
    assert result == ["EPERM", "EPERM", ["EPROTONOSUPPORT"] * 5, [[1, "lo"]]]
    assert socket.if_nameindex() == host_before


# -- splice: Dirty Pipe's write into a read-only file ----------------------------------------

async def test_splice_cannot_write_a_read_only_file(runner: Runner) -> None:
    """Dirty Pipe (CVE-2022-0847): splice a page of a read-only file into a pipe,
    then write into the pipe. On a fixed kernel (5.10.102, 5.15.25, 5.16.11 and
    later) the write lands in a new page: the file, a host bind of the
    interpreter, is unchanged, seen from the jail and from the host."""
    target = os.path.realpath("/usr/bin/env")
    digest = sha256(target)
    result = await run_code(runner, f"""
        fd = os.open({target!r}, os.O_RDONLY)
        head = os.pread(fd, 8, 0)
        r, w = os.pipe()
        os.write(w, b"x" * 65536)  # fill and drain: every pipe buffer gets flags
        os.read(r, 65536)
        moved = os.splice(fd, w, 1, offset_src=0)
        wrote = os.write(w, b"DIRTY")
        result = [moved, wrote, os.pread(fd, 8, 0) == head, os.read(r, 16)]
    """)
    assert result[:3] == [1, 5, True]
    assert result[3][1:] == b"DIRTY"
    assert sha256(target) == digest


# -- the page cache: evict-and-probe on a read-only bind ----------------------------------------

def _cached(fd: int) -> bool:
    """Whether the first page of `fd`'s file is in the page cache (RWF_NOWAIT)."""
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
    except BlockingIOError:
        return False
    return True


async def test_a_bound_files_page_cache_can_be_neither_evicted_nor_probed(runner: Runner) -> None:
    """Whether a page of a host file is cached tells a run when another run or
    a host process read it (issue 33). The run cannot evict the page of a
    read-only bind (POSIX_FADV_DONTNEED does nothing, MADV_PAGEOUT and
    MADV_COLD fail EINVAL) nor ask whether it is cached (RWF_NOWAIT fails
    EOPNOTSUPP): the host still has it cached after the run. What stays: a
    timed first read (docs/jail.md)."""
    target = os.path.join(os.path.dirname(os.__file__), "this.py")  # bound, rarely read
    fd = os.open(target, os.O_RDONLY)
    try:
        os.read(fd, 1 << 16)
        assert _cached(fd)
        result = await run_code(runner, f"""
            import mmap
            fd = os.open({target!r}, os.O_RDONLY)
            m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            result = [attempt(lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)),
                      attempt(lambda: m.madvise(21)),  # MADV_PAGEOUT
                      attempt(lambda: m.madvise(20)),  # MADV_COLD
                      attempt(lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)),
                      attempt(lambda: os.preadv(fd, [bytearray(1)], 0, 0))]
        """)
        assert result == ["OK:None", "EINVAL", "EINVAL", "ENOTSUP", "OK:1"]
        assert _cached(fd)  # the host's page stayed
    finally:
        os.close(fd)


# -- memfd_create: fileless code adds nothing the working dir lacks ----------------------------

async def test_memfd_cannot_overwrite_what_trunner_runs(runner: Runner) -> None:
    """runc's CVE-2019-5736 reached the runtime's binary through /proc/PID/exe of
    a runtime process in the container. Here pid 1 (trunner-waiter) and the
    adapter are out of reach (EACCES: Landlock's scope, non-dumpable), the
    program's own binary is a read-only bind, and a memfd holds only the
    program's own bytes (where the run has one: without a memory cgroup
    memfd_create fails ENOSYS); the waiter's file is unchanged."""
    from trunner.kernel.install import WAITER

    digest = sha256(WAITER)
    result = await _program(runner, """
        def memfd():
            fd = os.memfd_create("payload")
            os.write(fd, b"#!/bin/sh\\n")
            return os.fstat(fd).st_size
        def write(path):
            return attempt(lambda: os.close(os.open(path, os.O_WRONLY)))
        result = [write("/proc/1/exe"), write(f"/proc/{os.getppid()}/exe"),
                  write("/proc/self/exe"), write(f"/proc/1/root/{os.readlink('/proc/self/exe')}"),
                  attempt(memfd)]
    """)
    assert result[:2] == ["EACCES", "EACCES"]
    assert result[2] in ("EACCES", "EROFS", "ETXTBSY")
    assert result[3] == "EACCES"
    assert result[4] == ("OK:10" if no_memory_cgroup_reason() is None else "ENOSYS")
    assert sha256(WAITER) == digest


# -- memfds and Landlock rulesets: only a memory cgroup bounds them ---------------------------

#: A memfd (os.memfd_create), a Landlock ruleset handling READ_FILE and the
#: Landlock ABI query (landlock_create_ruleset, 444 on every architecture
#: but alpha), each as its errno's name or "OK".
MEMORY_HOLDERS = """
import struct
def call(nr, *args):
    answer = syscall(nr, *args)
    return "OK" if answer.startswith("OK:") else answer
result = [attempt(lambda: os.close(os.memfd_create("held", os.MFD_CLOEXEC))),
          call(444, struct.pack("QQQ", 1 << 2, 0, 0), 24, 0),
          call(444, None, 0, 1)]
"""


@pytest.mark.skipif(no_memory_cgroup_reason() is None,
                    reason="this caller's runs have a memory cgroup, which bounds memfds and"
                    " rulesets: both stay allowed (test_memfd_and_rulesets_with_a_memory_cgroup)")
async def test_memfd_and_rulesets_fail_enosys_without_a_memory_cgroup(runner: Runner) -> None:
    """Without a memory cgroup only RLIMIT_AS bounds a process, and neither is
    address space: a memfd's pages held 2048 MiB past RLIMIT_AS 1 GiB, 252
    rulesets 1130 MiB of slab. Both fail ENOSYS, a kernel without them."""
    assert await run_code(runner, MEMORY_HOLDERS) == ["ENOSYS", "ENOSYS", "ENOSYS"]


@pytest.mark.skipif(no_memory_cgroup_reason() is not None,
                    reason=str(no_memory_cgroup_reason()))
async def test_memfd_and_rulesets_with_a_memory_cgroup(runner: Runner) -> None:
    """A run with a memory cgroup (root on this host) keeps both: the cgroup
    charges a memfd's pages and the rulesets' slab to the run."""
    assert await run_code(runner, MEMORY_HOLDERS) == ["OK:None", "OK", "OK"]


async def test_ordinary_programs_fall_back_without_memfd(runner: Runner) -> None:
    """CPython's multiprocessing never calls memfd_create (its semaphores and
    shared memory are /dev/shm files, on the scratch): a pool, a queue and a
    shared memory block work either way. A program that tries a memfd first
    gets an OSError of ENOSYS where the run has no memory cgroup, and falls
    back to a file, as HotSpot's ZGC does."""
    result = await _program(runner, """
        import multiprocessing
        from multiprocessing import shared_memory
        def square(x):
            return x * x
        def put(queue):
            queue.put(42)
        with multiprocessing.Pool(2) as pool:
            squares = pool.map(square, range(5))
        queue = multiprocessing.Queue()
        child = multiprocessing.Process(target=put, args=(queue,))
        child.start()
        got = queue.get(timeout=10)
        child.join()
        block = shared_memory.SharedMemory(create=True, size=16)
        block.buf[:5] = b"hello"
        other = shared_memory.SharedMemory(block.name)
        shared = bytes(other.buf[:5])
        other.close()
        block.close()
        block.unlink()
        try:
            fd, how = os.memfd_create("heap", os.MFD_CLOEXEC), "memfd"
        except OSError as e:
            fd = os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR, 0o600)
            how = errno.errorcode[e.errno]
        os.write(fd, b"heap")
        result = [squares, got, shared, how, os.pread(fd, 4, 0), child.exitcode]
    """)
    how = "memfd" if no_memory_cgroup_reason() is None else "ENOSYS"
    assert result == [[0, 1, 4, 9, 16], 42, b"hello", how, b"heap", 0]


# -- Linux AIO, inotify, cachestat: still denied -------------------------------------------------

async def test_aio_watches_and_cachestat_stay_unavailable(runner: Runner) -> None:
    """io_setup would take from the host-wide fs.aio-max-nr; inotify would watch
    host binds; cachestat would read host page-cache state: each ENOSYS. (The
    host's AIO count: the quiet_host test below.)"""
    result = await run_code(runner, """
        import ctypes
        ctx = ctypes.c_ulong(0)
        fd = os.open("/usr", os.O_RDONLY)
        result = [syscall(206, 65536, ctypes.byref(ctx)), ctx.value,
                  syscall(294, 0), syscall(254, -1, b"/usr", 0xFFF),
                  syscall(451, fd, ctypes.create_string_buffer(16),
                          ctypes.create_string_buffer(40), 0)]
    """)
    assert result == ["ENOSYS", 0, "ENOSYS", "ENOSYS", "ENOSYS"]


@pytest.mark.quiet_host
async def test_a_runs_io_setup_leaves_the_hosts_aio_count_where_it_was(runner: Runner) -> None:
    """quiet_host: /proc/sys/fs/aio-nr counts every AIO context of the host
    (any process's: a database's too). A jail's io_setup takes none of it."""
    before = _count("/proc/sys/fs/aio-nr")
    result = await run_code(runner, """
        import ctypes
        ctx = ctypes.c_ulong(0)
        result = [syscall(206, 65536, ctypes.byref(ctx)), ctx.value]
    """)
    assert result == ["ENOSYS", 0]
    assert _count("/proc/sys/fs/aio-nr") <= before


# -- capset, adjtimex, the scheduler and priorities: the kernel's checks, the PID namespace ------

async def test_capset_adds_nothing(runner: Runner) -> None:
    """capset may only narrow: raising CAP_SYS_ADMIN fails EPERM; every set stays 0."""
    result = await run_code(runner, """
        import struct
        header = struct.pack("Ii", 0x20080522, 0)
        data = struct.pack("IIIIII", 1 << 21, 1 << 21, 0, 0, 0, 0)  # CAP_SYS_ADMIN
        raised = syscall(126, header, data)
        empty = syscall(126, header, bytes(24))
        caps = [line.split()[1] for line in open("/proc/self/status").read().splitlines()
                if line.startswith(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))]
        result = [raised, empty, sorted(set(caps))]
    """)
    assert result == ["EPERM", "OK:0", ["0000000000000000"]]


async def test_adjtimex_cannot_set_the_host_clock(runner: Runner) -> None:
    """A set (ADJ_SETOFFSET of +1 hour, and clock_adjtime of CLOCK_REALTIME) fails
    EPERM: CAP_SYS_TIME over the host's user namespace, which no jail has. The
    host's clock is where it was: its offset from the monotonic clock (which
    no set moves) did not jump, however long the run took."""
    import time

    def offset() -> float:
        return time.time() - time.monotonic()

    before = offset()
    result = await run_code(runner, """
        import ctypes, struct
        timex = bytearray(208)
        struct.pack_into("I", timex, 0, 0x0100 | 0x2000)  # ADJ_SETOFFSET | ADJ_NANO
        struct.pack_into("qq", timex, 72, 3600, 0)  # time: +1 h
        buf = ctypes.create_string_buffer(bytes(timex))
        result = [syscall(159, buf), syscall(305, 0, buf)]
    """)
    assert result == ["EPERM", "EPERM"]
    assert abs(offset() - before) < 600  # +1 h would be 3600; NTP slews far less


async def test_priority_and_affinity_reach_only_the_jail(runner: Runner) -> None:
    """setpriority of a whole user (the jail's uid is the caller's when not root)
    and of the test process by pid, sched_setaffinity and ioprio_set of it: the
    test process is not in view (ESRCH) and keeps its nice and its affinity."""
    host = os.getpid()
    nice, affinity = os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0)
    result = await run_code(runner, f"""
        result = [attempt(lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19)),
                  os.getpriority(os.PRIO_PROCESS, 0),
                  attempt(lambda: os.setpriority(os.PRIO_PROCESS, {host}, 19)),
                  attempt(lambda: os.sched_setaffinity({host}, {{0}})),
                  syscall(251, 1, {host}, (3 << 13) | 7)]  # ioprio_set(PROCESS, idle)
    """)
    assert result == ["OK:None", 19, "ESRCH", "ESRCH", "ESRCH"]
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice
    assert os.sched_getaffinity(0) == affinity


async def test_signals_by_pidfd_and_sigqueue_to_pid_1(runner: Runner) -> None:
    """pidfd_send_signal and rt_sigqueueinfo are kill() by other means: to pid 1,
    Landlock's signal scope refuses them (EPERM, ABI 6); below it they reach the
    jail's init, which the kernel shields from what it has no handler for. The
    test process cannot be named at all."""
    result = await run_code(runner, f"""
        import ctypes, signal, time
        fd = os.pidfd_open(1)
        info = ctypes.create_string_buffer(128)
        ctypes.memmove(info, (signal.SIGTERM).to_bytes(4, "little"), 4)
        result = [syscall(424, fd, signal.SIGKILL, None, 0),
                  syscall(129, 1, signal.SIGTERM, info),  # rt_sigqueueinfo
                  attempt(lambda: os.pidfd_open({os.getpid()}))]
        time.sleep(0.1)
        result.append(open("/proc/1/status").read().split("State:")[1].split()[0])
    """)
    sent = "EPERM" if landlock_abi_in_force() >= 6 else "OK:0"
    assert result[0] == sent
    # rt_sigqueueinfo may not forge a kernel si_code: SI_USER (0) to another pid is EPERM
    assert result[1] == "EPERM"
    assert result[2:] == ["ESRCH", "S"]


@pytest.mark.parametrize("call", ["fork", "seccomp_get_action", "landlock_abi"])
async def test_small_newly_allowed_calls_answer(runner: Runner, call: str) -> None:
    """fork(), seccomp(SECCOMP_GET_ACTION_AVAIL) and the Landlock ABI query answer
    as on a bare kernel (they used to fail ENOSYS; the query still does where
    the run has no memory cgroup: test_memfd_and_rulesets_fail_enosys_...)."""
    code = {
        "fork": "pid = libc.syscall(57)\nif pid == 0: os._exit(7)\n"
                "result = os.WEXITSTATUS(os.waitpid(pid, 0)[1])",
        "seccomp_get_action": "result = libc.syscall(317, 2, 0, ctypes.byref("
                              "ctypes.c_uint(0x7FFF0000)))",
        "landlock_abi": "result = libc.syscall(444, None, 0, 1) >= 1",
    }[call]
    result = await run_code(runner, "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                            + code)
    landlock = no_memory_cgroup_reason() is None
    assert result == {"fork": 7, "seccomp_get_action": 0, "landlock_abi": landlock}[call]
