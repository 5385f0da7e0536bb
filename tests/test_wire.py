"""The worker's codec (wire.py) against the parent's (msgspec), without processes.

Both directions, value by value: what the parent encodes, the worker decodes
to the same value and echoes back byte for byte; what the worker encodes,
the parent decodes strictly (trailing bytes refused, typed `exec` structs)
and msgspec would have written the very same bytes.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from trunner.errors import Reason, RunnerError
from trunner.protocol import (
    CollectedFile,
    ExecFile,
    ExecRequest,
    ExecResult,
    decode_single_frame,
    encode_frame,
)
from trunner.worker import exec_mode, wire

INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1
#: The ints at each edge of msgpack's int encodings.
INT_EDGES = [INT64_MIN, UINT64_MAX, 2**63 - 1, 2**63, -(2**31) - 1, -(2**31), 2**32 - 1, 2**32,
             -129, -128, -33, -32, -1, 0, 127, 128, 255, 256, 65535, 65536]
ints = st.one_of(st.integers(INT64_MIN, UINT64_MAX), st.sampled_from(INT_EDGES))
floats = st.floats(allow_nan=True, allow_infinity=True)
# Lengths that cross each size class (fix, 8, 16 bit); 32-bit ones are in a test below.
texts = st.one_of(st.text(max_size=40), st.integers(0, 70000).map(lambda n: "é" * (n // 2)))
blobs = st.one_of(st.binary(max_size=40), st.sampled_from([255, 256, 65535, 65536])
                  .map(lambda n: b"\x00" * n))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts, blobs)
keys = st.one_of(st.text(max_size=10), st.integers(INT64_MIN, UINT64_MAX))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=20),
        st.dictionaries(keys, inner, max_size=20),
    ),
    max_leaves=60,
)


def same(a: object, b: object) -> bool:
    """Equal, with types: bytes is not str, bool is not int, NaN is NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def parent_to_worker(v: object) -> None:
    """What the parent encodes, the worker decodes to the same value and
    echoes back byte for byte."""
    body = msgspec.msgpack.encode(v)
    got = wire.unpack(body)
    assert same(got, msgspec.msgpack.decode(body))
    assert wire.pack(got) == body


def worker_to_parent(v: object) -> None:
    """What the worker encodes, msgspec would have written; the parent
    decodes it strictly."""
    data = wire.frame(v)
    assert data == encode_frame(v)
    assert same(decode_single_frame(data), v)
    with pytest.raises(RunnerError) as info:
        decode_single_frame(data + b"\x00")
    assert info.value.reason is Reason.TRAILING_BYTES


#: One value of each msgpack type at each size class (fix, 8 and 16 bit; the
#: 32-bit ones in test_32_bit_lengths), and nestings of them: the default
#: lane's case of both directions; hypothesis's hundreds of values are `slow`.
REPRESENTATIVE: list[object] = [
    None, True, False, *INT_EDGES,
    0.0, -0.0, 1.5, -1e308, math.inf, -math.inf, math.nan,
    "", "x", "é" * 15, "é" * 16, "é" * 127, "é" * 128,
    b"", b"\x00", b"\xff" * 255, b"\xff" * 256,
    [], list(range(15)), list(range(16)),
    {}, dict.fromkeys(range(15), b""), {str(i): i for i in range(16)},
    {-1: "int key", UINT64_MAX: b"x", "": None},
    {"a": [1, {"b": [None, 2.5, b"\xff", "é"]}], 7: [[], {}], "n": [math.nan, -0.0]},
]


def test_representative_values_cross_both_ways() -> None:
    for v in REPRESENTATIVE:
        parent_to_worker(v)
        worker_to_parent(v)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(values)
def test_parent_to_worker_decodes_the_same_value_and_echoes_the_same_bytes(v: object) -> None:
    parent_to_worker(v)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(values)
def test_worker_to_parent_writes_msgspec_bytes_and_decodes_strictly(v: object) -> None:
    worker_to_parent(v)


@pytest.mark.parametrize("v", [2**64, INT64_MIN - 1])
def test_ints_past_64_bits_are_refused_on_both_sides(v: int) -> None:
    with pytest.raises(ValueError, match="int"):
        wire.pack(v)
    with pytest.raises(OverflowError):
        msgspec.msgpack.encode(v)


@pytest.mark.parametrize("n", [2**16, 2**16 + 1])
def test_32_bit_lengths(n: int) -> None:
    for v in ("x" * n, b"x" * n, [0] * n, dict.fromkeys(range(n), 0)):
        body = msgspec.msgpack.encode(v)
        assert wire.pack(v) == body
        assert same(wire.unpack(body), v)


def test_nesting_as_deep_as_msgspec_writes_needs_no_recursion() -> None:
    v: object = b"x"
    for i in range(900):
        v = [v] if i % 2 else {"k": v}
    body = msgspec.msgpack.encode(v)
    assert wire.pack(wire.unpack(body)) == body


def test_tuples_and_views_encode_as_arrays_and_bin() -> None:
    for v in ((1, (2, "x")), bytearray(b"ab"), memoryview(b"cd"), {(1, 2): "k"}):
        assert wire.pack(v) == msgspec.msgpack.encode(v)
    assert wire.unpack(msgspec.msgpack.encode({(1, (2,)): 0})) == {(1, (2,)): 0}


@given(st.integers(-128, 127), st.binary(max_size=300))
def test_ext_values_pass_through_byte_for_byte(code: int, data: bytes) -> None:
    body = msgspec.msgpack.encode([msgspec.msgpack.Ext(code, data)])
    assert wire.unpack(body) == [wire.Ext(code, data)]
    assert wire.pack(wire.unpack(body)) == body


