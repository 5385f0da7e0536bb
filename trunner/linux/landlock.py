"""Parent side: Landlock access masks and the ruleset plan, as data.

Pure: the masks each ABI handles, and `plan_ruleset`, which turns path
groups into a `LandlockRuleset` (a frozen msgspec Struct) that handles every
right the ABI knows, so anything not granted is denied. The helper applies
it through `trunner.kernel.install.restrict_filesystem`, with ints only.

Every ABI from 1 is used (the kernel's, capped at KNOWN_ABI). `FEATURES`
says, for each feature an older ABI lacks, which layer of the jail covers
it: the network namespace for TCP rules (ABI 4) and the abstract-socket
scope (ABI 6), the PID namespace for the signal scope (ABI 6), the
read-only binds and the minimal /dev for truncate (ABI 3) and device ioctls
(ABI 5). A profile sharing the host network has no such cover: it needs
`HOST_NETWORK_FEATURES` (`host_network_refusal`).
"""

from collections.abc import Iterable

import msgspec

# The rights and scopes (include/uapi/linux/landlock.h): one copy, shared with the helper.
from trunner.kernel.abi import (
    ACCESS_FS_EXECUTE as ACCESS_FS_EXECUTE,
    ACCESS_FS_IOCTL_DEV as ACCESS_FS_IOCTL_DEV,
    ACCESS_FS_MAKE_BLOCK as ACCESS_FS_MAKE_BLOCK,
    ACCESS_FS_MAKE_CHAR as ACCESS_FS_MAKE_CHAR,
    ACCESS_FS_MAKE_DIR as ACCESS_FS_MAKE_DIR,
    ACCESS_FS_MAKE_FIFO as ACCESS_FS_MAKE_FIFO,
    ACCESS_FS_MAKE_REG as ACCESS_FS_MAKE_REG,
    ACCESS_FS_MAKE_SOCK as ACCESS_FS_MAKE_SOCK,
    ACCESS_FS_MAKE_SYM as ACCESS_FS_MAKE_SYM,
    ACCESS_FS_READ_DIR as ACCESS_FS_READ_DIR,
    ACCESS_FS_READ_FILE as ACCESS_FS_READ_FILE,
    ACCESS_FS_REFER as ACCESS_FS_REFER,
    ACCESS_FS_REMOVE_DIR as ACCESS_FS_REMOVE_DIR,
    ACCESS_FS_REMOVE_FILE as ACCESS_FS_REMOVE_FILE,
    ACCESS_FS_TRUNCATE as ACCESS_FS_TRUNCATE,
    ACCESS_FS_WRITE_FILE as ACCESS_FS_WRITE_FILE,
    ACCESS_NET_BIND_TCP as ACCESS_NET_BIND_TCP,
    ACCESS_NET_CONNECT_TCP as ACCESS_NET_CONNECT_TCP,
    SCOPE_ABSTRACT_UNIX_SOCKET as SCOPE_ABSTRACT_UNIX_SOCKET,
    SCOPE_SIGNAL as SCOPE_SIGNAL,
)

# What Landlock (ABI <= 7) does NOT stop, verified on Linux 6.18: chmod/chown/utime/
# setxattr and stat/chdir/readlink on paths outside the rules (as uid 0, even with no
# capabilities, a jailed process can chmod 04777 a root-owned host file); connect() to
# *pathname* unix sockets anywhere (e.g. /run/docker.sock); UDP; TCP listen() on an
# auto-bound port (no bind() call to deny).  Other layers (netns, a non-root uid,
# seccomp, a tree that holds no host socket: `trunner.linux.sockets`) must cover those.



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

# Every ABI from 1 on is used; below KNOWN_ABI a feature the kernel lacks is not
# handled (asking for it would make landlock_create_ruleset() fail with EINVAL), and
# another layer covers it.  See FEATURES.
MIN_ABI = 1
KNOWN_ABI = 7
# Not known yet (planned as ABI 7): ABI 8 (Linux 6.19) adds LANDLOCK_RESTRICT_SELF_TSYNC
# (restrict every thread; the helper is single-threaded), ABI 9 adds
# LANDLOCK_ACCESS_FS_RESOLVE_UNIX (connect to pathname unix sockets; seccomp covers
# that here: connect() is EPERM).


class Feature(msgspec.Struct, frozen=True):
    """One Landlock feature: the ABI that brought it, and what holds without it."""

    name: str
    abi: int
    what: str
    #: What covers it in a trunner jail on a kernel without it.
    without: str


