"""Helper side: the kernel calls that put a process into its jail.

Runs in the single-threaded helper between spawn and exec. Imports only
`posix` (built in; `os` costs the helper ~1.5 ms) and `_kernel`, the raw
system calls (trunner/kernel/_kernel.c; ctypes cost ~3 ms). Every function
takes ints, strings and bytes the parent resolved, and raises
`OSError(errno, strerror, what)` when the kernel refuses. No policy is
decided here. The parent also calls `landlock_abi()` to probe.
"""

import posix
import sys

from trunner.kernel.abi import (
    IFF_UP,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    REPORT_FD,
    S_IFDIR,
    S_IFMT,
    SANDBOX_SETUP_EXIT,
    WAITER_FD,
)

TYPE_CHECKING = False  # not from typing: the helper imports this module
if TYPE_CHECKING:
    from collections.abc import Sequence

try:
    from trunner.kernel._kernel import (
        NR,
        confine_waiter as confine_waiter,
        fork_init as _fork_init,
        loopback_up,
        seccomp_filter,
        syscall,
    )
except ImportError as e:  # compiled at install (hatch_build.py)
    raise ImportError(f"trunner.kernel._kernel is not built ({e}): reinstall trunner where a"
                      " C compiler and the Python headers are present") from e

#: The helper's waiting stage (trunner/kernel/waiter.c), built beside this
#: module at install: what the helper execs once pid 1 is forked.
WAITER = __file__.rpartition("/")[0] + "/trunner-waiter"

_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_LANDLOCK_RULE_NET_PORT = 2
_SOCK_FILTER_BYTES = 8
_BPF_MAXINSNS = 4096
_SIGSET_BYTES = 8  # the kernel's sigset_t (rt_sigaction's last argument)


def call(name: str, *args: "int | bytes | None", what: str = "") -> int:
    """The system call `name`; a refusal raises OSError naming `what` (or
    the call)."""
    try:
        return syscall(NR[name], *args)
    except OSError as e:
        raise OSError(e.errno, e.strerror, what or name) from None


def _prctl(option: int, arg: int, what: str) -> int:
    return call("prctl", option, arg, 0, 0, 0, what=what)


def _u64(*values: int) -> bytes:
    """Native-endian u64 fields, as the kernel's structs lay them out."""
    return b"".join(v.to_bytes(8, sys.byteorder) for v in values)


def write_file(path: str, data: bytes) -> None:
    fd = posix.open(path, posix.O_WRONLY | posix.O_CLOEXEC)
    try:
        posix.write(fd, data)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    finally:
        posix.close(fd)


def unshare(flags: int) -> None:
    call("unshare", flags)


def pivot_root(new_root: str, put_old: str) -> None:
    call("pivot_root", _path(new_root), _path(put_old),
         what=f"pivot_root({new_root}, {put_old})")


def _path(text: str) -> bytes:
    """A path as the kernel takes it (bytes are NUL-terminated)."""
    return text.encode("utf-8", "surrogateescape")


def map_ids(uid: int, gid: int, inside: "int | None" = None) -> None:
    """Map the real ids, in a new user namespace, to `inside` (uid and gid
    alike), or to themselves; setgroups must be denied before gid_map can
    be written."""
    write_file("/proc/self/setgroups", b"deny")
    write_file("/proc/self/uid_map", b"%d %d 1" % (uid if inside is None else inside, uid))
    write_file("/proc/self/gid_map", b"%d %d 1" % (gid if inside is None else inside, gid))


def bring_loopback_up() -> None:
    """Bring this network namespace's `lo` up (needs CAP_NET_ADMIN over it:
    the user namespace that owns it); 127.0.0.1 and, where IPv6 is on, ::1
    come with it. Refused, or still down when read back: OSError."""
    try:
        flags = loopback_up()
    except OSError as e:
        raise OSError(e.errno, e.strerror, "ioctl(SIOCSIFFLAGS, lo)") from None
    if not flags & IFF_UP:
        raise OSError(100, f"lo is still down (flags {flags:#x})", "ioctl(SIOCSIFFLAGS, lo)")


