"""Per-call limits in a pool (issue 35, item 3): one pool serves problems
with limits of their own, each under the rules version and the verdict of a
cold run with those limits, each in one of the pool's slots."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from conftest import child_pids, make_runner
from support import scaled, wait_until
from trunner import Limits, Reason, RunnerError
from trunner.limits import MiB
from trunner.linux.probe import probe_host

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from trunner import Result, Runner
    from trunner.protocol import ExecResult

ROOT = Path(__file__).resolve().parent.parent

needs_memory_cgroup = pytest.mark.skipif(
    not probe_host().memory_cgroup_base,
    reason=f"no memory cgroup for this caller (uid {probe_host().uid}): no memory_limit"
    " verdict (the bound is RLIMIT_AS per process and the scratch size)",
)

#: 3 s of the spin's own CPU time, whatever the host's load: 3x the tight
#: problem's cpu_time_s, a third of the loose one's.
SPIN = ["python3", "-c", "import time\nt = time.process_time()\n"
        "while time.process_time() - t < 3: pass"]
#: 150 MiB written (so touched), held: ~3x the tight problem's memory_bytes,
#: under a third of the loose one's.
ALLOC = ["python3", "-c", "b = b'x' * (150 * 2**20)\nprint(len(b))"]


def problems(runner: Runner) -> tuple[Limits, Limits]:
    """Two problems' limits, both other than the pool's (the runner's): a
    tight one and a loose one. Their wall time leaves the CPU limit to
    decide, on a busy host too."""
    wall = scaled(60.0)
    tight = runner.limits.replace(wall_time_s=wall, cpu_time_s=1.0, memory_bytes=48 * MiB)
    loose = runner.limits.replace(wall_time_s=wall, cpu_time_s=10.0, memory_bytes=512 * MiB)
    return tight, loose


async def outcome(run: Awaitable[Result[ExecResult]]) -> tuple[str, str]:
    """("ok", rules version) or (the reason, "")."""
    try:
        result = await run
    except RunnerError as e:
        return str(e.reason), ""
    assert result.response.exit_code == 0, result.response
    return "ok", result.rules_version


async def check_problems(runner: Runner, argv: list[str], expected: dict[float, str],
                         field: str) -> None:
    tight, loose = problems(runner)
    async with runner.pool("exec", size=1) as pool:
        await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
        for limits in (tight, loose):
            want = expected[getattr(limits, field)]
            pooled = await outcome(pool.exec(argv, limits=limits))
            cold = await outcome(runner.exec(argv, limits=limits))
            assert pooled[0] == cold[0] == want, (limits, pooled, cold)
            if want == "ok":
                assert pooled[1] == cold[1] == runner.rules_version(limits)
    versions = {runner.rules_version(), *(runner.rules_version(lim) for lim in (tight, loose))}
    assert len(versions) == 3


async def test_cpu_time_per_problem_on_one_pool(runner: Runner) -> None:
    """3 s of CPU fails `cpu_time` under 1 s and passes under 10 s, pooled
    as cold; a pass carries the cold run's rules version of its limits."""
    await check_problems(runner, SPIN, {1.0: str(Reason.CPU_TIME), 10.0: "ok"}, "cpu_time_s")


@needs_memory_cgroup
async def test_memory_per_problem_on_one_pool(runner: Runner) -> None:
    """150 MiB fails `memory_limit` at 48 MiB and passes at 512 MiB, pooled
    as cold."""
    await check_problems(runner, ALLOC, {48 * MiB: str(Reason.MEMORY_LIMIT), 512 * MiB: "ok"},
                         "memory_bytes")


#: A value of its own for every field of `Limits`, far from the runner's:
#: the smallest allowed, but for the times (a start-up on a busy host stays
#: well within them).
EVERY_FIELD = {
    "wall_time_s": 5.0,
    "stdout_max_bytes": 0,
    "stderr_max_bytes": 0,
    "cpu_time_s": 0.5,
    "address_space_bytes": 64 * MiB,
    "processes": 1,
    "open_files": 32,
    "file_size_bytes": 0,
    "scratch_bytes": 1 * MiB,
    "memory_bytes": 32 * MiB,
}


async def verdict(run: Awaitable[Result[ExecResult]]) -> tuple[object, ...]:
    try:
        result = await run
    except RunnerError as e:
        return (e.reason,)
    return (result.response.exit_code, result.response.stdout, result.rules_version)


async def test_every_field_may_differ(runner: Runner) -> None:
    """The fork server fixes no limit: whatever one field's value, a call
    with it gets a cold run's verdict and rules version (`processes` 1's
    `bad_request`, a timeout's reason, included)."""
    assert set(EVERY_FIELD) == set(Limits.__struct_fields__)
    async with runner.pool("exec", size=1) as pool:
        for field, value in EVERY_FIELD.items():
            limits = runner.limits.replace(**{field: value})
            for argv in (["true"], ["python3", "-c", "print(1)"]):
                pooled = await verdict(pool.exec(argv, limits=limits))
                cold = await verdict(runner.exec(argv, limits=limits))
                assert pooled == cold, (field, argv)


async def test_a_run_mode_takes_limits_per_call(runner: Runner) -> None:
    tight, _ = problems(runner)
    async with runner.pool("children:run_code", size=1) as pool:
        with pytest.raises(RunnerError) as info:
            await pool.run("while True: pass", limits=tight)
        assert info.value.reason is Reason.CPU_TIME
        own = await pool.run("result = 6 * 7", limits=tight)
        pooled = await pool.run("result = 6 * 7")
    cold = await runner.run("children:run_code", "result = 6 * 7", limits=tight)
    assert own.response == pooled.response == 42
    assert own.rules_version == cold.rules_version == runner.rules_version(tight)
    assert pooled.rules_version == runner.rules_version()


class Gate:
    """A jailed program held until the host lets it go, as root and not: it
    waits for `go` in a dir the jail sees read-only (an import path of
    `runner`); the host finds it by a token in its argv (/proc/PID/cmdline
    is readable where a jail's cwd is not)."""

    def __init__(self, tmp_path: Path, jail_root: Path) -> None:
        self.dir = tmp_path / "gate"
        self.dir.mkdir()
        self.dir.chmod(0o755)  # a root caller's jail runs as a host id of its own
        self.runner = make_runner(import_paths=[str(self.dir)], temp_root=str(jail_root),
                                  limits=Limits(wall_time_s=scaled(20.0)))
        self.count = 0

    def program(self) -> tuple[list[str], bytes]:
        """A new held program's argv, and the token that finds it."""
        self.count += 1
        token = f"gate-{os.getpid()}-{self.count}"
        go = str(self.dir / "go")
        return (["python3", "-c", f"import os, time  # {token}\n"
                 f"while not os.path.exists({go!r}): time.sleep(0.005)\n"], token.encode())

    def open(self) -> None:
        (self.dir / "go").touch()

    def close(self) -> None:
        (self.dir / "go").unlink(missing_ok=True)


def running(token: bytes) -> int | None:
    """The host pid of the one process whose argv holds `token`, if any."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if token in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    assert len(found) <= 1, found
    return found[0] if found else None


def leader_of(pid: int) -> int:
    """The ancestor of `pid` that is our child: its jail's leader."""
    while (parent := int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
           ) != os.getpid():
        pid = parent
    return pid


async def test_equal_limits_use_the_prewarmed_worker(tmp_path: Path, jail_root: Path) -> None:
    """Limits equal to the pool's, however built, are the pool's: the call
    is served by the idle worker; other limits get a jail of their own,
    and the idle worker is ended for its slot."""
    gate = Gate(tmp_path, jail_root)
    runner = gate.runner
    same = Limits.from_mapping({"wall_time_s": runner.limits.wall_time_s})
    assert same == runner.limits
    assert same is not runner.limits
    other = runner.limits.replace(cpu_time_s=3.0)
    async with runner.pool("exec", size=1) as pool:
        for limits, prewarmed in ((same, True), (other, False), (None, True)):
            await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
            before = set(child_pids())  # the fork server, the idle worker's leader
            argv, token = gate.program()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(pool.exec, argv, limits=limits))
                held = await wait_until(partial(running, token), 30, "the held program")
                assert (leader_of(held) in before) is prewarmed
                assert pool.idle_workers == 0
                assert len(list(jail_root.iterdir())) == 1  # never two: one slot
                gate.open()
            gate.close()


