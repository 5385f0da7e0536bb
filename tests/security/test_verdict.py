"""The verdict is trunner's: a jailed program cannot forge the frame its
adapter writes, whoever the caller is and wherever trunner is installed.

Each attack runs in a caller of its own (tests/installed.py): trunner
installed under the temp dir, which its jails bind inside their scratch /tmp,
and run as a non-root uid, whose pipes belong to the jail's uid. The
program tries its forgery and prints what each try answered; the test
asserts the real verdict came back (the program's own output and exit
code, only the files asked for) and that the host's files did not change.
"""

from __future__ import annotations

import ast
import errno
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from installed import run_caller, temp_install, unused_id, world_python

from conftest import landlock_cap
from support import VIA_POOL, VIA_WARM, run_code
from trunner.linux.probe import trunner_dir

if TYPE_CHECKING:
    from collections.abc import Iterator

    from trunner import Runner


@pytest.fixture(scope="module")
def install() -> Iterator[Path]:
    python = world_python()
    if python is None:
        pytest.skip("no interpreter of this Python's version that every uid can run")
    root = temp_install(python)
    yield root
    shutil.rmtree(root)


#: The caller: one `exec` of ARGV, its verdict as one JSON line; through a
#: `runner.pool("exec")` when the test run is pooled (support.VIA_POOL), in a
#: `runner.warm()` block when it is warm (support.VIA_WARM).
CALLER = """
import json, os, sys, trio
from trunner import Limits, Runner, RunnerError
from trunner.linux.backend import LinuxBackend
from trunner.worker import locate_worker
argv, collect, temp_root, cap, via = json.loads(sys.argv[1] if len(sys.argv) > 1 else {args!r})

async def main():
    limits = Limits(wall_time_s=30)
    if cap is None:
        runner = Runner(limits=limits, temp_root=temp_root)
    else:
        runner = Runner(limits=limits, temp_root=temp_root,
                        backend=LinuxBackend(locate_worker(), landlock_abi=cap))
    try:
        if via == "pool":
            async with runner.pool("exec", size=1) as pool:
                r = (await pool.exec(argv, collect=collect)).response
        elif via == "warm":
            async with runner.warm():
                r = (await runner.exec(argv, collect=collect)).response
        else:
            r = (await runner.exec(argv, collect=collect)).response
        out = {{"ok": True, "exit_code": r.exit_code, "stdout": r.stdout.decode(errors="replace"),
               "stderr": r.stderr.decode(errors="replace"), "files": [f.path for f in r.files]}}
    except RunnerError as e:
        out = {{"ok": False, "reason": str(e.reason), "detail": e.detail}}
    print(json.dumps(out))

trio.run(main)
"""


def call(install: Path, argv: list[str], collect: list[str], *, uid: int | None) -> dict[str, Any]:
    """Run `argv` jailed by a caller using `install`, as `uid`; its verdict."""
    temp_root = Path(tempfile.mkdtemp(prefix="jails-", dir=install))  # reachable by `uid`
    temp_root.chmod(0o1777)
    try:
        args = [argv, collect, str(temp_root), landlock_cap(),
                "pool" if VIA_POOL else "warm" if VIA_WARM else ""]
        script = CALLER.format(args=json.dumps(args))
        verdict = run_caller(install, script, uid=uid)
        assert isinstance(verdict, dict)
        assert list(temp_root.iterdir()) == [], "the caller left a jail dir behind"
    finally:
        shutil.rmtree(temp_root)
    return verdict


def _site(install: Path) -> str:
    (site,) = install.glob("venv/lib/python*/site-packages")
    return str(site)


#: Item 1: rename the directory that holds trunner's bind (it lies in the
#: jail's scratch /tmp), put modules of our own in its place (the adapter
#: imported `struct` and `fnmatch` lazily, after the program), and forge a frame.
REPLACE_IMPORT_PATH = """
import os, sys
site = sys.argv[1]
payload = '''
import posix
body = bytes.fromhex(%r)
posix.write(1, len(body).to_bytes(4, "big") + body)
posix._exit(0)
'''
forged = {forged!r}
def attempt(fn):
    try:
        fn()
        return "OK"
    except OSError as e:
        return os.strerror(e.errno)
tried = {{}}
ancestors = []
path = site
while path not in ("/", "/tmp"):
    ancestors.append(path)
    path = os.path.dirname(path)
for path in ancestors:
    tried[path] = attempt(lambda: os.rename(path, path + ".moved"))
for name in ("struct", "fnmatch", "traceback", "_struct"):
    def plant():
        os.makedirs(site, exist_ok=True)
        with open(os.path.join(site, name + ".py"), "x") as f:
            f.write(payload % forged.hex())
    tried["plant " + name] = attempt(plant)
print(sorted(tried.items()))
"""

