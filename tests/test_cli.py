"""The `trunner` command, mode lookup, and signals as cancellation, as a user
runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from conftest import TESTS_DIR, child_pids
from support import group_alive, is_alive, wait_until
from trunner import (
    Reason,
    Runner,
    RunnerError,
    cancel_on_signals,
    locate_worker,
)
from trunner.jail import HostSupport, ProcessLimit

if TYPE_CHECKING:
    from pathlib import Path

TRUNNER = os.path.join(os.path.dirname(sys.executable), "trunner")


def cli(*args: str, stdin: bytes = b"") -> tuple[int, dict[str, object]]:
    out = subprocess.run([TRUNNER, *args], input=stdin, capture_output=True, timeout=120)
    return out.returncode, json.loads(out.stdout)


def test_exec_prints_one_json_object() -> None:
    code, out = cli("exec", "--text", "--", "/bin/sh", "-c", "echo hi; echo no >&2; exit 4")
    assert code == 0
    assert (out["exit_code"], out["stdout"], out["stderr"]) == (4, "hi\n", "no\n")
    assert len(str(out["rules_version"])) == 64


def test_run_with_request_json_and_error_output(tmp_path: Path) -> None:
    code, out = cli("run", "echo", "--request", '{"a": [1, 2]}')
    assert (code, out["response"]) == (0, {"a": [1, 2]})
    code, out = cli("run", "echo", "--request", "-", stdin=b'"from stdin"')
    assert (code, out["response"]) == (0, "from stdin")
    code, out = cli("run", "children:sleep", "--import-path", TESTS_DIR, "--request", "30",
                    "--timeout", "1")
    assert (code, out["error"]) == (1, "timeout")
    code, out = cli("exec", "--timeout", "-1", "--", "/bin/true")
    assert (code, out["error"]) == (2, "usage")
    assert str(out["detail"]).startswith("--timeout: ")  # the flag typed, not $.wall_time_s


def test_locate_worker_finds_the_binary_inside_the_package() -> None:
    import trunner.worker

    path = locate_worker()
    assert path == os.path.join(os.path.dirname(trunner.worker.__file__), "trunner-worker")
    assert os.access(path, os.X_OK)
    with open(path, "rb") as f:
        assert b"python" in f.readline()  # so it runs under this interpreter, -I -S


def test_the_worker_runs_under_this_interpreter() -> None:
    """-I -S for the helper and a built-in mode; -P, with site, for a user mode."""
    from trunner.linux.backend import LinuxBackend
    from trunner.linux.probe import trunner_dir

    worker = locate_worker()
    backend = LinuxBackend(worker)
    path = ("--path", trunner_dir())
    assert backend.helper_launch() == (sys.executable, "-I", "-S", worker, *path)
    assert backend.adapter_argv("echo", builtin=True) == (
        sys.executable, "-I", "-S", worker, *path, "echo")
    assert backend.adapter_argv("pkg.mod:fn", builtin=False) == (
        sys.executable, "-P", worker, *path, "pkg.mod:fn")


def test_version_is_one_string_everywhere() -> None:
    import trunner

    version = trunner.__version__
    assert [part.isdigit() for part in version.split(".")] == [True, True, True]
    for argv in ([os.path.join(os.path.dirname(sys.executable), "trunner"), "--version"],
                 [sys.executable, "-m", "trunner", "--version"]):
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        assert done.stdout == f"trunner {version}\n", argv
    from importlib.metadata import version as installed

    assert installed("trunner-sandbox") == version


async def test_entry_point_modes_resolve_and_run(
    jail_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real distribution's metadata on sys.path, registering a mode.
    dist = tmp_path / "site" / "trunner_test_modes-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: trunner-test-modes\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text("[trunner.modes]\nslow-sleep = children:sleep\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    # Each Runner reads the entry points once, at its first lookup.
    runner = Runner(temp_root=str(jail_root), import_paths=[TESTS_DIR])
    assert runner.resolve_mode("slow-sleep") == "children:sleep"
    assert (await runner.run("slow-sleep", 0.01)).response == "slept"
    with pytest.raises(RunnerError) as info:
        runner.resolve_mode("not-registered")
    assert info.value.reason is Reason.UNKNOWN_MODE


# -- SIGTERM and SIGINT: cancellation, cleanup, 128+signal ---------------------


def _jailed_sleep(cli_pid: int) -> int | None:
    """The pid of a `sleep` descended from the CLI `cli_pid`, if one runs (its cwd
    and pid inside are the jail's own: found by ancestry)."""
    parents: dict[int, int] = {}
    sleeps: list[int] = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                comm, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        parents[int(entry)] = int(rest.split()[1])
        if comm.endswith("(sleep"):
            sleeps.append(int(entry))
    for pid in sleeps:
        ancestor = pid
        while ancestor > 1 and ancestor != cli_pid:
            ancestor = parents.get(ancestor, 0)
        if ancestor == cli_pid and is_alive(pid):
            return pid
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
async def test_a_signalled_cli_cleans_up_and_exits_128_plus_the_signal(
    jail_root: Path, sig: signal.Signals
) -> None:
    """Before: SIGTERM ended the CLI on the spot and its jail dir stayed."""
    # A plain Popen, polled: the test reads its pipes synchronously once it has exited.
    cli = subprocess.Popen(  # noqa: ASYNC220
        [TRUNNER, "exec", "--timeout", "60", "--", "/bin/sleep", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(jail_root)},
    )
    try:
        def sleeping() -> int | None:
            assert cli.poll() is None, cli.stderr.read() if cli.stderr else ""
            return _jailed_sleep(cli.pid)

        sleeper = await wait_until(sleeping, 60, "the jailed sleep")
        cli.send_signal(sig)
        await wait_until(lambda: cli.poll() is not None, 10, "the CLI's exit")
        assert cli.stdout is not None
        assert cli.stderr is not None
        out = json.loads(cli.stdout.read())
        assert cli.returncode == 128 + sig, cli.stderr.read()
        assert out == {"error": "signal", "detail": f"cancelled by {sig.name}"}
        assert not is_alive(sleeper)
        assert list(jail_root.iterdir()) == []  # removed by the CLI itself, before its exit
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait()
        for stream in (cli.stdout, cli.stderr):
            if stream is not None:
                stream.close()


async def test_cancel_on_signals_cancels_the_runs_and_tells_the_signal(
    runner: Runner, jail_root: Path
) -> None:
    seen: list[int] = []

    async def signal_once_running() -> None:
        seen.extend(await wait_until(child_pids, 30, "a child process"))
        os.kill(os.getpid(), signal.SIGINT)  # a real signal to this process

    async with cancel_on_signals() as stop, trio.open_nursery() as nursery:
        nursery.start_soon(signal_once_running)
        await runner.run("children:sleep", 1000)
    assert stop.signal is signal.SIGINT
    assert stop.exit_code == 130
    assert stop.cancel_scope.cancelled_caught
    assert seen
    assert not any(is_alive(p) or group_alive(p) for p in seen)
    assert list(jail_root.iterdir()) == []


async def test_cancel_on_signals_lets_the_body_errors_through_unwrapped(runner: Runner) -> None:
    with pytest.raises(RunnerError) as info:
        async with cancel_on_signals() as stop:
            await runner.run("children:run_code", "import os; os._exit(3)")
    assert (info.value.reason, info.value.exit_status) == (Reason.NONZERO_EXIT, 3)
    assert stop.signal is None
    assert stop.exit_code is None


async def test_cancel_on_signals_around_a_body_that_never_checkpoints() -> None:
    """Its watcher then first runs after the receiver closed (this crashed
    trio with a TrioInternalError, as `trunner exec --timeout -1` did)."""
    async with cancel_on_signals() as stop:
        pass
    await trio.testing.wait_all_tasks_blocked()  # the watcher has run and ended
    assert stop.signal is None
    assert not stop.cancel_scope.cancelled_caught


# -- doctor: layer by layer ---------------------------------------------------------

HOST_KEYS = ("platform", "is_root", "uid", "gid", "landlock_abi", "seccomp_filter",
             "user_namespaces", "network_namespaces", "process_limit", "refusal",
             "refusal_detail", "rules_version", "worker", "can_run")
LAYERS = {"namespaces", "landlock", "seccomp", "process_limit", "memory", "cgroup_view", "identity",
          "provider_profile"}


def test_doctor_reports_each_layer_in_json_and_text() -> None:
    from trunner.kernel.install import landlock_abi
    from trunner.linux.landlock import KNOWN_ABI, features_for_abi

    code, out = cli("doctor", "--json")
    assert code == 0
    assert set(HOST_KEYS) <= set(out)
    layers: Any = out["layers"]
    assert set(layers) == LAYERS
    assert [name for name, layer in layers.items() if not layer["holds"]] == []
    kernel = landlock_abi()
    landlock = layers["landlock"]
    assert landlock["kernel_abi"] == out["landlock_abi"] == kernel
    assert landlock["abi_used"] == min(kernel, KNOWN_ABI)
    assert landlock["features"] == features_for_abi(min(kernel, KNOWN_ABI))
    assert layers["namespaces"]["available"] == ["user", "net", "mount", "pid", "ipc", "uts",
                                                 "cgroup"]
    text = subprocess.run([TRUNNER, "doctor"], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    lines = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
             for line in text.stdout.splitlines() if ":" in line}
    assert lines["can_run"] == "yes"
    # A person's text: no reprs, no empty fields.
    assert not any(c in text.stdout for c in "{}[]")
    assert not any(word in text.stdout.split() for word in ("None", "True", "False"))
    assert all(value for value in lines.values())
    assert lines["landlock"].startswith(f"holds: ABI {min(kernel, KNOWN_ABI)} in use")
    assert lines["seccomp"] == "holds"
    assert lines["provider_profile"] == "can run"


def _host(abi: int, namespaces: tuple[str, ...]) -> HostSupport:
    return HostSupport(platform="linux", is_root=False, uid=1000, gid=1000, landlock_abi=abi,
                       seccomp_filter=True, user_namespaces=True, network_namespaces=True,
                       process_limit=ProcessLimit("rlimit_nproc"), namespaces=namespaces)


ALL_NS = ("user", "net", "mount", "pid", "ipc", "uts", "cgroup")
SCOPES = ["scope_abstract_unix_socket", "scope_signal"]


@pytest.mark.parametrize(
    ("kernel", "cap", "missing"),
    [(7, None, []), (7, 6, []), (7, 4, ["ioctl_dev", *SCOPES]),
     (3, None, ["tcp", "ioctl_dev", *SCOPES]),
     (1, None, ["refer", "truncate", "tcp", "ioctl_dev", *SCOPES])],
)
def test_doctor_layers_name_what_covers_a_missing_feature(
    kernel: int, cap: int | None, missing: list[str]
) -> None:
    """The pure report from plain host facts: older kernels (and caps) list each
    Landlock feature they lack with the layer that covers it."""
    from trunner.linux.doctor import host_layers

    layers = host_layers(_host(kernel, ALL_NS), cap)
    landlock = layers["landlock"]
    assert landlock["holds"]
    assert landlock["abi_used"] == (cap or kernel)
    assert list(landlock["covered_by_other_layers"]) == missing
    assert [f for f, on in landlock["features"].items() if not on] == missing
    provider = layers["provider_profile"]
    assert provider["holds"] == ("tcp" not in missing
                                 and "scope_abstract_unix_socket" not in missing)
    if not provider["holds"]:
        assert "needs " in provider["detail"]


def test_doctor_layers_without_landlock_or_a_namespace() -> None:
    from trunner.linux.doctor import host_layers

    layers = host_layers(_host(0, tuple(n for n in ALL_NS if n != "pid")))
    assert layers["namespaces"] == {"holds": False, "available": ["user", "net", "mount", "ipc",
                                                                  "uts", "cgroup"],
                                    "missing": ["pid"]}
    assert not layers["landlock"]["holds"]
    assert not any(layers["landlock"]["features"].values())
    assert not layers["provider_profile"]["holds"]
    # A cap above what the kernel has does not hold either.
    assert not host_layers(_host(5, ALL_NS), 6)["landlock"]["holds"]


def test_a_reader_that_left_is_no_traceback(jail_root: Path) -> None:
    """`trunner exec ... | head`: stdout's reader gone before the answer."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "trunner"), "exec", "--",
             "/bin/echo", "hi"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
            env={**os.environ, "TMPDIR": str(jail_root)})
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")
    assert os.listdir(jail_root) == []
