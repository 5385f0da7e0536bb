"""Parent side: the seccomp policy as data, and its compilation to BPF.

`build_bpf` compiles a `SeccompPolicy` into classic BPF bytes with pyseccomp
(imported lazily: it is slow to import), once per policy; the helper only
installs the bytes (`trunner.linux.kernel.install`). `syscall_name` names a killed
syscall number.

A call the policy does not allow fails with an errno, so a program can carry
on or fail with its own message: EPERM for the known-dangerous families
(`ERRNO_EPERM`), ENOSYS for every other number (what a kernel without the
call says). Only foreign architectures and x32 syscall numbers kill the
whole process with SIGSYS (`SECCOMP_RET_KILL_PROCESS`): a program built for
them is not one the jail runs.
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
    "F_NOTIFY",
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

# The new process becomes a child of the caller's parent. Allowed: the jail's
# pid 2 (the adapter) is a child of the jail's pid 1, which reaps every child;
# pid 1 itself cannot use it (the kernel refuses CLONE_PARENT from a namespace's
# init), and the helper outside runs no jailed code.
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
# unshare and setns fail EPERM and clone3 ENOSYS, so it needs no rule of its own.
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
# (TIOCSTI and TIOCLINUX fail EPERM, what a kernel with legacy_tiocsti off says.)
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
# dnotify: a watch on a directory of a read-only host bind signals the jail whenever a host
# process or another jail lists or changes it. The filter cannot tell a host bind from the
# run's own scratch, so it fails everywhere (as inotify does: not on the allow-list).
F_NOTIFY = 1026

_U32 = 0xFFFFFFFF

# --------------------------------------------------------------------------------------------
# The policy as data
# --------------------------------------------------------------------------------------------

# Allowed unconditionally.  Found by running CPython 3.11 (startup, msgspec/blake3 imports,
# threads, trio, subprocess, fork, sockets, tempfile), a battery of /bin/sh + coreutils
# commands, and make + cc, git, tar, ps, timeout, setsid, getent and `python -m venv` under
# ``strace -f``, then adding the obvious siblings named in the comments.
# socket/socketpair, clone, ioctl, fcntl, sendto, sendmsg and prlimit64 are allowed only
# with argument checks (see SeccompPolicy);
# clone3 fails with ENOSYS so that glibc falls back to clone, whose flags we can inspect.
ALLOWED_SYSCALLS: tuple[str, ...] = (
    "accept",  # AF_UNIX servers (default profile only: see provider_policy)
    "accept4",
    "access",
    "alarm",  # signal.alarm(); getitimer/setitimer likewise
    "arch_prctl",  # TLS setup by ld.so
    "bind",  # AF_UNIX names in the run's own network namespace (default profile only)
    "brk",
    "capget",  # read-only: libcap, ps
    "chdir",
    "chmod",  # the scratch is the jail's own; binds of host files are read-only (EROFS)
    "chown",  # only to ids the jail holds (no capabilities)
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
    "execveat",  # the helper and pid 1 exec trunner-waiter from a descriptor; no more than execve
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",  # cat, sort
    "fchdir",  # find
    "fchmod",
    "fchmodat",
    "fchmodat2",  # glibc >= 2.39 lchmod
    "fchown",
    "fchownat",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futimesat",
    "get_mempolicy",  # ps, libnuma: the calling process's own NUMA policy
    "getcpu",
    "getcwd",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",  # id
    "getitimer",
    "getpeername",
    "getpgid",  # any pid: only the jail's PID namespace is in view
    "getpgrp",  # sh
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",  # ls probes POSIX ACLs; shutil.copystat reads xattrs
    "kill",  # Landlock's signal scope (ABI 6) bounds who can be signalled
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",  # autobinds an AF_INET socket: default profile only (AF_UNIX there)
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "mincore",  # grep
    "mkdir",
    "mkdirat",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",  # POSIX mqueues: the IPC namespace's own (Landlock refuses the open: EACCES)
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",  # glibc realloc of large blocks
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
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
    "removexattr",
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
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getaffinity",  # nproc, os.sched_getaffinity; glibc probes of other threads
    "sched_getattr",
    "sched_getparam",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_yield",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",  # shutil.copyfile fast path
    "set_mempolicy",  # ps probes it; only the caller's own allocations
    "set_robust_list",  # glibc, every thread
    "set_tid_address",  # glibc startup
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",  # no CAP_SETGID in the jail: EPERM from the kernel
    "setitimer",
    "setpgid",  # make, sh job control, subprocess process_group
    "setregid",
    "setresgid",
    "setresuid",  # make, git (drop-privilege idioms to the current ids)
    "setreuid",
    "setsid",  # the PID namespace holds the whole tree, whatever its sessions
    "setsockopt",
    "setuid",  # the setuid family reaches only ids already held (no CAP_SETUID)
    "setxattr",  # user.* xattrs in the scratch; EROFS on the binds
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",  # SysV IPC: the jail's own IPC namespace, gone with the run
    "shutdown",
    "sigaltstack",  # faulthandler, CPython stack-overflow guard
    "stat",
    "statfs",  # coreutils probe for SELinux
    "statx",
    "symlink",
    "symlinkat",
    "sysinfo",  # sort, CPython memory probes
    "tgkill",  # raise()/abort(), signal.pthread_kill
    "timer_create",  # coreutils timeout; per-process timers
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "times",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",  # tar, cp -p, make, touch
    "utimes",
    "vfork",  # CPython's _posixsubprocess
    "wait4",
    "waitid",
    "write",
    "writev",
)
# Not listed: ENOSYS, the kernel's answer for a call it does not have (glibc and most
# programs fall back: fchmodat2 -> fchmodat, clone3 -> clone, timer_create -> alarm), e.g.
#   fork           glibc forks with clone; the legacy syscall is not needed.
#   seccomp, landlock_*  stacking more filters or rulesets would be harmless, but nothing
#                  needs them; a program probing for them carries on as on an old kernel
#                  (prctl(PR_SET_SECCOMP) stays reachable through prctl, equally harmless).
#   splice, vmsplice, tee  (Dirty Pipe, CVE-2022-0847) callers fall back to read/write.
#   pidfd_send_signal  kill() does the same and is allowed; callers fall back to it.
#   and every number libseccomp 2.5.4 does not know (listmount, statmount, mseal, ...).
# Failing with EPERM (ERRNO_EPERM), the kernel's answer to a caller without the privilege:
#   what expands the kernel's attack surface or reaches past the namespaces (see the list).
#   connect        pathname AF_UNIX sockets (docker.sock, D-Bus) are outside Landlock's
#                  reach; with connect denied and sockets AF_UNIX *stream* only (an
#                  unconnected stream socket cannot sendto a path), nothing leaves.
# Failing with the errno of a kernel without the feature, which callers already handle:
#   socket/socketpair of another family: EAFNOSUPPORT; of another type: ESOCKTNOSUPPORT.
#   ioctl outside IOCTL_ALLOWED: ENOTTY (TIOCSTI, TIOCLINUX: EPERM).
#   sendto/sendmsg with MSG_FASTOPEN: EOPNOTSUPP (fast open disabled).
#   provider socket() with a protocol other than 0/TCP: EPROTONOSUPPORT.
# And EPERM: clone with a namespace flag; fcntl(F_SETLEASE), fcntl(F_NOTIFY); prlimit64 of
# another pid (it could lower the limits of the jail's pid 1); bind/listen/accept/accept4
# in the provider profile.
# SysV shared memory is memory outside RLIMIT_AS (like the scratch tmpfs): a segment
# outlives its detach until the IPC namespace ends with the run. Only a memory cgroup
# bounds it per run (issue 10, item 8).


class SeccompPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The seccomp policy as data; `build_bpf` compiles it.

    A name may appear in at most one of allowed/extra_allowed, errno_enosys,
    errno_eperm, self_only and the conditional rules (socket/socketpair when
    `unix_only_socket`; clone, ioctl, fcntl, sendto, sendmsg always).
    Values compared with ioctl's request, fcntl's cmd and the send flags are
    their low 32 bits: the kernel reads them as unsigned int. A name in none
    of them fails ENOSYS; only foreign architectures and x32 numbers kill.
    """

    #: Syscall names allowed unconditionally.
    allowed: tuple[str, ...]
    #: `socket`/`socketpair` only for AF_UNIX stream (low 32 bits of the domain).
    unix_only_socket: bool = True
    #: Fail with ENOSYS, as every unlisted name does; listed to say so (`clone3`:
    #: glibc then falls back to `clone`, whose flags a filter can inspect, unlike
    #: clone3's struct).
    errno_enosys: tuple[str, ...] = ("clone3",)
    #: More unconditionally allowed names, for callers that widen the default.
    extra_allowed: tuple[str, ...] = ()
    #: `clone` is allowed iff `flags & clone_denied_flags == 0`, else EPERM
    #: (0: unconditional).
    clone_denied_flags: int = NAMESPACE_FLAGS
    #: `ioctl` requests allowed; any other fails ENOTTY, except `ioctl_eperm`.
    ioctl_allowed: tuple[int, ...] = IOCTL_ALLOWED
    #: `ioctl` requests that fail EPERM.
    ioctl_eperm: tuple[int, ...] = (TIOCSTI, TIOCLINUX)
    #: `fcntl` commands that fail EPERM; the rest are allowed.
    fcntl_eperm: tuple[int, ...] = (F_SETLEASE, F_NOTIFY)
    #: `sendto`/`sendmsg` with any of these flags fail EOPNOTSUPP (0: unconditional).
    send_flags_denied: int = MSG_FASTOPEN
    #: Fail with EPERM: the known-dangerous families.
    errno_eperm: tuple[str, ...] = ()
    #: `socket` for AF_INET/AF_INET6 stream only, protocol 0 or TCP (any other
    #: fails EPROTONOSUPPORT), and no longer AF_UNIX (socketpair stays AF_UNIX
    #: stream): the provider profile, where Landlock limits TCP connect to the
    #: configured ports. Either way another family fails EAFNOSUPPORT and
    #: another type of an allowed family ESOCKTNOSUPPORT.
    inet_socket: bool = False
    #: Allowed only with a pid argument (arg 0) of 0, the caller itself; EPERM
    #: for any other pid.
    self_only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in ("allowed", "errno_enosys", "extra_allowed", "errno_eperm", "self_only"):
            _names(getattr(self, field), field)
        for field in ("clone_denied_flags", "send_flags_denied"):
            _u32(getattr(self, field), field)
        for field in ("ioctl_allowed", "ioctl_eperm", "fcntl_eperm"):
            for value in getattr(self, field):
                _u32(value, field)
        if set(self.ioctl_allowed) & set(self.ioctl_eperm):
            raise ValueError("SeccompPolicy: an ioctl request is both allowed and denied")


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


