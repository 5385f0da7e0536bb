"""The `files` mode: entries written and read back exactly, trees through
export and import, unsafe archives and symlinked paths refused with nothing
written anywhere, reads held to their budget. Real jails, but for the
request checks and the codec, which are pure."""

from __future__ import annotations

import io
import os
import tarfile
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from conftest import landlock_abi_in_force
from support import scaled
from trunner import (
    Export,
    FileEntry,
    FilesRequest,
    FilesResult,
    Import,
    Limits,
    ReadFiles,
    Reason,
    RunnerError,
    WriteFiles,
    files,
)
from trunner.protocol import (
    EXEC_INPUT_MAX_BYTES,
    FILES_DEFAULT_BUDGET_BYTES,
    FILES_MAX_OPS,
    FilesOp,
    encode_frame,
    files_headroom_bytes,
)
from trunner.worker import files_mode, wire

if TYPE_CHECKING:
    from pathlib import Path

    from trunner import Result, Runner

KiB, MiB = 1024, 1024 * 1024


def file(path: str, data: bytes, mode: int = 0o644, mtime_ns: int = 1_600_000_000_000_000_000,
         ) -> FileEntry:
    return FileEntry(path=path, type="file", mode=mode, mtime_ns=mtime_ns, data=data)


def symlink(path: str, target: str, mtime_ns: int = 1_600_000_000_000_000_000) -> FileEntry:
    return FileEntry(path=path, type="symlink", mode=0o777, mtime_ns=mtime_ns, target=target)


def directory(path: str, mode: int = 0o755, mtime_ns: int = 1_600_000_000_000_000_000,
              ) -> FileEntry:
    return FileEntry(path=path, type="dir", mode=mode, mtime_ns=mtime_ns)


