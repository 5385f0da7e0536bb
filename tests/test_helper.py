"""The helper's plan: every layer mandatory, every failure closed and reported
on a channel the adapter cannot write. Real helpers on the real kernel; the
plans are built by the real backend and then broken on purpose: each step is
refused by planting an item the kernel (or the step's own check) refuses,
never by a hook in the plan."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import marshal
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from conftest import child_pids
from support import plan_for, scaled
from trunner import Limits, Reason, Runner, RunnerError, helper
from trunner.helper import PROCESS_COUNT_EXIT, SANDBOX_SETUP_EXIT
from trunner.jail import HostSupport
from trunner.kernel import abi
from trunner.linux.backend import LinuxBackend, LinuxJail
from trunner.linux.plan import (
    Bind,
    CpuCgroup,
    Devpts,
    HelperPlan,
    InSession,
    MemoryCgroup,
    PathRule,
    PidsCgroup,
    Rlimit,
    RlimitNproc,
    Sysctl,
)
from trunner.linux.probe import probe_host
from trunner.linux.profile import DEFAULT_PROFILE
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from collections.abc import Callable


class PlanEditing(LinuxBackend):
    """The real backend, with its helper plan edited before it is encoded."""

    edit: Callable[[HelperPlan], HelperPlan] = staticmethod(lambda plan: plan)

    def _plan_for_run(
        self, limits: Limits, cgroup_dir: str | None, memory_dir: str | None,
        host_id: int | None, cpu_dir: str | None = None, view_dirs: tuple[str, ...] = (),
    ) -> HelperPlan:
        return type(self).edit(super()._plan_for_run(limits, cgroup_dir, memory_dir, host_id,
                                                     cpu_dir, view_dirs))


class ArgvEditing(LinuxBackend):
    """The real backend, with the encoded plan item replaced."""

    item: Callable[[str], str] = staticmethod(lambda item: item)

    def open_jail(self, **kw: Any) -> LinuxJail:
        jail = super().open_jail(**kw)
        argv = list(jail.command.argv)
        i = argv.index("helper") + 1
        argv[i] = type(self).item(argv[i])
        return dataclasses.replace(jail, command=dataclasses.replace(jail.command,
                                                                     argv=tuple(argv)))


def runner_on(jail_root: Path, backend: LinuxBackend) -> Runner:
    return Runner(temp_root=str(jail_root), backend=backend)


async def refusal(runner: Runner) -> RunnerError:
    with pytest.raises(RunnerError) as info:
        await runner.run("echo", 1)
    assert child_pids() == []
    return info.value


def _edited(**changes: Any) -> type[PlanEditing]:
    return type("Edited", (PlanEditing,), {
        "edit": staticmethod(lambda plan: msgspec.structs.replace(plan, **changes))})


# -- each step refused, by an item it cannot apply --------------------------------

#: Not a directory anywhere (the host's, the jail's).
MISSING = "/nonexistent/trunner-test"
#: An RLIMIT_NPROC hard limit any caller may set (lowering is always allowed):
#: the one the helper inherits, or 2**20 where there is none.
_NPROC = min(resource.getrlimit(resource.RLIMIT_NPROC)[1] & ((1 << 63) - 1), 1 << 20)


def _nproc_above_its_hard_limit(plan: HelperPlan) -> HelperPlan:
    """The jail's RLIMIT_NPROC above the hard limit the plan's own rlimits set:
    only CAP_SYS_RESOURCE in the host's namespace may raise one, and the jail's
    user namespace gives none there."""
    return msgspec.structs.replace(
        plan, rlimits=(*plan.rlimits, Rlimit(resource=resource.RLIMIT_NPROC, soft=_NPROC,
                                             hard=_NPROC)),
        jail_nproc=_NPROC + 1)


def _with(**changes: Callable[[HelperPlan], object]) -> Callable[[HelperPlan], HelperPlan]:
    return lambda plan: msgspec.structs.replace(
        plan, **{name: change(plan) for name, change in changes.items()})


#: For each step of the helper's chain: a plan item it refuses, and the start of
#: its refusal. In the helper: the cgroups, limits and namespaces; in pid 2
#: (after the fork), proc, landlock and seccomp.
REFUSALS: dict[str, tuple[Callable[[HelperPlan], HelperPlan], str]] = {
    # The jail's environment (the backend's) has names the plan does not allow.
    "env": (_with(env=lambda _: ()), "env: unexpected variables "),
    # A cgroup that is not there: its limit file cannot be written.
    "process_limit": (_with(process_limit=lambda _: PidsCgroup(cgroup=MISSING, max=32)),
                      f"process_limit: {MISSING}/pids.max: No such file or directory"
                      " (errno 2)"),
    "memory": (_with(memory=lambda _: MemoryCgroup(cgroup=MISSING, bytes=64 << 20,
                                                   socket_bytes=64 << 20)),
               f"memory: {MISSING}/{abi.PROG_CGROUP}/memory.limit_in_bytes: No such file"),
    "cpu": (_with(cpu=lambda _: CpuCgroup(cgroup=MISSING)),
            f"cpu: {MISSING}/{abi.PROG_CGROUP}/cpuacct.usage: No such file"),
    # No such resource.
    "rlimits": (_with(rlimits=lambda p: (*p.rlimits, Rlimit(resource=999, soft=0, hard=0))),
                "rlimits: setrlimit(999, 0, 0): Invalid argument"),
    # A host uid the kernel cannot map (-1 is no id).
    "build_namespace": (_with(build_userns=lambda _: True, uid=lambda _: -1),
                        "build_namespace: /proc/self/uid_map: Invalid argument"),
    # No such sysctl in the IPC namespace (as root written by the helper, else
    # by its child in a user namespace, which reports the exception).
    "ipc": (_with(ipc_limits=lambda p: (*p.ipc_limits, Sysctl(name="no_such_sysctl", value="1"))),
            "ipc: "),
    "root": (_with(root_ops=lambda p: (*p.root_ops, Bind(source=MISSING, path=MISSING))),
             f"root: bind({MISSING}): No such file or directory"),
    # Host uid 0: never a jail's.
    "identity": (_with(uid=lambda _: 0, gid=lambda _: 0),
                 "identity: a jail never runs as host uid or gid 0"),
    # CLONE_PARENT is no namespace: unshare refuses it.
    "namespaces": (_with(unshare_flags=lambda p: p.unshare_flags | 0x8000),
                   "namespaces: unshare: Invalid argument"),
    # A session's pid 1 by a start time it never had: a reused pid is refused.
    "session": (_with(session=lambda _: InSession(pid=os.getpid(), start=0)),
                "session: the session's pid 1 is gone"),
    "loopback": (_with(loopback=lambda _: "down"),
                 "loopback: 'down' does not fit the plan's namespaces"),
    "jail_processes": (_nproc_above_its_hard_limit,
                       f"jail_processes: setrlimit({resource.RLIMIT_NPROC}, {_NPROC + 1},"
                       f" {_NPROC + 1}): Operation not permitted"),
    # A plan never given its run's values (`plan.for_run`): no parent pid.
    "parent_death": (_with(parent_pid=lambda _: 0),
                     "parent_death: the parent exited before the signal was armed"),
    # The jail's RLIMIT_NPROC of 1: the helper itself, so it cannot fork pid 1.
    "pid_namespace": (_with(jail_nproc=lambda _: 1),
                      "pid_namespace: Resource temporarily unavailable"),
    "proc": (_with(proc_ops=lambda p: (*p.proc_ops, Devpts(path=MISSING, ptmx_mode=0o666,
                                                           mode=0o620, max=1))),
             f"proc: mount({MISSING}): No such file or directory"),
    "landlock": (_with(landlock=lambda p: msgspec.structs.replace(p.landlock, paths=(
        *p.landlock.paths, PathRule(path=MISSING, dir_access=abi.ACCESS_FS_READ_FILE,
                                    file_access=abi.ACCESS_FS_READ_FILE)))),
                 f"landlock: landlock_add_rule({MISSING}): No such file or directory"),
    # One instruction, and no return: the kernel refuses the program.
    "seccomp": (_with(seccomp_bpf=lambda _: bytes(8)),
                "seccomp: seccomp(SECCOMP_SET_MODE_FILTER): Invalid argument"),
}
#: Steps no plan item can make fail: they read nothing from the plan (the
#: waiter's path is the install's; the capabilities dropped are all of them;
#: the descriptors are the spawn's; NO_NEW_PRIVS cannot be refused).
NO_PLAN_ITEM = ("waiter", "capabilities", "descriptors", "no_new_privs")


def test_every_step_is_refused_by_an_item_or_reads_none() -> None:
    """Each step of the helper's chain (its `steps` list) has its refusal
    above, or is named as one that reads nothing from the plan: a new step
    must say which."""
    tree = ast.parse(inspect.getsource(helper))
    steps = next(node.value for node in ast.walk(tree)
                 if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                 and node.target.id == "steps")
    own = next(node for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and node.name == "_own_jail")
    assert isinstance(steps, ast.List)
    # A jail of its own's steps 5-8b (`_own_jail`), or a session's command's.
    names = [ast.literal_eval(node.elts[0]) for lists in (steps, own) for node in ast.walk(lists)
             if isinstance(node, ast.Tuple) and node.elts
             and isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str)]
    # rlimits: in both (a jail of its own sets them after its root).
    assert sorted(names) == sorted([*REFUSALS, *NO_PLAN_ITEM, "rlimits"])


@pytest.mark.parametrize("step", [
    pytest.param(step, marks=pytest.mark.skipif(
        step == "identity" and os.getuid() != 0,
        reason="not root: the build namespace maps the plan's ids, so any other host id is"
        " refused there, before the identity step"))
    for step in REFUSALS])
async def test_each_setup_step_fails_closed(jail_root: Path, step: str) -> None:
    edit, detail = REFUSALS[step]
    backend = type("Edited", (PlanEditing,), {"edit": staticmethod(edit)})(locate_worker())
    e = await refusal(runner_on(jail_root, backend))
    assert (e.reason, e.exit_status) == (Reason.SANDBOX_SETUP, SANDBOX_SETUP_EXIT), e.detail
    assert e.detail.startswith(detail), e.detail
    if step == "ipc":
        assert "no_such_sysctl" in e.detail


#: Runs the helper (argv[1:]) in a mount namespace of its own (in a user
#: namespace of its own: anyone may) with a tmpfs over /proc: no process shows.
EMPTY_PROC = """
import posix, sys
sys.path.insert(0, sys.argv[sys.argv.index("--path") + 1])
from trunner.kernel import abi, install, mounts
install.unshare(abi.CLONE_NEWUSER | abi.CLONE_NEWNS)
mounts.mount("", "/", "", abi.MS_REC | abi.MS_PRIVATE)
mounts.mount("tmpfs", "/proc", "tmpfs", abi.MS_NOSUID | abi.MS_NODEV)
posix.execv(sys.argv[1], sys.argv[1:])
"""


class EmptyProc(PlanEditing):
    """The real backend, its process limit RLIMIT_NPROC (the uid's tasks counted
    in /proc), its helper seeing an empty /proc."""

    edit = staticmethod(_with(process_limit=lambda _: RlimitNproc(max=32)))

    def open_jail(self, **kw: Any) -> LinuxJail:
        jail = super().open_jail(**kw)
        argv = jail.command.argv
        wrapped = (argv[0], "-I", "-S", "-c", EMPTY_PROC, *argv)
        return dataclasses.replace(jail, command=dataclasses.replace(jail.command, argv=wrapped))


async def test_process_count_failure_is_its_own_reason(jail_root: Path) -> None:
    """The uid's tasks cannot be counted where /proc shows none (the helper
    itself, at least, would show): `process_count`, its own exit code."""
    e = await refusal(runner_on(jail_root, EmptyProc(locate_worker())))
    assert e.reason is Reason.PROCESS_COUNT
    assert e.exit_status == PROCESS_COUNT_EXIT
    assert e.detail == "process_count: own process not found in /proc"


# -- more real failures --------------------------------------------------------


async def test_rlimit_above_the_hard_limit_is_refused(jail_root: Path) -> None:
    import resource

    backend = _edited(rlimits=(Rlimit(resource=resource.RLIMIT_NOFILE, soft=64, hard=32),))(
        locate_worker())
    e = await refusal(runner_on(jail_root, backend))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail.startswith(f"rlimits: setrlimit({resource.RLIMIT_NOFILE}, 64, 32)")


async def test_rlimit_above_the_kernel_maximum_is_refused(jail_root: Path) -> None:
    import resource

    nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
    too_many = nr_open + 1
    backend = _edited(rlimits=(Rlimit(resource=resource.RLIMIT_NOFILE, soft=too_many,
                                      hard=too_many),))(locate_worker())
    e = await refusal(runner_on(jail_root, backend))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail.startswith(f"rlimits: setrlimit({resource.RLIMIT_NOFILE}, {too_many}")


async def test_a_landlock_path_that_vanished_fails_closed(jail_root: Path, tmp_path: Path) -> None:
    modes = tmp_path / "modes"
    modes.mkdir()
    runner = Runner(temp_root=str(jail_root), import_paths=[str(modes)])
    modes.rmdir()
    e = await refusal(runner)
    assert e.reason is Reason.SANDBOX_SETUP
    # Its bind into the jail's root fails first (Landlock would, on top).
    assert e.detail.startswith(f"root: bind({modes}): No such file or directory")


@pytest.mark.parametrize(("loopback", "own_network"), [("host", True), ("up", False),
                                                       ("down", True)])
async def test_a_loopback_that_does_not_fit_the_namespaces_is_refused(
    jail_root: Path, loopback: str, own_network: bool
) -> None:
    """The run's lo is brought up only in a network namespace of its own (never
    the host's), and a jail with one of its own always has it up: anything
    else is refused, naming the step."""
    def edit(plan: HelperPlan) -> HelperPlan:
        flags = plan.unshare_flags if own_network else plan.unshare_flags & ~abi.CLONE_NEWNET
        return msgspec.structs.replace(plan, loopback=loopback, unshare_flags=flags)

    cls = type("Edited", (PlanEditing,), {"edit": staticmethod(edit)})
    backend: LinuxBackend = cls(locate_worker())
    e = await refusal(runner_on(jail_root, backend))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail == (f"loopback: {loopback!r} does not fit the plan's namespaces "
                        f"(network namespace of its own: {own_network})")


async def test_an_unknown_process_limit_mechanism_is_refused(jail_root: Path) -> None:
    """Refused as the plan is read, before any step (tests/test_plan.py: every
    malformed item); the run fails `sandbox_setup` all the same."""
    backend = _edited(process_limit={"kind": "none", "max": 0})(locate_worker())
    e = await refusal(runner_on(jail_root, backend))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail == "plan: process_limit: unknown kind 'none'"


# -- corrupt plans -----------------------------------------------------------


def _argv_edited(fn: Callable[[str], str]) -> LinuxBackend:
    cls = type("Edited", (ArgvEditing,), {"item": staticmethod(fn)})
    backend: LinuxBackend = cls(locate_worker())
    return backend


def _drop(key: str) -> Callable[[str], str]:
    def edit(item: str) -> str:
        plan = marshal.loads(bytes.fromhex(item))
        del plan[key]
        return marshal.dumps(plan).hex()
    return edit


@pytest.mark.parametrize("key", ["landlock", "seccomp_bpf", "waiter_bpf", "unshare_flags",
                                 "process_limit", "rlimits", "parent_pid", "env", "unsafe_skip",
                                 "root_ops",
                                 "proc_ops", "scratch", "staging", "hostname", "workdir",
                                 "build_userns", "uid", "gid", "jail_nproc", "memory",
                                 "ipc_limits"])
async def test_a_plan_without_a_layer_is_refused_not_skipped(jail_root: Path, key: str) -> None:
    e = await refusal(runner_on(jail_root, _argv_edited(_drop(key))))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail == f"plan: missing {key}"


@pytest.mark.parametrize(("item", "detail"), [
    ("zz", "plan: not a plan"),
    ("", "plan: not a plan"),
    (marshal.dumps([1, 2]).hex(), f"plan: not a plan of version {abi.PLAN_VERSION}"),
    (marshal.dumps({"version": 1}).hex(), f"plan: not a plan of version {abi.PLAN_VERSION}"),
])
async def test_a_corrupt_plan_fails_closed(jail_root: Path, item: str, detail: str) -> None:
    e = await refusal(runner_on(jail_root, _argv_edited(lambda _: item)))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail.startswith(detail)


@pytest.mark.parametrize("key", ["seccomp_bpf", "waiter_bpf"])
async def test_a_wrongly_typed_plan_item_fails_closed(jail_root: Path, key: str) -> None:
    def edit(item: str) -> str:
        plan = marshal.loads(bytes.fromhex(item))
        plan[key] = 12345
        return marshal.dumps(plan).hex()
    e = await refusal(runner_on(jail_root, _argv_edited(edit)))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail == f"plan: {key}: malformed (int)"


async def test_skipping_is_only_for_named_layers(jail_root: Path) -> None:
    def edit(item: str) -> str:
        plan = marshal.loads(bytes.fromhex(item))
        plan["unsafe_skip"] = ["descriptors"]
        return marshal.dumps(plan).hex()
    e = await refusal(runner_on(jail_root, _argv_edited(edit)))
    assert e.detail == "plan: cannot skip descriptors"
    with pytest.raises(ValueError, match="cannot skip"):
        LinuxBackend(locate_worker(), unsafe_skip=("env",)).rules_document(Limits())


def test_a_skipped_layer_changes_the_rules_version() -> None:
    worker = locate_worker()
    full = Runner(backend=LinuxBackend(worker)).rules_version()
    skipped = Runner(backend=LinuxBackend(worker, unsafe_skip=("seccomp",))).rules_version()
    assert full != skipped


def test_a_plan_without_a_required_namespace_is_refused() -> None:
    # (tests/test_plan.py checks every field plan_jail resolves.)
    host = HostSupport(platform="linux", is_root=False, uid=1000, gid=1000, landlock_abi=7,
                       seccomp_filter=True, user_namespaces=True, network_namespaces=True,
                       process_limit=probe_host().process_limit)
    for name in ("user", "mount", "pid", "ipc", "uts", "cgroup"):
        without = msgspec.structs.replace(
            DEFAULT_PROFILE, namespaces=tuple(n for n in DEFAULT_PROFILE.namespaces if n != name))
        with pytest.raises(ValueError, match=f"own {name} namespace"):
            plan_for(Limits(), host, without)


# -- the report channel ----------------------------------------------------------


async def test_a_forged_refusal_is_an_ordinary_exit(runner: Runner) -> None:
    code = ("import os, sys; sys.stderr.write('trunner-helper: env: forged\\n');"
            " sys.stderr.flush(); os._exit(121)")
    with pytest.raises(RunnerError) as info:
        await runner.run("children:run_code", code)
    assert info.value.reason is Reason.NONZERO_EXIT
    assert info.value.exit_status == SANDBOX_SETUP_EXIT
    assert "forged" in info.value.detail  # quoted from stderr, not believed


async def test_the_adapter_does_not_hold_the_report_pipe(runner: Runner) -> None:
    # 0-2, and the response pipe the adapter moved off fd 1 (run_code put it back on 1).
    code = ("import os, stat\nfrom trunner.worker.adapters import reply_fd\nresult = []\n"
            "for fd in range(64):\n    try:\n"
            "        if stat.S_ISFIFO(os.fstat(fd).st_mode): result.append(fd)\n"
            "    except OSError: pass\nresult = [result, reply_fd()]\n")
    pipes, reply = (await runner.run("children:run_code", code)).response
    assert pipes == sorted({0, 1, 2, reply})


@pytest.mark.parametrize(("sig", "name"), [(40, "SIGRTMIN+6"), (signal.SIGUSR1, "SIGUSR1")])
async def test_every_signal_death_is_killed_by_signal(runner: Runner, sig: int, name: str) -> None:
    with pytest.raises(RunnerError) as info:
        await runner.run("children:frame_then_signal", sig)
    assert info.value.reason is Reason.KILLED_BY_SIGNAL
    assert info.value.signal == sig
    assert info.value.detail.startswith(f"killed by {name}")


# -- the probe only reads ----------------------------------------------------------------


def test_the_probe_changes_nothing_on_the_host() -> None:
    """`trunner doctor`'s probe, under an audit hook that records every open
    for writing, mkdir, rmdir and rename the process makes."""
    code = (
        "import sys\n"
        "seen = []\n"
        "def hook(event, args):\n"
        "    if event == 'open' and args[0] == '/dev/null':\n"
        "        return\n"
        "    if event == 'open' and args[1] is not None"
        " and any(c in str(args[1]) for c in 'wax+'):\n"
        "        seen.append((event, args[0]))\n"
        "    elif event == 'open' and isinstance(args[2], int) and args[2] & 3:\n"
        "        seen.append((event, args[0]))\n"
        "    elif event in ('os.mkdir', 'os.rmdir', 'os.rename', 'os.remove', 'os.chmod'):\n"
        "        seen.append((event, args[0]))\n"
        "sys.addaudithook(hook)\n"
        "from trunner.linux.probe import probe_host\n"
        "host = probe_host()\n"
        "print(host.can_run, seen)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=scaled(60), cwd="/")
    assert out.returncode == 0, out.stderr
    # /dev/null: subprocess's stdio for the ldconfig run pyseccomp does.
    assert out.stdout.strip() == "True []", out.stdout



async def test_only_runner_errors_leave_run(runner: Runner) -> None:
    """A type msgspec cannot decode into fails inside the verdict, after the
    child ran: still a RunnerError, with the cause chained, nothing left."""
    with pytest.raises(RunnerError) as info:
        await runner.run("echo", 1, response_type=open)  # type: ignore[call-overload]
    assert info.value.reason is Reason.INTERNAL_ERROR
    assert isinstance(info.value.__cause__, TypeError)
    assert child_pids() == []


# A parent whose hard NOFILE limit is below Limits.open_files and that may not raise it.
RLIMIT_PARENT = """
import resource, trio
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from trunner import Limits, Runner, RunnerError
async def main():
    runner = Runner(temp_root={root!r}, limits=Limits(open_files=256))
    try:
        await runner.run("echo", 1)
    except RunnerError as e:
        print(e.reason, e.exit_status, e.detail, sep="\\n")
    else:
        print("ran")
