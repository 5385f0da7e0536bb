"""The `files` mode, worker side: read, write, export and import the
working dir's files, one op after another (the parent's side and the
types: trunner/files.py, protocol.FilesRequest and FilesResult).

Runs as a jailed built-in adapter (`python -I -S`), so it imports posix and
errno only, fnmatch for a wildcard pattern, and tarfile (with io) for an
Export or an Import op alone. Request and reply are plain values laid out
as the protocol's structs.

Never through a symlink: every path is walked from its base one component
at a time, each opened O_DIRECTORY | O_NOFOLLOW relative to the last, and a
file, symlink or hard link is made under a fresh name beside its path and
renamed over it, so neither a symlink nor a hard link already there is ever
written through. An archive's members are all checked before anything is
written; tarfile only parses it (its `data` filter would follow a link
inside the tree, take away group and other write bits, refuse absolute
symlink targets, and is path-based: a session's other commands may move a
path between its check and the write). Reads (ReadFiles, Export) stop past
`budget_bytes` with `over_budget`, never a cut result.
"""

import errno
import posix

from trunner.kernel.abi import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from trunner.worker.wire import EXEC_PATH_MAX_BYTES, FILES_DETAIL_MAX_BYTES, pack

TYPE_CHECKING = False  # not from typing: importing it costs the adapter ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

_DIR_FLAGS = posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW | posix.O_CLOEXEC
_CHUNK = 1 << 20
#: What a FileEntry costs in the reply beside its path's, target's and
#: data's own bytes: the entry with those empty and the widest ints, and
#: their headers at their widest (str32, bin32).
ENTRY_BYTES = len(pack({"path": "", "type": "symlink", "mode": -(2**63), "mtime_ns": -(2**63),
                        "data": b"", "target": ""})) + 4 + 4 + 3


class Failed(Exception):
    """An op that cannot be done as asked: `kind` is FilesError's."""

    def __init__(self, kind: str, path: str, detail: str) -> None:
        super().__init__(kind, path, detail)
        self.kind, self.path, self.detail = kind, path, detail


def _os_failed(path: str, e: OSError) -> Failed:
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    return Failed("os_error", path, f"{name}: {e.strerror or e}")


class Budget:
    """What the reads may still return, in reply bytes."""

    def __init__(self, total: int) -> None:
        self.total = self.left = total

    def take(self, n: int, path: str) -> None:
        if n > self.left:
            raise Failed("over_budget", path, f"the reads pass the budget of {self.total}"
                         f" bytes at {path!r}")
        self.left -= n


def run_files(body: "Any", root: str = ".") -> "dict[str, object]":  # noqa: ANN401
    """Run a FilesRequest's ops in order on the directory `root` (the
    working dir); the FilesResult: each op's result, until the first that
    fails, and that one's error."""
    if not isinstance(body, dict) or body.get("type") != "files_request":
        raise ValueError("the request is not a files_request")
    budget = Budget(body["budget_bytes"])
    results: list[object] = []
    base = posix.open(root, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_CLOEXEC)
    old = posix.umask(0o022)
    try:
        for i, op in enumerate(body["ops"]):
            try:
                results.append(_OPS[op["type"]](base, op, budget))
            except Failed as e:
                return reply(results, {"op": i, "kind": e.kind,
                                       "path": _shown(e.path, EXEC_PATH_MAX_BYTES),
                                       "detail": _shown(e.detail, FILES_DETAIL_MAX_BYTES)})
    finally:
        posix.umask(old)
        posix.close(base)
    return reply(results, None)


def reply(results: "list[object]", error: "dict[str, object] | None") -> "dict[str, object]":
    """protocol.FilesResult's wire map."""
    return {"type": "files_result", "results": results, "error": error}


def _shown(text: str, most: int) -> str:
    """`text` as UTF-8 of at most `most` bytes (a name that is not UTF-8 escaped)."""
    text = text.encode(errors="surrogateescape").decode(errors="backslashreplace")
    return text.encode()[:most].decode(errors="ignore")


# -- paths -------------------------------------------------------------------------


def parts(path: str) -> "list[str]":
    """`path`'s components, or refused: absolute, empty, `..` or NUL. "."
    is the base itself (no components)."""
    if path == ".":
        return []
    names = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or not names or ".." in names or "\0" in path:
        raise Failed("refused", path, f"{path!r} is not a plain relative path")
    return names


