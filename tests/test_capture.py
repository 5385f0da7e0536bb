"""Output before a failure (issue 35, item 4): with
`exec(..., capture_on_failure=True)` a limit's `RunnerError` carries
`.output`, what the program printed before it, each stream within its cap,
marked if cut; without it, none. Real programs, real limits; the bytes are
asserted exactly. The output comes from the adapter's own reply (the program
cannot write it: tests/security/test_verdict.py); where the adapter wrote
none, `.output` is None and `.detail` says why."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import assert_carries_no_output, scaled
from trunner import CapturedOutput, Reason, Runner, RunnerError
from trunner.linux.probe import probe_host
from trunner.protocol import ExecResult, encode_frame

ROOT = Path(__file__).resolve().parent.parent
PROGRESS = ["sh", "-c", "echo progress-line; echo to-stderr >&2; sleep 30"]


async def _fails(runner: Runner, argv: list[str], **kw: object) -> RunnerError:
    with pytest.raises(RunnerError) as info:
        await runner.exec(argv, **kw)  # type: ignore[arg-type]
    return info.value


async def test_a_timeout_carries_what_was_printed_before_it_when_asked(runner: Runner) -> None:
    limits = runner.limits.replace(wall_time_s=scaled(1))
    e = await _fails(runner, PROGRESS, limits=limits, capture_on_failure=True)
    assert e.reason is Reason.TIMEOUT, e
    assert e.output == CapturedOutput(stdout=b"progress-line\n", stderr=b"to-stderr\n")
    assert e.usage is not None  # the same failure, with its usage
    assert "no output captured" not in e.detail
    # The default stays: no output on the error.
    e = await _fails(runner, PROGRESS, limits=limits)
    assert e.reason is Reason.TIMEOUT
    assert e.output is None
    assert_carries_no_output(e)


async def test_cpu_time_carries_the_output(runner: Runner) -> None:
    limits = runner.limits.replace(cpu_time_s=0.3)
    e = await _fails(runner, ["sh", "-c", "echo spinning; while :; do :; done"], limits=limits,
                     capture_on_failure=True)
    assert e.reason is Reason.CPU_TIME, e
    assert e.output == CapturedOutput(stdout=b"spinning\n", stderr=b"")


def _writer(out: int, err: int) -> list[str]:
    return [sys.executable, "-c", f"import os, time; os.write(1, b'o' * {out});"
            f" os.write(2, b'e' * {err}); time.sleep(30)"]


async def test_a_crossed_cap_keeps_the_stream_to_its_cap_marked_cut(runner: Runner) -> None:
    limits = runner.limits.replace(stdout_max_bytes=1000, stderr_max_bytes=500)
    e = await _fails(runner, _writer(100_000, 0), limits=limits, capture_on_failure=True)
    assert e.reason is Reason.STDOUT_CAP, e
    assert e.output == CapturedOutput(stdout=b"o" * 1000, stderr=b"", stdout_truncated=True)
    e = await _fails(runner, _writer(10, 100_000), limits=limits, capture_on_failure=True)
    assert e.reason is Reason.STDERR_CAP, e
    assert e.output == CapturedOutput(stdout=b"o" * 10, stderr=b"e" * 500,
                                      stderr_truncated=True)
    # Each stream exactly at its cap: nothing cut, the limit is the wall time.
    limits = limits.replace(wall_time_s=scaled(1))
    e = await _fails(runner, _writer(1000, 500), limits=limits, capture_on_failure=True)
    assert e.reason is Reason.TIMEOUT, e
    assert e.output == CapturedOutput(stdout=b"o" * 1000, stderr=b"e" * 500)


async def test_the_bytes_are_never_decoded(runner: Runner) -> None:
    """A program that prints a well-formed reply frame gets it back as bytes,
    as any other output: never read as a response, and the failure stands."""
    fake = encode_frame(ExecResult(exit_code=0, signal=None, stdout=b"forged", stderr=b""))
    limits = runner.limits.replace(wall_time_s=scaled(1))
    e = await _fails(runner, [sys.executable, "-c", "import sys, time;"
                              f" sys.stdout.buffer.write({fake!r}); sys.stdout.flush();"
                              " time.sleep(30)"], limits=limits, capture_on_failure=True)
    assert e.reason is Reason.TIMEOUT
    assert e.output is not None
    assert e.output.stdout == fake


async def test_too_many_files_carries_the_output(runner: Runner) -> None:
    code = "print('made'); [open(f'f{i}', 'w').close() for i in range(10_001)]"
    e = await _fails(runner, [sys.executable, "-c", code], collect=["f*"],
                     capture_on_failure=True)
    assert e.reason is Reason.TOO_MANY_FILES, e
    assert e.output == CapturedOutput(stdout=b"made\n", stderr=b"")


async def test_memory_limit_carries_the_output(runner: Runner) -> None:
    if not probe_host().memory_cgroup_base:
        pytest.skip(f"no memory cgroup for this caller (uid {os.getuid()}): no memory_limit")
    limits = runner.limits.replace(memory_bytes=128 << 20, wall_time_s=scaled(30))
    code = "print('allocating', flush=True); b = b'x' * (512 << 20); print('done')"
    e = await _fails(runner, [sys.executable, "-c", code], limits=limits,
                     capture_on_failure=True)
    assert e.reason is Reason.MEMORY_LIMIT, e
    assert e.output is not None
    assert e.output.stdout == b"allocating\n"
    assert not e.output.stdout_truncated


@pytest.mark.slow
async def test_no_reply_no_output_and_the_detail_says_why(runner: Runner) -> None:
    """A program that stops its adapter (SIGSTOP: same uid in the jail)
    leaves it no chance to report: the parent's backstop deadline (1 s past
    wall_time_s) ends the run, `timeout`, with no output, and says so."""
    limits = runner.limits.replace(wall_time_s=scaled(1))
    e = await _fails(runner, ["sh", "-c", "echo hi; kill -STOP $PPID; sleep 30"],
                     limits=limits, capture_on_failure=True)
    assert e.reason is Reason.TIMEOUT, e
    assert e.output is None
    assert "no output captured: the adapter wrote no reply" in e.detail
    assert "no output captured" in str(e)


async def test_other_failures_carry_no_output(runner: Runner) -> None:
    """Only a limit's reason carries output: a refusal before spawn is as it was."""
    e = await _fails(runner, [], capture_on_failure=True)
    assert e.reason is Reason.BAD_REQUEST
    assert e.output is None
    assert "no output" not in e.detail
    assert_carries_no_output(e)


