"""Who the jail is on the host (issue 10, item 1; issue 17, item 4): a root
caller's jail runs as a host uid/gid of its own, taken per concurrent run
from a range nothing else on the host uses (`trunner.linux.ids`, default
0x7A000000 + [0, 1024)), groups cleared, never host uid 0 or 65534; anyone
else's runs as the caller. Inside, every jail is uid/gid 1000 (`trunner`)."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from installed import claim

from conftest import TESTS_DIR, child_pids
from support import (
    READY,
    jail_ready,
    let_go,
    live_status,
    proc_status,
    run_code,
    scaled,
    wait_until,
)
from trunner import Limits, Reason, Runner, RunnerError
from trunner.linux import ids as ids_module
from trunner.linux.backend import LinuxBackend
from trunner.linux.ids import DEFAULT_RANGE, HostFiles, HostIds
from trunner.linux.plan import JAIL_ID
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

root_only = pytest.mark.skipif(os.getuid() != 0, reason="a root caller's host ids (not root:"
                               " jails run as the caller, no range, no lock dir of root's)")

WHO = """
result = {"ids": [os.getresuid(), os.getresgid()], "groups": os.getgroups(),
          "uid_map": open("/proc/self/uid_map").read().split(),
          "gid_map": open("/proc/self/gid_map").read().split(),
          "status": {k: v.split() for k, v in (line.split(":", 1)
                     for line in open("/proc/self/status")) if k in ("Uid", "Gid", "CapEff")}}
