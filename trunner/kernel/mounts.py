"""Helper side: build the jail's root, pivot into it, and give it a /proc.

Imports only `posix` and `trunner.kernel` (abi, install). Every operation
comes resolved from the parent (`plan.root_ops`, `plan.PROC_OPS`); the helper
reads each, with the plan, into the class of its op here (`ROOT_OPS`,
`PROC_OPS`); a refused one raises `OSError` naming the target, and the
helper refuses the jail: nothing half-built is ever run in.

`build_root` runs in the helper, in a private mount namespace, with the
rights of the caller (real root, or an unprivileged user's own user
namespace), so that binds are walked as the caller walks them (an
interpreter under a mode-700 home included). Order (bubblewrap's
`setup_newroot`): make every mount private, mount a staging tmpfs and pivot
into it with the old root at /oldroot, build /newroot from /oldroot paths
(read-only binds, a size-capped scratch, a minimal /dev, the host's /proc for
the id maps only; with an image, its /etc as a read-only overlay under a
layer of the root's own), remount /newroot read-only, detach /oldroot, pivot into
/newroot and detach the staging tmpfs. Nothing else of the host's tree is
reachable afterwards.

A bind that lands in the scratch (a host path under /tmp: a venv, an
import path) does not hang from directories the jail owns, which it could
rename away and rebuild with files of its own: the first directory below
the scratch dir is a small tmpfs of its own (a mount point: rename and
rmdir answer EBUSY), holding the directories down to the bind, read-only
(EROFS) once every bind in it is mounted.

`enter_jail` runs in the jail's pid 2, inside every new namespace: a fresh
/proc of the jail's PID namespace over the host's (a fresh proc mount is only
allowed where a full one is visible already), its sensitive entries masked,
then the hostname and the working dir.
"""

import posix

from trunner.kernel.abi import (
    BIND_DEVICE,
    BIND_WRITABLE,
    MNT_DETACH,
    MS_BIND,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_RELATIME,
    MS_REMOUNT,
    S_IFDIR,
    S_IFLNK,
    S_IFMT,
)
from trunner.kernel.install import _path, call, pivot_root

TYPE_CHECKING = False  # not from typing: importing it costs the helper ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    #: A plan item as it arrives: a dict of plain values.
    Data: TypeAlias = dict[str, object]
    RootOp: TypeAlias = "Scratch | Bind | Dir | Symlink | File | HostProc | MaskSocket | Overlay"
    ProcOp: TypeAlias = "Mask | ReadOnly | Devpts | CgroupView"


# -- the ops, as the helper reads them -----------------------------------------------
# One slots class per op of `trunner.linux.plan` (and the scratch's size):
# the fields of its Struct of the same name and its tag as TAG
# (tests/test_plan.py pins both; the meaning is documented there). Each reads
# the op's plain dict, once, when the helper reads the plan; a dict of another
# shape raises ValueError.


class ScratchSize:
    __slots__ = ("bytes", "inodes")

    def __init__(self, d: "Data") -> None:
        size, inodes = d.get("bytes"), d.get("inodes")
        if type(size) is not int or type(inodes) is not int or len(d) != 2:
            raise ValueError("scratch size")
        self.bytes, self.inodes = size, inodes


class Scratch:
    __slots__ = ("mode", "name", "path")
    TAG = "scratch"

    def __init__(self, d: "Data") -> None:
        name, path, mode = d.get("name"), d.get("path"), d.get("mode")
        if type(name) is not str or type(path) is not str or type(mode) is not int or len(d) != 4:
            raise ValueError(self.TAG)
        self.name, self.path, self.mode = name, path, mode


class Bind:
    __slots__ = ("flags", "path", "source")
    TAG = "bind"

    def __init__(self, d: "Data") -> None:
        source, path, flags = d.get("source"), d.get("path"), d.get("flags")
        if (type(source) is not str or type(path) is not str or type(flags) is not int
                or len(d) != 4):
            raise ValueError(self.TAG)
        self.source, self.path, self.flags = source, path, flags


class Dir:
    __slots__ = ("mode", "path")
    TAG = "dir"

    def __init__(self, d: "Data") -> None:
        path, mode = d.get("path"), d.get("mode")
        if type(path) is not str or type(mode) is not int or len(d) != 3:
            raise ValueError(self.TAG)
        self.path, self.mode = path, mode


