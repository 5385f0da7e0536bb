"""Parent side: the one plan the helper enforces, and its codec.

`plan_jail` is pure: from the limits, the host facts, the profile and the
per-run values it resolves every number, path and BPF byte the helper will
apply, as a `HelperPlan`. `encode_plan` turns it into the single argv item
the helper reads (hex of a marshal dict: marshal is built in and already
loaded in the helper). The effective rules version hashes the same plan,
with per-run values (jail dir, cgroup, parent pid) and install locations
replaced by placeholders: what is hashed is exactly what is enforced.
"""

from __future__ import annotations

import marshal
import os
import resource
import sys
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from trunner.helper import PLAN_VERSION, SKIPPABLE
from trunner.linux import landlock, seccomp
from trunner.profile import PYTHON_PATHS, TRUNNER_PATH, JailProfile

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from trunner.jail import HostSupport
    from trunner.limits import Limits

#: Placeholders for per-run values in the hashed plan.
JAIL_DIR: Final = "@jail"
CGROUP: Final = "@cgroup"

_CLONE_NEWUSER: Final = 0x10000000
_CLONE_NEWNET: Final = 0x40000000
_NAMESPACE_FLAGS: Final = {"user": _CLONE_NEWUSER, "net": _CLONE_NEWNET}
_PATH: Final = "/usr/local/bin:/usr/bin:/bin"


class HelperPlan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything one helper run applies, resolved. See `trunner.helper`."""

    version: int = PLAN_VERSION
    #: The only environment names the helper accepts.
    env: tuple[str, ...]
    #: ("pids_cgroup", cgroup dir, pids.max) or ("rlimit_nproc", "", processes).
    process_limit: tuple[Literal["pids_cgroup", "rlimit_nproc"], str, int]
    #: (resource number, soft, hard), CORE 0 included.
    rlimits: tuple[tuple[int, int, int], ...]
    unshare_flags: int
    uid: int
    gid: int
    landlock: landlock.LandlockRuleset
    parent_pid: int
    seccomp_bpf: bytes
    #: Layers left out, for benchmarks that measure one layer at a time.
    unsafe_skip: tuple[str, ...] = ()
    #: Test hook: refuse at this step, as if it had failed.
    fail_at: str = ""


def rlimits_for(limits: Limits) -> tuple[tuple[int, int, int], ...]:
    """`Limits` to (resource, soft, hard); units are converted here only."""
    return (
        # SIGXCPU at the soft limit, SIGKILL one second later.
        (resource.RLIMIT_CPU, limits.cpu_time_s, limits.cpu_time_s + 1),
        (resource.RLIMIT_AS, limits.address_space_bytes, limits.address_space_bytes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_CORE, 0, 0),
    )


def environment(
    jail_dir: str, names: Sequence[str], import_paths: Sequence[str] = ()
) -> dict[str, str]:
    """The whole environment of a jailed process: nothing is inherited."""
    known = {"PATH": _PATH, "HOME": jail_dir, "TMPDIR": jail_dir, "LANG": "C.UTF-8"}
    env = {name: known[name] for name in names}
    if import_paths:
        env["PYTHONPATH"] = os.pathsep.join(import_paths)
    return env


def trunner_dir() -> str:
    """The directory trunner is imported from."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_paths() -> tuple[str, ...]:
    """Where this interpreter, its stdlib and site-packages live."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return tuple(sorted(paths))


def resolve_paths(paths: Sequence[str]) -> list[str]:
    """Expand the profile's symbolic paths; drop system paths this host lacks
    (e.g. no /lib64), which cannot then be reached anyway."""
    out: list[str] = []
    for path in paths:
        if path == PYTHON_PATHS:
            out += python_paths()
        elif path == TRUNNER_PATH:
            out.append(trunner_dir())
        elif os.path.exists(path):
            out.append(path)
    return out


def plan_jail(
    limits: Limits,
    host: HostSupport,
    profile: JailProfile,
    jail_dir: str,
    *,
    import_paths: Sequence[str] = (),
    cgroup: str | None = None,
    parent_pid: int = 0,
    landlock_abi: int | None = None,
    unsafe_skip: Sequence[str] = (),
    fail_at: str = "",
) -> HelperPlan:
    """The helper plan for one run. `cgroup` is the run's pids cgroup when
    the host's process limit is a cgroup.

    Raises:
        ValueError: the host has no process-limit mechanism, a namespace or
            a skipped layer is unknown, or the Landlock ABI is too old.
    """
    limit = host.process_limit
    if limit is None:
        raise ValueError("no process-limit mechanism on this host")
    process_limit: tuple[Literal["pids_cgroup", "rlimit_nproc"], str, int]
    if limit.kind == "pids_cgroup":
        process_limit = ("pids_cgroup", CGROUP if cgroup is None else cgroup, limits.processes)
    else:
        process_limit = ("rlimit_nproc", "", limits.processes)
    flags = 0
    for name in profile.namespaces:
        flags |= _NAMESPACE_FLAGS[name]
    if not flags & _CLONE_NEWUSER:
        raise ValueError("a jail always has its own user namespace")
    unknown = sorted(set(unsafe_skip) - set(SKIPPABLE))
    if unknown:
        raise ValueError(f"cannot skip {unknown}")
    abi = min(host.landlock_abi if landlock_abi is None else landlock_abi, landlock.KNOWN_ABI)
    ruleset = landlock.plan_ruleset(
        abi,
        read_exec=resolve_paths(profile.read_exec),
        read_only=[*resolve_paths(profile.read_only), *import_paths],
        read_write=[jail_dir, *resolve_paths(profile.read_write)],
        connect_tcp_ports=profile.tcp_connect_ports,
    )
    env = environment(jail_dir, profile.environment, import_paths)
    return HelperPlan(
        env=tuple(sorted(env)),
        process_limit=process_limit,
        rlimits=rlimits_for(limits),
        unshare_flags=flags,
        uid=host.uid,
        gid=host.gid,
        landlock=ruleset,
        parent_pid=parent_pid,
        seccomp_bpf=seccomp.build_bpf(profile.seccomp),
        unsafe_skip=tuple(sorted(set(unsafe_skip))),
        fail_at=fail_at,
    )


def encode_plan(plan: HelperPlan) -> str:
    """The helper's plan argv item: hex of a marshal dict of plain values."""
    data: dict[str, Any] = msgspec.structs.asdict(plan)
    data["landlock"] = plan.landlock.install_args()
    data = msgspec.to_builtins(data, builtin_types=(bytes,))
    return marshal.dumps(data).hex()


def hashed_plan(plan: HelperPlan, env: Mapping[str, str], jail_dir: str) -> dict[str, Any]:
    """The plan and environment as hashed: per-run values and install
    locations replaced by placeholders (so any clone of the same rules has
    the same version)."""
    names = {jail_dir: JAIL_DIR, trunner_dir(): TRUNNER_PATH}
    names.update((path, PYTHON_PATHS) for path in python_paths())

    def name(value: object) -> object:
        return names.get(value, value) if isinstance(value, str) else value

    rules = plan.landlock
    path_rules = sorted({(name(path), access) for path, access in rules.path_rules})
    data: dict[str, Any] = msgspec.structs.asdict(plan)
    data["landlock"] = msgspec.structs.replace(rules, path_rules=tuple(path_rules))
    if plan.process_limit[0] == "pids_cgroup":
        data["process_limit"] = ("pids_cgroup", CGROUP, plan.process_limit[2])
    data["parent_pid"] = 0
    data["env"] = {key: name(value) for key, value in env.items()}
    return data
