"""The jail's own world: mount, PID, IPC and UTS namespaces, a minimal root
pivoted into, a size-capped scratch. Each escape test runs a real jailed
child and asserts the errno and the missing side effect on the host."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trio
from test_helper import PlanEditing, refusal, runner_on

from conftest import TESTS_DIR, landlock_abi_in_force
from support import (
    PRELUDE,
    READY,
    denied,
    jail_ready,
    jailed_under,
    let_go,
    pid_namespace_members,
    run_code,
    wait_until,
)
from trunner import Limits, Reason, Runner
from trunner.limits import MiB
from trunner.linux.plan import WORKDIR, Bind, HelperPlan
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from collections.abc import Callable


# -- /proc and the PID namespace ------------------------------------------------


async def test_proc_lists_only_the_jails_processes(runner: Runner) -> None:
    result = await run_code(runner, """
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.read(r, 1)
            os._exit(0)
        result = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                  "me": os.getpid(), "child": child, "parent": os.getppid()}
        os.write(w, b"x")
        os.waitpid(child, 0)
    """)
    # pid 1 is the jail's reaper (and the adapter's parent), 2 the adapter.
    assert result == {"pids": [1, 2, result["child"]], "me": 2, "child": result["child"],
                      "parent": 1}
    assert str(os.getpid()) not in map(str, result["pids"]) or os.getpid() <= 3


async def test_the_hosts_proc_under_the_jails_is_out_of_reach(runner: Runner) -> None:
    """The helper wrote its id maps through a bind of the host's /proc, which
    pid 2's fresh /proc covers: it cannot be unmounted to reach host pids."""
    me = os.getpid()
    result = await run_code(runner, f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def umount(flags):
            if libc.umount2(b"/proc", flags) != 0:
                raise OSError(ctypes.get_errno(), "umount2")
        result = [attempt(lambda: umount(0)), attempt(lambda: umount(2)),
                  attempt(lambda: os.stat("/proc/{me}")),
                  sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:2]]
    """)
    assert result[:2] == ["EPERM", "EPERM"]
    assert result[2:] == ["ENOENT", [1, 2]]


async def test_two_concurrent_runs_see_nothing_of_each_other(
    runner: Runner, jail_root: Path
) -> None:
    """Each run leaves a file in its working dir, /tmp and /dev/shm, then waits
    until the test saw both; neither sees the other's files or processes."""
    code = """
        import time
        for where in (".", "/tmp", "/dev/shm"):
            open(f"{where}/TAG", "w").write("TAG")
        while not os.path.exists("go"):
            time.sleep(0.005)
        result = {"files": sorted(os.listdir(".")) + sorted(os.listdir("/tmp"))
                  + sorted(os.listdir("/dev/shm")),
                  "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                  "ns": os.readlink("/proc/self/ns/pid")}
    """
    seen: dict[str, Any] = {}

    async def one(tag: str) -> None:
        seen[tag] = await run_code(runner, code.replace("TAG", tag))

    def both_ready() -> list[int] | None:
        ready = [p for p in jailed_under(str(jail_root))
                 for tag in ("alpha", "beta") if os.path.exists(f"/proc/{p}/cwd/{tag}")]
        return ready if len(ready) == 2 else None

    async def release_both() -> None:
        for pid in await wait_until(both_ready, 30, "both runs' files"):
            Path(f"/proc/{pid}/cwd/go").touch()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "alpha")
        nursery.start_soon(one, "beta")
        nursery.start_soon(release_both)
    for tag, other in (("alpha", "beta"), ("beta", "alpha")):
        assert tag in seen[tag]["files"]
        assert other not in seen[tag]["files"]
        assert seen[tag]["pids"] == [1, 2]
    assert seen["alpha"]["ns"] != seen["beta"]["ns"]


