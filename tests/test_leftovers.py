"""No jail dir, run cgroup or jailed process outlives its owner (the process
that runs a `Runner`), even when the host kills the owner's direct children
with it (Ray's workers do), and a new `Runner` sweeps what dead owners left,
never a live owner's or another uid's."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from conftest import TESTS_DIR
from support import (
    ALL_CONTROLLERS,
    is_alive,
    jailed_under,
    owner_of,
    run_cgroup_parents,
    run_cgroups_of,
    scaled,
    wait_until,
)
from trunner import Runner
from trunner.cleanup import OWNER_DIR_PREFIX, owner_alive, owner_id, remove_cgroup

if TYPE_CHECKING:
    from collections.abc import Iterator

#: As test_faults' bound for a parent's death: measured 4-160 ms there.
GONE_WITHIN_S = 1.0

#: The marker in the argv of the exec in flight (not in any trunner argv).
MARKER = "leftovers-test-sleeper"

CALLER = """
import sys, trio
from trunner import Runner, Limits
async def main():
    runner = Runner(temp_root={root!r}, limits=Limits(wall_time_s=60))
    async with runner.pool("exec", size=3) as pool:
        await pool.exec([sys.executable, "-c", "import time; time.sleep(1000)", {marker!r}])
trio.run(main)
"""
#: A session: its own jail, a background process and a command in flight,
#: three jail dirs; the commands' cgroups nested in the session's.
SESSION_CALLER = """
import sys, trio
from trunner import Runner, Limits
async def main():
    runner = Runner(temp_root={root!r}, limits=Limits(wall_time_s=60))
    async with runner.session() as s:
        await s.start_background(["sleep", "1000"])
        await s.exec([sys.executable, "-c", "import time; time.sleep(1000)", {marker!r}])
trio.run(main)
"""


def _children_of(pid: int) -> list[int]:
    found = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(p) for p in path.read_text().split()]
        except OSError:
            continue
    return found


def _pidfds_of_children(pid: int) -> dict[int, int]:
    """A pidfd on each child of `pid`, by pid: each opened, then checked to
    be the child of `pid` still (not a process that took a pid that ended
    between the listing and the open)."""
    pidfds: dict[int, int] = {}
    for child in _children_of(pid):
        try:
            pidfd = os.pidfd_open(child)
        except ProcessLookupError:
            continue  # ended since it was listed
        if _ppid(child) == pid:
            pidfds[child] = pidfd
        else:
            os.close(pidfd)
    return pidfds


def _exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` has exited (a pidfd polls readable then)."""
    return bool(select.select([pidfd], [], [], 0)[0])


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _watchdogs_of(owner: str) -> list[int]:
    """The watchdogs whose argv names `owner` (an owner id) as their owner."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and any(a.endswith("watchdog.py") for a in _argv(int(p.name)))
            and owner in _argv(int(p.name))]


def _left(root: Path, caller: str, seen: set[int]) -> list[str]:
    """What of `caller`'s runs is still on the host ([] = nothing)."""
    left = [f"process {p}" for p in seen | set(jailed_under(str(root))) if is_alive(p)]
    left += [f"cgroup {c}" for c in run_cgroups_of(caller, ALL_CONTROLLERS)]
    # os.walk, not rglob: it skips what goes while it lists (the watchdog removes it).
    return left + [f"dir {os.path.relpath(os.path.join(top, name), root)}"
                   for top, dirs, files in os.walk(root) for name in dirs + files]


