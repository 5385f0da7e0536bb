"""examples/interactive.py: a solution and an interactor, each jailed,
talking through the caller; each verdict exact. At least 10 s of wall time
and 2 s of idle time (more on a slow host: `scaled`), so that scheduling on
a busy host cannot cause a false TLE."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import child_pids
from support import scaled
from trunner import Limits, Runner

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "interactive.py"
PYTHON = [sys.executable, "-c"]
#: Guesses 1, 2, 3, ...: more than 10 guesses for 737.
LINEAR = "n = 1\nwhile True:\n    print(n, flush=True)\n    if input() == '=': break\n    n += 1\n"
STUCK = "print(500, flush=True)\nimport time\ntime.sleep(1e9)"


def example() -> dict[str, Any]:
    return runpy.run_path(str(EXAMPLE), run_name="interactive_example")


async def verdict(runner: Runner, solution: str, *, idle_s: float = 2.0) -> tuple[str, str]:
    names = example()
    got = await names["judge"](
        runner, [*PYTHON, solution], [*PYTHON, names["INTERACTOR"], "737"],
        solution_limits=Limits(wall_time_s=scaled(10.0), cpu_time_s=5.0),
        interactor_limits=Limits(wall_time_s=scaled(20.0), cpu_time_s=5.0),
        idle_s=scaled(idle_s))
    return got.verdict, got.detail


async def test_binary_search_is_accepted(runner: Runner) -> None:
    assert await verdict(runner, example()["SOLUTION"]) == ("AC", "")
    assert child_pids() == []


async def test_too_many_guesses_is_a_wrong_answer(runner: Runner) -> None:
    assert await verdict(runner, LINEAR) == ("WA", "the interactor did not accept")


async def test_a_crash_after_the_answer_is_a_runtime_error(runner: Runner) -> None:
    crash = example()["SOLUTION"] + "raise SystemExit(3)\n"
    assert await verdict(runner, crash) == ("RE", "the solution exited 3 (signal None)")


@pytest.mark.slow
async def test_a_solution_that_stops_answering_is_an_idle_tle(runner: Runner) -> None:
    name, detail = await verdict(runner, STUCK)
    assert name == "TLE-idle"
    assert f"(idle limit {scaled(2.0)} s)" in detail
    silent = float(detail.split(" for ")[1].split(" s ")[0])
    assert silent >= scaled(2.0)
    assert child_pids() == []  # both runs ended with the verdict
