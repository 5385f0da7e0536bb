"""Build hook: compile the helper's C parts into trunner/linux/kernel/ (so an
editable install finds them in place) and put them in the wheel:
_kernel.c, its raw system calls (an extension module), and waiter.c, the
static `trunner-waiter` it becomes once the jail's pid 1 is forked, with
`abi.h` generated from abi.py first. Needs a C compiler (`CC`, default
`cc`), the interpreter's headers and a static C library; a failed compile
fails the install."""

import os
import runpy
import subprocess
import sysconfig

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

KERNEL = "trunner/linux/kernel"
SOURCE = f"{KERNEL}/_kernel.c"
WAITER_SOURCE = f"{KERNEL}/waiter.c"
WAITER = f"{KERNEL}/trunner-waiter"


class KernelBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, object]) -> None:
        root, cc = self.root, os.environ.get("CC", "cc")
        abi = runpy.run_path(os.path.join(root, KERNEL, "abi.py"))
        with open(os.path.join(root, KERNEL, "abi.h"), "w") as f:
            f.write(abi["c_header"]())
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        target = f"{KERNEL}/_kernel{suffix}"
        command = [
            cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            os.path.join(root, SOURCE), "-o", os.path.join(root, target),
        ]
        subprocess.run(command, check=True)
        waiter = [cc, "-O2", "-Wall", "-Werror", "-static", "-s", f"-I{os.path.join(root, KERNEL)}",
                  os.path.join(root, WAITER_SOURCE), "-o", os.path.join(root, WAITER)]
        subprocess.run(waiter, check=True)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if self.target_name == "wheel" and version != "editable":
            force_include = build_data.setdefault("force_include", {})
            assert isinstance(force_include, dict)
            force_include[os.path.join(root, target)] = target
            force_include[os.path.join(root, WAITER)] = WAITER
