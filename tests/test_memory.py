"""The per-run memory bound (`memory_bytes`): as root, one memory cgroup
per run holds all of its processes and its scratch tmpfs's pages; past it
the kernel kills a process of the run and the run fails `memory_limit`.
Not root, there is no cgroup the caller may use: the bound is RLIMIT_AS per
process and the scratch size, and the plan says so."""

from __future__ import annotations

import dataclasses

import pytest

from support import denied, pid_namespace_members, plan_for, run_code
from trunner import Limits, Reason, Runner
from trunner.limits import MiB
from trunner.linux.plan import MemoryCgroup, NoMemoryCgroup
from trunner.linux.probe import probe_host

needs_memory_cgroup = pytest.mark.skipif(
    not probe_host().memory_cgroup_base,
    reason=f"no memory cgroup for this caller (uid {probe_host().uid}): the bound is RLIMIT_AS"
    " per process and the scratch size",
)

# Four processes of the run touch `mib` MiB each and hold it until all four
# have (on a busy host a child could otherwise be done before the next
# starts), then report. A child killed before its byte leaves the parent an
# EOF, not a wait until the deadline (the others closed their write ends).
_TOUCH = """
import mmap
def touch(mib):
    m = mmap.mmap(-1, mib << 20)
    for i in range(0, mib << 20, 4096):
        m[i] = 1
    return m
touched, release = os.pipe(), os.pipe()
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        os.close(touched[0]); os.close(release[1])
        held = touch({mib})
        os.write(touched[1], b"t")
        os.close(touched[1])  # a sibling the OOM killer takes then ends the parent's read
        os.read(release[0], 1)  # EOF once the parent has touched too
        os._exit(0)
    kids.append(pid)
os.close(touched[1]); os.close(release[0])
held = touch({mib})
seen = b""
while len(seen) < 3 and (byte := os.read(touched[0], 1)):
    seen += byte
os.close(release[1])
codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]
result = {{"codes": codes, "ns": os.readlink("/proc/self/ns/pid")}}
"""


@needs_memory_cgroup
async def test_processes_together_past_memory_bytes_fail_memory_limit(runner: Runner) -> None:
    # Each of the four is far below the bound; together 4 x 96 MiB
    # is past 256 MiB.
    limits = runner.limits.replace(memory_bytes=256 * MiB, wall_time_s=30)
    e = await denied(runner, _TOUCH.format(mib=96), limits=limits)
    assert e.reason is Reason.MEMORY_LIMIT
    assert "the kernel killed" in e.detail
    # Under the bound the same work runs, and all four finished.
    ok = await run_code(runner, _TOUCH.format(mib=32), limits=limits)
    assert ok["codes"] == [0, 0, 0]
    assert pid_namespace_members(ok["ns"]) == []


@needs_memory_cgroup
async def test_scratch_pages_count_toward_memory_bytes(runner: Runner) -> None:
    """tmpfs pages are memory: a scratch bigger than the memory bound is
    bounded by the memory bound."""
    limits = runner.limits.replace(memory_bytes=128 * MiB, scratch_bytes=512 * MiB,
                                   wall_time_s=30)
    e = await denied(runner, """
        for n in range(8):  # files of 32 MiB: each below RLIMIT_FSIZE
            with open(f"/tmp/fill{n}", "wb") as f:
                for _ in range(32):
                    f.write(b"x" * (1 << 20))
        result = "wrote 256 MiB"
    """, limits=limits)
    assert e.reason is Reason.MEMORY_LIMIT


def test_the_plan_names_the_memory_bound() -> None:
    host = probe_host()
    limits = Limits(memory_bytes=300 * MiB)
    root = dataclasses.replace(host, is_root=True, memory_cgroup_base="/sys/fs/cgroup/x")
    plan = plan_for(limits, root, memory_cgroup="/cg/m")
    # The program's bound is memory_bytes, its sockets' (v1) the same figure.
    assert plan.memory == MemoryCgroup(cgroup="/cg/m", bytes=300 * MiB, socket_bytes=300 * MiB)
    user = dataclasses.replace(host, is_root=False, uid=1000, gid=1000, memory_cgroup_base="")
    assert plan_for(limits, user).memory == NoMemoryCgroup()
    # Root without a memory controller: the same documented bound.
    bare = dataclasses.replace(root, memory_cgroup_base="")
    assert plan_for(limits, bare).memory == NoMemoryCgroup()
