#!/usr/bin/env python3
"""What Ray costs a pooled run: a local pool against `cluster_pool` on 1 and 2 nodes.

    python benchmarks/ray_pool.py [-n N] [-c C] [--rounds R] [--size S] [--argv ...] [--smoke]

Needs the `ray` extra (e.g. `.venv-ray/bin/python`). Starts its own 2-node
Ray cluster on this machine (loopback only, its own RAY_TMPDIR, ended by pid
at the end; never `ray stop`), like tests/ray/raysupport.py. Variants:

  local   Runner.pool("exec", size=S) in this process
  ray-1   trunner.ray.cluster_pool("exec", size_per_node=S) on the head only
          (the head alone carries the resource `trunner_head`)
  ray-2   the same on both nodes (resource `trunner`)

Each block opens its pool (not timed), warms it, then runs N calls of
`exec ARGV` (default `true`) from C concurrent tasks, and closes it. Each
round visits every variant once, the order rotating. Per variant, medians
over rounds:

  inv/s    calls per second over the block
  p50      the median latency of one call inside the block (ms)
  driver   this process (RUSAGE_SELF: trio, and Ray's core-worker threads)
  actor    the node actors (/proc/PID/stat utime+stime), ray only
  jails    what the pool owner reaped (RUSAGE_CHILDREN for local, the
           actors' cutime+cstime for ray) plus its live children (the fork
           server, prewarmed workers); the same work in every variant
  daemons  every other process carrying our RAY_TMPDIR (raylet, gcs_server,
           idle Ray workers...); Ray idles in local blocks too
  host     /proc/stat busy time over the block (every process, the kernel)

CPU columns are ms per call. Then ratios against `local` and what Ray adds
a call. The machine's noise is shared by all variants (interleaved rounds);
compare variants within one run, not across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os

# Before Ray is imported: it reads the address switch at import (without it,
# the driver resolves its own address to the routed interface, and hangs).
os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})

import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

import ray
import trio
from ray.cluster_utils import Cluster

from trunner import Limits, Runner
from trunner.ray import cluster_pool

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
MiB = 1024 * 1024
VARIANTS = ("local", "ray-1", "ray-2")
RESOURCE = {"ray-1": "trunner_head", "ray-2": "trunner"}
NODE_ARGS: dict[str, Any] = {
    "num_cpus": 1,
    "object_store_memory": 100 * MiB,
    "node_ip_address": "127.0.0.1",
}
COLUMNS = ("inv/s", "p50", "driver", "actor", "jails", "daemons", "host")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def host_busy_ms() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) * TICK_MS


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3 on), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def own_ms(pid: int) -> float:
    """utime + stime of `pid` (fields 14, 15)."""
    f = stat_fields(pid)
    return 0.0 if f is None else (int(f[11]) + int(f[12])) * TICK_MS


def reaped_ms(pid: int) -> float:
    """cutime + cstime of `pid` (fields 16, 17): its reaped children."""
    f = stat_fields(pid)
    return 0.0 if f is None else (int(f[13]) + int(f[14])) * TICK_MS


def rusage_ms(who: int) -> float:
    r = resource.getrusage(who)
    return (r.ru_utime + r.ru_stime) * 1000


def carrying(tmpdir: str) -> list[int]:
    """Processes (but this one) whose environment names `tmpdir` as RAY_TMPDIR."""
    needle = f"RAY_TMPDIR={tmpdir}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            continue
    return out


def children_of(parents: set[int]) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (f := stat_fields(int(name))) is not None \
                and int(f[1]) in parents:
            out.append(int(name))
    return out


class Who:
    """The pids a block's CPU is split over, found before the block: the
    actors (none for local), the pool owners' live non-Ray children (the
    fork server, prewarmed workers: counted while they live through the
    block; once reaped, in the owner's reaped figure), and Ray's daemons."""

    def __init__(self, tmpdir: str, actors: list[int]) -> None:
        self.actors = actors
        ray_pids = set(carrying(tmpdir))
        self.daemons = sorted(ray_pids - set(actors))
        owners = set(actors) if actors else {os.getpid()}
        self.children = [p for p in children_of(owners) if p not in ray_pids]

    def __str__(self) -> str:
        return (f"actors {self.actors}, {len(self.children)} live jail-side children,"
                f" {len(self.daemons)} Ray daemons")

    def sample(self) -> tuple[list[float], dict[int, float]]:
        reaped = (sum(reaped_ms(p) for p in self.actors) if self.actors
                  else rusage_ms(resource.RUSAGE_CHILDREN))
        live = {}
        for pid in self.children:
            if (f := stat_fields(pid)) is not None:
                live[pid] = sum(int(x) for x in f[11:15]) * TICK_MS
        return ([time.monotonic() * 1000, rusage_ms(resource.RUSAGE_SELF),
                 sum(own_ms(p) for p in self.actors), reaped,
                 sum(own_ms(p) for p in self.daemons), host_busy_ms()], live)

    @staticmethod
    def delta(before: tuple[list[float], dict[int, float]],
              after: tuple[list[float], dict[int, float]]) -> list[float]:
        """wall, driver, actor, jails, daemons, host: after - before."""
        d = [a - b for a, b in zip(after[0], before[0], strict=True)]
        d[3] += sum(after[1][p] - before[1][p] for p in after[1] if p in before[1])
        return d


async def block(pool: Any, tmpdir: str, actors: list[int],  # noqa: ANN401  either pool
                argv: list[str], n: int, c: int) -> list[float]:
    """One timed block: [inv/s, p50 ms, then CPU ms per call by COLUMNS]."""
    async def warm() -> None:
        for _ in range(3):
            await pool.exec(argv)

    async with trio.open_nursery() as nursery:
        for _ in range(c):
            nursery.start_soon(warm)
    latencies: list[float] = []
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            r = await pool.exec(argv)
            latencies.append((time.perf_counter() - t0) * 1000)
            if r.response is None or r.response.exit_code != 0:
                raise RuntimeError(f"the call failed: {r!r}")

    who = Who(tmpdir, actors)
    log(f"    measuring: {who}")
    before = who.sample()
    async with trio.open_nursery() as nursery:
        for _ in range(c):
            nursery.start_soon(worker)
    after = who.sample()
    d = Who.delta(before, after)
    return [n / (d[0] / 1000), statistics.median(latencies), *(x / n for x in d[1:])]


async def run_variant(name: str, tmpdir: str, jail_root: str, args: argparse.Namespace,
                      limits: Limits) -> list[float]:
    if name == "local":
        runner = Runner(limits=limits, temp_root=jail_root)
        async with runner.pool("exec", size=args.size) as pool:
            return await block(pool, tmpdir, [], args.argv, args.n, args.c)
    async with cluster_pool("exec", limits=limits, size_per_node=args.size,
                            resource=RESOURCE[name], cpus_per_node=1,
                            temp_root=jail_root) as cpool:
        actors = [node.pid for node in cpool.nodes.values()]
        figures = await block(cpool, tmpdir, actors, args.argv, args.n, args.c)
        served = {nid[:8]: s.served for nid, s in (await cpool.node_stats()).items()}
        log(f"    {name}: served per node {served}")
        return figures


async def measure(tmpdir: str, jail_root: str, args: argparse.Namespace) -> None:
    limits = Limits(wall_time_s=20.0)
    figures: dict[str, list[list[float]]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        log(f"round {r + 1}/{args.rounds}: {' '.join(order)}")
        for name in order:
            f = await run_variant(name, tmpdir, jail_root, args, limits)
            figures[name].append(f)
            log(f"  {name:<6} {f[0]:8.1f} inv/s  p50 {f[1]:6.2f} ms")
    report(figures, args)


def report(figures: dict[str, list[list[float]]], args: argparse.Namespace) -> None:
    med = {name: [statistics.median(f[i] for f in figures[name]) for i in range(len(COLUMNS))]
           for name in VARIANTS}
    print(f"exec {' '.join(args.argv)}: {args.rounds} rounds x {args.n} calls, concurrency"
          f" {args.c}, {args.size} workers per pool/node; medians; CPU in ms per call")
    print(f"  {'variant':<8}" + "".join(f"{h:>9}" for h in COLUMNS))
    for name in VARIANTS:
        m = med[name]
        print(f"  {name:<8}{m[0]:>9.1f}{m[1]:>9.2f}" + "".join(f"{v:>9.2f}" for v in m[2:]))
    local = med["local"]
    print("ratios against local:")
    for name in ("ray-1", "ray-2"):
        m = med[name]
        print(f"  {name}/local  inv/s {m[0] / local[0]:5.2f}x  p50 {m[1] / local[1]:5.2f}x"
              f"  host CPU {m[6] / local[6]:5.2f}x")
    for name in ("ray-1", "ray-2"):
        m = med[name]
        added = m[2] + m[3] + m[5] - local[2]
        print(f"{name}: Ray adds {m[1] - local[1]:.2f} ms p50 and {added:.2f} ms of CPU per call"
              " (driver+actor+daemons - local parent)")


def start_cluster(tmpdir: str) -> Cluster:
    os.environ["RAY_TMPDIR"] = tmpdir
    cluster = Cluster(initialize_head=True, head_node_args={
        **NODE_ARGS, "resources": {"trunner": 1, "trunner_head": 1}, "include_dashboard": False})
    try:
        cluster.add_node(**NODE_ARGS, resources={"trunner": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
    except BaseException:
        stop_cluster(cluster, tmpdir)
        raise
    return cluster


def stop_cluster(cluster: Cluster, tmpdir: str) -> None:
    with contextlib.suppress(Exception):
        ray.shutdown()
    with contextlib.suppress(Exception):
        cluster.shutdown()
    deadline = time.monotonic() + 10
    while (left := carrying(tmpdir)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    if left:
        log(f"Ray processes outlived the cluster: {left}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="calls per block")
    parser.add_argument("-c", type=int, default=4, help="concurrent callers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=4, help="workers per pool (per node)")
    parser.add_argument("--argv", nargs="+", default=["true"])
    parser.add_argument("--smoke", action="store_true", help="-n 10 --rounds 1: does it run")
    args = parser.parse_args()
    if args.smoke:
        args.n, args.rounds = 10, 1
    tmpdir = tempfile.mkdtemp(prefix="trunner-ray-", dir="/tmp")  # short: Ray's socket paths
    jail_root = tempfile.mkdtemp(prefix="trunner-ray-jails-")
    try:
        log("starting a 2-node Ray cluster...")
        cluster = start_cluster(tmpdir)
        try:
            trio.run(measure, tmpdir, jail_root, args)
        finally:
            stop_cluster(cluster, tmpdir)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        shutil.rmtree(jail_root, ignore_errors=True)


if __name__ == "__main__":
    main()
