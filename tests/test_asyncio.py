"""trunner from asyncio (issue 39): the README's cases awaited from asyncio
tasks through `trunner.aio`, an asyncio cancel that ends the jail before
the `await` returns, errors that cross as themselves, and the trio API
awaited from asyncio refused with a reason that names the asyncio API.

Each test is a plain function that runs its own `asyncio.run`; conftest's
`no_leaks` checks every one (no child, fd, jail dir or cgroup left). The
portal, the trio thread every asyncio call of this process runs in, is
started before that check by `portal` (module scope): its own fds (trio's
epoll and wake-up socket) live as long as the process, not one test.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conftest import cgroup_dirs, child_pids, make_runner
from support import group_alive, is_alive, jailed_under, scaled
from trunner import ExecFile, Limits, Reason, Runner, RunnerError
from trunner.aio import AsyncioRunner, Portal

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine


@pytest.fixture(autouse=True, scope="module")
def portal() -> Portal:
    """The portal, started before any test's leak check is taken."""
    return Portal.get()


@pytest.fixture
def arunner(runner: Runner) -> AsyncioRunner:
    return AsyncioRunner(runner)


def run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(main())


async def until(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`support.wait_until` for asyncio: poll every 5 ms, fail naming `what`."""
    try:
        async with asyncio.timeout(scaled(timeout_s)):
            while not (value := pred()):  # noqa: ASYNC110  a plain predicate
                await asyncio.sleep(0.005)
            return value
    except TimeoutError:
        raise AssertionError(f"not within {scaled(timeout_s)} s: {what}") from None


# -- the README's cases, from asyncio ---------------------------------------------------


def test_the_readme_example_from_asyncio(arunner: AsyncioRunner) -> None:
    async def main() -> list[Any]:
        out: list[Any] = []
        result = await arunner.run("echo", {"x": [1, 2, 3]})
        out.append((result.response, result.rules_version == arunner.rules_version()))
        done = await arunner.exec(["/bin/sh", "-c", "echo $GREETING"], env={"GREETING": "hi"})
        out.append((done.response.exit_code, done.response.stdout))
        missing = await arunner.exec(["no-such-program"])
        out.append((missing.response.exit_code, missing.response.stderr))
        if shutil.which("cc") is not None:
            built = await arunner.exec(["cc", "-o", "prog", "main.c"],
                                       files={"main.c": b"int main(void) { return 3; }"},
                                       collect=["prog"])
            prog = built.response.files[0]
            ran = await arunner.exec(["./prog"], files={
                "prog": ExecFile(data=prog.data, executable=bool(prog.mode & 0o111))})
            out.append(ran.response.exit_code)
        out.append((await arunner.run("children:sleep", 0)).response)  # a user mode
        return out

    out = run(main)
    assert out[0] == ({"x": [1, 2, 3]}, True)
    assert out[1] == (0, b"hi\n")
    assert out[2] == (127, b"trunner: no-such-program: not found\n")
    assert out[-1] == "slept"
    if shutil.which("cc") is not None:
        assert out[3] == 3


def test_usage_and_a_runner_error_cross_as_themselves(arunner: AsyncioRunner) -> None:
    async def main() -> tuple[Any, RunnerError]:
        done = await arunner.exec(["sleep", "0.2"])
        try:
            await arunner.exec(["sh", "-c", "while :; do :; done"],
                               limits=Limits(cpu_time_s=0.5, wall_time_s=scaled(20)))
        except RunnerError as e:
            return done.usage, e
        raise AssertionError("the spin was not ended")

    usage, error = run(main)
    assert usage is not None
    assert usage.wall_s >= 0.2
    assert type(error) is RunnerError
    assert error.reason is Reason.CPU_TIME
    assert error.usage is not None
    assert error.usage.cpu_s >= 0.5


def test_refusals_before_a_spawn_cross_as_themselves(arunner: AsyncioRunner,
                                                     jail_root: Path) -> None:
    async def main() -> list[RunnerError]:
        errors = []
        for call in (lambda: arunner.exec([]), lambda: arunner.run("no_such_mode"),
                     lambda: arunner.run("echo", object())):
            try:
                await call()
            except RunnerError as e:
                errors.append(e)
        return errors

    reasons = [e.reason for e in run(main)]
    assert reasons == [Reason.BAD_REQUEST, Reason.UNKNOWN_MODE, Reason.BAD_REQUEST]
    assert list(jail_root.iterdir()) == []


def test_the_pool_from_asyncio(arunner: AsyncioRunner) -> None:
    async def main() -> tuple[list[Any], int | None]:
        async with arunner.pool("echo", size=2) as pool:
            assert pool.idle_workers == 2  # warm on entry
            first = (await pool.run("a")).response
            many = await asyncio.gather(*(pool.run(i) for i in range(6)))
        epool = arunner.pool("exec", size=1)
        async with epool:
            code = (await epool.exec(["sh", "-c", "exit 4"])).response.exit_code
        async with epool:  # opened again, as a trio pool may be
            assert (await epool.exec(["true"])).response.exit_code == 0
        return [first, *(r.response for r in many)], code

    responses, code = run(main)
    assert responses == ["a", 0, 1, 2, 3, 4, 5]
    assert code == 4


def test_a_warm_block_from_asyncio(arunner: AsyncioRunner) -> None:
    """`async with arunner.warm():` (and `async with arunner:`) keep one
    fork server in the portal: the runs there, concurrent ones too, are
    started by it; it is gone after the block."""
    async def main() -> tuple[list[int | None], list[int | None], list[int | None]]:
        async with arunner.warm() as same:
            assert same is arunner
            server = arunner.runner._warm.server
            assert server is not None
            pid = server.pid  # type: ignore[attr-defined]
            codes = [r.response.exit_code for r in await asyncio.gather(
                *(arunner.exec(["sh", "-c", f"exit {i}"]) for i in range(4)))]
            assert server.starts == 1  # type: ignore[attr-defined]
        async with arunner:
            again = [(await arunner.exec(["true"])).response.exit_code]
            assert arunner.runner._warm.server not in (None, server)
        return codes, again, [pid]

    codes, again, (pid,) = run(main)
    assert codes == [0, 1, 2, 3]
    assert again == [0]
    assert pid is not None
    assert not is_alive(pid)
    assert arunner.runner._warm.server is None


def test_an_exception_of_the_pool_body_leaves_as_itself(arunner: AsyncioRunner) -> None:
    async def main() -> None:
        async with arunner.pool("echo", size=1) as pool:
            await pool.run(1)
            raise KeyError("the body's own")

    with pytest.raises(KeyError, match="the body's own") as info:
        run(main)
    assert type(info.value) is KeyError


def test_a_pool_outside_its_async_with_is_refused(arunner: AsyncioRunner) -> None:
    async def main() -> None:
        await arunner.pool("echo", size=1).run(1)

    with pytest.raises(RuntimeError, match="async with"):
        run(main)


# -- cancellation ----------------------------------------------------------------------


def test_an_asyncio_cancel_ends_the_jail_before_the_await_returns(
        arunner: AsyncioRunner, jail_root: Path) -> None:
    cgroups = cgroup_dirs()

    async def main() -> tuple[list[int], list[Path]]:
        task = asyncio.ensure_future(arunner.run("children:sleep", 1000))
        jailed = await until(lambda: jailed_under(str(jail_root)), 60, "the run jailed")
        dirs = list(jail_root.iterdir())
        task.cancel()
        await asyncio.sleep(0)  # the first cancel delivered: the call is ending
        task.cancel()  # a second one does not cut that short
        with pytest.raises(asyncio.CancelledError):
            await task
        # Back from the await: nothing of the run is left, no waiting.
        assert not any(is_alive(p) or group_alive(p) for p in jailed)
        assert jailed_under(str(jail_root)) == []
        assert list(jail_root.iterdir()) == []
        assert child_pids() == []
        assert cgroup_dirs() == cgroups
        return jailed, dirs

    jailed, dirs = run(main)
    assert jailed  # it was running,
    assert len(dirs) == 1  # in its one jail dir


def test_an_asyncio_timeout_ends_an_exec_and_a_pool_call(arunner: AsyncioRunner,
                                                         jail_root: Path) -> None:
    async def main() -> tuple[bytes, int]:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await arunner.exec(["sleep", "30"])
        assert jailed_under(str(jail_root)) == []
        assert list(jail_root.iterdir()) == []
        async with arunner.pool("exec", size=1) as pool:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await pool.exec(["sleep", "30"])
            # The pool serves on; the cancelled call's jail is gone already:
            # what is left is the refill's (an idle worker, not a sleep).
            assert not [p for p in jailed_under(str(jail_root))
                        if _comm(p) == "sleep"]
            out = (await pool.exec(["echo", "on"])).response.stdout
        current = asyncio.current_task()
        assert current is not None
        return out, current.cancelling()

    out, cancelling = run(main)
    assert out == b"on\n"
    assert cancelling == 0


def test_a_cancel_while_the_pool_opens_leaves_nothing(arunner: AsyncioRunner,
                                                      jail_root: Path) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(_enter_and_wait(arunner))
        await until(lambda: list(jail_root.iterdir()), 60, "the pool starting a worker")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert jailed_under(str(jail_root)) == []
        assert list(jail_root.iterdir()) == []

    run(main)


async def _enter_and_wait(arunner: AsyncioRunner) -> None:
    async with arunner.pool("echo", size=4):
        await asyncio.sleep(1000)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


# -- the pool's own failure ------------------------------------------------------------


def test_a_refill_that_cannot_spawn_cancels_the_body_and_leaves_as_its_error(
        tmp_path: Path) -> None:
    root = tmp_path / "pool-root"
    root.mkdir()
    pooled = AsyncioRunner(make_runner(temp_root=str(root)))

    async def main() -> tuple[RunnerError, RunnerError, int]:
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            async with pooled.pool("echo", size=1, idle_s=0.5) as pool:
                await until(lambda: pool.idle_workers == 0, 30, "the idle worker ended")
                await until(lambda: not os.listdir(root), 30, "its jail dir gone")
                root.rmdir()
                root.write_bytes(b"")  # no jail dir can be made under a file
                try:  # this run's own spawn
                    await pool.run(1)
                except RunnerError as e:
                    own = e
                await asyncio.sleep(scaled(30))  # the refill it woke fails: cancelled
        except RunnerError as e:
            assert loop.time() - began < scaled(30)
            current = asyncio.current_task()
            assert current is not None
            return own, e, current.cancelling()
        raise AssertionError("the body was not cancelled")

    own, failure, cancelling = run(main)
    assert own.reason is Reason.SPAWN_FAILED
    assert type(failure) is RunnerError
    assert failure.reason is Reason.SPAWN_FAILED
    assert cancelling == 0  # the body's cancel was the pool's, and is taken back
    root.unlink()


def test_a_pool_that_cannot_fill_fails_on_entry(tmp_path: Path) -> None:
    root = tmp_path / "pool-root"
    root.mkdir()
    pooled = AsyncioRunner(make_runner(temp_root=str(root)))
    root.rmdir()
    root.write_bytes(b"")
    entered = []

    async def main() -> None:
        async with pooled.pool("echo", size=1):
            entered.append(True)

    with pytest.raises(RunnerError) as info:
        run(main)
    assert entered == []
    assert info.value.reason is Reason.SPAWN_FAILED
    root.unlink()


# -- the wrong API for the loop ----------------------------------------------------------


def test_the_trio_api_from_asyncio_is_refused_naming_the_asyncio_api(
        runner: Runner, jail_root: Path) -> None:
    async def main() -> list[RunnerError]:
        errors = []
        for call in (lambda: runner.run("echo", 1), lambda: runner.exec([]),
                     lambda: runner.exec(["true"]), lambda: _open(runner),
                     lambda: _warm(runner)):
            try:
                await call()
            except RunnerError as e:
                errors.append(e)
        return errors

    errors = run(main)
    assert [e.reason for e in errors] == [Reason.NOT_IN_TRIO] * 5
    for e in errors:
        assert "trunner.aio.AsyncioRunner" in e.detail
    assert list(jail_root.iterdir()) == []  # nothing spawned, nothing to clean


async def _open(runner: Runner) -> None:
    async with runner.pool("echo", size=1):
        pass


async def _warm(runner: Runner) -> None:
    async with runner.warm():
        pass


async def test_the_asyncio_api_from_trio_names_the_trio_api(arunner: AsyncioRunner) -> None:
    with pytest.raises(RuntimeError, match=r"trunner\.Runner"):
        await arunner.run("echo", 1)
    with pytest.raises(RuntimeError, match=r"trunner\.Runner"):
        async with arunner.pool("echo", size=1):
            pass


def test_an_asyncio_runner_takes_a_runner_or_its_arguments(runner: Runner) -> None:
    assert AsyncioRunner(runner).runner is runner
    assert AsyncioRunner(limits=Limits(wall_time_s=3)).limits == Limits(wall_time_s=3)
    with pytest.raises(ValueError, match="not both"):
        AsyncioRunner(runner, limits=Limits())


def test_the_docs_block_runs_as_written(tmp_path: Path) -> None:
    """docs/asyncio.md's block, a program of its own (its jail dirs in the
    system temp dir: the child's `Runner`, removed before it returns)."""
    [program] = re.findall(r"^```python\n(.*?)^```$",
                           (Path(__file__).parent.parent / "docs" / "asyncio.md").read_text(),
                           re.MULTILINE | re.DOTALL)
    (tmp_path / "from_asyncio.py").write_text(program)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "from_asyncio.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=scaled(300))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.splitlines() == ["['42', 'cpu_time']", "cancelled"]


# -- streams and sessions, from asyncio ----------------------------------------


def test_open_process_from_asyncio(arunner: AsyncioRunner) -> None:
    async def main() -> tuple[bytes, bytes, int | None]:
        async with arunner.open_process(["sh", "-c", "read n; echo $((n * 2)); echo e >&2"]) as p:
            await p.stdin.send_all(b"21\n")
            out = await p.stdout.receive_some()
            err = await p.stderr.receive_some()
        assert p.result is not None
        return out, err, p.result.response.exit_code

    assert run(main) == (b"42\n", b"e\n", 0)


def test_an_open_process_cap_leaves_the_async_with_as_its_error(arunner: AsyncioRunner) -> None:
    async def main() -> None:
        async with arunner.open_process(["sh", "-c", "yes"],
                                        limits=Limits(stdout_max_bytes=1000)) as p:
            while True:
                await p.stdout.receive_some()

    with pytest.raises(RunnerError) as info:
        run(main)
    assert info.value.reason is Reason.STDOUT_CAP


def test_a_session_from_asyncio(arunner: AsyncioRunner) -> None:
    """Files kept across commands, a background process, a streamed one,
    and an asyncio cancel that ends one command, not the session."""
    async def main() -> tuple[bytes, bytes, bytes, str]:
        async with arunner.session() as s:
            await s.exec(["sh", "-c", "echo kept > f"])
            bg = await s.start_background(["sh", "-c", "cat f; sleep 1000"])
            await until(lambda: bg.stdout, 20, "the background's output")
            task = asyncio.ensure_future(s.exec(["sleep", "1000"]))
            await asyncio.sleep(scaled(0.5))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with s.open_process(["cat", "f"]) as p:
                streamed = await p.stdout.receive_some()
            await s.write_files({"g": b"written\n"})
            assert [e.data for e in await s.read_files(["g"])] == [b"written\n"]
            assert await s.import_(await s.export("."), "copy") >= 2
            kept = (await s.exec(["cat", "copy/f"])).response.stdout
            await bg.stop()
            return kept, bg.stdout, streamed, s.ended

    kept, background, streamed, ended = run(main)
    assert kept == background == streamed == b"kept\n"
    assert ended == ""


def test_an_exception_of_the_session_body_leaves_as_itself(arunner: AsyncioRunner) -> None:
    async def main() -> None:
        async with arunner.session() as s:
            await s.exec(["true"])
            raise KeyError("the body's own")

    with pytest.raises(KeyError, match="the body's own") as info:
        run(main)
    assert type(info.value) is KeyError
    assert child_pids() == []


def test_cancel_on_signals_from_asyncio(arunner: AsyncioRunner) -> None:
    """SIGTERM cancels the body: the run in flight ends its jail (the leak
    check), the `async with` returns with the signal."""
    import signal

    from trunner.aio import cancel_on_signals

    async def main() -> tuple[object, int | None, bool]:
        reached = False
        async with cancel_on_signals() as stop:
            asyncio.get_running_loop().call_later(scaled(0.5), os.kill, os.getpid(),
                                                  signal.SIGTERM)
            await arunner.exec(["sleep", "1000"], limits=Limits(wall_time_s=scaled(60)))
            reached = True
        return stop.signal, stop.exit_code, reached

    assert run(main) == (signal.SIGTERM, 143, False)
    assert child_pids() == []
