"""The effective rules version: one BLAKE3 digest naming the rules in force.

It hashes a canonical msgpack encoding (sorted keys) of everything that
decides the rules as applied on this host: a schema version, the jail
profile (namespaces, Landlock paths and rights, network policy, the seccomp
policy, the environment names, the process-limit mechanism), the seccomp BPF
bytes for this architecture, the Landlock ABI actually used, the `Limits`,
the import paths, and, when a provider is configured, the BLAKE3 of the
provider profile template. Not hashed: host paths behind the profile's
symbolic `@python`/`@trunner` entries, and the per-run jail dir.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import TYPE_CHECKING, Any, Final

import blake3
import msgspec

if TYPE_CHECKING:
    from trunner.jail import JailBackend
    from trunner.limits import Limits

#: Bump when the meaning of a hashed field changes.
SCHEMA_VERSION: Final = 1

_ENCODER = msgspec.msgpack.Encoder(order="sorted")


def rules_document(backend: JailBackend, limits: Limits) -> dict[str, Any]:
    """The canonical description of the rules, before hashing."""
    from trunner.linux import backend as linux

    assert isinstance(backend, linux.LinuxBackend)
    profile = backend.profile
    doc: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "backend": "linux",
        "machine": platform.machine(),
        "profile": profile,
        "seccomp_bpf": backend.bpf(),
        "landlock_abi": backend.abi(),
        "process_limit": (backend.probe().process_limit or "").split(":", 1)[0],
        "import_paths": list(backend.import_paths),
        "limits": msgspec.structs.asdict(limits),
    }
    if profile.name == "provider":
        doc["provider_template_blake3"] = provider_profile_template_blake3()
    return doc


def effective_rules_version(backend: JailBackend, limits: Limits) -> str:
    """Hex BLAKE3 of the canonical rules document."""
    return blake3.blake3(_ENCODER.encode(rules_document(backend, limits))).hexdigest()


def provider_profile_template_blake3() -> str | None:
    """The BLAKE3 of the provider jail profile template on this platform, or
    None where no provider profile is measured (no backend here)."""
    from trunner.profile import PROVIDER_TEMPLATE

    if sys.platform != "linux" or not os.path.exists(PROVIDER_TEMPLATE):
        return None
    with open(PROVIDER_TEMPLATE, "rb") as f:
        return blake3.blake3(f.read()).hexdigest()
