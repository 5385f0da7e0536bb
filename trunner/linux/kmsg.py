"""Parent side: what the kernel log says about a seccomp kill.

Reads /dev/kmsg for the audit record (type 1326) of the killed pid. Only
records stamped at or after the spawn count: an older one is of an earlier
process that had the same pid. Records may be missing (rate limits, no
access to the log); the caller then says so.
"""

from __future__ import annotations

import os


def denied_syscall(pid: int, since_us: int) -> int | None:
    """The syscall number the seccomp filter killed `pid` for, or None.

    `since_us` is CLOCK_MONOTONIC in microseconds, the clock of /dev/kmsg's
    timestamps.
    """
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    needle, found = f" pid={pid} ".encode(), None
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record was overwritten while we read
                continue
            if b"type=1326" not in record or needle not in record:
                continue
            prefix, _, message = record.partition(b";")
            fields = prefix.split(b",")
            if len(fields) < 3 or int(fields[2]) < since_us or b" syscall=" not in message:
                continue
            found = int(message.split(b" syscall=")[1].split()[0])
    finally:
        os.close(fd)
    return found
