"""The driver's side, without an event loop: which nodes there are, which
one a call goes to, what a Ray failure means, and how a node's actor starts.

Shared by the trio pool (trunner.ray.pool) and the asyncio one
(trunner.ray.aio). Each call goes to the live node with the fewest calls in
flight, under a per-node bound, so nothing queues without bound; a node
whose call failed is suspect, and takes no call, until a `hello` answers.
The blocking functions here (`start_node`, `discover`) talk to Ray's GCS
and run in a worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from typing import TYPE_CHECKING, Any, Literal

import ray
import ray.exceptions as rex
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trunner import workdir
from trunner.errors import Reason, RunnerError
from trunner.invocation import Result
from trunner.limits import Limits
from trunner.ray import wire
from trunner.ray.actor import NodeActor

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from trunner.protocol import ExecFile

#: How long a node's actor may take to be placed and warm its pool.
START_BOUND_S = 120.0
#: How often suspect nodes are pinged, and how long a ping may take.
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
    actor: Any  # a Ray ActorHandle
    pid: int
    in_flight: int = 0
    served: int = 0
    state: Literal["live", "suspect", "dead"] = "live"


class Router:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.nodes: dict[str, Node] = {}
        #: Nodes whose actor started with other rules, or failed to start: id -> why.
        self.refused: dict[str, str] = {}
        self.rules_version = ""
        self._prefix = secrets.token_hex(6)
        self._count = 0

    def call_id(self) -> str:
        self._count += 1
        return f"{self._prefix}-{self._count}"

    def run_call(self, request: object) -> wire.RunCall:
        """A `run()` call of the pool's mode."""
        if self.spec.mode == "exec":
            raise RuntimeError("an exec pool serves `pool.exec(argv, ...)`, not `pool.run`")
        return wire.RunCall(id=self.call_id(), request=wire.raw(request))

    def exec_call(self, argv: Sequence[str], stdin: bytes,
                  files: Mapping[str, bytes | ExecFile] | None, collect: Sequence[str],
                  env: Mapping[str, str] | None) -> wire.ExecCall:
        """An `exec` call, checked here as `Runner.exec` checks it, before
        any node is asked.

        Raises:
            RunnerError: `bad_request`.
        """
        if self.spec.mode != "exec":
            raise RuntimeError("pool.exec needs a pool of the 'exec' mode")
        request, _ = workdir.exec_request(argv, stdin, files, collect, self.spec.limits, env)
        return wire.ExecCall(id=self.call_id(), argv=request.argv, stdin=request.stdin,
                             files=request.files, collect=request.collect, env=request.env)

    def pick(self, exclude: frozenset[str] = frozenset()) -> Node | None:
        """The live node with the fewest calls in flight, under the bound."""
        bound = self.spec.in_flight_per_node
        best = None
        for node in self.nodes.values():
            if node.state != "live" or node.in_flight >= bound or node.id in exclude:
                continue
            if best is None or (node.in_flight, node.served) < (best.in_flight, best.served):
                best = node
        if best is not None:
            best.in_flight += 1
        return best

    def release(self, node: Node) -> None:
        node.in_flight -= 1
        node.served += 1

    def hopeless(self, exclude: frozenset[str] = frozenset()) -> bool:
        """No node is live or may come back: waiting cannot help."""
        return all(n.state == "dead" or n.id in exclude for n in self.nodes.values())

    def failed(self, node: Node, e: BaseException) -> RunnerError:
        """What a Ray error on a call means to the caller; a lost node turns suspect."""
        if isinstance(e, LOST):
            if node.state == "live":
                node.state = "suspect"
            error = RunnerError(
                Reason.NODE_LOST,
                f"node {node.id} (actor pid {node.pid}) was lost with this call in flight"
                f" ({type(e).__name__}): the run may or may not have executed")
        else:
            error = RunnerError(Reason.INTERNAL_ERROR,
                                f"node {node.id}: {type(e).__name__}: {e}")
        error.__cause__ = e
        return error

    def retry_or_raise(self, node: Node, e: BaseException, tried: frozenset[str]
                       ) -> frozenset[str]:
        """After Ray error `e` on a call to `node`: the nodes tried so far,
        if the call goes to another (`retry_node_lost`); else its `RunnerError`."""
        error = self.failed(node, e)
        if error.reason is Reason.NODE_LOST and len(tried) < self.spec.retry_node_lost:
            return tried | {node.id}
        raise error from e

    def answered(self, node: Node, hello: wire.Hello) -> None:
        """A suspect node's ping came back: live again if its rules are the pool's."""
        node.pid = hello.pid
        if hello.error is None and hello.rules_version == self.rules_version:
            node.state = "live"
        else:
            node.state = "dead"
            self.refused[node.id] = _why(hello, self.rules_version)

    def pinged_dead(self, node: Node, e: BaseException) -> None:
        if isinstance(e, rex.ActorDiedError | rex.ActorUnschedulableError):
            node.state = "dead"  # will not restart (its node is gone)

    def add(self, node: Node, hello: wire.Hello) -> None:
        """A node found after the start: it serves if its rules are the pool's."""
        if hello.error is None and hello.rules_version == self.rules_version:
            self.nodes[node.id] = node
        else:
            self.refused[node.id] = _why(hello, self.rules_version)
            kill(node)


    def result(self, node: Node, data: bytes, response_type: Any) -> Result[Any]:  # noqa: ANN401
        """A node's reply as the caller's `Result`, or its `RunnerError`.
        A reply under other rules than the pool's is refused, and so is
        the node from then on."""
        reply = wire.decode_reply(data)
        if isinstance(reply, wire.Failure):
            raise wire.error_of(reply)
        if reply.rules_version != self.rules_version:
            node.state = "dead"
            self.refused[node.id] = f"served under rules version {reply.rules_version}"
            raise RunnerError(Reason.SANDBOX_SETUP,
                              f"node {node.id} served under rules version"
                              f" {reply.rules_version}, not the pool's {self.rules_version}")
        return Result(wire.response_of(reply, response_type), reply.rules_version, reply.usage)

    def no_node(self) -> RunnerError:
        gone = ", ".join(self.nodes) or "none"
        return RunnerError(Reason.NODE_LOST, f"no node is left to serve the call (lost: {gone})")

    def new(self, ids: list[str], joining: set[str]) -> list[str]:
        """Of `ids`, the nodes this pool has not met."""
        return [i for i in ids if i not in self.nodes and i not in self.refused
                and i not in joining]


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


