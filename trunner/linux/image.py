"""Parent side: an image as the jail's system root (`Runner(root=DIR)`).

What the plan needs to put a directory tree (an unpacked OCI image, a
`debootstrap` tree, a busybox tree) at the jail's `/` while the adapter
still runs on the host's interpreter: the image's top-level entries
(`image_facts`), and how the host's interpreter starts in a root that is
not the host's (`host_interpreter`): its program interpreter (the realpath
of PT_INTERP, read from the ELF), the library path it must be given
(RUNPATH first, then the host's ld.so.conf and system dirs) and the venv
it runs in. Both read the host once, when the `Runner` is made; the plan
is built from what they return (`plan.image_root_ops`) and reads nothing.
Never reads a file of the image beyond its top level and /etc's kind: the
rules version hashes the caller's statement of the contents, not the tree.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from typing import Final, Literal

import msgspec

from trunner.kernel import abi

#: trunner's own dir in an image's jail: read-only, never the image's.
TRUNNER_DIR: Final = "/.trunner"
#: Where the host's code (its /usr and /lib*, the interpreter's prefix,
#: trunner) is bound in an image's jail: a path no image may hold.
HOST_PREFIX: Final = abi.HOST_PREFIX
#: trunner's own venv in an image's jail: a pyvenv.cfg naming the host's
#: interpreter under HOST_PREFIX, and the host venv's site-packages.
VENV: Final = "/.trunner/venv"
#: The synthesized top layer of an image's /etc (the jail's passwd, group,
#: hosts, hostname, and an empty ld.so.preload).
ETC_LAYER: Final = "/.trunner/etc"
#: The image's top-level entries the jail makes itself, never bound.
IMAGE_SKIPPED: Final = frozenset({"dev", "etc", "home", "proc", "sys", "tmp", ".trunner"})
#: Host dirs the loader's libraries may lie in besides /usr (real dirs
#: only: a link such as lib -> usr/lib is covered by /usr).
HOST_LIB_DIRS: Final = ("/lib", "/lib32", "/lib64", "/libx32")
#: The first glibc whose loader has `--argv0` (`--inhibit-cache` is older).
MIN_GLIBC: Final = (2, 33)
#: What an image's path may not hold: overlayfs's lowerdir separators and
#: escapes, and what no mount option carries.
_UNSAFE_CHARS: Final = frozenset(",:\\\n\0=")

_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NULL, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 5, 15, 29


class ImageEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One top-level entry of the image: its name, its kind, a link's target."""

    name: str
    kind: Literal["dir", "file", "symlink"]
    target: str = ""


class ImageFacts(msgspec.Struct, frozen=True, kw_only=True):
    """The image as the plan uses it: its resolved path and top-level entries."""

    path: str
    entries: tuple[ImageEntry, ...]


class HostInterpreter(msgspec.Struct, frozen=True, kw_only=True):
    """How the host's interpreter starts in an image's jail (host paths)."""

    #: The realpath of the interpreter binary's PT_INTERP.
    loader: str
    #: The real interpreter binary.
    python: str
    #: Library dirs, in the order the loader is given them.
    library_path: tuple[str, ...]
    #: The host dirs holding the loader's libraries: /usr and real /lib* dirs.
    system_dirs: tuple[str, ...]
    #: The host venv this interpreter runs in ("": none).
    venv: str = ""
    #: The host venv's site-packages dirs, by their path below the venv
    #: ("lib/python3.11/site-packages"); () outside a venv.
    venv_site: tuple[tuple[str, str], ...] = ()
    #: The interpreter's version, as pyvenv.cfg names it.
    version: str = ""


class ImageRefusal(ValueError):
    """The image, or this host, cannot hold a jail's root: the text says how to fix it."""


