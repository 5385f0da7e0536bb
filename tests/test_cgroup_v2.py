"""cgroup v2 as users deploy it (issue 32), in a guest under systemd 252
(scripts/guest/run-v2), the caller placed by scripts/guest/layout as named
by TRUNNER_TEST_CGROUP_LAYOUT (scripts/test-cgroup-v2 runs each):

- `root`: the caller in the root cgroup (a VM with nothing else, a container);
- `service`, `session`: a plain service, a root login's session scope: not
  delegated, refused, naming the fix;
- `delegated`, `scope`: a `Delegate=yes` service, `systemd-run --scope -p
  Delegate=yes`, the caller in it: refused until it moves itself into a
  leaf (`cgroup_leaf`), and refused while another process stays there;
- `delegated-leaf`: the same, the caller already in a leaf (`DelegateSubgroup=`);
- `user`: uid 65534 in a service of its `user@.service`, not delegated:
  runs without cgroups (RLIMIT_NPROC), and doctor names the fix;
- `user-delegated`: uid 65534 in `systemd-run --user --scope -p Delegate=yes`
  (which systemd 252 does not mark): RLIMIT_NPROC until it names a leaf,
  then refused while another process stays beside it, then per-run cgroups
  once it moves, as root gets; `user-delegated-leaf`: already in the leaf;
- `docker`: root in a container run `--privileged --cgroupns=private`, its
  process moved into a leaf first: per-run cgroups; `docker-default`: root
  in a container run with Docker's defaults: refused, naming the flags;
  `docker-user`: uid 65534 in one run with the least flags that let the
  jail work: RLIMIT_NPROC; `docker-user-init`: the same with `--init`,
  whose docker-init is a mount below /usr: refused (a non-root jail cannot
  bind /usr without it).

Each asserts that `trunner doctor` predicts what a real run does, that
the doctor changed nothing, and where runs get cgroups that `processes`
and `memory_bytes` hold (a fork bomb's EAGAIN, `memory_limit`) and that
no run's cgroup is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import scaled
from trunner.linux import delegation

LAYOUT = os.environ.get("TRUNNER_TEST_CGROUP_LAYOUT", "")
pytestmark = pytest.mark.skipif(
    not LAYOUT, reason="not in a cgroup v2 guest layout (scripts/test-cgroup-v2 boots one)")

TRUNNER = [sys.executable, "-m", "trunner"]
CGROUPS = Path("/sys/fs/cgroup")
#: What a run in each layout gets: "cgroup" (per-run cgroups), "rlimit" (no
#: cgroup: RLIMIT_NPROC; then the fix for cgroups that doctor's note names),
#: or the refusal's reason and the fix its detail names.
EXPECTED: dict[str, tuple[str, str]] = {
    "root": ("cgroup", ""),
    "service": ("process_limit_unavailable", "Delegate=yes"),
    "session": ("process_limit_unavailable", "Delegate=yes"),
    "delegated": ("process_limit_unavailable", "Runner(cgroup_leaf=NAME)"),
    "scope": ("process_limit_unavailable", "Runner(cgroup_leaf=NAME)"),
    "delegated-leaf": ("cgroup", ""),
    "user": ("rlimit", delegation.USER_FIX),
    "user-delegated": ("rlimit", delegation.USER_FIX),
    "user-delegated-leaf": ("cgroup", ""),
    "docker": ("cgroup", ""),
    "docker-default": ("sandbox_setup", "--security-opt seccomp=unconfined"),
    "docker-user": ("rlimit", delegation.CONTAINER_FIX),
    "docker-user-init": ("sandbox_setup", "/usr/sbin/docker-init is a mount below /usr"),
}
#: The leaf the layouts that need one move into.
LEAF = "supervisor"
#: Where the caller sits in the delegated cgroup itself, so must move.
MOVES = ("delegated", "scope", "user-delegated")

FORK_BOMB = """
import errno, os, time
pids = []
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print(errno.errorcode[e.errno], len(pids))
        break
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 1)  # off the run's stdout: the run ends at its EOF
        os.dup2(null, 2)
        time.sleep(1000)
        os._exit(0)
    pids.append(pid)
