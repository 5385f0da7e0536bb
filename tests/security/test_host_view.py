"""What the jail could learn about the host before its own PID and mount
namespaces (issue 10, item 9): host pids through pidfd_open and kill(pid, 0),
host paths through stat, getxattr and readlink, and the whole checkout of an
editable install. Each probe now finds nothing of the host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from conftest import TESTS_DIR
from support import run_code
from trunner.linux.probe import package_dir, trunner_dir

if TYPE_CHECKING:
    from trunner import Runner

async def test_pidfd_open_reaches_only_the_jails_own_pids(runner: Runner) -> None:
    """Before: pidfd_open on any host pid (and PIDFD_GET_INFO) listed every
    host process. The host pids here are real, live, and well inside the
    range probed."""
    host = [os.getpid(), os.getppid(), 1]
    result = await run_code(runner, f"""
        own = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        opened = []
        for pid in range(1, {max(host) + 2}):
            try:
                os.close(os.pidfd_open(pid))
                opened.append(pid)
            except OSError as e:
                assert e.errno == errno.ESRCH, e
        result = {{"own": own, "opened": opened}}
    """)
    assert set(result["opened"]) <= set(result["own"]) | {max(result["own"]) + 1}
    assert 1 in result["opened"]  # the jail's own pid 1, not the host's init
    assert not ({os.getpid(), os.getppid()} - set(result["own"])) & set(result["opened"])


async def test_kill_zero_tells_no_host_pid_from_a_free_one(runner: Runner) -> None:
    """Before: kill(pid, 0) gave EPERM for a live host pid, ESRCH for a free one."""
    victim = subprocess.Popen(  # noqa: ASYNC220  a host process to look for, killed below
        [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = await run_code(runner, f"""
            own = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            answers = {{}}
            for pid in range(1, {victim.pid + 2}):
                try:
                    os.kill(pid, 0)
                    answers[pid] = "OK"
                except OSError as e:
                    answers[pid] = errno.errorcode[e.errno]
            result = {{"own": own, "live": [p for p, a in answers.items() if a != "ESRCH"]}}
        """)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
    assert victim.pid not in result["live"] or victim.pid in result["own"]
    # Only the jail's own processes answer (its pid 1, itself, a child or two).
    assert set(result["live"]) <= set(result["own"]) | set(range(1, 5))


async def test_host_paths_give_enoent_to_stat_getxattr_and_readlink(
    runner: Runner, tmp_path: Path
) -> None:
    """Before: stat, getxattr and readlink worked on any host path."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to("/etc/shadow")
    paths = [str(tmp_path / "file"), str(tmp_path / "link"), str(tmp_path), "/etc/shadow",
             "/root/.bashrc", "/var/log", "/home"]
    result = await run_code(runner, f"""
        out = {{}}
        for path in {paths!r}:
            out[path] = [attempt(lambda: os.stat(path).st_mode),
                         attempt(lambda: os.readlink(path)),
                         attempt(lambda: os.getxattr(path, "user.x"))]
        result = out
    """)
    for path in paths[:5]:
        assert result[path] == ["ENOENT"] * 3, (path, result[path])
    assert result["/var/log"] == ["ENOENT"] * 3
    # /home holds only the jail's own working dir (its scratch).
    assert result["/home"][0].startswith("OK:")


async def test_an_editable_checkout_shows_only_the_package(runner: Runner) -> None:
    """Before: with an editable install the whole checkout was readable
    (.git/config, tests/, pyproject.toml). Now only trunner's package dir is
    bound (and the import paths the runner names: here tests/)."""
    root = trunner_dir()
    probes = [os.path.join(root, name) for name in (".git", "pyproject.toml", "README.md",
                                                    "scripts", "benchmarks")]
    probes = [p for p in probes if os.path.exists(p)]
    if not probes:  # scripts/test-installed: the wheel's package, not a checkout
        pytest.skip(f"trunner is imported from {root}, not a checkout")
    result = await run_code(runner, f"""
        result = {{p: attempt(lambda: os.stat(p).st_mode) for p in {probes!r}}}
        result["package"] = attempt(lambda: sorted(os.listdir({package_dir()!r}))[:1])
        result["tests"] = attempt(lambda: os.path.isdir({TESTS_DIR!r}))
    """)
    for path in probes:
        assert result[path] == "ENOENT", path
    assert result["package"].startswith("OK:")
    assert result["tests"] == "OK:True"


async def test_boot_command_line_and_kernel_config_read_empty(runner: Runner) -> None:
    """Before: /proc/cmdline and /proc/config.gz gave the host's boot command line
    and kernel build config. Now they are masked (/dev/null over each, as container
    runtimes mask that class of file); /proc/stat, /proc/loadavg and /proc/pressure
    stay readable, for ps and top (docs/jail.md: what it still sees of the host)."""
    cmdline = Path("/proc/cmdline").read_bytes().strip()
    assert cmdline  # the host has one to hide
    has_config = os.path.exists("/proc/config.gz")
    kept = [p for p in ("/proc/stat", "/proc/loadavg", "/proc/pressure/cpu") if os.path.exists(p)]
    result = await run_code(runner, f"""
        def read(path):
            with open(path, "rb") as f:
                return f.read().hex()
        result = {{p: attempt(lambda: read(p))
                   for p in ("/proc/cmdline", "/proc/config.gz", *{kept!r})}}
    """)
    assert result["/proc/cmdline"] == "OK:''"
    # A kernel without CONFIG_IKCONFIG_PROC has no config.gz to hide.
    assert result["/proc/config.gz"] == ("OK:''" if has_config else "ENOENT")
    assert cmdline.hex() not in repr(result)
    for path in kept:
        assert result[path].startswith("OK:'"), (path, result[path])
        assert result[path] != "OK:''", path


async def test_proc_self_cgroup_shows_no_host_path(runner: Runner) -> None:
    """Before: /proc/self/cgroup named the run's host cgroup, with the parent's pid
    in it (`/trunner/<pid>-<id>`), and the caller's own cgroup path. The jail has
    its own cgroup namespace, unshared after the helper joined the run's cgroups:
    every hierarchy shows the jail at its root, "/"."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    host_paths = {line.split(":", 2)[2] for line in lines} - {"/"}
    result = await run_code(runner, """
        with open("/proc/self/cgroup") as f:
            result = f.read()
    """)
    lines = result.splitlines()
    assert lines
    assert all(line.split(":", 2)[2] == "/" for line in lines), result
    assert f"{os.getpid()}-" not in result
    assert not any(path in result for path in host_paths), (host_paths, result)
