/* trunner.linux._kernel: raw system calls for the helper, without ctypes.
 *
 * The helper runs on every jailed spawn, before the jail exists; importing
 * ctypes there cost ~3 ms (libffi, struct, the ctypes package). This module
 * is the whole of what the helper needs from C:
 *
 *   syscall(nr, *args) -> int  up to six arguments, each an int (passed as
 *                              a long, negative ones as such), None (NULL)
 *                              or a bytes-like object (a pointer to its
 *                              buffer; bytes are NUL-terminated, so a path
 *                              passed as bytes is a C string). -1 raises
 *                              OSError(errno).
 *   seccomp_filter(bpf)        PR_SET_SECCOMP with `bpf`, struct sock_filter
 *                              bytes (the struct sock_fprog points into them).
 *   loopback_up() -> int       bring the network namespace's "lo" up
 *                              (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP |
 *                              IFF_RUNNING added), through an AF_INET datagram
 *                              socket closed before it returns; the flags as
 *                              read back, or OSError(errno).
 *   clone_parent() -> int      fork as the caller's sibling: clone(CLONE_PARENT
 *                              | SIGCHLD), with the interpreter's fork hooks
 *                              (PyOS_BeforeFork, PyOS_AfterFork_*), as
 *                              os.fork; the child's pid, 0 in the child. The
 *                              fork server makes each run's leader a child
 *                              of the runner this way. The caller must be
 *                              single-threaded (glibc's cached tid is the
 *                              parent's in the child: nothing here reads it).
 *   confine_waiter(bpf, landlock)
 *                              what a waiter keeps of the jail, on this
 *                              process: the ambient, effective, permitted
 *                              and inheritable capability sets emptied,
 *                              NO_NEW_PRIVS, with `landlock` (None, or
 *                              (abi, handled_fs, handled_net, scoped, fd,
 *                              rights)) a ruleset granting `rights` on the
 *                              file `fd` holds (nothing on a directory),
 *                              then `bpf` as its seccomp filter. The
 *                              checks of install.restrict_filesystem and
 *                              install_seccomp (the kernel's Landlock ABI,
 *                              NO_NEW_PRIVS, the program's size) hold.
 *                              OSError(errno, strerror, the call refused).
 *   fork_init(done, closing, bpf, landlock, argv, report, waiter, fail)
 *                              the jail's pid 1 and pid 2, after an
 *                              unshare(CLONE_NEWPID): pid 1 is a vfork
 *                              child (it shares the caller's memory, so it
 *                              runs no Python and copies none of its
 *                              pages): it closes `closing`, resets the
 *                              signals the interpreter catches to their
 *                              default, forks pid 2 (the C library's fork,
 *                              of the caller's memory: 0 is returned
 *                              there, with the interpreter's fork hooks),
 *                              then arms SIGKILL as its
 *                              parent-death signal, enters /, puts `done`
 *                              on fd 0, closes 1, 2 and every descriptor
 *                              past `waiter`, confines itself as
 *                              confine_waiter does, makes `report`
 *                              close-on-exec and execs `waiter` (a
 *                              descriptor) with `argv`. A failure there is
 *                              written on `report` ("pid_namespace: pid 1:
 *                              ...") and pid 1 exits `fail`. The caller
 *                              gets pid 1's pid once it has exec'd or
 *                              exited (OSError: no pid 1). Signals are
 *                              blocked from before the vfork until each
 *                              process is its own.
 *   NR                         {name: number} of the calls used, from this
 *                              build's <sys/syscall.h>.
 *
 * No policy lives here: trunner.linux.install and mounts decide what to call.
 */
#define PY_SSIZE_T_CLEAN
/* The stable ABI of 3.11: one _kernel.abi3.so for every CPython from 3.11 on. */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#include <Python.h>

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

#define MAX_ARGS 6

/* Calls newer than some C libraries' headers: one number on every arch. */
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