def drop_capabilities(last_cap: int) -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets."""
    for cap in range(last_cap + 1):
        _prctl(_PR_CAPBSET_DROP, cap, f"prctl(PR_CAPBSET_DROP, {cap})")
    clear_capabilities()


def clear_capabilities() -> None:
    """Empty the ambient, effective, permitted and inheritable sets."""
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    # struct __user_cap_header_struct {u32 version; int pid}, then two
    # zeroed __user_cap_data_struct {u32 effective, permitted, inheritable}.
    header = _LINUX_CAPABILITY_VERSION_3.to_bytes(4, sys.byteorder) + bytes(4)
    call("capset", header, bytes(24))


def fork_init(done: int, closing: "tuple[int, ...]", bpf: bytes,
              landlock: "tuple[int, int, int, int, int, int] | None",
              argv: "tuple[str, ...]") -> int:
    """The jail's pid 1, a vfork child that runs no Python, exec'ing the
    waiter at WAITER_FD with `argv`, and pid 2, its fork (0 there):
    `_kernel.fork_init`, its failures on REPORT_FD."""
    return _fork_init(done, closing, bpf, landlock, argv, REPORT_FD, WAITER_FD,
                      SANDBOX_SETUP_EXIT)


def close_from(first_fd: int) -> None:
    call("close_range", first_fd, 0xFFFFFFFF, 0)


def set_cloexec(fd: int) -> None:
    posix.set_inheritable(fd, False)


def set_no_new_privs() -> None:
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")


def has_no_new_privs() -> bool:
    return _prctl(_PR_GET_NO_NEW_PRIVS, 0, "prctl(PR_GET_NO_NEW_PRIVS)") == 1


def default_signal(sig: int) -> None:
    """Reset `sig` to its default action (below Python's own handler): a
    zeroed struct sigaction is SIG_DFL, no flags, an empty mask."""
    call("rt_sigaction", sig, bytes(32), None, _SIGSET_BYTES, what=f"signal({sig}, SIG_DFL)")


def set_dumpable(on: bool) -> None:
    _prctl(PR_SET_DUMPABLE, int(on), "prctl(PR_SET_DUMPABLE)")


def set_parent_death_signal(sig: int) -> None:
    _prctl(PR_SET_PDEATHSIG, sig, "prctl(PR_SET_PDEATHSIG)")


def set_rlimit(resource: int, soft: int, hard: int) -> None:
    """prlimit64 on this process (struct rlimit64: two u64; -1 is infinity)."""
    new = _u64(soft & 0xFFFFFFFFFFFFFFFF, hard & 0xFFFFFFFFFFFFFFFF)
    call("prlimit64", 0, resource, new, None, what=f"setrlimit({resource}, {soft}, {hard})")


def landlock_abi() -> int:
    """The kernel's Landlock ABI; 0 where Landlock is absent or disabled."""
    try:
        return call("landlock_create_ruleset", None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    except OSError as e:
        if e.errno in (38, 95):  # ENOSYS, EOPNOTSUPP
            return 0
        raise


def restrict_filesystem(
    abi: int, fs: int, net: int, scoped: int,
    paths: "Sequence[tuple[str | int, int, int]]", ports: "list[tuple[int, int]]",
) -> None:
    """Create a Landlock ruleset handling `fs`/`net`/`scoped` at `abi`, add
    each (path, rights on a dir, rights on a file) and (port, rights), and
    restrict this thread. Needs NO_NEW_PRIVS (checked, even with
    CAP_SYS_ADMIN); a missing path or a refused rule raises and nothing is
    enforced. Paths are opened with O_PATH following symlinks, so a rule on
    /bin -> usr/bin covers its target; an int is a descriptor of the file
    (no path: a session's command sees no /proc/self of its own yet)."""
    kernel = landlock_abi()
    if kernel < abi:
        raise OSError(95, f"kernel Landlock ABI is {kernel}, the ruleset needs ABI {abi}",
                      "landlock")
    if not has_no_new_privs():
        raise OSError(1, "PR_SET_NO_NEW_PRIVS is not set", "landlock_restrict_self")
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # struct landlock_ruleset_attr
    ruleset = call("landlock_create_ruleset", _u64(fs, net, scoped)[:size], size, 0)
    try:
        for path, dir_rights, file_rights in paths:
            try:
                fd = (posix.dup(path) if isinstance(path, int)
                      else posix.open(path, posix.O_PATH | posix.O_CLOEXEC))
            except OSError as e:
                raise OSError(e.errno, e.strerror, f"landlock_add_rule({path})") from None
            try:
                is_dir = posix.fstat(fd).st_mode & S_IFMT == S_IFDIR
                rights = dir_rights if is_dir else file_rights
                if rights:  # struct landlock_path_beneath_attr, packed: 12 bytes
                    attr = _u64(rights) + fd.to_bytes(4, sys.byteorder, signed=True)
                    _add_rule(ruleset, _LANDLOCK_RULE_PATH_BENEATH, attr,
                              f"landlock_add_rule({path})")
            finally:
                posix.close(fd)
        for port, rights in ports:
            _add_rule(ruleset, _LANDLOCK_RULE_NET_PORT, _u64(rights, port),
                      f"landlock_add_rule(tcp port {port})")
        call("landlock_restrict_self", ruleset, 0)
    finally:
        posix.close(ruleset)


def _add_rule(ruleset: int, rule_type: int, attr: bytes, what: str) -> None:
    call("landlock_add_rule", ruleset, rule_type, attr, 0, what=what)


def install_seccomp(bpf: bytes) -> None:
    """Load `bpf` (struct sock_filter bytes compiled by the parent) as a
    seccomp filter on this thread. Needs NO_NEW_PRIVS (checked) and a
    single thread; afterwards only the allow-list runs, so call it last."""
    count, rest = divmod(len(bpf), _SOCK_FILTER_BYTES)
    if rest or not 0 < count <= _BPF_MAXINSNS:
        raise OSError(22, f"not a BPF program ({len(bpf)} bytes)", "seccomp")
    if not has_no_new_privs():
        raise OSError(1, "PR_SET_NO_NEW_PRIVS is not set", "seccomp")
    try:
        seccomp_filter(bpf)
    except OSError as e:
        raise OSError(e.errno, e.strerror, "seccomp(SECCOMP_SET_MODE_FILTER)") from None
