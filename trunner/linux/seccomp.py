"""Parent side: the seccomp policy as data, and its compilation to BPF.

`build_bpf` compiles a `SeccompPolicy` into classic BPF bytes with pyseccomp
(imported lazily: it is slow to import), once per policy; the helper only
installs the bytes (`trunner.linux.install`). `syscall_name` names a killed
syscall number. Anything the policy does not allow kills the whole process
with SIGSYS (`SECCOMP_RET_KILL_PROCESS`), as do foreign architectures and
x32 syscall numbers.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "AF_UNIX",
    "ALLOWED_SYSCALLS",
    "CLONE_NEWTIME",
    "CLONE_PARENT",
    "DEFAULT_POLICY",
    "F_SETLEASE",
    "IOCTL_ALLOWED",
    "MSG_FASTOPEN",
    "NAMESPACE_FLAGS",
    "TIOCLINUX",
    "TIOCSTI",
    "SeccompPolicy",
    "build_bpf",
    "provider_policy",
    "syscall_name",
]

# --------------------------------------------------------------------------------------------
# Constants (Linux UAPI; identical on every architecture we care about)
# --------------------------------------------------------------------------------------------

AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
SOCK_STREAM = 1
IPPROTO_TCP = 6
# The only protocols of an AF_INET/AF_INET6 stream socket Landlock's TCP rules see:
# IPPROTO_MPTCP (262), IPPROTO_SMC (256, Linux 6.11) and SCTP (132) connect and bind
# unchecked. 0 picks TCP for SOCK_STREAM.
INET_PROTOCOLS = (0, IPPROTO_TCP)
# TCP fast open: sendto/sendmsg with this flag connects without connect(), past
# Landlock's connect hook.
MSG_FASTOPEN = 0x20000000

# The new process becomes a child of the caller's parent: from the group leader, a
# child of trunner itself, which never reaps it (a zombie per call).
CLONE_PARENT = 0x00008000
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# CLONE_NEWTIME (0x80) is only meaningful to unshare() and clone3(); for clone() the low byte
# of the flags is the exit signal (CSIGNAL), so it must NOT be part of the clone() mask.
# unshare and setns are killed and clone3 fails with ENOSYS, so it needs no rule of its own.
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
    | CLONE_NEWCGROUP
)

TIOCSTI = 0x5412  # push bytes into a terminal's input queue: classic sandbox escape
TIOCLINUX = 0x541C  # virtual-console ioctls, incl. selection paste (same class of escape)

# The ioctl requests ordinary programs make (CPython, sh, coreutils, git, tar, gcc under
# strace: only the first three, on pipes). No tty is reachable in the jail, so the tty
# queries answer ENOTTY from the kernel; FIO* act on the caller's own descriptor.
IOCTL_ALLOWED = (
    0x5401,  # TCGETS: isatty(), tcgetattr()
    0x540F,  # TIOCGPGRP: sh, tcgetpgrp()
    0x5413,  # TIOCGWINSZ: ls, os.get_terminal_size()
    0x541B,  # FIONREAD
    0x5421,  # FIONBIO: socket.setblocking(), Node
    0x5450,  # FIONCLEX
    0x5451,  # FIOCLEX
    0x802C542A,  # TCGETS2: tcgetattr() in glibc >= 2.42
)

# A lease makes every other opener of the file (any host process, any uid) wait for the
# holder, up to lease-break-time (45 s). Locks stay: advisory, and they die with the run.
F_SETLEASE = 1024

_U32 = 0xFFFFFFFF

# --------------------------------------------------------------------------------------------
# The policy as data
# --------------------------------------------------------------------------------------------

# Allowed unconditionally.  Found by running CPython 3.11 (startup, msgspec/blake3 imports,
# threads, trio, subprocess, fork, sockets, tempfile) and a battery of /bin/sh + coreutils
# commands under ``strace -f``, then adding the obvious siblings named in the comments.
# socket/socketpair, clone, ioctl, fcntl, sendto and sendmsg are allowed only with argument
# checks (see SeccompPolicy);
# clone3 fails with ENOSYS so that glibc falls back to clone, whose flags we can inspect.
ALLOWED_SYSCALLS: tuple[str, ...] = (
    "accept",  # AF_UNIX servers (default profile only: see provider_policy)
    "accept4",
    "access",
    "alarm",  # signal.alarm(); getitimer/setitimer likewise
    "arch_prctl",  # TLS setup by ld.so
    "bind",
    "brk",
    "chdir",
    "clock_getres",
    "clock_gettime",  # vDSO fallback; CPU-time clocks are real syscalls
    "clock_nanosleep",
    "close",
    "close_range",  # subprocess close_fds fast path
    "copy_file_range",  # cp
    "creat",  # tar
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_pwait",
    "epoll_wait",
    "eventfd2",
    "execve",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",  # cat, sort
    "fchdir",  # find
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "getcwd",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",  # id
    "getitimer",
    "getpeername",
    "getpgrp",  # sh
    "getpid",
    "getppid",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrusage",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",  # ls probes POSIX ACLs; shutil.copystat reads xattrs
    "kill",  # Landlock's signal scope (ABI 6) bounds who can be signalled
    "lgetxattr",
    "link",
    "linkat",
    "listen",  # autobinds an AF_INET socket: default profile only (AF_UNIX there)
    "listxattr",
    "llistxattr",
    "lseek",
    "lstat",
    "madvise",
    "mincore",  # grep
    "mkdir",
    "mkdirat",
    "mmap",
    "mprotect",
    "mremap",  # glibc realloc of large blocks
    "msync",
    "munmap",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "pidfd_open",  # os.pidfd_open, trio's process waiting
    "pipe",
    "pipe2",
    "poll",
    "ppoll",
    "prctl",  # PR_SET_NAME from trio's thread cache; nothing reachable needs privileges
    "pread64",
    "pselect6",
    "pwrite64",
    "read",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmsg",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",  # registered by glibc >= 2.35 at startup and for every thread
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigsuspend",  # sh's wait
    "sched_yield",
    "select",
    "sendfile",  # shutil.copyfile fast path
    "set_robust_list",  # glibc, every thread
    "set_tid_address",  # glibc startup
    "setitimer",
    "setsockopt",
    "shutdown",
    "sigaltstack",  # faulthandler, CPython stack-overflow guard
    "stat",
    "statfs",  # coreutils probe for SELinux
    "statx",
    "symlink",
    "symlinkat",
    "sysinfo",  # sort, CPython memory probes
    "tgkill",  # raise()/abort(), signal.pthread_kill
    "times",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "vfork",  # CPython's _posixsubprocess
    "wait4",
    "waitid",
    "write",
    "writev",
)
# Deliberately absent (killed), beyond the namespace/mount/module/keyring/tracing families:
#   seccomp        stacking more filters would be harmless but nothing needs it; note that
#                  prctl(PR_SET_SECCOMP) stays reachable through prctl, equally harmless.
#   setsid, setpgid  a descendant must not leave the process group (so subprocess's
#                  start_new_session/process_group, and coreutils `timeout`, die).
#   personality    even the 0xffffffff query; READ_IMPLIES_EXEC & co. are not wanted.
#   fork           glibc forks with clone; the legacy syscall is not needed.
#   mbind, migrate_pages, move_pages, set_mempolicy: NUMA placement, not needed.
#   chown family, mknod(at), setuid family, capset, timer_create: not needed by the workload.
# Failing with EPERM instead (ERRNO_EPERM), so tools degrade rather than die:
#   chmod, fchmod(at), utime(s|nsat), futimesat, chown family, set/removexattr family:
#                  Landlock does not cover metadata, and a jailed root (real uid 0 mapped
#                  to itself) owns the host's root files: it could chmod them. fchmod
#                  needs only a read-only fd, so it goes too.
#   connect        pathname AF_UNIX sockets (docker.sock, D-Bus) are outside Landlock's
#                  reach; with connect denied and sockets AF_UNIX *stream* only (an
#                  unconnected stream socket cannot sendto a path), nothing leaves.
# Failing with the errno of a kernel without the feature, which callers already handle:
#   ioctl outside IOCTL_ALLOWED: ENOTTY (TIOCSTI, TIOCLINUX: killed).
#   sendto/sendmsg with MSG_FASTOPEN: EOPNOTSUPP (fast open disabled).
#   provider socket() with a protocol other than 0/TCP: EPROTONOSUPPORT.
# And EPERM: fcntl(F_SETLEASE); listen/accept/accept4 in the provider profile.


class SeccompPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The seccomp policy as data; `build_bpf` compiles it.

    A name may appear in at most one of allowed/extra_allowed, errno_enosys,
    errno_eperm, self_only and the conditional rules (socket/socketpair when
    `unix_only_socket`; clone, ioctl, fcntl, sendto, sendmsg always).
    Values compared with ioctl's request, fcntl's cmd and the send flags are
    their low 32 bits: the kernel reads them as unsigned int.
    """

    #: Syscall names allowed unconditionally.
    allowed: tuple[str, ...]
    #: `socket`/`socketpair` only for AF_UNIX stream (low 32 bits of the domain).
    unix_only_socket: bool = True
    #: Fail with ENOSYS instead of killing (`clone3`: glibc then falls back to
    #: `clone`, whose flags a filter can inspect, unlike clone3's struct).
    errno_enosys: tuple[str, ...] = ("clone3",)
    #: More unconditionally allowed names, for callers that widen the default.
    extra_allowed: tuple[str, ...] = ()
    #: `clone` is allowed iff `flags & clone_denied_flags == 0` (0: unconditional).
    clone_denied_flags: int = NAMESPACE_FLAGS | CLONE_PARENT
    #: `ioctl` requests allowed; any other fails ENOTTY, except `ioctl_killed`.
    ioctl_allowed: tuple[int, ...] = IOCTL_ALLOWED
    #: `ioctl` requests that kill.
    ioctl_killed: tuple[int, ...] = (TIOCSTI, TIOCLINUX)
    #: `fcntl` commands that fail EPERM; the rest are allowed.
    fcntl_eperm: tuple[int, ...] = (F_SETLEASE,)
    #: `sendto`/`sendmsg` with any of these flags fail EOPNOTSUPP (0: unconditional).
    send_flags_denied: int = MSG_FASTOPEN
    #: Fail with EPERM instead of killing, so tools degrade rather than die.
    errno_eperm: tuple[str, ...] = ()
    #: `socket` for AF_INET/AF_INET6 stream only, protocol 0 or TCP (any other
    #: fails EPROTONOSUPPORT), and no longer AF_UNIX (socketpair stays AF_UNIX
    #: stream): the provider profile, where Landlock limits TCP connect to the
    #: configured ports.
    inet_socket: bool = False
    #: Allowed only with a pid argument (arg 0) of 0: the caller itself.
    self_only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in ("allowed", "errno_enosys", "extra_allowed", "errno_eperm", "self_only"):
            _names(getattr(self, field), field)
        for field in ("clone_denied_flags", "send_flags_denied"):
            _u32(getattr(self, field), field)
        for field in ("ioctl_allowed", "ioctl_killed", "fcntl_eperm"):
            for value in getattr(self, field):
                _u32(value, field)
        if set(self.ioctl_allowed) & set(self.ioctl_killed):
            raise ValueError("SeccompPolicy: an ioctl request is both allowed and killed")


