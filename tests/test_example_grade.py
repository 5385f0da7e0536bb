"""examples/grade.py, run as the README says, end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "grade")


def grade(submission: str, env: dict[str, str]) -> tuple[int, dict[str, str]]:
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "grade.py"),
         os.path.join(EXAMPLE, submission), os.path.join(EXAMPLE, "cases")],
        capture_output=True, timeout=120, env=env, cwd=ROOT,
    )
    lines = out.stdout.decode().splitlines()
    assert lines[1].split() == ["case", "verdict", "cpu", "wall", "memory", "output"], out
    verdicts = dict(line.split()[:2] for line in lines[2:-1])
    return out.returncode, verdicts


@pytest.fixture
def env(jail_root: object) -> dict[str, str]:
    # The example's jails go under the test's jail root, so the leak check sees them.
    return {**os.environ, "TMPDIR": str(jail_root)}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this host")
def test_the_correct_c_submission_passes_every_case(env: dict[str, str]) -> None:
    code, verdicts = grade("sum.c", env)
    assert verdicts == dict.fromkeys(
        ["01-small", "02-empty", "03-negative", "04-long", "05-big", "06-single", "07-zero"],
        "ok")
    assert code == 0


def test_the_buggy_python_submission_fails_each_case_its_own_way(env: dict[str, str]) -> None:
    code, verdicts = grade("sum_buggy.py", env)
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
