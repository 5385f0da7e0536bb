"""`trunner.ray.cluster_pool` on a real 2-node Ray cluster (tests/ray/conftest.py):
routing, parity of errors with a local Runner, a lost node, a killed actor,
cancellation, back-pressure, cleanup, and refused starts."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import ray
import trio
from raysupport import NODE_ARGS, leftovers, own, raylet_pid, trunner_cgroups

from support import host_children, jailed_under, scaled, wait_until
from trunner import Limits, Reason, Runner, RunnerError
from trunner.linux.probe import probe_host
from trunner.ray import AsyncioPool, cluster_pool

if TYPE_CHECKING:
    from collections.abc import Callable

    from raysupport import Nodes

    from trunner.ray.pool import ClusterPool

LIMITS = Limits(wall_time_s=20.0)
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def sleeping(root: Path) -> list[int]:
    """The jailed `sleep`s under `root`: the runs in flight there."""
    return [pid for pid in jailed_under(str(root)) if cmdline(pid).startswith(b"sleep\0")]


def pool(nodes: Nodes, mode: str = "exec", **kw: Any) -> Owned:
    kw.setdefault("limits", LIMITS)
    kw.setdefault("size_per_node", 2)
    kw.setdefault("temp_root", str(nodes.jail_root))
    return Owned(cluster_pool(mode, **kw))


class Owned:
    """`async with` a cluster pool whose actors are recorded as owners of
    this run's cgroups (raysupport.own) on entry, and again before its
    close (a node picked up, an actor restarted meanwhile)."""

    def __init__(self, pool: ClusterPool) -> None:
        self.pool = pool

    async def __aenter__(self) -> ClusterPool:
        entered = await self.pool.__aenter__()
        own(entered)
        return entered

    async def __aexit__(self, *exc: object) -> bool | None:
        own(self.pool)
        return await self.pool.__aexit__(*exc)


async def test_200_requests_over_two_nodes_one_rules_version(nodes: Nodes) -> None:
    built_two_ways = {Runner(limits=LIMITS).rules_version(),
                      Runner(limits=Limits.from_mapping({"wall_time_s": 20})).rules_version()}
    answers: dict[int, bytes] = {}
    async with pool(nodes) as p:
        assert set(p.nodes) == {nodes.head_id, nodes.worker_id}
        # Each node's actor holds its `trunner` resource and reserves its CPU.
        free = ray.available_resources()
        assert free.get("trunner", 0) == 0, free
        assert free.get("CPU", 0) == 0, free

        async def one(i: int) -> None:
            token = f"request {i} {os.urandom(8).hex()}".encode()
            r = await p.exec(["cat"], stdin=token)
            assert r.rules_version == p.rules_version
            assert r.usage is not None
            answers[i] = token if r.response.stdout == token else r.response.stdout

        async with trio.open_nursery() as n:
            for i in range(200):
                n.start_soon(one, i)
        served = {node_id: s.served for node_id, s in (await p.node_stats()).items()}
    assert len(answers) == 200
    assert built_two_ways == {p.rules_version}
    assert set(served) == {nodes.head_id, nodes.worker_id}
    assert all(count > 0 for count in served.values()), served
    assert sum(served.values()) == 200


#: Each reason's snippet and the limits it runs under: a wall time short
#: enough to wait out for `timeout`, generous for the others, so that only
#: that reason can come out whatever the host's load (on a loaded host a
#: cold start, or a spin's 0.5 s of CPU on shared cores, takes more than
#: 1.5 s of wall time).
SHORT = Limits(wall_time_s=1.5, cpu_time_s=0.5, stdout_max_bytes=4096)
LONG = SHORT.replace(wall_time_s=20.0)
CASES = {
    Reason.TIMEOUT: ("import time\ntime.sleep(30)", SHORT),
    Reason.CPU_TIME: ("while True: pass", LONG),
    Reason.STDOUT_CAP: ("import os\nos.write(1, b'x' * 100000)", LONG),
    Reason.NONZERO_EXIT: ("raise ValueError('boom')", LONG),
}


@pytest.mark.slow
async def test_limits_come_back_as_the_local_runner_error(nodes: Nodes) -> None:
    for limits in (SHORT, LONG):
        local = Runner(limits=limits, import_paths=[TESTS_DIR], temp_root=str(nodes.jail_root))
        async with pool(nodes, "children:run_code", limits=limits,
                        import_paths=[TESTS_DIR]) as p:
            for reason, (code, under) in CASES.items():
                if under is not limits:
                    continue
                with pytest.raises(RunnerError) as here:
                    await local.run("children:run_code", code)
                with pytest.raises(RunnerError) as there:
                    await p.run(code)
                assert type(there.value) is RunnerError
                assert here.value.reason is there.value.reason is reason
                if reason is Reason.NONZERO_EXIT:  # (at a kill, whether it exited first is a race)
                    assert there.value.exit_status == here.value.exit_status == 1
                assert there.value.usage is not None
                assert not isinstance(there.value.__cause__, ray.exceptions.RayError)
            ok = await p.run("result = 21 * 2")
            assert ok.response == 42


#: 3 s of the spin's own CPU time: 3x the tight problem's cpu_time_s, under
#: a third of the loose one's (tests/test_pool_limits.py, on one host).
SPIN = ["python3", "-c", "import time\nt = time.process_time()\n"
        "while time.process_time() - t < 3: pass"]
ALLOC = ["python3", "-c", "b = b'x' * (150 * 2**20)\nprint(len(b))"]


async def test_per_call_limits_on_the_cluster(nodes: Nodes) -> None:
    """One cluster pool serves two problems: each call under its own
    limits, on either node, with a local cold run's rules version and
    verdict for them (3x from each limit); the pool's calls keep the pool's."""
    tight = LIMITS.replace(wall_time_s=scaled(60.0), cpu_time_s=1.0, memory_bytes=48 * 2**20)
    loose = LIMITS.replace(wall_time_s=scaled(60.0), cpu_time_s=10.0, memory_bytes=512 * 2**20)
    local = Runner(limits=LIMITS, temp_root=str(nodes.jail_root))
    memory = bool(probe_host().memory_cgroup_base)
    async with pool(nodes, size_per_node=1) as p:
        for limits in (tight, loose, tight, loose):  # sequential: the nodes take turns
            r = await p.exec(["true"], limits=limits)
            assert r.rules_version == local.rules_version(limits) != p.rules_version
        assert (await p.exec(["true"])).rules_version == p.rules_version
        cases = [(SPIN, tight, Reason.CPU_TIME), (SPIN, loose, None)]
        if memory:  # else no memory cgroup: no memory_limit verdict (uid 65534)
            cases += [(ALLOC, tight, Reason.MEMORY_LIMIT), (ALLOC, loose, None)]
        for argv, limits, reason in cases:
            if reason is None:
                there = await p.exec(argv, limits=limits)
                here = await local.exec(argv, limits=limits)
                assert there.response.exit_code == here.response.exit_code == 0
                assert there.rules_version == here.rules_version
            else:
                with pytest.raises(RunnerError) as there_e:
                    await p.exec(argv, limits=limits)
                with pytest.raises(RunnerError) as here_e:
                    await local.exec(argv, limits=limits)
                assert there_e.value.reason is here_e.value.reason is reason
        stats = await p.node_stats()
    assert all(s.served > 0 for s in stats.values()), stats


@pytest.mark.slow
async def test_a_lost_node_fails_its_calls_and_the_rest_finish(
        nodes: Nodes, node_options: dict[str, dict[str, Any]]) -> None:
    lost_root = nodes.worker_root()
    outcomes: list[str] = []
    node_options.update(nodes.options_for_worker())
    async with pool(nodes, in_flight_per_node=4, size_per_node=4) as p:
        worker_pid = p.nodes[nodes.worker_id].pid

        errors: list[RunnerError] = []

        async def one() -> None:
            try:
                r = await p.exec(["sleep", "4"])
                outcomes.append(f"ok {r.response.exit_code}")
            except RunnerError as e:
                errors.append(e)
                after = time.monotonic() - killed
                outcomes.append(f"lost {type(e.__cause__).__name__} {after:.1f}")

        killed = 0.0
        async with trio.open_nursery() as n:
            for _ in range(8):
                n.start_soon(one)
            await wait_until(lambda: len(sleeping(lost_root)) == 4, 20, "4 runs on the worker")
            raylet = raylet_pid(nodes.worker)
            doomed = [raylet, *host_children(raylet)]
            assert worker_pid in doomed
            killed = time.monotonic()
            for pid in doomed:
                os.kill(pid, signal.SIGKILL)
        print("outcomes:", sorted(outcomes))  # the Ray error, seconds after the kill
        assert sorted(o.split()[0] for o in outcomes) == ["lost"] * 4 + ["ok"] * 4
        assert all(o == "ok 0" for o in outcomes if o.startswith("ok"))
        for e in errors:
            assert e.reason is Reason.NODE_LOST
            assert nodes.worker_id in e.detail
            assert "may or may not have executed" in e.detail
        # The lost node's jails, jail dirs and cgroups: gone (its watchdog).
        await wait_until(lambda: not jailed_under(str(lost_root)) and not leftovers(lost_root),
                         10, lambda: f"{jailed_under(str(lost_root))} {leftovers(lost_root)}")
        assert not [c for c in trunner_cgroups() if c.startswith(f"{worker_pid}-")]
        r = await p.exec(["echo", "still here"])  # the other node serves on
        assert r.response.stdout == b"still here\n"
    nodes.replace_worker()


@pytest.mark.slow
async def test_a_killed_actor_fails_its_calls_then_the_pool_serves(nodes: Nodes) -> None:
    async with pool(nodes, in_flight_per_node=2) as p:
        victim = p.nodes[nodes.worker_id].pid
        lost: list[RunnerError] = []

        async def one() -> None:
            try:
                await p.exec(["sleep", "4"])
            except RunnerError as e:
                lost.append(e)

        async with trio.open_nursery() as n:
            for _ in range(4):
                n.start_soon(one)
            await wait_until(lambda: len(sleeping(nodes.jail_root)) == 4, 20, "4 runs")
            os.kill(victim, signal.SIGKILL)
        print("actor killed:", sorted(type(e.__cause__).__name__ for e in lost))
        assert len(lost) == 2
        assert all(e.reason is Reason.NODE_LOST for e in lost), lost
        for i in range(6):
            r = await p.exec(["echo", str(i)])
            assert r.response.stdout == f"{i}\n".encode()
        # The restarted actor serves again once a ping has answered.
        await wait_until(lambda: p.nodes[nodes.worker_id].state == "live", 30,
                         "the restarted actor")
        assert p.nodes[nodes.worker_id].pid != victim


@pytest.mark.slow
async def test_retry_sends_a_lost_call_to_the_other_node(nodes: Nodes) -> None:
    async with pool(nodes, in_flight_per_node=2, retry_node_lost=1) as p:
        victim = p.nodes[nodes.worker_id].pid
        outs: list[bytes] = []

        async def one(i: int) -> None:
            r = await p.exec(["sh", "-c", f"sleep 3; echo {i}"])
            outs.append(r.response.stdout)

        async with trio.open_nursery() as n:
            for i in range(4):
                n.start_soon(one, i)
            await wait_until(lambda: len(sleeping(nodes.jail_root)) == 4, 20, "4 runs")
            os.kill(victim, signal.SIGKILL)
        assert sorted(outs) == [f"{i}\n".encode() for i in range(4)]
        stats = await p.node_stats()
        assert stats[nodes.head_id].served == 4  # its 2, then the lost node's 2 again


async def test_a_new_node_is_picked_up(nodes: Nodes) -> None:
    extra = None
    try:
        async with pool(nodes) as p:
            assert len(p.nodes) == 2
            extra = nodes.cluster.add_node(**NODE_ARGS)
            new_id = extra.node_id
            await wait_until(lambda: new_id in p.nodes, 30, "the new node in the pool")
            assert p.nodes[new_id].state == "live"

            async def one(i: int) -> None:
                r = await p.exec(["sh", "-c", f"sleep 0.3; echo {i}"])
                assert r.response.stdout == f"{i}\n".encode()

            async with trio.open_nursery() as n:
                for i in range(24):
                    n.start_soon(one, i)
            assert (await p.node_stats())[new_id].served > 0
    finally:
        if extra is not None:
            nodes.cluster.remove_node(extra)


@pytest.mark.parametrize("front", ["trio", "asyncio"])
async def test_a_node_joining_at_the_close_is_closed_with_the_rest(nodes: Nodes,
                                                                   front: str) -> None:
    """The pool closes while a new node's actor is starting: the close waits
    for that join, then closes the actor with the rest. (AsyncioPool's close
    cancelled the join: the actor lived on past the close, warming a jailed
    pool, until its start ended and Ray dropped the handle.)"""
    extra: Any = None
    pools: list[ClusterPool | AsyncioPool] = []

    def joining() -> bool:
        return extra is not None and extra.node_id in pools[0]._router.joining

    try:
        if front == "trio":
            async with pool(nodes) as p:
                pools.append(p)
                extra = nodes.cluster.add_node(**NODE_ARGS)
                await wait_until(joining, 30, "the new node joining")
        else:
            opened = threading.Event()

            async def main() -> None:
                async with AsyncioPool("exec", limits=LIMITS, size_per_node=2,
                                       temp_root=str(nodes.jail_root)) as p:
                    own(p)
                    pools.append(p)
                    opened.set()
                    await asyncio_wait_until(joining, 60, "the new node joining")

            async with trio.open_nursery() as n:
                n.start_soon(partial(trio.to_thread.run_sync, asyncio.run, main()))
                await wait_until(opened.is_set, 60, "the asyncio pool open")
                extra = nodes.cluster.add_node(**NODE_ARGS)  # (Ray's main thread only)
        # Back from the close: every actor the pool started is ended, that
        # one too, and its jails are gone, not left to Ray and the watchdog.
        assert jailed_under(str(nodes.jail_root)) == []
        assert pools[0].nodes[extra.node_id].state == "dead"
        await wait_until(lambda: ray.available_resources().get("trunner", 0) == 3, 10,
                         lambda: f"every node's resource free: {ray.available_resources()}")
    finally:
        if extra is not None:
            nodes.cluster.remove_node(extra)


async def test_a_cancelled_call_leaves_no_jailed_process(nodes: Nodes) -> None:
    async with pool(nodes) as p:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as n:
                n.start_soon(p.exec, ["sleep", "30"])
                await wait_until(lambda: len(sleeping(nodes.jail_root)) == 1, 20,
                                 "the jailed sleep running")
                scope.cancel()  # the call in flight on its node
        assert scope.cancelled_caught
        # Back from the cancel: the jail is gone already, no waiting.
        assert sleeping(nodes.jail_root) == []
        r = await p.exec(["echo", "on"])
        assert r.response.stdout == b"on\n"


async def test_in_flight_bound_per_node(nodes: Nodes) -> None:
    async with pool(nodes, in_flight_per_node=2) as p:
        results = []

        async def one(i: int) -> None:
            r = await p.exec(["sh", "-c", f"sleep 0.3; echo {i}"])
            results.append(int(r.response.stdout))
            assert all(node.in_flight <= 2 for node in p.nodes.values())

        async with trio.open_nursery() as n:
            for i in range(20):
                n.start_soon(one, i)
        stats = await p.node_stats()
    assert sorted(results) == list(range(20))
    assert {s.peak_in_flight for s in stats.values()} <= {1, 2}
    assert sum(s.served for s in stats.values()) == 20


async def test_close_and_kill_leave_nothing(nodes: Nodes) -> None:
    cgroups = trunner_cgroups()
    async with pool(nodes, size_per_node=3) as p:
        await p.exec(["true"])
        assert leftovers(nodes.jail_root)  # the prewarmed workers' jail dirs
    assert leftovers(nodes.jail_root) == []
    assert jailed_under(str(nodes.jail_root)) == []
    assert trunner_cgroups() == cgroups

    async with pool(nodes, size_per_node=3) as p:
        await p.exec(["true"])
        dead = p.nodes[nodes.head_id]
        ray.kill(dead.actor, no_restart=True)  # its idle workers, dirs, cgroups: orphaned
        await wait_until(lambda: not os.path.exists(f"/proc/{dead.pid}"), 30, "the actor's end")
    async with pool(nodes, size_per_node=1) as p:  # a new actor sweeps what is left
        await p.exec(["true"])
        assert not [c for c in trunner_cgroups() if c.startswith(f"{dead.pid}-")]
        assert not [d for d in leftovers(nodes.jail_root) if f"-{dead.pid}-" in d]
        assert jailed_under(str(nodes.jail_root)) != []  # (its own, prewarmed)


@pytest.mark.parametrize("other", ["limits", "profile"])
async def test_nodes_with_other_rules_are_refused(
        nodes: Nodes, node_options: dict[str, dict[str, Any]], other: str) -> None:
    override: dict[str, Any] = ({"limits": LIMITS.replace(wall_time_s=21.0)} if other == "limits"
                                else {"provider": {"ports": [8080]}})
    node_options.update(nodes.options_for_worker(**override))
    with pytest.raises(RunnerError) as e:
        async with pool(nodes):
            pytest.fail("started")
    assert e.value.reason is Reason.SANDBOX_SETUP
    assert "rules versions differ" in e.value.detail
    node_options.clear()
    async with pool(nodes) as p:  # nothing held the nodes' resource
        assert len(p.nodes) == 2


async def test_retry_is_refused_with_the_provider_profile(nodes: Nodes) -> None:
    with pytest.raises(ValueError, match="provider"):
        pool(nodes, retry_node_lost=1, provider={"ports": [8080]})


async def asyncio_wait_until(pred: Callable[[], object], timeout_s: float, what: str) -> None:
    """`support.wait_until` for an asyncio loop: poll `pred()` every 5 ms,
    fail naming `what` after `timeout_s` (scaled)."""
    try:
        async with asyncio.timeout(scaled(timeout_s)):
            while not pred():  # noqa: ASYNC110  a plain predicate: nothing to await
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"not within {scaled(timeout_s)} s: {what}") from None


async def test_asyncio_pool(nodes: Nodes) -> None:
    async def main() -> list[bytes]:
        async with AsyncioPool("exec", limits=LIMITS, size_per_node=2,
                               temp_root=str(nodes.jail_root)) as p:
            own(p)
            outs = await asyncio.gather(*(p.exec(["echo", str(i)]) for i in range(20)))
            task = asyncio.ensure_future(p.exec(["sleep", "30"]))
            await asyncio_wait_until(lambda: len(sleeping(nodes.jail_root)) == 1, 20,
                                     "the jailed sleep running")
            task.cancel()  # the call in flight on its node
            with pytest.raises(asyncio.CancelledError):
                await task
            assert sleeping(nodes.jail_root) == []  # back from the cancel: the jail is gone
            assert jailed_under(str(nodes.jail_root)) != []  # idle workers only
            with pytest.raises(RunnerError) as e:
                await p.exec([])
            assert e.value.reason is Reason.BAD_REQUEST
            other = LIMITS.replace(cpu_time_s=3.0)
            r = await p.exec(["true"], limits=other)
            assert r.rules_version == Runner(limits=other).rules_version() != p.rules_version
            stats = await p.node_stats()
            # The 20, the cancelled one, the own limits' one; the bad request
            # never left the driver.
            assert sum(s.served for s in stats.values()) == 22
            return [r.response.stdout for r in outs]

    outs = await trio.to_thread.run_sync(asyncio.run, main())
    assert outs == [f"{i}\n".encode() for i in range(20)]


async def test_the_docs_block_runs_as_written(nodes: Nodes, tmp_path: Path) -> None:
    """docs/ray.md's per-call limits block, a driver of its own whose
    `ray.init(address="auto")` finds this cluster (as test_ray_readme's)."""
    import re
    import sys

    [program] = re.findall(r"^```python\n(.*?)^```$", (Path(TESTS_DIR).parent / "docs" / "ray.md")
                           .read_text(), re.MULTILINE | re.DOTALL)
    (tmp_path / "ray_limits.py").write_text(program)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["RAY_ADDRESS"] = nodes.cluster.address
    with trio.fail_after(scaled(300)):
        done = await trio.run_process([sys.executable, "ray_limits.py"], cwd=tmp_path, env=env,
                                      capture_stdout=True, capture_stderr=True, check=False)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, (out, err)
    assert out.splitlines()[-1] == "b'42\\n' True"


async def test_the_benchmark_runs() -> None:
    """benchmarks/ray_pool.py --smoke: its own cluster, every figure there."""
    import sys

    script = os.path.join(os.path.dirname(TESTS_DIR), "benchmarks", "ray_pool.py")
    with trio.fail_after(scaled(180)):
        done = await trio.run_process([sys.executable, script, "--smoke"], capture_stdout=True,
                                      capture_stderr=True)
    out = done.stdout.decode()
    for variant in ("local", "ray-1", "ray-2"):
        assert any(line.split()[:1] == [variant] for line in out.splitlines()), out
    assert "Ray adds" in out
