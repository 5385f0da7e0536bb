"""Filesystem and /proc escapes: each child reaches for something outside its
jail dir; each test asserts the errno and that the outside thing is unchanged."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from conftest import TESTS_DIR, child_pids, make_runner
from support import host_children, run_code, scaled, sha256, user_xattrs_absent, wait_until
from trunner import Limits, Runner

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A root-owned secret file outside any jail dir."""
    d = tmp_path / "outside"
    d.mkdir()
    f = d / "secret.txt"
    f.write_text("top secret")
    os.chmod(f, 0o644)
    return f


# Reading a host secret and writing to /tmp, /var/tmp, /dev/shm or a test dir:
# test_jail.py (test_reading_a_file_outside_fails, test_writing_outside_the_jail_fails).


async def test_overwrite_and_unlink_existing_outside_file(runner: Runner, outside: Path) -> None:
    """Tamper with an existing host file: truncate, append, unlink, rename away."""
    before = outside.stat()
    result = await run_code(runner, f"""
        p = {str(outside)!r}
        result = [attempt(lambda: open(p, "w")), attempt(lambda: open(p, "a")),
                  attempt(lambda: os.truncate(p, 0)), attempt(lambda: os.unlink(p)),
                  attempt(lambda: os.rename(p, "stolen"))]
    """)
    assert result == ["ENOENT"] * 5  # not in the jail's root (Landlock denies it on top)
    assert outside.read_text() == "top secret"
    assert outside.stat().st_ino == before.st_ino
    assert outside.stat().st_mtime_ns == before.st_mtime_ns


async def test_symlink_from_jail_to_outside_file(runner: Runner, outside: Path) -> None:
    """Symlink planted in the jail dir pointing out (symlink race out of the jail dir)."""
    result = await run_code(runner, f"""
        os.symlink({str(outside)!r}, "link")
        os.symlink({str(outside.parent)!r}, "dirlink")
        result = [attempt(lambda: open("link").read()),
                  attempt(lambda: open("link", "w").write("pwned")),
                  attempt(lambda: open("dirlink/secret.txt").read()),
                  attempt(lambda: open("dirlink/new", "w").write("pwned"))]
    """)
    assert result == ["ENOENT"] * 4  # the targets are not in the jail's root
    assert outside.read_text() == "top secret"
    assert sorted(os.listdir(outside.parent)) == ["secret.txt"]


async def test_hardlink_from_jail_to_outside_file(runner: Runner, outside: Path) -> None:
    """Hardlink an outside file into the jail dir to gain write access through the jail rule."""
    nlink = outside.stat().st_nlink
    result = await run_code(runner, f"""
        result = [attempt(lambda: os.link({str(outside)!r}, "hl")), os.path.exists("hl")]
    """)
    assert result == ["ENOENT", False]  # not in the jail's root
    assert outside.stat().st_nlink == nlink
    assert outside.read_text() == "top secret"


async def test_hardlink_to_setuid_binary(runner: Runner) -> None:
    """Hardlink to setuid binary (pin a vulnerable suid copy for later / CVE-2009-style)."""
    candidates = ("/usr/bin/passwd", "/usr/bin/su", "/bin/su")
    suid = next((p for p in candidates if os.path.exists(p)), None)
    if suid is None:
        pytest.skip("no setuid binary on this host")
    nlink = os.stat(suid).st_nlink
    result = await run_code(runner, f"""
        result = [attempt(lambda: os.link({suid!r}, "suid")), os.path.exists("suid")]
    """)
    # The binary is on a read-only bind, the working dir on the scratch tmpfs:
    # a link across mounts is EXDEV before any permission check (as root or
    # not, at every Landlock ABI); Landlock (no REFER granted) and, not root,
    # fs.protected_hardlinks would refuse it on top.
    assert result == ["EXDEV", False]
    assert os.stat(suid).st_nlink == nlink


