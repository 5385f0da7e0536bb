"""Compiling a `SeccompPolicy` into classic BPF.

`policy_rules` turns a policy into its rules as data, in order, and checks the
policy's consistency; it is pure. `compile` feeds rules to libseccomp
(pyseccomp, imported lazily: it is slow to import) for one architecture and
exports the BPF; `build_bpf` does both for the native one. The helper only
installs the bytes (`trunner.kernel.install`). `syscall_name` names a
killed syscall number, `libseccomp_version` the libseccomp that compiles.
"""

from __future__ import annotations

import errno
import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trunner.linux.seccomp.policy import (
    _U32,
    AF_INET,
    AF_INET6,
    AF_NETLINK,
    AF_UNIX,
    DEFAULT_POLICY,
    INET_PROTOCOLS,
    LOOPBACK_INET_TYPES,
    S_IFMT,
    SOCK_STREAM,
    UNIX_SOCKET_TYPES,
    WAITER_ARCH_PRCTLS,
    WAITER_IOCTLS,
    WAITER_SYSCALLS,
    SeccompPolicy,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "ALLOW",
    "DEFAULT_ACTION",
    "ERRNO",
    "Action",
    "Arg",
    "Rule",
    "build_bpf",
    "compile",
    "libseccomp_problem",
    "libseccomp_version",
    "policy_rules",
    "syscall_name",
    "waiter_bpf",
]


# --------------------------------------------------------------------------------------------
# The rules as data (pure)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """What a rule does: allow the call (`code` None), or fail it with errno `code`."""

    code: int | None = None

    def __repr__(self) -> str:
        if self.code is None:
            return "ALLOW"
        return f"ERRNO({errno.errorcode.get(self.code, self.code)})"


ALLOW = Action()


def ERRNO(code: int) -> Action:
    """Fail the call with errno `code`."""
    return Action(code)


#: Every call the policy names nowhere: what a kernel without it says.
DEFAULT_ACTION = ERRNO(errno.ENOSYS)
EPERM = ERRNO(errno.EPERM)


@dataclass(frozen=True)
class Arg:
    """The condition `args[index] & mask == value`."""

    index: int
    mask: int
    value: int

    def __repr__(self) -> str:
        return f"Arg({self.index}, {self.mask:#x}, {self.value:#x})"


@dataclass(frozen=True)
class Rule:
    """`action` for `syscall` when all of `args` hold (none: always)."""

    action: Action
    syscall: str
    args: tuple[Arg, ...] = ()


#: socket()/socketpair() of a type other than stream within an allowed family.
_SOCK_TYPE_MASK = 0xF  # the type, past SOCK_NONBLOCK/SOCK_CLOEXEC


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


def _check_groups(policy: SeccompPolicy) -> None:
    """A name in two groups of the policy is an error: which rule wins would be
    libseccomp's choice, not the policy's."""
    conditional = ["clone", "fadvise64", "fcntl", "ioctl", "madvise", "mknod", "mknodat",
                   "preadv2", "pwritev2", "sendmmsg", "sendmsg", "sendto"]
    if policy.unix_only_socket:
        conditional += ["socket", "socketpair"]
    groups = {
        "allowed/extra_allowed": {*policy.allowed, *policy.extra_allowed},
        "errno_enosys": set(policy.errno_enosys),
        "errno_eperm": set(policy.errno_eperm),
        "self_only": set(policy.self_only),
        "conditional rules": set(conditional),
    }
    seen: dict[str, str] = {}
    for group, names in groups.items():
        for name in sorted(names):
            if name in seen:
                raise ValueError(f"seccomp policy: {name!r} is in both {seen[name]} and {group}")
            seen[name] = group


#: Per family, each allowed type and its allowed protocols (none listed: any).
_Families = tuple[tuple[int, tuple[tuple[int, tuple[int, ...]], ...]], ...]


