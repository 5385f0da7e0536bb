"""Old name of the shared test helpers, kept for test files not yet switched.

Import from `support` (tests/support.py) instead.
"""

from support import (
    PRELUDE as PRELUDE,
    denied as denied,
    run_code as run_code,
    sha256 as sha256,
    syscall_denied as syscall_denied,
)
