"""Removing jail dirs: what a jailed child leaves (depth, modes, symlinks,
bulk), what cannot be removed (`cleanup_failed`), and the watchdog process
that removes the dirs of a dead parent."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

import trunner.cleanup
from support import group_alive, is_alive, jailed_under, scaled, wait_until
from trunner import Reason, Runner, RunnerError
from trunner.backend import make_jail_dir, remove_jail_dir
from trunner.cleanup import remove_tree
from trunner.linux import watchdog

if TYPE_CHECKING:
    from collections.abc import Iterator

MiB = 1024 * 1024


async def run_code(runner: Runner, code: str, **kw: Any) -> Any:
    return (await runner.run("children:run_code", textwrap.dedent(code), **kw)).response


def _chain(root: Path, depth: int) -> None:
    """`root`, a `depth`-deep chain of directories `d` under it, and a file
    at the bottom (made fd-relative: the path outgrows PATH_MAX)."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


# -- remove_tree on its own ----------------------------------------------------


def test_a_chain_deeper_than_the_recursion_and_fd_limits(tmp_path: Path) -> None:
    """4,000 levels, past the recursion limit, removed with RLIMIT_NOFILE set
    to 8 above the fds already open: a removal holding one fd per level
    would fail with EMFILE."""
    top = tmp_path / "top"
    _chain(top, 4000)
    assert sys.getrecursionlimit() < 4000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 8, hard))
    try:
        gone = remove_tree(str(top))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert gone
    assert not top.exists()


def test_symlinks_are_removed_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep").write_text("keep me")
    top = tmp_path / "top"
    (top / "d").mkdir(parents=True)
    (top / "to-dir").symlink_to(outside)
    (top / "d" / "to-sub").symlink_to(outside / "sub")
    (top / "to-file").symlink_to(outside / "sub" / "keep")
    (top / "dangling").symlink_to(tmp_path / "nowhere")
    link = tmp_path / "link-to-outside"
    link.symlink_to(outside)
    assert remove_tree(str(top))
    assert remove_tree(str(link))  # the link itself, not what it names
    assert not top.exists()
    assert not link.is_symlink()
    assert (outside / "sub" / "keep").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jails", "outside"]


def test_missing_path_is_gone_and_a_file_is_removed(tmp_path: Path) -> None:
    assert remove_tree(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("x")
    assert remove_tree(str(tmp_path / "file"))
    assert not (tmp_path / "file").exists()


REMOVE_WITHOUT_CAPS = """
import os, sys
sys.path.insert(0, {root!r})
from trunner.cleanup import remove_tree
eff = int(open("/proc/self/status").read().split("CapEff:")[1].split()[0], 16)
print(eff, remove_tree({path!r}), os.path.lexists({path!r}))
"""


def test_dirs_without_rwx_are_given_it(tmp_path: Path) -> None:
    """Modes 000, 0500 (no write) and 0300 (no read) on non-empty dirs, as an
    owner without CAP_DAC_OVERRIDE sees them (as root: every capability
    dropped, as a jailed child is)."""
    top = tmp_path / "top"
    for name, mode in [("none", 0o000), ("no-write", 0o500), ("no-read", 0o300)]:
        (top / name / "inner").mkdir(parents=True)
        (top / name / "inner" / "f").write_text("x")
        (top / name / "f").write_text("x")
        (top / name / "inner").chmod(mode)
        (top / name).chmod(mode)
    top.chmod(0o500)
    root = os.path.dirname(os.path.dirname(trunner.cleanup.__file__))
    code = REMOVE_WITHOUT_CAPS.format(root=root, path=str(top))
    argv = [sys.executable, "-I", "-c", code]
    if os.geteuid() == 0:
        argv = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(60))
    try:
        assert out.stdout.split() == ["0", "True", "False"], out.stderr
    finally:
        if top.exists():
            shutil.rmtree(top)


# -- what a jailed child leaves --------------------------------------------------


async def test_deep_chain_with_big_files_is_removed(runner: Runner, jail_root: Path) -> None:
    """The issue's case: sixteen 64 MiB files (sparse) under a 1,500-deep
    chain. `shutil.rmtree` recursed into a RecursionError and left it all."""
    result = await run_code(runner, """
        import os
        for _ in range(1500):
            os.mkdir("d")
            os.chdir("d")
        for i in range(16):
            with open(f"big{i}", "wb") as f:
                f.truncate(64 * 1024 * 1024)
        with open("real", "wb") as f:
            f.write(os.urandom(1 << 20))
        result = sum(os.stat(f"big{i}").st_size for i in range(16))
    """)
    assert result == 16 * 64 * MiB
    assert list(jail_root.iterdir()) == []


async def test_modes_and_special_files_the_child_makes(runner: Runner, jail_root: Path) -> None:
    result = await run_code(runner, """
        import os, socket
        os.makedirs("a/b/c")
        open("a/b/c/f", "w").write("x")
        os.mkdir("a/locked", 0)            # mode 000
        os.mkdir("a/b/readonly", 0o500)    # no write bit
        os.mkdir("noread", 0o300)          # no read bit
        s = socket.socket(socket.AF_UNIX)
        s.bind("a/sock")
        result = sorted(oct(os.stat(p).st_mode & 0o777)
                        for p in ("a/locked", "a/b/readonly", "noread"))
    """)
    assert result == ["0o0", "0o300", "0o500"]
    assert list(jail_root.iterdir()) == []


