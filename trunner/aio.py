"""trunner for asyncio callers: `AsyncioRunner` and its pools, awaited from
asyncio tasks, with the trio API's results, errors and verdicts.

A facade, not a port: every call runs the trio API itself as one task of
the portal, a trio run on a daemon thread of this process started by the
first call (benchmarks/aio_facade.py measured it against trio's guest mode
on the asyncio loop; docs/asyncio.md). An asyncio cancel cancels the call's
trio scope and waits for the call to end (its jail killed and removed)
before the `CancelledError` leaves the `await`; trunner's errors cross as
themselves. `trunner.ray.AsyncioPool` holds its cluster pool through the
same pieces (`call`, `Held`). Named `aio`, not `asyncio`: a module
`trunner.asyncio` would shadow the standard library's for anything run
from inside the package's directory, and `from trunner import asyncio`
would in a caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal as _signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, final, overload

import trio

from trunner.runner import Runner

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
    from contextlib import AbstractAsyncContextManager
    from types import TracebackType

    from trunner.invocation import Result
    from trunner.limits import Limits
    from trunner.pool import WorkerPool
    from trunner.protocol import ExecFile, ExecResult, FileEntry, FilesOp, FilesResult
    from trunner.session import Background, Session
    from trunner.streaming import StreamingProcess

P = ParamSpec("P")
T = TypeVar("T")

#: How long the portal's thread lets go of the GIL after a reply, when it has
#: more to run: a woken thread's wake-up, from its epoll to holding the GIL
#: (benchmarks/aio_facade.py: without it, 0.2-6 ms after a pool call).
HANDOFF_S = 0.0002

#: A finished call: (True, its value) or (False, its exception; None if it was cancelled).
Outcome = tuple[bool, Any]


class Portal:
    """One trio run on a daemon thread: the trio side of every asyncio call
    in this process. Idle between calls (blocked in epoll); a child of a
    fork starts its own. `Portal.get()` gives the live one."""

    _lock = threading.Lock()
    _current: Portal | None = None

    @classmethod
    def get(cls) -> Portal:
        with cls._lock:
            portal = cls._current
            if portal is None or not portal.is_alive():
                portal = cls._current = cls()
            return portal

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="trunner-aio", daemon=True)
        self._thread.start()
        self._ready.wait()

    def is_alive(self) -> bool:
        return self._pid == os.getpid() and self._token is not None

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        finally:
            self._token = None
            self._ready.set()

    async def _serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await trio.sleep_forever()

    def soon(self, fn: Callable[..., object], *args: object) -> bool:
        """Run `fn(*args)` on the portal's thread, in order; False if it has ended."""
        token = self._token
        if token is None:
            return False
        try:
            token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            return False
        return True

    def start(self, scope: trio.CancelScope, fn: Callable[[], Awaitable[object]],
              done: asyncio.Future[Outcome]) -> None:
        """Start `fn()` as a task of the portal, in `scope`; its outcome
        settles `done` on `done`'s own loop."""
        if not self.soon(self._start, scope, fn, functools.partial(settle_soon, done)):
            raise RuntimeError("trunner.aio: the portal's trio thread has ended")

    def _start(self, scope: trio.CancelScope, fn: Callable[[], Awaitable[object]],
               reply: Callable[[Outcome], None]) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(_serve_call, scope, fn, reply)


async def _serve_call(scope: trio.CancelScope, fn: Callable[[], Awaitable[object]],
                      reply: Callable[[Outcome], None]) -> None:
    outcome: Outcome = (False, None)  # cancelled, unless it ends otherwise
    try:
        with scope:
            try:
                outcome = (True, await fn())
            except trio.Cancelled:
                raise
            except BaseException as e:  # crosses to the caller as itself
                outcome = (False, e)
    finally:
        reply(outcome)
        outcome = (False, None)  # no reference cycle through the frame
        if trio.lowlevel.current_statistics().tasks_runnable:
            # Other trio work is ready (a pool's refill, whose spawn is
            # CPU): it would hold the GIL for up to a switch interval (5 ms)
            # while the caller's thread wakes. Release it for that wake-up,
            # so the caller goes on first, as a trio caller's task would.
            time.sleep(HANDOFF_S)  # noqa: ASYNC251  blocks this thread on purpose


def settle_soon(done: asyncio.Future[Outcome], outcome: Outcome) -> None:
    """Settle `done` with `outcome` from any thread, on its own loop."""
    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
        done.get_loop().call_soon_threadsafe(_settle, done, outcome)


