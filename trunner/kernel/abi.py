"""Every constant both sides of the jail share, written once.

The parent (plan, landlock, seccomp, backend) and the helper side (helper,
install, mounts, the worker's exec mode) import them from here; waiter.c
gets `abi.h`, generated from this file at build (`c_header`). Kernel
numbers are Linux UAPI values, the same on every architecture trunner
runs on. Imports nothing: the helper pays for every import on every spawn.
"""

# -- the helper's own protocol --------------------------------------------------

#: Exit code of a refused jail (some setup step failed).
SANDBOX_SETUP_EXIT = 121
#: Exit code when the real uid's process count cannot be measured.
PROCESS_COUNT_EXIT = 122
#: The helper's report pipe (write end), as the helper holds it.
REPORT_FD = 3
#: trunner-waiter, opened (O_PATH) before the jail exists: pid 1 and the
#: helper exec it from this descriptor, never by a path.
WAITER_FD = 4
#: The program's cgroup, as the helper hands it to the jail's pid 2 (opened
#: before the jail exists; absent where the run has no cgroup): its CPU time
#: (v2 `cpu.stat`; v1 `cpuacct.usage`, with `cpuacct.stat`'s user and system
#: split at PROG_CPU_SPLIT_FD), its peak memory (v2 `memory.peak`, v1
#: `memory.max_usage_in_bytes`), and the `tasks` (v2 `cgroup.procs`) of `prog`
#: and of `sup` in each hierarchy the run has: the exec adapter joins `prog`
#: for its program's spawn only; a run() mode's adapter, its own program,
#: joins it for good. Closed, or close-on-exec, before any of the program's code.
PROG_CPU_FD = 5
PROG_CPU_SPLIT_FD = 6
PROG_PEAK_FD = 7
PROG_JOIN_FDS = (8, 9, 10)
SUP_JOIN_FDS = (11, 12, 13)
CGROUP_FDS = (PROG_CPU_FD, PROG_CPU_SPLIT_FD, PROG_PEAK_FD, *PROG_JOIN_FDS, *SUP_JOIN_FDS)
#: A streaming run's (`Runner.open_process`) program stdout: the write end
#: of a pipe the parent made and reads itself, named after the report
#: pipe in the helper's argv (`FD,STREAM`), moved here and handed to pid 2;
#: the exec adapter gives it to its program as fd 1 and keeps none of it.
#: Its fd 1 stays the reply frame's pipe, which the program never gets.
STREAM_FD = CGROUP_FDS[-1] + 1
#: A run's cgroup holds no process; its two leaves do: `sup` the helper,
#: the jail's pid 1 and the adapter, `prog` the program's tree.
SUP_CGROUP = "sup"
PROG_CGROUP = "prog"
#: Where an image's jail shows the host's code (`trunner.linux.image`):
#: only trunner makes it; no image may hold /.trunner.
HOST_PREFIX = "/.trunner/host"
#: Plan format version; the parent and the helper ship together.
PLAN_VERSION = 13
#: The plan's fields, in the order the helper applies them. The parent's
#: `HelperPlan` and the helper's `helper.Plan` have exactly these
#: (tests/test_plan.py pins both).
PLAN_FIELDS = (
    "version", "env", "process_limit", "jail_nproc", "memory", "cpu", "rlimits", "ipc_limits",
    "build_userns", "unshare_flags", "uid", "gid", "jail_id", "loopback", "root_ops", "proc_ops",
    "scratch", "staging", "hostname", "workdir", "landlock", "parent_pid", "seccomp_bpf",
    "waiter_bpf", "unsafe_skip", "stdio", "session",
)
#: What the program's stdio are (the plan's `stdio`): "pipes", the
#: adapter's (fd 0, 1, 2 only); "stream", the parent's own pipes, its
#: stdout at STREAM_FD (`Runner.open_process`); "pty", a pty pid 2
#: allocates in the run's own devpts, whose controlling side goes to the
#: parent over the socket at STREAM_FD (SCM_RIGHTS).
STDIO_KINDS = ("pipes", "stream", "pty")
#: Steps a benchmark may leave out (`unsafe_skip`, hashed into the rules
#: version). Nothing else is ever skipped. (Not the namespaces: the jail's
#: root, which Landlock's paths name, is built in them.)
SKIPPABLE = ("process_limit", "rlimits", "capabilities", "landlock", "parent_death", "seccomp")

#: The report pipe carries notes, each NOTE_MARK, a word, a space, numbers
#: separated by spaces and a newline, and at most one refusal: any other
#: text (the step that failed and why), written by the helper or pid 2
#: just before it exits SANDBOX_SETUP_EXIT or PROCESS_COUNT_EXIT.
NOTE_MARK = b"\0"
#: The adapter's pid in its jail's PID namespace (pid 1 is the helper's
#: waiter). The exec adapter refuses to run as any other (`kill(-1)`).
ADAPTER_PID = 2

