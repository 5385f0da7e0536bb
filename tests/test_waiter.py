"""trunner-waiter (trunner/linux/waiter.c), what the helper and the jail's
pid 1 exec once pid 2 is forked, run here outside any jail: the helper form
forwards the end pid 1 reports (an exit code, or a death by that signal),
kills and reaps its child every time, and refuses an argv it does not know;
each form calls nothing outside the waiters' seccomp allow-list (static
musl's start-up included). The jailed paths (pid 1's `init` form, the
SIGSYS note) run in test_faults, tests/security and every run."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

from support import scaled, wait_until
from trunner.helper import SANDBOX_SETUP_EXIT
from trunner.kernel.install import WAITER

# Forks a child that sleeps (the waiter's "pid 1"), writes LINE on a pipe,
# then execs the waiter in its place, as the helper does: from a descriptor
# (execveat), under STRICT's filter if argv[3] is "strict".
BECOME_WAITER = r"""
import os, sys
line = sys.argv[1].encode()
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(r); os.close(w)
    os.execv("/bin/sleep", ["sleep", "60"])
if line:
    os.write(w, line)
os.close(w)
print(child, flush=True)
proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
report_r, report_w = os.pipe()
os.set_inheritable(r, True)
os.set_inheritable(proc, True)
os.set_inheritable(report_w, True)
waiter = sys.argv[2]
fd = os.open(waiter, os.O_PATH | os.O_CLOEXEC)
argv = [waiter, str(r), str(child), str(proc), str(report_w), "--", "echo"]
if sys.argv[3] == "strict":
    exec(STRICT)
os.execve(fd, argv, os.environ)
"""
# The waiters' allow-list (seccomp's `waiter_rules`) with a kill, not ENOSYS,
# for any other call: a waiter that calls one dies of SIGSYS. Python's last
# steps before the exec call only what the helper's do under the real filter.
REPO = str(Path(__file__).resolve().parents[1])
STRICT = rf"""
import pyseccomp as sc
sys.path.insert(0, {REPO!r})
from trunner.linux.seccomp.compile import waiter_rules
strict = sc.SyscallFilter(sc.KILL_PROCESS)
for rule in waiter_rules():
    strict.add_rule(sc.ALLOW, rule.syscall,
                    *(sc.Arg(a.index, sc.MASKED_EQ, a.mask, a.value) for a in rule.args))
