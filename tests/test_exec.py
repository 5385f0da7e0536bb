"""`exec` mode: the caps mean the program's own bytes, to the byte."""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from conftest import child_pids
from trunner import Reason, Runner, RunnerError

if TYPE_CHECKING:
    from pathlib import Path

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


def test_the_exec_adapter_refuses_to_serve_outside_a_jail(tmp_path: Path) -> None:
    """The adapter ends its program's tree with kill(-1), which in a jail
    reaches only that PID namespace. Run by hand on a host it would kill
    every process its caller may signal (a spike did just that, as root):
    it refuses unless it is a jail's pid 2. Tried in a PID namespace of
    its own, as pid 3, beside a sleeper a kill(-1) would end."""
    from trunner import Limits
    from trunner.exec_checks import exec_request
    from trunner.protocol import encode_frame
    from trunner.worker import locate_worker

    request, _ = exec_request(["true"], b"", None, (), Limits())
    (tmp_path / "request").write_bytes(encode_frame(request))
    script = (f"sleep 30 & {shlex.quote(sys.executable)} {shlex.quote(locate_worker())} exec"
              " <request >reply 2>err; echo exit=$?; kill -0 $! && echo sleeper-alive; kill $!")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--pid", "--fork",
                           "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["exit=1", "sleeper-alive"], (done.stdout, done.stderr)
    err = (tmp_path / "err").read_text()
    assert "pid 3, not 2: it runs only inside a trunner jail" in err, err
    assert (tmp_path / "reply").read_bytes() == b""