def test_a_timestamp_is_echoed_as_the_same_datetime() -> None:
    import datetime

    when = datetime.datetime(2024, 2, 29, 12, 0, 0, 123456, tzinfo=datetime.UTC)
    body = msgspec.msgpack.encode(when)
    assert msgspec.msgpack.decode(wire.pack(wire.unpack(body))) == when


@pytest.mark.parametrize(
    "body",
    [b"", b"\xc1", b"\x92\x01", b"\xd9\x05abc", b"\xcd\x01", b"\x01\x02", b"\xa2\xff\xfe"],
    ids=["empty", "never-used", "short-array", "short-str", "short-uint", "trailing", "utf8"],
)
def test_malformed_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011  each has its own message
        wire.unpack(body)


def test_unsupported_types_are_refused() -> None:
    with pytest.raises(TypeError, match="set"):
        wire.pack({1, 2})


def test_frame_header_is_the_body_length() -> None:
    data = wire.frame([1, 2, 3])
    assert data[:4] == (len(data) - 4).to_bytes(4, "big")
    assert wire.unpack(data[4:]) == [1, 2, 3]


# -- the exec structs ----------------------------------------------------------

paths = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0/"),
                min_size=1, max_size=12)
exec_requests = st.builds(
    ExecRequest,
    argv=st.lists(st.text(max_size=10), min_size=1, max_size=4),
    stdin=st.binary(max_size=64),
    files=st.dictionaries(paths, st.builds(ExecFile, data=st.binary(max_size=32),
                                           executable=st.booleans()), max_size=4),
    collect=st.lists(paths, max_size=4),
    stdout_max_bytes=st.integers(0, 2**40),
    stderr_max_bytes=st.integers(0, 2**40),
)
collected = st.builds(CollectedFile, path=paths, size=st.integers(INT64_MIN, 2**63 - 1),
                      data=st.binary(max_size=32), mode=st.integers(0, 0o7777))


def exec_request_reads(request: ExecRequest) -> None:
    got = exec_mode.Request(wire.unpack(encode_frame(request)[4:]))
    assert (got.argv, got.stdin, got.collect) == (request.argv, request.stdin, request.collect)
    assert got.files == {p: (f.data, f.executable) for p, f in request.files.items()}
    assert (got.stdout_max_bytes, got.stderr_max_bytes) == (
        request.stdout_max_bytes, request.stderr_max_bytes)


@pytest.mark.parametrize("request_", [
    pytest.param(ExecRequest(argv=["x"]), id="defaults"),
    pytest.param(ExecRequest(argv=["/bin/sh", "-c", "é", ""], stdin=b"\x00in\xff",
                             files={"a.txt": ExecFile(data=b"1", executable=True),
                                    "é ü": ExecFile(data=b"")},
                             collect=["*.txt", "é"], stdout_max_bytes=2**40,
                             stderr_max_bytes=0), id="every-field"),
])
def test_an_exec_request_reads_as_the_parent_wrote_it(request_: ExecRequest) -> None:
    exec_request_reads(request_)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(exec_requests)
def test_exec_request_reads_as_the_parent_wrote_it(request: ExecRequest) -> None:
    exec_request_reads(request)


@pytest.mark.parametrize(("code", "files", "unmatched"), [
    pytest.param(0, [], [], id="exit-0"),
    pytest.param(2**31, [CollectedFile(path="a.txt", size=1, data=b"x", mode=0o644)], ["é"],
                 id="exit-2**31-collected"),
    pytest.param(-9, [CollectedFile(path="é", size=INT64_MIN, data=b"", mode=0o7777),
                      CollectedFile(path="b", size=2**63 - 1, data=b"\xff", mode=0)], [],
                 id="signal-9-collected"),
])
def test_an_exec_reply_decodes_strictly_into_exec_result(
    code: int, files: list[CollectedFile], unmatched: list[str]
) -> None:
    exec_reply_decodes(code, b"out\x00", b"err", files, unmatched, 1.5)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**31), 2**31), st.binary(max_size=64), st.binary(max_size=64),
       st.lists(collected, max_size=3), st.lists(paths, max_size=3),
       st.floats(allow_nan=False))
def test_exec_reply_decodes_strictly_into_exec_result(
    code: int, out: bytes, err: bytes, files: list[CollectedFile], unmatched: list[str],
    elapsed_s: float,
) -> None:
    exec_reply_decodes(code, out, err, files, unmatched, elapsed_s)


def exec_reply_decodes(code: int, out: bytes, err: bytes, files: list[CollectedFile],
                       unmatched: list[str], elapsed_s: float) -> None:
    maps = [{"path": f.path, "size": f.size, "data": f.data, "mode": f.mode} for f in files]
    reply = exec_mode.result(code, out, err, maps, unmatched, elapsed_s)
    expected = ExecResult(exit_code=code if code >= 0 else None,
                          signal=-code if code < 0 else None, stdout=out, stderr=err,
                          files=files, unmatched=unmatched, elapsed_s=elapsed_s)
    data = wire.frame(reply)
    assert data == encode_frame(expected)
    assert decode_single_frame(data, ExecResult) == expected
    # Exactly the struct's fields, nothing the parent would silently skip.
    strict: Any = msgspec.defstruct("Strict", [(f, Any) for f in ExecResult.__struct_fields__],
                                    tag="exec_result", forbid_unknown_fields=True)
    msgspec.msgpack.decode(data[4:], type=strict)


def test_exec_request_with_another_tag_is_refused() -> None:
    body = wire.unpack(encode_frame(ExecResult(exit_code=0, signal=None, stdout=b"",
                                               stderr=b""))[4:])
    with pytest.raises(ValueError, match="exec_request"):
        exec_mode.Request(body)
