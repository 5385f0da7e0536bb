"""README.md's `trunner.ray` block, as written, against the 2-node cluster
of tests/ray/conftest.py: a driver of its own whose `ray.init(address="auto")`
finds this cluster through RAY_ADDRESS. tests/test_readme.py runs the
README's other blocks."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import trio
from test_readme import ray_programs

from support import scaled

if TYPE_CHECKING:
    from pathlib import Path

    from raysupport import Nodes


async def test_the_readme_ray_block_runs_as_written(nodes: Nodes, tmp_path: Path) -> None:
    [program] = ray_programs()
    (tmp_path / "readme_ray.py").write_text(program)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["RAY_ADDRESS"] = nodes.cluster.address
    with trio.fail_after(scaled(300)):
        done = await trio.run_process([sys.executable, "readme_ray.py"], cwd=tmp_path, env=env,
                                      capture_stdout=True, capture_stderr=True, check=False)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, (out, err)
    stdout, rules_version = out.splitlines()[-1].split(" ")
    assert stdout == "b'42\\n'"
    assert len(rules_version) == 64