def _socket_rules(name: str, families: _Families, others: tuple[int, ...] = ()) -> list[Rule]:
    # Disjoint rules: a family not listed -> EAFNOSUPPORT; a listed family of a type
    # not listed -> ESOCKTNOSUPPORT (e.g. the provider's: a datagram socket could
    # sendto() a host socket by path without connect()); a listed type with a protocol
    # not listed (if any are) -> EPROTONOSUPPORT. The kernel reads the domain and
    # protocol as ints: compare only the low 32 bits; the type past SOCK_NONBLOCK and
    # SOCK_CLOEXEC. `others`: families whose rules are made apart.
    out: list[Rule] = []
    for family, types in families:
        fam = Arg(0, _U32, family)
        for kind, protocols in types:
            typ = Arg(1, _SOCK_TYPE_MASK, kind)
            if not protocols:
                out.append(Rule(ALLOW, name, (fam, typ)))
                continue
            out += [Rule(ALLOW, name, (fam, typ, Arg(2, _U32, p))) for p in protocols]
            out += [Rule(ERRNO(errno.EPROTONOSUPPORT), name, (fam, typ, Arg(2, mask, value)))
                    for mask, value in _low32_complement(protocols)]
        for mask, value in _complement([kind for kind, _ in types], _SOCK_TYPE_MASK):
            out.append(Rule(ERRNO(errno.ESOCKTNOSUPPORT), name, (fam, Arg(1, mask, value))))
    for mask, value in _low32_complement((*(family for family, _ in families), *others)):
        out.append(Rule(ERRNO(errno.EAFNOSUPPORT), name, (Arg(0, mask, value),)))
    return out


def _netlink_rules(protocols: tuple[int, ...]) -> list[Rule]:
    # socket(AF_NETLINK, any type, protocol): a listed protocol, or EPROTONOSUPPORT
    # (the kernel's own answer for a type netlink lacks stays its own).
    fam = Arg(0, _U32, AF_NETLINK)
    out = [Rule(ALLOW, "socket", (fam, Arg(2, _U32, p))) for p in protocols]
    out += [Rule(ERRNO(errno.EPROTONOSUPPORT), "socket", (fam, Arg(2, mask, value)))
            for mask, value in _low32_complement(protocols)]
    return out


def _mknod_rules(name: str, arg: int, types: tuple[int, ...]) -> list[Rule]:
    # The file type is the 4 bits of S_IFMT in the mode: one disjoint rule for each of
    # the 16 values, allowed or EPERM (device nodes).
    return [Rule(ALLOW if t << 12 in types else EPERM, name, (Arg(arg, S_IFMT, t << 12),))
            for t in range(16)]


def _flag_rules(name: str, arg: int, denied: int, action: Action) -> list[Rule]:
    # Allowed iff no denied flag is set; else `action` (one rule per flag: they
    # overlap, but agree).
    if not denied:
        return [Rule(ALLOW, name)]
    bits = [1 << b for b in range(32) if denied >> b & 1]
    return [Rule(ALLOW, name, (Arg(arg, denied, 0),)),
            *(Rule(action, name, (Arg(arg, bit, bit),)) for bit in bits)]


def _value_rules(name: str, arg: int, exact: dict[int, Action], rest: Action) -> list[Rule]:
    # low32(arg) == v -> exact[v]; any other value -> rest.
    out = [Rule(exact[v], name, (Arg(arg, _U32, v),)) for v in sorted(exact)]
    out += [Rule(rest, name, (Arg(arg, mask, value),)) for mask, value in _low32_complement(exact)]
    return out


