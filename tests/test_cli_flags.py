"""The command line without traps: a flag per `Limits` field, errors naming
the flag, one exit-code convention, `--env`, `--exit-code`, `python -m
trunner`. Every run is a real jailed child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import msgspec
import pytest

from trunner import Limits
from trunner.cli import LIMIT_ALIASES, limit_flag

if TYPE_CHECKING:
    from pathlib import Path

TRUNNER = os.path.join(os.path.dirname(sys.executable), "trunner")


def run(*args: str, module: bool = False) -> tuple[int, dict[str, object], str]:
    cmd = [sys.executable, "-m", "trunner"] if module else [TRUNNER]
    out = subprocess.run([*cmd, *args], capture_output=True, timeout=120, text=True)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def test_every_limits_field_has_a_flag_with_its_name() -> None:
    done = subprocess.run([TRUNNER, "exec", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    text = done.stdout
    for field in Limits.__struct_fields__:
        assert limit_flag(field) in text, field
    for aliases in LIMIT_ALIASES.values():
        for alias in aliases:
            assert alias in text


@pytest.mark.parametrize("field", Limits.__struct_fields__)
def test_each_limit_flag_reaches_the_limits(field: str) -> None:
    """Each flag's value is the field's: the rules version of a run with the
    flag is that of `Limits(field=value)`."""
    from trunner import Runner

    value = {"address_space_bytes": 2 << 30, "wall_time_s": 7.5}.get(field)
    if value is None:
        default = getattr(Limits(), field)
        value = default * 2 if isinstance(default, int) else default + 1
    limits = msgspec.convert({field: value}, Limits)
    if field == "cpu_time_s" and limits.cpu_time_s > limits.wall_time_s:
        limits = limits.replace(wall_time_s=float(limits.cpu_time_s))
    flags = [limit_flag(field), str(value)]
    if limits.wall_time_s != Limits().wall_time_s and field != "wall_time_s":
        flags += ["--wall-time-s", str(limits.wall_time_s)]
    code, out, err = run("exec", *flags, "--", "/bin/true")
    assert code == 0, (out, err)
    assert out["rules_version"] == Runner().rules_version(limits)


@pytest.mark.parametrize(("flag", "value"), [
    ("--wall-time-s", "-1"), ("--timeout", "-1"), ("--timeout", "soon"), ("--cpu", "0"),
    ("--memory", "1"), ("--memory-bytes", "1"), ("--processes", "0"), ("--open-files", "x"),
])
def test_a_bad_limit_names_the_flag_typed_and_exits_2(flag: str, value: str) -> None:
    code, out, err = run("exec", flag, value, "--", "/bin/true")
    assert (code, out["error"]) == (2, "usage")
    assert str(out["detail"]).startswith(f"{flag}: ")
    assert "$." not in str(out["detail"])
    assert flag in err


def test_memory_is_the_address_space_limit_not_the_cgroup() -> None:
    from trunner import Runner

    _, by_alias, _ = run("exec", "--memory", str(2 << 30), "--", "/bin/true")
    _, by_name, _ = run("exec", "--address-space-bytes", str(2 << 30), "--", "/bin/true")
    expected = Runner().rules_version(Limits(address_space_bytes=2 << 30))
    assert by_alias["rules_version"] == by_name["rules_version"] == expected


def test_exit_codes_one_convention() -> None:
    code, out, _ = run("exec", "--", "/bin/sh", "-c", "exit 3")
    assert (code, out["exit_code"]) == (0, 3)  # trunner's answer, whatever the program's exit
    code, out, _ = run("exec", "--timeout", "0.5", "--", "sleep", "5")
    assert (code, out["error"]) == (1, "timeout")  # a RunnerError
    code, _, err = run("exec", "--no-such-flag", "--", "/bin/true")
    assert code == 2  # argparse's usage error
    assert "--no-such-flag" in err
    code, out, _ = run("exec", "--env", "NOEQUALS", "--", "/bin/true")
    assert (code, out["error"]) == (2, "usage")
    code, out, _ = run("exec", "--file", "/abs=/etc/hostname", "--", "/bin/true")
    assert (code, out["error"]) == (1, "bad_request")  # the runner's refusal
    code, out, _ = run("run", "echo", "--request", "{bad")
    assert (code, out["error"]) == (2, "usage")
    assert str(out["detail"]).startswith("--request: ")
    code, out, _ = run("run", "echo", "--import-path", "/no/such/dir")
    assert (code, out["error"]) == (2, "usage")
    assert str(out["detail"]).startswith("--import-path: ")


@pytest.mark.parametrize(("argv", "expected"), [
    (["/bin/sh", "-c", "exit 0"], 0), (["/bin/sh", "-c", "exit 3"], 3),
    (["/bin/sh", "-c", "exit 200"], 200), (["/bin/sh", "-c", "kill -9 $$"], 128 + 9),
    (["no-such-program"], 127), (["/etc/hostname"], 126),
])
def test_exit_code_propagates_the_programs_own(argv: list[str], expected: int) -> None:
    code, out, _ = run("exec", "--exit-code", "--", *argv)
    assert code == expected
    assert "error" not in out


def test_exit_code_keeps_trunners_failures_apart() -> None:
    code, out, _ = run("exec", "--exit-code", "--timeout", "0.5", "--", "sleep", "5")
    assert (code, out["error"]) == (124, "timeout")
    code, out, _ = run("exec", "--exit-code", "--stdout-cap", "10", "--", "/bin/sh", "-c",
                       "yes | head -c 1000")
    assert (code, out["error"]) == (125, "stdout_cap")
    code, out, _ = run("exec", "--exit-code", "--timeout", "-1", "--", "/bin/true")
    assert (code, out["error"]) == (125, "usage")
    code, _, _ = run("exec", "--exit-code", "--no-such-flag", "--", "/bin/true")
    assert code == 125  # argparse's error too, under --exit-code


def test_the_json_carries_usage_on_a_result_and_on_a_failure() -> None:
    code, out, _ = run("exec", "--", sys.executable, "-c", "sum(range(10**6))")
    assert code == 0
    usage = out["usage"]
    assert isinstance(usage, dict), out
    assert usage["cpu_user_s"] > 0, out
    code, out, _ = run("exec", "--cpu", "0.3", "--", sys.executable, "-c", "while True: pass")
    assert (code, out["error"]) == (1, "cpu_time")
    usage = out["usage"]
    assert isinstance(usage, dict), out
    assert usage["cpu_user_s"] + usage["cpu_sys_s"] >= 0.3, out
    code, out, _ = run("run", "echo", "--request", "1")
    assert (code, out["response"]) == (0, 1)
    assert isinstance(out["usage"], dict), out
    assert out["usage"]["wall_s"] > 0, out


def test_env_flag_sets_the_programs_variables() -> None:
    code, out, _ = run("exec", "--text", "--env", "A=1", "--env", "B=x=y", "--env", "A=2",
                       "--env", "LANG=C", "--", "/bin/sh", "-c", 'echo "$A $B $LANG"')
    assert code == 0
    assert out["stdout"] == "2 x=y C\n"  # the last one given wins
    code, out, _ = run("exec", "--env", "1BAD=x", "--", "/bin/true")
    assert (code, out["error"]) == (1, "bad_request")


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
