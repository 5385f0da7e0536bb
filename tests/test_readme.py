"""README.md's "Use" section runs as written: its files are written where
it says, its other Python blocks run as they are, each a program of its
own, against a real jail."""

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
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_LINE = re.compile(r"# ([\w./-]+\.py)\n")


def use_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Use\n")
    return text[start : text.index("\n## ", start + 1)]


def blocks() -> tuple[dict[str, str], list[str]]:
    """The section's files (a block whose first line is `# PATH.py`) and programs."""
    files: dict[str, str] = {}
    programs: list[str] = []
    for block in BLOCK.findall(use_section()):
        named = FILE_LINE.match(block)
        if named:
            files[named.group(1)] = block
        else:
            programs.append(block)
    return files, programs


def test_the_use_section_shows_its_files_and_programs() -> None:
    files, programs = blocks()
    assert set(files) == {"my_modes/my_pkg/modes.py", "my_modes/my_pkg/__init__.py"}
    assert len(programs) == 2


def test_the_use_section_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no cc on this host: the README's example builds with it")
    files, programs = blocks()
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    outputs = []
    for i, program in enumerate(programs):
        (tmp_path / f"use_{i}.py").write_text(program)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([sys.executable, f"use_{i}.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=scaled(300))
        assert done.returncode == 0, (program, done.stdout, done.stderr)
        outputs.append(done.stdout.splitlines())
    main, signals = outputs
    assert main[0].startswith("{'x': [1, 2, 3]} ")
    assert main[1] == "0 b'hi\\n'"
    assert main[2] == "127 b'trunner: no-such-program: not found\\n'"
    assert main[3] == "0"
    assert main[4] == "{'html': '<p>...</p>'}"
    assert signals == ["0", "1", "2"]
