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
    SANDBOX_SETUP_EXIT,
    WAITER_FD,
)

TYPE_CHECKING = False  # not from typing: the helper imports this module
if TYPE_CHECKING:
    from collections.abc import Sequence

try:
    from trunner.kernel._kernel import (
        NR,
        clear_capabilities as clear_capabilities,
        confine_waiter as confine_waiter,
        fork_init as _fork_init,
        landlock_abi as landlock_abi,
        landlock_restrict,
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
    """Empty the bounding set, then the ambient, effective, permitted and
    inheritable sets (`clear_capabilities`: `_kernel.clear_capabilities`,
    the code the waiters' confinement runs)."""
    for cap in range(last_cap + 1):
        _prctl(_PR_CAPBSET_DROP, cap, f"prctl(PR_CAPBSET_DROP, {cap})")
    clear_capabilities()


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


def set_dumpable(on: bool) -> None:
    _prctl(PR_SET_DUMPABLE, int(on), "prctl(PR_SET_DUMPABLE)")


def set_parent_death_signal(sig: int) -> None:
    _prctl(PR_SET_PDEATHSIG, sig, "prctl(PR_SET_PDEATHSIG)")


def set_rlimit(resource: int, soft: int, hard: int) -> None:
    """prlimit64 on this process (struct rlimit64: two u64; -1 is infinity)."""
    new = _u64(soft & 0xFFFFFFFFFFFFFFFF, hard & 0xFFFFFFFFFFFFFFFF)
    call("prlimit64", 0, resource, new, None, what=f"setrlimit({resource}, {soft}, {hard})")


def restrict_filesystem(
    abi: int, fs: int, net: int, scoped: int,
    paths: "Sequence[tuple[str | int, int, int]]", ports: "Sequence[tuple[int, int]]",
) -> None:
    """Create a Landlock ruleset handling `fs`/`net`/`scoped` at `abi`, add
    each (path, rights on a dir, rights on a file) and (port, rights), and
    restrict this thread. Needs NO_NEW_PRIVS (checked, even with
    CAP_SYS_ADMIN); a missing path or a refused rule raises and nothing is
    enforced. Paths are opened with O_PATH following symlinks, so a rule on
    /bin -> usr/bin covers its target; an int is a descriptor of the file
    (no path: a session's command sees no /proc/self of its own yet).
    `_kernel.landlock_restrict`, the code pid 1's ruleset runs."""
    landlock_restrict(abi, fs, net, scoped, paths, ports)


def install_seccomp(bpf: bytes) -> None:
    """Load `bpf` (struct sock_filter bytes compiled by the parent) as a
    seccomp filter on this thread. Needs NO_NEW_PRIVS (checked) and a
    single thread; afterwards only the allow-list runs, so call it last.
    `_kernel.seccomp_filter`, the code the waiters' filter runs."""
    seccomp_filter(bpf)