#: Each Landlock feature trunner uses, by the ABI that brought it.  A jail on a
#: kernel below a feature's ABI is still contained, by the layer `without` names.
FEATURES: tuple[Feature, ...] = (
    Feature("filesystem", 1, "read, write, exec, list, create and remove, per path",
            "(required: no Landlock, no jail)"),
    Feature("refer", 2, "link and rename across directories, within granted paths",
            "stricter, not weaker: ABI 1 refuses every link or rename across directories"
            " (EXDEV), also inside the working dir"),
    Feature("truncate", 3, "truncate(), O_TRUNC and ftruncate() per path",
            "the read-only binds (EROFS); the host's other files are not in the jail's root"),
    Feature("tcp", 4, "TCP bind() and connect() per port",
            "the network namespace (the run's own, holding only its loopback: Landlock's TCP"
            " rules are used by no other profile); the provider profile, which shares the"
            " host network, refuses to run"),
    Feature("ioctl_dev", 5, "ioctl() on character and block devices",
            "the minimal /dev (null, zero, full, random, urandom, the run's own ptys and"
            " tty) and seccomp's ioctl allow-list"),
    Feature("scope_abstract_unix_socket", 6,
            "connect to abstract unix sockets only within the jail",
            "the network namespace (abstract names are per network namespace); the provider"
            " profile, which shares the host network, refuses to run"),
    Feature("scope_signal", 6, "signals only within the jail",
            "the PID namespace (no host process is visible, so none can be signalled)"),
)

#: What a profile that shares the host network namespace (the provider) needs:
#: no namespace can stand in for these there.
HOST_NETWORK_FEATURES: tuple[str, ...] = ("tcp", "scope_abstract_unix_socket")

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


def features_for_abi(abi: int) -> dict[str, bool]:
    """Each of FEATURES: whether ABI `abi` has it."""
    _check_abi(abi)
    return {f.name: abi >= f.abi for f in FEATURES}


def host_network_shortfall(abi: int) -> Feature | None:
    """The first feature a profile sharing the host network needs that ABI
    `abi` lacks, or None."""
    _check_abi(abi)
    for f in FEATURES:
        if f.name in HOST_NETWORK_FEATURES and abi < f.abi:
            return f
    return None


def host_network_refusal(abi: int) -> str | None:
    """Why a profile sharing the host network cannot run at ABI `abi`, or None."""
    f = host_network_shortfall(abi)
    if f is None:
        return None
    return (f"landlock: a profile sharing the host network needs {f.name} ({f.what}), from"
            f" ABI {f.abi}; the ABI in use is {abi}")


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


def tty_access(abi: int) -> int:
    """Read, write, list and (ABI 5) device ioctls: the jail's own ptys, whose
    requests seccomp's ioctl list bounds."""
    return (ro_access(abi) | ACCESS_FS_WRITE_FILE | ACCESS_FS_IOCTL_DEV) & fs_access_for_abi(abi)


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


def _check_path(path: object) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError(f"Landlock rule path must be a non-empty str, got {path!r}")
    if "\0" in path:
        raise ValueError(f"Landlock rule path contains NUL: {path!r}")
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
    list_only: Iterable[str] = (),
    ttys: Iterable[str] = (),
    connect_tcp_ports: Iterable[int] = (),
    host_network: bool = False,
    handle_tcp: bool = True,
) -> LandlockRuleset:
    """Plan a ruleset handling every right `abi` knows, so anything not granted is denied.

    `abi` is the ABI in use: the kernel's (`install.landlock_abi()`), or less when capped;
    values above KNOWN_ABI are planned as KNOWN_ABI (we cannot handle rights we do not
    know).  Only rights and scopes `abi` has are handled or granted: what an older ABI
    lacks is covered by another layer (FEATURES).  Paths are kept as given (the caller
    resolves them); a path listed in several groups gets the union of rights.
    `list_only` dirs may be listed (READ_DIR, inherited below), nothing more.
    `ttys` (the jail's own ptys) may be read, written and listed, with device
    ioctls (`tty_access`).
    From ABI 4 on, with `handle_tcp`, TCP bind() and connect() are handled: bind is
    always denied, connect only allowed to `connect_tcp_ports`.  Without it (a profile
    with a network namespace of its own, which holds only the run's loopback) Landlock
    leaves TCP alone, so the run's servers bind and connect on their own loopback;
    below ABI 4 Landlock does not see the network.  Either way `connect_tcp_ports` is
    then dropped.  `host_network` needs `handle_tcp`.  From ABI 6
    on, abstract unix sockets and signals are scoped to the jail's own domain.

    Raises:
        ValueError: a bad ABI, path or port, or `host_network` (the profile shares
            the host's network namespace) at an ABI without TCP rules or the
            abstract-socket scope (`host_network_refusal`).
    """
    _check_abi(abi)
    if host_network:
        if not handle_tcp:
            raise ValueError("a profile sharing the host network needs Landlock's TCP rules")
        refusal = host_network_refusal(min(abi, KNOWN_ABI))
        if refusal is not None:
            raise ValueError(refusal)
    abi = min(abi, KNOWN_ABI)
    masks: dict[str, int] = {}
    for group, access in (
        (read_exec, rx_access(abi)),
        (read_only, ro_access(abi)),
        (read_write, rw_access(abi)),
        (list_only, ACCESS_FS_READ_DIR),
        (ttys, tty_access(abi)),
    ):
        if isinstance(group, str):
            raise ValueError(f"expected an iterable of paths, got the str {group!r}")
        for path in group:
            _check_path(path)
            masks[path] = masks.get(path, 0) | access
    # The run's own network namespace needs no port rules: nothing but its own
    # loopback is in it.
    handled_net = net_access_for_abi(abi) if handle_tcp else 0
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