static PyObject *
kernel_syscall(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    long nr, a[MAX_ARGS] = {0};
    Py_buffer views[MAX_ARGS];
    int nviews = 0, err;
    long ret;
    PyObject *result = NULL;

    if (nargs < 1 || nargs > MAX_ARGS + 1) {
        PyErr_SetString(PyExc_TypeError, "syscall(nr, *args): 0 to 6 arguments");
        return NULL;
    }
    nr = PyLong_AsLong(args[0]);
    if (nr == -1 && PyErr_Occurred())
        return NULL;
    for (Py_ssize_t i = 1; i < nargs; i++) {
        PyObject *arg = args[i];
        if (arg == Py_None) {
            a[i - 1] = 0;
        } else if (PyLong_Check(arg)) {
            a[i - 1] = (long)PyLong_AsUnsignedLongMask(arg);
            if (PyErr_Occurred())
                goto done;
        } else if (PyObject_CheckBuffer(arg)) {
            if (PyObject_GetBuffer(arg, &views[nviews], PyBUF_SIMPLE) < 0)
                goto done;
            a[i - 1] = (long)views[nviews].buf;
            nviews++;
        } else {
            PyObject *name = PyType_GetName(Py_TYPE(arg));
            if (name != NULL) {
                PyErr_Format(PyExc_TypeError, "syscall argument %zd: int, None or bytes, not %U",
                             i, name);
                Py_DECREF(name);
            }
            goto done;
        }
    }
    errno = 0;
    ret = syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
    err = errno;
    if (ret == -1) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
    } else {
        result = PyLong_FromLong(ret);
    }
done:
    while (nviews > 0)
        PyBuffer_Release(&views[--nviews]);
    return result;
}

