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

from support import jailed_under, wait_until  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

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
        return {self.worker_id: {"temp_root": str(self.worker_root()), **more}}

    def replace_worker(self) -> None:
        """A new worker node in place of one a test killed."""
        self.cluster.remove_node(self.worker, allow_graceful=False)
        self.worker = self.cluster.add_node(**NODE_ARGS)
        self.cluster.wait_for_nodes()


def raylet_pid(node: Any) -> int:
    pid: int = node.all_processes["raylet"][0].process.pid
    return pid


def trunner_cgroups() -> set[str]:
    """The trunner run cgroups on the host of this test and its cluster, and
    of dead owners."""
    from trunner.linux import cgroup
    from trunner.linux.probe import probe_host

    limit = probe_host().process_limit
    if limit is None or limit.kind != "pids_cgroup":
        return set()
    base = Path(limit.cgroup_base, cgroup.DIR_NAME)
    names = {p.name for p in base.iterdir() if p.is_dir()} if base.is_dir() else set()
    # Not another test suite's, running beside this one: a cgroup whose owner
    # lives and is neither this process nor one of this cluster's.
    ours = {os.getpid(), *_carrying(os.environ.get("RAY_TMPDIR", ""))}
    return {n for n in names
            if int(n.split("-", 1)[0]) in ours or not os.path.exists(f"/proc/{n.split('-')[0]}")}


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
            deadline = time.monotonic() + 10
            while (left := _carrying(tmpdir)) and time.monotonic() < deadline:
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
            shutil.rmtree(tmpdir, ignore_errors=True)
            shutil.rmtree(jail_root, ignore_errors=True)
    assert not left, f"Ray processes outlived the cluster: {left}"


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
