"""Limits typed with units: `trunner.units`, the one parser, with plain
values (no process, no I/O), and the command's flags parsed through it
(`trunner.cli.parse`: argv -> the Limits it would run with; nothing runs).
The same flags in real jailed runs: tests/test_cli_shell.py."""

from __future__ import annotations

from fractions import Fraction

import pytest

from trunner import Limits
from trunner.cli import UsageError, limit_flag, parse
from trunner.limits import GiB, KiB, MiB
from trunner.units import (
    BYTE_SUFFIXES,
    FORMS,
    TIME_SUFFIXES,
    Unit,
    UnitError,
    parse_limit,
    parse_quantity,
    unit_of,
)

SIZE_FORMS = ("N bytes, or N with K, M, G (KiB, MiB, GiB) or KB, MB, GB (decimal),"
              " e.g. 256M")
TIME_FORMS = "N seconds, or N with ms, s or m (minutes), e.g. 500ms"


# -- the parser, sans-IO --------------------------------------------------------------


def test_each_field_has_the_unit_its_name_says() -> None:
    """Every Limits field, with its unit: a new field's unit is a reviewed line here."""
    assert {field: unit_of(field) for field in Limits.__struct_fields__} == {
        "wall_time_s": Unit.SECONDS, "stdout_max_bytes": Unit.BYTES,
        "stderr_max_bytes": Unit.BYTES, "cpu_time_s": Unit.SECONDS,
        "address_space_bytes": Unit.BYTES, "processes": Unit.COUNT,
        "open_files": Unit.COUNT, "file_size_bytes": Unit.BYTES,
        "scratch_bytes": Unit.BYTES, "memory_bytes": Unit.BYTES,
    }


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("256M", 256 * MiB, id="M-binary"),
    pytest.param("256m", 256 * MiB, id="m-any-case"),
    pytest.param("256MiB", 256 * MiB, id="MiB"),
    pytest.param("256MB", 256 * 10**6, id="MB-decimal"),
    pytest.param("256mb", 256 * 10**6, id="mb-decimal"),
    pytest.param("1K", KiB, id="K"),
    pytest.param("1k", KiB, id="k"),
    pytest.param("1KiB", KiB, id="KiB"),
    pytest.param("1KB", 1000, id="KB"),
    pytest.param("2G", 2 * GiB, id="G"),
    pytest.param("2GiB", 2 * GiB, id="GiB"),
    pytest.param("1GB", 10**9, id="GB"),
    pytest.param("512B", 512, id="B"),
    pytest.param("1.5K", 1536, id="fraction"),
    pytest.param(".5K", 512, id="leading-dot"),
    pytest.param("1.1K", 1126, id="rounded-down"),  # 1126.4, as Docker: whole bytes
    pytest.param("0.1GB", 10**8, id="exact-decimal"),
    pytest.param("1024", 1024, id="bare-int"),
    pytest.param("1.5", 1.5, id="bare-float"),  # as before units: Limits refuses it
    pytest.param("1e9", 1e9, id="bare-exponent"),
    pytest.param("-1", -1, id="bare-negative"),
])
def test_sizes(text: str, expected: int | float) -> None:
    value = parse_quantity(text, Unit.BYTES)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("500ms", 0.5, id="ms"),
    pytest.param("1ms", 0.001, id="one-ms"),
    pytest.param("2s", 2.0, id="s"),
    pytest.param("1m", 60.0, id="m-minutes"),
    pytest.param("1.5m", 90.0, id="fraction-of-a-minute"),
    pytest.param("0.3m", 18.0, id="exact"),  # 0.3 * 60.0 is 17.999999999999996 in floats
    pytest.param("0.1s", 0.1, id="tenth"),
    pytest.param("10", 10, id="bare-int"),  # Limits stores it as 10.0
    pytest.param("0.25", 0.25, id="bare-float"),
])
def test_times(text: str, expected: float) -> None:
    value = parse_quantity(text, Unit.SECONDS)
    assert value == expected
    assert type(value) is type(expected)


def test_every_suffix_multiplies_exactly() -> None:
    for suffix, size in BYTE_SUFFIXES.items():
        for written in {suffix, suffix.lower(), suffix.title()}:
            assert parse_quantity(f"3{written}", Unit.BYTES) == 3 * size, written
    for suffix, seconds in TIME_SUFFIXES.items():
        assert parse_quantity(f"3{suffix}", Unit.SECONDS) == float(3 * seconds)
    assert {"ms": Fraction(1, 1000), "s": 1, "m": 60} == TIME_SUFFIXES


