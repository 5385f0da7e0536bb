"""`exec` files: placed in the working dir, collected back inside the stdout
cap, refused before spawn when bad."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from conftest import child_pids
from support import scaled
from trunner import (
    CollectedFile,
    ExecFile,
    ExecResult,
    Limits,
    Reason,
    Runner,
    RunnerError,
    exec_checks,
)
from trunner.protocol import (
    EXEC_COLLECT_MAX_FILES,
    EXEC_COLLECT_MAX_PATTERNS,
    EXEC_INPUT_MAX_BYTES,
    EXEC_INPUT_MAX_FILES,
    EXEC_PATH_MAX_BYTES,
    encode_frame,
    exec_frame_bytes,
)
from trunner.worker import exec_mode

if TYPE_CHECKING:
    from pathlib import Path

PY = sys.executable

C_SOURCE = b"""\
#include <stdio.h>
int main(void) {
    FILE *f = fopen("out/answer.txt", "w");
    if (!f) return 2;
    fputs("forty-two\\n", f);
    fclose(f);
    puts("wrote it");
    return 0;
}
"""


TRUNNER = os.path.join(os.path.dirname(sys.executable), "trunner")


def cli(*args: str) -> tuple[int, dict[str, object]]:
    out = subprocess.run([TRUNNER, *args], capture_output=True, timeout=scaled(120))
    return out.returncode, json.loads(out.stdout)


def py(code: str) -> list[str]:
    return [PY, "-c", code]


@pytest.fixture
def unspawnable(jail_root: Path) -> Runner:
    """Fails `spawn_failed` as soon as it makes a jail dir or spawns."""
    return Runner(temp_root=str(jail_root / "missing"), worker="/nonexistent/trunner-worker")


# -- files in, files out -------------------------------------------------------------


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs cc")
async def test_compile_then_run_returns_the_binary_and_the_output_file(runner: Runner) -> None:
    # The linker's chmod works in the working dir (the jail's scratch), and exec is
    # allowed there: the binary runs in the jail that compiled it.
    script = "mkdir out && cc -O1 -o a.out src/main.c && ./a.out"
    done = (await runner.exec(["/bin/sh", "-c", script], files={"src/main.c": C_SOURCE},
                              collect=["a.out", "out/*"])).response
    assert (done.exit_code, done.stdout, done.stderr) == (0, b"wrote it\n", b"")
    paths = {f.path: f for f in done.files}
    assert sorted(paths) == ["a.out", "out/answer.txt"]
    assert paths["out/answer.txt"].data == b"forty-two\n"
    binary = paths["a.out"].data
    assert binary[:4] == b"\x7fELF"
    assert paths["a.out"].size == len(binary)
    # The collected binary, placed executable in a fresh jail, runs as itself.
    again = (await runner.exec(["/bin/sh", "-c", "mkdir out && ./a.out && cat out/answer.txt"],
                               files={"a.out": ExecFile(data=binary, executable=True)})
             ).response
    assert (again.exit_code, again.stdout) == (0, b"wrote it\nforty-two\n")


async def test_a_python_package_in_subdirectories_runs_with_dash_m(runner: Runner) -> None:
    files: dict[str, bytes | ExecFile] = {
        "pkg/__init__.py": b"",
        "pkg/__main__.py": b"from pkg.calc.ops import double\nfrom pkg.io import save\n"
                           b"save(double(21))\n",
        "pkg/calc/__init__.py": b"",
        "pkg/calc/ops.py": b"def double(x):\n    return 2 * x\n",
        "pkg/io.py": b"def save(v):\n    open('result/value.txt', 'w').write(str(v))\n"
                     b"    print('saved', v)\n",
        "result/.keep": b"",
    }
    done = (await runner.exec([PY, "-m", "pkg"], files=files,
                              collect=["result/*.txt", "pkg/**/*.py"])).response
    assert (done.exit_code, done.stdout, done.stderr) == (0, b"saved 42\n", b"")
    got = {f.path: f.data for f in done.files}
    assert got.pop("result/value.txt") == b"42"
    assert got == {p: d for p, d in files.items() if p.endswith(".py")}
    assert done.unmatched == []


async def test_the_exec_bit_comes_from_the_request(runner: Runner) -> None:
    script = b"#!/bin/sh\necho ran\n"
    files: dict[str, bytes | ExecFile] = {
        "bin/yes.sh": ExecFile(data=script, executable=True), "bin/no.sh": script}
    code = "import os; print(oct(os.stat('bin/yes.sh').st_mode), oct(os.stat('bin/no.sh').st_mode))"
    done = (await runner.exec(py(code), files=files)).response
    assert done.stdout == b"0o100755 0o100644\n"
    ran = (await runner.exec(["./bin/yes.sh"], files=files)).response
    assert (ran.exit_code, ran.stdout) == (0, b"ran\n")
    refused = (await runner.exec(["/bin/sh", "-c", "./bin/no.sh"], files=files)).response
    assert refused.exit_code == 126
    assert b"Permission denied" in refused.stderr


# -- collect -------------------------------------------------------------------------

MAKE_TREE = """
import os
os.makedirs('out/deep/er')
for i in range(40):
    open(f'out/f{i:02}.txt', 'w').write(str(i))
