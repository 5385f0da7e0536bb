"""Each `Limits` field that bounds trunner's own processes as well as the
program's, at the smallest value it accepts: every way of running still
starts and answers as usual (a cold and a warm `exec`, one with files, a
built-in and a user mode, a pool, `open_process` on pipes and on a pty, a
session's command), and the bound holds for the program. `processes` 1
leaves an exec run no room for its program: refused before any spawn."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import msgspec
import msgspec.inspect as mi
import pytest
from test_stream import read_until

from conftest import child_pids
from support import run_code
from trunner import Limits, Reason, RunnerError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from trunner import Runner

#: The fields whose smallest value trunner's own processes live under too
#: (the times and the output caps bound the program only, tested elsewhere).
FIELDS = ("address_space_bytes", "processes", "open_files", "file_size_bytes",
          "scratch_bytes", "memory_bytes")


def smallest(field: str) -> int:
    """The field's lowest accepted value, from `Limits`' own constraints."""
    struct = mi.type_info(Limits)
    assert isinstance(struct, mi.StructType)
    (info,) = [f for f in struct.fields if f.name == field]
    kinds = info.type.types if isinstance(info.type, mi.UnionType) else (info.type,)
    (low,) = [t.ge for t in kinds if isinstance(t, mi.IntType)]
    assert low is not None
    Limits(**{field: low})
    with pytest.raises(msgspec.ValidationError):
        Limits(**{field: low - 1})
    return int(low)


def test_the_fields_are_the_ones_trunner_lives_under() -> None:
    assert {f: smallest(f) for f in FIELDS} == {
        "address_space_bytes": 64 << 20, "processes": 1, "open_files": 32,
        "file_size_bytes": 0, "scratch_bytes": 1 << 20, "memory_bytes": 32 << 20}


def _paths(runner: Runner, limits: Limits) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Each way of running `echo hi`'s like, and what it answers."""

    async def exec_() -> Any:
        return (await runner.exec(["/bin/echo", "hi"], limits=limits)).response.stdout

    async def files() -> Any:
        r = (await runner.exec(["/bin/cp", "a", "b"], files={"a": b"hi\n"}, collect=["b"],
                               limits=limits)).response
        return r.files[0].data if r.files else r.stderr

    async def builtin() -> Any:
        return (await runner.run("echo", b"hi\n", limits=limits)).response

    async def user_mode() -> Any:
        return (await run_code(runner, "result = b'hi\\n'", limits=limits))

    async def pool() -> Any:
        async with runner.pool("exec", size=1, limits=limits) as p:
            return (await p.exec(["/bin/echo", "hi"])).response.stdout

    async def warm() -> Any:
        async with runner.warm():
            return (await runner.exec(["/bin/echo", "hi"], limits=limits)).response.stdout

    async def stream() -> Any:
        async with runner.open_process(["/bin/cat"], limits=limits) as p:
            await p.stdin.send_all(b"hi\n")
            await p.stdin.aclose()
            return await read_until(p.stdout, b"")

    async def pty() -> Any:
        async with runner.open_process(["/bin/echo", "hi"], limits=limits, pty=True) as p:
            return (await read_until(p.stdout, b"")).replace(b"\r\n", b"\n")  # in pieces, maybe

    async def session() -> Any:
        async with runner.session(limits=limits) as s:
            return (await s.exec(["/bin/echo", "hi"])).response.stdout

    return {f.__name__.rstrip("_"): f for f in (exec_, files, builtin, user_mode, pool, warm,
                                                 stream, pty, session)}


@asynccontextmanager
async def _answers(runner: Runner, limits: Limits) -> AsyncIterator[dict[str, object]]:
    got: dict[str, object] = {}
    for name, path in _paths(runner, limits).items():
        try:
            got[name] = await path()
        except RunnerError as e:
            got[name] = e.reason
            print(name, e)
    yield got
    assert child_pids() == []


@pytest.mark.parametrize("field", FIELDS)
async def test_every_way_of_running_starts_at_a_fields_smallest_value(
        runner: Runner, field: str) -> None:
    limits = runner.limits.replace(**{field: smallest(field)})
    async with _answers(runner, limits) as got:
        if field == "processes":  # 1: the program's run has no room for it
            assert got == {**dict.fromkeys(got, Reason.BAD_REQUEST),
                           "builtin": b"hi\n", "user_mode": b"hi\n"}, got
        elif field == "file_size_bytes":  # 0: an input file is over it, refused
            assert got == {**dict.fromkeys(got, b"hi\n"), "files": Reason.BAD_REQUEST}, got
        else:
            assert got == dict.fromkeys(got, b"hi\n"), got


async def test_the_smallest_values_hold_for_the_program(runner: Runner) -> None:
    program = """import os
fds = []
while True:
    try:
        fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        print(max(fds), e.errno)
        break
for fd in fds:
    os.close(fd)
try:
    os.write(os.open("f", os.O_WRONLY | os.O_CREAT), b"x")
except OSError as e:
    print(e.errno)
print(os.stat("f").st_size)
"""
    limits = runner.limits.replace(open_files=smallest("open_files"),
                                   file_size_bytes=smallest("file_size_bytes"))
    r = (await runner.exec(["python3", "-c", program], limits=limits)).response
    assert (r.exit_code, r.stderr) == (0, b"")
    # Every descriptor below 32 was the program's to open, none above; not a
    # byte of a file.
    assert r.stdout.decode().split() == ["31", "24", "27", "0"]


async def test_an_exec_run_needs_two_processes(runner: Runner) -> None:
    limits = runner.limits.replace(processes=1)
    with pytest.raises(RunnerError) as info:
        await runner.exec(["/bin/true"], limits=limits)
    assert info.value.reason is Reason.BAD_REQUEST
    assert "processes=1" in str(info.value)
    with pytest.raises(RunnerError) as info:
        async with runner.session(limits=limits):
            pytest.fail("a session that no command can run in was opened")
    assert info.value.reason is Reason.BAD_REQUEST
    assert child_pids() == []
    # 2: the program runs, and cannot start another.
    two = (await runner.exec(["/bin/sh", "-c", "echo hi; /bin/true"],
                             limits=runner.limits.replace(processes=2))).response
    assert (two.exit_code, two.stdout, two.stderr) == (2, b"hi\n", b"/bin/sh: 1: Cannot fork\n")