strict.load()
"""


def become_waiter(line: str, *, strict: bool = False) -> tuple[int, int]:
    """(the waiter's exit status as returncode, its child's pid)."""
    code = f"STRICT = {STRICT!r}\n{BECOME_WAITER}"
    done = subprocess.run([sys.executable, "-c", code, line, WAITER, "strict" if strict else ""],
                          capture_output=True, text=True, timeout=scaled(30))
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, int(done.stdout.split()[0])


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


ENDS = [
    ("1 0", 0),                         # pid 2 exited 0
    ("1 7", 7),                         # pid 2 exited 7
    ("1 0 5 6 7", 0),                   # ... with its usage (written on the report pipe)
    ("2 15", -signal.SIGTERM),          # killed by SIGTERM: the waiter dies of it too
    ("3 6", -signal.SIGABRT),           # dumped core on SIGABRT
    ("2 13", -signal.SIGPIPE),          # SIGPIPE, which the exec left ignored (Python's)
    ("", -signal.SIGKILL),              # pid 1 died first: its own end (SIGKILLed) counts
    ("x y", -signal.SIGKILL),           # not pid 1's line: likewise
]


@pytest.mark.parametrize(("line", "returncode"), ENDS)
def test_forwards_pid_2s_end_and_reaps_its_child(line: str, returncode: int) -> None:
    code, child = become_waiter(line)
    assert code == returncode
    assert gone(child)  # killed and reaped: nothing outlives the waiter


@pytest.mark.parametrize(("line", "returncode"), ENDS)
def test_calls_nothing_outside_the_waiters_filter(line: str, returncode: int) -> None:
    """Under the waiters' allow-list with a kill for anything else, each end
    is forwarded as without it: musl's start-up and every call waiter.c
    makes on that path are on the list (under the real filter, one that is
    not would fail ENOSYS, and musl's start-up would crash on it)."""
    code, child = become_waiter(line, strict=True)
    assert code == returncode
    assert gone(child)


@pytest.mark.parametrize("argv", [[], ["init"]])
def test_init_and_a_refusal_call_nothing_outside_the_waiters_filter(argv: list[str]) -> None:
    """`init` with no child (waitid: ECHILD, exit 1) and a refused argv
    (exit 121), under the strict allow-list: start-up, pipe2, waitid, exit."""
    code = (f"import os, sys\n{STRICT}\n"
            "os.execve(os.open(sys.argv[1], os.O_PATH), sys.argv[1:], {})")
    done = subprocess.run([sys.executable, "-c", code, WAITER, *argv],
                          capture_output=True, text=True, timeout=scaled(30))
    assert done.returncode == (1 if argv else SANDBOX_SETUP_EXIT), done.stderr


def test_refuses_an_argv_it_does_not_know() -> None:
    for argv in ([], ["3", "x", "4", "5"], ["3", "1", "4", "5", "++", "echo"], ["nit"]):
        done = subprocess.run([WAITER, *argv], capture_output=True, timeout=scaled(10))
        assert done.returncode == SANDBOX_SETUP_EXIT, argv
        assert done.stdout == done.stderr == b""


def test_is_a_static_binary() -> None:
    """Nothing to load: pid 1's Landlock ruleset grants it only this file."""
    with open(WAITER, "rb") as f:
        elf = f.read()
    assert elf[:5] == b"\x7fELF\x02"  # ELF64
    order: Literal["little", "big"] = "little" if elf[5] == 1 else "big"
    phoff = int.from_bytes(elf[0x20:0x28], order)
    size, count = int.from_bytes(elf[0x36:0x38], order), int.from_bytes(elf[0x38:0x3A], order)
    types = [int.from_bytes(elf[phoff + i * size:phoff + i * size + 4], order)
             for i in range(count)]
    assert 1 in types  # PT_LOAD
    assert 3 not in types  # PT_INTERP: no loader to read
    assert 2 not in types  # PT_DYNAMIC: no libraries
    assert os.access(WAITER, os.X_OK)


def test_a_missing_waiter_refuses_every_run(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """Without the binary no jail could end its run: the host probe (and so
    `Runner()` and `trunner doctor`) refuses, naming it, before any spawn."""
    from trunner.errors import Reason
    from trunner.kernel import install
    from trunner.linux.probe import probe_host

    monkeypatch.setattr(install, "WAITER", str(tmp_path / "trunner-waiter"))
    host = probe_host()
    assert host.refusal is Reason.SANDBOX_SETUP
    assert host.refusal_detail.startswith(f"{tmp_path}/trunner-waiter is not built")


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rpartition(")")[2].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        found += kids
        todo += kids
    return found


def _exec_fn(pid: int) -> bytes:
    """The name the kernel gave the exec that made `pid` (auxv AT_EXECFN)."""
    with open(f"/proc/{pid}/auxv", "rb") as f:
        auxv = f.read()
    words = [int.from_bytes(auxv[i:i + 8], sys.byteorder) for i in range(0, len(auxv), 8)]
    address = dict(zip(words[::2], words[1::2], strict=True))[31]  # AT_EXECFN
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:  # the string ends just below the stack's top: read no further than its page
        return os.pread(fd, 4096 - address % 4096, address).partition(b"\0")[0]
    finally:
        os.close(fd)


async def test_the_helper_and_pid_1_exec_the_waiter_from_a_descriptor(runner: object) -> None:
    """Opened before the jail existed, the waiter is exec'd through that
    descriptor (execveat, AT_EMPTY_PATH: the kernel names it /dev/fd/N),
    never by a path the jail could have rebuilt meanwhile."""
    from trunner import Runner
    from trunner.helper import WAITER_FD

    assert isinstance(runner, Runner)
    def exe(pid: int) -> str:
        try:
            return os.path.realpath(f"/proc/{pid}/exe", strict=True)
        except OSError:  # gone since it was listed (a leader's short-lived fork)
            return ""

    def waiters() -> list[int]:
        return [pid for pid in _descendants(os.getpid()) if exe(pid) == os.path.realpath(WAITER)]

    async with runner.pool("echo", size=1) as pool:
        await wait_until(lambda: len(waiters()) >= 2, 20, "the waiting helper and the jail's pid 1")
        assert {_exec_fn(pid) for pid in waiters()} == {f"/dev/fd/{WAITER_FD}".encode()}
        assert (await pool.run({"x": 1})).response == {"x": 1}


async def test_pid_1_catches_and_blocks_no_signal(runner: object) -> None:
    """Pid 1 (a vfork child that runs no Python, `_kernel.fork_init`) resets
    the handlers the interpreter set before it forks pid 2 and execs the
    waiter: the kernel shields a namespace's init from the signals it has no
    handler for, and none is caught or blocked there (the interpreter's
    ignored SIGPIPE and SIGXFSZ stay ignored, as across any exec)."""
    from trunner import Runner

    assert isinstance(runner, Runner)
    grep = "grep -E '^(Name|SigBlk|SigIgn|SigCgt):' /proc/1/status"
    result = await runner.exec(["sh", "-c", grep])
    status = dict(line.split(":\t") for line in result.response.stdout.decode().splitlines())
    ignored = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    assert status == {"Name": "trunner-waiter", "SigBlk": "0" * 16, "SigIgn": f"{ignored:016x}",
                      "SigCgt": "0" * 16}, status
