"""The seccomp policy as data: what a jailed process may call, and why.

`SeccompPolicy` names the allowed, errno and conditional calls; `DEFAULT_POLICY`
and `provider_policy()` are the two profiles. Nothing here compiles: see
`trunner.linux.seccomp.compile`.

A call the policy does not allow fails with an errno, so a program can carry
on or fail with its own message: EPERM for the known-dangerous families
(`ERRNO_EPERM`), ENOSYS for every other number (what a kernel without the
call says). Only foreign architectures and x32 syscall numbers kill the
whole process with SIGSYS (`SECCOMP_RET_KILL_PROCESS`): a program built for
them is not one the jail runs.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING

import msgspec

from trunner.kernel import abi
from trunner.kernel.abi import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "AF_INET",
    "AF_INET6",
    "AF_NETLINK",
    "AF_PACKET",
    "AF_UNIX",
    "ALLOWED_SYSCALLS",
    "CLONE_NEWCGROUP",
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWTIME",
    "CLONE_NEWUSER",
    "CLONE_NEWUTS",
    "CLONE_PARENT",
    "DEFAULT_POLICY",
    "DENIED_AS_DOCKER_ALLOWS",
    "ERRNO_EPERM",
    "F_NOTIFY",
    "F_SETLEASE",
    "INET_PROTOCOLS",
    "IOCTL_ALLOWED",
    "IOCTL_INTERFACE_QUERIES",
    "IPPROTO_TCP",
    "IPPROTO_UDP",
    "IPPROTO_UDPLITE",
    "LOOPBACK_INET_TYPES",
    "MKNOD_TYPES",
    "MSG_FASTOPEN",
    "NAMESPACE_FLAGS",
    "NETLINK_PROTOCOLS",
    "SELF_ONLY",
    "SERVER_SYSCALLS",
    "SOCK_DGRAM",
    "SOCK_SEQPACKET",
    "SOCK_STREAM",
    "S_IFMT",
    "TIOCLINUX",
    "TIOCSTI",
    "UNBOUNDED_WITHOUT_MEMORY_CGROUP",
    "UNIX_SOCKET_TYPES",
    "WAITER_ARCH_PRCTLS",
    "WAITER_IOCTLS",
    "WAITER_SYSCALLS",
    "SeccompPolicy",
    "provider_policy",
    "without_memory_cgroup",
]

# --------------------------------------------------------------------------------------------
# Constants (Linux UAPI; identical on every architecture we care about)
# --------------------------------------------------------------------------------------------

AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
SOCK_STREAM = 1
SOCK_DGRAM = 2
SOCK_SEQPACKET = 5
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_UDPLITE = 136
# The only protocols of an AF_INET/AF_INET6 stream socket Landlock's TCP rules see:
# IPPROTO_MPTCP (262), IPPROTO_SMC (256, Linux 6.11) and SCTP (132) connect and bind
# unchecked. 0 picks TCP for SOCK_STREAM.
INET_PROTOCOLS = (0, IPPROTO_TCP)
# The default profile's own loopback (its private network namespace): AF_INET and
# AF_INET6 stream sockets of protocol 0 or TCP, datagram sockets of 0 or UDP. Not
# SOCK_RAW (it needs CAP_NET_RAW: EPERM anyway), not ping sockets (SOCK_DGRAM of
# IPPROTO_ICMP/ICMPV6: the run's namespace has net.ipv4.ping_group_range "1 0", so the
# kernel refuses them, EACCES, and the jail cannot change it; ping's code is a CVE class,
# CVE-2017-2671), not SCTP, MPTCP or SMC: nothing ordinary needs them. UDP-Lite is UDP's
# code with a partial checksum; Docker and bubblewrap allow it, and CPython's test_socket
# has 187 cases of it.
LOOPBACK_INET_TYPES = ((SOCK_STREAM, INET_PROTOCOLS),
                       (SOCK_DGRAM, (0, IPPROTO_UDP, IPPROTO_UDPLITE)))
# AF_UNIX of every type (any protocol: the kernel takes only 0 or PF_UNIX), pathname and
# abstract names alike: abstract names are per network namespace, so the run's own (and
# Landlock's abstract scope, ABI 6, keeps connect and send within the run's domain);
# pathname sockets are reachable only if the jail's tree holds one, and the tree is built
# without any (`trunner.linux.sockets`: every bind walked, each socket found masked).
UNIX_SOCKET_TYPES = (SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET)
# TCP fast open: sendto/sendmsg with this flag connects without connect(), past
# Landlock's connect hook.
MSG_FASTOPEN = 0x20000000

# The page-cache channel: whether a page of a host file is cached tells a run
# when another run or a host process read it. RWF_NOWAIT in preadv2/pwritev2
# answers it without timing (EAGAIN when uncached); MADV_COLD/MADV_PAGEOUT on a
# read-only mapping and POSIX_FADV_DONTNEED evict a host file's pages, so that a
# timed read then probes it. The filter cannot tell a host bind from the scratch:
# everywhere, RWF_NOWAIT fails EOPNOTSUPP (as on a file that lacks it), the two
# madvise advices EINVAL (as a kernel without them), and DONTNEED does nothing
# (advice: a cache that keeps pages is correct).
RWF_NOWAIT = 0x8
MADV_COLD = 20
MADV_PAGEOUT = 21
POSIX_FADV_DONTNEED = 4

# The new process becomes a child of the caller's parent. Allowed: the jail's
# pid 2 (the adapter) is a child of the jail's pid 1, which reaps every child;
# pid 1 itself cannot use it (the kernel refuses CLONE_PARENT from a namespace's
# init), and the helper outside runs no jailed code.
CLONE_PARENT = 0x00008000
# CLONE_NEWTIME (0x80) is only meaningful to unshare() and clone3(); for clone() the low byte
# of the flags is the exit signal (CSIGNAL), so it must NOT be part of the clone() mask.
# unshare and setns fail EPERM and clone3 ENOSYS, so it needs no rule of its own.
CLONE_NEWTIME = 0x00000080
# Every namespace kind a profile names (abi.NAMESPACE_FLAGS: each CLONE_NEW* flag but
# CLONE_NEWTIME); clone() with any of them fails EPERM.
NAMESPACE_FLAGS: int = functools.reduce(operator.or_, abi.NAMESPACE_FLAGS.values())

TIOCSTI = 0x5412  # push bytes into a terminal's input queue: classic sandbox escape
TIOCLINUX = 0x541C  # virtual-console ioctls, incl. selection paste (same class of escape)

# The ioctl requests ordinary programs make (CPython, sh, coreutils, git, tar, gcc under
# strace: only the first three, on pipes); FIO* act on the caller's own descriptor.
# The only ttys in the jail are the ptys of its own devpts instance (and /dev/tty, their
# controlling one), so the terminal requests reach the run's own ptys alone: pty.openpty(),
# script, stty, a shell's job control (strace of script, CPython's pty and tty modules).
# Not here, so ENOTTY: TIOCSETD (line disciplines: n_gsm and n_hdlc are CVE classes),
# modem and serial lines, TIOCCONS, TIOCVHANGUP and the locked termios (CAP_SYS_ADMIN).
# (TIOCSTI and TIOCLINUX fail EPERM, what a kernel with legacy_tiocsti off says.)
IOCTL_ALLOWED = (
    0x5401,  # TCGETS: isatty(), tcgetattr()
    0x5402,  # TCSETS: tcsetattr(TCSANOW), tty.setraw()
    0x5403,  # TCSETSW: tcsetattr(TCSADRAIN)
    0x5404,  # TCSETSF: tcsetattr(TCSAFLUSH)
    0x5405,  # TCGETA (termio)
    0x5406,  # TCSETA
    0x5407,  # TCSETAW
    0x5408,  # TCSETAF
    0x5409,  # TCSBRK: tcdrain(), tcsendbreak()
    0x540A,  # TCXONC: tcflow()
    0x540B,  # TCFLSH: tcflush()
    0x540C,  # TIOCEXCL
    0x540D,  # TIOCNXCL
    0x540E,  # TIOCSCTTY: a session leader takes its pty as controlling terminal
    0x540F,  # TIOCGPGRP: sh, tcgetpgrp()
    0x5410,  # TIOCSPGRP: tcsetpgrp(), job control
    0x5411,  # TIOCOUTQ
    0x5413,  # TIOCGWINSZ: ls, os.get_terminal_size()
    0x5414,  # TIOCSWINSZ: script, a terminal emulator
    0x541B,  # FIONREAD
    0x5420,  # TIOCPKT: packet mode on a pty master
    0x5421,  # FIONBIO: socket.setblocking(), Node
    0x5422,  # TIOCNOTTY: give the controlling terminal up
    0x5424,  # TIOCGETD: read the line discipline (setting it stays denied)
    0x5425,  # TCSBRKP
    0x5429,  # TIOCGSID: tcgetsid()
    0x5441,  # TIOCGPTPEER: open a pty master's peer (glibc openpty)
    0x5450,  # FIONCLEX
    0x5451,  # FIOCLEX
    0x80045430,  # TIOCGPTN: ptsname()
    0x40045431,  # TIOCSPTLCK: unlockpt()
    0x80045432,  # TIOCGDEV
    0x40045436,  # TIOCSIG: a pty master signals its foreground group
    0x80045438,  # TIOCGPKT
    0x80045439,  # TIOCGPTLCK
    0x80045440,  # TIOCGEXCL
    0x802C542A,  # TCGETS2: tcgetattr() in glibc >= 2.42
    0x402C542B,  # TCSETS2
    0x402C542C,  # TCSETSW2
    0x402C542D,  # TCSETSF2
)

# Interface queries (default profile: the run's own network namespace, its loopback only):
# if_nametoindex(), if_indextoname(), if_nameindex() and a scope id's name go through them
# in glibc. Setting anything needs CAP_NET_ADMIN over the namespace, which no jailed
# process has. The provider profile, in the host's namespace, has none of them.
IOCTL_INTERFACE_QUERIES = (
    0x8910,  # SIOCGIFNAME: if_indextoname()
    0x8912,  # SIOCGIFCONF
    0x8913,  # SIOCGIFFLAGS
    0x8915,  # SIOCGIFADDR
    0x891B,  # SIOCGIFNETMASK
    0x8921,  # SIOCGIFMTU
    0x8927,  # SIOCGIFHWADDR
    0x8933,  # SIOCGIFINDEX: if_nametoindex()
)

# mknod()/mknodat() may make what any unprivileged caller may (the file type, mode &
# S_IFMT): a FIFO (mkfifo), a unix socket's node, a regular file. Device nodes fail EPERM,
# as the kernel answers without CAP_MKNOD (and Landlock grants MAKE_CHAR/MAKE_BLOCK nowhere).
S_IFMT = 0o170000
MKNOD_TYPES = (0, 0o010000, 0o100000, 0o140000)  # (0 = regular), S_IFIFO, S_IFREG, S_IFSOCK

# Netlink in the run's own network namespace (default profile): the route family (an
# interface list, getifaddrs(), glibc's AI_ADDRCONFIG, `ip`) and socket diagnostics
# (`ss`). Changing anything needs CAP_NET_ADMIN over the namespace, which no jailed
# process has. Every other protocol (generic netlink's many families, netfilter, xfrm,
# audit, uevents) fails EPROTONOSUPPORT: kernel surface nothing ordinary needs.
AF_NETLINK = 16
NETLINK_ROUTE = 0
NETLINK_SOCK_DIAG = 4
NETLINK_PROTOCOLS = (NETLINK_ROUTE, NETLINK_SOCK_DIAG)
# AF_PACKET (17) stays EAFNOSUPPORT: creating one needs CAP_NET_RAW over the network
# namespace, which no jailed process has (the kernel says EPERM), and its code is a CVE
# class (CVE-2017-7308, CVE-2020-14386); the run's namespace holds only a loopback anyway.
AF_PACKET = 17

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
# socket/socketpair, clone, ioctl, fcntl, sendto, sendmsg, sendmmsg, mknod, mknodat and
# prlimit64 are allowed only with argument checks (see SeccompPolicy);
# clone3 fails with ENOSYS so that glibc falls back to clone, whose flags we can inspect.
ALLOWED_SYSCALLS: tuple[str, ...] = (
    "accept",  # loopback and AF_UNIX servers (default profile only: see provider_policy)
    "accept4",
    "access",
    "adjtimex",  # query only: any change needs CAP_SYS_TIME in the host's user namespace
    "alarm",  # signal.alarm(); getitimer/setitimer likewise
    "arch_prctl",  # TLS setup by ld.so
    "bind",  # loopback ports and unix names of the run's own network namespace (default only)
    "brk",
    "capget",  # read-only: libcap, ps
    "capset",  # within the permitted set only, which is empty: drops nothing it had
    "chdir",
    "chmod",  # the scratch is the jail's own; binds of host files are read-only (EROFS)
    "chown",  # only to ids the jail holds (no capabilities)
    "clock_adjtime",  # like adjtimex: the kernel refuses a change (EPERM)
    "clock_getres",
    "clock_gettime",  # vDSO fallback; CPU-time clocks are real syscalls
    "clock_nanosleep",
    "close",
    "close_range",  # subprocess close_fds fast path
    "connect",  # the run's own loopback and unix names; the tree holds no host socket
    "copy_file_range",  # cp
    "creat",  # tar
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",  # the helper and pid 1 exec trunner-waiter from a descriptor; no more than execve
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fallocate",  # posix_fallocate; bounded by the scratch size and RLIMIT_FSIZE
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
    "fork",  # as clone() without flags
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_requeue",
    "futex_wait",
    "futex_waitv",  # Wine, Proton
    "futex_wake",
    "futimesat",
    "get_mempolicy",  # ps, libnuma: the calling process's own NUMA policy
    "get_robust_list",  # ptrace-checked: the jail's own tasks only
    "get_thread_area",
    "getcpu",
    "getcwd",
    "getdents",
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
    "getrlimit",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",  # ls probes POSIX ACLs; shutil.copystat reads xattrs
    "ioprio_get",
    "ioprio_set",  # the jail's own tasks (PID namespace); the realtime class needs CAP_SYS_ADMIN
    "kill",  # Landlock's signal scope (ABI 6) bounds who can be signalled
    "landlock_add_rule",
    # a program may confine itself further: domains only stack (ENOSYS without a
    # memory cgroup: UNBOUNDED_WITHOUT_MEMORY_CGROUP)
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",  # autobinds an AF_INET socket: the run's loopback (default profile only)
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "map_shadow_stack",
    "membarrier",
    # exec from the working dir is allowed anyway: a memfd adds no payload (ENOSYS
    # without a memory cgroup: UNBOUNDED_WITHOUT_MEMORY_CGROUP)
    "memfd_create",
    "memfd_secret",  # locked pages: RLIMIT_MEMLOCK and the memory cgroup bound them
    "mincore",  # grep
    "mkdir",
    "mkdirat",
    "mlock",  # RLIMIT_MEMLOCK (the caller's, inherited) and the memory cgroup bound mlock*
    "mlock2",
    "mlockall",
    "mmap",
    "modify_ldt",
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
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",  # a handle is only a name: open_by_handle_at stays EPERM
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",  # signal.pause(); without it CPython's itimer tests return at once
    "pidfd_open",  # os.pidfd_open, trio's process waiting
    "pidfd_send_signal",  # as kill(): Landlock's signal scope and the PID namespace
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",  # PR_SET_NAME from trio's thread cache; nothing reachable needs privileges
    "pread64",
    "preadv",
    "process_mrelease",
    "process_vm_readv",  # the ptrace access check, as ptrace
    "process_vm_writev",
    "pselect6",
    "ptrace",  # debuggers, strace: same uid, PID namespace, Landlock scope, non-dumpable adapter
    "pwrite64",
    "pwritev",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",  # registered by glibc >= 2.35 at startup and for every thread
    "rt_sigaction",
    "rt_sigpending",  # signal.sigpending()
    "rt_sigprocmask",
    "rt_sigqueueinfo",  # as kill()
    "rt_sigreturn",
    "rt_sigsuspend",  # sh's wait
    "rt_sigtimedwait",  # sigwait, sigtimedwait, sigwaitinfo
    "rt_tgsigqueueinfo",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getaffinity",  # nproc, os.sched_getaffinity; glibc probes of other threads
    "sched_getattr",
    "sched_getparam",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",  # taskset; the PID namespace: the jail's own tasks only
    "sched_setattr",  # a realtime policy or a raised priority needs CAP_SYS_NICE
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",  # filters only stack: the strictest answer of all wins
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",  # shutil.copyfile fast path
    "set_mempolicy",  # ps probes it; only the caller's own allocations
    "set_robust_list",  # glibc, every thread
    "set_thread_area",
    "set_tid_address",  # glibc startup
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",  # no CAP_SETGID in the jail: EPERM from the kernel
    "setitimer",
    "setpgid",  # make, sh job control, subprocess process_group
    "setpriority",  # nice; PRIO_USER too reaches only tasks the PID namespace shows
    "setregid",
    "setresgid",
    "setresuid",  # make, git (drop-privilege idioms to the current ids)
    "setreuid",
    "setrlimit",  # the caller's own limits; raising past the hard limit needs a capability
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
    "signalfd",
    "signalfd4",
    "splice",  # Dirty Pipe (CVE-2022-0847) is a kernel bug, fixed in 5.10.102/5.15.25/5.16.11
    "stat",
    "statfs",  # coreutils probe for SELinux
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",  # sort, CPython memory probes
    "tee",
    "tgkill",  # raise()/abort(), signal.pthread_kill
    "time",
    "timer_create",  # coreutils timeout; per-process timers
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",  # as tgkill
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",  # tar, cp -p, make, touch
    "utimes",
    "vfork",  # CPython's _posixsubprocess
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
)
# Anchored on Docker's default profile (moby/profiles seccomp/default.json): every call it
# allows without a capability is allowed here, conditionally or not, except the ones
# DENIED_AS_DOCKER_ALLOWS names with their reason (docs/jail.md's syscall table).
# Not listed: ENOSYS, the kernel's answer for a call it does not have (glibc and most
# programs fall back: fchmodat2 -> fchmodat, clone3 -> clone, timer_create -> alarm), e.g.
#   every number libseccomp 2.5.4 does not know (listmount, statmount, mseal, ...).
# Failing with EPERM (ERRNO_EPERM), the kernel's answer to a caller without the privilege:
#   what expands the kernel's attack surface or reaches past the namespaces (see the list).
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
    `unix_only_socket`; clone, ioctl, fcntl, sendto, sendmsg, sendmmsg, mknod,
    mknodat, preadv2, pwritev2, madvise and fadvise64 always).
    Values compared with ioctl's request, fcntl's cmd and the send flags are
    their low 32 bits: the kernel reads them as unsigned int. A name in none
    of them fails ENOSYS; only foreign architectures and x32 numbers kill.
    """

    #: Syscall names allowed unconditionally.
    allowed: tuple[str, ...]
    #: `socket`/`socketpair` checked by family and type (low 32 bits of the
    #: domain; the type past SOCK_NONBLOCK/SOCK_CLOEXEC): AF_UNIX stream only,
    #: unless `loopback_sockets` or `inet_socket` widens it.
    unix_only_socket: bool = True
    #: With `unix_only_socket`: AF_UNIX of every type (`UNIX_SOCKET_TYPES`) for
    #: `socket` and `socketpair`, and AF_INET/AF_INET6 stream (0 or TCP) and
    #: datagram (0 or UDP) sockets (`LOOPBACK_INET_TYPES`): the default
    #: profile, whose network namespace holds only the run's own loopback.
    loopback_sockets: bool = False
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
    #: configured ports (it wins over `loopback_sockets`). Either way another
    #: family fails EAFNOSUPPORT and another type of an allowed family
    #: ESOCKTNOSUPPORT.
    inet_socket: bool = False
    #: Allowed only with a pid argument (arg 0) of 0, the caller itself; EPERM
    #: for any other pid.
    self_only: tuple[str, ...] = ()
    #: `preadv2`/`pwritev2` with any of these flags fail EOPNOTSUPP (0: unconditional).
    rwf_denied: int = RWF_NOWAIT
    #: `madvise` advices that fail EINVAL; the rest are allowed.
    madvise_einval: tuple[int, ...] = (MADV_COLD, MADV_PAGEOUT)
    #: `fadvise64` advices that succeed doing nothing; the rest are allowed.
    fadvise_noop: tuple[int, ...] = (POSIX_FADV_DONTNEED,)
    #: `mknod`/`mknodat` only of these file types (mode & S_IFMT), else EPERM.
    mknod_types: tuple[int, ...] = MKNOD_TYPES
    #: `socket(AF_NETLINK, any type, protocol)` for these protocols, any other
    #: EPROTONOSUPPORT; none: AF_NETLINK fails EAFNOSUPPORT as any unlisted family.
    netlink_protocols: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for field in ("allowed", "errno_enosys", "extra_allowed", "errno_eperm", "self_only"):
            _names(getattr(self, field), field)
        for field in ("clone_denied_flags", "send_flags_denied", "rwf_denied"):
            _u32(getattr(self, field), field)
        for field in ("ioctl_allowed", "ioctl_eperm", "fcntl_eperm", "madvise_einval",
                      "fadvise_noop"):
            for value in getattr(self, field):
                _u32(value, field)
        if set(self.ioctl_allowed) & set(self.ioctl_eperm):
            raise ValueError("SeccompPolicy: an ioctl request is both allowed and denied")
        for value in self.netlink_protocols:
            _u32(value, "netlink_protocols")
        for value in self.mknod_types:
            if value & ~S_IFMT:
                raise ValueError(f"SeccompPolicy.mknod_types: {value:#o} is not a file type")


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
    # (name_to_handle_at, which only names a file, is allowed)
    "open_by_handle_at",
    # other processes' descriptors and memory advice (Docker: CAP_SYS_PTRACE); ptrace and
    # process_vm_* are allowed: the ptrace access check, Landlock's scope and the PID
    # namespace bound them to the jail's own dumpable tasks
    "kcmp", "pidfd_getfd", "process_madvise",
    # kernel attack surface with a history of CVEs
    "bpf", "io_uring_enter", "io_uring_register", "io_uring_setup", "perf_event_open",
    "userfaultfd",
    # keyrings: shared by uid across namespaces (CVE-2016-0728)
    "add_key", "keyctl", "request_key",
    # the kernel itself: modules, kexec, reboot, swap, accounting, quotas, log, time
    # (adjtimex and clock_adjtime are allowed: the kernel refuses a change without
    # CAP_SYS_TIME in the host's user namespace, and a query is harmless)
    "acct", "clock_settime", "delete_module", "finit_module",
    "init_module", "ioperm", "iopl", "kexec_file_load", "kexec_load", "lookup_dcookie",
    "nfsservctl", "quotactl", "quotactl_fd", "reboot", "settimeofday", "swapoff",
    "swapon", "syslog", "vhangup",
    # identity of the jail (the UTS namespace's own, but fixed to "trunner")
    "setdomainname", "sethostname",
    # READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE and the like: even the query value
    "personality",
    # NUMA placement of other processes' pages, and of ranges (nothing needs it)
    "mbind", "migrate_pages", "move_pages",
)

