"""examples/judge/judge.py, run as docs/grading.md says, end to end: every
language this host has, each verdict exact; every one it lacks named with
its reason. CI runs it as root and as uid 65534 (no memory cgroup there:
the over-memory case is Java's alone)."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_runtimes import rows

from support import scaled
from trunner.linux.probe import probe_host

ROOT = Path(__file__).resolve().parent.parent
JUDGE = ROOT / "examples" / "judge" / "judge.py"
JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"
LANGUAGES = ["c", "c++", "java", "python", "node", "rust"]
EXTENSIONS = {"c": "c", "c++": "cpp", "java": "java", "python": "py", "node": "js", "rust": "rs"}
#: The buggy submission's verdict on each case: the same in every language.
SUM = {
    ("sum", "01-small"): "AC",
    ("sum", "02-long"): "WA",
    ("sum", "03-negative"): "TLE-cpu",
    ("sum", "04-table"): "MLE",
    ("sum", "05-empty"): "RE",
    ("sum", "06-huge"): "OLE",
    ("sum-wall", "01-small"): "AC",
    ("sum-wall", "02-zero"): "TLE-wall",
}
OVER_MEMORY = ("sum", "04-table")


def example() -> dict[str, Any]:
    """The example's own names (examples/ is not a package)."""
    return runpy.run_path(str(JUDGE), run_name="judge_example")


def present() -> list[str]:
    """The languages this host has, found as the test's own: tools on the
    jail's PATH, rustup's toolchain in this uid's home."""
    tools = {"c": ["gcc"], "c++": ["g++"], "java": ["javac", "java"], "python": ["python3"],
             "node": ["node"]}
    found = [name for name, names in tools.items()
             if all(shutil.which(tool, path=JAIL_PATH) for tool in names)]
    home = Path.home()
    rustup = Path(os.environ.get("RUSTUP_HOME") or home / ".rustup")
    cargo = Path(os.environ.get("CARGO_HOME") or home / ".cargo")
    try:
        rust = rustup.is_dir() and (cargo / "bin" / "rustc").exists()
    except PermissionError:
        rust = False
    if rust and os.access(rustup, os.R_OK | os.X_OK):
        found.append("rust")
    return found


def expected(languages: list[str], memory_cgroup: bool) -> dict[tuple[str, str, str, str], str]:
    """(language, source, problem, case) -> verdict, for the table it prints."""
    table = {}
    for lang in languages:
        ext = EXTENSIONS[lang]
        table[(lang, f"sum.{ext}", "-", "build")] = "ok"
        for (problem, case), verdict in SUM.items():
            if (problem, case) == OVER_MEMORY and not memory_cgroup and lang != "java":
                continue
            table[(lang, f"sum.{ext}", problem, case)] = verdict
        table[(lang, f"typo.{ext}", "-", "build")] = "CE"
    return table


def test_its_limits_keep_each_verdict_apart() -> None:
    """The timing rules the verdicts rest on, read from the example: a CPU
    limit a tenth of the wall one where a busy loop runs (so it ends by CPU
    time on a loaded host); where a program waits, a CPU limit the JVM's
    start (~0.1 s) is under 5 % of; the JVM and Node at their documented
    `processes` floors (docs/toolchains.md)."""
    names = example()
    problems = {p.name: p for p in names["PROBLEMS"]}
    assert problems["sum"].wall_time_s >= 10 * problems["sum"].cpu_time_s
    assert problems["sum-wall"].cpu_time_s >= 20 * 0.1
    assert [(p, c.name) for p in problems for c in problems[p].cases] == list(SUM)
    floors = {runtime: max(r[3] for r in rows() if r[0] == runtime) for runtime, *_ in rows()}
    assert names["JAVA_PROCESSES"] >= floors["OpenJDK 17"]
    assert names["NODE_PROCESSES"] >= floors["Node 20"]


@pytest.mark.slow  # waits out its wall-limit cases (5 s each) and CPU-limit ones
def test_the_judge_gives_each_language_its_verdicts(jail_root: Path) -> None:
    # The example's jails go under the test's jail root, so the leak check sees them.
    env = {**os.environ, "TMPDIR": str(jail_root)}
    out = subprocess.run([sys.executable, str(JUDGE)], capture_output=True, text=True,
                         timeout=scaled(600), env=env, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    memory_cgroup = bool(probe_host().memory_cgroup_base)
    assert lines[0].startswith(f"as uid {os.getuid()}, "), lines[0]
    assert lines[0].endswith("a memory cgroup per run" if memory_cgroup else
                             "no memory cgroup: MLE is only Java's -Xmx"), lines[0]
    header = lines.index("lang    source    problem   case         verdict         cpu"
                         "      wall     memory  detail")
    rows = [line.split() for line in lines[header + 1:] if not line.startswith("skipped ")]
    for row in rows:  # lang source problem case verdict CPU ms WALL ms MEM MiB detail...
        assert (row[6], row[8], row[10]) == ("ms", "ms", "MiB"), row
    got = {tuple(row[:4]): row[4] for row in rows}
    languages = present()
    assert got == expected(languages, memory_cgroup)

    skips = [line for line in lines if line.startswith("skipped ")]
    missing = [lang for lang in LANGUAGES if lang not in languages]
    by_language = [line for line in skips if line.split()[1].rstrip(":") in missing]
    assert [line.split()[1] for line in by_language] == [f"{lang}:" for lang in missing]
    for line in by_language:  # each names its reason
        reason = line.split(": ", 1)[1]
        assert reason.startswith("no "), line
    over = [line for line in skips if line.startswith("skipped sum/04-table in ")]
    skipped = [lang for lang in languages if lang != "java"]
    if memory_cgroup or not skipped:
        assert over == []
    else:
        assert over == [f"skipped sum/04-table in {', '.join(skipped)}: meant to exceed the"
                        " memory limit, which only a memory cgroup would enforce for them, and"
                        " this caller's runs have none (as root they do, or with a delegated"
                        " cgroup: docs/install.md#cgroups)"]
    assert len(skips) == len(by_language) + len(over), skips
