"""`address_space_bytes="auto"` (issue 19), the default: no RLIMIT_AS where
the run has a memory cgroup (as root), which bounds what it really uses, so
a runtime that reserves large ranges starts; elsewhere RLIMIT_AS stays at
`AUTO_ADDRESS_SPACE_BYTES`. Resolved when the jail is planned: the plan and
the rules version hold the number, never "auto"."""

from __future__ import annotations

import dataclasses
import io
import json
import resource
import shutil
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec
import pytest
import trio

from support import VIA_POOL, denied, plan_for, rules_document, run_code, scaled
from trunner import ExecFile, Limits, Reason, Runner, RunnerError
from trunner.cleanup import owner_id
from trunner.cli import _limits, _limits_args
from trunner.limits import AUTO_ADDRESS_SPACE_BYTES, GiB, MiB
from trunner.linux import cgroup
from trunner.linux.plan import RLIM_INFINITY, MemoryCgroup
from trunner.linux.probe import probe_host

if TYPE_CHECKING:
    from collections.abc import Callable

HOST = probe_host()
#: Whether this caller's runs have a memory cgroup (root, or a caller delegated
#: one on cgroup v2): what "auto" is resolved by.
CGROUP = bool(HOST.memory_cgroup_base)
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
    assert address_space(plan_for(Limits(), user)) == AUTO_ADDRESS_SPACE_BYTES == 6 * GiB
    assert address_space(plan_for(Limits(), bare_root)) == AUTO_ADDRESS_SPACE_BYTES
    # A number holds everywhere, a memory cgroup or not.
    for host in (root, user, bare_root):
        assert address_space(plan_for(Limits(address_space_bytes=3 * GiB), host)) == 3 * GiB


def test_the_rules_version_hashes_the_resolved_number() -> None:
    runner = Runner()
    document = rules_document(runner, Limits())
    assert "auto" not in repr(document)
    resolved = RLIM_INFINITY if CGROUP else AUTO_ADDRESS_SPACE_BYTES
    rlimits = document["plan"]["rlimits"]
    assert {"resource": resource.RLIMIT_AS, "soft": resolved, "hard": resolved} in rlimits
    if not CGROUP:  # the same number, given or resolved: the same rules
        assert runner.rules_version(
            Limits(address_space_bytes=AUTO_ADDRESS_SPACE_BYTES)) == runner.rules_version(Limits())
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


def _cgroup_read(path: Path, *names: str) -> int | None:
    """The first of `names` in the cgroup dir `path` that reads as a number
    (v2's file first, then v1's); None if none does."""
    for name in names:
        try:
            text = (path / name).read_text().strip()
        except OSError:
            continue
        return int(text) if text.isdigit() else None
    return None


def _sample_run_cgroup(seen: dict[str, int]) -> None:
    """Fold one reading of this process's live runs' program memory cgroups
    (as root trunner makes one per run, under `<memory base>/trunner`, its
    name starting with its owner's id; the program's is its `prog` leaf)
    into `seen`: the lowest limit read (it is unlimited until the helper
    sets it) and the highest peak."""
    paths = list(Path(HOST.memory_cgroup_base, cgroup.DIR_NAME).glob(f"{owner_id()}-*/prog"))
    seen["runs"] = max(seen.get("runs", 0), len(paths))
    for path in paths:
        limit = _cgroup_read(path, "memory.max", "memory.limit_in_bytes")
        peak = _cgroup_read(path, "memory.peak", "memory.max_usage_in_bytes", "memory.current")
        if limit is None or peak is None:
            continue  # gone between the listing and the read
        seen["limit"] = min(seen.get("limit", limit), limit)
        seen["peak"] = max(seen.get("peak", 0), peak)


async def _touch_past(runner: Runner, memory: int, sample: Callable[[], None]) -> RunnerError:
    """Touch a gigabyte under `memory`, calling `sample` every 5 ms until the
    run failed; its error."""
    limits = runner.limits.replace(memory_bytes=memory, wall_time_s=30)
    errors = []

    async def run() -> None:
        errors.append(await denied(runner, _RESERVE.format(touch=1024), limits=limits))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        while not errors:
            sample()
            await trio.sleep(0.005)
    return errors[0]


@needs_memory_cgroup
async def test_touching_past_memory_bytes_still_fails_memory_limit(runner: Runner) -> None:
    """With no RLIMIT_AS, the memory cgroup is what stops the run: a gigabyte
    touched under a 128 MiB bound fails `memory_limit`, and the run's own
    memory cgroup, of that limit, peaked at it, never past."""
    memory = 128 * MiB
    seen: dict[str, int] = {}
    e = await _touch_past(runner, memory, lambda: _sample_run_cgroup(seen))
    assert e.reason is Reason.MEMORY_LIMIT
    assert "the kernel killed" in e.detail, e.detail
    # This run's one cgroup (through a pool, perhaps also the worker
    # prewarmed to replace the one that served).
    assert 1 <= seen.get("runs", 0) <= (2 if VIA_POOL else 1), seen
    assert seen["limit"] == memory, seen
    # It pressed on the bound (within 8 MiB: the last reading may precede the
    # kill) and the kernel held it there.
    assert memory - 8 * MiB <= seen["peak"] <= memory, seen


