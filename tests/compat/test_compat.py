"""Ordinary work that must run inside the jail (issue 10's compatibility
list, the parts the mount and PID namespaces unlock): real programs from
this machine, each asserting its real output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from support import run_code

if TYPE_CHECKING:
    from trunner import Runner


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
        result = [me.pw_name, me.pw_dir, grp.getgrgid(os.getgid()).gr_name, getpass.getuser()]
    """)
    assert result[0] in ("root", "trunner")
    assert result[1] == "/home/trunner"
    assert result[3] == result[0]


# Compile-and-run C in the working dir waits for issue 10's seccomp item: the
# linker's chmod of its output is still EPERM, so the binary is not executable.
# (Allowing chmod is safe only once a root caller runs as an unprivileged host
# uid: as host uid 0 the jail owns the host's device nodes bound into /dev.)


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
