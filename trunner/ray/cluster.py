"""The driver's blocking calls to Ray: list the nodes carrying the
resource, start a node's actor and wait for its pool, close or kill actors.

Each talks to Ray's GCS and may block for seconds: the pools run them in a
worker thread, all but `kill` (one request, made in place). What their
outcomes mean is the router's (trunner.ray.router) to decide.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import msgspec
import ray
import ray.exceptions as rex
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trunner.errors import Reason, RunnerError
from trunner.ray import wire
from trunner.ray.actor import NodeActor
from trunner.ray.router import Node

if TYPE_CHECKING:
    from trunner.ray.router import Spec

#: How long a node's actor may take to be placed and warm its pool.
START_BOUND_S = 120.0


def candidates(resource: str) -> list[str]:
    """Ids of the live nodes carrying `resource`."""
    return sorted(n["NodeID"] for n in ray.nodes()
                  if n.get("Alive") and n.get("Resources", {}).get(resource, 0) >= 1)


def start_node(spec: Spec, node_id: str) -> tuple[Node, wire.Hello]:
    """Place one actor on the node and wait for its pool.

    Raises:
        RunnerError: `sandbox_setup` when it is not placed or not warm
            within START_BOUND_S, or its `hello` does not decode (another
            trunner on the node); its actor is ended.
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
    except msgspec.DecodeError as e:
        kill(node)
        raise RunnerError(Reason.SANDBOX_SETUP,
                          f"node {node_id}: its trunner actor's hello: {e}") from e
    node.pid = hello.pid
    return node, hello


def start_all(spec: Spec) -> tuple[list[Node], str]:
    """An actor on every node carrying the resource, all with one rules
    version; on any failure, none.

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
    """Close every node's pool at once and wait for them, then end the actors."""
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
    """End the node's actor, for good (no restart); the node is dead."""
    with contextlib.suppress(rex.RayError, ValueError):
        ray.kill(node.actor, no_restart=True)
    node.state = "dead"
