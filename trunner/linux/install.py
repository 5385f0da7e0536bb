"""Helper side: the kernel calls that put a process into its jail.

Runs in the single-threaded helper between spawn and exec. Imports only
`os` and `ctypes`; every function takes ints, strings and bytes the parent
resolved, and raises `OSError(errno, what)` when the kernel refuses. No
policy is decided here. The parent also calls `landlock_abi()` to probe.
"""

import ctypes
import os

# Syscall numbers: x86_64, and the generic table (aarch64) where they differ.
_NR = {
    "x86_64": {"capset": 126, "pivot_root": 155, "close_range": 436, "landlock_create_ruleset": 444,
               "landlock_add_rule": 445, "landlock_restrict_self": 446},
    "aarch64": {"capset": 91, "pivot_root": 41, "close_range": 436, "landlock_create_ruleset": 444,
                "landlock_add_rule": 445, "landlock_restrict_self": 446},
}
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_LANDLOCK_RULE_NET_PORT = 2
_S_IFMT = 0o170000
_S_IFDIR = 0o040000
_SOCK_FILTER_BYTES = 8
_BPF_MAXINSNS = 4096

_libc: list[ctypes.CDLL] = []


def libc() -> ctypes.CDLL:
    """The libc already mapped into this process (dlopen(NULL): no search)."""
    if not _libc:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        lib.prctl.restype = ctypes.c_int
        _libc.append(lib)
    return _libc[0]


def _nr(name: str) -> int:
    table = _NR.get(os.uname().machine)
    if table is None:
        raise OSError(95, f"no syscall table for {os.uname().machine}")  # EOPNOTSUPP
    return table[name]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), what)
    return ret


def _syscall(name: str, *args: int) -> int:
    return _check(int(libc().syscall(ctypes.c_long(_nr(name)),
                                     *(ctypes.c_long(a) for a in args))), name)


def _prctl(option: int, arg: int, what: str) -> int:
    ulong = ctypes.c_ulong
    return _check(libc().prctl(ctypes.c_int(option), ulong(arg), ulong(0), ulong(0), ulong(0)),
                  what)


def write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    finally:
        os.close(fd)


def unshare(flags: int) -> None:
    _check(libc().unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def pivot_root(new_root: str, put_old: str) -> None:
    new, old = ctypes.c_char_p(os.fsencode(new_root)), ctypes.c_char_p(os.fsencode(put_old))
    _check(int(libc().syscall(ctypes.c_long(_nr("pivot_root")), new, old)),
           f"pivot_root({new_root}, {put_old})")


def map_ids(uid: int, gid: int) -> None:
    """Map the real ids to themselves in a new user namespace; setgroups
    must be denied before gid_map can be written."""
    write_file("/proc/self/setgroups", b"deny")
    write_file("/proc/self/uid_map", f"{uid} {uid} 1".encode())
    write_file("/proc/self/gid_map", f"{gid} {gid} 1".encode())


def drop_capabilities(last_cap: int) -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets."""
    for cap in range(last_cap + 1):
        _prctl(_PR_CAPBSET_DROP, cap, f"prctl(PR_CAPBSET_DROP, {cap})")
    clear_capabilities()


def clear_capabilities() -> None:
    """Empty the ambient, effective, permitted and inheritable sets."""
    ulong = ctypes.c_ulong
    _check(libc().prctl(_PR_CAP_AMBIENT, ulong(_PR_CAP_AMBIENT_CLEAR_ALL), ulong(0), ulong(0),
                        ulong(0)), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two zeroed __user_cap_data_struct
    _syscall("capset", ctypes.addressof(header), ctypes.addressof(data))


def close_from(first_fd: int) -> None:
    _syscall("close_range", first_fd, 0xFFFFFFFF, 0)


def set_cloexec(fd: int) -> None:
    os.set_inheritable(fd, False)


def set_no_new_privs() -> None:
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")


def has_no_new_privs() -> bool:
    return _prctl(_PR_GET_NO_NEW_PRIVS, 0, "prctl(PR_GET_NO_NEW_PRIVS)") == 1


def default_signal(sig: int) -> None:
    """Reset `sig` to its default action (below Python's own handler)."""
    lib = libc()
    lib.signal.restype = ctypes.c_void_p
    if lib.signal(ctypes.c_int(sig), ctypes.c_void_p(0)) == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), f"signal({sig}, SIG_DFL)")


