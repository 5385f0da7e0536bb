"""Fuzzing the parent's untrusted inputs, without processes.

Goes past test_protocol.py / test_limits.py: mutated valid frames (bit flips,
splices, rewritten headers), declared lengths up to 2**32-1 against small
caps with the allocation measured, hostile msgpack bodies (huge container
and string headers, deep nesting), typed responses, untrusted `Limits`
config of any shape, and request encoding of structured values with huge
ints, special floats and unencodable leaves.

`TRUNNER_FUZZ_EXAMPLES` sets the examples per test (default 300);
`benchmarks/fuzz.py` runs this file with 10,000. Every property here is
`slow` (`-m 'not slow'` leaves it out); the default lane keeps a fixed
case of the hostile headers and declared lengths, the deep nestings, and
test_protocol.py's and test_limits.py's own cases of the frame codec and
of `Limits` from config.
"""

from __future__ import annotations

import math
import os
import tracemalloc
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st

from trunner.errors import Reason, RunnerError
from trunner.limits import Limits
from trunner.protocol import (
    HEADER_BYTES,
    MAX_FRAME_BYTES,
    ExecRequest,
    ExecResult,
    decode_single_frame,
    encode_frame,
)

EXAMPLES = int(os.environ.get("TRUNNER_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
PROTOCOL_REASONS = frozenset({
    Reason.NO_FRAME, Reason.TRUNCATED_FRAME, Reason.OVERSIZED_FRAME,
    Reason.TRAILING_BYTES, Reason.BAD_FRAME,
})
KiB = 1024

# -- values --------------------------------------------------------------------

leaves = (
    st.none() | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**32, -(2**31) - 1])
    | st.floats()  # nan and +-inf included
    | st.text(max_size=40) | st.binary(max_size=64)
)
keys = st.text(max_size=10) | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8)
msgpack_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=6)
    | st.dictionaries(keys, inner, max_size=6)
    | st.tuples(inner, inner),
    max_leaves=40,
)


def normalize(value: Any) -> Any:
    """What a value is after a msgpack round trip (tuples are arrays)."""
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        return {normalize_key(k): normalize(v) for k, v in value.items()}
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def normalize_key(key: Any) -> Any:
    return tuple(normalize_key(k) for k in key) if isinstance(key, (list, tuple)) else key


def same(a: Any, b: Any) -> bool:
    """Equality where nan equals nan."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def decode_or_reason(data: bytes, response_type: Any = Any, **kw: Any) -> Any:
    """The decoded value, or the RunnerError; anything else propagates."""
    try:
        return decode_single_frame(data, response_type, **kw)
    except RunnerError as e:
        error = e
    assert error.reason in PROTOCOL_REASONS, error.reason
    assert error.detail
    assert "\n" not in error.detail
    return error


# -- mutated valid frames -------------------------------------------------------


@st.composite
def mutated_frames(draw: st.DrawFn, values: st.SearchStrategy[Any] = msgpack_values) -> bytes:
    data = bytearray(encode_frame(draw(values)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(
            ["flip", "set", "insert", "delete", "truncate", "append", "header", "splice"]
        ))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[at:]
        elif op == "append":
            data += draw(st.binary(min_size=1, max_size=8))
        elif op == "header":
            declared = draw(st.integers(0, MAX_FRAME_BYTES) | st.sampled_from(
                [0, 1, len(data) - HEADER_BYTES - 1, len(data) - HEADER_BYTES + 1,
                 2**31, 2**32 - 1]
            ))
            data[:HEADER_BYTES] = max(declared, 0).to_bytes(HEADER_BYTES, "big")
        elif op == "splice":
            other = encode_frame(draw(values))
            data[at:at] = other[: draw(st.integers(0, len(other)))]
    return bytes(data)


caps = st.integers(0, 64) | st.integers(0, 4 * KiB) | st.just(MAX_FRAME_BYTES)


@pytest.mark.slow
@FUZZ
@given(mutated_frames(), caps)
def test_mutated_frames_give_a_value_or_a_named_reason(data: bytes, cap: int) -> None:
    out = decode_or_reason(data, max_body_bytes=cap)
    declared = int.from_bytes(data[:HEADER_BYTES], "big") if len(data) >= HEADER_BYTES else None
    note(f"declared={declared} size={len(data)} cap={cap} -> {out!r:.200}")
    # The reasons are decided in this order, from the sizes alone.
    if not data:
        assert isinstance(out, RunnerError)
        assert out.reason is Reason.NO_FRAME
    elif declared is None:
        assert isinstance(out, RunnerError)
        assert out.reason is Reason.TRUNCATED_FRAME
    elif declared > cap:
        assert isinstance(out, RunnerError)
        assert out.reason is Reason.OVERSIZED_FRAME
    elif len(data) < HEADER_BYTES + declared:
        assert isinstance(out, RunnerError)
        assert out.reason is Reason.TRUNCATED_FRAME
    elif len(data) > HEADER_BYTES + declared:
        assert isinstance(out, RunnerError)
        assert out.reason is Reason.TRAILING_BYTES
    elif not isinstance(out, RunnerError):
        # Accepted: exactly one frame whose body re-encodes to a valid frame.
        assert same(decode_single_frame(encode_frame(out)), out)
    else:
        assert out.reason is Reason.BAD_FRAME


@pytest.mark.slow
@FUZZ
@given(
    mutated_frames(st.builds(
        ExecResult,
        exit_code=st.none() | st.integers(-(2**63), 2**63 - 1),
        signal=st.none() | st.integers(0, 64),
        stdout=st.binary(max_size=32),
        stderr=st.binary(max_size=32),
    )),
    caps,
)
def test_mutated_typed_frames_give_the_type_or_a_named_reason(data: bytes, cap: int) -> None:
    out = decode_or_reason(data, ExecResult, max_body_bytes=cap)
    # decode_or_reason checked any error's reason; an accepted result must round-trip.
    if not isinstance(out, RunnerError):
        assert decode_single_frame(encode_frame(out), ExecResult) == out


@pytest.mark.slow
@FUZZ
@given(
    st.integers(0, MAX_FRAME_BYTES) | st.integers(2**20, MAX_FRAME_BYTES),
    st.binary(max_size=64),
    st.integers(0, 4 * KiB) | st.just(MAX_FRAME_BYTES),
)
def test_huge_declared_lengths_never_allocate(declared: int, tail: bytes, cap: int) -> None:
    declared_length_never_allocates(declared, tail, cap)


@pytest.mark.parametrize(("declared", "cap"), [
    (2**32 - 1, 4 * KiB), (2**32 - 1, MAX_FRAME_BYTES), (MAX_FRAME_BYTES, MAX_FRAME_BYTES),
    (2**20, 4 * KiB), (65, 64),
])
def test_a_huge_declared_length_never_allocates(declared: int, cap: int) -> None:
    """The default lane's cases of the property above."""
    declared_length_never_allocates(declared, b"\x91\xc0", cap)


