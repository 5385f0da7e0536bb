"""The fork server: the helper's unconfined first stage, kept alive for a pool.

`trunner-worker server FD` runs as the helper does (this
interpreter with `-I -S`, a cleared environment, a session of its own) and
stops before any confinement step: per run it must still do what only that
stage can (join cgroups, take the run's ids, build the root, unshare). FD is
its end of the control channel, a SOCK_SEQPACKET socket only the parent
holds the other end of; the socket's peer credentials name the parent (no
host pid in argv, which a run's leader shows as its command line). It is
all the server holds besides /dev/null on 0 and 1 and, on 2, a pipe to the
parent (its stderr, shown when it dies): single-threaded, no other
descriptor, no shared mapping; it imports trunner's helper chain, the
built-in adapters and `_socket`, and never a user's module. Its objects
are frozen out of the garbage collector (`gc.freeze`), so a forked run's
collections do not copy its pages.

Each message is one run: the marshal of `(STAGE, MODE)`, STAGE the helper's
own argv (`PLAN 3 -- ADAPTER...`, as `trunner.helper` reads it) and
MODE a built-in mode to serve in pid 2 without an exec (or ""), with
exactly `abi.RUN_FDS` descriptors: the run's stdin, stdout, stderr, report pipe,
its link (a socketpair to the parent) and its jail dir, and for a streaming
run (`abi.STREAM_RUN_FDS`) its program's stdout (or a pty's socket), last. The server checks
the shape only, forks the run's leader as the parent's child
(`clone_parent`), closes its copies and answers `ok PID`, or `refused WHY`
with nothing forked. The plan is the leader's to read and refuse, as the
helper's is. The server keeps nothing of a run.

The leader: a session of its own first, then `S` and its pid on the link
(so a parent that lost the server before its answer can still find it); it
waits for `G`, which the parent sends once it holds the leader's pid, a
pidfd and a watchdog entry (EOF instead: the parent is gone, so it exits).
Then it puts the run's descriptors at 0-3 (and STREAM_FD), enters the jail dir, closes
everything else and runs the helper's chain (`helper.main`), in the same
order. A built-in mode is served by pid 2 in-process; a user mode is exec'd
as on the cold path.
"""

import _socket  # not socket: its enum and selectors would add ~1.4 MB to every fork
import gc
import marshal
import posix
import sys

from trunner import helper
from trunner.kernel import abi, install
from trunner.kernel._kernel import clone_parent

# Served in pid 2, imported once here: in an image's jail the package's own
# path is the host's, which only sys.path is rebased from (`_rebase_imports`).
from trunner.worker import adapters, exec_mode, files_mode  # noqa: F401

TYPE_CHECKING = False  # not from typing (see helper.py)
if TYPE_CHECKING:
    from typing import Any, NoReturn

#: The largest message the server reads (a plan is a few KiB).
MAX_MESSAGE = 1 << 20
#: Where the leader parks the run's descriptors before moving them to 0-3.
_PARKED = 64


class Refused(Exception):
    """A message the server will not fork for."""


def main(argv: "list[str]") -> "NoReturn":
    """Serve run messages on the control channel until it closes."""
    try:
        control = _socket.socket(fileno=int(argv[0]))
        # The parent made the socketpair: its peer credentials name it (not
        # argv, which a run's leader would show in its /proc/PID/cmdline).
        creds = control.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    except (IndexError, ValueError, OSError):
        posix._exit(abi.SANDBOX_SETUP_EXIT)
    parent = int.from_bytes(creds[:4], sys.byteorder)
    install.set_parent_death_signal(abi.SIGKILL)
    if posix.getppid() != parent:  # the parent died before the signal was armed
        posix._exit(abi.SANDBOX_SETUP_EXIT)
    gc.freeze()
    while True:
        try:
            data, fds, flags = _receive(control)
        except OSError:
            posix._exit(0)  # the channel is broken: the parent is gone or done
        if not data and not fds:
            posix._exit(0)  # EOF: the pool is closed
        try:
            stage, mode = _check(data, fds, flags)
            pid = clone_parent()
            if pid == 0:
                _lead(control, fds, stage, mode)
            reply = abi.SERVER_OK + b" %d" % pid
        except Refused as e:
            reply = abi.SERVER_REFUSED + b" " + str(e).encode(errors="replace")[:2000]
        except OSError as e:
            reply = abi.SERVER_REFUSED + b" fork: " + (e.strerror or "").encode()
        finally:
            for received in fds:
                posix.close(received)
        try:
            control.send(reply)
        except OSError:
            posix._exit(0)


