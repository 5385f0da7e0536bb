"""Helpers shared by the escape suite (not a test module)."""

from __future__ import annotations

import hashlib
import signal
import textwrap
from typing import Any

import pytest

from trunner import Reason, Runner, RunnerError

# Prelude for child snippets: `attempt(fn)` returns the errno name or "OK:<value>".
PRELUDE = """
import errno, os
def attempt(fn):
    try:
        return "OK:" + repr(fn())
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
"""


async def run_code(runner: Runner, code: str, **kw: Any) -> Any:
    src = PRELUDE + textwrap.dedent(code)
    return (await runner.run("children:run_code", src, **kw)).response


async def denied(runner: Runner, code: str, **kw: Any) -> RunnerError:
    src = PRELUDE + textwrap.dedent(code)
    with pytest.raises(RunnerError) as info:
        await runner.run("children:run_code", src, **kw)
    return info.value


async def syscall_denied(runner: Runner, code: str, name: str, **kw: Any) -> RunnerError:
    e = await denied(runner, code, **kw)
    assert e.reason is Reason.SYSCALL_DENIED, (e.reason, e.detail)
    assert e.signal == signal.SIGSYS
    # The name comes from the kernel's (rate-limited) audit record in /dev/kmsg;
    # when the record was logged it must name exactly this syscall.
    assert f"({name})" in e.detail or "number not logged" in e.detail, e.detail
    return e


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