#: Allowed only on the calling process (pid argument 0), else EPERM: on another
#: pid of the jail, prlimit64 could lower the limits of the jail's pid 1 (the
#: same uid; Landlock does not mediate it), ending the run's reaper.
SELF_ONLY: tuple[str, ...] = ("prlimit64",)

#: Fail with EPERM: what expands the kernel's attack surface or reaches past the
#: namespaces and the read-only binds. Each family, and why it stays out:
ERRNO_EPERM: tuple[str, ...] = (
    # namespaces (clone's namespace flags: clone_denied_flags); user namespaces are
    # the door to most kernel privilege-escalation bugs
    "setns", "unshare",
    # mounts: the minimal root must stay as the helper built it
    "chroot", "fsconfig", "fsmount", "fsopen", "fspick", "mount", "mount_setattr",
    "move_mount", "open_tree", "pivot_root", "umount2",
    # file handles: "shocker" (CVE-2014-3519) walks out of a mount with them
    "name_to_handle_at", "open_by_handle_at",
    # tracing and other processes' memory (Landlock scopes ptrace; this is the rest)
    "kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev",
    "ptrace",
    # kernel attack surface with a history of CVEs
    "bpf", "io_uring_enter", "io_uring_register", "io_uring_setup", "perf_event_open",
    "userfaultfd",
    # keyrings: shared by uid across namespaces (CVE-2016-0728)
    "add_key", "keyctl", "request_key",
    # the kernel itself: modules, kexec, reboot, swap, accounting, quotas, log, time
    "acct", "adjtimex", "clock_adjtime", "clock_settime", "delete_module", "finit_module",
    "init_module", "ioperm", "iopl", "kexec_file_load", "kexec_load", "lookup_dcookie",
    "nfsservctl", "quotactl", "quotactl_fd", "reboot", "settimeofday", "swapoff",
    "swapon", "syslog", "vhangup",
    # identity of the jail (the UTS namespace's own, but fixed to "trunner")
    "setdomainname", "sethostname",
    # READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE and the like: even the query value
    "personality",
    # capabilities: none to set (capget is allowed)
    "capset",
    # NUMA placement of other processes' pages, and of ranges (nothing needs it)
    "mbind", "migrate_pages", "move_pages",
    # fileless executables (memfd_create: the payload of runc CVE-2019-5736 exploits);
    # memory hidden from the kernel; device nodes (mkfifo too: nothing needs it)
    "memfd_create", "memfd_secret", "mknod", "mknodat",
    # reaching host sockets by path: see the comment above the policy class
    "connect",
)

