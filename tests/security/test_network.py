"""Network escapes: every route from the jail to a listener the test owns.

Each attempt is a real jailed child; each asserts the reason/errno and that
the test-owned endpoint saw nothing."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import textwrap
from typing import TYPE_CHECKING

import pytest
import trio
from test_filesystem import HOLD, _ready_jails, while_held

from conftest import TESTS_DIR, child_pids, landlock_abi_in_force, make_runner
from support import rules_document, run_code, scaled, wait_until
from trunner import Limits, Reason, Runner, RunnerError
from trunner.linux import landlock, sockets
from trunner.linux.backend import LinuxBackend

if TYPE_CHECKING:
    from pathlib import Path


def _nothing_accepted(listener: socket.socket) -> None:
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        listener.accept()


def _nothing_received(sock: socket.socket) -> None:
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(65536)


async def test_tcp_to_test_listener_on_loopback(runner: Runner) -> None:
    """TCP connect to a host service on 127.0.0.1 (the classic localhost-admin-port
    escape): the jail's 127.0.0.1 is its own loopback, where nothing listens."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = await run_code(runner, f"""
            import socket
            result = attempt(lambda: socket.create_connection(("127.0.0.1", {port}),
                                                              timeout={scaled(2)}).sendall(b"pwn"))
        """)
        assert result == "ECONNREFUSED"
        _nothing_accepted(listener)


async def test_udp_to_test_socket(runner: Runner) -> None:
    """UDP datagram to a host service (e.g. DNS/syslog/statsd on localhost): sent,
    on the run's own loopback, and the host's socket receives nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        port = sink.getsockname()[1]
        result = await run_code(runner, f"""
            import socket
            result = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
                b"pwn", ("127.0.0.1", {port})))
        """)
        assert result == "OK:3"
        _nothing_received(sink)


async def test_ipv6_tcp_to_test_listener(runner: Runner) -> None:
    """IPv6 TCP to ::1 (a second address family that a v4-only filter would miss)."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    with socket.socket(socket.AF_INET6) as listener:
        try:
            listener.bind(("::1", 0))
        except OSError:
            pytest.skip("::1 is not configured on this host")
        listener.listen()
        port = listener.getsockname()[1]
        result = await run_code(runner, f"""
            import socket
            result = attempt(lambda: socket.create_connection(("::1", {port}),
                                                              timeout={scaled(2)}))
        """)
        # The run's own ::1 refuses; without IPv6 in its namespace there is no route.
        assert result in ("ECONNREFUSED", "EADDRNOTAVAIL", "ENETUNREACH"), result
        _nothing_accepted(listener)


@pytest.mark.parametrize(
    ("family", "kind", "proto", "expected"),
    [
        # raw IP: spoofing, ping sweeps (and CAP_NET_RAW, which no jailed process has)
        ("AF_INET", "SOCK_RAW", "socket.IPPROTO_ICMP", "ESOCKTNOSUPPORT"),
        ("AF_INET6", "SOCK_RAW", "socket.IPPROTO_ICMPV6", "ESOCKTNOSUPPORT"),
        ("AF_INET", "SOCK_RAW", "socket.IPPROTO_RAW", "ESOCKTNOSUPPORT"),
        # packet socket: CVE-2017-7308/CVE-2020-14386 class
        ("AF_PACKET", "SOCK_RAW", "0x0300", "EAFNOSUPPORT"),
        ("AF_PACKET", "SOCK_DGRAM", "0x0300", "EAFNOSUPPORT"),
        ("AF_VSOCK", "SOCK_STREAM", "0", "EAFNOSUPPORT"),  # vsock to the hypervisor host
        # ping sockets: refused by the run's ping_group_range anyway; kept out
        ("AF_INET", "SOCK_DGRAM", "socket.IPPROTO_ICMP", "EPROTONOSUPPORT"),
    ],
)
async def test_raw_packet_netlink_vsock_sockets(
    runner: Runner, family: str, kind: str, proto: str, expected: str
) -> None:
    """Raw / packet / vsock / ping sockets (kernel attack surface reached by socket
    families and types): an errno from the filter, no descriptor. (Netlink: route
    and sock_diag only, test_new_calls.py.)"""
    result = await run_code(runner, f"""
        import socket
        fds = os.listdir("/proc/self/fd")
        result = [attempt(lambda: socket.socket(socket.{family}, socket.{kind}, {proto})),
                  os.listdir("/proc/self/fd") == fds]
    """)
    assert result == [expected, True]


@pytest.mark.parametrize("kind", ["pathname", "abstract"])
async def test_unix_socket_of_the_test(runner: Runner, tmp_path: Path, kind: str) -> None:
    """A host unix socket outside the jail: docker.sock-style by path (not in the
    jail's tree: ENOENT), or an X11/D-Bus-style abstract name (the host's network
    namespace's, not the run's: refused; Landlock's scope, ABI 6, would refuse it
    too): connect fails, the host's listener accepts nothing."""
    address = str(tmp_path / "docker.sock") if kind == "pathname" else (
        f"\0trunner-sec-{os.getpid()}"
    )
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        if kind == "pathname":
            os.chmod(address, 0o777)
        listener.listen()
        result = await run_code(runner, f"""
            import socket
            s = socket.socket(socket.AF_UNIX)
            result = attempt(lambda: s.connect({address!r}))
        """)
        assert result == ("ENOENT" if kind == "pathname" else "ECONNREFUSED")
        _nothing_accepted(listener)