#: What Docker's default profile allows without a capability and this one does not,
#: each with its reason (docs/jail.md, the syscall table). All fail ENOSYS, the answer of
#: a kernel without them, which their callers handle. tests/test_seccomp.py checks this
#: list against a snapshot of Docker's; tests/security shows each denial holds.
DENIED_AS_DOCKER_ALLOWS: tuple[tuple[str, str], ...] = (
    # inotify and fanotify (fanotify_init needs CAP_SYS_ADMIN there; fanotify_mark is
    # the rest): a watch on a directory of a read-only host bind reports host activity
    # (another jail or a host process listing or changing it), and neither seccomp nor
    # Landlock can tell the run's own scratch from a bind
    *((name, "watches report host activity on the binds")
      for name in ("fanotify_mark", "inotify_add_watch", "inotify_init", "inotify_init1",
                   "inotify_rm_watch")),
    # Linux AIO: every context draws on one host-wide count (fs.aio-max-nr, 65536 by
    # default); one io_setup can take nearly all of it and leave the host and every
    # other run with EAGAIN until it ends. libaio's callers fall back to threads.
    *((name, "contexts come from the host-wide fs.aio-max-nr")
      for name in ("io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_setup",
                   "io_submit")),
    # page-cache residency of any file it can open, the read-only host binds included:
    # a side channel on host activity (mincore() lost it in 5.0 for files the caller
    # cannot write; cachestat() only in 6.18)
    ("cachestat", "page-cache residency of host files before Linux 6.18"),
)


