"""A jailed program that pins host kernel memory one way, and its driver.

`python memory_attack.py MODE CAP_BYTES [HOLD_S]` runs inside the jail: it
pins kernel memory by MODE until the kernel refuses (the errno is the
answer) or until CAP_BYTES (its own brake, so that an unbounded mechanism
does not take the host down), holds it HOLD_S seconds while the host
measures, and prints one JSON line {"mode", "stopped_by", "bytes", "count"}.
`stopped_by` is an errno name, or "cap" when nothing stopped it.

`python memory_attack.py --drive MODE CAP_BYTES MEMORY_BYTES SCRATCH_BYTES`
runs on the host as the caller: one `Runner.exec` of the attack, sampling
while it runs the run's own memory cgroup (as root: its limit and its peak
usage, kernel memory included) and the host's /proc/meminfo; prints one
JSON line with the attack's answer (or the run's refusal reason), the
usage trunner reported, the cgroup's figures and the host's drop (a
host-wide figure: any other process moves it).
Only the standard library inside the jail (ctypes for SysV IPC).
"""

import ctypes
import errno
import json
import os
import signal
import socket
import sys
import time
from typing import Any

_IPC_PRIVATE = 0
_IPC_CREAT = 0o1000
_IPC_NOWAIT = 0o4000
_IPC_RMID = 0
_F_SETPIPE_SZ = 1031
_PAGE = 4096
_SO_SNDBUF_MAX = 64 << 20  # asked for; the kernel clamps it to 2 x wmem_max


State = dict[str, Any]


