"""The command line without traps: a flag per `Limits` field, errors naming
the flag, one exit-code convention, `--env`, `--exit-code`, `python -m
trunner`.

Flags are checked in-process: `trunner.cli.parse` (argv -> what would run,
nothing run) and `trunner.cli.main` itself, the command's own function,
whose runs are real jailed children. A few runs are the real `trunner`
command end to end (tests/test_cli.py has more)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

import pytest

from trunner import Limits
from trunner.cli import LIMIT_ALIASES, UsageError, limit_flag, main, parse

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    #: `cli(*argv)`: `main(argv)` in this process -> (exit code, stdout's JSON, stderr).
    Cli = Callable[..., tuple[int, dict[str, Any], str]]

TRUNNER = os.path.join(os.path.dirname(sys.executable), "trunner")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], jail_root: Path,
        monkeypatch: pytest.MonkeyPatch) -> Cli:
    """`main(argv)` as the `trunner` command runs it: its return value, or
    the code argparse exits with, is the exit code. Its jail dirs go under
    `jail_root` (the leak check's), as under TMPDIR=jail_root."""
    monkeypatch.setattr(tempfile, "tempdir", str(jail_root))

    def call(*argv: str) -> tuple[int, dict[str, Any], str]:
        code: int | str | None
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's own error: the command exits with it
            code = e.code
        out, err = capsys.readouterr()
        assert isinstance(code, int), (code, err)
        return code, json.loads(out) if out.strip() else {}, err

    return call


def run(*args: str, module: bool = False) -> tuple[int, dict[str, object], str]:
    """The real `trunner` command (or `python -m trunner`), end to end."""
    cmd = [sys.executable, "-m", "trunner"] if module else [TRUNNER]
    out = subprocess.run([*cmd, *args], capture_output=True, timeout=120, text=True)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


# -- flags, parsed: nothing runs ------------------------------------------------------


def test_every_limits_field_has_a_flag_with_its_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse(["exec", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for field in Limits.__struct_fields__:
        assert limit_flag(field) in text, field
    for aliases in LIMIT_ALIASES.values():
        for alias in aliases:
            assert alias in text


def _value(field: str) -> object:
    """A valid value for `field` other than its default."""
    value = {"address_space_bytes": 2 << 30, "wall_time_s": 7.5,
             "file_size_bytes": 100 << 20}.get(field)
    if value is None:
        default = getattr(Limits(), field)
        value = default * 2 if isinstance(default, int) else default + 1
    return value


@pytest.mark.parametrize("field", Limits.__struct_fields__)
@pytest.mark.parametrize("command", ["exec", "run"])
def test_each_limit_flag_reaches_the_limits(command: str, field: str) -> None:
    """Each flag's value is the field's, and only that field's: the Limits
    the command would run with are `Limits(field=value)`."""
    value = _value(field)
    target = ["--", "/bin/true"] if command == "exec" else ["echo"]
    args = parse([command, limit_flag(field), str(value), *target])
    expected = Limits.from_mapping({field: value})
    assert expected != Limits()
    assert args.limits == expected


def test_no_limit_flag_is_the_default_limits() -> None:
    assert parse(["exec", "--", "/bin/true"]).limits == Limits()
    assert parse(["run", "echo"]).limits == Limits()


@pytest.mark.parametrize(("field", "alias"), [
    (field, alias) for field, aliases in LIMIT_ALIASES.items() for alias in aliases])
def test_each_alias_means_its_field(field: str, alias: str) -> None:
    value = str(_value(field))
    by_alias = parse(["exec", alias, value, "--", "/bin/true"]).limits
    by_name = parse(["exec", limit_flag(field), value, "--", "/bin/true"]).limits
    assert by_alias == by_name == Limits.from_mapping({field: _value(field)})


def test_the_alias_meanings() -> None:
    assert LIMIT_ALIASES == {
        "wall_time_s": ("--timeout",), "stdout_max_bytes": ("--stdout-cap",),
        "stderr_max_bytes": ("--stderr-cap",), "cpu_time_s": ("--cpu",),
        "address_space_bytes": ("--memory",)}


def test_memory_is_the_address_space_limit_not_the_cgroup() -> None:
    by_alias = parse(["exec", "--memory", str(2 << 30), "--", "/bin/true"]).limits
    by_name = parse(["exec", "--address-space-bytes", str(2 << 30), "--", "/bin/true"]).limits
    assert by_alias == by_name == Limits(address_space_bytes=2 << 30)
    assert by_alias.memory_bytes == Limits().memory_bytes
    assert parse(["exec", "--memory", "auto", "--", "/bin/true"]).limits == Limits(
        address_space_bytes="auto")


@pytest.mark.parametrize(("flag", "value"), [
    ("--wall-time-s", "-1"), ("--timeout", "-1"), ("--timeout", "soon"), ("--cpu", "0"),
    ("--memory", "1"), ("--memory-bytes", "1"), ("--processes", "0"), ("--open-files", "x"),
])
def test_a_bad_limit_names_the_flag_typed_and_exits_2(
    cli: Cli, flag: str, value: str
) -> None:
    with pytest.raises(UsageError) as info:
        parse(["exec", flag, value, "--", "/bin/true"])
    assert str(info.value).startswith(f"{flag}: ")
    assert "$." not in str(info.value)
    code, out, err = cli("exec", flag, value, "--", "/bin/true")
    assert (code, out) == (2, {"error": "usage", "detail": str(info.value)})
    assert flag in err


def test_env_items_parse_to_the_programs_variables() -> None:
    args = parse(["exec", "--env", "A=1", "--env", "B=x=y", "--env", "A=2", "--env", "LANG=C",
                  "--", "/bin/sh"])
    assert args.env == {"A": "2", "B": "x=y", "LANG": "C"}  # the last one given wins
    assert parse(["exec", "--", "/bin/sh"]).env == {}
    for bad in ("NOEQUALS", "=x"):
        with pytest.raises(UsageError) as info:
            parse(["exec", "--env", bad, "--", "/bin/true"])
        assert str(info.value) == f"--env {bad!r}: expected NAME=VALUE"


# -- exit codes and JSON: main() in-process, real jailed runs ------------------------


def test_exit_codes_one_convention(cli: Cli) -> None:
    code, out, _ = cli("exec", "--", "/bin/sh", "-c", "exit 3")
    assert (code, out["exit_code"]) == (0, 3)  # trunner's answer, whatever the program's exit
    assert "error" not in out
    code, out, _ = cli("exec", "--timeout", "0.5", "--", "sleep", "5")
    assert (code, out["error"]) == (1, "timeout")  # a RunnerError
    code, _, err = cli("exec", "--no-such-flag", "--", "/bin/true")
    assert code == 2  # argparse's usage error
    assert "--no-such-flag" in err
    code, out, _ = cli("exec", "--env", "NOEQUALS", "--", "/bin/true")
    assert (code, out["error"]) == (2, "usage")
    assert out["detail"] == "--env 'NOEQUALS': expected NAME=VALUE"
    code, out, _ = cli("exec", "--file", "/abs=/etc/hostname", "--", "/bin/true")
    assert (code, out["error"]) == (1, "bad_request")  # the runner's refusal
    assert "'/abs' is absolute" in out["detail"]
    code, out, _ = cli("run", "echo", "--request", "{bad")
    assert (code, out["error"]) == (2, "usage")
    assert str(out["detail"]).startswith("--request: ")
    code, out, _ = cli("run", "echo", "--import-path", "/no/such/dir")
    assert (code, out["error"]) == (2, "usage")
    assert str(out["detail"]).startswith("--import-path: ")


@pytest.mark.parametrize(("argv", "expected"), [
    (["/bin/sh", "-c", "exit 0"], 0), (["/bin/sh", "-c", "exit 3"], 3),
    (["/bin/sh", "-c", "exit 200"], 200), (["/bin/sh", "-c", "kill -9 $$"], 128 + 9),
    (["no-such-program"], 127), (["/etc/hostname"], 126),
])
def test_exit_code_propagates_the_programs_own(
    cli: Cli, argv: list[str], expected: int
) -> None:
    code, out, _ = cli("exec", "--exit-code", "--", *argv)
    assert code == expected
    assert "error" not in out


def test_exit_code_keeps_trunners_failures_apart(
    cli: Cli
) -> None:
    code, out, _ = cli("exec", "--exit-code", "--timeout", "0.5", "--", "sleep", "5")
    assert (code, out["error"]) == (124, "timeout")
    code, out, _ = cli("exec", "--exit-code", "--stdout-cap", "10", "--", "/bin/sh", "-c",
                       "yes | head -c 1000")
    assert (code, out["error"]) == (125, "stdout_cap")
    code, out, _ = cli("exec", "--exit-code", "--timeout", "-1", "--", "/bin/true")
    assert (code, out["error"]) == (125, "usage")
    assert str(out["detail"]).startswith("--timeout: ")
    code, _, err = cli("exec", "--exit-code", "--no-such-flag", "--", "/bin/true")
    assert code == 125  # argparse's error too, under --exit-code
    assert "--no-such-flag" in err
    code, _, _ = cli("exec", "--no-such-flag", "--", "--exit-code")
    assert code == 2  # the program's argument, not trunner's flag


def test_the_json_carries_usage_on_a_result_and_on_a_failure(
    cli: Cli
) -> None:
    code, out, _ = cli("exec", "--", sys.executable, "-c", "sum(range(10**6))")
    assert code == 0
    usage = out["usage"]
    assert isinstance(usage, dict), out
    assert usage["cpu_user_s"] > 0, out
    code, out, _ = cli("exec", "--cpu", "0.3", "--", sys.executable, "-c", "while True: pass")
    assert (code, out["error"]) == (1, "cpu_time")
    usage = out["usage"]
    assert isinstance(usage, dict), out
    assert usage["cpu_user_s"] + usage["cpu_sys_s"] >= 0.3, out
    code, out, _ = cli("run", "echo", "--request", "1")
    assert (code, out["response"]) == (0, 1)
    assert isinstance(out["usage"], dict), out
    assert out["usage"]["wall_s"] > 0, out


def test_env_flag_sets_the_programs_variables(
    cli: Cli
) -> None:
    code, out, _ = cli("exec", "--text", "--env", "A=1", "--env", "B=x=y", "--env", "A=2",
                       "--env", "LANG=C", "--", "/bin/sh", "-c", 'echo "$A $B $LANG"')
    assert code == 0
    assert out["stdout"] == "2 x=y C\n"  # the last one given wins
    code, out, _ = cli("exec", "--env", "1BAD=x", "--", "/bin/true")
    assert (code, out["error"]) == (1, "bad_request")
    assert "1BAD" in out["detail"]


# -- the real command, end to end ------------------------------------------------------


def test_the_command_exits_with_the_convention() -> None:
    """The exit code a process sees: main's return value, argparse's exit,
    and the program's own under --exit-code."""
    code, out, _ = run("exec", "--exit-code", "--", "/bin/sh", "-c", "exit 3")
    assert (code, out["exit_code"]) == (3, 3)
    assert "error" not in out
    code, out, err = run("exec", "--exit-code", "--timeout", "-1", "--", "/bin/true")
    assert (code, out["error"]) == (125, "usage")
    assert "--timeout" in err
    code, _, err = run("exec", "--no-such-flag", "--", "/bin/true")
    assert code == 2
    assert "--no-such-flag" in err
    code, _, err = run("exec", "--exit-code", "--no-such-flag", "--", "/bin/true")
    assert code == 125
    assert "--no-such-flag" in err


def test_python_dash_m_trunner_is_the_command() -> None:
    code, out, _ = run("exec", "--text", "--", "/bin/sh", "-c", "echo hi", module=True)
    assert (code, out["stdout"]) == (0, "hi\n")
    code, out, _ = run("run", "echo", "--request", "[1]", module=True)
    assert (code, out["response"]) == (0, [1])


# -- host problems under the right reason ---------------------------------------------


def test_an_unusable_libseccomp_is_a_layer_that_does_not_hold(tmp_path: Path) -> None:
    """A broken pyseccomp install (one that cannot load libseccomp.so.2, as on
    a host without libseccomp2) shadows the real one in the parent: doctor
    says the seccomp layer does not hold, a run fails `sandbox_setup` naming it."""
    (tmp_path / "pyseccomp.py").write_text(
        'raise OSError("libseccomp.so.2: cannot open shared object file")\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def trunner(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TRUNNER, *args], capture_output=True, text=True, timeout=120,
                              env=env)

    doctor = trunner("doctor", "--json")
    assert doctor.returncode == 1, doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["can_run"] is False
    assert report["refusal"] == "sandbox_setup"
    seccomp = report["layers"]["seccomp"]
    assert not seccomp["holds"]
    assert "libseccomp.so.2" in seccomp["detail"]
    text = trunner("doctor")
    assert "seccomp: DOES NOT HOLD: libseccomp" in text.stdout
    assert "Traceback" not in text.stderr
    done = trunner("exec", "--", "/bin/true")
    assert done.returncode == 1
    out = json.loads(done.stdout)
    assert out["error"] == "sandbox_setup"
    assert out["detail"].startswith("seccomp: ")
    assert "libseccomp.so.2" in out["detail"]
