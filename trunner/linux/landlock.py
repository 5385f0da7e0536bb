"""Landlock layer of the trunner jail: access masks, ruleset planning, argv encoding, syscalls.

The pure half (masks, `plan_ruleset`, `encode_ruleset`/`decode_ruleset`) runs in the parent;
the syscall half (`abi_version`, `restrict_self`) runs in the single-threaded helper process
right before it execve()s the adapter.  The helper imports this module, so the only
module-level imports are `os`, `ctypes`, `errno` and `sys` (typing only under TYPE_CHECKING):
`typing` alone would cost ~10 ms there, which is also why `Ruleset` is a hand-made tuple
(and `from __future__ import annotations`, 0.2 ms, is replaced by a few quoted annotations).
"""

import ctypes
import errno
import os
import sys

TYPE_CHECKING = False  # mypy/pyright treat any variable with this name as True
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import NamedTuple

# What Landlock (ABI <= 7) does NOT stop, verified on Linux 6.18: chmod/chown/utime/
# setxattr and stat/chdir/readlink on paths outside the rules (as uid 0, even with no
# capabilities, a jailed process can chmod 04777 a root-owned host file); connect() to
# *pathname* unix sockets anywhere (e.g. /run/docker.sock); UDP; TCP listen() on an
# auto-bound port (no bind() call to deny).  Other layers (netns, a non-root uid,
# seccomp) must cover those.

__all__ = [
    "ACCESS_FS_EXECUTE",
    "ACCESS_FS_WRITE_FILE",
    "ACCESS_FS_READ_FILE",
    "ACCESS_FS_READ_DIR",
    "ACCESS_FS_REMOVE_DIR",
    "ACCESS_FS_REMOVE_FILE",
    "ACCESS_FS_MAKE_CHAR",
    "ACCESS_FS_MAKE_DIR",
    "ACCESS_FS_MAKE_REG",
    "ACCESS_FS_MAKE_SOCK",
    "ACCESS_FS_MAKE_FIFO",
    "ACCESS_FS_MAKE_BLOCK",
    "ACCESS_FS_MAKE_SYM",
    "ACCESS_FS_REFER",
    "ACCESS_FS_TRUNCATE",
    "ACCESS_FS_IOCTL_DEV",
    "ACCESS_FS_FILE",
    "ACCESS_NET_BIND_TCP",
    "ACCESS_NET_CONNECT_TCP",
    "SCOPE_ABSTRACT_UNIX_SOCKET",
    "SCOPE_SIGNAL",
    "MIN_ABI",
    "KNOWN_ABI",
    "Ruleset",
    "fs_access_for_abi",
    "net_access_for_abi",
    "scope_for_abi",
    "ro_access",
    "rx_access",
    "rw_access",
    "path_rule_access",
    "plan_ruleset",
    "encode_ruleset",
    "decode_ruleset",
    "abi_version",
    "restrict_self",
]

# ---------------------------------------------------------------------------
# Constants (include/uapi/linux/landlock.h)
# ---------------------------------------------------------------------------

# Filesystem rights.  ABI 1 has bits 0..12.
ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2 (Linux 5.19): link/rename across directories
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3 (Linux 6.2)
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5 (Linux 6.10): ioctl on char/block devices

# Network rights, ABI 4 (Linux 6.7).
ACCESS_NET_BIND_TCP = 1 << 0
ACCESS_NET_CONNECT_TCP = 1 << 1

# IPC scopes, ABI 6 (Linux 6.12).
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

# ABI 7 (Linux 6.15) adds no access right and no scope, only audit-logging flags for
# landlock_restrict_self() (LANDLOCK_RESTRICT_SELF_LOG_SAME_EXEC_OFF = 1,
# LOG_NEW_EXEC_ON = 2, LOG_SUBDOMAINS_OFF = 4) and the LANDLOCK_CREATE_RULESET_ERRATA
# query.  We pass flags=0, i.e. the kernel defaults: denials by this very program are
# audit-logged (when audit is enabled), denials after the next execve() are not.

