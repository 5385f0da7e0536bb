"""The worker's msgpack codec: how a built-in adapter reads its request and
writes its reply.

Every jailed adapter pays for its imports on each spawn, so this module
imports nothing but the built-in itertools (`struct` only at the first
float): msgspec costs ~20 ms there (typing, inspect, decimal, uuid,
datetime). The parent keeps msgspec and its strict, typed decoding
(protocol.py). tests/test_wire.py checks value by value that `pack` writes
exactly msgspec's bytes and `unpack` reads what msgspec writes. Pure: no IO,
no typing, no enum.

Encodes None, bool, int (-2**63 .. 2**64-1), float (as float64), str, bytes,
bytearray, memoryview, list, tuple, dict and `Ext`; anything else is a
TypeError. Decodes every msgpack type; an ext value (a timestamp too) stays
an opaque `Ext` and is written back byte for byte.
"""

from itertools import chain

TYPE_CHECKING = False  # not from typing: importing it costs the adapter ~5 ms
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

#: Frame header: the body's length, 4 bytes big-endian.
HEADER_BYTES = 4
#: Largest body a 4-byte header can declare.
MAX_FRAME_BYTES = 2**32 - 1

#: Bounds of an `exec` request's files (refused before spawn) and of what it
#: collects: all files' bytes and stdin together; files placed; files collected
#: (past it the run fails `too_many_files`) and patterns; a path's UTF-8 bytes
#: (Linux PATH_MAX less its NUL) and a name's (NAME_MAX). Both sides use them;
#: protocol.py re-exports them.
EXEC_INPUT_MAX_BYTES = 64 * 1024 * 1024
EXEC_INPUT_MAX_FILES = 1024
EXEC_COLLECT_MAX_FILES = 10_000
EXEC_COLLECT_MAX_PATTERNS = 1024
EXEC_PATH_MAX_BYTES = 4095
EXEC_NAME_MAX_BYTES = 255
#: Bound of an `exec` request's `env`: every `NAME=VALUE` with its NUL, in UTF-8.
EXEC_ENV_MAX_BYTES = 128 * 1024
#: The `files` mode: most ops a request holds; longest error detail (UTF-8
#: bytes); the read budget of a request that names none (`FilesRequest`):
#: the default stdout cap (1 MiB) less 64 KiB, more than its headroom.
FILES_MAX_OPS = 1024
FILES_DETAIL_MAX_BYTES = 1024
FILES_DEFAULT_BUDGET_BYTES = 1024 * 1024 - 64 * 1024

_STRUCTS: "dict[str, Any]" = {}


def _floats(fmt: str) -> "Any":  # noqa: ANN401 (a struct.Struct; no typing here)
    """struct.Struct(fmt), importing struct at the first float (~0.5 ms)."""
    packer = _STRUCTS.get(fmt)
    if packer is None:
        import struct

        packer = _STRUCTS[fmt] = struct.Struct(fmt)
    return packer


# Fixed-size ext: marker -> data size.
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_END = object()  # no more items; no key yet


class Ext:
    """A msgpack ext value, kept as its type code and raw data."""

    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes) -> None:
        if not -128 <= code <= 127:
            raise ValueError(f"ext code {code} is not in -128..127")
        self.code, self.data = code, bytes(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ext) and (self.code, self.data) == (other.code, other.data)

    def __hash__(self) -> int:
        return hash((self.code, self.data))

    def __repr__(self) -> str:
        return f"Ext({self.code}, {self.data!r})"


def frame(obj: object) -> bytes:
    """`obj` as one frame: the 4-byte length, then the msgpack body.

    Raises:
        TypeError: a value of a type this codec does not encode.
        ValueError: an int out of range, or a body over `MAX_FRAME_BYTES`.
    """
    out = bytearray(HEADER_BYTES)
    _pack(obj, out)
    size = len(out) - HEADER_BYTES
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame body of {size} bytes is too large")
    out[:HEADER_BYTES] = size.to_bytes(HEADER_BYTES, "big")
    return bytes(out)


def pack(obj: object) -> bytes:
    """`obj` as a msgpack body (no header): msgspec's bytes for the same value."""
    out = bytearray()
    _pack(obj, out)
    return bytes(out)


def _size(out: bytearray, n: int, fix: int, fix_max: int, m8: int | None, m16: int) -> None:
    """A length header: the fix form, then 8-, 16- or 32-bit (no 8 for arrays, maps)."""
    if n <= fix_max:
        out.append(fix | n)
    elif m8 is not None and n < 0x100:
        out += bytes((m8, n))
    elif n < 0x10000:
        out.append(m16)
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(m16 + 1)
        out += n.to_bytes(4, "big")
    else:
        raise ValueError(f"a length of {n} does not fit msgpack")


def _pack_int(x: int, out: bytearray) -> None:
    # The smallest form, as msgspec writes it.
    if 0 <= x < 0x80 or -32 <= x < 0:
        out += (x & 0xFF).to_bytes(1, "big")
    elif x >= 0:
        for marker, n in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
            if x < 1 << (8 * n):
                out.append(marker)
                out += x.to_bytes(n, "big")
                return
        raise ValueError(f"int {x} is over 2**64 - 1")
    else:
        for marker, n in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
            if x >= -(1 << (8 * n - 1)):
                out.append(marker)
                out += x.to_bytes(n, "big", signed=True)
                return
        raise ValueError(f"int {x} is under -2**63")


