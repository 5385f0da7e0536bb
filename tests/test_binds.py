"""Toolchains outside /usr, bound with `Runner(binds=...)`, and the /etc
entries runtimes need (issue 35, items 1 and 2): rustup's rustc and pyenv's
interpreters compile and run in the jail, a bind at a target path, the
refusals with their reason, and OpenJDK's javac, `java Main.java` and
SecureRandom with the default /etc. The attacks on a bind are in
tests/security/test_bind_attacks.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from conftest import make_runner
from support import run_code, scaled
from trunner import Limits, RunnerError
from trunner.errors import Reason
from trunner.linux.binds import parse_binds, parse_etc, shadow_refusal, writer_refusal
from trunner.linux.plan import WORKDIR, built_paths

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = os.getuid() == 0
HOME = Path("/root")
RUSTUP = HOME / ".rustup"
CARGO = HOME / ".cargo"
PYENV = HOME / ".pyenv" / "versions"

#: Enough for a compiler: rustc and javac start threads (docs/toolchains.md).
TOOL_LIMITS = Limits(wall_time_s=scaled(60), cpu_time_s=scaled(60), processes=64)


def unreadable(path: Path) -> str | None:
    """Why this uid cannot use `path` (root's home is mode 700), or None."""
    try:
        exists = path.exists()
    except PermissionError:
        exists = True
    if not exists:
        return f"no {path} on this host"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{path} is not readable by uid {os.getuid()} (root's home is mode 700)"
    return None


# -- the arguments and the refusals, on plain values -----------------------------


def test_binds_are_read_as_pairs(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    real = str(tmp_path / "real")
    assert parse_binds([real, (str(tmp_path / "link"), "/opt/t/")]) == (
        (real, real), (real, "/opt/t"))
    # A link named alone: its target is bound, at the link's path.
    assert parse_binds([str(tmp_path / "link")]) == ((real, str(tmp_path / "link")),)


@pytest.mark.parametrize(("binds", "message"), [
    ("/usr", "expected a list of paths"),
    ([("/usr",)], r"expected a path or a \(source, target\) pair"),
    ([("/usr", "opt/x")], "is not an absolute path"),
    ([("/no/such/dir", "/opt/x")], "is not a directory"),
    (["/etc/hostname"], "is not a directory"),
])
def test_a_malformed_bind_is_a_value_error(binds: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_binds(binds)  # type: ignore[arg-type]


@pytest.mark.parametrize(("etc", "message"), [
    (["/usr/share/zoneinfo"], "not a path below /etc"),
    (["/etc"], "not a path below /etc"),
    (["/etc/passwd"], "makes its own"),
    (["/etc/hosts"], "makes its own"),
    (["/etc/no-such-entry"], "does not exist"),
])
def test_a_malformed_etc_entry_is_a_value_error(etc: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_etc(etc)


BOUND = ["/usr", "/bin", "/lib", "/opt/py"]


@pytest.mark.parametrize(("bind", "clash"), [
    (("/x", "/"), "whole root"),
    (("/x", "/proc"), "own /proc"),
    (("/x", "/proc/sys"), "own /proc"),
    (("/x", "/dev"), "own /dev"),
    (("/x", "/etc"), "own /etc"),
    (("/x", "/etc/ssl"), "own /etc"),
    (("/x", "/tmp"), "own /tmp"),
    (("/x", "/home"), f"own {WORKDIR}"),
    (("/x", WORKDIR + "/bin"), f"own {WORKDIR}"),
    (("/x", "/sys"), "own /sys/fs/cgroup"),
    (("/home", "/home"), f"own {WORKDIR}"),
    (("/x", "/usr"), "overlaps /usr"),
    (("/x", "/usr/local/x"), "overlaps /usr"),
    (("/x", "/opt"), "overlaps /opt/py"),
])
def test_a_bind_that_would_shadow_the_jails_paths_is_refused(
        bind: tuple[str, str], clash: str) -> None:
    refusal = shadow_refusal([bind], built_paths(), BOUND)
    assert refusal is not None
    assert clash in refusal


@pytest.mark.parametrize("binds", [
    [("/opt/rust", "/opt/rust")],
    [("/x", "/opt/rust")],
    [("/x", "/tmp/x")],  # in the scratch /tmp, as an import path may be
    [("/usr/lib/jvm", "/usr/lib/jvm")],  # at its own path in /usr: the same files
    [("/opt/py", "/opt/py"), ("/opt", "/opt")],  # nested at their own paths: bound once
])
def test_a_bind_that_shadows_nothing_is_planned(binds: list[tuple[str, str]]) -> None:
    assert shadow_refusal(binds, built_paths(), BOUND) is None


def test_two_moved_binds_may_not_overlap() -> None:
    refusal = shadow_refusal([("/a", "/opt/t"), ("/b", "/opt/t/sub")], built_paths(), BOUND)
    assert refusal is not None
    assert "overlaps /opt/t" in refusal


# -- who may write a bind (as root) ----------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    top = tmp_path / "tool"
    (top / "bin").mkdir(parents=True)
    (top / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    (top / "bin" / "tool").chmod(0o755)
    (top / "link").symlink_to("/etc/shadow")  # a link's own mode means nothing
    return top


@pytest.mark.skipif(not ROOT, reason="the tree must be root's: as root only")
def test_a_tree_only_root_can_write_is_accepted(tree: Path) -> None:
    assert writer_refusal(str(tree)) is None


@pytest.mark.skipif(not ROOT, reason="the tree must be root's: as root only")
@pytest.mark.parametrize(("where", "change"), [
    ("bin/tool", "g+w"),
    ("bin", "o+w"),
    ("bin", "chown"),
    (".", "o+w"),
    ("..", "o+w"),  # a parent, not sticky
    ("..", "chown"),
])
def test_a_tree_another_user_could_write_is_refused(tree: Path, where: str, change: str) -> None:
    path = (tree / where).resolve()
    st = path.stat()
    if change == "chown":
        os.chown(path, 65534, 65534)
    else:
        path.chmod(st.st_mode | (stat.S_IWGRP if change == "g+w" else stat.S_IWOTH))
    refusal = writer_refusal(str(tree))
    assert refusal is not None
    assert f"{path} (uid" in refusal


def test_not_root_the_callers_own_tree_is_never_roots(tree: Path) -> None:
    """As uid 65534 the walk refuses (the tree is not root's), but a
    non-root Runner never asks it: the bind is only as fixed as its caller
    keeps it (docs/toolchains.md)."""
    if ROOT:
        os.chown(tree, 65534, 65534)
    refusal = writer_refusal(str(tree))
    assert refusal is not None
    assert f"{tree} (uid 65534" in refusal


# -- Runner: the refusals, with their reason -----------------------------------------


@pytest.mark.parametrize("target", ["/proc", "/etc", "/dev", "/tmp", WORKDIR, "/", "/usr"])
def test_runner_refuses_a_shadowing_bind(jail_root: Path, tree: Path, target: str) -> None:
    with pytest.raises(RunnerError) as e:
        make_runner(temp_root=str(jail_root), binds=[(str(tree), target)])
    assert e.value.reason == Reason.SANDBOX_SETUP
    assert f"bind {tree} on {target}:" in e.value.detail


@pytest.mark.skipif(not ROOT, reason="as root only: not root, a bind is the caller's")
def test_runner_as_root_refuses_a_bind_another_user_can_write(
        jail_root: Path, tree: Path) -> None:
    (tree / "bin").chmod(0o777)
    with pytest.raises(RunnerError) as e:
        make_runner(temp_root=str(jail_root), binds=[str(tree)])
    assert e.value.reason == Reason.SANDBOX_SETUP
    assert f"{tree}/bin (uid 0, mode 0777)" in e.value.detail


def test_a_bind_is_in_the_rules_version_by_path_not_contents(
        jail_root: Path, tree: Path) -> None:
    plain = make_runner(temp_root=str(jail_root)).rules_version()
    bound = make_runner(temp_root=str(jail_root), binds=[str(tree)])
    moved = make_runner(temp_root=str(jail_root), binds=[(str(tree), "/opt/tool")])
    versions = {plain, bound.rules_version(), moved.rules_version()}
    assert len(versions) == 3
    (tree / "bin" / "tool").write_text("#!/bin/sh\necho changed\n")
    (tree / "new").mkdir()
    again = make_runner(temp_root=str(jail_root), binds=[str(tree)])
    assert again.rules_version() == bound.rules_version()
    # read+exec, not read-only: another version than an import path's.
    imported = make_runner(temp_root=str(jail_root), import_paths=[str(tree)])
    assert imported.rules_version() not in versions


# -- a toolchain of the test's own: exec from a bind, at its path and moved ----------


@pytest.fixture
def toolchain(tmp_path: Path) -> Iterator[Path]:
    """A compiled program and a script calling it, outside /usr and outside
    /tmp: in the jail a bind below /tmp inherits the exec right of the
    scratch /tmp's Landlock rule, whatever its own."""
    if shutil.which("cc") is None:
        pytest.skip("no cc on this host")
    top = Path(tempfile.mkdtemp(prefix="trunner-chain-", dir="/var/tmp"))
    try:
        (top / "bin").mkdir()
        src = tmp_path / "hello.c"
        src.write_text('#include <stdio.h>\nint main(void){puts("hello from a bind");return 0;}\n')
        subprocess.run(["cc", "-o", str(top / "bin" / "hello"), str(src)], check=True)
        (top / "bin" / "wrap").write_text('#!/bin/sh\nexec "$(dirname "$0")/hello"\n')
        (top / "bin" / "wrap").chmod(0o755)
        top.chmod(0o755)
        yield top
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("moved", [False, True], ids=["own-path", "at-/opt/chain"])
async def test_a_bound_toolchain_runs(jail_root: Path, toolchain: Path, moved: bool) -> None:
    where = "/opt/chain" if moved else str(toolchain)
    runner = make_runner(temp_root=str(jail_root),
                         binds=[(str(toolchain), where)] if moved else [str(toolchain)])
    r = (await runner.exec([f"{where}/bin/wrap"])).response
    assert (r.exit_code, r.stdout, r.stderr) == (0, b"hello from a bind\n", b"")
    # As an import path the same tree is read-only without exec: 126, as before.
    imported = make_runner(temp_root=str(jail_root), import_paths=[str(toolchain)])
    r = (await imported.exec([f"{toolchain}/bin/hello"])).response
    assert r.exit_code == 126
    assert b"Permission denied" in r.stderr


async def test_a_jdk_moved_out_of_usr_compiles_and_runs(jail_root: Path) -> None:
    """A self-contained JDK (Temurin: no /etc links) at a path outside /usr."""
    jdks = sorted(Path("/usr/lib/jvm").glob("temurin-*"))
    if not jdks:
        pytest.skip("no Temurin JDK under /usr/lib/jvm on this host")
    runner = make_runner(temp_root=str(jail_root), binds=[(str(jdks[-1]), "/opt/jdk")],
                         limits=TOOL_LIMITS)
    r = (await runner.exec(["sh", "-c", "/opt/jdk/bin/javac Main.java && /opt/jdk/bin/java Main"],
                           files={"Main.java": JAVA_MAIN})).response
    assert (r.exit_code, r.stdout) == (0, b"hello 0\n"), r.stderr


# -- rustup's rustc and pyenv's interpreters ------------------------------------------


async def test_rustup_rustc_compiles_and_runs_in_the_jail(jail_root: Path) -> None:
    for path in (RUSTUP, CARGO):
        reason = unreadable(path)
        if reason is not None:
            pytest.skip(reason)
    runner = make_runner(temp_root=str(jail_root), binds=[str(RUSTUP), str(CARGO)],
                         limits=TOOL_LIMITS)
    # rustup's proxy (~/.cargo/bin/rustc) finds its toolchain through RUSTUP_HOME.
    env = {"PATH": f"{CARGO}/bin:/usr/bin:/bin", "RUSTUP_HOME": str(RUSTUP),
           "CARGO_HOME": str(CARGO)}
    r = (await runner.exec(["sh", "-c", "rustc -O main.rs && ./main"], env=env,
                           files={"main.rs": b'fn main() { println!("rust {}", 6 * 7); }'}
                           )).response
    assert (r.exit_code, r.stdout) == (0, b"rust 42\n"), r.stderr[-2000:]


def pyenv_version() -> Path | None:
    """A pyenv interpreter that is not the one running the tests."""
    prefix = os.path.realpath(sys.base_prefix)
    found = sorted(p for p in PYENV.glob("3.*") if str(p) != prefix) if PYENV.is_dir() else []
    return found[0] if found else None


async def test_pyenv_interpreter_runs_in_the_jail(jail_root: Path) -> None:
    reason = unreadable(PYENV)
    if reason is not None:
        pytest.skip(reason)
    version = pyenv_version()
    if version is None:
        pytest.skip("no pyenv interpreter but the one running the tests")
    runner = make_runner(temp_root=str(jail_root), binds=[str(version)])
    r = (await runner.exec([f"{version}/bin/python3", "-c",
                            "import sys, ssl; print(sys.prefix, 6 * 7)"])).response
    assert (r.exit_code, r.stdout) == (0, f"{version} 42\n".encode()), r.stderr


#: The caller for a non-root run: one exec with `binds`, its result as JSON.
BIND_CALLER = """
import json, trio
from trunner import Limits, Runner
from trunner.linux.backend import LinuxBackend
from trunner.worker import locate_worker
argv, binds, temp_root, cap = json.loads({args!r})

async def main():
    binds_ = [tuple(b) for b in binds]
    if cap is None:
        runner = Runner(temp_root=temp_root, binds=binds_)
    else:
        runner = Runner(temp_root=temp_root, backend=LinuxBackend(
            locate_worker(), landlock_abi=cap, binds=binds_))
    r = (await runner.exec(argv)).response
    print(json.dumps([r.exit_code, r.stdout.decode(), r.stderr.decode()[-2000:]]))

trio.run(main)
"""


def test_pyenv_interpreter_runs_for_a_non_root_caller() -> None:
    """As a non-root caller (from root: an unused uid, through setpriv), a
    pyenv interpreter copied where that uid can read it (~/.pyenv is in
    root's mode-700 home), bound at the prefix it was built for: its
    libpython is found through an absolute RPATH (at /opt/py: exit 127)."""
    from installed import run_caller, temp_install, unused_id, world_python

    from conftest import landlock_cap

    if not ROOT:
        pytest.skip("a caller of another uid needs root to start it")
    version = pyenv_version()
    python = world_python()
    if version is None or python is None:
        pytest.skip("no pyenv interpreter, or none of this Python's version any uid can run")
    install = temp_install(python)
    try:
        copy = install / "pyenv" / version.name
        shutil.copytree(version, copy, symlinks=True)
        subprocess.run(["chmod", "-R", "a+rX", str(install / "pyenv")], check=True)
        temp_root = Path(tempfile.mkdtemp(prefix="jails-", dir=install))
        temp_root.chmod(0o1777)
        argv = [f"{version}/bin/python3", "-c", "import sys, ssl; print(sys.prefix, 6 * 7)"]
        args = [argv, [[str(copy), str(version)]], str(temp_root), landlock_cap()]
        out = run_caller(install, BIND_CALLER.format(args=json.dumps(args)), uid=unused_id())
        assert list(temp_root.iterdir()) == [], "the caller left a jail dir behind"
    finally:
        shutil.rmtree(install)
    assert out == [0, f"{version} 42\n", ""]


# -- the /etc runtimes need ----------------------------------------------------------

JAVA_MAIN = b"""public class Main {
    public static void main(String[] args) throws Exception {
        System.out.println("hello " + new java.security.SecureRandom().nextInt(1));
    }
}
"""


@pytest.mark.parametrize("how", ["javac", "java Main.java", "javac+java"])
async def test_openjdk_compiles_and_runs_with_the_default_etc(jail_root: Path, how: str) -> None:
    """Debian's OpenJDK links conf/security/java.security into /etc/java-17-openjdk:
    before, each died `InternalError: Error loading java.security file`."""
    if shutil.which("javac") is None:
        pytest.skip("no javac on this host")
    argv = {"javac": ["javac", "Main.java"], "java Main.java": ["java", "Main.java"],
            "javac+java": ["sh", "-c", "javac Main.java && java Main"]}[how]
    runner = make_runner(temp_root=str(jail_root), limits=TOOL_LIMITS)
    r = (await runner.exec(argv, files={"Main.java": JAVA_MAIN}, collect=["*.class"])).response
    assert r.exit_code == 0, r.stderr[-2000:]
    assert b"java.security" not in r.stderr
    assert r.stdout == (b"" if how == "javac" else b"hello 0\n")
    assert [f.path for f in r.files] == ([] if how == "java Main.java" else ["Main.class"])


async def test_etc_entries_of_the_callers(jail_root: Path) -> None:
    """`etc=` adds host entries; a symlink stays a link, resolved in the jail
    (/etc/mtab: the jail's own /proc/mounts, not the host's)."""
    if not os.path.isfile("/etc/debian_version") or not os.path.islink("/etc/mtab"):
        pytest.skip("no /etc/debian_version or /etc/mtab link on this host")
    code = """
        result = [attempt(lambda: open("/etc/debian_version").read()),
                  os.readlink("/etc/mtab") if os.path.islink("/etc/mtab") else "absent",
                  attempt(lambda: " /home/trunner " in open("/etc/mtab").read())]
    """
    runner = make_runner(temp_root=str(jail_root), import_paths=[os.path.dirname(__file__)])
    assert await run_code(runner, code) == ["ENOENT", "absent", "ENOENT"]
    runner = make_runner(temp_root=str(jail_root), import_paths=[os.path.dirname(__file__)],
                         etc=["/etc/debian_version", "/etc/mtab"])
    version = Path("/etc/debian_version").read_text()
    assert await run_code(runner, code) == [f"OK:{version!r}", os.readlink("/etc/mtab"),
                                            "OK:True"]


def test_the_docs_block_runs_as_written(tmp_path: Path) -> None:
    """docs/toolchains.md's program, as written: rustup's rustc where this
    uid has ~/.rustup, else its own message."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "toolchains.md").read_text()
    (block,) = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)
    (tmp_path / "toolchains.py").write_text(block)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "toolchains.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=scaled(300), check=False)
    assert done.returncode == 0, done.stderr
    home = Path(os.path.expanduser("~"))
    rustup = unreadable(home / ".rustup") is None and unreadable(home / ".cargo") is None
    assert done.stdout == ("0 b'42\\n'\n" if rustup else "no rustup here\n")
