"""Load: 500 echo invocations at concurrency 8 through one Runner.

Every response must equal its own unique request (no loss, no mix-up), and
afterwards the parent's fds, child processes, jail dirs and RSS are back at
the baseline. Shares its logic with `benchmarks/load.py` (`-n 10000` there).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from conftest import child_pids, open_fds
from support import scaled

if TYPE_CHECKING:
    from types import ModuleType

MiB = 1024 * 1024
LOAD_PY = Path(__file__).resolve().parent.parent / "benchmarks" / "load.py"


def _load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trunner_bench_load", LOAD_PY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # long: 500 runs
async def test_500_invocations_at_concurrency_8_no_loss_no_mixup_no_leak(
    jail_root: Path,
) -> None:
    load = _load_module()
    fds_before = open_fds()
    with trio.fail_after(scaled(240)):  # generous: ~30 s expected on 2 cores
        figures = await load.run_load(500, 8, temp_root=str(jail_root), seed=1234)
    print(
        f"{figures['invocations_per_s']:.1f} inv/s, p50 {figures['latency_ms']['p50']:.0f} ms,"
        f" p99 {figures['latency_ms']['p99']:.0f} ms, RSS {figures['rss_growth_mib']:+.1f} MiB"
    )
    assert figures["errors"] == []
    assert figures["lost"] == []
    assert figures["mixed_up"] == []
    assert figures["ok"] == 500
    # Leaks, within load.py's own snapshots (after a warm-up run) ...
    problems = load.leak_problems(figures["before_full"], figures["after_full"], 50 * MiB)
    assert problems == []
    assert figures["rss_growth_mib"] < 50
    # ... and against this test's own view.
    assert child_pids() == []
    assert os.listdir(jail_root) == []
    assert open_fds() == fds_before
