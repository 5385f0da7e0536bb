"""Faults: the child dying badly, the caller cancelling anywhere, the parent
dying, the host refusing resources. Each test asserts the reason and that
nothing (process, jail dir, fd, cgroup) is left behind."""

from __future__ import annotations

import errno
import fcntl
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

import trunner.backend
import trunner.invocation
from conftest import TESTS_DIR, child_pids, open_fds
from support import (
    group_alive,
    is_alive,
    jail_pid,
    jailed_under,
    owner_of,
    run_cgroups_of,
    scaled,
    wait_until,
)
from trunner import Limits, Reason, Runner, RunnerError
from trunner.spawn import ColdSpawner

if TYPE_CHECKING:
    from collections.abc import Iterator

MiB = 1024 * 1024


async def fails(runner: Runner, mode: str, request: Any = None, **kw: Any) -> RunnerError:
    with pytest.raises(RunnerError) as info:
        await runner.run(mode, request, **kw)
    return info.value


async def code_fails(runner: Runner, code: str, **kw: Any) -> RunnerError:
    return await fails(runner, "children:run_code", textwrap.dedent(code), **kw)


# -- the child dies of a signal ------------------------------------------------


@pytest.mark.parametrize(
    ("code", "sig"),
    [
        pytest.param("import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                     signal.SIGKILL, id="sigkill-self"),
        pytest.param("import ctypes; ctypes.string_at(0xFFFF800000001000, 1)", signal.SIGSEGV,
                     id="sigsegv-kernel-address"),
        pytest.param("import os; os.abort()", signal.SIGABRT, id="sigabrt-abort"),
    ],
)
async def test_child_dies_of_a_real_fault(runner: Runner, code: str, sig: int) -> None:
    e = await code_fails(runner, code)
    assert (e.reason, e.signal, e.exit_status) == (Reason.KILLED_BY_SIGNAL, sig, None)
    assert signal.Signals(sig).name in e.detail


def adapter_running(pid: int) -> bool:
    """Whether jailed `pid` is past its helper: seccomp installed and the
    helper's argv replaced by the adapter's (exec'd)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            filtered = "Seccomp:\t2" in f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return filtered and b"helper" not in argv


async def test_child_sigkilled_from_outside_mid_run(runner: Runner) -> None:
    seen: list[int] = []

    async def kill_when_seen() -> None:
        seen.extend(await wait_until(child_pids, 30, "a child process"))
        jail = await wait_until(lambda: jail_pid(seen[0]), 30, "the jail's pid 2")  # the adapter
        await wait_until(lambda: adapter_running(jail), 30, "the adapter runs")
        os.kill(jail, signal.SIGKILL)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill_when_seen)
        e = await fails(runner, "children:sleep", 1000)
    assert (e.reason, e.signal) == (Reason.KILLED_BY_SIGNAL, signal.SIGKILL)
    assert not any(is_alive(p) or group_alive(p) for p in seen)


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("result = len(bytearray(2 * 1024**3))", id="one-big-bytearray"),
        pytest.param("chunks = [bytearray(32 * 1024**2) for _ in range(64)]", id="many-chunks"),
        pytest.param("import mmap; m = mmap.mmap(-1, 2 * 1024**3)", id="anon-mmap"),
    ],
)
async def test_out_of_address_space_is_nonzero_exit_with_memory_error(
    runner: Runner, code: str
) -> None:
    limits = runner.limits.replace(address_space_bytes=512 * MiB)
    e = await code_fails(runner, code, limits=limits)
    assert e.reason is Reason.NONZERO_EXIT
    assert e.exit_status == 1
    assert "MemoryError" in e.detail or "Cannot allocate memory" in e.detail, e.detail


# -- the caller cancels at random points ----------------------------------------


@pytest.mark.slow
async def test_cancel_at_random_points_leaves_nothing(
    runner: Runner, jail_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 runs of a 5 s sleep, each cancelled after 0..0.3 s (a quarter of
    them after 0.3..1.2 s, to reach the adapter too), 4 at a time: in the
    shielded spawn, in the helper, in the interpreter's start, in the
    adapter. Each run's leader (seen through a wrapped `spawn`) and jail dir
    (seen through a wrapped `make_jail_dir`) are gone when its `run()` returns;
    with 4 runs in flight, child_pids() is checked once all are done. On a
    slow host (`scaled`) the phases last longer: the delays and the sleep
    stretch with them, so the cancels land in the same phases."""
    rng = random.Random(1234)
    delays = [scaled(rng.uniform(0.0, 0.3) if rng.random() < 0.75 else rng.uniform(0.3, 1.2))
              for _ in range(200)]
    leaders: dict[object, list[int]] = {}
    jail_dirs: dict[object, list[str]] = {}
    from trunner.backend import make_jail_dir as real_make_jail_dir
    real_spawn = ColdSpawner.spawn

    async def spawn(self: ColdSpawner, jail: Any, *, stdio: str = "pipes") -> Any:
        child = await real_spawn(self, jail, stdio=stdio)
        leaders.setdefault(trio.lowlevel.current_task(), []).append(child.pid)
        return child

    def make_jail_dir(temp_root: str | None) -> str:
        path = real_make_jail_dir(temp_root)
        jail_dirs.setdefault(trio.lowlevel.current_task(), []).append(path)
        return path

    monkeypatch.setattr(ColdSpawner, "spawn", spawn)
    monkeypatch.setattr(trunner.backend, "make_jail_dir", make_jail_dir)
    problems: list[str] = []
    counts = {"cancelled": 0, "spawned": 0, "jail_dir_made": 0}
    limiter = trio.CapacityLimiter(4)

    async def one(i: int, delay: float) -> None:
        async with limiter:
            task = trio.lowlevel.current_task()
            leaders.pop(task, None)
            jail_dirs.pop(task, None)
            with trio.move_on_after(delay) as scope:
                await runner.run("children:sleep", scaled(5))
            counts["cancelled"] += scope.cancelled_caught
            for pid in leaders.get(task, []):
                counts["spawned"] += 1
                if is_alive(pid) or group_alive(pid):
                    problems.append(f"run {i} (delay {delay:.3f}): leader {pid} still alive")
            for path in jail_dirs.get(task, []):
                counts["jail_dir_made"] += 1
                if os.path.lexists(path):
                    problems.append(f"run {i} (delay {delay:.3f}): jail dir {path} left")

    with trio.fail_after(scaled(120)):
        async with trio.open_nursery() as nursery:
            for i, delay in enumerate(delays):
                nursery.start_soon(one, i, delay)
    print(counts)
    assert problems == []
    assert counts["cancelled"] == 200  # a 5 s sleep never finishes in 1.2 s (both scaled)
    assert counts["spawned"] > 20  # some cancels did land after the spawn
    assert counts["jail_dir_made"] >= counts["spawned"]  # the dirs were seen
    assert child_pids() == []
    assert list(jail_root.iterdir()) == []


# -- the parent process dies: SIGKILL, SIGTERM ----------------------------------

#: How long after a parent's death (or its exit after SIGTERM) its jailed
#: processes, cgroups and jail dirs may last. Measured on the 2-core CI kind
#: with the suite running beside it: 4-25 ms typical, 160 ms the worst seen
#: (benchmarks/parent_death.py). The watchdog is already running and needs
#: no CPU-heavy step, so 1 s is 6x the worst seen; the old watchdog misses it
#: whatever the load, as it never removed a jail dir. Zombies are not counted:
#: a dead parent's children are reaped by PID 1 (here every ~2 s), not by
#: anything trunner runs.
GONE_WITHIN_S = 1.0

PARENT = """
import signal, sys, trio
sys.path.insert(0, {tests!r})
import trunner
from trunner import Runner, Limits
CODE = {code!r}
async def runs():
    runner = Runner(import_paths=[{tests!r}], temp_root={root!r}, limits=Limits(wall_time_s=60))
    async with trio.open_nursery() as nursery:
        for _ in range({copies}):
            nursery.start_soon(runner.run, "children:run_code", CODE)
async def main():
    if not {handle_signals!r}:
        return await runs()
    async with trunner.cancel_on_signals() as stop:
        await runs()
    sys.exit(stop.exit_code)
trio.run(main)
"""

SLEEP = "import time; time.sleep(1000)"
FORK_THEN_SLEEP = """
import os, time
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(1000)
    time.sleep(1000)
time.sleep(1000)
"""


def _jailed_under(root: Path) -> list[int]:
    return jailed_under(str(root))


def _left_by(owner: str, root: Path, seen: list[int]) -> list[str]:
    """What of the runs of the parent `owner` is still on the host ([] = nothing)."""
    left = [f"process {p}" for p in {*seen, *_jailed_under(root)} if is_alive(p)]
    left += [f"cgroup {c}" for c in run_cgroups_of(owner, ("pids",))]
    # os.walk, not rglob: it skips what goes while it lists (the watchdog removes it).
    return left + [f"dir {os.path.relpath(os.path.join(top, name), root)}"
                   for top, dirs, files in os.walk(root) for name in dirs + files]


async def _ends_clean(parent: subprocess.Popen[bytes], owner: str, root: Path, seen: list[int]
                     ) -> float:
    """Wait for `parent` (the owner `owner`) to be gone, then for nothing of
    its runs to be left, within GONE_WITHIN_S; returns how long the second
    wait took."""
    await wait_until(lambda: parent.poll() is not None, 30, "the parent's exit")
    start = trio.current_time()
    await wait_until(lambda: not _left_by(owner, root, seen), GONE_WITHIN_S,
                     lambda: f"nothing left (left: {_left_by(owner, root, seen)})")
    return trio.current_time() - start


def _start_parent(root: Path, code: str, copies: int, handle_signals: bool = False
                  ) -> subprocess.Popen[bytes]:
    script = PARENT.format(tests=TESTS_DIR, root=str(root), code=code, copies=copies,
                           handle_signals=handle_signals)
    return subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)


