"""The worker binary: what runs inside the jail, after the helper's exec.

`trunner-worker MODE` (main.py) dispatches to the helper (the jail's first
stage, `trunner.helper`) or to an adapter (adapters.py, exec_mode.py), which
reads one request frame and writes one reply frame with wire.py. Nothing
here imports msgspec, trio or typing at module level: a user mode alone
imports msgspec, lazily. The parent only finds the binary (`locate_worker`): the script
`trunner-worker` beside this file.
"""

#: File name of the worker binary this package installs.
WORKER_BINARY = "trunner-worker"


def locate_worker() -> str:
    """The worker binary inside this package (every install layout has it:
    a venv, `--user`, `--target`, an editable checkout).

    Raises:
        RunnerError: `worker_not_found`, naming where it looked.
    """
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), WORKER_BINARY)
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    from trunner.errors import Reason, RunnerError

    raise RunnerError(Reason.WORKER_NOT_FOUND, f"no executable {WORKER_BINARY} at {path}")
