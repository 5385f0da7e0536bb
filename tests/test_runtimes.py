"""docs/toolchains.md's per-runtime table, checked: each row's program runs
clean at its `processes` floor and, one below, answers as the table says
(the JVM's with every GC thread started at once, its worst case);
Node below 7 hangs until its wall time; a Java OutOfMemoryError exits 1.
The figures are this 2-CPU host's: elsewhere the JVM rows are skipped."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conftest import make_runner
from support import scaled
from trunner import Limits, RunnerError
from trunner.errors import Reason
from trunner.limits import GiB

if TYPE_CHECKING:
    from trunner import Runner

DOC = Path(__file__).resolve().parent.parent / "docs" / "toolchains.md"
ROW = re.compile(r"^\| (OpenJDK 17|Node 20) \| `([^`]+)` \| ([^|]+) \| (\d+) \| ([^|]+) \|$", re.M)
ROOT = os.getuid() == 0
CPUS = len(os.sched_getaffinity(0))
WARNINGS = ("Failed to start thread", "pthread_create: Resource temporarily unavailable")
#: G1 starts a GC worker and a refinement thread late, under load: with this
#: flag it starts them at once, so the floor and one below are not timing's.
EVERY_THREAD = "-XX:-UseDynamicNumberOfGCThreads"

MAIN = b"public class Main { public static void main(String[] a) { System.out.println(6 * 7); } }"
OOM = b"""public class Main { public static void main(String[] a) {
    java.util.List<long[]> l = new java.util.ArrayList<>();
    while (true) l.add(new long[1 << 20]);
} }"""


def rows() -> list[tuple[str, str, str, int, str]]:
    found = [(m[1], m[2], m[3], int(m[4]), m[5]) for m in ROW.finditer(DOC.read_text())]
    assert len(found) == 5, found
    return found


def test_the_table_has_its_rows() -> None:
    assert [(r[1], r[3]) for r in rows()] == [
        ("java Main", 15), ("javac Main.java", 15), ("java Main", 22), ("javac Main.java", 22),
        ("node -e", 8)]


def _limits(when: str, processes: int) -> Limits | None:
    """The row's limits on this host, or None where they cannot be had here."""
    base = {"processes": processes, "wall_time_s": scaled(30), "cpu_time_s": scaled(30)}
    if when.startswith("as root, `memory_bytes` 1 GiB"):
        return Limits(**base) if ROOT else None  # type: ignore[arg-type]
    if when.startswith("G1"):
        # As root a 2 GiB cgroup; not root, no cgroup: either way G1.
        return Limits(**base, memory_bytes=2 * GiB)  # type: ignore[arg-type]
    return Limits(**base)  # type: ignore[arg-type]


async def _inputs(runner: Runner, program: str) -> dict[str, bytes]:
    """The files `program` runs on: `java Main` the class, built once."""
    if program != "java Main":
        return {"Main.java": MAIN}
    built = (await runner.exec(["javac", "Main.java"], files={"Main.java": MAIN},
                               collect=["Main.class"],
                               limits=Limits(processes=64, wall_time_s=scaled(60),
                                             cpu_time_s=scaled(60)))).response
    return {"Main.class": built.files[0].data}


async def _run(runner: Runner, program: str, files: dict[str, bytes], limits: Limits,
               every_thread: bool = False) -> tuple[int | None, str]:
    flag = [EVERY_THREAD] if every_thread else []
    argv = {"java Main": ["java", *flag, "Main"],
            "javac Main.java": ["javac", *[f"-J{f}" for f in flag], "Main.java"],
            "node -e": ["node", "-e", "console.log(6 * 7)"]}[program]
    r = (await runner.exec(argv, files=files, limits=limits)).response
    return r.exit_code, (r.stdout + r.stderr).decode(errors="replace")


@pytest.mark.parametrize("row", range(5))
async def test_a_runtime_runs_at_its_floor_and_not_below(jail_root: Path, row: int) -> None:
    runtime, program, when, floor, below = rows()[row]
    if shutil.which(program.split()[0]) is None:
        pytest.skip(f"no {program.split()[0]} on this host")
    if runtime.startswith("OpenJDK") and CPUS != 2:
        pytest.skip(f"the JVM's figures are for 2 CPUs; this process has {CPUS}")
    at, under = _limits(when, floor), _limits(when, floor - 1)
    if at is None or under is None:
        pytest.skip(f"the row is for {when.split(',')[0]}")
    runner = make_runner(temp_root=str(jail_root))
    jvm = runtime.startswith("OpenJDK")
    files = await _inputs(runner, program)
    for every_thread in (False, True) if jvm else (False,):
        code, out = await _run(runner, program, files, at, every_thread)
        assert code == 0, out
        assert not any(w in out for w in WARNINGS), out
    code, out = await _run(runner, program, files, under, jvm)
    message = re.search(r"`([^`]+)` on (stdout|stderr)", below)
    assert message is not None, below
    assert message[1] in out, out
    if "exit 1" in below:
        assert code == 1, out


async def test_node_below_seven_hangs_until_its_wall_time(jail_root: Path) -> None:
    if shutil.which("node") is None:
        pytest.skip("no node on this host")
    assert "Node below 7 does not fail: it hangs until `wall_time_s`" in DOC.read_text()
    runner = make_runner(temp_root=str(jail_root))
    with pytest.raises(RunnerError) as e:
        await runner.exec(["node", "-e", "console.log(1)"],
                          limits=Limits(processes=6, wall_time_s=scaled(3)))
    assert e.value.reason == Reason.TIMEOUT


@pytest.mark.parametrize("flags", [[], ["-Xmx64m"]], ids=["default-heap", "Xmx64m"])
async def test_a_java_out_of_memory_error_exits_1(jail_root: Path, flags: list[str]) -> None:
    """Not `memory_limit`: the heap runs out first (as root a quarter of
    `memory_bytes`; not root, the default heap only with -Xmx is bounded
    below what the host has, so only that case runs there)."""
    if shutil.which("java") is None:
        pytest.skip("no java on this host")
    if not ROOT and not flags:
        pytest.skip("not root, the JVM sizes its heap from the host's memory: -Xmx only")
    runner = make_runner(temp_root=str(jail_root))
    r: Any = (await runner.exec(["java", *flags, "Main.java"], files={"Main.java": OOM},
                                limits=Limits(wall_time_s=scaled(60), cpu_time_s=scaled(60))
                                )).response
    assert (r.exit_code, r.signal) == (1, None)
    assert b"java.lang.OutOfMemoryError: Java heap space" in r.stderr