async def _wait_for_runs(parent: subprocess.Popen[bytes], root: Path, expected: int) -> list[int]:
    """The jailed processes, once `expected` of them run the adapter's code."""
    def ready() -> bool:
        assert parent.poll() is None, parent.stderr.read() if parent.stderr else ""
        # The helpers and the jails' pid 1 are trunner's (argv: helper).
        return len([p for p in _jailed_under(root) if adapter_running(p)]) >= expected

    await wait_until(ready, 60, f"{expected} jailed processes running")
    return _jailed_under(root)


def _end_parent(parent: subprocess.Popen[bytes], root: Path) -> None:
    if parent.poll() is None:
        parent.kill()
    parent.wait()
    assert parent.stderr is not None
    parent.stderr.close()
    shutil.rmtree(root)


@pytest.mark.parametrize(
    ("code", "copies", "expected"),
    [
        pytest.param(SLEEP, 1, 1, id="one-run"),
        pytest.param(FORK_THEN_SLEEP, 1, 3, id="child-and-grandchildren"),
        pytest.param(FORK_THEN_SLEEP, 3, 9, id="three-runs-with-grandchildren"),
        pytest.param(SLEEP, 6, 6, id="six-runs"),
    ],
)
async def test_sigkilled_parent_mid_run_leaves_nothing(
    tmp_path: Path, code: str, copies: int, expected: int
) -> None:
    """No jailed process, no cgroup, no jail dir: the watchdog's work."""
    root = tmp_path / "parent-jails"  # not jail_root: the dead parent cannot clean up
    root.mkdir()
    parent = _start_parent(root, code, copies)
    try:
        owner = owner_of(parent.pid)
        jailed = await _wait_for_runs(parent, root, expected)
        [owner_dir] = root.iterdir()  # the parent's: its jail dirs are in it
        assert len(list(owner_dir.iterdir())) == copies
        assert len(run_cgroups_of(owner, ("pids",))) in (0, copies)  # 0: not root
        parent.kill()
        took = await _ends_clean(parent, owner, root, jailed)
        print(f"nothing left {1000 * took:.0f} ms after the parent was reaped")
    finally:
        _end_parent(parent, root)


