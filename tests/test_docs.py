"""The docs match the tree: the modules table in docs/design.md names every
module and package, and nothing that is gone; README.md opens with the two
commands CI and reviewers run; every link reaches its page and heading, and
every page of docs/ is one link from README.md."""

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


# Links: every relative link in the README and docs/ reaches a file, and its
# anchor a heading there. Every page under docs/ is linked from the README, so
# what moves out of it (issue 34) stays one click away.

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "benchmarks" / "README.md"]


def _prose(path: Path) -> str:
    """`path`'s text without its fenced blocks and code spans."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", path.read_text()))


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives `path`'s headings: lower case, punctuation
    dropped, spaces as dashes, a repeat numbered."""
    seen: dict[str, int] = {}
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def _links(page: Path) -> list[tuple[Path, str]]:
    """Each relative link of `page`: the file it names and its anchor (or "")."""
    found = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        found.append(((page.parent / file).resolve() if file else page, anchor))
    return found


def test_every_link_reaches_its_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        for target, anchor in _links(page):
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} missing")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: no #{anchor} in {target.name}")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {target for target, _ in _links(ROOT / "README.md")}
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked) == []


def test_every_reason_is_named_in_the_readme_and_explained_in_api_md() -> None:
    from trunner import Reason

    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|", (ROOT / "docs" / "api.md").read_text().split(
        "\n## Reasons\n", 1)[1], re.M)
    assert sorted(r.value for r in Reason if f"`{r.value}`" not in readme) == []
    assert sorted(rows) == sorted(r.value for r in Reason)
