"""Prewarmed jailed workers: spawned ahead, helper done, adapter imported,
each blocked reading its one request.

Nothing of the contract is relaxed: a pooled worker is an ordinary jailed
child that has not been given its request yet. It serves exactly one
invocation in its own process group and jail dir; the wall-clock deadline
starts when its request is written; the caps and the verdict are the same.
As root, an idle worker holds its jail's host id (`trunner.linux.ids`) until
it has served or is ended: a pool of `size` keeps `size` ids taken.

A call with limits of its own (`limits=` other than the pool's) is served
by a jail opened and started for it when it comes, through the pool's fork
server: the cold plan of those limits, so their rules version. It takes one
of the pool's `size` slots for its run: the pool's idle workers and such
jails together are at most `size` (an idle worker is ended to make room, and
the refill waits for the slot), and a call that finds every slot taken by
such jails waits for one, before its jail is opened (its deadline has not
started). A call with the pool's limits is served as before.
"""

from __future__ import annotations

from collections import deque
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from trunner import exec_checks, invocation
from trunner.errors import Reason, RunnerError
from trunner.limits import Limits
from trunner.protocol import ExecFile, ExecResult

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from trunner.invocation import Result
    from trunner.jail import JailBackend
    from trunner.streaming import StreamingProcess

#: What `not_in_trio` names: the same pool for asyncio callers.
_ASYNCIO_POOL = "trunner.aio.AsyncioRunner(...).pool(...)"


