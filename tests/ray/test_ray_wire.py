"""trunner.ray.wire: what crosses between driver and node (async only for
the autouse leak check of tests/ray)."""

from __future__ import annotations

import pickle

import msgspec
import pytest

from trunner import CapturedOutput, Limits, Reason, RunnerError, Usage
from trunner.protocol import ExecFile, ExecResult
from trunner.ray import wire

USAGE = Usage(wall_s=1.5, cpu_user_s=0.25, cpu_sys_s=0.125, peak_memory_bytes=4096)


async def test_a_failure_comes_back_field_for_field() -> None:
    e = RunnerError(Reason.NONZERO_EXIT, "exit 3", exit_status=3, signal=None, usage=USAGE)
    reply = wire.decode_reply(wire.encode(wire.failure_of(e)))
    assert isinstance(reply, wire.Failure)
    back = wire.error_of(reply)
    assert type(back) is RunnerError
    assert (back.reason, back.detail, back.exit_status, back.signal, back.usage) == \
        (Reason.NONZERO_EXIT, "exit 3", 3, None, USAGE)
    assert pickle.loads(pickle.dumps(back)).usage == USAGE


async def test_a_failures_output_comes_back_and_old_ones_have_none() -> None:
    """`capture_on_failure` crosses: the call's flag and the error's output; a
    call or a failure without them (before issue 35) decodes as off, None."""
    output = CapturedOutput(stdout=b"progress-line\n", stderr=b"e", stderr_truncated=True)
    e = RunnerError(Reason.TIMEOUT, "wall", usage=USAGE, output=output)
    reply = wire.decode_reply(wire.encode(wire.failure_of(e)))
    assert isinstance(reply, wire.Failure)
    assert (wire.error_of(reply).reason, wire.error_of(reply).output) == (Reason.TIMEOUT, output)
    old = wire.decode_reply(
        msgspec.msgpack.encode({"type": "failure", "reason": "timeout", "detail": "wall"}))
    assert isinstance(old, wire.Failure)
    assert wire.error_of(old).output is None
    call = wire.ExecCall(id="c", argv=["true"], capture_on_failure=True)
    assert wire.decode_call(wire.encode(call)) == call
    decoded = wire.decode_call(msgspec.msgpack.encode({"type": "exec", "id": "c",
                                                        "argv": ["true"]}))
    assert isinstance(decoded, wire.ExecCall)
    assert decoded.capture_on_failure is False


async def test_an_unknown_reason_is_an_internal_error() -> None:
    back = wire.error_of(wire.Failure(reason="from_a_newer_node", detail="x"))
    assert back.reason is Reason.INTERNAL_ERROR
    assert "from_a_newer_node" in back.detail


CALLS = [
    pytest.param(wire.ExecCall(id="a-1", argv=["cat"], stdin=b"\0x",
                               files={"f": ExecFile(data=b"1")}, collect=["*.txt"],
                               env={"K": "V"}), id="exec"),
    pytest.param(wire.ExecCall(id="a-2", argv=["true"]), id="exec-defaults"),
    pytest.param(wire.RunCall(id="a-3", request=wire.raw({"n": [1, 2]})), id="run"),
    pytest.param(wire.RunCall(id="a-4"), id="run-none"),
    pytest.param(wire.ExecCall(id="a-5", argv=["true"], limits=Limits(cpu_time_s=1.0)),
                 id="exec-own-limits"),
    pytest.param(wire.RunCall(id="a-6", limits=Limits(memory_bytes=64 * 2**20)),
                 id="run-own-limits"),
]


@pytest.mark.parametrize("call", CALLS)
async def test_a_call_round_trips_as_its_own_kind(call: wire.Call) -> None:
    back = wire.decode_call(wire.encode(call))
    assert type(back) is type(call)
    assert back == call


async def test_a_call_is_tagged_by_its_kind() -> None:
    assert msgspec.msgpack.decode(wire.encode(wire.RunCall(id="r"))) == \
        {"type": "run", "id": "r", "request": None, "limits": None}
    assert msgspec.msgpack.decode(wire.encode(wire.ExecCall(id="e", argv=["true"])))["type"] \
        == "exec"


@pytest.mark.parametrize("body", [
    pytest.param({"type": "run", "id": "r", "request": None}, id="run"),
    pytest.param({"type": "exec", "id": "e", "argv": ["true"], "stdin": b"", "files": {},
                  "collect": [], "env": {}}, id="exec"),
])
async def test_a_call_from_before_limits_decodes_as_the_pools(body: dict[str, object]) -> None:
    """A call as encoded before per-call limits (no `limits` field) is one
    under the pool's limits."""
    call = wire.decode_call(msgspec.msgpack.encode(body))
    assert call.id == body["id"]
    assert call.limits is None


async def test_a_calls_limits_are_checked_as_limits() -> None:
    """A call's own limits decode through `Limits`' own checks (and its
    `__post_init__`: an int for a float field is the float)."""
    body = {"type": "exec", "id": "e", "argv": ["true"], "limits": {"cpu_time_s": 2}}
    call = wire.decode_call(msgspec.msgpack.encode(body))
    assert call.limits is not None
    assert call.limits == Limits(cpu_time_s=2.0)
    assert type(call.limits.cpu_time_s) is float
    body["limits"] = {"cpu_time_s": -1.0}
    with pytest.raises(msgspec.ValidationError, match=r"at `\$.limits.cpu_time_s`"):
        wire.decode_call(msgspec.msgpack.encode(body))
    body["limits"] = {"cpu_seconds": 1.0}
    with pytest.raises(msgspec.ValidationError, match="unknown field `cpu_seconds`"):
        wire.decode_call(msgspec.msgpack.encode(body))


@pytest.mark.parametrize(("body", "match"), [
    pytest.param({"type": "call", "id": "x", "argv": ["true"]},
                 r"Invalid value 'call' - at `\$.type`", id="the-old-call-tag"),
    pytest.param({"id": "x", "argv": ["true"]}, "missing required field `type`", id="no-tag"),
    pytest.param({"type": "exec", "id": "x"}, "missing required field `argv`", id="exec-no-argv"),
])
async def test_a_call_of_neither_kind_does_not_decode(body: dict[str, object], match: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=match):
        wire.decode_call(msgspec.msgpack.encode(body))


async def test_a_success_round_trips() -> None:
    result = ExecResult(exit_code=0, signal=None, stdout=b"out", stderr=b"")
    success = wire.Success(response=msgspec.Raw(wire.encode(result)), rules_version="v",
                           usage=USAGE)
    reply = wire.decode_reply(wire.encode(success))
    assert isinstance(reply, wire.Success)
    assert wire.response_of(reply, ExecResult) == result


async def test_a_response_of_the_wrong_type_is_bad_frame() -> None:
    success = wire.Success(response=wire.raw({"a": 1}), rules_version="v")
    with pytest.raises(RunnerError) as e:
        wire.response_of(success, int)
    assert e.value.reason is Reason.BAD_FRAME


async def test_an_unencodable_request_is_bad_request() -> None:
    with pytest.raises(RunnerError) as e:
        wire.raw(object())
    assert e.value.reason is Reason.BAD_REQUEST
