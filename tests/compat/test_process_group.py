"""The program runs in a session and process group of its own (issue 19):
`kill 0` and `killpg` reach only its own tree, never trunner's adapter."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trunner import Runner

PY = sys.executable


async def test_the_program_leads_its_own_session_and_group(runner: Runner) -> None:
    probe = "import os; print(os.getpid() == os.getsid(0) == os.getpgid(0), os.getppid())"
    done = (await runner.exec([PY, "-c", probe])).response
    leads, parent = done.stdout.split()
    assert leads == b"True"
    assert parent == b"2"  # the adapter (pid 2 of the jail), alive


async def test_kill_term_0_from_a_shell_that_ignores_it_leaves_the_run_ok(runner: Runner) -> None:
    # Before: the signal reached the adapter too, and the run ended killed_by_signal.
    script = "trap '' TERM; kill -TERM 0; echo survived"
    done = (await runner.exec(["/bin/sh", "-c", script])).response
    assert (done.exit_code, done.stdout, done.stderr) == (0, b"survived\n", b"")


async def test_killpg_0_sigkill_ends_only_the_programs_group(runner: Runner) -> None:
    code = ("import os, signal, sys\n"
            "if os.fork() == 0:\n"
            "    os.killpg(0, signal.SIGKILL)\n"
            "os.wait()\n")
    done = (await runner.exec([PY, "-c", code])).response
    # The program itself died by SIGKILL; the adapter did not, so the run is
    # an ordinary result that says so (before: killed_by_signal, no result).
    assert (done.exit_code, done.signal) == (None, 9), done
    assert done.stdout == b""


async def test_kill_0_ends_the_program_not_the_adapter(runner: Runner) -> None:
    done = (await runner.exec(["/bin/sh", "-c", "kill 0; echo not reached"])).response
    assert (done.exit_code, done.signal, done.stdout) == (None, 15, b"")


# A daemon that leaves every group trunner knows, and still ends with the run:
# tests/security/test_processes.py, test_a_daemon_that_left_every_group_is_dead_when_exec_returns.
