"""Networking within one run (issue 19): the run's private network namespace
has its loopback up, and TCP, UDP and every kind of unix socket work there,
as they do bare and under bubblewrap's `--unshare-all`. Each test is a real
jail; its real output is asserted. What stays out of reach (the host's
listeners, another run's, a socket planted in a bind) is in
tests/security/test_network.py."""

from __future__ import annotations

import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

from support import run_code, scaled

if TYPE_CHECKING:
    from trunner import Runner

#: Whether the jail's network namespace has IPv6 (the host may disable it
#: for every namespace: ipv6.disable=1, or net.ipv6.conf.default.disable_ipv6).
HAS_V6 = """
import socket
try:
    with socket.socket(socket.AF_INET6) as _probe:
        _probe.bind(("::1", 0))
    v6 = None
except OSError as e:
    v6 = f"no ::1 in the jail's network namespace ({e.strerror}); /proc/sys/net/ipv6 " + (
        "exists" if os.path.exists("/proc/sys/net/ipv6") else "is absent")
"""


async def _skip_without_v6(runner: Runner) -> None:
    why = await run_code(runner, HAS_V6 + "result = v6")
    if why is not None:
        pytest.skip(why)


async def test_loopback_is_up(runner: Runner) -> None:
    """Only the run's own `lo` in its namespace, and up: a connect to a port
    nobody listens on is refused (a loopback that is down: ENETUNREACH)."""
    result = await run_code(runner, """
        import socket
        names = [name for _, name in socket.if_nameindex()]
        s = socket.socket()
        refused = attempt(lambda: s.connect(("127.0.0.1", 9)))
        s.close()
        result = [names, refused, socket.getaddrinfo("localhost", 80, socket.AF_INET)[0][4]]
    """)
    assert result == [["lo"], "ECONNREFUSED", ["127.0.0.1", 80]]


async def test_interface_names_and_indexes(runner: Runner) -> None:
    """if_nametoindex/if_indextoname (glibc's SIOCGIFINDEX/SIOCGIFNAME ioctls)
    and an IPv6 scope id by name: what CPython's test_socket checks."""
    await _skip_without_v6(runner)
    result = await run_code(runner, """
        import socket
        index = socket.if_nametoindex("lo")
        scoped = socket.getaddrinfo("ff02::1de:c0:face:8d%lo", 1234, socket.AF_INET6,
                                    socket.SOCK_DGRAM)[0][4]
        named = socket.getnameinfo(scoped, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
        result = [index, socket.if_indextoname(index), scoped[3] == index, list(named)]
    """)
    assert result == [1, "lo", True, ["ff02::1de:c0:face:8d%lo", "1234"]]


@pytest.mark.parametrize("family", ["AF_INET", "AF_INET6"])
async def test_tcp_server_and_client_in_one_run(runner: Runner, family: str) -> None:
    if family == "AF_INET6":
        await _skip_without_v6(runner)
    host = "127.0.0.1" if family == "AF_INET" else "::1"
    result = await run_code(runner, f"""
        import socket, threading
        server = socket.socket(socket.{family}, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(({host!r}, 0))
        server.listen()
        port = server.getsockname()[1]

        def serve():
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(64).upper())

        t = threading.Thread(target=serve)
        t.start()
        with socket.create_connection(({host!r}, port), timeout={scaled(5)}) as c:
            c.sendall(b"ping over tcp")
            reply = c.recv(64)
            peer = c.getpeername()[0]
        t.join()
        server.close()
        result = [reply, peer, port > 0]
    """)
    assert result == [b"PING OVER TCP", host, True]


@pytest.mark.parametrize("proto", ["IPPROTO_UDP", "IPPROTO_UDPLITE"])
@pytest.mark.parametrize("family", ["AF_INET", "AF_INET6"])
async def test_udp_on_loopback(runner: Runner, family: str, proto: str) -> None:
    if family == "AF_INET6":
        await _skip_without_v6(runner)
    host = "127.0.0.1" if family == "AF_INET" else "::1"
    result = await run_code(runner, f"""
        import socket
        a = socket.socket(socket.{family}, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK,
                          socket.{proto})
        b = socket.socket(socket.{family}, socket.SOCK_DGRAM, socket.{proto})
        a.bind(({host!r}, 0))
        b.settimeout({scaled(5)})
        b.sendto(b"datagram", a.getsockname())
        import select
        select.select([a], [], [], {scaled(5)})
        data, sender = a.recvfrom(64)
        a.sendto(data[::-1], sender)
        back = b.recv(64)
        a.close()
        b.close()
        result = [data, back]
    """)
    assert result == [b"datagram", b"margatad"]


