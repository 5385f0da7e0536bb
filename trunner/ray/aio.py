"""`AsyncioPool`: `cluster_pool` for asyncio callers (a Ray actor, an RL
rollout loop), through the pieces of trunner's own asyncio API
(trunner.aio): the trio `ClusterPool` is held open in the portal, the trio
thread of every asyncio caller (`Held`), and each call is one portal call
(`call`). So one implementation of the router's loops (trunner.ray.pool)
serves trio and asyncio alike: the same results, errors, cancellation and
close, with an asyncio cancel that returns once the jail on the node is gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trunner.aio import Held, call
from trunner.ray.pool import cluster_pool

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import TracebackType

    from trunner.invocation import Result
    from trunner.limits import Limits
    from trunner.protocol import ExecFile, ExecResult
    from trunner.ray import router, wire


class AsyncioPool:
    """`async with AsyncioPool("exec", limits=...) as pool: await pool.exec(argv)`.
    Takes `cluster_pool`'s arguments and gives the same results and errors."""

    def __init__(
        self, mode: str, *, limits: Limits | None = None, size_per_node: int = 8,
        in_flight_per_node: int = 16, resource: str = "trunner", cpus_per_node: float = 1,
        retry_node_lost: int = 0, **runner_options: Any,  # noqa: ANN401  Runner's
    ) -> None:
        self._pool = cluster_pool(
            mode, limits=limits, size_per_node=size_per_node,
            in_flight_per_node=in_flight_per_node, resource=resource,
            cpus_per_node=cpus_per_node, retry_node_lost=retry_node_lost, **runner_options)
        self._router = self._pool._router  # read-only here: the portal's thread writes it
        self._held = Held("AsyncioPool", self._pool)

    @property
    def rules_version(self) -> str:
        return self._pool.rules_version

    @property
    def nodes(self) -> dict[str, router.Node]:
        return self._pool.nodes

    @property
    def refused(self) -> dict[str, str]:
        return self._pool.refused

    async def node_stats(self) -> dict[str, wire.Stats]:
        """Each live node's own figures, as `ClusterPool.node_stats`."""
        return await call("AsyncioPool.node_stats", self._pool.node_stats)

    async def __aenter__(self) -> AsyncioPool:
        await self._held.enter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._held.exit(exc)

    async def run(
        self, request: object = None, *, response_type: Any = Any,  # noqa: ANN401  a msgspec type form
        limits: Limits | None = None,
    ) -> Result[Any]:
        return await call("AsyncioPool.run", self._pool.run, request,
                          response_type=response_type, limits=limits)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None, limits: Limits | None = None,
        capture_on_failure: bool = False,
    ) -> Result[ExecResult]:
        return await call("AsyncioPool.exec", self._pool.exec, argv, stdin=stdin, files=files,
                          collect=collect, env=env, limits=limits,
                          capture_on_failure=capture_on_failure)
