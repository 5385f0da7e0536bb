"""An image as the jail's system root (`Runner(root=DIR)`, issue 36): a
busybox tree built here, with a musl-linked program and its loader copied
in (a libc other than the host's glibc), runs a cold exec, the built-in
modes, a user mode and pooled runs; the program cannot write the image,
reach host paths beyond what is bound, or see LD_LIBRARY_PATH; the image's
/etc/ld.so.preload never reaches the host's interpreter; the refusals say
how to fix them. No test downloads an image."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from conftest import TESTS_DIR, make_runner
from support import run_code, scaled
from trunner import Limits, RunnerError
from trunner.errors import Reason
from trunner.linux.image import ImageRefusal, elf_interp_and_runpath

if TYPE_CHECKING:
    from trunner import Runner

BUSYBOX = Path("/usr/bin/busybox")
MUSL_LOADER = Path("/lib/ld-musl-x86_64.so.1")
STATEMENT = "busybox test image, built by tests/test_image.py"
LIMITS = Limits(wall_time_s=scaled(20.0))


def _is_static(path: Path) -> bool:
    try:
        elf_interp_and_runpath(str(path))
    except ImageRefusal:
        return True
    return False


pytestmark = pytest.mark.skipif(
    not BUSYBOX.exists() or not _is_static(BUSYBOX),
    reason="no static /usr/bin/busybox (apt-get install busybox-static)")

#: A musl program: its loader from /proc/self/maps (the image's, not the
#: host's), and whether it was given LD_LIBRARY_PATH.
MUSL_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    const char *l = getenv("LD_LIBRARY_PATH");
    char line[512];
    FILE *maps = fopen("/proc/self/maps", "r");
    const char *loader = "?";
    static char found[512];
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "ld-musl")) {
            strcpy(found, strrchr(line, ' ') + 1);
            loader = found;
            break;
        }
    printf("LD_LIBRARY_PATH=%s\nloader %s", l ? l : "(unset)", loader);
    return 0;
}
"""
#: A glibc library that ends any process it is preloaded into, exit 97.
PRELOAD_EXIT = r"""
#include <unistd.h>
__attribute__((constructor)) static void end(void) { _exit(97); }
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/busybox and a link for each applet; usr/bin/musl-env and
    lib/ld-musl-x86_64.so.1 (where musl-gcc is); lib/preload-exit.so named
    by the image's /etc/ld.so.preload (where gcc is); an /etc of its own;
    a planted /.trunner/host/planted the jail must not show."""
    root = tmp_path_factory.mktemp("image") / "img"
    for d in ("bin", "etc", "lib", "usr/bin", ".trunner/host"):
        (root / d).mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, check=True,
                             text=True).stdout.split()
    for name in applets:
        if name != "busybox":
            (root / "bin" / name).symlink_to("busybox")
    (root / "sbin").symlink_to("bin")
    (root / "etc" / "os-release").write_text("ID=trunner-test-image\n")
    (root / "etc" / "passwd").write_text("root:x:0:0:image root:/root:/bin/sh\n")
    (root / ".trunner" / "host" / "planted").write_text("planted by the image\n")
    build = tmp_path_factory.mktemp("build")
    if shutil.which("musl-gcc") and MUSL_LOADER.exists():
        (build / "musl.c").write_text(MUSL_PROGRAM)
        subprocess.run(["musl-gcc", "-O1", "-o", str(root / "usr/bin/musl-env"),
                        str(build / "musl.c")], check=True)
        shutil.copy(MUSL_LOADER, root / "lib" / MUSL_LOADER.name)  # the file, not the link
    if shutil.which("gcc"):
        (build / "preload.c").write_text(PRELOAD_EXIT)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(root / "lib/preload-exit.so"),
                        str(build / "preload.c")], check=True)
        (root / "etc" / "ld.so.preload").write_text("/lib/preload-exit.so\n")
    return root


def has_musl(image: Path) -> bool:
    return (image / "usr/bin/musl-env").exists()


@pytest.fixture
def runner(image: Path, jail_root: Path) -> Runner:
    return make_runner(root=str(image), root_statement=STATEMENT, import_paths=[TESTS_DIR],
                       temp_root=str(jail_root), limits=LIMITS)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry below `root`: its size and mtime (ns), links not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


