"""Shared fixtures: a real Runner, and a leak check around every test."""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path

    from trunner import Limits, Runner

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

#: tests/ray needs the `ray` extra and a Ray cluster: scripts/test-ray runs
#: it, in a venv of its own, with TRUNNER_TEST_RAY=1 (where `ray` is then
#: missing, the run fails: it does not skip).
collect_ignore = [] if os.environ.get("TRUNNER_TEST_RAY") == "1" else ["ray"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quiet-host", action="store_true",
        help="run only the tests marked quiet_host (host-wide figures: run them alone, serially,"
             " on a host nothing else loads); without it they are deselected")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `quiet_host` test asserts a host-wide figure that any other process
    moves: it runs in its own pass (`--quiet-host`), never in the default lane."""
    quiet = config.getoption("--quiet-host")
    keep = [item for item in items if bool(item.get_closest_marker("quiet_host")) == quiet]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def child_pids() -> list[int]:
    """Our child processes, not counting trunner's own watchdog."""
    from trunner.linux.watchdog import watchdog_pid

    pids: list[int] = []
    for path in glob.glob("/proc/self/task/*/children"):
        try:
            with open(path) as f:
                pids += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            continue  # a thread (trio's worker threads retire) ended while we looked
    return [p for p in pids if p != watchdog_pid()]


def cgroup_dirs() -> set[str]:
    """This process's run cgroups, in every hierarchy runs get one in."""
    from support import ALL_CONTROLLERS, run_cgroups_of
    from trunner.cleanup import owner_id

    # Only this process's: cgroup names start with its owner id (pid, start
    # time, PID namespace: another trunner may have had this pid).
    return set(run_cgroups_of(owner_id(), ALL_CONTROLLERS))


@pytest.fixture
def jail_root(tmp_path: Path) -> Path:
    root = tmp_path / "jails"
    root.mkdir()
    return root


@pytest.fixture(autouse=True)
def no_leaks(jail_root: Path) -> Iterator[None]:
    """Every test leaves no fd, child process, jail dir or cgroup behind."""
    from trunner.linux.watchdog import ensure_running

    ensure_running()  # one per parent process, started once: not a leak
    fds, cgroups = open_fds(), cgroup_dirs()
    yield
    from support import scaled
    from trunner.linux import ids

    assert child_pids() == [], "a child process outlived the test"
    # A host id stays held (its lock and a pidfd) until its run's pid 1 has
    # exited, which may take past the run's end on a busy host.
    assert ids.settle(scaled(10)) == 0, "a run's pid 1 outlived it by 10 s"
    assert open_fds() == fds, "an fd leaked"
    assert list(jail_root.iterdir()) == [], "a jail dir was left behind"
    assert cgroup_dirs() == cgroups, "a cgroup was left behind"


#: Test-only knob: cap the Landlock ABI the jail uses (as on an older kernel).
#: `.ci/run` runs tests/security with it at 1, 3, 4 and 6.
LANDLOCK_ABI_VAR = "TRUNNER_TEST_LANDLOCK_ABI"


def landlock_cap() -> int | None:
    """The Landlock ABI cap of this test run (TRUNNER_TEST_LANDLOCK_ABI), or None."""
    value = os.environ.get(LANDLOCK_ABI_VAR, "")
    return int(value) if value else None


def landlock_abi_in_force() -> int:
    """The ABI the test runners' jails use: the cap, else the kernel's (at most the
    highest trunner knows)."""
    from trunner.linux.landlock import KNOWN_ABI
    from trunner.linux.probe import probe_host

    cap = landlock_cap()
    return min(probe_host().landlock_abi if cap is None else cap, KNOWN_ABI)


def make_runner(
    *,
    import_paths: Sequence[str] = (),
    temp_root: str | None = None,
    limits: Limits | None = None,
    provider: Mapping[str, Any] | None = None,
    binds: Sequence[str | tuple[str, str]] = (),
    etc: Sequence[str] = (),
    root: str | None = None,
    root_statement: str | None = None,
) -> Runner:
    """A `Runner` as a caller builds one, at the test run's Landlock ABI cap;
    under TRUNNER_TEST_VIA_POOL=1 a `support.PooledRunner`, whose every run
    and exec is served through `runner.pool(...)`, under
    TRUNNER_TEST_VIA_WARM=1 a `support.WarmRunner` (`runner.warm()`)."""
    from support import VIA_POOL, VIA_WARM, PooledRunner, WarmRunner
    from trunner import Runner
    from trunner.linux.backend import LinuxBackend
    from trunner.linux.profile import DEFAULT_PROFILE, provider_profile
    from trunner.worker import locate_worker

    cls = PooledRunner if VIA_POOL else WarmRunner if VIA_WARM else Runner
    cap = landlock_cap()
    if cap is None:
        return cls(import_paths=import_paths, temp_root=temp_root, limits=limits,
                   provider=provider, binds=binds, etc=etc, root=root,
                   root_statement=root_statement)
    backend = LinuxBackend(
        locate_worker(),
        import_paths=tuple(os.path.abspath(p) for p in import_paths),
        profile=DEFAULT_PROFILE if provider is None else provider_profile(provider),
        landlock_abi=cap,
        binds=binds,
        etc=etc,
        root=root,
        root_statement=root_statement,
    )
    return cls(temp_root=temp_root, limits=limits, backend=backend)


@pytest.fixture
def runner(jail_root: Path) -> Runner:
    from support import scaled
    from trunner import Limits

    # A safety cap, not what a test measures: a slow host gets more.
    return make_runner(
        import_paths=[TESTS_DIR], temp_root=str(jail_root),
        limits=Limits(wall_time_s=scaled(20.0)),
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Keep the reason of a skip or xfail raised inside an async test:
    pytest-trio unwraps it from trio's exception group with a bare
    `pytest.skip()`/`pytest.xfail()`, whose context is that group."""
    try:
        return (yield)
    except (pytest.skip.Exception, pytest.xfail.Exception) as bare:
        group = bare.__context__
        if bare.msg or not isinstance(group, BaseExceptionGroup):
            raise
        leaves = list(_leaves(group))
        if len(leaves) == 1 and type(leaves[0]) is type(bare):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _leaves(e)
        else:
            yield e