# The only rights that make sense on a rule whose path is a regular file (or other
# non-directory); any other bit makes landlock_add_rule() fail with EINVAL.
ACCESS_FS_FILE = (
    ACCESS_FS_EXECUTE
    | ACCESS_FS_WRITE_FILE
    | ACCESS_FS_READ_FILE
    | ACCESS_FS_TRUNCATE
    | ACCESS_FS_IOCTL_DEV
)

# MIN_ABI = 6: without the ABI 6 scopes a jailed process could still connect to any
# abstract-namespace unix socket of the host (D-Bus, X11, systemd, other jails: abstract
# sockets have no inode, so no filesystem rule can stop them) and kill() any process of
# the same uid, including the trunner parent and other workers.
MIN_ABI = 6
KNOWN_ABI = 7

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2

# Syscall numbers: x86_64, and every other architecture except alpha (+110).
_NR_CREATE_RULESET = 444
_NR_ADD_RULE = 445
_NR_RESTRICT_SELF = 446

_PR_GET_NO_NEW_PRIVS = 39

_S_IFMT = 0o170000
_S_IFDIR = 0o040000

_FS_BY_ABI = (
    0,  # ABI 0: no Landlock
    (1 << 13) - 1,  # ABI 1
    (1 << 14) - 1,  # ABI 2: + REFER
    (1 << 15) - 1,  # ABI 3: + TRUNCATE
    (1 << 15) - 1,  # ABI 4: net only
    (1 << 16) - 1,  # ABI 5: + IOCTL_DEV
)

# ---------------------------------------------------------------------------
# Pure part
# ---------------------------------------------------------------------------


def _check_abi(abi: int) -> int:
    if isinstance(abi, bool) or not isinstance(abi, int) or abi < 1:
        raise ValueError(f"invalid Landlock ABI {abi!r} (must be an int >= 1)")
    return abi


def fs_access_for_abi(abi: int) -> int:
    """All filesystem rights Landlock ABI `abi` can handle (ABIs above KNOWN_ABI: ours)."""
    _check_abi(abi)
    return _FS_BY_ABI[min(abi, len(_FS_BY_ABI) - 1)]


def net_access_for_abi(abi: int) -> int:
    """All network rights ABI `abi` can handle (0 below ABI 4)."""
    _check_abi(abi)
    return ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP if abi >= 4 else 0


def scope_for_abi(abi: int) -> int:
    """All IPC scopes ABI `abi` knows (0 below ABI 6)."""
    _check_abi(abi)
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def ro_access(abi: int) -> int:
    """Read files and list directories."""
    _check_abi(abi)
    return ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR


def rx_access(abi: int) -> int:
    """Read, list and execve()."""
    return ro_access(abi) | ACCESS_FS_EXECUTE


def rw_access(abi: int) -> int:
    """Everything the ABI has, except MAKE_CHAR, MAKE_BLOCK and IOCTL_DEV.

    Device nodes are useless in a work dir (mknod() of one needs CAP_MKNOD anyway) and
    device ioctls are attack surface, so those stay denied even beneath read_write
    paths.  EXECUTE is included: the jail, not W^X, is the boundary (the adapter is a
    CPython that can already run arbitrary code).  REFER lets link()/rename() move
    files *within* the read_write hierarchies only; the kernel still refuses to move
    or link anything in from or out to a path lacking REFER (EXDEV).
    """
    return fs_access_for_abi(abi) & ~(
        ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK | ACCESS_FS_IOCTL_DEV
    )


def path_rule_access(access: int, *, is_dir: bool) -> int:
    """The part of `access` the kernel accepts on a path rule: all of it beneath a
    directory, only ACCESS_FS_FILE bits on a file (others give EINVAL)."""
    return access if is_dir else access & ACCESS_FS_FILE


_FIELDS = ("abi", "handled_fs", "handled_net", "scoped", "path_rules", "port_rules")

if TYPE_CHECKING:

    class Ruleset(NamedTuple):
        abi: int
        handled_fs: int
        handled_net: int
        scoped: int
        path_rules: tuple[tuple[str, int], ...]
        port_rules: tuple[tuple[int, int], ...]

