"""Parent side: Landlock access masks and the ruleset plan, as data.

Pure: the masks each ABI handles, and `plan_ruleset`, which turns path
groups into a `LandlockRuleset` (a frozen msgspec Struct) that handles every
right the ABI knows, so anything not granted is denied. The helper applies
it through `trunner.linux.install.restrict_filesystem`, with ints only.
"""

from collections.abc import Iterable

import msgspec

# What Landlock (ABI <= 7) does NOT stop, verified on Linux 6.18: chmod/chown/utime/
# setxattr and stat/chdir/readlink on paths outside the rules (as uid 0, even with no
# capabilities, a jailed process can chmod 04777 a root-owned host file); connect() to
# *pathname* unix sockets anywhere (e.g. /run/docker.sock); UDP; TCP listen() on an
# auto-bound port (no bind() call to deny).  Other layers (netns, a non-root uid,
# seccomp) must cover those.


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


class LandlockRuleset(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the helper enforces: the rights handled at `abi`, and the rights
    granted beneath each path and on each TCP port."""

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int
    path_rules: tuple[tuple[str, int], ...]
    port_rules: tuple[tuple[int, int], ...]

    def install_args(self) -> tuple[int, int, int, int, list[tuple[str, int, int]],
                                    list[tuple[int, int]]]:
        """The arguments of `install.restrict_filesystem`: each path with its
        rights on a directory and on a file (the kernel refuses dir-only
        rights on a file)."""
        paths = [(p, a, path_rule_access(a, is_dir=False)) for p, a in self.path_rules]
        return (self.abi, self.handled_fs, self.handled_net, self.scoped, paths,
                list(self.port_rules))


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
    read_exec: Iterable[str],
    read_only: Iterable[str],
    read_write: Iterable[str],
    connect_tcp_ports: Iterable[int] = (),
    min_abi: int = MIN_ABI,
) -> LandlockRuleset:
    """Plan a ruleset handling every right `abi` knows, so anything not granted is denied.

    `abi` is normally `abi_version()` of the target kernel; values above KNOWN_ABI are
    planned as KNOWN_ABI (we cannot handle rights we do not know).  Raises ValueError if
    `abi < min_abi`.  Paths are kept as given (the caller resolves them); a path listed in
    several groups gets the union of rights.
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
    return LandlockRuleset(
        abi=abi,
        handled_fs=fs_access_for_abi(abi),
        handled_net=handled_net,
        scoped=scope_for_abi(abi),
        path_rules=tuple(sorted(masks.items())),
        port_rules=port_rules,
    )
