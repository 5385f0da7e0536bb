"""Smoke test of the benchmark harness: both scripts run in quick mode and
report every figure as a positive number. No performance target is asserted:
the targets are reported by the harness, PASS or MISS, never enforced here.

Each benchmark runs with TMPDIR a dir of the test's own (`bench_env`): its
scratch and jail dirs (tempfile's, and a `Runner`'s default temp_root) are
not in the shared temp dir, which another run or a host's cleaner may sweep.
The benchmark runs are `slow` (long and exhaustive); CI runs them."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from support import scaled

if TYPE_CHECKING:
    from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(ROOT, "benchmarks")
TIMEOUT_S = scaled(300)
ALWAYS = ("bare", "trunner_cold", "cat", "python_floor")
CONCURRENCY = ("1", "2", "4", "8", "16")


def bench_env(tmp_path: Path) -> dict[str, str]:
    """The benchmarks' environment: TMPDIR a dir of this test's own, where they
    make their scratch and jail dirs."""
    scratch = tmp_path / "bench-tmp"
    scratch.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(scratch)}


def run_quick_json(script: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH_DIR, script), "--quick", "--json", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT_S,
        cwd=ROOT,
        env=bench_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    report = json.loads(proc.stdout)
    assert isinstance(report, dict)
    return report


def positive(x: object) -> bool:
    return (
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
    )


def non_negative(x: object) -> bool:
    return (
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
    )


def check_latency(name: str, fig: dict[str, Any]) -> None:
    for key in ("p50", "p90", "p99", "mean", "min", "max", "parent_cpu_ms_per_inv"):
        assert positive(fig[key]), (name, key, fig[key])
    assert fig["n"] >= 1
    assert fig["min"] <= fig["p50"] <= fig["p90"] <= fig["p99"] <= fig["max"], (name, fig)
    for p in ("p50", "p90", "p99"):
        assert positive(fig["ratio_vs_bare"][p]), (name, p)
    child = fig["child_cpu_ms_per_inv"]
    assert child is None or non_negative(child), (name, child)


@pytest.mark.slow
def test_spawn_latency_quick_reports_every_figure(tmp_path: Path) -> None:
    saved, svg = tmp_path / "run.json", tmp_path / "cdf.svg"
    report = run_quick_json("spawn_latency.py", tmp_path, "--save", str(saved),
                            "--plot", str(svg))
    assert json.loads(saved.read_text()) == report
    check_plot(svg, report)
    check_compare(saved, tmp_path)
    assert {"meta", "latency_ms", "unavailable", "throughput", "parent_cpu_ms_per_inv",
            "drain", "targets"} <= set(report)
    assert positive(report["meta"]["elapsed_s"])
    assert report["meta"]["frame_bytes"] == 64

    lat = report["latency_ms"]
    for name in ALWAYS:
        assert lat[name] is not None, report["unavailable"].get(name)
        check_latency(name, lat[name])
    assert lat["bare"]["ratio_vs_bare"]["p50"] == 1.0
    # Optional variants: figures when available, otherwise n/a with a reason.
    for name in ("bwrap", "trunner_prewarmed"):
        if lat[name] is None:
            assert report["unavailable"][name], name
        else:
            check_latency(name, lat[name])
    if shutil.which("bwrap") is None:
        assert lat["bwrap"] is None

    measured = ("bare", "trunner_cold") + (
        ("trunner_prewarmed",) if lat["trunner_prewarmed"] is not None else ()
    )
    for name in measured:
        tp = report["throughput"][name]
        for c in CONCURRENCY:
            assert positive(tp["per_s"][c]), (name, c)
            assert positive(tp["latency_p50_ms"][c]), (name, c)
        assert positive(report["parent_cpu_ms_per_inv"][name])

    drain = report["drain"]
    assert positive(drain["bytes"])
    assert positive(drain["pipe_floor_mib_s"])
    for name in ("trunner", "trunner_jailed"):
        d = drain[name]
        for key in ("stream_mib_s", "wall_mib_s", "wall_s", "stream_s", "to_first_byte_s",
                    "ratio_vs_floor"):
            assert positive(d[key]), (name, key, d[key])
        assert non_negative(d["peak_rss_growth_mib"]), (name, d["peak_rss_growth_mib"])

    check_exec_block(report["exec_block"])

    targets = report["targets"]
    assert set(targets) == {"cold_jail_overhead", "prewarmed_vs_bare", "prewarmed_vs_bwrap",
                            "concurrency_scaling", "drain_vs_pipe", "cold_vs_floor",
                            "child_cpu_vs_floor"}
    for name, t in targets.items():
        assert t["status"] in ("PASS", "MISS", "n/a"), (name, t)
        assert (t["value"] is None) == (t["status"] == "n/a"), (name, t)
    for name in ("cold_jail_overhead", "concurrency_scaling", "drain_vs_pipe", "cold_vs_floor",
                 "child_cpu_vs_floor"):
        assert positive(targets[name]["value"]), (name, targets[name])


EXEC_ALWAYS = ("bare", "trunner_cold", "trunner_warm", "trunner_pool", "trunner_pool_echo",
               "python_floor")
EXEC_KEYS = ("wall_ms_per_run", "host_cpu_ms_per_run", "background_ms_per_run",
             "host_cpu_net_ms_per_run", "parent_cpu_ms_per_run")


def check_exec_block(block: dict[str, Any]) -> None:
    """The exec /bin/true block (issue 22): every figure of every variant a
    positive number. Host CPU comes from /proc/stat in jiffies (10 ms), so
    a quick block of the cheapest variant may see none, and the figure net
    of the idle background may go either way: finite, not positive."""
    variants = block["variants"]
    names = [*EXEC_ALWAYS, "bwrap"] if variants["bwrap"] is not None else list(EXEC_ALWAYS)
    if shutil.which("bwrap") is None:
        assert variants["bwrap"] is None
        assert block["unavailable"]["bwrap"]
    for name in names:
        fig = variants[name]
        assert fig is not None, block["unavailable"].get(name)
        assert len(fig["rounds"]) == block["settings"]["rounds"], name
        for key in ("wall_ms_per_run", "parent_cpu_ms_per_run"):
            assert positive(fig[key]), (name, key, fig[key])
        # An idle host may show no busy jiffy in a short idle block.
        assert non_negative(fig["background_ms_per_run"]), (name, fig)
        host = fig["host_cpu_ms_per_run"]
        assert (non_negative if name == "bare" else positive)(host), (name, host)
        assert math.isfinite(fig["host_cpu_net_ms_per_run"]), name
    assert non_negative(block["idle"]["busy_ms_per_s"])
    assert len(block["idle"]["rounds"]) == block["settings"]["rounds"]
    for name in ("trunner_pool", "trunner_pool_echo", "trunner_pool_c4", "trunner_warm",
                 "trunner_warm_c4"):
        assert positive(block["pool_open_ms"][name]), name
    c4 = block["concurrency4"]
    for name in ("trunner_pool", "trunner_warm", "trunner_cold", "bwrap"):
        if name == "bwrap" and variants["bwrap"] is None:
            assert c4["bwrap"] is None
            continue
        for key in ("per_s", "host_cpu_ms_per_inv", "latency_p50_ms"):
            assert positive(c4[name][key]), (name, key, c4[name])
    ratios = block["ratios"]
    with_bwrap = ("cold_vs_bwrap_wall", "pool_vs_bwrap_wall", "warm_vs_bwrap_wall")
    always = ("echo_pool_vs_python_wall", "echo_pool_vs_python_host_cpu_raw")
    for name in always + (with_bwrap if variants["bwrap"] is not None else ()):
        assert positive(ratios[name]), (name, ratios)
    if variants["bwrap"] is None:
        assert all(ratios[name] is None for name in with_bwrap), ratios
    for r in ratios.values():  # None where a figure is n/a (or net of background, not > 0)
        assert r is None or positive(r), ratios
    targets = block["targets"]
    assert set(targets) == {"exec_pool_cpu_vs_bwrap", "exec_pool_wall_vs_bwrap",
                            "exec_warm_cpu_vs_bwrap", "exec_c4_pool_vs_bwrap",
                            "echo_pool_cpu_vs_python"}
    for name, t in targets.items():
        assert t["status"] in ("PASS", "MISS", "n/a"), (name, t)
        assert (t["value"] is None) == (t["status"] == "n/a"), (name, t)


@pytest.mark.slow
def test_spawn_latency_exec_block_alone(tmp_path: Path) -> None:
    """--exec-block runs that block only; --from renders its table."""
    saved = tmp_path / "exec.json"
    report = run_quick_json("spawn_latency.py", tmp_path, "--exec-block", "--save", str(saved))
    assert set(report) == {"meta", "exec_block"}
    assert report["exec_block"]["settings"]["n"] == 8
    check_exec_block(report["exec_block"])
    table = subprocess.run(
        [sys.executable, os.path.join(BENCH_DIR, "spawn_latency.py"), "--from", str(saved)],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=True, cwd=tmp_path,
        env=bench_env(tmp_path),
    ).stdout
    assert "exec /bin/true block" in table
    assert "exec_pool_cpu_vs_bwrap" in table


def check_plot(svg: Path, report: dict[str, Any]) -> None:
    """The CDF is an SVG with one line per measured variant (no matplotlib)."""
    from xml.etree import ElementTree

    root = ElementTree.parse(svg).getroot()
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    measured = [name for name, fig in report["latency_ms"].items() if fig is not None]
    assert len(lines) == len(measured) == len(report["samples_ms"])


def check_compare(saved: Path, tmp_path: Path) -> None:
    """--from a saved run, --compare against itself: every ratio is 1."""
    args = ["--from", str(saved), "--compare", str(saved)]
    report = run_quick_json("spawn_latency.py", tmp_path, *args)
    ratios = report["compare"]["ratios"]
    seen = [r for fig in ratios["latency"].values() for r in fig.values() if r is not None]
    seen += [r for fig in ratios["throughput"].values() for r in fig.values() if r is not None]
    seen += [r for r in ratios["drain"].values() if r is not None]
    assert len(seen) > 20
    assert all(math.isclose(r, 1.0) for r in seen), ratios
    assert ratios["cold_c4_vs_old"]["status"] == "MISS"  # 1.0 against itself
    table = subprocess.run(
        [sys.executable, os.path.join(BENCH_DIR, "spawn_latency.py"), *args],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=True, cwd=tmp_path,
        env=bench_env(tmp_path),
    ).stdout
    assert "cold_c4_vs_old" in table
    assert "invocations/s at concurrency" in table
    assert "exec /bin/true block" in table


@pytest.mark.slow
def test_helper_steps_quick_reports_every_figure(tmp_path: Path) -> None:
    report = run_quick_json("helper_steps.py", tmp_path)
    assert {"meta", "timeline", "leave_one_out", "imports", "parent_phases"} <= set(report)

    steps = {row["step"]: row for row in report["timeline"]}
    for name in ("interpreter start (fork+exec+init, -I -S)", "namespaces", "landlock",
                 "seccomp", "exec adapter, exit, reap"):
        assert name in steps, sorted(steps)
    for row in report["timeline"]:
        for key in ("ms_p50", "ms_min", "ms_p90"):
            assert non_negative(row[key]), row
    assert positive(sum(row["ms_p50"] for row in report["timeline"]))

    rows = {row["variant"]: row for row in report["leave_one_out"]["rows"]}
    assert "helper, full plan" in rows
    from trunner.helper import SKIPPABLE

    for layer in SKIPPABLE:
        assert f"full - {layer}" in rows, sorted(rows)
    for row in rows.values():
        for key in ("ms_p50", "ms_min", "ms_p90"):
            assert positive(row[key]), row
        saves = row["saves_ms"]
        assert (saves is None) != row["variant"].startswith("full - "), row
        assert saves is None or math.isfinite(saves), row

    assert len(report["imports"]) == 2
    for label, imp in report["imports"].items():
        assert positive(imp["total_ms"]), label
        assert imp["modules"] > 0, label
        assert imp["top_self"], label
        assert imp["top_level"], label
        for entry in imp["top_self"]:
            assert non_negative(entry["self_ms"]), (label, entry)

    phases = {row["phase"]: row["ms_p50"] for row in report["parent_phases"]["rows"]}
    assert positive(phases["Runner.run (real, same loop)"])
    assert positive(phases["total (timed calls)"])
    for name, ms in phases.items():
        assert non_negative(ms), (name, ms)


@pytest.mark.slow
def test_session_cost_quick_reports_every_way(tmp_path: Path) -> None:
    """benchmarks/session_cost.py: a session's command, a pooled exec and a
    cold one, each with its wall and host CPU per call, and the ratios."""
    report = run_quick_json("session_cost.py", tmp_path)
    assert (report["calls"], report["rounds"]) == (5, 1)
    for way in ("session", "pool", "cold", "session/pool", "session/cold"):
        assert positive(report[way]["wall_ms"]), way
        assert positive(report[way]["cpu_ms"]), way


@pytest.mark.slow
def test_stream_echo_quick_reports_both_medians(tmp_path: Path) -> None:
    """benchmarks/stream_echo.py: one-byte round trips through open_process
    and through a bare pipe pair, each figure there and positive."""
    report = run_quick_json("stream_echo.py", tmp_path)
    for name in ("open_process", "bare_pipes"):
        fig = report[name]
        assert fig["n"] == 50
        for key in ("p50_us", "p90_us", "min_us", "max_us"):
            assert positive(fig[key]), (name, key)
        assert fig["min_us"] <= fig["p50_us"] <= fig["p90_us"] <= fig["max_us"]
    assert positive(report["ratio_p50"])


@pytest.mark.slow
def test_exit_chain_reports_every_step(tmp_path: Path) -> None:
    """benchmarks/exit_chain.py (root: it reads the kernel's trace) names
    every step of a prewarmed call, each with a non-negative time."""
    if os.geteuid() != 0:
        pytest.skip("exit_chain.py reads tracefs, which needs root")
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH_DIR, "exit_chain.py"), "-n", "4", "--json"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S, cwd=ROOT,
        env=bench_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    report = json.loads(proc.stdout)
    assert report["calls"] >= 1
    assert [row["step"] for row in report["steps"]] == [
        "request written", "adapter reads it", "adapter replies", "adapter exits",
        "pid 1 exits", "helper exits", "parent wakes", "run() returns",
    ]
    for row in report["steps"]:
        assert non_negative(row["p50_ms"]), row
        assert row["p50_ms"] <= row["p90_ms"], row
    assert positive(report["total_p50_ms"])


@pytest.mark.slow
def test_aio_facade_reports_every_figure(tmp_path: Path) -> None:
    """benchmarks/aio_facade.py, one round: every way and every call has a
    positive p50 and a CPU per call (docs/asyncio.md's table)."""
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH_DIR, "aio_facade.py"), "-n", "1",
         "--noop-calls", "10", "--json"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S, cwd=ROOT,
        env=bench_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    report = json.loads(proc.stdout)
    assert sorted(report) == sorted(f"{way}/{kind}" for way in ("trio", "thread", "guest")
                                    for kind in ("noop", "c1", "c8", "cold1", "cold8"))
    for name, row in report.items():
        assert positive(row["p50_ms"]), (name, row)
        assert non_negative(row["cpu_ms"]), (name, row)


def _has_cpython_tests() -> bool:
    for python in ("/usr/bin/python3.11", sys.executable):
        done = subprocess.run([python, "-c", "import test.test_os"], capture_output=True,
                              check=False, timeout=scaled(60)) if os.path.exists(python) else None
        if done is not None and done.returncode == 0:
            return True
    return False


@pytest.mark.slow
def test_cpython_os_tests_runs_one_module_each_way(tmp_path: Path) -> None:
    """The CPython OS-test harness on one quick module (test_fcntl): in trunner
    and bare (and under bubblewrap where installed), each run gives unittest's
    summary, parsed: how many ran, how many failed or errored."""
    if not _has_cpython_tests():
        pytest.skip("CPython's test suite is not installed (libpython3.11-testsuite;"
                    " scripts/setup installs it as root)")
    modes = "trunner,bwrap,bare" if shutil.which("bwrap") else "trunner,bare"
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH_DIR, "cpython_os_tests.py"), "--modules",
         "test_fcntl", "--modes", modes, "--json"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S, cwd=ROOT,
        env=bench_env(tmp_path))
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    outcomes = json.loads(proc.stdout)["outcomes"]
    assert [o["mode"] for o in outcomes] == modes.split(",")
    for o in outcomes:
        assert o["died"] is None, o
        assert o["ran"] > 0, o
        assert 0 <= o["failed"] <= o["ran"], o
    bare = outcomes[-1]
    assert bare["failed"] == 0, bare  # bare is the reference: nothing in the way


def test_cpython_os_tests_parses_unittest_summaries() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "cpython_os_tests", os.path.join(BENCH_DIR, "cpython_os_tests.py"))
    assert spec is not None
    assert spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = harness  # its dataclasses look their module up
    try:
        spec.loader.exec_module(harness)
    finally:
        del sys.modules[spec.name]
    parse = harness.parse
    ok = parse("m", "bare", b"test_a (test.m.C.test_a) ... ok\n\nRan 3 tests in 0.1s\n\nOK\n")
    assert (ok.ran, ok.failed, ok.died) == (3, 0, None)
    bad = parse("m", "bare", b"FAIL: test_a (test.m.C.test_a)\nERROR: test_b (test.m.D.test_b)\n"
                b"Ran 5 tests in 1s\n\nFAILED (failures=1, errors=2, skipped=1)\n")
    assert (bad.ran, bad.failed, bad.cases) == (5, 3, ["ERROR: D.test_b", "FAIL: C.test_a"])
    died = parse("m", "bare", b"Fatal Python error: Segmentation fault\n")
    assert (died.failed, died.died) == (None, "no unittest summary")