#: Note: the jail's pid 1, as "init HOSTPID STARTTIME" (its start time in
#: clock ticks, /proc/PID/stat field 22): the parent waits on it at teardown.
INIT_NOTE = b"init"
#: Note: after a seccomp kill, "jail-pid HOSTPID" of pid 2, for the kernel
#: log's record (written by trunner-waiter).
JAIL_PID_NOTE = b"jail-pid"
#: Note: pid 2's own rusage, as "usage UTIME_US STIME_US MAXRSS_KIB": pid 1
#: reaps pid 2 with wait4 and trunner-waiter writes it after an exit or a
#: signal death other than a seccomp kill (a `run()` mode's `Usage`).
USAGE_NOTE = b"usage"
#: Note: "ready", from pid 2 of a fork server's run, confined, just before
#: it closes the report pipe and serves a built-in mode in-process (the
#: exec that closes the pipe on the cold path does not happen there).
READY_NOTE = b"ready"

# -- the fork server's grammar (`trunner.worker.forkserver`, `forkclient`) ------

#: A run message carries the marshal of `(STAGE, MODE)` and exactly these
#: descriptors, in order: the run's stdin, stdout, stderr, report pipe, its
#: link to the parent, its jail dir.
RUN_FDS = 6
#: A streaming run's message carries one more, last: the program's stdout
#: pipe (or a pty's socket), which the leader puts at STREAM_FD; its stage
#: then names `REPORT_FD,STREAM_FD`.
STREAM_RUN_FDS = RUN_FDS + 1
#: Modes built into the worker (`trunner.worker.adapters`): the MODE a fork
#: server's pid 2 may serve in-process.
BUILTIN_MODES = ("echo", "exec", "files")
#: The server's answers: `ok PID`, or `refused WHY` with nothing forked.
SERVER_OK = b"ok"
SERVER_REFUSED = b"refused"
#: On the link: the leader's `S` and its pid, once in a session of its own;
#: the parent's `G` once it holds it (EOF: the parent is gone).
LEADER_IN_SESSION = b"S"
LEADER_GO = b"G"

# -- kernel numbers --------------------------------------------------------------

SIGINT, SIGKILL, SIGPIPE, SIGXCPU, SIGXFSZ, SIGSYS = 2, 9, 13, 24, 25, 31
RLIMIT_NPROC = 6

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
#: Each namespace kind a profile names, and its flag.
NAMESPACE_FLAGS = {"cgroup": CLONE_NEWCGROUP, "ipc": CLONE_NEWIPC, "mount": CLONE_NEWNS,
                   "net": CLONE_NEWNET, "pid": CLONE_NEWPID, "user": CLONE_NEWUSER,
                   "uts": CLONE_NEWUTS}
#: A session's command joins the session's user, mount, network, UTS and
#: cgroup namespaces (`setns`, by a pidfd of the session's pid 1; its IPC
#: namespace too, first as root: `helper._enter_session`), then unshares
#: these: a PID namespace (a sibling of the session's), a copy of the mount
#: namespace (its own /proc) and a cgroup namespace rooted at its own leaf.
SESSION_JOINED = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWCGROUP
SESSION_UNSHARED = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWCGROUP
#: The adapter mode a session's pid 2 runs: it says it is ready on stdout
#: (HOLD_READY), then holds the session's namespaces until its stdin ends.
HOLD_MODE = "hold"
HOLD_READY = b"R"
#: Commands (background processes among them) one session runs at once:
#: its process bound counts trunner's own processes of each.
SESSION_COMMANDS = 8

#: The plan's `loopback`: the run's own network namespace with its lo
#: brought up, or the host's network, shared (the provider profile).
LOOPBACK_UP = "up"
LOOPBACK_HOST = "host"
IFF_UP = 0x1

S_IFMT = 0o170000
S_IFIFO = 0o010000
S_IFSOCK = 0o140000
S_IFDIR = 0o040000
S_IFLNK = 0o120000
S_IFREG = 0o100000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
#: A bind op's flags in the plan.
BIND_WRITABLE = 1
BIND_DEVICE = 2

# Landlock (include/uapi/linux/landlock.h). Filesystem rights; ABI 1 has bits 0..12.
ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2 (Linux 5.19)
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3 (Linux 6.2)
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5 (Linux 6.10)
# Network rights, ABI 4 (Linux 6.7).
ACCESS_NET_BIND_TCP = 1 << 0
ACCESS_NET_CONNECT_TCP = 1 << 1
# IPC scopes, ABI 6 (Linux 6.12).
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1


def c_header() -> str:
    """`abi.h` for waiter.c: the constants C needs, from this file."""
    note = "".join(f"\\{b:03o}" for b in NOTE_MARK + JAIL_PID_NOTE + b" ")
    usage = "".join(f"\\{b:03o}" for b in NOTE_MARK + USAGE_NOTE + b" ")
    return (
        "/* Generated from trunner/kernel/abi.py at build: do not edit. */\n"
        f"#define TRUNNER_SANDBOX_SETUP_EXIT {SANDBOX_SETUP_EXIT}\n"
        f"#define TRUNNER_JAIL_PID_NOTE \"{note}\"\n"
        f"#define TRUNNER_USAGE_NOTE \"{usage}\"\n"
    )