async def test_rename_jail_file_out_and_outside_file_in(runner: Runner, tmp_path: Path) -> None:
    """rename(2) across the jail boundary (move a payload out / pull a file in)."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    result = await run_code(runner, f"""
        open("payload", "w").write("x")
        result = [attempt(lambda: os.rename("payload", {str(inbox / "payload")!r})),
                  attempt(lambda: os.rename({str(inbox)!r}, "grabbed"))]
    """)
    assert result == ["ENOENT", "ENOENT"]  # the inbox is not in the jail's root
    assert os.listdir(inbox) == []


async def test_sibling_jail_dir(runner: Runner, jail_root: Path) -> None:
    """Another invocation's jail dir (cross-tenant read/write between concurrent runs)."""
    sibling = jail_root / "trunner-sibling"
    sibling.mkdir(mode=0o700)
    (sibling / "data").write_text("tenant B")
    try:
        result = await run_code(runner, f"""
            s = {str(sibling)!r}
            result = [attempt(lambda: open(s + "/data").read()),
                      attempt(lambda: open(s + "/data", "w")),
                      attempt(lambda: open(s + "/new", "w")),
                      attempt(lambda: os.listdir(s)),
                      attempt(lambda: os.listdir(os.path.dirname(os.getcwd())))]
        """)
        # Not in the jail's root; the working dir's parent is the root's /home,
        # which holds the jail's own working dir only.
        assert result == ["ENOENT"] * 4 + ["OK:['trunner']"]
        assert (sibling / "data").read_text() == "tenant B"
        assert sorted(os.listdir(sibling)) == ["data"]
    finally:
        shutil.rmtree(sibling)


@pytest.mark.parametrize(
    "path",
    [
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/proc/sys/kernel/core_pattern",  # core_pattern pipe escape
        "/proc/sysrq-trigger",
        "/dev/kmsg",
        "/dev/tty",
        "/dev/mem",
        "/sys/fs/cgroup/cgroup.procs",  # cgroup v2: migrate out of the per-run pids cgroup
        "/sys/fs/cgroup/pids/cgroup.procs",  # cgroup v1: same
        "/sys/fs/cgroup/pids/trunner/cgroup.procs",
        "/sys/fs/cgroup/pids/release_agent",  # CVE-2022-0492 cgroup v1 release_agent escape
        "/sys/fs/cgroup/memory/release_agent",
    ],
)
async def test_open_host_control_file_for_write(runner: Runner, path: str) -> None:
    """Writable kernel/host control files in /proc, /sys and /dev (opened only, nothing written)."""
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    before = Path(path).read_bytes() if path.startswith("/proc/sys/") else None
    result = await run_code(runner, f"""
        import os.path
        result = [attempt(lambda: os.close(os.open({path!r}, os.O_WRONLY)))]
        if os.path.exists({path!r}):
            result.append(bool(os.statvfs({path!r}).f_flag & os.ST_RDONLY))
    """)
    # /sys, /dev/kmsg, /dev/mem and cgroups are not in the jail's root. /proc/sys
    # is mounted read-only, and its files are root's: the jail's uid (65534 for
    # a root caller) gets EACCES before the mount's EROFS (Landlock grants /proc
    # read only, on top). /dev/tty is bound and granted: it opens the caller's
    # controlling terminal, which can only be a pty of the run's own devpts, and
    # the run starts with none (a new session): ENXIO, no host terminal.
    expected: list[object] = ["EACCES", True] if path.startswith("/proc/sys") else ["ENOENT"]
    expected = {"/dev/tty": ["ENXIO", False]}.get(path, expected)
    if path in _cgroup_view_files():
        # The program's own cgroup, shown read-only (`CgroupView`): its
        # cgroup.procs is root's as root (EACCES), else the mount's EROFS.
        expected = ["EACCES" if os.getuid() == 0 else "EROFS", True]
    assert result == expected
    if before is not None:
        assert Path(path).read_bytes() == before


def _cgroup_view_files() -> set[str]:
    """The cgroup.procs files the jail's /sys/fs/cgroup shows: its program's
    own cgroup's, at each view's root."""
    from trunner.linux.probe import probe_host

    views = probe_host().cgroup_views
    if views == (("cgroup2", ""),):
        return {"/sys/fs/cgroup/cgroup.procs"}
    shown = {c for _, options in views for c in options.split(",")}
    return {f"/sys/fs/cgroup/{c}/cgroup.procs" for c in shown}


METADATA_CALLS = {
    "chmod": "os.chmod(p, 0o4777)",
    "fchmod": "os.chmod(os.open(p, os.O_RDONLY), 0o4777)",  # a read-only fd is enough
    "chown": "os.chown(p, os.getuid(), os.getgid())",
    "lchown": "os.lchown(p, -1, os.getgid())",
    "utime": "os.utime(p, (0, 0))",
    "utime_now": "os.utime(p)",
    "setxattr": "os.setxattr(p, 'user.x', b'y')",
    "removexattr": "os.removexattr(p, 'user.x')",
}


