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
 *   seccomp_filter(bpf)        `bpf`, struct sock_filter bytes, as this
 *                              thread's seccomp filter (PR_SET_SECCOMP; the
 *                              struct sock_fprog points into them). Checked
 *                              first: a whole program of 1 to BPF_MAXINSNS
 *                              instructions, then NO_NEW_PRIVS.
 *   clear_capabilities()       the ambient set cleared, then capset with
 *                              the effective, permitted and inheritable
 *                              sets empty.
 *   landlock_abi() -> int      the kernel's Landlock ABI, 0 where Landlock
 *                              is absent or disabled.
 *   landlock_restrict(abi, fs, net, scoped, rules, ports)
 *                              a Landlock ruleset handling `fs`, `net` and
 *                              `scoped` at `abi` (the attr's size is that
 *                              ABI's), each rule (path or fd, rights on a
 *                              directory, rights on a file) added on the
 *                              path opened O_PATH (symlinks followed) or a
 *                              duplicate of the fd, the one right fstat
 *                              picks (0: no rule), each port (port, rights)
 *                              as a NET_PORT rule, then this thread
 *                              restricted. Checked first: the kernel's ABI
 *                              (EOPNOTSUPP, "landlock"), NO_NEW_PRIVS
 *                              (EPERM, "landlock_restrict_self"). A failure
 *                              enforces nothing and leaves no descriptor.
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
 *                              then `bpf` as its seccomp filter: the code
 *                              of clear_capabilities, landlock_restrict
 *                              and seccomp_filter, their checks included.
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
 * The confinement steps (clear_capabilities, landlock_restrict,
 * seccomp_filter) are each one C function, the one implementation of the
 * step: the jail's pid 2 calls them through trunner.kernel.install, and
 * confine_waiter and fork_init's pid 1 call the same functions in order.
 * Each refusal is OSError(errno, strerror or what a check found, the call
 * refused: "capset", "landlock_add_rule(<path>)", "landlock_add_rule(tcp
 * port <n>)", "seccomp(SECCOMP_SET_MODE_FILTER)", ...).
 *
 * No policy lives here: trunner.kernel.install and mounts decide what to call.
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

/* The confinement primitives: system calls only (pid 1 runs them in a vfork
 * child, with no interpreter), each the one implementation of its step, for
 * the jail's pid 2 (through the functions below) and the waiters (confine).
 * A failure returns -1 with errno and says where it stopped: */
enum { KERNEL_REFUSED, ABI_TOO_OLD, NNP_UNSET, NOT_BPF };
struct refusal {
    const char *what; /* the call refused */
    int why;          /* KERNEL_REFUSED (errno's strerror), or a check of ours */
    long rule;        /* landlock_add_rule: the rule's index (rules, then ports) */
    long long detail; /* ABI_TOO_OLD: the kernel's ABI; NOT_BPF: the program's size */
};

/* A Landlock path-beneath rule: `path` opened O_PATH (following symlinks),
 * or, with no path, a duplicate of `fd`; fstat decides which rights apply
 * (a zero adds no rule: the kernel refuses directory rights on a file). */
struct landlock_rule {
    const char *path;
    int fd;
    unsigned long long dir_rights, file_rights;
};
struct landlock_port {
    unsigned long long port, rights;
};

static int
no_new_privs(void)
{
    return prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1;
}

/* The ambient, effective, permitted and inheritable sets emptied. */
static int
clear_caps(struct refusal *r)
{
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];

    memset(data, 0, sizeof data);
    r->what = "prctl(PR_CAP_AMBIENT_CLEAR_ALL)";
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        return -1;
    r->what = "capset";
    return syscall(SYS_capset, &header, data) < 0 ? -1 : 0;
}

/* The kernel's Landlock ABI: 0 where Landlock is absent or disabled. */
static long
landlock_kernel_abi(void)
{
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0L, 1L /* VERSION */);
    if (abi < 0 && (errno == ENOSYS || errno == EOPNOTSUPP))
        return 0;
    return abi;
}

/* A ruleset handling `fs`, `net` and `scoped` at `abi`, each rule and port
 * added, this thread restricted. Checked first: the kernel's ABI, then
 * NO_NEW_PRIVS (even with CAP_SYS_ADMIN). Any failure enforces nothing and
 * leaves no descriptor open; at most two are open at a time (the ruleset
 * and one rule's), as RLIMIT_NOFILE is already the run's. */
