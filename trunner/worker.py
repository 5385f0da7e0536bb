"""The worker binary's mode dispatch: `trunner-worker MODE`.

`helper` is dispatched first, before anything heavy is imported: it is the
jail's first stage and must start fast. Every other mode is an adapter
(adapters.py): it reads one request frame, writes one response frame, exits.
"""

import sys

#: File name of the worker binary this package installs.
WORKER_BINARY = "trunner-worker"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `trunner-worker`."""
    argv = sys.argv if argv is None else argv
    if len(argv) < 2:
        sys.stderr.write(f"usage: {WORKER_BINARY} MODE\n")
        return 2
    if argv[1] == "helper":
        from trunner import helper

        helper.main(argv[2:])
    from trunner import adapters

    return adapters.serve(argv[1])


def adapter_argv(worker: str, mode: str) -> tuple[str, ...]:
    """The adapter stage's argv for `mode`.

    A built-in mode needs only the standard library and trunner, so a Python
    worker runs it as the helper runs: `python -I -S WORKER --path DIR MODE`
    (no site, no .pth files). A user mode keeps site-packages and
    PYTHONPATH, where its code is found: `WORKER MODE`.
    """
    if mode in ("echo", "exec"):
        from trunner.linux.backend import helper_launch

        launch = helper_launch(worker)
        if len(launch) > 1:
            return (*launch, mode)
    return (worker, mode)


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
