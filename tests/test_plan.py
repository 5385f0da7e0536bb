"""The plan: one typed value, what the helper reads and what is hashed.

The parent's `HelperPlan` has exactly the fields the helper reads
(`abi.PLAN_FIELDS`), and each of its item Structs the fields and tag of the
helper's slots class of the same name; every kind of item reads back to its
plain values; the plan of a real run, decoded by the helper's own reader,
is, field by field, the plan that was hashed into the rules version
(per-run values as placeholders); and `plan_jail` resolves every field from
what it is given.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import tempfile
from typing import TYPE_CHECKING, Any

import msgspec
import msgspec.inspect as mi
import pytest

from support import plan_for
from trunner import Limits, helper
from trunner.jail import HostSupport, ProcessLimit
from trunner.kernel import abi, mounts
from trunner.linux import seccomp
from trunner.linux.backend import PREPARED_KEPT, LinuxBackend, LinuxJail
from trunner.linux.plan import (
    CGROUP,
    HOST_GID,
    HOST_UID,
    JAIL_ID,
    PROC_OPS,
    WORKDIR,
    Bind,
    File,
    HelperPlan,
    HostProc,
    NoCpuCgroup,
    NoMemoryCgroup,
    NoSession,
    Rlimit,
    Scratch,
    UsernsNproc,
    environment,
    hashed_plan,
    ipc_limits_for,
    plain,
)
from trunner.linux.probe import package_dir, probe_host, trunner_dir
from trunner.linux.profile import DEFAULT_PROFILE
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


def _plan_type() -> mi.StructType:
    t = mi.type_info(HelperPlan)
    assert isinstance(t, mi.StructType)
    return t


PLAN_TYPE = _plan_type()
#: The Landlock rules the helper reads as tuples, in the order of their fields.
AS_TUPLES = ("PathRule", "PortRule")


def test_the_helper_reads_exactly_the_plans_fields() -> None:
    assert HelperPlan.__struct_fields__ == abi.PLAN_FIELDS
    assert helper.Plan.__slots__ == abi.PLAN_FIELDS


def _structs(t: mi.Type) -> Iterator[mi.StructType]:
    """Every Struct type in `t`, itself included."""
    if isinstance(t, mi.StructType):
        yield t
        for field in t.fields:
            yield from _structs(field.type)
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield from _structs(member)
    elif isinstance(t, mi.VarTupleType):
        yield from _structs(t.item_type)


ITEMS = sorted({t.cls for t in _structs(PLAN_TYPE) if t.cls is not HelperPlan},
               key=lambda cls: cls.__name__)


def _reader(struct: type[msgspec.Struct]) -> type:
    """The helper's class of `struct`'s name (the root's and /proc's ops: `mounts`)."""
    cls = getattr(helper, struct.__name__, None) or getattr(mounts, struct.__name__)
    assert isinstance(cls, type)
    return cls


@pytest.mark.parametrize("struct", ITEMS, ids=lambda cls: cls.__name__)
def test_each_item_class_has_the_fields_and_tag_of_its_struct(
        struct: type[msgspec.Struct]) -> None:
    """One slots class per kind, pinned to its Struct: a field added or
    renamed on one side fails here. A "none" kind has nothing to read (the
    helper reads None); a Landlock rule is a tuple of its fields."""
    tag = struct.__struct_config__.tag
    if tag == "none" or struct.__name__ in AS_TUPLES:
        assert not hasattr(helper, struct.__name__)
        assert not hasattr(mounts, struct.__name__)
        return
    cls = _reader(struct)
    assert sorted(cls.__dict__["__slots__"]) == sorted(struct.__struct_fields__)
    assert getattr(cls, "TAG", None) == tag


def _as_plain(value: object, t: mi.Type) -> object:
    """What the helper read, back as plain values, guided by the parent's type."""
    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if isinstance(m, mi.StructType)]
        tag = "none" if value is None else getattr(type(value), "TAG", None)
        return _as_plain(value, next(m for m in members if m.cls.__struct_config__.tag == tag))
    if isinstance(t, mi.StructType):
        config = t.cls.__struct_config__
        out: dict[str, object] = {} if config.tag is None else {str(config.tag_field): config.tag}
        if value is None:
            assert config.tag == "none"
            return out
        if t.cls.__name__ in AS_TUPLES:
            assert isinstance(value, tuple)
            return {**out, **dict(zip(t.cls.__struct_fields__, value, strict=True))}
        assert type(value) is _reader(t.cls)
        return {**out, **{f.name: _as_plain(getattr(value, f.name), f.type) for f in t.fields}}
    if isinstance(t, mi.VarTupleType):
        assert isinstance(value, list)
        return [_as_plain(item, t.item_type) for item in value]
    return value


