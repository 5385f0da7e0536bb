"""The tree shows the design: import rules, read from the code itself.

- The child side is `trunner/helper.py`, `trunner/worker/` and
  `trunner/kernel/`: they import only each other and the standard library
  (a user mode's lazy msgspec, inside a function, is the one exception),
  and nothing of theirs imports msgspec, trio or typing when imported.
- The parent side imports of the child side only `trunner.kernel`'s
  shared constants and probes (`abi`, `install.landlock_abi`) and the
  worker's locator; `trunner/linux/` holds the parent's Linux backend only.
- Nothing in `trunner/*.py` imports `trunner.linux` but the backend seam
  (`backend.py`).
- No import circles among trunner's modules, type-only imports included
  (at most the one named below).
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


def _imports(path: Path, module_level_only: bool = False, types: bool = False) -> list[str]:
    """Every module `path` imports (absolute names), outside TYPE_CHECKING
    (`types`: inside too)."""
    tree = ast.parse(path.read_text())
    found: list[str] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _guarded(child) and not types:
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


#: The child side: what runs between the spawn and the program.
CHILD_SIDE = ("trunner.helper", "trunner.worker", "trunner.kernel")


def _is_child_side(name: str) -> bool:
    return any(name == c or name.startswith(c + ".") for c in CHILD_SIDE)


def test_only_the_seam_imports_the_linux_backend() -> None:
    offenders = {}
    for path in sorted(PACKAGE.glob("*.py")):
        linux = sorted({n for n in _imports(path) if n.startswith("trunner.linux")})
        if linux and not (path.name == "backend.py" and path.parent == PACKAGE):
            offenders[str(path.relative_to(PACKAGE))] = linux
    assert offenders == {}


def test_the_child_side_imports_only_itself_and_the_standard_library() -> None:
    # The jail's first stage and its adapters: whatever they import, every run pays for.
    offenders = {}
    for name, path in MODULES.items():
        if not _is_child_side(name):
            continue
        bad = sorted({n for n in _imports(path, module_level_only=True)
                      if n.split(".")[0] == "trunner" and n != "trunner"
                      and not _is_child_side(n)})
        if bad:
            offenders[name] = bad
    assert offenders == {}


def test_the_parent_imports_of_the_child_side_only_its_constants() -> None:
    allowed = {"trunner.kernel", "trunner.kernel.abi", "trunner.kernel.install",
               "trunner.worker", "trunner.worker.locate_worker",
               "trunner.worker.WORKER_BINARY"}
    offenders = {}
    for name, path in MODULES.items():
        if _is_child_side(name):
            continue
        names = {n for n in _imports(path) if _is_child_side(n)}
        names -= allowed
        # Constants only: the shared ABI's, and the bounds of the worker's wire
        # mirror of the frame codec (`protocol` checks them parent-side).
        names = {n for n in names if not (
            n.startswith(("trunner.kernel.abi.", "trunner.worker.wire."))
            and n.rpartition(".")[2].isupper())}
        names.discard("trunner.worker.wire")
        names.discard("trunner.kernel.install.landlock_abi")
        if names:
            offenders[name] = sorted(names)
    assert offenders == {}


def test_the_fork_server_imports_nothing_heavy() -> None:
    # It is root's process for a pool's life: what it imports, every run inherits.
    heavy = ("msgspec", "trio", "typing", "socket", "subprocess")
    path = PACKAGE / "worker" / "forkserver.py"
    assert [n for n in _imports(path, module_level_only=True)
            if n.split(".")[0] in heavy] == []


@pytest.mark.parametrize("where", ["helper.py", "worker", "kernel"])
def test_the_child_side_imports_nothing_heavy(where: str) -> None:
    heavy = ("msgspec", "trio", "typing")
    offenders = {}
    target = PACKAGE / where
    for path in sorted([target] if target.is_file() else target.glob("*.py")):
        names = [n for n in _imports(path, module_level_only=True)
                 if n.split(".")[0] in heavy]
        if names:
            offenders[path.name] = names
    assert offenders == {}


def test_linux_holds_the_parent_side_only() -> None:
    assert not (PACKAGE / "linux" / "helper.py").exists()
    assert not (PACKAGE / "linux" / "forkserver.py").exists()
    assert not (PACKAGE / "linux" / "kernel").exists()


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
    # Type-only imports count: they are dependencies too.
    graph = {name: _internal(_imports(path, types=True)) - {name}
             for name, path in MODULES.items()}
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
    assert {"trunner.jail", "trunner.backend", "trunner.helper", "trunner.worker.exec_mode",
            "trunner.kernel.abi", "trunner.linux.backend", "trunner.worker.forkserver",
            "trunner.spawn"} <= set(MODULES)