async def test_a_call_of_its_own_limits_takes_one_of_the_pools_slots(
        tmp_path: Path, jail_root: Path) -> None:
    """A pool of size 1: two calls with limits of their own do not run at
    once. The second waits (nothing of it started: no jail dir, no
    process) until the first has ended; then it runs; then the pool
    refills."""
    gate = Gate(tmp_path, jail_root)
    runner = gate.runner
    a = runner.limits.replace(cpu_time_s=2.0)
    b = runner.limits.replace(cpu_time_s=3.0)
    ended: list[str] = []

    async def call(name: str, argv: list[str], limits: Limits) -> None:
        result = await pool.exec(argv, limits=limits)
        assert result.rules_version == runner.rules_version(limits)
        ended.append(name)

    async with runner.pool("exec", size=1) as pool, trio.open_nursery() as nursery:
        await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
        argv, token = gate.program()
        nursery.start_soon(call, "a", argv, a)
        held = await wait_until(lambda: running(token), 30, "a's program")
        nursery.start_soon(call, "b", ["true"], b)
        await wait_until(lambda: pool.calls_waiting == 1, 30, "b waiting for a slot")
        assert pool.idle_workers == 0  # ended for a's slot, not refilled while it runs
        assert len(list(jail_root.iterdir())) == 1  # a's: nothing of b's is made yet
        assert sorted(child_pids()) == sorted({pool._spawner.pid, leader_of(held)})  # type: ignore[attr-defined]
        assert ended == []
        gate.open()
        await wait_until(lambda: ended == ["a", "b"], 60, "a, then b")
        await wait_until(lambda: pool.idle_workers == 1, 60, "the pool refilled")
        assert pool.calls_waiting == 0


async def test_limits_of_another_type_are_refused(runner: Runner) -> None:
    async with runner.pool("exec", size=1) as pool:
        with pytest.raises(TypeError, match=r"trunner\.Limits"):
            await pool.exec(["true"], limits={"cpu_time_s": 1})  # type: ignore[arg-type]


BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_the_docs_block_runs_as_written(tmp_path: Path) -> None:
    """docs/pool.md's per-call limits block (its first), as a program of its own."""
    program = BLOCK.findall((ROOT / "docs" / "pool.md").read_text())[0]
    (tmp_path / "pool_limits.py").write_text(program)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "pool_limits.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.splitlines() == ["easy cpu_time", "hard ok"]
