"""Tests for trunner.landlock: pure planning/encoding, and real jailed child processes."""

import errno
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import strategies as st

import trunner.kernel.install as install
import trunner.linux.landlock as ll
from conftest import landlock_abi_in_force, landlock_cap
from support import TIME_SCALE, scaled

REPO = os.path.dirname(os.path.dirname(os.path.abspath(ll.__file__)))
KERNEL_ABI = install.landlock_abi()
#: The ABI the jailed children below plan for: the kernel's, or the test run's
#: cap (TRUNNER_TEST_LANDLOCK_ABI), at most KNOWN_ABI.
ABI = landlock_abi_in_force()
_CAP = landlock_cap()
_WHOSE = f"the cap {_CAP}, kernel {KERNEL_ABI}" if _CAP is not None else "the kernel's"


def needs(feature: str) -> pytest.MarkDecorator:
    """Skip where the Landlock ABI in force lacks `feature` (one of ll.FEATURES)."""
    since = {f.name: f.abi for f in ll.FEATURES}[feature]
    return pytest.mark.skipif(
        since > ABI, reason=f"Landlock ABI {ABI} ({_WHOSE}) lacks {feature} (ABI {since})")


#: The ABIs a real restrict is tried at (each a cap below this kernel's).
CAPPED_ABIS = [abi for abi in range(1, ll.KNOWN_ABI + 1) if abi <= KERNEL_ABI]


# ---------------------------------------------------------------------------
# Pure part
# ---------------------------------------------------------------------------


def test_constants_match_uapi() -> None:
    fs = [
        ll.ACCESS_FS_EXECUTE, ll.ACCESS_FS_WRITE_FILE, ll.ACCESS_FS_READ_FILE,
        ll.ACCESS_FS_READ_DIR, ll.ACCESS_FS_REMOVE_DIR, ll.ACCESS_FS_REMOVE_FILE,
        ll.ACCESS_FS_MAKE_CHAR, ll.ACCESS_FS_MAKE_DIR, ll.ACCESS_FS_MAKE_REG,
        ll.ACCESS_FS_MAKE_SOCK, ll.ACCESS_FS_MAKE_FIFO, ll.ACCESS_FS_MAKE_BLOCK,
        ll.ACCESS_FS_MAKE_SYM, ll.ACCESS_FS_REFER, ll.ACCESS_FS_TRUNCATE,
        ll.ACCESS_FS_IOCTL_DEV,
    ]
    assert fs == [1 << i for i in range(16)]
    assert (ll.ACCESS_NET_BIND_TCP, ll.ACCESS_NET_CONNECT_TCP) == (1, 2)
    assert (ll.SCOPE_ABSTRACT_UNIX_SOCKET, ll.SCOPE_SIGNAL) == (1, 2)
    assert (ll.MIN_ABI, ll.KNOWN_ABI) == (1, 7)


@pytest.mark.parametrize(
    ("abi", "fs", "net", "scope"),
    [
        (1, 0x1FFF, 0, 0),
        (2, 0x3FFF, 0, 0),
        (3, 0x7FFF, 0, 0),
        (4, 0x7FFF, 3, 0),
        (5, 0xFFFF, 3, 0),
        (6, 0xFFFF, 3, 3),
        (7, 0xFFFF, 3, 3),
        (99, 0xFFFF, 3, 3),
    ],
)
def test_access_for_abi(abi: int, fs: int, net: int, scope: int) -> None:
    assert ll.fs_access_for_abi(abi) == fs
    assert ll.net_access_for_abi(abi) == net
    assert ll.scope_for_abi(abi) == scope


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "7", None])
def test_bad_abi_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="invalid Landlock ABI"):
        ll.fs_access_for_abi(bad)  # type: ignore[arg-type]


def test_access_masks() -> None:
    assert ll.ro_access(7) == ll.ACCESS_FS_READ_FILE | ll.ACCESS_FS_READ_DIR
    assert ll.rx_access(7) == ll.ro_access(7) | ll.ACCESS_FS_EXECUTE
    rw = ll.rw_access(7)
    excluded = ll.ACCESS_FS_MAKE_CHAR | ll.ACCESS_FS_MAKE_BLOCK | ll.ACCESS_FS_IOCTL_DEV
    assert rw & excluded == 0
    assert rw | excluded == ll.fs_access_for_abi(7)
    for right in (ll.ACCESS_FS_REFER, ll.ACCESS_FS_TRUNCATE, ll.ACCESS_FS_MAKE_SYM,
                  ll.ACCESS_FS_REMOVE_DIR, ll.ACCESS_FS_EXECUTE, ll.ACCESS_FS_WRITE_FILE):
        assert rw & right
    # rights an ABI does not know are never asked for
    assert ll.rw_access(1) & ~ll.fs_access_for_abi(1) == 0
    assert not ll.rw_access(1) & ll.ACCESS_FS_REFER
    assert not ll.rw_access(2) & ll.ACCESS_FS_TRUNCATE
    assert ll.rw_access(3) & ll.ACCESS_FS_TRUNCATE