def tar_of(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes | None = None,
           mode: int = 0o644, mtime_ns: int = 1_600_000_000_000_000_000,
           linkname: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, linkname
    info.mtime = mtime_ns // 10**9
    info.pax_headers = {"mtime": f"{mtime_ns // 10**9}.{mtime_ns % 10**9:09d}"}
    if data is not None:
        info.size = len(data)
    return info, data


async def run_files(runner: Runner, ops: list[FilesOp], *, limits: Limits | None = None,
                    budget_bytes: int | None = None) -> Result[FilesResult]:
    """`ops` in a fresh jail as a session's `files` runs them: the checked
    request, `Runner.run("files", ...)`, the reply checked."""
    limits = runner.limits if limits is None else limits
    req = files.request(ops, limits, budget_bytes=budget_bytes)
    result = await runner.run("files", req, limits=limits, response_type=FilesResult)
    files.check_reply(req, result.response, usage=result.usage)
    return result


async def raw(runner: Runner, req: FilesRequest, limits: Limits | None = None) -> FilesResult:
    """The reply as the worker wrote it, before `check_reply`."""
    result = await runner.run("files", req, limits=limits, response_type=FilesResult)
    return result.response


async def in_jail_then_list(runner: Runner, req: FilesRequest) -> tuple[FilesResult, list[str]]:
    """`req`'s ops run in a jail by the files mode's own code; the reply, and
    what the working dir holds after, once shown that nothing else of the
    run's scratch (/tmp, /dev/shm) or the dir above the working dir changed."""
    result = await runner.run("children:files_then_list", req)
    out = result.response
    before, after, cwd = out["before"], out["after"], out["cwd"]
    assert before[cwd] == []
    for place in ("/tmp", "/dev/shm", "above"):
        assert after[place] == before[place], place
    assert after["above"] == [os.path.basename(cwd)]
    return msgspec.convert(out["reply"], FilesResult), after[cwd]


# -- written, read back ---------------------------------------------------------------

WRITTEN = [
    directory("work", 0o755, 1_700_000_000_000_000_001),
    file("work/a.txt", b"alpha\n", 0o640, 1_600_000_000_123_456_789),
    file("work/bin/run", b"#!/bin/sh\necho hi\n", 0o755, 1_600_000_001_000_000_002),
    file("work/old", b"\x00\xff" * 100, 0o600, -1_500_000_001),  # before 1970
    symlink("work/link", "a.txt", 1_650_000_000_000_000_007),
    symlink("work/dangling", "/nonexistent/x", 1_650_000_000_000_000_008),
    directory("work/empty", 0o750, 1_500_000_000_999_999_999),
    directory("work/ro", 0o555, 1_400_000_000_000_000_003),  # set after its contents
    file("work/ro/inside", b"in a read-only dir", 0o444, 1_300_000_000_000_000_004),
]


async def test_written_entries_read_back_exactly(runner: Runner) -> None:
    result = await run_files(runner, [WriteFiles(entries=WRITTEN), ReadFiles(
        patterns=["work/**"])])
    count, entries = result.response.results
    assert count == len(WRITTEN)
    assert isinstance(entries, list)
    by_path = {e.path: e for e in entries}
    # The one path not written: the parent made for work/bin/run.
    made = by_path.pop("work/bin")
    assert (made.type, made.mode, made.data, made.target) == ("dir", 0o755, b"", "")
    assert list(by_path.values()) == sorted(WRITTEN, key=lambda e: e.path)
    assert result.response.error is None


async def test_patterns_match_files_symlinks_and_dirs_never_through_a_link(
        runner: Runner) -> None:
    result = await run_files(runner, [
        WriteFiles(entries=[file("a/x.py", b"1"), file("a/b/y.py", b"2"), directory("a/c"),
                            symlink("a/up", ".."), file("z.txt", b"3")]),
        ReadFiles(patterns=["**/*.py", "a/*"]),
        ReadFiles(patterns=["a/up/**", "nothing/**"]),
    ])
    _, matched, through_link = result.response.results
    assert isinstance(matched, list)
    assert [(e.path, e.type) for e in matched] == [
        ("a/b", "dir"), ("a/b/y.py", "file"), ("a/c", "dir"), ("a/up", "symlink"),
        ("a/x.py", "file")]
    # `a/up/**` matches the link itself (no more dirs) and nothing through it.
    assert isinstance(through_link, list)
    assert [(e.path, e.type, e.target) for e in through_link] == [("a/up", "symlink", "..")]


# -- export and import ----------------------------------------------------------------

N_FILES = 1100  # more than EXEC_INPUT_MAX_FILES (1024)


def _tree() -> list[tuple[tarfile.TarInfo, bytes | None]]:
    members = []
    for i in range(10):
        members.append(member(f"d{i}", tarfile.DIRTYPE, mode=0o750 + i % 2 * 5,
                              mtime_ns=1_500_000_000_000_000_000 + i))
        for j in range(N_FILES // 10):
            mode = (0o644, 0o600, 0o755)[j % 3]
            members.append(member(f"d{i}/f{j:03d}", data=f"{i}/{j}\n".encode() * (j % 7),
                                  mode=mode, mtime_ns=1_600_000_000_000_000_000 + i * 1000 + j))
    members += [
        member("empty", tarfile.DIRTYPE, mode=0o700, mtime_ns=1_400_000_000_000_000_001),
        member("ro", tarfile.DIRTYPE, mode=0o555, mtime_ns=1_400_000_000_000_000_002),
        member("ro/kept", data=b"under a read-only dir", mode=0o444),
        member("link", tarfile.SYMTYPE, linkname="d0/f000", mode=0o777,
               mtime_ns=1_450_000_000_000_000_003),
        member("abs", tarfile.SYMTYPE, linkname="/usr/bin/env", mode=0o777),
        member("twin", tarfile.LNKTYPE, linkname="d0/f001", mode=0o600),
    ]
    return members


def _view(tar: bytes) -> dict[str, tuple[str, int, int, bytes, str]]:
    """name -> (type, mode, mtime_ns, data, target), a hard link as the file
    it names (which way round a pair is archived does not matter)."""
    out: dict[str, tuple[str, int, int, bytes, str]] = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        for m in t.getmembers():
            whole, _, frac = m.pax_headers.get("mtime", str(int(m.mtime))).partition(".")
            mtime_ns = int(whole) * 10**9 + int(frac.ljust(9, "0"))
            if m.islnk():
                out[m.name] = ("link", 0, 0, b"", m.linkname)
                continue
            data = t.extractfile(m).read() if m.isreg() else b""  # type: ignore[union-attr]
            kind = "file" if m.isreg() else "dir" if m.isdir() else "symlink"
            out[m.name] = (kind, m.mode, mtime_ns, data, m.linkname)
    for name, (kind, _, _, _, target) in list(out.items()):
        if kind == "link":
            out[name] = out[target]
    return out


async def test_more_than_1024_files_round_trip_through_import_and_export(
        runner: Runner) -> None:
    tree = _tree()
    sent = tar_of(tree)
    limits = Limits(wall_time_s=scaled(60), stdout_max_bytes=16 * MiB)
    result = await run_files(runner, [Import(path="dst", tar=sent), ReadFiles(
        patterns=["dst/**"]), Export(path="dst")], limits=limits)
    count, entries, back = result.response.results
    assert count == len(tree) > N_FILES
    # What was imported, read back as entries.
    assert isinstance(entries, list)
    expected = _view(sent)
    got = {e.path.removeprefix("dst/"): (e.type, e.mode, e.mtime_ns, e.data, e.target)
           for e in entries if e.path != "dst"}
    assert got == expected
    # And exported again: the same tree, the pair still one inode.
    assert isinstance(back, bytes)
    assert _view(back) == expected
    with tarfile.open(fileobj=io.BytesIO(back)) as t:
        assert t.getmembers()[0].name == "abs"  # relative names, sorted, dirs first
        links = [(m.name, m.linkname) for m in t.getmembers() if m.islnk()]
        assert len(t.getmembers()) == len(tree)
    if landlock_abi_in_force() < 2:  # no link across directories: a copy (docs/api.md)
        assert links == []
    else:
        assert links in ([("d0/f001", "twin")], [("twin", "d0/f001")])


async def test_a_hard_link_is_never_written_through(runner: Runner) -> None:
    sent = tar_of([member("orig", data=b"old"), member("twin", tarfile.LNKTYPE,
                                                       linkname="orig")])
    result = await run_files(runner, [Import(path=".", tar=sent),
                                      WriteFiles(entries=[file("twin", b"new")]),
                                      ReadFiles(patterns=["*"])])
    entries = result.response.results[2]
    assert isinstance(entries, list)
    assert [(e.path, e.data) for e in entries] == [("orig", b"old"), ("twin", b"new")]


# -- refused, and nothing written ------------------------------------------------------

UNSAFE = {
    "dotdot": [member("ok.txt", data=b"1"), member("../x", data=b"escaped")],
    "dotdot-deep": [member("ok.txt", data=b"1"), member("a/../../x", data=b"escaped")],
    "absolute": [member("ok.txt", data=b"1"), member("/tmp/abs", data=b"escaped")],
    "device": [member("ok.txt", data=b"1"), member("null", tarfile.CHRTYPE)],
    "fifo": [member("ok.txt", data=b"1"), member("pipe", tarfile.FIFOTYPE)],
    "symlink-then-write": [member("ok.txt", data=b"1"),
                           member("esc", tarfile.SYMTYPE, linkname="/tmp"),
                           member("esc/pwned", data=b"escaped")],
    "symlink-inside-then-write": [member("d", tarfile.DIRTYPE),
                                  member("in", tarfile.SYMTYPE, linkname="d"),
                                  member("in/through", data=b"written through")],
    "hard-link-out": [member("ok.txt", data=b"1"),
                      member("pw", tarfile.LNKTYPE, linkname="/etc/passwd")],
    "hard-link-absolute": [member("ok.txt", data=b"1"),
                           member("pw", tarfile.LNKTYPE, linkname="/ok.txt")],
    "hard-link-dotdot": [member("ok.txt", data=b"1"),
                         member("pw", tarfile.LNKTYPE, linkname="../ok.txt")],
}


@pytest.mark.parametrize("name", list(UNSAFE))
async def test_an_unsafe_archive_is_refused_and_nothing_is_written(
        runner: Runner, name: str) -> None:
    req = files.request([Import(path=".", tar=tar_of(UNSAFE[name]))], runner.limits)
    reply, cwd = await in_jail_then_list(runner, req)
    assert reply.results == []
    assert reply.error is not None
    assert (reply.error.op, reply.error.kind) == (0, "refused")
    # Every member is checked before the first is written: not even ok.txt.
    assert cwd == []
    # The built-in mode itself, checked: refused as a bad request.
    with pytest.raises(RunnerError) as caught:
        await run_files(runner, req.ops)
    assert caught.value.reason == Reason.BAD_REQUEST
    assert "Import" in caught.value.detail


async def test_an_import_through_an_existing_symlink_is_refused(runner: Runner) -> None:
    req = files.request([WriteFiles(entries=[symlink("esc", "/tmp")]),
                         Import(path=".", tar=tar_of([member("esc/pwned", data=b"x")])),
                         Import(path="esc", tar=tar_of([member("pwned", data=b"x")]))],
                        runner.limits)
    reply, cwd = await in_jail_then_list(runner, req)
    assert reply.results == [1]
    assert reply.error is not None
    assert (reply.error.op, reply.error.kind, reply.error.path) == (1, "refused", "esc")
    assert cwd == ["esc"]


async def test_a_write_through_an_existing_symlink_component_is_refused(
        runner: Runner) -> None:
    ops: list[FilesOp] = [
        # At the path itself, a symlink is replaced, never written through.
        WriteFiles(entries=[symlink("f", "/tmp/target")]),
        WriteFiles(entries=[file("f", b"a file now", 0o600)]),
        ReadFiles(patterns=["f"]),
        # In a component, refused.
        WriteFiles(entries=[symlink("esc", "/tmp"), symlink("up", ".")]),
        WriteFiles(entries=[file("esc/pwned", b"x")]),
    ]
    reply, cwd = await in_jail_then_list(runner, files.request(ops, runner.limits))
    assert reply.results[:2] == [1, 1]
    assert reply.results[2] == [file("f", b"a file now", 0o600)]
    assert reply.error is not None
    assert (reply.error.op, reply.error.kind, reply.error.path) == (4, "refused", "esc")
    assert cwd == ["esc", "f", "up"]  # and /tmp/target never made
    # The same through the built-in mode: a bad request naming the op and path.
    with pytest.raises(RunnerError) as caught:
        await run_files(runner, [ops[3], WriteFiles(entries=[file("up/esc/x", b"x")])])
    assert caught.value.reason == Reason.BAD_REQUEST
    assert "op 1 (WriteFiles) refused at 'up'" in caught.value.detail


async def test_a_dir_is_never_replaced_by_a_file(runner: Runner) -> None:
    with pytest.raises(RunnerError) as caught:
        await run_files(runner, [WriteFiles(entries=[file("d/x", b"1")]),
                                 WriteFiles(entries=[file("d", b"2")])])
    assert caught.value.reason == Reason.BAD_REQUEST
    assert "os_error at 'd': EISDIR" in caught.value.detail


# -- the read budget --------------------------------------------------------------------


async def test_a_read_over_the_budget_fails_over_budget(runner: Runner) -> None:
    data = b"b" * 2000
    cost = files_mode.ENTRY_BYTES + len("big.bin") + len(data)
    ops: list[FilesOp] = [WriteFiles(entries=[file("big.bin", data)]),
                          ReadFiles(patterns=["big.bin"])]
    fits = await raw(runner, files.request(ops, runner.limits, budget_bytes=cost))
    assert fits.error is None
    assert fits.results[1] == [file("big.bin", data)]
    req = files.request(ops, runner.limits, budget_bytes=cost - 1)
    over = await raw(runner, req)
    assert over.results == [1]  # the write happened; the read returned nothing
    assert over.error is not None
    assert (over.error.op, over.error.kind, over.error.path) == (1, "over_budget", "big.bin")
    assert f"budget of {cost - 1} bytes" in over.error.detail
    with pytest.raises(RunnerError) as caught:
        files.check_reply(req, over)
    assert caught.value.reason == Reason.STDOUT_CAP


async def test_an_export_over_the_budget_fails_over_budget(runner: Runner) -> None:
    ops: list[FilesOp] = [WriteFiles(entries=[file("d/big.bin", b"e" * 2000)]), Export(path="d")]
    tar = (await raw(runner, files.request(ops, runner.limits, budget_bytes=10240))).results[1]
    assert isinstance(tar, bytes)
    assert len(tar) == 10240  # a header, 2000 bytes, two zero blocks: one 10 KiB record
    over = await raw(runner, files.request(ops, runner.limits, budget_bytes=10239))
    assert over.error is not None
    assert (over.error.op, over.error.kind) == (1, "over_budget")


async def test_the_default_budget_fills_the_stdout_cap_and_no_more(runner: Runner) -> None:
    limits = Limits(wall_time_s=scaled(20), stdout_max_bytes=64 * KiB)
    budget = 64 * KiB - files_headroom_bytes(2)
    room = budget - files_mode.ENTRY_BYTES - len("fill")
    for size, kind in ((room, None), (room + 1, "over_budget")):
        ops: list[FilesOp] = [WriteFiles(entries=[file("fill", b"f" * size)]),
                              ReadFiles(patterns=["fill"])]
        req = files.request(ops, limits)
        assert req.budget_bytes == budget
        reply = await raw(runner, req, limits)  # never the parent's stdout_cap
        assert (reply.error and reply.error.kind) == kind


# -- the request, checked before a spawn (pure) ----------------------------------------


@pytest.mark.parametrize("op", [
    pytest.param(ReadFiles(patterns=["../x"]), id="pattern-dotdot"),
    pytest.param(ReadFiles(patterns=["/etc/*"]), id="pattern-absolute"),
    pytest.param(ReadFiles(patterns=["a", "./a"]), id="pattern-twice"),
    pytest.param(WriteFiles(entries=[file("../x", b"")]), id="entry-dotdot"),
    pytest.param(WriteFiles(entries=[file("/x", b"")]), id="entry-absolute"),
    pytest.param(WriteFiles(entries=[file("a/", b"")]), id="entry-trailing-slash"),
    pytest.param(WriteFiles(entries=[file("a", b""), directory("./a")]), id="entry-twice"),
    pytest.param(WriteFiles(entries=[symlink("l", "/tmp"), file("l/x", b"")]),
                 id="entry-under-a-symlink-entry"),
    pytest.param(WriteFiles(entries=[FileEntry(path="p", type="fifo",  # type: ignore[arg-type]
                                               mode=0o644, mtime_ns=0)]), id="entry-type"),
    pytest.param(WriteFiles(entries=[FileEntry(path="l", type="symlink", mode=0o777,
                                               mtime_ns=0, data=b"x", target="t")]),
                 id="data-on-a-symlink"),
    pytest.param(WriteFiles(entries=[FileEntry(path="f", type="file", mode=0o644,
                                               mtime_ns=0, target="t")]),
                 id="target-on-a-file"),
    pytest.param(WriteFiles(entries=[symlink("l", "")]), id="symlink-without-target"),
    pytest.param(WriteFiles(entries=[file("f", b"", mode=0o10000)]), id="mode-over-7777"),
    pytest.param(WriteFiles(entries=[file("f", b"", mtime_ns=2**63)]), id="mtime-over-int64"),
    pytest.param(Export(path=""), id="export-empty"),
    pytest.param(Import(path="..", tar=b""), id="import-dotdot"),
    pytest.param(Import(path="x", tar="not bytes"),  # type: ignore[arg-type]
                 id="import-str-tar"),
    pytest.param(FilesRequest(ops=[]), id="not-an-op"),
])
def test_a_bad_op_is_refused_before_a_spawn(op: Any) -> None:
    with pytest.raises(RunnerError) as caught:
        files.request([op], Limits())
    assert caught.value.reason == Reason.BAD_REQUEST


def test_the_request_bounds() -> None:
    limits = Limits(stdout_max_bytes=MiB, file_size_bytes=1000)
    with pytest.raises(RunnerError, match="file_size_bytes"):
        files.request([WriteFiles(entries=[file("f", b"x" * 1001)])], limits)
    with pytest.raises(RunnerError, match=f"over the bound of {FILES_MAX_OPS}"):
        files.request([ReadFiles(patterns=["x"])] * (FILES_MAX_OPS + 1), limits)
    big = b"t" * (EXEC_INPUT_MAX_BYTES // 2 + 1)
    with pytest.raises(RunnerError, match=f"over the bound of {EXEC_INPUT_MAX_BYTES}"):
        files.request([Import(path="a", tar=big), Import(path="b", tar=big)], limits)
    most = MiB - files_headroom_bytes(1)
    assert files.request([Export(path=".")], limits).budget_bytes == most
    with pytest.raises(RunnerError, match=f"not an int in 0..{most}"):
        files.request([Export(path=".")], limits, budget_bytes=most + 1)
    # The wire default is within the default cap's room, whatever the ops.
    assert MiB - files_headroom_bytes(FILES_MAX_OPS) >= FILES_DEFAULT_BUDGET_BYTES
    # Paths come out normal.
    req = files.request([ReadFiles(patterns=["./a//b"]), Export(path=".")], limits)
    assert req.ops == [ReadFiles(patterns=["a/b"]), Export(path=".")]


@pytest.mark.parametrize(("reply", "why"), [
    pytest.param(FilesResult(results=[]), "0 results for 1 ops", id="too-few"),
    pytest.param(FilesResult(results=[5]), "has a int result", id="wrong-kind"),
    pytest.param(FilesResult(results=[[file("../x", b"")]]), "not a plain", id="path"),
    pytest.param(FilesResult(results=[[file("b", b""), file("a", b"")]]), "sorted",
                 id="unsorted"),
    pytest.param(FilesResult(results=[[file("c", b"")]]), "no requested pattern",
                 id="unmatched"),
    pytest.param(FilesResult(results=[[FileEntry(path="a", type="dir", mode=0o755,
                                                 mtime_ns=0, data=b"x")]]), "data on",
                 id="data-on-a-dir"),
])
def test_a_reply_of_another_shape_is_a_bad_frame(reply: FilesResult, why: str) -> None:
    req = files.request([ReadFiles(patterns=["a", "b"])], Limits())
    with pytest.raises(RunnerError, match=why) as caught:
        files.check_reply(req, reply)
    assert caught.value.reason == Reason.BAD_FRAME


# -- the codec (pure, on a temp dir) ------------------------------------------------------


def test_the_worker_reply_is_msgspecs_bytes_and_entries_cost_at_most_their_count(
        tmp_path: Path) -> None:
    req = files.request([WriteFiles(entries=WRITTEN), ReadFiles(patterns=["**"]),
                         Export(path="work/ro"), ReadFiles(patterns=["nothing"]),
                         WriteFiles(entries=[file("work/link/x", b"")])], Limits())
    (tmp_path / "base").mkdir()
    reply = files_mode.run_files(wire.unpack(encode_frame(req)[4:]), str(tmp_path / "base"))
    expected = msgspec.convert(reply, FilesResult)
    assert wire.frame(reply) == encode_frame(expected)
    assert expected.error is not None
    assert (expected.error.op, expected.error.kind) == (4, "refused")
    entries = expected.results[1]
    assert isinstance(entries, list)
    assert len(entries) == len(WRITTEN) + 1
    worst = FileEntry(path="p" * 4095, type="symlink", mode=-(2**63), mtime_ns=-(2**63),
                      data=b"d" * 70000, target="t" * 4095)
    for e in [*entries, worst]:
        cost = files_mode.ENTRY_BYTES + len(e.path.encode()) + len(e.target.encode()) + len(
            e.data)
        assert len(msgspec.msgpack.encode(e)) <= cost
