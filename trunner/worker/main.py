"""The worker binary's mode dispatch: `trunner-worker MODE`.

`helper` is dispatched first, before anything heavy is imported: it is the
jail's first stage and must start fast; `server` is that stage kept alive
for a pool (`trunner.worker.forkserver`). Every other mode is an adapter
(adapters.py): it reads one request frame, writes one response frame, exits.
"""

import sys

from trunner.worker import WORKER_BINARY


def main(argv: list[str] | None = None) -> int:
    """Entry point of `trunner-worker`."""
    argv = sys.argv if argv is None else argv
    if len(argv) < 2:
        sys.stderr.write(f"usage: {WORKER_BINARY} MODE\n")
        return 2
    if argv[1] == "helper":
        from trunner import helper

        helper.main(argv[2:])
    if argv[1] == "server":
        from trunner.worker import forkserver

        forkserver.main(argv[2:])
    from trunner.worker import adapters

    return adapters.serve(argv[1])
