"""`Runner.open_process`: a jailed program's stdin, stdout and stderr as the
caller's trio streams, caps on what is streamed, a verdict only after a
clean end. Real jails, real pipes; no duration asserts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from conftest import child_pids
from support import scaled
from trunner import Reason, Runner, RunnerError, invocation
from trunner.backend import close_jail, open_jail
from trunner.kernel.abi import STREAM_FD
from trunner.spawn import COLD

if TYPE_CHECKING:
    from trunner.streaming import StreamingProcess

ROOT = Path(__file__).resolve().parent.parent

#: A program that asks for two numbers, one prompt at a time, and answers.
PROMPT = [sys.executable, "-c", (
    "import sys\n"
    "a = int(input('a? '))\n"
    "b = int(input('b? '))\n"
    "print(a + b, flush=True)\n"
    "sys.stderr.write('done\\n')\n"
)]


async def read_until(stream: trio.abc.ReceiveStream, end: bytes) -> bytes:
    """Read from `stream` until what was read ends with `end` (`b""`: until EOF)."""
    data = b""
    while not end or not data.endswith(end):
        chunk = await stream.receive_some()
        if not chunk:
            break
        data += chunk
    return data


async def test_a_streaming_program_answers_a_prompt(runner: Runner) -> None:
    async with runner.open_process(PROMPT) as p:
        assert await read_until(p.stdout, b"a? ") == b"a? "
        await p.stdin.send_all(b"2\n")
        assert await read_until(p.stdout, b"b? ") == b"b? "
        assert p.result is None
        await p.stdin.send_all(b"3\n")
        assert await read_until(p.stdout, b"\n") == b"5\n"
        assert await read_until(p.stderr, b"\n") == b"done\n"
        assert await p.stdout.receive_some() == b""
    assert p.result is not None
    response = p.result.response
    assert response.exit_code == 0
    assert response.signal is None
    # The verdict carries no output: what was streamed is not a result.
    assert (response.stdout, response.stderr) == (b"", b"")
    assert p.result.usage is not None
    assert p.result.usage.wall_s > 0
    # The plan names the streams (`stdio: stream`): a version of its own.
    assert p.result.rules_version == runner.backend.rules_version(runner.limits, stdio="stream")
    assert p.result.rules_version != runner.rules_version()


async def test_the_body_may_end_first_stdin_is_closed_and_the_rest_drained(
    runner: Runner,
) -> None:
    cat_then_talk = [sys.executable, "-c",
                     "import sys; data = sys.stdin.read(); print(len(data)); print('x' * 5000)"]
    async with runner.open_process(cat_then_talk) as p:
        await p.stdin.send_all(b"abc")
    assert p.result is not None
    assert p.result.response.exit_code == 0


async def test_a_nonzero_exit_is_a_result(runner: Runner) -> None:
    async with runner.open_process([sys.executable, "-c", "raise SystemExit(3)"]) as p:
        pass
    assert p.result is not None
    assert p.result.response.exit_code == 3


async def test_stdout_past_its_cap_while_streaming_raises_with_no_result(
    runner: Runner,
) -> None:
    limits = runner.limits.replace(stdout_max_bytes=1000)
    flood = [sys.executable, "-c",
             "import os, time\nos.write(1, b'o' * 1001)\ntime.sleep(1e9)"]
    got: list[bytes] = []
    process: list[StreamingProcess] = []

    async def talk() -> None:
        async with runner.open_process(flood, limits=limits) as p:
            process.append(p)
            while chunk := await p.stdout.receive_some():
                got.append(bytes(chunk))

    with pytest.raises(RunnerError) as info:
        await talk()
    assert info.value.reason is Reason.STDOUT_CAP
    assert len(b"".join(got)) <= 1000  # never a byte past the cap reaches the caller
    assert process[0].result is None
    assert child_pids() == []


async def test_stderr_past_its_cap_after_the_body_raises(runner: Runner) -> None:
    limits = runner.limits.replace(stderr_max_bytes=100)
    noisy = [sys.executable, "-c", "import os; os.write(2, b'e' * 101)"]
    with pytest.raises(RunnerError) as info:
        async with runner.open_process(noisy, limits=limits) as p:
            pass  # left unread: the parent drains it, still capped
    assert info.value.reason is Reason.STDERR_CAP
    assert "cap of 100 bytes" in info.value.detail
    assert p.result is None


@pytest.mark.slow
async def test_the_wall_deadline_while_streaming_raises_timeout(runner: Runner) -> None:
    limits = runner.limits.replace(wall_time_s=1.0, cpu_time_s=1.0)
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(1e9)"]
    process: list[StreamingProcess] = []

    async def talk() -> None:
        async with runner.open_process(sleeper, limits=limits) as p:
            process.append(p)
            assert await read_until(p.stdout, b"\n") == b"up\n"
            await trio.sleep_forever()  # the caller waits; the run's deadline ends it

    with trio.fail_after(scaled(30)), pytest.raises(RunnerError) as info:
        await talk()
    assert info.value.reason is Reason.TIMEOUT
    assert process[0].result is None
    assert child_pids() == []


async def test_cpu_time_while_streaming_raises_cpu_time(runner: Runner) -> None:
    limits = runner.limits.replace(cpu_time_s=0.5)
    spin = [sys.executable, "-c", "print('up', flush=True)\nwhile True: pass"]
    process: list[StreamingProcess] = []

    async def talk() -> None:
        async with runner.open_process(spin, limits=limits) as p:
            process.append(p)
            assert await read_until(p.stdout, b"\n") == b"up\n"
            assert await p.stdout.receive_some() == b""  # the adapter ended it

    with trio.fail_after(scaled(30)), pytest.raises(RunnerError) as info:
        await talk()
    assert info.value.reason is Reason.CPU_TIME
    assert process[0].result is None


async def test_the_callers_exception_leaves_as_itself_and_nothing_is_left(
    runner: Runner,
) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(1e9)"]
    with pytest.raises(KeyError):
        async with runner.open_process(sleeper) as p:
            raise KeyError("mine")
    assert p.result is None
    assert child_pids() == []


async def test_cancelling_the_caller_leaves_nothing(runner: Runner) -> None:
    sleeper = [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(1e9)"]
    with trio.move_on_after(scaled(30)) as scope:
        async with runner.open_process(sleeper) as p:
            assert await read_until(p.stdout, b"\n") == b"up\n"
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert p.result is None
    assert child_pids() == []


async def test_a_bad_request_spawns_nothing(runner: Runner) -> None:
    with pytest.raises(RunnerError) as info:
        async with runner.open_process([]):
            raise AssertionError("not reached")
    assert info.value.reason is Reason.BAD_REQUEST


#: Walks every descriptor the program can see, its own and every process's
#: it may list, and prints the (device, inode) of each it can open for
#: writing, or holds.
WALK_FDS = [sys.executable, "-c", """
import os
seen = set()
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    try:
        names = os.listdir(f'/proc/{pid}/fd')
    except OSError:
        continue
    for name in names:
        path = f'/proc/{pid}/fd/{name}'
        try:
            st = os.stat(path)
        except OSError:
            continue
        held = pid == str(os.getpid())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            writable = True
        except OSError:
            writable = False
        if held or writable:
            seen.add(f'{st.st_dev}:{st.st_ino}')
