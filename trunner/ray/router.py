"""The driver's decisions, with no event loop and no call to Ray: which
nodes there are, which one a call goes to, what a Ray failure means, what
the watch does next, and what a ping's or a join's outcome means.

Sans-IO: each step takes what happened (a reply's bytes, a Ray error, the
ids Ray listed, the time `now`) and says what to do; the trio pool
(trunner.ray.pool) and the asyncio one (trunner.ray.aio) are two thin loops
that do it. Of Ray it imports only `ray.exceptions`, to tell its errors
apart; the blocking calls to Ray's GCS are trunner.ray.cluster's. Each call
goes to the live node with the fewest calls in flight, under a per-node
bound, so nothing queues without bound; a node whose call failed is
suspect, and takes no call, until a `hello` answers.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import TYPE_CHECKING, Any, Literal

import ray.exceptions as rex

from trunner import exec_checks
from trunner.errors import Reason, RunnerError
from trunner.invocation import Result
from trunner.limits import Limits
from trunner.ray import wire

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from trunner.protocol import ExecFile

#: How often the watch runs (`due`): suspect nodes are pinged, and how long
#: a ping may take.
PING_S = 0.25
PING_BOUND_S = 5.0
#: How often the cluster is looked at for new nodes carrying the resource.
DISCOVER_S = 2.0
#: How long a cancelled call may take to end on its node.
CANCEL_BOUND_S = 10.0

#: Ray's errors that mean the node (its raylet, or the actor's process) is
#: gone or going: the run may or may not have executed.
LOST = (rex.RayActorError, rex.NodeDiedError, rex.ObjectLostError, rex.WorkerCrashedError,
        rex.LocalRayletDiedError, rex.ActorUnschedulableError)
#: Ray's errors on a ping that mean the actor will not restart (its node is gone).
GONE = (rex.ActorDiedError, rex.ActorUnschedulableError)


@dataclasses.dataclass(frozen=True)
class Spec:
    """What every node's actor is started with."""

    mode: str
    limits: Limits
    size_per_node: int
    in_flight_per_node: int
    resource: str
    cpus_per_node: float
    options: dict[str, Any]
    #: How many other nodes a call whose node was lost may go to.
    retry_node_lost: int = 0


@dataclasses.dataclass(eq=False)
class Node:
    id: str
    actor: Any  # a Ray ActorHandle; the router never touches it
    pid: int
    in_flight: int = 0
    served: int = 0
    state: Literal["live", "suspect", "dead"] = "live"


@dataclasses.dataclass(frozen=True)
class Ping:
    """Ask the suspect node's actor `hello`, within PING_BOUND_S; then `pinged`."""

    node: Node


@dataclasses.dataclass(frozen=True)
class Look:
    """List the nodes carrying the resource (`cluster.candidates`); then `found`."""