static PyObject *
kernel_seccomp_filter(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    struct sock_fprog prog;
    int ret, err;

    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len == 0 || view.len % sizeof(struct sock_filter) != 0
        || view.len / sizeof(struct sock_filter) > BPF_MAXINSNS) {
        PyBuffer_Release(&view);
        errno = EINVAL;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    prog.len = (unsigned short)(view.len / sizeof(struct sock_filter));
    prog.filter = (struct sock_filter *)view.buf;
    ret = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
    err = errno;
    PyBuffer_Release(&view);
    if (ret != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *
kernel_loopback_up(PyObject *module, PyObject *unused)
{
    struct ifreq ifr;
    int fd, err = 0;

    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    memset(&ifr, 0, sizeof ifr);
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
        goto fail;
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
        goto fail;
    /* Read back: the kernel says what holds, not what was asked. */
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
        goto fail;
    close(fd);
    return PyLong_FromLong((unsigned short)ifr.ifr_flags);
fail:
    err = errno;
    close(fd);
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* confine_waiter's arguments, read while the interpreter may still run. */
struct confinement {
    Py_buffer bpf;
    int landlock; /* 0: no ruleset */
    unsigned long long abi, fs, net, scoped, rights;
    int fd;
};

static int
read_confinement(PyObject *bpf, PyObject *landlock, struct confinement *c)
{
    memset(c, 0, sizeof *c);
    if (landlock != Py_None) {
        int fd;
        if (!PyArg_ParseTuple(landlock, "KKKKiK;landlock: (abi, fs, net, scoped, fd, rights)",
                              &c->abi, &c->fs, &c->net, &c->scoped, &fd, &c->rights))
            return -1;
        c->landlock = 1;
        c->fd = fd;
    }
    return PyObject_GetBuffer(bpf, &c->bpf, PyBUF_SIMPLE);
}

/* confine_waiter's work: system calls only (pid 1 runs it in a vfork
 * child), -1 with errno and *what naming the call refused. */
static int
confine(const struct confinement *c, const char **what)
{
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    struct sock_fprog prog;
    size_t count = (size_t)c->bpf.len / sizeof(struct sock_filter);

    memset(data, 0, sizeof data);
    *what = "prctl(PR_CAP_AMBIENT_CLEAR_ALL)";
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        return -1;
    *what = "capset";
    if (syscall(SYS_capset, &header, data) < 0)
        return -1;
    *what = "prctl(PR_SET_NO_NEW_PRIVS)";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -1;
    if (c->landlock) {
        /* struct landlock_ruleset_attr: three u64, as much as `abi` has;
         * struct landlock_path_beneath_attr: a u64 and an s32, packed. */
        unsigned long long attr[3] = {c->fs, c->net, c->scoped};
        struct __attribute__((packed)) {
            unsigned long long allowed;
            int parent_fd;
        } beneath;
        struct stat st;
        size_t size = c->abi < 4 ? 8 : c->abi < 6 ? 16 : 24;
        long kernel = syscall(SYS_landlock_create_ruleset, NULL, 0, 1L);
        int ruleset, fd, is_dir;
        *what = "landlock";
        if (kernel < 0 && errno != ENOSYS && errno != EOPNOTSUPP)
            return -1;
        if (kernel < (long)c->abi) {
            errno = EOPNOTSUPP;
            return -1;
        }
        *what = "landlock_restrict_self";
        if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
            errno = EPERM;
            return -1;
        }
        *what = "landlock_create_ruleset";
        ruleset = (int)syscall(SYS_landlock_create_ruleset, attr, size, 0L);
        if (ruleset < 0)
            return -1;
        *what = "landlock_add_rule";
        fd = fcntl(c->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0 || fstat(fd, &st) < 0)
            goto landlock_failed;
        is_dir = S_ISDIR(st.st_mode);
        if (!is_dir && c->rights) {
            beneath.allowed = c->rights;
            beneath.parent_fd = fd;
            if (syscall(SYS_landlock_add_rule, ruleset, 1L /* PATH_BENEATH */, &beneath, 0L) < 0)
                goto landlock_failed;
        }
        close(fd);
        fd = -1;
        *what = "landlock_restrict_self";
        if (syscall(SYS_landlock_restrict_self, ruleset, 0L) < 0)
            goto landlock_failed;
        close(ruleset);
        goto landlocked;
    landlock_failed:
        {
            int err = errno;
            if (fd >= 0)
                close(fd);
            close(ruleset);
            errno = err;
            return -1;
        }
    }
landlocked:
    *what = "seccomp";
    if (count == 0 || count > BPF_MAXINSNS || (size_t)c->bpf.len % sizeof(struct sock_filter)) {
        errno = EINVAL;
        return -1;
    }
    if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
        errno = EPERM;
        return -1;
    }
    *what = "seccomp(SECCOMP_SET_MODE_FILTER)";
    prog.len = (unsigned short)count;
    prog.filter = (struct sock_filter *)c->bpf.buf;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0 ? 0 : -1;
}

static PyObject *
refused(int err, const char *what)
{
    PyObject *exc = Py_BuildValue("(iss)", err, strerror(err), what);
    if (exc != NULL) {
        PyErr_SetObject(PyExc_OSError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *
kernel_confine_waiter(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    struct confinement c;
    const char *what = "";
    int ret, err;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "confine_waiter(bpf, landlock)");
        return NULL;
    }
    if (read_confinement(args[0], args[1], &c) < 0)
        return NULL;
    ret = confine(&c, &what);
    err = errno;
    PyBuffer_Release(&c.bpf);
    if (ret < 0)
        return refused(err, what);
    Py_RETURN_NONE;
}

/* Pid 1's failure: one line on the report pipe, then its exit code. */
static void __attribute__((noreturn))
init_failed(int report, const char *what, int err, int code)
{
    char line[512];
    int n = snprintf(line, sizeof line, "pid_namespace: pid 1: %s: %s (errno %d)", what,
                     strerror(err), err);
    if (n > 0 && write(report, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0) {
        /* the parent is gone: the exit code still tells */
    }
    _exit(code);
}

#define MAX_CLOSING 8
#define MAX_INIT_ARGS 8

/* What pid 1 reads: filled before the vfork, never written after it. */
struct init_args {
    struct confinement c;
    int closing[MAX_CLOSING], nclosing, done, report, waiter, fail;
    char *argv[MAX_INIT_ARGS + 1];
    sigset_t old;
};

/* Pid 1, a vfork child in the caller's memory: system calls only, on its
 * own frames below the caller's. Returns only in pid 2 (0), its fork. */
static __attribute__((noinline)) int
run_pid1(const struct init_args *a)
{
    const char *what = "";
    long jail;
    for (int i = 0; i < a->nclosing; i++)
        close(a->closing[i]);
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler != SIG_DFL
            && sa.sa_handler != SIG_IGN) {
            sa.sa_handler = SIG_DFL;
            sa.sa_flags = 0;
            sigaction(sig, &sa, NULL);
        }
    }
    /* The C library's fork, as os.fork's: pid 2 gets its own thread id
     * in the C library's thread data and its locks reset (the caller holds
     * none: it waits in vfork). */
    jail = fork();
    if (jail == 0)
        return 0;
    if (jail < 0)
        init_failed(a->report, "fork", errno, a->fail);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        init_failed(a->report, "prctl(PR_SET_PDEATHSIG)", errno, a->fail);
    if (chdir("/") < 0)
        init_failed(a->report, "chdir(/)", errno, a->fail);
    if (a->done != 0) {
        if (dup2(a->done, 0) < 0)
            init_failed(a->report, "dup2", errno, a->fail);
        close(a->done);
    }
    close(1);
    close(2);
    if (syscall(SYS_close_range, (long)a->waiter + 1, ~0UL, 0L) < 0)
        init_failed(a->report, "close_range", errno, a->fail);
    if (confine(&a->c, &what) < 0)
        init_failed(a->report, what, errno, a->fail);
    if (fcntl(a->report, F_SETFD, FD_CLOEXEC) < 0)
        init_failed(a->report, "fcntl(F_SETFD)", errno, a->fail);
    pthread_sigmask(SIG_SETMASK, &a->old, NULL);
    syscall(SYS_execveat, (long)a->waiter, "", a->argv, environ, (long)AT_EMPTY_PATH);
    init_failed(a->report, "exec", errno, a->fail);
}

static PyObject *
kernel_fork_init(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    struct init_args a;
    PyObject *argv_bytes[MAX_INIT_ARGS] = {NULL};
    int nargv = 0, err;
    sigset_t all;
    pid_t pid;
    PyObject *result = NULL;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "fork_init(done, closing, bpf, landlock, argv, report, waiter, fail)");
        return NULL;
    }
    memset(&a, 0, sizeof a);
    a.done = PyLong_AsLong(args[0]);
    a.report = PyLong_AsLong(args[5]);
    a.waiter = PyLong_AsLong(args[6]);
    a.fail = PyLong_AsLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyTuple_Check(args[1]) || PyTuple_Size(args[1]) > MAX_CLOSING
        || !PyTuple_Check(args[4]) || PyTuple_Size(args[4]) < 1
        || PyTuple_Size(args[4]) > MAX_INIT_ARGS) {
        PyErr_SetString(PyExc_TypeError, "fork_init: closing and argv are short tuples");
        return NULL;
    }
    a.nclosing = (int)PyTuple_Size(args[1]);
    for (int i = 0; i < a.nclosing; i++) {
        a.closing[i] = PyLong_AsLong(PyTuple_GetItem(args[1], i));
        if (PyErr_Occurred())
            return NULL;
    }
    if (read_confinement(args[2], args[3], &a.c) < 0)
        return NULL;
    for (; nargv < (int)PyTuple_Size(args[4]); nargv++) {
        if (!PyUnicode_FSConverter(PyTuple_GetItem(args[4], nargv), &argv_bytes[nargv]))
            goto done;
        a.argv[nargv] = PyBytes_AsString(argv_bytes[nargv]);
    }

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &a.old);
    PyOS_BeforeFork();
    pid = vfork();
    if (pid == 0) {
        run_pid1(&a); /* returns in pid 2 only */
        PyOS_AfterFork_Child();
        pthread_sigmask(SIG_SETMASK, &a.old, NULL);
        result = PyLong_FromLong(0);
        goto done;
    }
    err = errno;
    PyOS_AfterFork_Parent();
    pthread_sigmask(SIG_SETMASK, &a.old, NULL);
    if (pid < 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
    } else {
        result = PyLong_FromLong(pid);
    }
