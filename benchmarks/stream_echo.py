#!/usr/bin/env python3
"""One-byte round trips through `Runner.open_process` against a bare pipe pair.

    .venv/bin/python benchmarks/stream_echo.py [-n N] [--quick] [--json]

The same echo program (read one byte, write it back, unbuffered) runs
twice in this process: jailed, through `open_process` (its stdin and
stdout the parent's own pipes), and bare, a plain child on a pipe pair
(`trio.lowlevel.open_process`). Each round trip is: send one byte, receive
it back. The two are measured in alternating blocks of 100, so that both
see the same host; it reports the median (and p90) of N round trips each,
in microseconds, and their ratio. Process start is not timed. Nothing is
asserted (CI runs `--quick` for its shape only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

import trio

from trunner import Runner

ECHO = [sys.executable, "-u", "-c",
        "import os\nwhile (b := os.read(0, 1)):\n    os.write(1, b)\n"]
BLOCK = 100


async def round_trips(send: trio.abc.SendStream, receive: trio.abc.ReceiveStream,
                      n: int, out: list[float]) -> None:
    for _ in range(n):
        began = trio.current_time()
        await send.send_all(b"x")
        if await receive.receive_some(1) != b"x":
            raise RuntimeError("the echo did not come back")
        out.append((trio.current_time() - began) * 1e6)


def figures(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"n": len(ordered), "p50_us": statistics.median(ordered),
            "p90_us": ordered[int(0.9 * (len(ordered) - 1))],
            "min_us": ordered[0], "max_us": ordered[-1]}


async def measure(n: int) -> dict[str, Any]:
    runner = Runner()
    jailed: list[float] = []
    bare: list[float] = []
    async with runner.open_process(ECHO) as p:
        bare_proc = await trio.lowlevel.open_process(ECHO, stdin=subprocess.PIPE,
                                                     stdout=subprocess.PIPE)
        try:
            assert bare_proc.stdin is not None
            assert bare_proc.stdout is not None
            # One warm-up trip each (the programs' start is not timed).
            await round_trips(p.stdin, p.stdout, 1, [])
            await round_trips(bare_proc.stdin, bare_proc.stdout, 1, [])
            done = 0
            while done < n:
                block = min(BLOCK, n - done)
                await round_trips(p.stdin, p.stdout, block, jailed)
                await round_trips(bare_proc.stdin, bare_proc.stdout, block, bare)
                done += block
        finally:
            for stream in (bare_proc.stdin, bare_proc.stdout):
                if stream is not None:
                    await stream.aclose()
            await bare_proc.wait()
        await p.stdin.aclose()
    assert p.result is not None
    report = {"open_process": figures(jailed), "bare_pipes": figures(bare)}
    report["ratio_p50"] = report["open_process"]["p50_us"] / report["bare_pipes"]["p50_us"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="round trips each (default 1000)")
    parser.add_argument("--quick", action="store_true", help="50 round trips each")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    report = trio.run(measure, 50 if args.quick else args.n)
    if args.json:
        print(json.dumps(report))
        return
    for name in ("open_process", "bare_pipes"):
        fig = report[name]
        print(f"{name:>13}: p50 {fig['p50_us']:8.1f} us   p90 {fig['p90_us']:8.1f} us"
              f"   (n={fig['n']})")
    print(f"{'ratio':>13}: p50 {report['ratio_p50']:.2f} x")


if __name__ == "__main__":
    main()