#: Denied (EPERM) in the provider profile: listen() autobinds an unbound TCP socket
#: to 0.0.0.0:<ephemeral> without a bind() for Landlock to check, and the host can
#: then connect in. bind() of a socketpair's AF_UNIX end takes an abstract name in
#: the host's network namespace (a host service binding it then fails EADDRINUSE);
#: Landlock's abstract scope covers connect and send, not bind, and TCP bind is
#: Landlock's already (no port is granted). seccomp cannot see the socket's family
#: at bind() or listen(), so both fail for every family.
SERVER_SYSCALLS: tuple[str, ...] = ("accept", "accept4", "bind", "listen")


def provider_policy(base: SeccompPolicy | None = None) -> SeccompPolicy:
    """The provider profile's policy: TCP sockets and `connect` allowed (Landlock
    limits the ports), AF_UNIX sockets no longer creatable, so `connect` cannot
    reach a pathname unix socket on the host; no server calls, `bind` included
    (`SERVER_SYSCALLS`)."""
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
    errno_enosys=("clone3", "fork", "landlock_add_rule", "landlock_create_ruleset",
                  "landlock_restrict_self", "seccomp"),
    extra_allowed=(),
    clone_denied_flags=NAMESPACE_FLAGS,
    ioctl_allowed=IOCTL_ALLOWED,
    ioctl_eperm=(TIOCSTI, TIOCLINUX),
    fcntl_eperm=(F_SETLEASE, F_NOTIFY),
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


