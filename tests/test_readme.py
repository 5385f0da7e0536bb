"""README.md runs as written: every Python block in it, its files written
where it says, its other blocks run as they are, each a program of its own,
against a real jail. The `trunner.ray` block needs a Ray cluster: it runs in
tests/ray (test_ray_readme.py), from `ray_programs()` here.

The README is for users, and stays short: at most `MAX_LINES` lines (issue
34). Detail goes to docs/, linked from it (tests/test_docs.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import scaled

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_LINE = re.compile(r"# ([\w./-]+\.py)\n")
RAY = re.compile(r"^import ray\b", re.MULTILINE)
#: A standing rule (issue 34): a later change that needs more moves detail to docs/.
MAX_LINES = 350


def blocks() -> tuple[dict[str, str], list[str], list[str]]:
    """The README's files (a block whose first line is `# PATH.py`), its
    programs, and its programs that need Ray."""
    files: dict[str, str] = {}
    programs: list[str] = []
    ray: list[str] = []
    for block in BLOCK.findall(README.read_text()):
        named = FILE_LINE.match(block)
        if named:
            files[named.group(1)] = block
        elif RAY.search(block):
            ray.append(block)
        else:
            programs.append(block)
    return files, programs, ray


def ray_programs() -> list[str]:
    return blocks()[2]


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move detail to docs/"


def test_the_readme_shows_its_files_and_programs() -> None:
    files, programs, ray = blocks()
    assert set(files) == {"my_modes/my_pkg/modes.py", "my_modes/my_pkg/__init__.py"}
    assert len(programs) == 6
    assert len(ray) == 1


def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no cc on this host: the README's example builds with it")
    files, programs, _ = blocks()
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    outputs = []
    for i, program in enumerate(programs):
        (tmp_path / f"readme_{i}.py").write_text(program)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([sys.executable, f"readme_{i}.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=scaled(300))
        assert done.returncode == 0, (program, done.stdout, done.stderr)
        outputs.append(done.stdout.splitlines())
    main, stream, session, from_asyncio, signals, usage = outputs
    assert main[0].startswith("{'x': [1, 2, 3]} ")
    assert main[1] == "0 b'hi\\n'"
    assert main[2] == "127 b'trunner: no-such-program: not found\\n'"
    assert main[3] == "0"
    assert main[4] == "{'html': '<p>...</p>'}"
    assert stream == ["b'42\\n'", "0"]
    assert session[0].startswith("b'42\\n' Usage(wall_s="), session
    assert from_asyncio == ["b'hi\\n'"]
    assert signals == ["0", "1", "2"]
    assert usage[0].startswith("Usage(wall_s=")
    assert usage[1].startswith("cpu_time Usage(wall_s=")
