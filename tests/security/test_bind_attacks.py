"""A bound toolchain (`Runner(binds=...)`) is as fixed as every other bind:
a jailed program cannot write, rename, unlink or mount over it, nor any
directory above it, at its own path or moved, in /tmp or not; a socket in
it is masked where the jail sees it; its Landlock rule is read+exec at the
test run's ABI (`.ci/run` runs this module at 1, 3, 4 and 6). The host's
tree is the same afterwards."""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conftest import TESTS_DIR, landlock_abi_in_force, make_runner
from support import run_code
from trunner.linux import landlock

if TYPE_CHECKING:
    from collections.abc import Iterator


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p): (p.lstat().st_mode, b"" if p.is_dir() else p.read_bytes())
            for p in [root, *root.rglob("*")] if not p.is_symlink()}


@pytest.fixture(params=["/var/tmp", "/tmp"])
def chain(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tree to bind: a file, a script, a subdir, outside /tmp and in it."""
    top = Path(tempfile.mkdtemp(prefix="trunner-bound-", dir=request.param))
    try:
        (top / "bin").mkdir()
        (top / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
        (top / "bin" / "tool").chmod(0o755)
        (top / "data.txt").write_text("host data")
        top.chmod(0o755)
        yield top
    finally:
        shutil.rmtree(top)


ATTACK = """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    def mount_over(target):
        if libc.mount(b"none", target.encode(), b"tmpfs", 0, None) == 0:
            return "OK"
        return errno.errorcode[ctypes.get_errno()]
    top = TOP
    open("/home/trunner/f", "w").close()
    result = {
        "create": attempt(lambda: os.close(os.open(top + "/new", os.O_CREAT | os.O_WRONLY))),
        "truncate": attempt(lambda: open(top + "/data.txt", "w").close()),
        "append": attempt(lambda: open(top + "/data.txt", "a").write("x")),
        "unlink": attempt(lambda: os.unlink(top + "/data.txt")),
        "rename in": attempt(lambda: os.rename(top + "/bin/tool", top + "/bin/t2")),
        "rename out": attempt(lambda: os.rename(top + "/data.txt", "/tmp/stolen")),
        "replace": attempt(lambda: os.rename("/home/trunner/f", top + "/bin/tool")),
        "rmdir": attempt(lambda: os.rmdir(top + "/bin")),
        "mkdir": attempt(lambda: os.mkdir(top + "/d")),
        "symlink": attempt(lambda: os.symlink("/etc", top + "/l")),
        "link out": attempt(lambda: os.link(top + "/data.txt", "/home/trunner/h")),
        "chmod": attempt(lambda: os.chmod(top + "/bin/tool", 0o777)),
        "utime": attempt(lambda: os.utime(top + "/data.txt", (0, 0))),
        "mount over": mount_over(top),
        "mount in": mount_over(top + "/bin"),
        "run": os.popen(top + "/bin/tool").read(),
    }
    path = top
    while path != "/":
        result["rename " + path] = attempt(lambda: os.rename(path, path + ".moved"))
        path = os.path.dirname(path)
"""

#: What each attempt may answer: the bind is a read-only mount (EROFS), a
#: mount point (EBUSY), across mounts (EXDEV), or Landlock's or seccomp's
#: refusal (EACCES, EPERM); never OK.
REFUSED = {"EROFS", "EBUSY", "EXDEV", "EACCES", "EPERM"}


@pytest.mark.parametrize("moved", [False, True], ids=["own-path", "moved"])
async def test_a_bind_resists_every_change_from_inside(
        jail_root: Path, chain: Path, moved: bool) -> None:
    target = "/opt/chain" if moved else str(chain)
    runner = make_runner(import_paths=[TESTS_DIR], temp_root=str(jail_root),
                         binds=[(str(chain), target)])
    before = _snapshot(chain)
    result = await run_code(runner, ATTACK.replace("TOP", repr(target)))
    assert result.pop("run") == "tool\n"
    assert set(result.values()) <= REFUSED, result
    assert f"rename {target}" in result
    assert "rename /opt" in result if moved else f"rename {chain.parent}" in result
    assert _snapshot(chain) == before
    assert not Path("/tmp/stolen").exists()


async def test_a_socket_in_a_moved_bind_is_masked(jail_root: Path, chain: Path) -> None:
    """A host server's socket inside the tree: at the bind's target the jail
    finds an empty file (docs/jail.md, pathname unix sockets), and the
    server is never reached."""
    path = chain / "bin" / "srv.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen()
        server.setblocking(False)
        runner = make_runner(import_paths=[TESTS_DIR], temp_root=str(jail_root),
                             binds=[(str(chain), "/opt/chain")])
        result = await run_code(runner, """
            import socket, stat
            def connect():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect("/opt/chain/bin/srv.sock")
                finally:
                    s.close()
            result = [attempt(connect),
                      stat.S_ISSOCK(os.lstat("/opt/chain/bin/srv.sock").st_mode)]
        """)
        # An empty read-only file over it: connect needs write permission.
        assert result == ["EACCES", False]
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_a_bind_is_read_and_exec_under_landlock_at_the_runs_abi(chain: Path) -> None:
    """The plan's Landlock rule for the target: read+exec at the ABI in force
    (TRUNNER_TEST_LANDLOCK_ABI), no write right of any ABI."""
    abi = landlock_abi_in_force()
    runner = make_runner(binds=[(str(chain), "/opt/chain")])
    plan: dict[str, Any] = runner.backend.rules_document(runner.limits)["plan"]  # type: ignore[assignment]
    rules = {rule["path"]: rule["dir_access"] for rule in plan["landlock"]["paths"]}
    assert plan["landlock"]["abi"] == abi
    assert rules["/opt/chain"] == landlock.rx_access(abi)
    assert not rules["/opt/chain"] & landlock.rw_access(abi) & ~landlock.rx_access(abi)
    assert landlock.rx_access(abi) & landlock.ACCESS_FS_EXECUTE
    binds = [op for op in plan["root_ops"] if op["op"] == "bind" and op["path"] == "/opt/chain"]
    assert binds == [{"op": "bind", "source": str(chain), "path": "/opt/chain", "flags": 0}]
