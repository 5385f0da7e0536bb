"""A warm Runner: one fork server kept for `async with runner.warm():`.

Inside a block, `Runner.run`, `exec` and `open_process` start their jails
through the block's fork server (`trunner.linux.forkclient`), as a pool's
calls do, instead of a fork and exec of the helper each: the same jail,
plan and verdict, at a pooled run's cost, with nothing spawned ahead.
Outside every block runs are cold. Blocks nest and overlap (several tasks
may each hold one): the server starts when the first is entered and is
stopped when the last ends, once every run that took it has its leader
(`Warm.spawner`'s lease); no server outlives the blocks. The backstop is
the server's parent-death signal, never the garbage collector.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from trunner.spawn import COLD, Child, S, Spawner, Unowned

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trunner.jail import JailBackend


class Warm:
    """A Runner's warm blocks and their one fork server."""

    def __init__(self, backend: JailBackend) -> None:
        self._backend = backend
        self._server: Spawner | None = None
        self._blocks = 0
        #: Leases taken of the server whose leader is not spawned yet.
        self._pending = 0
        self._settled = trio.Event()

    @property
    def server(self) -> Spawner | None:
        """The fork server while a block is open (tests: its pid)."""
        return self._server

    @asynccontextmanager
    async def block(self) -> AsyncIterator[None]:
        if self._server is None:
            self._server = self._backend.fork_server("")
        server = self._server
        self._blocks += 1
        try:
            await server.start()
            yield
        finally:
            self._blocks -= 1
            if self._blocks == 0:
                self._server = None
                await self._close(server)

    async def _close(self, server: Spawner) -> None:
        """Once no lease waits for a leader (a run begun in a block and not
        spawned yet, a short wait), stop the server. Shielded."""
        with trio.CancelScope(shield=True):
            while self._pending:
                await self._settled.wait()
            await server.aclose()

    def spawner(self, mode: str) -> Spawner:
        """What a run of `mode` starts its jail with: a lease of the block's
        server, held until its leader is spawned (`with` it, so a run that
        fails before its spawn gives it back), or `COLD` outside a block."""
        if self._server is None:
            return COLD
        self._pending += 1
        return Lease(self, self._server.serving(mode))

    def _give_back(self) -> None:
        self._pending -= 1
        if not self._pending:
            self._settled.set()
            self._settled = trio.Event()


class Lease(Unowned):
    """One run's hold on a warm block's server: a `Spawner` for one spawn."""

    def __init__(self, warm: Warm, spawner: Spawner) -> None:
        self._warm: Warm | None = warm
        self._spawner = spawner
        self.in_process = spawner.in_process

    @property
    def losses(self) -> int:
        return self._spawner.losses

    async def spawn(self, jail: S, *, stdio: str = "pipes") -> Child[S]:
        try:
            return await self._spawner.spawn(jail, stdio=stdio)
        finally:
            self.give_back()

    def give_back(self) -> None:
        warm, self._warm = self._warm, None
        if warm is not None:
            warm._give_back()

    async def start(self) -> None:
        pass

    def serving(self, mode: str) -> Spawner:
        return self._spawner.serving(mode)

    async def aclose(self) -> None:
        self.give_back()

    async def __aexit__(self, *exc: object) -> None:
        self.give_back()
