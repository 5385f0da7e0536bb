"""trunner.linux.seccomp: the policy, its rules, its BPF, and what a filtered process
can and cannot do.

Every behavioural test runs a real child Python that installs the real filter, prints
"armed", then does one thing; nothing is mocked.  Children run in a new session with stdin
from /dev/null, so even a broken filter could not reach the test's terminal.
"""

from __future__ import annotations

import ast
import errno
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from support import FOREIGN_ABI_C, scaled, user_xattrs_absent
from trunner.kernel import abi, install
from trunner.linux import seccomp
from trunner.linux.seccomp import compile as seccomp_compile
from trunner.linux.seccomp.compile import ALLOW, ERRNO, Arg, Rule

REPO = str(Path(__file__).resolve().parents[1])
SIGSYS = -signal.SIGSYS

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or not sys.platform.startswith("linux"),
    reason="the tests use x86_64 syscall numbers",
)

# Installs the filter from argv[1], then runs the body.  Core dumps off: a SIGSYS kill
# would otherwise drop a core file.
PRELUDE = """\
import ctypes, errno, os, resource, socket, sys
sys.path.insert(0, {repo!r})
import trunner.kernel.install as install
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
with open(sys.argv[1], "rb") as f:
    bpf = f.read()
install.set_no_new_privs()
install.install_seccomp(bpf)
print("armed", flush=True)
"""


def run_filtered(
    body: str, bpf_file: Path, cwd: Path, *args: str, prelude: str = PRELUDE
) -> subprocess.CompletedProcess[str]:
    code = prelude.format(repo=REPO) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code, str(bpf_file), *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        start_new_session=True,
    )


def write_bpf(path: Path, policy: seccomp.SeccompPolicy = seccomp.DEFAULT_POLICY) -> Path:
    path.write_bytes(seccomp.build_bpf(policy))
    return path


@pytest.fixture(scope="module")
def bpf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bpf(tmp_path_factory.mktemp("seccomp") / "default.bpf")


