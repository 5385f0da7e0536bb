"""Resource exhaustion: each bomb hits its limit with the specific reason or
errno, and nothing of it is left behind."""

from __future__ import annotations

import signal
import textwrap
from typing import TYPE_CHECKING, TypeVar

import pytest

from support import denied, pid_namespace_members, run_code, scaled, uid_settled, wait_until
from trunner import Reason, Runner
from trunner.linux.probe import probe_host

if TYPE_CHECKING:
    from collections.abc import Callable

F = TypeVar("F", bound="Callable[..., object]")

_LIMIT = probe_host().process_limit
#: The process limit counts every process of the caller's uid on the host:
#: RLIMIT_NPROC, not root before Linux 5.14 (`rlimit_nproc`; since 5.14 the
#: jail's own user namespace is counted, `userns_nproc`; as root, a pids
#: cgroup of the run's own). A run's bound is then "the uid's tasks at spawn
#: + processes - 1": another test run of the same uid on the host (or this
#: one's orphans, until init reaps them) moves it mid-run.
UID_WIDE = _LIMIT is not None and _LIMIT.kind == "rlimit_nproc"


def per_run_bound(test: F) -> F:
    """For a test that asserts a run's exact process bound: where that bound
    is the uid's host-wide count (`UID_WIDE`) it is a quiet_host test, run
    alone; elsewhere it runs with everything else."""
    return pytest.mark.quiet_host(test) if UID_WIDE else test


async def settled() -> None:
    """Where the bound is the uid's (`UID_WIDE`), wait until no zombie of the
    uid is left to be counted at spawn and reaped mid-run (`uid_settled`);
    elsewhere a run's bound is its own, and zombies of the uid (another test
    run's: uid 65534 is every unprivileged run's) are none of its business."""
    if UID_WIDE:
        await wait_until(uid_settled, 10, "no zombie of this uid")


@per_run_bound
async def test_fork_bomb(runner: Runner) -> None:
    """Recursive fork bomb (every process forks): EAGAIN at the process limit (pids.max as
    root, RLIMIT_NPROC not), nothing left after."""
    limits = runner.limits.replace(processes=12, wall_time_s=40)
    await settled()
    result = await run_code(runner, f"wait_s = {scaled(15)}\n" + textwrap.dedent("""
        import time
        log = os.open("pids", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        fails = os.open("fails", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        top = os.getpid()
        for _ in range(6):
            try:
                pid = os.fork()
            except OSError as e:
                os.write(fails, errno.errorcode[e.errno].encode() + b"\\n")
                continue
            if pid:
                os.write(log, b"%d\\n" % pid)
        if os.getpid() != top:
            time.sleep(1000)
        deadline = time.monotonic() + wait_s  # descendants may hit the limit after we finish
        while not os.path.getsize("fails") and time.monotonic() < deadline:
            time.sleep(0.05)
        result = {"pids": [int(p) for p in open("pids").read().split()],
                  "fails": sorted(set(open("fails").read().split())),
                  "ns": os.readlink("/proc/self/ns/pid")}
    """), limits=limits)
    assert result["fails"] == ["EAGAIN"]
    assert 0 < len(result["pids"]) < 12
    assert pid_namespace_members(result["ns"]) == []  # pids inside are the jail's own


@per_run_bound
async def test_thread_bomb(runner: Runner) -> None:
    """Thread bomb: threads count against the pids cgroup too."""
    limits = runner.limits.replace(processes=8)
    await settled()
    result = await run_code(runner, """
        import threading, time
        n, err = 0, None
        for _ in range(64):
            try:
                threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
                n += 1
            except RuntimeError as e:
                err = str(e)
                break
        result = [n, err]
    """, limits=limits)
    n, err = result
    assert n < 8
    assert err == "can't start new thread"


async def test_memory_bomb(runner: Runner) -> None:
    """Memory bomb past RLIMIT_AS: MemoryError, the run fails nonzero_exit."""
    limits = runner.limits.replace(address_space_bytes=256 * 1024 * 1024)
    e = await denied(runner, "x = [bytearray(16 * 1024 * 1024) for _ in range(64)]", limits=limits)
    assert e.reason is Reason.NONZERO_EXIT
    assert "MemoryError" in e.detail


async def test_mmap_bomb_outside_the_heap(runner: Runner) -> None:
    """Anonymous mmap past RLIMIT_AS (bypass of the allocator): ENOMEM."""
    limits = runner.limits.replace(address_space_bytes=256 * 1024 * 1024)
    result = await run_code(
        runner, "import mmap\nresult = attempt(lambda: mmap.mmap(-1, 512 << 20))", limits=limits
    )
    assert result == "ENOMEM"


