"""Issue 20's API without traps: exec errors as a shell's, `env=`, checks
before spawning, collected files' modes, errors out of `async with` as
themselves. Every run is a real jailed child."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import pytest
import trio

from conftest import child_pids, make_runner
from support import scaled, wait_until
from trunner import ExecFile, Reason, Runner, RunnerError
from trunner.protocol import EXEC_ENV_MAX_BYTES, EXEC_INPUT_MAX_BYTES

if TYPE_CHECKING:
    from pathlib import Path

PY = sys.executable


# -- exec errors like a shell's ------------------------------------------------------


async def test_a_program_not_found_ends_127_with_one_line(runner: Runner) -> None:
    for name in ("no-such-program", "./no-such-file", "/no/such/dir/prog"):
        done = (await runner.exec([name])).response
        assert (done.exit_code, done.signal, done.stdout) == (127, None, b"")
        assert done.stderr == f"trunner: {name}: not found\n".encode()
        # An ordinary result: it carries usage, of a program that never ran.
        assert done.usage is not None
        assert done.usage.cpu_s < scaled(0.1), done.usage


@pytest.mark.parametrize(("files", "argv"), [
    pytest.param({"data.txt": b"not a program"}, ["./data.txt"], id="not-executable"),
    pytest.param({"junk": ExecFile(data=b"\x00\x01junk", executable=True)}, ["./junk"],
                 id="ENOEXEC"),
    pytest.param({"dir/f": b""}, ["./dir"], id="a-directory"),
])
async def test_a_program_that_cannot_be_executed_ends_126(
    runner: Runner, files: dict[str, bytes | ExecFile], argv: list[str]
) -> None:
    done = (await runner.exec(argv, files=files)).response
    assert (done.exit_code, done.stdout) == (126, b"")
    assert done.stderr.startswith(f"trunner: {argv[0]}: cannot execute: ".encode())
    assert done.stderr.count(b"\n") == 1
    assert done.usage is not None


@pytest.mark.parametrize(("kwargs", "words"), [
    pytest.param({"argv": []}, "argv is empty", id="empty-argv"),
    pytest.param({"argv": "ls"}, "not a str", id="str-argv"),
    pytest.param({"argv": ["ls", b"-l"]}, "argv[1] is a bytes", id="bytes-item"),
    pytest.param({"argv": ["ls", 3]}, "argv[1] is a int", id="int-item"),
    pytest.param({"argv": ["ls\0"]}, "NUL", id="nul-in-argv"),
    pytest.param({"stdin": "text"}, "stdin must be bytes", id="str-stdin"),
    pytest.param({"files": [("a", b"")]}, "files must be a mapping", id="list-files"),
    pytest.param({"files": []}, "files must be a mapping", id="empty-list-files"),
    pytest.param({"env": {"1X": "a"}}, "env name", id="env-digit-first"),
    pytest.param({"env": {"A=B": "a"}}, "env name", id="env-equals"),
    pytest.param({"env": {"A": "a\0b"}}, "NUL", id="env-nul"),
    pytest.param({"env": {"A": 1}}, "not a str", id="env-int-value"),
    pytest.param({"env": [("A", "b")]}, "env must be a mapping", id="env-list"),
    pytest.param({"env": {"A": "x" * EXEC_ENV_MAX_BYTES}}, "over the bound", id="env-size"),
    pytest.param({"stdin": b"x" * (EXEC_INPUT_MAX_BYTES + 1)}, "over the bound",
                 id="stdin-alone-over-the-bound"),
])
async def test_bad_requests_are_refused_before_spawning(
    runner: Runner, kwargs: dict[str, object], words: str
) -> None:
    call: dict[str, object] = {"argv": ["true"], **kwargs}
    argv = call.pop("argv")
    with pytest.raises(RunnerError) as info:
        await runner.exec(argv, **call)  # type: ignore[arg-type]
    assert info.value.reason is Reason.BAD_REQUEST
    assert words in info.value.detail
    async with runner.pool("exec", size=1) as pool:
        await wait_until(lambda: pool.idle_workers == 1, 60, "1 idle worker")
        with pytest.raises(RunnerError) as info:
            await pool.exec(argv, **call)  # type: ignore[arg-type]
        assert info.value.reason is Reason.BAD_REQUEST
        assert pool.idle_workers == 1  # nothing was spent on it


async def test_stdin_at_the_bound_passes_without_files(runner: Runner) -> None:
    limits = runner.limits.replace(wall_time_s=60.0)
    code = "import sys; print(len(sys.stdin.buffer.read()))"
    done = (await runner.exec([PY, "-c", code], stdin=b"x" * EXEC_INPUT_MAX_BYTES,
                              limits=limits)).response
    assert done.stdout == f"{EXEC_INPUT_MAX_BYTES}\n".encode()


# -- env= ---------------------------------------------------------------------------


async def test_env_reaches_the_program_over_the_jails_own(runner: Runner) -> None:
    env = {"PYTHONHASHSEED": "0", "LANG": "C", "HOME": "/tmp", "TMPDIR": "/tmp",
           "OMP_NUM_THREADS": "1", "MY_TEST_VAR": "a b=c", "EMPTY": ""}
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    done = (await runner.exec([PY, "-c", code], env=env)).response
    import json

    seen = json.loads(done.stdout)
    assert {k: seen[k] for k in env} == env
    assert seen["PATH"]  # the jail's, kept where not given
    plain = json.loads((await runner.exec([PY, "-c", code])).response.stdout)
    assert "MY_TEST_VAR" not in plain
    assert plain["HOME"] != "/tmp"


async def test_a_path_given_is_searched_for_the_program(runner: Runner) -> None:
    from trunner.linux.plan import WORKDIR

    # The working dir's path inside the jail is fixed (HOME): its bin is on PATH.
    done = (await runner.exec(["prog"], files={
        "bin/prog": ExecFile(data=b"#!/bin/sh\necho found\n", executable=True)},
        env={"PATH": f"{WORKDIR}/bin"})).response
    assert (done.exit_code, done.stdout) == (0, b"found\n")
    done = (await runner.exec(["sh", "-c", "true"], env={"PATH": "/nowhere"})).response
    assert done.exit_code == 127


async def test_env_applies_to_the_program_not_the_adapter(runner: Runner) -> None:
    # PYTHONPATH pointing at a module that would break the adapter: only the
    # program sees it (the adapter started long before; it imports nothing after).
    done = (await runner.exec(
        [PY, "-c", "import os; print(os.environ['PYTHONPATH'])"],
        env={"PYTHONPATH": "/home/trunner/evil", "LD_PRELOAD": "/nonexistent.so"})).response
    assert done.exit_code == 0
    assert done.stdout == b"/home/trunner/evil\n"


async def test_env_is_not_in_the_rules_version(runner: Runner) -> None:
    first = await runner.exec(["true"], env={"A": "1"})
    second = await runner.exec(["true"])
    assert first.rules_version == second.rules_version == runner.rules_version()


# -- collected files keep their mode ------------------------------------------------


async def test_collected_files_carry_their_permission_bits(runner: Runner) -> None:
    script = ("umask 0; echo a > plain; chmod 600 plain; echo b > tool; chmod 755 tool;"
              " echo c > ro; chmod 444 ro")
    done = (await runner.exec(["/bin/sh", "-c", script], collect=["*"])).response
    modes = {f.path: f.mode for f in done.files}
    assert modes == {"plain": 0o600, "tool": 0o755, "ro": 0o444}


# -- errors leave `async with` as themselves ----------------------------------------


async def test_a_runner_error_in_a_pool_body_leaves_as_itself(runner: Runner) -> None:
    with pytest.raises(RunnerError) as info:
        async with runner.pool("exec", size=1) as pool:
            await pool.exec(["true"], stdin="not bytes")  # type: ignore[arg-type]
    assert type(info.value) is RunnerError
    assert info.value.reason is Reason.BAD_REQUEST
    caught = None
    try:
        async with runner.pool("echo", size=1) as pool:
            await pool.run(1)
            raise RunnerError(Reason.TIMEOUT, "the caller's own")
    except RunnerError as e:
        caught = e
    assert caught is not None
    assert caught.reason is Reason.TIMEOUT
    assert child_pids() == []


async def test_a_value_error_in_a_pool_body_leaves_as_itself(runner: Runner) -> None:
    with pytest.raises(ValueError, match="mine") as info:
        async with runner.pool("echo", size=1):
            raise ValueError("mine")
    assert type(info.value) is ValueError
    assert child_pids() == []


async def test_a_cancelled_pool_body_is_plain_cancellation(runner: Runner) -> None:
    with trio.move_on_after(0.5) as scope:
        async with runner.pool("echo", size=1):
            await trio.sleep(30)
    assert scope.cancelled_caught


async def test_a_refill_that_cannot_spawn_fails_the_pool_with_its_reason(
    tmp_path: Path,
) -> None:
    root = tmp_path / "pool-root"
    root.mkdir()
    pooled = make_runner(temp_root=str(root))
    began = trio.current_time()

    async def body() -> None:
        async with pooled.pool("echo", size=1, idle_s=0.5) as pool:
            await wait_until(lambda: pool.idle_workers == 0, 30, "the idle worker ended")
            await wait_until(lambda: not os.listdir(root), 30, "its jail dir gone")
            root.rmdir()
            root.write_bytes(b"")  # no jail dir can be made under a file
            with pytest.raises(RunnerError) as own:  # this run's own spawn
                await pool.run(1)
            assert own.value.reason is Reason.SPAWN_FAILED
            await trio.sleep(scaled(30))  # the refill it woke fails: the body is cancelled

    with pytest.raises(RunnerError) as info:
        await body()
    assert type(info.value) is RunnerError
    assert info.value.reason is Reason.SPAWN_FAILED
    assert trio.current_time() - began < scaled(30)
    root.unlink()
    assert child_pids() == []


async def test_a_pool_that_cannot_fill_fails_on_entry(tmp_path: Path) -> None:
    root = tmp_path / "pool-root"
    root.mkdir()
    pooled = make_runner(temp_root=str(root))
    root.rmdir()
    root.write_bytes(b"")
    entered = False
    with pytest.raises(RunnerError) as info:
        async with pooled.pool("echo", size=1):
            entered = True
    assert not entered
    assert info.value.reason is Reason.SPAWN_FAILED


TRUNNER = os.path.join(os.path.dirname(sys.executable), "trunner")


def cli(*args: str) -> tuple[int, dict[str, object]]:
    import json
    import subprocess

    out = subprocess.run([TRUNNER, *args], capture_output=True, timeout=scaled(300))
    return out.returncode, json.loads(out.stdout)


def test_the_readme_round_trip_from_the_cli(tmp_path: Path) -> None:
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("no cc on this host: the jail binds the host's compiler")
    src = tmp_path / "main.c"
    src.write_bytes(b'#include <stdio.h>\nint main(void) { puts("built"); return 3; }\n')
    out_dir = tmp_path / "out"
    code, out = cli("exec", "--file", f"main.c={src}", "--collect", "prog",
                    "--out", str(out_dir), "--", "cc", "-o", "prog", "main.c")
    assert (code, out["exit_code"]) == (0, 0), out
    files: Any = out["files"]
    [listed] = files
    assert listed["path"] == "prog"
    assert listed["mode"] & 0o111  # the linker's exec bit, kept
    prog = out_dir / "prog"
    assert os.stat(prog).st_mode & 0o777 == listed["mode"] & 0o777
    code, out = cli("exec", "--file", f"prog={prog}", "--text", "--", "./prog")
    assert code == 0, out
    assert (out["exit_code"], out["stdout"]) == (3, "built\n")


def test_out_restores_modes_without_following_links(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    victim.chmod(0o600)
    (out_dir / "tool").symlink_to(victim)
    code, out = cli("exec", "--collect", "tool", "--out", str(out_dir), "--", "/bin/sh", "-c",
                    "echo x > tool; chmod 4755 tool")
    assert code != 0
    assert "tool" in str(out["detail"])
    assert victim.read_bytes() == b"keep"
    assert victim.stat().st_mode & 0o7777 == 0o600
    (out_dir / "tool").unlink()
    code, out = cli("exec", "--collect", "tool", "--out", str(out_dir), "--", "/bin/sh", "-c",
                    "echo x > tool; chmod 4755 tool")
    assert code == 0, out
    assert (out_dir / "tool").stat().st_mode & 0o7777 == 0o755  # setuid never restored


# -- a user mode's stdout is the user's ---------------------------------------------


async def test_a_user_modes_prints_go_to_stderr_not_the_frame(runner: Runner) -> None:
    result = await runner.run("children:chatty", 10_000)
    assert result.response == {"ok": 1}
    async with runner.pool("children:chatty", size=1) as pool:
        assert (await pool.run(10_000)).response == {"ok": 1}


async def test_a_user_modes_prints_count_against_the_stderr_cap(runner: Runner) -> None:
    limits = runner.limits.replace(stderr_max_bytes=5_000)
    with pytest.raises(RunnerError) as info:
        await runner.run("children:chatty", 10_000, limits=limits)
    assert info.value.reason is Reason.STDERR_CAP


# -- checks before spawning: a mode's attribute, found without importing ------------


@pytest.fixture
def mode_tree(tmp_path: Path) -> Path:
    """A package whose import would leave a mark: no check may import it."""
    pkg = tmp_path / "modes" / "marked"
    (pkg / "sub").mkdir(parents=True)
    mark = tmp_path / "imported"
    (pkg / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    (pkg / "sub" / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    (pkg / "sub" / "m.py").write_text(
        "import json\nfrom os import path as p\nif True:\n    def fn(req): return req\n"
        "try:\n    class K: pass\nexcept Exception:\n    pass\nDATA = 3\nNAME = 'x'\n"
        "alias = fn\n")
    (pkg / "lazy.py").write_text("def __getattr__(name): return lambda req: name\n")
    return tmp_path


@pytest.mark.parametrize(("mode", "ok"), [
    ("marked.sub.m:fn", True), ("marked.sub.m:K", True), ("marked.sub.m:json", True),
    ("marked.sub.m:p", True), ("marked.sub.m:alias", True), ("marked.lazy:anything", True),
    ("marked.sub.m:missing", False), ("marked.sub.m:DATA", False), ("marked.sub.m:NAME", False),
    ("marked.nope:fn", False), ("marked.sub.m.deeper:fn", False), ("nomodule_xyz:fn", False),
])
def test_a_spec_is_checked_without_importing(mode_tree: Path, mode: str, ok: bool) -> None:
    runner = make_runner(import_paths=[str(mode_tree / "modes")], temp_root=str(mode_tree))
    if ok:
        assert runner.resolve_mode(mode) == mode
    else:
        with pytest.raises(RunnerError) as info:
            runner.resolve_mode(mode)
        assert info.value.reason is Reason.UNKNOWN_MODE
    assert not (mode_tree / "imported").exists()
    assert "marked" not in sys.modules


async def test_a_missing_attribute_is_unknown_mode_before_spawning(runner: Runner) -> None:
    with pytest.raises(RunnerError) as info:
        await runner.run("children:no_such_function", 1)
    assert info.value.reason is Reason.UNKNOWN_MODE
    with pytest.raises(RunnerError) as info:
        runner.pool("children:no_such_function")
    assert info.value.reason is Reason.UNKNOWN_MODE
