/* trunner-waiter: what the helper and the jail's pid 1 become once pid 1
 * and pid 2 are forked.
 *
 *   trunner-waiter init
 *   trunner-waiter ENDS INIT PROC REPORT [-- ADAPTER...]
 *
 * `init` is pid 1 (_kernel.c's `fork_init` confines it first): it reaps
 * every orphan, writes pid 2's end ("CODE STATUS" of waitid) on fd 0, then
 * exits, which ends the namespace; after a seccomp kill it blocks until
 * killed instead (pid 2 stays a zombie, for the helper to name).
 *
 * The other form is the helper:
 * The helper (trunner/helper.py) forks pid 1, confines itself (no
 * capabilities, NO_NEW_PRIVS, the jail's seccomp filter), then execs this
 * static binary with the descriptors and pid below, so that what waits, and
 * exits last at the end of every run, is a process of a few pages, not an
 * interpreter: a Python process's exit costs ~0.5 ms more, on the path of
 * every prewarmed call. It does exactly what helper.py's `_wait_and_forward`
 * documents:
 *
 *   ENDS    read end of the pipe on which pid 1 writes "CODE STATUS" of pid
 *           2's end (waitid's si_code and si_status), or EOF if pid 1 died
 *   INIT    pid 1's host pid (this process's child)
 *   PROC    an O_PATH descriptor of the host's /proc (to name pid 2 after a
 *           seccomp kill)
 *   REPORT  the report pipe (abi.REPORT_FD)
 *   ADAPTER what pid 2 runs: not read, only shown (the host's `ps` tells
 *           which run a waiter serves, as the helper's argv did)
 *
 * It kills pid 1 (the kernel kills, and pid 1 reaps, whatever is left in
 * the namespace), reaps it, and leaves with pid 2's exit code, or writes
 * JAIL_PID_NOTE and pid 2's host pid after a SIGSYS and dies of pid 2's
 * signal. No allocation, no stdio: only the system calls the waiters'
 * filter allows (seccomp's WAITER_SYSCALLS). Its C library is static musl
 * (musl-gcc -static, at build only: the wheel carries the binary): its
 * start-up is set_tid_address (and arch_prctl on x86_64), where a static
 * glibc's costs ~0.6 ms more an exec, twice a run.
 */
#define _GNU_SOURCE /* wait4, pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "abi.h" /* generated from abi.py at build */

static const char NOTE[] = TRUNNER_JAIL_PID_NOTE; /* abi.NOTE_MARK + abi.JAIL_PID_NOTE + " " */
static const char USAGE[] = TRUNNER_USAGE_NOTE; /* abi.NOTE_MARK + abi.USAGE_NOTE + " " */

static long parse_upto(const char *s, const char **end, long most)
{
    long v = 0;
    int any = 0;
    while (*s >= '0' && *s <= '9') {
        if (v > (most - (*s - '0')) / 10)
            return -1;
        v = v * 10 + (*s++ - '0');
        any = 1;
    }
    *end = s;
    return any ? v : -1;
}

static long parse(const char *s, const char **end)
{
    return parse_upto(s, end, 0x7fffffff);
}

static long arg(const char *s)
{
    const char *end;
    long v = parse(s, &end);
    return *end == '\0' ? v : -1;
}

static ssize_t read_all(int fd, char *buf, size_t size)
{
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

static ssize_t read_at(int dir, const char *path, char *buf, size_t size)
{
    int fd = openat(dir, path, O_RDONLY | O_CLOEXEC);
    ssize_t n;
    if (fd < 0)
        return -1;
    n = read_all(fd, buf, size - 1);
    close(fd);
    if (n >= 0)
        buf[n] = '\0';
    return n;
}

static int decimal(char *out, long v)
{
    char tmp[24];
    int n = 0, i;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = '\0';
    return n;
}

/* Pid 2's host pid: the child of pid 1 whose NSpid ends in 2; 0 if unread. */
static long host_pid_of_pid_2(int proc, long init)
{
    char path[64], children[4096], status[4096];
    const char *p = children;
    int n = decimal(path, init);
    path[n] = '/';
    memcpy(path + n + 1, "task/", 5);
    n = n + 6 + decimal(path + n + 6, init);
    memcpy(path + n, "/children", 10);
    if (read_at(proc, path, children, sizeof children) <= 0)
        return 0;
    while (*p) {
        const char *end, *line;
        long child = parse(p, &end);
        if (child <= 0)
            break;
        n = decimal(path, child);
        memcpy(path + n, "/status", 8);
        if (read_at(proc, path, status, sizeof status) > 0
            && (line = strstr(status, "\nNSpid:")) != NULL) {
            const char *eol = strchr(line + 1, '\n');
            const char *last = eol ? eol : line + strlen(line);
            while (last > line && (last[-1] == ' ' || last[-1] == '\t'))
                last--;
            if (last - line >= 2 && last[-1] == '2'
                && (last[-2] == ' ' || last[-2] == '\t'))
                return child;
        }
        p = end;
        while (*p == ' ' || *p == '\n')
            p++;
    }
    return 0;
}

static void __attribute__((noreturn)) run_init(void)
{
    int block[2];
    /* Read forever: this process holds the write end. pipe2 with a flag:
     * musl's pipe(), and its pipe2 without one, are SYS_pipe on x86_64,
     * which the waiters' filter does not allow. */
    if (pipe2(block, O_CLOEXEC) < 0)
        _exit(1);
    for (;;) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_ALL, 0, &info, WEXITED | WNOWAIT) < 0) {
            if (errno == EINTR)
                continue;
            _exit(1); /* no child left before pid 2 was seen: never pid 2's end */
        }
        if (info.si_pid == 2) {
            char line[96];
            struct rusage ru;
            int status, n = decimal(line, info.si_code);
            line[n++] = ' ';
            n += decimal(line + n, info.si_status);
            /* Reap pid 2 for its rusage (its own and its reaped children's):
             * the helper reports it (a run() mode's usage). Not after a
             * seccomp kill: pid 2 stays a zombie for the helper to name. */
            memset(&ru, 0, sizeof ru);
            if ((info.si_code == CLD_EXITED || info.si_status != SIGSYS)
                && wait4(2, &status, 0, &ru) == 2) {
                line[n++] = ' ';
                n += decimal(line + n, ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec);
                line[n++] = ' ';
                n += decimal(line + n, ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec);
                line[n++] = ' ';
                n += decimal(line + n, ru.ru_maxrss);
            }
            if (write(0, line, (size_t)n) < 0) {
                /* the helper is gone: the parent-death signal ends us */
            }
            if (info.si_code == CLD_EXITED || info.si_status != SIGSYS)
                _exit(0); /* the kernel kills (and reaps) what is left */
            for (;;) { /* a seccomp kill: pid 2 stays a zombie for the helper */
                char c;
                if (read(block[0], &c, 1) < 0 && errno != EINTR)
                    _exit(1);
            }
        }
        while (wait4(info.si_pid, NULL, 0, NULL) < 0 && errno == EINTR)
            ;
    }
}