class Symlink:
    __slots__ = ("path", "target")
    TAG = "symlink"

    def __init__(self, d: "Data") -> None:
        target, path = d.get("target"), d.get("path")
        if type(target) is not str or type(path) is not str or len(d) != 3:
            raise ValueError(self.TAG)
        self.target, self.path = target, path


class File:
    __slots__ = ("content", "mode", "path")
    TAG = "file"

    def __init__(self, d: "Data") -> None:
        content, path, mode = d.get("content"), d.get("path"), d.get("mode")
        if (type(content) is not str or type(path) is not str or type(mode) is not int
                or len(d) != 4):
            raise ValueError(self.TAG)
        self.content, self.path, self.mode = content, path, mode


class HostProc:
    __slots__ = ("path",)
    TAG = "host_proc"

    def __init__(self, d: "Data") -> None:
        path = d.get("path")
        if type(path) is not str or len(d) != 2:
            raise ValueError(self.TAG)
        self.path = path


class MaskSocket:
    __slots__ = ("path",)
    TAG = "mask_socket"

    def __init__(self, d: "Data") -> None:
        path = d.get("path")
        if type(path) is not str or len(d) != 2:
            raise ValueError(self.TAG)
        self.path = path


class Overlay:
    __slots__ = ("lower", "path", "top")
    TAG = "overlay"

    def __init__(self, d: "Data") -> None:
        path, top, lower = d.get("path"), d.get("top"), d.get("lower")
        if (type(path) is not str or type(top) is not str or type(lower) is not str
                or len(d) != 4):
            raise ValueError(self.TAG)
        self.path, self.top, self.lower = path, top, lower


class Mask:
    __slots__ = ("path",)
    TAG = "mask"

    def __init__(self, d: "Data") -> None:
        path = d.get("path")
        if type(path) is not str or len(d) != 2:
            raise ValueError(self.TAG)
        self.path = path


class ReadOnly:
    __slots__ = ("path",)
    TAG = "read_only"

    def __init__(self, d: "Data") -> None:
        path = d.get("path")
        if type(path) is not str or len(d) != 2:
            raise ValueError(self.TAG)
        self.path = path


class Devpts:
    __slots__ = ("max", "mode", "path", "ptmx_mode")
    TAG = "devpts"

    def __init__(self, d: "Data") -> None:
        path, ptmx_mode, mode, limit = (d.get("path"), d.get("ptmx_mode"), d.get("mode"),
                                        d.get("max"))
        if (type(path) is not str or type(ptmx_mode) is not int or type(mode) is not int
                or type(limit) is not int or len(d) != 5):
            raise ValueError(self.TAG)
        self.path, self.ptmx_mode, self.mode, self.max = path, ptmx_mode, mode, limit


class CgroupView:
    __slots__ = ("fstype", "options", "path")
    TAG = "cgroup_view"

    def __init__(self, d: "Data") -> None:
        path, fstype, options = d.get("path"), d.get("fstype"), d.get("options")
        if (type(path) is not str or type(fstype) is not str or type(options) is not str
                or len(d) != 4):
            raise ValueError(self.TAG)
        self.path, self.fstype, self.options = path, fstype, options


#: Each op's class by its tag (the plan's `op`).
ROOT_OPS: "dict[object, Callable[[Data], RootOp]]" = {
    cls.TAG: cls for cls in (Scratch, Bind, Dir, Symlink, File, HostProc, MaskSocket,
                             Overlay)}
PROC_OPS: "dict[object, Callable[[Data], ProcOp]]" = {
    cls.TAG: cls for cls in (Mask, ReadOnly, Devpts, CgroupView)}


# -- building the root ---------------------------------------------------------------

_ST_TO_MS = ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC),
             (1024, MS_NOATIME), (2048, MS_NODIRATIME), (4096, MS_RELATIME))

OLD = "/oldroot"
NEW = "/newroot"
SCRATCH = "/scratch"


def mount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    call("mount", _path(source) if source else None, _path(target),
         _path(fstype) if fstype else None, flags, _path(data) if data else None,
         what=f"mount({target})")


def umount(target: str, flags: int) -> None:
    call("umount2", _path(target), flags, what=f"umount2({target})")


def _dirname(path: str) -> str:
    return path.rpartition("/")[0] or "/"


def _mkdirs(path: str, mode: int = 0o755) -> None:
    current = ""
    for part in path.strip("/").split("/"):
        current += "/" + part
        try:  # noqa: SIM105 (contextlib is one import too many for the helper)
            posix.mkdir(current, mode)
        except FileExistsError:
            pass


