"""The `trunner` command and mode lookup, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS_DIR
from trunner import Reason, Runner, RunnerError, locate_worker
from trunner import runner as runner_module

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
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: trunner-test-modes\nVersion: 1.0\n")
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