own = [os.fstat(fd) for fd in (0, 1, 2)]
print(' '.join(f'{st.st_dev}:{st.st_ino}' for st in own))
print(' '.join(sorted(seen)))
"""]


def parent_pipes() -> set[bytes]:
    """(device, inode) of every pipe this process holds."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if (st.st_mode & 0o170000) == 0o010000:
            out.add(f"{st.st_dev}:{st.st_ino}".encode())
    return out


async def test_the_program_cannot_reach_the_reply_pipe(runner: Runner) -> None:
    """From inside: no descriptor the program holds, or can open for
    writing through /proc, is the adapter's reply pipe."""
    before = parent_pipes()
    async with runner.open_process(WALK_FDS) as p:
        # The run's pipes: the program's three, the reply's, the report's.
        run_pipes = parent_pipes() - before
        first, second = (await read_until(p.stdout, b"")).split(b"\n")[:2]
        own, seen = set(first.split()), set(second.split())
    assert p.result is not None
    assert p.result.response.exit_code == 0
    assert len(own) == 3
    assert own <= run_pipes  # the program's stdio are the parent's own pipes
    assert own <= seen  # the walk works
    theirs = run_pipes - own  # the adapter's reply pipe and the helper's report pipe
    assert len(theirs) == 2
    assert not theirs & seen


