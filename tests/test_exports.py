"""The public namespace: what `import trunner` offers, and what it costs."""

from __future__ import annotations

import ast
import enum
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import trunner
from support import scaled

#: The public API (README, STYLE.md P16). A change here is an API change.
PUBLIC = {
    "CapturedOutput", "CollectedFile", "ExecFile", "ExecRequest", "ExecResult", "Export",
    "FileEntry", "FilesError", "FilesRequest", "FilesResult", "Import", "Limits", "ReadFiles",
    "WriteFiles",
    "PROCESS_COUNT_EXIT", "Reason", "Result", "Runner", "RunnerError", "SANDBOX_SETUP_EXIT",
    "Usage", "WORKER_BINARY", "cancel_on_signals",
    "locate_worker", "provider_profile_template_blake3",
}


def _typing_reexports() -> set[str]:
    """Names the `if TYPE_CHECKING:` block re-exports as `X as X` (what type checkers see)."""
    tree = ast.parse(Path(trunner.__file__).read_text())
    block = next(
        node for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )
    return {
        alias.asname
        for node in block.body if isinstance(node, ast.ImportFrom) and node.module != "typing"
        for alias in node.names if alias.asname == alias.name
    }


def test_all_is_the_public_api_and_every_name_resolves() -> None:
    assert set(trunner.__all__) == PUBLIC
    assert _typing_reexports() == PUBLIC  # the lazy exports and the typed ones agree
    namespace: dict[str, object] = {}
    exec("from trunner import *", namespace)  # resolves every lazy name
    assert set(namespace) - {"__builtins__"} == PUBLIC
    for name in PUBLIC:
        value = namespace[name]
        module = getattr(value, "__module__", None)
        assert module is None or module.startswith("trunner."), (name, module)
    with pytest.raises(AttributeError, match="no_such_name"):
        trunner.no_such_name  # noqa: B018


def test_exported_classes_are_final_frozen_or_errors() -> None:
    for name in trunner.__all__:
        value = getattr(trunner, name)
        if not isinstance(value, type):
            continue
        if issubclass(value, (BaseException, enum.Enum)):
            continue
        if issubclass(value, msgspec.Struct):
            assert value.__struct_config__.frozen, name
            continue
        assert getattr(value, "__final__", False), f"{name} is not @final"


def test_import_trunner_and_the_helper_stay_light() -> None:
    # The helper stage imports trunner.helper through the package: no trio,
    # msgspec, blake3, pyseccomp or typing on that path.
    code = (
        "import sys; import trunner.helper, trunner.kernel.install;"
        "print(' '.join(sorted(m for m in ('trio', 'msgspec', 'blake3', 'pyseccomp', 'typing')"
        " if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, "
                          f"{trunner.__path__[0].rsplit('/', 1)[0]!r}); {code}"],
                         capture_output=True, text=True, timeout=scaled(60))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
