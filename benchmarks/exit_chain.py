#!/usr/bin/env python3
"""Where a prewarmed invocation's time goes, from the kernel's trace.

    sudo .venv/bin/python benchmarks/exit_chain.py [-n N] [--json]

Root only: it turns on a few tracepoints in tracefs (mounting it at
/sys/kernel/tracing if needed) around each timed `pool.run("echo")` and
reads back, per call, when each process of the chain did its part:

    parent writes the request -> the adapter (jail pid 2) reads it ->
    writes its reply -> exits -> jail pid 1 exits -> the helper exits ->
    the parent wakes on the helper's exit -> run() returns

Each step is the time since the previous one (p50 and p90 over N calls,
ms). Tracing adds its own cost (a few us per event), so the total runs a
little above spawn_latency's trunner_prewarmed; the split is the point.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import statistics
import sys
from typing import Any

import trio

import trunner

TRACEFS = "/sys/kernel/tracing"
EVENTS = (
    "syscalls/sys_enter_write",
    "syscalls/sys_exit_read",
    "sched/sched_process_exit",
    "sched/sched_wakeup",
)
STEPS = (
    ("request written", "call to the parent's write of the request frame"),
    ("adapter reads it", "the write to pid 2's read returning"),
    ("adapter replies", "decode, encode, write of the reply"),
    ("adapter exits", "the reply to pid 2's do_exit"),
    ("pid 1 exits", "pid 2's do_exit to pid 1's (pid 2's teardown, pid 1 wakes, reports)"),
    ("helper exits", "pid 1's do_exit to the helper's (pid 1's teardown and reap)"),
    ("parent wakes", "the helper's do_exit to the parent's wake-up (its teardown)"),
    ("run() returns", "reap, group kill, cgroup and jail dir removal, verdict"),
)
LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[\d+\]\s+\S+\s+(?P<ts>[\d.]+): (?P<ev>.*)$")


def _write(name: str, value: str) -> None:
    with open(os.path.join(TRACEFS, name), "w") as f:
        f.write(value)


def _setup() -> None:
    if not os.path.exists(os.path.join(TRACEFS, "trace")):
        os.makedirs(TRACEFS, exist_ok=True)
        if os.system(f"mount -t tracefs nodev {TRACEFS}") != 0:
            raise SystemExit(f"exit_chain: cannot mount tracefs at {TRACEFS}")
    _write("tracing_on", "0")
    _write("buffer_size_kb", "8192")
    _write("trace", "")
    for event in EVENTS:
        _write(f"events/{event}/enable", "1")


def _teardown() -> None:
    with contextlib.suppress(OSError):
        _write("tracing_on", "0")
        for event in EVENTS:
            _write(f"events/{event}/enable", "0")


def _chain(helper: int) -> tuple[int, int] | None:
    """(pid 1, pid 2) of a pooled worker's jail, by host pid, once pid 2 is
    blocked reading its request; None before."""
    try:
        with open(f"/proc/{helper}/task/{helper}/children") as f:
            init = int(f.read().split()[0])
        with open(f"/proc/{init}/task/{init}/children") as f:
            jail = int(f.read().split()[0])
        with open(f"/proc/{jail}/syscall") as f:
            blocked = f.read().split()[:2] == ["0", "0x0"]  # read(0, ...)
    except (OSError, IndexError, ValueError):
        return None
    return (init, jail) if blocked else None


def _split(events: list[tuple[float, int, str]], parent: int, helper: int, init: int,
           jail: int, frame_len: int) -> list[float] | None:
    """The step times (ms) of one traced call, or None if an event is missing."""
    marks: list[float] = [events[0][0]]

    def first(pred: Any, after: float) -> float | None:  # noqa: ANN401
        for ts, pid, ev in events:
            if ts >= after and pred(pid, ev):
                return ts
        return None

    wanted = (
        lambda p, e: p == parent and e.startswith("sys_write(") and f"count: {frame_len:x})" in e,
        lambda p, e: p == jail and e.startswith("sys_read ->"),
        lambda p, e: p == jail and e.startswith("sys_write(fd: 1,"),
        lambda p, e: e.startswith("sched_process_exit:") and f" pid={jail} " in e,
        lambda p, e: e.startswith("sched_process_exit:") and f" pid={init} " in e,
        lambda p, e: e.startswith("sched_process_exit:") and f" pid={helper} " in e,
        lambda p, e: e.startswith("sched_wakeup:") and f" pid={parent} " in e,
        lambda p, e: p == parent and "RUN_END" in e,
    )
    for pred in wanted:
        ts = first(pred, marks[-1])
        if ts is None:
            return None
        marks.append(ts)
    return [(b - a) * 1000 for a, b in itertools.pairwise(marks)]


def _parse(text: str) -> list[list[tuple[float, int, str]]]:
    calls: list[list[tuple[float, int, str]]] = []
    current: list[tuple[float, int, str]] | None = None
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        item = (float(m["ts"]), int(m["pid"]), m["ev"])
        if "RUN_START" in item[2]:
            current = [item]
        elif current is not None:
            current.append(item)
            if "RUN_END" in item[2]:
                calls.append(current)
                current = None
    return calls


async def measure(n: int) -> list[list[float]]:
    runner = trunner.Runner()
    request = {"x": 1}
    frame_len = len(trunner.protocol.encode_frame(request))
    splits: list[list[float]] = []
    async with runner.pool("echo", size=1) as pool:
        for i in range(n + 3):
            with trio.fail_after(60):  # the pool has no event for it: poll
                while pool.idle_workers < 1 or (chain := _chain(pool._idle[0].child.pid)) is None:  # noqa: ASYNC110
                    await trio.sleep(0.005)
            helper = pool._idle[0].child.pid
            init, jail = chain
            _write("trace", "")
            _write("tracing_on", "1")
            # Blocking tracefs writes on purpose: they mark the call's edges.
            with open(os.path.join(TRACEFS, "trace_marker"), "w") as mark:  # noqa: ASYNC230
                mark.write("RUN_START\n")
                mark.flush()
                await pool.run(request)
                mark.write("RUN_END\n")
            _write("tracing_on", "0")
            with open(os.path.join(TRACEFS, "trace")) as f:  # noqa: ASYNC230 (untimed)
                calls = _parse(f.read())
            if i < 3 or not calls:  # warm-up
                continue
            split = _split(calls[0], os.getpid(), helper, init, jail, frame_len)
            if split is not None:
                splits.append(split)
    return splits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=40, help="traced calls")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if os.getuid() != 0:
        print("exit_chain: needs root (tracefs)", file=sys.stderr)
        return 2
    _setup()
    try:
        splits = trio.run(measure, args.n)
    finally:
        _teardown()
    if not splits:
        print("exit_chain: no complete trace", file=sys.stderr)
        return 1
    rows = []
    for k, (name, what) in enumerate(STEPS):
        xs = sorted(s[k] for s in splits)
        rows.append({"step": name, "what": what, "p50_ms": statistics.median(xs),
                     "p90_ms": xs[int(0.9 * (len(xs) - 1))]})
    totals = sorted(sum(s) for s in splits)
    report = {"calls": len(splits), "steps": rows, "total_p50_ms": statistics.median(totals)}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"prewarmed echo, {len(splits)} traced calls (ms since the previous step)")
    print(f"  {'step':18s} {'p50':>6s} {'p90':>6s}  what")
    for row in rows:
        print(f"  {row['step']:18s} {row['p50_ms']:6.2f} {row['p90_ms']:6.2f}  {row['what']}")
    print(f"  {'total':18s} {report['total_p50_ms']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
