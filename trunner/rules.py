"""The effective rules version: one BLAKE3 digest naming the rules in force.

A backend's `rules_version(limits)` is the `digest` of a canonical msgpack
encoding (sorted keys) of its `rules_document(limits)`: on Linux the very
helper plan that is enforced (rlimits, process limit, namespaces,
capabilities, Landlock rules at the ABI used, the seccomp BPF bytes and the
libseccomp that compiled them, skipped layers if any), the environment, the
limits the parent enforces, and, when a provider is configured, the BLAKE3
of the provider template. Per-run values (cgroups, parent pid, host uid and
gid) and install locations are placeholders, so the same rules give the
same version on any host, in any run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import blake3
import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping

_ENCODER = msgspec.msgpack.Encoder(order="sorted")


def digest(document: Mapping[str, object]) -> str:
    """Hex BLAKE3 of `document`'s canonical encoding (msgpack, keys sorted)."""
    return blake3.blake3(_ENCODER.encode(document)).hexdigest()
