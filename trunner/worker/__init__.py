"""The worker binary: what runs inside the jail, after the helper's exec.

`trunner-worker MODE` (main.py) dispatches to the helper (the jail's first
stage, `trunner.linux.helper`) or to an adapter (adapters.py, exec_mode.py), which
reads one request frame and writes one reply frame with wire.py. Nothing
here imports msgspec, trio or typing at module level: a user mode alone
imports msgspec, lazily. The parent only finds the binary (`locate_worker`).
"""

import sys

#: File name of the worker binary this package installs.
WORKER_BINARY = "trunner-worker"


def locate_worker() -> str:
    """The worker binary beside the current executable, or one directory up
    (an installed layout and a build tree).

    Raises:
        RunnerError: `worker_not_found`, listing where it looked.
    """
    import os

    here = os.path.dirname(os.path.abspath(sys.executable))
    tried = [os.path.join(here, WORKER_BINARY), os.path.join(os.path.dirname(here), WORKER_BINARY)]
    for path in tried:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    from trunner.errors import Reason, RunnerError

    raise RunnerError(
        Reason.WORKER_NOT_FOUND, f"no executable {WORKER_BINARY} at {' or '.join(tried)}"
    )
