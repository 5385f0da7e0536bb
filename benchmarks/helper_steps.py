#!/usr/bin/env python3
"""Where a cold jailed spawn spends its time: the helper, step by step.

    python benchmarks/helper_steps.py [--quick] [--json] [-n N]

Every run goes through `trunner.invocation.start` and `serve`, the functions
`Runner` uses, on the real `LinuxBackend` with `/bin/true` as the adapter;
a subclass only timestamps `open_jail` and the jail's `release` and, where a
view needs it, rewrites the command. Four views:

 1. timeline: the helper run by a wrapper that timestamps (CLOCK_MONOTONIC,
    shared with the parent) interpreter start, its imports, the plan parse,
    every `helper._apply` step and the exec, then the adapter's exit and reap;
 2. leave-one-out: the full plan against `LinuxBackend(unsafe_skip=(layer,))`
    for each layer in `trunner.helper.SKIPPABLE`, spawn to reap, interleaved,
    so kernel work outside the helper's Python (exec under a filter, netns
    setup) is counted too;
 3. imports: `python -X importtime` of the helper stage and of the jailed
    `echo` adapter, top modules;
 4. parent phases of one invocation: `Runner.run("echo")`'s calls
    (`invocation.start`, `serve`, `judge`) timed around, next to real
    `Runner.run` calls in the same loop.

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
from collections.abc import Callable  # noqa: TC003  annotates the BenchBackend dataclass
from typing import TYPE_CHECKING, Any

import trio

from trunner import invocation
from trunner.helper import SKIPPABLE
from trunner.jail import Command
from trunner.limits import Limits
from trunner.linux.backend import LinuxBackend, LinuxJail
from trunner.linux.plan import environment
from trunner.protocol import encode_frame
from trunner.spawn import COLD
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trunner.nursery_run import Outcome

ADAPTER = ("/bin/true",)
LIMITS = Limits()
CAPS = invocation.Caps(wall_time_s=30.0, stdout_max_bytes=1 << 20, stderr_max_bytes=1 << 20)
ECHO_FRAME = encode_frame(b"x" * 58)  # 64 bytes, as in spawn_latency.py
MARK = "TRUNNER_BENCH_MARKS"
FULL = "helper, full plan"

Argv = tuple[str, ...]
now = time.perf_counter  # CLOCK_MONOTONIC, as the wrapper's perf_counter_ns

# Runs in place of the worker script, started the same way (`python -I -S`,
# trunner found through the --path dir, passed first): the same imports, then
# helper.main with its plan parse, install import, every `_apply` step and the
# exec timestamped; the marks go to stderr just before the exec.
WRAPPER = r"""
import time
_t = time.perf_counter_ns
marks = [("start", _t())]
import posix, sys
sys.path.insert(0, sys.argv.pop(1))
from trunner.worker import main
marks.append(("import trunner.worker", _t()))
from trunner.kernel import install
marks.append(("install", _t()))
from trunner import helper
marks.append(("import trunner.helper", _t()))

def after(fn, name=None):
    def call(*args):
        result = fn(*args)
        marks.append((name or args[0], _t()))
        return result
    return call

helper._read_plan = after(helper._read_plan, "plan parse")
helper._apply = after(helper._apply)
_execv = posix.execv
def execv(path, args):
    if path.endswith("trunner-waiter"):  # the helper's own waiting stage
        return _execv(path, args)
    marks.append(("exec", _t()))
    posix.write(2, ("MARK " + ";".join("%s=%d" % m for m in marks) + "\n").encode())
    _execv(path, args)