def _metadata(path: Path) -> tuple[object, ...]:
    st = path.stat()
    return st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_atime_ns, os.listxattr(path)


@pytest.mark.parametrize("call", METADATA_CALLS.values(), ids=METADATA_CALLS.keys())
async def test_change_metadata_of_outside_file(
    jail_root: Path, outside: Path, call: str
) -> None:
    """chmod/chown/utime/xattr of a host file (make it setuid, forge times): allowed by
    seccomp now, they fail in the kernel. A file bound into the jail (an import path: a
    read-only bind) gives EROFS; one outside the jail's root is not there (ENOENT)."""
    runner = make_runner(import_paths=[TESTS_DIR, str(outside.parent)],
                         temp_root=str(jail_root), limits=Limits(wall_time_s=20.0))
    outside.touch()
    os.utime(outside, (1_000_000, 2_000_000))  # atime too: a read must not change it
    unbound = outside.parent.parent / "unbound.txt"
    unbound.write_text("not bound")
    before = _metadata(outside), _metadata(unbound)
    result = await run_code(runner, f"""
        result = []
        for p in ({str(outside)!r}, {str(unbound)!r}):
            result.append(attempt(lambda: {call}))
    """)
    assert result == ["EROFS", "ENOENT"]
    assert (_metadata(outside), _metadata(unbound)) == before
    assert outside.read_text() == "top secret"


async def test_metadata_of_the_jails_own_files_can_change(runner: Runner) -> None:
    """In the scratch (the jail's own tmpfs) chmod and utime work: tar, make and
    the linker need them. The setuid bit means nothing there (nosuid)."""
    result = await run_code(runner, """
        open("f", "w").close()
        os.chmod("f", 0o4751)
        os.utime("f", (5, 7))
        st = os.stat("f")
        result = [oct(st.st_mode & 0o7777), st.st_atime, st.st_mtime,
                  attempt(lambda: os.chown("f", os.getuid(), os.getgid())),
                  "nosuid" in [l for l in open("/proc/self/mountinfo")
                               if " /home/trunner " in l][0]]
    """)
    assert result == ["0o4751", 5.0, 7.0, "OK:None", True]


async def test_user_xattrs_of_the_jails_own_files_work(runner: Runner) -> None:
    """In the scratch, user xattrs can be set, read, listed and removed (tar and
    rsync keep them), where the kernel's tmpfs has them."""
    if (reason := user_xattrs_absent()) is not None:
        pytest.skip(reason)
    result = await run_code(runner, """
        open("f", "w").close()
        def users():
            return [name for name in os.listxattr("f") if name.startswith("user.")]
        result = [attempt(lambda: os.setxattr("f", "user.k", b"v")), os.getxattr("f", "user.k"),
                  users(), attempt(lambda: os.removexattr("f", "user.k")), users()]
    """)
    assert result == ["OK:None", b"v", ["user.k"], "OK:None", []]


async def test_overwrite_proc_self_exe_and_python_binary(runner: Runner) -> None:
    """CVE-2019-5736-style /proc/self/exe overwrite of the runtime binary."""
    exe = os.path.realpath(sys.executable)
    digest = sha256(exe)
    stdlib = os.__file__  # same read/exec rule, but not busy: Landlock must answer
    lib_digest = sha256(stdlib)
    result = await run_code(runner, f"""
        result = {{"exe": os.path.realpath("/proc/self/exe"),
                   "selfexe": attempt(lambda: open("/proc/self/exe", "r+b").write(b"X")),
                   "python": attempt(lambda: open({exe!r}, "r+b").write(b"X")),
                   "trunc": attempt(lambda: os.truncate({exe!r}, 0)),
                   "unlink": attempt(lambda: os.unlink({exe!r})),
                   "stdlib": attempt(lambda: open({stdlib!r}, "r+b").write(b"X")),
                   "stdlib_trunc": attempt(lambda: os.truncate({stdlib!r}, 0))}}
    """)
    # EROFS: the interpreter is a read-only bind (Landlock answers EACCES on top).
    assert result["selfexe"] in ("EACCES", "ETXTBSY", "EROFS"), result
    assert result["python"] in ("EACCES", "ETXTBSY", "EROFS"), result
    assert result["trunc"] in ("EACCES", "ETXTBSY", "EROFS"), result
    assert result["unlink"] in ("EACCES", "EROFS"), result
    assert result["stdlib"] in ("EACCES", "EROFS"), result
    assert result["stdlib_trunc"] in ("EACCES", "EROFS"), result
    assert sha256(exe) == digest
    assert sha256(stdlib) == lib_digest
    assert result["exe"] == exe  # the jailed worker runs this very binary


