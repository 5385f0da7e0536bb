"""Who the jail is on the host (issue 10, item 1): a root caller's jail runs
as an unprivileged host uid/gid (default 65534, `LinuxBackend(jail_ids=)`),
groups cleared, never host uid 0; anyone else's runs as the caller. Inside,
the process is its own uid, mapped to itself."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from conftest import TESTS_DIR
from support import run_code
from trunner import Runner
from trunner.linux.backend import LinuxBackend
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from pathlib import Path

root_only = pytest.mark.skipif(os.getuid() != 0, reason="a root caller's identity drop (not root:"
                               " jails run as the caller)")

WHO = """
result = {"ids": [os.getresuid(), os.getresgid()], "groups": os.getgroups(),
          "uid_map": open("/proc/self/uid_map").read().split(),
          "gid_map": open("/proc/self/gid_map").read().split(),
          "status": {k: v.split() for k, v in (line.split(":", 1)
                     for line in open("/proc/self/status")) if k in ("Uid", "Gid", "CapEff")}}
"""


async def test_the_jail_runs_as_the_planned_host_ids(runner: Runner) -> None:
    """The uid map says which host uid the jail is: `inside host 1`."""
    uid = 65534 if os.getuid() == 0 else os.getuid()
    gid = 65534 if os.getuid() == 0 else os.getgid()
    who = await run_code(runner, WHO)
    assert who["ids"] == [[uid] * 3, [gid] * 3]
    assert who["uid_map"] == [str(uid), str(uid), "1"]
    assert who["gid_map"] == [str(gid), str(gid), "1"]
    assert who["status"]["CapEff"] == ["0000000000000000"]
    if os.getuid() == 0:
        assert who["groups"] in ([], [gid])  # root's supplementary groups cleared


@root_only
async def test_jail_ids_are_configurable(jail_root: Path) -> None:
    backend = LinuxBackend(locate_worker(), import_paths=(TESTS_DIR,), jail_ids=(4242, 4343))
    runner = Runner(temp_root=str(jail_root), backend=backend)
    who = await run_code(runner, WHO)
    assert who["ids"] == [[4242] * 3, [4343] * 3]
    assert who["uid_map"] == ["4242", "4242", "1"]


def test_jail_ids_of_zero_are_refused() -> None:
    for ids in ((0, 65534), (65534, 0)):
        with pytest.raises(ValueError, match="never runs as host uid or gid 0"):
            LinuxBackend(locate_worker(), jail_ids=ids)


@root_only
async def test_a_root_only_file_in_view_is_not_readable(tmp_path: Path, jail_root: Path) -> None:
    """Before: the jail was host uid 0 (caps dropped), so every root-owned file
    in view was readable by its owner. A 0600 root file in an import path:"""
    secret = tmp_path / "secret.txt"
    secret.write_text("root's only")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    runner = Runner(temp_root=str(jail_root), import_paths=[TESTS_DIR, str(tmp_path)])
    result = await run_code(runner, f"""
        result = [attempt(lambda: open({str(secret)!r}).read()),
                  attempt(lambda: os.stat({str(secret)!r}).st_uid)]
    """)
    assert result[0] == "EACCES"
    assert result[1] == "OK:65534"  # host root is not mapped: it shows as the overflow uid
    assert secret.read_text() == "root's only"
