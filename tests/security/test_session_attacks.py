"""A session's commands against each other and against the session: what
one command (or a background process) does cannot reach another's
processes, the session's own pid 1 and 2, or the next command's setup."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest

from support import wait_until
from trunner import Reason, RunnerError

if TYPE_CHECKING:
    from trunner import Runner


async def test_kill_minus_one_reaches_only_the_commands_own_processes(runner: Runner) -> None:
    """`kill(-1, SIGKILL)` from a command (every process it may signal)
    leaves the background process and the session alive: they are in
    other PID namespaces."""
    async with runner.session() as s:
        bg = await s.start_background(["sh", "-c", "echo up; exec sleep 1000"])
        await wait_until(lambda: bg.stdout == b"up\n", 20, "the background process")
        with pytest.raises(RunnerError) as info:  # its own adapter, pid 2, is among them
            await s.exec(["sh", "-c", "kill -9 -1; echo still"])
        after = await s.exec(["echo", "serving"])
        assert bg.running
        await bg.stop()
    assert info.value.reason is Reason.KILLED_BY_SIGNAL
    assert after.response.stdout == b"serving\n"


async def test_a_background_process_cannot_see_or_trace_a_later_command(
        runner: Runner) -> None:
    """A background process polls every pid it can name for a later
    command's processes (its sleep, its helper): /proc shows none of them,
    kill(pid, 0) and ptrace find nothing outside its own namespace."""
    watcher = [sys.executable, "-c", (
        "import ctypes, os, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "seen = set()\n"
        "end = time.monotonic() + 3\n"
        "while time.monotonic() < end:\n"
        "    seen.update(n for n in os.listdir('/proc') if n.isdigit())\n"
        "    for pid in range(1, 400):\n"
        "        if libc.ptrace(16, pid, 0, 0) == 0:\n"  # PTRACE_ATTACH
        "            print('attached', pid, flush=True)\n"
        "print('seen', ' '.join(sorted(seen, key=int)), flush=True)\n")]
    async with runner.session() as s:
        bg = await s.start_background(watcher)
        for _ in range(5):
            await s.exec(["sh", "-c", "sleep 0.2"])
        await bg.wait()
        out = bg.stdout.decode()
    assert "attached" not in out, out
    assert out.startswith("seen "), out
    # Its own namespace only: its pid 1 (the waiter), 2 (the adapter), itself.
    assert out.split()[1:] == ["1", "2", "3"], out
