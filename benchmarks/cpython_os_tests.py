#!/usr/bin/env python3
"""CPython's own OS-facing test modules, in trunner, under bubblewrap, bare.

    python benchmarks/cpython_os_tests.py [--modes trunner,bwrap,bare] [--modules M,...]
        [-j 2] [--python /usr/bin/python3.11] [--logs DIR] [--json]

Each module runs alone, as `PYTHON -m test -v MODULE` (regrtest, one
process), three ways:

- `trunner`: `Runner.exec` (what `trunner exec` does) with
  `Limits(wall_time_s=150, cpu_time_s=600, stdout_max_bytes=32 MiB,
  stderr_max_bytes=32 MiB, processes=256)`, the rest the defaults;
- `bwrap`: `bwrap --unshare-all --die-with-parent --ro-bind / / --proc /proc
  --dev /dev --tmpfs /tmp`, its cwd, HOME and TMPDIR `/tmp`;
- `bare`: no sandbox, a fresh temp dir as cwd, HOME and TMPDIR.

All three get the environment trunner gives (`PATH`, `HOME`, `TMPDIR`,
`LANG`) and the same 150 s of wall time. A module's count is the failures
plus errors of unittest's last summary line (`FAILED (failures=F,
errors=E, ...)`, `OK` is 0); it *died* when there is no such summary (a
crash, a signal, the deadline, a trunner error). `-j` modules run at once
(2 by default), the three ways of one module interleaved with the others.
Progress goes to stderr; the table (or `--json`) to stdout. `--logs DIR`
keeps each run's output as `DIR/MODE/MODULE.txt`.

The interpreter is Debian's (`libpython3.11-testsuite` holds its `test`
package; `scripts/setup` installs it, and bubblewrap, as root); any
interpreter whose `test` package is installed will do (`--python`).

The 23 modules (MODULES): the process, signal, file, descriptor, terminal,
socket, memory-map and resource interfaces of the standard library:
test_os, test_posix, test_signal, test_subprocess, test_ssl, test_pty,
test_multiprocessing_fork, test_socket, test_select, test_selectors,
test_epoll, test_poll, test_fcntl, test_resource, test_shutil,
test_tempfile, test_threading, test_threadsignals, test_mmap, test_io,
test_faulthandler, test_fork1, test_wait4.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

import trio
import trio.lowlevel

MODULES = (
    "test_os", "test_posix", "test_signal", "test_subprocess", "test_ssl", "test_pty",
    "test_multiprocessing_fork", "test_socket", "test_select", "test_selectors",
    "test_epoll", "test_poll", "test_fcntl", "test_resource", "test_shutil",
    "test_tempfile", "test_threading", "test_threadsignals", "test_mmap", "test_io",
    "test_faulthandler", "test_fork1", "test_wait4",
)
MODES = ("trunner", "bwrap", "bare")
WALL_S = 150.0
MiB = 1 << 20
DEBIAN_PYTHON = "/usr/bin/python3.11"
BWRAP = ("bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
         "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp")

_SUMMARY = re.compile(rb"^(OK|FAILED)\b(?: \((.*)\))?", re.MULTILINE)
_RAN = re.compile(rb"^Ran (\d+) tests? in ", re.MULTILINE)
_CASE = re.compile(rb"^(FAIL|ERROR): (\S+) \(([^)]*)\)", re.MULTILINE)


@dataclass
class Outcome:
    """One module run one way."""

    module: str
    mode: str
    ran: int | None = None
    failed: int | None = None  # failures + errors; None: died
    died: str | None = None  # why, when there is no summary
    cases: list[str] = field(default_factory=list)  # "FAIL: Class.test" of each
    elapsed_s: float = 0.0


def parse(module: str, mode: str, output: bytes) -> Outcome:
    """Read unittest's last summary from a module's output: how many tests
    ran, how many failed or errored, and which. No summary: it died."""
    out = Outcome(module, mode)
    ran = _RAN.findall(output)
    summaries = _SUMMARY.findall(output)
    if not ran or not summaries:
        out.died = "no unittest summary"
        return out
    out.ran = int(ran[-1])
    word, detail = summaries[-1]
    counts = dict(re.findall(rb"(\w+)=(\d+)", detail or b""))
    out.failed = 0 if word == b"OK" else int(counts.get(b"failures", 0)) + int(
        counts.get(b"errors", 0))
    out.cases = sorted({f"{kind.decode()}: {where.decode().removeprefix(f'test.{module}.')}"
                        for kind, _name, where in _CASE.findall(output)})
    return out


def python_with_tests(python: str | None) -> str:
    """The interpreter to test: `python`, else Debian's, else this one,
    whichever has the test suite."""
    for candidate in (python, DEBIAN_PYTHON, sys.executable):
        if candidate and os.path.exists(candidate):
            found = subprocess.run([candidate, "-c", "import test.test_os"],
                                   capture_output=True, check=False)
            if found.returncode == 0:
                return candidate
    raise SystemExit("no interpreter with CPython's test suite: apt-get install"
                     " libpython3.11-testsuite (scripts/setup does, as root)")


def environment(home: str) -> dict[str, str]:
    """What trunner's jail gets, for the other two ways as well."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home,
            "LANG": os.environ.get("LANG", "C.UTF-8")}