else:

    class Ruleset(tuple):
        """Landlock ruleset plan: abi, handled_fs, handled_net, scoped,
        path_rules ((path, access), ...), port_rules ((port, access), ...).

        Behaves like typing.NamedTuple('Ruleset', ...) (fields, keyword construction,
        _replace, _asdict, _make, pickling) without importing typing/collections.
        """

        __slots__ = ()
        _fields = _FIELDS
        _field_defaults: dict = {}
        __match_args__ = _FIELDS

        def __new__(cls, abi, handled_fs, handled_net, scoped, path_rules, port_rules):
            return tuple.__new__(
                cls, (abi, handled_fs, handled_net, scoped, path_rules, port_rules)
            )

        @classmethod
        def _make(cls, iterable):
            t = tuple(iterable)
            if len(t) != 6:
                raise TypeError(f"Expected 6 arguments, got {len(t)}")
            return tuple.__new__(cls, t)

        def _replace(self, **kwargs):
            result = self._make(kwargs.pop(name, value) for name, value in zip(_FIELDS, self))
            if kwargs:
                raise ValueError(f"Got unexpected field names: {list(kwargs)!r}")
            return result

        def _asdict(self):
            return dict(zip(_FIELDS, self))

        def __getnewargs__(self):
            return tuple(self)

        def __repr__(self):
            inner = ", ".join(f"{n}={v!r}" for n, v in zip(_FIELDS, self))
            return f"Ruleset({inner})"

    def _field(i: int) -> property:
        return property(lambda self: tuple.__getitem__(self, i), doc=f"Alias for field {i}")

    for _i, _name in enumerate(_FIELDS):
        setattr(Ruleset, _name, _field(_i))
    del _i, _name, _field


def _check_path(path: object, *, absolute: bool) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError(f"Landlock rule path must be a non-empty str, got {path!r}")
    if "\0" in path:
        raise ValueError(f"Landlock rule path contains NUL: {path!r}")
    if absolute and not path.startswith("/"):
        raise ValueError(f"Landlock rule path must be absolute: {path!r}")
    return path


def _check_port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"invalid TCP port {port!r}")
    return port


def plan_ruleset(
    abi: int,
    *,
    read_exec: "Iterable[str]",
    read_only: "Iterable[str]",
    read_write: "Iterable[str]",
    connect_tcp_ports: "Iterable[int]" = (),
    min_abi: int = MIN_ABI,
) -> Ruleset:
    """Plan a ruleset handling every right `abi` knows, so anything not granted is denied.

    `abi` is normally `abi_version()` of the target kernel; values above KNOWN_ABI are
    planned as KNOWN_ABI (we cannot handle rights we do not know).  Raises ValueError if
    `abi < min_abi`.  Paths are kept as given (the caller resolves them; a placeholder
    such as "<jail>" may be planned for hashing, but encode_ruleset/restrict_self only
    accept absolute paths); a path listed in several groups gets the union of rights.
    From ABI 4 on, TCP bind() and connect() are handled: bind is always denied, connect
    only allowed to `connect_tcp_ports`.  Below ABI 4 the network is not restricted at all and
    `connect_tcp_ports` is moot (dropped).  From ABI 6 on, abstract unix sockets and
    signals are scoped to the jail's own domain.
    """
    _check_abi(abi)
    if abi < min_abi:
        raise ValueError(f"Landlock ABI {abi} is below the required minimum {min_abi}")
    abi = min(abi, KNOWN_ABI)
    masks: dict[str, int] = {}
    for group, access in (
        (read_exec, rx_access(abi)),
        (read_only, ro_access(abi)),
        (read_write, rw_access(abi)),
    ):
        if isinstance(group, str):
            raise ValueError(f"expected an iterable of paths, got the str {group!r}")
        for path in group:
            _check_path(path, absolute=False)
            masks[path] = masks.get(path, 0) | access
    handled_net = net_access_for_abi(abi)
    ports: set[int] = set()
    for port in connect_tcp_ports:
        ports.add(_check_port(port))
    port_rules = (
        tuple((p, ACCESS_NET_CONNECT_TCP) for p in sorted(ports)) if handled_net else ()
    )
    return Ruleset(
        abi,
        fs_access_for_abi(abi),
        handled_net,
        scope_for_abi(abi),
        tuple(sorted(masks.items())),
        port_rules,
    )