int main(int argc, char **argv)
{
    char end[128], note[sizeof USAGE - 1 + 3 * 21];
    long ends, init, proc, report, code = 0, value = 0, jail = 0, usage[3] = {-1, -1, -1};
    ssize_t got;
    int status;

    if (argc == 2 && strcmp(argv[1], "init") == 0)
        run_init();
    if (argc < 5 || (argc > 5 && strcmp(argv[5], "--") != 0) || (ends = arg(argv[1])) < 0 || (init = arg(argv[2])) <= 0
        || (proc = arg(argv[3])) < 0 || (report = arg(argv[4])) < 0)
        _exit(TRUNNER_SANDBOX_SETUP_EXIT); /* the caller never gets here */
    /* One atomic write from pid 1, which may then hold the pipe open (after
     * a seccomp kill): one read, never wait for EOF. */
    while ((got = read((int)ends, end, sizeof end - 1)) < 0 && errno == EINTR)
        ;
    if (got > 0) {
        const char *rest;
        end[got] = '\0';
        code = parse(end, &rest);
        value = *rest == ' ' ? parse(rest + 1, &rest) : -1;
        if (code < 0 || value < 0)
            got = 0; /* not pid 1's line: judge by pid 1's own end */
        else if (code != CLD_EXITED && value == SIGSYS)
            jail = host_pid_of_pid_2((int)proc, init);
        else {
            int i;
            for (i = 0; i < 3 && *rest == ' '; i++)
                usage[i] = parse_upto(rest + 1, &rest, 0x7fffffffffffffffL);
        }
    }
    if (got > 0 && usage[0] >= 0 && usage[1] >= 0 && usage[2] >= 0) {
        size_t n = sizeof USAGE - 1;
        int i;
        memcpy(note, USAGE, n);
        for (i = 0; i < 3; i++) {
            n += (size_t)decimal(note + n, usage[i]);
            note[n++] = i < 2 ? ' ' : '\n';
        }
        if (write((int)report, note, n) < 0) {
            /* the parent is gone or not reading: the run goes without usage */
        }
    }
    kill((pid_t)init, SIGKILL); /* the kernel kills (and pid 1 reaps) what is left */
    while (wait4((pid_t)init, &status, 0, NULL) < 0 && errno == EINTR)
        ;
    if (got <= 0) { /* pid 1 died first (killed): its end is the jail's */
        code = WIFEXITED(status) ? CLD_EXITED : 2;
        value = WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status);
    }
    if (code == CLD_EXITED) {
        close((int)report);
        _exit((int)value & 0xff);
    }
    if (jail) {
        size_t n = sizeof NOTE - 1;
        memcpy(note, NOTE, n);
        n += (size_t)decimal(note + n, jail);
        note[n++] = '\n';
        if (write((int)report, note, n) < 0) {
            /* the parent is gone or not reading: the signal still tells */
        }
    }
    close((int)report);
    /* Inherited as ignored across the exec (Python ignores SIGPIPE and
     * SIGXFSZ): back to the default, so that the signal ends this process.
     * (musl's signal() refuses 32-34, its own, as glibc's does 32-33; for
     * SIGABRT it blocks all signals around the change: rt_sigprocmask.) */
    if (value != SIGKILL && value != SIGSTOP)
        signal((int)value, SIG_DFL);
    kill(getpid(), (int)value);
    _exit(128 + (int)(value & 0x7f)); /* a signal whose default is not to terminate */
}
