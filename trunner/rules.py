"""The effective rules version: one BLAKE3 digest naming the rules in force.

It hashes a canonical msgpack encoding (sorted keys) of the backend's rules
document: on Linux the very helper plan that is enforced (rlimits, process
limit, namespaces, capabilities, Landlock rules at the ABI used, the seccomp
BPF bytes, skipped layers if any), the environment, the limits the parent
enforces, and, when a provider is configured, the BLAKE3 of the provider
template. Per-run values (jail dir, cgroup, parent pid) and install
locations are placeholders.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import blake3
import msgspec

if TYPE_CHECKING:
    from trunner.jail import JailBackend
    from trunner.limits import Limits

_ENCODER = msgspec.msgpack.Encoder(order="sorted")


def effective_rules_version(backend: JailBackend, limits: Limits) -> str:
    """Hex BLAKE3 of the canonical rules document."""
    return blake3.blake3(_ENCODER.encode(backend.rules_document(limits))).hexdigest()


def provider_profile_template_blake3() -> str | None:
    """The BLAKE3 of the provider jail profile template on this platform, or
    None where no provider profile is measured (no backend here)."""
    from trunner.profile import PROVIDER_TEMPLATE

    if sys.platform != "linux" or not os.path.exists(PROVIDER_TEMPLATE):
        return None
    with open(PROVIDER_TEMPLATE, "rb") as f:
        return blake3.blake3(f.read()).hexdigest()
