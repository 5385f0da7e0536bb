"""The Linux jail, layer by layer: each test is a child that tries the
forbidden thing, and each asserts the reason and the side effect that did
not happen. Real kernel, real processes, the jail as shipped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from conftest import TESTS_DIR, child_pids
from support import (
    PID_NS,
    alive,
    denied,
    is_jailed,
    jailed_under,
    pid_namespace_members,
    proc_status,
    proc_statuses,
    run_code,
    scaled,
    uid_settled,
    wait_until,
)
from trunner import Reason, Result, Runner
from trunner.linux.plan import TRUNNER_PROCESSES, WORKDIR
from trunner.linux.probe import probe_host, python_paths

#: Each Landlock feature doctor reports, and the ABI the kernel documentation
#: gives it (Documentation/userspace-api/landlock.rst).
DOCUMENTED_FEATURE_ABI = {"filesystem": 1, "refer": 2, "truncate": 3, "tcp": 4, "ioctl_dev": 5,
                          "scope_abstract_unix_socket": 6, "scope_signal": 6}


def kernel_landlock_abi() -> int:
    """The kernel's own answer to landlock_create_ruleset(NULL, 0,
    LANDLOCK_CREATE_RULESET_VERSION) (444 on every architecture but alpha),
    asked directly, not through trunner; 0 where Landlock is absent or off."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))
    if abi < 0:
        err = ctypes.get_errno()
        assert err in (errno.ENOSYS, errno.EOPNOTSUPP), os.strerror(err)
        return 0
    return int(abi)


def test_doctor_says_this_host_can_run() -> None:
    """`trunner doctor` reports the Landlock ABI the kernel has (whatever it
    is: 1 on Linux 5.13, 2 on 6.1, 7 on 6.15), uses it up to the highest
    trunner knows, and lists exactly that ABI's features."""
    from trunner.linux.landlock import KNOWN_ABI, MIN_ABI

    kernel = kernel_landlock_abi()
    host = probe_host()
    assert host.can_run, host.refusal_detail
    assert host.landlock_abi == kernel
    assert kernel >= MIN_ABI  # a host that can run has Landlock
    assert host.seccomp_filter
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "trunner"), "doctor", "--json"],
        capture_output=True, timeout=scaled(60),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["can_run"] is True, report
    assert report["landlock_abi"] == kernel
    layer = report["layers"]["landlock"]
    used = min(kernel, KNOWN_ABI)
    assert (layer["holds"], layer["kernel_abi"], layer["abi_used"], layer["known_abi"]) == (
        True, kernel, used, KNOWN_ABI), layer
    assert layer["features"] == {name: used >= abi for name, abi in DOCUMENTED_FEATURE_ABI.items()}
    lacking = {name for name, on in layer["features"].items() if not on}
    assert set(layer["covered_by_other_layers"]) == lacking, layer
    assert all(layer["covered_by_other_layers"].values()), layer


async def test_status_no_new_privs_seccomp_no_caps(runner: Runner) -> None:
    status: dict[str, Any] = (await runner.run("children:status")).response
    text = status["status"]
    assert "NoNewPrivs:\t1" in text
    assert "Seccomp:\t2" in text
    assert "CapEff:\t0000000000000000" in text
    assert "CapBnd:\t0000000000000000" in text
    # Descriptor hygiene: only the runner's pipes (and the listing's own fd).
    # 0-2, the response pipe moved off fd 1, and the fd listdir itself used.
    assert len(set(status["fds"]) - {0, 1, 2, status["reply_fd"]}) <= 1
    # Pid 2 of its own PID namespace, in a fresh process group and session
    # whose leader (the helper) is outside it: so 0 from inside.
    assert (status["pid"], status["pgid"], status["sid"]) == (2, 0, 0)
    # The cwd is the scratch's fixed working dir.
    assert status["cwd"] == WORKDIR


