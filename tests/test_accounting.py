"""The program's own cgroup: its figures and bounds are the whole tree's,
and never trunner's (issue 33, items 1-3 and 5).

Real jails, as root and (scripts/test-unprivileged) as uid 65534. Where the
run has cgroups (root here; a delegated caller on cgroup v2) every figure
of `exec` is its `prog` leaf's; where it has none, each test asserts the
documented fallback (docs/figures.md).
"""

from __future__ import annotations

import os
import sys

import pytest

from support import scaled
from trunner import Limits, Reason, Runner, RunnerError
from trunner.linux.probe import probe_host

MiB = 1 << 20
HOST = probe_host()
#: Whether this caller's runs get a memory and a CPU cgroup.
CGROUP = bool(HOST.memory_cgroup_base) and bool(HOST.cpu_cgroup_base)


def py(code: str) -> list[str]:
    return [sys.executable, "-S", "-c", code]


async def test_the_program_runs_in_its_own_leaf_and_trunner_beside_it(runner: Runner) -> None:
    """The jail's cgroup namespace is rooted at the run's `prog` leaf (the
    helper unshares it from there, then returns to `sup`): the program
    shows `/`, pid 1 and the adapter (pid 2) `/../sup`, in each hierarchy
    the run has a cgroup in."""
    code = ("for p in ('self', '1', '2'):\n"
            "    for line in open(f'/proc/{p}/cgroup'): print(p + '=' + line, end='')\n")
    out = (await runner.exec(py(code))).response.stdout.decode()
    seen: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        who, _, entry = line.partition("=")
        _, controllers, path = entry.split(":", 2)
        seen.setdefault(who, {})[controllers] = path
    run_hierarchies = [c for c in seen["self"]
                       if c == "" or {"pids", "memory", "cpuacct"} & set(c.split(","))]
    if not CGROUP:
        assert set(seen["self"].values()) == {"/"}, out  # no cgroup of the run's own
        return
    assert run_hierarchies, out
    for controllers in run_hierarchies:
        if controllers == "" and len(seen["self"]) > 1:
            continue  # v1 host: the unified hierarchy holds no run cgroup
        assert seen["self"][controllers] == "/", out
        assert seen["1"][controllers] == seen["2"][controllers] == "/../sup", out


async def test_the_request_is_not_the_programs_memory(runner: Runner) -> None:
    """A 30 MiB input file is the adapter's copy, not `true`'s: it exits 0
    under memory_bytes 64 MiB and reports under 8 MiB. Main reported 70 MiB
    and, under 64 MiB, ended `memory_limit` before the program started."""
    limits = runner.limits.replace(memory_bytes=64 * MiB, wall_time_s=scaled(30))
    files = {"in.bin": os.urandom(30 * MiB)}
    await runner.exec(["true"], files=files, limits=limits)  # warm-up: the binary's pages
    result = await runner.exec(["true"], files=files, limits=limits)
    usage = result.usage
    assert usage is not None
    assert result.response.exit_code == 0
    if not CGROUP:
        # Documented (docs/figures.md): max_rss keeps the adapter's peak at
        # the spawn (its request copy included) across the program's exec.
        assert usage.memory_source == "max_rss"
        assert usage.peak_memory_bytes >= 30 * MiB, usage
        return
    assert usage.peak_memory_bytes < 8 * MiB, usage
    assert usage.memory_source == "cgroup"