def read_back(read: helper.Plan) -> dict[str, object]:
    """`read`, the helper's `Plan`, as the plain values it was read from."""
    return {f.name: _as_plain(getattr(read, f.name), f.type) for f in PLAN_TYPE.fields}


def _lists(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return [_lists(item) for item in value]
    if isinstance(value, dict):
        return {key: _lists(item) for key, item in value.items()}
    return value


def _example(t: mi.StructType) -> msgspec.Struct:
    """An item of `t` with a value of its type in each field, each another."""
    def value(i: int, name: str, t: mi.Type) -> object:
        if isinstance(t, mi.VarTupleType):
            return (f"/{name}/{i}",)
        # A bool: not its default (True, where one has a default).
        return {mi.StrType: f"/{name}", mi.IntType: 100 + i, mi.BoolType: False}[type(t)]

    item: msgspec.Struct = t.cls(**{f.name: value(i, f.name, f.type)
                                    for i, f in enumerate(t.fields)})
    return item


def _every_kind() -> Iterator[tuple[str, msgspec.Struct]]:
    for field in PLAN_TYPE.fields:
        t = field.type.item_type if isinstance(field.type, mi.VarTupleType) else field.type
        if isinstance(t, mi.UnionType):
            for member in t.types:
                assert isinstance(member, mi.StructType)
                yield field.name, _example(member)


@pytest.mark.parametrize(("field", "item"), list(_every_kind()),
                         ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_every_kind_of_item_reads_back_to_its_plain_values(field: str,
                                                           item: msgspec.Struct) -> None:
    plan = LinuxBackend(locate_worker()).prepared(Limits()).plan
    many = isinstance(getattr(plan, field), tuple)
    plan = msgspec.structs.replace(plan, **{field: (item,) if many else item})
    data = plain(plan)
    read = helper.Plan(data)
    assert read_back(read) == _lists(data)
    got = getattr(read, field)
    assert type(got[0] if many else got).__name__ in (type(item).__name__, "NoneType")


def plan_of(jail: LinuxJail) -> tuple[helper.Plan, list[str]]:
    """The plan and adapter in a jail's helper argv, as the helper reads them."""
    argv = list(jail.command.argv)
    at = argv.index("helper") + 1
    return helper._read_plan([argv[at], "3", *argv[at + 2:]])


async def opened_plan(backend: LinuxBackend, jail_root: Path, limits: Limits,
                      **options: Any) -> tuple[LinuxJail, helper.Plan, list[str]]:
    """A jail of `/bin/true` opened (never started) with `options`, released;
    it and its plan and adapter, as the helper reads them."""
    jail_dir = tempfile.mkdtemp(dir=jail_root)
    jail = backend.open_jail(jail_dir=jail_dir, adapter_argv=("/bin/true",), limits=limits,
                             **options)
    try:
        return (jail, *plan_of(jail))
    finally:
        await jail.release()
        os.rmdir(jail_dir)


@pytest.mark.parametrize("stdio", abi.STDIO_KINDS)
async def test_what_the_helper_reads_is_what_was_hashed(jail_root: Path, stdio: str) -> None:
    backend = LinuxBackend(locate_worker())
    limits = Limits(processes=7)
    jail, read, adapter = await opened_plan(backend, jail_root, limits, stdio=stdio)
    assert adapter == ["/bin/true"]
    seen = read_back(read)
    env = environment(DEFAULT_PROFILE.environment)
    hashed = hashed_plan(seen, backend.host_paths(), env)
    document = backend.rules_document(limits, stdio=stdio)["plan"]
    assert seen["stdio"] == stdio
    # "pipes", the default, is hashed as before the field existed: absent.
    # Likewise "session", a jail of its own.
    fields = {*abi.PLAN_FIELDS} - {"session"} - ({"stdio"} if stdio == "pipes" else set())
    for name in fields:
        assert hashed[name] == document[name], name
    assert set(document) == set(hashed) == fields
    # The per-run values the helper got, and their placeholders.
    assert (document["uid"], document["gid"], document["parent_pid"]) == (HOST_UID, HOST_GID, 0)
    assert seen["parent_pid"] == os.getpid()
    if os.getuid() == 0:
        assert seen["uid"] == seen["gid"] != 0
        assert isinstance(read.process_limit, helper.PidsCgroup)
        assert read.process_limit.cgroup in jail.cgroups
        assert document["process_limit"]["cgroup"] == CGROUP
    else:
        assert (seen["uid"], seen["gid"]) == (os.getuid(), os.getgid())
    assert jail.jail_dir not in repr(seen)
    assert sorted(jail.command.env) == sorted(env)


async def test_a_session_commands_plan_is_what_its_version_hashed(jail_root: Path) -> None:
    """A session's command's plan, as the helper reads it, hashed, is the
    document its rules version is made of (`session=True`): the session's
    pid 1 (per session) reads as the kind alone, the process bounds are
    the ones enforced."""
    from trunner import Runner

    runner = Runner(temp_root=str(jail_root))
    backend = runner.backend
    assert isinstance(backend, LinuxBackend)
    limits = Limits(processes=7)
    async with runner.session(limits=limits) as s:
        assert s._started is not None
        session_jail = s._started.jail
        assert isinstance(session_jail, LinuxJail)
        _, read, _ = await opened_plan(backend, jail_root, limits, session=session_jail)
    seen = read_back(read)
    assert isinstance(read.session, helper.InSession)
    assert (read.session.pid, read.session.start) == session_jail.init
    hashed = hashed_plan(seen, backend.host_paths(), environment(DEFAULT_PROFILE.environment))
    document: dict[str, Any] = backend.rules_document(limits, session=True)["plan"]
    assert hashed == document
    assert document["session"] == {"kind": "session"}
    assert seen["jail_nproc"] in (0, 7 + 3 + 2 * 8)  # 0: a kernel without per-userns counts
    if os.getuid() == 0:
        assert isinstance(read.process_limit, helper.PidsCgroup)
        assert read.process_limit.max == 7 + 2  # its own cgroup: its run's bound


def test_plain_values_keep_every_field_and_its_kind() -> None:
    plan = LinuxBackend(locate_worker()).prepared(Limits()).plan
    data = plain(plan)
    assert tuple(data) == abi.PLAN_FIELDS
    assert data["process_limit"]["kind"] == type(plan.process_limit).__struct_config__.tag
    assert {op["op"] for op in data["root_ops"]} == {
        "scratch", "bind", "dir", "symlink", "file", "host_proc"}


def test_a_backend_keeps_the_plans_of_its_most_recent_limits_only() -> None:
    """A caller that passes new limits on every call (a judge's per-problem
    ones, say) does not grow the backend without bound."""
    backend = LinuxBackend(locate_worker())
    hot, one = backend.prepared(Limits()), backend.prepared(Limits(wall_time_s=1))
    for n in range(2, 3 * PREPARED_KEPT):
        backend.prepared(Limits(wall_time_s=n))
        backend.prepared(Limits(wall_time_s=n), "pty")
        assert backend.prepared(Limits()) is hot  # used on every call: kept
        assert len(backend._prepared) <= PREPARED_KEPT
    again = backend.prepared(Limits(wall_time_s=1))
    assert again is not one  # let go, and made anew
    assert again.version == one.version


def _host() -> HostSupport:
    return HostSupport(platform="linux", is_root=False, uid=1234, gid=5678, landlock_abi=7,
                       seccomp_filter=True, user_namespaces=True, network_namespaces=True,
                       process_limit=ProcessLimit("userns_nproc"), nproc_per_userns=True)


#: What `plan_jail` makes of each field, for `_host()` and these limits.
LIMITS = Limits(processes=5, open_files=99, cpu_time_s=3, scratch_bytes=64 << 20,
                memory_bytes=256 << 20)
CHECKS: dict[str, Any] = {
    "version": lambda v: v == abi.PLAN_VERSION,
    "env": lambda v: v == tuple(sorted(DEFAULT_PROFILE.environment)),
    "process_limit": lambda v: v == UsernsNproc(max=5 + 2),
    "jail_nproc": lambda v: v == 5 + 2,
    "memory": lambda v: v == NoMemoryCgroup(),
    "cpu": lambda v: v == NoCpuCgroup(),
    "rlimits": lambda v: {Rlimit(resource=resource.RLIMIT_NOFILE, soft=99, hard=99),
                          Rlimit(resource=resource.RLIMIT_CPU, soft=4, hard=5),
                          Rlimit(resource=resource.RLIMIT_CORE, soft=0, hard=0)} <= set(v)
    and len(v) == 7,
    "ipc_limits": lambda v: v == ipc_limits_for(LIMITS),
    "build_userns": lambda v: v is True,
    # user, net, mount, pid, uts, cgroup; ipc is the helper's `ipc` step, sized
    "unshare_flags": lambda v: v == sum(f for k, f in abi.NAMESPACE_FLAGS.items() if k != "ipc"),
    "uid": lambda v: v == 1234,
    "gid": lambda v: v == 5678,
    "jail_id": lambda v: v == JAIL_ID,
    "loopback": lambda v: v == abi.LOOPBACK_UP,
    "root_ops": lambda v: (
        v[0] == Scratch(name="work", path=WORKDIR, mode=0o700)
        and Bind(source=package_dir(), path=package_dir()) in v
        and not any(isinstance(op, Bind) and op.source in (trunner_dir(), "/etc", "/proc")
                    for op in v)
        and any(isinstance(op, File) and op.path == "/etc/passwd" for op in v)
        and v[-1] == HostProc(path="/proc")),
    "proc_ops": lambda v: v == PROC_OPS,
    "scratch": lambda v: (v.bytes, v.inodes) == (64 << 20, (64 << 20) // 4096),
    "staging": lambda v: v == "/tmp",
    "hostname": lambda v: v == "trunner",
    "workdir": lambda v: v == WORKDIR,
    "landlock": lambda v: v.abi == 7 and {r.path for r in v.paths} >= {WORKDIR, "/tmp", "/usr"}
    and all(r.dir_access & 0b10 for r in v.paths if r.path in (WORKDIR, "/tmp", "/dev/shm")),
    "parent_pid": lambda v: v == 42,
    # no memory cgroup: memfd_create and landlock_create_ruleset fail ENOSYS
    "seccomp_bpf": lambda v: v == seccomp.build_bpf(
        seccomp.without_memory_cgroup(DEFAULT_PROFILE.seccomp)),
    "waiter_bpf": lambda v: v == seccomp.waiter_bpf() and len(v) < len(seccomp.build_bpf()) // 20,
    "unsafe_skip": lambda v: v == ("seccomp",),
    # Planned as "pipes"; a streaming run's jail names its own (`open_jail`).
    "stdio": lambda v: v == "pipes",
    # Planned as a jail of its own; a session's command's names its session (`open_jail`).
    "session": lambda v: v == NoSession(),
}


def test_plan_jail_resolves_every_field_from_what_it_is_given() -> None:
    assert set(CHECKS) == set(abi.PLAN_FIELDS)
    plan = plan_for(LIMITS, _host(), parent_pid=42, unsafe_skip=("seccomp",))
    assert plan == plan_for(LIMITS, _host(), parent_pid=42, unsafe_skip=("seccomp",))
    wrong = [name for name, check in CHECKS.items() if not check(getattr(plan, name))]
    assert wrong == []


def test_the_plan_reads_no_host_path_of_its_own(tmp_path: Path) -> None:
    """A path the snapshot does not have is not bound, whatever the disk holds."""
    from trunner.linux.plan import plan_jail, profile_paths
    from trunner.linux.probe import snapshot

    there = snapshot(profile_paths(DEFAULT_PROFILE))
    missing = dataclasses.replace(probe_host(), is_root=False, uid=1234, gid=1234,
                                  process_limit=ProcessLimit("userns_nproc"))

    def binds(paths: Any) -> set[str]:
        return {op.path for op in plan_jail(LIMITS, missing, paths, DEFAULT_PROFILE).root_ops
                if isinstance(op, Bind)}

    # A profile path that is bound for itself: not the interpreter's (which is
    # /usr for /usr/bin/python3) nor trunner's.
    own = (*there.python, there.trunner_dir)

    def near(p: str, o: str) -> bool:
        return p == o or p.startswith(o.rstrip("/") + "/") or o.startswith(p.rstrip("/") + "/")

    path = next(p for p in sorted(binds(there)) if p in there.entries
                and not p.startswith("/dev/") and not any(near(p, o) for o in own))
    without = type(there)(python=there.python, package=there.package,
                          trunner_dir=there.trunner_dir,
                          entries={p: e for p, e in there.entries.items() if p != path})
    assert path not in binds(without)


@pytest.mark.parametrize("edit", ["extra", "missing"])
def test_the_helper_refuses_a_plan_of_other_fields(edit: str) -> None:
    import marshal

    data = plain(LinuxBackend(locate_worker()).prepared(Limits()).plan)
    if edit == "extra":
        data["swallow"] = 1
    else:
        del data["unsafe_skip"]
    item = marshal.dumps(data).hex()
    with pytest.raises(helper.SetupError) as info:
        helper._read_plan([item, "3", "--", "/bin/true"])
    assert info.value.step == ("plan: unknown swallow" if edit == "extra" else
                               "plan: missing unsafe_skip")


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """An edit of the plain plan: `value` at `path` ("a.b"); "+" appends."""
    def edit(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        at: Any = data
        for key in parents:
            at = at[int(key)] if isinstance(at, list) else at[key]
        if last == "+":
            at.append(value)
        elif isinstance(at, list):
            at[int(last)] = value
        else:
            at[last] = value
    return edit


@pytest.mark.parametrize(("edit", "refusal"), [
    (_set("process_limit", {"kind": "none", "max": 0}), "process_limit: unknown kind 'none'"),
    (_set("memory", {"kind": "swap"}), "memory: unknown kind 'swap'"),
    (_set("cpu.kind", "cpuset"), "cpu: unknown kind 'cpuset'"),
    (_set("root_ops.+", {"op": "chmod", "path": "/x"}), "root_ops: unknown op 'chmod'"),
    (_set("proc_ops.+", {"op": "unmask", "path": "/x"}), "proc_ops: unknown op 'unmask'"),
    (_set("root_ops.+", {"op": "bind", "source": "/x", "path": "/x"}),
     "root_ops: malformed bind {op: str, source: str, path: str}"),
    (_set("root_ops.+", {"op": "dir", "path": "/x", "mode": 0o755, "owner": 0}),
     "root_ops: malformed dir {op: str, path: str, mode: int, owner: int}"),
    (_set("root_ops.+", {"op": "dir", "path": b"/x", "mode": 0o755}),
     "root_ops: malformed dir {op: str, path: bytes, mode: int}"),
    (_set("rlimits.+", {"resource": "6", "soft": 1, "hard": 1}),
     "rlimits: malformed rlimit {resource: str, soft: int, hard: int}"),
    (_set("ipc_limits.+", ["shmmax", "1"]), "ipc_limits: malformed (list)"),
    (_set("landlock.paths.+", {"path": "/x", "dir_access": 1}),
     "landlock: malformed path rule {abi: int, handled_fs: int, handled_net: int, scoped: int,"
     " paths: list, ports: list}"),
    (_set("scratch", (1, 2)), "scratch: malformed (tuple)"),
    (_set("uid", "1000"), "uid: malformed (str)"),
    (_set("build_userns", 1), "build_userns: malformed (int)"),
    (_set("seccomp_bpf", 12345), "seccomp_bpf: malformed (int)"),
    (_set("waiter_bpf", "bpf"), "waiter_bpf: malformed (str)"),
    (_set("env.+", 1), "env: malformed (int)"),
    (_set("unsafe_skip", ("descriptors",)), "cannot skip descriptors"),
], ids=lambda v: v.split(":")[0] if isinstance(v, str) else None)
def test_a_malformed_plan_is_refused_when_read(edit: Callable[[dict[str, Any]], None],
                                               refusal: str) -> None:
    """Before any step: every item is read into its class once, so a kind
    the helper does not know, a missing or extra field or a value of another
    type refuses the plan, naming the field (and the item's shape)."""
    import marshal

    data = _lists(plain(LinuxBackend(locate_worker()).prepared(Limits()).plan))
    assert isinstance(data, dict)
    edit(data)
    item = marshal.dumps(data).hex()
    with pytest.raises(helper.SetupError) as info:
        helper._read_plan([item, "3", "--", "/bin/true"])
    assert info.value.step == f"plan: {refusal}"


def _layout(tmp_path: Path, *, wheel: bool) -> Any:
    """Host paths of one venv at tmp_path/venv, with trunner in its
    site-packages (a wheel) or in a checkout beside it (editable)."""
    from trunner.linux.plan import profile_paths
    from trunner.linux.probe import HostPaths, PathEntry, snapshot

    there = snapshot(profile_paths(DEFAULT_PROFILE))
    venv = str(tmp_path / "venv")
    top = f"{venv}/lib/python3/site-packages" if wheel else str(tmp_path / "checkout")
    dirs = {venv, top, f"{top}/trunner"}
    entries = {p: e for p, e in there.entries.items()
               if not any(p == o or p.startswith(o + "/") for o in there.python)}
    return HostPaths(python=(venv,), package=f"{top}/trunner", trunner_dir=top,
                     entries={**entries, **{d: PathEntry(kind="dir") for d in dirs}})


def test_a_wheel_in_a_venv_has_an_editable_checkouts_rules(tmp_path: Path) -> None:
    """The package is a bind of its own inside the interpreter's prefix too,
    so where trunner is installed does not change the rules version."""
    from trunner.linux.plan import plan_jail

    host = dataclasses.replace(probe_host(), is_root=False, uid=1234, gid=1234,
                               process_limit=ProcessLimit("userns_nproc"))
    hashed = []
    for wheel in (True, False):
        paths = _layout(tmp_path, wheel=wheel)
        plan = plan_jail(LIMITS, host, paths, DEFAULT_PROFILE)
        binds = [op.path for op in plan.root_ops if isinstance(op, Bind)]
        assert paths.package in binds
        assert paths.python[0] in binds
        hashed.append(hashed_plan(plain(plan), paths, {}))
    assert hashed[0] == hashed[1]


def test_msgspec_outside_the_interpreters_paths_is_bound_beside_the_package(
        tmp_path: Path) -> None:
    """A `--target` layout: what a user mode's adapter imports is bound too."""
    import msgspec as msgspec_struct

    from trunner.linux.plan import plan_jail
    from trunner.linux.probe import PathEntry, beside_dirs

    assert beside_dirs(()) != ()  # msgspec is importable here, outside no path
    inside = beside_dirs(("/",))
    assert inside == ()
    host = dataclasses.replace(probe_host(), is_root=False, uid=1234, gid=1234,
                               process_limit=ProcessLimit("userns_nproc"))
    paths = _layout(tmp_path, wheel=False)
    msgspec = f"{paths.trunner_dir}/msgspec"
    paths = msgspec_struct.structs.replace(
        paths, beside=(msgspec,), entries={**paths.entries, msgspec: PathEntry(kind="dir")})
    plan = plan_jail(LIMITS, host, paths, DEFAULT_PROFILE)
    assert msgspec in [op.path for op in plan.root_ops if isinstance(op, Bind)]