async def test_parent_environment_is_not_inherited(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2-secret")
    environ, raw = await run_code(runner, """
        result = [dict(os.environ), open("/proc/self/environ", "rb").read().decode()]
    """)
    assert "AWS_SECRET_ACCESS_KEY" not in environ
    assert "hunter2-secret" not in repr([environ, raw])
    assert set(environ) == {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONPATH"}


async def test_inheritable_fd_is_not_open_in_the_child(runner: Runner, tmp_path: Path) -> None:
    """An inheritable fd the parent leaked (fd-leak class, e.g. runc CVE-2024-21626)."""
    secret = tmp_path / "secret"
    secret.write_text("fd secret")
    fd = os.open(secret, os.O_RDWR)
    os.set_inheritable(fd, True)
    try:
        result = await run_code(runner, f"""
            result = [attempt(lambda: os.fstat({fd}).st_size), attempt(lambda: os.read({fd}, 100)),
                      attempt(lambda: os.write({fd}, b"pwned")),
                      sorted(int(x) for x in os.listdir("/proc/self/fd"))]
            from trunner.worker.adapters import reply_fd
            result.append(reply_fd())
        """)
    finally:
        os.close(fd)
    assert result[:3] == ["EBADF"] * 3
    assert fd not in result[3] or fd == result[4]
    # The runner's pipes, the response pipe moved off fd 1, the listing's own fd.
    assert len(set(result[3]) - {0, 1, 2, result[4]}) <= 1
    assert "fd secret" not in repr(result)
    assert secret.read_text() == "fd secret"


# TCP to a host listener and a host abstract unix socket: tests/security/test_network.py
# (test_tcp_to_test_listener_on_loopback, test_unix_socket_of_the_test[abstract]).


async def test_reading_a_file_outside_fails(runner: Runner, tmp_path: Path) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("top secret")
    result = await run_code(runner, f"""
        result = [attempt(lambda: open({str(secret)!r}).read()),
                  attempt(lambda: os.listdir({str(secret.parent)!r})),
                  attempt(lambda: open("/etc/shadow").read()),
                  attempt(lambda: open("/etc/passwd").read()),
                  attempt(lambda: os.listdir("/root")),
                  attempt(lambda: open("/root/.bashrc").read())]
    """)
    # Not in the jail's root at all (Landlock would refuse them too).
    assert result[:3] == ["ENOENT"] * 3
    # /etc/passwd is the jail's own: its user and nobody, no host account.
    assert result[3].startswith("OK:")
    assert "daemon:" not in result[3]
    # /root: at most the mount point of an interpreter kept there.
    kept = any(p.startswith("/root/") for p in python_paths())
    tops = sorted({p.split("/")[2] for p in python_paths() if p.startswith("/root/")})
    assert result[4] == (f"OK:{tops!r}" if kept else "ENOENT")
    assert result[5] == "ENOENT"
    assert "top secret" not in repr(result)


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "/var/tmp", "TEST_TMP"])
async def test_writing_outside_the_jail_fails(runner: Runner, where: str, tmp_path: Path) -> None:
    """Drop a file in a shared writable dir (tmp-race / planted-file class):
    the jail's /tmp and /dev/shm are its own scratch; nothing reaches the host."""
    base = str(tmp_path) if where == "TEST_TMP" else where
    target = f"{base}/trunner-escape-{os.getpid()}"
    result = await run_code(runner, f"""
        result = attempt(lambda: open({target!r}, "w").write("x"))
    """)
    assert result == ("OK:1" if where in ("/tmp", "/dev/shm") else "ENOENT")
    assert not os.path.exists(target)


async def test_writing_inside_the_jail_works(runner: Runner) -> None:
    result = await run_code(runner, """
        import os
        os.mkdir("d"); open("d/f", "w").write("ok")
        result = open(os.path.join(os.environ["TMPDIR"], "d", "f")).read()
    """)
    assert result == "ok"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("syscall(272, 0x10000000)", "EPERM"),  # unshare(CLONE_NEWUSER)
        ("syscall(272, 0x00020000)", "EPERM"),  # unshare(CLONE_NEWNS)
        ("syscall(165, b'none', b'/tmp', b'tmpfs', 0, None)", "EPERM"),  # mount
        ("syscall(304, -100, None, 0)", "EPERM"),  # open_by_handle_at
        ("syscall(41, 17, 3, 0)", "EAFNOSUPPORT"),  # socket(AF_PACKET, SOCK_RAW)
        ("syscall(999)", "ENOSYS"),  # a number no kernel has
    ],
)
async def test_forbidden_syscalls_fail_and_the_worker_carries_on(
    runner: Runner, call: str, expected: str
) -> None:
    """Outside the allow-list: an errno, not a kill; nothing changed (namespaces,
    mounts, tracer), and the worker goes on to return its result."""
    result = await run_code(runner, f"""
        def state():
            ns = sorted(os.readlink("/proc/self/ns/" + n) for n in os.listdir("/proc/self/ns"))
            tracer = open("/proc/self/status").read().split("TracerPid:")[1].split()[0]
            return [ns, open("/proc/self/mountinfo").read(), tracer]
        before = state()
        result = [{call}, state() == before]
    """)
    assert result == [expected, True]


