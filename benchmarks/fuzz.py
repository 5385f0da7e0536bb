#!/usr/bin/env python3
"""Long fuzzing run: tests/test_fuzz.py with many examples per test.

    python benchmarks/fuzz.py [-n 10000] [pytest args...]

Sets TRUNNER_FUZZ_EXAMPLES (default 10000; CI uses 300) and runs the file
with hypothesis statistics, then prints per test the examples run (passing,
failing, invalid) and the wall time. Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000, help="examples per test (default 10000)")
    args, rest = parser.parse_known_args()
    env = {**os.environ, "TRUNNER_FUZZ_EXAMPLES": str(args.n)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "--hypothesis-show-statistics", str(ROOT / "tests" / "test_fuzz.py"), *rest]
    print(f"TRUNNER_FUZZ_EXAMPLES={args.n} {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    out = proc.stdout
    # Hypothesis statistics: "tests/test_fuzz.py::NAME:" then
    #   "- during generate phase (12.34 seconds):" and
    #   "- Typical runtimes: ..., of which ... ~ N passing, M failing, K invalid"-ish lines.
    current = None
    rows: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        m = re.match(r"\s*tests/test_fuzz\.py::(\S+):\s*$", line)
        if m:
            current = m.group(1)
            rows[current] = {}
            continue
        if current is None:
            continue
        m = re.search(r"during (\w+) phase \(([\d.]+) seconds\)", line)
        if m:
            rows[current][m.group(1) + "_s"] = m.group(2)
        m = re.search(r"(\d+) passing, (\d+) failing, and (\d+) invalid", line)
        if m:
            counts = rows[current]
            counts["passing"], counts["failing"], counts["invalid"] = m.groups()
    if rows:
        print(f"{'test':<62} {'passing':>8} {'failing':>8} {'invalid':>8} {'gen s':>7}")
        for name, row in rows.items():
            print(f"{name:<62} {row.get('passing', '?'):>8} {row.get('failing', '?'):>8} "
                  f"{row.get('invalid', '?'):>8} {row.get('generate_s', '?'):>7}")
    summary = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|xfailed)", line)]
    print(summary[-1] if summary else out[-2000:])
    if proc.returncode != 0:
        print(out[-6000:], proc.stderr[-2000:], sep="\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
