"""Parent side: a host uid per concurrent run, for a root caller's jails.

As isolate's boxes: each run takes one id (uid == gid) of a range that
nothing else on the host uses, and gives it back when the run ends. The
kernel's per-uid counters (pending signals and POSIX timers, fds in flight,
pipe buffer pages, processes) are then per run, and no host process owns a
jail's processes or files (/proc/PID/root).

- The default range is `0x7A000000 + [0, 1024)`: inside systemd's
  documented unused span 1879048192..2147352575 (above the container ranges
  systemd-nspawn picks from, 524288..1879048191, and the usual /etc/subuid
  ranges, below 2**31 which some tools read as negative, and below
  systemd's foreign range 0x7FFE0000). 1024 concurrent runs is more than a
  host's memory holds at the default `memory_bytes`.
- `HostIds.check` (at `Runner()`) refuses the range, `host_ids_in_use`,
  when /etc/passwd, /etc/group, /etc/subuid or /etc/subgid name an id in it,
  or a live process runs with one that no trunner run holds (zombies hold
  nothing but their pid and are not counted). Users only a name
  service (LDAP, sssd) knows are not seen: reserve the range there.
- `HostIds.acquire` takes the first free id after the last one this
  process took: an flock on `/run/trunner-ids/<id>` (root's, 0700), held
  for the run's life. It is safe across Runners and processes; a dead
  owner's lock is dropped by the kernel. When every id is taken the run is
  refused, `host_ids_exhausted`, before anything is spawned: waiting would
  spend the run's deadline on other runs' length; a caller that wants to
  queue bounds its own concurrency (e.g. a `trio.CapacityLimiter`).
- A run gives its id back once its jail's pid 1 has exited (its whole PID
  namespace with it). Where pid 1 outlives the teardown's bound (a busy
  host), the lock stays held, with a pidfd of pid 1, until it has
  (`IdLease.release(after=)`, settled at the next `acquire` or `settle`):
  no other run, and no other trunner's `check`, meets a live process of
  the run with its id free.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import select
import stat
import time
from dataclasses import dataclass
from typing import Final

from trunner import procfs
from trunner.errors import Reason, RunnerError

DEFAULT_FIRST: Final = 0x7A000000
DEFAULT_COUNT: Final = 1024
#: The host ids a root caller's jails run as, by default.
DEFAULT_RANGE: Final = range(DEFAULT_FIRST, DEFAULT_FIRST + DEFAULT_COUNT)
#: Where the per-id lock files live: root's, on the host's tmpfs.
LOCK_DIR: Final = "/run/trunner-ids"
#: Ids a range may never hold: root, nobody (the overflow id), 16-bit -1, -1.
_RESERVED: Final = (0, 65534, 65535, 2**32 - 1)


@dataclass(frozen=True)
class HostFiles:
    """Where the host's users, groups, processes and id locks are (tests
    point them elsewhere)."""

    passwd: str = "/etc/passwd"
    group: str = "/etc/group"
    subuid: str = "/etc/subuid"
    subgid: str = "/etc/subgid"
    proc: str = "/proc"
    lock_dir: str = LOCK_DIR


def check_range(ids: range) -> None:
    """Raises ValueError unless `ids` is a non-empty step-1 range of valid,
    unreserved host ids."""
    if not isinstance(ids, range) or ids.step != 1 or len(ids) == 0:
        raise ValueError(f"host_ids {ids!r}: a non-empty range(first, stop) of step 1")
    if ids.start < 1 or ids.stop > 2**32 - 1:
        raise ValueError(f"host_ids {ids!r}: outside 1 .. 2**32 - 2")
    reserved = [i for i in _RESERVED if i in ids]
    if reserved:
        raise ValueError(f"host_ids {ids!r}: holds reserved id {reserved[0]}"
                         " (a jail never runs as host uid or gid 0 or nobody)")


@dataclass(eq=False)
class IdLease:
    """One host id, held (its lock file's fd) until `release`."""

    id: int
    fd: int

    def release(self, *, after: int | None = None) -> None:
        """Give the id back; with `after`, a pidfd of the run's pid 1 (this
        lease takes it over), only once that process has exited."""
        if after is not None:
            if not _exited(after):
                _lingering[after] = self
                return
            os.close(after)
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)  # drops the flock


#: Leases held past their run's end: pidfd of its pid 1 -> the lease.
_lingering: dict[int, IdLease] = {}


def _exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def settle(timeout_s: float = 0) -> int:
    """Give back the ids whose run's pid 1 has exited since, waiting up to
    `timeout_s` for the others; how many are still held."""
    deadline = time.monotonic() + timeout_s
    while True:
        for pidfd in [fd for fd in _lingering if _exited(fd)]:
            _lingering.pop(pidfd).release(after=pidfd)
        left = deadline - time.monotonic()
        if not _lingering or left <= 0:
            return len(_lingering)
        select.select(list(_lingering), [], [], left)