async def test_a_new_session_and_process_group_work(runner: Runner) -> None:
    """setsid and setpgid (subprocess's start_new_session and process_group, coreutils
    `timeout`, make): the PID namespace holds the whole tree, whatever its sessions."""
    result = await run_code(runner, """
        import subprocess, sys
        probe = "import os; print(os.getpid() == os.getsid(0) == os.getpgid(0))"
        new_session = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                     text=True, start_new_session=True)
        probe = "import os; print(os.getpid() == os.getpgid(0) != os.getsid(0))"
        new_group = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                   text=True, process_group=0)
        result = [new_session.stdout, new_group.stdout]
    """)
    assert result == ["True\n", "True\n"]


# Forks sleeping children until the kernel refuses one (64 at most).
FORK_UNTIL_REFUSED = """
import errno, os, resource, time
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
result = {"nproc": resource.getrlimit(resource.RLIMIT_NPROC), "forked": len(pids),
          "failure": failure, "pids": pids, "ns": os.readlink("/proc/self/ns/pid")}
"""


async def test_fork_bomb_stops_at_the_process_limit(runner: Runner) -> None:
    limits = runner.limits.replace(processes=8, wall_time_s=20)
    await wait_until(uid_settled, 10, "no zombie of this uid")
    result = await run_code(runner, FORK_UNTIL_REFUSED, limits=limits)
    assert result["failure"] == "EAGAIN"
    assert result["forked"] < 8
    assert pid_namespace_members(result["ns"]) == []


async def test_allocating_past_the_address_space_limit_fails(runner: Runner) -> None:
    limits = runner.limits.replace(address_space_bytes=512 * 1024 * 1024)
    e = await denied(runner, "result = len(bytearray(1024 * 1024 * 1024))", limits=limits)
    assert e.reason is Reason.NONZERO_EXIT
    assert "MemoryError" in e.detail


async def test_cpu_spin_ends_by_the_cpu_limit(runner: Runner) -> None:
    limits = runner.limits.replace(cpu_time_s=1, wall_time_s=30)
    start = trio.current_time()
    e = await denied(runner, "while True: pass", limits=limits)
    # The parent's poll of the run's CPU time (its SIGKILL of the group is then
    # the signal the helper died of, as for a timeout), or RLIMIT_CPU's SIGXCPU
    # a second later (a backstop): either way `cpu_time`, not a signal death.
    assert e.reason is Reason.CPU_TIME
    assert e.signal in (signal.SIGXCPU, signal.SIGKILL, None)
    assert trio.current_time() - start < scaled(25)


@pytest.mark.slow
async def test_run_longer_than_the_spawn_thread_idle_time_survives(runner: Runner) -> None:
    # trio retires idle worker threads after 10 s; a parent-death signal tied
    # to such a thread would kill this child for nothing.
    limits = runner.limits.replace(wall_time_s=40)
    result: Result[str] = await runner.run("children:sleep", 15.5, limits=limits)
    assert result.response == "slept"


PARENT = """
import sys, trio
sys.path.insert(0, {tests!r})
from trunner import Runner, Limits
async def main():
    runner = Runner(import_paths=[{tests!r}], temp_root={root!r}, limits=Limits(wall_time_s=60))
    await runner.run("children:run_code", {code!r})
trio.run(main)
"""

# The jailed worker forks a grandchild, then says so in its jail dir (its cwd): its
# stdout and stderr go to the parent's runner, which the test cannot read.
FORK_THEN_READY = """
import os, time
child = os.fork()
if child == 0:
    time.sleep(1000)
    os._exit(0)
with open("ready.tmp", "w") as f:
    f.write(f"{os.getpid()} {child}\\n")
os.rename("ready.tmp", "ready")
time.sleep(1000)
"""


