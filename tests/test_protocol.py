"""The frame codec, without processes: every prefix, every trailing byte."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from support import assert_carries_no_output
from trunner.errors import Reason, RunnerError
from trunner.protocol import ExecRequest, ExecResult, decode_single_frame, encode_frame


def reason_of(data: bytes, response_type: Any = Any, **kw: Any) -> Reason:
    with pytest.raises(RunnerError) as info:
        decode_single_frame(data, response_type, **kw)
    return info.value.reason


def check_frame(obj: object, response_type: Any = Any) -> None:
    data = encode_frame(obj)
    assert decode_single_frame(data, response_type) == obj
    assert reason_of(b"") is Reason.NO_FRAME
    for cut in range(1, len(data)):
        assert reason_of(data[:cut], response_type) is Reason.TRUNCATED_FRAME, cut
    assert reason_of(data + b"\x00", response_type) is Reason.TRAILING_BYTES
    assert reason_of(data + data, response_type) is Reason.TRAILING_BYTES


@pytest.mark.parametrize(
    ("obj", "response_type"),
    [
        pytest.param(None, Any, id="nil"),
        pytest.param({"a": [1, 2.5, "x", b"\x00\xff"]}, Any, id="map"),
        pytest.param("é" * 300, Any, id="str"),
        pytest.param(ExecRequest(argv=["/bin/true"], stdin=b"in"), ExecRequest, id="exec-request"),
        pytest.param(
            ExecResult(exit_code=None, signal=9, stdout=b"o", stderr=b""), ExecResult,
            id="exec-result",
        ),
    ],
)
def test_frames_round_trip_and_every_prefix_is_truncated(obj: object, response_type: Any) -> None:
    check_frame(obj, response_type)


def test_header_is_big_endian_body_length() -> None:
    data = encode_frame([1, 2, 3])
    assert data[:4] == (len(data) - 4).to_bytes(4, "big")
    assert data[4:] == msgspec.msgpack.encode([1, 2, 3])


def test_oversized_is_decided_from_the_header_alone() -> None:
    # 2**32-1 declared, 4 bytes present: must say oversized, not truncated.
    assert reason_of(b"\xff\xff\xff\xff", max_body_bytes=1020) is Reason.OVERSIZED_FRAME
    assert reason_of(b"\x00\x00\x04\x00", max_body_bytes=1023) is Reason.OVERSIZED_FRAME
    assert reason_of(b"\x00\x00\x04\x00", max_body_bytes=1024) is Reason.TRUNCATED_FRAME


def test_zero_length_body_is_bad_frame() -> None:
    assert reason_of(b"\x00\x00\x00\x00") is Reason.BAD_FRAME


def test_bad_body_keeps_msgspec_message() -> None:
    body = msgspec.msgpack.encode({"exit_code": "x"})
    with pytest.raises(RunnerError) as info:
        decode_single_frame(len(body).to_bytes(4, "big") + body, ExecResult)
    assert info.value.reason is Reason.BAD_FRAME
    assert "$" in info.value.detail


def test_wrong_tag_and_unknown_field() -> None:
    body = msgspec.msgpack.encode(ExecRequest(argv=["x"]))
    assert reason_of(len(body).to_bytes(4, "big") + body, ExecResult) is Reason.BAD_FRAME
    body = msgspec.msgpack.encode({"type": "exec_result", "nope": 1})
    assert reason_of(len(body).to_bytes(4, "big") + body, ExecResult) is Reason.BAD_FRAME


def test_unencodable_request_is_bad_request() -> None:
    with pytest.raises(RunnerError) as info:
        encode_frame(object())
    assert info.value.reason is Reason.BAD_REQUEST


def test_runner_error_carries_no_output_and_pickles() -> None:
    import pickle

    e = RunnerError(Reason.TIMEOUT, "late", signal=9)
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.reason, e2.detail, e2.exit_status, e2.signal) == (Reason.TIMEOUT, "late", None, 9)
    assert vars(e2) == vars(e)
    assert_carries_no_output(e)
    assert_carries_no_output(e2)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


@pytest.mark.slow  # the default lane's round trips: the frames above
@settings(max_examples=300, deadline=None)
@given(msgpack_values)
def test_round_trip(value: object) -> None:
    assert decode_single_frame(encode_frame(value)) == value


def frame_reason(data: bytes, cap: int) -> Reason | None:
    """What the format says of `data` as one frame (a 4-byte big-endian body
    length, at most `cap`, then exactly that many bytes of one msgpack value)."""
    if not data:
        return Reason.NO_FRAME
    if len(data) < 4:
        return Reason.TRUNCATED_FRAME
    declared = int.from_bytes(data[:4], "big")
    if declared > cap:
        return Reason.OVERSIZED_FRAME  # from the header alone
    if len(data) < 4 + declared:
        return Reason.TRUNCATED_FRAME
    if len(data) > 4 + declared:
        return Reason.TRAILING_BYTES
    try:
        msgspec.msgpack.decode(data[4:])
    except msgspec.DecodeError:
        return Reason.BAD_FRAME
    return None


#: Random bytes, and random bodies behind a true header (to reach the body),
#: some with bytes after them.
frame_bytes = st.binary(max_size=64) | st.builds(
    lambda body, tail: len(body).to_bytes(4, "big") + body + tail,
    st.binary(max_size=40), st.binary(max_size=4))


def value_or_named_reason(data: bytes, cap: int) -> None:
    try:
        value: object = decode_single_frame(data, max_body_bytes=cap)
    except RunnerError as e:
        reason: Reason | None = e.reason
    else:
        reason = None
    assert reason == frame_reason(data, cap), (data, cap)
    if reason is None:
        assert value == msgspec.msgpack.decode(data[4:])


#: Bytes that reach each of `frame_reason`'s outcomes (under some cap below).
SOME_BYTES = [b"", b"\x00", b"\x00\x00\x00", b"\x00\x00\x00\x00", b"\x00\x00\x00\x01",
              b"\x00\x00\x00\x01\xc0", b"\x00\x00\x00\x01\xc1", b"\x00\x00\x00\x01\xc0\x00",
              b"\x00\x00\x00\x02\x91\xc0", b"\x00\x00\x00\x02\x92\xc0", b"\xff\xff\xff\xff\xc0"]


def test_some_bytes_give_a_value_or_a_named_reason() -> None:
    """The default lane's case of the property below, whose hundreds of
    random frames are `slow`."""
    for data in SOME_BYTES:
        for cap in (0, 1, 64, 2**32 - 1):
            value_or_named_reason(data, cap)


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(frame_bytes, st.integers(0, 2**32 - 1) | st.integers(0, 64))
def test_random_bytes_give_a_value_or_a_named_reason(data: bytes, cap: int) -> None:
    value_or_named_reason(data, cap)
