"""`exec` mode: the caps mean the program's own bytes, to the byte."""

from __future__ import annotations

import sys

import pytest

from conftest import child_pids
from trunner import Reason, Runner, RunnerError

CAP = 100_000


def writer(out: int, err: int) -> list[str]:
    return [sys.executable, "-c",
            f"import os; os.write(1, b'o' * {out}) if {out} else None;"
            f" os.write(2, b'e' * {err}) if {err} else None"]


@pytest.mark.parametrize(("out", "err"), [(CAP, 0), (0, CAP), (CAP, CAP), (0, 0)])
async def test_output_up_to_each_cap_is_returned_whole(runner: Runner, out: int, err: int) -> None:
    limits = runner.limits.replace(stdout_max_bytes=CAP, stderr_max_bytes=CAP)
    result = (await runner.exec(writer(out, err), limits=limits)).response
    assert result.exit_code == 0
    assert result.stdout == b"o" * out
    assert result.stderr == b"e" * err


@pytest.mark.parametrize(("out", "err", "reason"), [
    (CAP + 1, 0, Reason.STDOUT_CAP),
    (0, CAP + 1, Reason.STDERR_CAP),
    (10 * CAP, 0, Reason.STDOUT_CAP),
])
async def test_one_byte_over_a_cap_fails_with_that_cap(
    runner: Runner, out: int, err: int, reason: Reason
) -> None:
    limits = runner.limits.replace(stdout_max_bytes=CAP, stderr_max_bytes=CAP)
    with pytest.raises(RunnerError) as info:
        await runner.exec(writer(out, err), limits=limits)
    assert info.value.reason is reason
    assert child_pids() == []


async def test_a_zero_cap_allows_silence_only(runner: Runner) -> None:
    limits = runner.limits.replace(stdout_max_bytes=0)
    assert (await runner.exec(writer(0, 0), limits=limits)).response.stdout == b""
    with pytest.raises(RunnerError) as info:
        await runner.exec(writer(1, 0), limits=limits)
    assert info.value.reason is Reason.STDOUT_CAP


# The program runs in a session and process group of its own (issue 19):
# `kill 0` reaches its own tree, never the adapter, and the run ends by the
# program's own outcome.

async def test_kill_0_of_a_program_that_ignores_it_is_a_normal_exit(runner: Runner) -> None:
    result = (await runner.exec(
        ["/bin/sh", "-c", "trap '' TERM; kill -TERM 0; echo still here; exit 0"])).response
    assert (result.exit_code, result.signal, result.stdout) == (0, None, b"still here\n")


async def test_kill_0_ends_the_program_not_the_adapter(runner: Runner) -> None:
    result = (await runner.exec(["/bin/sh", "-c", "kill 0; echo not reached"])).response
    assert (result.exit_code, result.signal, result.stdout) == (None, 15, b"")


async def test_killpg_0_reaches_only_the_programs_group(runner: Runner) -> None:
    code = ("import os, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            " os.killpg(0, signal.SIGTERM);"
            " print(os.getpid() == os.getpgid(0) == os.getsid(0), os.getppid())")
    result = (await runner.exec([sys.executable, "-c", code])).response
    # Its own session and group; its parent, the adapter, is the jail's pid 2.
    assert (result.exit_code, result.stdout) == (0, b"True 2\n")