async def test_sigkilled_parent_leaves_no_jailed_process(jail_root: Path) -> None:
    code = PARENT.format(tests=TESTS_DIR, root=str(jail_root), code=FORK_THEN_READY)
    parent = await trio.lowlevel.open_process(
        [sys.executable, "-c", code], stderr=subprocess.DEVNULL
    )
    try:
        def made_ready() -> list[int]:
            # The jail writes `ready` in its working dir (its own scratch),
            # seen from the host through the jail's /proc/PID/cwd.
            ready = [p for p in _descendants(parent.pid) if os.path.exists(f"/proc/{p}/cwd/ready")]
            assert ready or parent.poll() is None, f"the parent exited {parent.returncode}"
            return ready

        ready = await wait_until(made_ready, 30, "the jail's `ready`")
        inside = [int(pid) for pid in Path(f"/proc/{ready[0]}/cwd/ready").read_text().split()]
        assert inside == [2, 3]  # pids of the jail's own namespace
        ns = os.readlink(f"/proc/{ready[0]}/ns/pid")
        jailed = pid_namespace_members(ns)
        assert len(jailed) == 3  # its pid 1, the adapter, the grandchild
        assert set(jailed) <= set(_descendants(parent.pid))
        assert all(is_jailed(proc_status(pid)) for pid in jailed)
        parent.kill()
        await parent.wait()
        # Generous: the watchdog and PDEATHSIG kill them.
        await wait_until(lambda: not alive(jailed), 10,
                         lambda: f"the jailed processes gone (alive: {alive(jailed)})")
    finally:
        parent.kill()
        await parent.wait()
    # The dead parent could not clean its jail dir: its watchdog does (racing
    # an rmtree here failed ENOENT once).
    await wait_until(lambda: not any(jail_root.iterdir()), 10,
                     lambda: f"the jail dir removed by the watchdog: {list(jail_root.iterdir())}")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:  # a process that ends while we look has no task dir left to list
            paths = list(Path(f"/proc/{p}/task").glob("*/children"))
        except OSError:
            continue
        for path in paths:
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


# Each run first forks a grandchild that sleeps, in the run's process group.
FORK_A_SLEEPER = """
import os, time
sleeper = os.fork()
if sleeper == 0:
    time.sleep(1000)
    os._exit(0)
"""


@pytest.mark.parametrize(
    ("tail", "limits", "reason"),
    [
        pytest.param("result = sleeper", {}, None, id="ok"),
        pytest.param("raise RuntimeError(f'sleeper={sleeper}')", {}, Reason.NONZERO_EXIT,
                     id="nonzero-exit"),
        pytest.param("time.sleep(1000)", {"wall_time_s": 2.0}, Reason.TIMEOUT, id="timeout"),
        pytest.param("while True: os.write(1, b'x' * 4096)", {"stdout_max_bytes": 16384},
                     Reason.STDOUT_CAP, id="stdout-cap"),
    ],
)
async def test_no_process_of_a_run_outlives_it_whatever_the_outcome(
    runner: Runner, jail_root: Path, tail: str, limits: dict[str, float], reason: Reason | None
) -> None:
    code = FORK_A_SLEEPER + tail
    if reason is None:
        ns = await run_code(runner, code.replace("result = sleeper", f"result = {PID_NS}"))
        assert pid_namespace_members(ns) == []
    else:
        e = await denied(runner, code, limits=runner.limits.replace(**limits))
        assert e.reason is reason, e.detail
    # Reaching the outcome proves the fork happened; the sleeper's cwd was the jail dir.
    await wait_until(lambda: not jailed_under(str(jail_root)), 10,
                     lambda: f"the run's processes gone (alive: {jailed_under(str(jail_root))})")
    assert child_pids() == []
    assert list(jail_root.iterdir()) == []


def _tasks_of(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) whose real uid is `uid`."""
    return sum(int(fields["Threads"]) for _, fields in proc_statuses()
               if int(fields["Uid"].split()[0]) == uid)


async def test_the_process_limit_is_per_run(runner: Runner) -> None:
    """Each run forks exactly processes - 1 children (it is one process
    itself), whatever else its uid runs: RLIMIT_NPROC set in the run's own
    user namespace, which the kernel counts per user namespace (5.14 on), and
    as root a per-run pids cgroup too. Before, not root, RLIMIT_NPROC was the
    uid's count at spawn + processes, so runs of one uid fed each other's
    limit. (scripts/test-unprivileged runs this as uid 65534.)"""
    processes = 6
    limits = runner.limits.replace(processes=processes, wall_time_s=30)
    host = probe_host()
    assert host.process_limit is not None
    assert host.nproc_per_userns
    assert host.process_limit.kind == ("pids_cgroup" if os.getuid() == 0 else "userns_nproc")
    # Four runs at once, and host processes of this uid that exit meanwhile.
    results: list[Any] = []

    async def one() -> None:
        results.append(await run_code(runner, FORK_UNTIL_REFUSED, limits=limits))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)
        for _ in range(8):
            await trio.run_process(["true"])
    for result in results:
        assert result["failure"] == "EAGAIN"
        assert result["forked"] == processes - 1
        assert result["nproc"] == [processes + TRUNNER_PROCESSES] * 2
        assert pid_namespace_members(result["ns"]) == []
