"""The public namespace: what `import trunner` offers, and what it costs."""

from __future__ import annotations

import enum
import subprocess
import sys

import msgspec

import trunner


def test_all_names_resolve_and_nothing_else_is_public() -> None:
    for name in trunner.__all__:
        assert getattr(trunner, name) is not None, name
    assert sorted(trunner.__all__) == sorted(dir(trunner))


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
        "import sys; import trunner.helper, trunner.linux.install;"
        "print(' '.join(sorted(m for m in ('trio', 'msgspec', 'blake3', 'pyseccomp', 'typing')"
        " if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, "
                          f"{trunner.__path__[0].rsplit('/', 1)[0]!r}); {code}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