async def test_symlink_out_of_the_jail_leaves_its_target(
    runner: Runner, jail_root: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    (target / "sub").mkdir(parents=True)
    (target / "sub" / "data").write_text("host data")
    before = sorted((str(p), p.stat().st_mtime_ns) for p in target.rglob("*"))
    result = await run_code(runner, f"""
        import os
        os.symlink({str(target)!r}, "to-dir")
        os.mkdir("d")
        os.symlink({str(target / "sub")!r}, "d/to-sub")
        os.symlink({str(target / "sub" / "data")!r}, "to-file")
        result = sorted(os.listdir("."))
    """)
    assert result == ["d", "to-dir", "to-file"]
    assert list(jail_root.iterdir()) == []
    assert (target / "sub" / "data").read_text() == "host data"
    assert sorted((str(p), p.stat().st_mtime_ns) for p in target.rglob("*")) == before


async def test_the_event_loop_runs_while_a_big_tree_is_removed(
    jail_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A jail dir holding 30,000 files (a jail writes to its own scratch
    tmpfs now, so the test fills the dir itself); while they are removed,
    another task keeps ticking (the removal runs in a thread, not on the
    trio thread)."""
    spans: list[tuple[float, float]] = []

    def timed_remove_tree(path: str) -> bool:
        start = time.monotonic()
        try:
            return remove_tree(path)
        finally:
            spans.append((start, time.monotonic()))

    monkeypatch.setattr(trunner.cleanup, "remove_tree", timed_remove_tree)
    jail_dir = make_jail_dir(str(jail_root))
    for d in range(30):
        os.mkdir(os.path.join(jail_dir, str(d)))
        for f in range(1000):
            open(os.path.join(jail_dir, str(d), str(f)), "w").close()  # noqa: ASYNC230
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            await trio.sleep(0.002)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        gone = await remove_jail_dir(jail_dir)
        nursery.cancel_scope.cancel()
    assert gone
    assert list(jail_root.iterdir()) == []
    [(start, end)] = spans
    during = [t for t in ticks if start <= t <= end]
    gaps = [b - a for a, b in zip([start, *during], [*during, end], strict=True)]
    print(f"removal {1000 * (end - start):.0f} ms, {len(during)} ticks, "
          f"longest gap {1000 * max(gaps):.0f} ms")
    assert end - start > 0.05, "the tree was too small to show anything"
    assert max(gaps) < (end - start) / 3


# -- a dir that cannot be removed ------------------------------------------------

STUCK = """
import os, time
open("stuck", "w").close()
while not os.path.exists("go"):   # the test makes "stuck" immutable, then "go"
    time.sleep(0.005)
"""


@pytest.fixture
def immutable(jail_root: Path, tmp_path: Path) -> Iterator[list[Path]]:
    """Files the test makes immutable (chattr +i); cleared and their jail
    dir removed afterwards. Skips where the flag cannot be set."""
    probe = tmp_path / "probe"
    probe.touch()
    if os.geteuid() != 0 or subprocess.run(["chattr", "+i", str(probe)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and a filesystem with the immutable flag")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    made: list[Path] = []
    try:
        yield made
    finally:
        for path in made:
            subprocess.run(["chattr", "-i", str(path)], check=True)
            shutil.rmtree(path.parent.parent)  # the owner dir the jail dir kept


async def _make_stuck(jail_root: Path, made: list[Path]) -> None:
    """Once the child made its `stuck` (in its scratch), put an immutable
    `stuck` in its host jail dir, then say go (through the jail's cwd)."""
    found = await wait_until(lambda: [p for p in jailed_under(str(jail_root))
                                      if os.path.exists(f"/proc/{p}/cwd/stuck")],
                             30, "the jail's `stuck`")
    [owner_dir] = jail_root.iterdir()
    [jail_dir] = owner_dir.iterdir()
    stuck = jail_dir / "stuck"
    stuck.touch()
    await trio.run_process(["chattr", "+i", str(stuck)])  # check=True is its default
    made.append(stuck)
    Path(f"/proc/{found[0]}/cwd/go").touch()


@pytest.mark.parametrize(
    ("tail", "limits", "reason"),
    [
        pytest.param("result = 'done'", {}, Reason.CLEANUP_FAILED, id="else-a-success"),
        pytest.param("os._exit(3)", {}, Reason.NONZERO_EXIT, id="after-exit-3"),
        pytest.param("time.sleep(1000)", {"wall_time_s": 5.0}, Reason.TIMEOUT, id="after-timeout",
                     marks=pytest.mark.slow),
    ],
)
async def test_a_dir_that_stays_is_cleanup_failed_unless_the_run_failed_first(
    runner: Runner, jail_root: Path, immutable: list[Path],
    tail: str, limits: dict[str, float], reason: Reason,
) -> None:
    errors: list[RunnerError] = []

    async def run() -> None:
        try:
            await runner.run("children:run_code", STUCK + tail,
                             limits=runner.limits.replace(**limits))
        except RunnerError as e:
            errors.append(e)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_make_stuck, jail_root, immutable)
        nursery.start_soon(run)
    [e] = errors
    assert e.reason is reason, e.detail
    [stuck] = immutable
    assert stuck.exists()  # really left behind: the reason is not a guess
    if reason is Reason.CLEANUP_FAILED:
        assert str(stuck.parent) in e.detail


# -- the watchdog process ------------------------------------------------------


def _sleeping_group() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "1000"], start_new_session=True)