def test_path_rule_access_file_vs_dir() -> None:
    rw = ll.rw_access(7)
    assert ll.path_rule_access(rw, is_dir=True) == rw
    assert ll.path_rule_access(rw, is_dir=False) == (
        ll.ACCESS_FS_EXECUTE | ll.ACCESS_FS_WRITE_FILE | ll.ACCESS_FS_READ_FILE
        | ll.ACCESS_FS_TRUNCATE
    )
    assert ll.path_rule_access(ll.ro_access(7), is_dir=False) == ll.ACCESS_FS_READ_FILE
    assert ll.path_rule_access(ll.ACCESS_FS_READ_DIR, is_dir=False) == 0
    assert ll.path_rule_access(ll.fs_access_for_abi(7), is_dir=False) == ll.ACCESS_FS_FILE


def test_plan_abi4_has_net_but_no_scopes() -> None:
    r = ll.plan_ruleset(4, read_exec=[], read_only=[], read_write=[], connect_tcp_ports=[443])
    assert r.handled_fs == ll.fs_access_for_abi(4)
    assert r.handled_net == ll.ACCESS_NET_BIND_TCP | ll.ACCESS_NET_CONNECT_TCP
    assert r.scoped == 0
    assert r.port_rules == ((443, ll.ACCESS_NET_CONNECT_TCP),)


def test_plan_abi3_has_no_net_and_drops_ports() -> None:
    r = ll.plan_ruleset(3, read_exec=[], read_only=[], read_write=[], connect_tcp_ports=[443])
    assert (r.handled_net, r.scoped, r.port_rules) == (0, 0, ())


#: Per ABI: (handled fs, rw rights beneath a dir, rw rights on a file, net, scopes).
PER_ABI = {
    1: (0x1FFF, 0x1FFF & ~0x840, 0x7, 0, 0),
    2: (0x3FFF, 0x3FFF & ~0x840, 0x7, 0, 0),
    3: (0x7FFF, 0x7FFF & ~0x840, 0x4007, 0, 0),
    4: (0x7FFF, 0x7FFF & ~0x840, 0x4007, 3, 0),
    5: (0xFFFF, 0x7FFF & ~0x840, 0x4007, 3, 0),
    6: (0xFFFF, 0x7FFF & ~0x840, 0x4007, 3, 3),
    7: (0xFFFF, 0x7FFF & ~0x840, 0x4007, 3, 3),
}


@pytest.mark.parametrize("abi", sorted(PER_ABI))
def test_plan_per_abi(abi: int) -> None:
    """Each ABI handles exactly its rights, and no rule grants a right it does not
    handle (the kernel refuses such a rule with EINVAL)."""
    fs, rw_dir, rw_file, net, scope = PER_ABI[abi]
    r = ll.plan_ruleset(abi, read_exec=["/usr"], read_only=["/etc"], read_write=["/w"],
                        connect_tcp_ports=[443])
    assert (r.abi, r.handled_fs, r.handled_net, r.scoped) == (abi, fs, net, scope)
    rules = dict(r.path_rules)
    assert rules == {"/usr": 0b1101, "/etc": 0b1100, "/w": rw_dir}
    for access in rules.values():
        assert access & ~r.handled_fs == 0
        assert ll.path_rule_access(access, is_dir=False) & ~r.handled_fs == 0
    assert ll.path_rule_access(rw_dir, is_dir=False) == rw_file
    assert r.port_rules == (((443, ll.ACCESS_NET_CONNECT_TCP),) if net else ())
    dir_args = r.install_args()[4]
    assert dir_args == [(p, a, ll.path_rule_access(a, is_dir=False))
                        for p, a in sorted(rules.items())]


