"""examples/grade.py, run as docs/grading.md says, end to end."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from support import scaled

if TYPE_CHECKING:
    from trunner import Limits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRADE = os.path.join(ROOT, "examples", "grade.py")
EXAMPLE = os.path.join(ROOT, "examples", "grade")
#: A case's (cpu, wall) seconds, from the example's table.
Times = tuple[float, float] | None


def _case_limits() -> Limits:
    """The example's own `CASE` limits (examples/ is not a package)."""
    limits: Limits = runpy.run_path(GRADE, run_name="grade_example")["CASE"]
    return limits


CASE = _case_limits()


def grade(submission: str, env: dict[str, str]) -> tuple[int, dict[str, str], dict[str, Times]]:
    """Its exit code, each case's verdict, and each case's (cpu, wall) in seconds
    (None where the row has no usage)."""
    out = subprocess.run(
        [sys.executable, GRADE, os.path.join(EXAMPLE, submission),
         os.path.join(EXAMPLE, "cases")],
        capture_output=True, timeout=120, env=env, cwd=ROOT,
    )
    lines = out.stdout.decode().splitlines()
    assert lines[1].split() == ["case", "verdict", "cpu", "wall", "memory", "output"], out
    rows = [line.split() for line in lines[2:-1]]
    verdicts = {row[0]: row[1] for row in rows}
    times: dict[str, Times] = {}
    for row in rows:  # case verdict CPU ms WALL ms MEM MiB OUTPUT, or "-" for each figure
        if row[2] == "-":
            times[row[0]] = None
        else:
            assert (row[3], row[5]) == ("ms", "ms"), row
            times[row[0]] = (int(row[2]) / 1000, int(row[4]) / 1000)
    return out.returncode, verdicts, times


@pytest.fixture
def env(jail_root: object) -> dict[str, str]:
    # The example's jails go under the test's jail root, so the leak check sees them.
    return {**os.environ, "TMPDIR": str(jail_root)}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this host")
def test_the_correct_c_submission_passes_every_case(env: dict[str, str]) -> None:
    code, verdicts, _ = grade("sum.c", env)
    assert verdicts == dict.fromkeys(
        ["01-small", "02-empty", "03-negative", "04-long", "05-big", "06-single", "07-zero"],
        "ok")
    assert code == 0


@pytest.mark.slow  # waits out its wall-limit case: 10 s
def test_the_buggy_python_submission_fails_each_case_its_own_way(env: dict[str, str]) -> None:
    code, verdicts, times = grade("sum_buggy.py", env)
    assert verdicts == {
        "01-small": "ok",
        "02-empty": "crash",
        "03-negative": "tle_cpu",
        "04-long": "wrong",
        "05-big": "stdout_cap",
        "06-single": "ok",
        "07-zero": "tle_wall",
    }
    assert code == 1
    # What ran out, by the program's own figures (`Usage`): the busy loop its
    # CPU time, before the clock, which is 10x as long (so that it does even
    # given a tenth of a core on a loaded host); the pause the clock, having
    # used under 5 % of its CPU time. The busy loop's figure is within 25 %
    # of the limit: the kill follows a poll of /proc (clock ticks), the
    # figure is the reaped tree's rusage (seen 10 % below, as uid 65534).
    assert CASE.wall_time_s >= 10 * CASE.cpu_time_s, CASE
    busy, paused = times["03-negative"], times["07-zero"]
    assert busy is not None
    assert paused is not None
    assert 0.75 * CASE.cpu_time_s <= busy[0] <= 1.1 * CASE.cpu_time_s, busy
    assert busy[1] < CASE.wall_time_s, busy
    assert paused[0] < 0.05 * CASE.cpu_time_s, paused
    assert CASE.wall_time_s <= paused[1] <= CASE.wall_time_s + scaled(1), paused
