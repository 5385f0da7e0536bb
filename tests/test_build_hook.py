"""hatch_build.py, the build hook of a source install, run on a copy of the
C sources: what it builds, and the one line it ends with where something is
missing (the compiler, musl-gcc, the interpreter's headers)."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNEL = "trunner/kernel"

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("musl-gcc") is None,
                                reason="no C compiler or no musl-gcc (scripts/setup installs both)")


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Any:
    sys.path.insert(0, str(REPO))
    monkeypatch.delenv("TRUNNER_WERROR", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("MUSL_CC", raising=False)
    try:
        import hatch_build
    finally:
        sys.path.remove(str(REPO))
    return hatch_build


PT_DYNAMIC, PT_INTERP = 2, 3
SHT_DYNSYM, SHT_DYNAMIC, SHT_RELA, SHT_REL = 11, 6, 4, 9


def program_header_types(elf: bytes) -> set[int]:
    """The p_type of every program header of an ELF64 little-endian file."""
    assert elf[:6] == b"\x7fELF\x02\x01"
    phoff = int.from_bytes(elf[32:40], "little")
    size, count = int.from_bytes(elf[54:56], "little"), int.from_bytes(elf[56:58], "little")
    return {int.from_bytes(elf[phoff + i * size:phoff + i * size + 4], "little")
            for i in range(count)}


def section_types(elf: bytes) -> set[int]:
    """The sh_type of every section header of an ELF64 little-endian file."""
    shoff = int.from_bytes(elf[40:48], "little")
    size, count = int.from_bytes(elf[58:60], "little"), int.from_bytes(elf[60:62], "little")
    return {int.from_bytes(elf[shoff + i * size + 4:shoff + i * size + 8], "little")
            for i in range(count)}


def source_tree(tmp_path: Path) -> Path:
    (tmp_path / KERNEL).mkdir(parents=True)
    for name in ("_kernel.c", "waiter.c", "abi.py"):
        shutil.copy(REPO / KERNEL / name, tmp_path / KERNEL / name)
    return tmp_path


def build(hook: Any, root: Path) -> dict[str, Any]:
    data: dict[str, Any] = {}
    hook.KernelBuildHook.initialize(SimpleNamespace(root=str(root), target_name="wheel"),
                                    "standard", data)
    return data


def fails(hook: Any, root: Path) -> str:
    with pytest.raises(SystemExit) as info:
        build(hook, root)
    message = str(info.value.code)
    assert "\n" not in message
    assert not (root / KERNEL / "_kernel.abi3.so").exists() or "waiter" in message
    return message


def test_it_builds_the_abi3_extension_and_the_static_waiter(hook: Any, tmp_path: Path) -> None:
    root = source_tree(tmp_path)
    (root / KERNEL / "_kernel.cpython-311-x86_64-linux-gnu.so").write_bytes(b"stale")
    data = build(hook, root)
    platform = sysconfig.get_platform().replace("-", "_")
    assert data["tag"] == f"cp311-abi3-{platform}"
    assert sorted(p.name for p in (root / KERNEL).glob("_kernel*.so")) == ["_kernel.abi3.so"]
    waiter = root / KERNEL / "trunner-waiter"
    assert waiter.stat().st_mode & stat.S_IXUSR
    elf = waiter.read_bytes()
    assert program_header_types(elf).isdisjoint({PT_INTERP, PT_DYNAMIC})
    # Static musl, nothing loaded: no dynamic symbols (imports), no
    # relocations to apply at start-up, a few pages (most of the file is
    # the padding between its code, read-only and writable segments).
    assert section_types(elf).isdisjoint({SHT_DYNSYM, SHT_DYNAMIC, SHT_RELA, SHT_REL})
    assert len(elf) < 32 * 1024
    assert set(data["force_include"].values()) == {f"{KERNEL}/_kernel.abi3.so",
                                                   f"{KERNEL}/trunner-waiter"}


def test_a_missing_compiler_is_one_line(hook: Any, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-cc")
    message = fails(hook, source_tree(tmp_path))
    assert message.startswith("trunner-sandbox: no C compiler ('no-such-cc' not found)")
    assert "install gcc" in message


def test_missing_headers_are_one_line(hook: Any, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "include"
    empty.mkdir()
    real = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {**real(), "include": str(empty)})
    message = fails(hook, source_tree(tmp_path))
    ver = "{}.{}".format(*sys.version_info[:2])
    assert message == (f"trunner-sandbox: no Python.h in {empty}: install this interpreter's "
                       f"headers (python{ver}-dev on Debian and Ubuntu, python3-devel on "
                       "Fedora and RHEL)")


def test_a_missing_musl_gcc_is_one_line(hook: Any, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSL_CC", "no-such-musl-gcc")
    root = source_tree(tmp_path)
    message = fails(hook, root)
    assert message.startswith("trunner-sandbox: no musl-gcc ('no-such-musl-gcc' not found)")
    assert "install musl-tools" in message
    assert not (root / KERNEL / "_kernel.abi3.so").exists()  # refused before any compile


def test_the_waiter_needs_no_static_system_c_library(hook: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A compiler with no static C library of the system's (no glibc libc.a:
    # any static link fails): the waiter builds all the same, on musl's.
    cc = tmp_path / "cc-without-libc-a"
    cc.write_text('#!/bin/sh\nfor a; do [ "$a" = -static ] && '
                  '{ echo "ld: cannot find -lc" >&2; exit 1; }; done\nexec cc "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    root = source_tree(tmp_path / "src")
    build(hook, root)
    assert (root / KERNEL / "trunner-waiter").stat().st_mode & stat.S_IXUSR


def test_a_failing_waiter_compile_is_one_line(hook: Any, tmp_path: Path) -> None:
    root = source_tree(tmp_path)
    with open(root / KERNEL / "waiter.c", "a") as f:
        f.write("\n#error not this time\n")
    message = fails(hook, root)
    assert message == ("trunner-sandbox: compiling trunner/kernel/waiter.c failed "
                       "(the compiler's words are above)")
    assert not (root / KERNEL / "trunner-waiter").exists()


@pytest.mark.parametrize("werror", ["", "1"])
def test_warnings_are_errors_only_in_the_projects_own_builds(
        hook: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, werror: str) -> None:
    root = source_tree(tmp_path)
    with open(root / KERNEL / "_kernel.c", "a") as f:
        f.write("\nstatic int unused_by_anyone(void) { int x; return 0; }\n")
    if werror:
        monkeypatch.setenv("TRUNNER_WERROR", werror)
        message = fails(hook, root)
        assert message == ("trunner-sandbox: compiling trunner/kernel/_kernel.c failed "
                           "(the compiler's words are above)")
    else:
        build(hook, root)
        assert os.path.getsize(root / KERNEL / "_kernel.abi3.so") > 0