def declared_length_never_allocates(declared: int, tail: bytes, cap: int) -> None:
    data = declared.to_bytes(HEADER_BYTES, "big") + tail
    tracemalloc.start()
    try:
        out = decode_or_reason(data, max_body_bytes=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * KiB, (declared, cap, peak)
    if declared > cap:
        assert isinstance(out, RunnerError)
        assert out.reason is Reason.OVERSIZED_FRAME
    elif declared > len(tail):
        assert isinstance(out, RunnerError)
        assert out.reason is Reason.TRUNCATED_FRAME


#: msgpack headers that claim a huge container or string in a few bytes.
HOSTILE_PREFIXES = [
    b"\xdd\xff\xff\xff\xff",  # array32 of 2**32-1 elements
    b"\xdf\xff\xff\xff\xff",  # map32 of 2**32-1 pairs
    b"\xc6\xff\xff\xff\xff",  # bin32 of 2**32-1 bytes
    b"\xdb\xff\xff\xff\xff",  # str32 of 2**32-1 bytes
    b"\xc9\xff\xff\xff\xff\x01",  # ext32 of 2**32-1 bytes
    b"\xdc\xff\xff",  # array16 of 65535
    b"\xde\xff\xff",  # map16 of 65535
]


@pytest.mark.slow
@FUZZ
@given(st.lists(st.sampled_from(HOSTILE_PREFIXES), min_size=1, max_size=4), st.binary(max_size=32))
def test_hostile_body_headers_are_bad_frame_without_allocating(
    prefixes: list[bytes], tail: bytes
) -> None:
    hostile_body_is_bad_frame(prefixes, tail)


@pytest.mark.parametrize("prefix", HOSTILE_PREFIXES,
                         ids=["array32", "map32", "bin32", "str32", "ext32", "array16", "map16"])
def test_each_hostile_body_header_is_bad_frame_without_allocating(prefix: bytes) -> None:
    """The default lane's cases of the property above: each header alone."""
    hostile_body_is_bad_frame([prefix], b"\x01")


def hostile_body_is_bad_frame(prefixes: list[bytes], tail: bytes) -> None:
    body = b"".join(prefixes) + tail
    data = len(body).to_bytes(HEADER_BYTES, "big") + body
    tracemalloc.start()
    try:
        out = decode_or_reason(data, max_body_bytes=64 * KiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(out, RunnerError), out
    assert out.reason is Reason.BAD_FRAME, out
    assert peak < 1024 * KiB, peak


@pytest.mark.parametrize("opener", [b"\x91", b"\x81\xc0"], ids=["array", "map"])
@pytest.mark.parametrize("depth", [1_000, 20_000])
def test_deeply_nested_body_is_a_value_or_bad_frame(depth: int, opener: bytes) -> None:
    """A hostile child can nest as deep as its stdout cap allows."""
    body = opener * depth + b"\xc0"
    out = decode_or_reason(len(body).to_bytes(HEADER_BYTES, "big") + body)
    assert not isinstance(out, RunnerError) or out.reason is Reason.BAD_FRAME


# -- Limits from untrusted config -------------------------------------------------

FIELDS = list(Limits.__struct_fields__)
config_values = st.recursive(
    st.none() | st.booleans()
    | st.integers() | st.integers(-(2**70), 2**70)
    | st.floats() | st.decimals(allow_nan=True).map(str)
    | st.text(max_size=8) | st.binary(max_size=8)
    | st.sampled_from(["10", "1e3", "inf", "nan", "0x10", " 5", "", "1_000", "auto", "AUTO"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6,
)
config_keys = st.sampled_from([*FIELDS, "junk", "", "WALL_TIME_S", "wall_time_s "]) | st.text(
    max_size=12
) | st.integers() | st.none()


@pytest.mark.slow
@FUZZ
@given(st.dictionaries(config_keys, config_values, max_size=10))
def test_untrusted_config_of_any_shape_is_limits_or_value_error(data: dict[Any, Any]) -> None:
    try:
        limits = Limits.from_mapping(data)
    except ValueError:
        return
    assert set(data) <= set(FIELDS)
    fields = msgspec.structs.asdict(limits)
    # Every constraint holds: built in code and converted again, it is the same.
    assert Limits(**fields) == limits == limits.replace() == msgspec.convert(fields, Limits)
    assert all(not isinstance(v, bool) for v in fields.values())
    assert math.isfinite(limits.wall_time_s)


@pytest.mark.slow
@FUZZ
@given(st.fixed_dictionaries({}, optional={
    name: st.integers(-(2**70), 2**70) | st.floats() for name in FIELDS
}))
def test_numeric_config_near_the_bounds(data: dict[str, Any]) -> None:
    try:
        limits = Limits.from_mapping(data)
    except ValueError as e:
        message = str(e)
    else:
        for name, value in data.items():
            assert getattr(limits, name) == value
        return
    assert any(name in message for name in data), message


# -- request encoding -------------------------------------------------------------


class Unencodable:
    pass


hostile_leaves = (
    leaves
    | st.integers(2**64, 2**200) | st.integers(-(2**200), -(2**63) - 1)
    | st.builds(Unencodable) | st.complex_numbers(max_magnitude=10)
    | st.binary(max_size=16).map(bytearray) | st.binary(max_size=16).map(lambda b: memoryview(b))
    | st.just(...) | st.builds(object)
)
request_values = st.recursive(
    hostile_leaves,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(keys, inner, max_size=5)
    | st.tuples(inner, inner)
    | st.builds(ExecRequest, argv=st.lists(st.text(max_size=8), max_size=3)),
    max_leaves=30,
)


@pytest.mark.slow
@FUZZ
@given(request_values)
def test_encoding_any_request_is_a_frame_or_bad_request(value: Any) -> None:
    try:
        frame = encode_frame(value)
    except RunnerError as e:
        reason: Reason | None = e.reason
    else:
        reason = None
    if reason is not None:
        assert reason is Reason.BAD_REQUEST
        return
    assert isinstance(frame, bytes)
    assert int.from_bytes(frame[:HEADER_BYTES], "big") == len(frame) - HEADER_BYTES
    decoded: Any = decode_single_frame(frame)
    assert encode_frame(decoded) == frame  # stable: the bytes round-trip exactly
    if not _has_struct(value):
        assert same(decoded, normalize(value)), (decoded, value)


def _has_struct(value: Any) -> bool:
    if isinstance(value, msgspec.Struct):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_struct(v) for v in value)
    if isinstance(value, dict):
        return any(_has_struct(v) for v in value.values())
    return False


@pytest.mark.parametrize("depth", [1_000, 20_000])
def test_deeply_nested_request_is_a_frame_or_bad_request(depth: int) -> None:
    value: Any = None
    for _ in range(depth):
        value = [value]
    try:
        encode_frame(value)
    except RunnerError as e:
        reason: Reason | None = e.reason
    else:
        reason = None
    assert reason in (None, Reason.BAD_REQUEST)
