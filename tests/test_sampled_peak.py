"""cgroup v2 before Linux 5.19 keeps no peak of a cgroup (`memory.peak`):
there the parent samples the program's cgroup's current memory every
`MEMORY_SAMPLE_S` (issue 33, item 3).

No such kernel is in reach here, so these runs plan as on one
(`LinuxBackend(sample_memory=True)`): the helper hands the adapter no peak
file and the parent samples `memory.current` (v2) or
`memory.usage_in_bytes` (v1), the real kernel's. The CI guest runs them on
cgroup v2. As root, and as a delegated caller; elsewhere a run has no
memory cgroup to sample and they assert the `max_rss` fallback.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import pytest

from conftest import TESTS_DIR, landlock_cap
from support import PRELUDE, scaled
from trunner import Limits, Reason, Runner, RunnerError
from trunner.linux.backend import MEMORY_SAMPLE_S, LinuxBackend
from trunner.linux.probe import probe_host
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from pathlib import Path

MiB = 1 << 20
#: Whether this caller's runs get a memory cgroup to sample.
CGROUP = bool(probe_host().memory_cgroup_base) and bool(probe_host().cpu_cgroup_base)

#: Two processes each touch 120 MiB and hold it together for 0.5 s (50
#: samples): the cgroup holds 240 MiB at once, the larger `ru_maxrss` 130.
PAIR = """\
import os, time
r, w = os.pipe()
pid = os.fork()
b = bytearray(120 << 20)
for i in range(0, len(b), 4096): b[i] = 1
if pid == 0:
    os.write(w, b"x")
    time.sleep(60)
os.read(r, 1)
time.sleep(0.5)
os.kill(pid, 9)
os.waitpid(pid, 0)
"""


@pytest.fixture
def sampling(jail_root: Path) -> Runner:
    backend = LinuxBackend(locate_worker(), import_paths=(TESTS_DIR,), landlock_abi=landlock_cap(),
                           sample_memory=True)
    return Runner(temp_root=str(jail_root), backend=backend,
                  limits=Limits(memory_bytes=512 * MiB, processes=16, wall_time_s=scaled(60)))


def test_the_sampling_interval_sees_a_half_second_hold_many_times() -> None:
    assert MEMORY_SAMPLE_S * 10 <= 0.5


async def test_exec_reports_the_sampled_peak_of_the_tree_at_once(sampling: Runner) -> None:
    result = await sampling.exec([sys.executable, "-S", "-c", PAIR])
    usage = result.usage
    assert usage is not None
    assert result.response.exit_code == 0
    assert result.response.usage == usage  # the reply's own figures are the same
    if not CGROUP:
        assert usage.memory_source == "max_rss", usage
        assert 120 * MiB <= usage.peak_memory_bytes < 200 * MiB, usage
        return
    assert usage.memory_source == "sampled", usage
    # Both processes at once: more than any one's 120 MiB plus its interpreter.
    assert 240 * MiB <= usage.peak_memory_bytes <= 512 * MiB, usage
    assert usage.cpu_source == "cgroup", usage


async def test_a_run_mode_reports_the_sampled_peak(sampling: Runner) -> None:
    usage = (await sampling.run("children:run_code", PRELUDE + PAIR)).usage
    assert usage is not None
    if not CGROUP:
        assert usage.memory_source == "max_rss", usage
        return
    assert usage.memory_source == "sampled", usage
    assert 240 * MiB <= usage.peak_memory_bytes <= 512 * MiB, usage


async def test_a_timeout_reports_what_was_sampled_before_the_kill(sampling: Runner) -> None:
    """The parent's kill ends the run before any frame: its figures are
    the parent's, the sampled peak among them."""
    code = ("import time\nb = bytearray(200 << 20)\n"
            "for i in range(0, len(b), 4096): b[i] = 1\nprint('held', flush=True)\n"
            "time.sleep(60)\n")
    limits = sampling.limits.replace(wall_time_s=scaled(3))
    with pytest.raises(RunnerError) as info:
        await sampling.exec([sys.executable, "-S", "-c", code], limits=limits)
    e = info.value
    assert e.reason is Reason.TIMEOUT, (e.reason, e.detail)
    if not CGROUP:
        return  # no cgroup and no frame: the parent's /proc figures (test_usage)
    assert e.usage is not None
    assert e.usage.memory_source == "sampled", e.usage
    assert 200 * MiB <= e.usage.peak_memory_bytes <= 512 * MiB, e.usage


async def test_a_kernel_that_keeps_the_peak_is_not_sampled(runner: Runner) -> None:
    """The default backend reads the kernel's own peak where it has one."""
    if not CGROUP:
        pytest.skip("this caller's runs have no memory cgroup")
    release = tuple(int(n) for n in os.uname().release.split(".")[:2])
    v2 = os.path.exists(f"{probe_host().memory_cgroup_base}/cgroup.controllers")
    if v2 and release < (5, 19):
        pytest.skip("cgroup v2 before Linux 5.19 keeps no peak: sampled by default")
    usage = (await runner.exec([sys.executable, "-S", "-c", PAIR],
                               limits=runner.limits.replace(memory_bytes=512 * MiB,
                                                            processes=16))).usage
    assert usage is not None
    assert usage.memory_source == "cgroup", usage
    assert usage.peak_memory_bytes >= 240 * MiB, usage