# -- it runs -------------------------------------------------------------------------


async def test_a_busybox_image_runs_sh_c(runner: Runner) -> None:
    result = await runner.exec(["sh", "-c", "echo $((6 * 7)); cat /etc/os-release; id -u;"
                                " grep -c . /etc/passwd; head -1 /etc/passwd; ls /"])
    r = result.response
    assert (r.exit_code, r.stderr) == (0, b"")
    lines = r.stdout.decode().splitlines()
    assert lines[:3] == ["42", "ID=trunner-test-image", "1000"]
    # The jail's passwd (its user and nobody) over the image's.
    assert lines[3:5] == ["2", "trunner:x:1000:1000:trunner:/home/trunner:/bin/sh"]
    assert {"bin", "etc", "lib", "usr", "sbin", "proc", "dev", "tmp", "home"} <= set(lines[5:])


async def test_a_dynamically_linked_program_of_the_image_runs_on_its_libc(
        runner: Runner, image: Path) -> None:
    if not has_musl(image):
        pytest.skip("no musl-gcc or /lib/ld-musl-x86_64.so.1 here (apt-get install musl-tools)")
    r = (await runner.exec(["musl-env"])).response
    assert (r.exit_code, r.stderr) == (0, b"")
    # Its loader is the image's musl (the host's is glibc), and no library
    # path was handed down from the adapter's start.
    assert r.stdout.decode().splitlines() == ["LD_LIBRARY_PATH=(unset)",
                                              "loader /lib/ld-musl-x86_64.so.1"]


async def test_echo_and_a_user_mode_run_on_the_image(runner: Runner) -> None:
    assert (await runner.run("echo", {"a": [1, 2]})).response == {"a": [1, 2]}
    got = await run_code(runner, """
import platform, sys, trunner
result = {"executable": sys.executable, "trunner": trunner.__file__,
          "env": sorted(os.environ), "libc": platform.libc_ver()[0],
          "os_release": open("/etc/os-release").read(),
          "preload": open("/etc/ld.so.preload").read()}
""")
    assert got["executable"].startswith("/.trunner/"), got
    assert got["trunner"].startswith("/.trunner/host/"), got
    assert got["env"] == ["HOME", "LANG", "PATH", "PYTHONPATH", "TMPDIR"]
    assert got["libc"] == "glibc"  # the host's interpreter, on its own libc
    assert got["os_release"] == "ID=trunner-test-image\n"
    assert got["preload"] == ""


async def test_pooled_runs_on_the_image(runner: Runner, image: Path) -> None:
    """The exec and echo modes are served in-process by the fork server's
    pid 2 (its imports rebased under /.trunner/host); a user mode is exec'd."""
    async with runner.pool("exec", size=1) as pool:
        for _ in range(2):
            argv = ["musl-env"] if has_musl(image) else ["sh", "-c", "echo (unset)"]
            r = (await pool.exec(argv)).response
            assert r.exit_code == 0, r
            assert b"(unset)" in r.stdout
        # The exec adapter imports struct and fnmatch on first use: found
        # under the host prefix (without the rebase: ModuleNotFoundError).
        r = (await pool.exec(["sh", "-c", "echo x > out.txt"], collect=["*.txt"])).response
        assert r.exit_code == 0
        assert [(f.path, f.data) for f in r.files] == [("out.txt", b"x\n")]
    async with runner.pool("echo", size=1) as pool:
        assert (await pool.run([3])).response == [3]
    async with runner.pool("children:run_code", size=1) as pool:
        code = "import sys\nresult = sys.prefix"
        from support import PRELUDE
        assert (await pool.run(PRELUDE + code)).response.startswith("/.trunner/")


# -- what it cannot do ---------------------------------------------------------------


