"""trunner installed under the host's temp dir, run by a caller of another uid.

Not a test module. Some attacks need conditions of their own, which a test
makes rather than relying on where CI put the checkout:

- `temp_install()`: a venv under the temp dir (world-readable, from a
  world-readable interpreter of this Python's version), holding a copy of
  the trunner package this process imports (a checkout's or an installed
  wheel's, its worker binary inside it) and of what it imports. Its jails bind it inside their own
  scratch /tmp, where the jail's uid owns the directories above it.
- `run_caller(install, script, uid=...)`: run `script` with that venv's
  Python as `uid` (from root, through `setpriv`; not root, as oneself): a
  non-root caller, whose pipes belong to the jail's uid.
- `unused_id()`: that uid, one no other test run on this host uses at the
  same time (`claim`).

The script prints one JSON line; `run_caller` returns it decoded.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from support import scaled

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

#: What trunner imports in the caller, beside the standard library.
DEPENDENCIES = ("trio", "outcome", "sniffio", "sortedcontainers", "attr", "attrs", "idna",
                "msgspec", "blake3", "pyseccomp")


def readable_by_all(path: str) -> bool:
    """Whether every directory above `path` is searchable, and `path` readable, by anyone."""
    parts = Path(path).parts
    for i in range(1, len(parts)):
        if not os.stat(os.path.join(*parts[:i])).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def world_python() -> str | None:
    """An interpreter of this Python's version that any uid can run."""
    version = "python{}.{}".format(*sys.version_info[:2])
    for path in (os.path.realpath(sys.executable), f"/usr/bin/{version}",
                 f"/usr/local/bin/{version}"):
        if os.path.isfile(path) and readable_by_all(path):
            return path
    return None


def _copy_module(name: str, site: Path) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{name} is not importable here")
    if spec.submodule_search_locations:
        src = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(src, site / src.name, symlinks=True)
    else:
        shutil.copy2(spec.origin, site / Path(spec.origin).name)


def temp_install(python: str) -> Path:
    """A venv under the temp dir with this trunner in it; returns its root
    (removed again if making it fails)."""
    root = Path(tempfile.mkdtemp(prefix="trunner-install-", dir="/tmp"))
    try:
        _fill(root, python)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def _fill(root: Path, python: str) -> None:
    root.chmod(0o755)
    venv = root / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(venv / "bin/python"), "-c", purelib],
                               check=True, capture_output=True, text=True).stdout.strip())
    for name in DEPENDENCIES:
        _copy_module(name, site)
    # The package actually imported (trunner/worker/trunner-worker inside it).
    _copy_module("trunner", site)
    # As scripts/setup does: the jail cannot write __pycache__, nor should a caller.
    subprocess.run([str(venv / "bin/python"), "-m", "compileall", "-q", str(site)],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)


def unused_id() -> int:
    """A uid and gid that no passwd or group entry and no process uses, and
    (as root) that no other test process on this host has claimed: two test
    runs at once (another clone's) never run their callers as one uid."""
    taken: set[int] = set()
    for path in ("/etc/passwd", "/etc/group"):
        with open(path) as f:
            taken.update(int(line.split(":")[2]) for line in f if line.count(":") >= 3)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            taken.add(os.stat(f"/proc/{pid}").st_uid)
        except FileNotFoundError:
            continue
    ids = range(61000, 62000)
    if os.getuid() != 0:  # the id is only ever used from root (`run_caller`)
        return next(i for i in ids if i not in taken)
    return claim("uid", ids, lambda i: i not in taken)


#: Root's record of what each test process on this host has claimed
#: (`claim`): host-wide, as what is claimed is (ids).
CLAIMS_DIR = "/run/trunner-test-claims"


def claim(kind: str, candidates: Iterable[int], usable: Callable[[int], bool]) -> int:
    """The first of `candidates` that `usable` accepts and no other live test
    process on this host has claimed as `kind`; it is this process's until
    it exits. A claim is a file naming its owner (`trunner.cleanup.owner_id`),
    written under a lock: no descriptor stays open, and a dead owner's claim
    is free again. Root only (the dir is root's, under /run)."""
    from trunner.cleanup import owner_alive, owner_id

    os.makedirs(CLAIMS_DIR, mode=0o700, exist_ok=True)
    me = owner_id()
    lock = os.open(f"{CLAIMS_DIR}/.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for i in candidates:
            path = Path(CLAIMS_DIR, f"{kind}-{i}")
            try:
                owner = path.read_text()
            except FileNotFoundError:
                owner = ""
            if owner and owner != me and owner_alive(owner):
                continue  # another test process's
            if usable(i):
                if owner != me:
                    path.write_text(me)
                return i
    finally:
        os.close(lock)  # drops the flock
    raise RuntimeError(f"no {kind} left in {candidates!r}: every one is claimed or in use")


def run_caller(install: Path, script: str, *, uid: int | None = None,
               timeout_s: float = 120, groups: Iterable[int] = ()) -> object:
    """Run `script` with the install's Python, as `uid` when given (root
    only), with the supplementary `groups` (none by default)."""
    argv = [str(install / "venv/bin/python"), "-I", "-c", script]
    if uid is not None and os.getuid() == 0:
        kept = ",".join(map(str, groups))
        grouping = f"--groups={kept}" if kept else "--clear-groups"
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", grouping, "--", *argv]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": tempfile.gettempdir()}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/",
                          timeout=scaled(timeout_s))
    if done.returncode != 0:
        raise AssertionError(f"caller exited {done.returncode}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
