"""trunner.ray.router's steps, with no cluster and no event loop: real
nodes, real replies and real Ray error objects in, decisions out. `now`
is a plain number, the watch's clock as the loops pass it."""

from __future__ import annotations

import msgspec
import pytest
import ray.exceptions as rex

from trunner import Limits, Reason, RunnerError, Usage
from trunner.protocol import ExecResult
from trunner.ray import router, wire
from trunner.ray.router import Look, Node, Ping, Router

RULES = "r1"
T0 = 1000.0
USAGE = Usage(wall_s=1.5, cpu_user_s=0.25, cpu_sys_s=0.125, peak_memory_bytes=4096)


@pytest.fixture(autouse=True)
def no_leaks() -> None:
    """Replaces tests/ray's leak check: these steps start no cluster, no run."""


def spec(mode: str = "exec", *, retry_node_lost: int = 0) -> router.Spec:
    """A pool's spec: 2 calls in flight a node."""
    return router.spec_of(mode, Limits(), size_per_node=2, in_flight_per_node=2,
                          resource="trunner", cpus_per_node=1, retry_node_lost=retry_node_lost,
                          runner_options={})


def opened(*ids: str, retry_node_lost: int = 0) -> Router:
    """A router opened at T0 on `ids`, under RULES."""
    r = Router(spec(retry_node_lost=retry_node_lost))
    r.opened([Node(i, actor=None, pid=100 + n) for n, i in enumerate(ids)], RULES, T0)
    return r


def suspect(r: Router, node_id: str) -> Node:
    """The node, made suspect (as a call's lost node is)."""
    node = r.nodes[node_id]
    node.state = "suspect"
    return node


def hello(node_id: str, rules_version: str = RULES, pid: int = 7) -> bytes:
    return wire.encode(wire.Hello(node_id=node_id, pid=pid, rules_version=rules_version))


def success(response: object, rules_version: str = RULES) -> bytes:
    return wire.encode(wire.Success(response=wire.raw(response), rules_version=rules_version,
                                    usage=USAGE))


# -- a call ------------------------------------------------------------------------


def test_admit_takes_the_fewest_in_flight_then_the_fewest_served_under_the_bound() -> None:
    r = opened("a", "b")
    a, b = r.nodes["a"], r.nodes["b"]
    assert r.admit() is a  # a tie: the first
    assert r.admit() is b
    r.release(a)  # a: 0 in flight, 1 served; b: 1 in flight
    assert r.admit() is a
    assert r.admit() is b  # 1 in flight each: b has served none
    assert r.admit() is a
    assert (a.in_flight, b.in_flight) == (2, 2)
    assert r.admit() is None  # every slot taken: wait


def test_admit_skips_the_nodes_tried_and_those_not_live() -> None:
    r = opened("a", "b", "c")
    suspect(r, "a")
    assert r.admit(frozenset({"b"})) is r.nodes["c"]
    r.nodes["c"].state = "dead"
    assert r.admit(frozenset({"b"})) is None  # a may come back


@pytest.mark.parametrize(("dead", "tried", "lost"), [
    pytest.param({"a", "b"}, set(), "a, b", id="all-dead"),
    pytest.param({"a"}, {"b"}, "a, b", id="dead-or-tried"),
    pytest.param(set(), None, "none", id="no-node"),
])
def test_admit_with_no_node_that_may_serve_is_node_lost(dead: set[str], tried: set[str] | None,
                                                        lost: str) -> None:
    r = opened("a", "b") if tried is not None else opened()
    for node_id in dead:
        r.nodes[node_id].state = "dead"
    with pytest.raises(RunnerError) as e:
        r.admit(frozenset(tried or ()))
    assert e.value.reason is Reason.NODE_LOST
    assert f"(lost: {lost})" in e.value.detail