@pytest.mark.parametrize("abi", sorted(PER_ABI))
def test_features_per_abi(abi: int) -> None:
    has = ll.features_for_abi(abi)
    assert has == {
        "filesystem": True, "refer": abi >= 2, "truncate": abi >= 3, "tcp": abi >= 4,
        "ioctl_dev": abi >= 5, "scope_abstract_unix_socket": abi >= 6, "scope_signal": abi >= 6,
    }
    r = ll.plan_ruleset(abi, read_exec=[], read_only=[], read_write=[])
    assert bool(r.handled_fs & ll.ACCESS_FS_REFER) == has["refer"]
    assert bool(r.handled_fs & ll.ACCESS_FS_TRUNCATE) == has["truncate"]
    assert bool(r.handled_fs & ll.ACCESS_FS_IOCTL_DEV) == has["ioctl_dev"]
    assert bool(r.handled_net) == has["tcp"]
    assert bool(r.scoped & ll.SCOPE_ABSTRACT_UNIX_SOCKET) == has["scope_abstract_unix_socket"]
    assert bool(r.scoped & ll.SCOPE_SIGNAL) == has["scope_signal"]


def test_every_feature_says_what_covers_it() -> None:
    assert [f.abi for f in ll.FEATURES] == sorted(f.abi for f in ll.FEATURES)
    assert {f.name for f in ll.FEATURES} >= set(ll.HOST_NETWORK_FEATURES)
    covered = {f.name: f.without for f in ll.FEATURES}
    assert "network namespace" in covered["tcp"]
    assert "network namespace" in covered["scope_abstract_unix_socket"]
    assert "PID namespace" in covered["scope_signal"]
    assert "read-only binds" in covered["truncate"]
    assert "minimal /dev" in covered["ioctl_dev"]


@pytest.mark.parametrize(
    ("abi", "missing"),
    [(1, "tcp"), (3, "tcp"), (4, "scope_abstract_unix_socket"),
     (5, "scope_abstract_unix_socket"), (6, None), (7, None), (12, None)],
)
def test_host_network_needs_tcp_rules_and_the_abstract_socket_scope(
    abi: int, missing: str | None
) -> None:
    shortfall = ll.host_network_shortfall(abi)
    assert (shortfall.name if shortfall else None) == missing
    refusal = ll.host_network_refusal(abi)
    if missing is None:
        assert refusal is None
        ll.plan_ruleset(abi, read_exec=[], read_only=[], read_write=[], host_network=True)
        return
    assert refusal is not None
    assert f"needs {missing} (" in refusal
    assert f"the ABI in use is {abi}" in refusal
    with pytest.raises(ValueError, match=f"needs {missing}"):
        ll.plan_ruleset(abi, read_exec=[], read_only=[], read_write=[], host_network=True)
    # Its own network namespace covers both: any ABI plans.
    ll.plan_ruleset(abi, read_exec=[], read_only=[], read_write=[])


def test_plan_full() -> None:
    r = ll.plan_ruleset(
        7,
        read_exec=["/usr", "/bin", "/usr"],
        read_only=["/etc/ld.so.cache", "/usr"],
        read_write=["/tmp/j", "/dev/null"],
        connect_tcp_ports=iter([8080, 22, 8080]),
    )
    assert r.abi == 7
    assert r.handled_fs == 0xFFFF
    assert r.handled_net == 3
    assert r.scoped == ll.SCOPE_ABSTRACT_UNIX_SOCKET | ll.SCOPE_SIGNAL
    assert r.path_rules == (
        ("/bin", ll.rx_access(7)),
        ("/dev/null", ll.rw_access(7)),
        ("/etc/ld.so.cache", ll.ro_access(7)),
        ("/tmp/j", ll.rw_access(7)),
        ("/usr", ll.rx_access(7)),
    )
    assert r.port_rules == ((22, 2), (8080, 2))
    # deterministic regardless of input order
    assert r == ll.plan_ruleset(
        7, read_exec=["/bin", "/usr"], read_only=["/etc/ld.so.cache"],
        read_write=["/dev/null", "/tmp/j"], connect_tcp_ports=[8080, 22],
    )


def test_plan_unions_rights_of_a_path_listed_twice() -> None:
    r = ll.plan_ruleset(6, read_exec=["/x"], read_only=[], read_write=["/x"])
    assert r.path_rules == (("/x", ll.rx_access(6) | ll.rw_access(6)),)


def test_plan_clamps_future_abi() -> None:
    r = ll.plan_ruleset(12, read_exec=[], read_only=[], read_write=[])
    assert r.abi == ll.KNOWN_ABI


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"read_exec": [""]}, "must be a non-empty str"),
        ({"read_only": ["/a\0b"]}, "contains NUL"),
        ({"read_write": "/tmp"}, "got the str"),  # a str, not a list of paths
        ({"read_only": [b"/bytes"]}, "must be a non-empty str"),
        ({"connect_tcp_ports": [65536]}, "invalid TCP port 65536"),
        ({"connect_tcp_ports": [-1]}, "invalid TCP port -1"),
        ({"connect_tcp_ports": [True]}, "invalid TCP port True"),
        ({"connect_tcp_ports": ["80"]}, "invalid TCP port '80'"),
    ],
)
def test_plan_rejects_bad_input(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, Any] = {"read_exec": [], "read_only": [], "read_write": [], **kwargs}
    with pytest.raises(ValueError, match=match):
        ll.plan_ruleset(7, **args)


