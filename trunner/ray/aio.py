"""`AsyncioPool`: `cluster_pool` for asyncio callers (a Ray actor, an RL
rollout loop): the asyncio loops over the same router (trunner.ray.router),
which decides. Ray's object refs are awaitable in asyncio; the start, the
close and the look for new nodes (trunner.ray.cluster) run in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, assert_never

import ray.exceptions as rex

from trunner.errors import RunnerError
from trunner.protocol import ExecResult
from trunner.ray import cluster, router, wire

if TYPE_CHECKING:
    from collections.abc import Coroutine, Mapping, Sequence

    from trunner.invocation import Result
    from trunner.limits import Limits
    from trunner.protocol import ExecFile


class AsyncioPool:
    """`async with AsyncioPool("exec", limits=...) as pool: await pool.exec(argv)`.
    Takes `cluster_pool`'s arguments and gives the same results and errors."""

    def __init__(
        self, mode: str, *, limits: Limits | None = None, size_per_node: int = 8,
        in_flight_per_node: int = 16, resource: str = "trunner", cpus_per_node: float = 1,
        retry_node_lost: int = 0, **runner_options: Any,  # noqa: ANN401  Runner's
    ) -> None:
        self._router = router.Router(router.spec_of(
            mode, limits, size_per_node, in_flight_per_node, resource, cpus_per_node,
            retry_node_lost, runner_options))
        self._changed = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._pings: set[asyncio.Task[None]] = set()
        self._joins: set[asyncio.Task[None]] = set()

    @property
    def rules_version(self) -> str:
        return self._router.rules_version

    @property
    def nodes(self) -> dict[str, router.Node]:
        return dict(self._router.nodes)

    @property
    def refused(self) -> dict[str, str]:
        return dict(self._router.refused)

    async def node_stats(self) -> dict[str, wire.Stats]:
        """Each live node's own figures, as `ClusterPool.node_stats`."""
        out = {}
        for node in list(self._router.nodes.values()):
            if node.state == "live":
                with contextlib.suppress(TimeoutError):
                    data = await asyncio.wait_for(node.actor.stats.remote(), router.PING_BOUND_S)
                    out[node.id] = wire.decode_stats(data)
        return out

    async def __aenter__(self) -> AsyncioPool:
        nodes, version = await asyncio.to_thread(cluster.start_all, self._router.spec)
        self._router.opened(nodes, version, asyncio.get_running_loop().time())
        self._watcher = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._watcher is not None
        self._watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watcher
        for task in [*self._pings]:
            task.cancel()
        try:
            # A join in flight ends first (its thread cannot be cancelled), so
            # its node is closed with the rest; one that ends after the
            # close (this wait cancelled) kills its own (router.joined).
            if self._pings or self._joins:
                await asyncio.wait([*self._pings, *self._joins])
        finally:
            closing = self._router.close()
            self._notify()
            await asyncio.shield(asyncio.to_thread(cluster.close_all, closing))

    async def run(
        self, request: object = None, *, response_type: Any = Any,  # noqa: ANN401  a msgspec type form
        limits: Limits | None = None,
    ) -> Result[Any]:
        return await self._call(self._router.run_call(request, limits), response_type)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None, limits: Limits | None = None,
        capture_on_failure: bool = False,
    ) -> Result[ExecResult]:
        call = self._router.exec_call(argv, stdin, files, collect, env, limits,
                                      capture_on_failure=capture_on_failure)
        result: Result[ExecResult] = await self._call(call, ExecResult)
        return result

    # -- the loops: the router decides, these wait ----------------------------------

    async def _call(self, call: wire.Call, response_type: Any) -> Result[Any]:  # noqa: ANN401
        if not self._router.is_open:
            raise RuntimeError("use the pool inside `async with AsyncioPool(...)`")
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
            data: bytes = await ref
        except asyncio.CancelledError:
            async def end() -> None:
                with contextlib.suppress(rex.RayError, TimeoutError):
                    await asyncio.wait_for(node.actor.cancel.remote(call_id),
                                           router.CANCEL_BOUND_S)
            await asyncio.shield(asyncio.ensure_future(end()))
            raise
        return data

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, tasks: set[asyncio.Task[None]], coro: Coroutine[object, object, None]
               ) -> None:
        task = asyncio.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(router.PING_S)
            for step in self._router.due(loop.time()):
                match step:
                    case router.Ping(node):
                        self._spawn(self._pings, self._ping(node))
                    case router.Look():
                        try:
                            ids = await asyncio.to_thread(cluster.candidates,
                                                          self._router.spec.resource)
                        except rex.RayError:
                            continue  # looked at again when due
                        for node_id in self._router.found(ids):
                            self._spawn(self._joins, self._join(node_id))
                    case unreachable:
                        assert_never(unreachable)

    async def _ping(self, node: router.Node) -> None:
        reply: bytes | BaseException | None = None
        try:
            reply = await asyncio.wait_for(node.actor.hello.remote(), router.PING_BOUND_S)
        except TimeoutError:
            pass
        except rex.RayError as e:
            reply = e
        finally:
            self._router.pinged(node, reply)
            self._notify()

    async def _join(self, node_id: str) -> None:
        started: tuple[router.Node, wire.Hello] | RunnerError
        try:
            started = await asyncio.to_thread(cluster.start_node, self._router.spec, node_id)
        except RunnerError as e:
            started = e
        if (unused := self._router.joined(node_id, started)) is not None:
            cluster.kill(unused)
        self._notify()