async def run_trunner(runner: Any, argv: list[str]) -> tuple[bytes, str | None]:  # noqa: ANN401
    from trunner import RunnerError

    try:
        result = (await runner.exec(argv)).response
    except RunnerError as e:
        return b"", f"trunner: {e.reason}"
    output = result.stdout + result.stderr
    if result.signal is not None:
        return output, f"signal {result.signal}"
    return output, None


async def run_plain(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[bytes, str | None]:
    """Run `argv` with no jail of trunner's, for WALL_S at most. Forked by the
    thread that waits for it: bwrap's --die-with-parent is a parent-death
    signal, which follows the forking thread (trio retires its idle ones)."""
    def run() -> tuple[bytes, str | None]:
        try:
            done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=WALL_S, check=False)
        except subprocess.TimeoutExpired as e:
            return (e.stdout or b"") + (e.stderr or b""), "timeout"
        output = done.stdout + done.stderr
        return output, f"signal {-done.returncode}" if done.returncode < 0 else None

    return await trio.to_thread.run_sync(run, abandon_on_cancel=False)


async def run_one(module: str, mode: str, python: str, runner: Any,  # noqa: ANN401
                  logs: str | None) -> Outcome:
    argv = [python, "-m", "test", "-v", module]
    began = trio.current_time()
    if mode == "trunner":
        output, died = await run_trunner(runner, argv)
    elif mode == "bwrap":
        output, died = await run_plain([*BWRAP, "--", *argv], "/", environment("/tmp"))
    else:
        with tempfile.TemporaryDirectory(prefix="cpython-os-") as home:
            output, died = await run_plain(argv, home, environment(home))
    out = parse(module, mode, output)
    if died is not None and out.died is None and out.failed is None:
        out.died = died
    elif died is not None:
        out.died = died  # a summary, then a signal or a deadline: still died
        out.failed = None
    out.elapsed_s = round(trio.current_time() - began, 1)
    if logs:
        where = trio.Path(logs, mode)
        await where.mkdir(parents=True, exist_ok=True)
        await (where / f"{module}.txt").write_bytes(output)
    shown = out.died or f"{out.failed} of {out.ran}"
    print(f"{module:28} {mode:8} {shown:24} {out.elapsed_s:6.1f} s", file=sys.stderr)
    return out


def table(outcomes: list[Outcome], modes: list[str], modules: list[str]) -> str:
    by = {(o.module, o.mode): o for o in outcomes}
    lines = ["| module | " + " | ".join(modes) + " |", "| --- |" + " ---: |" * len(modes)]
    for module in modules:
        cells = []
        for mode in modes:
            o = by[module, mode]
            cells.append(f"died ({o.died})" if o.died else str(o.failed))
        lines.append(f"| {module} | " + " | ".join(cells) + " |")
    totals = [sum(by[m, mode].failed or 0 for m in modules) for mode in modes]
    died = [sum(1 for m in modules if by[m, mode].died) for mode in modes]
    lines.append("| **cases failing or erroring** | " + " | ".join(map(str, totals)) + " |")
    lines.append("| **modules that died** | " + " | ".join(map(str, died)) + " |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[Outcome]:
    modes = args.modes.split(",")
    modules = args.modules.split(",") if args.modules else list(MODULES)
    python = python_with_tests(args.python)
    if "bwrap" in modes and shutil.which("bwrap") is None:
        raise SystemExit("bwrap is not installed (apt-get install bubblewrap), or leave it out"
                         " of --modes")
    runner = None
    if "trunner" in modes:
        from trunner import Limits, Runner

        runner = Runner(limits=Limits(wall_time_s=WALL_S, cpu_time_s=600,
                                      stdout_max_bytes=32 * MiB, stderr_max_bytes=32 * MiB,
                                      processes=256))
    limiter = trio.CapacityLimiter(args.jobs)
    outcomes: list[Outcome] = []

    async def one(module: str, mode: str) -> None:
        async with limiter:
            outcomes.append(await run_one(module, mode, python, runner, args.logs))

    async with trio.open_nursery() as nursery:
        for module in modules:
            for mode in modes:
                nursery.start_soon(one, module, mode)
                await trio.lowlevel.checkpoint()  # start in order: FIFO through the limiter
    outcomes.sort(key=lambda o: (modules.index(o.module), modes.index(o.mode)))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--modules", help="comma-separated (default: the 23 of MODULES)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--python", help=f"the interpreter to test (default {DEBIAN_PYTHON})")
    parser.add_argument("--logs", help="keep each run's output under this dir")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    # A job in the background of a non-interactive shell starts with SIGINT
    # and SIGQUIT ignored, and so would every module run bare or in bwrap
    # (test_signal's KeyboardInterrupt tests then fail): give them back.
    for sig in (signal.SIGINT, signal.SIGQUIT):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else signal.SIG_DFL)
    outcomes = trio.run(main_async, args)
    if args.json:
        print(json.dumps({"outcomes": [asdict(o) for o in outcomes]}, indent=1))
    else:
        modules = list(dict.fromkeys(o.module for o in outcomes))
        print(table(outcomes, args.modes.split(","), modules))


if __name__ == "__main__":
    main()
