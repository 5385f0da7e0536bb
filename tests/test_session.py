"""`Runner.session`: one jail across commands. Real jails: each command is
a helper that joins the session's namespaces; the files, the network and
the cgroup are the session's, the verdict, usage and processes the
command's own. The autouse leak check sees nothing left after each test."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import pytest
import trio

from conftest import cgroup_dirs, child_pids
from support import scaled, wait_until
from trunner import Limits, Reason, Runner, RunnerError

if TYPE_CHECKING:
    from pathlib import Path

    from trunner.session import Session


@pytest.fixture
def runner(jail_root: Path) -> Runner:
    return Runner(temp_root=str(jail_root), limits=Limits(wall_time_s=scaled(20.0)))


def host_pids_running(marker: str) -> list[int]:
    """Host processes whose command line holds `marker` (unique per test)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


async def sh(s: Session, script: str, **kw: object) -> str:
    r = (await s.exec(["sh", "-c", script], **kw)).response  # type: ignore[arg-type]
    assert (r.exit_code, r.stderr) == (0, b""), r
    return r.stdout.decode()


async def test_files_symlinks_empty_dirs_and_mtimes_stay_across_commands(
        runner: Runner) -> None:
    async with runner.session() as s:
        await sh(s, "mkdir -p work/empty && printf hi > work/f && ln -s f work/l"
                    " && touch -d @1000000000 work/f && chmod 751 work/f && echo t > /tmp/t")
        got = await sh(s, "stat -c '%n %F %a %Y' work/empty work/f; readlink work/l;"
                          " cat work/l /tmp/t")
    empty, *rest = got.splitlines()
    assert empty.rsplit(" ", 1)[0] == "work/empty directory 755", got
    assert rest == ["work/f regular file 751 1000000000", "f", "hit"], got


async def test_each_command_has_its_own_verdict_usage_and_deadline(runner: Runner) -> None:
    """A command's exit, CPU and peak are its own; its timeout ends it
    alone, and the session serves the next command with its files."""
    burn = [sys.executable, "-c", "import time\nt = time.process_time()\n"
            "b = bytearray(64 << 20)\n"
            "while time.process_time() - t < 0.3: pass\nopen('burnt', 'w')"]
    async with runner.session() as s:
        busy = await s.exec(burn)
        idle = await s.exec(["sh", "-c", "exit 3"])
        with pytest.raises(RunnerError) as info:
            await s.exec(["sleep", "1000"], limits=Limits(wall_time_s=0.5))
        after = await s.exec(["ls", "burnt"])
    assert busy.response.exit_code == 0
    assert idle.response.exit_code == 3
    assert busy.usage is not None
    assert idle.usage is not None
    assert busy.usage.cpu_user_s + busy.usage.cpu_sys_s >= 0.25
    assert idle.usage.cpu_user_s + idle.usage.cpu_sys_s < 0.1  # not the earlier command's
    assert busy.usage.peak_memory_bytes > 64 << 20 > 2 * idle.usage.peak_memory_bytes
    assert info.value.reason is Reason.TIMEOUT
    assert after.response.stdout == b"burnt\n"


async def test_a_commands_processes_end_with_it_and_see_no_other(runner: Runner) -> None:
    """An orphan a command leaves dies with its PID namespace; a command
    sees only its own processes (its own /proc), never the session's pid 1
    and 2, another command's or a background process's."""
    marker = f"{os.getpid()}.{id(runner) % 1000}"
    async with runner.session() as s:
        bg = await s.start_background(["sleep", f"{marker}1"])
        await sh(s, f"sleep {marker}2 > /dev/null 2>&1 &")
        assert host_pids_running(f"{marker}2") == []
        await wait_until(lambda: host_pids_running(f"{marker}1"), 10, "the background sleep")
        seen = await sh(s, "cd /proc && echo [0-9]*; cat /proc/1/cmdline | tr '\\0' ' ';"
                           " for p in 3 4 5 6 7 8 9; do kill -0 $p 2>/dev/null && echo $p; done;"
                           " true")
        await bg.stop()
        assert await bg.wait() is None
        assert host_pids_running(f"{marker}1") == []
    pids, init, *alive = seen.splitlines()
    assert pids == "1 2 3", seen  # its pid 1 (the waiter), 2 (the adapter), its sh
    assert "trunner-waiter init" in init, seen
    assert alive == [], seen


async def test_a_background_server_answers_a_later_command(runner: Runner) -> None:
    server = [sys.executable, "-c", (
        "import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 8765)); s.listen()\n"
        "print('listening', flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept(); c.sendall(open('greeting').read().encode()); c.close()\n")]
    client = [sys.executable, "-c", (
        "import socket, time\n"
        "for _ in range(500):\n"
        "    try:\n"
        "        print(socket.create_connection(('127.0.0.1', 8765)).recv(100).decode())\n"
        "        break\n"
        "    except ConnectionRefusedError:\n"
        "        time.sleep(0.02)\n")]
    async with runner.session() as s:
        bg = await s.start_background(server, files={"greeting": b"hello from the server"})
        got = await s.exec(client)
        assert bg.running
        assert bg.stdout == b"listening\n"
    assert got.response.stdout == b"hello from the server\n"
    assert not bg.running
    with pytest.raises(RunnerError) as info:
        await bg.wait()
    assert info.value.reason is Reason.SESSION_ENDED  # it ended with the session