def open_dir(base: int, names: "list[str]", *, make: bool = False) -> int:
    """The directory `names` under `base`, opened one component at a time
    with O_NOFOLLOW (made, 0o755, where missing with `make`).

    Raises:
        Failed: `refused` where a component is a symlink; `os_error`.
    """
    fd = posix.dup(base)
    try:
        for i, name in enumerate(names):
            try:
                try:
                    nxt = posix.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not make:
                        raise
                    try:  # noqa: SIM105  contextlib is one more import
                        posix.mkdir(name, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass  # made meanwhile: opened (or refused) below
                    nxt = posix.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise _component_failed(fd, names[: i + 1], e) from None
            posix.close(fd)
            fd = nxt
    except BaseException:
        posix.close(fd)
        raise
    return fd


def _component_failed(fd: int, names: "list[str]", e: OSError) -> Failed:
    path = "/".join(names)
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            is_link = posix.stat(names[-1], dir_fd=fd, follow_symlinks=False).st_mode & S_IFMT
        except OSError:
            is_link = 0
        if is_link == S_IFLNK:
            return Failed("refused", path, f"{path!r} is a symlink: never followed")
    return _os_failed(path, e)


class _Temp:
    """Fresh names beside a path: made, then renamed over it."""

    count = 0

    @classmethod
    def make(cls, make: "Callable[[str], object]") -> str:
        while True:
            cls.count += 1
            name = f".trunner-files-{posix.getpid()}-{cls.count}"
            try:
                make(name)
            except FileExistsError:
                continue
            return name


def _replace(dir_fd: int, tmp: str, name: str) -> None:
    """Rename `tmp` over `name` (never a directory there: EISDIR)."""
    try:
        posix.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        posix.unlink(tmp, dir_fd=dir_fd)
        raise


# -- writing -----------------------------------------------------------------------


class Writer:
    """Writes entries under `base`, then (`finish`) each directory's mode
    and mtime, deepest first, once what goes in it is written."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.dirs: list[tuple[list[str], int, int]] = []

    def _at(self, path: str) -> tuple[int, str]:
        names = parts(path)
        if not names:
            raise Failed("refused", path, "an entry names the base directory itself")
        return open_dir(self.base, names[:-1], make=True), names[-1]

    def file(self, path: str, data: bytes, mode: int, mtime_ns: int) -> None:
        d, name = self._at(path)
        try:
            fds: list[int] = []
            flags = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW
            tmp = _Temp.make(lambda n: fds.append(posix.open(
                n, flags | posix.O_CLOEXEC, 0o600, dir_fd=d)))
            try:
                view = memoryview(data)
                while view:
                    view = view[posix.write(fds[0], view) :]
                posix.chmod(fds[0], mode)
                posix.utime(fds[0], ns=(mtime_ns, mtime_ns))
            except BaseException:
                posix.unlink(tmp, dir_fd=d)
                raise
            finally:
                posix.close(fds[0])
            _replace(d, tmp, name)
        except OSError as e:
            raise _os_failed(path, e) from None
        finally:
            posix.close(d)

    def symlink(self, path: str, target: str, mtime_ns: int) -> None:
        d, name = self._at(path)
        try:
            tmp = _Temp.make(lambda n: posix.symlink(target, n, dir_fd=d))
            try:
                posix.utime(tmp, ns=(mtime_ns, mtime_ns), dir_fd=d, follow_symlinks=False)
            except BaseException:
                posix.unlink(tmp, dir_fd=d)
                raise
            _replace(d, tmp, name)
        except OSError as e:
            raise _os_failed(path, e) from None
        finally:
            posix.close(d)

    def link(self, path: str, target: str) -> None:
        """A hard link at `path` to the regular file `target` (both under
        `base`); where Landlock refuses a link across directories (ABI 1:
        EXDEV), a copy of it."""
        names = parts(target)
        t = open_dir(self.base, names[:-1])
        try:
            try:
                st = posix.stat(names[-1], dir_fd=t, follow_symlinks=False)
            except OSError as e:
                raise _os_failed(target, e) from None
            if st.st_mode & S_IFMT != S_IFREG:
                raise Failed("refused", path, f"hard link to {target!r}, not a regular file")
            d, name = self._at(path)
            try:
                tmp = _Temp.make(lambda n: posix.link(names[-1], n, src_dir_fd=t,
                                                      dst_dir_fd=d, follow_symlinks=False))
                _replace(d, tmp, name)
                return
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise _os_failed(path, e) from None
            finally:
                posix.close(d)
            read = _read_regular(t, names[-1], st.st_size + 1)
        finally:
            posix.close(t)
        if read is None:
            raise Failed("refused", path, f"hard link to {target!r}, which changed meanwhile")
        data, st = read
        self.file(path, data, st.st_mode & 0o7777, st.st_mtime_ns)

    def dir(self, path: str, mode: int, mtime_ns: int) -> None:
        names = parts(path)
        if names:
            d = open_dir(self.base, names[:-1], make=True)
            try:
                try:
                    posix.mkdir(names[-1], 0o700, dir_fd=d)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise _os_failed(path, e) from None
            finally:
                posix.close(d)
        fd = open_dir(self.base, names)
        try:
            posix.chmod(fd, 0o700)  # ours to fill; its own mode comes last
        except OSError as e:
            raise _os_failed(path, e) from None
        finally:
            posix.close(fd)
        self.dirs.append((names, mode, mtime_ns))

    def finish(self) -> None:
        # Deepest first: a parent keeps its search right until its children are done.
        for names, mode, mtime_ns in sorted(self.dirs, key=lambda d: d[0], reverse=True):
            fd = open_dir(self.base, names)
            try:
                posix.chmod(fd, mode)
                posix.utime(fd, ns=(mtime_ns, mtime_ns))
            except OSError as e:
                raise _os_failed("/".join(names) or ".", e) from None
            finally:
                posix.close(fd)


def _write_files(base: int, op: "dict[str, Any]", budget: Budget) -> int:
    del budget
    writer = Writer(base)
    entries = sorted(op["entries"], key=lambda e: parts(e["path"]))  # parents first
    for entry in entries:
        kind, path = entry["type"], entry["path"]
        if kind == "file":
            writer.file(path, entry["data"], entry["mode"], entry["mtime_ns"])
        elif kind == "symlink":
            writer.symlink(path, entry["target"], entry["mtime_ns"])
        elif kind == "dir":
            writer.dir(path, entry["mode"], entry["mtime_ns"])
        else:
            raise Failed("refused", path, f"unknown entry type {kind!r}")
    writer.finish()
    return len(entries)


# -- reading -----------------------------------------------------------------------


def _read_regular(dir_fd: int, name: str, most: int) -> "tuple[bytes, Any] | None":
    """Up to `most` bytes of the regular file `name` (O_NOFOLLOW), and its
    fstat; None if it is not one."""
    flags = posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK | posix.O_CLOEXEC
    try:
        fd = posix.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = posix.fstat(fd)
        if st.st_mode & S_IFMT != S_IFREG:
            return None
        chunks, left = [], most
        while left > 0:
            chunk = posix.read(fd, min(left, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st
    finally:
        posix.close(fd)


def _travels(name: str) -> bool:
    """A name a FileEntry can carry: UTF-8."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _names(base: int, names: "list[str]") -> "list[str]":
    """The entries of the directory `names`, if it is one reached without
    a symlink; [] otherwise."""
    try:
        fd = open_dir(base, names)
    except Failed:
        return []
    try:
        return [n for n in posix.listdir(fd) if _travels(n)]
    except OSError:
        return []
    finally:
        posix.close(fd)


def match(base: int, pattern: str) -> "set[str]":
    """The paths under `base` that `pattern` matches, of any type: `*`, `?`
    and `[...]` within one component, `**` any number of them (none
    too); never through a symlink. A path over `EXEC_PATH_MAX_BYTES` never
    matches."""
    segments = pattern.split("/")
    # `**/**` is `**`: collapse runs, which would only repeat the walk.
    segments = [g for i, g in enumerate(segments) if g != "**" or segments[i - 1 : i] != [g]]
    found: set[str] = set()
    seen: set[tuple[tuple[str, ...], int]] = set()
    stack: list[tuple[tuple[str, ...], int]] = [((), 0)]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        names, i = state
        if i == len(segments):
            path = "/".join(names)
            if names and len(path.encode()) <= EXEC_PATH_MAX_BYTES:
                found.add(path)
            continue
        seg = segments[i]
        if seg == "**":
            stack.append((names, i + 1))
            stack += [((*names, n), i) for n in _names(base, list(names))]
        elif any(c in seg for c in "*?["):
            from fnmatch import fnmatchcase  # imports re: only for a wildcard

            stack += [((*names, n), i + 1) for n in _names(base, list(names))
                      if fnmatchcase(n, seg)]
        else:
            stack.append(((*names, seg), i + 1))
    return found


def _entry(base: int, path: str, budget: Budget) -> "dict[str, object] | None":
    """The FileEntry map of `path` (None: gone, reached only through a
    symlink, or neither a file, a symlink nor a dir), its cost taken."""
    names = path.split("/")
    try:
        d = open_dir(base, names[:-1])
    except Failed:
        return None
    try:
        try:
            st = posix.stat(names[-1], dir_fd=d, follow_symlinks=False)
        except OSError:
            return None
        kind, data, target = st.st_mode & S_IFMT, b"", ""
        if kind == S_IFLNK:
            try:
                target = posix.readlink(names[-1], dir_fd=d)
            except OSError:
                return None
            if not _travels(target):
                return None
        cost = ENTRY_BYTES + len(path.encode()) + len(target.encode())
        if kind == S_IFREG:
            read = _read_regular(d, names[-1], budget.left - cost + 1)
            if read is None:
                return None
            data, st = read
        elif kind not in (S_IFDIR, S_IFLNK):
            return None
    finally:
        posix.close(d)
    budget.take(cost + len(data), path)
    kinds = {S_IFREG: "file", S_IFLNK: "symlink", S_IFDIR: "dir"}
    return {"path": path, "type": kinds[kind], "mode": st.st_mode & 0o7777,
            "mtime_ns": st.st_mtime_ns, "data": data, "target": target}


def _read_files(base: int, op: "dict[str, Any]", budget: Budget) -> "list[dict[str, object]]":
    found: set[str] = set()
    for pattern in op["patterns"]:
        parts(pattern)
        found |= match(base, pattern)
    entries = []
    for path in sorted(found):
        entry = _entry(base, path, budget)
        if entry is not None:
            entries.append(entry)
    return entries


# -- archives ----------------------------------------------------------------------


class _Bounded:
    """A write-only file for tarfile that fails `over_budget` past `most` bytes."""

    def __init__(self, most: int, path: str) -> None:
        self.most, self.path = most, path
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.most:
            raise Failed("over_budget", self.path, f"the export passes what is left of the"
                         f" budget, {self.most} bytes")
        self.parts.append(bytes(data))
        return len(data)

    def tell(self) -> int:
        return self.size


def _ns_text(ns: int) -> str:
    """`ns` as exact decimal seconds (a pax `mtime`)."""
    sign = "-" if ns < 0 else ""
    seconds, frac = divmod(abs(ns), 10**9)
    return f"{sign}{seconds}.{frac:09d}"


def _text_ns(text: str) -> "int | None":
    """A pax `mtime` as exact nanoseconds; None when malformed."""
    sign = -1 if text.startswith("-") else 1
    whole, _, frac = text.lstrip("-").partition(".")
    if not whole.isdigit() or (frac and not frac.isdigit()):
        return None
    return sign * (int(whole) * 10**9 + int((frac + "0" * 9)[:9]))


def _walk(base: int, path: str) -> "Iterator[tuple[str, str, Any, int]]":
    """(relative path, name, lstat, the dir fd holding it) for everything
    under `path`, directories before what they hold, never through a
    symlink."""
    stack = [parts(path)]
    top = len(stack[0])
    while stack:
        names = stack.pop()
        d = open_dir(base, names)
        try:
            subdirs = []
            for name in sorted(posix.listdir(d)):
                st = posix.stat(name, dir_fd=d, follow_symlinks=False)
                rel = "/".join([*names[top:], name])
                yield rel, name, st, d
                if st.st_mode & S_IFMT == S_IFDIR:
                    subdirs.append([*names, name])
            stack += reversed(subdirs)
        finally:
            posix.close(d)


def _export(base: int, op: "dict[str, Any]", budget: Budget) -> bytes:
    import io
    import tarfile

    out = _Bounded(budget.left, op["path"])
    fileobj: Any = out  # write and tell are all tarfile uses
    seen: dict[tuple[int, int], str] = {}
    try:
        with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, name, st, d in _walk(base, op["path"]):
                info = tarfile.TarInfo(rel)
                info.mode, info.mtime = st.st_mode & 0o7777, st.st_mtime_ns // 10**9
                if st.st_mtime_ns % 10**9 or st.st_mtime_ns < 0:
                    info.pax_headers = {"mtime": _ns_text(st.st_mtime_ns)}
                kind, data = st.st_mode & S_IFMT, None
                if kind == S_IFDIR:
                    info.type = tarfile.DIRTYPE
                elif kind == S_IFLNK:
                    info.type, info.linkname = tarfile.SYMTYPE, posix.readlink(name, dir_fd=d)
                elif kind == S_IFREG and (st.st_dev, st.st_ino) in seen:
                    info.type, info.linkname = tarfile.LNKTYPE, seen[(st.st_dev, st.st_ino)]
                elif kind == S_IFREG:
                    read = _read_regular(d, name, out.most - out.size + 1)
                    if read is None:
                        continue  # replaced meanwhile by what is not a file
                    data = read[0]
                    if st.st_nlink > 1:
                        seen[(st.st_dev, st.st_ino)] = rel
                    info.size = len(data)
                else:
                    continue  # a fifo, a socket or a device: not exported
                if data is None:
                    tar.addfile(info)
                else:
                    if len(data) > out.most - out.size:
                        raise Failed("over_budget", rel, f"the export passes what is left of"
                                     f" the budget, {out.most} bytes")
                    tar.addfile(info, io.BytesIO(data))
    except OSError as e:
        raise _os_failed(op["path"], e) from None
    budget.take(out.size, op["path"])
    return b"".join(out.parts)


#: Member kinds an Import writes.
_FILE, _DIR, _SYMLINK, _LINK = "file", "dir", "symlink", "link"


def check_members(members: "list[Any]") -> "list[tuple[str, str, Any]]":
    """(kind, normal path, member) for each member to write, in order; a
    `./` member (the base) is skipped. Refused, before anything is written:
    an absolute name or one with `..`, a path twice, a device node, a fifo
    or any type but a file, a dir, a symlink and a hard link, a hard link
    to anything but an earlier file of the archive, and any path under a
    member that is not a directory (a symlink's: written through it)."""
    plan: list[tuple[str, str, Any]] = []
    kinds: dict[str, str] = {}
    for m in members:
        if m.name.startswith("/") or ".." in m.name.split("/"):
            raise Failed("refused", m.name, f"member {m.name!r}: absolute, or has '..'")
        names = [p for p in m.name.split("/") if p not in ("", ".")]
        path = "/".join(names)
        if m.isreg():
            kind = _FILE
        elif m.isdir():
            kind = _DIR
        elif m.issym():
            kind = _SYMLINK
        elif m.islnk():
            kind = _LINK
            target = "/".join(p for p in m.linkname.split("/") if p not in ("", "."))
            if m.linkname.startswith("/") or ".." in m.linkname.split("/") or kinds.get(
                    target) not in (_FILE, _LINK):
                raise Failed("refused", m.name, f"member {m.name!r}: a hard link to"
                             f" {m.linkname!r}, not an earlier file of the archive")
        else:
            raise Failed("refused", m.name, f"member {m.name!r}: a device node, a fifo or"
                         " another type; only files, dirs, symlinks and hard links")
        if not path:
            if kind != _DIR:
                raise Failed("refused", m.name, f"member {m.name!r} names the base")
            continue
        if path in kinds:
            raise Failed("refused", m.name, f"member {m.name!r} is in the archive twice")
        kinds[path] = kind
        plan.append((kind, path, m))
    for _, path, m in plan:
        names = path.split("/")
        for i in range(1, len(names)):
            above = "/".join(names[:i])
            if kinds.get(above, _DIR) != _DIR:
                raise Failed("refused", m.name, f"member {m.name!r} lies under {above!r}, a"
                             f" {kinds[above]} of the archive: never written through")
    return plan


def _import(base: int, op: "dict[str, Any]", budget: Budget) -> int:
    del budget
    import io
    import tarfile

    try:
        with tarfile.open(fileobj=io.BytesIO(op["tar"]), mode="r:") as tar:
            plan = check_members(tar.getmembers())
            into = open_dir(base, parts(op["path"]), make=True)
            try:
                writer = Writer(into)
                for kind, path, m in plan:
                    mtime_ns = _text_ns(m.pax_headers.get("mtime", "")) or int(m.mtime) * 10**9
                    if kind == _FILE:
                        source = tar.extractfile(m)
                        data = source.read() if source is not None else b""
                        writer.file(path, data, m.mode & 0o7777, mtime_ns)
                    elif kind == _DIR:
                        writer.dir(path, m.mode & 0o7777, mtime_ns)
                    elif kind == _SYMLINK:
                        writer.symlink(path, m.linkname, mtime_ns)
                    else:
                        writer.link(path, "/".join(p for p in m.linkname.split("/")
                                                   if p not in ("", ".")))
                writer.finish()
            finally:
                posix.close(into)
    except tarfile.TarError as e:
        raise Failed("refused", op["path"], f"not an uncompressed tar: {e}") from None
    return len(plan)


_OPS: "dict[str, Callable[[int, dict[str, Any], Budget], object]]" = {
    "read_files": _read_files,
    "write_files": _write_files,
    "export": _export,
    "import": _import,
}