def _settle(done: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not done.done():
        done.set_result(outcome)


def _unwrap(outcome: Outcome) -> Any:  # noqa: ANN401  the call's own value
    ok, value = outcome
    if ok:
        return value
    if value is None:
        raise asyncio.CancelledError("trunner.aio: the call's trio side was cancelled")
    try:
        raise value
    finally:
        value = None


async def _wait_out(done: asyncio.Future[Outcome]) -> None:
    """Wait for `done` whatever cancels this task meanwhile."""
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            continue


def _loop(api: str) -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(f"{api} is awaited from asyncio: trio callers use trunner.Runner"
                           " (or trunner.ray.cluster_pool)") from None


async def call(api: str, fn: Callable[P, Awaitable[T]], *args: P.args,
               **kwargs: P.kwargs) -> T:
    """`await fn(*args, **kwargs)` in the portal, from an asyncio task.

    A cancel of the awaiting task cancels the call's trio scope, waits for
    the call to end (a run's jail is then killed and removed), and leaves
    as `CancelledError`; the call's own exception leaves as itself.
    """
    done: asyncio.Future[Outcome] = _loop(api).create_future()
    scope = trio.CancelScope()
    portal = Portal.get()
    portal.start(scope, functools.partial(fn, *args, **kwargs), done)
    try:
        outcome = await asyncio.shield(done)
    except asyncio.CancelledError:
        portal.soon(scope.cancel)
        await _wait_out(done)
        raise
    result: T = _unwrap(outcome)
    return result


class Held(Generic[T]):
    """A trio async context manager (a pool) held open in the portal for the
    `async with` of an asyncio task, as the trio API's is for a trio task:
    the body's own exception leaves as itself; the held one's own failure
    (a refill that cannot spawn) cancels the body and leaves as itself."""

    def __init__(self, api: str, cm: AbstractAsyncContextManager[T]) -> None:
        self._api, self._cm = api, cm
        self._portal: Portal | None = None
        self._scope = trio.CancelScope()
        self._stop: trio.Event | None = None
        self._ended: asyncio.Future[Outcome] | None = None
        self._body: asyncio.Task[Any] | None = None
        self._cancelled_body = False

    async def enter(self) -> T:
        loop = _loop(self._api)
        self._scope, self._stop, self._cancelled_body = trio.CancelScope(), None, False
        opened: asyncio.Future[Outcome] = loop.create_future()
        ended = self._ended = loop.create_future()
        self._portal = Portal.get()
        self._portal.start(self._scope, functools.partial(self._hold, opened), ended)
        try:
            await asyncio.wait([opened, ended], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._portal.soon(self._scope.cancel)
            await _wait_out(ended)
            raise
        if not opened.done():
            _unwrap(ended.result())  # it failed to open: raises
        value: T = _unwrap(opened.result())
        self._body = asyncio.current_task()
        ended.add_done_callback(self._on_end)
        return value

    async def _hold(self, opened: asyncio.Future[Outcome]) -> None:
        async with self._cm as value:
            self._stop = trio.Event()
            settle_soon(opened, (True, value))
            await self._stop.wait()

    async def wait_ended(self) -> None:
        """Wait until the held one ends; its failure cancels the body, this
        task among them, first (`_on_end` was added first)."""
        assert self._ended is not None
        await asyncio.wait([self._ended])

    def _on_end(self, ended: asyncio.Future[Outcome]) -> None:
        """The held one ended while the body runs: its failure. Cancel the body."""
        if self._body is not None and not self._body.done():
            self._cancelled_body = True
            self._body.cancel()

    async def exit(self, exc: BaseException | None) -> None:
        assert self._portal is not None
        assert self._ended is not None
        ended, body, self._body = self._ended, self._body, None
        ended.remove_done_callback(self._on_end)
        stop = self._stop
        if stop is not None:
            self._portal.soon(stop.set)
        try:
            await asyncio.shield(ended)
        except asyncio.CancelledError:
            self._portal.soon(self._scope.cancel)
            await _wait_out(ended)
            raise
        ok, failure = ended.result()
        if ok:
            return
        if failure is None:  # its trio side was cancelled, not by this task
            failure = asyncio.CancelledError("trunner.aio: the pool's trio side was cancelled")
        try:
            if self._cancelled_body and body is not None:  # the cancel was ours: take it back
                body.uncancel()
                if isinstance(exc, asyncio.CancelledError):
                    raise failure
            if exc is None:
                raise failure
            exc.add_note(f"the pool failed too: {failure}")
            # The body's own exception leaves as itself.
        finally:
            failure = None


@final
class AsyncioRunner:
    """`trunner.Runner` for asyncio callers: `await runner.run(mode, x)`,
    `await runner.exec(argv)`, `async with runner.pool(mode) as pool:`.

    Takes a `Runner`, or `Runner`'s keyword arguments to build one; the
    methods take theirs and give the same results and `RunnerError`s. Each
    call is the trio `Runner`'s, in the portal (see the module's docstring).

    Raises:
        RunnerError: as `Runner()`.
    """

    def __init__(self, runner: Runner | None = None, /,
                 **options: Any) -> None:  # noqa: ANN401  Runner's keyword arguments
        if runner is not None and options:
            raise ValueError("pass a Runner or Runner's arguments, not both")
        self.runner = runner if runner is not None else Runner(**options)
        self._entered: list[AsyncioWarm] = []

    def warm(self) -> AsyncioWarm:
        """`Runner.warm`, from asyncio: `async with runner.warm():` keeps a
        fork server (in the portal) for the block, and `run`, `exec` and
        `open_process` there start their jails through it."""
        return AsyncioWarm(self, Held("AsyncioRunner.warm", self.runner.warm()))

    async def __aenter__(self) -> AsyncioRunner:
        block = self.warm()
        await block.__aenter__()
        self._entered.append(block)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._entered.pop().__aexit__(exc_type, exc, tb)

    @property
    def limits(self) -> Limits:
        return self.runner.limits

    def rules_version(self, limits: Limits | None = None) -> str:
        """As `Runner.rules_version`."""
        return self.runner.rules_version(limits)

    @overload
    async def run(
        self, mode: str, request: object = None, *, limits: Limits | None = None
    ) -> Result[Any]: ...

    @overload
    async def run(
        self, mode: str, request: object = None, *, limits: Limits | None = None,
        response_type: type[T],
    ) -> Result[T]: ...

    async def run(
        self, mode: str, request: object = None, *, limits: Limits | None = None,
        response_type: Any = Any,
    ) -> Result[Any]:
        """`Runner.run`, from asyncio.

        Raises:
            RunnerError: with any `Reason`; never with a partial result.
        """
        return await call("AsyncioRunner.run", self.runner.run, mode, request, limits=limits,
                          response_type=response_type)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None, limits: Limits | None = None,
    ) -> Result[ExecResult]:
        """`Runner.exec`, from asyncio.

        Raises:
            RunnerError: as `Runner.exec`.
        """
        return await call("AsyncioRunner.exec", self.runner.exec, argv, stdin=stdin,
                          files=files, collect=collect, env=env, limits=limits)

    def pool(self, mode: str, *, size: int = 2, limits: Limits | None = None,
             idle_s: float = 60.0) -> AsyncioWorkerPool:
        """`Runner.pool`, from asyncio: `async with runner.pool("echo") as
        pool: await pool.run(x)`. The pool's refill runs in the portal.

        Raises:
            RunnerError: `unknown_mode`, here; the pool's own failure, from
                the `async with`.
        """
        return AsyncioWorkerPool(self.runner.pool(mode, size=size, limits=limits,
                                                  idle_s=idle_s))

    def open_process(
        self, argv: Sequence[str], *, files: Mapping[str, bytes | ExecFile] | None = None,
        env: Mapping[str, str] | None = None, limits: Limits | None = None, pty: bool = False,
    ) -> AsyncioProcess:
        """`Runner.open_process`, from asyncio: `async with
        runner.open_process(argv) as p:`, then `await p.stdin.send_all(b)`,
        `await p.stdout.receive_some()`; `p.result` after a clean end."""
        return AsyncioProcess(Held("AsyncioRunner.open_process", self.runner.open_process(
            argv, files=files, env=env, limits=limits, pty=pty)))

    def session(self, *, limits: Limits | None = None, idle_s: float = 300.0,
                lifetime_s: float = 3600.0) -> AsyncioSession:
        """`Runner.session`, from asyncio: `async with runner.session() as s:`,
        then `await s.exec(argv)`, `s.open_process(argv)`,
        `await s.start_background(argv)` (docs/sessions.md)."""
        return AsyncioSession(Held("AsyncioRunner.session", self.runner.session(
            limits=limits, idle_s=idle_s, lifetime_s=lifetime_s)))


@final
class AsyncioWarm:
    """`async with runner.warm():` (an `AsyncioRunner`); see `Runner.warm`."""

    def __init__(self, runner: AsyncioRunner, held: Held[Runner]) -> None:
        self._runner, self._held = runner, held

    async def __aenter__(self) -> AsyncioRunner:
        await self._held.enter()
        return self._runner

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._held.exit(exc)


class AsyncioSendStream:
    """A trio send stream of the portal's, from asyncio."""

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self._stream = stream

    async def send_all(self, data: bytes) -> None:
        await call("send_all", self._stream.send_all, data)

    async def aclose(self) -> None:
        await call("aclose", self._stream.aclose)


class AsyncioReceiveStream:
    """A trio receive stream of the portal's (a `CappedStream`), from asyncio."""

    def __init__(self, stream: trio.abc.ReceiveStream, held: Held[Any]) -> None:
        self._stream, self._held = stream, held

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        try:
            return bytes(await call("receive_some", self._stream.receive_some, max_bytes))
        except trio.BrokenResourceError:
            # A read past the cap: the run ends with its error, which cancels
            # this body (as trio's does) and leaves the `async with` as itself.
            await self._held.wait_ended()
            raise


@final
class AsyncioProcess:
    """Use as `async with runner.open_process(argv) as p:` (an
    `AsyncioRunner` or `AsyncioSession`); see `Runner.open_process`. A cap
    or a limit cancels the body and leaves the `async with` as its
    `RunnerError`; `result` is set only after a clean end."""

    def __init__(self, held: Held[StreamingProcess]) -> None:
        self._held = held
        self._process: StreamingProcess | None = None

    async def __aenter__(self) -> AsyncioProcess:
        process = self._process = await self._held.enter()
        self.stdin = AsyncioSendStream(process.stdin)
        self.stdout = AsyncioReceiveStream(process.stdout, self._held)
        self.stderr = AsyncioReceiveStream(process.stderr, self._held)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._held.exit(exc)

    @property
    def result(self) -> Result[ExecResult] | None:
        return None if self._process is None else self._process.result

    def set_window_size(self, *, rows: int, columns: int) -> None:
        assert self._process is not None
        self._process.set_window_size(rows=rows, columns=columns)


@final
class AsyncioSession:
    """Use as `async with runner.session() as s:` (an `AsyncioRunner`); see
    `Runner.session` and `trunner.session.Session`."""

    def __init__(self, held: Held[Session]) -> None:
        self._held = held
        self._session: Session | None = None

    async def __aenter__(self) -> AsyncioSession:
        self._session = await self._held.enter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._held.exit(exc)

    @property
    def ended(self) -> str:
        assert self._session is not None
        return self._session.ended

    def rules_version(self, limits: Limits | None = None) -> str:
        assert self._session is not None
        return self._session.rules_version(limits)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None, limits: Limits | None = None,
        capture_on_failure: bool = False,
    ) -> Result[ExecResult]:
        """`Session.exec`, from asyncio."""
        assert self._session is not None
        return await call("AsyncioSession.exec", self._session.exec, argv, stdin=stdin,
                          files=files, collect=collect, env=env, limits=limits,
                          capture_on_failure=capture_on_failure)

    def open_process(
        self, argv: Sequence[str], *, files: Mapping[str, bytes | ExecFile] | None = None,
        env: Mapping[str, str] | None = None, limits: Limits | None = None, pty: bool = False,
    ) -> AsyncioProcess:
        """`Session.open_process`, from asyncio."""
        assert self._session is not None
        return AsyncioProcess(Held("AsyncioSession.open_process", self._session.open_process(
            argv, files=files, env=env, limits=limits, pty=pty)))

    async def files(self, ops: Sequence[FilesOp], *, limits: Limits | None = None,
                    budget_bytes: int | None = None) -> Result[FilesResult]:
        """`Session.files`, from asyncio."""
        assert self._session is not None
        return await call("AsyncioSession.files", self._session.files, ops, limits=limits,
                          budget_bytes=budget_bytes)

    async def read_files(self, patterns: Sequence[str], *,
                         limits: Limits | None = None) -> list[FileEntry]:
        """`Session.read_files`, from asyncio."""
        assert self._session is not None
        return await call("AsyncioSession.read_files", self._session.read_files, patterns,
                          limits=limits)

    async def write_files(self, entries: Mapping[str, bytes] | Sequence[FileEntry], *,
                          limits: Limits | None = None) -> None:
        """`Session.write_files`, from asyncio."""
        assert self._session is not None
        await call("AsyncioSession.write_files", self._session.write_files, entries,
                   limits=limits)

    async def export(self, path: str = ".", *, limits: Limits | None = None) -> bytes:
        """`Session.export`, from asyncio: the whole tar."""
        session = self._session
        assert session is not None

        async def whole() -> bytes:
            return b"".join([chunk async for chunk in session.export(path, limits=limits)])

        return await call("AsyncioSession.export", whole)

    async def import_(self, tar: bytes, path: str = ".", *, limits: Limits | None = None) -> int:
        """`Session.import_`, from asyncio."""
        assert self._session is not None
        return await call("AsyncioSession.import_", self._session.import_, tar, path,
                          limits=limits)

    async def start_background(
        self, argv: Sequence[str], *, files: Mapping[str, bytes | ExecFile] | None = None,
        env: Mapping[str, str] | None = None, limits: Limits | None = None,
    ) -> AsyncioBackground:
        """`Session.start_background`, from asyncio."""
        assert self._session is not None
        background = await call("AsyncioSession.start_background",
                                self._session.start_background, argv, files=files, env=env,
                                limits=limits)
        return AsyncioBackground(background)