@pytest.mark.parametrize(
    ("handle_signals", "sig"),
    [
        pytest.param(True, signal.SIGTERM, id="sigterm-cancel_on_signals"),
        pytest.param(True, signal.SIGINT, id="sigint-cancel_on_signals"),
        pytest.param(False, signal.SIGTERM, id="sigterm-default"),
    ],
)
async def test_signalled_parent_mid_run_leaves_nothing(
    tmp_path: Path, handle_signals: bool, sig: signal.Signals
) -> None:
    """Under `cancel_on_signals()` the parent cancels its runs, each cleans
    up, and it exits 128+signal; left to the default, SIGTERM ends it at
    once and the watchdog cleans up. Either way nothing is left."""
    root = tmp_path / "parent-jails"
    root.mkdir()
    parent = _start_parent(root, FORK_THEN_SLEEP, 3, handle_signals)
    try:
        owner = owner_of(parent.pid)
        jailed = await _wait_for_runs(parent, root, 9)
        parent.send_signal(sig)
        await _ends_clean(parent, owner, root, jailed)
        assert parent.returncode == (128 + sig if handle_signals else -sig)
        if handle_signals:
            assert parent.stderr is not None
            assert parent.stderr.read() == b""  # no traceback: a clean exit
    finally:
        _end_parent(parent, root)


