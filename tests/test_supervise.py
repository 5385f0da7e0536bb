"""nursery_run.supervise on its own: the post-exit drain bound.

Under the jail no descendant outlives the run (the PID namespace ends with
its pid 1, whatever sessions its members made), so the escaped-descendant
case is driven here with a plain, unjailed child: this tests the supervision
mechanism, not the jail.
"""

from __future__ import annotations

import os
import sys

import pytest
import trio

from support import Unjailed, is_alive, scaled, wait_until
from trunner.errors import Reason, RunnerError
from trunner.nursery_run import supervise
from trunner.spawn import spawn

ESCAPE = """
import os, sys, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    os.write(w, b"x")  # out of the group before the parent exits
    time.sleep(30)
    os._exit(0)
os.read(r, 1)
sys.stderr.write(f"{pid}\\n"); sys.stderr.flush()
os._exit(0)
"""


async def test_escaped_descendant_holding_stdout_is_drain_timeout() -> None:
    cmd = Unjailed((sys.executable, "-I", "-c", ESCAPE))
    child = await spawn(cmd)
    start = trio.current_time()
    outcome = await supervise(
        child, b"", deadline=trio.current_time() + 20, stdout_max_bytes=100,
        stderr_max_bytes=100, drain_grace_s=0.5,
    )
    elapsed = trio.current_time() - start
    assert outcome.failure is Reason.DRAIN_TIMEOUT
    assert outcome.exit_code == 0
    assert elapsed < scaled(10)  # bounded by the grace, not by the grandchild's 30 s
    escaped = int(outcome.stderr.split()[0])
    try:
        assert is_alive(escaped)  # it really escaped the group kill
    finally:
        os.kill(escaped, 9)
        await wait_until(lambda: not is_alive(escaped), 10, "the escaped one killed")


async def test_stdin_larger_than_the_pipe_is_fed_and_unread_stdin_is_fine() -> None:
    data = os.urandom(3 * 1024 * 1024)
    cmd = Unjailed(("/bin/cat",))
    outcome = await supervise(
        await spawn(cmd), data, deadline=trio.current_time() + 20,
        stdout_max_bytes=len(data), stderr_max_bytes=0,
    )
    assert (outcome.failure, outcome.exit_code, bytes(outcome.stdout)) == (None, 0, data)
    cmd = Unjailed(("/bin/true",))
    outcome = await supervise(
        await spawn(cmd), data, deadline=trio.current_time() + 20,
        stdout_max_bytes=0, stderr_max_bytes=0,
    )
    assert (outcome.failure, outcome.exit_code) == (None, 0)


async def test_spawn_failure_is_named_and_leaks_nothing() -> None:
    # (no_leaks checks the fds and children after the test)
    with pytest.raises(RunnerError) as info:
        await spawn(Unjailed(("/nonexistent",)))
    assert info.value.reason is Reason.SPAWN_FAILED
    assert "errno 2" in info.value.detail, info.value.detail