static int
landlock_apply(unsigned long long abi, unsigned long long fs, unsigned long long net,
               unsigned long long scoped, const struct landlock_rule *rules, size_t nrules,
               const struct landlock_port *ports, size_t nports, struct refusal *r)
{
    /* struct landlock_ruleset_attr: three u64, as much as `abi` has;
     * struct landlock_path_beneath_attr: a u64 and an s32, packed;
     * struct landlock_net_port_attr: two u64. */
    unsigned long long attr[3] = {fs, net, scoped}, port_attr[2];
    struct __attribute__((packed)) {
        unsigned long long allowed;
        int parent_fd;
    } beneath;
    size_t size = abi < 4 ? 8 : abi < 6 ? 16 : 24;
    long kernel;
    int ruleset, fd = -1, err;

    r->what = "landlock_create_ruleset";
    kernel = landlock_kernel_abi();
    if (kernel < 0)
        return -1;
    r->what = "landlock";
    if ((unsigned long long)kernel < abi) {
        r->why = ABI_TOO_OLD;
        r->detail = kernel;
        errno = EOPNOTSUPP;
        return -1;
    }
    r->what = "landlock_restrict_self";
    if (!no_new_privs()) {
        r->why = NNP_UNSET;
        errno = EPERM;
        return -1;
    }
    r->what = "landlock_create_ruleset";
    ruleset = (int)syscall(SYS_landlock_create_ruleset, attr, size, 0L);
    if (ruleset < 0)
        return -1;
    r->what = "landlock_add_rule";
    for (size_t i = 0; i < nrules; i++) {
        struct stat st;
        unsigned long long rights;
        r->rule = (long)i;
        fd = rules[i].path != NULL ? open(rules[i].path, O_PATH | O_CLOEXEC)
                                   : fcntl(rules[i].fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0 || fstat(fd, &st) < 0)
            goto failed;
        rights = S_ISDIR(st.st_mode) ? rules[i].dir_rights : rules[i].file_rights;
        if (rights) {
            beneath.allowed = rights;
            beneath.parent_fd = fd;
            if (syscall(SYS_landlock_add_rule, ruleset, 1L /* PATH_BENEATH */, &beneath, 0L) < 0)
                goto failed;
        }
        close(fd);
        fd = -1;
    }
    for (size_t i = 0; i < nports; i++) {
        r->rule = (long)(nrules + i);
        port_attr[0] = ports[i].rights;
        port_attr[1] = ports[i].port;
        if (syscall(SYS_landlock_add_rule, ruleset, 2L /* NET_PORT */, port_attr, 0L) < 0)
            goto failed;
    }
    r->rule = -1;
    r->what = "landlock_restrict_self";
    if (syscall(SYS_landlock_restrict_self, ruleset, 0L) < 0)
        goto failed;
    close(ruleset);
    return 0;
failed:
    err = errno;
    if (fd >= 0)
        close(fd);
    close(ruleset);
    errno = err;
    return -1;
}

/* `count` struct sock_filter at `filter` as this thread's seccomp filter.
 * Checked first: the program's size, then NO_NEW_PRIVS. */
static int
seccomp_install(const void *filter, size_t bytes, struct refusal *r)
{
    struct sock_fprog prog;
    size_t count = bytes / sizeof(struct sock_filter);

    r->what = "seccomp";
    if (count == 0 || count > BPF_MAXINSNS || bytes % sizeof(struct sock_filter)) {
        r->why = NOT_BPF;
        r->detail = (long long)bytes;
        errno = EINVAL;
        return -1;
    }
    if (!no_new_privs()) {
        r->why = NNP_UNSET;
        errno = EPERM;
        return -1;
    }
    r->what = "seccomp(SECCOMP_SET_MODE_FILTER)";
    prog.len = (unsigned short)count;
    prog.filter = (struct sock_filter *)filter;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0 ? 0 : -1;
}

