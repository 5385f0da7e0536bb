"""trunner: run untrusted work in a jailed subprocess from trio, get back
exactly one verified answer.

Exports are lazy: the worker's helper stage imports `trunner.helper` through
this package and must not pay for trio or msgspec. (The helper's exit
codes are re-exported by `trunner.backend`, the backend seam.)
"""

#: The release (the one version source: pyproject.toml reads it, as does `trunner --version`).
__version__ = "0.1.0"

# Not `from typing import TYPE_CHECKING`: importing typing costs the helper ~5 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from trunner.backend import (
        PROCESS_COUNT_EXIT as PROCESS_COUNT_EXIT,
        SANDBOX_SETUP_EXIT as SANDBOX_SETUP_EXIT,
        provider_profile_template_blake3 as provider_profile_template_blake3,
    )
    from trunner.errors import Reason as Reason, RunnerError as RunnerError
    from trunner.invocation import Result as Result
    from trunner.limits import Limits as Limits
    from trunner.output import CapturedOutput as CapturedOutput
    from trunner.protocol import (
        CollectedFile as CollectedFile,
        ExecFile as ExecFile,
        ExecRequest as ExecRequest,
        ExecResult as ExecResult,
        Export as Export,
        FileEntry as FileEntry,
        FilesError as FilesError,
        FilesRequest as FilesRequest,
        FilesResult as FilesResult,
        Import as Import,
        ReadFiles as ReadFiles,
        WriteFiles as WriteFiles,
    )
    from trunner.runner import Runner as Runner
    from trunner.signals import cancel_on_signals as cancel_on_signals
    from trunner.usage import Usage as Usage
    from trunner.worker import WORKER_BINARY as WORKER_BINARY, locate_worker as locate_worker

_WHERE = {
    "Reason": "trunner.errors",
    "RunnerError": "trunner.errors",
    "PROCESS_COUNT_EXIT": "trunner.backend",
    "SANDBOX_SETUP_EXIT": "trunner.backend",
    "Limits": "trunner.limits",
    "CapturedOutput": "trunner.output",
    "CollectedFile": "trunner.protocol",
    "ExecFile": "trunner.protocol",
    "ExecRequest": "trunner.protocol",
    "ExecResult": "trunner.protocol",
    "Export": "trunner.protocol",
    "FileEntry": "trunner.protocol",
    "FilesError": "trunner.protocol",
    "FilesRequest": "trunner.protocol",
    "FilesResult": "trunner.protocol",
    "Import": "trunner.protocol",
    "ReadFiles": "trunner.protocol",
    "WriteFiles": "trunner.protocol",
    "Usage": "trunner.usage",
    "provider_profile_template_blake3": "trunner.backend",
    "Result": "trunner.invocation",
    "Runner": "trunner.runner",
    "cancel_on_signals": "trunner.signals",
    "WORKER_BINARY": "trunner.worker",
    "locate_worker": "trunner.worker",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> "Any":  # noqa: ANN401
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trunner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