LOOPING_PARENT = """
import sys, trio
sys.path.insert(0, {tests!r})
from trunner import Runner, Limits
CODE = {code!r}
async def main():
    runner = Runner(import_paths=[{tests!r}], temp_root={root!r}, limits=Limits(wall_time_s=60))
    async def loop(k):
        for i in range(10**6):
            result = await runner.run("children:run_code", CODE)
            assert result.response == "forked", result
            with open({count!r}, "a") as f:
                f.write("ok\\n")
    async with trio.open_nursery() as nursery:
        for k in range(4):
            nursery.start_soon(loop, k)
trio.run(main)
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_sigkilled_parent_at_a_random_moment_of_a_busy_loop(
    tmp_path: Path, seed: int
) -> None:
    """A parent doing 4 runs at a time back to back (each forks once), killed
    at a random moment: whatever phase each run was in (jail dir just made,
    cgroup made, spawning, running, being removed), nothing is left."""
    root = tmp_path / "parent-jails"
    root.mkdir()
    code = "import os\nif os.fork() == 0:\n    os._exit(0)\nresult = 'forked'"
    count = tmp_path / "done"
    script = LOOPING_PARENT.format(tests=TESTS_DIR, root=str(root), code=code, count=str(count))
    # A plain Popen: it is SIGKILLed and polled, never awaited.
    parent = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-c", script], stderr=subprocess.PIPE
    )
    try:
        owner = owner_of(parent.pid)

        def running() -> bool:
            assert parent.poll() is None, parent.stderr.read() if parent.stderr else ""
            return bool(_jailed_under(root))

        await wait_until(running, 60, "the first jailed process")
        # The kill's moment, not a synchronization: any phase must be safe.
        await trio.sleep(random.Random(seed).uniform(0.5, 2.5))
        assert parent.poll() is None, parent.stderr.read() if parent.stderr else ""
        jailed = _jailed_under(root)
        parent.kill()
        await _ends_clean(parent, owner, root, jailed)
        done = count.read_text().count("ok") if count.exists() else 0
        print(f"{done} runs completed before the kill")
    finally:
        _end_parent(parent, root)


# -- the host refuses the jail dir ---------------------------------------------


def _never_spawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []

    async def spawn(self: Any, jail: Any, *, stdio: str = "pipes") -> Any:
        calls.append(jail)
        raise AssertionError("spawned although the jail dir could not be made")

    monkeypatch.setattr(ColdSpawner, "spawn", spawn)
    return calls


@pytest.mark.parametrize(
    ("make_root", "errno_name"),
    [
        pytest.param(lambda t: (t / "afile").write_text("x") and t / "afile" / "x", "ENOTDIR",
                     id="under-a-regular-file"),
        pytest.param(lambda t: (t / "afile").write_text("x") and t / "afile", "ENOTDIR",
                     id="is-a-regular-file"),
        pytest.param(lambda t: t / "missing" / "x", "ENOENT", id="missing"),
    ],
)
async def test_unusable_temp_root_is_spawn_failed_and_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_root: Any, errno_name: str
) -> None:
    root = make_root(tmp_path)
    runner = Runner(import_paths=[TESTS_DIR], temp_root=str(root))
    calls = _never_spawn(monkeypatch)
    e = await fails(runner, "echo", 1)
    assert e.reason is Reason.SPAWN_FAILED
    assert f"errno {getattr(errno, errno_name)}" in e.detail
    assert calls == []
    assert child_pids() == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "jails") in (["afile"], [])


# Mounts a tmpfs at argv[1] with options argv[2] in a private mount namespace
# of this process (not root: in a new user namespace too, the uid mapped to
# itself, so trunner still runs as that uid).
OWN_TMPFS = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(ok, what):
    if not ok:
        sys.exit(f"{what}: {os.strerror(ctypes.get_errno())}")
uid, gid = os.getuid(), os.getgid()
if uid == 0:
    check(libc.unshare(0x00020000) == 0, "unshare(CLONE_NEWNS)")
else:
    check(libc.unshare(0x10000000 | 0x00020000) == 0, "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
check(libc.mount(None, b"/", None, 0x4000 | 0x40000, None) == 0, "MS_REC|MS_PRIVATE")
check(libc.mount(b"tmpfs", sys.argv[1].encode(), b"tmpfs", 0, sys.argv[2].encode()) == 0,
      "mount")
"""
# Not root: holds such a mount until its stdin closes; the test, in the host's
# namespaces, reaches it through /proc/HOLDER/root (trunner's parent side only:
# a jailed helper, in a user namespace of its own, may not follow that link).
TMPFS_HOLDER = OWN_TMPFS + """
os.write(1, b"ready\\n")
os.read(0, 1)
"""


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Any]:
    """Mounts a tmpfs of the given options (as root here; not root, in a
    holder's namespaces, reached through /proc/HOLDER/root); skips if this
    host will not."""
    mounted: list[Path] = []
    holders: list[subprocess.Popen[bytes]] = []

    def mount(options: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted) + len(holders)}"
        where.mkdir()
        if os.getuid() != 0:
            holder = subprocess.Popen([sys.executable, "-c", TMPFS_HOLDER, str(where), options],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
            holders.append(holder)
            assert holder.stdout is not None
            if holder.stdout.readline() != b"ready\n":
                holder.wait()
                assert holder.stderr is not None
                pytest.skip(f"cannot mount a tmpfs here: {holder.stderr.read().decode().strip()}")
            return Path(f"/proc/{holder.pid}/root{where}")
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
            capture_output=True, text=True,
        )
        if out.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip() or out.returncode}")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in mounted:
            subprocess.run(["umount", "-l", str(where)], check=True)
        for holder in holders:
            holder.communicate()  # closes its stdin: it exits, the mount with it
            assert holder.returncode == 0, holder.returncode


