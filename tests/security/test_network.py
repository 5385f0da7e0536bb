"""Network escapes: every route from the jail to a listener the test owns.

Each attempt is a real jailed child; each asserts the reason/errno and that
the test-owned endpoint saw nothing."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sec_helpers import run_code, syscall_denied
from trunner import Runner


def _nothing_accepted(listener: socket.socket) -> None:
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        listener.accept()


def _nothing_received(sock: socket.socket) -> None:
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(65536)


async def test_tcp_to_test_listener_on_loopback(runner: Runner) -> None:
    """TCP connect to a host service on 127.0.0.1 (the classic localhost-admin-port escape)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        await syscall_denied(runner, f"""
            import socket
            socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"pwn")
        """, "socket")
        _nothing_accepted(listener)


async def test_udp_to_test_socket(runner: Runner) -> None:
    """UDP datagram to a host service (e.g. DNS/syslog/statsd on localhost)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        port = sink.getsockname()[1]
        await syscall_denied(runner, f"""
            import socket
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"pwn", ("127.0.0.1", {port}))
        """, "socket")
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
        await syscall_denied(runner, f"""
            import socket
            socket.create_connection(("::1", {port}), timeout=2)
        """, "socket")
        _nothing_accepted(listener)


@pytest.mark.parametrize(
    ("family", "kind", "proto"),
    [
        ("AF_INET", "SOCK_RAW", "socket.IPPROTO_ICMP"),  # raw IP: spoofing, ping sweeps
        ("AF_PACKET", "SOCK_RAW", "0x0300"),  # packet socket: CVE-2017-7308/CVE-2020-14386 class
        ("AF_NETLINK", "SOCK_RAW", "0"),  # netlink route: CVE-2022-1015 nf_tables class
        ("AF_VSOCK", "SOCK_STREAM", "0"),  # vsock to the hypervisor host
    ],
)
async def test_raw_packet_netlink_vsock_sockets(
    runner: Runner, family: str, kind: str, proto: str
) -> None:
    """Raw / packet / netlink / vsock sockets (kernel attack surface reached by socket families)."""
    await syscall_denied(runner, f"""
        import socket
        socket.socket(socket.{family}, socket.{kind}, {proto})
    """, "socket")


@pytest.mark.parametrize("kind", ["pathname", "abstract"])
async def test_unix_socket_of_the_test(runner: Runner, tmp_path: Path, kind: str) -> None:
    """A host unix socket outside the jail: docker.sock-style by path, or an
    X11/D-Bus-style abstract name (no path, so no Landlock path rule): connect fails."""
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
        assert result == "EPERM"
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
    """Unix datagram to a host socket path (journald/syslog /dev/log style) — no connect needed."""
    path = str(tmp_path / "log.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sink:
        sink.bind(path)
        await syscall_denied(runner, f"""
            import socket
            socket.socket(socket.AF_UNIX, socket.{kind}).sendto(b"pwn", {path!r})
        """, "socket")
        _nothing_received(sink)


async def test_socketpair_of_inet_family(runner: Runner) -> None:
    """socketpair() with a non-unix family (second entry point into the socket layer)."""
    await syscall_denied(runner, """
        import ctypes
        fds = (ctypes.c_int * 2)()
        ctypes.CDLL(None).socketpair(2, 1, 0, fds)  # AF_INET, SOCK_STREAM
    """, "socketpair")
