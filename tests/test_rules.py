"""The effective rules version and the provider profile."""

from __future__ import annotations

import copy
import dataclasses
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import blake3
import msgspec
import pytest

from conftest import TESTS_DIR, child_pids, landlock_abi_in_force, make_runner
from support import plan_for, run_code, scaled
from trunner import Limits, Reason, Runner, RunnerError, provider_profile_template_blake3
from trunner.limits import AUTO_ADDRESS_SPACE_BYTES, AUTO_FILE_SIZE_SLACK_BYTES, file_size_for
from trunner.linux import landlock
from trunner.linux.backend import LinuxBackend
from trunner.linux.probe import probe_host
from trunner.linux.profile import DEFAULT_PROFILE, PROVIDER_TEMPLATE, provider_profile
from trunner.linux.seccomp import DEFAULT_POLICY, build_bpf, without_memory_cgroup
from trunner.rules import digest

#: The default profile's version with default Limits on the CI host
#: (x86_64, Landlock ABI 7, root with a pids, a memory and a cpuacct cgroup and cpu and cpuset
#: cgroups for the view, no import paths;
#: address_space_bytes "auto" resolved to no RLIMIT_AS, file_size_bytes "auto" to
#: scratch_bytes + 64 KiB; with 64 MiB given, the version before item 5 of issue 35, 8c72d808...).
#: A rule change must change this line: that is the point.
GOLDEN_DEFAULT = "589f734d9d9a2d7907064ceb5eacab4723cb8ff2d4cea6d393207cb8601898c0"


def version(limits: Limits | None = None, **backend: Any) -> str:
    return LinuxBackend("trunner-worker", **backend).rules_version(limits or Limits())


#: The lowest Landlock ABI a jail sharing the host network is planned at (its
#: TCP port rules, ABI 4, and abstract socket scope, ABI 6). The version of
#: such a profile is computed there (a pure plan: the same on any host); the
#: kernel's ABI would refuse it below.
HOST_NETWORK_ABI = max(f.abi for f in landlock.FEATURES
                       if f.name in landlock.HOST_NETWORK_FEATURES)


def provider_skip_reason() -> str | None:
    """Why a provider (host network) jail cannot run at the Landlock ABI in
    force, naming the feature it lacks; None where it can."""
    abi = landlock_abi_in_force()
    lacking = landlock.host_network_shortfall(abi)
    if lacking is None:
        return None
    return (f"the provider profile needs Landlock {lacking.name} (ABI {lacking.abi}); the ABI"
            f" in force is {abi} (its refusal: test_provider_needs_landlock_abi_6_and_says_why"
            "_before_spawn)")


def test_same_inputs_same_version_in_two_processes() -> None:
    code = (
        "from trunner.linux.backend import LinuxBackend; from trunner.limits import Limits;"
        "print(LinuxBackend('trunner-worker').rules_version(Limits()))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True,
                           timeout=scaled(60))
    assert other.stdout.decode().strip() == version()


@pytest.mark.parametrize("parent", ["/tmp", "/var/tmp"])  # before and after /usr
def test_a_checkout_elsewhere_has_the_same_version(parent: str) -> None:
    # The package's path sorts among the system dirs differently in each
    # place; the version must not follow it (it did: Landlock's path rules).
    where = Path(tempfile.mkdtemp(dir=parent))
    try:
        shutil.copytree(Path(__file__).resolve().parent.parent / "trunner", where / "trunner",
                        ignore=shutil.ignore_patterns("__pycache__"))
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); import trunner;"
            "assert trunner.__file__.startswith(sys.argv[1]), trunner.__file__;"
            "from trunner.linux.backend import LinuxBackend; from trunner.limits import Limits;"
            "print(LinuxBackend('trunner-worker').rules_version(Limits()))"
        )
        other = subprocess.run([sys.executable, "-c", code, str(where)], capture_output=True,
                               timeout=scaled(60))
        assert other.returncode == 0, other.stderr
        assert other.stdout.decode().strip() == version()
    finally:
        shutil.rmtree(where)