async def test_four_concurrent_100_mib_processes_count_together(runner: Runner) -> None:
    """The peak is the tree's at once (`prog`'s), not its largest process's:
    main's `ru_maxrss` reported 106 MiB for four 100 MiB processes."""
    code = ("import os, time\nkids = []\nfor _ in range(4):\n"
            "    r, w = os.pipe()\n    pid = os.fork()\n    if pid == 0:\n"
            "        b = bytearray(100 << 20)\n"
            "        for i in range(0, len(b), 4096): b[i] = 1\n"
            "        os.write(w, b'x')\n        time.sleep(60)\n"
            "    os.close(w)\n    kids.append((pid, r))\n"
            "for pid, r in kids: os.read(r, 1)\n"
            "for pid, r in kids: os.kill(pid, 9); os.waitpid(pid, 0)\n")
    limits = runner.limits.replace(memory_bytes=1024 * MiB, processes=16,
                                   wall_time_s=scaled(60))
    usage = (await runner.exec(py(code), limits=limits)).usage
    assert usage is not None
    if CGROUP:
        assert usage.memory_source == "cgroup"
        assert usage.peak_memory_bytes >= 400 * MiB, usage
    else:  # documented: the largest single process
        assert usage.memory_source == "max_rss"
        assert 100 * MiB <= usage.peak_memory_bytes < 200 * MiB, usage


#: Ignores SIGCHLD (the kernel reaps its children, dropping their rusage),
#: then runs 6 children one after another (a pipe's EOF says one is gone),
#: each touching 100 MiB and spinning SPIN_S of CPU (0.3 s, `scaled`: on a
#: slow host the first child's touch alone must not reach cpu_time_s).
SPIN_S = scaled(0.3)
AUTO_REAPED = f"SPIN = {SPIN_S}\n" + """\
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
for _ in range(6):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        b = bytearray(100 << 20)
        for i in range(0, len(b), 4096): b[i] = 1
        t = time.process_time()
        while time.process_time() - t < SPIN: pass
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
"""


async def test_children_the_kernel_reaps_still_count(runner: Runner) -> None:
    """A tree that ignores SIGCHLD: on main it ended exit 0 with 0.004 s
    of CPU and a 9 MB peak under cpu_time_s=1; its cgroup counts it all."""
    limits = runner.limits.replace(cpu_time_s=scaled(1.0), memory_bytes=512 * MiB, processes=16,
                                   wall_time_s=scaled(60))
    if not CGROUP:  # documented (docs/figures.md): invisible; wall_time_s bounds them
        usage = (await runner.exec(py(AUTO_REAPED), limits=limits)).usage
        assert usage is not None
        assert usage.cpu_source == "rusage"
        assert usage.cpu_s < scaled(0.5), usage
        return
    with pytest.raises(RunnerError) as info:
        await runner.exec(py(AUTO_REAPED), limits=limits)
    e = info.value
    assert e.reason is Reason.CPU_TIME, (e.reason, e.detail)
    assert e.usage is not None
    assert e.usage.cpu_source == "cgroup"
    assert e.usage.cpu_s >= scaled(1.0), e.usage
    assert e.usage.peak_memory_bytes >= 100 * MiB, e.usage


async def test_usage_says_where_its_figures_came_from(runner: Runner) -> None:
    usage = (await runner.exec(["true"])).usage
    assert usage is not None
    expected = ("cgroup", "cgroup") if CGROUP else ("max_rss", "rusage")
    assert (usage.memory_source, usage.cpu_source) == expected


async def test_a_run_mode_is_its_own_program_in_its_leaf(runner: Runner) -> None:
    """A run() mode's adapter is its program: it joins `prog` before any
    of its code, so memory_bytes bounds it as before."""
    limits = Limits(memory_bytes=128 * MiB, wall_time_s=scaled(30))
    code = "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    if not HOST.memory_cgroup_base:
        pytest.skip("no memory cgroup for this caller's runs: RLIMIT_AS bounds a run() mode")
    from support import PRELUDE

    with pytest.raises(RunnerError) as info:
        await runner.run("children:run_code", PRELUDE + code, limits=limits)
    assert info.value.reason is Reason.MEMORY_LIMIT, (info.value.reason, info.value.detail)
    assert "memory_bytes" in info.value.detail
    assert "trunner's side" not in info.value.detail


