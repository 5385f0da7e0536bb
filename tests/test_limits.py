"""`Limits`: the same checks for values built in code and decoded from config."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from trunner.limits import PRESETS, Limits


def test_defaults_and_presets_are_valid() -> None:
    assert Limits().wall_time_s == 10.0
    assert set(PRESETS) == {"default", "quick", "tool", "bulk"}  # the names README documents
    assert PRESETS["default"] == Limits()
    default = msgspec.structs.asdict(Limits())
    for name, preset in PRESETS.items():
        fields = msgspec.structs.asdict(preset)
        # What config can say, a preset says: the untrusted path accepts it unchanged.
        assert Limits.from_mapping(fields) == preset, name
        if name == "quick":  # "tight everything"
            assert all(fields[f] <= default[f] for f in fields), fields
        elif name in ("tool", "bulk"):  # more room than the default, never less
            assert all(fields[f] >= default[f] for f in fields), (name, fields)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("wall_time_s", 0),
        ("wall_time_s", -1.0),
        ("stdout_max_bytes", -1),
        ("address_space_bytes", 1024),
        ("processes", 0),
        ("processes", True),
        ("open_files", "64"),
    ],
)
def test_bad_values_name_the_field_in_code_and_from_config(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})
    with pytest.raises(ValueError, match=field):
        Limits.from_mapping({field: value})


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ValueError, match="wall_time"):
        Limits.from_mapping({"wall_time": 3})
    with pytest.raises(TypeError):
        Limits(10.0)  # type: ignore[call-arg]  # keyword-only


def test_frozen_and_replace_validates() -> None:
    limits = Limits()
    with pytest.raises(AttributeError):
        limits.wall_time_s = 3  # type: ignore[misc]
    assert limits.replace(wall_time_s=3).wall_time_s == 3.0
    with pytest.raises(ValueError, match="processes"):
        limits.replace(processes=-5)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(
    st.sampled_from([*Limits.__struct_fields__, "junk"]),
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
))
def test_untrusted_mappings_give_limits_or_value_error(data: dict[str, Any]) -> None:
    try:
        limits = Limits.from_mapping(data)
    except ValueError:
        return
    assert msgspec.convert(msgspec.structs.asdict(limits), Limits) == limits