@final
class AsyncioBackground:
    """A session's background process (`trunner.session.Background`), from asyncio."""

    def __init__(self, background: Background) -> None:
        self._background = background

    @property
    def stdout(self) -> bytes:
        return self._background.stdout

    @property
    def stderr(self) -> bytes:
        return self._background.stderr

    @property
    def running(self) -> bool:
        return self._background.running

    async def wait(self) -> Result[ExecResult] | None:
        return await call("AsyncioBackground.wait", self._background.wait)

    async def stop(self) -> None:
        await call("AsyncioBackground.stop", self._background.stop)


@final
class AsyncioWorkerPool:
    """Use as `async with runner.pool(mode) as pool:` (an `AsyncioRunner`);
    see `Runner.pool`. The same calls, results and failures as the trio
    pool's: the body's own exception leaves the `async with` as itself, the
    pool's own failure cancels the body and leaves it as one `RunnerError`."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool
        self._held = Held("AsyncioWorkerPool", pool)

    @property
    def size(self) -> int:
        return self._pool.size

    @property
    def idle_workers(self) -> int:
        return self._pool.idle_workers

    @property
    def calls_waiting(self) -> int:
        return self._pool.calls_waiting

    async def __aenter__(self) -> AsyncioWorkerPool:
        await self._held.enter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._held.exit(exc)

    async def run(
        self, request: object, *, response_type: Any = Any,  # noqa: ANN401  a msgspec type form
        limits: Limits | None = None,
    ) -> Result[Any]:
        """`WorkerPool.run`, from asyncio."""
        return await call("AsyncioWorkerPool.run", self._pool.run, request,
                          response_type=response_type, limits=limits)

    async def exec(
        self, argv: Sequence[str], *, stdin: bytes = b"",
        files: Mapping[str, bytes | ExecFile] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None, limits: Limits | None = None,
    ) -> Result[ExecResult]:
        """`WorkerPool.exec`, from asyncio."""
        return await call("AsyncioWorkerPool.exec", self._pool.exec, argv, stdin=stdin,
                          files=files, collect=collect, env=env, limits=limits)


@final
@dataclass(eq=False)
class AsyncioSignalScope:
    """What `cancel_on_signals()` (asyncio) says: the signal that arrived first, or None."""

    signal: _signal.Signals | None = None

    @property
    def exit_code(self) -> int | None:
        """128 + the signal, as a shell reports a process it ended; or None."""
        return None if self.signal is None else 128 + self.signal


@contextlib.asynccontextmanager
async def cancel_on_signals(*signals: int) -> AsyncIterator[AsyncioSignalScope]:
    """`trunner.cancel_on_signals` for asyncio: the first of `signals`
    (default SIGTERM, SIGINT) cancels the body's task, so every trunner
    call in it ends its jail before its `await` returns; the `async with`
    then returns normally with `.signal` set. A second signal while the
    body unwinds is held until it has, then delivered as usual. The
    running loop's signal handlers for `signals` are this one's meanwhile;
    main thread only."""
    loop = _loop("trunner.aio.cancel_on_signals")
    task = asyncio.current_task()
    assert task is not None
    scope = AsyncioSignalScope()
    held: list[int] = []
    wanted = signals or (_signal.SIGTERM, _signal.SIGINT)

    def on_signal(signum: int) -> None:
        if scope.signal is None:
            scope.signal = _signal.Signals(signum)
            task.cancel()
        else:
            held.append(signum)

    for signum in wanted:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield scope
    except asyncio.CancelledError:
        if scope.signal is None or task.uncancel() > 0:
            raise  # not (only) ours
    finally:
        for signum in wanted:
            loop.remove_signal_handler(signum)
        if held:
            _signal.raise_signal(held[0])