class Router:
    """One pool's tables, and its steps: `opened` and `close`; for a call,
    `run_call`/`exec_call`, `admit`, `release`, `retry_or_raise`, `result`;
    for the watch, `due`, `pinged`, `found`, `joined`."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.nodes: dict[str, Node] = {}
        #: Nodes whose actor started with other rules, or failed to start: id -> why.
        self.refused: dict[str, str] = {}
        self.rules_version = ""
        #: Calls' own limits: the rules version the first reply under them
        #: gave, which every other reply under them must give.
        self.versions: dict[Limits, str] = {}
        #: Between `opened` and `close`.
        self.is_open = False
        #: Nodes being pinged (`Ping`) and being started (`found`), until their outcome.
        self.pinging: set[str] = set()
        self.joining: set[str] = set()
        self._next_look = 0.0
        self._prefix = secrets.token_hex(6)
        self._count = 0

    # -- open and close -------------------------------------------------------------

    def opened(self, nodes: Iterable[Node], rules_version: str, now: float) -> None:
        """The pool started (`cluster.start_all`) at `now`, on the watch's clock."""
        self.nodes = {n.id: n for n in nodes}
        self.rules_version = rules_version
        self.is_open = True
        self._next_look = now + DISCOVER_S

    def close(self) -> list[Node]:
        """The pool closes: nothing joins from now on. Returns the nodes to
        close (`cluster.close_all`)."""
        self.is_open = False
        return list(self.nodes.values())

    # -- a call ---------------------------------------------------------------------

    def call_id(self) -> str:
        self._count += 1
        return f"{self._prefix}-{self._count}"

    def run_call(self, request: object, limits: Limits | None = None) -> wire.RunCall:
        """A `run()` call of the pool's mode, with its own `limits` (None,
        or equal to the pool's: the pool's).

        Raises:
            RunnerError: `bad_request` if msgspec cannot encode `request`.
        """
        if self.spec.mode == "exec":
            raise RuntimeError("an exec pool serves `pool.exec(argv, ...)`, not `pool.run`")
        own = self.own_limits(limits)
        return wire.RunCall(id=self.call_id(), request=wire.raw(request), limits=own)

    def exec_call(self, argv: Sequence[str], stdin: bytes,
                  files: Mapping[str, bytes | ExecFile] | None, collect: Sequence[str],
                  env: Mapping[str, str] | None, limits: Limits | None = None, *,
                  capture_on_failure: bool = False) -> wire.ExecCall:
        """An `exec` call, checked here as `Runner.exec` checks it (under
        its own `limits`, if any), before any node is asked.

        Raises:
            RunnerError: `bad_request`.
        """
        if self.spec.mode != "exec":
            raise RuntimeError("pool.exec needs a pool of the 'exec' mode")
        own = self.own_limits(limits)
        request, _ = exec_checks.exec_request(argv, stdin, files, collect,
                                              self.spec.limits if own is None else own, env)
        return wire.ExecCall(id=self.call_id(), argv=request.argv, stdin=request.stdin,
                             files=request.files, collect=request.collect, env=request.env,
                             limits=own, capture_on_failure=capture_on_failure)

    def own_limits(self, limits: Limits | None) -> Limits | None:
        """A call's limits as they cross: None for the pool's (or equal ones).

        Raises:
            TypeError: not a `trunner.Limits`.
        """
        if limits is None or limits == self.spec.limits:
            return None
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a trunner.Limits")
        return limits

    def admit(self, tried: frozenset[str] = frozenset()) -> Node | None:
        """The node a call goes to now: the live one with the fewest calls
        in flight (then the fewest served), under the per-node bound, not in
        `tried`. Its slot is the call's until `release`. None: no node has a
        free slot; wait for a change (a release, a ping, a join) and ask again.

        Raises:
            RunnerError: `node_lost` when no node is live or may come back.
        """
        bound = self.spec.in_flight_per_node
        best = None
        for node in self.nodes.values():
            if node.state != "live" or node.in_flight >= bound or node.id in tried:
                continue
            if best is None or (node.in_flight, node.served) < (best.in_flight, best.served):
                best = node
        if best is not None:
            best.in_flight += 1
        elif all(n.state == "dead" or n.id in tried for n in self.nodes.values()):
            gone = ", ".join(self.nodes) or "none"
            raise RunnerError(Reason.NODE_LOST,
                              f"no node is left to serve the call (lost: {gone})")
        return best

    def release(self, node: Node) -> None:
        """The call `admit` sent to `node` is over, however it ended."""
        node.in_flight -= 1
        node.served += 1

    def retry_or_raise(self, node: Node, e: BaseException, tried: frozenset[str]
                       ) -> frozenset[str]:
        """After Ray error `e` on a call to `node`: the nodes tried so far,
        if the call goes to another (`retry_node_lost`); else its `RunnerError`.
        A lost node turns suspect.

        Raises:
            RunnerError: `node_lost` for the errors that mean the node or its
                actor is gone (LOST), chained; `internal_error` for any other.
        """
        error = self._error_of(node, e)
        if error.reason is Reason.NODE_LOST and len(tried) < self.spec.retry_node_lost:
            return tried | {node.id}
        raise error from e

    def _error_of(self, node: Node, e: BaseException) -> RunnerError:
        if isinstance(e, LOST):
            if node.state == "live":
                node.state = "suspect"
            return RunnerError(
                Reason.NODE_LOST,
                f"node {node.id} (actor pid {node.pid}) was lost with this call in flight"
                f" ({type(e).__name__}): the run may or may not have executed")
        return RunnerError(Reason.INTERNAL_ERROR, f"node {node.id}: {type(e).__name__}: {e}")

    def result(self, node: Node, data: bytes, response_type: Any,  # noqa: ANN401
               limits: Limits | None = None) -> Result[Any]:
        """A node's reply to a call (its own `limits` as the call carried
        them: None for the pool's) as the caller's `Result`, or its
        `RunnerError`. A reply under other rules than the pool's is refused,
        and so is the node from then on; with limits of the call's own, under
        other rules than the first reply under those limits (nodes that agree
        on the pool's rules agree on any limits').

        Raises:
            RunnerError: the node's own, rebuilt; `sandbox_setup` for other
                rules; `bad_frame` for a response that is not `response_type`.
        """
        reply = wire.decode_reply(data)
        if isinstance(reply, wire.Failure):
            raise wire.error_of(reply)
        if limits is None:
            expected, whose = self.rules_version, "the pool's"
        else:
            expected = self.versions.setdefault(limits, reply.rules_version)
            whose = "the first node's under the call's limits,"
        if reply.rules_version != expected:
            node.state = "dead"
            self.refused[node.id] = f"served under rules version {reply.rules_version}"
            raise RunnerError(Reason.SANDBOX_SETUP,
                              f"node {node.id} served under rules version"
                              f" {reply.rules_version}, not {whose} {expected}")
        return Result(wire.response_of(reply, response_type), reply.rules_version, reply.usage)

    # -- the watch ------------------------------------------------------------------

    def due(self, now: float) -> list[Ping | Look]:
        """What the watch does at `now` (it asks every PING_S): a `Ping` of
        each suspect node not being pinged, and every DISCOVER_S a `Look`."""
        steps: list[Ping | Look] = []
        for node in self.nodes.values():
            if node.state == "suspect" and node.id not in self.pinging:
                self.pinging.add(node.id)
                steps.append(Ping(node))
        if now >= self._next_look:
            self._next_look = now + DISCOVER_S
            steps.append(Look())
        return steps

    def pinged(self, node: Node, reply: bytes | BaseException | None) -> None:
        """A `Ping`'s outcome: the `hello` reply's bytes, the Ray error it
        raised, or None (no answer within PING_BOUND_S, or the pool closed).
        The node is live again if it answered under the pool's rules, dead
        (and refused) if under others, dead if its actor will not restart
        (GONE); else still suspect, pinged again when next due."""
        self.pinging.discard(node.id)
        if isinstance(reply, bytes):
            hello = wire.decode_hello(reply)
            node.pid = hello.pid
            if hello.error is None and hello.rules_version == self.rules_version:
                node.state = "live"
            else:
                node.state = "dead"
                self.refused[node.id] = _why(hello, self.rules_version)
        elif isinstance(reply, GONE):
            node.state = "dead"

    def found(self, ids: Iterable[str]) -> list[str]:
        """Of the node ids a `Look` listed, those to start an actor on
        (`cluster.start_node`): not met before, and the pool open. They are
        joining until `joined`."""
        if not self.is_open:
            return []
        new = [i for i in ids if i not in self.nodes and i not in self.refused
               and i not in self.joining]
        self.joining.update(new)
        return new

    def joined(self, node_id: str, started: tuple[Node, wire.Hello] | RunnerError
               ) -> Node | None:
        """A join's outcome: `cluster.start_node`'s, or the `RunnerError` it
        raised. The node serves if its actor answered under the pool's rules
        while the pool is open; else it is refused (under other rules, or
        not started), or it came too late (the pool closed meanwhile).

        Returns:
            The node whose actor will not serve, for the caller to end
            (`cluster.kill`); None when there is none.
        """
        self.joining.discard(node_id)
        if isinstance(started, RunnerError):
            self.refused[node_id] = str(started)
            return None
        node, hello = started
        if not self.is_open:
            return node
        if hello.error is None and hello.rules_version == self.rules_version:
            self.nodes[node.id] = node
            return None
        self.refused[node.id] = _why(hello, self.rules_version)
        return node