def _touch(path: str, mode: int = 0o444) -> None:
    _mkdirs(_dirname(path))
    try:
        posix.close(posix.open(path, posix.O_WRONLY | posix.O_CREAT | posix.O_CLOEXEC, mode))
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None


def _bind(source: str, target: str, flags: int) -> None:
    """Bind `source` (host path under /oldroot) on `target`, non-recursively
    (a submount is not carried along, so none stays writable), then remount
    it with its own flags kept and nosuid (+ nodev, + read-only) added."""
    try:
        st = posix.stat(source)
    except OSError as e:
        raise OSError(e.errno, e.strerror, f"bind({source[len(OLD):]})") from None
    if st.st_mode & S_IFMT == S_IFDIR:
        _mkdirs(target)
    else:
        _touch(target)
    mount(source, target, "", MS_BIND)
    keep = 0
    vfs = posix.statvfs(target).f_flag
    for st_flag, ms_flag in _ST_TO_MS:
        if vfs & st_flag:
            keep |= ms_flag
    extra = MS_NOSUID | (MS_NOEXEC if flags & BIND_DEVICE else MS_NODEV)
    if not flags & BIND_WRITABLE:
        extra |= MS_RDONLY
    mount("", target, "", MS_REMOUNT | MS_BIND | keep | extra)


def _skeleton(target: str, scratch_dirs: "list[str]", skeletons: "list[str]",
              bound: "list[str]", read_only_bind: bool) -> None:
    """If `target` lies in a scratch dir, make the first directory below
    that dir a tmpfs of its own (once), to be remounted read-only; unless
    that dir is itself a read-only bind (`bound`: a venv in /tmp, the
    package inside it)."""
    for base in scratch_dirs:
        if target.startswith(base):
            top = base + target[len(base):].partition("/")[0]
            if top == target:
                if read_only_bind:
                    bound.append(top)
            elif top not in skeletons and top not in bound:
                posix.mkdir(top, 0o755)
                mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
                skeletons.append(top)
            return