def candidates(resource: str) -> list[str]:
    """Ids of the live nodes carrying `resource` (blocking)."""
    return sorted(n["NodeID"] for n in ray.nodes()
                  if n.get("Alive") and n.get("Resources", {}).get(resource, 0) >= 1)


def start_node(spec: Spec, node_id: str) -> tuple[Node, wire.Hello]:
    """Place one actor on the node and wait for its pool (blocking).

    Raises:
        RunnerError: `sandbox_setup` when it is not placed or not warm
            within START_BOUND_S.
    """
    actor = NodeActor.options(  # type: ignore[attr-defined]
        num_cpus=spec.cpus_per_node,
        resources={spec.resource: 1},
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        max_restarts=-1,
        max_task_retries=0,
        max_concurrency=spec.in_flight_per_node,
    ).remote(spec.mode, wire.encode(spec.limits), spec.size_per_node, spec.options)
    node = Node(node_id, actor, pid=0)
    try:
        hello = wire.decode_hello(ray.get(actor.hello.remote(), timeout=START_BOUND_S))
    except rex.GetTimeoutError:
        kill(node)
        raise RunnerError(
            Reason.SANDBOX_SETUP,
            f"node {node_id}: its trunner actor did not start within {START_BOUND_S:.0f} s"
            f" (does another pool hold the node's {spec.resource!r} resource?)") from None
    except rex.RayError as e:
        kill(node)
        raise RunnerError(Reason.SANDBOX_SETUP,
                          f"node {node_id}: its trunner actor failed: {e}") from e
    node.pid = hello.pid
    return node, hello


def start_all(spec: Spec) -> tuple[list[Node], str]:
    """An actor on every node carrying the resource, all with one rules
    version (blocking); on any failure, none.

    Raises:
        RunnerError: `sandbox_setup` for no node or nodes whose rules
            differ; a node's own reason when its pool did not start.
    """
    if not ray.is_initialized():
        ray.init()  # as Ray's own first `.remote()` does: RAY_ADDRESS, or a local instance
    ids = candidates(spec.resource)
    if not ids:
        raise RunnerError(Reason.SANDBOX_SETUP,
                          f"no live Ray node carries the resource {spec.resource!r}"
                          f" (start nodes with --resources='{{\"{spec.resource}\": 1}}')")
    started: list[tuple[Node, wire.Hello]] = []
    try:
        for node_id in ids:
            started.append(start_node(spec, node_id))
        for node, hello in started:
            if hello.error is not None:  # its own reason (unknown_mode, sandbox_setup...)
                own = wire.error_of(hello.error)
                raise RunnerError(own.reason, f"node {node.id}: its pool did not start:"
                                  f" {own.detail}")
        versions = {hello.rules_version for _, hello in started}
        if len(versions) != 1:
            named = ", ".join(f"{n.id[:12]}: {h.rules_version[:16]}" for n, h in started)
            raise RunnerError(Reason.SANDBOX_SETUP,
                              f"the nodes' rules versions differ ({named}): their limits,"
                              " profile, install or kernel are not alike")
    except BaseException:
        for node, _ in started:
            kill(node)
        raise
    return [node for node, _ in started], versions.pop()


def close_all(nodes: list[Node]) -> None:
    """Close every node's pool at once and wait for them (blocking), then
    end the actors."""
    closing = []
    for node in nodes:
        if node.state != "dead":
            with contextlib.suppress(rex.RayError):
                closing.append(node.actor.close.remote())
    for ref in closing:
        with contextlib.suppress(rex.RayError):
            ray.get(ref, timeout=START_BOUND_S)
    for node in nodes:
        kill(node)


def kill(node: Node) -> None:
    with contextlib.suppress(rex.RayError, ValueError):
        ray.kill(node.actor, no_restart=True)
    node.state = "dead"
