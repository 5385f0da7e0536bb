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
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

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