class WorkerPool:
    """Use as `async with runner.pool(mode) as pool:`; see `Runner.pool`."""

    def __init__(
        self, backend: JailBackend, mode: str, adapter_argv: tuple[str, ...], limits: Limits,
        temp_root: str | None, *, size: int, idle_s: float
    ) -> None:
        if size < 1:
            raise ValueError("pool size must be at least 1")
        if idle_s <= 0:
            raise ValueError("idle_s must be positive")
        self._backend, self._limits, self._temp_root = backend, limits, temp_root
        self._caps = invocation.Caps.of(limits)
        self._mode = mode
        self._argv = adapter_argv
        self.size, self.idle_s = size, idle_s
        self._idle: deque[invocation.Started] = deque()
        #: Slots held by calls with limits of their own (`_own` of them).
        self._slots = trio.Semaphore(size)
        self._own = 0
        #: Set while the refill starts a worker; that worker's slot is taken.
        self._starting: trio.Event | None = None
        self._last_use = 0.0
        self._wanted = trio.Event()
        self._open = False
        self._spawner = backend.fork_server(mode)

    async def __aenter__(self) -> WorkerPool:
        invocation.require_trio("`async with runner.pool(...)`", _ASYNCIO_POOL)
        self._cm = self._running()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: object) -> bool | None:
        return await self._cm.__aexit__(*exc)  # type: ignore[arg-type]

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[WorkerPool]:
        """The refill runs in a nursery of the caller's task, but nothing
        leaves the `async with` in an ExceptionGroup: the body's own
        exception leaves as itself; the pool's own failure (a refill that
        cannot spawn) cancels the body and leaves as one `RunnerError`, the
        first one (any later one is in its notes)."""
        self._open = True
        self._last_use = trio.current_time()
        raised: BaseException | None = None
        failure: RunnerError | None = None
        try:
            try:
                async with self._spawner, trio.open_nursery() as nursery:
                    # Returns once the pool is full: warm on entry.
                    await nursery.start(self._refill)
                    try:
                        yield self
                    except BaseException as e:  # re-raised below, outside the nursery
                        raised = e
                    finally:
                        nursery.cancel_scope.cancel(reason="the pool was closed")
            except BaseExceptionGroup as group:
                failure = _first_failure(group)
        finally:
            self._open = False
            while self._idle:
                await invocation.discard(self._idle.popleft())
        try:
            if raised is not None and not (failure is not None
                                           and isinstance(raised, trio.Cancelled)):
                if failure is not None:
                    raised.add_note(f"the pool failed too: {failure}")
                raise raised
            if failure is not None:
                raise failure
        finally:
            raised = failure = None  # no reference cycle through the frame

    @property
    def idle_workers(self) -> int:
        """Workers spawned and waiting for a request."""
        return len(self._idle)

    @property
    def calls_waiting(self) -> int:
        """Calls with limits of their own waiting for a slot (every one of
        the pool's `size` is taken by such calls' jails)."""
        return self._slots.statistics().tasks_waiting

    async def run(
        self, request: object, *, response_type: Any = Any,  # noqa: ANN401  a msgspec type form
        limits: Limits | None = None,
    ) -> Result[Any]:
        """Serve `request` on a prewarmed worker (or a fresh one if none is
        ready). Same reasons, same verdict as `Runner.run`. With `limits`
        other than the pool's, on a jail started for this call (see the
        module's docstring), as `Runner.run(..., limits=limits)`."""
        invocation.require_trio("WorkerPool.run", _ASYNCIO_POOL)
        if self._mode == "exec":
            raise RuntimeError("an exec pool serves `pool.exec(argv, ...)`, not `pool.run`")
        limits = self._call_limits(limits)
        caps = self._caps if limits is self._limits else invocation.Caps.of(limits)
        return await self._serve(request, limits, caps, response_type)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None, limits: Limits | None = None,
        capture_on_failure: bool = False,
    ) -> Result[ExecResult]:
        """`Runner.exec` on a prewarmed worker of a `runner.pool("exec")`:
        the same checks, caps and verdict, and `capture_on_failure` alike.
        With `limits` other than the pool's, on a jail started for this
        call, as `Runner.exec(..., limits=limits)`."""
        invocation.require_trio("WorkerPool.exec", _ASYNCIO_POOL)
        if self._mode != "exec":
            raise RuntimeError("pool.exec needs a pool of the 'exec' mode")
        limits = self._call_limits(limits)
        request, caps = exec_checks.exec_request(argv, stdin, files, collect, limits, env)
        result: Result[ExecResult] = await self._serve(request, limits, caps, ExecResult,
                                                       capture_on_failure=capture_on_failure)
        exec_checks.check_exec_reply(result.response, limits, request.collect,
                                     capture_on_failure=capture_on_failure)
        return result

    @asynccontextmanager
    async def open_process(
        self, argv: Sequence[str], *, files: Mapping[str, bytes | ExecFile] | None = None,
        env: Mapping[str, str] | None = None, limits: Limits | None = None, pty: bool = False,
    ) -> AsyncIterator[StreamingProcess]:
        """`Runner.open_process` through this `exec` pool's fork server: a
        jail started for the call (its plan names its stdio, so no
        prewarmed worker fits), in one of the `size` slots, held until the
        `async with` ends. The same streams, caps and verdict."""
        if self._mode != "exec":
            raise RuntimeError("pool.open_process needs a pool of the 'exec' mode")
        if not self._open:
            raise RuntimeError("use the pool inside `async with runner.pool(...)`")
        from trunner import streaming

        limits = self._call_limits(limits)
        async with self._slot():
            self._last_use = trio.current_time()
            async with streaming.open_process(self._backend, self._argv, limits,
                                              self._temp_root, argv, files=files, env=env,
                                              pty=pty, spawner=self._spawner) as process:
                yield process

    def _call_limits(self, limits: Limits | None) -> Limits:
        """The pool's own limits for None or equal ones (so `is` tells a
        prewarmed call from one of its own)."""
        if limits is None or limits == self._limits:
            return self._limits
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        return limits

    async def _serve(
        self, request: object, limits: Limits, caps: invocation.Caps,
        response_type: Any,  # noqa: ANN401  as in run
        *, capture_on_failure: bool = False,
    ) -> Result[Any]:
        if not self._open:
            raise RuntimeError("use the pool inside `async with runner.pool(...)`")
        self._last_use = trio.current_time()
        if limits is not self._limits:
            async with self._slot():
                self._last_use = trio.current_time()
                return await invocation.invoke(self._backend, self._argv, limits,
                                               self._temp_root, request, caps, response_type,
                                               spawner=self._spawner,
                                               capture_on_failure=capture_on_failure)
        # A worker that died while idle (e.g. a refused setup) is served all
        # the same, so the caller gets its real reason, not a silent respawn.
        started = self._idle.popleft() if self._idle else None
        try:
            return await invocation.invoke(self._backend, self._argv, self._limits,
                                           self._temp_root, request, caps, response_type,
                                           started=started, spawner=self._spawner,
                                           capture_on_failure=capture_on_failure)
        finally:
            # Refill after the reply, not before: a new worker's start-up
            # (helper, adapter imports: most of an invocation's CPU) would
            # compete with this run for the CPU.
            self._wanted.set()

    @asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """One of the pool's `size` slots, for a call with limits of its own:
        wait for one, then end idle workers until they and such calls' jails
        are at most `size` (a worker the refill is starting counts: its end is
        waited for first), so that the call's jail takes the host id one of
        them held. The refill is woken when the slot is given back."""
        async with self._slots:
            self._own += 1
            try:
                while self._starting is not None:
                    await self._starting.wait()
                while self._idle and len(self._idle) + self._own > self.size:
                    await invocation.discard(self._idle.pop())
                yield
            finally:
                self._own -= 1
                self._wanted.set()

    async def _start(self) -> invocation.Started:
        """A worker for the idle queue. A server that dies with the request
        fails it; a refill, which no caller waits on, tries once more (on a
        new server) before that ends the pool."""
        losses = self._spawner.losses
        try:
            return await invocation.start(self._backend, self._argv, self._limits,
                                          self._temp_root, self._spawner)
        except RunnerError:
            if self._spawner.losses == losses:
                raise
        return await invocation.start(self._backend, self._argv, self._limits,
                                      self._temp_root, self._spawner)

    async def _refill(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                      ) -> None:
        ready = False

        def announce() -> None:
            nonlocal ready
            if not ready:
                ready = True
                task_status.started()

        while True:
            # Fresh before looking, so a run() during the awaits below is seen.
            self._wanted = trio.Event()
            if trio.current_time() - self._last_use >= self.idle_s:
                # Unused for idle_s: end the idle workers and the fork
                # server, refill (and restart it) on next use.
                while self._idle:
                    await invocation.discard(self._idle.popleft())
                await self._spawner.aclose()
                announce()
                await self._wanted.wait()
            elif len(self._idle) + self._own < self.size:
                # A refill that cannot spawn ends the pool: its RunnerError
                # (anything else as internal_error) leaves the `async with`.
                starting = self._starting = trio.Event()
                try:
                    with invocation.only_runner_errors():
                        self._idle.append(await self._start())
                finally:
                    self._starting = None
                    starting.set()
            else:
                announce()
                with trio.move_on_at(self._last_use + self.idle_s):
                    await self._wanted.wait()


def _first_failure(group: BaseExceptionGroup[BaseException]) -> RunnerError:
    """The pool's own failure out of its nursery's group: the first
    `RunnerError` (a refill's), any other exception as `internal_error`;
    the rest are named in its notes."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        e = stack.pop(0)
        if isinstance(e, BaseExceptionGroup):
            stack[:0] = e.exceptions
        elif not isinstance(e, trio.Cancelled):
            leaves.append(e)
    if not leaves:  # only Cancelled: not a failure of the pool's
        raise group
    first = leaves[0]
    if isinstance(first, RunnerError):
        failure = first
    else:
        if not isinstance(first, Exception):
            raise first  # KeyboardInterrupt and the like stay themselves
        failure = RunnerError(Reason.INTERNAL_ERROR, f"{type(first).__name__}: {first}")
        failure.__cause__ = first
    for other in leaves[1:]:
        failure.add_note(f"also: {type(other).__name__}: {other}")
    return failure