def build_root(staging: str, scratch: "ScratchSize", ops: "list[RootOp]",
               owner: "tuple[int, int]") -> None:
    """Build the jail's root from `ops` and pivot into it (see the module
    docstring). `scratch` is the size (bytes, inodes) of the run's one tmpfs for the
    working dir, /tmp and /dev/shm; its dirs belong to `owner` (uid, gid),
    the ids the jail will run as."""
    mount("", "/", "", MS_REC | MS_PRIVATE)
    mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    posix.chdir(staging)
    posix.mkdir("newroot", 0o755)
    posix.mkdir("oldroot", 0o755)
    mount("newroot", "newroot", "", MS_BIND)  # a mount point, for the last pivot
    pivot_root(".", "oldroot")
    posix.chdir("/")
    size, inodes = scratch.bytes, scratch.inodes
    posix.mkdir(SCRATCH, 0o755)
    mount("tmpfs", SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=0755,size={size},nr_inodes={inodes}")
    scratch_dirs: list[str] = []
    skeletons: list[str] = []
    bound: list[str] = []
    for item in ops:
        target = NEW + item.path
        if isinstance(item, MaskSocket):  # inside a bind made before it: nothing to build
            _mask_socket(target)
            continue
        if not isinstance(item, Scratch):
            read_only_bind = isinstance(item, Bind) and not item.flags & BIND_WRITABLE
            _skeleton(target, scratch_dirs, skeletons, bound, read_only_bind)
        if isinstance(item, Bind):
            _bind(OLD + item.source, target, item.flags)
        elif isinstance(item, Dir):
            _mkdirs(target, item.mode)
            posix.chmod(target, item.mode)
        elif isinstance(item, Symlink):
            _mkdirs(_dirname(target))
            posix.symlink(item.target, target)
        elif isinstance(item, File):
            _mkdirs(_dirname(target))
            flags = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_CLOEXEC
            fd = posix.open(target, flags, item.mode)
            try:
                posix.write(fd, _path(item.content))
            finally:
                posix.close(fd)
        elif isinstance(item, Scratch):  # a dir of the scratch tmpfs, bound on `path`
            mode = item.mode
            source = SCRATCH + "/" + item.name
            posix.mkdir(source, mode)
            posix.chown(source, *owner)
            posix.chmod(source, mode)  # the umask must not narrow 1777
            _mkdirs(target)
            mount(source, target, "", MS_BIND)
            scratch_dirs.append(target + "/")
        elif isinstance(item, Overlay):
            # Read-only, no upper layer: the root's `top` (made before) over
            # the host's `lower`. Mounts inside either are not seen through it.
            _mkdirs(target)
            mount("overlay", target, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
                  f"lowerdir={NEW + item.top}:{OLD + item.lower}")
        elif isinstance(item, HostProc):
            # Only until pid 2 mounts the jail's own over it: the helper
            # writes its id maps here (and a fresh proc needs a full one).
            _mkdirs(target)
            mount(OLD + "/proc", target, "", MS_BIND | MS_REC)
        else:  # an op class added without its step here
            raise OSError(22, f"unknown root operation {type(item).__name__}", "root")
    for path in [NEW, *skeletons]:
        mount("", path, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    umount(SCRATCH, MNT_DETACH)  # its dirs stay mounted where they were bound
    umount(OLD, MNT_DETACH)
    old = posix.open("/", posix.O_DIRECTORY | posix.O_RDONLY | posix.O_CLOEXEC)
    try:
        posix.chdir(NEW)
        pivot_root(".", ".")
        posix.fchdir(old)
        umount(".", MNT_DETACH)
    finally:
        posix.close(old)
    posix.chdir("/")


_EMPTY = "/empty"


def _mask_socket(target: str) -> None:
    """Hide what a bind shows at `target`: a socket (or whatever took its
    place) under an empty read-only file of the staging tmpfs, a directory
    under an empty read-only tmpfs. Gone since the parent found it: nothing
    to hide; a symlink now (mount would follow it) is no socket either."""
    try:
        st = posix.lstat(target)
    except FileNotFoundError:
        return
    kind = st.st_mode & S_IFMT
    if kind == S_IFLNK:
        return
    if kind == S_IFDIR:
        mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=0,mode=555")
        return
    try:
        posix.lstat(_EMPTY)
    except FileNotFoundError:
        _touch(_EMPTY, 0o444)
    mount(_EMPTY, target, "", MS_BIND)
    mount("", target, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _mask(target: str) -> None:
    """Hide a /proc entry: /dev/null over a file, an empty read-only tmpfs
    over a directory. Entries this kernel lacks have nothing to hide."""
    try:
        st = posix.lstat(target)
    except FileNotFoundError:
        return
    if st.st_mode & S_IFMT == S_IFDIR:
        mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=0,mode=555")
    else:
        mount("/dev/null", target, "", MS_BIND)


def _read_only(target: str) -> None:
    try:
        posix.lstat(target)
    except FileNotFoundError:
        return
    mount(target, target, "", MS_BIND | MS_REC)
    mount("", target, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _devpts(item: "Devpts") -> None:
    """A new devpts instance on `item.path`, of the user namespace pid 2 is in
    (the jail's): its ptys are the run's own. Device nodes, so not nodev."""
    options = f"newinstance,ptmxmode={item.ptmx_mode:04o},mode={item.mode:04o},max={item.max}"
    mount("devpts", item.path, "devpts", MS_NOSUID | MS_NOEXEC, options)


def enter_jail(proc_ops: "list[ProcOp]", hostname: str, workdir: str,
               again: bool = False) -> None:
    """In pid 2: the jail's own /proc over the host's, `proc_ops` (mask or
    make read-only a path, a pty instance, the program's cgroup), the
    hostname, the working dir. `again`: a session's command, in a copy of
    the session's mounts, whose cgroup views it replaces (the kernel
    refuses a hierarchy's mount on its own mount point)."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for item in proc_ops:
        if isinstance(item, Mask):
            _mask(item.path)
        elif isinstance(item, ReadOnly):
            _read_only(item.path)
        elif isinstance(item, Devpts):
            _devpts(item)
        elif isinstance(item, CgroupView):
            # The jail's cgroup namespace is rooted at the run's `prog`: the
            # mount shows that cgroup and nothing above it. Read-only.
            if again:
                umount(item.path, MNT_DETACH)
            mount(item.fstype, item.path, item.fstype,
                  MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, item.options)
        else:  # an op class added without its step here
            raise OSError(22, f"unknown /proc operation {type(item).__name__}", "proc")
    name = _path(hostname)
    call("sethostname", name, len(name))
    posix.chdir(workdir)
