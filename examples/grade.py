"""Grade a submission against a directory of cases, each case in its own jail.

    .venv/bin/python examples/grade.py examples/grade/sum.c examples/grade/cases
    .venv/bin/python examples/grade.py examples/grade/sum_buggy.py examples/grade/cases

The source (C or Python) is built once in a jail: a C file is compiled with
`cc` and the binary comes back as a collected file; a Python file is
byte-compiled, which checks its syntax. Then every case, `NAME.in` and
`NAME.out`, runs in a fresh jail of its own, at most `JOBS` at a time: the
binary (or source) is placed in the working dir as a file, the input is fed
on stdin, and the output is compared with the expected one word by word.
One line per case: its verdict (ok, wrong, tle_cpu, tle_wall, mle, crash,
syscall_denied, or another trunner reason), the program's CPU time, its
wall time and its peak memory (`Usage`, also for a case that failed), and
how many bytes it printed. A time limit exceeded is told by what ran out:
`tle_cpu`, the program's CPU time (`cpu_time`: a busy loop), or `tle_wall`,
its wall time (`timeout`: a program that waits). The wall limit is ten
times the CPU limit, so that a busy program runs out of CPU time first
even on a loaded host, where it gets a fraction of a core. Exits 0 when
every case is ok.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import trio

from trunner import ExecFile, Limits, Reason, Runner, RunnerError, Usage

JOBS = 2
BUILD = Limits(wall_time_s=60, cpu_time_s=60, stdout_max_bytes=16 << 20)
#: Each case: 1 s of CPU time, the judge's limit; 10 s of wall time, for a
#: program that waits (at 10x, a busy loop given a tenth of a core on a loaded
#: host still ends by its CPU time, `tle_cpu`, not by the clock).
CASE = Limits(wall_time_s=10, cpu_time_s=1, stdout_max_bytes=64 << 10, processes=8)
#: Verdicts for the reasons a judge names its own way.
VERDICTS = {Reason.CPU_TIME: "tle_cpu", Reason.TIMEOUT: "tle_wall", Reason.MEMORY_LIMIT: "mle"}


@dataclass
class Program:
    argv: list[str]
    files: dict[str, bytes | ExecFile]


@dataclass
class Case:
    name: str
    input: bytes
    expected: bytes


@dataclass
class Row:
    case: str
    verdict: str
    usage: Usage | None = None
    output: str = "-"

    def cells(self) -> list[str]:
        u = self.usage
        if u is None:
            return [self.case, self.verdict, "-", "-", "-", self.output]
        return [self.case, self.verdict, f"{u.cpu_s * 1000:.0f} ms", f"{u.wall_s * 1000:.0f} ms",
                f"{u.peak_memory_bytes / (1 << 20):.1f} MiB", self.output]


async def build(runner: Runner, name: str, code: bytes) -> Program:
    """Compile (C) or byte-compile (Python) a source in a jail; exit on errors."""
    if name.endswith(".c"):
        argv, files, collect = ["cc", "-O2", "-o", "prog", "main.c"], {"main.c": code}, ["prog"]
    else:
        argv = [sys.executable, "-m", "py_compile", "main.py"]
        files, collect = {"main.py": code}, []
    try:
        done = (await runner.exec(argv, files=files, collect=collect, limits=BUILD)).response
    except RunnerError as e:
        sys.exit(f"{name}: the build failed: {e.reason}: {e.detail}")
    if done.exit_code != 0:
        sys.exit(f"{name} does not build:\n{done.stderr.decode(errors='replace')}")
    if name.endswith(".c"):
        binary = done.files[0].data
        print(f"{name}: compiled in a jail ({len(binary)} byte binary)")
        return Program(["./prog"], {"prog": ExecFile(data=binary, executable=True)})
    print(f"{name}: byte-compiled in a jail")
    return Program([sys.executable, "main.py"], {"main.py": code})


async def run_case(runner: Runner, program: Program, case: Case) -> Row:
    """One case in its own jail."""
    try:
        result = await runner.exec(program.argv, stdin=case.input, files=program.files,
                                   limits=CASE)
    except RunnerError as e:
        return Row(case.name, VERDICTS.get(e.reason, e.reason.value), e.usage)
    done = result.response
    if done.signal == signal.SIGSYS:
        verdict = "syscall_denied"
    elif done.signal is not None or done.exit_code != 0:
        verdict = "crash"
    else:
        verdict = "ok" if done.stdout.split() == case.expected.split() else "wrong"
    return Row(case.name, verdict, result.usage, f"{len(done.stdout)} B")


async def grade(name: str, code: bytes, cases: list[Case]) -> list[Row]:
    runner = Runner()
    program = await build(runner, name, code)
    rows: list[Row | None] = [None] * len(cases)
    jobs = trio.CapacityLimiter(JOBS)

    async def one(i: int, case: Case) -> None:
        async with jobs:
            rows[i] = await run_case(runner, program, case)

    async with trio.open_nursery() as nursery:
        for i, case in enumerate(cases):
            nursery.start_soon(one, i, case)
    return [row for row in rows if row is not None]


def main() -> int:
    if len(sys.argv) != 3 or Path(sys.argv[1]).suffix not in (".c", ".py"):
        sys.exit(f"usage: {sys.argv[0]} SOURCE.c|SOURCE.py CASES_DIR")
    source, cases_dir = Path(sys.argv[1]), Path(sys.argv[2])
    cases = [Case(path.stem, path.read_bytes(), path.with_suffix(".out").read_bytes())
             for path in sorted(cases_dir.glob("*.in"))]
    rows = trio.run(grade, source.name, source.read_bytes(), cases)
    line = "{:<14}{:<16}{:>8}{:>10}{:>11}{:>9}".format
    print(line("case", "verdict", "cpu", "wall", "memory", "output"))
    for row in rows:
        print(line(*row.cells()))
    ok = sum(row.verdict == "ok" for row in rows)
    print(f"{ok} of {len(rows)} cases ok")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