#: Item 2: write a frame into the adapter's own stdout, the response pipe,
#: through /proc/PID/fd of every other process in view; the frame ends on a
#: bytes field (`stderr`, known) or an unknown key, sized to swallow the
#: adapter's real frame that follows it.
WRITE_ADAPTER_PIPE = """
import os, sys
sys.path.insert(0, sys.argv[1])
import msgspec
from trunner.worker.exec_mode import result
from trunner.worker.wire import frame
swallow = sys.argv[2]
mine = os.getpid()
tried, pipes = {}, []
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid == mine:
        continue
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = ["0", "1", "2", "3"]
    for what in ["mem", *("fd/" + fd for fd in fds)]:
        try:
            fd = os.open(f"/proc/{pid}/{what}", os.O_WRONLY)
        except OSError as e:
            tried[f"{pid}/{what}"] = os.strerror(e.errno)
            continue
        tried[f"{pid}/{what}"] = "OK"
        (pipes if what == "fd/1" else []).append(fd)
report = (repr(sorted(tried.items())) + "\\n").encode()
real = len(frame(result(0, report, b"", [], [], 0.0)))  # what the adapter will write
fake = {"type": "exec_result", "exit_code": 0, "signal": None, "stdout": b"forged",
        "files": [{"path": "Makefile", "size": 1, "data": b"x"}], "unmatched": [],
        "elapsed_s": 0.5, swallow: b""}
body = msgspec.msgpack.encode(fake)[:-2]  # the empty bin8 at the end becomes ...
body += b"\\xc6" + real.to_bytes(4, "big")  # ... a bin32 that holds the real frame
for fd in pipes:
    try:
        os.write(fd, (len(body) + real).to_bytes(4, "big") + body)
    except OSError:
        pass
sys.stdout.buffer.write(report)
"""


def _forged_frame_hex() -> str:
    from trunner.worker.exec_mode import result
    from trunner.worker.wire import pack

    return pack(result(0, b"forged", b"", [{"path": "Makefile", "size": 1, "data": b"x"}],
                       [], 0.5)).hex()


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("as_other_uid", [False, True], ids=["caller-as-is", "non-root-caller"])
def test_program_cannot_replace_what_the_adapter_imports(
    install: Path, as_other_uid: bool
) -> None:
    site = _site(install)
    before = _snapshot(install)
    code = REPLACE_IMPORT_PATH.format(forged=bytes.fromhex(_forged_frame_hex()))
    # A wildcard pattern (fnmatch) and the elapsed time (a float) were the
    # adapter's lazy imports after the program.
    verdict = call(install, ["python3", "-c", code, site], ["build/*.o"],
                   uid=unused_id() if as_other_uid else None)
    assert verdict["ok"], verdict
    assert verdict["stdout"] != "forged", verdict
    assert (verdict["exit_code"], verdict["files"]) == (0, [])
    tried = dict(ast.literal_eval(verdict["stdout"]))  # the program's own, real output
    assert str(install) in tried, tried  # the dir holding the bind, in the scratch /tmp
    assert [k for k, v in tried.items() if v == "OK"] == [], tried
    assert _snapshot(install) == before


@pytest.mark.parametrize("swallow", ["stderr", "unknown_key"])
@pytest.mark.parametrize("as_other_uid", [False, True], ids=["caller-as-is", "non-root-caller"])
def test_program_cannot_write_the_adapters_pipe(
    install: Path, as_other_uid: bool, swallow: str
) -> None:
    verdict = call(install, ["python3", "-c", WRITE_ADAPTER_PIPE, _site(install), swallow], [],
                   uid=unused_id() if as_other_uid else None)
    assert verdict["ok"], verdict
    assert verdict["stdout"] != "forged", verdict
    assert (verdict["exit_code"], verdict["files"], verdict["stderr"]) == (0, [], "")
    tried = dict(ast.literal_eval(verdict["stdout"]))  # the program's own, real output
    assert "2/mem" in tried, tried  # the adapter was in view
    assert [k for k, v in tried.items() if v == "OK"] == [], tried


