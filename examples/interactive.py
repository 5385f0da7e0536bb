"""Interactive judging with `Runner.open_process`: a solution and an
interactor, each in its own jail with its own limits, talking turn by turn
through the caller, which relays their bytes and times the solution's
silences.

The problem: guess a secret number in 1..1000 with at most 10 guesses. The
interactor reads the secret from its argv, answers each guess with `<`, `>`
or `=`, and exits 0 (the solution found it) or 1 (it did not). Verdicts, as
a judge gives them:

- AC, WA: the interactor's exit, 0 or 1 (anything else: JE, judge error);
- TLE-idle: the solution stopped answering: it owed the interactor a line
  and wrote nothing for `idle_s` (the idle limit, `IDLE_S`), while the
  interactor waited; the time it was silent is in the detail;
- TLE, MLE, OLE: the solution's own limits (`timeout` / `cpu_time`,
  `memory_limit`, `stdout_cap`), as the `RunnerError` from its
  `async with` says;
- RE: the solution exited non-zero (or was killed) after the interactor
  accepted.

    python examples/interactive.py            # judges the two solutions below
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from trunner import Limits, Reason, Runner, RunnerError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trunner.streaming import StreamingProcess

#: The idle limit: the longest the solution may stay silent while it owes a
#: line. Generous, so that scheduling on a busy host is never a TLE.
IDLE_S = 2.0

INTERACTOR = """
import sys
secret = int(sys.argv[1])
for _ in range(10):
    line = sys.stdin.readline()
    if not line:
        sys.exit(1)
    guess = int(line)
    answer = '=' if guess == secret else '<' if secret < guess else '>'
    print(answer, flush=True)
    if answer == '=':
        sys.exit(0)
sys.exit(1)
"""

#: Binary search: found in at most 10 guesses.
SOLUTION = """
lo, hi = 1, 1000
while True:
    mid = (lo + hi) // 2
    print(mid, flush=True)
    answer = input()
    if answer == '=':
        break
    if answer == '<':
        hi = mid - 1
    else:
        lo = mid + 1
"""


@dataclass(frozen=True)
class Verdict:
    verdict: str
    detail: str = ""


class _Idle(Exception):
    """The solution stayed silent past the idle limit."""

    def __init__(self, silent_s: float) -> None:
        super().__init__(silent_s)
        self.silent_s = silent_s


class _InteractorFailed(Exception):
    def __init__(self, error: RunnerError) -> None:
        super().__init__(error)
        self.error = error


async def judge(runner: Runner, solution: Sequence[str], interactor: Sequence[str], *,
                solution_limits: Limits, interactor_limits: Limits,
                idle_s: float = IDLE_S) -> Verdict:
    """Run `solution` against `interactor`, each in its own jail, and give
    the verdict."""
    try:
        async with runner.open_process(solution, limits=solution_limits) as sol:
            try:
                async with runner.open_process(interactor, limits=interactor_limits) as inter:
                    await relay(sol, inter, idle_s)
            except RunnerError as e:
                raise _InteractorFailed(e) from e
            assert inter.result is not None
            code = inter.result.response.exit_code
    except _Idle as e:
        return Verdict("TLE-idle", f"the solution wrote nothing for {e.silent_s:.1f} s"
                       f" while it owed a line (idle limit {idle_s} s)")
    except _InteractorFailed as e:
        return Verdict("JE", f"the interactor failed: {e.error}")
    except RunnerError as e:
        names = {Reason.TIMEOUT: "TLE", Reason.CPU_TIME: "TLE", Reason.MEMORY_LIMIT: "MLE",
                 Reason.STDOUT_CAP: "OLE", Reason.STDERR_CAP: "OLE"}
        return Verdict(names.get(e.reason, "RE"), str(e))
    if code not in (0, 1):
        return Verdict("JE", f"the interactor exited {code}")
    if code == 1:
        return Verdict("WA", "the interactor did not accept")
    assert sol.result is not None
    if sol.result.response.exit_code != 0:
        return Verdict("RE", f"the solution exited {sol.result.response.exit_code}"
                       f" (signal {sol.result.response.signal})")
    return Verdict("AC")


async def relay(sol: StreamingProcess, inter: StreamingProcess, idle_s: float) -> None:
    """Copy the solution's stdout to the interactor's stdin and back until
    both are done. The solution owes a line from its start and after each
    reply of the interactor's, until it writes one; owing one for `idle_s`
    raises `_Idle` (which ends both runs: an exception from the body kills
    its process)."""
    owed_since: list[float | None] = [trio.current_time()]
    changed = [trio.Event()]

    def owe(since: float | None) -> None:
        owed_since[0] = since
        changed[0].set()
        changed[0] = trio.Event()

    async def solution_to_interactor() -> None:
        while chunk := await sol.stdout.receive_some():
            owe(None)
            await _send(inter.stdin, chunk)
        owe(None)  # it ended: it owes nothing more
        await inter.stdin.aclose()

    async def interactor_to_solution() -> None:
        while chunk := await inter.stdout.receive_some():
            await _send(sol.stdin, chunk)
            owe(trio.current_time())
        await sol.stdin.aclose()

    async def watch(done: trio.CancelScope) -> None:
        while True:
            since, event = owed_since[0], changed[0]
            if since is None:
                await event.wait()
                continue
            with trio.move_on_at(since + idle_s):
                await event.wait()
                continue
            silent[0] = trio.current_time() - since
            done.cancel()
            return

    silent: list[float | None] = [None]
    async with trio.open_nursery() as nursery:
        watcher = trio.CancelScope()

        async def watched() -> None:
            with watcher:
                await watch(nursery.cancel_scope)

        nursery.start_soon(watched)
        async with trio.open_nursery() as pipes:
            pipes.start_soon(solution_to_interactor)
            pipes.start_soon(interactor_to_solution)
        watcher.cancel()
    if silent[0] is not None:
        raise _Idle(silent[0])


async def _send(stream: trio.abc.SendStream, data: bytes | bytearray) -> None:
    # The other side may have ended: its own end says how.
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(data)


async def main() -> None:
    runner = Runner()
    solution_limits = Limits(wall_time_s=10.0, cpu_time_s=5.0)
    interactor_limits = Limits(wall_time_s=20.0, cpu_time_s=5.0)
    python = [sys.executable, "-c"]
    stuck = "print(500, flush=True)\nimport time\ntime.sleep(1e9)"
    for name, code in (("binary search", SOLUTION), ("stops answering", stuck)):
        verdict = await judge(runner, [*python, code], [*python, INTERACTOR, "737"],
                              solution_limits=solution_limits,
                              interactor_limits=interactor_limits)
        print(f"{name}: {verdict.verdict} {verdict.detail}")


if __name__ == "__main__":
    trio.run(main)