open('out/deep/er/x.log', 'w').write('log')
open('out/.hidden', 'w').write('h')
open('top.log', 'w').write('top')
"""


@pytest.mark.parametrize(("patterns", "paths", "unmatched"), [
    (["*.bin", "nope/*"], [], ["*.bin", "nope/*"]),
    (["top.log"], ["top.log"], []),
    (["out/f07.txt"], ["out/f07.txt"], []),
    (["out/*.txt"], [f"out/f{i:02}.txt" for i in range(40)], []),
    (["**/*.log", "out/deep/**"], ["out/deep/er/x.log", "top.log"], []),
    (["out/.*", "out/f1?.txt", "out/f[0]0.txt", "zzz"],
     ["out/.hidden", "out/f00.txt", *(f"out/f1{i}.txt" for i in range(10))], ["zzz"]),
    (["out/deep"], [], ["out/deep"]),  # a directory is not a file
])
async def test_collect_globs(
    runner: Runner, patterns: list[str], paths: list[str], unmatched: list[str]
) -> None:
    done = (await runner.exec(py(MAKE_TREE), collect=patterns)).response
    assert done.exit_code == 0, done.stderr
    assert [f.path for f in done.files] == paths  # sorted, each once
    assert done.unmatched == unmatched
    for f in done.files:
        assert f.size == len(f.data) > 0


async def test_collected_symlinks_are_never_followed(runner: Runner) -> None:
    code = """