def policy_rules(policy: SeccompPolicy) -> list[Rule]:
    """The rules of ``policy``, in the order libseccomp gets them; the default
    action's (ENOSYS, `errno_enosys`) included, though libseccomp needs none.

    Raises ``ValueError`` if a name is in two groups of the policy. Whether each
    name is a syscall is the architecture's question: `compile` answers it.
    """
    _check_groups(policy)
    out = [Rule(ALLOW, name) for name in sorted({*policy.allowed, *policy.extra_allowed})]
    out += [Rule(ERRNO(errno.ENOSYS), name) for name in sorted(policy.errno_enosys)]
    out += [Rule(EPERM, name) for name in sorted(policy.errno_eperm)]
    if policy.unix_only_socket:
        stream_only: tuple[tuple[int, tuple[int, ...]], ...] = ((SOCK_STREAM, ()),)
        unix = (AF_UNIX, stream_only)
        if policy.loopback_sockets and not policy.inet_socket:
            unix = (AF_UNIX, tuple((kind, ()) for kind in UNIX_SOCKET_TYPES))
        out += _socket_rules("socketpair", (unix,))
        netlink = (AF_NETLINK,) if policy.netlink_protocols else ()
        if policy.inet_socket:  # the provider's: TCP, in the host's network namespace
            tcp = ((SOCK_STREAM, INET_PROTOCOLS),)
            out += _socket_rules("socket", ((AF_INET, tcp), (AF_INET6, tcp)), netlink)
        elif policy.loopback_sockets:  # the run's own loopback and unix names
            out += _socket_rules("socket", (unix, (AF_INET, LOOPBACK_INET_TYPES),
                                            (AF_INET6, LOOPBACK_INET_TYPES)), netlink)
        else:
            out += _socket_rules("socket", (unix,), netlink)
        if netlink:
            out += _netlink_rules(policy.netlink_protocols)
    for name in sorted(policy.self_only):  # pid argument 0: the caller itself
        out += _value_rules(name, 0, {0: ALLOW}, EPERM)
    out += _flag_rules("clone", 0, policy.clone_denied_flags, EPERM)
    # sendmsg(fd, msg, flags), sendto(fd, buf, len, flags, addr, addrlen)
    out += _flag_rules("sendmsg", 2, policy.send_flags_denied, ERRNO(errno.EOPNOTSUPP))
    out += _flag_rules("sendto", 3, policy.send_flags_denied, ERRNO(errno.EOPNOTSUPP))
    # sendmmsg(fd, msgvec, vlen, flags): the kernel sends every message with `flags`
    out += _flag_rules("sendmmsg", 3, policy.send_flags_denied, ERRNO(errno.EOPNOTSUPP))
    # mknod(path, mode, dev), mknodat(dirfd, path, mode, dev)
    out += _mknod_rules("mknod", 1, policy.mknod_types)
    out += _mknod_rules("mknodat", 2, policy.mknod_types)
    # preadv2/pwritev2(fd, iov, iovcnt, pos_l, pos_h, flags), madvise(addr, len,
    # advice), fadvise64(fd, offset, len, advice): the page-cache channel (policy.py)
    out += _flag_rules("preadv2", 5, policy.rwf_denied, ERRNO(errno.EOPNOTSUPP))
    out += _flag_rules("pwritev2", 5, policy.rwf_denied, ERRNO(errno.EOPNOTSUPP))
    out += _value_rules("madvise", 2, dict.fromkeys(policy.madvise_einval,
                                                    ERRNO(errno.EINVAL)), ALLOW)
    out += _value_rules("fadvise64", 3, dict.fromkeys(policy.fadvise_noop, ERRNO(0)), ALLOW)
    out += _value_rules("fcntl", 1, dict.fromkeys(policy.fcntl_eperm, EPERM), ALLOW)
    ioctl = {**dict.fromkeys(policy.ioctl_eperm, EPERM),
             **dict.fromkeys(policy.ioctl_allowed, ALLOW)}
    out += _value_rules("ioctl", 1, ioctl, ERRNO(errno.ENOTTY))
    return out


# --------------------------------------------------------------------------------------------
# libseccomp (pyseccomp, imported lazily)
# --------------------------------------------------------------------------------------------

_SOCK_FILTER_SIZE = 8  # struct sock_filter { u16 code; u8 jt; u8 jf; u32 k; }
_BPF_MAXINSNS = 4096
_NR_SCMP_ERROR = -1  # libseccomp's answer for a name it does not know


def _import_pyseccomp() -> Any:  # noqa: ANN401  pyseccomp is untyped (Any to mypy)
    try:
        import pyseccomp  # slow: it runs find_library(), i.e. ldconfig, at import time
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        raise RuntimeError(
            "trunner.seccomp needs the 'pyseccomp' package and the libseccomp shared library "
            f"(libseccomp.so.2, e.g. apt-get install libseccomp2): {exc}"
        ) from exc
    return pyseccomp


def libseccomp_problem() -> str | None:
    """Why libseccomp cannot compile filters here (pyseccomp missing or broken,
    the shared library absent), or None when it can."""
    try:
        libseccomp_version()
    except (RuntimeError, OSError, AttributeError) as exc:
        return str(exc)
    return None


