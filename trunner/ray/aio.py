"""`AsyncioPool`: `cluster_pool` for asyncio callers (a Ray actor, an RL
rollout loop), on the same router (trunner.ray.router). Ray's object refs
are awaitable in asyncio; the start and the close run in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import ray.exceptions as rex

from trunner.protocol import ExecResult
from trunner.ray import router, wire

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

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
        self._open = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Task[None] | None = None

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
        nodes, version = await asyncio.to_thread(router.start_all, self._router.spec)
        self._router.rules_version = version
        self._router.nodes = {n.id: n for n in nodes}
        self._open = True
        self._watcher = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._open = False
        self._notify()
        assert self._watcher is not None
        for task in (self._watcher, *self._tasks):
            task.cancel()
        for task in (self._watcher, *self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.shield(asyncio.to_thread(router.close_all,
                                               list(self._router.nodes.values())))

    async def run(
        self, request: object = None, *, response_type: Any = Any  # noqa: ANN401  a msgspec type form
    ) -> Result[Any]:
        return await self._call(self._router.run_call(request), response_type)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Result[ExecResult]:
        call = self._router.exec_call(argv, stdin, files, collect, env)
        result: Result[ExecResult] = await self._call(call, ExecResult)
        return result

    async def _call(self, call: wire.Call, response_type: Any) -> Result[Any]:  # noqa: ANN401
        if not self._open:
            raise RuntimeError("use the pool inside `async with AsyncioPool(...)`")
        payload = wire.encode(call)
        tried: frozenset[str] = frozenset()
        while True:
            node = await self._admit(tried)
            try:
                data = await self._ask(node, call.id, payload)
            except rex.RayError as e:
                tried = self._router.retry_or_raise(node, e, tried)
                continue
            finally:
                self._router.release(node)
                self._notify()
            return self._router.result(node, data, response_type)

    async def _admit(self, tried: frozenset[str]) -> router.Node:
        while True:
            node = self._router.pick(tried)
            if node is not None:
                return node
            if self._router.hopeless(tried):
                raise self._router.no_node()
            await self._changed.wait()

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

    def _spawn(self, coro: Any) -> None:  # noqa: ANN401  a coroutine
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self) -> None:
        pinging: set[str] = set()
        joining: set[str] = set()
        loop = asyncio.get_running_loop()
        next_look = loop.time() + router.DISCOVER_S
        while True:
            await asyncio.sleep(router.PING_S)
            for node in list(self._router.nodes.values()):
                if node.state == "suspect" and node.id not in pinging:
                    pinging.add(node.id)
                    self._spawn(self._ping(node, pinging))
            if loop.time() >= next_look:
                next_look = loop.time() + router.DISCOVER_S
                try:
                    ids = await asyncio.to_thread(router.candidates, self._router.spec.resource)
                except rex.RayError:
                    continue
                for node_id in self._router.new(ids, joining):
                    joining.add(node_id)
                    self._spawn(self._join(node_id, joining))

    async def _ping(self, node: router.Node, pinging: set[str]) -> None:
        try:
            data = await asyncio.wait_for(node.actor.hello.remote(), router.PING_BOUND_S)
            self._router.answered(node, wire.decode_hello(data))
        except TimeoutError:
            pass
        except rex.RayError as e:
            self._router.pinged_dead(node, e)
        finally:
            pinging.discard(node.id)
            self._notify()

    async def _join(self, node_id: str, joining: set[str]) -> None:
        try:
            node, hello = await asyncio.to_thread(router.start_node, self._router.spec, node_id)
        except Exception as e:
            self._router.refused[node_id] = str(e)
        else:
            self._router.add(node, hello)
        finally:
            joining.discard(node_id)
            self._notify()