class Stuck(Exception):
    """The kernel refused: carries the errno."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    libc.shmdt.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return libc


def _check(ret: int) -> int:
    if ret == -1:
        raise Stuck(ctypes.get_errno())
    return ret


def _sem(cap: int, state: State) -> None:
    libc = _libc()
    nsems = 32000
    while state["bytes"] < cap:
        ret = libc.semget(_IPC_PRIVATE, nsems, _IPC_CREAT | 0o600)
        if ret == -1 and ctypes.get_errno() == errno.EINVAL and nsems > 1:
            nsems //= 2  # past SEMMSL
            continue
        _check(ret)
        state["bytes"] += nsems * 64  # struct sem is one cache line
        state["count"] += 1


def _msg(cap: int, state: State) -> None:
    # Full queues of large messages (fast), then as many empty messages as
    # each queue counts (msgmnb: its byte limit counts messages too), each a
    # 64-byte kernel allocation.
    libc = _libc()

    class Msg(ctypes.Structure):
        _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 8192)]

    msg = Msg(1)

    def fill(q: int, size: int) -> None:
        while state["bytes"] < cap:
            if libc.msgsnd(q, ctypes.byref(msg), size, _IPC_NOWAIT) == -1:
                if ctypes.get_errno() != errno.EAGAIN:
                    _check(-1)
                return
            state["bytes"] += size + 64

    queues = []
    try:
        while state["bytes"] < cap:
            queues.append(_check(libc.msgget(_IPC_PRIVATE, _IPC_CREAT | 0o600)))
            state["count"] += 1
            fill(queues[-1], 8192)
    finally:
        for q in queues:
            fill(q, 0)


def _shm(cap: int, state: State) -> None:
    libc = _libc()
    size = 8 << 20
    while state["bytes"] < cap:
        ret = libc.shmget(_IPC_PRIVATE, size, _IPC_CREAT | 0o600)
        if ret == -1 and ctypes.get_errno() == errno.EINVAL and size > _PAGE:
            size //= 2  # past shmmax
            continue
        shmid = _check(ret)
        addr = libc.shmat(shmid, None, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            _check(-1)
        libc.memset(addr, 1, size)  # the pages stay after the detach
        libc.shmdt(ctypes.c_void_p(addr))
        state["bytes"] += size
        state["count"] += 1


def _fill(sock: socket.socket, state: State, cap: int) -> None:
    chunk = b"x" * 65536
    while state["bytes"] < cap:
        try:
            state["bytes"] += sock.send(chunk)
        except BlockingIOError:
            return


def _unix(cap: int, state: State, raise_buffers: bool) -> None:
    held = []
    while state["bytes"] < cap:
        try:
            a, b = socket.socketpair()
        except OSError as e:
            raise Stuck(e.errno) from None
        for s in (a, b):
            s.setblocking(False)
            if raise_buffers:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SO_SNDBUF_MAX)
                except OSError as e:
                    raise Stuck(e.errno) from None
            _fill(s, state, cap)
        held.append((a, b))
        state["count"] += 1
    state["held"] = held


def _pipe(cap: int, state: State) -> None:
    held = []
    while state["bytes"] < cap:
        try:
            r, w = os.pipe()
        except OSError as e:
            raise Stuck(e.errno) from None
        held.append((r, w))
        os.set_blocking(w, False)
        try:
            import fcntl

            fcntl.fcntl(w, _F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass  # past pipe-user-pages-soft: the pipe keeps its size
        chunk = b"x" * 65536
        while state["bytes"] < cap:
            try:
                state["bytes"] += os.write(w, chunk)
            except BlockingIOError:
                break
        state["count"] += 1
    state["held"] = held


def _queued_signals() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("SigQ:"):
                return int(line.split()[1].split("/")[0])
    raise RuntimeError("no SigQ")


def _sigpending(cap: int, state: State) -> None:
    # Real-time signals queued to ourselves, blocked: past RLIMIT_SIGPENDING
    # kill() drops them silently (sigqueue is not allowed), so the count is
    # read back; then POSIX timers, whose preallocated signal counts the
    # same way, until timer_create fails EAGAIN.
    sig = signal.SIGRTMIN
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    pid = os.getpid()
    for _ in range(min(cap // 96, 200_000)):
        os.kill(pid, sig)
    state["count"] = _queued_signals()
    state["bytes"] = state["count"] * 96  # one struct sigqueue
    libc = _libc()
    timer = ctypes.c_void_p()
    while state["bytes"] < cap:
        _check(libc.timer_create(1, None, ctypes.byref(timer)))  # CLOCK_MONOTONIC
        state["bytes"] += 96 + 256  # its signal and its k_itimer
        state["count"] += 1


def _inflight(cap: int, state: State) -> None:
    # Pipes full of data, sent as SCM_RIGHTS over a socket and closed here:
    # in flight, they count against no descriptor limit of the process.
    a, b = socket.socketpair()
    a.setblocking(False)
    state["held"] = (a, b)
    while state["bytes"] < cap:
        try:
            r, w = os.pipe()
        except OSError as e:
            raise Stuck(e.errno) from None
        os.set_blocking(w, False)
        while True:
            try:
                state["bytes"] += os.write(w, b"x" * 65536)
            except BlockingIOError:
                break
        try:
            socket.send_fds(a, [b"x"], [r, w])
        except OSError as e:
            raise Stuck(e.errno) from None
        finally:
            os.close(r)
            os.close(w)
        state["count"] += 2


MODES = {
    "none": lambda cap, state: None,
    "sem": _sem,
    "msg": _msg,
    "shm": _shm,
    "unix": lambda cap, state: _unix(cap, state, True),
    "unix_default": lambda cap, state: _unix(cap, state, False),
    "pipe": _pipe,
    "sigpending": _sigpending,
    "inflight": _inflight,
}



def _fan_out(mode: str, cap: int, state: State) -> None:
    """Run `mode` in as many processes as the run may have (fd limits are
    per process): each child reports its state on a pipe, then holds."""
    r, w = os.pipe()
    kids = 0
    while kids < 30:
        try:
            pid = os.fork()
        except OSError:
            break  # EAGAIN: the run's process limit
        if pid == 0:
            os.close(r)
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):  # or the run would wait for their EOF
                os.dup2(null, fd)
            mine: State = {"bytes": 0, "count": 0}
            stop = "cap"
            try:
                MODES[mode](cap // 30, mine)
            except Stuck as e:
                stop = errno.errorcode.get(e.args[0], str(e.args[0]))
            except BaseException as e:  # reported, not hidden
                stop = f"{type(e).__name__}: {e}"
            os.write(w, json.dumps([stop, mine["bytes"], mine["count"]]).encode() + b"\n")
            time.sleep(3600)
            os._exit(0)
        kids += 1
    os.close(w)
    stops = set()
    with os.fdopen(r) as f:
        for _ in range(kids):
            line = f.readline()
            if not line:
                break
            stop, size, count = json.loads(line)
            stops.add(stop)
            state["bytes"] += size
            state["count"] += count
    state["kids"] = kids
    if stops - {"cap"}:
        state["stops"] = sorted(stops)
        first = sorted(stops - {"cap"})[0]
        raise Stuck(getattr(errno, first, first))


def attack(mode: str, cap: int, hold_s: float) -> None:
    state: State = {"bytes": 0, "count": 0}
    stopped_by = "cap"
    try:
        if mode.endswith("_all"):
            _fan_out(mode[:-4], cap, state)
        else:
            MODES[mode](cap, state)
    except Stuck as e:
        err = e.args[0]
        stopped_by = errno.errorcode.get(err, str(err)) if isinstance(err, int) else err
    print(json.dumps({"mode": mode, "stopped_by": stopped_by, "bytes": state["bytes"],
                      "count": state["count"],
                      "kids": state.get("kids"), "stops": state.get("stops")}), flush=True)
    time.sleep(hold_s)  # held while the host measures


def meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":")
            out[name] = int(value.split()[0]) * 1024
    return out


#: A memory cgroup's figures: v2's file, else v1's.
_CGROUP_FILES = {
    "limit": ("memory.max", "memory.limit_in_bytes"),
    "peak": ("memory.peak", "memory.max_usage_in_bytes"),
    "usage": ("memory.current", "memory.usage_in_bytes"),
}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cgroup_figure(path: str, what: str) -> int | None:
    for name in _CGROUP_FILES[what]:
        text = _read(os.path.join(path, name))
        if text is not None:
            return int(text) if text.isdigit() else None
    return None


def cgroup_parent() -> str | None:
    """Where trunner makes this caller's runs' memory cgroups (as root: one per
    run, under `<memory base>/trunner`); None where the caller has none."""
    from trunner.linux.cgroup import DIR_NAME
    from trunner.linux.probe import probe_host

    base = probe_host().memory_cgroup_base
    return os.path.join(base, DIR_NAME) if base else None


def run_cgroups(parent: str | None) -> list[str]:
    """The program's memory cgroups (each run's `prog` leaf, bounded by
    memory_bytes) of this driver's live runs under `parent`: the runs'
    names start with their owner's id (this process, `owner_id`)."""
    from trunner.cleanup import owner_id
    from trunner.kernel.abi import PROG_CGROUP

    if parent is None:
        return []
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    return [os.path.join(parent, n, PROG_CGROUP) for n in names
            if n.startswith(owner_id() + "-")]


