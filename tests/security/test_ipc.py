"""SysV IPC and POSIX message queues: allowed by the filter, since the jail has
an IPC namespace of its own. What the host or another run holds must be out
of its reach: not found, not removed, not changed."""

from __future__ import annotations

import ctypes
import errno
import os
from typing import TYPE_CHECKING

import pytest
import trio

from support import READY, jail_ready, let_go, run_code

if TYPE_CHECKING:
    from collections.abc import Iterator

    from trunner import Runner

IPC_CREAT, IPC_EXCL, IPC_RMID, IPC_STAT = 0o1000, 0o2000, 0, 2
KEY = 0x7472756E  # "trun"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _call(nr: int, *args: object) -> int:
    rc = int(_libc.syscall(nr, *args))
    if rc == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return rc


SHMGET, SHMAT, SHMCTL, SHMDT = 29, 30, 31, 67
MSGGET, MSGSND, MSGCTL = 68, 69, 71
MQ_OPEN, MQ_UNLINK = 240, 241


class HostIpc:
    """A SysV shared memory segment (holding b"host"), a message queue (one
    message) and a POSIX message queue, made in the test's IPC namespace."""

    def __init__(self, key: int, mq_name: bytes) -> None:
        """Raises OSError (EEXIST if the key or the name is another process's,
        on this host), leaving nothing made."""
        self.key, self.mq_name = key, mq_name
        self.shm = self.msg = -1
        try:
            self.shm = _call(SHMGET, key, 4096, IPC_CREAT | IPC_EXCL | 0o666)
            addr = _call(SHMAT, self.shm, None, 0)
            ctypes.memmove(addr, b"host", 4)
            _call(SHMDT, ctypes.c_void_p(addr))
            self.msg = _call(MSGGET, key, IPC_CREAT | IPC_EXCL | 0o666)
            message = ctypes.create_string_buffer((1).to_bytes(8, "little") + b"host")  # mtype 1
            _call(MSGSND, self.msg, message, 4, 0)
            os.close(_call(MQ_OPEN, mq_name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666, None))
        except OSError:
            self.remove(mqueue=False)  # what it made (an mqueue that failed is not its own)
            raise

    def state(self) -> tuple[bytes, int, int]:
        """The segment's bytes, the queue's message count, the mqueue's presence."""
        addr = _call(SHMAT, self.shm, None, 0o10000)  # SHM_RDONLY
        data = ctypes.string_at(addr, 4)
        _call(SHMDT, ctypes.c_void_p(addr))
        stat = ctypes.create_string_buffer(256)  # struct msqid_ds
        _call(MSGCTL, self.msg, IPC_STAT, stat)
        qnum = int.from_bytes(stat.raw[80:88], "little")  # msg_qnum on x86_64
        fd = _call(MQ_OPEN, self.mq_name, os.O_RDONLY, 0, None)
        os.close(fd)
        return data, qnum, 1

    def remove(self, *, mqueue: bool = True) -> None:
        """Remove what it made (`mqueue`: its mqueue too); what is gone already is fine."""
        def quietly(nr: int, *args: object) -> None:
            try:
                _call(nr, *args)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EIDRM, errno.ENOENT):
                    raise

        if self.shm >= 0:
            quietly(SHMCTL, self.shm, IPC_RMID, None)
        if self.msg >= 0:
            quietly(MSGCTL, self.msg, IPC_RMID, None)
        if mqueue:
            quietly(MQ_UNLINK, self.mq_name)


@pytest.fixture
def host_ipc() -> Iterator[HostIpc]:
    """Objects under a key and a name no other process of this host holds
    (the host's IPC namespace is shared: another test run makes its own)."""
    for i in range(100):
        key = KEY + (os.getpid() + i) % 100_000
        try:
            ipc = HostIpc(key, b"trunner-host-%d-%d" % (os.getpid(), i))
            break
        except OSError as e:
            if e.errno != errno.EEXIST:
                raise
    else:
        raise AssertionError("100 IPC keys in use: a leak of earlier runs?")
    try:
        yield ipc
    finally:
        ipc.remove()


