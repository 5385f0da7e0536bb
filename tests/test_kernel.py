"""trunner.kernel._kernel, the helper's raw system calls (no ctypes), and the
install wrappers built on it: arguments reach the kernel as given, refusals
come back as the kernel's errno, and the helper imports neither ctypes nor
os."""

import errno
import os
import platform
import resource
import subprocess
import sys

import pytest

from trunner.kernel import _kernel, install

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_out(code: str) -> str:
    """The stdout of `code` run by a fresh interpreter (which must exit 0)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout


def test_numbers_come_from_this_build() -> None:
    if platform.machine() != "x86_64":
        pytest.skip(f"the known table below is x86_64's, this is {platform.machine()}")
    assert _kernel.NR == {
        "capset": 126, "close_range": 436, "landlock_add_rule": 445,
        "landlock_create_ruleset": 444, "landlock_restrict_self": 446, "mount": 165,
        "pivot_root": 155, "prctl": 157, "prlimit64": 302, "rt_sigaction": 13,
        "sethostname": 170, "setns": 308, "umount2": 166, "unshare": 272,
    }


def test_ints_bytes_and_none_reach_the_kernel() -> None:
    # prctl(PR_GET_DUMPABLE) answers 1 for this process.
    assert _kernel.syscall(_kernel.NR["prctl"], 3, 0, 0, 0, 0) == 1
    # A bytes path is a C string: the kernel looks it up and names the errno
    # (in a user and mount namespace of its own, so pivot_root is allowed to
    # get that far as any uid).
    code = (
        "from trunner.kernel import install\n"
        "install.unshare(0x10000000 | 0x00020000)\n"
        "try:\n"
        "    install.pivot_root('/no/such/dir', '/no/such/dir')\n"
        "except OSError as e:\n"
        "    print(e.errno, e.filename)\n"
    )
    assert python_out(code) == f"{errno.ENOENT} pivot_root(/no/such/dir, /no/such/dir)\n"
    # None is NULL: EFAULT would mean a pointer was passed instead.
    assert install.landlock_abi() >= 1


def test_bad_arguments_are_refused_before_the_call() -> None:
    with pytest.raises(TypeError, match="int, None or bytes, not str"):
        _kernel.syscall(_kernel.NR["prctl"], "3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="0 to 6"):
        _kernel.syscall(_kernel.NR["prctl"], 1, 2, 3, 4, 5, 6, 7)
    with pytest.raises(OSError, match="not a BPF program") as bad:
        install.install_seccomp(b"\0" * 7)
    assert bad.value.errno == errno.EINVAL
    with pytest.raises(OSError, match=r"not a BPF program \(0 bytes\)") as empty:
        _kernel.seccomp_filter(b"")  # install_seccomp is this: its checks are the C code's
    assert empty.value.errno == errno.EINVAL


def test_set_rlimit_is_setrlimit() -> None:
    """prlimit64's struct as install packs it: the soft and hard limits read
    back through resource, infinity (-1) included."""
    code = (
        "import resource; from trunner.kernel import install\n"
        "install.set_rlimit(resource.RLIMIT_NOFILE, 40, 50)\n"
        "install.set_rlimit(resource.RLIMIT_CORE, 0, -1)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE), "
        "resource.getrlimit(resource.RLIMIT_CORE))\n"
    )
    assert python_out(code).split("\n")[0] == f"(40, 50) (0, {resource.RLIM_INFINITY})"
    # Soft above hard: the kernel's EINVAL.
    with pytest.raises(OSError, match="setrlimit") as refused:
        install.set_rlimit(resource.RLIMIT_NOFILE, 10, 5)
    assert refused.value.errno == errno.EINVAL
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] != 10


def test_helper_imports_neither_ctypes_nor_os() -> None:
    """What the helper stage loads, as started (`python -I -S`)."""
    code = (
        f"import sys; sys.path.insert(0, {REPO!r})\n"
        "import trunner.worker.main, trunner.helper, trunner.kernel.mounts\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                            text=True, check=True).stdout.split()
    for heavy in ("ctypes", "os", "struct", "resource", "typing", "__future__"):
        assert heavy not in loaded
    assert "trunner.kernel._kernel" in loaded