def sample_cgroups(paths: list[str], seen: dict[str, dict[str, int]]) -> None:
    """Fold one reading of each run cgroup into `seen` (path -> its limit, the
    highest peak, usage and number of processes read): the last reading
    before the cgroup goes holds the run's peak (the kernel's high-water mark)."""
    for path in paths:
        figures = {what: _cgroup_figure(path, what) for what in _CGROUP_FILES}
        if figures["limit"] is None:
            continue  # gone between the listing and the read
        procs = len((_read(os.path.join(path, "cgroup.procs")) or "").split())
        mine = seen.setdefault(path, {"limit": figures["limit"], "peak": 0, "usage": 0,
                                      "procs": 0})
        # Unlimited until the helper sets the run's limit: the lowest read is it.
        mine["limit"] = min(mine["limit"], figures["limit"])
        for what in ("peak", "usage"):
            mine[what] = max(mine[what], figures[what] or 0)
        mine["peak"] = max(mine["peak"], mine["usage"])  # v2 before memory.peak (5.19)
        mine["procs"] = max(mine["procs"], procs)


_FIELDS = ("MemAvailable", "Slab", "SUnreclaim", "Shmem")
#: How long the attack holds what it pinned, while the driver samples.
HOLD_S = 2.0


async def drive(mode: str, cap: int, memory_bytes: int, scratch_bytes: int) -> dict[str, Any]:
    import trio

    from trunner import Limits, Runner, RunnerError
    from trunner.protocol import ExecFile

    source = await trio.Path(__file__).read_bytes()
    limits = Limits(memory_bytes=memory_bytes, scratch_bytes=scratch_bytes, wall_time_s=60,
                    cpu_time_s=30)
    abi = os.environ.get("TRUNNER_TEST_LANDLOCK_ABI", "")  # the test run's cap, as conftest
    if abi:
        from trunner.linux.backend import LinuxBackend
        from trunner.worker import locate_worker

        backend = LinuxBackend(locate_worker(), landlock_abi=int(abi))
        runner = Runner(limits=limits, backend=backend)
    else:
        runner = Runner(limits=limits)
    # The test run's TRUNNER_TEST_VIA_POOL (support.VIA_POOL): served by a pool.
    via_pool = os.environ.get("TRUNNER_TEST_VIA_POOL") == "1"
    via_warm = os.environ.get("TRUNNER_TEST_VIA_WARM") == "1"  # support.VIA_WARM: a warm block
    before = {name: meminfo()[name] for name in _FIELDS}
    worst = dict(before)
    out: dict[str, Any] = {"uid": os.getuid(), "before": before}

    async def run() -> None:
        try:
            argv = [sys.executable, "-I", "-S", "attack.py", mode, str(cap), str(HOLD_S)]
            files = {"attack.py": ExecFile(data=source)}
            if via_pool:
                async with runner.pool("exec", size=1) as pool:
                    res = await pool.exec(argv, files=files)
            elif via_warm:
                async with runner.warm():
                    res = await runner.exec(argv, files=files)
            else:
                res = await runner.exec(argv, files=files)
        except RunnerError as e:
            out["reason"] = e.reason.value
            out["detail"] = e.detail
        else:
            r = res.response
            out["exit_code"] = r.exit_code
            if res.usage is not None:
                out["peak_memory_bytes"] = res.usage.peak_memory_bytes
            out["stderr"] = r.stderr.decode(errors="replace")[-2000:]
            lines = r.stdout.decode(errors="replace").strip().splitlines()
            if lines:
                out["attack"] = json.loads(lines[-1])
        done.set()

    done = trio.Event()
    samples: list[tuple[float, int]] = []
    cgroups: dict[str, dict[str, int]] = {}
    parent = cgroup_parent()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        while not done.is_set():
            sample_cgroups(run_cgroups(parent), cgroups)
            now = meminfo()
            samples.append((trio.current_time(), now["MemAvailable"]))
            for name in ("Slab", "SUnreclaim", "Shmem"):
                worst[name] = max(worst[name], now[name])
            with trio.move_on_after(0.02):
                await done.wait()
    end = trio.current_time()
    # What the attack holds shows in every sample of its hold (HOLD_S at the
    # end of the run); another process's passing allocation does not: the
    # drop is the least one inside the hold, short of the teardown.
    hold = [avail for t, avail in samples if end - HOLD_S + 0.3 <= t <= end - 0.4]
    out["drop"] = before["MemAvailable"] - max(hold or [before["MemAvailable"]])
    out["peak_drop"] = before["MemAvailable"] - min(a for _, a in samples)
    out["grew"] = {name: worst[name] - before[name] for name in ("Slab", "SUnreclaim", "Shmem")}
    # The run's own memory cgroup (one run, so one; a pool's worker has its own).
    out["cgroups"] = list(cgroups.values())
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--drive":
        import trio

        mode, cap, memory, scratch = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(trio.run(drive, mode, cap, memory, scratch)))
    else:
        attack(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 1.5)
