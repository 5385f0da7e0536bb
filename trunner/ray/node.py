"""One node's trunner: a `Runner` and its pool on a dedicated trio thread.

Ray's actor (trunner.ray.actor) runs asyncio event loops on threads of its
own; this is the other side. `submit` and `cancel` may be called from any
thread: they hand the work to the trio thread with `TrioToken.run_sync_soon`,
so every table here is touched only there, in the order the calls came. A
call's reply, always exactly one, goes back through the `done` callback the
caller gave (the actor's `call_soon_threadsafe`). There is no thread per
request. Imports nothing of Ray.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import TYPE_CHECKING, Any, assert_never

import msgspec
import trio

from trunner.errors import Reason, RunnerError
from trunner.ray import wire
from trunner.runner import Runner

if TYPE_CHECKING:
    from collections.abc import Callable

    from trunner.invocation import Result
    from trunner.limits import Limits
    from trunner.pool import WorkerPool

    Done = Callable[[bytes], None]

#: Ids of calls cancelled before they arrived, kept so that a late arrival is
#: refused, not run (a bounded memory: the driver never reuses an id).
TOMBSTONES = 4096


class NodeServer:
    """Starts the pool on its thread and returns once it is warm (or failed:
    then `hello.error` says why, and every call is answered with it)."""

    def __init__(self, node_id: str, mode: str, limits: Limits, size: int,
                 options: dict[str, Any]) -> None:
        self._node_id = node_id
        self._mode, self._limits, self._size, self._options = mode, limits, size, options
        self._scopes: dict[str, trio.CancelScope] = {}
        self._waiters: dict[str, list[Callable[[], None]]] = {}
        self._pending: dict[str, Done] = {}
        self._tombstones: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._failure: RunnerError | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._pool: WorkerPool | None = None
        self._closing: trio.Event | None = None
        self.in_flight = self.peak_in_flight = self.served = 0
        self.hello = wire.Hello(node_id=node_id, pid=os.getpid())
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="trunner-pool", daemon=True)
        self._thread.start()
        self._ready.wait()

    # -- any thread -----------------------------------------------------------------

    def submit(self, payload: bytes, done: Done) -> str | None:
        """Start the call `payload` (a `wire.Call`); returns its id (None if
        it does not decode: then `done` has its failure already)."""
        try:
            call = wire.decode_call(payload)
        except msgspec.DecodeError as e:
            done(wire.encode(wire.failure_of(RunnerError(Reason.BAD_REQUEST, f"bad call: {e}"))))
            return None
        if not self._soon(self._start, call, done):
            done(self._closed_reply())
        return call.id

    def cancel(self, call_id: str, done: Callable[[], None]) -> None:
        """Cancel the call (its jail is killed and removed); `done()` once it
        has ended, or at once if it is not running."""
        if not self._soon(self._cancel, call_id, done):
            done()

    def close(self) -> None:
        """End the pool (and every call in flight); returns once it has exited."""
        self._soon(self._close)
        self._thread.join()

    def stats(self) -> wire.Stats:
        pool = self._pool
        return wire.Stats(pid=os.getpid(), in_flight=self.in_flight,
                          peak_in_flight=self.peak_in_flight, served=self.served,
                          idle_workers=pool.idle_workers if pool is not None else 0)

    def _soon(self, fn: Callable[..., object], *args: object) -> bool:
        token = self._token
        if token is None:
            return False
        try:
            token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            return False
        return True

    def _closed_reply(self) -> bytes:
        failure = self._failure or RunnerError(
            Reason.SPAWN_FAILED, f"the trunner pool of node {self._node_id} has closed")
        return wire.encode(wire.failure_of(failure))

    # -- the trio thread ------------------------------------------------------------

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as e:
            if self._failure is None:
                self._failure = RunnerError(Reason.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
        finally:
            self._token = None
            if self._failure is not None or not self.hello.rules_version:
                self.hello = wire.Hello(node_id=self._node_id, pid=os.getpid(),
                                        error=wire.failure_of(self._failure_or_closed()))
            for done in self._pending.values():
                done(self._closed_reply())
            self._pending.clear()
            self._ready.set()

    def _failure_or_closed(self) -> RunnerError:
        return self._failure or RunnerError(Reason.INTERNAL_ERROR, "the pool did not start")

    async def _serve(self) -> None:
        self._closing = trio.Event()
        try:
            runner = Runner(limits=self._limits, **self._options)
            async with runner.pool(self._mode, size=self._size) as pool, \
                    trio.open_nursery() as nursery:
                self._pool, self._nursery = pool, nursery
                self.hello = wire.Hello(node_id=self._node_id, pid=os.getpid(),
                                        rules_version=runner.rules_version())
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._closing.wait()
                nursery.cancel_scope.cancel(reason="the node's pool was closed")
        except RunnerError as e:
            self._failure = e
        finally:
            self._pool = self._nursery = None

    def _close(self) -> None:
        assert self._closing is not None
        self._closing.set()

    def _start(self, call: wire.Call, done: Done) -> None:
        if call.id in self._tombstones:
            del self._tombstones[call.id]
            done(wire.encode(wire.failure_of(RunnerError(
                Reason.INTERNAL_ERROR, "the call was cancelled before it arrived"))))
            return
        assert self._nursery is not None
        self._pending[call.id] = done
        self._scopes[call.id] = scope = trio.CancelScope()
        self._nursery.start_soon(self._serve_call, call, scope)

    def _cancel(self, call_id: str, done: Callable[[], None]) -> None:
        scope = self._scopes.get(call_id)
        if scope is None:  # not arrived yet (or already answered)
            self._tombstones[call_id] = None
            while len(self._tombstones) > TOMBSTONES:
                self._tombstones.popitem(last=False)
            done()
            return
        self._waiters.setdefault(call_id, []).append(done)
        scope.cancel(reason="the caller cancelled")

    async def _serve_call(self, call: wire.Call, scope: trio.CancelScope) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        reply = None
        try:
            with scope:
                reply = await self._answer(call)
            if reply is None:  # cancelled by the caller: the jail is gone
                reply = wire.encode(wire.failure_of(RunnerError(
                    Reason.INTERNAL_ERROR, "the call was cancelled")))
        finally:
            self.in_flight -= 1
            self._scopes.pop(call.id, None)
            if reply is not None:  # else the pool is closing: _main answers it
                self.served += 1
                self._pending.pop(call.id)(reply)
            for waiter in self._waiters.pop(call.id, ()):
                waiter()

    async def _answer(self, call: wire.Call) -> bytes:
        pool = self._pool
        assert pool is not None
        try:
            result: Result[Any]
            match call:
                case wire.ExecCall():
                    result = await pool.exec(call.argv, stdin=call.stdin, files=call.files,
                                             collect=call.collect, env=call.env,
                                             limits=call.limits,
                                             capture_on_failure=call.capture_on_failure)
                    response = msgspec.Raw(wire.encode(result.response))
                case wire.RunCall():
                    result = await pool.run(call.request, response_type=msgspec.Raw,
                                            limits=call.limits)
                    response = result.response
                case unreachable:
                    assert_never(unreachable)
            return wire.encode(wire.Success(response=response,
                                            rules_version=result.rules_version,
                                            usage=result.usage))
        except RuntimeError as e:  # the pool's misuse errors: an exec call to a run pool
            return wire.encode(wire.failure_of(RunnerError(Reason.BAD_REQUEST, str(e))))
        except RunnerError as e:
            return wire.encode(wire.failure_of(e))