async def test_no_host_process_is_visible_or_signalable(runner: Runner) -> None:
    me = os.getpid()
    result = await run_code(runner, f"""
        result = [attempt(lambda: os.stat("/proc/{me}")),
                  attempt(lambda: os.kill({me}, 0)),
                  attempt(lambda: os.kill(1, 9))]
    """)
    assert result[:2] == ["ENOENT", "ESRCH"]
    # kill(1, SIGKILL) from inside: pid 1, the jail's reaper, is outside the
    # worker's Landlock domain, so from ABI 6 the signal scope refuses it;
    # below, it is delivered and the kernel drops it (a PID namespace's init
    # takes from inside only the signals it handles).
    assert result[2] == ("EPERM" if landlock_abi_in_force() >= 6 else "OK:None")


@pytest.mark.parametrize("path", ["/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches",
                                  "/proc/sys/kernel/core_pattern"])
async def test_writes_to_proc_sys_fail(runner: Runner, path: str) -> None:
    before = os.stat(path).st_mtime_ns
    result = await run_code(runner, f"result = attempt(lambda: open({path!r}, 'w').write('1'))")
    assert result in ("EROFS", "EACCES")
    assert os.stat(path).st_mtime_ns == before


async def test_masked_proc_entries_show_nothing(runner: Runner, tmp_path: Path) -> None:
    # A lock the host holds, which the jail's /proc/locks would list (issue 33).
    import fcntl

    def head(path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 100)
        finally:
            os.close(fd)

    held = os.open(tmp_path / "held", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = await run_code(runner, """
            out = {}
            for p in ("/proc/keys", "/proc/timer_list", "/proc/interrupts", "/proc/kcore",
                      "/proc/locks", "/proc/sys/kernel/random/boot_id"):
                out[p] = attempt(lambda: open(p, "rb").read(100))
            result = out
        """)
        assert head("/proc/locks")  # the host's is not empty
    finally:
        os.close(held)
    assert len(head("/proc/sys/kernel/random/boot_id").strip()) == 36  # a UUID on the host
    for path, got in result.items():
        assert got in ("OK:b''", "ENOENT", "EACCES"), (path, got)


async def test_the_jail_is_gone_when_run_returns(runner: Runner) -> None:
    """A double fork (an orphan of pid 1) and a plain child left running: the
    kernel kills them when the namespace's pid 1 ends."""
    ns = await run_code(runner, """
        if os.fork() == 0:
            if os.fork() == 0:
                import time
                time.sleep(1000)
            os._exit(0)
        if os.fork() == 0:
            import time
            time.sleep(1000)
        os.wait()
        result = os.readlink("/proc/self/ns/pid")
    """)
    assert ns.startswith("pid:[")
    assert ns != os.readlink("/proc/self/ns/pid")
    assert pid_namespace_members(ns) == []


# -- the root -------------------------------------------------------------------


async def test_the_host_tree_is_not_reachable(runner: Runner, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host")
    result = await run_code(runner, f"""
        p = {str(secret)!r}
        result = [attempt(lambda: open(p).read()),
                  attempt(lambda: open("/proc/self/root" + p).read()),
                  attempt(lambda: open("/proc/1/root" + p).read()),
                  attempt(lambda: os.stat("/oldroot")),
                  attempt(lambda: os.stat("/newroot")),
                  attempt(lambda: open("/etc/shadow").read()),
                  attempt(lambda: os.stat("/root/.ssh")),
                  attempt(lambda: os.stat("/sys/kernel")),
                  attempt(lambda: os.stat("/var"))]
    """)
    assert result[:2] == ["ENOENT", "ENOENT"]
    assert result[2] in ("ENOENT", "EACCES")  # pid 1's root: the same tree, ptrace-scoped
    assert result[3:] == ["ENOENT"] * 6


async def test_etc_holds_the_short_list_and_the_jails_identity(runner: Runner) -> None:
    result = await run_code(runner, """
        import pwd, grp, socket
        me = pwd.getpwuid(os.getuid())
        result = {"etc": sorted(os.listdir("/etc")), "passwd": open("/etc/passwd").read(),
                  "home": me.pw_dir, "group": grp.getgrgid(os.getgid()).gr_gid,
                  "hostname": socket.gethostname(), "hosts": open("/etc/hosts").read()}
    """)
    assert {"passwd", "group", "hosts", "hostname"} <= set(result["etc"])
    assert not {"shadow", "gshadow", "ssh", "sudoers", "machine-id"} & set(result["etc"])
    users = [line.split(":")[0] for line in result["passwd"].splitlines()]
    assert len(users) <= 2
    assert set(users) <= {"root", "trunner", "nobody"}
    assert result["home"] == WORKDIR
    assert result["hostname"] == "trunner"
    assert "localhost" in result["hosts"]


@pytest.mark.parametrize(("call", "name"), [
    ("libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)", "mount"),
    ("libc.umount2(b'/usr', 2)", "umount2"),
    ("libc.syscall(155, b'/tmp', b'/tmp')", "pivot_root"),
])
async def test_mount_umount_and_pivot_root_are_denied(runner: Runner, call: str, name: str) -> None:
    """EPERM from the filter (it is the kernel's answer too: the jail has no
    capabilities), and the jail's mounts are as they were."""
    result = await run_code(runner, f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        before = open("/proc/self/mountinfo").read()
        rc = {call}
        result = [rc, errno.errorcode[ctypes.get_errno()],
                  open("/proc/self/mountinfo").read() == before]
    """)
    assert result == [-1, "EPERM", True], name


async def test_binds_are_read_only_and_device_free(runner: Runner) -> None:
    result = await run_code(runner, """
        result = [attempt(lambda: open("/usr/trunner-probe", "w")),
                  attempt(lambda: os.mkdir("/etc/x")),
                  attempt(lambda: open("/etc/passwd", "a")),
                  attempt(lambda: os.mkdir("/x"))]
    """)
    assert all(r in ("EROFS", "EACCES") for r in result), result
    assert not os.path.exists("/usr/trunner-probe")


async def test_no_part_of_the_checkout_but_the_package(runner: Runner) -> None:
    root = Path(__file__).resolve().parent.parent
    result = await run_code(runner, f"""
        r = {str(root)!r}
        result = [attempt(lambda: os.stat(r + "/pyproject.toml")),
                  attempt(lambda: os.stat(r + "/.git")),
                  attempt(lambda: os.stat(r + "/trunner/helper.py") and 1)]
    """)
    assert result[:2] == ["ENOENT", "ENOENT"]
    assert result[2] == "OK:1"


# -- scratch ----------------------------------------------------------------------


async def test_scratch_is_one_capped_tmpfs_and_nothing_lands_under_the_jail_root(
    runner: Runner, jail_root: Path
) -> None:
    """The working dir, /tmp and /dev/shm are one tmpfs of `scratch_bytes`,
    as the jail's statvfs counts it: 5 MiB written show as 5 MiB used in
    all three, the cap stops the next writes with ENOSPC wherever they go,
    and while the jail holds its bytes the host's jail root has none."""
    cap = 8 * MiB
    limits = runner.limits.replace(scratch_bytes=cap)
    code = READY + textwrap.dedent("""
        def used(path):
            st = os.statvfs(path)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        def fill(path, mib):
            with open(path, "wb") as f:
                for _ in range(mib):
                    f.write(b"x" * (1 << 20))
                    f.flush()
        where = (os.getcwd(), "/tmp", "/dev/shm")
        mounts = {}  # mount point -> (major:minor, filesystem type)
        for line in open("/proc/self/mountinfo"):
            left, _, right = line.partition(" - ")
            mounts[left.split()[4]] = (left.split()[2], right.split()[0])
        st = os.statvfs(".")
        out = {"devices": [os.stat(p).st_dev for p in where],
               "mounts": [mounts.get(p) for p in where],
               "size": st.f_blocks * st.f_frsize, "start": used(".")}
        out["a"] = attempt(lambda: fill("/tmp/a", 5))
        out["after_a"] = [used(p) for p in where]
        ready({"device": out["devices"][0]})  # the host looks under its jail root now
        out["b"] = attempt(lambda: fill("/dev/shm/b", 5))
        out["big"] = attempt(lambda: fill("big", 50))
        out["full"] = [used(p) for p in where]
        out["files"] = sum(os.path.getsize(p) for p in ("/tmp/a", "/dev/shm/b", "big", "ready"))
        result = out
    """)
    seen: dict[str, Any] = {}

    async def host_side() -> None:
        jail, info = await jail_ready(go=False)
        seen["cwd_device"] = os.stat(f"/proc/{jail}/cwd").st_dev
        seen["jail_device"] = info["device"]
        seen["under_root"] = [(str(p.relative_to(jail_root)), p.is_dir(), p.lstat().st_blocks)
                              for p in jail_root.rglob("*")]
        let_go(jail)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(host_side)
        result = (await runner.run("children:run_code", PRELUDE + code, limits=limits)).response
    # One filesystem, a tmpfs of the cap's size, in all three places.
    assert len(set(result["devices"])) == 1, result
    assert [m[1] for m in result["mounts"]] == ["tmpfs"] * 3, result["mounts"]
    assert len({m[0] for m in result["mounts"]}) == 1, result["mounts"]
    assert result["size"] == cap
    assert result["start"] < 64 * 1024, result["start"]  # an empty scratch
    # 5 MiB written to /tmp are 5 MiB used as each of the three counts it
    # (within 64 KiB: 16 pages).
    assert result["a"] == "OK:None"
    for got in result["after_a"]:
        assert abs(got - result["start"] - 5 * MiB) < 64 * 1024, result["after_a"]
    # One cap for the three: /dev/shm got what was left, the working dir nothing.
    assert [result["b"], result["big"]] == ["ENOSPC", "ENOSPC"]
    assert all(cap - got < 64 * 1024 for got in result["full"]), result["full"]
    assert cap - 64 * 1024 < result["files"] <= cap, result["files"]
    # What did not happen: the bytes landing under the jail root on the host,
    # where the jail dir holds empty dirs only; the jail's cwd is the tmpfs.
    assert seen["cwd_device"] == seen["jail_device"] != jail_root.stat().st_dev
    assert seen["under_root"], "no jail dir under the jail root during the run"
    assert all(is_dir and blocks <= 8 for _, is_dir, blocks in seen["under_root"]), seen
    assert list(jail_root.glob("*/*")) == []


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.mark.quiet_host
async def test_scratch_writes_take_no_host_disk(runner: Runner, jail_root: Path) -> None:
    """quiet_host: it asserts the host's free disk, which any other process
    moves. That figure is the point: 48 MiB held in the scratch take no byte
    of the disk under the jail root or the checkout (within 4 MiB, the host's
    own noise)."""
    limits = runner.limits.replace(scratch_bytes=64 * MiB)
    disks = {os.stat(p).st_dev: str(p) for p in (jail_root, TESTS_DIR)}
    before = {dev: _free_bytes(path) for dev, path in disks.items()}
    code = READY + textwrap.dedent("""
        for name in ("a", "/tmp/b", "/dev/shm/c"):
            with open(name, "wb") as f:
                for _ in range(16):
                    f.write(b"x" * (1 << 20))
        ready({})
        result = sum(os.path.getsize(p) for p in ("a", "/tmp/b", "/dev/shm/c"))
    """)
    held: dict[int, int] = {}

    async def host_side() -> None:
        jail, _ = await jail_ready(go=False)
        held.update({dev: _free_bytes(path) for dev, path in disks.items()})
        let_go(jail)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(host_side)
        result = (await runner.run("children:run_code", PRELUDE + code, limits=limits)).response
    assert result == 48 * MiB
    for dev, path in disks.items():
        assert abs(before[dev] - held[dev]) < 4 * MiB, (path, (before[dev] - held[dev]) // MiB)
    assert list(jail_root.glob("*/*")) == []


async def test_scratch_does_not_survive_the_run(runner: Runner) -> None:
    # Host paths bound under /tmp (a checkout or venv there) are mount points
    # in the scratch: the same in every run; what a run writes is not.
    code = """
        result = sorted(os.listdir(".")) + sorted(os.listdir("/tmp"))
        open("left-behind", "w").write("x")
        open("/tmp/left-behind", "w").write("x")
    """
    first = await run_code(runner, code)
    assert "left-behind" not in first
    assert await run_code(runner, code) == first
    assert all(sys.prefix.startswith(f"/tmp/{name}/") or TESTS_DIR.startswith(f"/tmp/{name}/")
               for name in first)


async def test_working_dir_is_fixed(runner: Runner) -> None:
    code = "result = [os.getcwd(), os.environ['HOME'], os.environ['TMPDIR']]"
    result = await run_code(runner, code)
    assert result == [WORKDIR] * 3


# -- setup failures -------------------------------------------------------------


def _edited(edit: Callable[[HelperPlan], HelperPlan]) -> PlanEditing:
    cls = type("Edited", (PlanEditing,), {"edit": staticmethod(edit)})
    backend: PlanEditing = cls(locate_worker())
    return backend


async def test_a_bind_that_cannot_be_made_fails_closed(jail_root: Path, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    backend = _edited(lambda plan: msgspec.structs.replace(
        plan, root_ops=(*plan.root_ops, Bind(source=str(gone), path=str(gone)))))
    e = await refusal(runner_on(jail_root, backend))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail.startswith(f"root: bind({gone}): No such file or directory"), e.detail


async def test_an_unknown_root_operation_fails_closed(jail_root: Path) -> None:
    """Refused as the helper reads the plan (each op into its class), before
    any step."""
    backend = _edited(lambda plan: msgspec.structs.replace(
        plan, root_ops=(*plan.root_ops, {"op": "union", "path": "/x"})))
    e = await refusal(runner_on(jail_root, backend))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail == "plan: root_ops: unknown op 'union'"


async def test_a_staging_dir_that_is_missing_fails_closed(jail_root: Path) -> None:
    backend = _edited(lambda plan: msgspec.structs.replace(plan, staging="/nonexistent-stage"))
    e = await refusal(runner_on(jail_root, backend))
    assert e.reason is Reason.SANDBOX_SETUP
    assert e.detail.startswith("root: mount(/nonexistent-stage)"), e.detail


async def test_exit_status_is_forwarded_unchanged(runner: Runner) -> None:
    e = await denied(runner, "os._exit(121)")
    assert (e.reason, e.exit_status) == (Reason.NONZERO_EXIT, 121)
    e = await denied(runner, "import signal; signal.raise_signal(signal.SIGUSR1)")
    assert (e.reason, e.signal) == (Reason.KILLED_BY_SIGNAL, 10)


def test_scratch_bytes_is_validated() -> None:
    assert Limits().scratch_bytes == 256 * MiB
    with pytest.raises(msgspec.ValidationError):
        Limits(scratch_bytes=1)



# -- mounts below a bind ----------------------------------------------------------


@pytest.mark.skipif(os.getuid() != 0, reason="mounting a tmpfs takes root")
def test_a_non_root_jail_refuses_a_bind_with_a_mount_below(tmp_path: Path) -> None:
    """A non-root caller's jail is a user namespace of its own, where the
    kernel locks every mount to its parent: binding a dir alone with a mount
    below it fails EINVAL (shown for real in the cgroup v2 guest: Docker's
    --init, scripts/test-cgroup-v2's `docker-user-init`). The plan is
    refused first, naming the mount; a root caller's is not."""
    import subprocess

    from trunner.errors import RunnerError
    from trunner.linux.backend import LinuxBackend, _refuse_locked_submounts

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(pkg / "sub")], check=True)
    try:
        backend = Runner(import_paths=[str(pkg)]).backend
        assert isinstance(backend, LinuxBackend)
        plan = backend.prepared(Limits()).plan  # as root: planned
        assert any(isinstance(op, Bind) and op.source == str(pkg) for op in plan.root_ops)
        with pytest.raises(RunnerError) as caught:
            _refuse_locked_submounts(plan)
        assert caught.value.reason is Reason.SANDBOX_SETUP
        assert f"{pkg}/sub is a mount below {pkg}, which the jail binds" in caught.value.detail
    finally:
        subprocess.run(["umount", str(pkg / "sub")], check=True)
    _refuse_locked_submounts(plan)  # the mount gone: nothing to refuse