def _complement(denied: Iterable[int], mask: int = _U32) -> list[tuple[int, int]]:
    """(mask, value) pairs whose union is exactly the values NOT in ``denied``,
    comparing only the bits of ``mask`` (contiguous, from bit 0 up).

    libseccomp has no masked "not equal", so "unless x & mask in denied" is written
    as several rules ``(x & m) == v``: the disjoint prefixes of a binary trie of
    ``denied`` that branch away from every denied value (at most one per bit per
    denied value). Rules of one syscall must not overlap either: libseccomp 2.5
    keeps the less specific of two overlapping rules and drops the other (so an
    unconditional ERRNO next to a conditional ALLOW loses the ALLOW). Every
    "these values, errno for the rest" here is built from such disjoint rules.
    """
    width = mask.bit_length()
    if mask != (1 << width) - 1 or not 0 < width <= 32:
        raise ValueError(f"mask {mask:#x} is not contiguous from bit 0")
    cubes: list[tuple[int, int]] = []

    def walk(values: list[int], bit: int, prefix: int) -> None:
        if bit < 0:
            return
        cube = mask & ~((1 << bit) - 1)  # this bit and all higher ones of the mask
        for b in (0, 1):
            sub = [v for v in values if (v >> bit) & 1 == b]
            branch = prefix | (b << bit)
            if sub:
                walk(sub, bit - 1, branch)
            else:
                cubes.append((cube, branch))

    walk(sorted({v & mask for v in denied}), width - 1, 0)
    return cubes


def _low32_complement(denied: Iterable[int]) -> list[tuple[int, int]]:
    """`_complement` over the low 32 bits (the kernel reads int arguments so)."""
    return _complement(denied, _U32)