"""


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    done = subprocess.run([*TRUNNER, *args], capture_output=True, text=True,
                          timeout=scaled(120), env={**os.environ, **(env or {})}, cwd="/tmp")
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}


def _tree() -> list[str]:
    """Every cgroup trunner could make: a `trunner/` dir, a leaf, and below
    (systemd's own come and go: a login session's slice torn down meanwhile)."""
    return sorted(str(p.relative_to(CGROUPS)) for p in CGROUPS.rglob("*")
                  if p.is_dir() and {"trunner", LEAF} & set(p.relative_to(CGROUPS).parts))


def _own_cgroup(pid: int | str = "self") -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line[3:] for line in lines if line.startswith("0::"))


def test_doctor_predicts_a_real_run_and_changes_nothing() -> None:
    before = _tree()
    _, doctor = _cli("doctor", "--json")
    assert _tree() == before  # the probe only reads
    code, out = _cli("exec", "--", "/bin/true")
    expected, fix = EXPECTED[LAYOUT]
    assert doctor["can_run"] is (code == 0), (doctor, out)
    limit = doctor["layers"]["process_limit"]  # type: ignore[index]
    if expected in ("cgroup", "rlimit"):
        assert code == 0, out
        assert limit["kind"] == ("pids_cgroup" if expected == "cgroup" else "userns_nproc"), limit
        assert fix in str(limit["cgroup_note"]), limit  # how to get cgroups ("": none needed)
        return
    assert (code, out["error"]) == (1, expected), out
    assert fix in str(out["detail"]), out
    assert fix in str(doctor["refusal_detail"]), doctor
    if LAYOUT == "docker-default":  # every flag Docker's defaults call for, at once
        for opt in ("seccomp", "apparmor", "systempaths"):
            assert f"--security-opt {opt}=unconfined" in str(out["detail"]), out
    if expected == "process_limit_unavailable":
        text = subprocess.run([*TRUNNER, "doctor"], capture_output=True, text=True,
                              timeout=scaled(120), cwd="/tmp").stdout
        lines = text.partition("layers:")[2].splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip().startswith("process_limit:"))
        assert lines[at].partition("process_limit: ")[2] == (
            "DOES NOT HOLD: no pids cgroup for the runs"), text
        assert lines[at + 1].strip().startswith("cgroups: "), text  # the note, with the fix
        assert fix in lines[at + 1], text


#: Moves itself into LEAF through `Runner(cgroup_leaf=)` and runs: in a
#: process of its own, as a caller would be (this test process's watchdog,
#: started by the leak check, stays where it started: in the delegated cgroup).
MOVER = """
import json, os, sys, trio
from trunner import Runner
def own():
    return next(l[3:] for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::"))
seen = {"before": own()}
Runner(cgroup_leaf=sys.argv[1])  # predicts: no move yet
seen["after_runner"] = own()
async def main():
    for _ in range(2):  # the second Runner finds this process in its leaf already
        done = await Runner(cgroup_leaf=sys.argv[1]).exec(["/bin/true"])
        seen.setdefault("exit_codes", []).append(done.response.exit_code)
trio.run(main)
seen["after_runs"] = own()
print(json.dumps(seen))
"""


@pytest.mark.skipif(LAYOUT not in MOVES, reason="the caller does not sit in the delegated cgroup")
def test_the_caller_moves_itself_into_a_leaf_only_when_asked() -> None:
    here = _own_cgroup()
    # Asked, but this test process stays beside it in the delegated cgroup.
    code, out = _cli("exec", "--", "/bin/true", env={delegation.LEAF_VAR: LEAF})
    assert (code, out.get("error")) == (1, "process_limit_unavailable"), out
    others = str(out["detail"]).partition("holds other processes (")[2].partition(")")[0]
    assert str(os.getpid()) in others.split(", "), out
    # A caller alone in it, as a service's main process: this process and its
    # watchdog step aside (as an ExecStartPre= would move them), the caller
    # starts in the delegated cgroup, and moves itself on its first run (not
    # at `Runner()`), once.
    delegated = CGROUPS / here.lstrip("/")
    aside = delegated / "tests"
    aside.mkdir()
    for pid in (delegated / "cgroup.procs").read_text().split():
        (aside / "cgroup.procs").write_text(pid)

    def start_in_delegated() -> None:
        (delegated / "cgroup.procs").write_text(str(os.getpid()))

    done = subprocess.run([sys.executable, "-c", MOVER, LEAF], capture_output=True, text=True,
                          timeout=scaled(120), preexec_fn=start_in_delegated)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"before": here, "after_runner": here, "exit_codes": [0, 0],
                    "after_runs": f"{here}/{LEAF}"}, seen
    assert sorted(p.name for p in delegated.iterdir() if p.is_dir()) == [LEAF, "tests", "trunner"]


@pytest.mark.skipif(EXPECTED.get(LAYOUT, ("",))[0] != "cgroup", reason="runs get no cgroup here")
def test_processes_and_memory_hold_and_no_cgroup_is_left() -> None:
    _, doctor = _cli("doctor", "--json")
    base = Path(str(doctor["layers"]["process_limit"]["cgroup_base"]))  # type: ignore[index]
    # The wall-time limits are safety caps here, scaled for a guest under emulation.
    wall = ["--wall-time-s", str(scaled(10))]
    code, out = _cli("exec", *wall, "--processes", "8", "--text", "--", sys.executable, "-c",
                     FORK_BOMB)
    assert code == 0, out
    failure, forked = str(out["stdout"]).split()
    assert failure == "EAGAIN"
    assert int(forked) < 8
    code, out = _cli("exec", *wall, "--memory-bytes", str(64 << 20), "--", sys.executable,
                     "-c", "b = bytearray(256 << 20); print(len(b))")
    assert (code, out.get("error")) == (1, "memory_limit"), out
    # Every run's cgroup removed (on v2 `trunner/` is a cgroup: files of its own).
    assert [p for p in (base / "trunner").iterdir() if p.is_dir()] == []
