"""Resource and output limits for one adapter class.

`Limits` is a frozen, keyword-only, closed msgspec Struct; every field carries
its unit in its name. Values built in code and values decoded from config go
through the same checks (`Limits.from_mapping` uses `msgspec.convert`).
Units are converted once, where the limit is applied (linux.py).

Values are canonical by field type: an int given for a float field is stored
as that float, whichever way the limits were built (constructor,
`from_mapping`, pickle, msgpack). Equal limits then hold identical values,
so they plan, encode and hash alike: one rules version.
"""

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, get_type_hints

import msgspec
from msgspec import Meta, Struct

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB
#: `address_space_bytes="auto"`: no RLIMIT_AS where the run has a memory
#: cgroup (as root), which bounds what it really uses, so runtimes that
#: reserve large ranges (the JVM, Go, V8) start; elsewhere
#: `AUTO_ADDRESS_SPACE_BYTES`. Resolved when the jail is planned.
AUTO: Final = "auto"
#: The smallest round RLIMIT_AS under which the JVM with its default flags,
#: Node's worker_threads and `npm install` start, measured on hosts of 8 to
#: 128 GB (docs/jail.md): the JVM takes half of it for its heap and needs
#: ~2 GiB beside (1 GiB class space, code cache, threads per CPU), so 4 GiB
#: up to 16 CPUs and 6 GiB to 128. It bounds a process, not a run: the
#: run's bound is `processes` times it.
AUTO_ADDRESS_SPACE_BYTES: Final = 6 * GiB
#: `file_size_bytes="auto"` is `scratch_bytes` and this much more: the
#: scratch tmpfs holds whole pages (up to 64 KiB each, arm64's largest), so
#: a file that fills it meets ENOSPC, never EFBIG (nor a SIGXFSZ kill) first.
AUTO_FILE_SIZE_SLACK_BYTES: Final = 64 * KiB


class Limits(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resource and output limits for one adapter class.

    Defaults suit a short computation: 10 s wall, 1 MiB of response, and
    `address_space_bytes="auto"`: no RLIMIT_AS where a per-run memory cgroup
    bounds the run (as root), else 6 GiB, under which the JVM with its
    default flags, Node's worker_threads and `npm install` start.
    """

    wall_time_s: Annotated[float, Meta(gt=0, le=86400)] = 10.0
    stdout_max_bytes: Annotated[int, Meta(ge=0, le=2**32 + 3)] = 1 * MiB
    stderr_max_bytes: Annotated[int, Meta(ge=0, le=1 * GiB)] = 64 * KiB
    #: CPU time (user + system) of the program's whole process tree; a
    #: float, sub-second. Past it the run fails `cpu_time`. Each process
    #: also has RLIMIT_CPU one second past the next whole second, a backstop
    #: that never fires first.
    cpu_time_s: Annotated[float, Meta(gt=0, le=86400)] = 10.0
    #: RLIMIT_AS of each process, or "auto" (AUTO): none where the run has a
    #: memory cgroup, else AUTO_ADDRESS_SPACE_BYTES. A number holds everywhere.
    address_space_bytes: Annotated[int, Meta(ge=64 * MiB, le=2**46)] | Literal["auto"] = AUTO
    processes: Annotated[int, Meta(ge=1, le=4096)] = 32
    #: RLIMIT_NOFILE of each process: at least 32, as trunner's own
    #: processes in the jail (its helper and adapter, under the same limit)
    #: hold up to 18 descriptors before the program starts.
    open_files: Annotated[int, Meta(ge=32, le=65536)] = 256
    #: RLIMIT_FSIZE of each process (so also the bound of each memfd, and of
    #: each `exec` input file), or "auto" (AUTO): `scratch_bytes` (and
    #: `AUTO_FILE_SIZE_SLACK_BYTES`), so that one file may fill the scratch
    #: and then meets ENOSPC (`file_size_for`).
    file_size_bytes: Annotated[int, Meta(ge=0, le=2**46)] | Literal["auto"] = AUTO
    #: The run's one scratch tmpfs (working dir, /tmp, /dev/shm). tmpfs pages
    #: are memory, not disk: this much RAM (or swap) per run at most.
    scratch_bytes: Annotated[int, Meta(ge=1 * MiB, le=2**40)] = 256 * MiB
    #: All of a run's memory together (its processes and its scratch), where
    #: the host gives a per-run memory cgroup (as root); past it the kernel
    #: kills a process of the run (`memory_limit`).
    memory_bytes: Annotated[int, Meta(ge=32 * MiB, le=2**46)] = 1 * GiB

    def __post_init__(self) -> None:
        # Meta constraints are only checked on decode/convert; check here too so
        # `Limits(...)` in code and `Limits.from_mapping(...)` agree.
        checked = msgspec.convert(msgspec.structs.asdict(self), _Checked)
        # The constructor keeps an int given for a float field; convert gives
        # the float. 5 == 5.0 and they hash alike, but they encode (and so
        # plan and version) differently: store the converted value. Every way
        # of building a Limits runs this (pickle and msgpack decode too).
        for name in self.__struct_fields__:
            value = getattr(checked, name)
            if type(getattr(self, name)) is not type(value):
                msgspec.structs.force_setattr(self, name, value)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Limits":
        """Build limits from untrusted config (e.g. parsed TOML/JSON).

        Raises:
            msgspec.ValidationError: a ValueError naming the offending field.
        """
        return msgspec.convert(dict(data), cls)

    def replace(self, **changes: object) -> "Limits":
        """A copy with some fields changed, validated again."""
        return Limits.from_mapping({**msgspec.structs.asdict(self), **changes})


def file_size_for(limits: Limits) -> int:
    """The file size bound applied (RLIMIT_FSIZE, an `exec` input file's
    bound): `file_size_bytes`, or for "auto" the scratch's size and
    `AUTO_FILE_SIZE_SLACK_BYTES`."""
    value = limits.file_size_bytes
    if value == AUTO:
        return limits.scratch_bytes + AUTO_FILE_SIZE_SLACK_BYTES
    return int(value)


# The same fields and constraints without __post_init__, so that
# `Limits.__post_init__` can validate through msgspec without recursing.
_Checked = msgspec.defstruct(
    "_Checked",
    list(get_type_hints(Limits, include_extras=True).items()),
    kw_only=True,
    forbid_unknown_fields=True,
)


#: Named presets for adapter classes. Each keeps `address_space_bytes`
#: "auto": none where the run has a memory cgroup, the default's elsewhere.
PRESETS: Final[Mapping[str, Limits]] = {
    "default": Limits(),
    # A quick pure computation: tight everything.
    "quick": Limits(
        wall_time_s=2.0,
        cpu_time_s=2.0,
        stdout_max_bytes=64 * KiB,
        stderr_max_bytes=16 * KiB,
        processes=4,
    ),
    # Running a tool (compiler, formatter): more time, room for children.
    "tool": Limits(
        wall_time_s=60.0,
        cpu_time_s=60.0,
        stdout_max_bytes=16 * MiB,
        stderr_max_bytes=1 * MiB,
        processes=64,
    ),
    # Producing a large reply (e.g. a rendered artifact).
    "bulk": Limits(
        wall_time_s=120.0,
        cpu_time_s=120.0,
        stdout_max_bytes=512 * MiB,
        file_size_bytes=1 * GiB,
    ),
}
