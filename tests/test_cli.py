"""The `trunner` command, mode lookup, and signals as cancellation, as a user
runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from conftest import TESTS_DIR, group_alive, is_alive, watch_children
from support import jailed_under
from trunner import (
    Reason,
    Runner,
    RunnerError,
    cancel_on_signals,
    locate_worker,
    runner as runner_module,
)

if TYPE_CHECKING:
    from pathlib import Path

TRUNNER = os.path.join(os.path.dirname(sys.executable), "trunner")


def cli(*args: str, stdin: bytes = b"") -> tuple[int, dict[str, object]]:
    out = subprocess.run([TRUNNER, *args], input=stdin, capture_output=True, timeout=120)
    return out.returncode, json.loads(out.stdout)


def test_exec_prints_one_json_object() -> None:
    code, out = cli("exec", "--text", "--", "/bin/sh", "-c", "echo hi; echo no >&2; exit 4")
    assert code == 0
    assert (out["exit_code"], out["stdout"], out["stderr"]) == (4, "hi\n", "no\n")
    assert len(str(out["rules_version"])) == 64


def test_run_with_request_json_and_error_output(tmp_path: Path) -> None:
    code, out = cli("run", "echo", "--request", '{"a": [1, 2]}')
    assert (code, out["response"]) == (0, {"a": [1, 2]})
    code, out = cli("run", "echo", "--request", "-", stdin=b'"from stdin"')
    assert (code, out["response"]) == (0, "from stdin")
    code, out = cli("run", "children:sleep", "--import-path", TESTS_DIR, "--request", "30",
                    "--timeout", "1")
    assert (code, out["error"]) == (1, "timeout")
    code, out = cli("exec", "--timeout", "-1", "--", "/bin/true")
    assert (code, out["error"]) == (2, "bad_request")


def test_locate_worker_finds_the_installed_binary() -> None:
    path = locate_worker()
    assert os.path.dirname(path) == os.path.dirname(os.path.abspath(sys.executable))
    assert os.access(path, os.X_OK)


async def test_entry_point_modes_resolve_and_run(
    jail_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real distribution's metadata on sys.path, registering a mode.
    dist = tmp_path / "site" / "trunner_test_modes-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: trunner-test-modes\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text("[trunner.modes]\nslow-sleep = children:sleep\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    runner_module._mode_entry_points.cache_clear()
    try:
        runner = Runner(temp_root=str(jail_root), import_paths=[TESTS_DIR])
        assert runner.resolve_mode("slow-sleep") == "children:sleep"
        assert (await runner.run("slow-sleep", 0.01)).response == "slept"
        with pytest.raises(RunnerError) as info:
            runner.resolve_mode("not-registered")
        assert info.value.reason is Reason.UNKNOWN_MODE
    finally:
        runner_module._mode_entry_points.cache_clear()


# -- SIGTERM and SIGINT: cancellation, cleanup, 128+signal ---------------------


def _jailed_sleep(root: Path) -> int | None:
    """The pid of a `sleep` jailed from a jail dir under `root`, if one runs."""
    for pid in jailed_under(str(root)):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "sleep" and is_alive(pid):
                    return pid
        except OSError:
            continue
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
async def test_a_signalled_cli_cleans_up_and_exits_128_plus_the_signal(
    jail_root: Path, sig: signal.Signals
) -> None:
    """Before: SIGTERM ended the CLI on the spot and its jail dir stayed."""
    # A plain Popen, polled: the test reads its pipes synchronously once it has exited.
    cli = subprocess.Popen(  # noqa: ASYNC220
        [TRUNNER, "exec", "--timeout", "60", "--", "/bin/sleep", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(jail_root)},
    )
    try:
        with trio.fail_after(60):
            while (sleeper := _jailed_sleep(jail_root)) is None:
                assert cli.poll() is None, cli.stderr.read() if cli.stderr else ""
                await trio.sleep(0.005)
        cli.send_signal(sig)
        with trio.fail_after(10):
            while cli.poll() is None:  # noqa: ASYNC110  a plain Popen: nothing to await
                await trio.sleep(0.005)
        assert cli.stdout is not None
        assert cli.stderr is not None
        out = json.loads(cli.stdout.read())
        assert cli.returncode == 128 + sig, cli.stderr.read()
        assert out == {"error": "signal", "detail": f"cancelled by {sig.name}"}
        assert not is_alive(sleeper)
        assert list(jail_root.iterdir()) == []  # removed by the CLI itself, before its exit
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait()
        for stream in (cli.stdout, cli.stderr):
            if stream is not None:
                stream.close()


async def test_cancel_on_signals_cancels_the_runs_and_tells_the_signal(
    runner: Runner, jail_root: Path
) -> None:
    seen: list[int] = []

    async def signal_once_running() -> None:
        with trio.fail_after(30):
            await watch_children(seen)
        os.kill(os.getpid(), signal.SIGINT)  # a real signal to this process

    async with cancel_on_signals() as stop, trio.open_nursery() as nursery:
        nursery.start_soon(signal_once_running)
        await runner.run("children:sleep", 1000)
    assert stop.signal is signal.SIGINT
    assert stop.exit_code == 130
    assert stop.cancel_scope.cancelled_caught
    assert seen
    assert not any(is_alive(p) or group_alive(p) for p in seen)
    assert list(jail_root.iterdir()) == []


async def test_cancel_on_signals_lets_the_body_errors_through_unwrapped(runner: Runner) -> None:
    with pytest.raises(RunnerError) as info:
        async with cancel_on_signals() as stop:
            await runner.run("children:run_code", "import os; os._exit(3)")
    assert (info.value.reason, info.value.exit_status) == (Reason.NONZERO_EXIT, 3)
    assert stop.signal is None
    assert stop.exit_code is None


async def test_cancel_on_signals_around_a_body_that_never_checkpoints() -> None:
    """Its watcher then first runs after the receiver closed (this crashed
    trio with a TrioInternalError, as `trunner exec --timeout -1` did)."""
    async with cancel_on_signals() as stop:
        pass
    await trio.testing.wait_all_tasks_blocked()  # the watcher has run and ended
    assert stop.signal is None
    assert not stop.cancel_scope.cancelled_caught
