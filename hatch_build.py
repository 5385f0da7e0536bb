"""Build hook: compile the helper's C parts into trunner/linux/ (so an
editable install finds them in place) and put them in the wheel:
_kernel.c, its raw system calls (an extension module), and waiter.c, the
static `trunner-waiter` it becomes once the jail's pid 1 is forked. Needs a
C compiler (`CC`, default `cc`), the interpreter's headers and a static C
library; a failed compile fails the install."""

import os
import subprocess
import sysconfig

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "trunner/linux/_kernel.c"
WAITER_SOURCE = "trunner/linux/waiter.c"
WAITER = "trunner/linux/trunner-waiter"


class KernelBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, object]) -> None:
        root, cc = self.root, os.environ.get("CC", "cc")
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        target = f"trunner/linux/_kernel{suffix}"
        command = [
            cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            os.path.join(root, SOURCE), "-o", os.path.join(root, target),
        ]
        subprocess.run(command, check=True)
        waiter = [cc, "-O2", "-Wall", "-Werror", "-static", "-s", os.path.join(root, WAITER_SOURCE),
                  "-o", os.path.join(root, WAITER)]
        subprocess.run(waiter, check=True)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if self.target_name == "wheel" and version != "editable":
            force_include = build_data.setdefault("force_include", {})
            assert isinstance(force_include, dict)
            force_include[os.path.join(root, target)] = target
            force_include[os.path.join(root, WAITER)] = WAITER