#: On a pty: whether each stdio is a tty, its window size once the caller
#: has set it, and whether TIOCSTI (typing into the terminal) is allowed.
PTY_PROBE = [sys.executable, "-c", """
import fcntl, os, sys, termios
print('tty', os.isatty(0), os.isatty(1), os.isatty(2), flush=True)
line = sys.stdin.readline()
size = os.get_terminal_size(0)
print('size', size.lines, size.columns, flush=True)
try:
    fcntl.ioctl(0, termios.TIOCSTI, b'x')
    print('tiocsti allowed', flush=True)
except OSError as e:
    print('tiocsti', e.errno, flush=True)
os.write(2, b'err\\n')
fd = os.open('/dev/tty', os.O_RDWR)
print('ctty', os.isatty(fd), flush=True)
"""]


async def test_a_pty_is_a_tty_takes_a_window_size_and_refuses_tiocsti(runner: Runner) -> None:
    async with runner.open_process(PTY_PROBE, pty=True) as p:
        assert p.is_pty
        assert await read_until(p.stdout, b"\n") == b"tty True True True\r\n"
        p.set_window_size(rows=33, columns=101)
        await p.stdin.send_all(b"go\n")
        rest = await read_until(p.stdout, b"")
    assert b"size 33 101\r\n" in rest
    assert b"tiocsti 1\r\n" in rest  # EPERM: seccomp denies it, as in any run
    assert b"tiocsti allowed" not in rest
    assert b"err\r\n" in rest  # stderr is on the same stream
    assert b"ctty True\r\n" in rest  # its controlling terminal
    assert p.result is not None
    assert p.result.response.exit_code == 0
    assert p.result.rules_version == runner.backend.rules_version(runner.limits, stdio="pty")


async def test_a_pty_past_the_stdout_cap_raises_with_no_result(runner: Runner) -> None:
    limits = runner.limits.replace(stdout_max_bytes=1000)
    flood = [sys.executable, "-c", "import os, time\nos.write(2, b'e' * 1001)\ntime.sleep(1e9)"]
    process: list[StreamingProcess] = []

    async def talk() -> None:
        async with runner.open_process(flood, limits=limits, pty=True) as p:
            process.append(p)
            while await p.stdout.receive_some():
                pass

    with pytest.raises(RunnerError) as info:
        await talk()
    assert info.value.reason is Reason.STDOUT_CAP
    assert process[0].result is None
    assert child_pids() == []


async def test_the_window_size_needs_a_pty(runner: Runner) -> None:
    async with runner.open_process([sys.executable, "-c", "pass"]) as p:
        assert not p.is_pty
        with pytest.raises(ValueError, match="pty=True"):
            p.set_window_size(rows=1, columns=1)


# -- through the pool: the fork server starts the jail, in one of its slots ----


async def test_through_the_pool_a_program_answers_a_prompt(runner: Runner) -> None:
    async with runner.pool("exec", size=1) as pool:
        await pool.exec([sys.executable, "-c", "pass"])  # a prewarmed worker served
        async with pool.open_process(PROMPT) as p:
            assert await read_until(p.stdout, b"a? ") == b"a? "
            await p.stdin.send_all(b"20\n")
            assert await read_until(p.stdout, b"b? ") == b"b? "
            await p.stdin.send_all(b"22\n")
            assert await read_until(p.stdout, b"\n") == b"42\n"
        assert p.result is not None
        assert p.result.response.exit_code == 0
        assert p.result.rules_version == runner.backend.rules_version(runner.limits,
                                                                      stdio="stream")
        # The pool goes on serving as before.
        assert (await pool.exec([sys.executable, "-c", "print(1)"])).response.stdout == b"1\n"
    assert child_pids() == []