def _available() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


@pytest.mark.quiet_host
@needs_memory_cgroup
async def test_touching_past_memory_bytes_leaves_the_hosts_memory(runner: Runner) -> None:
    """quiet_host: it asserts the host's MemAvailable, which any other
    process moves. That figure is the point: with no RLIMIT_AS, a gigabyte
    touched under a 128 MiB bound never takes the host's available memory
    down by much more than the bound."""
    memory = 128 * MiB
    before = lowest = _available()

    def sample() -> None:
        nonlocal lowest
        lowest = min(lowest, _available())

    e = await _touch_past(runner, memory, sample)
    assert e.reason is Reason.MEMORY_LIMIT
    # The bound, and room for the worker's own interpreter and the host's noise.
    assert before - lowest <= memory + 128 * MiB, (before - lowest) // MiB


# Runtimes that reserve more address space than they use start under what
# "auto" gives a run without a memory cgroup (issue 33, item 7): the JVM with
# its default flags (its heap is half of RLIMIT_AS, its class space 1 GiB
# and its code cache 240 MiB more), Node's worker_threads (a V8 isolate
# each) and `npm install` (zlib in libuv's threads, a lifecycle script).
# As a non-root caller without a delegated cgroup the runs get "auto"
# itself; a caller whose runs have a memory cgroup gets the same number
# given, which is what "auto" is for the others.
AUTO_WITHOUT_CGROUP: int | Literal["auto"] = AUTO_ADDRESS_SPACE_BYTES if CGROUP else "auto"

#: Two workers, each answering one message.
WORKERS = """
const { Worker } = require("worker_threads");
let answered = 0;
for (const n of [1, 2]) {
  const worker = new Worker(`
    const { parentPort } = require("worker_threads");
    parentPort.once("message", (m) => parentPort.postMessage(m * 10));`, { eval: true });
  worker.once("error", (e) => { console.error(e); process.exit(3); });
  worker.once("message", (m) => {
    console.log(`worker ${n}: ${m}`);
    worker.terminate();
    if (++answered === 2) console.log("workers ok");
  });
  worker.postMessage(n);
}
"""


def _npm_package() -> dict[str, ExecFile]:
    """A package with two local dependencies, a directory and a tarball
    whose postinstall runs node: `npm install` links, extracts and runs a
    script, all offline."""
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as tar:
        for name, text in {
            "package.json": json.dumps({
                "name": "packed", "version": "1.0.0", "main": "index.js",
                "scripts": {"postinstall": "node -e \"require('fs').writeFileSync('ran', '')\""}}),
            "index.js": "module.exports = 'packed';\n",
        }.items():
            data = text.encode()
            member = tarfile.TarInfo(f"package/{name}")
            member.size, member.mode = len(data), 0o644
            tar.addfile(member, io.BytesIO(data))
    return {name: ExecFile(data=data) for name, data in {
        "package.json": json.dumps({
            "name": "app", "version": "1.0.0", "private": True,
            "dependencies": {"linked": "file:linked", "packed": "file:packed-1.0.0.tgz"}}).encode(),
        "linked/package.json": json.dumps({"name": "linked", "version": "1.0.0"}).encode(),
        "linked/index.js": b"module.exports = 'linked';\n",
        "packed-1.0.0.tgz": tarball.getvalue(),
    }.items()}


_NPM_ENV = {"npm_config_offline": "true", "npm_config_audit": "false",
            "npm_config_fund": "false", "npm_config_update_notifier": "false"}
_RUNTIMES = {
    "jvm": (["java", "-version"], {}, {}),
    "node-worker-threads": (["node", "-e", WORKERS], {}, {}),
    "npm-install": (
        ["sh", "-c", "npm install && test -f package-lock.json -a -f node_modules/packed/ran"
         " && node -p \"require('linked') + ' ' + require('packed')\""],
        _npm_package(), _NPM_ENV),
}


@pytest.mark.parametrize("runtime", list(_RUNTIMES))
async def test_runtimes_start_under_auto_without_a_memory_cgroup(
        runner: Runner, runtime: str) -> None:
    argv, files, env = _RUNTIMES[runtime]
    tool = "npm" if runtime == "npm-install" else argv[0]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    # A JVM starts a thread per CPU for its GC and compilers; a slow host
    # (the guest's TCG) takes a while to start either.
    limits = runner.limits.replace(
        address_space_bytes=AUTO_WITHOUT_CGROUP, processes=256, open_files=1024,
        memory_bytes=2 * GiB, wall_time_s=scaled(120), cpu_time_s=scaled(120))
    script = 'grep "^Max address space" /proc/self/limits; exec "$@"'
    result = (await runner.exec(["sh", "-c", script, "sh", *argv], files=files, env=env,
                                limits=limits)).response
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.exit_code == 0, output[-2000:]
    soft, hard = output.splitlines()[0].split()[3:5]
    assert (soft, hard) == (str(AUTO_ADDRESS_SPACE_BYTES),) * 2, output
    assert {"jvm": "version", "node-worker-threads": "workers ok",
            "npm-install": "linked packed"}[runtime] in output, output
