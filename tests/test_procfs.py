"""`trunner.procfs`, the parent's one reader of /proc: real processes, and
mountinfo as the kernel writes it (escapes, optional fields)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trunner import procfs


def _gone_pid() -> int:
    """The pid of a process that ran and is reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_live_process_and_a_gone_one() -> None:
    me = os.getpid()
    fields = procfs.stat(me)
    assert fields[procfs.STATE] in (b"R", b"S")
    assert not procfs.exited(fields)
    assert procfs.parent(me) == os.getppid()
    assert procfs.start_time(me) == int(Path(f"/proc/{me}/stat").read_text().split()[21])
    ticks = procfs.cpu_ticks(me)
    assert ticks is not None
    assert min(ticks) >= 0
    assert procfs.status(me)["Pid"] == str(me)
    assert procfs.ns_pid(me) > 0
    assert procfs.peak_rss_bytes(me) > 1 << 20
    assert me in procfs.pids()
    assert procfs.cgroups() == procfs.cgroups(me) != {}
    gone = _gone_pid()
    assert (procfs.stat(gone), procfs.start_time(gone), procfs.parent(gone),
            procfs.cpu_ticks(gone), procfs.status(gone), procfs.ns_pid(gone),
            procfs.peak_rss_bytes(gone), procfs.children(gone), procfs.cgroups(gone)) == (
        [], None, 0, None, {}, 0, 0, [], {})
    assert procfs.exited([])


#: Names itself `) 1 2 (x` (PR_SET_NAME), says so, and waits.
ODD_NAME = ("import ctypes, sys; ctypes.CDLL(None).prctl(15, b') 1 2 (x', 0, 0, 0);"
            " print('named', flush=True); sys.stdin.read()")


def test_a_command_with_parentheses_and_spaces_and_a_zombie() -> None:
    child = subprocess.Popen([sys.executable, "-c", ODD_NAME], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"named\n"
        assert procfs.status(child.pid)["Name"] == ") 1 2 (x"
        fields = procfs.stat(child.pid)
        assert fields[procfs.STATE] in (b"R", b"S")
        assert procfs.parent(child.pid) == os.getpid()
        assert int(fields[procfs.PGRP]) == os.getpgrp()
        assert child.pid in procfs.children(os.getpid())
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped
        assert procfs.exited(procfs.stat(child.pid))
    finally:
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def test_mountinfo_as_the_kernel_writes_it(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/root rw\n"
        "35 22 0:30 / /sys/fs/cgroup/cpu,cpuacct ro,nosuid shared:9 - cgroup cgroup"
        " rw,cpu,cpuacct\n"
        "40 22 0:33 / /mnt/a\\040b\\011c\\134d rw master:2 - tmpfs none rw,size=4k\n"
        "not a mountinfo line\n")
    found = [(m.point, m.options, m.fstype, m.super_options)
             for m in procfs.mounts(str(mountinfo))]
    assert found == [
        ("/", "rw,relatime", "ext4", "rw"),
        ("/sys/fs/cgroup/cpu,cpuacct", "ro,nosuid", "cgroup", "rw,cpu,cpuacct"),
        ("/mnt/a b\tc\\d", "rw", "tmpfs", "rw,size=4k"),
    ]
    assert procfs.mounts(str(tmp_path / "missing")) == []
    assert "/proc" in {m.point for m in procfs.mounts()}
