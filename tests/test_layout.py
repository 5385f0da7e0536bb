"""The tree shows the design: import rules, read from the code itself.

- Nothing in `trunner/*.py` imports `trunner.linux` but the backend seam
  (`backend.py`). The child side, `trunner/worker/`, imports only the raw
  kernel layer (`trunner.linux.kernel`), and `main.py` the helper mode
  (`trunner.linux.helper`); `helper.py` imports only `trunner.linux.kernel`.
- Nothing in `trunner/worker/` or `trunner/linux/kernel/` imports msgspec,
  trio or typing when it is imported (a user mode's lazy msgspec is the one
  exception: inside a function).
- No import circles among trunner's modules.
- Only `trunner.ray` imports Ray (the `ray` extra), and nothing imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trunner"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _guarded(node: ast.AST) -> bool:
    """An `if TYPE_CHECKING:` block: never run."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and \
        node.test.id == "TYPE_CHECKING"


def _imports(path: Path, module_level_only: bool = False) -> list[str]:
    """Every module `path` imports (absolute names), outside TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    found: list[str] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _guarded(child):
                continue
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                if top or not module_level_only:
                    found.extend(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level \
                    and (top or not module_level_only):
                found.append(child.module)
                found.extend(f"{child.module}.{alias.name}" for alias in child.names)
            visit(child, inner)

    visit(tree, True)
    return found


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _internal(names: list[str]) -> set[str]:
    """The trunner modules among `names` (`from pkg import mod` names mod)."""
    return {name for name in names if name in MODULES}


def test_only_the_seam_imports_the_linux_backend() -> None:
    offenders = {}
    for path in sorted([*PACKAGE.glob("*.py"), *(PACKAGE / "worker").glob("*.py")]):
        linux = sorted({n for n in _imports(path) if n.startswith("trunner.linux")})
        if path.name == "backend.py" and path.parent == PACKAGE:
            linux = []
        elif path.parent.name == "worker":
            allowed = (("trunner.linux", "trunner.linux.helper", "trunner.linux.forkserver")
                       if path.name == "main.py" else ())
            linux = [n for n in linux
                     if n not in allowed and not n.startswith("trunner.linux.kernel")]
        if linux:
            offenders[str(path.relative_to(PACKAGE))] = linux
    assert offenders == {}


def test_the_helper_imports_only_the_kernel_side() -> None:
    internal = {n for n in _imports(PACKAGE / "linux" / "helper.py") if n.startswith("trunner")}
    assert internal
    assert all(n.startswith("trunner.linux.kernel") for n in internal), internal


def test_the_fork_server_imports_only_the_helper_chain_and_the_builtin_adapters() -> None:
    # It is root's process for a pool's life: what it imports, every run inherits.
    path = PACKAGE / "linux" / "forkserver.py"
    internal = {n for n in _imports(path) if n.startswith("trunner")}
    assert internal, internal
    assert {n for n in internal if not n.startswith("trunner.linux.kernel")} <= {
        "trunner.linux", "trunner.linux.helper", "trunner.worker",
        "trunner.worker.adapters", "trunner.worker.exec_mode"}, internal
    heavy = ("msgspec", "trio", "typing", "socket", "subprocess")
    assert [n for n in _imports(path, module_level_only=True)
            if n.split(".")[0] in heavy] == []


@pytest.mark.parametrize("where", ["worker", "linux/kernel"])
def test_the_child_side_imports_nothing_heavy(where: str) -> None:
    heavy = ("msgspec", "trio", "typing")
    offenders = {}
    for path in sorted((PACKAGE / where).glob("*.py")):
        names = [n for n in _imports(path, module_level_only=True)
                 if n.split(".")[0] in heavy]
        if names:
            offenders[path.name] = names
    assert offenders == {}


def test_only_trunner_ray_imports_ray() -> None:
    # The `ray` extra: `import trunner` (and all the rest) never pays for Ray.
    offenders = {}
    for name, path in MODULES.items():
        if name == "trunner.ray" or name.startswith("trunner.ray."):
            continue
        names = [n for n in _imports(path) if n.split(".")[0] == "ray" or
                 n == "trunner.ray" or n.startswith("trunner.ray.")]
        if names:
            offenders[name] = names
    assert offenders == {}
    assert any(n.split(".")[0] == "ray" for n in _imports(PACKAGE / "ray" / "actor.py"))


def test_no_import_circles() -> None:
    graph = {name: _internal(_imports(path)) - {name} for name, path in MODULES.items()}
    # A package's own __init__ is imported by its modules; a module importing
    # its package is no arrow back.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    circles = []
    state: dict[str, int] = {}

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep):], dep])
            elif dep not in state:
                walk(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert circles == []


def test_the_rules_test_reads_every_module() -> None:
    # The rules above see the whole package (a file they missed would pass them).
    assert {"trunner.jail", "trunner.backend", "trunner.linux.helper", "trunner.worker.exec_mode",
            "trunner.linux.kernel.abi", "trunner.linux.backend"} <= set(MODULES)