#: The class behind item 1, from inside: every mount point and each of its
#: ancestors resists rename, and no directory trunner's processes import
#: or exec from takes a new file or gives up an entry.
WALK_MOUNTS = """
import os, sys
def attempt(fn):
    try:
        fn()
        return "OK"
    except OSError as e:
        return os.strerror(e.errno)
points = set()
with open("/proc/self/mountinfo") as f:
    for line in f:
        point = line.split()[4].encode().decode("unicode_escape")
        if point != "/" and not point.startswith("/proc/"):
            points.add(point)
tried = {}
for point in sorted(points):
    path = point
    while path != "/":
        if path not in tried:
            tried[path] = attempt(lambda: os.rename(path, path + ".moved"))
        path = os.path.dirname(path)
trusted = [d for d in sys.argv[1:] if os.path.isdir(d)]
for d in trusted:
    def plant():
        os.close(os.open(d + "/planted.py", os.O_CREAT | os.O_WRONLY, 0o644))
    tried["create in " + d] = attempt(plant)
    for name in sorted(os.listdir(d)):
        old = d + "/" + name
        tried["rename " + old] = attempt(lambda: os.rename(old, old + ".x"))
print(repr(sorted(tried.items())))
"""


@pytest.mark.parametrize("as_other_uid", [False, True], ids=["caller-as-is", "non-root-caller"])
def test_nothing_trunner_trusts_can_be_renamed_or_replaced(
    install: Path, as_other_uid: bool
) -> None:
    site = _site(install)
    trunner = f"{site}/trunner"
    python = f"{install}/venv/bin"
    stdlib = "/usr/lib/python{}.{}".format(*sys.version_info[:2])  # the install's base
    trusted = [site, trunner, f"{trunner}/linux", f"{trunner}/kernel", f"{trunner}/worker",
               python, stdlib, "/usr/bin", "/"]
    verdict = call(install, ["python3", "-c", WALK_MOUNTS, *trusted], [],
                   uid=unused_id() if as_other_uid else None)
    assert verdict["ok"], verdict
    tried = dict(ast.literal_eval(verdict["stdout"]))
    for path in (str(install), "/tmp", "/home/trunner"):
        assert path in tried, tried
    assert f"rename {trunner}/kernel/trunner-waiter" in tried, tried
    # The jail's own scratch dirs take new files; nothing else does.
    assert [k for k, v in tried.items() if v == "OK"] == [], tried


def test_the_adapter_ends_at_any_import_once_its_program_runs() -> None:
    """The exec adapter's seal, in a plain process: what `_prepare` imported
    is there; anything else ends the process (exit 1, no frame)."""
    where = trunner_dir()  # the checkout, or the site-packages trunner is installed in
    code = (f"import sys; sys.path.insert(0, {where!r})\n"
            "from trunner.worker.exec_mode import _prepare\n"
            "_prepare(['build/*.o'])\n"
            "import fnmatch, struct\n"  # imported before: no import happens
            "print('sealed', flush=True)\n"
            "import json\n"
            "print('imported')\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, check=False)
    assert (done.returncode, done.stdout) == (1, "sealed\n"), done
    assert "import of 'json' after the program started" in done.stderr


async def test_no_exec_path_imports_after_the_program(runner: Runner) -> None:
    """Every path after the spawn (wildcards, `**`, an unmatched pattern, a
    signal, the elapsed time) runs sealed: an import would end the adapter."""
    program = "mkdir -p b/c && echo x > b/c/m.o && echo y > top.o && echo out && kill -9 $$"
    r = (await runner.exec(["/bin/sh", "-c", program],
                           collect=["**/*.o", "t?p.[o]", "none*"])).response
    assert (r.exit_code, r.signal, r.stdout) == (None, 9, b"out\n")
    assert [f.path for f in r.files] == ["b/c/m.o", "top.o"]
    assert r.unmatched == ["none*"]
    assert r.elapsed_s > 0


async def test_execveat_answers_as_execve_does(runner: Runner) -> None:
    """The filter allows execveat (the helper and pid 1 exec trunner-waiter
    from a descriptor); a program gains nothing by it: each file answers
    execveat(fd, "", AT_EMPTY_PATH) exactly as it answers execve(path)."""
    code = """
    import os
    with open("script", "w") as f:
        f.write("#!/bin/sh\\nexit 7\\n")
    os.chmod("script", 0o755)
    def answer(target):
        pid = os.fork()
        if pid == 0:
            try:
                os.execve(target, ["x", "-c", "exit 3"], {})
            except OSError as e:
                os._exit(100 + e.errno)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    result = {}
    for path in ("/bin/sh", "/bin/true", "/etc/hostname", "/dev/null", "/proc/self/exe",
                 "/home/trunner/script"):
        by_fd = os.open(path, os.O_PATH)
        os.set_inheritable(by_fd, True)  # a script's interpreter reads /dev/fd/N
        result[path] = (answer(path), answer(by_fd))
        os.close(by_fd)
    """
    answers = await run_code(runner, code)
    assert answers["/bin/sh"] == [3, 3]
    assert answers["/home/trunner/script"] == [7, 7]
    assert answers["/etc/hostname"][0] == 100 + errno.EACCES
    for path, (by_path, by_fd) in answers.items():
        assert by_path == by_fd, (path, answers)
