#!/usr/bin/env python3
"""Where a cold jailed spawn spends its time: the helper, step by step.

    python benchmarks/helper_steps.py [--quick] [--json] [-n N]

Four views, all through trunner's own spawn + supervise path, on plans built
by the real `LinuxBackend.open_jail()` with `/bin/true` as the adapter:

 1. timeline: the helper run with a wrapper that timestamps (CLOCK_MONOTONIC,
    shared with the parent) interpreter start, its imports, the plan parse
    and every setup step, then the exec of the adapter and the reap;
 2. leave-one-out: the full plan against the same plan without one item
    group (seccomp=, ll=, userns/netns, nproc=, ...), end to end, interleaved,
    so kernel work outside the helper's Python (exec under a filter, netns
    teardown) is counted too;
 3. imports: `python -X importtime` of the helper path (the installed
    `trunner-worker helper` script) and of the `echo` adapter, top modules;
 4. parent phases of one `Runner.run("echo")`, replayed step by step.

Progress goes to stderr; the tables (or, with --json, one JSON object) to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from trunner.jail import Command
from trunner.limits import Limits
from trunner.linux.backend import LinuxBackend
from trunner.nursery_run import Outcome, supervise
from trunner.cleanup import remove_tree
from trunner.spawn import spawn
from trunner.worker import locate_worker

ADAPTER = ("/bin/true",)
#: Plan item groups removed one at a time (prefixes of the helper's argv items).
GROUPS: dict[str, tuple[str, ...]] = {
    "cgroup": ("cgroup=",),
    "nproc (process count)": ("nproc=",),
    "rlimit": ("rlimit=",),
    "userns+netns": ("userns=", "netns="),
    "netns only": ("netns=",),
    "dropcaps": ("dropcaps=",),
    "landlock (ll=)": ("ll=",),
    "parent death": ("parent=",),
    "seccomp": ("seccomp=",),
}
MARK = "TRUNNER_BENCH_MARKS"
BASE = "full - cgroup"

# Runs in place of the worker binary, started the same way (`python -I -S`,
# trunner found through the path given after -c's code): the same imports
# (trunner.worker, trunner.helper), then helper.main with each step
# timestamped; the marks go to stderr just before the exec.
WRAPPER = r"""
import time
_t = time.perf_counter_ns
marks = [("start", _t())]
import sys
sys.path.insert(0, sys.argv.pop(1))
from trunner.worker import main as _main
marks.append(("import trunner.worker", _t()))
from trunner import helper
marks.append(("import trunner.helper", _t()))
import os, sys

_step = helper._step
def step(plan, name, fn, *args):
    _step(plan, name, fn, *args)
    marks.append((name, _t()))
helper._step = step
_count = helper._count_processes
def count(uid):
    n = _count(uid)
    marks.append(("process_count", _t()))
    return n
helper._count_processes = count
_Plan = helper.Plan
class Plan(_Plan):
    def __init__(self, argv):
        super().__init__(argv)
        marks.append(("plan parse", _t()))
helper.Plan = Plan
_exec = helper._exec
def exec_(argv):
    marks.append(("exec", _t()))
    os.write(2, ("%s %s\n" % (MARK, " ".join("%s=%d" % (n.replace(" ", "_"), t)
                                              for n, t in marks))).encode())
    _exec(argv)
