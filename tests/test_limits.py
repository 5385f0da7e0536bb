"""`Limits`: the same checks for values built in code and decoded from config."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from trunner.limits import (
    AUTO_ADDRESS_SPACE_BYTES,
    AUTO_FILE_SIZE_SLACK_BYTES,
    PRESETS,
    Limits,
    file_size_for,
)


def test_defaults_and_presets_are_valid() -> None:
    assert Limits().wall_time_s == 10.0
    assert set(PRESETS) == {"default", "quick", "tool", "bulk"}  # the names README documents
    assert PRESETS["default"] == Limits()
    default = msgspec.structs.asdict(Limits())
    for name, preset in PRESETS.items():
        fields = msgspec.structs.asdict(preset)
        # What config can say, a preset says: the untrusted path accepts it unchanged.
        assert Limits.from_mapping(fields) == preset, name
        # address_space_bytes: "auto" is compared where a number is the bound
        # (no memory cgroup: AUTO_ADDRESS_SPACE_BYTES); with one, "auto" sets none.
        # file_size_bytes: "auto" is the scratch's size.
        fields, base = (
            {**{f: AUTO_ADDRESS_SPACE_BYTES if v == "auto" else v for f, v in d.items()},
             "file_size_bytes": file_size_for(Limits.from_mapping(d))}
            for d in (fields, default))
        if name == "quick":  # "tight everything"
            assert all(fields[f] <= base[f] for f in fields), fields
        elif name in ("tool", "bulk"):  # more room than the default, never less
            assert all(fields[f] >= base[f] for f in fields), (name, fields)


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
        ("open_files", 31),  # trunner's own processes in the jail hold up to 18
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


def test_file_size_follows_the_scratch_unless_given() -> None:
    """file_size_bytes "auto" (the default) is the scratch's size, whatever
    that is, `replace` included, and a page's rounding more (a full scratch
    says ENOSPC); a number given holds."""
    slack = AUTO_FILE_SIZE_SLACK_BYTES
    assert slack == 64 << 10
    assert Limits().file_size_bytes == "auto"
    assert Limits().scratch_bytes == 256 << 20
    assert file_size_for(Limits()) == (256 << 20) + slack
    assert file_size_for(Limits(scratch_bytes=1 << 30)) == (1 << 30) + slack
    assert file_size_for(Limits().replace(scratch_bytes=8 << 20)) == (8 << 20) + slack
    assert file_size_for(Limits(file_size_bytes=1 << 20, scratch_bytes=1 << 30)) == 1 << 20
    assert file_size_for(Limits.from_mapping({"file_size_bytes": "auto"})) == (256 << 20) + slack
    with pytest.raises(ValueError, match="file_size_bytes"):
        Limits.from_mapping({"file_size_bytes": "scratch"})


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


def _four_ways(fields: dict[str, Any]) -> list[Limits]:
    """The same limits built as a caller, a config file, a pickle and the wire build them."""
    import pickle

    built = Limits(**fields)
    configured = Limits.from_mapping(fields)
    return [
        built,
        configured,
        pickle.loads(pickle.dumps(built)),
        msgspec.msgpack.decode(msgspec.msgpack.encode(fields), type=Limits),
    ]


@pytest.mark.parametrize("fields", [{"wall_time_s": 5}, {"wall_time_s": 5, "cpu_time_s": 7},
                                    {"wall_time_s": 86400, "processes": 3}])
def test_equal_limits_are_one_value_one_plan_one_version(fields: dict[str, Any]) -> None:
    """An int for a float field (wall_time_s=5) is stored as the float, however the
    limits were built: equal limits encode, plan and version alike. Before, the
    constructor kept int 5 and from_mapping gave 5.0: equal, but two versions."""
    from support import plan_for
    from trunner import Runner
    from trunner.linux.plan import encode_plan
    from trunner.linux.probe import probe_host
    from trunner.linux.profile import DEFAULT_PROFILE

    ways = _four_ways(fields)
    assert all(way == ways[0] for way in ways)
    for name in Limits.__struct_fields__:
        assert {type(getattr(way, name)) for way in ways} == {type(getattr(Limits(), name))}, name
    assert len({msgspec.msgpack.encode(way) for way in ways}) == 1
    plans = {encode_plan(plan_for(way, probe_host(), DEFAULT_PROFILE))
             for way in ways}
    assert len(plans) == 1
    fresh = [Runner().rules_version(way) for way in ways]
    assert len(set(fresh)) == 1, fresh
    backend = Runner().backend
    assert {backend.rules_version(way) for way in ways} == set(fresh[:1])


def test_the_version_cache_answers_for_the_value_not_the_first_form_seen() -> None:
    """The Runner caches versions per Limits (equal limits are one key): whichever
    form it saw first, it answers what a fresh Runner computes for the other."""
    from trunner import Runner

    built, configured, *_ = _four_ways({"wall_time_s": 5})
    for first, second in ((built, configured), (configured, built)):
        runner = Runner()
        runner.rules_version(first)
        assert runner.rules_version(second) == Runner().rules_version(second)