async def test_commands_run_at_once_in_one_session(runner: Runner) -> None:
    """Two commands in flight together, each its own verdict; a fifo in the
    shared working dir proves they overlapped."""
    async with runner.session() as s:
        await sh(s, "mkfifo pipe")
        got: dict[str, str] = {}

        async def one(name: str, script: str) -> None:
            got[name] = await sh(s, script)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "reader", "cat pipe")
            nursery.start_soon(one, "writer", "echo through > pipe; echo sent")
    assert got == {"reader": "through\n", "writer": "sent\n"}


async def test_nothing_of_the_session_is_left(runner: Runner) -> None:
    cgroups = cgroup_dirs()
    async with runner.session() as s:
        await sh(s, "echo x > f")
        assert child_pids() != []  # the session's helper, alive between commands
        if os.getuid() == 0:
            assert len(cgroup_dirs()) > len(cgroups)
    assert child_pids() == []
    assert cgroup_dirs() == cgroups


async def test_a_limit_only_the_session_sets_is_refused(runner: Runner) -> None:
    async with runner.session(limits=Limits(memory_bytes=256 << 20)) as s:
        for limits, named in ((Limits(processes=5), "processes"),
                              (Limits(scratch_bytes=2 << 20), "scratch_bytes"),
                              (Limits(memory_bytes=512 << 20), "memory_bytes 536870912")):
            with pytest.raises(RunnerError) as info:
                await s.exec(["true"], limits=limits)
            assert info.value.reason is Reason.BAD_REQUEST
            assert info.value.detail.startswith(named), info.value.detail
        # A field left at its default is the session's: here its memory_bytes.
        r = await s.exec(["sh", "-c", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
                          " /sys/fs/cgroup/memory.max 2>/dev/null; true"],
                         limits=Limits(wall_time_s=scaled(20.0)))
    if os.getuid() == 0:
        assert r.response.stdout == b"268435456\n"


async def test_idle_s_ends_the_session_and_a_later_command_is_refused(runner: Runner) -> None:
    async with runner.session(idle_s=0.2) as s:
        await sh(s, "true")
        await trio.sleep(0.2 + scaled(2.0))
        assert s.ended.startswith("idle_s (0.2 s) passed")
        with pytest.raises(RunnerError) as info:
            await s.exec(["true"])
    assert info.value.reason is Reason.SESSION_ENDED
    assert child_pids() == []


async def test_lifetime_s_ends_a_command_in_flight(runner: Runner) -> None:
    async with runner.session(lifetime_s=scaled(2.0)) as s:
        with pytest.raises(RunnerError) as info:
            await s.exec(["sleep", "1000"])
    assert info.value.reason is Reason.SESSION_ENDED
    assert info.value.detail.startswith("its lifetime_s"), info.value.detail


async def test_a_commands_rules_version_is_the_sessions_own(runner: Runner) -> None:
    async with runner.session() as s:
        r = await s.exec(["true"])
    assert r.rules_version == s.rules_version() != runner.rules_version()


async def test_the_body_s_exception_leaves_as_itself(runner: Runner) -> None:
    async def body() -> None:
        async with runner.session() as s:
            await sh(s, "true")
            raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await body()
    assert child_pids() == []


@pytest.mark.slow
async def test_a_thousand_commands_leave_nothing(runner: Runner) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    async with runner.session() as s:
        held = 0
        for i in range(1000):
            r = await s.exec(["sh", "-c", f"echo {i} >> log"])
            assert r.response.exit_code == 0
            if i == 0:  # the session's own: its pipes, its fork server's
                held = len(os.listdir("/proc/self/fd"))
        assert (await s.exec(["wc", "-l", "log"])).response.stdout == b"1000 log\n"
        assert len(os.listdir("/proc/self/fd")) == held
    assert len(os.listdir("/proc/self/fd")) == fds


