#!/usr/bin/env python3
"""Spawn latency, throughput, parent CPU and stdout drain of trunner, side by side.

    python benchmarks/spawn_latency.py [--quick] [--json] [--save F] [--compare F] [--from F]
                                       [--plot out.svg] [-n N]

One run measures every variant in the same process, after a warm-up, in
interleaved order (each iteration visits every variant once, round robin, the
starting variant rotating), so machine drift hits all variants alike:

  bare               trio.run_process of `trunner-worker echo`, no jail
  trunner_cold       Runner().run("echo", payload): the jail as shipped
  trunner_prewarmed  runner.pool("echo", size=4): a warm worker per call
  bwrap              bubblewrap around the bare worker (skipped if absent)
  cat                /bin/cat echoing the frame: the process-spawn floor
  python_floor       `python -I -S -c pass`: the interpreter start-up floor

A round trip is: spawn, write one 64-byte request frame, read the whole reply,
wait for exit (and, for trunner, everything Runner.run does around that).

Also: invocations/s at concurrency 1..16, parent CPU per invocation, the
stdout drain rate of trunner's parent path against a plain pipe, and the
issue's targets as ratios with PASS/MISS (reported, never asserted).
Then the exec block (issue 22; alone with --exec-block): `exec /bin/true` bare,
under bwrap, Runner().exec cold and through a pool, and a pooled `echo`
against `python -I -S -c pass`, in rotating blocks of N runs, with the host's
busy CPU from /proc/stat per run, the idle background, and invocations/s at
concurrency 4.
Progress goes to stderr; the table (or, with --json, one JSON object) to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable  # noqa: TC003  annotate the Variant dataclass
from dataclasses import dataclass, field
from typing import Any

import trio

from trunner.protocol import decode_single_frame, encode_frame

MiB = 1024 * 1024
#: Request payload: msgpack bin8 of 58 bytes, so the frame is 64 bytes.
PAYLOAD = b"x" * 58
FRAME = encode_frame(PAYLOAD)
assert len(FRAME) == 64, len(FRAME)

CONCURRENCY = (1, 2, 4, 8, 16)
#: Workers the pre-warmed variant keeps ready.
POOL_SIZE = 4
LATENCY_VARIANTS = ("bare", "trunner_cold", "trunner_prewarmed", "bwrap", "cat", "python_floor")
#: Variants measured under concurrency (the others are too cheap or n/a).
THROUGHPUT_VARIANTS = ("bare", "trunner_cold", "trunner_prewarmed")


def bwrap_mounts(paths: list[str]) -> list[str]:
    """bubblewrap's mount options: read-only binds of `paths` that exist (a
    path under another one bound is left to it), `--dev /dev`, `--proc /proc`
    and `--tmpfs /tmp`, ordered parents first, so a bind of a path under
    /tmp (a checkout in the temp dir) lands on top of the tmpfs instead of
    being hidden by it."""
    binds: list[str] = []
    for path in sorted({os.path.abspath(p) for p in paths if os.path.exists(p)}, key=len):
        if not any(path == b or path.startswith(b + "/") for b in binds):
            binds.append(path)
    mounts = [(path, 1, ["--ro-bind", path, path]) for path in binds]
    mounts += [("/dev", 0, ["--dev", "/dev"]), ("/proc", 0, ["--proc", "/proc"]),
               ("/tmp", 0, ["--tmpfs", "/tmp"])]
    # Shallower first; at equal depth the fresh mount before a bind of the same path.
    mounts.sort(key=lambda m: (m[0].rstrip("/").count("/"), m[1]))
    return [arg for _, _, args in mounts for arg in args]


#: What every bwrap variant binds read-only (as it exists on the host).
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc/ld.so.cache")


def bwrap_argv(bwrap: str, adapter: tuple[str, ...]) -> list[str]:
    """bubblewrap around `adapter`, binding read-only only what it needs: the
    system dirs, the venv, its base interpreter's prefix and trunner's dir,
    wherever they are (a project's .venv included, a checkout under /tmp too)."""
    from trunner.linux.probe import trunner_dir

    wanted = [*SYSTEM_DIRS,
              sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable)),
              os.path.dirname(os.path.abspath(adapter[0])), trunner_dir()]
    return [bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            *bwrap_mounts(wanted), "--chdir", "/tmp", "--", *adapter]


def worker_adapter(worker: str) -> tuple[str, ...]:
    """How trunner starts the `echo` adapter (`python -I -S ...` where this
    revision does), so bare, bwrap and trunner run the same adapter."""
    try:  # a trunner of the restructure on: the backend knows
        from trunner.linux.backend import LinuxBackend

        return LinuxBackend(worker).adapter_argv("echo", builtin=True)
    except (ImportError, AttributeError):
        pass
    try:
        from trunner.worker import adapter_argv  # type: ignore[attr-defined]
    except ImportError:  # an older trunner: the script under its shebang
        return (worker, "echo")
    return adapter_argv(worker, "echo")  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Settings:
    n: int
    warmup: int
    tp_window_s: float
    tp_rounds: int
    drain_bytes: int
    drain_reps: int


DEFAULT = Settings(n=150, warmup=5, tp_window_s=1.2, tp_rounds=2, drain_bytes=256 * MiB,
                   drain_reps=3)
QUICK = Settings(n=8, warmup=1, tp_window_s=0.5, tp_rounds=1, drain_bytes=16 * MiB,
                 drain_reps=2)


def plain_env(work_dir: str) -> dict[str, str]:
    """The unjailed variants' whole environment: what the jail's default
    profile sets (nothing inherited), so start-up work is comparable."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work_dir, "TMPDIR": work_dir,
            "LANG": "C.UTF-8"}


class BenchError(RuntimeError):
    """A round trip did not produce the expected answer: the figures would lie."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- variants ----------------------------------------------------------------


@dataclass
class Variant:
    name: str
    call: Callable[[], Awaitable[None]] | None  # one verified round trip; None: n/a
    note: str = ""  # why it is n/a, or what it is
    #: Untimed, after each timed call: let background work finish (pool refill).
    settle: Callable[[], Awaitable[None]] | None = None
    samples_s: list[float] = field(default_factory=list)
    parent_cpu_s: float = 0.0
    child_cpu_s: float = 0.0


async def _run_checked(argv: list[str], stdin: bytes, env: dict[str, str], cwd: str) -> bytes:
    proc = await trio.run_process(
        argv, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False,
        env=env, cwd=cwd,
    )
    if proc.returncode != 0:
        raise BenchError(f"{argv[0]} exited {proc.returncode}: {proc.stderr[-400:]!r}")
    return proc.stdout