WEIRD_PATHS = [
    "/tmp/a:b",
    "/tmp/with space",
    "/tmp/new\nline",
    "/tmp/::",
    "/tmp/p:1:/x",
    "/tmp/h:7:1:1:1:1",
    "/tmp/ünïcödé/\t\r",
    "/",
]


_abs_paths = st.text(st.characters(blacklist_characters="\0"), max_size=40).map(lambda t: "/" + t)


def test_abi_version_in_process() -> None:
    """The probed ABI is the kernel's own answer to a direct
    landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION), and
    Landlock is on: the jail needs it (a read-only query, safe here)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # 444 on every architecture but alpha; the version flag is 1 << 0.
    direct = libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))
    assert direct > 0, os.strerror(ctypes.get_errno())
    assert install.landlock_abi() == KERNEL_ABI == direct
    assert KERNEL_ABI >= ll.MIN_ABI


# ---------------------------------------------------------------------------
# Real jailed processes
# ---------------------------------------------------------------------------

CHILD = r"""
import ctypes, errno, json, os, sys

import msgspec
import trunner.kernel.install as inst
import trunner.linux.landlock as ll

cfg = json.loads(sys.argv[1])
SCALE = cfg["time_scale"]  # the test run's TRUNNER_TEST_TIME_SCALE, for every bound below


def restrict_self(r):
    inst.restrict_filesystem(*r.install_args())
results = {}


def attempt(name, fn):
    try:
        results[name] = {"ok": fn()}
    except OSError as e:
        results[name] = {"err": errno.errorcode.get(e.errno, str(e.errno)), "msg": str(e)}


def set_nnp():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def plan(**overrides):
    kw = dict(read_exec=cfg["rx"], read_only=cfg["ro"], read_write=cfg["rw"],
              connect_tcp_ports=cfg["ports"])
    kw.update(overrides)
    return ll.plan_ruleset(cfg.get("abi") or inst.landlock_abi(), **kw)


def read(path):
    with open(path) as f:
        return f.read()


def write(path, data="x"):
    with open(path, "w") as f:
        f.write(data)
    return read(path)

"""

MAIN_CHECKS = r"""
set_nnp()
restrict_self(plan())
# Everything below runs jailed; these imports must come from the read_exec stdlib.
import signal, socket, subprocess

jail, out, secret = cfg["jail"], cfg["out"], cfg["secret"]
attempt("read_secret", lambda: read(secret))
attempt("list_out", lambda: os.listdir(out))
attempt("write_out", lambda: write(os.path.join(out, "new")))
attempt("write_tmp", lambda: write(cfg["tmp_probe"]))
attempt("write_shm", lambda: write(cfg["shm_probe"]))
attempt("read_etc_hostname", lambda: read("/etc/hostname"))
attempt("proc_self_root", lambda: read("/proc/self/root" + secret))

attempt("write_jail", lambda: write(os.path.join(jail, "f"), "hello"))
attempt("mkdir_jail", lambda: os.mkdir(os.path.join(jail, "d")))
attempt("rename_in_jail", lambda: os.rename(os.path.join(jail, "f"), os.path.join(jail, "d", "g")))
attempt("link_in_jail", lambda: os.link(os.path.join(jail, "d", "g"), os.path.join(jail, "h")))
attempt("truncate_jail", lambda: os.truncate(os.path.join(jail, "h"), 2))
attempt("read_jail", lambda: read(os.path.join(jail, "d", "g")))
attempt("list_jail", lambda: sorted(os.listdir(jail)))
attempt("mkfifo_jail", lambda: os.mkfifo(os.path.join(jail, "fifo")))
attempt("mknod_char_jail",
        lambda: os.mknod(os.path.join(jail, "null"), 0o20600, os.makedev(1, 3)))
attempt("unlink_jail", lambda: os.unlink(os.path.join(jail, "h")))