async def test_the_program_cannot_write_the_image(runner: Runner, image: Path) -> None:
    before = tree(image)
    script = ("for f in /bin/new /bin/busybox /usr/bin/new /etc/new /etc/os-release /lib/x"
              " /.trunner/new /.trunner/host/new /.trunner/etc/passwd /new; do"
              " if echo x >> $f; then echo WROTE $f; fi; done; mkdir /bin/d && echo MADE;"
              " rm /bin/sh && echo REMOVED; echo done")
    r = (await runner.exec(["sh", "-c", script])).response
    assert r.stdout == b"done\n", r
    assert r.stderr.count(b"Read-only file system") >= 10, r.stderr
    assert tree(image) == before
    assert (image / "etc/os-release").read_text() == "ID=trunner-test-image\n"


async def test_the_program_reaches_no_host_path_beyond_the_binds(
        runner: Runner, image: Path) -> None:
    """Of the host: only its code, read-only, under /.trunner/host (the
    image's own /.trunner never shows); no exec there but the loader
    (Landlock); not the image's host path, its parent, nor the host's
    /etc."""
    import trunner

    bound = (os.path.dirname(os.path.dirname(os.path.abspath(trunner.__file__))), sys.prefix,
             sys.base_prefix, os.path.realpath(sys.executable))
    # A host dir none of trunner's own paths lies in (the checkout may be in /work or /tmp).
    unbound = next(d for d in ("/var", "/srv", "/boot", "/mnt", "/work")
                   if os.path.isdir(d) and not any(p.startswith(d + "/") for p in bound))
    got = await run_code(runner, f"""
import sys
paths = [{str(image)!r}, {str(image.parent)!r}, "/.trunner/host/etc", "/.trunner/host/planted",
         "/.trunner/host" + {unbound!r}, {sys.prefix!r} + "/pyvenv.cfg", "/etc/shadow"]
result = {{"exists": [p for p in paths if os.path.lexists(p)],
          "top": sorted(os.listdir("/.trunner/host")),
          "root": sorted(os.listdir("/.trunner"))}}
""")
    assert got["exists"] == []
    assert got["root"] == ["etc", "host", "venv"] if sys.prefix != sys.base_prefix else [
        "etc", "host"]
    # Top dirs of what trunner binds (the checkout may be anywhere: CI's is /check/...).
    tops = {p.split("/")[1] for p in (*bound, "/usr")}
    assert set(got["top"]) <= tops | {"lib", "lib64"}, (got["top"], bound)
    assert "usr" in got["top"]
    r = (await runner.exec(["sh", "-c", "/.trunner/host/usr/bin/true; echo $?;"
                            " cat /.trunner/host/planted; echo $?"])).response
    assert r.stdout == b"126\n1\n", r  # Landlock: no exec of the host's /usr


async def test_a_socket_in_the_image_is_masked(image: Path, jail_root: Path,
                                             tmp_path: Path) -> None:
    """A host server's socket inside the image's tree: at its jail path the
    program finds an empty file, and the server is never reached."""
    copy = tmp_path / "img"
    shutil.copytree(image, copy, symlinks=True)
    path = copy / "usr" / "srv.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen()
        server.setblocking(False)
        runner = make_runner(root=str(copy), root_statement=STATEMENT,
                             import_paths=[TESTS_DIR], temp_root=str(jail_root), limits=LIMITS)
        result = await run_code(runner, """
            import socket, stat
            def connect():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect("/usr/srv.sock")
                finally:
                    s.close()
            result = [attempt(connect), stat.S_ISSOCK(os.lstat("/usr/srv.sock").st_mode)]
        """)
        assert result == ["EACCES", False]  # an empty read-only file over it
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


async def test_the_image_ld_so_preload_never_reaches_the_host_interpreter(
        runner: Runner, image: Path) -> None:
    """The image names a library that ends any process it loads into (exit
    97): the jail's /etc/ld.so.preload is empty, so the adapter (the host's
    interpreter, on glibc) runs; the image's file is untouched."""
    if not (image / "etc/ld.so.preload").exists():
        pytest.skip("no gcc here to build the preloaded library")
    assert (await runner.run("echo", "alive")).response == "alive"
    r = (await runner.exec(["sh", "-c", "wc -c < /etc/ld.so.preload"])).response
    assert r.stdout.strip() == b"0"
    assert (image / "etc/ld.so.preload").read_text() == "/lib/preload-exit.so\n"