async def test_mknod_device_node_in_jail(runner: Runner) -> None:
    """mknod of a block device in the writable jail dir (raw disk access): EPERM, no node."""
    result = await run_code(runner, """
        result = [attempt(lambda: os.mknod("sda", 0o600 | 0o60000, os.makedev(8, 0))),
                  attempt(lambda: os.mknod("/dev/shm/sda", 0o600 | 0o60000, os.makedev(8, 0))),
                  os.path.lexists("sda"), os.path.lexists("/dev/shm/sda")]
    """)
    assert result == ["EPERM", "EPERM", False, False]


async def test_open_by_handle_at_shocker(runner: Runner) -> None:
    """CVE-2014-3519 'shocker': name_to_handle_at + open_by_handle_at to walk out of a
    chroot/mount: the handle is only a name (allowed, as Docker does), its open
    EPERM, no descriptor."""
    result = await run_code(runner, """
        import ctypes
        handle = ctypes.create_string_buffer(8 + 128)
        handle[0:4] = (128).to_bytes(4, "little")
        mount_id = ctypes.c_int()
        fds = os.listdir("/proc/self/fd")
        result = [syscall(303, -100, b"/", handle, ctypes.byref(mount_id), 0),  # name_to_handle_at
                  syscall(304, -100, handle, 0),  # open_by_handle_at
                  os.listdir("/proc/self/fd") == fds]
    """)
    assert result == ["OK:0", "EPERM", True]


@pytest.mark.parametrize("what", ["1/environ", "PPID/environ", "1/cmdline", "PPID/cmdline",
                                  "PPID/root/etc/shadow", "PPID/cwd", "PPID/fd", "PPID/mem",
                                  "1/root"])
async def test_proc_of_other_processes(runner: Runner, what: str) -> None:
    """/proc of init and of the parent (environ/cmdline secrets, /proc/PID/root traversal, mem)."""
    path = "/proc/" + what.replace("PPID", str(os.getpid()))
    result = await run_code(runner, f"""
        p = {path!r}
        is_dir = p.endswith(("fd", "root"))
        result = attempt(lambda: os.listdir(p) if is_dir else open(p, "rb").read(4096))
    """)
    # The parent is not in the jail's PID namespace; pid 1 is the jail's own
    # reaper (trunner-waiter init), whose cmdline is the only thing it shows.
    if what.startswith("PPID"):
        assert result == "ENOENT", (path, result)
    elif what == "1/cmdline":
        assert result.startswith("OK:"), (path, result)
        waiter = "/trunner/kernel/trunner-waiter"
        assert result.endswith(waiter + "\\x00init\\x00'"), (path, result)
    else:
        assert result == "EACCES", (path, result)


# The parent's environment: test_jail.py::test_parent_environment_is_not_inherited.


async def test_hardlink_through_proc_self_fd(runner: Runner) -> None:
    """Hardlink a read-only file into the jail via /proc/self/fd/N, to write it by the jail rule."""
    target = os.__file__  # readable in the jail, never writable
    digest, nlink = sha256(target), os.stat(target).st_nlink
    result = await run_code(runner, f"""
        fd = os.open({target!r}, os.O_RDONLY)
        result = [attempt(lambda: os.link(f"/proc/self/fd/{{fd}}", "hl", follow_symlinks=True)),
                  os.path.exists("hl")]
    """)
    assert result == ["EXDEV", False]
    assert os.stat(target).st_nlink == nlink
    assert sha256(target) == digest


async def test_fd_relative_traversal_from_o_path(runner: Runner, outside: Path) -> None:
    """openat() relative to an O_PATH dirfd and /proc/self/cwd/.. (fd-relative traversal out)."""
    result = await run_code(runner, f"""
        def rel():
            dfd = os.open({str(outside.parent)!r}, os.O_PATH | os.O_DIRECTORY)
            return os.read(os.open("secret.txt", os.O_RDONLY, dir_fd=dfd), 100)
        result = [attempt(rel), attempt(lambda: os.listdir("/proc/self/cwd/.."))]
    """)
    # Outside: not in the root; "..": the root's /home, the jail's own dir only.
    assert result == ["ENOENT", "OK:['trunner']"]
    assert "top secret" not in repr(result)