def assert_killed(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.stdout == "armed\n", (proc.stdout, proc.stderr)
    assert proc.returncode == SIGSYS, (proc.returncode, proc.stdout, proc.stderr)


def assert_ok(proc: subprocess.CompletedProcess[str], tail: str = "OK\n") -> None:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout.startswith("armed\n"), proc.stdout
    assert proc.stdout.endswith(tail), proc.stdout


# ---------------------------------------------------------------------------------------------
# What must keep working
# ---------------------------------------------------------------------------------------------

WORKLOAD = r"""
import concurrent.futures, os, socket, subprocess, sys, tempfile, threading
import blake3, msgspec, trio

assert msgspec.json.decode(msgspec.json.encode({"a": [1]})) == {"a": [1]}
assert len(blake3.blake3(b"x").hexdigest()) == 64

async def main():
    await trio.sleep(0.001)
    assert await trio.to_thread.run_sync(lambda: 41) + 1 == 42
    r = await trio.run_process(["/bin/echo", "trio"], capture_stdout=True)
    assert r.stdout == b"trio\n"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 0.001)
trio.run(main)

r = subprocess.run(["/bin/sh", "-c", "echo hi; cat /etc/hostname | wc -c; ls / >/dev/null"],
                   capture_output=True, check=True)
assert r.stdout.startswith(b"hi\n"), r
r = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, check=True)
assert r.stdout == b"1\n", r

fd = os.pidfd_open(os.getpid())
os.close(fd)
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    assert sum(ex.map(lambda x: x * x, range(10))) == 285
t = threading.Thread(target=lambda: None)
t.start()
t.join()

pid = os.fork()
if pid == 0:
    os._exit(7)
assert os.waitpid(pid, 0)[1] >> 8 == 7

with tempfile.NamedTemporaryFile(dir=".") as f:
    f.write(b"x")
    f.flush()
with tempfile.TemporaryDirectory(dir=".") as d:
    open(os.path.join(d, "f"), "w").close()
    os.rename(os.path.join(d, "f"), os.path.join(d, "g"))

a, b = socket.socketpair()
a.sendall(b"x")
assert b.recv(1) == b"x"
a.close()
b.close()
socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC).close()
# connect is allowed (the jail's tree holds no host socket): the kernel answers.
try:
    socket.socket(socket.AF_UNIX).connect("/nonexistent/trunner.sock")
    raise SystemExit("connected to nothing")
except FileNotFoundError:
    pass
for kind in (socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
    socket.socket(socket.AF_UNIX, kind | socket.SOCK_NONBLOCK).close()
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    a.send(b"y")
    assert b.recv(1) == b"y"
    a.close()
    b.close()
for family in (socket.AF_INET, socket.AF_INET6):
    socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC).close()
    socket.socket(family, socket.SOCK_DGRAM, socket.IPPROTO_UDP).close()

# What the namespaces now contain: metadata, sessions, ids already held, NUMA queries.
open("m", "w").close()
os.chmod("m", 0o700)
os.utime("m", (1, 2))
assert (os.stat("m").st_mode & 0o777, os.stat("m").st_mtime) == (0o700, 2), os.stat("m")
os.chown("m", os.getuid(), os.getgid())
os.setresuid(-1, os.geteuid(), -1)
os.setresgid(-1, os.getegid(), -1)
r = subprocess.run([sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid())"],
                   capture_output=True, check=True, start_new_session=True)
assert r.stdout == b"True\n", r
r = subprocess.run([sys.executable, "-c", "import os; print(os.getpgid(0) == os.getpid())"],
                   capture_output=True, check=True, process_group=0)
assert r.stdout == b"True\n", r
assert os.sched_getaffinity(0)

status = open("/proc/self/status").read()
assert "\nSeccomp:\t2\n" in status and "\nNoNewPrivs:\t1\n" in status, status
assert "\nSeccomp_filters:\t1\n" in status, status
print("OK")
"""


def test_workload_after_exec(bpf_file: Path, tmp_path: Path) -> None:
    """The helper's real sequence: install, exec CPython, run a realistic workload."""
    body = "os.execv(sys.executable, [sys.executable, '-c', sys.argv[2]])\n"
    assert_ok(run_filtered(body, bpf_file, tmp_path, WORKLOAD))


def test_shell_and_coreutils(bpf_file: Path, tmp_path: Path) -> None:
    script = (
        "set -e; echo a > f; cat f; ls -la >/dev/null; sleep 0.01; id >/dev/null; "
        "find . -name f >/dev/null; sed s/a/b/ f >/dev/null; seq 1 1000 | sort -n >/dev/null; "
        "mkdir d; cp -p f d/g; mv d/g d/h; ln -s f k; chmod 600 f; touch -d @5 f; "
        "test \"$(stat -c %a.%Y f)\" = 600.5; timeout 5 true; setsid true; "
        "readlink -f f >/dev/null; "
        "rm -r d; echo done"
    )
    body = "os.execv('/bin/sh', ['/bin/sh', '-c', sys.argv[2]])\n"
    assert_ok(run_filtered(body, bpf_file, tmp_path, script), tail="a\ndone\n")


def test_clone3_fails_with_enosys(bpf_file: Path, tmp_path: Path) -> None:
    body = """
    args = ctypes.create_string_buffer(88)  # struct clone_args, zeroed
    assert libc.syscall(435, args, 88) == -1
    assert ctypes.get_errno() == errno.ENOSYS, ctypes.get_errno()
    print("OK")
    """
    assert_ok(run_filtered(body, bpf_file, tmp_path))


def test_argument_checks_look_at_the_low_32_bits_only(bpf_file: Path, tmp_path: Path) -> None:
    """The kernel truncates ioctl's request and socket's domain to 32 bits; so does the filter."""
    body = """
    buf = ctypes.create_string_buffer(64)
    # TCGETS / TIOCGWINSZ with junk in the high half: allowed (the kernel sees TCGETS).
    for cmd in (0x5401, 0x5413, (1 << 32) | 0x5401, (0xFFFFFFFF << 32) | 0x5401):
        assert libc.syscall(16, 0, ctypes.c_ulong(cmd), buf) == -1
        assert ctypes.get_errno() == errno.ENOTTY, (hex(cmd), ctypes.get_errno())
    fd = libc.syscall(41, ctypes.c_ulong((1 << 32) | socket.AF_UNIX), socket.SOCK_STREAM, 0)
    assert fd >= 0, ctypes.get_errno()
    os.close(fd)
    print("OK")
    """
    assert_ok(run_filtered(body, bpf_file, tmp_path))


def test_ioctl_allow_list(bpf_file: Path, tmp_path: Path) -> None:
    """The listed requests reach the kernel (high bits ignored, as the kernel does); every
    other fails ENOTTY, even those the kernel would answer on this file."""
    body = """
    buf = ctypes.create_string_buffer(64)
    def ioctl(fd, cmd):
        rc = libc.syscall(16, fd, ctypes.c_ulong(cmd), buf)
        return rc if rc >= 0 else errno.errorcode[ctypes.get_errno()]
    r, w = os.pipe()
    os.write(w, b"abc")
    assert ioctl(r, 0x541B) == 0 and buf.raw[:4] == (3).to_bytes(4, "little")  # FIONREAD
    assert ioctl(r, (0xFFFFFFFF << 32) | 0x541B) == 0  # the kernel sees FIONREAD
    assert ioctl(r, 0x5451) == 0 and os.get_inheritable(r) is False  # FIOCLEX
    assert ioctl(r, 0x5450) == 0  # FIONCLEX
    buf[:4] = (1).to_bytes(4, "little")
    assert ioctl(r, 0x5421) == 0 and os.get_blocking(r) is False  # FIONBIO
    for tty in (0x5401, 0x540F, 0x5413, 0x802C542A):
        assert ioctl(r, tty) == "ENOTTY", hex(tty)  # the kernel's answer on a pipe
    fd = os.open("f", os.O_RDWR | os.O_CREAT)
    # FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IOC_GETVERSION, FS_IOC_SETVERSION, FIOQSIZE,
    # FIGETBSZ, FIOASYNC, FICLONE, FS_IOC_FSSETXATTR; and FIONREAD's neighbours.
    for cmd in (0x80086601, 0x40086602, 0x80087601, 0x40087602, 0x5460, 0x2, 0x5452,
                0x40049409, 0x401C5820, 0x541A, 0x541C ^ 0x8, 0x1541B):
        assert ioctl(fd, cmd) == "ENOTTY", hex(cmd)
    print("OK")
    """
    assert_ok(run_filtered(body, bpf_file, tmp_path))


def test_fcntl_setlease_and_notify_are_eperm_and_locks_work(
    bpf_file: Path, tmp_path: Path
) -> None:
    """F_SETLEASE and F_NOTIFY (dnotify) fail EPERM, high bits or not; the directory
    watched in vain sends no SIGIO when it changes."""
    body = """
    import fcntl, signal
    fd = os.open("f", os.O_RDWR | os.O_CREAT)
    for cmd in (fcntl.F_SETLEASE, (1 << 32) | fcntl.F_SETLEASE):
        assert libc.syscall(72, fd, ctypes.c_ulong(cmd), fcntl.F_RDLCK) == -1
        assert ctypes.get_errno() == errno.EPERM, (hex(cmd), ctypes.get_errno())
    assert fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_UNLCK
    seen = []
    signal.signal(signal.SIGIO, lambda n, f: seen.append(n))
    os.mkdir("d")
    d = os.open("d", os.O_RDONLY | os.O_DIRECTORY)
    events = fcntl.DN_ACCESS | fcntl.DN_CREATE | fcntl.DN_MULTISHOT
    for cmd in (fcntl.F_NOTIFY, (1 << 32) | fcntl.F_NOTIFY):
        assert libc.syscall(72, d, ctypes.c_ulong(cmd), events) == -1
        assert ctypes.get_errno() == errno.EPERM, (hex(cmd), ctypes.get_errno())
    os.listdir("d")
    open("d/new", "w").close()
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a syscall: pending handlers run after it
    assert seen == [], seen
    fcntl.flock(fd, fcntl.LOCK_EX)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) == fcntl.FD_CLOEXEC
    assert fcntl.fcntl(fd, fcntl.F_DUPFD, 10) >= 10
    print("OK")
    """
    assert_ok(run_filtered(body, bpf_file, tmp_path))


def test_msg_fastopen_is_eopnotsupp(bpf_file: Path, tmp_path: Path) -> None:
    body = """
    a, b = socket.socketpair()
    for call in (lambda: a.send(b"x", socket.MSG_FASTOPEN),  # glibc: the sendto syscall
                 lambda: a.sendmsg([b"x"], [], socket.MSG_FASTOPEN)):
        try:
            call()
            raise SystemExit("MSG_FASTOPEN sent")
        except OSError as e:
            assert e.errno == errno.EOPNOTSUPP, e
    # High bits of flags are not flags (the kernel reads an unsigned int).
    assert libc.syscall(44, a.fileno(), b"y", 1, ctypes.c_ulong(1 << 32), None, 0) == 1
    a.sendmsg([b"z"], [], socket.MSG_DONTWAIT)
    assert b.recv(8) == b"yz"
    print("OK")
    """
    assert_ok(run_filtered(body, bpf_file, tmp_path))


@pytest.fixture(scope="module")
def provider_bpf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seccomp") / "provider.bpf"
    return write_bpf(path, seccomp.provider_policy())


def test_provider_policy_tcp_only_no_server(provider_bpf: Path, tmp_path: Path) -> None:
    body = """
    def sock(*args):
        rc = libc.syscall(41, *[ctypes.c_ulong(a) for a in args])
        if rc < 0:
            return errno.errorcode[ctypes.get_errno()]
        os.close(rc)
        return "OK"
    out = {}
    for proto in (0, 6, (1 << 32) | 6):
        out[f"inet6 stream {proto:#x}"] = sock(socket.AF_INET6, socket.SOCK_STREAM, proto)
    for proto in (262, 256, 132, 17, (1 << 32) | 262, 0xFFFFFFFF):
        out[f"inet stream {proto:#x}"] = sock(socket.AF_INET, socket.SOCK_STREAM, proto)
    out["inet dgram"] = sock(socket.AF_INET, socket.SOCK_DGRAM, 0)
    out["inet6 raw"] = sock(socket.AF_INET6, socket.SOCK_RAW, 58)
    out["unix stream"] = sock(socket.AF_UNIX, socket.SOCK_STREAM, 0)
    out["netlink"] = sock(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    a, b = socket.socketpair()
    out["socketpair"] = "OK"
    s = socket.socket()
    for name, call in (("listen", s.listen), ("accept", s.accept),
                       ("accept4", lambda: libc.syscall(288, s.fileno(), None, None, 0)),
                       ("bind abstract", lambda: a.bind(b"\\0trunner-test-%d" % os.getpid())),
                       ("bind tcp", lambda: s.bind(("127.0.0.1", 0)))):
        try:
            rc = call()
        except OSError as e:
            out[name] = errno.errorcode[e.errno]
        else:
            out[name] = errno.errorcode[ctypes.get_errno()] if rc == -1 else "OK"
    print(sorted(out.items()))
    """
    proc = run_filtered(body, provider_bpf, tmp_path)
    assert proc.returncode == 0, proc
    assert proc.stdout.startswith("armed\n"), proc.stdout
    got = dict(ast.literal_eval(proc.stdout.splitlines()[1]))
    expected = {f"inet6 stream {p:#x}": "OK" for p in (0, 6, (1 << 32) | 6)}
    expected |= {f"inet stream {p:#x}": "EPROTONOSUPPORT"
                 for p in (262, 256, 132, 17, (1 << 32) | 262, 0xFFFFFFFF)}
    expected |= {"inet dgram": "ESOCKTNOSUPPORT", "inet6 raw": "ESOCKTNOSUPPORT",
                 "unix stream": "EAFNOSUPPORT", "netlink": "EAFNOSUPPORT", "socketpair": "OK",
                 "listen": "EPERM", "accept": "EPERM", "accept4": "EPERM",
                 "bind abstract": "EPERM", "bind tcp": "EPERM"}
    assert got == expected


# ---------------------------------------------------------------------------------------------
# What fails with an errno, the process carrying on
# ---------------------------------------------------------------------------------------------

# Each call runs for real in a child whose filter must answer it; `errno` the answer.
# Were the filter wrong, each would do nothing harmful here (a failing argument, or an
# effect on the throwaway child only) and report something else.
DENIED_CALLS = {
    "unshare_newuser": ("libc.syscall(272, 0x10000000)", errno.EPERM),
    "unshare_newnet": ("libc.syscall(272, 0x40000000)", errno.EPERM),
    "setns": ("libc.syscall(308, 0, 0)", errno.EPERM),
    "mount": ("libc.syscall(165, None, None, None, 0, None)", errno.EPERM),
    "bpf": ("libc.syscall(321, 0, None, 0)", errno.EPERM),
    "perf_event_open": ("libc.syscall(298, None, 0, -1, -1, 0)", errno.EPERM),
    "io_uring_setup": ("libc.syscall(425, 1, None)", errno.EPERM),
    "keyctl": ("libc.syscall(250, 0, 0, 0, 0, 0)", errno.EPERM),
    "userfaultfd": ("libc.syscall(323, 0)", errno.EPERM),
    "personality_query": ("libc.syscall(135, ctypes.c_ulong(0xFFFFFFFF))", errno.EPERM),
    "chroot": ("libc.syscall(161, b'/nonexistent')", errno.EPERM),
    "pivot_root": ("libc.syscall(155, None, None)", errno.EPERM),
    "open_by_handle_at": ("libc.syscall(304, -100, None, 0)", errno.EPERM),
    "kcmp": ("libc.syscall(312, 0, 0, 0, 0, 0)", errno.EPERM),
    "io_setup": ("libc.syscall(206, 1, ctypes.byref(ctypes.c_ulong(0)))", errno.ENOSYS),
    "inotify_init1": ("libc.syscall(294, 0)", errno.ENOSYS),
    "cachestat": ("libc.syscall(451, 0, None, None, 0)", errno.ENOSYS),
    # mknod of a char (S_IFCHR) or block (S_IFBLK) device, and mknodat: EPERM, no node
    "mknod_char": ("libc.syscall(133, b'n', 0o20600, 0x103)", errno.EPERM),
    "mknodat_block": ("libc.syscall(259, -100, b'n', 0o60600, 0x800)", errno.EPERM),
    "mknod_char_high_bits": ("libc.syscall(133, b'n', ctypes.c_ulong((1 << 32) | 0o20600), 0)",
                             errno.EPERM),
    "sendmmsg_fastopen": ("libc.syscall(307, 0, None, 0, 0x20000000)", errno.EOPNOTSUPP),
    "unknown_number": ("libc.syscall(1000)", errno.ENOSYS),
    "largest_non_x32_number": ("libc.syscall(0x3FFFFFFF)", errno.ENOSYS),
    "prlimit64_of_the_parent": (
        "libc.syscall(302, os.getppid(), 7, None, ctypes.create_string_buffer(16))", errno.EPERM),
    # The run's loopback: TCP, UDP and UDP-Lite only; no raw, ping, SCTP or MPTCP socket.
    "socket_inet_raw": ("libc.syscall(41, 2, 3, 1)", errno.ESOCKTNOSUPPORT),
    "socket_inet6_raw": ("libc.syscall(41, 10, 3 | 0x800, 58)", errno.ESOCKTNOSUPPORT),
    "socket_inet_ping": ("libc.syscall(41, 2, 2, 1)", errno.EPROTONOSUPPORT),
    "socket_inet6_ping": ("libc.syscall(41, 10, 2, 58)", errno.EPROTONOSUPPORT),
    "socket_inet_sctp": ("libc.syscall(41, 2, 1, 132)", errno.EPROTONOSUPPORT),
    "socket_inet_mptcp": ("libc.syscall(41, 2, 1, 262)", errno.EPROTONOSUPPORT),
    "socket_inet_udp_as_stream": ("libc.syscall(41, 2, 1, 17)", errno.EPROTONOSUPPORT),
    "socket_inet_seqpacket": ("libc.syscall(41, 2, 5, 0)", errno.ESOCKTNOSUPPORT),
    "socket_packet": ("libc.syscall(41, 17, 3, 0)", errno.EAFNOSUPPORT),
    "socket_netlink_generic": ("libc.syscall(41, 16, 3, 16)", errno.EPROTONOSUPPORT),
    "socket_netlink_netfilter": ("libc.syscall(41, 16, 3, 12)", errno.EPROTONOSUPPORT),
    "socket_netlink_low32": ("libc.syscall(41, 16, 3, ctypes.c_ulong(1 << 32 | 12))",
                             errno.EPROTONOSUPPORT),
    "socket_vsock": ("libc.syscall(41, 40, 1, 0)", errno.EAFNOSUPPORT),
    "socket_vsock_low32": ("libc.syscall(41, ctypes.c_ulong((1 << 32) | 40), 1, 0)",
                           errno.EAFNOSUPPORT),
    "socket_inet_proto_low32": ("libc.syscall(41, 2, 1, ctypes.c_ulong((1 << 32) | 132))",
                                errno.EPROTONOSUPPORT),
    "socketpair_inet": ("libc.syscall(53, 2, 1, 0, ctypes.create_string_buffer(8))",
                        errno.EAFNOSUPPORT),
    "socket_unix_raw": ("libc.syscall(41, 1, 3, 0)", errno.ESOCKTNOSUPPORT),
    "socketpair_unix_rdm": ("libc.syscall(53, 1, 4, 0, ctypes.create_string_buffer(8))",
                            errno.ESOCKTNOSUPPORT),
    "ioctl_tiocsti": ("libc.syscall(16, 0, 0x5412, ctypes.create_string_buffer(b'x'))",
                      errno.EPERM),
    "ioctl_tiocsti_high_bits": (
        "libc.syscall(16, 0, ctypes.c_ulong((1 << 32) | 0x5412), ctypes.create_string_buffer(8))",
        errno.EPERM),
    "ioctl_tioclinux": ("libc.syscall(16, 0, 0x541C, ctypes.create_string_buffer(8))",
                        errno.EPERM),
}
# clone with a namespace flag, alone and mixed with CLONE_PARENT or CLONE_VFORK|CLONE_VM
# style flags: EPERM, no process. (A wrong filter would fork: rc 0 in a second process.)
DENIED_CALLS.update(
    (f"clone_{name.lower()}",
     (f"libc.syscall(56, ctypes.c_ulong({flag:#x} | 17), 0, 0, 0, 0)", errno.EPERM))
    for name, flag in [
        ("NEWNS", 0x00020000),
        ("NEWCGROUP", 0x02000000),
        ("NEWUTS", 0x04000000),
        ("NEWIPC", 0x08000000),
        ("NEWUSER", 0x10000000),
        ("NEWPID", 0x20000000),
        ("NEWNET", 0x40000000),
        ("NEWUSER_NEWNET_PARENT", 0x50008000),
        ("NEWPID_high_bits", (1 << 32) | 0x20000000),
    ]
)

DENIED_BODY = """
rc = eval(sys.argv[2])
if rc == 0 and "libc.syscall(56" in sys.argv[2]:
    os._exit(0)  # a clone that went through: the child leaves quietly
print(rc, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()) if rc == -1 else "-")
print("survived")
"""


@pytest.mark.parametrize(("call", "err"), DENIED_CALLS.values(), ids=DENIED_CALLS.keys())
def test_denied_call_fails_with_its_errno(
    call: str, err: int, bpf_file: Path, tmp_path: Path
) -> None:
    proc = run_filtered(DENIED_BODY, bpf_file, tmp_path, call)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == f"armed\n-1 {errno.errorcode[err]}\nsurvived\n", proc.stdout


# Never allowed, conditionally or not; each is also called for real below. From
# "pidfd_getfd" on these are this policy's choices rather than hard requirements.
MUST_DENY_EPERM = [
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "bpf", "perf_event_open", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "userfaultfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "swapon", "swapoff", "reboot", "acct",
    "quotactl", "fsopen", "fsmount", "move_mount", "open_tree", "fspick", "fsconfig",
    "mount_setattr", "personality", "vhangup", "syslog", "iopl", "ioperm", "lookup_dcookie",
    "nfsservctl", "settimeofday", "clock_settime", "sethostname",
    "setdomainname", "pidfd_getfd", "kcmp", "move_pages", "migrate_pages",
    "mbind", "process_madvise", "quotactl_fd",
]
# What Docker's default profile allows and this one does not (each with its reason in
# the policy), and clone3.
MUST_DENY_ENOSYS = [
    "clone3", "cachestat", "fanotify_mark", "inotify_add_watch", "inotify_init",
    "inotify_init1", "inotify_rm_watch", "io_cancel", "io_destroy", "io_getevents",
    "io_pgetevents", "io_setup", "io_submit",
]


def test_must_deny_names_are_not_in_the_policy() -> None:
    policy = seccomp.DEFAULT_POLICY
    unconditional = set(policy.allowed) | set(policy.extra_allowed)
    assert unconditional.isdisjoint(MUST_DENY_EPERM + MUST_DENY_ENOSYS)
    assert set(MUST_DENY_EPERM) <= set(policy.errno_eperm)
    assert set(MUST_DENY_ENOSYS) == set(policy.errno_enosys)
    assert policy.unix_only_socket
    assert policy.clone_denied_flags == seccomp.NAMESPACE_FLAGS
    assert seccomp.NAMESPACE_FLAGS & 0xFF == 0  # never touches clone's exit-signal byte
    assert set(policy.ioctl_eperm) == {seccomp.TIOCSTI, seccomp.TIOCLINUX}
    assert policy.ioctl_allowed == seccomp.IOCTL_ALLOWED + seccomp.IOCTL_INTERFACE_QUERIES
    assert policy.fcntl_eperm == (seccomp.F_SETLEASE, seccomp.F_NOTIFY)
    assert policy.send_flags_denied == seccomp.MSG_FASTOPEN
    assert policy.self_only == ("prlimit64",)


DOCKER_ALLOWED = Path(__file__).with_name("docker-default-allowed.txt")


#: Allowed with argument checks: the page-cache channel (seccomp/policy.py).
PAGE_CACHE_CALLS = ("fadvise64", "madvise", "preadv2", "pwritev2")


def test_every_call_docker_allows_is_allowed_or_has_a_reason() -> None:
    """Anchored on Docker's default profile: each call it allows without a capability
    (the snapshot beside this file) is allowed here, unconditionally or with argument
    checks, or named in DENIED_AS_DOCKER_ALLOWS with its reason (and fails ENOSYS)."""
    import pyseccomp

    docker = {line for line in DOCKER_ALLOWED.read_text().split("\n")
              if line and not line.startswith("#")}
    policy = seccomp.DEFAULT_POLICY
    here = {*policy.allowed, *policy.self_only, *PAGE_CACHE_CALLS, "clone", "fcntl", "ioctl",
            "mknod", "mknodat", "sendmmsg", "sendmsg", "sendto", "socket", "socketpair"}
    reasons = dict(seccomp.DENIED_AS_DOCKER_ALLOWS)
    # Names x86_64 lacks (the *32 and time64 calls, other arches') are not calls here.
    known = {n for n in docker if pyseccomp.resolve_syscall(pyseccomp.Arch.X86_64, n) >= 0}
    assert known - here == set(reasons), sorted(known - here - set(reasons))
    assert all(reasons.values())
    assert set(reasons) <= set(policy.errno_enosys)


@pytest.mark.parametrize("profile", ["default", "provider"])
def test_without_a_memory_cgroup_memfds_and_rulesets_fail_enosys(profile: str,
                                                                  tmp_path: Path) -> None:
    """Where the run has no memory cgroup, only RLIMIT_AS bounds a process, and a
    memfd's pages and a ruleset's slab are not address space: each call fails
    ENOSYS (a kernel without it), the ABI query included. The profile's own
    filter (a memory cgroup) still allows them; nothing else changes."""
    base = seccomp.DEFAULT_POLICY if profile == "default" else seccomp.provider_policy()
    policy = seccomp.without_memory_cgroup(base)
    held = set(seccomp.UNBOUNDED_WITHOUT_MEMORY_CGROUP)
    assert held == {"memfd_create", "landlock_create_ruleset"}
    assert set(base.allowed) - set(policy.allowed) == held
    assert set(policy.errno_enosys) - set(base.errno_enosys) == held
    assert msgspec.structs.replace(policy, allowed=base.allowed,
                                   errno_enosys=base.errno_enosys) == base
    assert seccomp.without_memory_cgroup(policy) is policy
    body = """
    def answer(nr, *args):
        rc = libc.syscall(nr, *args)
        return "OK" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
    attr = (1 << 2).to_bytes(8, "little") + bytes(16)  # handled: READ_FILE
    print([answer(319, b"held", 1), answer(444, attr, 24, 0), answer(444, None, 0, 1)])
    """
    for bpf, expected in ((write_bpf(tmp_path / "without.bpf", policy), ["ENOSYS"] * 3),
                          (write_bpf(tmp_path / "with.bpf", base), ["OK"] * 3)):
        proc = run_filtered(body, bpf, tmp_path)
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
        assert ast.literal_eval(proc.stdout.splitlines()[1]) == expected


def x86_64_number(name: str) -> int:
    import pyseccomp

    nr = pyseccomp.resolve_syscall(pyseccomp.Arch.X86_64, name)
    assert nr >= 0, name
    return int(nr)


def test_must_deny_syscalls_fail_with_their_errno(bpf_file: Path, tmp_path: Path) -> None:
    """Every listed name, called for real with all-ones arguments (were the filter wrong,
    the kernel would answer EINVAL, EFAULT or EBADF rather than do something), in one
    child: none kills it any more."""
    names = {name: x86_64_number(name) for name in MUST_DENY_EPERM + MUST_DENY_ENOSYS}
    body = f"""
    out = {{}}
    for name, nr in {names!r}.items():
        rc = libc.syscall(nr, *[ctypes.c_long(-1)] * 6)
        out[name] = errno.errorcode.get(ctypes.get_errno(), "?") if rc == -1 else rc
    print(sorted(out.items()))
    """
    proc = run_filtered(body, bpf_file, tmp_path)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    got = dict(ast.literal_eval(proc.stdout.splitlines()[1]))
    assert got == dict.fromkeys(MUST_DENY_EPERM, "EPERM") | dict.fromkeys(
        MUST_DENY_ENOSYS, "ENOSYS")


def test_what_the_namespaces_contain_is_allowed(bpf_file: Path, tmp_path: Path) -> None:
    """Sessions and groups, metadata of the filtered process's own files, ids it holds,
    introspection, POSIX timers, SysV IPC and POSIX mqueues, and CLONE_PARENT (done
    from a grandchild, so that the new process is the filtered child's to reap)."""
    body = """
    import signal, struct, time
    out = {}
    for call in (os.setsid, lambda: os.setpgid(0, 0)):
        pid = os.fork()
        if pid == 0:
            call()
            os._exit(0 if os.getpgid(0) == os.getpid() else 1)
        out.setdefault("setsid_setpgid", []).append(os.waitpid(pid, 0)[1])
    open("f", "w").close()
    os.chmod("f", 0o751)
    os.utime("f", (3, 4))
    os.chown("f", -1, os.getgid())
    out["meta"] = [oct(os.stat("f").st_mode & 0o777), os.stat("f").st_mtime]
    os.setresuid(-1, -1, os.getuid())
    os.setgid(os.getgid())
    out["setgroups"] = libc.syscall(116, 0, None)  # setgroups(0, NULL): needs CAP_SETGID
    out["setgroups_errno"] = errno.errorcode.get(ctypes.get_errno())
    mode = ctypes.c_int(-1)
    out["get_mempolicy"] = libc.syscall(239, ctypes.byref(mode), None, 0, None, 0), mode.value
    out["getcpu"] = libc.syscall(309, None, None, None)
    out["capget"] = libc.syscall(125, struct.pack("Ii", 0x20080522, 0),
                                 ctypes.create_string_buffer(24))
    t = ctypes.c_int()
    out["timer_create"] = libc.syscall(222, 1, None, ctypes.byref(t))  # CLOCK_MONOTONIC
    out["timer_delete"] = libc.syscall(226, t)
    shm = libc.syscall(29, 0, 4096, 0o1600)  # shmget(IPC_PRIVATE, IPC_CREAT | 0600)
    out["shmctl_rmid"] = libc.syscall(31, shm, 0, None) if shm >= 0 else shm  # IPC_RMID
    msg = libc.syscall(68, 0, 0o1600)  # msgget
    out["msgctl_rmid"] = libc.syscall(71, msg, 0, None) if msg >= 0 else msg
    sem = libc.syscall(64, 0, 1, 0o1600)  # semget
    out["semctl_rmid"] = libc.syscall(66, sem, 0, 0) if sem >= 0 else sem
    mq = libc.syscall(240, b"trunner-test-%d" % os.getpid(), 0o102, 0o600, None)  # O_CREAT|O_RDWR
    out["mq_unlink"] = libc.syscall(241, b"trunner-test-%d" % os.getpid()) if mq >= 0 else mq
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        # CLONE_PARENT | SIGCHLD: the new process is mid's sibling, the filtered child's.
        rc = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)
        if rc == 0:
            os.write(w, b"cp")
            os._exit(0)
        os._exit(0 if rc > 0 else 1)
    assert os.waitpid(mid, 0)[1] == 0
    out["clone_parent"] = os.read(r, 2).decode(), os.wait()[1]
    print(sorted(out.items()))
    """
    proc = run_filtered(body, bpf_file, tmp_path)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    got = dict(ast.literal_eval(proc.stdout.splitlines()[1]))
    root = os.getuid() == 0  # not filtered: root in the host's user namespace has CAP_SETGID
    assert got == {
        "setsid_setpgid": [0, 0], "meta": ["0o751", 4.0],
        "setgroups": 0 if root else -1, "setgroups_errno": None if root else "EPERM",
        "get_mempolicy": (0, 0), "getcpu": 0, "capget": 0, "timer_create": 0,
        "timer_delete": 0, "shmctl_rmid": 0, "msgctl_rmid": 0, "semctl_rmid": 0,
        "mq_unlink": 0, "clone_parent": ("cp", 0),
    }


def test_user_xattrs_of_its_own_files_are_allowed(bpf_file: Path, tmp_path: Path) -> None:
    """setxattr, getxattr, listxattr and removexattr of a user xattr on a file
    the filtered process made (tar and rsync keep them): the filter lets them
    through, where the filesystem has them."""
    if (reason := user_xattrs_absent(tmp_path)) is not None:
        pytest.skip(reason)
    body = """
    def users():
        return [name for name in os.listxattr("f") if name.startswith("user.")]
    open("f", "w").close()
    os.setxattr("f", "user.k", b"v")
    out = [os.getxattr("f", "user.k"), users()]
    os.removexattr("f", "user.k")
    print([*out, users()])
    """
    proc = run_filtered(body, bpf_file, tmp_path)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert ast.literal_eval(proc.stdout.splitlines()[1]) == [b"v", ["user.k"], []]


GCC = shutil.which("gcc") or shutil.which("cc")


@pytest.fixture(scope="module")
def foreign_abi_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if GCC is None:
        pytest.skip("no C compiler to build the x32/i386 syscall probe")
    d = tmp_path_factory.mktemp("abi")
    (d / "probe.c").write_text(FOREIGN_ABI_C)
    subprocess.run([GCC, "-O0", "-o", str(d / "probe"), str(d / "probe.c")], check=True,
                   capture_output=True, timeout=scaled(60))
    return d / "probe"


@pytest.mark.parametrize("abi", ["x32", "i386"])
def test_foreign_abi_syscall_is_killed(
    abi: str, foreign_abi_binary: Path, bpf_file: Path, tmp_path: Path
) -> None:
    baseline = subprocess.run([str(foreign_abi_binary), abi], capture_output=True, text=True,
                              timeout=scaled(30))
    if baseline.returncode != 0:
        pytest.skip(f"{abi} syscalls unusable here even unfiltered: {baseline.returncode}")
    assert baseline.stdout.startswith("survived")
    body = "os.execv(sys.argv[2], sys.argv[2:])\n"
    assert_killed(run_filtered(body, bpf_file, tmp_path, str(foreign_abi_binary), abi))


# ---------------------------------------------------------------------------------------------
# The policy as data
# ---------------------------------------------------------------------------------------------


def test_allowed_syscalls_sorted_unique_and_conditional_ones_kept_apart() -> None:
    names = seccomp.ALLOWED_SYSCALLS
    assert list(names) == sorted(set(names))
    conditional = {"socket", "socketpair", "clone", "ioctl", "clone3", "fcntl", "sendto", "sendmsg",
                   *PAGE_CACHE_CALLS}
    assert conditional.isdisjoint(names)


def test_policy_is_a_plain_hashable_encodable_value() -> None:
    p = seccomp.DEFAULT_POLICY
    same = msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=seccomp.SeccompPolicy)
    assert same == p
    assert hash(same) == hash(p)
    assert msgspec.structs.asdict(p)["allowed"] == seccomp.ALLOWED_SYSCALLS
    q = msgspec.structs.replace(p, extra_allowed=("memfd_create",))
    assert q.extra_allowed == ("memfd_create",)
    assert q.allowed == p.allowed
    assert q != p
    with pytest.raises(AttributeError):
        p.allowed = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        seccomp.SeccompPolicy(allowed="read")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ioctl_allowed: .* is not a 32-bit unsigned int"):
        seccomp.SeccompPolicy(allowed=(), ioctl_allowed=(1 << 32,))
    with pytest.raises(ValueError, match="both allowed and denied"):
        seccomp.SeccompPolicy(allowed=(), ioctl_allowed=(1,), ioctl_eperm=(1,))


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (seccomp.SeccompPolicy(allowed=("read", "no_such_syscall")), "no_such_syscall"),
        (seccomp.SeccompPolicy(allowed=("read", "clone3")), "clone3"),
        (seccomp.SeccompPolicy(allowed=("read", "socket")), "socket"),
        (seccomp.SeccompPolicy(allowed=("read",), extra_allowed=("ioctl",)), "ioctl"),
        (seccomp.SeccompPolicy(allowed=("read", "fcntl")), "fcntl"),
        (seccomp.SeccompPolicy(allowed=("read", "sendto")), "sendto"),
    ],
)
def test_inconsistent_policy_is_rejected(policy: seccomp.SeccompPolicy, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        seccomp.build_bpf(policy)


def test_extra_allowed_and_socket_switch_widen_the_filter(tmp_path: Path) -> None:
    policy = msgspec.structs.replace(
        seccomp.DEFAULT_POLICY, unix_only_socket=False, extra_allowed=("socket",)
    )
    bpf = write_bpf(tmp_path / "wide.bpf", policy)
    body = """
    assert os.getsid(0) == os.getpid()  # a new session: see run_filtered
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    print("OK")
    """
    assert_ok(run_filtered(body, bpf, tmp_path))
    # socketpair lost its AF_UNIX rule with unix_only_socket=False and is not listed:
    # ENOSYS, like every name the policy does not mention.
    body = """
    try:
        socket.socketpair()
    except OSError as e:
        print(errno.errorcode[e.errno])
    """
    assert_ok(run_filtered(body, bpf, tmp_path), tail="ENOSYS\n")


@pytest.mark.parametrize("denied", [
    [seccomp.TIOCSTI, seccomp.TIOCLINUX],
    [*seccomp.IOCTL_ALLOWED, seccomp.TIOCSTI, seccomp.TIOCLINUX],
    [seccomp.F_SETLEASE],
    [seccomp.F_SETLEASE, seccomp.F_NOTIFY],
    [0, 6],
    [],
])
def test_low32_complement_is_exact(denied: list[int]) -> None:
    cubes = seccomp_compile._low32_complement(denied)
    rng = random.Random(1)
    samples = list(range(0x5300, 0x5600)) + [rng.getrandbits(32) for _ in range(3000)]
    samples += [0, 0xFFFFFFFF, *denied] + [d ^ (1 << b) for d in denied for b in range(32)]
    for x in samples:
        hits = sum((x & mask) == value for mask, value in cubes)
        assert hits == (0 if x in denied else 1), hex(x)


@pytest.mark.parametrize(("denied", "mask"), [([1], 0xF), ([1, 2, 5], 0xF), ([0], 0x1)])
def test_masked_complement_is_exact(denied: list[int], mask: int) -> None:
    """Over the bits of `mask` only (a socket's type past SOCK_NONBLOCK/SOCK_CLOEXEC):
    each value of a 32-bit word is matched once unless its masked bits are denied."""
    cubes = seccomp_compile._complement(denied, mask)
    assert all(m & ~mask == 0 for m, _ in cubes)
    rng = random.Random(2)
    for x in [*range(64), *(rng.getrandbits(32) for _ in range(2000))]:
        hits = sum((x & m) == v for m, v in cubes)
        assert hits == (0 if x & mask in denied else 1), hex(x)
    with pytest.raises(ValueError, match="not contiguous"):
        seccomp_compile._complement([1], 0xF0)


# ---------------------------------------------------------------------------------------------
# The rules as data (policy_rules: pure)
# ---------------------------------------------------------------------------------------------


def test_namespace_flags_are_the_abi_ones() -> None:
    assert seccomp.CLONE_NEWUSER is abi.CLONE_NEWUSER
    assert seccomp.CLONE_NEWNS is abi.CLONE_NEWNS
    flags = 0
    for flag in abi.NAMESPACE_FLAGS.values():
        flags |= flag
    assert flags == seccomp.NAMESPACE_FLAGS
    assert seccomp.CLONE_NEWTIME & seccomp.NAMESPACE_FLAGS == 0
    assert seccomp.CLONE_PARENT & seccomp.NAMESPACE_FLAGS == 0


def test_policy_rules_import_no_libseccomp() -> None:
    code = (
        f"import sys; sys.path.insert(0, {REPO!r}); import trunner.linux.seccomp as s; "
        "s.policy_rules(s.DEFAULT_POLICY); s.policy_rules(s.provider_policy()); "
        "print('pyseccomp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=scaled(60))
    assert out.stdout == "False\n"


@pytest.mark.parametrize(
    ("fields", "groups"),
    [
        ({"allowed": ("read", "setns"), "errno_eperm": ("setns",)},
         ("allowed/extra_allowed", "errno_eperm")),
        ({"allowed": ("read",), "extra_allowed": ("clone3",)},
         ("allowed/extra_allowed", "errno_enosys")),
        ({"allowed": ("read",), "errno_eperm": ("prlimit64",), "self_only": ("prlimit64",)},
         ("errno_eperm", "self_only")),
        ({"allowed": ("read",), "self_only": ("ioctl",)}, ("self_only", "conditional rules")),
        ({"allowed": ("read",), "errno_enosys": ("sendmsg",)},
         ("errno_enosys", "conditional rules")),
        ({"allowed": ("socketpair",)}, ("allowed/extra_allowed", "conditional rules")),
    ],
)
def test_a_name_in_two_groups_is_refused_naming_both(
    fields: dict[str, tuple[str, ...]], groups: tuple[str, str]
) -> None:
    policy = seccomp.SeccompPolicy(**fields)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is in both") as info:
        seccomp.policy_rules(policy)
    assert f"both {groups[0]} and {groups[1]}" in str(info.value)


def test_socket_names_are_free_without_unix_only_socket() -> None:
    policy = seccomp.SeccompPolicy(allowed=("socket", "socketpair"), unix_only_socket=False)
    rules = seccomp.policy_rules(policy)
    assert [r for r in rules if r.syscall.startswith("socket")] == [
        Rule(ALLOW, "socket"), Rule(ALLOW, "socketpair")]


def test_policy_rules_of_the_default_policy() -> None:
    rules = seccomp.policy_rules(seccomp.DEFAULT_POLICY)
    assert rules == seccomp.policy_rules(seccomp.DEFAULT_POLICY)  # deterministic
    by_name: dict[str, list[Rule]] = {}
    for rule in rules:
        by_name.setdefault(rule.syscall, []).append(rule)
    policy = seccomp.DEFAULT_POLICY
    for name in policy.allowed:
        assert by_name[name] == [Rule(ALLOW, name)]
    for name in policy.errno_eperm:
        assert by_name[name] == [Rule(ERRNO(errno.EPERM), name)]
    for name in policy.errno_enosys:  # listed, though libseccomp needs no rule for them
        assert by_name[name] == [Rule(ERRNO(errno.ENOSYS), name)]
    flags = [1 << b for b in range(32) if seccomp.NAMESPACE_FLAGS >> b & 1]
    assert by_name["clone"] == [
        Rule(ALLOW, "clone", (Arg(0, seccomp.NAMESPACE_FLAGS, 0),)),
        *(Rule(ERRNO(errno.EPERM), "clone", (Arg(0, f, f),)) for f in flags)]
    # ioctl: each listed request (sorted), then ENOTTY for the rest.
    exact = {**dict.fromkeys(seccomp.IOCTL_ALLOWED + seccomp.IOCTL_INTERFACE_QUERIES, ALLOW),
             seccomp.TIOCSTI: ERRNO(errno.EPERM), seccomp.TIOCLINUX: ERRNO(errno.EPERM)}
    ioctl = by_name["ioctl"]
    assert ioctl[:len(exact)] == [Rule(exact[v], "ioctl", (Arg(1, 0xFFFFFFFF, v),))
                                  for v in sorted(exact)]
    assert {r.action for r in ioctl[len(exact):]} == {ERRNO(errno.ENOTTY)}
    # The page-cache channel: RWF_NOWAIT EOPNOTSUPP, two madvise advices EINVAL,
    # POSIX_FADV_DONTNEED a no-op (errno 0), every other value allowed.
    for name in ("preadv2", "pwritev2"):
        assert by_name[name] == [Rule(ALLOW, name, (Arg(5, seccomp.RWF_NOWAIT, 0),)),
                                 Rule(ERRNO(errno.EOPNOTSUPP), name,
                                      (Arg(5, seccomp.RWF_NOWAIT, seccomp.RWF_NOWAIT),))]
    assert by_name["madvise"][:2] == [
        Rule(ERRNO(errno.EINVAL), "madvise", (Arg(2, 0xFFFFFFFF, seccomp.MADV_COLD),)),
        Rule(ERRNO(errno.EINVAL), "madvise", (Arg(2, 0xFFFFFFFF, seccomp.MADV_PAGEOUT),))]
    assert {r.action for r in by_name["madvise"][2:]} == {ALLOW}
    assert by_name["fadvise64"][0] == Rule(ERRNO(0), "fadvise64",
                                           (Arg(3, 0xFFFFFFFF, seccomp.POSIX_FADV_DONTNEED),))
    assert {r.action for r in by_name["fadvise64"][1:]} == {ALLOW}
    assert set(by_name) == {*policy.allowed, *policy.errno_eperm, *policy.errno_enosys,
                            *policy.self_only, *PAGE_CACHE_CALLS, "clone", "fcntl", "ioctl",
                            "mknod", "mknodat", "sendmmsg", "sendmsg", "sendto", "socket",
                            "socketpair"}
    # mknod, mknodat: one rule per file type, devices EPERM
    allowed_types = {a.value for r in by_name["mknodat"] if r.action == ALLOW for a in r.args}
    assert allowed_types == {0, 0o010000, 0o100000, 0o140000}
    assert len(by_name["mknod"]) == 16
    assert repr(Rule(ERRNO(errno.EPERM), "setns")) == \
        "Rule(action=ERRNO(EPERM), syscall='setns', args=())"


def _overlap(a: Rule, b: Rule) -> bool:
    """Some argument values match both rules (conditions on one argument agree on
    the bits both compare)."""
    return all((x.value ^ y.value) & x.mask & y.mask == 0
               for x in a.args for y in b.args if x.index == y.index)


def _matches(rule: Rule, args: tuple[int, ...]) -> bool:
    return all(args[a.index] & a.mask == a.value for a in rule.args)


@pytest.mark.parametrize("profile", ["default", "provider"])
def test_each_syscalls_rules_agree_where_they_overlap_and_cover_every_call(profile: str) -> None:
    """Rules of one syscall that could both match have the same action (else libseccomp
    would keep one of them: see `_complement`), and every argument vector matches one."""
    policy = seccomp.provider_policy() if profile == "provider" else seccomp.DEFAULT_POLICY
    by_name: dict[str, list[Rule]] = {}
    for rule in seccomp.policy_rules(policy):
        by_name.setdefault(rule.syscall, []).append(rule)
    conditional = {name: rules for name, rules in by_name.items() if len(rules) > 1}
    assert set(conditional) == {"clone", "fcntl", "ioctl", "mknod", "mknodat", "prlimit64",
                                "sendmmsg", "sendmsg", "sendto", "socket", "socketpair",
                                *PAGE_CACHE_CALLS}
    rng = random.Random(3)
    for name, rules in conditional.items():
        for rule in rules:
            assert all(a.value & ~a.mask == 0 and 0 <= a.index < 6 for a in rule.args), rule
        for i, a in enumerate(rules):
            for b in rules[i + 1:]:
                assert a.action == b.action or not _overlap(a, b), (a, b)
        # Every value a rule names, its neighbours, and random words, in each argument.
        seen = [a.value for r in rules for a in r.args] + [0, 0xFFFFFFFF]
        pool = seen + [v ^ (1 << b) for v in seen for b in range(32)]
        for _ in range(4000):
            args = tuple(rng.choice(pool) if rng.random() < 0.8 else rng.getrandbits(64)
                         for _ in range(6))
            hits = {r.action for r in rules if _matches(r, args)}
            assert len(hits) == 1, (name, [hex(a) for a in args], hits)


def test_compile_takes_rules_as_data() -> None:
    rules = seccomp.policy_rules(seccomp.DEFAULT_POLICY)
    assert seccomp_compile.compile(rules) == seccomp.build_bpf()
    # The default action's rules are left to the default (libseccomp refuses them).
    only = seccomp_compile.compile([Rule(ERRNO(errno.ENOSYS), "clone3")])
    assert only == seccomp_compile.compile([])
    assert seccomp_compile.compile([Rule(ALLOW, "read")]) != only


def test_unknown_syscall_name_is_refused_by_compile() -> None:
    policy = seccomp.SeccompPolicy(allowed=("read",), errno_eperm=("no_such_syscall",))
    rules = seccomp.policy_rules(policy)  # a name is the architecture's question
    assert Rule(ERRNO(errno.EPERM), "no_such_syscall") in rules
    with pytest.raises(ValueError, match="unknown syscall 'no_such_syscall'"):
        seccomp_compile.compile(rules)
    with pytest.raises(ValueError, match="unknown syscall 'nope'"):
        seccomp_compile.compile([Rule(ERRNO(errno.ENOSYS), "nope")])


def test_compile_for_another_architecture() -> None:
    """On aarch64 the x86_64-only names (open, stat, fork, ...) have no number:
    libseccomp leaves their rules out."""
    import pyseccomp

    native = seccomp.build_bpf()
    assert seccomp_compile.compile(seccomp.DEFAULT_POLICY, pyseccomp.Arch.X86_64) == native
    arm = seccomp_compile.compile(seccomp.DEFAULT_POLICY, pyseccomp.Arch.AARCH64)
    assert len(arm) % 8 == 0
    assert 0 < len(arm) // 8 <= 4096
    assert arm != native


# ---------------------------------------------------------------------------------------------
# Parent side: build_bpf, syscall_name; helper side: install_filter
# ---------------------------------------------------------------------------------------------


def test_build_bpf_is_deterministic_and_not_cached() -> None:
    bpf = seccomp.build_bpf()
    again = seccomp.build_bpf(seccomp.DEFAULT_POLICY)
    assert again == bpf
    assert again is not bpf  # compiled anew: callers keep the bytes
    assert len(bpf) % 8 == 0
    assert 0 < len(bpf) // 8 <= 4096
    code = (
        f"import sys; sys.path.insert(0, {REPO!r}); import trunner.linux.seccomp as s; "
        "sys.stdout.write(s.build_bpf().hex())"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=scaled(60))
    assert bytes.fromhex(other.stdout) == bpf


def test_import_is_cheap_for_the_helper() -> None:
    """The installer pulls in its raw system calls and nothing else (no
    ctypes, no pyseccomp, no typing)."""
    code = (
        f"import sys; sys.path.insert(0, {REPO!r}); import trunner; before = set(sys.modules); "
        "import trunner.kernel.install; print(' '.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=scaled(60))
    added = set(out.stdout.split())
    # Not even `trunner.linux`, the parent's backend package: the child side is its own room.
    assert added == {"trunner.kernel", "trunner.kernel.abi", "trunner.kernel.install",
                     "trunner.kernel._kernel"}


def test_syscall_name() -> None:
    import pyseccomp

    assert seccomp.syscall_name(39) == "getpid"
    assert seccomp.syscall_name(56) == "clone"
    assert seccomp.syscall_name(-1) is None
    assert seccomp.syscall_name(0x40000000 + 39) is None
    assert seccomp.syscall_name(100_000) is None
    # Another architecture's numbers, on request.
    assert seccomp.syscall_name(172, pyseccomp.Arch.AARCH64) == "getpid"
    assert seccomp.syscall_name(0x40000000 + 39, pyseccomp.Arch.X32) == "getpid"
    assert seccomp.syscall_name(39, pyseccomp.Arch.X86_64) == "getpid"


@pytest.mark.parametrize("bad", [b"", b"\0" * 7, b"\0" * 8 * 4097, b"\0" * 12])
def test_install_filter_rejects_malformed_programs(bad: bytes) -> None:
    # Validation happens before any prctl: safe to call in the test process.
    with pytest.raises(OSError, match=rf"^\[Errno {errno.EINVAL}\]") as info:
        install.install_seccomp(bad)
    assert info.value.errno == errno.EINVAL


def test_install_filter_requires_no_new_privs(bpf_file: Path, tmp_path: Path) -> None:
    prelude = PRELUDE.replace("install.set_no_new_privs()\n", "").replace(
        "install.install_seccomp(bpf)\n",
        "try:\n    install.install_seccomp(bpf)\nexcept OSError as e:\n"
        "    assert e.errno == errno.EPERM, e\n    print('refused', flush=True)\n"
        "else:\n    print('installed', flush=True)\n",
    )
    proc = run_filtered("print('OK')\n", bpf_file, tmp_path, prelude=prelude)
    assert proc.returncode == 0, proc
    assert proc.stdout == "refused\narmed\nOK\n", proc


def test_kernel_rejects_garbage_with_oserror(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.bpf"
    garbage.write_bytes(b"\xff" * 16)  # well-formed size, invalid opcodes
    prelude = PRELUDE.replace(
        "install.install_seccomp(bpf)\n",
        "try:\n    install.install_seccomp(bpf)\nexcept OSError as e:\n"
        "    assert e.errno == errno.EINVAL and 'SECCOMP_SET_MODE_FILTER' in str(e), e\n"
        "    print('rejected', flush=True)\n",
    )
    proc = run_filtered("", garbage, tmp_path, prelude=prelude)
    assert proc.returncode == 0, proc
    assert proc.stdout == "rejected\narmed\n", proc


def _socket_allows(policy: seccomp.SeccompPolicy) -> set[tuple[str, tuple[tuple[int, int], ...]]]:
    """(call, ((arg, value), ...)) of every ALLOW rule of socket/socketpair."""
    return {(r.syscall, tuple((a.index, a.value) for a in r.args))
            for r in seccomp.policy_rules(policy)
            if r.action == seccomp.ALLOW and r.syscall in ("socket", "socketpair")}


def test_the_default_profile_allows_the_loopbacks_sockets_only() -> None:
    """AF_UNIX of every type (socketpair too), TCP, UDP and UDP-Lite of both inet families,
    netlink route and sock_diag; nothing raw, no ping, no other protocol."""
    unix = {(call, ((0, 1), (1, kind))) for call in ("socket", "socketpair")
            for kind in (1, 2, 5)}
    inet = {("socket", ((0, family), (1, kind), (2, proto))) for family in (2, 10)
            for kind, protos in ((1, (0, 6)), (2, (0, 17, 136))) for proto in protos}
    netlink = {("socket", ((0, 16), (2, proto))) for proto in (0, 4)}
    assert _socket_allows(seccomp.DEFAULT_POLICY) == unix | inet | netlink
    assert "connect" in seccomp.DEFAULT_POLICY.allowed


def test_interface_queries_are_the_default_profiles_only() -> None:
    """SIOCGIFINDEX and the like read the run's own loopback; in the provider
    profile (the host's network namespace) they would read the host's."""
    assert set(seccomp.IOCTL_INTERFACE_QUERIES) <= set(seccomp.DEFAULT_POLICY.ioctl_allowed)
    assert seccomp.provider_policy().ioctl_allowed == seccomp.IOCTL_ALLOWED


def test_the_provider_profile_keeps_tcp_only() -> None:
    """The host's network namespace: TCP sockets (0 or IPPROTO_TCP), no UDP, no
    AF_UNIX socket() (socketpair of the stream type only), no server calls."""
    policy = seccomp.provider_policy()
    assert _socket_allows(policy) == {
        ("socketpair", ((0, 1), (1, 1))),
        *(("socket", ((0, family), (1, 1), (2, proto))) for family in (2, 10) for proto in (0, 6)),
    }
    assert set(seccomp.SERVER_SYSCALLS) <= set(policy.errno_eperm)
    assert "connect" in policy.allowed


def test_the_waiters_filter_allows_their_calls_and_nothing_else(tmp_path: Path) -> None:
    """The waiting helper's and pid 1's own filter: what Python's last steps
    and waiter.c call work; any other call, the jail's ordinary ones too,
    fails ENOSYS."""
    bpf_file = tmp_path / "waiter.bpf"
    bpf_file.write_bytes(seccomp.waiter_bpf())
    body = """
    def call(nr, *args):
        rc = libc.syscall(nr, *args)
        return rc if rc >= 0 else errno.errorcode[ctypes.get_errno()]
    r, w = os.pipe()
    assert os.write(w, b"x") == 1 and os.read(r, 1) == b"x"
    assert call(39) == os.getpid()  # getpid
    assert call(16, r, 0x5451) == 0  # ioctl FIOCLEX
    assert call(16, r, 0x541B, ctypes.create_string_buffer(8)) == "ENOSYS"  # FIONREAD
    assert call(247, 0, 0, None, 4, None) == "ECHILD"  # waitid: reaches the kernel
    assert call(62, os.getpid(), 0) == 0  # kill, signal 0
    for nr in (41, 57, 56, 59, 101, 272, 165, 2, 87, 90, 161, 157, 317):
        # socket, fork, clone, execve, ptrace, unshare, mount, open, unlink,
        # chmod, chroot, prctl, seccomp
        assert call(nr, 0, 0, 0) == "ENOSYS", nr
    os.write(1, b"OK\\n")
    os._exit(0)
    """
    assert_ok(run_filtered(body, bpf_file, tmp_path))


def test_the_waiters_filter_is_a_fraction_of_the_jails() -> None:
    waiter, jail = seccomp.waiter_bpf(), seccomp.build_bpf()
    assert len(waiter) // 8 < 64 < len(jail) // 8 // 20