def spec_of(mode: str, limits: Limits | None, size_per_node: int, in_flight_per_node: int,
            resource: str, cpus_per_node: float, retry_node_lost: int,
            runner_options: dict[str, Any]) -> Spec:
    """The checked spec of `cluster_pool`'s arguments.

    Raises:
        ValueError: a bad size, bound or retry count; retry with a provider.
    """
    limits = Limits() if limits is None else limits
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a trunner.Limits")
    if size_per_node < 1:
        raise ValueError("size_per_node must be at least 1")
    if in_flight_per_node < 1:
        raise ValueError("in_flight_per_node must be at least 1")
    if cpus_per_node < 0:
        raise ValueError("cpus_per_node must not be negative")
    if retry_node_lost < 0:
        raise ValueError("retry_node_lost must not be negative")
    if retry_node_lost and runner_options.get("provider") is not None:
        raise ValueError("retry_node_lost is refused with the provider profile: a run that"
                         " can reach the network must not run twice")
    options = dict(runner_options)
    if "limits" in options or "backend" in options:
        raise ValueError("pass limits as cluster_pool(limits=...); a backend cannot cross nodes")
    return Spec(mode, limits, size_per_node, in_flight_per_node, resource, cpus_per_node,
                options, retry_node_lost)


def _why(hello: wire.Hello, rules_version: str) -> str:
    if hello.error is not None:
        return f"{hello.error.detail} [{hello.error.reason}]"
    return f"rules version {hello.rules_version}, not the pool's {rules_version}"
