"""SIGTERM and SIGINT as cancellation, so that every run cleans up.

Left to their defaults, SIGTERM ends the process at once (its jail dirs are
then the watchdog's) and SIGINT raises `KeyboardInterrupt` wherever the code
is. `cancel_on_signals()` turns the first of them into the cancellation of
one scope: each run in it kills its group, frees its cgroup and removes its
jail dir, as it does when its caller cancels. The CLI runs inside one.
"""

from __future__ import annotations

import signal as _signal
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, final

import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@final
@dataclass(eq=False)
class SignalScope:
    """The scope `cancel_on_signals()` cancels, and the signal that did."""

    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: The signal that arrived first, or None.
    signal: _signal.Signals | None = None

    @property
    def exit_code(self) -> int | None:
        """128 + the signal, as a shell reports a process it ended; or None."""
        return None if self.signal is None else 128 + self.signal


@asynccontextmanager
async def cancel_on_signals(
    *signals: int,
) -> AsyncIterator[SignalScope]:
    """Cancel the body on the first of `signals` (default SIGTERM, SIGINT).

    ```python
    async with trunner.cancel_on_signals() as stop:
        await serve_forever(runner)
    if stop.signal is not None:
        sys.exit(stop.exit_code)   # every run has cleaned up by now
    ```

    The body ends as if its caller had cancelled it; the `async with` then
    returns normally, with `.signal` set. A second signal that arrives while
    the body unwinds is held until it has, then delivered as usual (trio
    redelivers it). Main thread only.
    """
    scope = SignalScope()
    watcher = trio.CancelScope()

    async def watch(received: AsyncIterator[int]) -> None:
        with watcher:
            # The body may be over before this task first runs: the receiver
            # is closed then, and only this checkpoint (cancelled) is safe.
            await trio.lowlevel.checkpoint()
            async for signum in received:
                scope.signal = _signal.Signals(signum)
                scope.cancel_scope.cancel()
                return

    with trio.open_signal_receiver(*(signals or (_signal.SIGTERM, _signal.SIGINT))) as received:
        # A system task, not a nursery: the body's own exceptions stay unwrapped.
        trio.lowlevel.spawn_system_task(watch, received)
        try:
            with scope.cancel_scope:
                yield scope
        finally:
            watcher.cancel()
