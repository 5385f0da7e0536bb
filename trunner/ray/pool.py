"""`cluster_pool`: a trunner pool on every Ray node that carries the
resource, used from trio as one pool.

The trio loops over the router (trunner.ray.router), which decides: this
module only waits and does what its steps say. Ray's object refs are
awaited without a thread: `ObjectRef.future()`'s done-callback wakes the
trio task through its `TrioToken`. The start, the close and the look for
new nodes talk to Ray's GCS (trunner.ray.cluster) in a worker thread.
"""

from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, assert_never

import ray.exceptions as rex
import trio

from trunner.errors import RunnerError
from trunner.invocation import require_trio
from trunner.protocol import ExecResult
from trunner.ray import cluster, router, wire

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from trunner.invocation import Result
    from trunner.limits import Limits
    from trunner.protocol import ExecFile


def cluster_pool(
    mode: str,
    *,
    limits: Limits | None = None,
    size_per_node: int = 8,
    in_flight_per_node: int = 16,
    resource: str = "trunner",
    cpus_per_node: float = 1,
    retry_node_lost: int = 0,
    **runner_options: Any,  # noqa: ANN401  Runner's own keyword arguments
) -> ClusterPool:
    """One jailed pool of `mode` per Ray node carrying `resource`, used as
    one: `async with trunner.ray.cluster_pool("exec") as pool: await pool.exec(argv)`.

    Each node gets one actor (it takes the node's `resource`: one pool per
    node at a time), pinned there, reserving `cpus_per_node` CPUs from Ray's
    scheduler, holding a `Runner(limits=limits, **runner_options)` and its
    pool of `size_per_node` prewarmed workers. At most `in_flight_per_node`
    calls are sent to a node at once; beyond that, callers wait. The start
    checks that every node runs under one rules version.

    `retry_node_lost` sends a call whose node was lost (`node_lost`) to
    another node, at most that many times: the run may then execute twice.
    It is refused with the provider profile, which can reach the network.

    Raises:
        ValueError: a bad size, bound or retry count; retry with a provider.
        RunnerError: from the `async with`: `sandbox_setup` (no node,
            nodes whose rules differ), or a node's own reason when its pool
            did not start.
    """
    return ClusterPool(router.spec_of(mode, limits, size_per_node, in_flight_per_node, resource,
                                      cpus_per_node, retry_node_lost, runner_options))


