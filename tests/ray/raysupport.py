"""A real 2-node Ray cluster on this machine, one per test module.

Run by scripts/test-ray, in a venv with the `ray` extra: `import ray` here
fails the run where Ray is missing; nothing skips. Loopback only, nothing
leaves the machine: the nodes listen on 127.0.0.1, usage stats are off, and
the driver resolves its own address to loopback too
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray take 127.0.0.1 as this node's
address instead of the one it would route to the internet from). Each pass
(root, uid 65534) has its own Ray temp dir. The cluster ends through
`cluster.shutdown()`, then a SIGKILL by pid of any process that carries our
RAY_TMPDIR; never `ray stop`, which would end every Ray on the host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
# Before Ray is imported: it reads the address switch at import.
os.environ.update(ENV)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from support import jailed_under, scaled, wait_until  # noqa: E402
from trunner.ray import cluster  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from trunner.ray import wire
    from trunner.ray.router import Node, Spec

NODE_ARGS: dict[str, Any] = {
    "num_cpus": 1,
    "resources": {"trunner": 1},
    "object_store_memory": 100 * 1024 * 1024,
    "node_ip_address": "127.0.0.1",
}


class Nodes:
    """The cluster, its jail root, and what the tests do to its nodes."""

    def __init__(self, cluster: Cluster, jail_root: Path) -> None:
        self.cluster = cluster
        self.jail_root = jail_root
        self.worker = next(iter(cluster.worker_nodes))

    @property
    def head_id(self) -> str:
        node_id: str = self.cluster.head_node.node_id
        return node_id

    @property
    def worker_id(self) -> str:
        node_id: str = self.worker.node_id
        return node_id

    def worker_root(self) -> Path:
        """The jail root the worker node's actor uses (`options_for_worker`)."""
        root = self.jail_root / "worker"
        root.mkdir(exist_ok=True)
        return root

    def options_for_worker(self, **more: Any) -> dict[str, dict[str, Any]]:
        """`node_options` for the worker node: its own jail root (`worker_root`),
        and `more`."""
        return {self.worker_id: {"temp_root": str(self.worker_root()), **more}}

    def replace_worker(self) -> None:
        """A new worker node in place of one a test killed."""
        self.cluster.remove_node(self.worker, allow_graceful=False)
        self.worker = self.cluster.add_node(**NODE_ARGS)
        self.cluster.wait_for_nodes()


def raylet_pid(node: Any) -> int:
    pid: int = node.all_processes["raylet"][0].process.pid
    return pid


#: (pid, start time) of every actor this run's pools had (`own`): owners of
#: this run's cgroups, alive or dead.
_OWNERS: set[tuple[int, int]] = set()


def own(pool: Any) -> None:  # a ClusterPool or an AsyncioPool
    """Record `pool`'s actors (its `nodes`, live now) as owners of this
    run's cgroups, so that theirs still count as ours once they are dead."""
    for node in pool.nodes.values():
        if (start := _start_of(node.pid)) is not None:
            _OWNERS.add((node.pid, start))


def trunner_cgroups() -> set[str]:
    """The trunner run cgroups of this test run: of this process, of its
    cluster's live processes, and of the actors its pools had (`own`), dead
    or alive. Never another trunner's on the host (another test run beside
    this one, live or dead): a cgroup is named after its owner,
    `PID-START-PIDNS-…` (trunner.cleanup.owner_id)."""
    from trunner.linux import cgroup
    from trunner.linux.probe import probe_host

    limit = probe_host().process_limit
    if limit is None or limit.kind != "pids_cgroup":
        return set()
    base = Path(limit.cgroup_base, cgroup.DIR_NAME)
    names = {p.name for p in base.iterdir() if p.is_dir()} if base.is_dir() else set()
    live = {os.getpid(), *_carrying(os.environ.get("RAY_TMPDIR", ""))}
    ours = {(pid, start) for pid in live if (start := _start_of(pid)) is not None} | _OWNERS
    return {n for n in names if _owner_of(n) in ours}


def _owner_of(name: str) -> tuple[int, int] | None:
    pid, _, rest = name.partition("-")
    start = rest.partition("-")[0]
    return (int(pid), int(start)) if pid.isdigit() and start.isdigit() else None


def _start_of(pid: int) -> int | None:
    """A live process's start time (clock ticks after boot), as trunner
    names an owner by."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def leftovers(root: Path) -> list[str]:
    """Jail dirs (and owner dirs) under `root`, recursively one level."""
    return sorted(str(p) for p in root.rglob("trunner-*"))




def _carrying(tmpdir: str) -> list[int]:
    """Our uid's processes whose environment names `tmpdir` as RAY_TMPDIR."""
    if not tmpdir:
        return []
    needle = f"RAY_TMPDIR={tmpdir}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            continue
    return out


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    tmpdir = tempfile.mkdtemp(prefix="trunner-ray-", dir="/tmp")  # short: Ray's socket paths
    jail_root = Path(tempfile.mkdtemp(prefix="trunner-ray-jails-"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", tmpdir)
        cluster = Cluster(initialize_head=True,
                          head_node_args={**NODE_ARGS, "include_dashboard": False})
        try:
            cluster.add_node(**NODE_ARGS)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            yield Nodes(cluster, jail_root)
        finally:
            ray.shutdown()
            cluster.shutdown()
            deadline = time.monotonic() + scaled(10)
            while (left := _carrying(tmpdir)) and time.monotonic() < deadline:
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
            shutil.rmtree(tmpdir, ignore_errors=True)
            shutil.rmtree(jail_root, ignore_errors=True)
    assert not left, f"Ray processes outlived the cluster: {left}"


@pytest.fixture
def node_options(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """Per-node overrides, by Ray node id, of what the pools' actors start
    with: Runner options, and "limits". Fill it before a pool starts (or
    picks the node up): that node is then set up other than the rest, as a
    node of another install or config would be. The driver's
    `cluster.start_node` starts its actor with that spec (a test hook, kept
    out of trunner's own types)."""
    overrides: dict[str, dict[str, Any]] = {}
    start_node = cluster.start_node

    def start_overridden(spec: Spec, node_id: str) -> tuple[Node, wire.Hello]:
        override = dict(overrides.get(node_id, {}))
        if override:
            spec = dataclasses.replace(spec, limits=override.pop("limits", spec.limits),
                                       options={**spec.options, **override})
        return start_node(spec, node_id)

    monkeypatch.setattr(cluster, "start_node", start_overridden)
    return overrides


@pytest.fixture(autouse=True)
async def no_leaks(nodes: Nodes) -> AsyncIterator[None]:
    """Every test leaves no jailed process, jail dir or cgroup behind (the
    suite-wide check counts our child processes: here Ray's are ours)."""
    cgroups = trunner_cgroups()
    yield

    def left() -> str:
        return (f"jailed {jailed_under(str(nodes.jail_root))}, dirs {leftovers(nodes.jail_root)},"
                f" cgroups {sorted(trunner_cgroups() - cgroups)}")

    # A lost node's watchdog may still be at work.
    await wait_until(lambda: not jailed_under(str(nodes.jail_root))
                     and not leftovers(nodes.jail_root) and trunner_cgroups() <= cgroups,
                     10, lambda: "something was left behind: " + left())
