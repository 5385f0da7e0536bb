"""Usage on every result and every failure, and the whole run's CPU-time limit.

Real jails, as root and (scripts/test-unprivileged) as uid 65534. The
figures are asserted with generous bounds: other jails share the host's
CPUs, so a program's wall time is never bounded tightly here. An upper
bound on a time (wall or CPU: a slow host takes longer for the same work,
and a limit is enforced later after it is crossed) is `scaled`; a lower
bound is trunner's figure, and is not.
"""

from __future__ import annotations

import os
import pickle
import sys
import textwrap

import pytest

from support import PRELUDE, scaled
from trunner import Limits, Reason, Runner, RunnerError, Usage
from trunner.linux.plan import rlimits_for
from trunner.linux.probe import probe_host

MiB = 1 << 20
#: Whether this caller's runs get a memory cgroup (its figures are then `prog`'s).
CGROUP = bool(probe_host().memory_cgroup_base)

#: A spinner: burns `s` seconds of its own CPU time.
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
#: A 200 MiB toucher: allocates and writes a page of every 4 KiB.
TOUCH = "b = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"


def py(code: str) -> list[str]:
    return [sys.executable, "-S", "-c", code]


def is_root() -> bool:
    return os.geteuid() == 0


async def exec_fails(runner: Runner, argv: list[str], limits: Limits) -> RunnerError:
    with pytest.raises(RunnerError) as info:
        await runner.exec(argv, limits=limits)
    return info.value


async def run_fails(runner: Runner, code: str, limits: Limits) -> RunnerError:
    with pytest.raises(RunnerError) as info:
        await runner.run("children:run_code", PRELUDE + textwrap.dedent(code), limits=limits)
    return info.value


def usage_of(e: RunnerError) -> Usage:
    assert e.usage is not None, (e.reason, e.detail)
    return e.usage


# -- exec: the program's own tree ------------------------------------------------


async def test_a_spinner_uses_cpu_close_to_its_wall_time(runner: Runner) -> None:
    result = await runner.exec(py(SPIN.format(s=0.6)))
    usage = result.usage
    assert usage is not None
    assert usage == result.response.usage
    # process_time() is a system call, so the split is the kernel's to make; the sum is ours
    assert usage.cpu_user_s > 0.05
    assert usage.cpu_sys_s >= 0
    assert usage.cpu_s == pytest.approx(usage.cpu_user_s + usage.cpu_sys_s)
    assert 0.5 <= usage.cpu_s < scaled(5)
    assert usage.wall_s >= usage.cpu_s * 0.9  # one thread: its wall time covers it
    assert usage.memory_source == ("cgroup" if CGROUP else "max_rss")


async def test_a_sleeper_uses_little_cpu_and_its_wall_time(runner: Runner) -> None:
    usage = (await runner.exec(["sleep", "1"])).usage
    assert usage is not None
    assert usage.wall_s >= 0.95
    assert usage.cpu_s < scaled(0.3)


async def test_a_200_mib_toucher_peaks_past_200_mib(runner: Runner) -> None:
    usage = (await runner.exec(py(TOUCH))).usage
    assert usage is not None
    assert usage.peak_memory_bytes >= 200 * MiB


async def test_the_usage_is_the_programs_not_the_adapters(runner: Runner) -> None:
    """`true` uses next to nothing: no interpreter start-up is counted."""
    usage = (await runner.exec(["true"])).usage
    assert usage is not None
    assert usage.cpu_s < scaled(0.05)
    assert usage.wall_s < scaled(1)


async def test_a_spinner_ends_by_cpu_time_with_its_usage(runner: Runner) -> None:
    limits = runner.limits.replace(cpu_time_s=0.5, wall_time_s=20)
    e = await exec_fails(runner, py("while True: pass"), limits)
    assert e.reason is Reason.CPU_TIME
    usage = usage_of(e)
    assert 0.45 <= usage.cpu_s < 0.5 + scaled(1.0)  # ticks in /proc, microseconds in rusage
    assert usage.wall_s < scaled(15)


@pytest.mark.slow
async def test_beside_two_busy_loops_cpu_time_never_ends_a_run_below_its_bound(
        runner: Runner) -> None:
    """On 2 shared cores a spinner's scaled CPU time lags the kernel's tick
    sampling: RLIMIT_CPU at the bound's whole second fired first, at 0.93 s
    reported under cpu_time_s=1 (issue 33). Ten runs, each `cpu_time` at
    1.0 s or more."""
    import subprocess

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: ASYNC220
             for _ in range(2)]  # killed and reaped below
    try:
        limits = runner.limits.replace(cpu_time_s=1.0, wall_time_s=scaled(30))
        reported = []
        for _ in range(10):
            e = await exec_fails(runner, py("while True: pass"), limits)
            assert e.reason is Reason.CPU_TIME, (e.reason, e.detail)
            reported.append(usage_of(e).cpu_s)
        print("cpu_s reported:", sorted(reported))
        assert min(reported) >= 1.0, reported
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