async def test_through_the_pool_a_breach_raises_with_no_result(runner: Runner) -> None:
    limits = runner.limits.replace(stderr_max_bytes=10)
    noisy = [sys.executable, "-c", "import os, time\nos.write(2, b'e' * 11)\ntime.sleep(1e9)"]
    process: list[StreamingProcess] = []

    async def talk() -> None:
        async with runner.pool("exec", size=1) as pool, pool.open_process(
                noisy, limits=limits) as p:
            process.append(p)
            while await p.stderr.receive_some():
                pass

    with pytest.raises(RunnerError) as info:
        await talk()
    assert info.value.reason is Reason.STDERR_CAP
    assert process[0].result is None
    assert child_pids() == []


async def test_through_the_pool_a_pty_takes_a_window_size(runner: Runner) -> None:
    async with runner.pool("exec", size=1) as pool:
        async with pool.open_process(PTY_PROBE, pty=True) as p:
            assert await read_until(p.stdout, b"\n") == b"tty True True True\r\n"
            p.set_window_size(rows=7, columns=9)
            await p.stdin.send_all(b"go\n")
            rest = await read_until(p.stdout, b"")
        assert b"size 7 9\r\n" in rest
        assert b"ctty True\r\n" in rest
        assert p.result is not None
        assert p.result.response.exit_code == 0


def test_the_docs_block_runs(tmp_path: Path) -> None:
    """docs/streaming.md, "A pty": its block, run as written."""
    text = (ROOT / "docs" / "streaming.md").read_text()
    section = text.split("\n## A pty\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```python\n(.*?)^```$", section, re.M | re.S)
    assert block is not None
    (tmp_path / "pty.py").write_text(block.group(1))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "pty.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[b'24 100', b'tty'] 0\n"


@pytest.mark.parametrize(("planned", "handed", "why"), [
    ("pipes", "stream", "descriptors: stdio 'pipes' but a stream descriptor"),
    ("stream", "pipes", "descriptors: stdio 'stream' but no stream descriptor"),
    ("pty", "stream", f"descriptors: fd {STREAM_FD} is not the runner's socket"),
    ("stream", "pty", f"descriptors: fd {STREAM_FD} is not the runner's pipe"),
])
async def test_the_helper_takes_exactly_the_descriptors_its_plan_names(
    runner: Runner, planned: str, handed: str, why: str,
) -> None:
    """The plan's `stdio` decides what may enter: a descriptor it does not
    name, or one of another kind, refuses the run before any program."""
    limits = runner.limits
    jail = await open_jail(runner.backend, runner.backend.adapter_argv("exec", builtin=True),
                           limits, runner.temp_root, "", planned)
    try:
        child = await COLD.spawn(jail, stdio=handed)
    except BaseException:
        await close_jail(jail)
        raise
    outcome = await invocation.serve(invocation.Started(jail, child), b"",
                                     invocation.Caps.of(limits))
    with pytest.raises(RunnerError) as info:
        invocation.judge(outcome, jail, limits.stdout_max_bytes)
    assert info.value.reason is Reason.SANDBOX_SETUP
    assert why in info.value.detail


@pytest.mark.parametrize("pty", [False, True], ids=["pipes", "pty"])
async def test_a_program_not_found_ends_127_with_its_line_on_its_stderr(
    runner: Runner, pty: bool,
) -> None:
    async with runner.open_process(["no-such-program"], pty=pty) as p:
        said = await read_until(p.stdout if pty else p.stderr, b"")
    assert said.replace(b"\r\n", b"\n") == b"trunner: no-such-program: not found\n"
    assert p.result is not None
    assert p.result.response.exit_code == 127


async def test_files_are_placed_before_the_program_starts(runner: Runner) -> None:
    async with runner.open_process(["cat", "in.txt"], files={"in.txt": b"placed\n"}) as p:
        assert await read_until(p.stdout, b"") == b"placed\n"
    assert p.result is not None
    assert p.result.response.exit_code == 0