/* OSError(err, why, what): `what` a str object (taken), or NULL for r->what. */
static PyObject *
refused(int err, const struct refusal *r, PyObject *what, unsigned long long abi)
{
    PyObject *exc, *why;

    if (what == NULL)
        what = PyUnicode_DecodeFSDefault(r->what);
    if (what == NULL)
        return NULL;
    switch (r->why) {
    case ABI_TOO_OLD:
        why = PyUnicode_FromFormat("kernel Landlock ABI is %lld, the ruleset needs ABI %llu",
                                   r->detail, abi);
        break;
    case NNP_UNSET:
        why = PyUnicode_FromString("PR_SET_NO_NEW_PRIVS is not set");
        break;
    case NOT_BPF:
        why = PyUnicode_FromFormat("not a BPF program (%lld bytes)", r->detail);
        break;
    default:
        why = PyUnicode_DecodeLocale(strerror(err), "surrogateescape");
    }
    if (why == NULL) {
        Py_DECREF(what);
        return NULL;
    }
    exc = Py_BuildValue("(iNN)", err, why, what);
    if (exc != NULL) {
        PyErr_SetObject(PyExc_OSError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *
kernel_clear_capabilities(PyObject *module, PyObject *unused)
{
    struct refusal r = {"", KERNEL_REFUSED, -1, 0};
    if (clear_caps(&r) < 0)
        return refused(errno, &r, NULL, 0);
    Py_RETURN_NONE;
}

static PyObject *
kernel_seccomp_filter(PyObject *module, PyObject *arg)
{
    struct refusal r = {"", KERNEL_REFUSED, -1, 0};
    Py_buffer view;
    int ret, err;

    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    ret = seccomp_install(view.buf, (size_t)view.len, &r);
    err = errno;
    PyBuffer_Release(&view);
    if (ret < 0)
        return refused(err, &r, NULL, 0);
    Py_RETURN_NONE;
}

static int
item_ull(PyObject *seq, Py_ssize_t i, unsigned long long *out)
{
    PyObject *item = PySequence_GetItem(seq, i);
    if (item == NULL)
        return -1;
    *out = PyLong_AsUnsignedLongLong(item);
    Py_DECREF(item);
    return *out == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *
kernel_landlock_restrict(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    struct refusal r = {"", KERNEL_REFUSED, -1, 0};
    unsigned long long abi, fs, net, scoped;
    struct landlock_rule *rules = NULL;
    struct landlock_port *ports = NULL;
    PyObject **names = NULL, **encoded = NULL, *result = NULL;
    Py_ssize_t nrules, nports, i;
    int ret, err;

    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "landlock_restrict(abi, fs, net, scoped, rules, ports)");
        return NULL;
    }
    abi = PyLong_AsUnsignedLongLong(args[0]);
    fs = PyLong_AsUnsignedLongLong(args[1]);
    net = PyLong_AsUnsignedLongLong(args[2]);
    scoped = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    nrules = PySequence_Size(args[4]);
    nports = PySequence_Size(args[5]);
    if (nrules < 0 || nports < 0)
        return NULL;
    rules = PyMem_Calloc((size_t)nrules + 1, sizeof *rules);
    names = PyMem_Calloc((size_t)nrules + 1, sizeof *names);
    encoded = PyMem_Calloc((size_t)nrules + 1, sizeof *encoded);
    ports = PyMem_Calloc((size_t)nports + 1, sizeof *ports);
    if (rules == NULL || names == NULL || encoded == NULL || ports == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < nrules; i++) {
        PyObject *rule = PySequence_GetItem(args[4], i);
        if (rule == NULL)
            goto done;
        if (PySequence_Size(rule) != 3) {
            Py_DECREF(rule);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "landlock rule: (path or fd, dir, file)");
            goto done;
        }
        names[i] = PySequence_GetItem(rule, 0);
        if (names[i] == NULL || item_ull(rule, 1, &rules[i].dir_rights) < 0
            || item_ull(rule, 2, &rules[i].file_rights) < 0) {
            Py_DECREF(rule);
            goto done;
        }
        Py_DECREF(rule);
        if (PyLong_Check(names[i])) {
            long fd = PyLong_AsLong(names[i]);
            if (fd == -1 && PyErr_Occurred())
                goto done;
            /* out of an int's range: no such descriptor, as dup(2) says */
            rules[i].fd = fd < 0 || fd > 0x7fffffff ? -1 : (int)fd;
        } else {
            if (!PyUnicode_FSConverter(names[i], &encoded[i]))
                goto done;
            rules[i].path = PyBytes_AsString(encoded[i]);
        }
    }
    for (i = 0; i < nports; i++) {
        PyObject *port = PySequence_GetItem(args[5], i);
        if (port == NULL)
            goto done;
        if (PySequence_Size(port) != 2 || item_ull(port, 0, &ports[i].port) < 0
            || item_ull(port, 1, &ports[i].rights) < 0) {
            Py_DECREF(port);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "landlock port: (port, rights)");
            goto done;
        }
        Py_DECREF(port);
    }
    ret = landlock_apply(abi, fs, net, scoped, rules, (size_t)nrules, ports, (size_t)nports, &r);
    err = errno;
    if (ret == 0) {
        result = Py_NewRef(Py_None);
    } else if (r.rule < 0) {
        refused(err, &r, NULL, abi);
    } else if (r.rule < nrules) {
        PyObject *what = PyUnicode_FromFormat("landlock_add_rule(%S)", names[r.rule]);
        if (what != NULL)
            refused(err, &r, what, abi);
    } else {
        PyObject *what = PyUnicode_FromFormat("landlock_add_rule(tcp port %llu)",
                                              ports[r.rule - nrules].port);
        if (what != NULL)
            refused(err, &r, what, abi);
    }
done:
    for (i = 0; names != NULL && i < nrules; i++) {
        Py_XDECREF(names[i]);
        Py_XDECREF(encoded[i]);
    }
    PyMem_Free(rules);
    PyMem_Free(names);
    PyMem_Free(encoded);
    PyMem_Free(ports);
    return result;
}