async def test_four_spinners_share_one_whole_run_cpu_time(runner: Runner) -> None:
    """cpu_time_s is the tree's: four processes reach 1.0 s together (not 4 s each)."""
    limits = runner.limits.replace(cpu_time_s=1.0, wall_time_s=20, processes=16)
    code = ("import os\nfor _ in range(3):\n    if os.fork() == 0: break\n"
            "while True: pass\n")
    e = await exec_fails(runner, py(code), limits)
    assert e.reason is Reason.CPU_TIME
    usage = usage_of(e)
    assert 0.9 <= usage.cpu_s < 1.0 + scaled(1.5)
    assert usage.wall_s < scaled(15)


async def test_an_orphan_in_a_session_of_its_own_counts(runner: Runner) -> None:
    """A spinner that left the program's tree (a new session, its stdout and
    stderr closed, so the run ends at the leader's exit) is still the
    program's: the adapter is the tree's subreaper, and kills and reaps it.
    The leader exits once the spinner has used 0.3 s of CPU (its /proc
    figure), not after a fixed time a busy host may give it less of."""
    code = ("import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n"
            "    os.close(1)\n    os.close(2)\n    while True: pass\n"
            "def cpu():\n"
            "    fields = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()\n"
            "    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')\n"
            "while cpu() < 0.3:\n    time.sleep(0.01)\n")
    result = await runner.exec(py(code))
    usage = result.usage
    assert result.response.exit_code == 0
    assert usage is not None
    assert usage.cpu_s >= 0.2


async def test_a_sleeper_ends_by_its_wall_time_with_its_usage(runner: Runner) -> None:
    limits = runner.limits.replace(wall_time_s=0.5)
    e = await exec_fails(runner, ["sleep", "30"], limits)
    assert e.reason is Reason.TIMEOUT
    usage = usage_of(e)
    assert usage.wall_s >= 0.5
    assert usage.cpu_s < scaled(0.3)


async def test_a_toucher_past_the_memory_bound_ends_with_its_usage(runner: Runner) -> None:
    """As root: the memory cgroup, `memory_limit`, with the usage up to the
    kill. Not root there is no memory cgroup; under `address_space_bytes`
    the allocation fails in the program (MemoryError, exit 1): an ordinary
    result, with its usage."""
    if is_root():
        limits = runner.limits.replace(memory_bytes=128 * MiB)
        e = await exec_fails(runner, py(TOUCH), limits)
        assert e.reason is Reason.MEMORY_LIMIT
        usage = usage_of(e)
        assert 64 * MiB <= usage.peak_memory_bytes <= 200 * MiB
    else:
        limits = runner.limits.replace(address_space_bytes=128 * MiB)
        result = await runner.exec(py(TOUCH), limits=limits)
        assert result.response.exit_code == 1
        assert b"MemoryError" in result.response.stderr
        assert result.usage is not None
        assert result.usage.peak_memory_bytes < 128 * MiB


async def test_a_cap_breach_carries_the_usage(runner: Runner) -> None:
    limits = runner.limits.replace(stdout_max_bytes=1000)
    e = await exec_fails(runner, py("import os\nos.write(1, b'x' * 5000)"), limits)
    assert e.reason is Reason.STDOUT_CAP
    assert usage_of(e).wall_s >= 0


async def test_a_program_ignoring_sigxcpu_is_cpu_time_not_a_signal(runner: Runner) -> None:
    limits = runner.limits.replace(cpu_time_s=1.0, wall_time_s=20)
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass\n"
    e = await exec_fails(runner, py(code), limits)
    assert e.reason is Reason.CPU_TIME
    assert usage_of(e).cpu_s >= 0.9


async def test_a_pooled_exec_carries_usage(runner: Runner) -> None:
    async with runner.pool("exec", size=1) as pool:
        result = await pool.exec(["sleep", "0.3"])
    assert result.usage is not None
    assert result.usage.wall_s >= 0.25


# -- run() modes: the adapter process's own figures ------------------------------


async def test_a_run_mode_result_carries_the_adapters_usage(runner: Runner) -> None:
    result = await runner.run("children:run_code", SPIN.format(s=0.5) + TOUCH)
    usage = result.usage
    assert usage is not None
    assert usage.cpu_s >= 0.5
    assert usage.peak_memory_bytes >= 200 * MiB
    assert usage.wall_s >= 0.5