async def test_a_run_modes_figures_are_its_cgroups_from_the_request_on(runner: Runner) -> None:
    """A run() mode's figures were its adapter's rusage: children the kernel
    reaps were invisible. Where the run has cgroups they are now `prog`'s,
    read by the parent after the run: its CPU since the request was
    written, and its peak."""
    from support import PRELUDE

    # Its children spin 6 x SPIN_S (scaled): the CPU bound is scaled with them.
    limits = runner.limits.replace(memory_bytes=512 * MiB, processes=16, cpu_time_s=scaled(10),
                                   wall_time_s=scaled(60))
    usage = (await runner.run("children:run_code", PRELUDE + AUTO_REAPED, limits=limits)).usage
    assert usage is not None
    if not CGROUP:  # documented (docs/figures.md): the adapter's own rusage
        assert (usage.memory_source, usage.cpu_source) == ("max_rss", "rusage")
        assert usage.cpu_s < scaled(0.9), usage
        return
    assert (usage.memory_source, usage.cpu_source) == ("cgroup", "cgroup")
    assert usage.cpu_s >= 6 * SPIN_S, usage
    assert usage.peak_memory_bytes >= 100 * MiB, usage


#: Queues as much as it can on its own loopback, then prints what its
#: network namespace holds queued: `tx_queue` + `rx_queue` over
#: /proc/net/{tcp,udp}{,6} (the run's own namespace: no other tenant's).
SOCKET_HOG = """\
import socket, sys
kind = sys.argv[1]
tables = [open("/proc/net/" + name) for name in ("tcp", "tcp6", "udp", "udp6")]  # read last
held, sent = [], 0
chunk = b"x" * 65536
if kind == "tcp":
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)
    for _ in range(150):
        try:
            c = socket.socket()
            c.connect(srv.getsockname())
            held += [c, srv.accept()[0]]
        except OSError:  # out of descriptors (RLIMIT_NOFILE)
            break
        c.setblocking(False)
        try:
            while True:
                sent += c.send(chunk)
        except OSError:
            pass
        if sent > 256 << 20:
            break
else:
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setblocking(False)
    for _ in range(300):
        try:
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        except OSError:  # out of descriptors (RLIMIT_NOFILE)
            break
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
        rx.bind(("127.0.0.1", 0))
        held.append(rx)
        for _ in range(16):  # a full receiver drops the rest: no EAGAIN
            try:
                sent += tx.sendto(chunk[:60000], rx.getsockname())
            except OSError:
                pass
        if sent > 256 << 20:
            break
queued = 0
for table in tables:
    for line in table.read().splitlines()[1:]:
        tx_q, rx_q = line.split()[4].split(":")
        queued += int(tx_q, 16) + int(rx_q, 16)
print(queued, sent)
"""


@pytest.mark.parametrize("kind", ["tcp", "udp"])
async def test_socket_buffers_stay_within_the_runs_bound(runner: Runner, kind: str) -> None:
    """On main, one run under memory_bytes 128 MiB queued 1024 MiB of TCP
    and 1025 MiB of UDP on its own loopback. On cgroup v1 `prog`'s
    `memory.kmem.tcp.limit_in_bytes` (its `socket_bytes`, memory_bytes)
    bounds both; on v2 they count in `memory.max`. Slack: 16 MiB (the
    kernel's per-socket forward allocations and its forced charges)."""
    if not HOST.memory_cgroup_base:
        pytest.skip("no memory cgroup for this caller's runs: socket buffers are not bounded"
                    " (docs/jail.md, what bounds a run's memory)")
    limits = runner.limits.replace(memory_bytes=64 * MiB, wall_time_s=scaled(60))
    try:
        result = await runner.exec([*py(SOCKET_HOG), kind], limits=limits)
    except RunnerError as e:  # v2: the program may be OOM-killed at its bound instead
        failure: RunnerError | None = e
    else:
        failure = None
    if failure is not None:
        assert failure.reason is Reason.MEMORY_LIMIT, (failure.reason, failure.detail)
        return
    queued, sent = map(int, result.response.stdout.split())
    print(f"{kind}: queued {queued / MiB:.1f} MiB of {sent / MiB:.1f} MiB sent")
    assert queued <= 64 * MiB + 16 * MiB, (queued, sent)