"""

#: Where the small ranges of `small` are: blocks of 64 ids from here (the
#: default range is every run's). Block 0 is skipped: it was every test
#: run's fixed range before.
BLOCKS_FROM, BLOCK = 0x7B000000, 64


@pytest.fixture(scope="module")
def small() -> int:
    """The first id of a block of 64 host ids this test process has to itself:
    another test run on this host (another clone's, at the same time) claims
    another block, and nothing on the host uses one of its ids. Each test takes
    a small range at the block's start."""
    def unused(block: int) -> bool:
        first = BLOCKS_FROM + BLOCK * block
        return HostIds(range(first, first + BLOCK)).users() == []

    return BLOCKS_FROM + BLOCK * claim("host-id-block", range(1, 257), unused)


def host_uid(pid: int) -> int:
    return int(proc_status(pid)["Uid"].split()[0])


def helpers(n: int) -> list[int] | None:
    """This process's children (the helpers of runs started), once there are `n`."""
    pids = child_pids()
    return pids if len(pids) >= n else None


async def test_the_jail_is_one_uid_inside_mapped_to_its_host_id(runner: Runner) -> None:
    """The uid map says which host uid the jail is: `1000 host 1`."""
    who = await run_code(runner, WHO)
    assert who["ids"] == [[JAIL_ID] * 3, [JAIL_ID] * 3]
    inside, host, count = who["uid_map"]
    assert (inside, count) == (str(JAIL_ID), "1")
    if os.getuid() == 0:
        assert int(host) in DEFAULT_RANGE
        assert who["gid_map"] == [str(JAIL_ID), host, "1"]  # gid == uid on the host
        assert who["groups"] in ([], [JAIL_ID])  # root's supplementary groups cleared
    else:
        assert who["uid_map"] == [str(JAIL_ID), str(os.getuid()), "1"]
        assert who["gid_map"] == [str(JAIL_ID), str(os.getgid()), "1"]
    assert who["status"]["CapEff"] == ["0000000000000000"]


@root_only
async def test_host_ids_are_configurable(jail_root: Path, small: int) -> None:
    ids = range(small, small + 2)
    runner = Runner(temp_root=str(jail_root), import_paths=[TESTS_DIR], host_ids=ids)
    who = await run_code(runner, WHO)
    assert who["ids"] == [[JAIL_ID] * 3, [JAIL_ID] * 3]
    assert int(who["uid_map"][1]) in ids
    assert who["gid_map"][1] == who["uid_map"][1]


@pytest.mark.parametrize("ids", [range(0, 5), range(65530, 65540), range(10, 10), range(10, 20, 2),
                                 range(2**32 - 4, 2**32)])
def test_bad_ranges_are_refused(ids: range) -> None:
    with pytest.raises(ValueError, match="host_ids"):
        LinuxBackend(locate_worker(), host_ids=ids)


@root_only
async def test_a_root_only_file_in_view_is_not_readable(tmp_path: Path, jail_root: Path) -> None:
    """Before: the jail was host uid 0 (caps dropped), so every root-owned file
    in view was readable by its owner. A 0600 root file in an import path:"""
    secret = tmp_path / "secret.txt"
    secret.write_text("root's only")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    runner = Runner(temp_root=str(jail_root), import_paths=[TESTS_DIR, str(tmp_path)])
    result = await run_code(runner, f"""
        result = [attempt(lambda: open({str(secret)!r}).read()),
                  attempt(lambda: os.stat({str(secret)!r}).st_uid)]
    """)
    assert result[0] == "EACCES"
    assert result[1] == "OK:65534"  # host root is not mapped: it shows as the overflow uid
    assert secret.read_text() == "root's only"


async def _hold_two(
    runner: Runner, code: str, during: Callable[[], Awaitable[None]] | None = None
) -> tuple[list[int], list[Any]]:
    """Run `code` (which calls `ready(info)`) twice at once; while both jails
    wait, read their host uids from /proc and call `during()`. Returns the
    uids and both results."""
    results: list[Any] = []

    async def one() -> None:
        results.append(await runner.run("children:run_code", code))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
        started = await wait_until(lambda: helpers(2), 60, "2 runs' helpers")
        jails = [(await jail_ready(helper, go=False))[0] for helper in started]
        uids = [host_uid(jail) for jail in jails]
        if during is not None:
            await during()
        for jail in jails:
            let_go(jail)
    return uids, results


@root_only
async def test_two_concurrent_runs_have_two_host_uids_and_one_rules_version(
    runner: Runner, jail_root: Path
) -> None:
    """Before: both were host uid 65534, with every host process of that uid."""
    from support import PRELUDE

    async def another_runner() -> None:
        # Processes of the range that trunner's runs hold do not make it "in use".
        Runner(temp_root=str(jail_root), import_paths=[TESTS_DIR])

    code = PRELUDE + READY + 'ready({}); result = open("/proc/self/uid_map").read().split()'
    uids, results = await _hold_two(runner, code, another_runner)
    assert uids[0] != uids[1]
    assert all(uid in DEFAULT_RANGE for uid in uids)
    assert sorted(int(r.response[1]) for r in results) == sorted(uids)
    assert results[0].rules_version == results[1].rules_version == runner.rules_version()


@root_only
async def test_a_host_process_of_uid_65534_cannot_reach_a_jails_files(runner: Runner) -> None:
    """Before: a root caller's jail was host uid 65534, so any host process of
    that uid could open its files through /proc/PID/root (same uid: ptrace
    access allowed)."""
    from support import PRELUDE

    code = PRELUDE + READY + 'open("secret", "w").write("the jail\'s"); ready({}); result = 1'
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.run, "children:run_code", code)
        helper = (await wait_until(lambda: helpers(1), 60, "the run's helper"))[0]
        jail, _ = await jail_ready(helper, go=False)
        path = f"/proc/{jail}/root/home/trunner/secret"
        assert Path(path).read_text() == "the jail's"  # root can
        nobody = await trio.run_process(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", path],
            capture_stdout=True, capture_stderr=True, check=False)
        let_go(jail)
    assert nobody.returncode != 0
    assert nobody.stdout == b""
    assert b"Permission denied" in nobody.stderr


