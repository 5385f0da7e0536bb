"""Jail profiles: the declarative rules a backend applies, as data.

`DEFAULT_PROFILE` has a network namespace of its own, holding only the
run's loopback (brought up by the helper). The provider profile is the same
jail except that it shares the host's network namespace and may open TCP
connections to configured ports (Landlock ABI >= 4 net rules); it is made
from a template shipped in `trunner/linux/profiles/provider.toml`, whose
placeholders are filled from configuration. What a profile decides reaches
the helper's plan, and the plan is what the effective rules version hashes.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec

from trunner.linux import seccomp

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Symbolic paths, resolved by the backend on the host: the interpreter's
#: prefixes, and the directory trunner is imported from.
PYTHON_PATHS: Final = "@python"
TRUNNER_PATH: Final = "@trunner"

PROVIDER_TEMPLATE: Final = os.path.join(os.path.dirname(__file__), "profiles", "provider.toml")


class JailProfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The declarative rules one backend applies to every invocation.

    The jail dir is always read-write and is not part of the profile.
    """

    name: str
    #: Namespaces the helper unshares: cgroup, user, mount, pid, ipc and uts
    #: always (a plan without one is refused); "net" unless the profile needs
    #: the host network (provider).
    namespaces: tuple[str, ...]
    read_exec: tuple[str, ...]
    read_only: tuple[str, ...]
    read_write: tuple[str, ...]
    #: Outbound TCP connect is allowed to these ports only (none: no TCP).
    tcp_connect_ports: tuple[int, ...]
    #: The hosts a provider is meant to reach. Landlock filters TCP by port,
    #: not by address: this list documents intent and is hashed, not enforced.
    provider_hosts: tuple[str, ...]
    seccomp: seccomp.SeccompPolicy
    #: The only environment variable names a jailed process gets (plus
    #: PYTHONPATH when the runner has import paths).
    environment: tuple[str, ...]


DEFAULT_PROFILE: Final = JailProfile(
    name="default",
    namespaces=("cgroup", "ipc", "mount", "net", "pid", "user", "uts"),
    # Host paths: bound read-only into the jail's root, and granted again by
    # Landlock on top. /dev, /etc, /proc, /tmp and the working dir are the
    # jail's own (built by the helper: see `trunner.linux.plan.root_ops`);
    # naming them here grants Landlock rights on the built ones.
    read_exec=("/bin", "/lib", "/lib64", "/sbin", "/usr", PYTHON_PATHS, TRUNNER_PATH),
    # /proc is the jail's own (its PID namespace only, sensitive entries
    # masked); /etc holds only the short list the helper binds.
    read_only=("/dev/full", "/dev/random", "/dev/urandom", "/dev/zero", "/etc", "/proc"),
    read_write=("/dev/null",),
    tcp_connect_ports=(),
    provider_hosts=(),
    seccomp=seccomp.DEFAULT_POLICY,
    environment=("HOME", "LANG", "PATH", "TMPDIR"),
)


Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]


class ProviderConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a caller configures for the provider profile."""

    ports: Annotated[list[Port], msgspec.Meta(min_length=1, max_length=64)]
    hosts: list[str] = []
    read_only: list[str] = []


class _Template(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # What the provider template must contain once filled.
    name: str
    namespaces: list[Literal["cgroup", "ipc", "mount", "net", "pid", "user", "uts"]]
    tcp_connect_ports: list[Port]
    provider_hosts: list[str]
    extra_read_only: list[str]
    inet_sockets: bool


_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}")


def fill_template(text: str, values: Mapping[str, object]) -> str:
    """Replace each `{{name}}` with `values[name]` as a TOML value.

    Raises:
        ValueError: an unknown or malformed placeholder.
    """
    if text.count("{{") != text.count("}}"):
        raise ValueError("provider template: unbalanced '{{' / '}}'")

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(f"provider template: unknown placeholder {{{{{name}}}}}")
        return json.dumps(values[name])  # JSON arrays of ints/strings are TOML

    return _PLACEHOLDER.sub(fill, text)


def provider_profile(
    config: ProviderConfig | Mapping[str, Any], *, template: str | None = None
) -> JailProfile:
    """The provider profile for `config`, from the shipped template.

    Raises:
        ValueError: bad configuration (unknown key, port out of range, a
            read-only path that is not absolute or does not exist) or a bad
            template (unknown placeholder, not TOML, unknown field).
    """
    if not isinstance(config, ProviderConfig):
        config = msgspec.convert(dict(config), ProviderConfig)
    for path in config.read_only:
        if not os.path.isabs(path) or not os.path.exists(path):
            raise ValueError(f"provider read_only path {path!r} is not an existing absolute path")
    if template is None:
        with open(PROVIDER_TEMPLATE, encoding="utf-8") as f:
            template = f.read()
    filled = fill_template(
        template,
        {"ports": sorted(set(config.ports)), "hosts": sorted(set(config.hosts)),
         "read_only": sorted(set(config.read_only))},
    )
    try:
        data = msgspec.convert(tomllib.loads(filled), _Template)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"provider template is not TOML once filled: {e}") from None
    policy = seccomp.provider_policy() if data.inet_sockets else seccomp.DEFAULT_POLICY
    return msgspec.structs.replace(
        DEFAULT_PROFILE,
        name=data.name,
        namespaces=tuple(sorted(set(data.namespaces))),
        tcp_connect_ports=tuple(data.tcp_connect_ports),
        provider_hosts=tuple(data.provider_hosts),
        read_only=tuple(sorted({*DEFAULT_PROFILE.read_only, *data.extra_read_only})),
        seccomp=policy,
    )


def template_blake3() -> str | None:
    """The BLAKE3 of the shipped provider template (part of the rules
    version of every provider run); None if it is not installed."""
    import blake3

    try:
        with open(PROVIDER_TEMPLATE, "rb") as f:
            return blake3.blake3(f.read()).hexdigest()
    except FileNotFoundError:
        return None
