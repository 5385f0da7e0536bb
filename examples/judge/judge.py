"""A judge for C, C++, Java, Python, Node and Rust, every compile and every run in a jail.

    .venv/bin/python examples/judge/judge.py            # every language present
    .venv/bin/python examples/judge/judge.py c java     # some of them

Each language has two submissions in `submissions/`: `sum.*`, which sums
the integers on its input with one bug per failing case (the verdicts AC,
WA, TLE-cpu, TLE-wall, MLE, RE and OLE), and `typo.*`, which does not
compile (CE; Python's `py_compile` and Node's `--check` are the compile
step there). Every submission is built once, in a jail; the binary (or the
classes, or the source) is then placed in each case's own jail as a file.

All of it runs on ONE pool (`runner.pool("exec")`), opened with the build's
limits: a build takes a prewarmed worker; a case takes its problem's limits
(`pool.exec(..., limits=...)`), so a jail started for that call, in one of
the pool's slots. The two problems have the same task and different limits:
`sum` is decided by CPU time (the wall limit twenty times the CPU limit, so
a busy loop runs out of CPU time first even on a loaded host), `sum-wall` by
the wall clock (a program that waits; its CPU limit is far above what the
JVM's start uses). Per language, `processes` is what the runtime needs: the
JVM's documented floor (docs/toolchains.md), Node's 8.

Verdicts: trunner's reason where the run failed (`cpu_time` TLE-cpu,
`timeout` TLE-wall, `memory_limit` MLE, `stdout_cap` or `stderr_cap` OLE);
a Java `OutOfMemoryError` (exit 1, under `-Xmx`, read from stderr) is MLE
too; any other nonzero exit or a signal is RE; otherwise the output decides,
word by word (AC, WA). A trunner failure that is not the program's (say
`sandbox_setup`) is IE, the judge's own error. Each row gives the program's
CPU time, wall time and peak memory (`Usage`, also for a case that failed).

What is left out is said, with the reason: a language whose toolchain is
absent (Rust needs rustup's `~/.rustup` and `~/.cargo`, bound into the jail
with `Runner(binds=...)`), and a case meant to exceed the memory limit where
nothing would stop it: MLE is the run's memory cgroup (as root, or a
delegated cgroup) or the runtime's own bound (Java's `-Xmx`). Exits 0 once
every submission was judged, 2 on a usage error.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from trunner import ExecFile, Limits, Reason, Runner, RunnerError, Usage
from trunner.limits import KiB, MiB
from trunner.linux.probe import probe_host

if TYPE_CHECKING:
    from trunner.pool import WorkerPool

HERE = Path(__file__).resolve().parent
SUBMISSIONS = HERE / "submissions"
#: The PATH a program has in the jail: a tool is present if it is found there.
JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Runs at a time: the pool's size (each case's jail takes one of its slots).
JOBS = 4
#: A build: compilers start threads and processes (rustc, javac: 64 is ample).
BUILD = Limits(wall_time_s=120, cpu_time_s=120, processes=64, stdout_max_bytes=32 * MiB)
#: The JVM's `processes` floor on 2 CPUs, G1 (docs/toolchains.md: 15 to 22,
#: 22 the highest, every late GC thread started); `-XX:ActiveProcessorCount=2`
#: makes it size its thread pools as there on a host of any size.
JAVA_PROCESSES = 22
#: Node's floor (docs/toolchains.md; below 7 it hangs).
NODE_PROCESSES = 8
#: A native program or Python: itself and a few.
PROCESSES = 4


@dataclass(frozen=True)
class Case:
    name: str
    input: bytes
    expected: bytes
    #: Meant to exceed the memory limit: judged only where something bounds memory.
    over_memory: bool = False


@dataclass(frozen=True)
class Problem:
    name: str
    cpu_time_s: float
    wall_time_s: float
    memory_bytes: int
    stdout_max_bytes: int
    cases: tuple[Case, ...]

    def limits(self, processes: int) -> Limits:
        return Limits(cpu_time_s=self.cpu_time_s, wall_time_s=self.wall_time_s,
                      memory_bytes=self.memory_bytes, stdout_max_bytes=self.stdout_max_bytes,
                      processes=processes)


def numbers(*values: int) -> bytes:
    return " ".join(map(str, values)).encode() + b"\n"


PROBLEMS = (
    # Decided by CPU time: 1 s of CPU, 20 s of wall (20x: a busy loop given a
    # tenth of a core on a loaded host still ends by its CPU time, with room).
    Problem("sum", cpu_time_s=1, wall_time_s=20, memory_bytes=256 * MiB,
            stdout_max_bytes=64 * KiB, cases=(
                Case("01-small", numbers(1, 2, 3), b"6"),
                Case("02-long", numbers(*range(1, 151)), b"11325"),
                Case("03-negative", numbers(5, -3, 2), b"4"),
                Case("04-table", numbers(7, 200_000_000, 1), b"200000008", over_memory=True),
                Case("05-empty", b"", b"0"),
                Case("06-huge", numbers(1, 5_000_000_000_000), b"5000000000001"),
            )),
    # Decided by the wall clock: 5 s of wall, 10 s of CPU (a program that
    # waits uses almost none: the JVM's start, about 1 %).
    Problem("sum-wall", cpu_time_s=10, wall_time_s=5, memory_bytes=128 * MiB,
            stdout_max_bytes=64 * KiB, cases=(
                Case("01-small", numbers(4, 5), b"9"),
                Case("02-zero", numbers(4, 0, 5), b"9"),
            )),
)


@dataclass(frozen=True)
class Language:
    name: str
    extension: str  # of its submissions in submissions/
    source: str  # the source's name in the jail
    compile: tuple[str, ...]
    run: tuple[str, ...]  # "{heap}": the Java heap, in MiB
    processes: int = PROCESSES
    #: What the build leaves that the run needs (globs); the source itself if empty.
    outputs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    #: Bounds its own heap (`-Xmx`): an over-memory case is judged anywhere.
    bounds_heap: bool = False
    #: Host trees bound into the jail (read-only, exec allowed).
    binds: tuple[str, ...] = ()


def rust() -> Language | str:
    """rustup's Rust (`$RUSTUP_HOME`, `$CARGO_HOME`, or in the home), or why not."""
    home = Path.home()
    rustup = Path(os.environ.get("RUSTUP_HOME") or home / ".rustup")
    cargo = Path(os.environ.get("CARGO_HOME") or home / ".cargo")
    for tree in (rustup, cargo / "bin" / "rustc"):
        try:
            if not tree.exists():
                return f"no rustup toolchain: no {tree} (set RUSTUP_HOME and CARGO_HOME)"
        except PermissionError:
            return f"no rustup toolchain: {tree} is not readable by uid {os.getuid()}"
        if not os.access(tree, os.R_OK | os.X_OK):
            return f"no rustup toolchain: {tree} is not readable by uid {os.getuid()}"
    env = {"PATH": f"{cargo / 'bin'}:{JAIL_PATH}", "RUSTUP_HOME": str(rustup),
           "CARGO_HOME": str(cargo)}
    return Language("rust", "rs", "main.rs", ("rustc", "-O", "-o", "main", "main.rs"),
                    ("./main",), outputs=("main",), env=env, binds=(str(rustup), str(cargo)))