@root_only
@pytest.mark.parametrize("where", ["passwd", "group", "subuid"])
def test_the_range_is_refused_when_the_host_names_an_id_in_it(tmp_path: Path, jail_root: Path,
                                                               where: str, small: int) -> None:
    """Checked at Runner(): a user, a group or a subordinate range in it."""
    ids = range(small, small + 16)
    line = {"passwd": f"intruder:x:{small + 7}:100::/:/bin/sh",
            "group": f"intruders:x:{small + 7}:",
            "subuid": f"intruder:{small - 100}:200"}[where]
    path = tmp_path / where
    path.write_text(f"# a comment\nroot:x:0:0::/root:/bin/sh\n{line}\n"
                    if where == "passwd" else f"{line}\n")
    files = HostFiles(**{where: str(path)})
    backend = LinuxBackend(locate_worker(), host_ids=ids, host_files=files)
    with pytest.raises(RunnerError) as info:
        Runner(temp_root=str(jail_root), backend=backend)
    assert info.value.reason is Reason.HOST_IDS_IN_USE
    assert "intruder" in info.value.detail
    assert str(path) in info.value.detail
    assert child_pids() == []
    # The same range with the host's own files is free.
    Runner(temp_root=str(jail_root), backend=LinuxBackend(locate_worker(), host_ids=ids))


