"""Build hook: compile trunner/linux/_kernel.c, the helper's raw system
calls, into trunner/linux/ (so an editable install finds it in place), and
put it in the wheel. Needs a C compiler (`CC`, default `cc`) and the
interpreter's headers; a failed compile fails the install."""

import os
import subprocess
import sysconfig

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "trunner/linux/_kernel.c"


class KernelBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, object]) -> None:
        root = self.root
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        target = f"trunner/linux/_kernel{suffix}"
        command = [
            os.environ.get("CC", "cc"), "-O2", "-Wall", "-Werror", "-shared", "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            os.path.join(root, SOURCE), "-o", os.path.join(root, target),
        ]
        subprocess.run(command, check=True)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if self.target_name == "wheel" and version != "editable":
            force_include = build_data.setdefault("force_include", {})
            assert isinstance(force_include, dict)
            force_include[os.path.join(root, target)] = target
