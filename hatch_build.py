"""Build hook: compile the helper's C parts into trunner/kernel/ (so an
editable install finds them in place) and put them in the wheel:

- _kernel.c, its raw system calls: an extension module on the stable ABI of
  3.11 (`_kernel.abi3.so`, so the wheel is `cp311-abi3` and loads on every
  CPython from 3.11 on);
- waiter.c: the static `trunner-waiter` it becomes once the jail's pid 1 is
  forked, with `abi.h` generated from abi.py first. It links static musl
  (`MUSL_CC`, default `musl-gcc`: Debian's musl-tools), whose start-up is a
  system call or two, where a static glibc binary's costs ~0.6 ms more an exec.

A source build needs a C compiler (`CC`, default `cc`), musl-gcc and the
interpreter's headers; each one missing fails with one line naming what to
install. An install from the wheel needs none of them.
Warnings are errors only where TRUNNER_WERROR=1 (the project's own builds:
scripts/setup, scripts/build-wheel, CI), never for a user's `pip install`,
where a newer compiler may warn of something new.
"""

import os
import runpy
import shlex
import shutil
import subprocess
import sys
import sysconfig

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

KERNEL = "trunner/kernel"
SOURCE = f"{KERNEL}/_kernel.c"
TARGET = f"{KERNEL}/_kernel.abi3.so"
WAITER_SOURCE = f"{KERNEL}/waiter.c"
WAITER = f"{KERNEL}/trunner-waiter"
#: The stable-ABI floor, also set in _kernel.c: requires-python's 3.11.
ABI_TAG = "cp311-abi3"
#: The waiter's flags: static musl, not position-independent (nothing to
#: relocate at start-up), no unwind tables (nothing unwinds), stripped.
WAITER_FLAGS = ["-O2", "-static", "-fno-pie", "-no-pie", "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables", "-Wl,-z,noexecstack", "-s"]


def fail(message: str) -> None:
    """End the build with one line (pip shows it under the hook's output)."""
    raise SystemExit(f"trunner-sandbox: {message}")


def compile_c(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a compile, passing its words on (pip shows them on failure)."""
    done = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(done.stdout + done.stderr)
    return done


class KernelBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, object]) -> None:
        root = self.root
        cc = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
        if shutil.which(cc[0]) is None:
            fail(f"no C compiler ({cc[0]!r} not found) to build from source: install gcc "
                 "(apt-get install gcc, dnf install gcc), or install the published wheel, "
                 "which needs none")
        musl_cc = shlex.split(os.environ.get("MUSL_CC", "musl-gcc")) or ["musl-gcc"]
        if shutil.which(musl_cc[0]) is None:
            fail(f"no musl-gcc ({musl_cc[0]!r} not found) to build the static trunner-waiter "
                 "from source: install musl-tools (apt-get install musl-tools; on Fedora, dnf "
                 "install musl-gcc musl-libc-static), or install the published wheel, which "
                 "needs none")
        include = sysconfig.get_paths()["include"]
        if not os.path.exists(os.path.join(include, "Python.h")):
            ver = "{}.{}".format(*sys.version_info[:2])
            fail(f"no Python.h in {include}: install this interpreter's headers "
                 f"(python{ver}-dev on Debian and Ubuntu, python3-devel on Fedora and RHEL)")
        warnings = ["-Wall", "-Werror"] if os.environ.get("TRUNNER_WERROR") == "1" else ["-Wall"]
        abi = runpy.run_path(os.path.join(root, KERNEL, "abi.py"))
        with open(os.path.join(root, KERNEL, "abi.h"), "w") as f:
            f.write(abi["c_header"]())
        # A version-specific build left by an older checkout would load first.
        for name in os.listdir(os.path.join(root, KERNEL)):
            if name.startswith("_kernel.") and name.endswith(".so") and name != "_kernel.abi3.so":
                os.unlink(os.path.join(root, KERNEL, name))
        extension = [*cc, "-O2", *warnings, "-shared", "-fPIC", f"-I{include}",
                     os.path.join(root, SOURCE), "-o", os.path.join(root, TARGET)]
        if compile_c(extension).returncode != 0:
            fail(f"compiling {SOURCE} failed (the compiler's words are above)")
        waiter = [*musl_cc, *WAITER_FLAGS, *warnings, f"-I{os.path.join(root, KERNEL)}",
                  os.path.join(root, WAITER_SOURCE), "-o", os.path.join(root, WAITER)]
        if compile_c(waiter).returncode != 0:
            fail(f"compiling {WAITER_SOURCE} failed (the compiler's words are above)")
        build_data["pure_python"] = False
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"{ABI_TAG}-{platform}"
        if self.target_name == "wheel" and version != "editable":
            force_include = build_data.setdefault("force_include", {})
            assert isinstance(force_include, dict)
            force_include[os.path.join(root, TARGET)] = TARGET
            force_include[os.path.join(root, WAITER)] = WAITER