#: Denied (EPERM) in the provider profile: listen() autobinds an unbound TCP socket
#: to 0.0.0.0:<ephemeral> without a bind() for Landlock to check, and the host can
#: then connect in. bind() of a socketpair's AF_UNIX end takes an abstract name in
#: the host's network namespace (a host service binding it then fails EADDRINUSE);
#: Landlock's abstract scope covers connect and send, not bind, and TCP bind is
#: Landlock's already (no port is granted). seccomp cannot see the socket's family
#: at bind() or listen(), so both fail for every family.
SERVER_SYSCALLS: tuple[str, ...] = ("accept", "accept4", "bind", "listen")


#: All that trunner's own waiters may call once confined, in every profile:
#: the waiting helper and the jail's pid 1 (`_kernel.confine_waiter`),
#: from their install to their end. Between the two: Python's last steps
#: (descriptor flags, pid 1's signal mask, the exec of trunner-waiter from its descriptor, or a
#: refusal written and `_exit`, which may allocate), then waiter.c's calls:
#: static musl's start-up (set_tid_address; arch_prctl on x86_64,
#: `WAITER_ARCH_PRCTLS`), and its signal(SIGABRT), which blocks every signal
#: around the change (rt_sigprocmask). Anything else fails ENOSYS. An
#: allow-list of its own, not the jail's: a hundredth of the instructions to
#: install, twice a run, and nothing a jailed process would gain from
#: reaching a waiter.
WAITER_SYSCALLS: tuple[str, ...] = (
    "read", "write", "close", "openat", "pipe2", "fcntl", "execveat",
    "wait4", "waitid", "kill", "getpid", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn",
    "brk", "mmap", "munmap", "set_tid_address", "exit_group",
)
#: ioctl() of a waiter: only a descriptor's close-on-exec flag (CPython's
#: `set_inheritable`).
WAITER_IOCTLS: tuple[int, ...] = (0x5450, 0x5451)  # FIONCLEX, FIOCLEX
#: arch_prctl() of a waiter (x86_64 only; no such call on aarch64): only
#: musl's thread pointer, set at start-up.
WAITER_ARCH_PRCTLS: tuple[int, ...] = (0x1002,)  # ARCH_SET_FS