async def test_disk_fill_in_the_jail_dir(runner: Runner) -> None:
    """Disk fill in the jail dir past RLIMIT_FSIZE: EFBIG (Python ignores SIGXFSZ), file capped."""
    limits = runner.limits.replace(file_size_bytes=1 << 20)
    result = await run_code(runner, """
        f = os.open("fill", os.O_WRONLY | os.O_CREAT)
        def fill():
            while True:
                os.write(f, b"\\0" * 65536)
        result = [attempt(fill), os.path.getsize("fill"),
                  attempt(lambda: os.pwrite(f, b"x", 10 << 30))]  # sparse far past the limit
    """, limits=limits)
    assert result == ["EFBIG", 1 << 20, "EFBIG"]


async def test_disk_fill_by_a_program(runner: Runner) -> None:
    """Disk fill by an exec'd program (default SIGXFSZ action): killed by SIGXFSZ."""
    limits = runner.limits.replace(file_size_bytes=1 << 20)
    done = (await runner.exec(
        ["/bin/sh", "-c", "head -c 4000000 /dev/zero > fill; echo $?; wc -c < fill"], limits=limits
    )).response
    assert done.exit_code == 0, done
    # 128 + SIGXFSZ: head was killed by the signal; the file stopped at the limit.
    assert done.stdout.split() == [str(128 + signal.SIGXFSZ).encode(), str(1 << 20).encode()]


# The plain CPU spin is test_jail.py::test_cpu_spin_ends_by_the_cpu_limit.


@pytest.mark.slow
async def test_cpu_spin_ignoring_sigxcpu(runner: Runner) -> None:
    """CPU spin that ignores SIGXCPU: the parent's poll of the run's CPU time
    ends it (`cpu_time`), before RLIMIT_CPU's hard limit would SIGKILL it."""
    limits = runner.limits.replace(cpu_time_s=1.5, wall_time_s=30)
    e = await denied(runner, """
        import signal
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        while True: pass
    """, limits=limits)
    assert e.reason is Reason.CPU_TIME
    assert e.usage is not None
    assert e.usage.cpu_s >= 1.35


@pytest.mark.slow
async def test_cpu_spin_in_a_chain_of_children(runner: Runner) -> None:
    """CPU limit evasion by forking fresh spinners (RLIMIT_CPU is per
    process): cpu_time_s is the whole run's, so the chain ends `cpu_time`
    (before, only the wall clock stopped it)."""
    limits = runner.limits.replace(cpu_time_s=1, wall_time_s=10)
    e = await denied(runner, """
        import time
        while True:
            if os.fork() == 0:
                t = time.monotonic()
                while time.monotonic() - t < 0.5:
                    pass
                os._exit(0)
            os.wait()
    """, limits=limits)
    assert e.reason is Reason.CPU_TIME
    assert e.usage is not None
    assert 0.9 <= e.usage.cpu_s < 1 + scaled(2)  # a slow host stops it later


@pytest.mark.parametrize(
    ("fd", "field", "reason"),
    [(1, "stdout_max_bytes", Reason.STDOUT_CAP), (2, "stderr_max_bytes", Reason.STDERR_CAP)],
    ids=["stdout", "stderr"],
)
async def test_output_flood(runner: Runner, fd: int, field: str, reason: Reason) -> None:
    """Output flood on stdout (a huge reply) or stderr (log spam): the cap kills it."""
    limits = runner.limits.replace(**{field: 16 * 1024})
    e = await denied(runner, f"""
        while True:
            os.write({fd}, b"A" * 4096)
    """, limits=limits)
    assert e.reason is reason


async def test_fd_exhaustion(runner: Runner) -> None:
    """Descriptor exhaustion: EMFILE at RLIMIT_NOFILE."""
    limits = runner.limits.replace(open_files=32)
    result = await run_code(runner, """
        fds, err = [], None
        while len(fds) < 1000:
            try:
                fds.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as e:
                err = errno.errorcode[e.errno]
                break
        result = [err, max(fds), attempt(lambda: os.dup2(0, 40))]
        for fd in fds:
            os.close(fd)
    """, limits=limits)
    assert result[0] == "EMFILE"
    assert result[1] <= 31
    assert result[2] == "EBADF"  # dup2 beyond the limit is refused too