import os
os.symlink('/etc/hostname', 'leak')
os.symlink('/usr/lib', 'libdir')
os.symlink('../../etc', 'up')
os.mkdir('real')
open('real/ok.txt', 'w').write('ok')
os.symlink('real/ok.txt', 'inside')
os.symlink('real', 'realdir')
"""
    done = (await runner.exec(py(code), collect=["leak", "libdir/*", "up/*", "inside",
                                                 "realdir/ok.txt", "**"])).response
    assert done.exit_code == 0, done.stderr
    assert [f.path for f in done.files] == ["real/ok.txt"]
    assert done.unmatched == ["leak", "libdir/*", "up/*", "inside", "realdir/ok.txt"]


def test_reading_a_collected_path_refuses_a_swapped_in_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a process still running after the program could do between the match
    # and the read: make a matched path's directory a symlink. (In-process: the
    # worker's reader on a real directory tree.)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"secret")
    work = tmp_path / "work"
    (work / "real").mkdir(parents=True)
    (work / "real" / "secret").write_bytes(b"mine")
    monkeypatch.chdir(work)
    assert exec_mode._read_no_follow("real/secret", 100) == b"mine"
    (work / "real" / "secret").unlink()
    (work / "real").rmdir()
    (work / "real").symlink_to(tmp_path / "outside")
    assert exec_mode._read_no_follow("real/secret", 100) is None
    (work / "file").symlink_to(tmp_path / "outside" / "secret")
    assert exec_mode._read_no_follow("file", 100) is None
    os.mkfifo(work / "fifo")
    assert exec_mode._read_no_follow("fifo", 100) is None  # and does not block


def test_collect_walks_deeper_than_the_recursion_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    depth = sys.getrecursionlimit() + 100
    monkeypatch.chdir(tmp_path)
    dirs = ["d/" * i for i in range(1, depth + 1)]
    deepest = dirs[-1] + "f"
    try:  # a tree this deep left behind would break pytest's own tmp cleanup
        for d in dirs:
            os.mkdir(d)
        (tmp_path / deepest).write_bytes(b"deep")
        files, unmatched = exec_mode.collect(["**/f", "**/**/nope"], 100)
        assert [(f["path"], f["data"]) for f in files] == [(deepest, b"deep")]
        assert unmatched == ["**/**/nope"]
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(deepest)
        for d in reversed(dirs):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(d)


async def test_more_matches_than_the_bound_fail_with_too_many_files(runner: Runner) -> None:
    """Past the file-count bound the run fails with a reason of its own, never
    `stdout_cap`, whatever the files' size (issue 35: 1025 empty files were
    `stdout_cap`); at the bound, every file comes back."""
    assert EXEC_COLLECT_MAX_FILES == 10_000
    code = f"for i in range({EXEC_COLLECT_MAX_FILES + 1}): open(f'f{{i}}', 'w').close()"
    with pytest.raises(RunnerError) as info:
        await runner.exec(py(code), collect=["f*"])
    assert info.value.reason is Reason.TOO_MANY_FILES
    assert f"more than {EXEC_COLLECT_MAX_FILES} files" in info.value.detail
    assert info.value.usage is not None
    # Files whose bytes together are past the stdout cap: the count still decides.
    code = (f"for i in range({EXEC_COLLECT_MAX_FILES + 1}):"
            f" open(f'f{{i}}', 'w').write('x' * 200)")
    with pytest.raises(RunnerError) as info:
        await runner.exec(py(code), collect=["f*"])
    assert info.value.reason is Reason.TOO_MANY_FILES
    code = f"for i in range({EXEC_COLLECT_MAX_FILES}): open(f'f{{i}}', 'w').write(str(i))"
    done = (await runner.exec(py(code), collect=["f*"])).response
    assert len(done.files) == EXEC_COLLECT_MAX_FILES
    assert {f.path: f.data for f in done.files}["f9999"] == b"9999"


# -- the exact cap edge --------------------------------------------------------------

CAP = 50_000


def writer(out: int, sizes: list[int]) -> list[str]:
    return py(f"import os; os.write(1, b'o' * {out}) if {out} else None\n"
              f"for i, n in enumerate({sizes}): open(f'c{{i}}', 'wb').write(b'f' * n)")


@pytest.mark.parametrize(("out", "sizes"), [
    (0, [CAP]),
    (CAP - 1000, [1000]),
    (CAP // 2, [CAP // 4, CAP // 4, 0]),
    (CAP, [0, 0]),
    (0, [1] * 100 + [CAP - 100]),
])
async def test_stdout_and_collected_bytes_equal_to_the_cap_pass(
    runner: Runner, out: int, sizes: list[int]
) -> None:
    limits = runner.limits.replace(stdout_max_bytes=CAP)
    done = (await runner.exec(writer(out, sizes), collect=["c*"], limits=limits)).response
    assert done.stdout == b"o" * out
    by_name = {f.path: f.data for f in done.files}
    assert by_name == {f"c{i}": b"f" * n for i, n in enumerate(sizes)}
    assert len(done.stdout) + sum(map(len, by_name.values())) <= CAP


@pytest.mark.parametrize(("out", "sizes"), [
    (0, [CAP + 1]),
    (CAP - 1000, [1001]),
    (CAP // 2, [CAP // 4, CAP // 4, 1]),
    (CAP, [0, 1]),
    (0, [1] * 100 + [CAP - 99]),
    (0, [10 * CAP]),
])
async def test_one_collected_byte_over_the_cap_fails_with_stdout_cap(
    runner: Runner, out: int, sizes: list[int]
) -> None:
    limits = runner.limits.replace(stdout_max_bytes=CAP)
    with pytest.raises(RunnerError) as info:
        await runner.exec(writer(out, sizes), collect=["c*"], limits=limits)
    assert info.value.reason is Reason.STDOUT_CAP
    assert "collected files" in info.value.detail
    assert child_pids() == []


def test_the_frame_bound_holds_for_the_largest_reply() -> None:
    cap, err_cap = 70_000, 300
    patterns = ["p" * 100] * 3
    name = "d/" + "x" * (EXEC_PATH_MAX_BYTES - 2)
    files = [CollectedFile(path=name, size=2**62, data=b"") for _ in range(EXEC_COLLECT_MAX_FILES)]
    files.append(CollectedFile(path=name, size=2**62, data=b"f" * (cap + 1)))
    worst = ExecResult(exit_code=255, signal=None, stdout=b"", stderr=b"e" * (err_cap + 1),
                       files=files, unmatched=patterns, elapsed_s=1e300)
    assert len(encode_frame(worst)) <= exec_frame_bytes(cap, err_cap, patterns)
    spread = [CollectedFile(path=name, size=300, data=b"f" * 300) for _ in range(cap // 300)]
    rest = b"o" * (cap + 1 - 300 * len(spread))
    worst = msgspec.structs.replace(worst, files=spread, stdout=rest)
    assert len(encode_frame(worst)) <= exec_frame_bytes(cap, err_cap, patterns)
    assert exec_frame_bytes(cap, err_cap) < exec_frame_bytes(cap, err_cap, patterns)


# -- refused before anything is spawned ----------------------------------------------

TOO_MANY = {f"f{i}": b"" for i in range(EXEC_INPUT_MAX_FILES + 1)}
HALF = b"\0" * (EXEC_INPUT_MAX_BYTES // 2)

REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("absolute", {"files": {"/etc/x": b""}}, "absolute"),
    ("dotdot", {"files": {"a/../../x": b""}}, "'..'"),
    ("dotdot-only", {"files": {"..": b""}}, "'..'"),
    ("nul", {"files": {"a\0b": b""}}, "NUL"),
    ("empty", {"files": {"": b""}}, "empty"),
    ("dot", {"files": {"./.": b""}}, "empty"),
    ("directory", {"files": {"a/": b""}}, "ends with '/'"),
    ("duplicate", {"files": {"a/b": b"1", "./a//b": b"2"}}, "twice"),
    ("file-and-dir", {"files": {"a": b"", "a/b": b""}}, "as a file and as the directory"),
    ("long-name", {"files": {"x" * 256: b""}}, "longer than"),
    ("long-path", {"files": {"/".join(["x" * 200] * 21): b""}}, "longer than"),
    ("not-utf8", {"files": {"\udcff": b""}}, "UTF-8"),
    ("not-bytes", {"files": {"a": "text"}}, "bytes or an ExecFile"),
    ("too-many", {"files": TOO_MANY}, "over the bound"),
    ("too-many-bytes", {"files": {"a": HALF, "b": HALF + b"\0"}}, "over the bound"),
    ("stdin-counts", {"files": {"a": HALF}, "stdin": HALF + b"\0"}, "over the bound"),
    ("over-fsize", {"files": {"a": b"x" * 1001},
                    "limits": Limits(file_size_bytes=1000)}, "file_size_bytes"),
    ("pattern-absolute", {"collect": ["/etc/*"]}, "absolute"),
    ("pattern-dotdot", {"collect": ["../*"]}, "'..'"),
    ("pattern-nul", {"collect": ["a\0"]}, "NUL"),
    ("pattern-empty", {"collect": [""]}, "empty"),
    ("pattern-duplicate", {"collect": ["*.txt", "./*.txt"]}, "twice"),
    ("pattern-str", {"collect": "a.out"}, "not one str"),
    ("too-many-patterns", {"collect": [f"p{i}" for i in range(EXEC_COLLECT_MAX_PATTERNS + 1)]},
     "over the bound"),
    ("over-fsize-auto", {"files": {"a": b"x" * ((1 << 20) + (64 << 10) + 1)},
                         "limits": Limits(scratch_bytes=1 << 20)}, "file_size_bytes"),
]


@pytest.mark.parametrize(("kwargs", "words"), [(k, w) for _, k, w in REFUSALS],
                         ids=[name for name, _, _ in REFUSALS])
async def test_bad_files_and_patterns_are_refused_before_spawn(
    runner: Runner, unspawnable: Runner, jail_root: Path, kwargs: dict[str, Any], words: str
) -> None:
    # `unspawnable` would fail spawn_failed had it got as far as making a jail dir.
    for r in (runner, unspawnable):
        with pytest.raises(RunnerError) as info:
            await r.exec(["/bin/true"], **kwargs)
        assert info.value.reason is Reason.BAD_REQUEST, (info.value.reason, info.value.detail)
        assert words in info.value.detail
        assert "\n" not in info.value.detail
        assert len(info.value.detail) < 300
        assert child_pids() == []
        assert list(jail_root.iterdir()) == []


async def test_files_at_the_bounds_are_accepted(runner: Runner) -> None:
    quarter = b"\0" * (EXEC_INPUT_MAX_BYTES // 4)
    many = {f"d/f{i}": b"" for i in range(EXEC_INPUT_MAX_FILES - 2)}
    files = {**many, "a": quarter, "b": quarter}
    code = "import os; print(len(os.listdir('d')), os.path.getsize('a') + os.path.getsize('b'))"
    done = (await runner.exec(py(code), files=files, stdin=quarter + quarter)).response
    assert done.stdout == f"{EXEC_INPUT_MAX_FILES - 2} {EXEC_INPUT_MAX_BYTES // 2}\n".encode()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="/.a\0\udcff\u00e9", max_size=12))
def test_a_normal_path_is_relative_plain_and_stable(path: str) -> None:
    try:
        norm = exec_checks.normal_path(path)
    except RunnerError as e:
        refusal: RunnerError | None = e
    else:
        refusal = None
    if refusal is not None:
        assert refusal.reason is Reason.BAD_REQUEST
        return
    parts = norm.split("/")
    assert all(p not in ("", ".", "..") for p in parts)
    assert "\0" not in norm
    assert exec_checks.normal_path(norm) == norm
    assert os.path.normpath(path) == norm


def test_the_parent_checks_collected_paths_and_sizes() -> None:
    def ok(*files: CollectedFile) -> bool:
        return exec_checks.check_collected(list(files))

    good = CollectedFile(path="a/b", size=1, data=b"x")
    assert ok(good)
    assert not ok(msgspec.structs.replace(good, size=2))
    assert not ok(good, good)
    for path in ("../x", "/x", "a//b", "a/./b", "", "a\0"):
        assert not ok(msgspec.structs.replace(good, path=path)), path


# -- the command line ---------------------------------------------------------------


def test_exec_files_in_and_collected_as_base64_or_into_a_dir(tmp_path: Path) -> None:
    src = tmp_path / "prog.sh"
    src.write_bytes(b"#!/bin/sh\nmkdir -p out && echo made > out/x.txt && echo ran\n")
    src.chmod(0o755)
    data = tmp_path / "data.txt"
    data.write_bytes(b"plain")
    args = ["exec", "--file", "bin/prog.sh=" + str(src), "--file", "data.txt=" + str(data),
            "--collect", "out/*", "--collect", "none*"]
    code, out = cli(*args, "--text", "--", "/bin/sh", "-c", "./bin/prog.sh && ls -l data.txt")
    assert code == 0, out
    assert str(out["stdout"]).startswith("ran\n-rw-r--r--")  # exec bit from the host file
    assert out["files"] == [{"path": "out/x.txt", "size": 5,
                             "data": base64.b64encode(b"made\n").decode(), "mode": 0o644}]
    assert out["unmatched"] == ["none*"]
    dest = tmp_path / "collected"
    code, out = cli(*args, "--out", str(dest), "--", "./bin/prog.sh")
    assert code == 0, out
    assert out["files"] == [{"path": "out/x.txt", "size": 5, "mode": 0o644,
                             "written": str(dest / "out" / "x.txt")}]
    assert (dest / "out" / "x.txt").read_bytes() == b"made\n"


def test_exec_bad_files_are_refused(tmp_path: Path) -> None:
    code, out = cli("exec", "--file", "/abs=/etc/hostname", "--", "/bin/true")
    assert (code, out["error"]) == (1, "bad_request")
    assert "absolute" in str(out["detail"])
    code, out = cli("exec", "--file", "noequals", "--", "/bin/true")
    assert (code, out["error"]) == (2, "usage")
    code, out = cli("exec", "--file", f"a={tmp_path / 'missing'}", "--", "/bin/true")
    assert (code, out["error"]) == (2, "usage")


# -- the parent trusts nothing it did not ask for (issue 17) ----------------------

TREE = ("a.o", ".h.o", "top.o", "b/x.txt", "b/c/m.o", "b/c/.d/n.o", "dd/ee/ff.c", "[x]")
PATTERNS = ("*", "*.o", "**", "**/*.o", "b/**", "b/*/m.o", "?op.o", "[ab]*", "**/ff.c",
            "dd/**/ff.c", "b/c/**", "b/**/c/*.o", "**/**/n.o", "[[]x]", "none", "b/c")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_parent_matches_a_pattern_as_the_adapter_does(
    pattern: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for path in TREE:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    files, _ = exec_mode.collect([pattern], 1 << 20)
    assert {f["path"] for f in files} == {p for p in TREE if exec_checks.matches(pattern, p)}


def _reply(*paths: str, unmatched: tuple[str, ...] = ()) -> ExecResult:
    return ExecResult(exit_code=0, signal=None, stdout=b"", stderr=b"",
                      files=[CollectedFile(path=p, size=1, data=b"x") for p in paths],
                      unmatched=list(unmatched))


def test_a_collected_file_no_pattern_matches_fails_the_run() -> None:
    from trunner.exec_checks import check_exec_reply

    limits = Limits()
    check_exec_reply(_reply("build/a.o"), limits, ["build/*.o"])
    with pytest.raises(RunnerError) as info:
        check_exec_reply(_reply("build/a.o", "Makefile"), limits, ["build/*.o"])
    assert info.value.reason is Reason.BAD_FRAME
    assert "Makefile" in info.value.detail
    with pytest.raises(RunnerError) as info:
        check_exec_reply(_reply(unmatched=("other",)), limits, ["build/*.o"])
    assert info.value.reason is Reason.BAD_FRAME


@pytest.mark.parametrize("where", ["top", "file"])
def test_a_reply_with_a_key_trunner_did_not_define_is_bad_frame(where: str) -> None:
    from trunner.protocol import decode_single_frame
    from trunner.worker.wire import frame

    file = {"path": "a", "size": 1, "data": b"x"}
    body = exec_mode.result(0, b"", b"", [file], [], 0.0)
    good = frame(body)
    assert decode_single_frame(good, ExecResult).files[0].path == "a"
    if where == "top":
        body["swallow"] = b"the real frame"
    else:
        file["swallow"] = b"the real frame"
    with pytest.raises(RunnerError) as info:
        decode_single_frame(frame(body), ExecResult)
    assert info.value.reason is Reason.BAD_FRAME
    assert "swallow" in info.value.detail


@pytest.mark.parametrize("planted", ["file", "dir"])
def test_exec_out_never_writes_through_a_symlink(tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "x.txt").write_bytes(b"precious\n")
    dest = tmp_path / "collected"
    (dest / "out").mkdir(parents=True)
    if planted == "file":
        (dest / "out" / "x.txt").symlink_to(victim / "x.txt")
    else:
        (dest / "out").rmdir()
        (dest / "out").symlink_to(victim)
    code, out = cli("exec", "--collect", "out/*", "--out", str(dest), "--",
                    "/bin/sh", "-c", "mkdir out && echo made > out/x.txt")
    assert code != 0, out
    assert out["error"] == "usage", out
    # O_NOFOLLOW: ELOOP on a linked file, ENOTDIR on a linked directory.
    assert ("Too many levels of symbolic links" if planted == "file" else "Not a directory") \
        in str(out["detail"]), out
    assert (victim / "x.txt").read_bytes() == b"precious\n"
    assert sorted(p.name for p in victim.iterdir()) == ["x.txt"]


# -- file_size_bytes follows the scratch ---------------------------------------------

_FILL = "head -c {n} /dev/zero > big; echo $?; wc -c < big"


async def test_a_file_may_fill_the_scratch_by_default(runner: Runner) -> None:
    """`file_size_bytes` "auto" is the scratch's size: a 100 MB temp file is
    written whole under the default 256 MiB scratch (issue 35: it failed
    EFBIG at the old 64 MiB default, as root and not)."""
    done = (await runner.exec(["sh", "-c", _FILL.format(n=100_000_000)])).response
    assert (done.stdout, done.stderr) == (b"0\n100000000\n", b"")


async def test_no_file_grows_past_the_scratch(runner: Runner) -> None:
    """Past the scratch the write still fails, with the full tmpfs's ENOSPC
    ("auto" is a page's rounding past the scratch, so RLIMIT_FSIZE never
    comes first), the file at most the scratch; a `file_size_bytes` given
    below it still holds (SIGXFSZ kills `head`: 128 + 25)."""
    scratch = 8 << 20
    limits = runner.limits.replace(scratch_bytes=scratch)
    done = (await runner.exec(["sh", "-c", _FILL.format(n=2 * scratch)], limits=limits)).response
    assert done.stdout.split()[0] == b"1", done
    assert int(done.stdout.split()[1]) <= scratch, done
    assert b"No space left on device" in done.stderr, done
    limits = limits.replace(file_size_bytes=scratch // 2)
    done = (await runner.exec(["sh", "-c", _FILL.format(n=2 * scratch)], limits=limits)).response
    assert done.stdout == f"{128 + signal.SIGXFSZ}\n{scratch // 2}\n".encode(), done