@contextlib.asynccontextmanager
async def host_process_as(uid: int) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A host process (`cat`) running as `uid`, ended (stdin closed, reaped)
    on the way out unless it has already."""
    process = subprocess.Popen(  # noqa: ASYNC220  it waits on stdin, ended below
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "cat"],
        stdin=subprocess.PIPE)
    try:
        def is_cat_as_uid() -> bool:  # setpriv's setuid comes before its exec of cat
            status = live_status(process.pid)
            return status["Uid"].split()[0] == str(uid) and status["Name"] == "cat"

        await wait_until(is_cat_as_uid, 30, f"a host process (cat) running as {uid}")
        yield process
    finally:
        end(process)


def end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=scaled(10))


@root_only
async def test_the_range_is_refused_while_a_host_process_runs_as_an_id(
        jail_root: Path, small: int) -> None:
    ids = range(small, small + 16)
    uid = small + 3
    async with host_process_as(uid) as squatter:
        with pytest.raises(RunnerError) as info:
            Runner(temp_root=str(jail_root), host_ids=ids)
        assert info.value.reason is Reason.HOST_IDS_IN_USE
        assert f"process {squatter.pid} (cat) runs as id {uid}" in info.value.detail
    Runner(temp_root=str(jail_root), host_ids=ids)  # gone: the range is free


@root_only
async def test_a_run_that_ends_between_the_two_reads_is_not_a_user(
        monkeypatch: pytest.MonkeyPatch, small: int) -> None:
    """The check reads the processes, then each one's id lock: a run (of
    another trunner) that ends in between released its lock after its
    process was seen. Its process is looked at again, and is gone."""
    ids = range(small, small + 16)
    uid = small + 5
    async with host_process_as(uid) as run:
        host = HostIds(ids)
        assert host.users() == [f"process {run.pid} (cat) runs as id {uid}"]

        def run_ends_then_lock_is_free(host_id: int) -> bool:
            end(run)
            return False

        monkeypatch.setattr(host, "_held", run_ends_then_lock_is_free)
        assert host.users() == []


@root_only
async def test_an_id_stays_held_until_its_runs_pid_1_has_exited(small: int) -> None:
    """A run whose pid 1 outlives the teardown's bound (a busy host) gives its
    id back only once that process has exited: until then its lock is held,
    so another trunner's check sees the process's id as a run's, not as a
    foreign user's (seen on a busy host: `host_ids_in_use` naming a
    `trunner-waiter`)."""
    ids = range(small + 32, small + 48)
    host = HostIds(ids)
    lease = host.acquire()
    async with host_process_as(lease.id) as pid_1:  # stands for the run's pid 1
        lease.release(after=os.pidfd_open(pid_1.pid))
        assert host._held(lease.id)
        assert ids_module.settle() == 1
        assert host.users() == []  # its process is a run's, not a user
        other = host.acquire()
        other.release()
        assert other.id != lease.id  # not given to another run either
    assert ids_module.settle(scaled(10)) == 0  # exited: given back
    assert not host._held(lease.id)


LOOP = "while True: pass"


@root_only
async def test_one_id_serves_any_number_of_sequential_runs(jail_root: Path, small: int) -> None:
    """Released on every path: ok, error, timeout, cancel. With one id, a
    second concurrent run is refused before anything is spawned."""
    ids = range(small, small + 1)
    runner = Runner(temp_root=str(jail_root), import_paths=[TESTS_DIR], host_ids=ids,
                    limits=Limits(wall_time_s=20.0))
    assert await run_code(runner, "result = 1") == 1
    with pytest.raises(RunnerError) as info:
        await run_code(runner, "raise SystemExit(3)")
    assert info.value.reason is Reason.NONZERO_EXIT
    with pytest.raises(RunnerError) as info:
        await run_code(runner, LOOP, limits=Limits(wall_time_s=0.5))
    assert info.value.reason is Reason.TIMEOUT
    from support import PRELUDE

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_code, runner, READY + "ready({})\n" + LOOP)
        [helper] = await wait_until(lambda: helpers(1), 60, "the run's helper")
        jail, _ = await jail_ready(helper, go=False)
        assert host_uid(jail) == small
        # The one id is taken: refused, nothing spawned.
        with pytest.raises(RunnerError) as info:
            await runner.run("children:run_code", PRELUDE + "result = 2")
        assert info.value.reason is Reason.HOST_IDS_EXHAUSTED
        assert child_pids() == [helper]
        nursery.cancel_scope.cancel()
    assert not HostIds(ids)._held(small)
    assert await run_code(runner, "result = 3") == 3
    assert not HostIds(ids)._held(small)


@root_only
async def test_a_pool_holds_its_ids_while_idle(jail_root: Path, small: int) -> None:
    ids = range(small, small + 2)
    runner = Runner(temp_root=str(jail_root), import_paths=[TESTS_DIR], host_ids=ids)
    async with runner.pool("children:status", size=2) as pool:
        await wait_until(lambda: helpers(2) and pool.idle_workers == 2, 60, "2 idle workers")
        assert all(HostIds(ids)._held(i) for i in ids)
        with pytest.raises(RunnerError) as info:
            await runner.run("children:status")
        assert info.value.reason is Reason.HOST_IDS_EXHAUSTED
        assert (await pool.run(None)).response["pid"] == 2
    assert not any(HostIds(ids)._held(i) for i in ids)
    assert (await runner.run("children:status")).response["pid"] == 2


@root_only
async def test_a_call_with_its_own_limits_takes_the_pools_id(jail_root: Path, small: int
                                                              ) -> None:
    """One host id, a pool of size 1 holding it: a call with limits of its
    own ends the idle worker and runs under its id (never
    `host_ids_exhausted`), then the pool holds it again."""
    ids = range(small, small + 1)
    runner = Runner(temp_root=str(jail_root), host_ids=ids, limits=Limits(wall_time_s=20.0))
    other = runner.limits.replace(cpu_time_s=3.0)
    async with runner.pool("exec", size=1) as pool:
        for limits in (other, other, None):
            await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
            assert HostIds(ids)._held(small)
            r = await pool.exec(["cat", "/proc/self/uid_map"], limits=limits)
            assert r.response.stdout.split()[1] == str(small).encode()
            assert r.rules_version == runner.rules_version(limits)
    assert not HostIds(ids)._held(small)


#: Per-uid kernel counters a jail can drain: (setup and `take()`, the error
#: `take()` gives once the quota is full). `take()` returns "OK" or an errno name.
COUNTERS = {
    # Each POSIX timer preallocates a pending signal: RLIMIT_SIGPENDING,
    # counted per host uid above the jail's user namespace.
    "pending_signals": ("""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def take():
    tid = ctypes.c_void_p()
    if libc.timer_create(1, None, ctypes.byref(tid)) == 0:  # CLOCK_MONOTONIC, SIGALRM
        return "OK"
    return errno.errorcode[ctypes.get_errno()]