@pytest.mark.parametrize("caller_script", [CALLER, SESSION_CALLER], ids=["pool", "session"])
async def test_killing_the_caller_and_its_children_together_leaves_nothing(
    tmp_path: Path, caller_script: str,
) -> None:
    """A caller with a pool of 3 `exec` workers, one running a sleep: 3 jail
    dirs (in its one owner dir) and, as root, 6 run cgroups (pids and
    memory) or 3 (v2). SIGKILLed with all its direct children at once, as
    Ray does: its watchdog is not one of them, so within GONE_WITHIN_S no
    jail dir, no owner dir, no cgroup and no jailed process is left. Before,
    the watchdog was a direct child: all of it stayed."""
    root = tmp_path / "caller-jails"  # not jail_root: the dead caller cannot clean up
    root.mkdir()
    script = caller_script.format(root=str(root), marker=MARKER)
    caller = subprocess.Popen(  # noqa: ASYNC220  a plain Popen, killed and polled
        [sys.executable, "-c", script], stderr=subprocess.PIPE)
    owner = owner_of(caller.pid)
    try:
        def ready() -> bool:
            assert caller.poll() is None, caller.stderr.read() if caller.stderr else ""
            owners = list(root.iterdir())
            return (len(owners) == 1 and len(list(owners[0].iterdir())) == 3
                    and any(MARKER in _argv(p) for p in jailed_under(str(root))))

        await wait_until(ready, 60, "3 jail dirs and the sleep running")
        [owner_dir] = root.iterdir()
        assert owner_dir.name.startswith(f"{OWNER_DIR_PREFIX}{caller.pid}-")
        assert owner_dir.name[len(OWNER_DIR_PREFIX):].rpartition("-")[0] == owner
        assert owner_alive(owner)
        if caller_script == CALLER:
            assert len(run_cgroups_of(owner)) in (0, 3, 6)  # 0: not root; 3: cgroup v2
        seen = set(jailed_under(str(root)))
        children = _pidfds_of_children(caller.pid)
        [watchdog] = _watchdogs_of(owner)
        assert watchdog not in children
        assert _ppid(watchdog) != caller.pid
        try:
            # As Ray ends a worker: the caller, then at once each direct child,
            # through a pidfd: a child already reaped (the host's init reaps
            # the caller's orphans) is not a failure, and its pid, if reused,
            # is never hit.
            caller.kill()
            for pidfd in children.values():
                with contextlib.suppress(ProcessLookupError):  # it has exited already
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            await wait_until(lambda: caller.poll() is not None, 30, "the caller's exit")
            await wait_until(lambda: all(_exited(fd) for fd in children.values()), 30,
                             lambda: "the caller's children's exit (alive: "
                             f"{[p for p, fd in children.items() if not _exited(fd)]})")
        finally:
            for pidfd in children.values():
                os.close(pidfd)
        start = trio.current_time()
        await wait_until(lambda: not _left(root, owner, seen), GONE_WITHIN_S,
                         lambda: f"nothing left (left: {_left(root, owner, seen)})")
        print(f"nothing left {1000 * (trio.current_time() - start):.0f} ms after the caller")
        assert list(root.iterdir()) == []
        # Its work done, the watchdog exits.
        await wait_until(lambda: not is_alive(watchdog), GONE_WITHIN_S, "the watchdog's exit")
    finally:
        if caller.poll() is None:
            caller.kill()
        caller.wait()
        assert caller.stderr is not None
        caller.stderr.close()
        for path in run_cgroups_of(owner, ALL_CONTROLLERS):  # so that a failure leaves nothing
            remove_cgroup(path)


# -- a new Runner sweeps what dead owners left ------------------------------------


def _dead_owner() -> str:
    """The owner id of a process that ran and is gone (reaped)."""
    proc = subprocess.Popen(["sleep", "1000"])
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    ns = os.stat("/proc/self/ns/pid").st_ino
    proc.kill()
    proc.wait()
    return f"{proc.pid}-{fields[19]}-{ns}"