def test_file_size_auto_is_the_scratch_size_in_the_version() -> None:
    """"auto" hashes as the number it applies: the same rules, one version."""
    assert version(Limits()) == version(Limits(file_size_bytes=file_size_for(Limits())))
    assert version(Limits(scratch_bytes=64 << 20)) == version(
        Limits(scratch_bytes=64 << 20, file_size_bytes=(64 << 20) + AUTO_FILE_SIZE_SLACK_BYTES))
    assert version(Limits()) != version(Limits(file_size_bytes=64 << 20))


def test_golden_default_version() -> None:
    host = probe_host()
    kind = host.process_limit.kind if host.process_limit else None
    if (platform.machine(), host.landlock_abi, kind) != ("x86_64", 7, "pids_cgroup"):
        pytest.skip("the golden digest is pinned for x86_64, Landlock ABI 7, root")
    assert version() == GOLDEN_DEFAULT


PROFILE_CHANGES = {
    "namespaces": ("cgroup", "ipc", "mount", "pid", "user", "uts"),
    "read_exec": (*DEFAULT_PROFILE.read_exec, "/opt"),
    "read_only": DEFAULT_PROFILE.read_only[1:],
    "read_write": (),
    "tcp_connect_ports": (443,),
    "provider_hosts": ("example.org",),
    "seccomp": msgspec.structs.replace(DEFAULT_POLICY, allowed=DEFAULT_POLICY.allowed[1:]),
    "environment": ("PATH",),
}


@pytest.mark.parametrize("field", sorted(PROFILE_CHANGES))
def test_each_profile_field_changes_the_version(field: str) -> None:
    base = DEFAULT_PROFILE
    if field == "tcp_connect_ports":
        # Enforced (Landlock's TCP rules) only where the host network is shared.
        base = msgspec.structs.replace(DEFAULT_PROFILE, namespaces=PROFILE_CHANGES["namespaces"])
    changed = msgspec.structs.replace(base, **{field: PROFILE_CHANGES[field]})
    # Without a network namespace the plan needs Landlock's host-network features.
    abi = HOST_NETWORK_ABI if "net" not in changed.namespaces else None
    assert version(profile=changed, landlock_abi=abi) != version(profile=base, landlock_abi=abi)


def test_ports_are_not_hashed_where_nothing_enforces_them() -> None:
    """With a network namespace of its own the jail's Landlock handles no TCP
    (its loopback is the run's), so ports there decide nothing and are not hashed."""
    changed = msgspec.structs.replace(DEFAULT_PROFILE, tcp_connect_ports=(443,))
    assert version(profile=changed) == version()


def test_every_profile_field_is_covered() -> None:
    assert set(PROFILE_CHANGES) | {"name"} == set(DEFAULT_PROFILE.__struct_fields__)


def test_what_is_not_enforced_is_not_hashed() -> None:
    # A profile's name decides nothing the helper applies.
    assert version(profile=msgspec.structs.replace(DEFAULT_PROFILE, name="other")) == version()


@pytest.mark.parametrize("field", Limits.__struct_fields__)
def test_each_limits_field_changes_the_version(field: str) -> None:
    """Each enforced limit is hashed. `memory_bytes` too, root or not: it
    sizes the run's IPC namespace even where no memory cgroup holds it."""
    value = getattr(Limits(), field)
    if value == "auto":  # address_space_bytes: twice what "auto" resolves to differs from it
        value = AUTO_ADDRESS_SPACE_BYTES
    assert version(Limits().replace(**{field: value * 2})) != version()


