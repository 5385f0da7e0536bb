"""The command fits the shell (issue 35, item 6), run as a user runs it: the
real `trunner` command, a real process, real jailed runs.

- `exec --stdin -` feeds the caller's stdin, `--stdin-file PATH` a file's
  bytes, `--stdin TEXT` the text;
- limit flags take units (the parser itself: tests/test_cli_units.py);
- every subcommand's `--help` says what it does, and `run --help` lists the
  built-in and registered modes;
- a successful `exec` prints no `limit`;
- docs/cli.md's shell session runs as written.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support import wait_until
from trunner.cli import BUILTIN_HELP, build_parser
from trunner.kernel.abi import BUILTIN_MODES
from trunner.protocol import EXEC_INPUT_MAX_BYTES

BIN = os.path.dirname(sys.executable)
TRUNNER = os.path.join(BIN, "trunner")
ROOT = Path(__file__).resolve().parent.parent

#: A successful exec's JSON, key for key, in order.
EXEC_KEYS = ["exit_code", "signal", "stdout", "stderr", "files", "unmatched", "elapsed_s",
             "usage", "rules_version"]


def trunner(*args: str, jail_root: Path, stdin: bytes | None = b"",
            env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """The real command: its exit code, its stdout's one JSON object, its stderr."""
    done = subprocess.run(
        [TRUNNER, *args], input=stdin, capture_output=True, timeout=120,
        stdin=subprocess.DEVNULL if stdin is None else None,
        env={**os.environ, "TMPDIR": str(jail_root), **(env or {})})
    out = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, out, done.stderr.decode()


# -- stdin ------------------------------------------------------------------------------


def test_stdin_dash_feeds_the_callers_stdin_as_bytes(jail_root: Path) -> None:
    """Before: the program read the literal `-`."""
    data = bytes(range(256)) + b"-\n\xff\x00"  # not UTF-8: passed as it is
    code, out, err = trunner("exec", "--stdin", "-", "--", "cat", jail_root=jail_root,
                             stdin=data)
    assert code == 0, err
    assert base64.b64decode(out["stdout"]) == data
    assert out["exit_code"] == 0


def test_stdin_dash_with_nothing_on_stdin_is_empty(jail_root: Path) -> None:
    code, out, err = trunner("exec", "--text", "--stdin", "-", "--", "wc", "-c",
                             jail_root=jail_root, stdin=None)
    assert (code, out["stdout"]) == (0, "0\n"), err


def test_stdin_text_is_fed_as_utf8(jail_root: Path) -> None:
    code, out, err = trunner("exec", "--text", "--stdin", "-x é", "--", "cat",
                             jail_root=jail_root, stdin=b"not this")
    assert (code, out["stdout"]) == (0, "-x é"), err


def test_stdin_file_feeds_a_files_bytes(jail_root: Path, tmp_path: Path) -> None:
    data = b"\x00\xff-\n" * 1000
    (tmp_path / "in.bin").write_bytes(data)
    (tmp_path / "dash.txt").write_bytes(b"-")  # a literal dash, as --help says
    code, out, err = trunner("exec", "--stdin-file", str(tmp_path / "in.bin"), "--", "cat",
                             jail_root=jail_root, stdin=b"not this")
    assert code == 0, err
    assert base64.b64decode(out["stdout"]) == data
    code, out, err = trunner("exec", "--text", "--stdin-file", str(tmp_path / "dash.txt"),
                             "--", "cat", jail_root=jail_root)
    assert (code, out["stdout"]) == (0, "-"), err