attempt("symlink_create", lambda: os.symlink(secret, os.path.join(jail, "sym")))
attempt("symlink_read", lambda: read(os.path.join(jail, "sym")))
attempt("hardlink_out_in", lambda: os.link(secret, os.path.join(jail, "hl")))
attempt("rename_out_in", lambda: os.rename(secret, os.path.join(jail, "mv")))
attempt("rename_in_out", lambda: os.rename(os.path.join(jail, "d", "g"), os.path.join(out, "mv")))

attempt("dev_null_rw", lambda: write("/dev/null"))


def tcp_connect(port):
    s = socket.socket()
    s.settimeout(5 * SCALE)
    try:
        s.connect(("127.0.0.1", port))
        return "connected"
    finally:
        s.close()


def tcp_bind(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]
    finally:
        s.close()


attempt("connect_denied_port", lambda: tcp_connect(cfg["denied_port"]))
attempt("connect_allowed_port", lambda: tcp_connect(cfg["allowed_port"]))
attempt("bind_ephemeral", lambda: tcp_bind(0))
attempt("bind_fixed", lambda: tcp_bind(cfg["free_port"]))


def abstract_connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(cfg["abstract"].encode("latin-1"))
        return "connected"
    finally:
        s.close()


attempt("abstract_connect", abstract_connect)


def own_abstract():
    # abstract sockets created inside the same domain remain usable
    name = cfg["abstract"].encode("latin-1") + b"-inner"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen()
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(name)
    conn, _ = srv.accept()
    c.sendall(b"ping")
    data = conn.recv(4).decode()
    for s in (c, conn, srv):
        s.close()
    return data


attempt("abstract_own", own_abstract)

attempt("kill_parent", lambda: os.kill(cfg["parent_pid"], 0))
attempt("kill_init", lambda: os.kill(1, 0))
attempt("kill_self", lambda: os.kill(os.getpid(), 0))


def kill_child():
    p = subprocess.Popen(["/bin/sleep", "30"])
    os.kill(p.pid, signal.SIGTERM)
    return p.wait(timeout=10 * SCALE)


attempt("kill_child", kill_child)


def run(argv, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30 * SCALE, **kw)
    return [p.returncode, p.stdout, p.stderr]


attempt("echo", lambda: run(["/bin/echo", "hi"]))
attempt("sh", lambda: run("echo from-sh; ls " + jail, shell=True))
attempt("sh_devnull", lambda: run(["/bin/sh", "-c", "echo ok"], stdin=subprocess.DEVNULL))
attempt("nested_python", lambda: run(
    [sys.executable, "-c",
     "import sys, os\n"
     "print(6 * 7)\n"
     "try:\n"
     "    open(sys.argv[1]).read(); print('READ')\n"
     "except PermissionError:\n"
     "    print('EACCES')\n"
     "try:\n"
     "    os.kill(int(sys.argv[2]), 0); print('SIGNALLED')\n"
     "except PermissionError:\n"
     "    print('EPERM')\n",
     secret, str(cfg["parent_pid"])]))

print(json.dumps(results))
"""

ERROR_CHECKS = r"""
def restrict(r):
    restrict_self(r)
    return "restricted"

# Nothing below may enforce anything: every call must fail before landlock_restrict_self.
fds_before = sorted(os.listdir("/proc/self/fd"))
attempt("no_nnp", lambda: restrict(plan()))
set_nnp()
attempt("abi_too_new", lambda: restrict(msgspec.structs.replace(plan(), abi=ll.KNOWN_ABI + 1)))
attempt("missing_path", lambda: restrict(plan(read_only=cfg["ro"] + [cfg["missing"]])))
attempt("dangling_symlink", lambda: restrict(plan(read_only=cfg["ro"] + [cfg["dangling"]])))
# A rule the kernel itself refuses (a pipe is not a path it can rule): return value checked.
pipe_r, pipe_w = os.pipe()
attempt("kernel_refuses_rule",
        lambda: restrict(plan(read_only=cfg["ro"] + [f"/proc/self/fd/{pipe_r}"])))
attempt("still_unrestricted", lambda: read(cfg["secret"]))
results["fds"] = [fds_before, sorted(os.listdir("/proc/self/fd"))]
print(json.dumps(results))
"""

CAPPED_CHECKS = r"""
set_nnp()
restrict_self(plan())
import fcntl, signal, socket, termios

jail = cfg["jail"]
os.mkdir(os.path.join(jail, "a"))
os.mkdir(os.path.join(jail, "b"))
write(os.path.join(jail, "a", "f"))
attempt("read_secret", lambda: read(cfg["secret"]))
attempt("rename_across_dirs",
        lambda: os.rename(os.path.join(jail, "a", "f"), os.path.join(jail, "b", "f")))
attempt("truncate_outside", lambda: os.truncate(cfg["victim"], 0))


