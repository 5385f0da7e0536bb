"""Parent side: where a caller on cgroup v2 may make its runs' cgroups.

On cgroup v2 a cgroup that holds processes cannot give controllers to its
children (the "no internal processes" rule; the host's root cgroup is
exempt). So runs' cgroups go in `trunner/` under a *delegated* cgroup D
that holds no process: the caller lives in a leaf below D (systemd's
`DelegateSubgroup=`, or `enter_leaf` when asked: `Runner(cgroup_leaf=)`,
`TRUNNER_CGROUP_LEAF`). D is delegated when it is the root of this cgroup
namespace (a VM's whole tree, a container's with `--cgroupns=private`) or
systemd marked it (`trusted.delegate` or `user.delegate`: a `Delegate=yes`
service or scope, systemd 251 on). A user's manager before systemd 254
marks none of its units, so for a non-root caller that names a leaf, D may
also be its own cgroup inside a subtree delegated to its uid (its
`user@.service`): naming the leaf says that D's unit is `Delegate=yes`.
Never an ancestor systemd manages.

`place` only reads (`trunner doctor` predicts with it); `enter_leaf` moves
this process, and nothing else, into its leaf.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trunner import procfs

LEAF_VAR = "TRUNNER_CGROUP_LEAF"

#: The fixes a refusal names.
SERVICE_FIX = ("set Delegate=yes on the unit, with DelegateSubgroup=NAME (systemd 254 on) or"
               f" {LEAF_VAR}=NAME, or run the caller under"
               " `systemd-run --scope -p Delegate=yes CMD`")
USER_FIX = ("run the caller under `systemd-run --user --scope -p Delegate=yes CMD`, with"
            f" {LEAF_VAR}=NAME (Runner(cgroup_leaf=NAME))")
CONTAINER_FIX = (f"run the container with --privileged and {LEAF_VAR}=NAME (Docker, Podman),"
                 " or not as root")


@dataclass(frozen=True)
class Placement:
    """Where runs' cgroups go (`base`, "" if nowhere), the leaf this process
    must first move into ("" if it stays), and otherwise why not (`refusal`,
    naming the fix)."""

    base: str = ""
    leaf: str = ""
    refusal: str = ""
    #: The controllers of `base` that runs get (of those asked for).
    controllers: tuple[str, ...] = ()


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def own_cgroup() -> tuple[str, str, bool] | None:
    """(the cgroup2 mount point, this process's cgroup path in it, whether
    the mount is read-only), or None where there is no unified hierarchy."""
    own = procfs.cgroups().get("")
    if own is None:
        return None
    for mount in procfs.mounts():
        if mount.fstype == "cgroup2":
            return mount.point, own, "ro" in mount.options.split(",")
    return None


def is_delegated(path: str, *, namespace_root: bool) -> bool:
    """Whether the cgroup dir `path` is delegated (see the module's rule)."""
    if namespace_root:
        return True
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, name) == b"1":
                return True
        except OSError:
            continue
    return False


def _in_own_subtree(path: str, mount: str) -> bool:
    """Whether the cgroup dir `path` is this uid's, below an ancestor that
    is marked delegated and is this uid's too (a `user@.service`)."""
    uid = os.getuid()
    try:
        if os.stat(path).st_uid != uid:
            return False
        up = os.path.dirname(path)
        while len(up) > len(mount.rstrip("/")):
            if os.stat(up).st_uid == uid and is_delegated(up, namespace_root=False):
                return True
            up = os.path.dirname(up)
    except OSError:
        return False
    return False


def _processes(path: str) -> list[int]:
    return [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]