def _validate(r: Ruleset) -> Ruleset:
    """Raise ValueError unless `r` is something the kernel of ABI r.abi would accept."""
    if not isinstance(r, tuple) or len(r) != 6:
        raise ValueError(f"not a Ruleset: {r!r}")
    abi, fs, net, scoped, path_rules, port_rules = r
    _check_abi(abi)
    for name, value, allowed in (
        ("handled_fs", fs, fs_access_for_abi(abi)),
        ("handled_net", net, net_access_for_abi(abi)),
        ("scoped", scoped, scope_for_abi(abi)),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"invalid {name} {value!r}")
        if value & ~allowed:
            raise ValueError(f"{name} {value:#x} has bits unknown to ABI {abi}")
    if not fs:
        raise ValueError("handled_fs is empty")
    for rule in path_rules:
        path, access = rule
        _check_path(path, absolute=True)
        if isinstance(access, bool) or not isinstance(access, int) or access <= 0:
            raise ValueError(f"invalid access {access!r} for {path!r}")
        if access & ~fs:
            raise ValueError(f"access {access:#x} for {path!r} is not within handled_fs")
    for port_rule in port_rules:
        port, access = port_rule
        _check_port(port)
        if isinstance(access, bool) or not isinstance(access, int) or access <= 0:
            raise ValueError(f"invalid access {access!r} for port {port}")
        if access & ~net:
            raise ValueError(f"access {access:#x} for port {port} is not within handled_net")
    return r


def encode_ruleset(r: Ruleset) -> list[str]:
    """Encode `r` as argv items for the helper (see decode_ruleset for the format)."""
    _validate(r)
    count = len(r.path_rules) + len(r.port_rules)
    out = [f"h:{r.abi}:{r.handled_fs}:{r.handled_net}:{r.scoped}:{count}"]
    out.extend(f"p:{access}:{path}" for path, access in r.path_rules)
    out.extend(f"n:{access}:{port}" for port, access in r.port_rules)
    return out


def _uint(text: str, what: str) -> int:
    # Strict: int() would also accept "+1", " 1", "1_0" and non-ASCII digits.
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise ValueError(f"bad {what} in encoded Landlock ruleset: {text!r}")
    return int(text)


def decode_ruleset(args: list[str]) -> Ruleset:
    """Inverse of encode_ruleset(); raises ValueError on anything malformed.

    Format: one argv item per element, all integers in plain decimal:
      ``h:<abi>:<handled_fs>:<handled_net>:<scoped>:<n>`` header, first, exactly once;
      then exactly n items, each ``p:<access>:<path>`` (the path is everything after the
      second colon, verbatim: it may contain ':', spaces, newlines, anything but NUL,
      which argv cannot carry anyway) or ``n:<access>:<port>``.
    """
    if not args:
        raise ValueError("empty encoded Landlock ruleset")
    head = args[0].split(":")
    if len(head) != 6 or head[0] != "h":
        raise ValueError(f"bad encoded Landlock ruleset header: {args[0]!r}")
    abi, fs, net, scoped, count = (_uint(x, "header field") for x in head[1:])
    if count != len(args) - 1:
        raise ValueError(
            f"encoded Landlock ruleset announces {count} rules, has {len(args) - 1}"
        )
    path_rules: list[tuple[str, int]] = []
    port_rules: list[tuple[int, int]] = []
    for item in args[1:]:
        parts = item.split(":", 2)
        if len(parts) != 3:
            raise ValueError(f"bad encoded Landlock rule: {item!r}")
        kind, access_text, value = parts
        access = _uint(access_text, "access")
        if kind == "p":
            path_rules.append((value, access))
        elif kind == "n":
            port_rules.append((_uint(value, "port"), access))
        else:
            raise ValueError(f"bad encoded Landlock rule: {item!r}")
    return _validate(Ruleset(abi, fs, net, scoped, tuple(path_rules), tuple(port_rules)))


# ---------------------------------------------------------------------------
# Syscall part (runs in the helper)
# ---------------------------------------------------------------------------

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        # dlopen(NULL): the libc already mapped into this process; no ctypes.util/ldconfig.
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        lib.prctl.restype = ctypes.c_int
        _libc = lib
    return _libc