#: Every call the policy names nowhere: what a kernel without it says.
DEFAULT_ERRNO = errno.ENOSYS
#: socket()/socketpair() of a type other than stream within an allowed family.
_SOCK_TYPE_MASK = 0xF  # the type, past SOCK_NONBLOCK/SOCK_CLOEXEC


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

    default = sc.ERRNO(DEFAULT_ERRNO)
    flt = sc.SyscallFilter(default)
    # Foreign-arch syscalls (int 0x80 from a 64-bit process) and x32 numbers (libseccomp
    # sends them to the bad-arch action on x86_64) kill the whole process.
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    # We only export; the helper sets no_new_privs itself and is single-threaded (no TSYNC).
    flt.set_attr(sc.Attr.CTL_NNP, 0)
    flt.set_attr(sc.Attr.CTL_TSYNC, 0)
    eperm = sc.ERRNO(errno.EPERM)

    def rule(action: int, name: str, *args: object) -> None:
        # libseccomp refuses a rule whose action is the default one; the default
        # applies to it anyway.
        if action != default:
            flt.add_rule(action, nr(name), *args)

    def arg_eq(arg: int, mask: int, value: int) -> object:
        return sc.Arg(arg, sc.MASKED_EQ, mask, value)

    for name in sorted(groups["allowed/extra_allowed"]):
        rule(sc.ALLOW, name)
    for name in sorted(policy.errno_enosys):
        nr(name)  # an unknown name is still an error
        rule(sc.ERRNO(errno.ENOSYS), name)
    for name in sorted(policy.errno_eperm):
        rule(eperm, name)

    def socket_rules(name: str, families: tuple[int, ...], protocols: tuple[int, ...]) -> None:
        # Disjoint rules: a family not listed -> EAFNOSUPPORT; a listed family of a type
        # other than stream -> ESOCKTNOSUPPORT (a datagram socket could sendto() a host
        # socket by path without connect()); stream with a protocol not listed (if any
        # are) -> EPROTONOSUPPORT. The kernel reads the domain and protocol as ints:
        # compare only the low 32 bits.
        for family in families:
            fam = arg_eq(0, _U32, family)
            stream = arg_eq(1, _SOCK_TYPE_MASK, SOCK_STREAM)
            if not protocols:
                rule(sc.ALLOW, name, fam, stream)
            for proto in protocols:
                rule(sc.ALLOW, name, fam, stream, arg_eq(2, _U32, proto))
            if protocols:
                for mask, value in _low32_complement(protocols):
                    rule(sc.ERRNO(errno.EPROTONOSUPPORT), name, fam, stream,
                         arg_eq(2, mask, value))
            for mask, value in _complement((SOCK_STREAM,), _SOCK_TYPE_MASK):
                rule(sc.ERRNO(errno.ESOCKTNOSUPPORT), name, fam, arg_eq(1, mask, value))
        for mask, value in _low32_complement(families):
            rule(sc.ERRNO(errno.EAFNOSUPPORT), name, arg_eq(0, mask, value))

    if policy.unix_only_socket:
        socket_rules("socketpair", (AF_UNIX,), ())
        if policy.inet_socket:
            socket_rules("socket", (AF_INET, AF_INET6), INET_PROTOCOLS)
        else:
            socket_rules("socket", (AF_UNIX,), ())
    for name in sorted(policy.self_only):
        rule(sc.ALLOW, name, arg_eq(0, _U32, 0))
        for mask, value in _low32_complement((0,)):
            rule(eperm, name, arg_eq(0, mask, value))

    def flag_rules(name: str, arg: int, denied: int, action: int) -> None:
        # Allowed iff no denied flag is set; else `action`.
        if not denied:
            rule(sc.ALLOW, name)
            return
        rule(sc.ALLOW, name, arg_eq(arg, denied, 0))
        for bit in (1 << b for b in range(32) if denied >> b & 1):
            rule(action, name, arg_eq(arg, bit, bit))

    def value_rules(name: str, arg: int, exact: dict[int, int], rest: int) -> None:
        # low32(arg) == v -> exact[v]; any other value -> rest.
        for v in sorted(exact):
            rule(exact[v], name, arg_eq(arg, _U32, v))
        for mask, value in _low32_complement(exact):
            rule(rest, name, arg_eq(arg, mask, value))

    flag_rules("clone", 0, policy.clone_denied_flags, eperm)
    # sendmsg(fd, msg, flags), sendto(fd, buf, len, flags, addr, addrlen)
    flag_rules("sendmsg", 2, policy.send_flags_denied, sc.ERRNO(errno.EOPNOTSUPP))
    flag_rules("sendto", 3, policy.send_flags_denied, sc.ERRNO(errno.EOPNOTSUPP))
    value_rules("fcntl", 1, dict.fromkeys(policy.fcntl_eperm, eperm), sc.ALLOW)
    ioctl = {**dict.fromkeys(policy.ioctl_eperm, eperm),
             **dict.fromkeys(policy.ioctl_allowed, sc.ALLOW)}
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


def libseccomp_version() -> str:
    """The version of the libseccomp that compiles the filters, `MAJOR.MINOR.MICRO`
    (part of the rules version: another libseccomp may compile other bytes)."""
    import ctypes

    class _Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

    lib = _import_pyseccomp()._libseccomp
    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    v = lib.seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"