def provider_policy(base: SeccompPolicy | None = None) -> SeccompPolicy:
    """The provider profile's policy: TCP sockets and `connect` allowed (Landlock
    limits the ports), AF_UNIX sockets no longer creatable (socketpair AF_UNIX
    stream only), so `connect` cannot reach a pathname unix socket on the host;
    no UDP; no server calls, `bind` included (`SERVER_SYSCALLS`)."""
    base = DEFAULT_POLICY if base is None else base
    return msgspec.structs.replace(
        base,
        inet_socket=True,
        loopback_sockets=False,  # the host's network namespace: none of the loopback's
        netlink_protocols=(),  # the host's network namespace: no netlink at all
        ioctl_allowed=tuple(r for r in base.ioctl_allowed if r not in IOCTL_INTERFACE_QUERIES),
        allowed=tuple(sorted({*base.allowed, "connect"} - set(SERVER_SYSCALLS))),
        errno_eperm=tuple(sorted({*base.errno_eperm, *SERVER_SYSCALLS} - {"connect"})),
    )


#: Calls whose kernel memory only a memory cgroup bounds: one process holds it
#: past its RLIMIT_AS, unswappable or counted nowhere else. A memfd's pages are
#: shmem, not address space (memfd_create, then write(): 2048 MiB held past an
#: RLIMIT_AS of 1 GiB); Landlock rulesets hold their rules in unswappable slab
#: (252 of them: 1130 MiB). A run without a memory cgroup (a caller that is not
#: root, without a delegated cgroup) has them fail ENOSYS (`without_memory_cgroup`),
#: the answer of a kernel without them (before 3.17; without Landlock), which their
#: callers handle: HotSpot's ZGC, libffi's trampolines and libwayland's cursors
#: fall back to a file on any failure, and code that tests the errno tests ENOSYS
#: (EPERM reads as a refusal to report, not a lack); CPython's stdlib never calls
#: memfd_create (multiprocessing's shared memory and semaphores are /dev/shm
#: files, on the scratch); a Landlock user takes ENOSYS as "no Landlock here".
#: With a memory cgroup (root, or a delegated cgroup) both stay allowed.
UNBOUNDED_WITHOUT_MEMORY_CGROUP: tuple[str, ...] = ("landlock_create_ruleset", "memfd_create")