async def test_unix_stream_sendmsg_with_address_bypassing_connect(
    runner: Runner, tmp_path: Path
) -> None:
    """sendto() with an address on an unconnected stream socket (connect-filter bypass)."""
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        result = await run_code(runner, f"""
            import socket
            s = socket.socket(socket.AF_UNIX)
            result = attempt(lambda: s.sendto(b"pwn", {path!r}))
        """)
        assert result in ("EOPNOTSUPP", "ENOTSUP")  # errno 95 has both names
        _nothing_accepted(listener)


@pytest.mark.parametrize("kind", ["SOCK_DGRAM", "SOCK_SEQPACKET"])
async def test_unix_datagram_to_test_socket_path(
    runner: Runner, tmp_path: Path, kind: str
) -> None:
    """Unix datagram to a host socket path (journald/syslog /dev/log style), no
    connect needed: the path is not in the jail's tree."""
    path = str(tmp_path / "log.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sink:
        sink.bind(path)
        os.chmod(path, 0o777)
        result = await run_code(runner, f"""
            import socket
            s = socket.socket(socket.AF_UNIX, socket.{kind})
            result = [attempt(lambda: s.sendto(b"pwn", {path!r})),
                      attempt(lambda: s.connect({path!r}))]
        """)
        # (A seqpacket socket must connect first: ENOTCONN.)
        sent = "ENOENT" if kind == "SOCK_DGRAM" else "ENOTCONN"
        assert result == [sent, "ENOENT"]
        _nothing_received(sink)


async def test_socketpair_of_inet_family(runner: Runner) -> None:
    """socketpair() with a non-unix family (second entry point into the socket layer)."""
    result = await run_code(runner, """
        import ctypes
        fds = (ctypes.c_int * 2)()
        result = [syscall(53, 2, 1, 0, fds), list(fds)]  # AF_INET, SOCK_STREAM
    """)
    # (The kernel itself would answer EOPNOTSUPP.)
    assert result == ["EAFNOSUPPORT", [0, 0]]


# Two runs at once: each has a network namespace of its own (its loopback, its
# abstract names), and (ABI 6) a Landlock domain of its own scoping abstract
# connects. Run A listens on a TCP port, a UDP port and an abstract name, all
# chosen by the test, and holds; run B, meanwhile, tries all three.

LISTENING = """
import select, socket
port, name = {port}, {name!r}
tcp4 = socket.socket()
tcp4.bind(("127.0.0.1", port))
tcp4.listen()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", port))
abstract = socket.socket(socket.AF_UNIX)
abstract.bind(name)
abstract.listen()
"""

SAW = """
ready = select.select([tcp4, udp, abstract], [], [], 0)[0]
result = [len(ready), signals]
"""

TRYING = """
import socket
port, name, bound = {port}, {name!r}, {bound}
def tcp():
    with socket.create_connection(("127.0.0.1", port), timeout=bound) as s:
        s.sendall(b"from B")
def unix():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(name)
        s.sendall(b"from B")
def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return s.sendto(b"from B", ("127.0.0.1", port))
def own():  # B's own abstract name of that spelling: its namespace's, free
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(name)
        return "bound"
result = [attempt(tcp), attempt(unix), attempt(udp), attempt(own)]
"""


async def test_two_runs_cannot_reach_each_others_loopback_or_abstract_names(
    jail_root: Path,
) -> None:
    port = 20000 + int.from_bytes(os.urandom(2), "big") % 40000
    name = f"\0trunner-run-a-{os.getpid()}-{os.urandom(4).hex()}"
    runner = make_runner(import_paths=[TESTS_DIR], temp_root=str(jail_root),
                         limits=Limits(wall_time_s=20.0))
    out: dict[str, object] = {}

    async def run_a() -> None:
        code = textwrap.dedent(LISTENING.format(port=port, name=name)) + HOLD + SAW
        out["a"] = await run_code(runner, code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_a)
        ready = await wait_until(_ready_jails, 15, "run A's `ready`")
        try:
            out["b"] = await run_code(runner, TRYING.format(port=port, name=name,
                                                            bound=scaled(2)))
        finally:
            os.kill(ready[0], signal.SIGUSR1)
    # B: TCP refused by its own loopback, the abstract name not in its namespace,
    # the datagram sent on its own loopback; A: nothing pending on any of the three.
    assert out["b"] == ["ECONNREFUSED", "ECONNREFUSED", "OK:6", "OK:'bound'"]
    assert out["a"] == [0, [signal.SIGUSR1]]


# A socket in a bind: nothing in seccomp or Landlock (to ABI 7) checks a connect
# to a pathname unix socket, only its file's mode; so the tree must hold none.
# The backend walks every bind the plan makes and masks each socket found (an
# empty read-only file over it, part of the hashed plan).

def _serve_unix(path: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        s.bind(path)  # (at most 107 bytes: the tests' paths stay short)
        os.chmod(path, 0o777)  # the socket's own mode lets anyone connect
        if kind == socket.SOCK_STREAM:
            s.listen()
    except BaseException:
        s.close()
        raise
    return s


async def test_socket_planted_in_an_import_path_is_masked(
    jail_root: Path, tmp_path: Path
) -> None:
    """Planted by the test in an import path, mode 0777 (the mode stops no uid),
    stream and datagram: in the jail each is an empty read-only file (connect and
    sendto: EACCES, the mask's mode), named in the rules document's root ops; the
    host's sockets see nothing."""
    planted = tmp_path / "m"
    (planted / "p").mkdir(parents=True)
    stream_path, dgram_path = str(planted / "app.sock"), str(planted / "p" / "log.sock")
    with _serve_unix(stream_path) as stream, \
            _serve_unix(dgram_path, socket.SOCK_DGRAM) as dgram:
        runner = make_runner(import_paths=[TESTS_DIR, str(planted)], temp_root=str(jail_root))
        ops = rules_document(runner)["plan"]["root_ops"]
        masked = sorted(op["path"] for op in ops if op["op"] == "mask_socket")
        assert masked == [stream_path, dgram_path]
        result = await run_code(runner, f"""
            import socket, stat
            st = os.stat({stream_path!r})
            u = socket.socket(socket.AF_UNIX)
            d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            result = [stat.S_ISREG(st.st_mode), st.st_size, oct(st.st_mode & 0o777),
                      attempt(lambda: u.connect({stream_path!r})),
                      attempt(lambda: d.sendto(b"pwn", {dgram_path!r})),
                      attempt(lambda: open({stream_path!r}, "w"))]
        """)
        assert result == [True, 0, "0o444", "EACCES", "EACCES", "EROFS"]
        _nothing_accepted(stream)
        _nothing_received(dgram)


async def test_socket_in_a_dir_the_caller_cannot_list(jail_root: Path, tmp_path: Path) -> None:
    """A directory with search but no read permission (0311): a non-root walk
    cannot list it, yet the jail (the caller's uid) could enter it by name. Not
    root, the whole dir is masked (an empty tmpfs: ENOENT); as root the walk lists
    it and masks the socket itself (EACCES)."""
    planted = tmp_path / "m"
    hidden = planted / "h"
    hidden.mkdir(parents=True)
    path = str(hidden / "s")
    with _serve_unix(path) as listener:
        hidden.chmod(0o311)
        try:
            runner = make_runner(import_paths=[TESTS_DIR, str(planted)],
                                 temp_root=str(jail_root))
            result = await run_code(runner, f"""
                import socket
                result = attempt(lambda: socket.socket(socket.AF_UNIX).connect({path!r}))
            """)
        finally:
            hidden.chmod(0o755)
        assert result == ("EACCES" if os.geteuid() == 0 else "ENOENT")
        _nothing_accepted(listener)


def test_system_dirs_are_walked_once_per_backend_the_callers_paths_at_each_plan(
    tmp_path: Path,
) -> None:
    """The system dirs' walk is cached per process; an import path is walked
    again for each new plan, so a socket planted between two plans is masked by
    the second."""
    planted = tmp_path / "m"
    planted.mkdir()
    runner = make_runner(import_paths=[str(planted)])
    backend = runner.backend
    assert isinstance(backend, LinuxBackend)
    assert [op["op"] for op in backend.rules_document(Limits())["plan"]["root_ops"]
            if op["op"] == "mask_socket"] == []
    walked = dict(sockets._SYSTEM)
    assert "/usr" in walked
    assert str(planted) not in walked
    with _serve_unix(str(planted / "late.sock")):
        ops = backend.rules_document(Limits(wall_time_s=3.0))["plan"]["root_ops"]
    assert [op["path"] for op in ops if op["op"] == "mask_socket"] == [str(planted / "late.sock")]
    assert all(sockets._SYSTEM[k] is v for k, v in walked.items())
    assert str(planted) not in sockets._SYSTEM


# The provider profile: TCP sockets in the host network namespace, Landlock
# allowing connect to the configured ports only. Landlock sees only connect and
# bind of IPPROTO_TCP sockets: every other route to or from a port is the filter's.

PROVIDER_PORT = 9  # the allowed port: nothing listens on it


def _provider(jail_root: Path) -> Runner:
    return make_runner(import_paths=[TESTS_DIR], temp_root=str(jail_root),
                       provider={"ports": [PROVIDER_PORT]})


def test_provider_runs_only_where_landlock_covers_the_host_network(jail_root: Path) -> None:
    """Sharing the host network, no namespace stands in for Landlock's TCP port rules
    (ABI 4) or abstract-socket scope (ABI 6): below ABI 6 the provider profile is
    refused before anything is spawned, naming the missing feature."""
    abi = landlock_abi_in_force()
    if abi >= 6:
        _provider(jail_root)
        return
    with pytest.raises(RunnerError) as info:
        _provider(jail_root)
    assert info.value.reason is Reason.SANDBOX_SETUP
    missing = "tcp" if abi < 4 else "scope_abstract_unix_socket"
    assert f"needs {missing} (" in info.value.detail
    assert f"the ABI in use is {abi}" in info.value.detail
    assert child_pids() == []


def skip_where_the_provider_is_refused() -> None:
    """Skip, naming the Landlock feature the ABI in force lacks, where the provider
    profile is refused (as test_provider_runs_only_where_landlock_covers_the_host_network
    asserts)."""
    abi = landlock_abi_in_force()
    lacking = landlock.host_network_shortfall(abi)
    if lacking is not None:
        pytest.skip(f"the provider profile needs Landlock {lacking.name} (ABI {lacking.abi}):"
                    f" the ABI in force is {abi}")


@pytest.fixture
def provider(jail_root: Path) -> Runner:
    skip_where_the_provider_is_refused()
    return _provider(jail_root)


async def test_provider_socket_protocols(provider: Runner) -> None:
    """Only protocol 0 or IPPROTO_TCP: MPTCP (262), SMC (256), SCTP (132) and the rest
    make sockets Landlock's TCP rules do not cover. High bits are ignored by the kernel."""
    result = await run_code(provider, """
        import ctypes, socket
        libc = ctypes.CDLL(None, use_errno=True)
        made, errors = [], set()
        for family in (socket.AF_INET, socket.AF_INET6):
            for proto in [*range(301), 0xFFFF, 1 << 16, 0x7FFFFFFF, 0xFFFFFFFF, (1 << 32) | 262]:
                fd = libc.syscall(41, family, socket.SOCK_STREAM, ctypes.c_ulong(proto))
                if fd >= 0:
                    os.close(fd)
                    made.append([family, proto])
                else:
                    errors.add(errno.errorcode[ctypes.get_errno()])
        result = [made, sorted(errors)]
    """)
    assert result == [[[2, 0], [2, 6], [10, 0], [10, 6]], ["EPROTONOSUPPORT"]], result


FLAVOURS = {
    # socket() fails: Landlock would not see this socket's connect.
    "mptcp": ("s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)\n"
              "s.connect(ADDR)", "EPROTONOSUPPORT"),
    # TCP fast open connects from sendto/sendmsg, past the connect hook.
    "fastopen_sendto": ("s = socket.socket()\ns.sendto(b'x', socket.MSG_FASTOPEN, ADDR)",
                        errno.errorcode[errno.EOPNOTSUPP]),  # 95 is also ENOTSUP
    "fastopen_sendmsg": ("s = socket.socket()\ns.sendmsg([b'x'], [], socket.MSG_FASTOPEN, ADDR)",
                         errno.errorcode[errno.EOPNOTSUPP]),
    # TCP_FASTOPEN_CONNECT (30) defers the SYN to the first write, but connect() runs the hook.
    "fastopen_connect": ("s = socket.socket()\ns.setsockopt(6, 30, 1)\ns.connect(ADDR)\n"
                         "s.send(b'x')", "EACCES"),
}


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
async def test_provider_listener_on_other_port_sees_nothing(provider: Runner, flavour: str) -> None:
    """A host listener on a port not allowed: no connection, whatever the socket flavour."""
    code, expected = FLAVOURS[flavour]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        addr = ("127.0.0.1", listener.getsockname()[1])
        body = textwrap.indent(code.replace("ADDR", repr(addr)), "    ")
        result = await run_code(provider, f"import socket\ndef go():\n{body}\nresult = attempt(go)")
        assert result == expected, result
        _nothing_accepted(listener)


def _listening_inodes() -> dict[int, int]:
    """inode -> port of every TCP socket in LISTEN state (0A) in this network namespace."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":
                    out[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return out


def _socket_inodes(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # it has just exited
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


LISTEN = """
import json, select, socket
tries = {
    "autobind4": lambda: socket.socket(socket.AF_INET),
    "autobind6": lambda: socket.socket(socket.AF_INET6),
    "mptcp": lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262),
}
result, listening = {}, []
for name, make in tries.items():
    try:
        s = make()
        if name == "mptcp":
            s.bind(("127.0.0.1", 0))
        s.listen()
        listening.append(s)
        result[name] = "listening"
    except OSError as e:
        result[name] = errno.errorcode[e.errno]
with open("ports.tmp", "w") as f:
    json.dump([s.getsockname()[1] for s in listening], f)
os.rename("ports.tmp", "ports")
if listening:  # give the host its chance (bounded): a connection would be accepted
    ready = select.select(listening, [], [], BOUND)[0]
    result["accepted"] = [s.accept()[1][1] for s in ready]
""".replace("BOUND", repr(scaled(10)))


async def test_provider_cannot_listen(provider: Runner, jail_root: Path) -> None:
    """listen() without bind() autobinds to 0.0.0.0:<ephemeral> (no bind hook), and an
    MPTCP socket binds past Landlock. While the run lasts, the host connects to every
    port the child reports and every listening port that is one of its sockets."""
    done = trio.Event()
    connects: dict[int, str | None] = {}

    async def host() -> None:
        while not done.is_set():
            ports = set()
            for hit in jail_root.glob("*/ports"):
                with contextlib.suppress(OSError, ValueError):
                    ports |= set(json.loads(hit.read_text()))
            listening = _listening_inodes()
            for pid in child_pids():
                ports |= {listening[i] for i in _socket_inodes(pid) if i in listening}
            for port in sorted(ports - set(connects)):
                with socket.socket() as s:
                    s.settimeout(scaled(5))
                    connects[port] = errno.errorcode.get(s.connect_ex(("127.0.0.1", port)))
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(host)
        result = await run_code(provider, LISTEN)
        done.set()
    assert result == {"autobind4": "EPERM", "autobind6": "EPERM", "mptcp": "EPROTONOSUPPORT"}
    assert connects == {}, connects


async def test_provider_cannot_bind_an_abstract_name(jail_root: Path) -> None:
    """The provider shares the host's network namespace, where abstract unix names
    live: a socketpair's end bound to one would hold it (a host service binding it
    then fails EADDRINUSE). Landlock's abstract scope covers connect, not bind; the
    filter denies bind (EPERM). While the child lives, the host binds that name."""
    skip_where_the_provider_is_refused()
    provider = make_runner(import_paths=[TESTS_DIR], temp_root=str(jail_root),
                           provider={"ports": [PROVIDER_PORT]}, limits=Limits(wall_time_s=20.0))
    name = b"\0trunner-test-%d-%s" % (os.getpid(), os.urandom(8).hex().encode())
    before = f"""
        import socket
        a, b = socket.socketpair()
        bound = attempt(lambda: a.bind({name!r}))
    """

    def host() -> str:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.bind(name)
            except OSError as e:
                return errno.errorcode[e.errno or 0]
        return "bound"

    child, hosted = await while_held(provider, before, "result = [bound, signals]", host)
    assert (child, hosted) == (["EPERM", [signal.SIGUSR1]], "bound")