def set_dumpable(on: bool) -> None:
    _prctl(_PR_SET_DUMPABLE, int(on), "prctl(PR_SET_DUMPABLE)")


def set_parent_death_signal(sig: int) -> None:
    _prctl(_PR_SET_PDEATHSIG, sig, "prctl(PR_SET_PDEATHSIG)")


def landlock_abi() -> int:
    """The kernel's Landlock ABI; 0 where Landlock is absent or disabled."""
    try:
        return _syscall("landlock_create_ruleset", 0, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    except OSError as e:
        if e.errno in (38, 95):  # ENOSYS, EOPNOTSUPP
            return 0
        raise


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)): 12 bytes
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def restrict_filesystem(
    abi: int, fs: int, net: int, scoped: int,
    paths: "list[tuple[str, int, int]]", ports: "list[tuple[int, int]]",
) -> None:
    """Create a Landlock ruleset handling `fs`/`net`/`scoped` at `abi`, add
    each (path, rights on a dir, rights on a file) and (port, rights), and
    restrict this thread. Needs NO_NEW_PRIVS (checked, even with
    CAP_SYS_ADMIN); a missing path or a refused rule raises and nothing is
    enforced. Paths are opened with O_PATH following symlinks, so a rule on
    /bin -> usr/bin covers its target."""
    kernel = landlock_abi()
    if kernel < abi:
        raise OSError(95, f"kernel Landlock ABI is {kernel}, the ruleset needs ABI {abi}",
                      "landlock")
    if not has_no_new_privs():
        raise OSError(1, "PR_SET_NO_NEW_PRIVS is not set", "landlock_restrict_self")
    attr = _RulesetAttr(fs, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _syscall("landlock_create_ruleset", ctypes.addressof(attr), size, 0)
    try:
        for path, dir_rights, file_rights in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                raise OSError(e.errno, e.strerror, f"landlock_add_rule({path})") from None
            try:
                is_dir = os.fstat(fd).st_mode & _S_IFMT == _S_IFDIR
                rights = dir_rights if is_dir else file_rights
                if rights:
                    _add_rule(ruleset, _LANDLOCK_RULE_PATH_BENEATH, _PathBeneath(rights, fd),
                              f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        for port, rights in ports:
            _add_rule(ruleset, _LANDLOCK_RULE_NET_PORT, _NetPort(rights, port),
                      f"landlock_add_rule(tcp port {port})")
        _syscall("landlock_restrict_self", ruleset, 0)
    finally:
        os.close(ruleset)


def _add_rule(ruleset: int, rule_type: int, attr: ctypes.Structure, what: str) -> None:
    _check(int(libc().syscall(
        ctypes.c_long(_nr("landlock_add_rule")), ctypes.c_long(ruleset), ctypes.c_long(rule_type),
        ctypes.c_void_p(ctypes.addressof(attr)), ctypes.c_long(0))), what)


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def install_seccomp(bpf: bytes) -> None:
    """Load `bpf` (struct sock_filter bytes compiled by the parent) as a
    seccomp filter on this thread. Needs NO_NEW_PRIVS (checked) and a
    single thread; afterwards only the allow-list runs, so call it last."""
    count, rest = divmod(len(bpf), _SOCK_FILTER_BYTES)
    if rest or not 0 < count <= _BPF_MAXINSNS:
        raise OSError(22, f"not a BPF program ({len(bpf)} bytes)", "seccomp")
    if not has_no_new_privs():
        raise OSError(1, "PR_SET_NO_NEW_PRIVS is not set", "seccomp")
    insns = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(count, ctypes.addressof(insns))
    ulong = ctypes.c_ulong
    _check(libc().prctl(_PR_SET_SECCOMP, ulong(_SECCOMP_MODE_FILTER),
                        ctypes.c_void_p(ctypes.addressof(prog)), ulong(0), ulong(0)),
           "seccomp(SECCOMP_SET_MODE_FILTER)")


if ctypes.sizeof(_PathBeneath) != 12:  # pragma: no cover
    raise ImportError("trunner.linux.install: unexpected struct layout")