def _syscall(*args: int) -> int:
    """syscall(2) returning the raw result; only when it is -1 is ctypes.get_errno() valid."""
    return int(_lib().syscall(*(ctypes.c_long(a) for a in args)))


def _fail(step: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{step}: {os.strerror(err)}")


def abi_version() -> int:
    """Landlock ABI of the running kernel; 0 if Landlock is not built in or disabled."""
    if not sys.platform.startswith("linux"):
        return 0
    ret = _syscall(_NR_CREATE_RULESET, 0, 0, _CREATE_RULESET_VERSION)
    if ret >= 0:
        return ret
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EOPNOTSUPP):
        return 0
    raise OSError(err, f"landlock_create_ruleset(VERSION): {os.strerror(err)}")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)): 12 bytes, not 16
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _no_new_privs() -> bool:
    ret = _lib().prctl(
        ctypes.c_int(_PR_GET_NO_NEW_PRIVS), ctypes.c_ulong(0), ctypes.c_ulong(0),
        ctypes.c_ulong(0), ctypes.c_ulong(0),
    )
    if ret < 0:
        raise _fail("prctl(PR_GET_NO_NEW_PRIVS)")
    return bool(ret == 1)


def restrict_self(r: Ruleset) -> None:
    """Enforce `r` on the calling thread (and everything it later execs or forks).

    Preconditions: the process is single-threaded (Landlock restricts only the calling
    thread; other threads would stay free) and PR_SET_NO_NEW_PRIVS is already set — the
    kernel only lets CAP_SYS_ADMIN skip that, and we refuse even then (EPERM).  Fails
    closed: a kernel ABI below r.abi, a missing path or any refused rule raises
    OSError(errno, "<step>: <detail>") and nothing is enforced; the caller must not run
    the untrusted work after an error.  Each path is opened with O_PATH, following
    symlinks, so a rule on a symlink (/bin -> usr/bin) covers its target.
    """
    _validate(r)
    kernel_abi = abi_version()
    if kernel_abi < r.abi:
        what = (
            "Landlock is unavailable" if kernel_abi == 0
            else f"kernel Landlock ABI is {kernel_abi}"
        )
        raise OSError(errno.EOPNOTSUPP, f"landlock: {what}, the ruleset needs ABI {r.abi}")
    if not _no_new_privs():
        raise OSError(
            errno.EPERM,
            "landlock_restrict_self: PR_SET_NO_NEW_PRIVS is not set "
            "(call prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) first)",
        )

    attr = _RulesetAttr(r.handled_fs, r.handled_net, r.scoped)
    size = 8 if r.abi < 4 else 16 if r.abi < 6 else 24
    ruleset_fd = _syscall(_NR_CREATE_RULESET, ctypes.addressof(attr), size, 0)
    if ruleset_fd < 0:
        raise _fail("landlock_create_ruleset")
    try:
        for path, access in r.path_rules:
            step = f"landlock_add_rule({path})"
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                raise OSError(e.errno, f"{step}: open(O_PATH): {e.strerror}") from None
            try:
                is_dir = os.fstat(fd).st_mode & _S_IFMT == _S_IFDIR
                allowed = path_rule_access(access, is_dir=is_dir)
                if not allowed:
                    continue  # e.g. only READ_DIR asked on a file: nothing to grant
                pb = _PathBeneathAttr(allowed, fd)
                ret = _syscall(
                    _NR_ADD_RULE, ruleset_fd, _RULE_PATH_BENEATH, ctypes.addressof(pb), 0
                )
                if ret < 0:
                    raise _fail(step)
            finally:
                os.close(fd)
        for port, access in r.port_rules:
            np = _NetPortAttr(access, port)
            if _syscall(_NR_ADD_RULE, ruleset_fd, _RULE_NET_PORT, ctypes.addressof(np), 0) < 0:
                raise _fail(f"landlock_add_rule(tcp port {port})")
        if _syscall(_NR_RESTRICT_SELF, ruleset_fd, 0) < 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset_fd)


if ctypes.sizeof(_PathBeneathAttr) != 12:  # pragma: no cover
    raise ImportError("trunner.landlock: unexpected struct layout")