async def test_jail_dir_on_a_full_filesystem_child_gets_enospc(tiny_tmpfs: Any) -> None:
    """The run writes to its own scratch tmpfs (`scratch_bytes`), never to the
    temp root's filesystem: full at the scratch cap, whatever the host has."""
    root = tiny_tmpfs("size=64k,mode=0700")
    runner = Runner(import_paths=[TESTS_DIR], temp_root=str(root),
                    limits=Limits(wall_time_s=20, scratch_bytes=1024 * 1024))
    # Caught in the child: it can write up to the scratch's size, no further.
    result = (await runner.run("children:run_code", textwrap.dedent("""
        import errno
        written = 0
        try:
            with open("big", "wb") as f:
                for _ in range(2048):
                    f.write(b"x" * 4096)
                    f.flush()
                    written += 4096
            result = ("wrote", written)
        except OSError as e:
            result = (errno.errorcode[e.errno], written)
    """))).response
    assert result[0] == "ENOSPC"
    assert 64 * 1024 < result[1] <= 1024 * 1024
    # Uncaught: a nonzero exit whose detail names the error.
    e = await code_fails(runner, "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))")
    assert e.reason is Reason.NONZERO_EXIT
    assert "No space left on device" in e.detail
    assert list(root.iterdir()) == []