def test_a_run_without_a_memory_cgroup_has_its_own_filter_and_version() -> None:
    """Without a memory cgroup memfd_create and landlock_create_ruleset fail
    ENOSYS (`seccomp.without_memory_cgroup`): the plan's filter differs, and
    the version names it. With `address_space_bytes` fixed, the memory plan
    and the filter are all that differ; the filter alone moves the version."""
    host = probe_host()
    limits = Limits(address_space_bytes=1 << 30)

    def document(memory_cgroup_base: str) -> dict[str, Any]:
        backend = LinuxBackend("trunner-worker", _host=dataclasses.replace(
            host, memory_cgroup_base=memory_cgroup_base))
        return backend.rules_document(limits)

    with_cgroup, without = document("/sys/fs/cgroup/memory"), document("")
    assert {key for key, value in with_cgroup["plan"].items()
            if without["plan"][key] != value} == {"memory", "seccomp_bpf"}
    assert with_cgroup["plan"]["seccomp_bpf"] == build_bpf(DEFAULT_POLICY)
    assert without["plan"]["seccomp_bpf"] == build_bpf(without_memory_cgroup(DEFAULT_POLICY))
    swapped = copy.deepcopy(without)
    swapped["plan"]["seccomp_bpf"] = with_cgroup["plan"]["seccomp_bpf"]
    assert digest(swapped) != digest(without)


def test_import_paths_and_provider_change_the_version() -> None:
    assert version(import_paths=(TESTS_DIR,)) != version()
    abi = HOST_NETWORK_ABI  # the provider's plan needs it: see HOST_NETWORK_ABI
    provider = version(profile=provider_profile({"ports": [443]}), landlock_abi=abi)
    assert provider != version(landlock_abi=abi)
    assert provider != version(profile=provider_profile({"ports": [8443]}), landlock_abi=abi)