# -- the rules version and the refusals --------------------------------------------


def test_the_rules_version_covers_the_root_and_its_statement(
        image: Path, tmp_path: Path) -> None:
    def version(root: Path | None, statement: str | None = STATEMENT) -> str:
        if root is None:
            return make_runner(limits=LIMITS).rules_version()
        return make_runner(root=str(root), root_statement=statement,
                           limits=LIMITS).rules_version()

    base = version(image)
    (tmp_path / "link").symlink_to(image)
    assert version(tmp_path / "link") == base  # resolved: the same tree
    assert version(image, STATEMENT + " v2") != base
    assert version(None) != base
    other = tmp_path / "other"
    shutil.copytree(image, other, symlinks=True)
    os.chmod(tmp_path, 0o755)
    assert version(other) != base


def test_a_root_without_a_statement_is_a_value_error(image: Path) -> None:
    with pytest.raises(ValueError, match="root_statement"):
        make_runner(root=str(image))


@pytest.mark.parametrize(("options", "detail"), [
    ({"etc": ["/etc/os-release"]}, "put the entries in the image's /etc"),
    ({"binds": [("/usr", "/bin")]}, "shadow the jail's own /bin"),
    ({"binds": [("/usr", "/usr/lib/nothing")]}, "make that directory in the image"),
    ({"binds": [("/usr", "/.trunner/x")]}, "/.trunner"),
    ({"import_paths": ["/usr/share"]}, "make that directory in the image"),
])
def test_what_an_image_cannot_hold_is_refused(
        image: Path, options: dict[str, list[str] | list[tuple[str, str]]],
        detail: str) -> None:
    with pytest.raises(RunnerError) as info:
        make_runner(root=str(image), root_statement=STATEMENT, **options)  # type: ignore[arg-type]
    assert info.value.reason == Reason.SANDBOX_SETUP
    assert detail in info.value.detail


def test_an_image_without_etc_or_at_an_unmountable_path_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    with pytest.raises(RunnerError) as info:
        make_runner(root=str(bare), root_statement=STATEMENT)
    assert info.value.reason == Reason.SANDBOX_SETUP
    assert f"mkdir {bare}/etc" in info.value.detail
    colon = tmp_path / "a:b"
    (colon / "etc").mkdir(parents=True)
    with pytest.raises(RunnerError) as info:
        make_runner(root=str(colon), root_statement=STATEMENT)
    assert "cannot be mounted" in info.value.detail


def test_the_docs_block_runs_as_written(tmp_path: Path) -> None:
    """docs/images.md's program, as written."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "images.md").read_text()
    (block,) = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)
    (tmp_path / "images.py").write_text(block)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "images.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=scaled(120), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0 b'42\\n'\n"


def test_a_backend_with_a_root_never_plans_on_the_hosts(image: Path) -> None:
    """Asked before `check()`, a backend with `root=` checks the image
    first: its plan and its adapter are the image's."""
    from trunner.linux.backend import LinuxBackend
    from trunner.worker import locate_worker

    backend = LinuxBackend(locate_worker(), root=str(image), root_statement=STATEMENT)
    document = backend.rules_document(LIMITS)
    assert document["root"]["path"] == str(image)
    backend = LinuxBackend(locate_worker(), root=str(image), root_statement=STATEMENT)
    assert "--inhibit-cache" in backend.adapter_argv("echo", builtin=True)


async def test_a_session_on_an_image(runner: Runner, image: Path) -> None:
    """A session's jail on the image: its commands join it (the image's
    root, its scratch), files stay across them, the files API works there
    (the adapter on the host's interpreter under /.trunner/host)."""
    before = tree(image)
    async with runner.session() as s:
        await s.write_files({"note": b"from the files API\n"})
        first = (await s.exec(["sh", "-c", "cat note; echo kept > f; cat /etc/os-release"])
                 ).response
        second = (await s.exec(["cat", "f"])).response
        entries = await s.read_files(["f"])
    assert first.stdout == b"from the files API\nID=trunner-test-image\n", first
    assert second.stdout == b"kept\n"
    assert [e.data for e in entries] == [b"kept\n"]
    assert tree(image) == before
