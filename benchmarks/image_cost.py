#!/usr/bin/env python3
"""What `Runner(root=IMAGE)` costs a run against the host's root, paired, in one process.

    python benchmarks/image_cost.py [-n N]

Builds a busybox image in a temp dir (the static /usr/bin/busybox and a link
per applet, an /etc), then makes two Runners, one on the host's root and one
on the image, and alternates their calls (host, image, image, host, ...) so
load drifts hit both: N cold `exec(["/bin/true"])` each (the host's
coreutils true, busybox's true), then N cold `run("echo")` each. Prints the
p50 and p90 per root, the image - host difference of the p50s, and the p50
of the per-pair differences, in ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import trio

from trunner import Runner


def build_image(top: str) -> str:
    root = os.path.join(top, "img")
    for d in ("bin", "etc"):
        os.makedirs(os.path.join(root, d))
    shutil.copy("/usr/bin/busybox", os.path.join(root, "bin", "busybox"))
    applets = subprocess.run(["/usr/bin/busybox", "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for name in applets:
        if name != "busybox":
            os.symlink("busybox", os.path.join(root, "bin", name))
    os.symlink("bin", os.path.join(root, "sbin"))
    return root


def summary(name: str, values: list[float]) -> str:
    q = statistics.quantiles(values, n=10)
    return f"{name:>12}: p50 {statistics.median(values):6.2f} ms  p90 {q[8]:6.2f} ms"


async def measure(host: Runner, image: Runner, n: int, what: str) -> None:
    async def call(runner: Runner) -> float:
        t = time.perf_counter()
        if what == "exec":
            r = await runner.exec(["/bin/true"])
            assert r.response.exit_code == 0, r.response
        else:
            await runner.run("echo", 0)
        return (time.perf_counter() - t) * 1000

    await call(host)
    await call(image)
    times: dict[str, list[float]] = {"host": [], "image": []}
    diffs = []
    for i in range(n):
        order = ("host", "image") if i % 2 == 0 else ("image", "host")
        got = {}
        for name in order:
            got[name] = await call(host if name == "host" else image)
            times[name].append(got[name])
        diffs.append(got["image"] - got["host"])
    print(f"{what} /bin/true" if what == "exec" else "run('echo')")
    for name, values in times.items():
        print(summary(name, values))
    p50 = statistics.median(times["image"]) - statistics.median(times["host"])
    print(f"  image - host: p50s {p50:+.2f} ms, per pair p50 {statistics.median(diffs):+.2f} ms")


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        root = build_image(top)
        temp_root = tempfile.gettempdir()
        host = Runner(temp_root=temp_root)
        image = Runner(temp_root=temp_root, root=root, root_statement="busybox")
        await measure(host, image, n, "exec")
        await measure(host, image, n, "echo")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200)
    trio.run(main, parser.parse_args().n)
