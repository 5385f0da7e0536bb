"""A warm Runner (issue 40): `async with runner.warm():` keeps one fork
server, and `run`, `exec` and `open_process` there start their jails
through it. The seed's spawn clauses hold on that path (a cleared
environment, the jail as cwd, piped stdio, a fresh process group, the full
helper chain), the server lives exactly as long as the blocks, and no run
begun in a block is left without its leader when the last one ends."""

from __future__ import annotations

import errno
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trunner.linux.forkclient
from conftest import TESTS_DIR, child_pids, open_fds
from support import (
    a_killed_parent_leaves_nothing,
    is_alive,
    run_code,
    scaled,
    wait_until,
)
from trunner import Reason, Runner, RunnerError
from trunner.linux.plan import WORKDIR

ROOT = Path(__file__).resolve().parent.parent


def _server(runner: Runner) -> trunner.linux.forkclient.ForkServer:
    server = runner._warm.server
    assert isinstance(server, trunner.linux.forkclient.ForkServer), server
    return server


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command: [state, ppid, pgrp, session, ...]."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].decode().split()


async def test_a_block_starts_one_server_on_entry_and_stops_it_at_its_end(
        runner: Runner) -> None:
    async with runner.warm() as same:
        assert same is runner
        server = _server(runner)
        pid = server.pid
        assert pid is not None
        assert is_alive(pid)  # started on entry, before any run
        for argv in (["/bin/true"], ["/bin/echo", "hi"]):
            result = await runner.exec(argv)
            assert result.response.exit_code == 0
            assert result.rules_version == runner.rules_version()  # the cold plan's
        assert (await runner.run("echo", b"x")).response == b"x"  # a built-in, in pid 2
        assert await run_code(runner, "result = 'u'") == "u"  # a user mode, exec'd
        async with runner.open_process(["/bin/cat"]) as p:
            await p.stdin.send_all(b"abc")
            await p.stdin.aclose()
            assert await p.stdout.receive_some() == b"abc"
        assert p.result is not None
        assert p.result.response.exit_code == 0
        assert (server.starts, server.losses, server.strays, server.pid) == (1, 0, 0, pid)
    assert runner._warm.server is None
    assert not is_alive(pid)
    # Outside every block, runs are cold: no server is started for them.
    async with runner.open_process(["/bin/sleep", "5"]):
        (leader,) = child_pids()
        assert b"server" not in Path(f"/proc/{leader}/cmdline").read_bytes()
        assert runner._warm.server is None


async def test_async_with_the_runner_is_a_block(runner: Runner) -> None:
    async with runner as same:
        assert same is runner
        pid = _server(runner).pid
        assert pid is not None
        assert (await runner.exec(["/bin/true"])).response.exit_code == 0
    assert not is_alive(pid)
    assert runner._warm.server is None


async def test_the_spawn_clauses_hold_on_the_warm_path(
        runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cleared environment, the jail as cwd, piped stdio and nothing
    else, a session and group of the leader's own, and the whole chain:
    no new privileges, the seccomp filter, no capability."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2-secret")
    async with runner.warm():
        status: dict[str, Any] = (await runner.run("children:status")).response
        environ, raw, fds = await run_code(runner, """
            result = [dict(os.environ), open("/proc/self/environ", "rb").read().decode(),
                      {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)}]
        """)
        async with runner.open_process(["/bin/sleep", "5"]):
            leaders = [p for p in child_pids() if p != _server(runner).pid]
            assert len(leaders) == 1, leaders
            (leader,) = leaders
            _, ppid, pgrp, session = _stat(leader)[:4]
            assert int(ppid) == os.getpid()  # ours to reap, not the server's
            assert int(pgrp) == int(session) == leader != os.getpgid(0)
    assert "hunter2-secret" not in repr([environ, raw])
    assert set(environ) == {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONPATH"}
    assert all(target.startswith("pipe:") for target in fds.values()), fds
    text = status["status"]
    for line in ("NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000",
                 "CapBnd:\t0000000000000000"):
        assert line in text
    assert len(set(status["fds"]) - {0, 1, 2, status["reply_fd"]}) <= 1
    assert (status["pid"], status["pgid"], status["sid"]) == (2, 0, 0)
    assert status["cwd"] == WORKDIR


async def test_overlapping_blocks_share_the_server_until_the_last_ends(runner: Runner) -> None:
    first_done = trio.Event()
    async with runner.warm():
        pid = _server(runner).pid
        assert pid is not None

        async def second() -> None:
            async with runner.warm():
                assert _server(runner).pid == pid
                await first_done.wait()
                # The first block has ended; this one's runs still use the server.
                assert (await runner.exec(["/bin/true"])).response.exit_code == 0
                assert _server(runner).starts == 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            async with runner.warm():  # nested in the first: the same server
                assert _server(runner).pid == pid
            assert is_alive(pid)
            first_done.set()
    assert not is_alive(pid)
    assert runner._warm.server is None


async def test_a_run_begun_in_a_block_is_spawned_before_the_server_stops(
        runner: Runner) -> None:
    """A run from another task that took the block's server and has no
    leader yet when the block ends: the end waits for its spawn, so the run
    is served, and the server stops after."""
    results: list[int | None] = []

    async def one() -> None:
        results.append((await runner.exec(["/bin/echo", "ok"])).response.exit_code)

    async def let_go(pid: int) -> None:
        await trio.testing.wait_all_tasks_blocked()  # the block's end waits
        assert is_alive(pid)
        os.kill(pid, signal.SIGCONT)

    async with trio.open_nursery() as nursery:
        async with runner.warm():
            server = _server(runner)
            pid = server.pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)  # it answers no request until let go
            nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            assert runner._warm._pending == 1  # it took the server, and waits for its leader
            nursery.start_soon(let_go, pid)
        assert not is_alive(pid)  # stopped once the run had its leader
    assert results == [0]
    assert (server.starts, server.losses) == (1, 0)
    assert runner._warm._pending == 0