LOST = [
    pytest.param(rex.ActorUnavailableError("gone", None), id="actor-unavailable"),
    pytest.param(rex.ActorDiedError(), id="actor-died"),
    pytest.param(rex.RayActorError(), id="actor-error"),
    pytest.param(rex.NodeDiedError("node"), id="node-died"),
    pytest.param(rex.ObjectLostError("ab" * 14, None, ""), id="object-lost"),
    pytest.param(rex.WorkerCrashedError(), id="worker-crashed"),
    pytest.param(rex.LocalRayletDiedError(), id="raylet-died"),
    pytest.param(rex.ActorUnschedulableError("u"), id="unschedulable"),
]


@pytest.mark.parametrize("error", LOST)
def test_a_lost_node_is_node_lost_and_turns_suspect(error: BaseException) -> None:
    r = opened("a", "b")
    a = r.nodes["a"]
    assert r.admit() is a
    with pytest.raises(RunnerError) as e:
        r.retry_or_raise(a, error, frozenset())
    assert e.value.reason is Reason.NODE_LOST
    assert e.value.__cause__ is error
    assert "node a (actor pid 100)" in e.value.detail
    assert "may or may not have executed" in e.value.detail
    assert a.state == "suspect"
    r.release(a)
    assert r.admit() is r.nodes["b"]
    assert r.admit() is r.nodes["b"]
    assert r.admit() is None  # a takes no call while suspect


def test_a_lost_call_goes_to_another_node_retry_node_lost_times() -> None:
    r = opened("a", "b", "c", retry_node_lost=1)
    a = r.admit()
    assert a is not None
    tried = r.retry_or_raise(a, rex.ActorDiedError(), frozenset())
    r.release(a)
    assert tried == {"a"}
    b = r.admit(tried)
    assert b is not None
    assert b.id != "a"
    with pytest.raises(RunnerError) as e:
        r.retry_or_raise(b, rex.ActorDiedError(), tried)
    assert e.value.reason is Reason.NODE_LOST


def test_any_other_ray_error_is_internal_error_and_the_node_stays_live() -> None:
    r = opened("a", retry_node_lost=3)
    a = r.nodes["a"]
    error = rex.RaySystemError("boom")
    with pytest.raises(RunnerError) as e:
        r.retry_or_raise(a, error, frozenset())  # never retried
    assert e.value.reason is Reason.INTERNAL_ERROR
    assert e.value.__cause__ is error
    assert a.state == "live"


def test_a_reply_becomes_the_result_or_the_nodes_error() -> None:
    r = opened("a")
    a = r.nodes["a"]
    out = ExecResult(exit_code=0, signal=None, stdout=b"hi\n", stderr=b"")
    result = r.result(a, success(out), ExecResult)
    assert (result.response, result.rules_version, result.usage) == (out, RULES, USAGE)
    failure = wire.failure_of(RunnerError(Reason.TIMEOUT, "wall", usage=USAGE))
    with pytest.raises(RunnerError) as e:
        r.result(a, wire.encode(failure), ExecResult)
    assert (e.value.reason, e.value.usage) == (Reason.TIMEOUT, USAGE)
    with pytest.raises(RunnerError) as e:
        r.result(a, success({"not": "an exec result"}), ExecResult)
    assert e.value.reason is Reason.BAD_FRAME
    assert a.state == "live"


def test_a_reply_under_other_rules_is_refused_and_so_is_its_node() -> None:
    r = opened("a", "b")
    a = r.nodes["a"]
    with pytest.raises(RunnerError) as e:
        r.result(a, success(1, rules_version="r2"), int)
    assert e.value.reason is Reason.SANDBOX_SETUP
    assert (a.state, r.refused) == ("dead", {"a": "served under rules version r2"})