def compile(rules: SeccompPolicy | Sequence[Rule], arch: int | None = None) -> bytes:
    """Compile ``rules`` (a policy's, `policy_rules`) for ``arch`` into ``struct
    sock_filter`` bytes.

    ``arch`` is an AUDIT_ARCH_* number (`pyseccomp.Arch`), the native one if None.
    libseccomp drops the rules of a name ``arch`` lacks (``open`` on aarch64): the
    call does not exist there. Deterministic for given rules, arch and libseccomp
    version. Raises ``RuntimeError`` if pyseccomp/libseccomp is unavailable and
    ``ValueError`` for an inconsistent policy, a name libseccomp does not know or a
    rule it refuses (argument checks of socket() on socketcall arches: i386, s390x).
    """
    if isinstance(rules, SeccompPolicy):
        rules = policy_rules(rules)
    sc = _import_pyseccomp()

    def action(a: Action) -> int:
        return int(sc.ALLOW if a.code is None else sc.ERRNO(a.code))

    flt = sc.SyscallFilter(action(DEFAULT_ACTION))
    if arch is not None:
        flt.remove_arch(sc.Arch.NATIVE)
        flt.add_arch(arch)
    # Foreign-arch syscalls (int 0x80 from a 64-bit process) and x32 numbers (libseccomp
    # sends them to the bad-arch action on x86_64) kill the whole process.
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    # We only export; the helper sets no_new_privs itself and is single-threaded (no TSYNC).
    flt.set_attr(sc.Attr.CTL_NNP, 0)
    flt.set_attr(sc.Attr.CTL_TSYNC, 0)
    # A binary tree of syscall numbers, not a linear list: each syscall is
    # O(log n) compares, and the kernel's install (its per-syscall cache is
    # built by running the filter for every number) costs half: 0.28 ms, not
    # 0.56, for the default policy's ~2000 instructions, three times a run.
    flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    for rule in rules:
        # libseccomp takes native numbers and translates them by name to each arch of
        # the filter (a name without a native number has a negative "pseudo" one).
        nr = int(sc.resolve_syscall(sc.Arch.NATIVE, rule.syscall))
        if nr == _NR_SCMP_ERROR:
            raise ValueError(f"seccomp policy: unknown syscall {rule.syscall!r}")
        # libseccomp refuses a rule whose action is the default one; the default
        # applies to it anyway.
        if rule.action != DEFAULT_ACTION:
            args = [sc.Arg(a.index, sc.MASKED_EQ, a.mask, a.value) for a in rule.args]
            try:
                flt.add_rule(action(rule.action), nr, *args)
            except OSError as exc:  # e.g. socket() where it is multiplexed (socketcall)
                raise ValueError(f"seccomp policy: libseccomp refused {rule}: {exc}") from None

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
    """`compile` ``policy`` for the native architecture. Not cached: a caller that
    needs the bytes again keeps them (the backend compiles once per backend)."""
    if not isinstance(policy, SeccompPolicy):
        raise TypeError(f"expected a SeccompPolicy, got {type(policy).__name__}")
    return compile(policy)


def waiter_rules() -> list[Rule]:
    """The waiters' allow-list (policy.WAITER_SYSCALLS, WAITER_IOCTLS,
    WAITER_ARCH_PRCTLS)."""
    return [*(Rule(ALLOW, name) for name in WAITER_SYSCALLS),
            *(Rule(ALLOW, "ioctl", (Arg(1, _U32, request),)) for request in WAITER_IOCTLS),
            *(Rule(ALLOW, "arch_prctl", (Arg(0, _U32, code),)) for code in WAITER_ARCH_PRCTLS)]


@functools.cache
def waiter_bpf() -> bytes:
    """`compile` of `waiter_rules()` for the native architecture (the same
    in every profile: compiled once a process)."""
    return compile(waiter_rules())


def syscall_name(nr: int, arch: int | None = None) -> str | None:
    """The name of syscall number ``nr`` (e.g. from a SIGSYS report) on ``arch``
    (an AUDIT_ARCH_* number, the native one if None), else None.

    None also for a number ``arch`` does not have (x32 ones on x86_64) and if
    libseccomp is unavailable.
    """
    if nr < 0:
        return None
    try:
        sc = _import_pyseccomp()
        name = sc.resolve_syscall(sc.Arch.NATIVE if arch is None else arch, nr)
        return str(name.decode("ascii"))
    except (RuntimeError, ValueError, UnicodeDecodeError):
        return None


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