async def test_the_watchdog_kills_listed_groups_and_removes_their_dirs(tmp_path: Path) -> None:
    """The watchdog script on its own, fed records over its pipe, then EOF:
    a live group is killed and its dir removed; a group already unlisted is
    not signalled (its pgid may be recycled) but its dir is removed; a dir
    the parent reported removed is not touched."""
    dirs = {}
    for name in ("live", "killed", "forgotten"):
        dirs[name] = tmp_path / name
        _chain(dirs[name], 1200)  # deeper than the recursion limit
    live, unlisted = _sleeping_group(), _sleeping_group()
    # A plain Popen: the test writes its stdin synchronously, a byte at a time.
    proc = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-I", "-S", watchdog.__file__], stdin=subprocess.PIPE, env={}, cwd="/"
    )
    assert proc.stdin is not None
    try:
        records = [
            watchdog._record("=", 0, "", str(dirs["live"])),
            watchdog._record("+", live.pid, "", str(dirs["live"])),
            watchdog._record("+", unlisted.pid, "", str(dirs["killed"])),
            watchdog._record("-", unlisted.pid),
            watchdog._record("=", 0, "", str(dirs["forgotten"])),
            watchdog._record("x", 0, "", str(dirs["forgotten"])),
        ]
        for record in records:  # a byte at a time: records split across reads
            for i in range(len(record)):
                proc.stdin.write(record[i : i + 1])
                proc.stdin.flush()
        proc.stdin.close()
        # A hung watchdog, not a speed bound (that is test_faults').
        await wait_until(lambda: proc.poll() is not None, 30, "the watchdog's exit")
        assert proc.returncode == 0
        assert live.wait(timeout=scaled(5)) == -signal.SIGKILL
        assert unlisted.poll() is None  # not signalled
        assert not dirs["live"].exists()
        assert not dirs["killed"].exists()
        assert dirs["forgotten"].is_dir()
    finally:
        for p in (live, unlisted, proc):
            if p.poll() is None:
                p.kill()
            p.wait()
        remove_tree(str(dirs["forgotten"]))
    assert not is_alive(live.pid)
    assert not group_alive(live.pid)


async def test_the_watchdog_ends_at_its_owners_death_with_its_pipe_still_open(
    tmp_path: Path,
) -> None:
    """The watchdog told its owner (here a `sleep` process's owner id) ends
    when the owner dies, though its pipe's write end stays open (as in a
    child the owner forked): it kills the listed group and removes its dir
    and the owner dir. Before, only EOF ended it."""
    owner_proc = subprocess.Popen(["sleep", "1000"])  # noqa: ASYNC220  killed, not awaited
    fields = Path(f"/proc/{owner_proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    owner = f"{owner_proc.pid}-{fields[19]}-{os.stat('/proc/self/ns/pid').st_ino}"
    owner_dir = tmp_path / f"trunner-{owner}-0badc0de"
    jail_dir = owner_dir / "0123456789abcdef"
    jail_dir.mkdir(parents=True)
    live = _sleeping_group()
    read, write = os.pipe()
    proc = subprocess.Popen(  # noqa: ASYNC220  a plain Popen, polled
        [sys.executable, "-I", "-S", watchdog.__file__, owner], stdin=read, env={}, cwd="/")
    os.close(read)
    try:
        os.write(write, b"".join([
            watchdog._record("=", 0, "", str(owner_dir)),
            watchdog._record("=", 0, "", str(jail_dir)),
            watchdog._record("+", live.pid, "", str(jail_dir)),
        ]))
        owner_proc.kill()
        owner_proc.wait()
        # A hung watchdog, not a speed bound.
        await wait_until(lambda: proc.poll() is not None, 30, "the watchdog's exit")
        assert proc.returncode == 0
        assert live.wait(timeout=scaled(5)) == -signal.SIGKILL
        assert not owner_dir.exists()
    finally:
        os.close(write)
        for p in (live, proc, owner_proc):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_the_watchdog_script_imports_only_the_stdlib_cleanup_and_procfs() -> None:
    code = (
        f"import runpy, sys; sys.argv = [{watchdog.__file__!r}];"
        f"sys.stdin.close(); import os; os.close(0); os.open('/dev/null', os.O_RDONLY);"
        f"runpy.run_path({watchdog.__file__!r}, run_name='__main__');"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('trio', 'msgspec', 'blake3', 'pyseccomp', 'trunner'))))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, timeout=scaled(60))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["trunner", "trunner.cleanup", "trunner.procfs"]
