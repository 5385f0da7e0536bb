"""Runtimes see their limits: the program's own cgroup, shown read-only at
/sys/fs/cgroup (issue 33, item 6).

Real jails. Where the run has cgroups (root here; a delegated caller on
cgroup v2), the jail's cgroup namespace is rooted at the run's `prog` and
pid 2 mounts it read-only: cgroup2 on v2; on v1 each hierarchy the run has
a cgroup of its own in. Never anything above `prog`. Without cgroups there
is no /sys at all (docs/figures.md: give runtimes their limit yourself).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from support import scaled
from trunner.linux.probe import probe_host

if TYPE_CHECKING:
    from trunner import Runner

MiB = 1 << 20
HOST = probe_host()
VIEWS = HOST.cgroup_views
V2 = VIEWS == (("cgroup2", ""),)
#: The JVM sizes itself from v1 limits only with memory, cpu, cpuacct and
#: cpuset all mounted.
JVM_VIEW = V2 or {"memory", "cpu", "cpuacct", "cpuset"} <= {
    c for _, options in VIEWS for c in options.split(",")}

#: Walks /sys/fs/cgroup: every dir, the memory limit, and what a write and
#: a mkdir get.
WALK = """\
import errno, json, os
seen = {"dirs": [], "limit": None, "write": None, "mkdir": None}
for top, dirs, files in os.walk("/sys/fs/cgroup"):
    seen["dirs"].append(top)
for name in ("memory.max", "memory/memory.limit_in_bytes"):
    path = "/sys/fs/cgroup/" + name
    if os.path.exists(path):
        seen["limit"] = int(open(path).read())
        try:
            with open(path, "w") as f:
                f.write("max")
            seen["write"] = "ok"
        except OSError as e:
            seen["write"] = errno.errorcode[e.errno]
        try:
            os.mkdir(os.path.dirname(path) + "/escape")
            seen["mkdir"] = "ok"
        except OSError as e:
            seen["mkdir"] = errno.errorcode[e.errno]
seen["self"] = sorted(set(line.strip().rsplit(":", 1)[1] for line in open("/proc/self/cgroup")))
print(json.dumps(seen))
"""


async def test_the_program_sees_its_own_cgroup_read_only_and_nothing_above(
        runner: Runner) -> None:
    limits = runner.limits.replace(memory_bytes=300 * MiB)
    result = await runner.exec([sys.executable, "-S", "-c", WALK], limits=limits)
    seen = json.loads(result.response.stdout)
    if not VIEWS:
        assert seen["dirs"] == [], seen  # no /sys in the jail
        assert seen["limit"] is None, seen
        return
    assert seen["limit"] == 300 * MiB, seen  # prog's own bound: memory_bytes
    assert (seen["write"], seen["mkdir"]) == ("EROFS", "EROFS"), seen
    assert seen["self"] == ["/"], seen
    # Only the mount roots: `prog` has no child, and nothing above it shows.
    roots = ["/sys/fs/cgroup"] if V2 else [
        "/sys/fs/cgroup", *(f"/sys/fs/cgroup/{options}" for _, options in VIEWS)]
    assert sorted(seen["dirs"]) == sorted(roots), seen


def _node_heap(argv_prefix: list[str]) -> int:
    code = "console.log(require('v8').getHeapStatistics().heap_size_limit)"
    return int(subprocess.run([*argv_prefix, "node", "-e", code], check=True,
                              capture_output=True, text=True).stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
async def test_node_sizes_its_heap_from_the_runs_memory(runner: Runner) -> None:
    """Without the view, Node saw the host's RAM (4 GiB heap here); in a 1
    GiB run it now sizes from memory_bytes (V8's floor is ~259 MiB)."""
    if not any("memory" in options.split(",") or fstype == "cgroup2"
               for fstype, options in VIEWS):
        pytest.skip("this caller's runs have no memory cgroup to show (docs/figures.md:"
                    " pass --max-old-space-size in env)")
    limits = runner.limits.replace(memory_bytes=1024 * MiB, processes=64,
                                   wall_time_s=scaled(60))
    code = ("console.log(require('v8').getHeapStatistics().heap_size_limit,"
            " process.versions.node.split('.')[0])")
    result = await runner.exec(["node", "-e", code], limits=limits)
    jailed, major = map(int, result.response.stdout.split())
    if major < 20:  # Debian 12's Node 18 (seen in the v2 guest: 1534 MiB either way)
        pytest.skip(f"Node {major} sizes its heap from the host's RAM, never its cgroup"
                    " (Node 20 on does)")
    host = _node_heap([])
    print(f"node heap_size_limit: {jailed / MiB:.0f} MiB jailed, {host / MiB:.0f} MiB on the host")
    assert jailed <= 1024 * MiB, jailed
    assert host > 1024 * MiB, host  # the view made the difference


def _java_heap() -> int:
    flags = subprocess.run(["java", "-XX:+PrintFlagsFinal", "-version"], check=True,
                           capture_output=True, text=True).stdout
    return int(flags.split(" MaxHeapSize ")[1].split()[1])


@pytest.mark.skipif(shutil.which("java") is None, reason="java is not installed")
async def test_the_jvm_sizes_its_heap_from_the_runs_memory(runner: Runner) -> None:
    if not VIEWS:
        pytest.skip("this caller's runs have no cgroup to show (docs/api.md, memory_bytes: pass"
                    " -XX:MaxRAM= in env)")
    if not JVM_VIEW:
        pytest.skip("the JVM needs memory, cpu, cpuacct and cpuset cgroups of the run's own on"
                    " cgroup v1; this host's runs have " + ", ".join(o for _, o in VIEWS)
                    + " (docs/api.md, memory_bytes: pass -XX:MaxRAM= in env)")
    limits = runner.limits.replace(memory_bytes=1024 * MiB, processes=128,
                                   wall_time_s=scaled(60))
    result = await runner.exec(
        ["sh", "-c", "java -XX:+PrintFlagsFinal -version | grep -w MaxHeapSize"], limits=limits)
    heap = int(result.response.stdout.split()[3])
    host = _java_heap()
    print(f"java MaxHeapSize: {heap / MiB:.0f} MiB jailed, {host / MiB:.0f} MiB on the host")
    assert heap <= 512 * MiB, result.response.stdout
    assert host > heap, host  # a quarter of the host's RAM: the view made the difference
