#!/usr/bin/env python3
"""Parent death: how long a SIGKILLed parent's jailed work outlives it.

    python benchmarks/parent_death.py [-r 5] [--runs 6] [--subreaper] [--kill-children] [--json]

Each round starts a separate Python parent doing `--runs` invocations at
once (each forks two grandchildren and sleeps), waits until every jailed
process is up (seccomp installed), SIGKILLs the parent (with
`--kill-children`, all its direct children too, at once, as Ray does to a
worker's), then polls every
millisecond: when the parent is reaped, when each jailed process has died
(a zombie counts as dead) and when it is reaped, when the watchdog exits,
and when the parent's cgroups and jail dirs are gone. Times are ms after the
SIGKILL; "n/a" where a thing never went within the 5 s window.

A dead parent's children (dead jailed processes, zombies then) are reaped
by the nearest subreaper ancestor, else PID 1, never by trunner.
`plain_orphan` is the same wait for an orphan that has nothing to do with
trunner. `--subreaper` makes this harness that ancestor (it reaps them),
as a supervisor such as tini or systemd would.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

TESTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
WINDOW_S = 5.0

PARENT = """
import sys, trio
sys.path.insert(0, {tests!r})
from trunner import Runner, Limits
CODE = '''
import os, time
for _ in range(2):
    if os.fork() == 0:
        time.sleep(1000)
time.sleep(1000)
'''
async def main():
    runner = Runner(import_paths=[{tests!r}], temp_root={root!r}, limits=Limits(wall_time_s=60))
    async with trio.open_nursery() as nursery:
        for _ in range({runs}):
            nursery.start_soon(runner.run, "children:run_code", CODE)
trio.run(main)
"""


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _jailed(root: str) -> list[int]:
    sys.path.insert(0, TESTS_DIR)
    from support import jailed_under

    return jailed_under(root)


def _filtered(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "Seccomp:\t2" in f.read()
    except OSError:
        return False


def _children_of(ppid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == ppid:
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _watchdogs(parent_pid: int, jailed: list[int]) -> list[int]:
    """The parent's watchdog: a child that is not jailed, or (not a child)
    a watchdog.py naming the parent as its owner."""
    found = [p for p in _children_of(parent_pid) if p not in jailed]
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        owner = f"{parent_pid}-".encode()  # its argv ends with the owner id: PID-START-PIDNS
        if any(a.endswith(b"watchdog.py") for a in argv) and argv[-2].startswith(owner):
            found.append(int(entry))
    return found


def _cgroups(parent_pid: int) -> list[str]:
    from trunner.linux import cgroup
    from trunner.linux.backend import probe_host

    limit = probe_host().process_limit
    if limit is None or limit.kind != "pids_cgroup":
        return []
    base = os.path.join(limit.cgroup_base, cgroup.DIR_NAME)
    try:
        return [n for n in os.listdir(base) if n.startswith(f"{parent_pid}-")]
    except FileNotFoundError:
        return []


ORPHAN = (
    "import os, time\npid = os.fork()\nif pid == 0:\n"
    "    os.close(1)\n    os.close(2)\n    time.sleep(1000)\nprint(pid)\n"
)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not (yet) ours
        os.waitpid(pid, os.WNOHANG)


def plain_orphan_ms(subreaper: bool) -> float:
    """How long a killed orphan with no tie to trunner stays unreaped."""
    pid = int(subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True,
                             text=True, check=True).stdout)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while _state(pid) is not None:
        if subreaper:
            _reap(pid)
        time.sleep(0.001)
    return (time.monotonic() - t0) * 1000


def one_round(runs: int, subreaper: bool, kill_children: bool) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="parent-death-")
    script = PARENT.format(tests=TESTS_DIR, root=root, runs=runs)
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while True:
            jailed = _jailed(root)
            if len(jailed) >= 3 * runs and all(_filtered(p) for p in jailed):
                break
            if time.monotonic() > deadline or parent.poll() is not None:
                raise RuntimeError("the parent did not start its runs")
            time.sleep(0.01)
        watchdogs = _watchdogs(parent.pid, jailed)
        children = _children_of(parent.pid) if kill_children else []
        t0 = time.monotonic()
        parent.send_signal(signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        marks: dict[str, float] = {}
        dead: dict[int, float] = {}
        reaped: dict[int, float] = {}
        while time.monotonic() - t0 < WINDOW_S:
            now = (time.monotonic() - t0) * 1000
            if "parent" not in marks and parent.poll() is not None:
                marks["parent"] = now
            for pid in jailed:
                if subreaper:
                    _reap(pid)
                state = _state(pid)
                if pid not in dead and state in (None, "Z", "X"):
                    dead[pid] = now
                if pid not in reaped and state is None:
                    reaped[pid] = now
            for pid in watchdogs if subreaper else ():
                _reap(pid)
            if "watchdog" not in marks and all(_state(p) in (None, "Z") for p in watchdogs):
                marks["watchdog"] = now
            if "cgroups" not in marks and not _cgroups(parent.pid):
                marks["cgroups"] = now
            if "jail_dirs" not in marks and not os.listdir(root):
                marks["jail_dirs"] = now
            if len(reaped) == len(jailed) and len(marks) == 5:
                break
            time.sleep(0.001)
        if len(dead) == len(jailed):
            marks["last_dead"] = max(dead.values())
        if len(reaped) == len(jailed):
            marks["last_reaped"] = max(reaped.values())
        marks["plain_orphan"] = plain_orphan_ms(subreaper)
        return marks
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        shutil.rmtree(root, ignore_errors=True)


KEYS = ("parent", "last_dead", "last_reaped", "watchdog", "cgroups", "jail_dirs", "plain_orphan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=6, help="invocations in flight per parent")
    ap.add_argument("--subreaper", action="store_true",
                    help="be the dead parent's reaping ancestor (PR_SET_CHILD_SUBREAPER)")
    ap.add_argument("--kill-children", action="store_true",
                    help="SIGKILL the parent's direct children with it (as Ray does)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.subreaper:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    rounds = [one_round(args.runs, args.subreaper, args.kill_children) for _ in range(args.rounds)]
    summary = {}
    for key in KEYS:
        values = [r[key] for r in rounds if key in r]
        summary[key] = {
            "median_ms": statistics.median(values) if values else None,
            "max_ms": max(values) if values else None,
            "missed": len(rounds) - len(values),
        }
    if args.json:
        print(json.dumps({"rounds": rounds, "summary": summary}))
        return 0
    how = "this harness as subreaper" if args.subreaper else "reaped by PID 1"
    how += ", its direct children killed with it" if args.kill_children else ""
    print(f"{args.rounds} rounds, {args.runs} runs in flight, {how}; ms after SIGKILL")
    print(f"{'':>12} {'median':>8} {'max':>8}  missed")
    for key, s in summary.items():
        med = "n/a" if s["median_ms"] is None else f"{s['median_ms']:.0f}"
        mx = "n/a" if s["max_ms"] is None else f"{s['max_ms']:.0f}"
        print(f"{key:>12} {med:>8} {mx:>8}  {s['missed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