# Where the host must act while a jailed child holds something: the child makes
# a file `ready` in its working dir (reached from the host through the jail's
# /proc/PID/cwd) and waits for the host's SIGUSR1, which a wakeup pipe catches
# whenever it comes. Every signal with a handler lands in that pipe: the child
# reports the ones it got.
HOLD = f"""
import select, signal
_wake_r, _wake_w = os.pipe()
os.set_blocking(_wake_w, False)
signal.set_wakeup_fd(_wake_w)
for _sig in (signal.SIGIO, signal.SIGUSR1):
    signal.signal(_sig, lambda n, f: None)
open("ready", "w").close()
signals = b""
while signal.SIGUSR1 not in signals and select.select([_wake_r], [], [], {scaled(15)})[0]:
    signals += os.read(_wake_r, 64)
signals = sorted(set(signals))
"""


def _ready_jails() -> list[int]:
    """Host pids of jailed children (pid 2 of each jail) that made `ready`."""
    return [jail for helper in child_pids() for init in host_children(helper)
            for jail in host_children(init) if os.path.exists(f"/proc/{jail}/cwd/ready")]


async def while_held(
    runner: Runner, before: str, after: str, host: Callable[[], Any]
) -> tuple[Any, Any]:
    """Run `before` in the jail, then `HOLD`; meanwhile `host()` runs on the host
    and the child is released; then `after`, whose `result` is returned with
    what `host()` returned."""
    out: dict[str, Any] = {}
    code = textwrap.dedent(before) + HOLD + textwrap.dedent(after)

    async def jailed() -> None:
        out["child"] = await run_code(runner, code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(jailed)
        ready = await wait_until(_ready_jails, 15, "the jail's `ready`")
        try:
            out["host"] = host()
        finally:
            os.kill(ready[0], signal.SIGUSR1)
    return out["child"], out["host"]


async def test_dnotify_on_a_read_only_host_dir(jail_root: Path, tmp_path: Path) -> None:
    """fcntl(F_NOTIFY) on a directory of a read-only host bind would signal the jail
    (SIGIO) each time a host process or another jail lists or changes it. It fails
    EPERM, like F_SETLEASE; the host lists and writes, and no SIGIO comes."""
    watched = tmp_path / "watched"
    watched.mkdir()
    (watched / "old").write_text("host data")
    runner = make_runner(import_paths=[TESTS_DIR, str(watched)], temp_root=str(jail_root),
                         limits=Limits(wall_time_s=20.0))
    before = f"""
        import fcntl
        fd = os.open({str(watched)!r}, os.O_RDONLY | os.O_DIRECTORY)
        armed = attempt(lambda: fcntl.fcntl(
            fd, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_CREATE | fcntl.DN_MULTISHOT))
    """

    def host() -> list[str]:
        listed = os.listdir(watched)
        (watched / "new").write_text("host data")
        return listed

    child, listed = await while_held(runner, before, "result = [armed, signals]", host)
    # The host listed and wrote (SIGIO, 29, would be there), and was not seen.
    assert (child, listed) == (["EPERM", [signal.SIGUSR1]], ["old"])


# -- /etc: what the jail holds of the host's reveals no secret -------------------------

#: Inside: what /etc/ssl holds, a planted key by its path and through
#: /usr/lib/ssl/private (a link to /etc/ssl/private), the jail's groups, and
#: whether the CA certificates still load (a TLS client's).
ETC_SECRETS = r"""
import errno, json, os, ssl, sys
def attempt(fn):
    try:
        return "OK:" + repr(fn())
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
key = sys.argv[1]
name = os.path.basename(key)
print(json.dumps({
    "ssl": sorted(os.listdir("/etc/ssl")),
    "key": attempt(lambda: open(key).read()),
    "via_usr": attempt(lambda: open("/usr/lib/ssl/private/" + name).read()),
    "private": attempt(lambda: os.stat("/etc/ssl/private")),
    "etc": sorted(set(os.listdir("/etc")) & {"shadow", "gshadow", "ssh", "sudoers",
                                             "machine-id", "ssl-cert-snakeoil.key"}),
    "groups": len(os.getgroups()),
    "cas": ssl.create_default_context().cert_store_stats()["x509_ca"],
}))
"""

#: The caller: one exec of ETC_SECRETS with its key path; the program's JSON line.
ETC_CALLER = """
import json, sys, trio
from trunner import Limits, Runner
from trunner.linux.backend import LinuxBackend
from trunner.worker import locate_worker
code, key, temp_root, cap = json.loads({args!r})

async def main():
    backend = None if cap is None else LinuxBackend(locate_worker(), landlock_abi=cap)
    runner = (Runner(temp_root=temp_root) if backend is None
              else Runner(temp_root=temp_root, backend=backend))
    r = (await runner.exec(["python3", "-I", "-c", code, key])).response
    assert r.exit_code == 0, r.stderr
    print(r.stdout.decode().strip())

trio.run(main)
"""


@pytest.fixture
def planted_key() -> Iterator[Path]:
    """A key of group ssl-cert in /etc/ssl/private (where Debian keeps its
    snakeoil key), for this test alone; root only."""
    import grp

    if os.getuid() != 0:
        pytest.skip("planting a key in /etc/ssl/private needs root")
    try:
        gid = grp.getgrnam("ssl-cert").gr_gid
    except KeyError:
        pytest.skip("no group ssl-cert on this host")
    if not os.path.isdir("/etc/ssl/private"):
        pytest.skip("no /etc/ssl/private on this host")
    key = Path(f"/etc/ssl/private/trunner-test-{os.getpid()}.key")
    key.write_text("PRIVATE KEY")
    try:
        os.chown(key, 0, gid)
        key.chmod(0o640)
        yield key
    finally:
        key.unlink()


def _key(request: pytest.FixtureRequest) -> str:
    """The planted key (root), else where Debian keeps its snakeoil key."""
    if os.getuid() == 0:
        return str(request.getfixturevalue("planted_key"))
    return "/etc/ssl/private/ssl-cert-snakeoil.key"


def _no_secret(out: dict[str, Any]) -> None:
    assert out["ssl"] == sorted(p for p in ("certs", "openssl.cnf")
                                if os.path.exists(f"/etc/ssl/{p}"))
    assert (out["key"], out["via_usr"], out["private"]) == ("ENOENT", "ENOENT", "ENOENT")
    assert out["etc"] == []
    assert out["cas"] > 0  # the CA certificates still load


async def test_etc_reveals_no_host_secret(request: pytest.FixtureRequest, jail_root: Path) -> None:
    """Of /etc/ssl the jail holds only the certificates and openssl.cnf (it
    bound /etc/ssl whole): a key in /etc/ssl/private is not there, by its
    path or through /usr/lib/ssl/private, a link to it."""
    key = _key(request)
    runner = make_runner(temp_root=str(jail_root))
    r = (await runner.exec(["python3", "-I", "-c", ETC_SECRETS, key])).response
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    _no_secret(out)
    assert out["groups"] == (0 if os.getuid() == 0 else len(os.getgroups()))


def test_etc_reveals_no_host_secret_to_a_caller_in_group_ssl_cert(
        request: pytest.FixtureRequest) -> None:
    """The same for a non-root caller in group ssl-cert, who can read the
    key on the host, and whose jail keeps its supplementary groups (the
    host's ssl-cert shows there as the overflow gid)."""
    import grp
    import subprocess

    from installed import run_caller, temp_install, unused_id, world_python

    from conftest import landlock_cap

    if os.getuid() != 0:
        pytest.skip("a caller of another uid and group needs root to start it")
    key = _key(request)
    python = world_python()
    if python is None:
        pytest.skip("no interpreter of this Python's version that every uid can run")
    gid = grp.getgrnam("ssl-cert").gr_gid
    uid = unused_id()
    seen = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", f"--groups={gid}",
                           "cat", key], capture_output=True, text=True, check=False)
    assert seen.stdout == "PRIVATE KEY"  # on the host, the caller can read it
    install = temp_install(python)
    try:
        temp_root = Path(tempfile.mkdtemp(prefix="jails-", dir=install))
        temp_root.chmod(0o1777)
        args = [ETC_SECRETS, key, str(temp_root), landlock_cap()]
        out = run_caller(install, ETC_CALLER.format(args=json.dumps(args)), uid=uid,
                         groups=[gid])
        assert isinstance(out, dict)
        assert list(temp_root.iterdir()) == [], "the caller left a jail dir behind"
    finally:
        shutil.rmtree(install)
    _no_secret(out)
    assert out["groups"] == 1  # ssl-cert, kept
