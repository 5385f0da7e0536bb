"""`address_space_bytes="auto"` (issue 19), the default: no RLIMIT_AS where
the run has a memory cgroup (as root), which bounds what it really uses, so
a runtime that reserves large ranges starts; elsewhere RLIMIT_AS stays at
`AUTO_ADDRESS_SPACE_BYTES`. Resolved when the jail is planned: the plan and
the rules version hold the number, never "auto"."""

from __future__ import annotations

import dataclasses
import resource

import msgspec
import pytest
import trio

from support import denied, plan_for, run_code
from trunner import Limits, Reason, Runner
from trunner.cli import _limits, _limits_args
from trunner.limits import AUTO_ADDRESS_SPACE_BYTES, GiB, MiB
from trunner.linux.plan import RLIM_INFINITY, MemoryCgroup
from trunner.linux.probe import probe_host

HOST = probe_host()
CGROUP = HOST.is_root and bool(HOST.memory_cgroup_base)
needs_memory_cgroup = pytest.mark.skipif(
    not CGROUP, reason=f"no memory cgroup for this caller (uid {HOST.uid}): auto is RLIMIT_AS")


def address_space(plan: object) -> int:
    (limit,) = [r for r in plan.rlimits if r.resource == resource.RLIMIT_AS]  # type: ignore[attr-defined]
    assert limit.soft == limit.hard
    return int(limit.soft)


def test_auto_is_the_default_and_accepted_everywhere() -> None:
    import argparse

    assert Limits().address_space_bytes == "auto"
    assert Limits.from_mapping({"address_space_bytes": "auto"}) == Limits()
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(Limits()), type=Limits) == Limits()
    assert Limits(address_space_bytes=2 * GiB).replace(address_space_bytes="auto") == Limits()
    parser = argparse.ArgumentParser()
    _limits_args(parser)
    for flag in ("--memory", "--address-space-bytes"):
        assert _limits(parser.parse_args([flag, "auto"])).address_space_bytes == "auto"
        assert _limits(parser.parse_args([flag, str(GiB)])).address_space_bytes == GiB
    for bad in ("Auto", "auto ", "", "none", True, 1.5):
        with pytest.raises(ValueError, match="address_space_bytes"):
            Limits.from_mapping({"address_space_bytes": bad})
        with pytest.raises(ValueError, match="address_space_bytes"):
            Limits(address_space_bytes=bad)  # type: ignore[arg-type]


def test_auto_is_resolved_when_planned() -> None:
    root = dataclasses.replace(HOST, is_root=True, memory_cgroup_base="/sys/fs/cgroup/x")
    user = dataclasses.replace(HOST, is_root=False, uid=1000, gid=1000, memory_cgroup_base="")
    bare_root = dataclasses.replace(root, memory_cgroup_base="")  # no memory controller
    assert isinstance(plan_for(Limits(), root).memory, MemoryCgroup)
    assert address_space(plan_for(Limits(), root)) == RLIM_INFINITY
    assert address_space(plan_for(Limits(), user)) == AUTO_ADDRESS_SPACE_BYTES == GiB
    assert address_space(plan_for(Limits(), bare_root)) == AUTO_ADDRESS_SPACE_BYTES
    # A number holds everywhere, a memory cgroup or not.
    for host in (root, user, bare_root):
        assert address_space(plan_for(Limits(address_space_bytes=3 * GiB), host)) == 3 * GiB


def test_the_rules_version_hashes_the_resolved_number() -> None:
    runner = Runner()
    document = runner.backend.rules_document(Limits())
    assert "auto" not in repr(document)
    resolved = RLIM_INFINITY if CGROUP else AUTO_ADDRESS_SPACE_BYTES
    rlimits = document["plan"]["rlimits"]
    assert {"resource": resource.RLIMIT_AS, "soft": resolved, "hard": resolved} in rlimits
    if not CGROUP:  # the same number, given or resolved: the same rules
        assert runner.rules_version(Limits(address_space_bytes=GiB)) == runner.rules_version(
            Limits())
    assert runner.rules_version(Limits(address_space_bytes=2 * GiB)) != runner.rules_version(
        Limits())


async def test_the_jail_has_the_resolved_rlimit(runner: Runner) -> None:
    line = await run_code(runner, """
        result = [l for l in open("/proc/self/limits") if l.startswith("Max address space")][0]
    """, limits=runner.limits.replace(address_space_bytes="auto"))
    soft, hard = line.split()[3:5]
    want = "unlimited" if CGROUP else str(AUTO_ADDRESS_SPACE_BYTES)
    assert (soft, hard) == (want, want)


# 8 GiB reserved PROT_NONE (as the JVM reserves its heap), then `touch` MiB
# mapped and written.
_RESERVE = """
import mmap
reserved = mmap.mmap(-1, 8 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                     prot=0)  # PROT_NONE (not in 3.11 mmap): not committed
used = mmap.mmap(-1, {touch} << 20)
for i in range(0, {touch} << 20, 4096):
    used[i] = 1
result = "touched {touch} MiB"
"""


@needs_memory_cgroup
async def test_a_large_reservation_runs_where_a_memory_cgroup_bounds_use(runner: Runner) -> None:
    assert await run_code(runner, _RESERVE.format(touch=10)) == "touched 10 MiB"


def _available() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


@needs_memory_cgroup
async def test_touching_past_memory_bytes_still_fails_memory_limit(runner: Runner) -> None:
    """With no RLIMIT_AS, the memory cgroup is what stops the run: a gigabyte
    touched under a 128 MiB bound fails `memory_limit`, and the host's
    available memory never drops by much more than the bound."""
    memory = 128 * MiB
    limits = runner.limits.replace(memory_bytes=memory, wall_time_s=30)
    before = _available()
    lowest = before
    errors = []

    async def run() -> None:
        errors.append(await denied(runner, _RESERVE.format(touch=1024), limits=limits))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        while not errors:
            lowest = min(lowest, _available())
            await trio.sleep(0.005)
    assert errors[0].reason is Reason.MEMORY_LIMIT
    # The bound, and room for the worker's own interpreter and the host's noise.
    assert before - lowest <= memory + 128 * MiB, (before - lowest) // MiB