def without_memory_cgroup(policy: SeccompPolicy) -> SeccompPolicy:
    """`policy` for a run that has no memory cgroup: every name of
    `UNBOUNDED_WITHOUT_MEMORY_CGROUP` it allows fails ENOSYS instead (one it
    already fails keeps its errno)."""
    names = {name for name in UNBOUNDED_WITHOUT_MEMORY_CGROUP
             if name in policy.allowed or name in policy.extra_allowed}
    if not names:
        return policy
    return msgspec.structs.replace(
        policy,
        allowed=tuple(name for name in policy.allowed if name not in names),
        extra_allowed=tuple(name for name in policy.extra_allowed if name not in names),
        errno_enosys=tuple(sorted({*policy.errno_enosys, *names})),
    )


DEFAULT_POLICY = SeccompPolicy(
    allowed=ALLOWED_SYSCALLS,
    unix_only_socket=True,
    loopback_sockets=True,
    errno_enosys=tuple(sorted({"clone3", *(name for name, _ in DENIED_AS_DOCKER_ALLOWS)})),
    extra_allowed=(),
    clone_denied_flags=NAMESPACE_FLAGS,
    ioctl_allowed=IOCTL_ALLOWED + IOCTL_INTERFACE_QUERIES,
    ioctl_eperm=(TIOCSTI, TIOCLINUX),
    fcntl_eperm=(F_SETLEASE, F_NOTIFY),
    send_flags_denied=MSG_FASTOPEN,
    errno_eperm=ERRNO_EPERM,
    self_only=SELF_ONLY,
    mknod_types=MKNOD_TYPES,
    netlink_protocols=NETLINK_PROTOCOLS,
)