def image_facts(root: str) -> ImageFacts:
    """The image at `root` (resolved): its top-level entries, /etc checked.

    Raises:
        ImageRefusal: not a directory, a path overlayfs cannot name, no
            /etc directory, or no /bin/sh-like tree at all (nothing to run).
    """
    if not isinstance(root, str) or not os.path.isabs(root):
        raise ImageRefusal(f"root {root!r}: expected an absolute path to a directory")
    path = os.path.realpath(root)
    if not os.path.isdir(path):
        raise ImageRefusal(f"root {root!r} is not a directory this process can reach")
    if path == "/":
        raise ImageRefusal("root '/': the host's root is the default; pass no root=")
    if _UNSAFE_CHARS & set(path):
        raise ImageRefusal(f"root {path!r}: a path with one of , : \\ = or a newline cannot be"
                           " mounted (overlayfs): move or link the image elsewhere")
    etc = os.path.join(path, "etc")
    if os.path.islink(etc) or not os.path.isdir(etc):
        raise ImageRefusal(f"root {path!r} has no /etc directory: make one"
                           f" (mkdir {etc}); the jail's /etc is the image's, with its own"
                           " passwd, group, hosts and hostname on top")
    entries: list[ImageEntry] = []
    with os.scandir(path) as it:
        for entry in sorted(it, key=lambda e: e.name):
            if entry.name in IMAGE_SKIPPED:
                continue
            if entry.is_symlink():
                entries.append(ImageEntry(name=entry.name, kind="symlink",
                                          target=os.readlink(entry.path)))
            elif entry.is_dir(follow_symlinks=False):
                entries.append(ImageEntry(name=entry.name, kind="dir"))
            elif entry.is_file(follow_symlinks=False):
                entries.append(ImageEntry(name=entry.name, kind="file"))
            # sockets, fifos and devices at the top level are left out
    return ImageFacts(path=path, entries=tuple(entries))


def elf_interp_and_runpath(path: str) -> tuple[str, tuple[str, ...]]:
    """PT_INTERP and DT_RUNPATH (or DT_RPATH where there is no RUNPATH) of
    the ELF64 little-endian file at `path`, as written ($ORIGIN kept).

    Raises:
        ImageRefusal: not an ELF64 little-endian executable with a PT_INTERP.
    """
    with open(path, "rb") as f:
        data = f.read(64)
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ImageRefusal(f"{path} is not an ELF64 little-endian executable: root= is"
                               " supported for such hosts only")
        phoff = int.from_bytes(data[0x20:0x28], "little")
        phentsize = int.from_bytes(data[0x36:0x38], "little")
        phnum = int.from_bytes(data[0x38:0x3A], "little")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        loads: list[tuple[int, int, int]] = []
        interp = ""
        dynamic: tuple[int, int] | None = None
        for i in range(phnum):
            ph = table[i * phentsize:(i + 1) * phentsize]
            kind = int.from_bytes(ph[0:4], "little")
            offset, vaddr = int.from_bytes(ph[8:16], "little"), int.from_bytes(ph[16:24], "little")
            filesz = int.from_bytes(ph[32:40], "little")
            if kind == _PT_LOAD:
                loads.append((vaddr, filesz, offset))
            elif kind == _PT_INTERP:
                f.seek(offset)
                interp = f.read(filesz).split(b"\0", 1)[0].decode()
            elif kind == _PT_DYNAMIC:
                dynamic = (offset, filesz)
        if not interp:
            raise ImageRefusal(f"{path} has no program interpreter (PT_INTERP): a static"
                               " interpreter cannot be started through the host's loader")
        if dynamic is None:
            return interp, ()
        f.seek(dynamic[0])
        raw = f.read(dynamic[1])
        tags: dict[int, int] = {}
        for i in range(0, len(raw) - 15, 16):
            tag = int.from_bytes(raw[i:i + 8], "little", signed=True)
            if tag == _DT_NULL:
                break
            tags.setdefault(tag, int.from_bytes(raw[i + 8:i + 16], "little"))
        name = tags.get(_DT_RUNPATH, tags.get(_DT_RPATH))
        if name is None or _DT_STRTAB not in tags:
            return interp, ()
        strtab = tags[_DT_STRTAB]
        base = next((off + strtab - vaddr for vaddr, size, off in loads
                     if vaddr <= strtab < vaddr + size), None)
        if base is None:
            return interp, ()
        f.seek(base + name)
        text = f.read(4096).split(b"\0", 1)[0].decode()
    return interp, tuple(p for p in text.split(":") if p)


