"""A limit typed as text, read with its unit: the one parser behind every
place a limit is typed (the `trunner` command's limit flags).

Pure: text in, a number out, or a `UnitError` whose message gives the
accepted forms. No I/O, and nothing of trunner imported: what the number
must be (its bounds, int or float) stays `Limits`' to say.

The unit follows the field's name (`Limits` keeps units in names):

- `..._bytes`: `N` bytes; `N` with `K`, `M`, `G` (KiB, MiB, GiB, as Docker
  reads them; any case, or written `KiB`, `MiB`, `GiB`), or with `KB`, `MB`,
  `GB` (decimal: 1000, 10**6, 10**9). A suffix gives whole bytes, rounded
  down as Docker does (`1.5K` is 1536);
- `..._s`: `N` seconds; `N` with `ms`, `s` or `m` (minutes), as written;
- anything else is a count: `N`.

A bare `N` keeps the meaning it had before units: an int when `int()`
reads it, else a float when `float()` does (`5`, `2.5`, `1e9`), checked
by `Limits` as it is.
"""

from __future__ import annotations

import enum
import re
from fractions import Fraction
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Collection


class Unit(enum.Enum):
    """What a limit counts, from the unit in its field's name."""

    BYTES = "bytes"
    SECONDS = "seconds"
    COUNT = "count"


#: Byte suffixes, upper-cased, and their multipliers.
BYTE_SUFFIXES: Final[dict[str, int]] = {
    "B": 1,
    "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30,
    "KB": 10**3, "MB": 10**6, "GB": 10**9,
}
#: Time suffixes, exactly as written, and how many seconds each is.
TIME_SUFFIXES: Final[dict[str, Fraction]] = {
    "ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60),
}
#: The accepted forms, in words (for errors and `--help`).
FORMS: Final[dict[Unit, str]] = {
    Unit.BYTES: "N bytes, or N with K, M, G (KiB, MiB, GiB) or KB, MB, GB (decimal),"
                " e.g. 256M",
    Unit.SECONDS: "N seconds, or N with ms, s or m (minutes), e.g. 500ms",
    Unit.COUNT: "a whole number N",
}

_QUANTITY = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([A-Za-z]+)")


class UnitError(ValueError):
    """Text that is no quantity of its unit; the message gives the forms."""


def unit_of(field: str) -> Unit:
    """The unit of a `Limits` field, from its name."""
    if field.endswith("_bytes"):
        return Unit.BYTES
    if field.endswith("_s"):
        return Unit.SECONDS
    return Unit.COUNT


def parse_quantity(text: str, unit: Unit, *, words: Collection[str] = ()) -> int | float | str:
    """`text` as a quantity of `unit`: a bare number as `int()` or
    `float()` reads it; with a suffix, whole bytes (an int) or seconds (a
    float). A word of `words` (such as `"auto"`) is returned as it is.

    Raises:
        UnitError: anything else, naming the accepted forms.
    """
    if text in words:
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    match = _QUANTITY.fullmatch(text)
    if match is not None:
        number, suffix = Fraction(match.group(1)), match.group(2)
        if unit is Unit.BYTES and suffix.upper() in BYTE_SUFFIXES:
            return int(number * BYTE_SUFFIXES[suffix.upper()])  # rounded down
        if unit is Unit.SECONDS and suffix in TIME_SUFFIXES:
            return float(number * TIME_SUFFIXES[suffix])
    forms = FORMS[unit] + "".join(f", or {word!r}" for word in words)
    raise UnitError(f"{text!r} is not {_NOUN[unit]}: give {forms}")


def parse_limit(field: str, text: str, *, words: Collection[str] = ()) -> int | float | str:
    """`text`, typed for the `Limits` field `field`, in the unit its name
    carries (`parse_quantity`).

    Raises:
        UnitError: naming the accepted forms.
    """
    return parse_quantity(text, unit_of(field), words=words)


_NOUN: Final[dict[Unit, str]] = {
    Unit.BYTES: "a size", Unit.SECONDS: "a time", Unit.COUNT: "a number"}