@pytest.mark.parametrize(("text", "unit", "noun"), [
    ("256X", Unit.BYTES, "a size"), ("M", Unit.BYTES, "a size"), ("", Unit.BYTES, "a size"),
    ("256 M", Unit.BYTES, "a size"), ("1.2.3K", Unit.BYTES, "a size"),
    ("-1K", Unit.BYTES, "a size"), ("1s", Unit.BYTES, "a size"), ("1e3K", Unit.BYTES, "a size"),
    ("2M", Unit.SECONDS, "a time"), ("1h", Unit.SECONDS, "a time"),
    ("1S", Unit.SECONDS, "a time"), ("1K", Unit.SECONDS, "a time"),
    ("soon", Unit.SECONDS, "a time"), ("ms", Unit.SECONDS, "a time"),
    ("1K", Unit.COUNT, "a number"), ("two", Unit.COUNT, "a number"),
])
def test_anything_else_is_refused_naming_the_forms(text: str, unit: Unit, noun: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_quantity(text, unit)
    assert str(info.value) == f"{text!r} is not {noun}: give {FORMS[unit]}"


def test_the_forms_in_words() -> None:
    assert FORMS == {Unit.BYTES: SIZE_FORMS, Unit.SECONDS: TIME_FORMS,
                     Unit.COUNT: "a whole number N"}


def test_a_word_passes_where_it_is_allowed() -> None:
    assert parse_limit("address_space_bytes", "auto", words=("auto",)) == "auto"
    assert parse_limit("address_space_bytes", "6G", words=("auto",)) == 6 * GiB
    with pytest.raises(UnitError) as info:
        parse_limit("address_space_bytes", "none", words=("auto",))
    assert str(info.value) == f"'none' is not a size: give {SIZE_FORMS}, or 'auto'"
    with pytest.raises(UnitError):
        parse_limit("memory_bytes", "auto")


def test_parse_limit_reads_the_unit_of_the_name() -> None:
    assert parse_limit("memory_bytes", "1M") == MiB
    assert parse_limit("cpu_time_s", "1m") == 60.0
    with pytest.raises(UnitError):
        parse_limit("processes", "1m")


# -- the flags, parsed: nothing runs ----------------------------------------------------


@pytest.mark.parametrize(("flags", "expected"), [
    (["--memory-bytes", "256M"], Limits(memory_bytes=256 * MiB)),
    (["--memory-bytes", "256MB"], Limits(memory_bytes=256_000_000)),
    (["--memory", "6G"], Limits(address_space_bytes=6 * GiB)),
    (["--memory", "auto"], Limits(address_space_bytes="auto")),
    (["--file-size-bytes", "1G", "--file-size-bytes", "auto"], Limits(file_size_bytes="auto")),
    (["--stdout-cap", "1K", "--stderr-max-bytes", "2k"],
     Limits(stdout_max_bytes=1024, stderr_max_bytes=2048)),
    (["--scratch-bytes", "1G", "--file-size-bytes", "512M"],
     Limits(scratch_bytes=GiB, file_size_bytes=512 * MiB)),
    (["--timeout", "1m", "--cpu", "500ms"], Limits(wall_time_s=60.0, cpu_time_s=0.5)),
    (["--wall-time-s", "90s", "--cpu-time-s", "1.5m"], Limits(wall_time_s=90.0, cpu_time_s=90.0)),
    (["--timeout", "7.5", "--memory-bytes", str(256 * MiB), "--processes", "64"],
     Limits(wall_time_s=7.5, memory_bytes=256 * MiB, processes=64)),
])
@pytest.mark.parametrize("command", ["exec", "run"])
def test_limit_flags_take_units(command: str, flags: list[str], expected: Limits) -> None:
    target = ["--", "/bin/true"] if command == "exec" else ["echo"]
    assert parse([command, *flags, *target]).limits == expected


def test_a_suffixed_value_and_its_bare_number_are_the_same_limits() -> None:
    """Same Limits, field for field and type for type: the same rules version."""
    by_unit = parse(["exec", "--memory-bytes", "256M", "--timeout", "1m", "--", "true"]).limits
    bare = parse(["exec", "--memory-bytes", "268435456", "--timeout", "60", "--", "true"]).limits
    assert by_unit == bare
    assert type(by_unit.wall_time_s) is type(bare.wall_time_s) is float


@pytest.mark.parametrize(("flag", "value", "detail"), [
    ("--memory-bytes", "256X", f"'256X' is not a size: give {SIZE_FORMS}"),
    ("--stdout-cap", "1 K", f"'1 K' is not a size: give {SIZE_FORMS}"),
    ("--memory", "lots", f"'lots' is not a size: give {SIZE_FORMS}, or 'auto'"),
    ("--timeout", "2M", f"'2M' is not a time: give {TIME_FORMS}"),
    ("--cpu-time-s", "1h", f"'1h' is not a time: give {TIME_FORMS}"),
    ("--processes", "1K", "'1K' is not a number: give a whole number N"),
    # Read with its unit, then checked against the field's bounds, as before.
    ("--memory-bytes", "1M", "Expected `int` >= 33554432"),
    ("--timeout", "0ms", "Expected `float` > 0.0"),
    ("--timeout", "25h", "'25h' is not a time: give " + TIME_FORMS),
])
def test_a_bad_value_names_the_flag_as_typed_and_the_forms(
    flag: str, value: str, detail: str
) -> None:
    with pytest.raises(UsageError) as info:
        parse(["exec", flag, value, "--", "/bin/true"])
    assert str(info.value) == f"{flag}: {detail}"


def test_every_limit_flag_shows_its_unit_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["exec", "--help"])
    text = capsys.readouterr().out
    metavar = {Unit.BYTES: "SIZE", Unit.SECONDS: "TIME", Unit.COUNT: "N"}
    for field in Limits.__struct_fields__:
        assert f"{limit_flag(field)} {metavar[unit_of(field)]}" in text, field
    assert "default 1G (1073741824)" in text  # memory_bytes
    assert "default 32\n" in text  # processes: a count, no suffix
    assert " ".join(f"SIZE: {SIZE_FORMS}; TIME: {TIME_FORMS}.".split()) in " ".join(text.split())