def tcp_connect(port):
    with socket.socket() as s:
        s.settimeout(5 * SCALE)
        s.connect(("127.0.0.1", port))
        return "connected"


def abstract_connect():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(cfg["abstract"].encode("latin-1"))
        return "connected"


def tty_ioctl():
    with open("/dev/null", "rb") as f:
        fcntl.ioctl(f.fileno(), termios.TCGETS, b"\0" * 64)


attempt("connect_denied_port", lambda: tcp_connect(cfg["denied_port"]))
attempt("ioctl_dev", tty_ioctl)
attempt("abstract_connect", abstract_connect)
attempt("kill_parent", lambda: os.kill(cfg["parent_pid"], 0))
print(json.dumps(results))
"""

MISSING_PATH_UNCAUGHT = r"""
set_nnp()
restrict_self(plan(read_exec=cfg["rx"] + [cfg["missing"]]))
print("SHOULD NOT BE REACHED")
"""


def _listener(family: int, addr: str | bytes | tuple[str, int]) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind(addr)
    s.listen(8)
    s.setblocking(False)
    return s


def _pending(s: socket.socket, timeout: float = 0.2) -> bool:
    return bool(select.select([s], [], [], scaled(timeout))[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: A jailed child's JSON report, as the tests read it.
Report = dict[str, Any]


class Env:
    def __init__(self) -> None:
        self.jail = tempfile.mkdtemp(prefix="trunner-ll-jail-")
        self.out = tempfile.mkdtemp(prefix="trunner-ll-out-")
        self.secret = os.path.join(self.out, "secret")
        with open(self.secret, "w") as f:
            f.write("top secret")
        os.symlink(os.path.join(self.out, "nope"), os.path.join(self.out, "dangling"))
        tag = uuid.uuid4().hex
        self.tmp_probe = f"/tmp/trunner-ll-probe-{tag}"
        self.shm_probe = f"/dev/shm/trunner-ll-probe-{tag}"
        self.denied = _listener(socket.AF_INET, ("127.0.0.1", 0))
        self.allowed = _listener(socket.AF_INET, ("127.0.0.1", 0))
        self.abstract_name = f"\0trunner-ll-{tag}"
        self.abstract = _listener(socket.AF_UNIX, self.abstract_name.encode("latin-1"))

    def cfg(self, **extra: object) -> Report:
        return {
            "rx": [sys.base_prefix, sys.prefix, "/usr", "/lib", "/lib64", "/bin", REPO],
            "ro": ["/etc/ld.so.cache"],
            "rw": [self.jail, "/dev/null"],
            "ports": [self.allowed.getsockname()[1]],
            "jail": self.jail,
            "out": self.out,
            "secret": self.secret,
            "missing": os.path.join(self.out, "does-not-exist"),
            "dangling": os.path.join(self.out, "dangling"),
            "tmp_probe": self.tmp_probe,
            "shm_probe": self.shm_probe,
            "denied_port": self.denied.getsockname()[1],
            "allowed_port": self.allowed.getsockname()[1],
            "free_port": _free_port(),
            "abstract": self.abstract_name,
            "parent_pid": os.getpid(),
            "abi": ABI,
            "time_scale": TIME_SCALE,
            **extra,
        }

    def run(self, checks: str, cfg: Report) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run(
            [sys.executable, "-c", CHILD + checks, json.dumps(cfg)],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=scaled(60),
        )

    def close(self) -> None:
        for s in (self.denied, self.allowed, self.abstract):
            s.close()
        shutil.rmtree(self.jail, ignore_errors=True)
        shutil.rmtree(self.out, ignore_errors=True)
        for p in (self.tmp_probe, self.shm_probe):
            if os.path.lexists(p):
                os.unlink(p)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


@pytest.fixture(scope="module")
def jailed(env: Env) -> Report:
    """Run the main jailed child once; tests below check pieces of its report."""
    p = env.run(MAIN_CHECKS, env.cfg())
    assert p.returncode == 0, p.stderr
    res: Report = json.loads(p.stdout.splitlines()[-1])
    res["_denied_pending"] = _pending(env.denied)
    res["_allowed_pending"] = _pending(env.allowed)
    res["_abstract_pending"] = _pending(env.abstract)
    return res


def _err(res: Report, name: str) -> str | None:
    err: str | None = res[name].get("err")
    return err


@needs("filesystem")
def test_outside_files_unreadable(jailed: Report) -> None:
    assert _err(jailed, "read_secret") == "EACCES"
    assert _err(jailed, "list_out") == "EACCES"
    assert _err(jailed, "read_etc_hostname") == "EACCES"
    assert _err(jailed, "proc_self_root") == "EACCES"


@needs("filesystem")
def test_writes_outside_jail_denied(jailed: Report, env: Env) -> None:
    for name in ("write_out", "write_tmp", "write_shm"):
        assert _err(jailed, name) == "EACCES", name
    assert not os.path.lexists(env.tmp_probe)
    assert not os.path.lexists(env.shm_probe)
    assert set(os.listdir(env.out)) == {"secret", "dangling"}


@needs("refer")
def test_jail_dir_is_writable(jailed: Report, env: Env) -> None:
    for name in ("write_jail", "mkdir_jail", "rename_in_jail", "link_in_jail",
                 "truncate_jail", "mkfifo_jail", "unlink_jail", "symlink_create"):
        assert "ok" in jailed[name], (name, jailed[name])
    assert jailed["write_jail"]["ok"] == "hello"
    assert jailed["read_jail"]["ok"] == "he"  # truncated through the hard link
    assert jailed["list_jail"]["ok"] == ["d", "h"]
    with open(os.path.join(env.jail, "d", "g")) as f:
        assert f.read() == "he"


@needs("filesystem")
def test_device_nodes_denied_even_in_jail(jailed: Report, env: Env) -> None:
    # We run as root (CAP_MKNOD), so only Landlock's missing MAKE_CHAR stops this.
    if os.geteuid() == 0:
        assert _err(jailed, "mknod_char_jail") == "EACCES"
    else:
        assert "err" in jailed["mknod_char_jail"]
    assert not os.path.lexists(os.path.join(env.jail, "null"))


@needs("refer")
def test_links_do_not_leak_outside(jailed: Report, env: Env) -> None:
    assert _err(jailed, "symlink_read") == "EACCES"
    assert _err(jailed, "hardlink_out_in") in ("EXDEV", "EACCES")
    assert _err(jailed, "rename_out_in") in ("EXDEV", "EACCES")
    assert _err(jailed, "rename_in_out") in ("EXDEV", "EACCES")
    assert not os.path.lexists(os.path.join(env.jail, "hl"))
    assert not os.path.lexists(os.path.join(env.jail, "mv"))
    with open(env.secret) as f:
        assert f.read() == "top secret"


@needs("filesystem")
def test_file_rules_work(jailed: Report) -> None:
    # /dev/null is a *file* rule with rw rights: only file bits may be passed to the kernel.
    assert jailed["dev_null_rw"] == {"ok": ""}


@needs("tcp")
def test_tcp(jailed: Report, env: Env) -> None:
    assert _err(jailed, "connect_denied_port") == "EACCES"
    assert not jailed["_denied_pending"]
    assert jailed["connect_allowed_port"] == {"ok": "connected"}
    assert jailed["_allowed_pending"]
    conn, _ = env.allowed.accept()
    conn.close()
    assert _err(jailed, "bind_ephemeral") == "EACCES"
    assert _err(jailed, "bind_fixed") == "EACCES"


@needs("scope_abstract_unix_socket")
def test_abstract_unix_socket_scoped(jailed: Report) -> None:
    assert _err(jailed, "abstract_connect") == "EPERM"
    assert not jailed["_abstract_pending"]
    assert jailed["abstract_own"] == {"ok": "ping"}


@needs("scope_signal")
def test_signals_scoped(jailed: Report) -> None:
    assert _err(jailed, "kill_parent") == "EPERM"
    assert _err(jailed, "kill_init") == "EPERM"
    assert jailed["kill_self"] == {"ok": None}
    assert jailed["kill_child"] == {"ok": -signal.SIGTERM}


@needs("refer")
def test_programs_still_run(jailed: Report, env: Env) -> None:
    assert jailed["echo"] == {"ok": [0, "hi\n", ""]}
    assert jailed["sh"]["ok"][:2] == [0, "from-sh\nd\nfifo\nsym\n"]
    assert jailed["sh_devnull"] == {"ok": [0, "ok\n", ""]}
    # the domain is inherited across execve(): a nested interpreter is jailed too
    # (its signal to the parent: refused from ABI 6, the signal scope)
    signalled = "EPERM" if ABI >= 6 else "SIGNALLED"
    assert jailed["nested_python"]["ok"][:2] == [0, f"42\nEACCES\n{signalled}\n"]


@needs("tcp")
def test_no_connect_ports_means_no_connect(env: Env) -> None:
    p = env.run(
        'set_nnp(); restrict_self(plan())\n'
        'import socket\n'
        'addr = ("127.0.0.1", cfg["allowed_port"])\n'
        'attempt("c", lambda: socket.create_connection(addr, 5 * SCALE).close())\n'
        'print(json.dumps(results))\n',
        env.cfg(ports=[]),
    )
    assert p.returncode == 0, p.stderr
    assert _err(json.loads(p.stdout), "c") == "EACCES"
    assert not _pending(env.allowed)


@needs("filesystem")
def test_errors_fail_closed_before_enforcing(env: Env) -> None:
    cfg = env.cfg()
    p = env.run(ERROR_CHECKS, cfg)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert _err(res, "no_nnp") == "EPERM"
    assert "PR_SET_NO_NEW_PRIVS" in res["no_nnp"]["msg"]
    assert _err(res, "abi_too_new") == errno.errorcode[errno.EOPNOTSUPP]
    assert f"needs ABI {ll.KNOWN_ABI + 1}" in res["abi_too_new"]["msg"]
    assert _err(res, "missing_path") == "ENOENT"
    assert f"landlock_add_rule({cfg['missing']})" in res["missing_path"]["msg"]
    assert _err(res, "dangling_symlink") == "ENOENT"
    assert _err(res, "kernel_refuses_rule") == "EBADFD"
    assert "landlock_add_rule(/proc/self/fd/" in res["kernel_refuses_rule"]["msg"]
    before, after = res["fds"]
    assert len(after) == len(before) + 2  # only the test's own pipe: no leaked fds
    assert res["still_unrestricted"] == {"ok": "top secret"}


@needs("filesystem")
def test_missing_path_kills_the_child(env: Env) -> None:
    cfg = env.cfg()
    p = env.run(MISSING_PATH_UNCAUGHT, cfg)
    assert p.returncode != 0
    assert "SHOULD NOT BE REACHED" not in p.stdout
    assert f"[Errno {errno.ENOENT}]" in p.stderr
    assert f"landlock_add_rule({cfg['missing']})" in p.stderr


@pytest.mark.parametrize("abi", CAPPED_ABIS)
def test_restrict_at_a_capped_abi(env: Env, abi: int, tmp_path: Any) -> None:
    """A real ruleset planned for `abi` (as on an older kernel) on this kernel: the
    kernel accepts it (attr size, rights and rules of that ABI only) and enforces
    exactly that ABI's features, no more: what it lacks gets through here, where
    no namespace stands in (in a jail, tests/security asserts what does)."""
    victim = tmp_path / "victim"
    victim.write_text("host data")
    victim.chmod(0o666)  # DAC lets anyone truncate it: only Landlock could refuse
    tcp = _listener(socket.AF_INET, ("127.0.0.1", 0))
    name = f"\0trunner-ll-capped-{uuid.uuid4().hex}"
    abstract = _listener(socket.AF_UNIX, name.encode("latin-1"))
    jail = tempfile.mkdtemp(prefix="trunner-ll-capped-")
    try:
        p = env.run(CAPPED_CHECKS, env.cfg(
            abi=abi, jail=jail, rw=[jail, "/dev/null"], victim=str(victim),
            denied_port=tcp.getsockname()[1], abstract=name,
        ))
        assert p.returncode == 0, p.stderr
        res: Report = json.loads(p.stdout.splitlines()[-1])
        tcp_pending, abstract_pending = _pending(tcp), _pending(abstract)
    finally:
        tcp.close()
        abstract.close()
        shutil.rmtree(jail, ignore_errors=True)
    assert _err(res, "read_secret") == "EACCES"
    if abi < 2:  # no REFER: every link or rename across directories is refused
        assert _err(res, "rename_across_dirs") == "EXDEV"
    else:
        assert res["rename_across_dirs"] == {"ok": None}
    if abi < 3:
        assert res["truncate_outside"] == {"ok": None}
        assert victim.read_text() == ""
    else:
        assert _err(res, "truncate_outside") == "EACCES"
        assert victim.read_text() == "host data"
    if abi < 4:
        assert res["connect_denied_port"] == {"ok": "connected"}
    else:
        assert _err(res, "connect_denied_port") == "EACCES"
    assert tcp_pending == (abi < 4)
    assert _err(res, "ioctl_dev") == ("ENOTTY" if abi < 5 else "EACCES")
    if abi < 6:
        assert res["abstract_connect"] == {"ok": "connected"}
        assert res["kill_parent"] == {"ok": None}
    else:
        assert _err(res, "abstract_connect") == "EPERM"
        assert _err(res, "kill_parent") == "EPERM"
    assert abstract_pending == (abi < 6)