def _pack(obj: object, out: bytearray) -> None:
    # A stack of iterators, not recursion: any depth msgspec writes or reads.
    stack: list[Iterator[object]] = []
    while True:
        if isinstance(obj, (list, tuple)):
            _size(out, len(obj), 0x90, 15, None, 0xDC)
            if obj:
                stack.append(iter(obj))
        elif isinstance(obj, dict):
            _size(out, len(obj), 0x80, 15, None, 0xDE)
            if obj:
                stack.append(chain.from_iterable(obj.items()))
        else:
            _pack_scalar(obj, out)
        while stack:
            obj = next(stack[-1], _END)
            if obj is not _END:
                break
            stack.pop()
        else:
            return


def _pack_scalar(obj: object, out: bytearray) -> None:
    if obj is None:
        out.append(0xC0)
    elif obj is True or obj is False:
        out.append(0xC3 if obj else 0xC2)
    elif isinstance(obj, int):
        _pack_int(int(obj), out)
    elif isinstance(obj, float):
        out.append(0xCB)
        out += _floats(">d").pack(obj)
    elif isinstance(obj, str):
        data = obj.encode()
        _size(out, len(data), 0xA0, 31, 0xD9, 0xDA)
        out += data
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        view = memoryview(obj).cast("B")
        _size(out, len(view), 0xC4, -1, 0xC4, 0xC5)
        out += view
    elif isinstance(obj, Ext):
        n = len(obj.data)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}.get(n)
        if fixed is not None:
            out.append(fixed)
        else:
            _size(out, n, 0, -1, 0xC7, 0xC8)
        out += obj.code.to_bytes(1, "big", signed=True)
        out += obj.data
    else:
        raise TypeError(f"cannot encode a {type(obj).__name__}")


def unpack(body: bytes) -> object:
    """The one msgpack value `body` holds.

    Raises:
        ValueError: truncated, trailing bytes, or a byte that starts no value.
    """
    # Containers being filled: [container, items left, key or _END]. No
    # recursion: any depth msgspec writes.
    stack: list[list[Any]] = []
    i = 0
    while True:
        obj, i, n = _head(body, i)
        if n:
            stack.append([obj, n, _END])
            continue
        # `obj` is whole: put it in its container, closing each one it fills.
        while stack:
            top = stack[-1]
            container, left, key = top
            if isinstance(container, list):
                container.append(obj)
            elif key is _END:
                top[2] = _frozen(obj)
                break  # its value comes next
            else:
                container[key] = obj
                top[2] = _END
            top[1] = left - 1
            if left > 1:
                break
            stack.pop()
            obj = container
        else:
            if i != len(body):
                raise ValueError(f"{len(body) - i} bytes after the value")
            return obj


def _take(data: bytes, i: int, n: int) -> bytes:
    if i + n > len(data):
        raise ValueError(f"truncated: {len(data) - i} of {n} bytes at offset {i}")
    return data[i : i + n]


def _uint(data: bytes, i: int, n: int) -> int:
    return int.from_bytes(_take(data, i, n), "big")


def _head(data: bytes, i: int) -> tuple[object, int, int]:
    """The value at `i`, the offset after it, and for an array or a map its
    item count (the container is returned empty)."""
    b = _take(data, i, 1)[0]
    i += 1
    if b < 0x80:
        return b, i, 0
    if b >= 0xE0:
        return b - 0x100, i, 0
    if 0xA0 <= b <= 0xBF:
        return _str(data, i, b & 0x1F)
    if 0x90 <= b <= 0x9F:
        return [], i, b & 0x0F
    if 0x80 <= b <= 0x8F:
        return {}, i, b & 0x0F
    if b == 0xC0:
        return None, i, 0
    if b in (0xC2, 0xC3):
        return b == 0xC3, i, 0
    if 0xCC <= b <= 0xCF:
        n = 1 << (b - 0xCC)
        return _uint(data, i, n), i + n, 0
    if 0xD0 <= b <= 0xD3:
        n = 1 << (b - 0xD0)
        return int.from_bytes(_take(data, i, n), "big", signed=True), i + n, 0
    if b == 0xCA:
        return _floats(">f").unpack(_take(data, i, 4))[0], i + 4, 0
    if b == 0xCB:
        return _floats(">d").unpack(_take(data, i, 8))[0], i + 8, 0
    if 0xD9 <= b <= 0xDB:
        n = 1 << (b - 0xD9)
        return _str(data, i + n, _uint(data, i, n))
    if 0xC4 <= b <= 0xC6:
        n = 1 << (b - 0xC4)
        size = _uint(data, i, n)
        return _take(data, i + n, size), i + n + size, 0
    if b in (0xDC, 0xDD):
        n = 2 if b == 0xDC else 4
        return [], i + n, _uint(data, i, n)
    if b in (0xDE, 0xDF):
        n = 2 if b == 0xDE else 4
        return {}, i + n, _uint(data, i, n)
    if b in _FIXEXT:
        return _ext(data, i, _FIXEXT[b])
    if 0xC7 <= b <= 0xC9:
        n = 1 << (b - 0xC7)
        return _ext(data, i + n, _uint(data, i, n))
    raise ValueError(f"byte 0x{b:02x} at offset {i - 1} starts no msgpack value")


def _str(data: bytes, i: int, n: int) -> tuple[str, int, int]:
    return _take(data, i, n).decode(), i + n, 0


def _frozen(key: object) -> object:
    """An array used as a map key, as a tuple (as msgspec decodes it)."""
    return tuple(_frozen(k) for k in key) if isinstance(key, list) else key


def _ext(data: bytes, i: int, n: int) -> tuple[Ext, int, int]:
    code = int.from_bytes(_take(data, i, 1), "big", signed=True)
    return Ext(code, _take(data, i + 1, n)), i + 1 + n, 0