@pytest.fixture
def planted() -> Iterator[list[Path]]:
    """Cgroups a test plants; emptied and removed afterwards."""
    made: list[Path] = []
    try:
        yield made
    finally:
        for path in made:
            if path.is_dir():
                for pid in (path / "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
                path.rmdir()


def _plant_dir(root: Path, owner: str, suffix: str = "0badc0de") -> Path:
    owner_dir = root / f"{OWNER_DIR_PREFIX}{owner}-{suffix}"
    (owner_dir / "0123456789abcdef" / "deep").mkdir(parents=True)
    (owner_dir / "0123456789abcdef" / "deep" / "file").write_text("left")
    return owner_dir


def test_a_new_runner_sweeps_dead_owners_leftovers_only(
    tmp_path: Path, planted: list[Path]
) -> None:
    """Owner dirs and run cgroups named for: a dead owner (pid gone), a dead
    owner whose pid now runs something else (our pid, another start time),
    a live owner (us) and, as root, a dead owner's dir that another uid
    owns; a symlink named like a dead owner's dir. `Runner()` removes the
    dead owners' (killing what their cgroups held) and keeps the rest."""
    root = tmp_path / "sweep-root"
    root.mkdir()
    dead, me = _dead_owner(), owner_id()
    pid, start, ns = me.split("-")
    reused = f"{pid}-{int(start) - 1}-{ns}"  # our pid, another process's start time
    assert not owner_alive(dead)
    assert not owner_alive(reused)
    assert owner_alive(me)
    gone = [_plant_dir(root, dead), _plant_dir(root, reused)]
    kept = [_plant_dir(root, me)]
    if os.geteuid() == 0:
        foreign = _plant_dir(root, dead, "f0f0f0f0")
        for path in (foreign, *foreign.rglob("*")):
            os.chown(path, 65533, 65533, follow_symlinks=False)
        kept.append(foreign)
    target = tmp_path / "target"
    (target / "sub").mkdir(parents=True)
    link = root / f"{OWNER_DIR_PREFIX}{dead}-11111111"
    link.symlink_to(target)
    # Run cgroups (as root): a dead owner's holding a live process, a live owner's.
    sleeper = None
    for parent in run_cgroup_parents():
        parent.mkdir(exist_ok=True)
        for owner in (dead, reused, me):
            path = parent / f"{owner}-{os.urandom(16).hex()}"
            path.mkdir()
            planted.append(path)
            (kept if owner == me else gone).append(path)
        if sleeper is None:
            sleeper = subprocess.Popen(["sleep", "1000"])
            dead_cgroup = parent / planted[-3].name
            (dead_cgroup / "cgroup.procs").write_text(str(sleeper.pid))
    try:
        Runner(import_paths=[TESTS_DIR], temp_root=str(root))
        assert [p for p in gone if os.path.lexists(p)] == []
        assert [p for p in kept if not p.is_dir()] == []
        assert link.is_symlink()
        assert (target / "sub").is_dir()
        for owner_dir in (p for p in kept if p.is_relative_to(root)):
            assert (owner_dir / "0123456789abcdef" / "deep" / "file").read_text() == "left"
        if sleeper is not None:
            assert sleeper.wait(timeout=scaled(30)) == -signal.SIGKILL
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        for path in root.iterdir():
            if path.is_symlink():
                path.unlink()
        subprocess.run(["rm", "-rf", "--", str(root)], check=True)


def test_a_runs_trunner_dir_removed_under_a_live_backend_is_made_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`RunCgroups` sets a base's `trunner/` dir up once, not on each run: a
    run's mkdir that finds it gone makes it again (with its controllers
    given, on v2), and the run gets its cgroup (a `trunner/` of this test's
    own name, so no other run on the host is in it)."""
    from trunner.linux import cgroup

    parents = run_cgroup_parents(("pids",))
    if not parents:
        pytest.skip("no run cgroups for this caller")
    base = str(parents[0].parent)
    monkeypatch.setattr(cgroup, "DIR_NAME", f"trunner-test-{os.urandom(4).hex()}")
    own = Path(base, cgroup.DIR_NAME)
    made = cgroup.RunCgroups()
    try:
        for _ in range(2):
            [path] = made.make([(base, "pids")], lambda paths: None)
            assert Path(path).parent == own
            assert Path(path, "pids.max").is_file()  # the controller is the cgroup's
            cgroup.remove_now(path)
            own.rmdir()  # removed under the live backend
    finally:
        if own.exists():
            remove_cgroup(str(own))