def _names(values: Iterable[str], field: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise TypeError(f"SeccompPolicy.{field} must be a sequence of names, not a str")
    out = tuple(values)
    for v in out:
        if not isinstance(v, str) or not v:
            raise TypeError(f"SeccompPolicy.{field}: {v!r} is not a syscall name")
    return out


def _u32(value: int, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U32:
        raise ValueError(f"SeccompPolicy.{field}: {value!r} is not a 32-bit unsigned int")
    return value


#: Allowed only on the calling process (pid argument 0): on another pid they
#: would read or lower a host process's limits (prlimit64, same uid) or probe
#: which host processes exist; there is no PID namespace to hide them.
SELF_ONLY: tuple[str, ...] = ("getpgid", "getsid", "prlimit64", "sched_getaffinity")

#: Fail with EPERM instead of killing: see the comment above the policy class.
ERRNO_EPERM: tuple[str, ...] = (
    "chmod", "chown", "connect", "fchmod", "fchmodat", "fchown", "fchownat", "fremovexattr",
    "fsetxattr", "futimesat", "lchown", "lremovexattr", "lsetxattr", "removexattr",
    "setxattr", "utime", "utimensat", "utimes",
)

#: Denied (EPERM) in the provider profile: listen() autobinds an unbound TCP socket
#: to 0.0.0.0:<ephemeral> without a bind() for Landlock to check, and the host can
#: then connect in. seccomp cannot see the socket's family at listen().
SERVER_SYSCALLS: tuple[str, ...] = ("accept", "accept4", "listen")


def provider_policy(base: SeccompPolicy | None = None) -> SeccompPolicy:
    """The provider profile's policy: TCP sockets and `connect` allowed (Landlock
    limits the ports), AF_UNIX sockets no longer creatable, so `connect` cannot
    reach a pathname unix socket on the host; no server calls."""
    base = DEFAULT_POLICY if base is None else base
    return msgspec.structs.replace(
        base,
        inet_socket=True,
        allowed=tuple(sorted({*base.allowed, "connect"} - set(SERVER_SYSCALLS))),
        errno_eperm=tuple(sorted({*base.errno_eperm, *SERVER_SYSCALLS} - {"connect"})),
    )


DEFAULT_POLICY = SeccompPolicy(
    allowed=ALLOWED_SYSCALLS,
    unix_only_socket=True,
    errno_enosys=("clone3",),
    extra_allowed=(),
    clone_denied_flags=NAMESPACE_FLAGS | CLONE_PARENT,
    ioctl_allowed=IOCTL_ALLOWED,
    ioctl_killed=(TIOCSTI, TIOCLINUX),
    fcntl_eperm=(F_SETLEASE,),
    send_flags_denied=MSG_FASTOPEN,
    errno_eperm=ERRNO_EPERM,
    self_only=SELF_ONLY,
)

# --------------------------------------------------------------------------------------------
# Parent side: compilation with pyseccomp (imported lazily)
# --------------------------------------------------------------------------------------------

_SOCK_FILTER_SIZE = 8  # struct sock_filter { u16 code; u8 jt; u8 jf; u32 k; }
_BPF_MAXINSNS = 4096
_BPF_CACHE: dict[SeccompPolicy, bytes] = {}


def _import_pyseccomp() -> Any:  # noqa: ANN401  pyseccomp is untyped (Any to mypy)
    try:
        import pyseccomp  # slow: it runs find_library(), i.e. ldconfig, at import time
    except (ImportError, OSError, RuntimeError) as exc:
        raise RuntimeError(
            "trunner.seccomp needs the 'pyseccomp' package and the libseccomp shared library "
            f"(libseccomp.so.2, e.g. apt-get install libseccomp2): {exc}"
        ) from exc
    return pyseccomp


def _low32_complement(denied: Iterable[int]) -> list[tuple[int, int]]:
    """(mask, value) pairs whose union is exactly the 32-bit values NOT in ``denied``.

    libseccomp cannot attach a rule whose action equals the default action (here: kill), and
    has no masked "not equal", so "allow unless low32(x) in denied" is written as several
    ALLOW rules ``(x & mask) == value``: the disjoint prefixes of a binary trie of ``denied``
    that branch away from every denied value (at most 32 per denied value). Nor can rules
    of one syscall overlap: libseccomp 2.5 keeps the less specific of two overlapping rules
    and drops the other, so "ERRNO, except ALLOW for these" is also written with cubes.
    """
    cubes: list[tuple[int, int]] = []

    def walk(values: list[int], bit: int, prefix: int) -> None:
        if bit < 0:
            return
        mask = _U32 & ~((1 << bit) - 1)  # this bit and all higher ones
        for b in (0, 1):
            sub = [v for v in values if (v >> bit) & 1 == b]
            branch = prefix | (b << bit)
            if sub:
                walk(sub, bit - 1, branch)
            else:
                cubes.append((mask, branch))

    walk(sorted(set(denied)), 31, 0)
    return cubes


def _compile(policy: SeccompPolicy) -> bytes:
    sc = _import_pyseccomp()
    native = sc.Arch.NATIVE

    def nr(name: str) -> int:
        num = sc.resolve_syscall(native, name)
        if num < 0:
            raise ValueError(f"seccomp policy: unknown syscall {name!r} on the native arch")
        return int(num)

    conditional = ["clone", "fcntl", "ioctl", "sendmsg", "sendto"]
    if policy.unix_only_socket:
        conditional += ["socket", "socketpair"]
    groups = {
        "allowed/extra_allowed": set(policy.allowed) | set(policy.extra_allowed),
        "errno_enosys": set(policy.errno_enosys),
        "errno_eperm": set(policy.errno_eperm),
        "self_only": set(policy.self_only),
        "conditional rules": set(conditional),
    }
    seen: dict[str, str] = {}
    for group, names in groups.items():
        for name in names:
            if name in seen:
                raise ValueError(f"seccomp policy: {name!r} is in both {seen[name]} and {group}")
            seen[name] = group

    flt = sc.SyscallFilter(sc.KILL_PROCESS)
    # Foreign-arch syscalls (int 0x80 from a 64-bit process) kill too, not just the thread.
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    # We only export; the helper sets no_new_privs itself and is single-threaded (no TSYNC).
    flt.set_attr(sc.Attr.CTL_NNP, 0)
    flt.set_attr(sc.Attr.CTL_TSYNC, 0)

    for name in sorted(groups["allowed/extra_allowed"]):
        flt.add_rule(sc.ALLOW, nr(name))
    for name in sorted(policy.errno_enosys):
        flt.add_rule(sc.ERRNO(errno.ENOSYS), nr(name))
    for name in sorted(policy.errno_eperm):
        flt.add_rule(sc.ERRNO(errno.EPERM), nr(name))
    if policy.unix_only_socket:
        for name in ("socketpair",) if policy.inet_socket else ("socket", "socketpair"):
            # The kernel reads the domain as an int: compare only the low 32 bits.
            # Stream only (type & 0xf, past SOCK_NONBLOCK/SOCK_CLOEXEC): a datagram
            # socket could sendto() a host socket by path without connect().
            flt.add_rule(
                sc.ALLOW, nr(name), sc.Arg(0, sc.MASKED_EQ, _U32, AF_UNIX),
                sc.Arg(1, sc.MASKED_EQ, 0xF, SOCK_STREAM),
            )
    for name in sorted(policy.self_only):
        flt.add_rule(sc.ALLOW, nr(name), sc.Arg(0, sc.MASKED_EQ, _U32, 0))
    if policy.unix_only_socket and policy.inet_socket:
        for family in (AF_INET, AF_INET6):
            stream = (sc.Arg(0, sc.MASKED_EQ, _U32, family),
                      sc.Arg(1, sc.MASKED_EQ, 0xF, SOCK_STREAM))
            for proto in INET_PROTOCOLS:
                flt.add_rule(sc.ALLOW, nr("socket"), *stream, sc.Arg(2, sc.MASKED_EQ, _U32, proto))
            for mask, value in _low32_complement(INET_PROTOCOLS):
                flt.add_rule(sc.ERRNO(errno.EPROTONOSUPPORT), nr("socket"), *stream,
                             sc.Arg(2, sc.MASKED_EQ, mask, value))

    def flag_rules(name: str, arg: int, denied: int, action: int | None) -> None:
        # Allowed iff no denied flag is set; else `action` (None: the default, kill).
        if not denied:
            flt.add_rule(sc.ALLOW, nr(name))
            return
        flt.add_rule(sc.ALLOW, nr(name), sc.Arg(arg, sc.MASKED_EQ, denied, 0))
        if action is None:
            return
        for bit in (1 << b for b in range(32) if denied >> b & 1):
            flt.add_rule(action, nr(name), sc.Arg(arg, sc.MASKED_EQ, bit, bit))

    def value_rules(name: str, arg: int, exact: dict[int, int | None], rest: int) -> None:
        # low32(arg) == v -> exact[v] (None: kill); any other value -> rest.
        for v in sorted(exact):
            if (action := exact[v]) is not None:
                flt.add_rule(action, nr(name), sc.Arg(arg, sc.MASKED_EQ, _U32, v))
        for mask, value in _low32_complement(exact):
            flt.add_rule(rest, nr(name), sc.Arg(arg, sc.MASKED_EQ, mask, value))

    flag_rules("clone", 0, policy.clone_denied_flags, None)
    # sendmsg(fd, msg, flags), sendto(fd, buf, len, flags, addr, addrlen)
    flag_rules("sendmsg", 2, policy.send_flags_denied, sc.ERRNO(errno.EOPNOTSUPP))
    flag_rules("sendto", 3, policy.send_flags_denied, sc.ERRNO(errno.EOPNOTSUPP))
    value_rules("fcntl", 1, dict.fromkeys(policy.fcntl_eperm, sc.ERRNO(errno.EPERM)), sc.ALLOW)
    ioctl = {**dict.fromkeys(policy.ioctl_killed), **dict.fromkeys(policy.ioctl_allowed, sc.ALLOW)}
    value_rules("ioctl", 1, ioctl, sc.ERRNO(errno.ENOTTY))

    fd = os.memfd_create("trunner-seccomp-bpf", os.MFD_CLOEXEC)
    with open(fd, "w+b", buffering=0) as f:
        flt.export_bpf(f)
        f.seek(0)
        bpf = f.read()
    count, rest = divmod(len(bpf), _SOCK_FILTER_SIZE)
    if rest or not 0 < count <= _BPF_MAXINSNS:
        raise RuntimeError(f"libseccomp exported an unusable filter ({len(bpf)} bytes)")
    return bpf


def build_bpf(policy: SeccompPolicy = DEFAULT_POLICY) -> bytes:
    """Compile ``policy`` for the native architecture into ``struct sock_filter`` bytes.

    Deterministic for a given policy and libseccomp version; cached per policy.  Raises
    ``RuntimeError`` if pyseccomp/libseccomp is unavailable and ``ValueError`` for an
    inconsistent policy or an unknown syscall name.
    """
    if not isinstance(policy, SeccompPolicy):
        raise TypeError(f"expected a SeccompPolicy, got {type(policy).__name__}")
    bpf = _BPF_CACHE.get(policy)
    if bpf is None:
        bpf = _BPF_CACHE[policy] = _compile(policy)
    return bpf


_NAME_CACHE: dict[int, str | None] = {}


def syscall_name(nr: int) -> str | None:
    """The x86_64 name of syscall number ``nr`` (e.g. from a SIGSYS report), else None.

    None also for x32 numbers (``nr & 0x40000000``) and if libseccomp is unavailable.
    """
    if nr in _NAME_CACHE:
        return _NAME_CACHE[nr]
    name: str | None = None
    if 0 <= nr < 0x40000000:
        try:
            sc = _import_pyseccomp()
            name = sc.resolve_syscall(sc.Arch.X86_64, nr).decode("ascii")
        except (RuntimeError, ValueError, UnicodeDecodeError):
            name = None
    _NAME_CACHE[nr] = name
    return name