async def test_a_server_killed_in_a_block_is_replaced_and_both_are_gone(
        runner: Runner) -> None:
    async with runner.warm():
        server = _server(runner)
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: not is_alive(first), 10, "the server's death")
        assert (await runner.exec(["/bin/true"])).response.exit_code == 0
        second = server.pid
        assert second is not None
        assert second != first
        assert server.starts == 2
    assert not is_alive(second)


async def test_a_failed_run_in_a_block_keeps_its_reason(runner: Runner) -> None:
    async with runner.warm():
        with pytest.raises(RunnerError) as info:
            await runner.exec(["/bin/sleep", "10"], limits=runner.limits.replace(wall_time_s=0.2))
        assert info.value.reason is Reason.TIMEOUT
        with pytest.raises(RunnerError) as info:
            await runner.exec(["/bin/sh", "-c", "head -c 2000 /dev/zero"],
                              limits=runner.limits.replace(stdout_max_bytes=100))
        assert info.value.reason is Reason.STDOUT_CAP
        assert runner._warm._pending == 0
        assert _server(runner).starts == 1


async def test_a_server_that_cannot_start_fails_its_block_and_leaves_nothing(
        runner: Runner) -> None:
    """Its descriptors run out (EMFILE, this process's RLIMIT_NOFILE just
    above those open): entering the block is `spawn_failed` naming the
    errno, no run waits for it, nothing it opened stays open, and the next
    block starts a server as usual."""
    assert (await runner.exec(["/bin/true"])).response.exit_code == 0  # the backend's files read
    before = open_fds()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        with pytest.raises(RunnerError) as info:
            async with runner.warm():
                pytest.fail("the block was entered")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert info.value.reason is Reason.SPAWN_FAILED
    assert f"fork server: Too many open files (errno {errno.EMFILE})" in str(info.value)
    assert runner._warm.server is None
    assert open_fds() == before
    assert child_pids() == []
    async with runner.warm():
        assert (await runner.exec(["/bin/true"])).response.exit_code == 0
        assert _server(runner).starts == 1


PARENT = """
import sys, trio
sys.path.insert(0, {tests!r})
from trunner import Runner, Limits
async def main():
    runner = Runner(temp_root={root!r}, limits=Limits(wall_time_s=60))
    async with runner:
        print(runner._warm.server.pid, flush=True)
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(runner.exec, ["/bin/sleep", "1000"])
trio.run(main)
"""


async def test_the_parent_dies_and_the_server_and_every_jail_go(tmp_path: Path) -> None:
    """The backstop is the server's parent-death signal, not a collector."""
    root = tmp_path / "parent-jails"
    root.mkdir()
    await a_killed_parent_leaves_nothing(PARENT.format(tests=TESTS_DIR, root=str(root)), root)


def test_the_docs_block_runs_as_written(tmp_path: Path) -> None:
    """docs/pool.md's warm Runner block (its second), as a program of its own."""
    program = re.findall(r"^```python\n(.*?)^```$", (ROOT / "docs" / "pool.md").read_text(),
                         re.MULTILINE | re.DOTALL)[1]
    (tmp_path / "warm.py").write_text(program)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "warm.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.splitlines() == ["one", "two"]