posix.execv = execv
helper.main(sys.argv[2:])
""".replace("MARK", MARK)
STEP_NAMES = {"start": "interpreter start (fork+exec+init, -I -S)",
              "install": "import trunner.kernel.install (_kernel)"}


@dataclasses.dataclass
class TimedJail(LinuxJail):
    at: dict[str, float] = dataclasses.field(default_factory=dict)

    async def release(self) -> None:
        self.at["release"] = now()
        await super().release()
        self.at["released"] = now()


@dataclasses.dataclass
class BenchBackend(LinuxBackend):
    """The real backend, timestamped (`at`: open_jail, opened, release,
    released). `rewrite` maps the jailed command's argv; `bare` replaces
    the jailed command with this argv, unjailed (same env and cwd)."""

    rewrite: Callable[[Argv], Argv] | None = None
    bare: Argv = ()
    at: dict[str, float] = dataclasses.field(default_factory=dict)

    def open_jail(self, *, jail_dir: str, adapter_argv: Sequence[str],
                  limits: Limits, in_process: str = "", **options: str) -> TimedJail:
        self.at["open_jail"] = now()
        if self.bare:
            env = environment(self.profile.environment)
            jail = TimedJail(Command(argv=self.bare, env=env, cwd=jail_dir), jail_dir, at=self.at)
        else:
            real = super().open_jail(jail_dir=jail_dir, adapter_argv=adapter_argv, limits=limits,
                                     **options)  # stdio= (streaming) from 707defd on
            cmd = real.command
            if self.rewrite is not None:
                cmd = dataclasses.replace(cmd, argv=self.rewrite(cmd.argv))
            jail = TimedJail(cmd, jail_dir, real.cgroups, real.memory_cgroup, real.host_id,
                             at=self.at)
        self.at["opened"] = now()
        return jail


async def once(backend: BenchBackend, temp_root: str, adapter: Argv = ADAPTER,
               frame: bytes = b"") -> tuple[dict[str, float], Outcome]:
    """One invocation through invocation.start + serve; its timestamps
    (start, open_jail, opened, started, release, released, served)."""
    at = backend.at
    at.clear()
    at["start"] = now()
    started = await invocation.start(backend, adapter, LIMITS, temp_root, COLD)
    at["started"] = now()
    out = await invocation.serve(started, frame, CAPS)
    at["served"] = now()
    if out.failure is not None or out.exit_code != 0:
        raise RuntimeError(f"{started.jail.command.argv[:2]} failed: {out.failure} "
                           f"{out.detail} report={out.report} exit={out.exit_code} "
                           f"stderr={bytes(out.stderr[-400:])!r}")
    return dict(at), out


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


def summary(xs: Sequence[float]) -> dict[str, float]:
    return {"ms_p50": med(xs), "ms_min": min(xs), "ms_p90": pct90(xs)}


# -- 1. timeline ---------------------------------------------------------------


def run_wrapper(argv: Argv) -> Argv:
    """(python, -I, -S, worker, --path, DIR, helper, ...) -> the same
    interpreter and flags on WRAPPER, DIR first, then `helper ...`."""
    i = argv.index("--path")
    return (*argv[:i - 1], "-c", WRAPPER, argv[i + 1], *argv[i + 2:])


async def timeline(worker: str, tmp: str, n: int) -> list[dict[str, Any]]:
    backend = BenchBackend(worker, rewrite=run_wrapper)
    per: dict[str, list[float]] = {}
    for i in range(n + 1):  # the first is a warm-up
        at, out = await once(backend, tmp)
        line = next(x for x in out.stderr.decode().splitlines() if x.startswith(MARK))
        marks = [(STEP_NAMES.get(k, k), int(v) / 1e9) for k, v in
                 (m.rsplit("=", 1) for m in line[len(MARK) + 1:].split(";"))]
        marks.append(("exec adapter, exit, reap", at["release"]))
        prev = at["opened"]  # spawn() is called next
        for name, t in marks:
            if i:
                per.setdefault(name, []).append(1e3 * (t - prev))
            prev = t
    return [{"step": name, **summary(xs)} for name, xs in per.items()]


# -- 2. leave-one-out ----------------------------------------------------------


async def leave_one_out(worker: str, tmp: str, n: int) -> dict[str, Any]:
    """Floors, the full plan, the full plan without each skippable layer
    and without all of them; interleaved, the first variant rotating."""
    python = os.path.realpath(sys.executable)  # noqa: ASYNC240  setup, untimed
    venv_python = sys.executable  # the venv's, which starts a user mode's adapter
    variants = {
        "/bin/true (spawn floor)": BenchBackend(worker, bare=("/bin/true",)),
        "python -I -S -c pass": BenchBackend(worker, bare=(python, "-I", "-S", "-c", "pass")),
        "venv python -c pass (site)": BenchBackend(worker, bare=(venv_python, "-c", "pass")),
        FULL: BenchBackend(worker),
    }
    skips: dict[str, tuple[str, ...]] = {}
    for layer in SKIPPABLE:
        # Not root, the capability drop needs the user namespace (CAP_SETPCAP
        # is held only inside it): without namespaces it is skipped too.
        both = layer == "namespaces" and os.getuid() != 0
        skips[f"full - {layer}"] = (layer, "capabilities") if both else (layer,)
    skips["full - every skippable layer"] = SKIPPABLE
    for name, skip in skips.items():
        variants[name] = BenchBackend(worker, unsafe_skip=skip)
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for i in range(n + 1):  # the first round is a warm-up
        k = i % len(names)
        for name in names[k:] + names[:k]:
            at, _ = await once(variants[name], tmp)
            if i:
                times[name].append(1e3 * (at["release"] - at["opened"]))
        if (i + 1) % max(1, (n + 1) // 4) == 0:
            log(f"  leave-one-out: {i + 1}/{n + 1}")
    full = med(times[FULL])
    rows = [{"variant": name, **summary(xs),
             "saves_ms": full - med(xs) if name.startswith("full - ") else None,
             "skips": list(skips.get(name, ()))}
            for name, xs in times.items()]
    return {"rows": rows, "full_p50_ms": full}


# -- 3. imports ----------------------------------------------------------------


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


async def imports(worker: str, tmp: str, n: int) -> dict[str, Any]:
    def importtime(argv: Argv) -> Argv:
        return (argv[0], "-X", "importtime", *argv[1:])

    backend = BenchBackend(worker)
    # The adapter stage as the helper execs it (`python -I -S ... echo`
    # where this revision has adapter_argv), with -X importtime.
    echo = importtime(backend.adapter_argv("echo", builtin=True))
    paths: dict[str, Callable[[], Any]] = {
        "helper (trunner-worker helper, full plan)":
            lambda: once(BenchBackend(worker, rewrite=importtime), tmp),
        "echo adapter (trunner-worker echo, jailed)":
            lambda: once(backend, tmp, adapter=echo, frame=ECHO_FRAME),
    }
    result: dict[str, Any] = {}
    for label, fn in paths.items():
        runs = []
        for _ in range(n + 1):
            _, out = await fn()
            runs.append(parse_importtime(out.stderr.decode(errors="replace")))
        runs = runs[1:]
        agg = {name: (med([r[name][0] for r in runs if name in r]),
                      med([r[name][1] for r in runs if name in r]),
                      runs[0].get(name, (0, 0, 0))[2]) for name in set().union(*runs)}
        top_self = sorted(agg.items(), key=lambda kv: -kv[1][0])[:10]
        top_level = sorted(((k, v) for k, v in agg.items() if v[2] == 0),
                           key=lambda kv: -kv[1][1])[:8]
        result[label] = {
            "modules": len(agg),
            "total_ms": sum(a[0] for a in agg.values()) / 1e3,
            "top_self": [{"module": k, "self_ms": v[0] / 1e3, "cumulative_ms": v[1] / 1e3}
                         for k, v in top_self],
            "top_level": [{"module": k, "cumulative_ms": v[1] / 1e3} for k, v in top_level],
        }
    return result


# -- 4. parent phases ----------------------------------------------------------

#: (label, from, to) over the timestamps of `parent_phases`.
PHASES = (
    ("resolve mode + encode frame", "begin", "encoded"),
    ("rules_version (cached)", "encoded", "start"),
    ("start: mkdtemp (jail dir)", "start", "open_jail"),
    ("start: open_jail (plan, cgroup mkdir)", "open_jail", "opened"),
    ("start: spawn (fork+exec, spawn thread)", "opened", "started"),
    ("serve: supervise (helper + echo, reap)", "started", "release"),
    ("serve: release (cgroup rmdir)", "release", "released"),
    ("serve: remove jail dir", "released", "served"),
    ("judge (decode frame)", "served", "judged"),
    ("total (timed calls)", "begin", "judged"),
)


async def parent_phases(worker: str, tmp: str, n: int) -> dict[str, Any]:
    """The calls of `Runner.run("echo")` (runner.py `_run`), each timed, on
    the timestamped backend; then a real `Runner.run` on a plain one."""
    from trunner.runner import Runner

    runner = Runner(temp_root=tmp, worker=worker)
    backend = BenchBackend(worker)
    payload = b"x" * 58
    phases: dict[str, list[float]] = {label: [] for label, _, _ in PHASES}
    real: list[float] = []
    for i in range(n + 1):  # the first is a warm-up
        at = backend.at
        at.clear()
        at["begin"] = now()
        adapter = backend.adapter_argv(runner.resolve_mode("echo"), builtin=True)
        frame = encode_frame(payload)
        at["encoded"] = now()
        runner.rules_version(LIMITS)
        at["start"] = now()
        started = await invocation.start(backend, adapter, LIMITS, tmp, COLD)
        at["started"] = now()
        out = await invocation.serve(started, frame, invocation.Caps.of(LIMITS))
        at["served"] = now()
        reply = invocation.judge(out, started.jail, LIMITS.stdout_max_bytes)
        at["judged"] = now()
        if reply != payload:
            raise RuntimeError(f"echo: wrong reply {reply!r}")
        t0 = now()
        await runner.run("echo", payload)
        t1 = now()
        if i:
            real.append(1e3 * (t1 - t0))
            for label, a, b in PHASES:
                phases[label].append(1e3 * (at[b] - at[a]))
    rows = [{"phase": k, "ms_p50": med(v)} for k, v in phases.items()]
    rows.append({"phase": "Runner.run (real, same loop)", "ms_p50": med(real)})
    return {"rows": rows}


# -- report --------------------------------------------------------------------


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
    for r in report["timeline"]:
        L.append(f"   {r['step']:<44} {r['ms_p50']:8.2f} {r['ms_min']:8.2f} {r['ms_p90']:8.2f}")
    L.append(f"   {'sum of p50s':<44} {sum(r['ms_p50'] for r in report['timeline']):8.2f}")
    L.append("")
    L.append("2. spawn to reap (ms), interleaved; 'saves' = p50 of the full plan minus its own")
    L.append("   p50 (the layer left out with LinuxBackend(unsafe_skip=(layer,)))")
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
    L.append("4. parent phases of Runner.run('echo'), its invocation calls timed (p50 ms)")
    for r in report["parent_phases"]["rows"]:
        L.append(f"   {r['phase']:<44} {r['ms_p50']:8.2f}")
    return "\n".join(L)


async def bench(n: int) -> dict[str, Any]:
    import platform

    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    worker = locate_worker()
    LinuxBackend(worker).check()
    with tempfile.TemporaryDirectory(prefix="trunner-bench-") as tmp:
        log("timeline ...")
        tl = await timeline(worker, tmp, n)
        log("leave-one-out ...")
        loo = await leave_one_out(worker, tmp, n)
        log("imports ...")
        imp = await imports(worker, tmp, max(3, n // 4))
        log("parent phases ...")
        pp = await parent_phases(worker, tmp, n)
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
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