def test_calls_are_built_and_checked_for_their_mode() -> None:
    r = Router(spec("exec"))
    call = r.exec_call(["cat"], b"in", {"f": b"1"}, ["*.txt"], {"K": "V"})
    assert isinstance(call, wire.ExecCall)
    assert (call.argv, call.stdin, call.files["f"].data, call.collect, call.env) == \
        (["cat"], b"in", b"1", ["*.txt"], {"K": "V"})
    with pytest.raises(RunnerError) as e:
        r.exec_call([], b"", None, (), None)
    assert e.value.reason is Reason.BAD_REQUEST
    with pytest.raises(RuntimeError, match=r"not `pool\.run`"):
        r.run_call(None)
    run = Router(spec("echo"))
    call2 = run.run_call({"x": 1})
    assert isinstance(call2, wire.RunCall)
    assert msgspec.msgpack.decode(call2.request) == {"x": 1}
    with pytest.raises(RuntimeError, match="'exec' mode"):
        run.exec_call(["true"], b"", None, (), None)
    ids = {r.exec_call(["true"], b"", None, (), None).id for _ in range(3)}
    assert len(ids | {call.id}) == 4


# -- the watch ---------------------------------------------------------------------


def test_due_looks_every_discover_s_from_the_start() -> None:
    r = opened("a")
    assert r.due(T0 + router.PING_S) == []
    assert r.due(T0 + router.DISCOVER_S) == [Look()]
    assert r.due(T0 + router.DISCOVER_S + router.PING_S) == []
    assert r.due(T0 + 2 * router.DISCOVER_S) == [Look()]


def test_a_suspect_node_is_pinged_once_at_a_time_until_it_answers() -> None:
    r = opened("a", "b")
    a = suspect(r, "a")
    now = T0 + router.PING_S
    assert r.due(now) == [Ping(a)]
    assert r.due(now + router.PING_S) == []  # its ping is in flight
    r.pinged(a, None)  # no answer within PING_BOUND_S
    assert a.state == "suspect"
    assert r.due(now + 2 * router.PING_S) == [Ping(a)]
    r.pinged(a, rex.ActorUnavailableError("restarting", None))
    assert a.state == "suspect"
    assert r.due(now + 3 * router.PING_S) == [Ping(a)]
    r.pinged(a, hello("a", pid=4242))
    assert (a.state, a.pid) == ("live", 4242)  # restarted, same rules: serves again
    assert r.due(now + 4 * router.PING_S) == []
    assert r.admit() is a


@pytest.mark.parametrize("error", [
    pytest.param(rex.ActorDiedError(), id="actor-died"),
    pytest.param(rex.ActorUnschedulableError("its node is gone"), id="unschedulable"),
])
def test_a_ping_that_says_the_actor_will_not_restart_ends_the_node(error: BaseException
                                                                    ) -> None:
    r = opened("a")
    a = suspect(r, "a")
    assert r.due(T0 + router.PING_S) == [Ping(a)]
    r.pinged(a, error)
    assert a.state == "dead"
    assert r.due(T0 + 2 * router.PING_S) == []
    with pytest.raises(RunnerError) as e:
        r.admit()
    assert e.value.reason is Reason.NODE_LOST


@pytest.mark.parametrize(("answer", "why"), [
    pytest.param(hello("a", rules_version="r2"), "rules version r2, not the pool's r1",
                 id="other-rules"),
    pytest.param(wire.encode(wire.Hello(node_id="a", pid=7, error=wire.failure_of(
        RunnerError(Reason.SANDBOX_SETUP, "no cgroup")))), "no cgroup [sandbox_setup]",
                 id="its-pool-failed"),
])
def test_a_restarted_actor_under_other_rules_is_refused(answer: bytes, why: str) -> None:
    r = opened("a")
    a = suspect(r, "a")
    r.due(T0 + router.PING_S)
    r.pinged(a, answer)
    assert (a.state, r.refused) == ("dead", {"a": why})


def test_a_look_joins_each_new_node_once() -> None:
    r = opened("a")
    r.refused["x"] = "other rules"
    assert r.found(["a", "b", "x", "c"]) == ["b", "c"]
    assert r.joining == {"b", "c"}
    assert r.found(["a", "b", "c"]) == []  # still joining


def test_a_joined_node_serves_when_its_rules_are_the_pools() -> None:
    r = opened("a")
    assert r.found(["b"]) == ["b"]
    b = Node("b", actor=None, pid=9)
    assert r.joined("b", (b, wire.decode_hello(hello("b", pid=9)))) is None
    assert (r.joining, r.nodes["b"], b.state) == (set(), b, "live")
    assert r.found(["a", "b"]) == []


