"""A jail dir's life on the host: made, listed with the watchdog, removed
whatever the child left in it.

`remove_tree` is iterative and fd-relative: any depth, a few fds, never a
symlink followed, modes the child took away given back. The watchdog process
runs it too, so this module imports only the standard library at its top.
The runner calls `make_jail_dir` and `remove_jail_dir` (off the event loop,
shielded).
"""

from __future__ import annotations

import contextlib
import os
import tempfile

#: A directory to list and unlink in; O_NOFOLLOW: a symlink is never entered.
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A handle on a directory that needs no permission on it.
_HANDLE = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> bool:
    """Remove `path` and everything under it; returns whether it is gone.

    Never recurses and holds at most four fds at any depth. A symlink is
    removed, never followed. A directory lacking owner rwx (a child may make
    one 000) is given it first. Stops at the first error it cannot fix, and
    so is safe on failure paths: it never raises `OSError`.
    """
    parent, name = os.path.split(os.path.abspath(path))
    if not name:
        return False
    try:
        top = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        with contextlib.suppress(OSError):
            _remove(top, name)
        os.stat(name, dir_fd=top, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        pass
    finally:
        os.close(top)
    return False


def _remove(top: int, name: str) -> None:
    fd = _enter(top, name)
    if fd is None:
        _unlink(top, name)
        return
    # One frame per directory from `name` down to the open one: its name in
    # its parent, its identity (to check that ".." leads back), and its
    # subdirectories still to remove. Only the deepest directory is open.
    try:
        frames = [(name, _identity(fd), _clear(fd))]
        while frames:
            subdirs = frames[-1][2]
            if subdirs:
                sub = subdirs.pop()
                child = _enter(fd, sub)
                if child is None:  # replaced by a non-directory, or gone
                    _unlink(fd, sub)
                    continue
                os.close(fd)
                fd = child
                frames.append((sub, _identity(fd), _clear(fd)))
                continue
            done = frames.pop()[0]
            if not frames:
                os.rmdir(done, dir_fd=top)
                break
            up = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            if _identity(fd) != frames[-1][1]:
                raise OSError(f"{done!r} was moved during its removal")
            os.rmdir(done, dir_fd=fd)
    finally:
        os.close(fd)


def _enter(parent: int, name: str) -> int | None:
    """An fd to list directory `name` and unlink in it; None if `name` is
    not a directory (a symlink to one included) or is gone."""
    try:
        handle = os.open(name, _HANDLE, dir_fd=parent)
    except (NotADirectoryError, FileNotFoundError):
        return None
    try:
        if os.fstat(handle).st_mode & 0o700 != 0o700:
            # Through the handle, so the directory checked is the one changed.
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        return os.open(".", _DIR, dir_fd=handle)
    finally:
        os.close(handle)


def _clear(fd: int) -> list[str]:
    """Unlink every non-directory in `fd`; returns the subdirectories."""
    with os.scandir(fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in entries:
        if not is_dir:
            _unlink(fd, name)
    return [name for name, is_dir in entries if is_dir]


def _unlink(fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=fd)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def make_jail_dir(temp_root: str | None) -> str:
    """A fresh 0700 jail dir under `temp_root` (default: the system temp
    dir), listed with the watchdog before it exists: a parent dying at any
    moment after this call leaves it to the watchdog.

    Raises:
        OSError: the dir cannot be made, or the watchdog cannot be told.
    """
    from trunner.linux import watchdog

    root = os.path.abspath(tempfile.gettempdir() if temp_root is None else temp_root)
    while True:
        path = os.path.join(root, f"trunner-{os.urandom(8).hex()}")
        watchdog.hold(None, path)
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            watchdog.forget(path)  # not ours: never the watchdog's to remove
        except BaseException:
            watchdog.forget(path)
            raise


async def remove_jail_dir(path: str) -> bool:
    """Remove a jail dir without blocking the event loop; returns whether it
    is gone. Shielded, so it runs to the end under cancellation too. Once
    the dir is gone, the watchdog stops listing it."""
    import trio

    from trunner.linux import watchdog

    try:
        os.rmdir(path)  # the common case, empty: one syscall, no thread
        gone = True
    except FileNotFoundError:
        gone = True
    except OSError:
        with trio.CancelScope(shield=True):
            gone = await trio.to_thread.run_sync(remove_tree, path)
    if gone:
        watchdog.forget(path)
    return gone