async def test_temp_root_out_of_inodes_is_spawn_failed(
    tiny_tmpfs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tiny_tmpfs("size=64k,nr_inodes=4,mode=0700")
    n = 0
    while True:  # use up every inode
        try:
            (root / f"f{n}").touch()
        except OSError as err:
            full = err
            break
        n += 1
    assert full.errno == errno.ENOSPC
    runner = Runner(import_paths=[TESTS_DIR], temp_root=str(root))
    calls = _never_spawn(monkeypatch)
    e = await fails(runner, "echo", 1)
    assert e.reason is Reason.SPAWN_FAILED
    assert f"errno {errno.ENOSPC}" in e.detail
    assert calls == []
    assert sorted(p.name for p in root.iterdir()) == [f"f{i}" for i in range(n)]


# -- the parent runs out of fds ------------------------------------------------


def _is_open(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    "headroom",
    range(0, 14),
)
async def test_parent_out_of_fds_is_a_clear_reason(
    runner: Runner, jail_root: Path, headroom: int
) -> None:
    """Exactly `headroom` fd numbers free below the soft RLIMIT_NOFILE: each
    headroom exhausts the table at a different step (the cgroup file, the
    three pipes, Popen's own pipe, the pidfd...). Either the run succeeds or
    it fails `spawn_failed` naming EMFILE; no fd and no jail dir is left."""
    await runner.run("echo", 0)  # warm caches that would open files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = open_fds()
    used = {int(fd) for fd in before if _is_open(int(fd))}  # not the listing's own fd
    limit, free = 0, 0
    while True:  # the lowest limit leaving exactly `headroom` numbers free below it
        if limit not in used:
            if free == headroom:
                break
            free += 1
        limit += 1
    outcome: Any
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        try:
            outcome = (await runner.run("echo", {"h": headroom})).response
        except BaseException as e:  # anything but RunnerError is a bug
            outcome = e
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    left = list(jail_root.iterdir())
    for path in left:  # so that a failure here is this test's, not no_leaks'
        shutil.rmtree(path)
    print(f"headroom {headroom}: limit {limit}: {outcome!r:.300}")
    assert open_fds() == before
    assert child_pids() == []
    assert not isinstance(outcome, BaseException) or isinstance(outcome, RunnerError), (
        f"not a RunnerError: {type(outcome).__name__}: {outcome!s:.300}"
    )
    assert left == []
    if isinstance(outcome, RunnerError):
        assert outcome.reason is Reason.SPAWN_FAILED, (outcome.reason, outcome.detail)
        assert f"errno {errno.EMFILE}" in outcome.detail
    else:
        assert outcome == {"h": headroom}


# -- the worker binary ---------------------------------------------------------


def _worker_copy(tmp_path: Path, mode: int) -> str:
    from trunner.worker import locate_worker

    path = tmp_path / "trunner-worker"
    shutil.copyfile(locate_worker(), path)
    path.chmod(mode)
    return str(path)


def _garbage_worker(tmp_path: Path) -> str:
    path = tmp_path / "garbage"
    path.write_bytes(b"\x00\x01garbage")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    ("make_worker", "errno_value"),
    [
        pytest.param(lambda t: "/nonexistent", errno.ENOENT, id="missing"),
        pytest.param(lambda t: str(t / "no" / "such" / "worker"), errno.ENOENT,
                     id="missing-dir"),
        pytest.param(lambda t: _worker_copy(t, 0o644), errno.EACCES, id="not-executable"),
        pytest.param(lambda t: str(t), errno.EACCES, id="a-directory"),
        pytest.param(_garbage_worker, errno.ENOEXEC, id="not-a-program"),
    ],
)
async def test_unusable_worker_is_spawn_failed(
    jail_root: Path, tmp_path: Path, make_worker: Any, errno_value: int
) -> None:
    worker = make_worker(tmp_path)
    runner = Runner(import_paths=[TESTS_DIR], temp_root=str(jail_root), worker=worker)
    if os.path.isfile(worker):
        assert not os.stat(worker).st_mode & stat.S_IXUSR or errno_value == errno.ENOEXEC
    e = await fails(runner, "echo", 1)
    assert e.reason is Reason.SPAWN_FAILED, (e.reason, e.detail)
    assert f"errno {errno_value}" in e.detail, e.detail
    assert child_pids() == []