def test_template_digest_is_blake3_of_the_shipped_file() -> None:
    digest = provider_profile_template_blake3()
    assert digest == blake3.blake3(Path(PROVIDER_TEMPLATE).read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("config", "template", "match"),
    [
        ({"ports": [0]}, None, "ports"),
        ({"ports": [70000]}, None, "ports"),
        ({"ports": []}, None, "ports"),
        ({"ports": [443], "bogus": 1}, None, "bogus"),
        ({"ports": [443], "read_only": ["/no/such/path"]}, None, "/no/such/path"),
        ({"ports": [443], "read_only": ["relative"]}, None, "relative"),
        ({"ports": [443]}, 'name = "p"\nx = {{nope}}\n', "nope"),
        ({"ports": [443]}, 'name = {{ports\n', "unbalanced"),
    ],
)
def test_bad_provider_configuration_is_refused(
    config: dict[str, Any], template: str | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        provider_profile(config, template=template)


def test_bad_provider_configuration_is_refused_at_runner_construction(jail_root: Path) -> None:
    with pytest.raises(ValueError, match="ports"):
        Runner(temp_root=str(jail_root), provider={"ports": [99999]})
    assert child_pids() == []


CONNECT = """
import errno, socket
out = {}
for port in PORTS:
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        out[port] = "connected"
    except OSError as e:
        out[port] = errno.errorcode[e.errno]
    finally:
        s.close()
result = out
"""


def _listen() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    s.setblocking(False)
    return s


async def test_provider_connects_to_allowed_port_only(jail_root: Path) -> None:
    """Landlock's TCP port rules (ABI 4) in the host network: the allowed port
    connects, any other is refused (EACCES) and its listener sees nothing."""
    if (reason := provider_skip_reason()) is not None:
        pytest.skip(reason)
    with _listen() as allowed, _listen() as other:
        ports = [allowed.getsockname()[1], other.getsockname()[1]]
        runner = make_runner(
            temp_root=str(jail_root), import_paths=[TESTS_DIR], provider={"ports": ports[:1]}
        )
        result = await run_code(runner, CONNECT.replace("PORTS", repr(ports)))
        assert result == {ports[0]: "connected", ports[1]: "EACCES"}
        conn, _ = allowed.accept()  # the allowed listener saw exactly that one
        conn.close()
        with pytest.raises(BlockingIOError):
            other.accept()


async def test_default_profile_connects_nowhere(runner: Runner) -> None:
    with _listen() as listener:
        port = listener.getsockname()[1]
        result = await run_code(runner, f"""
            import socket
            result = attempt(lambda: socket.socket().connect(("127.0.0.1", {port})))
        """)
        assert result == "ECONNREFUSED"  # the run's own loopback: nothing listens there
        with pytest.raises(BlockingIOError):
            listener.accept()


async def test_provider_still_denies_udp_unix_and_bind(jail_root: Path) -> None:
    if (reason := provider_skip_reason()) is not None:
        pytest.skip(reason)
    runner = make_runner(temp_root=str(jail_root), import_paths=[TESTS_DIR],
                         provider={"ports": [9]})
    result = await run_code(runner, """
        import socket
        result = attempt(lambda: socket.socket().bind(("127.0.0.1", 0)))
    """)
    assert result == "EPERM"  # the filter's (any family), before Landlock's EACCES
    result = await run_code(runner, """
        import socket
        result = [attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
                  attempt(lambda: socket.socket(socket.AF_UNIX))]
    """)
    assert result == ["ESOCKTNOSUPPORT", "EAFNOSUPPORT"]


@pytest.mark.parametrize(("abi", "missing"), [(1, "tcp"), (3, "tcp"),
                                              (4, "scope_abstract_unix_socket"),
                                              (5, "scope_abstract_unix_socket"), (6, None)])
def test_provider_needs_landlock_abi_6_and_says_why_before_spawn(
    jail_root: Path, abi: int, missing: str | None
) -> None:
    """The provider shares the host network: no namespace covers TCP ports (ABI 4)
    or abstract sockets (ABI 6) there. Below, `Runner()` refuses, naming the
    feature, and the pure plan refuses too. A cap above the kernel's ABI is
    refused first, for either profile, naming the kernel's."""
    profile = provider_profile({"ports": [443]})
    if missing is not None:  # a pure plan: the same on any host
        with pytest.raises(ValueError, match=f"needs {missing}"):
            plan_for(Limits(), probe_host(), profile, landlock_abi=abi)
    backend = LinuxBackend("trunner-worker", profile=profile, landlock_abi=abi)
    default = LinuxBackend("trunner-worker", landlock_abi=abi)
    kernel = probe_host().landlock_abi
    if abi > kernel:
        for refused in (backend, default):
            with pytest.raises(RunnerError) as info:
                Runner(temp_root=str(jail_root), backend=refused)
            assert info.value.reason is Reason.SANDBOX_SETUP
            assert info.value.detail == f"landlock: ABI {abi} asked, the kernel has {kernel}"
        assert child_pids() == []
        pytest.skip(f"the kernel's Landlock ABI is {kernel}: a Runner capped at ABI {abi}"
                    " is refused as such (asserted), not for the provider's features")
    if missing is None:
        Runner(temp_root=str(jail_root), backend=backend)
        return
    with pytest.raises(RunnerError) as info:
        Runner(temp_root=str(jail_root), backend=backend)
    assert info.value.reason is Reason.SANDBOX_SETUP
    assert info.value.detail.startswith("provider profile: landlock: ")
    assert f"needs {missing} (" in info.value.detail
    assert child_pids() == []
    # The default profile has its own network namespace: it runs at that ABI.
    Runner(temp_root=str(jail_root), backend=default)


@pytest.mark.parametrize("abi", [1, 2, 3, 4, 5, 6])
def test_the_abi_in_force_is_in_the_version(abi: int) -> None:
    """A cap changes the version, but where it is the kernel's own ABI."""
    kernel = min(probe_host().landlock_abi, landlock.KNOWN_ABI)
    assert (version(landlock_abi=abi) == version()) == (abi == kernel)
    ruleset = LinuxBackend("trunner-worker", landlock_abi=abi).rules_document(Limits())[
        "plan"]["landlock"]
    assert ruleset["abi"] == abi