def place(controllers: tuple[str, ...], leaf: str = "", *, is_root: bool) -> Placement:
    """Where this process's runs' cgroups would go, with `controllers`
    (the first required, the others taken where D has them), `leaf` the
    name of the leaf it may move into ("": it may not move). Reads only."""
    found = own_cgroup()
    if found is None:
        return Placement(refusal="no cgroup v2 hierarchy is mounted")
    mount, own, read_only = found
    here = os.path.join(mount, own.lstrip("/"))
    fix = SERVICE_FIX if is_root else USER_FIX
    if read_only:
        return Placement(refusal=f"the cgroup2 hierarchy at {mount} is mounted read-only (a"
                                 f" container's default): {CONTAINER_FIX}")

    def delegated(path: str, namespace_root: bool) -> bool:
        return (is_delegated(path, namespace_root=namespace_root)
                or (bool(leaf) and not is_root and _in_own_subtree(path, mount)))

    up, up_root = os.path.dirname(here), os.path.dirname(own) == "/"
    if own != "/" and (is_delegated(up, namespace_root=up_root)
                       or (os.path.basename(here) == leaf and delegated(up, up_root))):
        # Already in a leaf below D: DelegateSubgroup=, or an earlier move.
        return _check(up, controllers, mine=[os.getpid()])
    if not delegated(here, own == "/"):
        return Placement(refusal=f"this process's cgroup {own} is not delegated to it"
                                 f" (cgroup v2: no cgroup may be made there): {fix}")
    if not os.path.exists(os.path.join(here, "cgroup.type")):
        return _check(here, controllers, mine=_processes(here))  # the host's root cgroup
    if not leaf:
        return Placement(refusal=f"the delegated cgroup {own} holds this process, so it cannot"
                                 " give controllers to runs' cgroups: let trunner move"
                                 f" itself into a leaf of it (Runner(cgroup_leaf=NAME) or"
                                 f" {LEAF_VAR}=NAME), or use DelegateSubgroup=NAME"
                                 " (systemd 254 on)")
    if "/" in leaf or leaf in ("", ".", "..", "trunner") or leaf.startswith("cgroup."):
        return Placement(refusal=f"cgroup leaf {leaf!r} is not a plain name of its own")
    placed = _check(here, controllers, mine=[os.getpid()])
    if placed.refusal:
        return placed
    return Placement(base=placed.base, leaf=os.path.join(here, leaf),
                     controllers=placed.controllers)


def _check(base: str, controllers: tuple[str, ...], mine: list[int]) -> Placement:
    """`base` as D: delegated to us (writable), with the first of
    `controllers`, and either giving them to children already or free of
    processes but `mine` (which leave it), so that they can be given."""
    available = _read(os.path.join(base, "cgroup.controllers")).split()
    enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
    have = tuple(c for c in controllers if c in available)
    if controllers[0] not in have:
        return Placement(refusal=f"the delegated cgroup {base} has no {controllers[0]}"
                                 f" controller (cgroup.controllers: {' '.join(available)}):"
                                 " delegate it (Delegate=yes, or Delegate="
                                 f"{' '.join(controllers)})")
    writable = [os.path.join(base, name) for name in ("", "cgroup.subtree_control", "cgroup.procs")]
    if not all(os.access(path, os.W_OK) for path in writable):
        return Placement(refusal=f"the delegated cgroup {base} is not writable by this process"
                                 f" (uid {os.getuid()})")
    others = sorted(set(_processes(base)) - set(mine))
    if any(c not in enabled for c in have) and others:
        return Placement(refusal=f"the delegated cgroup {base} holds other processes"
                                 f" ({', '.join(map(str, others[:5]))}), so it cannot give"
                                 " controllers to runs' cgroups: move them into a leaf"
                                 " (DelegateSubgroup=NAME, or an ExecStartPre= that moves the"
                                 " service's processes)")
    runs = os.path.join(base, "trunner")
    if os.path.isdir(runs) and not os.access(os.path.join(runs, "cgroup.subtree_control"),
                                             os.W_OK):
        return Placement(refusal=f"{runs} is not writable by this process (uid {os.getuid()})")
    return Placement(base=base, controllers=have)


def enter_leaf(leaf: str) -> None:
    """Move this process (all its threads) into the cgroup `leaf`, made if
    missing. Idempotent.

    Raises:
        OSError: the kernel refused.
    """
    os.makedirs(leaf, exist_ok=True)
    with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
