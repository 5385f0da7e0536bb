"""The Landlock ABI in force, and what stands in for each feature an older ABI lacks.

`.ci/run` runs tests/security again with TRUNNER_TEST_LANDLOCK_ABI at 1, 3, 4
and 6 (as on Linux 5.13, 6.2, 6.7 and 6.12). These tests prove that the cap is
what the kernel enforces (a capped pass that silently ran at the kernel's ABI
would prove nothing) and that it is what the rules version records. Escapes
that depend on one feature are asserted where they live (network, signals);
this file holds the ones no other file had.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conftest import landlock_abi_in_force, make_runner
from support import rules_document, run_code
from trunner import Limits, Runner
from trunner.linux.backend import LinuxBackend
from trunner.linux.landlock import FEATURES, KNOWN_ABI, features_for_abi
from trunner.linux.probe import probe_host
from trunner.worker import locate_worker

if TYPE_CHECKING:
    from pathlib import Path


def test_the_abi_in_force_is_the_one_hashed(runner: Runner) -> None:
    """The rules version records the ABI used: a capped jail has its own version."""
    abi = landlock_abi_in_force()
    doc = rules_document(runner)
    ruleset = doc["plan"]["landlock"]
    assert ruleset["abi"] == abi
    features = features_for_abi(abi)
    # The default profile's network namespace is its own: Landlock handles no TCP
    # there (its loopback is the run's); the provider's TCP rules: test_network.py.
    assert ruleset["handled_net"] == 0
    assert bool(ruleset["scoped"]) == features["scope_signal"]
    full = Runner(backend=LinuxBackend(locate_worker(), import_paths=runner.import_paths),
                  limits=runner.limits)
    kernel = min(probe_host().landlock_abi, KNOWN_ABI)
    assert (runner.rules_version() == full.rules_version()) == (abi == kernel)


async def test_the_kernel_enforces_the_abi_in_force(runner: Runner) -> None:
    """Observed from inside the jail, where the ABIs differ: a rename across
    directories of the working dir (refused by ABI 1, which lacks REFER, EXDEV),
    and a terminal ioctl on /dev/null (from ABI 5 refused by Landlock, EACCES;
    below, the driver answers ENOTTY)."""
    result = await run_code(runner, """
        import fcntl, termios
        os.mkdir("a")
        os.mkdir("b")
        for name in ("a/f", "a/h"):
            with open(name, "w") as f:
                f.write("x")
        with open("/dev/null", "rb") as null:
            result = [attempt(lambda: os.rename("a/f", "b/f")),
                      attempt(lambda: os.rename("a/h", "a/i")),
                      attempt(lambda: fcntl.ioctl(null.fileno(), termios.TCGETS, b"\\0" * 64))]
    """)
    abi = landlock_abi_in_force()
    assert result[0] == ("EXDEV" if abi < 2 else "OK:None")
    assert result[1] == "OK:None"  # within one directory: at every ABI
    assert result[2] == ("EACCES" if abi >= 5 else "ENOTTY")


async def test_truncating_a_bound_host_file_fails(runner: Runner, tmp_path: Path) -> None:
    """Truncate (Landlock ABI 3) a host file the jail may read, by path, by
    O_TRUNC and by ftruncate: below ABI 3 Landlock does not see truncation at
    all; the read-only bind refuses it (EROFS) at every ABI."""
    victim = tmp_path / "ro" / "victim"
    victim.parent.mkdir()
    victim.write_text("host data\n")
    victim.chmod(0o666)  # so that DAC lets any uid write it: only the jail's layers refuse
    jailed = make_runner(import_paths=(*runner.import_paths, str(victim.parent)),
                         temp_root=runner.temp_root, limits=Limits(wall_time_s=20.0))
    before = victim.stat()
    result = await run_code(jailed, f"""
        p = {str(victim)!r}
        def ftruncate():
            with open(p, "rb") as f:
                os.ftruncate(f.fileno(), 0)
        result = [attempt(lambda: os.truncate(p, 0)),
                  attempt(lambda: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))),
                  attempt(ftruncate),
                  attempt(lambda: open(p).read())]
    """)
    # ftruncate on a read-only descriptor: EINVAL, whatever the ABI.
    assert result == ["EROFS", "EROFS", "EINVAL", "OK:" + repr("host data\n")]
    assert victim.read_text() == "host data\n"
    assert victim.stat().st_mtime_ns == before.st_mtime_ns


def test_every_missing_feature_names_what_covers_it() -> None:
    abi = landlock_abi_in_force()
    for feature in FEATURES:
        assert feature.without
        assert features_for_abi(abi)[feature.name] == (abi >= feature.abi)