class ClusterPool:
    """Use as `async with cluster_pool(...) as pool:`; see `cluster_pool`."""

    def __init__(self, spec: router.Spec) -> None:
        self._router = router.Router(spec)
        self._changed = trio.Event()

    @property
    def rules_version(self) -> str:
        """The one rules version every node serves under."""
        return self._router.rules_version

    @property
    def nodes(self) -> dict[str, router.Node]:
        """The nodes, by Ray node id (live, suspect or dead): a snapshot."""
        return dict(self._router.nodes)

    @property
    def refused(self) -> dict[str, str]:
        """Nodes found after the start that do not serve, and why."""
        return dict(self._router.refused)

    async def __aenter__(self) -> ClusterPool:
        require_trio("`async with cluster_pool(...)`", "trunner.ray.AsyncioPool")
        self._cm = self._running()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: object) -> bool | None:
        return await self._cm.__aexit__(*exc)  # type: ignore[arg-type]

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[ClusterPool]:
        nodes, version = await trio.to_thread.run_sync(cluster.start_all, self._router.spec)
        self._router.opened(nodes, version, trio.current_time())
        raised: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, nursery)
                try:
                    yield self
                except BaseException as e:  # re-raised below, outside the nursery
                    raised = e
                finally:
                    # Pings end here; a join in flight ends first (its thread
                    # cannot be abandoned), so its node is closed with the rest.
                    nursery.cancel_scope.cancel(reason="the cluster pool was closed")
        finally:
            closing = self._router.close()
            self._notify()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(cluster.close_all, closing)
        if raised is not None:
            try:
                raise raised
            finally:
                raised = None

    async def node_stats(self) -> dict[str, wire.Stats]:
        """Each live node's own figures (calls in flight, the peak, served)."""
        out = {}
        for node in list(self._router.nodes.values()):
            if node.state == "live":
                with trio.move_on_after(router.PING_BOUND_S):
                    out[node.id] = wire.decode_stats(await _wait(node.actor.stats.remote()))
        return out

    async def run(
        self, request: object = None, *, response_type: Any = Any,  # noqa: ANN401  a msgspec type form
        limits: Limits | None = None,
    ) -> Result[Any]:
        """`Runner.run` of the pool's mode on some node: the same verdict.
        With `limits` other than the pool's, in a jail started for the call
        on its node (docs/ray.md): under those limits' rules version."""
        return await self._call(self._router.run_call(request, limits), response_type)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None, limits: Limits | None = None,
        capture_on_failure: bool = False,
    ) -> Result[ExecResult]:
        """`Runner.exec` on some node: the same checks (here, before any
        node is asked), caps and verdict; with `limits` as `run`'s, and
        `capture_on_failure` alike."""
        call = self._router.exec_call(argv, stdin, files, collect, env, limits,
                                      capture_on_failure=capture_on_failure)
        result: Result[ExecResult] = await self._call(call, ExecResult)
        return result

    # -- the loops: the router decides, these wait ----------------------------------

    async def _call(self, call: wire.Call, response_type: Any) -> Result[Any]:  # noqa: ANN401
        require_trio("ClusterPool.run and .exec", "trunner.ray.AsyncioPool")
        if not self._router.is_open:
            raise RuntimeError("use the pool inside `async with cluster_pool(...)`")
        payload = wire.encode(call)
        tried: frozenset[str] = frozenset()
        while True:
            node = self._router.admit(tried)
            if node is None:
                await self._changed.wait()
                continue
            try:
                data = await self._ask(node, call.id, payload)
            except rex.RayError as e:
                tried = self._router.retry_or_raise(node, e, tried)
                continue
            finally:
                self._router.release(node)
                self._notify()
            return self._router.result(node, data, response_type, call.limits)

    async def _ask(self, node: router.Node, call_id: str, payload: bytes) -> bytes:
        ref = node.actor.call.remote(payload)
        try:
            return await _wait(ref)
        except trio.Cancelled:
            # The caller's cancel reaches the jail: `cancel` returns once the
            # run has ended on the node and its jail dir is removed.
            with trio.CancelScope(shield=True), trio.move_on_after(router.CANCEL_BOUND_S), \
                    contextlib.suppress(rex.RayError):  # lost: its watchdog ends the jail
                await _wait(node.actor.cancel.remote(call_id))
            raise

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _watch(self, nursery: trio.Nursery) -> None:
        while True:
            await trio.sleep(router.PING_S)
            for step in self._router.due(trio.current_time()):
                match step:
                    case router.Ping(node):
                        nursery.start_soon(self._ping, node)
                    case router.Look():
                        try:
                            ids = await trio.to_thread.run_sync(cluster.candidates,
                                                                self._router.spec.resource)
                        except rex.RayError:
                            continue  # looked at again when due
                        for node_id in self._router.found(ids):
                            nursery.start_soon(self._join, node_id)
                    case unreachable:
                        assert_never(unreachable)

    async def _ping(self, node: router.Node) -> None:
        reply: bytes | BaseException | None = None
        try:
            with trio.move_on_after(router.PING_BOUND_S):
                reply = await _wait(node.actor.hello.remote())
        except rex.RayError as e:
            reply = e
        finally:
            self._router.pinged(node, reply)
            self._notify()

    async def _join(self, node_id: str) -> None:
        started: tuple[router.Node, wire.Hello] | RunnerError
        try:
            started = await trio.to_thread.run_sync(cluster.start_node, self._router.spec,
                                                    node_id)
        except RunnerError as e:
            started = e
        if (unused := self._router.joined(node_id, started)) is not None:
            cluster.kill(unused)
        self._notify()


async def _wait(ref: Any) -> bytes:  # noqa: ANN401  a Ray ObjectRef
    """The ref's value (or its Ray error), with no thread: Ray's callback
    wakes this task."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future = ref.future()
    future.add_done_callback(wake)
    await done.wait()
    value: bytes = future.result()
    return value
