"""The Linux jail, layer by layer: each test is a child that tries the
forbidden thing, and each asserts the reason and the side effect that did
not happen. Real kernel, real processes, the jail as shipped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio

from conftest import TESTS_DIR, child_pids, is_alive
from trunner import Reason, Runner, RunnerError
from trunner.linux.backend import probe_host


async def run_code(runner: Runner, code: str, **kw: Any) -> Any:
    return (await runner.run("children:run_code", textwrap.dedent(code), **kw)).response


async def denied(runner: Runner, code: str, **kw: Any) -> RunnerError:
    with pytest.raises(RunnerError) as info:
        await runner.run("children:run_code", textwrap.dedent(code), **kw)
    return info.value


def test_doctor_says_this_host_can_run() -> None:
    host = probe_host()
    assert host.can_run, host.refusal_detail
    assert host.landlock_abi >= 6 and host.seccomp_filter
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "trunner"), "doctor", "--json"],
        capture_output=True, timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert b'"can_run":true' in out.stdout


async def test_status_no_new_privs_seccomp_no_caps(runner: Runner) -> None:
    status = (await runner.run("children:status")).response
    text = status["status"]
    assert "NoNewPrivs:\t1" in text
    assert "Seccomp:\t2" in text
    assert "CapEff:\t0000000000000000" in text
    assert "CapBnd:\t0000000000000000" in text
    # Descriptor hygiene: only the runner's pipes (and the listing's own fd).
    assert set(status["fds"]) <= {0, 1, 2, 3}
    # A fresh process group and session of its own.
    assert status["pgid"] == status["pid"] == status["sid"]
    assert os.path.realpath(status["cwd"]).startswith(os.path.realpath(runner.temp_root or "/"))


async def test_parent_environment_is_not_inherited(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRUNNER_TEST_SECRET", "hunter2")
    status = (await runner.run("children:status")).response
    assert "TRUNNER_TEST_SECRET" not in status["environ"]
    assert "hunter2" not in repr(status["environ"])
    assert set(status["environ"]) == {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONPATH"}


async def test_inheritable_fd_is_not_open_in_the_child(runner: Runner, tmp_path: Path) -> None:
    fd = os.open(tmp_path / "secret", os.O_CREAT | os.O_RDWR)
    os.set_inheritable(fd, True)
    try:
        status = (await runner.run("children:status")).response
        assert fd not in status["fds"]
        assert set(status["fds"]) <= {0, 1, 2, 3}
    finally:
        os.close(fd)


async def test_tcp_connect_to_host_listener_fails_and_listener_sees_nothing(
    runner: Runner,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        e = await denied(runner, f"""
            import socket
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
        """)
        assert e.reason is Reason.SYSCALL_DENIED
        assert "socket" in e.detail
        with pytest.raises(BlockingIOError):
            listener.accept()


async def test_abstract_unix_socket_of_the_host_is_unreachable(runner: Runner) -> None:
    name = f"\0trunner-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(name)
        listener.listen()
        listener.setblocking(False)
        result = await run_code(runner, f"""
            import socket
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect({name!r})
                result = "connected"
            except OSError as e:
                result = e.errno
        """)
        assert result != "connected"
        with pytest.raises(BlockingIOError):
            listener.accept()


async def test_reading_a_file_outside_fails(runner: Runner, tmp_path: Path) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("top secret")
    result = await run_code(runner, f"""
        import errno
        out = []
        for fn in (lambda: open({str(secret)!r}).read(), lambda: __import__("os").listdir({str(secret.parent)!r}),
                   lambda: open("/etc/shadow").read(), lambda: open("/root/.bashrc").read()):
            try:
                out.append(fn())
            except OSError as e:
                out.append(errno.errorcode[e.errno])
        result = out
    """)
    assert result[:3] == ["EACCES", "EACCES", "EACCES"]
    assert result[3] in ("EACCES", "ENOENT")
    assert "top secret" not in repr(result)


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "/var/tmp"])
async def test_writing_outside_the_jail_fails(runner: Runner, where: str) -> None:
    target = f"{where}/trunner-escape-{os.getpid()}"
    result = await run_code(runner, f"""
        import errno
        try:
            open({target!r}, "w").write("x")
            result = "wrote"
        except OSError as e:
            result = errno.errorcode[e.errno]
    """)
    assert result == "EACCES"
    assert not os.path.exists(target)


async def test_writing_inside_the_jail_works(runner: Runner) -> None:
    result = await run_code(runner, """
        import os
        os.mkdir("d"); open("d/f", "w").write("ok")
        result = open(os.path.join(os.environ["TMPDIR"], "d", "f")).read()
    """)
    assert result == "ok"


@pytest.mark.parametrize(
    ("code", "syscall"),
    [
        ("import ctypes; ctypes.CDLL(None, use_errno=True).unshare(0x10000000)", "unshare"),
        ("import ctypes; ctypes.CDLL(None).mount(b'none', b'/tmp', b'tmpfs', 0, None)", "mount"),
        ("import ctypes; ctypes.CDLL(None).ptrace(0, 0, 0, 0)", "ptrace"),
        ("import os; os.setsid()", "setsid"),
        ("import os; os.setpgid(0, 0)", "setpgid"),
        ("import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)", "socket"),
    ],
)
async def test_forbidden_syscalls_are_syscall_denied(
    runner: Runner, code: str, syscall: str
) -> None:
    e = await denied(runner, code)
    assert e.reason is Reason.SYSCALL_DENIED
    assert e.signal == signal.SIGSYS
    assert f"({syscall})" in e.detail


async def test_fork_bomb_stops_at_the_process_limit(runner: Runner) -> None:
    limits = runner.limits.replace(processes=8, wall_time_s=20)
    result = await run_code(runner, """
        import os, time, errno
        pids, failure = [], None
        for _ in range(64):
            try:
                pid = os.fork()
            except OSError as e:
                failure = errno.errorcode[e.errno]
                break
            if pid == 0:
                time.sleep(1000)
                os._exit(0)
            pids.append(pid)
        result = {"forked": len(pids), "failure": failure, "pids": pids}
    """, limits=limits)
    assert result["failure"] == "EAGAIN"
    assert result["forked"] < 8
    assert not any(is_alive(p) for p in result["pids"])


async def test_allocating_past_the_address_space_limit_fails(runner: Runner) -> None:
    limits = runner.limits.replace(address_space_bytes=512 * 1024 * 1024)
    e = await denied(runner, "result = len(bytearray(1024 * 1024 * 1024))", limits=limits)
    assert e.reason is Reason.NONZERO_EXIT
    assert "MemoryError" in e.detail


async def test_cpu_spin_ends_by_the_cpu_limit(runner: Runner) -> None:
    limits = runner.limits.replace(cpu_time_s=1, wall_time_s=30)
    start = trio.current_time()
    e = await denied(runner, "while True: pass", limits=limits)
    assert e.reason is Reason.KILLED_BY_SIGNAL
    assert e.signal in (signal.SIGXCPU, signal.SIGKILL)
    assert trio.current_time() - start < 25


async def test_run_longer_than_the_spawn_thread_idle_time_survives(runner: Runner) -> None:
    # trio retires idle worker threads after 10 s; a parent-death signal tied
    # to such a thread would kill this child for nothing.
    await trio.sleep(0)
    result = await runner.run("children:sleep", 15.5, limits=runner.limits.replace(wall_time_s=40))
    assert result.response == "slept"


PARENT = """
import sys, trio
sys.path.insert(0, {tests!r})
from trunner import Runner, Limits
async def main():
    runner = Runner(import_paths=[{tests!r}], temp_root={root!r}, limits=Limits(wall_time_s=60))
    await runner.run("children:run_code", '''
import os, sys, time
if os.fork() == 0:
    time.sleep(1000)
os.write(2, b"ready\\\\n")
time.sleep(1000)
''')
trio.run(main)
"""


async def test_sigkilled_parent_leaves_no_jailed_process(jail_root: Path) -> None:
    code = PARENT.format(tests=TESTS_DIR, root=str(jail_root))
    parent = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        jailed: list[int] = []
        with trio.fail_after(30):
            while len(jailed) < 2:
                await trio.sleep(0.05)
                jailed = _descendants(parent.pid)
                jailed = [p for p in jailed if _cmdline(p).count(b"children:run_code")]
        await trio.sleep(0.3)
        jailed = [p for p in _descendants(parent.pid) if b"run_code" in _cmdline(p)]
        assert len(jailed) >= 2
        parent.kill()
        parent.wait()
        await trio.sleep(1.0)
        assert not any(is_alive(p) for p in jailed)
    finally:
        parent.kill()
        parent.wait()
        assert parent.stderr is not None
        parent.stderr.close()
    for entry in jail_root.iterdir():  # the dead parent could not clean its jail dir
        import shutil

        shutil.rmtree(entry)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for path in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = [int(k) for k in path.read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def test_group_and_children_gone_after_every_kind_of_run(runner: Runner) -> None:
    await runner.run("echo", 1)
    with pytest.raises(RunnerError):
        await runner.run("children:raise_error")
    assert child_pids() == []


def test_unprivileged_path_where_the_interpreter_is_reachable(tmp_path: Path) -> None:
    """As a non-root uid the process limit is RLIMIT_NPROC. That path needs an
    interpreter (and venv) the unprivileged uid can reach; probe, else skip."""
    if os.getuid() != 0:
        host = probe_host()
        assert host.process_limit is not None and host.process_limit.kind == "rlimit_nproc"
        return
    probe = subprocess.run(  # the worker's real interpreter, and trunner from it
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
         os.path.realpath(sys.executable), "-c", "import sys; print(sys.version)"],
        capture_output=True, timeout=60, cwd="/",
    )
    seen = (probe.stdout + probe.stderr).decode(errors="replace").strip()[:80]
    if probe.returncode != 0 or seen != sys.version[:80]:
        pytest.skip(
            "the worker's interpreter is not reachable by uid 65534 (probed: "
            f"exit {probe.returncode}, {seen!r} is not this {sys.version.split()[0]})"
        )
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="trunner-unpriv-", dir="/tmp")
    os.chmod(root, 0o777)
    code = (
        "import trio; from trunner import Runner; r = Runner(temp_root=%r);"
        "print(r.backend.probe().process_limit.kind, trio.run(r.run, 'echo', 7).response)" % root
    )
    try:
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             sys.executable, "-c", code], capture_output=True, timeout=120, cwd="/",
        )
        assert out.stdout.split() == [b"rlimit_nproc", b"7"], out.stderr
        assert os.listdir(root) == []
    finally:
        shutil.rmtree(root)