def test_stdin_refusals_name_the_flag(jail_root: Path, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    code, out, err = trunner("exec", "--stdin-file", missing, "--", "cat", jail_root=jail_root)
    detail = f"--stdin-file {missing!r}: No such file or directory"
    assert (code, out) == (2, {"error": "usage", "detail": detail})
    assert err == f"trunner: error: {detail}\n"
    code, out, err = trunner("exec", "--exit-code", "--stdin-file", str(tmp_path), "--", "cat",
                             jail_root=jail_root)
    assert (code, out) == (125, {"error": "usage",
                                 "detail": f"--stdin-file {str(tmp_path)!r}: Is a directory"})
    code, out, err = trunner("exec", "--stdin", "x", "--stdin-file", missing, "--", "cat",
                             jail_root=jail_root)
    assert (code, out) == (2, {})
    assert err.endswith(
        "trunner exec: error: argument --stdin-file: not allowed with argument --stdin\n")


def test_stdin_over_the_exec_bound_is_a_usage_error(jail_root: Path, tmp_path: Path) -> None:
    over = b"x" * (EXEC_INPUT_MAX_BYTES + 1)
    code, out, _ = trunner("exec", "--stdin", "-", "--", "cat", jail_root=jail_root, stdin=over)
    assert (code, out) == (2, {"error": "usage", "detail": (
        f"--stdin -: stdin is over {EXEC_INPUT_MAX_BYTES} bytes, the most exec takes")})
    (tmp_path / "big").write_bytes(over)
    code, out, _ = trunner("exec", "--stdin-file", str(tmp_path / "big"), "--", "cat",
                           jail_root=jail_root)
    assert (code, out) == (2, {"error": "usage", "detail": (
        f"--stdin-file {str(tmp_path / 'big')!r}: over {EXEC_INPUT_MAX_BYTES} bytes, the most"
        " exec takes")})
    # Exactly the bound is fed whole.
    code, out, err = trunner("exec", "--text", "--stdin", "-", "--", "wc", "-c",
                             jail_root=jail_root, stdin=over[:-1])
    assert (code, out["stdout"]) == (0, f"{EXEC_INPUT_MAX_BYTES}\n"), err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
async def test_a_signal_while_reading_stdin_ends_it_as_a_run(
    jail_root: Path, sig: signal.Signals
) -> None:
    """A writer that never closes the pipe: the signal still ends the command,
    128 + n, with its JSON, and no jail was made."""
    cli = subprocess.Popen(  # noqa: ASYNC220  polled below; its pipes read once it exited
        [TRUNNER, "exec", "--stdin", "-", "--", "cat"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(jail_root)})
    try:
        def reading() -> bool:
            assert cli.poll() is None
            # Its reader thread: started once the signal handlers are in place.
            return len(os.listdir(f"/proc/{cli.pid}/task")) > 1

        await wait_until(reading, 30, "the CLI reading its stdin")
        cli.send_signal(sig)
        await wait_until(lambda: cli.poll() is not None, 10, "the CLI's exit")
        assert cli.stdout is not None
        assert cli.stderr is not None
        assert cli.returncode == 128 + sig, cli.stderr.read()
        assert json.loads(cli.stdout.read()) == {"error": "signal",
                                                 "detail": f"cancelled by {sig.name}"}
        assert list(jail_root.iterdir()) == []
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait()
        for stream in (cli.stdin, cli.stdout, cli.stderr):
            if stream is not None:
                stream.close()


# -- units, in real runs ----------------------------------------------------------------


def test_a_size_with_a_unit_is_the_cap(jail_root: Path) -> None:
    code, out, err = trunner("exec", "--stdout-cap", "1K", "--", "head", "-c", "1024",
                             "/dev/zero", jail_root=jail_root)
    assert code == 0, err
    assert base64.b64decode(out["stdout"]) == bytes(1024)
    code, out, _ = trunner("exec", "--stdout-cap", "1K", "--", "head", "-c", "1025",
                           "/dev/zero", jail_root=jail_root)
    assert (code, out["error"]) == (1, "stdout_cap")
    code, out, _ = trunner("exec", "--stdout-cap", "1KB", "--", "head", "-c", "1001",
                           "/dev/zero", jail_root=jail_root)
    assert (code, out["error"]) == (1, "stdout_cap")  # KB is 1000


def test_file_size_with_a_unit_bounds_a_file(jail_root: Path) -> None:
    code, out, err = trunner("exec", "--text", "--file-size-bytes", "1K", "--", "sh", "-c",
                             "head -c 4096 /dev/zero > f; stat -c %s f", jail_root=jail_root)
    assert (code, out["exit_code"], out["stdout"]) == (0, 0, "1024\n"), err


def test_times_with_units_are_the_limits(jail_root: Path) -> None:
    code, out, _ = trunner("exec", "--timeout", "500ms", "--", "sleep", "5",
                           jail_root=jail_root)
    assert (code, out["error"]) == (1, "timeout")
    assert out["detail"] == "the program ran past its wall time of 0.5 s"
    code, out, _ = trunner("exec", "--cpu", "300ms", "--timeout", "1m", "--", sys.executable,
                           "-c", "while True: pass", jail_root=jail_root)
    assert (code, out["error"]) == (1, "cpu_time")
    assert out["usage"]["cpu_user_s"] + out["usage"]["cpu_sys_s"] >= 0.3


def test_a_unit_and_its_bare_number_run_under_one_rules_version(jail_root: Path) -> None:
    versions = set()
    for memory, timeout in (("256M", "1m"), ("268435456", "60")):
        code, out, err = trunner("exec", "--memory-bytes", memory, "--timeout", timeout,
                                 "--", "true", jail_root=jail_root)
        assert code == 0, err
        versions.add(out["rules_version"])
    assert len(versions) == 1
    code, out, err = trunner("exec", "--", "true", jail_root=jail_root)
    assert out["rules_version"] not in versions  # the limits do enter it


def test_a_bad_unit_is_a_usage_error_naming_the_flag_and_forms(jail_root: Path) -> None:
    """Before: `--memory-bytes: Expected `int`, got `str``."""
    detail = ("--memory-bytes: '256X' is not a size: give N bytes, or N with K, M, G"
              " (KiB, MiB, GiB) or KB, MB, GB (decimal), e.g. 256M")
    code, out, err = trunner("exec", "--memory-bytes", "256X", "--", "true",
                             jail_root=jail_root)
    assert (code, out) == (2, {"error": "usage", "detail": detail})
    assert err == f"trunner: error: {detail}\n"
    code, out, _ = trunner("exec", "--exit-code", "--cpu", "1h", "--", "true",
                           jail_root=jail_root)
    assert (code, out) == (125, {"error": "usage", "detail": (
        "--cpu: '1h' is not a time: give N seconds, or N with ms, s or m (minutes),"
        " e.g. 500ms")})
    code, out, _ = trunner("run", "echo", "--processes", "1K", jail_root=jail_root)
    assert (code, out) == (2, {"error": "usage",
                               "detail": "--processes: '1K' is not a number: give a whole"
                                         " number N"})


def test_run_takes_units_too(jail_root: Path) -> None:
    code, out, err = trunner("run", "echo", "--request", "[1]", "--timeout", "30s",
                             "--memory-bytes", "512M", "--stdout-cap", "64K",
                             jail_root=jail_root)
    assert (code, out["response"]) == (0, [1]), err


# -- the JSON: no `limit` ------------------------------------------------------------------


def test_a_successful_exec_prints_no_limit(jail_root: Path) -> None:
    """Before: `"limit": null` in every result, never anything else."""
    for argv in (["true"], ["sh", "-c", "exit 3"], ["sh", "-c", "kill -9 $$"]):
        code, out, err = trunner("exec", "--", *argv, jail_root=jail_root)
        assert code == 0, err
        assert list(out) == EXEC_KEYS, argv


# -- --help ---------------------------------------------------------------------------


def _subparsers() -> dict[str, Any]:
    import argparse

    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_subcommand_and_every_flag_says_what_it_is() -> None:
    """Before: `exec --help` and `run --help` had no description; `mode`,
    `argv` and `doctor --json` had no help."""
    subs = _subparsers()
    assert sorted(subs) == ["doctor", "exec", "run"]
    for name, parser in subs.items():
        assert parser.description, name
        for action in parser._actions:
            assert action.help, (name, action.dest)


def test_each_subcommands_help_opens_with_what_it_does() -> None:
    expected = {
        "run": "Run MODE on one request in a fresh jail and print one JSON object:"
               ' {"response": ..., "usage": ..., "rules_version": ...}.',
        "exec": "Run ARGV (after --) inside a fresh jail, in its working dir, and print how"
                " it ended as one JSON object: exit_code, signal, stdout, stderr (base64, or"
                " text with --text), files, unmatched, elapsed_s, usage, rules_version.",
        "doctor": "Check what this host supports, layer by layer, and whether a run would"
                  " work: exit 0 if it would, 1 if not (the refusal names the fix).",
    }
    for name, description in expected.items():
        done = subprocess.run([TRUNNER, name, "--help"], capture_output=True, text=True,
                              timeout=60, check=True)
        paragraphs = done.stdout.split("\n\n")
        assert " ".join(paragraphs[1].split()) == description, name


def test_every_builtin_mode_has_its_help() -> None:
    assert tuple(BUILTIN_HELP) == BUILTIN_MODES


def test_run_help_lists_the_builtin_and_registered_modes(tmp_path: Path) -> None:
    """A real distribution's metadata on the path, registering two modes."""
    site = tmp_path / "site"
    dist = site / "trunner_help_modes-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: trunner-help-modes\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[trunner.modes]\nslow-sleep = children:sleep\ngrade = judge.modes:grade\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([TRUNNER, "run", "--help"], capture_output=True, text=True,
                          timeout=60, check=True, env=env)
    modes = done.stdout.split("\nmodes:\n", 1)[1]
    assert modes == (
        "  built in:\n"
        "    echo        gives the request back as its response\n"
        "    exec        runs a program (an ExecRequest); 'trunner exec' is its command line\n"
        "    files       reads, writes, exports and imports the working dir's files (a"
        " FilesRequest)\n"
        "  registered (entry points in group 'trunner.modes'):\n"
        "    grade       judge.modes:grade\n"
        "    slow-sleep  children:sleep\n"
        "  or PACKAGE.MODULE:FUNCTION, found on --import-path or in site-packages\n")
    from importlib.metadata import entry_points

    if not entry_points(group="trunner.modes"):  # none installed here: it says so
        done = subprocess.run([TRUNNER, "run", "--help"], capture_output=True, text=True,
                              timeout=60, check=True)
        assert "  registered (entry points in group 'trunner.modes'):\n    (none here)\n" in (
            done.stdout)


# -- docs/cli.md's session, as written ---------------------------------------------------


def _session() -> list[tuple[str, list[str]]]:
    """docs/cli.md's `console` blocks: each `$ ` command with the lines it prints."""
    text = (ROOT / "docs" / "cli.md").read_text()
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```console\n(.*?)^```", text, re.M | re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
    return steps


def test_the_docs_session_runs_as_written(jail_root: Path, tmp_path: Path) -> None:
    """Each shown line is the JSON printed; `, ...` stands for keys left out."""
    steps = _session()
    assert len(steps) >= 7
    env = {**os.environ, "TMPDIR": str(jail_root), "PATH": f"{BIN}:{os.environ['PATH']}"}
    for command, shown in steps:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=env)
        printed = done.stdout.splitlines()
        assert len(printed) == len(shown), (command, done.stdout, done.stderr)
        for line, expected in zip(printed, shown, strict=True):
            whole = not expected.endswith(", ...}")
            want = json.loads(expected.replace(", ...}", "}"))
            got = json.loads(line)
            assert (got if whole else {k: got.get(k) for k in want}) == want, command