# In the jail: every way to reach an object by its key or name (ids are per
# namespace too: the host's id numbers are tried as well).
REACH = """
def reach(key, name, shm_id, msg_id):
    got = {  # in this order: ids are per namespace, the jail's own would start at 0 too
        "shmget": syscall(29, key, 0, 0),
        "shmat_id": syscall(30, shm_id, None, 0),
        "shmctl_rmid_id": syscall(31, shm_id, 0, None),
        "msgget": syscall(68, key, 0),
        "msgctl_rmid_id": syscall(71, msg_id, 0, None),
        "mq_open": syscall(240, name, os.O_RDONLY, 0, None),
        "mq_unlink": syscall(241, name),
    }
    got["shmget_create_excl"] = syscall(29, key, 4096, 0o3600)  # IPC_CREAT|IPC_EXCL: free
    got["sysvipc"] = [open("/proc/sysvipc/" + kind).read().count("\\n") - 1
                      for kind in ("shm", "msg", "sem")]
    return got
"""


def _unreachable(got: dict[str, object]) -> None:
    assert got["shmget"] == "ENOENT", got
    assert str(got["shmget_create_excl"]).startswith("OK:"), got  # the key is free there
    assert got["shmat_id"] in ("EINVAL", "EIDRM"), got
    assert got["shmctl_rmid_id"] in ("EINVAL", "EIDRM"), got
    assert got["msgget"] == "ENOENT", got
    assert got["msgctl_rmid_id"] in ("EINVAL", "EIDRM"), got
    assert got["mq_open"] == "ENOENT", got
    assert got["mq_unlink"] == "ENOENT", got


async def test_host_sysv_ipc_and_mqueues_are_invisible(runner: Runner, host_ipc: HostIpc) -> None:
    before = host_ipc.state()
    assert before == (b"host", 1, 1)
    got = await run_code(runner, REACH + f"result = reach({host_ipc.key}, "
                                 f"{host_ipc.mq_name!r}, {host_ipc.shm}, {host_ipc.msg})\n")
    _unreachable(got)
    assert got["sysvipc"] == [1, 0, 0]  # only the segment it made itself
    assert host_ipc.state() == before


async def test_two_concurrent_runs_cannot_see_each_others_ipc(runner: Runner) -> None:
    """Run A makes a segment, a queue and an mqueue under one key and name, and waits;
    run B reaches for them; then A checks its own are as it left them (and removes
    its mqueue: B's mq_unlink found none)."""
    key, name = KEY + 1, b"trunner-run-a"
    code_a = READY + f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
shm = libc.syscall(29, {key}, 4096, 0o3600)
addr = libc.syscall(30, shm, None, 0)
ctypes.memmove(addr, b"mine", 4)
msg = libc.syscall(68, {key}, 0o3600)
# Made, but not opened: Landlock refuses to open the IPC namespace's internal
# mqueue files (beneath no rule), EACCES. mq_unlink below proves it was made.
mq = syscall(240, {name!r}, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, None)
ready({{"shm": shm, "msg": msg}})
result = [ctypes.string_at(addr, 4), syscall(68, {key}, 0) == "OK:" + repr(msg),
          syscall(29, {key}, 0, 0) == "OK:" + repr(shm), mq, syscall(241, {name!r})]
"""
    out: dict[str, object] = {}

    async def run_a() -> None:
        out["a"] = await run_code(runner, code_a)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_a)
        jail_a, ids = await jail_ready(go=False)
        assert min(ids.values()) >= 0, ids
        try:
            out["b"] = await run_code(
                runner, REACH + f"result = reach({key}, {name!r}, {ids['shm']}, {ids['msg']})\n")
        finally:
            let_go(jail_a)
    _unreachable(out["b"])  # type: ignore[arg-type]
    assert out["a"] == [b"mine", True, True, "EACCES", "OK:0"]