async def test_a_later_command_cannot_reach_a_background_abstract_socket(
        runner: Runner) -> None:
    """Landlock's abstract unix socket scope (ABI 6): each command is a
    domain of its own, so a background process's abstract socket is out of
    a later command's reach; its pathname socket in the working dir is not."""
    from conftest import landlock_abi_in_force

    server = [sys.executable, "-c", (
        "import socket, threading\n"
        "def serve(family_addr):\n"
        "    s = socket.socket(socket.AF_UNIX); s.bind(family_addr); s.listen()\n"
        "    while True:\n"
        "        c, _ = s.accept(); c.sendall(b'hi'); c.close()\n"
        "threading.Thread(target=serve, args=('\\0trunner-session-test',), daemon=True).start()\n"
        "serve('sock')\n")]
    client = [sys.executable, "-c", (
        "import socket, time\n"
        "for addr in ('sock', '\\0trunner-session-test'):\n"
        "    for _ in range(500):\n"
        "        try:\n"
        "            c = socket.socket(socket.AF_UNIX); c.connect(addr)\n"
        "            print(addr[:4].strip(chr(0)), c.recv(2).decode()); break\n"
        "        except FileNotFoundError:\n"
        "            time.sleep(0.02)\n"
        "        except OSError as e:\n"
        "            print(addr[:4].strip(chr(0)), e.errno); break\n")]
    async with runner.session() as s:
        bg = await s.start_background(server)
        got = (await s.exec(client)).response.stdout.decode().splitlines()
        await bg.stop()
    assert got[0] == "sock hi"
    if landlock_abi_in_force() >= 6:
        assert got[1] == "tru 1", got  # EPERM: another domain's abstract socket


async def test_a_session_whose_jail_ends_by_itself_ends(runner: Runner) -> None:
    """Its pid 2 killed from the host: the session ends, names why, and a
    later command is refused; nothing is left."""
    from trunner import procfs

    async with runner.session() as s:
        await sh(s, "true")
        assert s._started is not None
        init = s._started.jail.init[0]  # type: ignore[attr-defined]  # LinuxJail's
        [hold] = procfs.children(init)
        os.kill(hold, 9)
        await wait_until(lambda: s.ended, 20, "the session's end")
        with pytest.raises(RunnerError) as info:
            await s.exec(["true"])
    assert s.ended == "its jail ended (its pid 2 exited)"
    assert info.value.reason is Reason.SESSION_ENDED


async def test_the_files_api_keeps_types_modes_and_mtimes(runner: Runner) -> None:
    """write_files, then a command sees them; read_files gives back what a
    command left (a symlink, an empty dir, a mode, an mtime) exactly; the
    export of a tree of 1500 files comes back through import_ elsewhere."""
    from trunner.protocol import FileEntry

    async with runner.session() as s:
        await s.write_files([
            FileEntry(path="work/run.sh", type="file", mode=0o750, mtime_ns=10**18,
                      data=b"echo ran\n"),
            FileEntry(path="work/link", type="symlink", mode=0o777, mtime_ns=10**18,
                      target="run.sh"),
            FileEntry(path="work/empty", type="dir", mode=0o700, mtime_ns=2 * 10**18)])
        ran = await sh(s, "./work/link && stat -c '%a %Y' work/run.sh work/empty")
        await sh(s, "mkdir -p out/many && cd out && ln -s ../work/run.sh tool"
                    " && touch -d @1234567890 tool.txt && for i in $(seq 1500);"
                    " do echo $i > many/$i; done")
        entries = {e.path: e for e in await s.read_files(["out/*", "work/**"])}
        big = Limits(stdout_max_bytes=8 << 20)
        tar = b"".join([chunk async for chunk in s.export("out", limits=big)])
        assert await s.import_(tar, "copy") == 1503  # 1500 files, 2 dirs, the link
        copied = await sh(s, "ls copy/many | wc -l; readlink copy/tool; cat copy/many/1500")
    assert ran == "ran\n750 1000000000\n700 2000000000\n"
    assert entries["work/empty"].type == "dir"
    assert entries["work/empty"].mtime_ns == 2 * 10**18
    assert entries["work/link"].type == "symlink"
    assert entries["work/link"].target == "run.sh"
    assert entries["work/run.sh"].data == b"echo ran\n"
    assert entries["work/run.sh"].mode == 0o750
    assert entries["out/tool"].target == "../work/run.sh"
    assert entries["out/tool.txt"].mtime_ns == 1234567890 * 10**9
    assert entries["out/many"].type == "dir"
    assert copied == "1500\n../work/run.sh\n1500\n"


async def test_a_files_op_through_a_symlink_is_refused_and_writes_nothing(
        runner: Runner) -> None:
    async with runner.session() as s:
        await sh(s, "ln -s /tmp up")
        with pytest.raises(RunnerError) as info:
            await s.write_files({"up/planted": b"x"})
        left = await sh(s, "test -e /tmp/planted && echo written; echo end")
    assert info.value.reason is Reason.BAD_REQUEST
    assert "'up'" in info.value.detail, info.value.detail
    assert left == "end\n"


async def test_a_cancelled_command_ends_alone(runner: Runner) -> None:
    """Cancelling a command's await ends that command (its processes gone
    when the await returns), not the session."""
    marker = f"{os.getpid()}.77"
    async with runner.session() as s:
        await sh(s, "echo kept > f")
        with trio.move_on_after(scaled(1.0)) as scope:
            await s.exec(["sleep", f"{marker}"])
        assert scope.cancelled_caught
        assert host_pids_running(marker) == []
        assert await sh(s, "cat f") == "kept\n"
        assert s.ended == ""