helper._exec = exec_
helper.main(sys.argv[2:])
""".replace("MARK", repr(MARK))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct90(xs: Sequence[float]) -> float:
    s = sorted(xs)
    k = 0.9 * (len(s) - 1)
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Bench:
    def __init__(self, temp_root: str) -> None:
        self.worker = locate_worker()
        self.backend = LinuxBackend(self.worker)
        self.backend.check()
        self.temp_root = temp_root
        self.venv_python = os.path.join(os.path.dirname(self.worker), "python")
        self.real_python = os.path.realpath(sys.executable)

    async def run(self, build: Callable[[tuple[str, ...]], tuple[str, ...]] | None,
                  *, argv: tuple[str, ...] = (), stdin: bytes = b"",
                  stderr_max: int = 64 * 1024) -> tuple[float, float, Outcome]:
        """One spawn through trunner.spawn + supervise; returns (spawn time,
        reap time, outcome). With `build`, the command is the real jailed
        command for ADAPTER, its argv passed through `build` (fresh jail dir
        and cgroup, released after); otherwise `argv` runs bare in a temp dir."""
        jail_dir = tempfile.mkdtemp(prefix="trunner-", dir=self.temp_root)
        jail = None
        try:
            if build is not None:
                jail = self.backend.open_jail(jail_dir=jail_dir, adapter_argv=ADAPTER,
                                              limits=Limits())
                cmd = dataclasses.replace(jail.command, argv=build(jail.command.argv))
            else:
                env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": jail_dir,
                       "TMPDIR": jail_dir, "LANG": "C.UTF-8"}
                cmd = Command(argv=argv, env=env, cwd=jail_dir)
            t0 = time.perf_counter()
            child = await spawn(cmd)
            out = await supervise(child, stdin, deadline=trio.current_time() + 30,
                                  stdout_max_bytes=1 << 20, stderr_max_bytes=stderr_max)
            t1 = time.perf_counter()
        finally:
            if jail is not None:
                with trio.CancelScope(shield=True):
                    await jail.release()
            remove_tree(jail_dir)
        if out.failure is not None or out.exit_code != 0:
            raise RuntimeError(f"{cmd.argv[:2]} failed: {out.failure} {out.detail} "
                               f"exit={out.exit_code} stderr={bytes(out.stderr[-400:])!r}")
        return t0, t1, out


def _plan_bounds(argv: tuple[str, ...]) -> tuple[int, int]:
    """Where the plan items start (after `helper`) and end (at `--`)."""
    return argv.index("helper") + 1, argv.index("--")


def without(prefixes: tuple[str, ...]) -> Callable[[tuple[str, ...]], tuple[str, ...]]:
    def build(argv: tuple[str, ...]) -> tuple[str, ...]:
        start, split = _plan_bounds(argv)
        keep = [a for a in argv[start:split] if not a.startswith(prefixes)]
        return (*argv[:start], *keep, *argv[split:])
    return build


def only_env(argv: tuple[str, ...]) -> tuple[str, ...]:
    start, split = _plan_bounds(argv)
    return (*argv[:start], *(a for a in argv[start:split] if a.startswith("env=")),
            *argv[split:])


def full(argv: tuple[str, ...]) -> tuple[str, ...]:
    return argv


# -- 1. timeline ---------------------------------------------------------------


async def timeline(b: Bench, n: int) -> list[dict[str, Any]]:
    def wrapped(argv: tuple[str, ...]) -> tuple[str, ...]:
        start, _ = _plan_bounds(argv)
        trunner_dir = argv[argv.index("--path") + 1]
        return (b.venv_python, "-I", "-S", "-c", WRAPPER, trunner_dir, *argv[start - 1:])

    per: dict[str, list[float]] = {}
    order: list[str] = []
    for _ in range(n + 1):  # the first is a warm-up
        t0, t1, out = await b.run(wrapped)
        line = next(x for x in bytes(out.stderr).decode().splitlines() if x.startswith(MARK))
        marks = [(k, int(v) / 1e9) for k, v in (i.split("=") for i in line.split()[1:])]
        prev = t0
        steps = [("interpreter start (fork+exec+init, -I -S)", marks[0][1])]
        steps += [(name.replace("_", " ") if name.startswith("import") else name, t)
                  for name, t in marks[1:]]
        steps.append(("exec adapter, exit, reap", t1))
        if not order:
            order = [s for s, _ in steps]
        for name, t in steps:
            per.setdefault(name, []).append(1e3 * (t - prev))
            prev = t
        per.setdefault("total", []).append(1e3 * (t1 - t0))
    per.pop("total")
    rows = [{"step": s, "ms_p50": med(per[s][1:]), "ms_min": min(per[s][1:]),
             "ms_p90": pct90(per[s][1:])} for s in order]
    return rows


# -- 2. leave-one-out --------------------------------------------------------------


async def leave_one_out(b: Bench, n: int) -> dict[str, Any]:
    """Floors, the helper with env= items only, the full plan, the full plan
    without its cgroup, and that base without one more group. The cgroup join
    waits 0 to ~20 ms (an RCU grace period, depending on the last migration),
    which would swamp the other groups' millisecond differences; so they are
    taken off the base without it."""
    base = GROUPS["cgroup"]
    variants: dict[str, Callable[[], Any]] = {
        "/bin/true (spawn floor)": lambda: b.run(None, argv=("/bin/true",)),
        "python -I -S -c pass": lambda: b.run(None, argv=(b.real_python, "-I", "-S", "-c",
                                                          "pass")),
        "venv python -c pass (site)": lambda: b.run(None, argv=(b.venv_python, "-c", "pass")),
        "helper, env= items only": lambda: b.run(only_env),
        "helper, full plan": lambda: b.run(full),
        BASE: lambda: b.run(without(base)),
    }
    for name, prefixes in GROUPS.items():
        if name != "cgroup":
            variants[f"{BASE} - {name}"] = (lambda p=prefixes: b.run(without(base + p)))
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for i in range(n + 1):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            t0, t1, _ = await variants[name]()
            if i:
                times[name].append(1e3 * (t1 - t0))
        if (i + 1) % max(1, (n + 1) // 4) == 0:
            log(f"  leave-one-out: {i + 1}/{n + 1}")
    p50 = {name: med(times[name]) for name in names}
    rows = []
    for name in names:
        if name == BASE:
            saves = p50["helper, full plan"] - p50[name]
        elif name.startswith(BASE + " - "):
            saves = p50[BASE] - p50[name]
        else:
            saves = None
        rows.append({"variant": name, "ms_p50": p50[name], "ms_min": min(times[name]),
                     "ms_p90": pct90(times[name]), "saves_ms": saves})
    return {"rows": rows, "full_p50_ms": p50["helper, full plan"]}


# -- 3. imports ----------------------------------------------------------------------


def parse_importtime(stderr: str) -> dict[str, tuple[int, int, int]]:
    """name -> (self us, cumulative us, depth)."""
    out: dict[str, tuple[int, int, int]] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum, name = line[len("import time:"):].split("|", 2)
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        out[name.strip()] = (int(self_us), int(cum), depth)
    return out


async def imports(b: Bench, n: int) -> dict[str, Any]:
    from trunner.protocol import encode_frame

    def helper_importtime(argv: tuple[str, ...]) -> tuple[str, ...]:
        # argv is (interpreter, -I, -S, worker, ...): add -X importtime after it.
        return (argv[0], "-X", "importtime", *argv[1:])

    paths: dict[str, Callable[[], Any]] = {
        "helper (trunner-worker helper, full plan)":
            lambda: b.run(helper_importtime, stderr_max=1 << 20),
        "echo adapter (trunner-worker echo, no jail)":
            lambda: b.run(None, argv=(b.venv_python, "-X", "importtime", b.worker, "echo"),
                          stdin=encode_frame(b"x" * 58), stderr_max=1 << 20),
    }
    result: dict[str, Any] = {}
    for label, fn in paths.items():
        runs = []
        for _ in range(n + 1):
            _, _, out = await fn()
            runs.append(parse_importtime(bytes(out.stderr).decode(errors="replace")))
        runs = runs[1:]
        names = set().union(*runs)
        agg = {name: (med([r[name][0] for r in runs if name in r]),
                      med([r[name][1] for r in runs if name in r]),
                      runs[0].get(name, (0, 0, 0))[2]) for name in names}
        total_us = sum(a[0] for a in agg.values())
        top_self = sorted(agg.items(), key=lambda kv: -kv[1][0])[:10]
        top_level = sorted(((k, v) for k, v in agg.items() if v[2] == 0),
                           key=lambda kv: -kv[1][1])[:8]
        result[label] = {
            "modules": len(agg),
            "total_ms": total_us / 1e3,
            "top_self": [{"module": k, "self_ms": v[0] / 1e3, "cumulative_ms": v[1] / 1e3}
                         for k, v in top_self],
            "top_level": [{"module": k, "cumulative_ms": v[1] / 1e3} for k, v in top_level],
        }
    return result


# -- 4. parent phases ------------------------------------------------------------------


async def parent_phases(temp_root: str, n: int) -> dict[str, Any]:
    """Runner.run("echo") replayed phase by phase (as in Runner._invoke), next
    to real Runner.run calls, interleaved."""
    from trunner.protocol import encode_frame
    from trunner.runner import Runner, judge

    runner = Runner(temp_root=temp_root)
    payload = b"x" * 58
    phases: dict[str, list[float]] = {}
    real: list[float] = []
    marks: list[tuple[str, float]] = []

    def mark(name: str) -> None:
        marks.append((name, time.perf_counter()))

    for i in range(n + 1):
        limits = runner.limits
        marks.clear()
        mark("")
        adapter_argv = (runner.worker, runner.resolve_mode("echo"))
        frame = encode_frame(payload)
        mark("resolve mode + encode frame")
        runner.rules_version(limits)
        mark("rules_version (ruleset, BPF, BLAKE3)")
        jail_dir = tempfile.mkdtemp(prefix="trunner-", dir=temp_root)
        mark("mkdtemp (jail dir)")
        try:
            jail = runner.backend.open_jail(jail_dir=jail_dir, adapter_argv=adapter_argv,
                                            limits=limits)
            mark("open_jail (plan, cgroup mkdir)")
            try:
                child = await spawn(jail.command)
                mark("spawn (fork+exec, spawn thread)")
                outcome = await supervise(child, frame,
                                          deadline=trio.current_time() + limits.wall_time_s,
                                          stdout_max_bytes=limits.stdout_max_bytes,
                                          stderr_max_bytes=limits.stderr_max_bytes)
                mark("supervise (helper + echo adapter, reap)")
            finally:
                with trio.CancelScope(shield=True):
                    await jail.release()
                mark("release (cgroup rmdir)")
        finally:
            remove_tree(jail_dir)
            mark("remove jail dir")
        if judge(outcome, limits) != payload:
            raise RuntimeError("echo replay: wrong reply")
        mark("judge (decode frame)")
        t0 = time.perf_counter()
        await runner.run("echo", payload)
        t1 = time.perf_counter()
        if i:
            real.append(1e3 * (t1 - t0))
            for (_, a), (name, b) in zip(marks, marks[1:], strict=False):
                phases.setdefault(name, []).append(1e3 * (b - a))
            phases.setdefault("total (replay)", []).append(1e3 * (marks[-1][1] - marks[0][1]))
    rows = [{"phase": k, "ms_p50": med(v)} for k, v in phases.items()]
    rows.append({"phase": "Runner.run (real, same loop)", "ms_p50": med(real)})
    return {"rows": rows}


# -- report -------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    L: list[str] = []
    m = report["meta"]
    L.append(f"trunner helper steps: n={m['n']} per variant, {m['elapsed_s']:.0f} s; "
             f"adapter {' '.join(ADAPTER)}; {m['kernel']}, {m['cpus']} CPUs, "
             f"{'root' if m['root'] else 'non-root'}; load avg {m['loadavg_1m'][0]:.1f} -> "
             f"{m['loadavg_1m'][1]:.1f}")
    L.append("")
    L.append("1. timeline of one jailed spawn (ms per step; the helper wrapped to timestamp)")
    L.append(f"   {'':<44} {'p50':>8} {'min':>8} {'p90':>8}")
    total = 0.0
    for r in report["timeline"]:
        total += r["ms_p50"]
        L.append(f"   {r['step']:<44} {r['ms_p50']:8.2f} {r['ms_min']:8.2f} {r['ms_p90']:8.2f}")
    L.append(f"   {'sum of p50s':<44} {total:8.2f}")
    L.append("")
    L.append("2. end to end, spawn to reap (ms), interleaved; 'saves' = p50 of the plan it is")
    L.append("   taken from minus its own p50 (groups are taken from the plan without cgroup)")
    L.append(f"   {'':<44} {'p50':>8} {'min':>8} {'p90':>8} {'saves':>8}")
    for r in report["leave_one_out"]["rows"]:
        saves = "" if r["saves_ms"] is None else f" {r['saves_ms']:8.2f}"
        L.append(f"   {r['variant']:<44} {r['ms_p50']:8.2f} {r['ms_min']:8.2f}"
                 f" {r['ms_p90']:8.2f}{saves}")
    L.append("")
    L.append("3. imports (python -X importtime, median of runs)")
    for label, r in report["imports"].items():
        L.append(f"   {label}: {r['modules']} modules, {r['total_ms']:.1f} ms in imports")
        L.append("     top-level (cumulative): " + ", ".join(
            f"{x['module']} {x['cumulative_ms']:.1f}" for x in r["top_level"]))
        L.append("     top by self time:       " + ", ".join(
            f"{x['module']} {x['self_ms']:.1f}" for x in r["top_self"]))
    L.append("")
    L.append("4. parent phases of Runner.run('echo') (p50 ms)")
    for r in report["parent_phases"]["rows"]:
        L.append(f"   {r['phase']:<44} {r['ms_p50']:8.2f}")
    return "\n".join(L)


async def bench(n: int) -> dict[str, Any]:
    import platform

    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="trunner-bench-") as tmp:
        b = Bench(tmp)
        log("timeline ...")
        tl = await timeline(b, n)
        log("leave-one-out ...")
        loo = await leave_one_out(b, n)
        log("imports ...")
        imp = await imports(b, max(3, n // 4))
        log("parent phases ...")
        pp = await parent_phases(tmp, n)
        if os.listdir(tmp):
            raise RuntimeError(f"jail dirs left behind: {os.listdir(tmp)}")
    return {
        "meta": {
            "n": n, "elapsed_s": time.perf_counter() - started,
            "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
            "cpus": os.cpu_count(), "root": os.getuid() == 0,
            "python": platform.python_version(),
            "loadavg_1m": [load_start, os.getloadavg()[0]],
        },
        "timeline": tl,
        "leave_one_out": loo,
        "imports": imp,
        "parent_phases": pp,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few runs per variant (~10 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("-n", type=int, help="measured runs per variant")
    args = parser.parse_args(argv)
    n = args.n if args.n is not None else (4 if args.quick else 30)
    if n < 1:
        parser.error("-n must be at least 1")
    report = trio.run(bench, n)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