def worker_call(argv: list[str], env: dict[str, str], cwd: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        out = await _run_checked(argv, FRAME, env, cwd)
        if decode_single_frame(out) != PAYLOAD:
            raise BenchError(f"{argv[0]}: wrong reply {out[:80]!r}")
    return call


def cat_call(env: dict[str, str], cwd: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        if await _run_checked(["/bin/cat"], FRAME, env, cwd) != FRAME:
            raise BenchError("cat did not echo the frame")
    return call


def python_floor_call(env: dict[str, str], cwd: str) -> Callable[[], Awaitable[None]]:
    argv = [os.path.realpath(sys.executable), "-I", "-S", "-c", "pass"]

    async def call() -> None:
        await _run_checked(argv, FRAME, env, cwd)
    return call


def runner_call(runner: Any) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        result = await runner.run("echo", PAYLOAD)
        if result.response != PAYLOAD:
            raise BenchError(f"trunner: wrong reply {result.response!r}")
    return call


async def open_prewarmed(runner: Any, stack: contextlib.AsyncExitStack, size: int) -> Variant:
    """The pre-warmed variant: `async with runner.pool("echo", size=N) as pool:
    await pool.run(payload)`, n/a where Runner has no `pool`.

    Each timed call is followed by an untimed wait until the pool is full
    again and every idle worker is blocked reading its request (helper done,
    adapter imported), so the background refill never overlaps another
    measurement and every timed call finds a warm worker.
    """
    name = "trunner_prewarmed"
    if runner is None:
        return Variant(name, None, "no Runner on this host")
    if not callable(getattr(runner, "pool", None)):
        return Variant(name, None, "Runner has no `pool`")
    try:
        pool = await stack.enter_async_context(runner.pool("echo", size=size))
    except (TypeError, ValueError, AttributeError) as e:
        return Variant(name, None, f"Runner.pool does not fit this harness: {e!r}")

    async def call() -> None:
        result = await pool.run(PAYLOAD)
        if result.response != PAYLOAD:
            raise BenchError(f"trunner pool: wrong reply {result.response!r}")

    async def settle() -> None:
        await wait_pool_warm(pool, size)

    try:
        await settle()
        await call()
        await settle()
    except (BenchError, OSError) as e:
        return Variant(name, None, f"probe failed: {e}")
    return Variant(name, call, f"pool of {size}", settle=settle)


def _descendants(pid: str) -> list[str]:
    """Every descendant of `pid` (a jailed adapter is the helper's grandchild)."""
    import glob

    out: list[str] = []
    todo = [pid]
    while todo:
        for path in glob.glob(f"/proc/{todo.pop()}/task/*/children"):
            try:
                with open(path) as f:
                    found = f.read().split()
            except OSError:
                continue
            out += found
            todo += found
    return out


def _warm_worker_pids(adapter: tuple[str, ...]) -> int:
    """How many of our descendants run `adapter` and sit in read(0, ...).

    A pool with a fork server (`backend.fork_server`) forks its workers from
    the server, adapter imported, so they carry the server's argv: the
    adapter's with `server ...` in place of the mode."""
    served = (*adapter[:-1], "server")
    warm = 0
    for pid in _descendants(str(os.getpid())):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = tuple(a.decode() for a in f.read().split(b"\0") if a)
            if argv[-len(adapter):] != adapter and argv[:len(served)] != served:
                continue
            with open(f"/proc/{pid}/syscall") as f:
                fields = f.read().split()
        except (OSError, UnicodeDecodeError):
            continue
        # "0 0x0 ...": blocked in read(2) on fd 0, i.e. waiting for the frame.
        if fields[:2] == ["0", "0x0"]:
            warm += 1
    return warm


async def wait_pool_warm(pool: Any, size: int, timeout_s: float = 30.0) -> None:
    from trunner.worker import locate_worker

    adapter = worker_adapter(locate_worker())
    with trio.move_on_after(timeout_s):
        # Polls the pool and /proc: no event to wait on.
        while (getattr(pool, "idle_workers", size) < size  # noqa: ASYNC110
               or _warm_worker_pids(adapter) < size):
            await trio.sleep(0.002)
        return
    raise BenchError(f"the pool did not refill to {size} warm workers in {timeout_s} s")


async def probe(variant: Variant) -> Variant:
    """Run one round trip; a variant that cannot do one is n/a, with the reason."""
    if variant.call is not None:
        try:
            await variant.call()
        except (BenchError, OSError) as e:
            return Variant(variant.name, None, f"probe failed: {e}")
        except Exception as e:  # a RunnerError: this host cannot run it
            return Variant(variant.name, None, f"probe failed: {e!r}")
    return variant


# -- measurements ------------------------------------------------------------


def _cpu(who: int) -> float:
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


async def measure_latency(variants: list[Variant], n: int, warmup: int) -> None:
    """Interleaved: each iteration runs every variant once, starting one further on."""
    active = [v for v in variants if v.call is not None]
    total = warmup + n
    for i in range(total):
        k = i % len(active)
        for v in active[k:] + active[:k]:
            assert v.call is not None
            p0, c0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            await v.call()
            t1 = time.perf_counter()
            p1, c1 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
            if i >= warmup:
                v.samples_s.append(t1 - t0)
                v.parent_cpu_s += p1 - p0
                v.child_cpu_s += c1 - c0
            if v.settle is not None:
                await v.settle()
        if (i + 1) % max(1, total // 5) == 0:
            log(f"  latency: {i + 1}/{total} iterations")


async def throughput_window(call: Callable[[], Awaitable[None]], c: int, window_s: float
                            ) -> tuple[float, float, list[float]]:
    """`c` closed-loop callers for `window_s`. Returns (work done in the
    steady part of the window, its length, latencies).

    Every call contributes the fraction of its duration that lies in
    [start + 15% of the window, end]; during that interval all `c` callers
    are busy, so ramp-up and the tail (calls finishing after the end) bias
    nothing.
    """
    spans: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    t_end = t0 + window_s

    async def caller() -> None:
        while time.perf_counter() < t_end:
            s = time.perf_counter()
            await call()
            spans.append((s, time.perf_counter()))

    async with trio.open_nursery() as nursery:
        for _ in range(c):
            nursery.start_soon(caller)
    a, b = t0 + 0.15 * window_s, t_end
    work = sum(max(0.0, min(e, b) - max(s, a)) / (e - s) for s, e in spans if e > s)
    return work, b - a, [e - s for s, e in spans]


async def measure_throughput(variants: list[Variant], settings: Settings
                             ) -> dict[str, dict[str, Any]]:
    """Invocations/s per concurrency level; rounds interleave levels and variants."""
    active = [v for v in variants if v.call is not None]
    acc: dict[tuple[str, int], list[float]] = {}
    lat: dict[tuple[str, int], list[float]] = {}
    step = 0
    for r in range(settings.tp_rounds):
        for c in CONCURRENCY:
            k = step % len(active)
            step += 1
            for v in active[k:] + active[:k]:
                assert v.call is not None
                work, length, lats = await throughput_window(v.call, c, settings.tp_window_s)
                if v.settle is not None:
                    await v.settle()
                a = acc.setdefault((v.name, c), [0.0, 0.0])
                a[0] += work
                a[1] += length
                lat.setdefault((v.name, c), []).extend(lats)
        log(f"  throughput: round {r + 1}/{settings.tp_rounds}")
    out: dict[str, dict[str, Any]] = {}
    for v in active:
        out[v.name] = {
            "per_s": {str(c): acc[(v.name, c)][0] / acc[(v.name, c)][1] for c in CONCURRENCY},
            "latency_p50_ms": {str(c): 1e3 * statistics.median(lat[(v.name, c)])
                               for c in CONCURRENCY},
        }
    return out


class _TimedStream:
    """Wraps the child's stdout stream to time the first byte and EOF."""

    def __init__(self, inner: trio.lowlevel.FdStream) -> None:
        self.inner = inner
        self.first: float | None = None
        self.first_len = 0
        self.eof: float | None = None
        self.reads = 0  # non-empty reads

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        chunk = await self.inner.receive_some(max_bytes)
        now = time.perf_counter()
        if chunk:
            self.reads += 1
        if chunk and self.first is None:
            self.first, self.first_len = now, len(chunk)
        if not chunk:
            self.eof = now
        return chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _trim_heap() -> None:
    """Give freed heap back to the kernel (glibc), so an earlier drain's
    retained buffer does not hide this one's growth."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Bare:
    """A jail that holds nothing, for a bare drain (`trunner.jail.Jail`)."""

    memory_sample_s = None  # nothing to sample (supervise asks from 0c47465 on)

    def __init__(self, command: Any) -> None:
        self.command, self.jail_dir = command, "/"

    def spawned(self, pgid: int) -> None:
        pass

    def killed(self, pgid: int) -> None:
        pass

    async def wait_gone(self, pgid: int, report: bytes) -> None:
        pass


async def drain_trunner(nbytes: int, backend: Any | None, temp_root: str) -> dict[str, float]:
    """One capped drain through trunner.spawn + trunner.nursery_run.supervise,
    the parent's exact drain path. With `backend`, the command is jailed
    (helper, Landlock, seccomp ...) as Runner would; without, it is bare."""
    import gc
    import inspect

    from trunner.cleanup import remove_tree
    from trunner.jail import Command
    from trunner.limits import Limits
    from trunner.nursery_run import supervise
    from trunner.spawn import spawn

    argv = ("/bin/sh", "-c", f"head -c {nbytes} /dev/zero")
    jail, jail_dir = None, None
    if backend is not None:
        jail_dir = tempfile.mkdtemp(prefix="trunner-", dir=temp_root)
        limits = Limits(wall_time_s=300, stdout_max_bytes=nbytes)
        jail = backend.open_jail(jail_dir=jail_dir, adapter_argv=argv, limits=limits)
        cmd = jail.command
    else:
        cmd = Command(argv=argv, env={}, cwd="/")
    # A trunner of the restructure on spawns a Jail; older revisions a Command.
    target: Any = cmd
    if "jail" in inspect.signature(spawn).parameters:
        target = jail if jail is not None else _Bare(cmd)
    gc.collect()
    _trim_heap()
    hwm_ok = _reset_peak_rss()
    rss0 = _status_kib("VmRSS")
    sampled = [rss0]

    async def sample_rss() -> None:
        while True:
            sampled.append(_status_kib("VmRSS"))
            await trio.sleep(0.005)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_rss)
            t0 = time.perf_counter()
            child = await spawn(target)
            timed = _TimedStream(child.stdout)
            child.stdout = timed  # type: ignore[assignment]
            outcome = await supervise(
                child, b"", deadline=trio.current_time() + 300,
                stdout_max_bytes=nbytes, stderr_max_bytes=64 * 1024,
            )
            t1 = time.perf_counter()
            nursery.cancel_scope.cancel()
        peak = _status_kib("VmHWM") if hwm_ok else max(sampled)
        got = len(outcome.stdout)
        if outcome.failure is not None or outcome.exit_code != 0 or got != nbytes:
            raise BenchError(
                f"drain failed: {outcome.failure} {outcome.detail} exit={outcome.exit_code} "
                f"got={got} stderr={bytes(outcome.stderr[-300:])!r}"
            )
        del outcome
    finally:
        if jail is not None:
            with trio.CancelScope(shield=True):
                await jail.release()
        if jail_dir is not None:
            remove_tree(jail_dir)
    assert timed.first is not None
    assert timed.eof is not None
    stream_s = max(timed.eof - timed.first, 1e-9)
    return {
        "wall_s": t1 - t0,
        "stream_s": stream_s,
        "to_first_byte_s": timed.first - t0,
        "stream_mib_s": (nbytes - timed.first_len) / MiB / stream_s,
        "wall_mib_s": nbytes / MiB / (t1 - t0),
        "peak_rss_growth_mib": (peak - rss0) / 1024,
        "reads": timed.reads,
        "mean_read_kib": nbytes / 1024 / max(timed.reads, 1),
    }


async def drain_floor(nbytes: int) -> float:
    """Wall time of `head -c N /dev/zero | cat > /dev/null` in sh."""
    t0 = time.perf_counter()
    await trio.run_process(["/bin/sh", "-c", f"head -c {nbytes} /dev/zero | cat > /dev/null"])
    return time.perf_counter() - t0


async def measure_drain(settings: Settings, backend: Any | None, temp_root: str
                        ) -> dict[str, Any]:
    n = settings.drain_bytes
    runs: dict[str, list[dict[str, float]]] = {"trunner": [], "trunner_jailed": []}
    floor_n: list[float] = []
    floor_0: list[float] = []
    for rep in range(settings.drain_reps + 1):  # the first rep is a warm-up
        keep = rep > 0
        t = await drain_floor(n)
        t0 = await drain_floor(0)
        if keep:
            floor_n.append(t)
            floor_0.append(t0)
        r = await drain_trunner(n, None, temp_root)
        if keep:
            runs["trunner"].append(r)
        if backend is not None:
            r = await drain_trunner(n, backend, temp_root)
            if keep:
                runs["trunner_jailed"].append(r)
        log(f"  drain: {rep + 1}/{settings.drain_reps + 1}")
    # The floor's own start-up (sh, head, cat) is taken off: a pipe's rate.
    floor_s = max(statistics.median(floor_n) - statistics.median(floor_0), 1e-9)
    out: dict[str, Any] = {
        "bytes": n,
        "reps": settings.drain_reps,
        "pipe_floor_mib_s": n / MiB / floor_s,
        "pipe_floor_wall_s": statistics.median(floor_n),
    }
    for name, rs in runs.items():
        if not rs:
            out[name] = None
            continue
        best = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        best["peak_rss_growth_mib"] = max(r["peak_rss_growth_mib"] for r in rs)
        best["ratio_vs_floor"] = best["stream_mib_s"] / out["pipe_floor_mib_s"]
        out[name] = best
    return out


# -- the exec block (issue 22) ---------------------------------------------------

#: `exec /bin/true` variants, then the `echo` comparison, in one rotation.
EXEC_VARIANTS = ("bare", "bwrap", "trunner_cold", "trunner_warm", "trunner_pool")
ECHO_VARIANTS = ("trunner_pool_echo", "python_floor")
#: Variants measured at concurrency 4 in the exec block.
EXEC_C4_VARIANTS = ("trunner_pool", "trunner_warm", "trunner_cold", "bwrap")
TRUE = "/bin/true"


@dataclass(frozen=True)
class ExecSettings:
    n: int  # sequential invocations per block
    rounds: int  # each round runs one block per variant, the order rotating
    warmup: int  # untimed invocations per variant before the first round
    c4_window_s: float  # the concurrency-4 window, per variant


EXEC_DEFAULT = ExecSettings(n=100, rounds=5, warmup=3, c4_window_s=3.0)
EXEC_QUICK = ExecSettings(n=8, rounds=2, warmup=1, c4_window_s=0.5)

#: /proc/stat's jiffies (USER_HZ) per second.
CLK_TCK = os.sysconf("SC_CLK_TCK")


def host_busy_ms() -> float:
    """Host-wide busy CPU time so far (ms): the first line of /proc/stat,
    user + nice + system + irq + softirq + steal (guest time is already in
    user). Every process counts, reaped or not, and the kernel's work."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    assert fields[0] == "cpu", fields
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return 1e3 * (user + nice + system + irq + softirq + steal) / CLK_TCK


def _descendants_busy() -> bool:
    """Whether any descendant of ours is running (or in uninterruptible sleep)."""
    for pid in _descendants(str(os.getpid())):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in ("R", "D"):
            return True
    return False


async def wait_quiet(pool: Any | None, size: int, timeout_s: float = 30.0) -> None:
    """Until `pool` (if any) holds `size` idle workers and none of our
    descendants has run for two polls in a row: the refill is over (its CPU
    is then counted in the block that caused it, not the next)."""
    with trio.move_on_after(timeout_s):
        quiet = 0
        while quiet < 2:
            await trio.sleep(0.003)
            full = pool is None or getattr(pool, "idle_workers", size) >= size
            quiet = quiet + 1 if full and not _descendants_busy() else 0
        return
    raise BenchError(f"the pool did not refill and settle in {timeout_s} s")


@dataclass
class ExecVariant:
    name: str
    call: Callable[[], Awaitable[None]] | None  # one checked invocation; None: n/a
    note: str = ""
    #: Untimed but counted (CPU): after a block, wait for background work to end.
    settle: Callable[[], Awaitable[None]] | None = None
    rounds: list[dict[str, float]] = field(default_factory=list)


def bare_true_call(env: dict[str, str], cwd: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        await trio.run_process([TRUE], env=env, cwd=cwd)  # check=True: exit 0
    return call


def bwrap_true_argv(bwrap: str) -> list[str]:
    return [bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            *bwrap_mounts(list(SYSTEM_DIRS)), "--", TRUE]


def argv_call(argv: list[str], env: dict[str, str], cwd: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        await _run_checked(argv, b"", env, cwd)
    return call


def exec_call(target: Any) -> Callable[[], Awaitable[None]]:
    """`await target.exec(["/bin/true"])`, a Runner or an exec pool."""
    async def call() -> None:
        result = await target.exec([TRUE])
        if result.response.exit_code != 0:
            raise BenchError(f"/bin/true in trunner: {result.response!r}")
    return call


def echo_pool_call(pool: Any) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        result = await pool.run(b"x")
        if result.response != b"x":
            raise BenchError(f"trunner echo pool: wrong reply {result.response!r}")
    return call


async def _open_pool(runner: Any | None, mode: str, size: int, stack: contextlib.AsyncExitStack
                     ) -> tuple[Any | None, float | None, str]:
    """(pool, seconds to open it, why not)."""
    if runner is None:
        return None, None, "no Runner on this host"
    if not callable(getattr(runner, "pool", None)):
        return None, None, "Runner has no `pool`"
    t0 = time.perf_counter()
    try:
        pool = await stack.enter_async_context(runner.pool(mode, size=size))
    except Exception as e:  # a RunnerError or an older signature: n/a
        return None, None, f"Runner.pool({mode!r}) failed: {e!r}"
    return pool, time.perf_counter() - t0, ""


async def _open_warm(runner: Any | None, stack: contextlib.AsyncExitStack
                     ) -> tuple[Any | None, float | None, str]:
    """(a second Runner of the same backend in a `warm()` block, seconds to
    enter it, why not): the cold variant's Runner stays cold."""
    if runner is None:
        return None, None, "no Runner on this host"
    if not callable(getattr(runner, "warm", None)):
        return None, None, "Runner has no `warm`"
    from trunner import Runner

    warm = Runner(backend=runner.backend, limits=runner.limits, temp_root=runner.temp_root)
    t0 = time.perf_counter()
    try:
        await stack.enter_async_context(warm.warm())
    except Exception as e:
        return None, None, f"Runner.warm() failed: {e!r}"
    return warm, time.perf_counter() - t0, ""


async def _exec_probe(v: ExecVariant, warmup: int) -> ExecVariant:
    """Warm-up calls (one at least): a variant that cannot run is n/a."""
    if v.call is None:
        return v
    try:
        for _ in range(max(1, warmup)):
            await v.call()
        if v.settle is not None:
            await v.settle()
    except Exception as e:
        return ExecVariant(v.name, None, f"probe failed: {e!r}")
    return v


async def _block(v: ExecVariant, n: int) -> dict[str, float]:
    """N sequential invocations: wall, host busy CPU, our own CPU."""
    assert v.call is not None
    h0, p0 = host_busy_ms(), _cpu(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(n):
        await v.call()
    t1 = time.perf_counter()
    if v.settle is not None:
        await v.settle()
    t2 = time.perf_counter()
    h1, p1 = host_busy_ms(), _cpu(resource.RUSAGE_SELF)
    return {"wall_s": t1 - t0, "span_s": t2 - t0, "host_busy_ms": h1 - h0,
            "parent_cpu_ms": 1e3 * (p1 - p0)}


async def _idle_block(duration_s: float) -> dict[str, float]:
    h0, t0 = host_busy_ms(), time.perf_counter()
    await trio.sleep(duration_s)
    h1, t1 = host_busy_ms(), time.perf_counter()
    return {"span_s": t1 - t0, "host_busy_ms": h1 - h0,
            "busy_ms_per_s": (h1 - h0) / (t1 - t0)}


async def _c4(v: ExecVariant, window_s: float) -> dict[str, float]:
    """4 closed-loop callers over `window_s` (the steady part counted, as in
    the throughput section), and the host's busy CPU per invocation."""
    assert v.call is not None
    h0 = host_busy_ms()
    work, length, lats = await throughput_window(v.call, 4, window_s)
    if v.settle is not None:
        await v.settle()
    h1 = host_busy_ms()
    return {"per_s": work / length, "calls": len(lats),
            "host_cpu_ms_per_inv": (h1 - h0) / max(len(lats), 1),
            "latency_p50_ms": 1e3 * statistics.median(lats) if lats else math.nan}


def _ratio_of(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and a > 0 and b > 0 else None


def exec_block_figures(variants: list[ExecVariant], idle: list[dict[str, float]], n: int
                       ) -> dict[str, Any]:
    """Per variant, the median over rounds of the per-run figures. `host_cpu`
    is raw; `host_cpu_net` takes off that round's idle background rate times
    the block's span (calls and settle)."""
    out: dict[str, Any] = {}
    for v in variants:
        if not v.rounds:
            out[v.name] = None
            continue
        per: dict[str, list[float]] = {"wall_ms_per_run": [], "host_cpu_ms_per_run": [],
                                       "background_ms_per_run": [],
                                       "host_cpu_net_ms_per_run": [],
                                       "parent_cpu_ms_per_run": []}
        for b, i in zip(v.rounds, idle, strict=True):
            bg = i["busy_ms_per_s"] * b["span_s"]
            per["wall_ms_per_run"].append(1e3 * b["wall_s"] / n)
            per["host_cpu_ms_per_run"].append(b["host_busy_ms"] / n)
            per["background_ms_per_run"].append(bg / n)
            per["host_cpu_net_ms_per_run"].append((b["host_busy_ms"] - bg) / n)
            per["parent_cpu_ms_per_run"].append(b["parent_cpu_ms"] / n)
        fig: dict[str, Any] = {k: statistics.median(xs) for k, xs in per.items()}
        fig["rounds"] = v.rounds
        out[v.name] = fig
    return out


def exec_ratios(figs: dict[str, Any]) -> dict[str, float | None]:
    def get(name: str, key: str) -> float | None:
        f = figs.get(name)
        return f[key] if f else None

    net, wall = "host_cpu_net_ms_per_run", "wall_ms_per_run"
    raw = "host_cpu_ms_per_run"
    return {
        "pool_vs_bwrap_host_cpu": _ratio_of(get("trunner_pool", net), get("bwrap", net)),
        "pool_vs_bwrap_host_cpu_raw": _ratio_of(get("trunner_pool", raw), get("bwrap", raw)),
        "pool_vs_bwrap_wall": _ratio_of(get("trunner_pool", wall), get("bwrap", wall)),
        "cold_vs_bwrap_host_cpu": _ratio_of(get("trunner_cold", net), get("bwrap", net)),
        "cold_vs_bwrap_host_cpu_raw": _ratio_of(get("trunner_cold", raw), get("bwrap", raw)),
        "cold_vs_bwrap_wall": _ratio_of(get("trunner_cold", wall), get("bwrap", wall)),
        "warm_vs_bwrap_host_cpu": _ratio_of(get("trunner_warm", net), get("bwrap", net)),
        "warm_vs_bwrap_host_cpu_raw": _ratio_of(get("trunner_warm", raw), get("bwrap", raw)),
        "warm_vs_bwrap_wall": _ratio_of(get("trunner_warm", wall), get("bwrap", wall)),
        "echo_pool_vs_python_host_cpu": _ratio_of(get("trunner_pool_echo", net),
                                                  get("python_floor", net)),
        "echo_pool_vs_python_host_cpu_raw": _ratio_of(get("trunner_pool_echo", raw),
                                                      get("python_floor", raw)),
        "echo_pool_vs_python_wall": _ratio_of(get("trunner_pool_echo", wall),
                                              get("python_floor", wall)),
    }


def exec_targets(block: dict[str, Any]) -> dict[str, Any]:
    """Issue 40's targets (the echo one is issue 22's)."""
    r = block["ratios"]
    c4 = block["concurrency4"]
    pool4, bwrap4 = c4.get("trunner_pool"), c4.get("bwrap")
    return {
        "exec_pool_cpu_vs_bwrap": _target(
            r["pool_vs_bwrap_host_cpu"], "<=", 1.5,
            "trunner_pool exec host CPU / bwrap's (background off)"),
        "exec_pool_wall_vs_bwrap": _target(
            r["pool_vs_bwrap_wall"], "<=", 1.3, "trunner_pool exec wall / bwrap's"),
        "exec_warm_cpu_vs_bwrap": _target(
            r.get("warm_vs_bwrap_host_cpu"), "<=", 2.0,
            "exec in a warm Runner, host CPU / bwrap's (background off)"),
        "exec_c4_pool_vs_bwrap": _target(
            _ratio_of(pool4 and pool4["per_s"], bwrap4 and bwrap4["per_s"]), ">=", 1.0,
            "invocations/s at concurrency 4, pool of 4 / bwrap"),
        "echo_pool_cpu_vs_python": _target(
            r["echo_pool_vs_python_host_cpu"], "<=", 0.5,
            "trunner_pool echo host CPU / python -I -S -c pass's (background off)"),
    }


async def measure_exec_block(settings: ExecSettings, runner: Any | None, runner_note: str,
                             bwrap: str | None, env: dict[str, str], work_dir: str
                             ) -> dict[str, Any]:
    """Every variant in blocks of N sequential invocations, one block per
    variant per round, the order rotating between rounds, and one idle block
    per round (as long as the round's median block) for the host's
    background; then invocations/s at concurrency 4."""
    started = time.perf_counter()
    python = [sys.executable, "-I", "-S", "-c", "pass"]
    pool_open_s: dict[str, float | None] = {}
    async with contextlib.AsyncExitStack() as stack:
        pool, pool_open_s["trunner_pool"], pool_note = await _open_pool(
            runner, "exec", 1, stack)
        echo, pool_open_s["trunner_pool_echo"], echo_note = await _open_pool(
            runner, "echo", 1, stack)
        warm, pool_open_s["trunner_warm"], warm_note = await _open_warm(runner, stack)

        async def settle_pool() -> None:
            await wait_quiet(pool, 1)

        async def settle_echo() -> None:
            await wait_quiet(echo, 1)

        log("exec block: probing variants ...")
        variants = [
            ExecVariant("bare", bare_true_call(env, work_dir)),
            ExecVariant("bwrap", argv_call(bwrap_true_argv(bwrap), env, work_dir)
                        if bwrap else None, "" if bwrap else "bwrap not installed"),
            ExecVariant("trunner_cold", exec_call(runner) if runner else None, runner_note),
            ExecVariant("trunner_warm", exec_call(warm) if warm else None, warm_note),
            ExecVariant("trunner_pool", exec_call(pool) if pool else None, pool_note,
                        settle=settle_pool),
            ExecVariant("trunner_pool_echo", echo_pool_call(echo) if echo else None,
                        echo_note, settle=settle_echo),
            ExecVariant("python_floor", argv_call(python, env, work_dir)),
        ]
        variants = [await _exec_probe(v, settings.warmup) for v in variants]
        for v in variants:
            log(f"  {v.name}: {'ok' if v.call else 'n/a (' + v.note + ')'}")
        active = [v for v in variants if v.call is not None]
        idle: list[dict[str, float]] = []
        for r in range(settings.rounds):
            k = r % len(active)
            spans = []
            for v in active[k:] + active[:k]:
                b = await _block(v, settings.n)
                v.rounds.append(b)
                spans.append(b["span_s"])
            idle.append(await _idle_block(statistics.median(spans)))
            log(f"  exec block: round {r + 1}/{settings.rounds}")
    figs = exec_block_figures(variants, idle, settings.n)

    log(f"exec block: concurrency 4, {settings.c4_window_s:g} s each ...")
    c4: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        pool4, pool_open_s["trunner_pool_c4"], pool4_note = await _open_pool(
            runner, "exec", 4, stack)
        warm4, pool_open_s["trunner_warm_c4"], warm4_note = await _open_warm(runner, stack)

        async def settle_pool4() -> None:
            await wait_quiet(pool4, 4)

        by_name = {v.name: v for v in variants}
        c4_variants = [
            ExecVariant("trunner_pool", exec_call(pool4) if pool4 else None, pool4_note,
                        settle=settle_pool4),
            ExecVariant("trunner_warm", exec_call(warm4) if warm4 else None, warm4_note),
            by_name["trunner_cold"],
            by_name["bwrap"],
        ]
        for v in c4_variants:
            if v.call is not None and v.settle is not None:
                await v.settle()
            c4[v.name] = await _c4(v, settings.c4_window_s) if v.call is not None else None
    idle_rates = [i["busy_ms_per_s"] for i in idle]
    block: dict[str, Any] = {
        "settings": dict(settings.__dict__),
        "clk_tck": CLK_TCK,
        "python_floor": sys.executable,
        "background": "subtracted in host_cpu_net_ms_per_run and in the ratios and"
                      " targets (each round's idle rate x the block's span);"
                      " host_cpu_ms_per_run and the *_raw ratios are raw",
        "variants": figs,
        "unavailable": {v.name: v.note for v in variants if v.call is None},
        "idle": {"busy_ms_per_s": statistics.median(idle_rates) if idle_rates else None,
                 "rounds": idle},
        "pool_open_ms": {k: None if s is None else 1e3 * s for k, s in pool_open_s.items()},
        "concurrency4": c4,
        "elapsed_s": time.perf_counter() - started,
    }
    block["ratios"] = exec_ratios(figs)
    block["targets"] = exec_targets(block)
    return block


def render_exec_block(block: dict[str, Any]) -> list[str]:
    s = block["settings"]
    idle = block["idle"]["busy_ms_per_s"]
    lines = [
        f"exec /bin/true block: {s['rounds']} rounds x N={s['n']} sequential runs per variant,"
        f" order rotating; median over rounds; {block['elapsed_s']:.0f} s",
        f"  host CPU = /proc/stat busy (all processes + kernel); idle background"
        f" {idle if idle is not None else math.nan:.1f} ms/s, subtracted in 'net'",
        "  variant                 wall/run  host CPU/run   background   net CPU/run"
        "  parent CPU/run",
    ]
    for name in (*EXEC_VARIANTS, *ECHO_VARIANTS):
        f = block["variants"].get(name)
        if name == ECHO_VARIANTS[0]:
            lines.append("  echo comparison")
        if f is None:
            lines.append(f"  {name:<22} n/a ({block['unavailable'].get(name, '')})")
            continue
        lines.append(
            f"  {name:<22} {f['wall_ms_per_run']:7.2f} ms  {f['host_cpu_ms_per_run']:9.2f} ms"
            f"  {f['background_ms_per_run']:8.2f} ms  {f['host_cpu_net_ms_per_run']:9.2f} ms"
            f"  {f['parent_cpu_ms_per_run']:11.2f} ms")
    opened = ", ".join(f"{k} {'n/a' if v is None else f'{v:.1f} ms'}"
                       for k, v in block["pool_open_ms"].items())
    lines.append(f"  pools opened (outside the blocks): {opened}")
    lines.append("  ratios (net host CPU; raw in brackets)")
    r = block["ratios"]

    def cell(key: str) -> str:
        return "n/a" if r.get(key) is None else f"{r[key]:.3f}"

    lines.append(f"    pool / bwrap:  host CPU {cell('pool_vs_bwrap_host_cpu')}"
                 f" [{cell('pool_vs_bwrap_host_cpu_raw')}]  wall {cell('pool_vs_bwrap_wall')}")
    lines.append(f"    cold / bwrap:  host CPU {cell('cold_vs_bwrap_host_cpu')}"
                 f" [{cell('cold_vs_bwrap_host_cpu_raw')}]  wall {cell('cold_vs_bwrap_wall')}")
    lines.append(f"    warm / bwrap:  host CPU {cell('warm_vs_bwrap_host_cpu')}"
                 f" [{cell('warm_vs_bwrap_host_cpu_raw')}]  wall {cell('warm_vs_bwrap_wall')}")
    lines.append(f"    echo pool / python -I -S -c pass:  host CPU"
                 f" {cell('echo_pool_vs_python_host_cpu')}"
                 f" [{cell('echo_pool_vs_python_host_cpu_raw')}]"
                 f"  wall {cell('echo_pool_vs_python_wall')}")
    lines.append(f"  concurrency 4, {s['c4_window_s']:g} s window   invocations/s"
                 "  host CPU/inv  p50 latency")
    for name in EXEC_C4_VARIANTS:
        c = block["concurrency4"].get(name)
        if c is None:
            lines.append(f"    {name:<32} n/a")
            continue
        label = f"{name} (pool of 4)" if name == "trunner_pool" else name
        lines.append(f"    {label:<32} {c['per_s']:9.1f}  {c['host_cpu_ms_per_inv']:9.2f} ms"
                     f"  {c['latency_p50_ms']:8.2f} ms")
    lines.append("  targets (reported, not asserted; the pool's c=4 >= 3x the previous"
                 " pool's needs an older checkout)")
    lines += _render_targets(block["targets"])
    return lines


# -- report --------------------------------------------------------------------


def pct(xs: list[float], p: float) -> float:
    """Percentile with linear interpolation (p in 0..100)."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def latency_figures(variants: list[Variant]) -> dict[str, Any]:
    figs: dict[str, Any] = {}
    for v in variants:
        if not v.samples_s:
            figs[v.name] = None
            continue
        ms = [1e3 * s for s in v.samples_s]
        figs[v.name] = {
            "n": len(ms),
            "p50": pct(ms, 50), "p90": pct(ms, 90), "p99": pct(ms, 99),
            "mean": statistics.fmean(ms), "min": min(ms), "max": max(ms),
            "parent_cpu_ms_per_inv": 1e3 * v.parent_cpu_s / len(ms),
            # bwrap exits without reaping its sandboxed init, so that CPU
            # never reaches our RUSAGE_CHILDREN: not a figure.
            "child_cpu_ms_per_inv": (None if v.name == "bwrap"
                                     else 1e3 * v.child_cpu_s / len(ms)),
        }
    bare = figs.get("bare")
    for f in figs.values():
        if f is not None and bare is not None:
            f["ratio_vs_bare"] = {p: f[p] / bare[p] for p in ("p50", "p90", "p99")}
    return figs


def _target(value: float | None, op: str, threshold: float, what: str) -> dict[str, Any]:
    if value is None:
        return {"what": what, "value": None, "op": op, "threshold": threshold,
                "pass": None, "status": "n/a"}
    ok = {"<=": value <= threshold, "<": value < threshold, ">=": value >= threshold}[op]
    return {"what": what, "value": value, "op": op, "threshold": threshold,
            "pass": ok, "status": "PASS" if ok else "MISS"}


def _render_targets(ts: dict[str, Any]) -> list[str]:
    lines = []
    width = max([20, *map(len, ts)])
    for name, t in ts.items():
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(f"  {t['status']:<5} {name:<{width}} {value:>7} {t['op']:>2}"
                     f" {t['threshold']:<4g}  {t['what']}")
    return lines


def targets(lat: dict[str, Any], tp: dict[str, Any], drain: dict[str, Any]) -> dict[str, Any]:
    target = _target

    bare, cold, pre = lat.get("bare"), lat.get("trunner_cold"), lat.get("trunner_prewarmed")
    py, bw = lat.get("python_floor"), lat.get("bwrap")
    overhead = None
    if bare and cold and py:
        overhead = (cold["p50"] - bare["p50"]) / py["p50"]
    pre_vs_bare = pre["p50"] / bare["p50"] if pre and bare else None
    pre_vs_bwrap = pre["p50"] / bw["p50"] if pre and bw else None
    cold_vs_floor = cold["p50"] / py["p50"] if cold and py else None
    cpu_vs_floor = (cold["child_cpu_ms_per_inv"] / py["child_cpu_ms_per_inv"]
                    if cold and py and py["child_cpu_ms_per_inv"] else None)
    scale = None
    if "trunner_cold" in tp:
        per = tp["trunner_cold"]["per_s"]
        scale = per["4"] / per["1"]
    parent_path = drain.get("trunner")
    return {
        "cold_jail_overhead": target(
            overhead, "<=", 1.2, "(trunner_cold p50 - bare p50) / python -I -S p50"),
        "prewarmed_vs_bare": target(pre_vs_bare, "<=", 0.1, "trunner_prewarmed p50 / bare p50"),
        "prewarmed_vs_bwrap": target(
            pre_vs_bwrap, "<=", 0.15, "trunner_prewarmed p50 / bwrap p50"),
        "cold_vs_floor": target(
            cold_vs_floor, "<=", 3.0, "trunner_cold p50 / python -I -S p50"),
        "child_cpu_vs_floor": target(
            cpu_vs_floor, "<=", 3.0, "trunner_cold child CPU / python -I -S child CPU"),
        "concurrency_scaling": target(
            scale, ">=", 1.6, "trunner_cold invocations/s at concurrency 4 / at 1"),
        "drain_vs_pipe": target(
            parent_path["ratio_vs_floor"] if parent_path else None, ">=", 0.9,
            "trunner drain stream rate / pipe floor rate"),
    }


def render(report: dict[str, Any]) -> str:
    lines: list[str] = []
    m = report["meta"]
    if "latency_ms" not in report:  # --exec-block: that block alone
        lines.append(f"trunner spawn benchmark, exec block only; {m['elapsed_s']:.0f} s")
        lines.append(f"host: {m['kernel']}, {m['cpus']} CPUs, Python {m['python']}, "
                     f"bwrap {m['bwrap'] or 'absent'}; load avg {m['loadavg_1m'][0]:.1f} -> "
                     f"{m['loadavg_1m'][1]:.1f}")
        lines.append("")
        return "\n".join(lines + render_exec_block(report["exec_block"]))
    lines.append(
        f"trunner spawn benchmark: n={m['n']} per variant after {m['warmup']} warm-up, "
        f"interleaved; request frame {m['frame_bytes']} B; {m['elapsed_s']:.0f} s"
    )
    lines.append(
        f"host: {m['kernel']}, {m['cpus']} CPUs, Python {m['python']}, "
        f"bwrap {m['bwrap'] or 'absent'}; load avg {m['loadavg_1m'][0]:.1f} -> "
        f"{m['loadavg_1m'][1]:.1f}"
    )
    lines.append("")
    lines.append("round trip (ms; ratio to bare)     p50               p90               p99"
                 "       parent CPU/inv  child CPU/inv")
    lat = report["latency_ms"]
    for name in LATENCY_VARIANTS:
        f = lat.get(name)
        if f is None:
            lines.append(f"  {name:<20} n/a ({report['unavailable'].get(name, '')})")
            continue
        cells = []
        for p in ("p50", "p90", "p99"):
            r = f.get("ratio_vs_bare", {}).get(p)
            cells.append(f"{f[p]:8.2f} ({r:5.2f}x)" if r is not None else f"{f[p]:8.2f}")
        child = f["child_cpu_ms_per_inv"]
        child_cell = f"{child:9.2f} ms" if child is not None else "  (not seen)"
        lines.append(
            f"  {name:<20} {cells[0]:>17} {cells[1]:>17} {cells[2]:>17}"
            f"  {f['parent_cpu_ms_per_inv']:9.2f} ms  {child_cell}"
        )
    lines.append("")
    tp = report["throughput"]
    lines.append("invocations/s at concurrency " + "".join(f"{c:>9}" for c in CONCURRENCY)
                 + "   (p50 latency at 16)")
    for name, t in tp.items():
        lines.append(f"  {name:<27} " + "".join(f"{t['per_s'][str(c)]:9.1f}" for c in CONCURRENCY)
                     + f"   {t['latency_p50_ms']['16']:.0f} ms")
    for name in THROUGHPUT_VARIANTS:
        if name not in tp:
            lines.append(f"  {name:<27} n/a")
    lines.append("")
    d = report["drain"]
    lines.append(f"stdout drain, {d['bytes'] // MiB} MiB (median of {d['reps']})"
                 "     stream MiB/s  vs floor   wall MiB/s  first byte  peak RSS growth"
                 "  mean read")
    for name, label in (("trunner", "trunner spawn+supervise"),
                        ("trunner_jailed", "same, jailed (helper)")):
        r = d.get(name)
        if r is None:
            lines.append(f"  {label:<38} n/a")
            continue
        lines.append(
            f"  {label:<38} {r['stream_mib_s']:10.0f}  {r['ratio_vs_floor']:7.2f}x"
            f"  {r['wall_mib_s']:10.0f}  {1e3 * r['to_first_byte_s']:7.1f} ms"
            f"  {r['peak_rss_growth_mib']:9.1f} MiB  {r['mean_read_kib']:6.0f} KiB"
        )
    lines.append(f"  {'pipe floor (head | cat > /dev/null)':<38} {d['pipe_floor_mib_s']:10.0f}"
                 f"  {1.0:7.2f}x")
    lines.append("")
    lines.append("targets (reported, not asserted)")
    lines += _render_targets(report["targets"])
    if report.get("exec_block") is not None:
        lines.append("")
        lines += render_exec_block(report["exec_block"])
    return "\n".join(lines)


def plot(path: str, report: dict[str, Any]) -> str:
    """The latency CDF of every measured variant, as SVG (cdf_svg.py)."""
    from cdf_svg import write_cdf_svg

    m = report["meta"]
    write_cdf_svg(path, report["samples_ms"],
                  f"trunner spawn latency CDF (n={m['n']}, {m['cpus']} CPUs)")
    return f"latency CDF written to {path}"


# -- compare -------------------------------------------------------------------


def _ratio(new: Any, old: Any) -> float | None:
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (new, old))
    return new / old if ok and old > 0 else None


def compare(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Ratios new / old of every figure both runs have (None where one lacks
    it): latency percentiles and CPU per variant, invocations/s per variant
    and concurrency, drain rates."""
    out: dict[str, Any] = {"latency": {}, "throughput": {}, "drain": {}}
    for name in LATENCY_VARIANTS:
        f, g = new["latency_ms"].get(name), old["latency_ms"].get(name)
        keys = ("p50", "p90", "p99", "parent_cpu_ms_per_inv", "child_cpu_ms_per_inv")
        out["latency"][name] = {k: _ratio(f[k], g[k]) if f and g else None for k in keys}
    for name in THROUGHPUT_VARIANTS:
        t, u = new["throughput"].get(name), old["throughput"].get(name)
        out["throughput"][name] = {
            str(c): _ratio(t["per_s"][str(c)], u["per_s"].get(str(c))) if t and u else None
            for c in CONCURRENCY}
    for name in ("trunner", "trunner_jailed"):
        d, e = new["drain"].get(name), old["drain"].get(name)
        out["drain"][name] = _ratio(d["stream_mib_s"], e["stream_mib_s"]) if d and e else None
    c4 = out["throughput"]["trunner_cold"]["4"]
    out["cold_c4_vs_old"] = {
        "what": "trunner_cold invocations/s at concurrency 4, this run / the saved one",
        "value": c4, "op": ">=", "threshold": 1.8,
        "status": "n/a" if c4 is None else "PASS" if c4 >= 1.8 else "MISS"}
    return out


def render_compare(ratios: dict[str, Any], old_path: str) -> str:
    def cell(r: float | None) -> str:
        return f"{r:8.2f}x" if r is not None else f"{'n/a':>9}"

    lines = [f"this run / {old_path} (below 1: this run is faster or cheaper;"
             " for invocations/s, above 1 is better)",
             "  latency and CPU                 p50       p90       p99"
             "  parent CPU  child CPU"]
    for name, r in ratios["latency"].items():
        lines.append(f"  {name:<26}" + "".join(cell(r[k]) + " " for k in (
            "p50", "p90", "p99", "parent_cpu_ms_per_inv", "child_cpu_ms_per_inv")))
    lines.append("  invocations/s at concurrency " + "".join(f"{c:>10}" for c in CONCURRENCY))
    for name, r in ratios["throughput"].items():
        lines.append(f"  {name:<29}" + "".join(" " + cell(r[str(c)]) for c in CONCURRENCY))
    for name, r in ratios["drain"].items():
        lines.append(f"  drain stream rate, {name:<15} {cell(r)}")
    t = ratios["cold_c4_vs_old"]
    value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
    lines.append(f"  {t['status']:<5} cold_c4_vs_old {value:>7} {t['op']} {t['threshold']:g}"
                 f"  {t['what']}")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------


def _bwrap_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip().split()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _meta(load_start: float, worker: str, bwrap: str | None) -> dict[str, Any]:
    return {
        "worker": worker,
        "python": platform.python_version(),
        "python_floor": os.path.realpath(sys.executable),
        "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "bwrap": _bwrap_version(bwrap) if bwrap else None,
        "elapsed_s": 0.0,
        # 1-minute load average before and after: how shared the machine was.
        "loadavg_1m": [load_start, os.getloadavg()[0]],
    }


async def bench(settings: Settings, exec_settings: ExecSettings, exec_only: bool = False
                ) -> dict[str, Any]:
    """The whole run, or with `exec_only` the exec block alone."""
    from trunner.errors import RunnerError
    from trunner.runner import Runner
    from trunner.worker import locate_worker

    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    worker = locate_worker()
    adapter = worker_adapter(worker)
    bwrap = shutil.which("bwrap")
    with tempfile.TemporaryDirectory(prefix="trunner-bench-") as tmp:
        jail_root = os.path.join(tmp, "jails")
        work_dir = os.path.join(tmp, "work")
        os.mkdir(jail_root)
        os.mkdir(work_dir)
        env = plain_env(work_dir)
        runner = None
        runner_note = ""
        try:
            runner = Runner(temp_root=jail_root)
        except RunnerError as e:
            runner_note = f"Runner refused on this host: {e.reason}: {e.detail}"
        if exec_only:
            block = await measure_exec_block(exec_settings, runner, runner_note, bwrap, env,
                                             work_dir)
            leftovers = os.listdir(jail_root)
            if leftovers:
                raise BenchError(f"jail dirs left behind: {leftovers}")
            meta = _meta(load_start, worker, bwrap)
            meta["elapsed_s"] = time.perf_counter() - started
            return {"meta": meta, "exec_block": block}
        async with contextlib.AsyncExitStack() as stack:
            log("probing variants ...")
            variants = [
                await probe(Variant("bare", worker_call([*adapter], env, work_dir))),
                await probe(Variant("trunner_cold",
                                    runner_call(runner) if runner else None, runner_note)),
                await open_prewarmed(runner, stack, size=POOL_SIZE),
                await probe(Variant(
                    "bwrap",
                    worker_call(bwrap_argv(bwrap, adapter), env, work_dir)
                    if bwrap else None,
                    "" if bwrap else "bwrap not installed",
                )),
                await probe(Variant("cat", cat_call(env, work_dir))),
                await probe(Variant("python_floor", python_floor_call(env, work_dir))),
            ]
            for v in variants:
                log(f"  {v.name}: {'ok' if v.call else 'n/a (' + v.note + ')'}")
            if variants[0].call is None:
                raise BenchError(f"the bare worker does not run: {variants[0].note}")
            log(f"latency: {settings.warmup} warm-up + {settings.n} interleaved iterations")
            await measure_latency(variants, settings.n, settings.warmup)
            log("throughput ...")
            tp_variants = [v for v in variants if v.name in THROUGHPUT_VARIANTS]
            tp = await measure_throughput(tp_variants, settings)
        log(f"drain ({settings.drain_bytes // MiB} MiB) ...")
        drain = await measure_drain(settings, runner.backend if runner else None, jail_root)
        block = await measure_exec_block(exec_settings, runner, runner_note, bwrap, env,
                                         work_dir)
        leftovers = os.listdir(jail_root)
        if leftovers:
            raise BenchError(f"jail dirs left behind: {leftovers}")
    lat = latency_figures(variants)
    report: dict[str, Any] = {
        "meta": {
            "n": settings.n,
            "warmup": settings.warmup,
            "throughput_window_s": settings.tp_window_s,
            "throughput_rounds": settings.tp_rounds,
            "frame_bytes": len(FRAME),
            **_meta(load_start, worker, bwrap),
        },
        "latency_ms": lat,
        # Raw round trips (ms), measurement order: for --plot and later looks.
        "samples_ms": {v.name: [1e3 * x for x in v.samples_s] for v in variants if v.samples_s},
        "unavailable": {v.name: v.note for v in variants if v.call is None},
        "throughput": tp,
        "parent_cpu_ms_per_inv": {k: f["parent_cpu_ms_per_inv"] for k, f in lat.items() if f},
        "drain": drain,
        "targets": targets(lat, tp, drain),
        "exec_block": block,
    }
    report["meta"]["elapsed_s"] = time.perf_counter() - started
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a handful of iterations and a 16 MiB drain (~20-30 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--save", metavar="FILE", help="also write the JSON report to FILE")
    parser.add_argument("--compare", metavar="FILE",
                        help="print the ratios of this run to a report saved with --save")
    parser.add_argument("--from", dest="load", metavar="FILE",
                        help="measure nothing: report (and plot, compare) a saved run")
    parser.add_argument("--plot", metavar="FILE.svg", help="write the latency CDF as SVG")
    parser.add_argument("-n", type=int, help="measured iterations per variant")
    parser.add_argument("--drain-mib", type=int, help="size of the drained reply, MiB")
    parser.add_argument("--exec-block", action="store_true",
                        help="run only the exec /bin/true block (and its echo comparison)")
    parser.add_argument("--exec-n", type=int,
                        help="sequential invocations per exec block (default 100, --quick 8)")
    args = parser.parse_args(argv)
    if args.exec_block and (args.compare or args.plot or args.load):
        parser.error("--exec-block measures that block only: no --compare, --plot, --from")
    if args.plot and not args.plot.endswith(".svg"):
        parser.error("--plot writes SVG: give a FILE ending in .svg")
    old = None
    if args.compare:
        with open(args.compare) as f:
            old = json.load(f)
    settings = QUICK if args.quick else DEFAULT
    if args.n is not None:
        if args.n < 1:
            parser.error("-n must be at least 1")
        settings = Settings(**{**settings.__dict__, "n": args.n})
    if args.drain_mib is not None:
        settings = Settings(**{**settings.__dict__, "drain_bytes": args.drain_mib * MiB})
    exec_settings = EXEC_QUICK if args.quick else EXEC_DEFAULT
    if args.exec_n is not None:
        if args.exec_n < 1:
            parser.error("--exec-n must be at least 1")
        exec_settings = ExecSettings(**{**exec_settings.__dict__, "n": args.exec_n})
    if args.load:
        with open(args.load) as f:
            report = json.load(f)
        # Judged by this revision's targets.
        if "latency_ms" in report:
            report["targets"] = targets(report["latency_ms"], report["throughput"],
                                        report["drain"])
        if report.get("exec_block") is not None:
            report["exec_block"]["targets"] = exec_targets(report["exec_block"])
    else:
        report = trio.run(bench, settings, exec_settings, args.exec_block)
    if old is not None:
        report["compare"] = {"against": args.compare, "ratios": compare(report, old)}
    if args.save:
        with open(args.save, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(render(report))
        if old is not None:
            print()
            print(render_compare(report["compare"]["ratios"], args.compare))
    if args.plot:
        log(plot(args.plot, report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
