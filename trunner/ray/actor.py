"""The Ray actor on each node: asyncio methods in front of a `NodeServer`.

Calls run in the actor's default concurrency group; `hello`, `stats`,
`cancel` and `close` in the `control` group, whose own event loop answers
while every call slot is busy. Arguments and results are msgpack bytes
(trunner.ray.wire); the constructor's limits too.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
import ray

from trunner.limits import Limits
from trunner.ray import wire
from trunner.ray.node import NodeServer

if TYPE_CHECKING:
    from collections.abc import Callable

CONTROL = "control"
F = TypeVar("F", bound="Callable[..., Any]")


def _control(fn: F) -> F:
    """A method of the `control` concurrency group."""
    return cast("F", ray.method(concurrency_group=CONTROL)(fn))


def _resolve(fut: asyncio.Future[Any], value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def _reply_to(fut: asyncio.Future[bytes]) -> Callable[[bytes], None]:
    """A callback for any thread that resolves `fut` on its own loop."""
    loop = fut.get_loop()

    def reply(data: bytes) -> None:
        loop.call_soon_threadsafe(_resolve, fut, data)
    return reply


def _ended(fut: asyncio.Future[None]) -> Callable[[], None]:
    loop = fut.get_loop()

    def ended() -> None:
        loop.call_soon_threadsafe(_resolve, fut, None)
    return ended


@ray.remote(concurrency_groups={CONTROL: 4})
class NodeActor:
    def __init__(self, mode: str, limits: bytes, size: int, options: dict[str, Any]) -> None:
        node_id = ray.get_runtime_context().get_node_id()
        self._server = NodeServer(node_id, mode, msgspec.msgpack.decode(limits, type=Limits),
                                  size, options)

    async def call(self, payload: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[bytes] = loop.create_future()
        call_id = self._server.submit(payload, _reply_to(reply))
        try:
            return await asyncio.shield(reply)
        except asyncio.CancelledError:  # ray.cancel: end the jail before the task ends
            if call_id is not None:
                ended: asyncio.Future[None] = loop.create_future()
                self._server.cancel(call_id, _ended(ended))
                await ended
            raise

    @_control
    async def hello(self) -> bytes:
        return wire.encode(self._server.hello)

    @_control
    async def stats(self) -> bytes:
        return wire.encode(self._server.stats())

    @_control
    async def cancel(self, call_id: str) -> None:
        """Returns once the call has ended and its jail is removed."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        self._server.cancel(call_id, _ended(ended))
        await ended

    @_control
    async def close(self) -> None:
        """Returns once the pool has exited (its workers and jails are gone)."""
        await asyncio.get_running_loop().run_in_executor(None, self._server.close)
