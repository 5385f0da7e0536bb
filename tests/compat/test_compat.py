"""Ordinary work that must run inside the jail (issue 10's compatibility
list, the parts the mount and PID namespaces unlock): real programs from
this machine, each asserting its real output."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TYPE_CHECKING

import pytest

from support import run_code
from trunner.linux.plan import JAIL_ID, WORKDIR

if TYPE_CHECKING:
    from trunner import ExecFile, ExecResult, Limits, Runner


async def test_tmp_and_tempfile(runner: Runner) -> None:
    result = await run_code(runner, """
        import tempfile
        with open("/tmp/hard-coded", "w") as f:
            f.write("x")
        with tempfile.NamedTemporaryFile(dir="/tmp") as t:
            t.write(b"y")
            t.flush()
            name = t.name
        result = [open("/tmp/hard-coded").read(), name.startswith("/tmp/"), tempfile.gettempdir()]
    """)
    assert result == ["x", True, "/home/trunner"]


async def test_multiprocessing_pool_and_shared_memory(runner: Runner) -> None:
    result = await run_code(runner, """
        from multiprocessing import Pool, shared_memory
        with Pool(2) as pool:
            squares = pool.map(abs, [-1, -2, -3])
        shm = shared_memory.SharedMemory(create=True, size=16)
        shm.buf[0] = 7
        value = bytes(shm.buf[:1])
        shm.close()
        shm.unlink()
        result = [squares, value]
    """)
    assert result == [[1, 2, 3], b"\x07"]


async def test_getpwuid_of_the_own_uid(runner: Runner) -> None:
    result = await run_code(runner, """
        import getpass, grp, pwd
        me = pwd.getpwuid(os.getuid())
        result = [os.getuid(), os.getgid(), me.pw_name, me.pw_dir,
                  grp.getgrgid(os.getgid()).gr_name, getpass.getuser()]
    """)
    # The jail's own user, whoever the caller is (root too): uid and gid 1000.
    assert result == [JAIL_ID, JAIL_ID, "trunner", WORKDIR, "trunner", "trunner"]


async def test_proc_cpuinfo_meminfo_and_self_in_a_grandchild(runner: Runner) -> None:
    result = await run_code(runner, """
        import subprocess, sys
        out = subprocess.run([sys.executable, "-c",
                              "print(open('/proc/self/status').read().count('Pid'))"],
                             capture_output=True, text=True)
        result = ["processor" in open("/proc/cpuinfo").read(),
                  "MemTotal" in open("/proc/meminfo").read(), out.returncode, out.stdout.strip()]
    """)
    assert result[:3] == [True, True, 0]
    assert int(result[3]) >= 2


# -- programs that died of SIGSYS before seccomp answered with errnos (issue 10,
# item 5) or needed chmod/utime in the working dir. Each runs the host's own
# tool, bound read-only into the jail; a tool this host lacks skips, named.


def _need(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not on this host: {', '.join(missing)} (scripts/setup installs them)")


async def _sh(runner: Runner, script: str, files: dict[str, bytes | ExecFile] | None = None,
              limits: Limits | None = None) -> ExecResult:
    done = (await runner.exec(["/bin/sh", "-c", script], files=files, limits=limits)).response
    assert done.exit_code == 0, (done.exit_code, done.signal, done.stdout, done.stderr)
    return done


async def test_coreutils_timeout(runner: Runner) -> None:
    _need("timeout", "sleep")
    done = await _sh(runner, "timeout 5 echo in-time; timeout 0.2 sleep 30; echo status=$?")
    assert done.stdout == b"in-time\nstatus=124\n"
    assert done.stderr == b""  # no "warning: timer_create" either


async def test_coreutils_setsid(runner: Runner) -> None:
    _need("setsid")
    # setsid forks when the caller leads its group; --wait returns the child's status.
    done = await _sh(runner, f"setsid --wait {sys.executable} -c "
                             "'import os; print(os.getsid(0) == os.getpid() == os.getpgid(0))'")
    assert done.stdout == b"True\n"


async def test_subprocess_start_new_session(runner: Runner) -> None:
    result = await run_code(runner, """
        import subprocess, sys
        out = subprocess.run([sys.executable, "-c",
                              "import os; print(os.getsid(0) == os.getpid())"],
                             capture_output=True, text=True, start_new_session=True)
        result = [out.returncode, out.stdout]
    """)
    assert result == [0, "True\n"]


HELLO_C = b"""#include <stdio.h>
int main(void) { printf("hello from %s\\n", "C"); return 0; }
"""


async def test_compile_c_and_run_it_in_the_same_jail(runner: Runner) -> None:
    """cc links a.out and sets its exec bit (chmod) in the working dir, which allows
    exec: the binary runs at once."""
    _need("cc")
    done = await _sh(runner, "cc -O0 -o a.out hello.c && ls -l a.out | cut -c1-10 && ./a.out",
                     files={"hello.c": HELLO_C})
    assert done.stdout == b"-rwxr-xr-x\nhello from C\n"


async def test_make_builds_and_runs_a_c_program(runner: Runner) -> None:
    _need("make", "cc")
    makefile = b"hello: hello.c\n\tcc -O0 -o $@ $<\nrun: hello\n\t./hello\n"
    done = await _sh(runner, "make -s run && make -s -q hello && echo up-to-date",
                     files={"Makefile": makefile, "hello.c": HELLO_C})
    assert done.stdout == b"hello from C\nup-to-date\n"


async def test_tar_round_trip_keeps_modes_and_mtimes(runner: Runner) -> None:
    _need("tar")
    done = await _sh(runner, """
        set -e
        mkdir -p d/sub && echo one > d/sub/f && echo two > d/x
        chmod 0751 d/x && chmod 0640 d/sub/f && chmod 0705 d/sub
        touch -d @1000000000 d/x && touch -d @1200000000 d/sub/f && touch -d @1100000000 d/sub
        tar cf a.tar d && mkdir out && tar xpf a.tar -C out
        stat -c '%n %a %Y' out/d/x out/d/sub out/d/sub/f
        cat out/d/x out/d/sub/f
    """)
    assert done.stdout == (b"out/d/x 751 1000000000\nout/d/sub 705 1100000000\n"
                           b"out/d/sub/f 640 1200000000\ntwo\none\n")


async def test_python_venv_in_the_working_dir(runner: Runner) -> None:
    """`python -m venv` (its pip too): copies, symlinks, chmod of the scripts."""
    limits = runner.limits.replace(wall_time_s=120, cpu_time_s=120)
    done = await _sh(runner, f"""
        {sys.executable} -m venv v &&
        v/bin/python -c 'import sys; print(sys.prefix != sys.base_prefix, sys.prefix)' &&
        test -x v/bin/pip && v/bin/python -m pip --version | cut -d' ' -f1
    """, limits=limits)
    assert done.stdout == b"True /home/trunner/v\npip\n"


async def test_git_init_and_commit(runner: Runner) -> None:
    _need("git")
    done = await _sh(runner, """
        set -e
        git init -q r && cd r
        echo hello > f && git add f
        git -c user.name=jail -c user.email=jail@trunner commit -q -m 'first commit'
        git log --format='%an %s' && git show HEAD:f
    """)
    assert done.stdout == b"jail first commit\nhello\n"


async def test_getent_hosts_localhost(runner: Runner) -> None:
    """getent's getaddrinfo probes the interfaces with a socket of a family the jail
    does not offer: EAFNOSUPPORT now (it was a kill), and /etc/hosts answers."""
    _need("getent")
    done = await _sh(runner, "getent hosts localhost; getent ahosts localhost")
    lines = done.stdout.decode().splitlines()
    assert lines[0].split()[0] in ("127.0.0.1", "::1"), lines
    assert "localhost" in lines[0].split()[1:], lines
    # ahosts: getaddrinfo, which probes the interfaces (a netlink socket) first.
    assert {line.split()[0] for line in lines[1:]} & {"127.0.0.1", "::1"}, lines


async def test_ps_lists_only_the_jail(runner: Runner) -> None:
    """procps `ps` (get_mempolicy, set_mempolicy probes): the jail's processes, from
    its own /proc: pid 1 (the reaper), the worker and ps itself."""
    _need("ps")
    done = await _sh(runner, "ps -e -o pid=,comm=")
    rows = [line.split(None, 1) for line in done.stdout.decode().splitlines()]
    pids = [int(pid) for pid, _ in rows]
    assert pids[:2] == [1, 2], rows
    assert max(pids) < 10, rows
    assert [comm for _, comm in rows][-1] == "ps", rows


async def test_ssl_ca_store_local_time_and_localhost_lookup(runner: Runner) -> None:
    """The short /etc the jail gets: the CA store (the default SSL context loads
    it), the host's local time zone, and localhost from the jail's /etc/hosts."""
    result = await run_code(runner, """
        import socket, ssl, time
        ctx = ssl.create_default_context()
        result = [ctx.cert_store_stats()["x509_ca"], time.tzname,
                  sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80)}),
                  socket.gethostname()]
    """)
    assert result[0] > 10  # the host's CA certificates, not an empty store
    assert result[1] == list(time.tzname)
    assert set(result[2]) <= {"127.0.0.1", "::1"}
    assert result[2]
    assert result[3] == "trunner"