""", "EAGAIN"),
    # Pipe buffer slots: fs.pipe-user-pages-soft (16384 pages) per host uid.
    "pipe_pages": ("""
import fcntl
pipes = []
def take():
    pipes.append(os.pipe())
    return attempt(lambda: fcntl.fcntl(pipes[-1][1], fcntl.F_SETPIPE_SZ, 1 << 20)).split(":")[0]
""", "EPERM"),
    # Descriptors in flight in unix sockets: RLIMIT_NOFILE per host uid.
    "fds_in_flight": ("""
import array, socket
a, b = socket.socketpair()
def take():
    fds = array.array("i", [a.fileno()] * 253)
    sent = attempt(lambda: a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]))
    return sent.split(":")[0]
""", "ETOOMANYREFS"),
}


@root_only
@pytest.mark.parametrize("counter", sorted(COUNTERS))
async def test_one_jail_draining_a_per_uid_counter_leaves_another_its_own(
    runner: Runner, counter: str
) -> None:
    """Before: with one host uid for every jail, the kernel's per-uid counts
    were shared, so one jail holding its quota made another's `timer_create`
    fail EAGAIN, its `F_SETPIPE_SZ` EPERM and its `SCM_RIGHTS` ETOOMANYREFS.
    RLIMIT_SIGPENDING is lowered here (the jails inherit it) so the first
    jail fills its quota quickly."""
    from support import PRELUDE

    setup, full = COUNTERS[counter]
    drain = PRELUDE + READY + setup + """
n = 0
while n < 100000 and (last := take()) == "OK":
    n += 1
ready({})
result = [n, last]
"""
    results: list[Any] = []

    async def drain_one() -> None:
        results.append((await runner.run("children:run_code", drain)).response)

    soft, hard = resource.getrlimit(resource.RLIMIT_SIGPENDING)
    resource.setrlimit(resource.RLIMIT_SIGPENDING, (256, hard))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain_one)
            helper = (await wait_until(lambda: helpers(1), 60, "the run's helper"))[0]
            jail, _ = await jail_ready(helper, go=False)
            # The first jail holds all it may: another jail takes one more.
            results.append(await run_code(runner, setup + "result = take()"))
            let_go(jail)
    finally:
        resource.setrlimit(resource.RLIMIT_SIGPENDING, (soft, hard))
    other, (taken, last) = results
    assert last == full  # the first jail's quota was full
    assert 0 < taken < 100000
    assert other == "OK"


@root_only
async def test_a_session_holds_its_id_and_its_commands_run_as_it(
        jail_root: Path, small: int) -> None:
    """A session takes one host id for its life (issue 38): with it the only
    one, another session and a run are refused `host_ids_exhausted` before
    anything is spawned, while the session's commands run, as that id."""
    ids = range(small, small + 1)
    runner = Runner(temp_root=str(jail_root), host_ids=ids, limits=Limits(wall_time_s=20.0))
    async with runner.session() as s:
        before = child_pids()
        with pytest.raises(RunnerError) as info:
            await runner.exec(["true"])
        assert info.value.reason is Reason.HOST_IDS_EXHAUSTED
        with pytest.raises(RunnerError) as again:
            async with runner.session():
                pass
        assert again.value.reason is Reason.HOST_IDS_EXHAUSTED
        assert child_pids() == before
        r = await s.exec(["sh", "-c", "cat /proc/self/uid_map"])
        assert r.response.stdout.split()[:2] == [b"1000", str(small).encode()]
    assert not HostIds(ids)._held(small)
    assert (await runner.exec(["true"])).response.exit_code == 0
