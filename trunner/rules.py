"""The effective rules version: one BLAKE3 digest naming the rules in force.

It hashes a canonical msgpack encoding (sorted keys) of everything that
decides the rules as applied on this host: a schema version, the Landlock
ABI used and rules, the seccomp BPF bytes for this architecture, the helper
plan's fixed parts and the `Limits`. Same rules on the same host, same
digest; any rule change, a new digest.
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING, Any, Final

import blake3
import msgspec

if TYPE_CHECKING:
    from trunner.jail import JailBackend
    from trunner.limits import Limits

#: Bump when the meaning of a hashed field changes.
SCHEMA_VERSION: Final = 1
#: Stands for the per-invocation jail dir, which is not a rule.
JAIL_DIR_PLACEHOLDER: Final = "<jail>"

_ENCODER = msgspec.msgpack.Encoder(order="sorted")


def rules_document(backend: JailBackend, limits: Limits) -> dict[str, Any]:
    """The canonical description of the rules, before hashing."""
    from trunner import linux, seccomp

    assert isinstance(backend, linux.LinuxBackend)
    host = backend.probe()
    ruleset = linux.landlock_ruleset(
        backend.abi(),
        JAIL_DIR_PLACEHOLDER,
        read_exec=linux.python_read_exec_paths(),
        read_only=backend.import_paths,
    )
    return {
        "schema": SCHEMA_VERSION,
        "backend": "linux",
        "machine": platform.machine(),
        "landlock": ruleset._asdict(),
        "seccomp_policy": seccomp.DEFAULT_POLICY._asdict(),
        "seccomp_bpf": backend.bpf(),
        "namespaces": ["user", "net"],
        "environment": sorted(linux.environment(JAIL_DIR_PLACEHOLDER).items()),
        "import_paths": list(backend.import_paths),
        "rlimits": [list(r) for r in linux.rlimits_for(limits)],
        "process_limit": (host.process_limit or "").split(":", 1)[0],
        "limits": msgspec.structs.asdict(limits),
    }


def effective_rules_version(backend: JailBackend, limits: Limits) -> str:
    """Hex BLAKE3 of the canonical rules document."""
    return blake3.blake3(_ENCODER.encode(rules_document(backend, limits))).hexdigest()


def provider_profile_template_blake3() -> str | None:
    """The BLAKE3 of the provider jail profile template on this platform, or
    None where no provider profile is measured."""
    path = os.path.join(os.path.dirname(__file__), "profiles", "provider.toml")
    if not os.path.exists(path) or not platform.system() == "Linux":
        return None
    with open(path, "rb") as f:
        return blake3.blake3(f.read()).hexdigest()