def languages() -> tuple[list[Language], dict[str, str]]:
    """The languages this host has (their tools on the jail's PATH), and why each other is not."""
    found: list[Language] = []
    skipped: dict[str, str] = {}
    table = [
        (("gcc",), Language("c", "c", "main.c", ("gcc", "-O2", "-o", "main", "main.c"),
                            ("./main",), outputs=("main",))),
        (("g++",), Language("c++", "cpp", "main.cpp", ("g++", "-O2", "-o", "main", "main.cpp"),
                            ("./main",), outputs=("main",))),
        (("javac", "java"), Language(
            "java", "java", "Main.java", ("javac", "Main.java"),
            ("java", "-Xmx{heap}m", "-XX:ActiveProcessorCount=2", "Main"),
            processes=JAVA_PROCESSES, outputs=("*.class",), bounds_heap=True)),
        (("python3",), Language("python", "py", "main.py",
                                ("python3", "-m", "py_compile", "main.py"),
                                ("python3", "main.py"))),
        (("node",), Language("node", "js", "main.js", ("node", "--check", "main.js"),
                             ("node", "main.js"), processes=NODE_PROCESSES)),
    ]
    for tools, language in table:
        missing = [tool for tool in tools if shutil.which(tool, path=JAIL_PATH) is None]
        if missing:
            skipped[language.name] = f"no {', '.join(missing)} on the jail's PATH ({JAIL_PATH})"
        else:
            found.append(language)
    rs = rust()
    if isinstance(rs, str):
        skipped["rust"] = rs
    else:
        found.append(rs)
    return found, skipped


