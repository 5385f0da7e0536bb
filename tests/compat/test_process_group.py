"""The program runs in a session and process group of its own (issue 19):
`kill 0` and `killpg` reach only its own tree, never trunner's adapter, and
what leaves every group still ends with the run (pid 1's death ends the PID
namespace)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from support import pid_namespace_members

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


async def test_a_tree_that_leaves_every_group_ends_with_the_run(runner: Runner) -> None:
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.setpgid(0, 0)\n"
            "        print(os.getpid(), os.readlink('/proc/self/ns/pid'), flush=True)\n"
            "        os.close(1); os.close(2)\n"
            "        time.sleep(1000)\n"
            "    os._exit(0)\n"
            "os.wait()\n")
    done = (await runner.exec([PY, "-c", code])).response
    assert done.exit_code == 0
    pid, ns = done.stdout.split()
    assert int(pid) > 2  # the daemon was started, in a group trunner never made
    assert pid_namespace_members(ns.decode()) == []  # nothing of the run is alive on the host