trio.run(main)
"""


def test_an_rlimit_above_the_inherited_hard_limit_fails_closed(jail_root: Path) -> None:
    """A real rlimit-step failure from an ordinary Runner: without
    CAP_SYS_RESOURCE the helper cannot raise the hard NOFILE limit it
    inherited to open_files."""
    import resource
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv on this host")
    out = subprocess.run(
        ["setpriv", "--inh-caps=-sys_resource", "--bounding-set=-sys_resource", "--",
         sys.executable, "-c", RLIMIT_PARENT.format(root=str(jail_root))],
        capture_output=True, text=True, timeout=scaled(60),
    )
    assert out.returncode == 0, out.stderr
    reason, exit_status, detail = out.stdout.splitlines()
    assert (reason, int(exit_status)) == (Reason.SANDBOX_SETUP, SANDBOX_SETUP_EXIT)
    assert detail.startswith(f"rlimits: setrlimit({resource.RLIMIT_NOFILE}, 256, 256)"), detail
    assert list(jail_root.iterdir()) == []


def test_landlock_below_the_minimum_abi_is_refused_before_spawn(jail_root: Path) -> None:
    from trunner.linux.landlock import MIN_ABI

    with pytest.raises(RunnerError) as info:
        runner_on(jail_root, LinuxBackend(locate_worker(), landlock_abi=MIN_ABI - 1))
    assert info.value.reason is Reason.SANDBOX_SETUP
    assert f"ABI {MIN_ABI - 1} is below the required {MIN_ABI}" in info.value.detail
    assert child_pids() == []
