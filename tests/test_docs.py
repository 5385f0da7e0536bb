"""The docs match the tree: the modules table in docs/design.md names every
module and package, and nothing that is gone; README.md opens with the two
commands CI and reviewers run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trunner"

#: The first fenced block of README.md, exactly.
COMMANDS = [
    "scripts/demo   # set up .venv, check the host, run one real jailed invocation",
    "scripts/test   # set up .venv, run the whole test suite (pytest, real kernel)",
]


def _modules_table() -> list[str]:
    """The first cell of every row of the table under "## Modules"."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    names = []
    for line in section.splitlines():
        row = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if row:
            names.append(row.group(1))
    return names


def _tree() -> set[str]:
    """`trunner/*.py`, and every package directly under trunner/ and trunner/linux/."""
    found = {f"trunner/{path.name}" for path in PACKAGE.glob("*.py")}
    for parent in (PACKAGE, PACKAGE / "linux"):
        for init in parent.glob("*/__init__.py"):
            found.add(init.parent.relative_to(ROOT).as_posix() + "/")
    return found


def _exists(name: str) -> bool:
    path = ROOT / name
    if name.endswith("/"):
        return (path / "__init__.py").is_file()
    return path.is_file()


def test_the_modules_table_has_one_row_a_name() -> None:
    names = _modules_table()
    assert names, "no table under ## Modules in docs/design.md"
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_every_module_and_package_is_in_the_table() -> None:
    assert sorted(_tree() - set(_modules_table())) == []


def test_every_row_names_something_that_exists() -> None:
    assert [name for name in _modules_table() if not _exists(name)] == []


def test_the_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    assert block is not None
    assert block.group(1).splitlines() == COMMANDS
    # Nothing but the title comes before it.
    assert text[: block.start()].strip() == "# trunner"
