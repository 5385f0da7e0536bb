"""Parent side: whether a `package.module:attr` mode exists, found without
running any of it.

Importing a user's module in the parent would run it unjailed (even
`importlib.util.find_spec("pkg.sub")` runs `pkg/__init__.py`), so the
check is static: each component is located with `PathFinder.find_spec`
given the directory to search (which imports nothing), the module's source
is parsed with `ast`, and its top level (into `if`, `try` and `with`
blocks) must bind the name: a `def`, a `class`, an import, or an assignment
of something that is not a literal. What cannot be read statically (an
extension module, a bytecode-only one, a module `__getattr__`, a
`from x import *`) is given the benefit of the doubt: the adapter, inside
the jail, then refuses it (exit 2, `nonzero_exit`, its line on stderr).
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import os
from typing import TYPE_CHECKING

from trunner.errors import Reason, RunnerError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

_LITERALS = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr,
             ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.BinOp,
             ast.Compare, ast.BoolOp, ast.UnaryOp)


def check_spec(mode: str, search: Sequence[str]) -> None:
    """Refuse `mode` (`module.path:attr`) with `unknown_mode` when its module
    is not on `search` or its top level binds no callable `attr`.

    Raises:
        RunnerError: `unknown_mode`.
    """
    module, _, attr = mode.partition(":")
    parts = module.split(".")
    locations: list[str] | None = list(search)
    spec = None
    for i, part in enumerate(parts):
        if locations is None:
            name = ".".join(parts[:i])
            raise RunnerError(Reason.UNKNOWN_MODE,
                              f"{name!r} is not a package, so has no {part!r} for mode {mode!r}")
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            raise RunnerError(Reason.UNKNOWN_MODE,
                              f"no module {'.'.join(parts[: i + 1])!r} for mode {mode!r}")
        search_locations = spec.submodule_search_locations
        locations = list(search_locations) if search_locations is not None else None
    assert spec is not None
    origin = spec.origin
    if not origin or not origin.endswith(".py"):
        return  # a namespace package, an extension, bytecode only: the adapter decides
    try:
        stat = os.stat(origin)
    except OSError:
        return
    verdict = _binds(origin, stat.st_mtime_ns, stat.st_size, attr)
    if verdict is not None:
        raise RunnerError(Reason.UNKNOWN_MODE, f"mode {mode!r}: {module} {verdict}")


@functools.lru_cache(maxsize=256)
def _binds(path: str, mtime_ns: int, size: int, attr: str) -> str | None:
    """None when the module at `path` may bind a callable `attr` at its top
    level; else why not (`mtime_ns` and `size` key the cache)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError) as e:
        return f"cannot be parsed: {e}"
    found: ast.AST | None = None
    for node in _top_level(tree.body):
        for name, value in _bound(node):
            if name in (attr, "__getattr__") or name == "*":
                if name != attr:
                    return None  # resolved at run time: the adapter decides
                found = value
    if found is None:
        return f"has no top-level {attr!r}"
    if isinstance(found, _LITERALS):
        return f"binds {attr!r} to a {type(found).__name__.lower()}, which is not callable"
    return None


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.While, ast.For)):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)
            yield from _top_level(node.finalbody)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _bound(node: ast.stmt) -> Iterator[tuple[str, ast.AST]]:
    """The names `node` binds, each with what it is bound to."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name, node
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            yield (alias.asname or alias.name.split(".")[0]), node
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    yield name.id, node.value if isinstance(target, ast.Name) else node
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        yield node.target.id, node.value if node.value is not None else node