done:
    PyBuffer_Release(&a.c.bpf);
    for (int i = 0; i < nargv; i++)
        Py_XDECREF(argv_bytes[i]);
    return result;
}

static PyObject *
kernel_clone_parent(PyObject *module, PyObject *unused)
{
    long pid;
    int err;

    PyOS_BeforeFork();
    pid = syscall(SYS_clone, (long)(CLONE_PARENT | SIGCHLD), 0L, 0L, 0L, 0L);
    err = errno;
    if (pid == 0) {
        PyOS_AfterFork_Child();
        return PyLong_FromLong(0);
    }
    PyOS_AfterFork_Parent();
    if (pid < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(pid);
}

static PyMethodDef kernel_methods[] = {
    {"syscall", (PyCFunction)(void (*)(void))kernel_syscall, METH_FASTCALL,
     "syscall(nr, *args) -> int: a raw system call; -1 raises OSError."},
    {"seccomp_filter", kernel_seccomp_filter, METH_O,
     "seccomp_filter(bpf): install struct sock_filter bytes with PR_SET_SECCOMP."},
    {"clone_parent", kernel_clone_parent, METH_NOARGS,
     "clone_parent() -> int: fork as the caller's sibling (CLONE_PARENT); 0 in the child."},
    {"confine_waiter", (PyCFunction)(void (*)(void))kernel_confine_waiter, METH_FASTCALL,
     "confine_waiter(bpf, landlock): what a waiter keeps of the jail, on this process."},
    {"fork_init", (PyCFunction)(void (*)(void))kernel_fork_init, METH_FASTCALL,
     "fork_init(done, closing, bpf, landlock, argv, report, waiter, fail) -> int:"
     " pid 1 (vfork, exec'd) and pid 2 (0 is returned there)."},
    {"loopback_up", kernel_loopback_up, METH_NOARGS,
     "loopback_up() -> int: bring the network namespace's lo up; its flags."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "_kernel", "Raw system calls for trunner's helper.", -1,
    kernel_methods,
};

/* The calls trunner makes, by name: NR's contents. */
#define NR_ENTRY(name) {#name, SYS_##name}
static const struct {
    const char *name;
    long nr;
} numbers[] = {
    NR_ENTRY(capset), NR_ENTRY(close_range), NR_ENTRY(landlock_add_rule),
    NR_ENTRY(landlock_create_ruleset), NR_ENTRY(landlock_restrict_self), NR_ENTRY(mount),
    NR_ENTRY(pivot_root), NR_ENTRY(prctl), NR_ENTRY(prlimit64), NR_ENTRY(rt_sigaction),
    NR_ENTRY(sethostname), NR_ENTRY(setns), NR_ENTRY(umount2), NR_ENTRY(unshare),
};

PyMODINIT_FUNC
PyInit__kernel(void)
{
    PyObject *module = PyModule_Create(&kernel_module), *table = NULL;
    if (module == NULL)
        return NULL;
    table = PyDict_New();
    if (table == NULL)
        goto fail;
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        PyObject *value = PyLong_FromLong(numbers[i].nr);
        int ret = value == NULL ? -1 : PyDict_SetItemString(table, numbers[i].name, value);
        Py_XDECREF(value);
        if (ret < 0)
            goto fail;
    }
    if (PyModule_AddObject(module, "NR", table) < 0)
        goto fail;
    return module;
fail:
    Py_XDECREF(table);
    Py_DECREF(module);
    return NULL;
}