def test_the_output_survives_pickle() -> None:
    """A `RunnerError` crosses processes whole (a pool's thread, Ray)."""
    output = CapturedOutput(stdout=b"o", stderr=b"e" * 3, stderr_truncated=True)
    e = pickle.loads(pickle.dumps(RunnerError(Reason.TIMEOUT, "late", output=output)))
    assert (e.reason, e.detail, e.output) == (Reason.TIMEOUT, "late", output)
    assert pickle.loads(pickle.dumps(RunnerError(Reason.TIMEOUT, "late"))).output is None


def test_within_cuts_each_stream_to_its_cap() -> None:
    assert CapturedOutput.within(b"abc", b"de", stdout_max_bytes=2, stderr_max_bytes=2) == (
        CapturedOutput(stdout=b"ab", stderr=b"de", stdout_truncated=True))
    assert CapturedOutput.within(b"", b"", stdout_max_bytes=0, stderr_max_bytes=0) == (
        CapturedOutput(stdout=b"", stderr=b""))


def test_the_docs_block_runs(tmp_path: Path) -> None:
    """docs/api.md, "Output before a failure": its block, run as written."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("\n## Output before a failure\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```python\n(.*?)^```$", section, re.M | re.S)
    assert block is not None
    (tmp_path / "capture.py").write_text(block.group(1))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "capture.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "timeout b'progress-line\\n'\n"


def test_the_limits_are_the_adapters() -> None:
    """What `.output` may be attached for: the limits the exec adapter ends a
    program for and still reports (docs/api.md lists the same)."""
    from trunner.errors import CAPTURED_REASONS

    assert {r.value for r in CAPTURED_REASONS} == {
        "timeout", "cpu_time", "memory_limit", "stdout_cap", "stderr_cap", "too_many_files"}
    text = (ROOT / "docs" / "api.md").read_text().split("\n## Output before a failure\n")[1]
    section = text.split("\n```", 1)[0]
    for reason in CAPTURED_REASONS:
        assert f"`{reason.value}`" in section, reason


def test_the_cli_prints_it_under_its_own_key() -> None:
    """`trunner exec --capture-on-failure`: the failure's JSON has `output`
    beside `error`; without the flag it has none."""
    import json

    base = [sys.executable, "-m", "trunner", "exec", "--text", "--wall-time-s", str(scaled(1))]
    for flag, expected in (["--capture-on-failure"], True), ([], False):
        done = subprocess.run([*base, *flag, "--", *PROGRESS], capture_output=True, text=True,
                              timeout=scaled(120), cwd=ROOT)
        assert done.returncode == 1, done.stderr
        out = json.loads(done.stdout)
        assert out["error"] == "timeout"
        if expected:
            assert out["output"] == {"stdout": "progress-line\n", "stderr": "to-stderr\n",
                                     "stdout_truncated": False, "stderr_truncated": False}
        else:
            assert "output" not in out


async def test_a_pool_call_carries_it_on_a_prewarmed_worker_and_with_its_own_limits(
    runner: Runner,
) -> None:
    """`pool.exec(..., capture_on_failure=True)`: on a prewarmed worker (the
    pool's limits) and on a jail started for a call's own limits alike."""
    tight = runner.limits.replace(wall_time_s=scaled(1))
    async with runner.pool("exec", size=1, limits=tight) as pool:
        with pytest.raises(RunnerError) as info:
            await pool.exec(PROGRESS, capture_on_failure=True)
        assert info.value.reason is Reason.TIMEOUT
        assert info.value.output == CapturedOutput(stdout=b"progress-line\n",
                                                   stderr=b"to-stderr\n")
        with pytest.raises(RunnerError) as info:
            await pool.exec(["sh", "-c", "echo spinning; while :; do :; done"],
                            limits=runner.limits.replace(cpu_time_s=0.3),
                            capture_on_failure=True)
        assert info.value.reason is Reason.CPU_TIME
        assert info.value.output == CapturedOutput(stdout=b"spinning\n", stderr=b"")
        with pytest.raises(RunnerError) as info:
            await pool.exec(PROGRESS)
        assert info.value.output is None