async def test_http_server_and_urllib_on_localhost(runner: Runner) -> None:
    result = await run_code(runner, f"timeout_s = {scaled(5)}\n" + textwrap.dedent("""
        import http.server, threading, urllib.request

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = f"hello from {self.path}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        httpd = http.server.ThreadingHTTPServer(("localhost", 0), Handler)
        t = threading.Thread(target=httpd.serve_forever)
        t.start()
        url = f"http://localhost:{httpd.server_address[1]}/jail"
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            got = [reply.status, reply.read()]
        httpd.shutdown()
        httpd.server_close()
        t.join()
        result = got
    """))
    assert result == [200, b"hello from /jail"]


async def test_asyncio_server_and_client(runner: Runner) -> None:
    result = await run_code(runner, """
        import asyncio

        async def main():
            async def echo(reader, writer):
                writer.write((await reader.readline()).upper())
                await writer.drain()
                writer.close()
                await writer.wait_closed()

            tcp = await asyncio.start_server(echo, "127.0.0.1", 0)
            unix = await asyncio.start_unix_server(echo, "app.sock")
            out = []
            port = tcp.sockets[0].getsockname()[1]
            for opened in (asyncio.open_connection("127.0.0.1", port),
                           asyncio.open_unix_connection("app.sock")):
                reader, writer = await opened
                writer.write(b"asyncio line\\n")
                out.append(await reader.readline())
                writer.close()
                await writer.wait_closed()
            for server in (tcp, unix):
                server.close()
                await server.wait_closed()
            return out

        result = asyncio.run(main())
    """)
    assert result == [b"ASYNCIO LINE\n", b"ASYNCIO LINE\n"]


FORKSERVER = """\
import multiprocessing as mp
from work import square

if __name__ == "__main__":
    ctx = mp.get_context("forkserver")
    with ctx.Pool(2) as pool:
        print(pool.map(square, range(6)), ctx.get_start_method())
    import os, stat, tempfile
    from multiprocessing import forkserver
    address = forkserver._forkserver._forkserver_address
    print(stat.S_ISSOCK(os.stat(address).st_mode),
          os.path.dirname(os.path.dirname(address)) == tempfile.gettempdir())
"""


async def test_multiprocessing_forkserver(runner: Runner) -> None:
    """The forkserver start method talks to its server over a pathname unix
    socket in a temporary dir (the run's own scratch: TMPDIR); a program as
    a user runs it, with its module beside it."""
    files = {"main.py": FORKSERVER.encode(), "work.py": b"def square(x):\n    return x * x\n"}
    done = (await runner.exec([sys.executable, "main.py"], files=files)).response
    assert (done.exit_code, done.stderr) == (0, b"")
    assert done.stdout == b"[0, 1, 4, 9, 16, 25] forkserver\nTrue True\n"


@pytest.mark.parametrize("kind", ["SOCK_STREAM", "SOCK_DGRAM", "SOCK_SEQPACKET"])
@pytest.mark.parametrize("name", ["pathname", "abstract"])
async def test_unix_sockets_of_every_type(runner: Runner, kind: str, name: str) -> None:
    address = "./u.sock" if name == "pathname" else "\\0trunner-compat"
    result = await run_code(runner, f"""
        import socket, stat
        kind = socket.{kind}
        server = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
        server.bind({address!r})
        made = stat.S_ISSOCK(os.stat("u.sock").st_mode) if {name!r} == "pathname" else None
        client = socket.socket(socket.AF_UNIX, kind)
        if kind == socket.SOCK_DGRAM:
            client.sendto(b"one datagram", {address!r})
            got = server.recv(64)
        else:
            server.listen()
            client.connect({address!r})
            conn, _ = server.accept()
            client.sendall(b"one message")
            got = conn.recv(64)
            conn.close()
        a, b = socket.socketpair(socket.AF_UNIX, kind)
        a.send(b"pair")
        paired = b.recv(8)
        for s in (server, client, a, b):
            s.close()
        result = [got, made, paired]
    """)
    expected = b"one datagram" if kind == "SOCK_DGRAM" else b"one message"
    assert result == [expected, True if name == "pathname" else None, b"pair"]