def _receive(control: "_socket.socket") -> "tuple[bytes, list[int], int]":
    """One message, the descriptors it carried (close-on-exec), its flags."""
    data, ancillary, flags, _ = control.recvmsg(
        MAX_MESSAGE, _socket.CMSG_SPACE((abi.STREAM_RUN_FDS + 1) * 4), _socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + 4], sys.byteorder, signed=True)
                    for i in range(0, len(payload) - len(payload) % 4, 4)]
    return data, fds, flags


def _check(data: bytes, fds: "list[int]", flags: int) -> "tuple[list[str], str]":
    if flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC):
        raise Refused("message truncated")
    if len(fds) not in (abi.RUN_FDS, abi.STREAM_RUN_FDS):
        raise Refused(f"expected {abi.RUN_FDS} descriptors, got {len(fds)}")
    try:
        stage, mode = marshal.loads(data)
    except (ValueError, EOFError, TypeError) as e:
        raise Refused(f"not a run message ({type(e).__name__})") from None
    if type(stage) is not list or not all(type(arg) is str for arg in stage):
        raise Refused("the helper's argv is not a list of str")
    if mode not in ("", *abi.BUILTIN_MODES):
        raise Refused(f"no built-in mode {mode!r}")
    return stage, mode


def _rebase_imports() -> None:
    """In an image's jail (only trunner makes /.trunner/host: an image may
    hold no /.trunner), the server's code lies under HOST_PREFIX, and its
    paths name the image's files, or nothing: a later import (the exec
    adapter imports a few modules on first use) must find the host's, never
    the image's (a Debian image's /usr/lib/python3 would load into the
    host's interpreter). So every sys.path entry is rebased there and the
    importers cached for the host's paths dropped."""
    try:
        posix.stat(abi.HOST_PREFIX)
    except OSError:
        return
    sys.path[:] = [abi.HOST_PREFIX + p if p.startswith("/") else p for p in sys.path]
    sys.path_importer_cache.clear()


def _lead(control: "_socket.socket", fds: "list[int]", stage: "list[str]",
          mode: str) -> "NoReturn":
    """The run's leader, the parent's child: see the module's docstring."""
    try:
        posix.setsid()
        posix.close(control.detach())
        parked = [_PARKED + i for i in range(len(fds))]
        for fd, to in zip(fds, parked, strict=True):
            posix.dup2(fd, to, inheritable=False)
            posix.close(fd)
        link = parked[4]
        posix.write(link, abi.LEADER_IN_SESSION + b"%d" % posix.getpid())
        if posix.read(link, 1) != abi.LEADER_GO:
            posix._exit(abi.SANDBOX_SETUP_EXIT)  # the parent is gone
        for to, fd in enumerate(parked[:4]):
            posix.dup2(fd, to)
        posix.fchdir(parked[5])
        if len(parked) == abi.STREAM_RUN_FDS:  # the helper moves none: both in their slots
            posix.dup2(parked[6], abi.STREAM_FD)
            for fd in range(abi.REPORT_FD + 1, abi.STREAM_FD):
                try:  # noqa: SIM105  no contextlib here
                    posix.close(fd)
                except OSError:
                    pass
            install.close_from(abi.STREAM_FD + 1)
        else:
            install.close_from(abi.REPORT_FD + 1)
    except BaseException:
        posix._exit(abi.SANDBOX_SETUP_EXIT)
    helper.main(stage, serve=_serve if mode else None, mode=mode)


def _serve(mode: str) -> "Any":  # noqa: ANN401  never returns
    """Pid 2, confined: say so on the report pipe, close it, serve `mode`."""
    _rebase_imports()
    posix.write(abi.REPORT_FD, abi.NOTE_MARK + abi.READY_NOTE + b"\n")
    posix.close(abi.REPORT_FD)
    adapters.serve(mode)
    posix._exit(2)
