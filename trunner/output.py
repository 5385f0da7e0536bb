"""`CapturedOutput`: what a program printed before a failure, on
`RunnerError.output` when the caller asked for it (`capture_on_failure`).

Its own module so that both the error type (`trunner.errors`) and the
pipeline (`trunner.invocation`) can hold it without importing each other.
Pure: imports msgspec and nothing of trunner. A diagnostic, never a
response: nothing here decodes or checks the program's bytes.
"""

from __future__ import annotations

from typing import final

import msgspec


@final
class CapturedOutput(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a program printed before a failure (`RunnerError.output`, with
    `exec(..., capture_on_failure=True)`): a diagnostic, never a response.

    The bytes are the program's own, as its adapter read them, never decoded.
    Each stream is within its cap (`stdout_max_bytes`, `stderr_max_bytes`);
    `stdout_truncated` and `stderr_truncated` say that the program wrote
    more than is here (the stream crossed its cap).
    """

    stdout: bytes
    stderr: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @classmethod
    def within(cls, stdout: bytes, stderr: bytes, *, stdout_max_bytes: int,
               stderr_max_bytes: int) -> CapturedOutput:
        """Both streams, each cut to its cap and marked if cut (the `exec`
        adapter reports one byte past a cap it saw crossed)."""
        return cls(stdout=stdout[:stdout_max_bytes], stderr=stderr[:stderr_max_bytes],
                   stdout_truncated=len(stdout) > stdout_max_bytes,
                   stderr_truncated=len(stderr) > stderr_max_bytes)