static PyObject *
kernel_landlock_abi(PyObject *module, PyObject *unused)
{
    long abi = landlock_kernel_abi();
    if (abi < 0) {
        struct refusal r = {"landlock_create_ruleset", KERNEL_REFUSED, -1, 0};
        return refused(errno, &r, NULL, 0);
    }
    return PyLong_FromLong(abi);
}

/* confine_waiter's arguments, read while the interpreter may still run. */
struct confinement {
    Py_buffer bpf;
    int landlock; /* 0: no ruleset */
    unsigned long long abi, fs, net, scoped;
    struct landlock_rule rule;
};

static int
read_confinement(PyObject *bpf, PyObject *landlock, struct confinement *c)
{
    memset(c, 0, sizeof *c);
    if (landlock != Py_None) {
        int fd;
        if (!PyArg_ParseTuple(landlock, "KKKKiK;landlock: (abi, fs, net, scoped, fd, rights)",
                              &c->abi, &c->fs, &c->net, &c->scoped, &fd, &c->rule.file_rights))
            return -1;
        c->landlock = 1;
        c->rule.fd = fd; /* no rights on a directory */
    }
    return PyObject_GetBuffer(bpf, &c->bpf, PyBUF_SIMPLE);
}

/* confine_waiter's work, the primitives above in order: system calls only
 * (pid 1 runs it in a vfork child). */
static int
confine(const struct confinement *c, struct refusal *r)
{
    if (clear_caps(r) < 0)
        return -1;
    r->what = "prctl(PR_SET_NO_NEW_PRIVS)";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -1;
    if (c->landlock
        && landlock_apply(c->abi, c->fs, c->net, c->scoped, &c->rule, 1, NULL, 0, r) < 0)
        return -1;
    return seccomp_install(c->bpf.buf, (size_t)c->bpf.len, r);
}

static PyObject *
kernel_confine_waiter(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    struct confinement c;
    struct refusal r = {"", KERNEL_REFUSED, -1, 0};
    int ret, err;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "confine_waiter(bpf, landlock)");
        return NULL;
    }
    if (read_confinement(args[0], args[1], &c) < 0)
        return NULL;
    ret = confine(&c, &r);
    err = errno;
    PyBuffer_Release(&c.bpf);
    if (ret < 0)
        return refused(err, &r, NULL, c.abi);
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
    struct refusal r = {"", KERNEL_REFUSED, -1, 0};
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
    if (confine(&a->c, &r) < 0)
        init_failed(a->report, r.what, errno, a->fail);
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
    {"clear_capabilities", kernel_clear_capabilities, METH_NOARGS,
     "clear_capabilities(): empty the ambient, effective, permitted and inheritable sets."},
    {"landlock_abi", kernel_landlock_abi, METH_NOARGS,
     "landlock_abi() -> int: the kernel's Landlock ABI, 0 where it has none."},
    {"landlock_restrict", (PyCFunction)(void (*)(void))kernel_landlock_restrict, METH_FASTCALL,
     "landlock_restrict(abi, fs, net, scoped, rules, ports): a Landlock ruleset on this thread."},
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