def _glibc_version() -> tuple[int, int]:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return (0, 0)
    name, _, version = text.partition(" ")
    parts = version.split(".")
    if name != "glibc" or len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return (0, 0)
    return int(parts[0]), int(parts[1])


def _ld_so_conf(path: str = "/etc/ld.so.conf", depth: int = 0) -> list[str]:
    """The dirs the host's ld.so.conf lists (its `include` globs followed)."""
    out: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include") and depth < 4:
            for pattern in line.split()[1:]:
                if not os.path.isabs(pattern):
                    pattern = os.path.join(os.path.dirname(path), pattern)
                for name in sorted(glob.glob(pattern)):
                    out += _ld_so_conf(name, depth + 1)
        elif line.startswith("/"):
            out.append(line.split()[0].split("=")[0])
    return out


def _system_search_path(loader: str) -> list[str]:
    """The loader's own system dirs, from its `--help`."""
    try:
        text = subprocess.run([loader, "--help"], capture_output=True, env={}, timeout=10,
                              check=False, stdin=subprocess.DEVNULL).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split()[0] for line in text.splitlines()
            if line.strip().endswith("(system search path)")]


def host_interpreter() -> HostInterpreter:
    """How this interpreter starts in an image's jail.

    Raises:
        ImageRefusal: the host's C library is not glibc 2.33 or later (its
            loader needs `--argv0`), or the interpreter is not a dynamic ELF64.
    """
    glibc = _glibc_version()
    if glibc < MIN_GLIBC:
        found = "not glibc" if glibc == (0, 0) else f"glibc {glibc[0]}.{glibc[1]}"
        raise ImageRefusal(f"root=: the host's C library is {found}; starting the adapter"
                           f" on an image needs glibc {MIN_GLIBC[0]}.{MIN_GLIBC[1]} or later"
                           " (its loader's --argv0)")
    python = os.path.realpath(sys.executable)
    interp, runpath = elf_interp_and_runpath(python)
    loader = os.path.realpath(interp)
    system_dirs = ["/usr", *(d for d in HOST_LIB_DIRS
                             if os.path.isdir(d) and not os.path.islink(d))]
    origin = os.path.dirname(python)
    wanted = [p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for p in runpath]
    wanted += _ld_so_conf() + _system_search_path(loader)
    library: list[str] = []
    for path in wanted:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in library:
            library.append(real)
    venv_site: list[tuple[str, str]] = []
    if sys.prefix != sys.base_prefix:
        for site in sorted(glob.glob(os.path.join(sys.prefix, "lib", "python3*",
                                                  "site-packages"))):
            venv_site.append((os.path.realpath(site), os.path.relpath(site, sys.prefix)))
    version = ".".join(str(n) for n in sys.version_info[:3])
    return HostInterpreter(loader=loader, python=python, library_path=tuple(library),
                           system_dirs=tuple(system_dirs),
                           venv=sys.prefix if venv_site else "", venv_site=tuple(venv_site),
                           version=version)


def in_host(path: str) -> str:
    """A host path as an image's jail shows it."""
    return HOST_PREFIX + path


def adapter_launch(host: HostInterpreter, bound: tuple[str, ...]) -> tuple[str, ...]:
    """The start of every adapter's argv in an image's jail: the host's
    loader (never the image's), the image's ld.so.cache ignored, the
    library path an argument (never LD_LIBRARY_PATH, which the program
    would inherit), the interpreter named as trunner's venv's python (so
    sys.prefix is that venv), then the real interpreter. Library dirs not
    below a `bound` host dir are left out."""
    library = [in_host(p) for p in host.library_path
               if any(p == b or p.startswith(b.rstrip("/") + "/") for b in bound)]
    argv0 = f"{VENV}/bin/python" if host.venv_site else in_host(host.python)
    return (in_host(host.loader), "--inhibit-cache", "--library-path", ":".join(library),
            "--argv0", argv0, in_host(host.python))