async def test_a_run_mode_spinner_ends_by_cpu_time(runner: Runner) -> None:
    limits = runner.limits.replace(cpu_time_s=0.5, wall_time_s=20)
    e = await run_fails(runner, "while True: pass", limits)
    assert e.reason is Reason.CPU_TIME
    assert 0.45 <= usage_of(e).cpu_s < 0.5 + scaled(1.5)


async def test_run_mode_forks_share_one_cpu_time(runner: Runner) -> None:
    limits = runner.limits.replace(cpu_time_s=1.0, wall_time_s=20, processes=16)
    e = await run_fails(runner, """
        for _ in range(3):
            if os.fork() == 0:
                break
        while True: pass
    """, limits)
    assert e.reason is Reason.CPU_TIME
    assert 0.9 <= usage_of(e).cpu_s < 1.0 + scaled(1.5)


async def test_a_run_mode_sleeper_ends_by_timeout_with_its_usage(runner: Runner) -> None:
    limits = runner.limits.replace(wall_time_s=0.5)
    e = await run_fails(runner, "import time\ntime.sleep(30)", limits)
    assert e.reason is Reason.TIMEOUT
    usage = usage_of(e)
    assert usage.wall_s >= 0.5
    assert usage.cpu_s < scaled(1)


async def test_a_run_mode_error_carries_the_usage(runner: Runner) -> None:
    e = await run_fails(runner, TOUCH + "raise ValueError('boom')", runner.limits)
    assert e.reason is Reason.NONZERO_EXIT
    assert usage_of(e).peak_memory_bytes >= 200 * MiB


async def test_a_run_mode_toucher_past_the_memory_bound(runner: Runner) -> None:
    if is_root():
        e = await run_fails(runner, TOUCH, runner.limits.replace(memory_bytes=128 * MiB))
        assert e.reason is Reason.MEMORY_LIMIT
    else:
        e = await run_fails(runner, TOUCH, runner.limits.replace(address_space_bytes=128 * MiB))
        assert e.reason is Reason.NONZERO_EXIT
        assert "MemoryError" in e.detail
    assert usage_of(e).peak_memory_bytes > 0


async def test_nothing_ran_no_usage(runner: Runner) -> None:
    with pytest.raises(RunnerError) as info:
        await runner.exec(["/x"], files={"/abs": b""})
    assert info.value.reason is Reason.BAD_REQUEST
    assert info.value.usage is None


# -- the limit itself -------------------------------------------------------------


def test_cpu_time_s_is_a_float_and_ints_keep_working() -> None:
    assert Limits(cpu_time_s=3).cpu_time_s == 3.0
    assert type(Limits(cpu_time_s=3).cpu_time_s) is float
    assert type(Limits.from_mapping({"cpu_time_s": 3}).cpu_time_s) is float
    assert Limits(cpu_time_s=0.25).cpu_time_s == 0.25
    with pytest.raises(ValueError, match="cpu_time_s"):
        Limits(cpu_time_s=0)


@pytest.mark.parametrize(("cpu", "soft"), [(0.25, 2), (1, 2), (1.5, 3), (10, 11)])
def test_rlimit_cpu_is_a_backstop_a_second_past_the_next_whole_second(cpu: float,
                                                                       soft: int) -> None:
    """Never first: at ceil(cpu_time_s) the kernel's tick-sampled check fired
    below the bound (issue 33: 0.93 s reported under cpu_time_s=1)."""
    import resource

    limits = Limits(cpu_time_s=cpu)
    (rlimit,) = [r for r in rlimits_for(limits, memory_cgroup=False)
                 if r.resource == resource.RLIMIT_CPU]
    assert (rlimit.soft, rlimit.hard) == (soft, soft + 1)


def test_a_runner_error_keeps_its_usage_through_pickle() -> None:
    usage = Usage(wall_s=1.5, cpu_user_s=1.0, cpu_sys_s=0.25, peak_memory_bytes=1 << 20)
    e = RunnerError(Reason.CPU_TIME, "over", usage=usage)
    back = pickle.loads(pickle.dumps(e))
    assert back.usage == usage
    assert back.usage.cpu_s == 1.25


def test_sub_second_cpu_limits_have_versions_of_their_own() -> None:
    """0.5 s and 0.7 s share RLIMIT_CPU's backstop (2 s) but not their bound."""
    runner = Runner()
    assert (runner.rules_version(Limits(cpu_time_s=0.5))
            != runner.rules_version(Limits(cpu_time_s=0.7)))