class HostIds:
    """A range of host ids and the runs holding them."""

    def __init__(self, ids: range, files: HostFiles | None = None) -> None:
        check_range(ids)
        self.ids = ids
        self.files = files or HostFiles()
        # Each process starts somewhere else in the range; then it goes round,
        # so a just-freed id is the last one it takes again.
        self._next = random.randrange(len(ids))

    def check(self) -> None:
        """Refuse a range something else on the host uses.

        Raises:
            RunnerError: `host_ids_in_use` naming the first user found;
                `sandbox_setup` if the lock dir cannot be made safe.
        """
        self._lock_dir()
        users = self.users()
        if users:
            more = f" (and {len(users) - 1} more)" if len(users) > 1 else ""
            raise RunnerError(
                Reason.HOST_IDS_IN_USE,
                f"host ids {self.ids.start}..{self.ids.stop - 1} are in use on this host:"
                f" {users[0]}{more}; give Runner(host_ids=) a range nothing else uses",
            )

    def users(self) -> list[str]:
        """What on the host uses an id of the range, besides trunner's runs."""
        ids, files = self.ids, self.files
        found = [f"{files.passwd}: {name} (uid {uid}, gid {gid})"
                 for name, uid, gid in _entries(files.passwd, 2, 3) if uid in ids or gid in ids]
        found += [f"{files.group}: {name} (gid {gid})"
                  for name, gid, _ in _entries(files.group, 2, 2) if gid in ids]
        for path in (files.subuid, files.subgid):
            found += [f"{path}: {name} ({first}..{first + count - 1})"
                      for name, first, count in _entries(path, 1, 2)
                      if range(max(first, ids.start), min(first + count, ids.stop))]
        for pid, name, used in _processes(files.proc, ids):
            # A trunner run (this host's, any process's) holds its id's lock.
            foreign = sorted(i for i in used if not self._held(i))
            # A run that ended between the two reads released its lock after
            # its last process was seen: look at the process again.
            if foreign and set(foreign) & _ids_of(files.proc, pid, ids):
                found.append(f"process {pid} ({name}) runs as id {foreign[0]}")
        return found

    def acquire(self) -> IdLease:
        """Take a free id for one run.

        Raises:
            RunnerError: `host_ids_exhausted` when concurrent runs hold every
                id of the range; `spawn_failed` out of descriptors;
                `sandbox_setup` if its lock cannot be made otherwise.
        """
        settle()
        count = len(self.ids)
        for step in range(count):
            index = (self._next + step) % count
            lease = self._try(self.ids[index])
            if lease is not None:
                self._next = (index + 1) % count
                return lease
        raise RunnerError(
            Reason.HOST_IDS_EXHAUSTED,
            f"all {count} host ids {self.ids.start}..{self.ids.stop - 1} are taken by concurrent"
            " runs; bound the concurrency or give Runner(host_ids=) a larger range",
        )

    def _try(self, host_id: int) -> IdLease | None:
        path = f"{self.files.lock_dir}/{host_id}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            # Out of descriptors is the parent's state, as for any spawn.
            out_of_fds = e.errno in (errno.EMFILE, errno.ENFILE)
            raise RunnerError(Reason.SPAWN_FAILED if out_of_fds else Reason.SANDBOX_SETUP,
                              f"host id lock {path}: {e.strerror} (errno {e.errno})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise RunnerError(Reason.SANDBOX_SETUP, f"host id lock {path}: {e.strerror}"
                              f" (errno {e.errno})") from None
        return IdLease(host_id, fd)

    def _held(self, host_id: int) -> bool:
        """Whether a run (of any process) holds `host_id` now."""
        try:
            fd = os.open(f"{self.files.lock_dir}/{host_id}",
                         os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def _lock_dir(self) -> None:
        """Make the lock dir, root's and writable by root alone: anyone who
        could create or lock its files could hold every id."""
        path = self.files.lock_dir
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise RunnerError(Reason.SANDBOX_SETUP, f"cannot make the host id lock dir {path}:"
                              f" {e.strerror} (errno {e.errno})") from None
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise RunnerError(Reason.SANDBOX_SETUP, f"the host id lock dir {path} must be a"
                              " directory of root's that no one else can write")


def _entries(path: str, first: int, second: int) -> list[tuple[str, int, int]]:
    """(name, field `first`, field `second`) of each colon-separated line
    whose fields are numbers; a missing file has none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        fields = line.split(":")
        if len(fields) > max(first, second) and not line.startswith("#"):
            try:
                out.append((fields[0], int(fields[first]), int(fields[second])))
            except ValueError:
                continue  # a NIS "+" line, a comment
    return out


def _processes(proc: str, ids: range) -> list[tuple[int, str, set[int]]]:
    """(pid, name, ids of the range it holds) of each process holding one,
    as a real, effective, saved or filesystem uid or gid."""
    out = []
    for pid in procfs.pids(proc):
        fields = procfs.status(pid, proc)
        used = _used(fields, ids)
        if used and not _dead(proc, pid):
            out.append((pid, fields.get("Name", ""), used))
    return out


def _used(fields: dict[str, str], ids: range) -> set[int]:
    return {int(v) for key in ("Uid", "Gid") for v in fields.get(key, "").split()
            if int(v) in ids}


def _ids_of(proc: str, pid: int, ids: range) -> set[int]:
    """The ids of the range `pid` holds now; none once it is dead or gone."""
    fields = procfs.status(pid, proc)
    return set() if _dead(proc, pid) else _used(fields, ids)


_PF_EXITING: Final = 0x4


def _dead(proc: str, pid: int) -> bool:
    """A zombie or a process past its exit (or gone): it holds nothing but
    its pid. (A cancelled run's pid 1, whose parent the helper was killed
    first, stays a zombie until the host's init reaps it, in its own time.)"""
    fields = procfs.stat(pid, proc)
    return procfs.exited(fields) or bool(int(fields[procfs.FLAGS]) & _PF_EXITING)
