"""`trunner.linux.sockets`: the walk that finds the unix sockets a bind would
show, on real trees the test makes (real sockets, real modes, no mocking),
and `plan.with_masks`, which puts what it found into the plan."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import TYPE_CHECKING

from support import plan_for, scaled
from trunner import Limits
from trunner.linux import sockets
from trunner.linux.plan import MaskSocket, with_masks
from trunner.linux.probe import probe_host

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@contextlib.contextmanager
def _sockets(*paths: Path) -> Iterator[None]:
    made = []
    try:
        for path in paths:
            s = socket.socket(socket.AF_UNIX)
            made.append(s)
            s.bind(str(path))
        yield
    finally:
        for s in made:
            s.close()


def test_finds_sockets_at_any_depth_and_the_top_itself(tmp_path: Path) -> None:
    tmp_path = tmp_path / "tree"  # beside the suite's jail dir
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    with _sockets(tmp_path / "top.sock", tmp_path / "a" / "b" / "deep.sock"):
        found = sockets.find_sockets(str(tmp_path))
        alone = sockets.find_sockets(str(tmp_path / "top.sock"))
    assert found.sockets == (str(tmp_path / "a" / "b" / "deep.sock"), str(tmp_path / "top.sock"))
    assert found.unlistable == ()
    assert found.entries == 6, found  # a, b, file, fifo and the two sockets
    assert alone.sockets == (str(tmp_path / "top.sock"),)


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    """A link in a bind resolves in the jail's root: what it points to is
    walked where it is bound, or is not in the jail at all."""
    outside, inside = tmp_path / "outside", tmp_path / "inside"
    outside.mkdir()
    inside.mkdir()
    (inside / "to_dir").symlink_to(outside)
    (inside / "to_sock").symlink_to(outside / "s.sock")
    with _sockets(outside / "s.sock"):
        assert sockets.find_sockets(str(inside)).sockets == ()


def test_mount_points_below_the_top_are_not_entered(tmp_path: Path) -> None:
    """A bind is not recursive: the jail sees the directory beneath a mount
    point, not what is mounted there."""
    (tmp_path / "mnt").mkdir()
    with _sockets(tmp_path / "mnt" / "s.sock"):
        skipped = sockets.find_sockets(str(tmp_path), [str(tmp_path / "mnt")])
        top = sockets.find_sockets(str(tmp_path / "mnt"), [str(tmp_path / "mnt")])
    assert skipped.sockets == ()
    assert top.sockets == (str(tmp_path / "mnt" / "s.sock"),)


def test_a_dir_that_cannot_be_listed_but_entered_is_reported(tmp_path: Path) -> None:
    """Search without read (0311): not root, the walk cannot list it, the jail
    could enter it by name; as root it is listed like any other."""
    tmp_path = tmp_path / "tree"
    hidden, closed = tmp_path / "hidden", tmp_path / "closed"
    hidden.mkdir(parents=True)
    closed.mkdir()
    with _sockets(hidden / "s.sock", closed / "t.sock"):
        hidden.chmod(0o311)
        closed.chmod(0o000)
        try:
            found = sockets.find_sockets(str(tmp_path))
        finally:
            hidden.chmod(0o755)
            closed.chmod(0o755)
    if os.geteuid() == 0:
        assert found == sockets.Found(
            (str(closed / "t.sock"), str(hidden / "s.sock")), (), 4)
    else:  # the closed dir: beyond the caller's reach, so the jail's too
        assert (found.sockets, found.unlistable) == ((), (str(hidden),))


def test_missing_top_finds_nothing(tmp_path: Path) -> None:
    assert sockets.find_sockets(str(tmp_path / "nothing")) == sockets.Found()


def test_mount_points_of_this_namespace() -> None:
    points = sockets.mount_points()
    assert "/" in points
    assert "/proc" in points


def test_masks_go_last_in_the_plan_and_change_nothing_else() -> None:
    plan = plan_for(Limits(), probe_host())
    masked = with_masks(plan, ["/b.sock", "/a.sock", "/b.sock"])
    assert masked.root_ops == (*plan.root_ops, MaskSocket(path="/a.sock"),
                               MaskSocket(path="/b.sock"))
    assert with_masks(plan, []) is plan


def test_the_walk_of_this_hosts_system_dirs_is_bounded() -> None:
    """What one backend walks once (warm cache): /usr here takes ~0.17 s."""
    start = time.perf_counter()
    found = sockets.find_sockets("/usr", sockets.mount_points())
    elapsed = time.perf_counter() - start
    assert found.entries > 0
    assert elapsed < scaled(5.0), (elapsed, found.entries)