@dataclass
class Row:
    language: str
    submission: str
    problem: str
    case: str
    verdict: str
    usage: Usage | None = None
    detail: str = ""

    def cells(self) -> list[str]:
        u = self.usage
        figures = ["-", "-", "-"] if u is None else [
            f"{u.cpu_s * 1000:.0f} ms", f"{u.wall_s * 1000:.0f} ms",
            f"{u.peak_memory_bytes / MiB:.1f} MiB"]
        return [self.language, self.submission, self.problem, self.case, self.verdict,
                *figures, self.detail]


#: A trunner reason that is the program's verdict.
REASONS = {Reason.CPU_TIME: "TLE-cpu", Reason.TIMEOUT: "TLE-wall",
           Reason.MEMORY_LIMIT: "MLE", Reason.STDOUT_CAP: "OLE", Reason.STDERR_CAP: "OLE"}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class Built:
    """A submission that compiled: what each case's jail gets."""

    argv: list[str]
    files: dict[str, bytes | ExecFile]


class Judge:
    def __init__(self, pool: WorkerPool, jobs: trio.CapacityLimiter,
                 memory_cgroup: bool) -> None:
        self.pool = pool
        self.jobs = jobs
        self.memory_cgroup = memory_cgroup
        self.rows: list[Row] = []
        #: "problem/case" -> the languages that skipped it (nothing bounds their memory).
        self.skipped: dict[str, list[str]] = {}

    async def build(self, language: Language, submission: str) -> Built | None:
        code = (SUBMISSIONS / submission).read_bytes()
        row = Row(language.name, submission, "-", "build", "CE")
        self.rows.append(row)
        try:
            async with self.jobs:
                result = await self.pool.exec(
                    list(language.compile), files={language.source: code},
                    collect=list(language.outputs), env=language.env, limits=BUILD)
        except RunnerError as e:  # a compile past a limit is CE; trunner's own failure, IE
            row.usage, row.detail = e.usage, e.reason.value
            row.verdict = "CE" if e.reason in REASONS else "IE"
            return None
        done, row.usage = result.response, result.usage
        if done.exit_code != 0:
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            errors = [line for line in lines if "error" in line.lower()] or lines
            row.detail = errors[0].strip()[:60] if errors else f"exit {done.exit_code}"
            return None
        row.verdict = "ok"
        if not language.outputs:
            return Built(list(language.run), {language.source: code})
        return Built(list(language.run), {
            f.path: ExecFile(data=f.data, executable=bool(f.mode & 0o111)) for f in done.files})

    async def run_case(self, language: Language, submission: str, built: Built,
                       problem: Problem, case: Case) -> None:
        row = Row(language.name, submission, problem.name, case.name, "IE")
        self.rows.append(row)
        heap = str(problem.memory_bytes // MiB // 2)  # Java: half, the rest the JVM's own
        argv = [word.replace("{heap}", heap) for word in built.argv]
        try:
            async with self.jobs:
                result = await self.pool.exec(argv, stdin=case.input, files=built.files,
                                              limits=problem.limits(language.processes))
        except RunnerError as e:
            row.usage, row.detail = e.usage, e.reason.value
            row.verdict = REASONS.get(e.reason, "IE")
            return
        done, row.usage = result.response, result.usage
        if done.signal is not None:
            row.verdict, row.detail = "RE", signal_name(done.signal)
        elif done.exit_code != 0:
            if language.bounds_heap and b"java.lang.OutOfMemoryError" in done.stderr:
                row.verdict, row.detail = "MLE", "OutOfMemoryError"
            else:
                row.verdict, row.detail = "RE", f"exit {done.exit_code}"
        else:
            row.verdict = "AC" if done.stdout.split() == case.expected.split() else "WA"
            row.detail = f"{len(done.stdout)} B out"

    async def judge(self, language: Language) -> None:
        for kind in ("sum", "typo"):
            submission = f"{kind}.{language.extension}"
            built = await self.build(language, submission)
            if built is None:
                continue
            async with trio.open_nursery() as nursery:
                for problem in PROBLEMS:
                    for case in problem.cases:
                        if case.over_memory and not (self.memory_cgroup or language.bounds_heap):
                            key = f"{problem.name}/{case.name}"
                            self.skipped.setdefault(key, []).append(language.name)
                            continue
                        nursery.start_soon(self.run_case, language, submission, built,
                                           problem, case)


def open_runner(chosen: list[Language], skipped: dict[str, str]) -> tuple[Runner, list[Language]]:
    """A `Runner` with the toolchains the chosen languages bind; a language
    whose bind is refused (say, a tree another user may write, as root) is
    skipped, with trunner's reason."""
    binds = [tree for language in chosen for tree in language.binds]
    try:
        return Runner(binds=binds), chosen
    except (RunnerError, ValueError) as e:
        if not binds:
            raise
        reason = e.detail if isinstance(e, RunnerError) else str(e)
        for language in chosen:
            if language.binds:
                skipped[language.name] = f"its toolchain cannot be bound: {reason}"
        return Runner(), [language for language in chosen if not language.binds]


async def judge_all(runner: Runner, chosen: list[Language], memory_cgroup: bool) -> Judge:
    jobs = trio.CapacityLimiter(JOBS)
    async with runner.pool("exec", size=JOBS, limits=BUILD) as pool:
        judge = Judge(pool, jobs, memory_cgroup)
        async with trio.open_nursery() as nursery:
            for language in chosen:
                nursery.start_soon(judge.judge, language)
    return judge


def main() -> int:
    found, skipped = languages()
    names = sys.argv[1:]
    known = {language.name for language in found} | set(skipped)
    if unknown := [name for name in names if name not in known]:
        print(f"usage: {sys.argv[0]} [LANGUAGE...]; unknown {unknown}, known {sorted(known)}",
              file=sys.stderr)
        return 2
    chosen = [language for language in found if not names or language.name in names]
    runner, chosen = open_runner(chosen, skipped)
    memory_cgroup = bool(probe_host().memory_cgroup_base)
    memory = ("a memory cgroup per run" if memory_cgroup else
              "no memory cgroup: MLE is only Java's -Xmx")
    print(f"as uid {os.getuid()}, {len(os.sched_getaffinity(0))} CPUs, {memory}")
    line = "{:<8}{:<10}{:<10}{:<13}{:<10}{:>9}{:>10}{:>11}  {}".format
    for problem in PROBLEMS:
        print(f"problem {problem.name}: {problem.cpu_time_s:g} s CPU, "
              f"{problem.wall_time_s:g} s wall, {problem.memory_bytes // MiB} MiB, "
              f"{problem.stdout_max_bytes // KiB} KiB of output, {len(problem.cases)} cases")
    judge = trio.run(judge_all, runner, chosen, memory_cgroup)
    print(line("lang", "source", "problem", "case", "verdict", "cpu", "wall", "memory",
               "detail").rstrip())
    order = {language.name: i for i, language in enumerate(chosen)}
    cases = {(p.name, c.name): i for i, (p, c) in
             enumerate((p, c) for p in PROBLEMS for c in p.cases)}
    judge.rows.sort(key=lambda r: (order[r.language], r.submission.startswith("typo"),
                                   cases.get((r.problem, r.case), -1)))
    for row in judge.rows:
        print(line(*row.cells()).rstrip())
    for name, reason in skipped.items():
        if not names or name in names:
            print(f"skipped {name}: {reason}")
    for case, langs in judge.skipped.items():
        print(f"skipped {case} in {', '.join(sorted(langs, key=order.__getitem__))}: meant to"
              " exceed the memory limit, which only a memory cgroup would enforce for them, and"
              " this caller's runs have none (as root they do, or with a delegated cgroup:"
              " docs/install.md#cgroups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