def test_a_joined_node_under_other_rules_is_refused_and_handed_back() -> None:
    r = opened("a")
    r.found(["b"])
    b = Node("b", actor=None, pid=9)
    assert r.joined("b", (b, wire.decode_hello(hello("b", rules_version="r2")))) is b
    assert "b" not in r.nodes
    assert r.refused == {"b": "rules version r2, not the pool's r1"}
    assert r.found(["b"]) == []  # not tried again


def test_a_node_that_did_not_start_is_refused_with_why() -> None:
    r = opened("a")
    r.found(["b"])
    error = RunnerError(Reason.SANDBOX_SETUP, "node b: its trunner actor failed: x")
    assert r.joined("b", error) is None
    assert (r.joining, r.refused) == (set(), {"b": str(error)})


def test_a_node_that_joins_after_the_close_is_handed_back_not_added() -> None:
    r = opened("a")
    r.found(["b"])
    closing = r.close()
    assert closing == [r.nodes["a"]]
    assert not r.is_open
    b = Node("b", actor=None, pid=9)
    assert r.joined("b", (b, wire.decode_hello(hello("b")))) is b  # for the caller to end
    assert list(r.nodes) == ["a"]
    assert r.found(["c"]) == []  # a closed pool picks nothing up


# -- a call's own limits ------------------------------------------------------------

OWN = Limits(cpu_time_s=1.0)


def test_a_calls_own_limits_cross_and_the_pools_do_not() -> None:
    r = opened("a")
    assert r.exec_call(["true"], b"", None, (), None, OWN).limits == OWN
    assert r.exec_call(["true"], b"", None, (), None).limits is None
    # Equal to the pool's, however built: the pool's, sent as None.
    same = Limits.from_mapping({})
    assert same is not r.spec.limits
    assert r.exec_call(["true"], b"", None, (), None, same).limits is None
    run = Router(router.spec_of("echo", Limits(), 2, 2, "trunner", 1, 0, {}))
    assert run.run_call("x", OWN).limits == OWN
    assert run.run_call("x").limits is None
    with pytest.raises(TypeError, match=r"trunner\.Limits"):
        r.exec_call(["true"], b"", None, (), None, {"cpu_time_s": 1})  # type: ignore[arg-type]


def test_an_exec_call_is_checked_under_its_own_limits() -> None:
    """The files' bound is the call's `file_size_bytes`, checked on the
    driver before any node is asked."""
    r = opened("a")
    files = {"f": b"x" * 2048}
    assert r.exec_call(["true"], b"", files, (), None).files["f"].data == files["f"]
    with pytest.raises(RunnerError) as e:
        r.exec_call(["true"], b"", files, (), None, Limits(file_size_bytes=1024))
    assert e.value.reason is Reason.BAD_REQUEST


def test_replies_under_own_limits_agree_with_the_first() -> None:
    """The driver cannot compute a rules version: the first reply under a
    call's own limits pins it, every node's later replies under them must
    give it; the pool's own calls keep the pool's."""
    r = opened("a", "b")
    a, b = r.nodes["a"], r.nodes["b"]
    assert r.result(a, success(1, "own-1"), int, OWN).rules_version == "own-1"
    assert r.result(b, success(2, "own-1"), int, OWN).rules_version == "own-1"
    assert r.result(b, success(3), int).rules_version == RULES
    with pytest.raises(RunnerError) as e:
        r.result(b, success(4, "own-2"), int, OWN)
    assert e.value.reason is Reason.SANDBOX_SETUP
    assert "own-2" in e.value.detail
    assert b.state == "dead"
    assert "b" in r.refused
    with pytest.raises(RunnerError) as e:  # under the pool's limits: the pool's version only
        r.result(a, success(5, "own-1"), int)
    assert e.value.reason is Reason.SANDBOX_SETUP
