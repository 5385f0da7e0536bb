/* nolibc.h: the little of a C library that trunner-waiter (waiter.c) needs,
 * so that it links none: built -nostdlib -static -ffreestanding, it starts
 * in ~0.1 ms where a static glibc binary takes ~0.7 ms (IRELATIVE relocs,
 * cpuid probes, TLS set-up), and it is exec'd twice a run.
 *
 * Here: `_start`, raw system calls (x86_64 and aarch64) and the kernel ABI
 * constants and layouts the waiter uses, and the string helpers. Each call
 * is the one glibc 2.36's wrapper makes (pipe is pipe2(fds, 0), waitpid is
 * wait4, _exit is exit_group, signal is rt_sigaction with SA_RESTART and
 * the signal in the mask), so the jail's seccomp filter sees the same
 * system calls; glibc's own start-up calls (brk, arch_prctl, set_tid_address,
 * set_robust_list, rseq, prlimit64, readlink, getrandom, mprotect) are gone.
 * The nl_ system calls return the kernel's result: -errno on failure.
 * No headers at all, not even the kernel's: nothing to install but gcc.
 */
#ifndef TRUNNER_NOLIBC_H
#define TRUNNER_NOLIBC_H

typedef unsigned long size_t;
typedef long ssize_t;
typedef int pid_t;

#define NULL ((void *)0)

/* The kernel ABI: the same numbers on x86_64 and aarch64 (asm-generic). */
#define EINTR 4
#define O_RDONLY 0
#define O_CLOEXEC 02000000
#define P_ALL 0
#define WEXITED 4
#define WNOWAIT 0x01000000
#define SIGKILL 9
#define SIGSTOP 19
#define SIGSYS 31
#define SIG_DFL ((void *)0)
#define SA_RESTART 0x10000000
#define SA_RESTORER 0x04000000
#define NL_NSIG 65 /* glibc's NSIG: signals 1..64 */
#define NL_SIGCANCEL 32 /* glibc's internal signals, which its sigaction refuses */
#define NL_SIGSETXID 33

#define WIFEXITED(s) (((s) & 0x7f) == 0)
#define WEXITSTATUS(s) (((s) >> 8) & 0xff)
#define WTERMSIG(s) ((s) & 0x7f)

/* siginfo_t as waitid fills it for SIGCHLD (include/uapi/asm-generic/siginfo.h,
 * 64-bit: the union starts at offset 16); 128 bytes in all. */
typedef struct {
    int si_signo;
    int si_errno;
    int si_code;
    int pad_;
    int si_pid;    /* offset 16 */
    int si_uid;
    int si_status; /* offset 24 */
    int rest_[25];
} siginfo_t;

struct timeval {
    long tv_sec;
    long tv_usec;
};

/* struct rusage (include/uapi/linux/resource.h): two timevals, 14 longs. */
struct rusage {
    struct timeval ru_utime;
    struct timeval ru_stime;
    long ru_maxrss; /* offset 32 */
    long rest_[13];
};

/* The kernel's struct sigaction (rt_sigaction; __ARCH_HAS_SA_RESTORER on
 * both), with its 8-byte sigset. */
struct nl_sigaction {
    void *sa_handler;
    unsigned long sa_flags;
    void *sa_restorer;
    unsigned long sa_mask;
};

#if defined(__x86_64__)
#define NR_read 0
#define NR_write 1
#define NR_close 3
#define NR_rt_sigaction 13
#define NR_rt_sigreturn 15
#define NR_getpid 39
#define NR_wait4 61
#define NR_kill 62
#define NR_exit_group 231
#define NR_waitid 247
#define NR_openat 257
#define NR_pipe2 293

static inline long nl_syscall(long n, long a, long b, long c, long d, long e)
{
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}

/* The kernel starts us with argc at (%rsp), argv after it; the ABI wants
 * %rsp 16-aligned before the call (which pushes the return address). */
__asm__(".pushsection .text\n"
        ".global _start\n"
        ".type _start, @function\n"
        "_start:\n"
        "    xor %ebp, %ebp\n"
        "    mov (%rsp), %rdi\n"
        "    lea 8(%rsp), %rsi\n"
        "    and $-16, %rsp\n"
        "    call nl_start\n"
        "    hlt\n"
        ".size _start, . - _start\n"
        /* glibc's __restore_rt: sa_restorer, as glibc passes one */
        ".type nl_restore_rt, @function\n"
        "nl_restore_rt:\n"
        "    mov $15, %eax\n" /* NR_rt_sigreturn */
        "    syscall\n"
        ".size nl_restore_rt, . - nl_restore_rt\n"
        ".popsection\n");
extern char nl_restore_rt[];
#define NL_RESTORER_FLAGS SA_RESTORER
#define NL_RESTORER ((void *)nl_restore_rt)

#elif defined(__aarch64__)
#define NR_openat 56
#define NR_close 57
#define NR_pipe2 59
#define NR_read 63
#define NR_write 64
#define NR_exit_group 94
#define NR_waitid 95
#define NR_kill 129
#define NR_rt_sigaction 134
#define NR_getpid 172
#define NR_wait4 260

static inline long nl_syscall(long n, long a, long b, long c, long d, long e)
{
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc #0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4)
                     : "memory", "cc");
    return x0;
}

__asm__(".pushsection .text\n"
        ".global _start\n"
        ".type _start, %function\n"
        "_start:\n"
        "    mov x29, #0\n"
        "    mov x30, #0\n"
        "    ldr x0, [sp]\n"
        "    add x1, sp, #8\n"
        "    mov x2, sp\n"
        "    and sp, x2, #-16\n"
        "    bl nl_start\n"
        "    brk #0\n"
        ".size _start, . - _start\n"
        ".popsection\n");
/* glibc on aarch64 passes no restorer (the kernel returns through the vDSO) */
#define NL_RESTORER_FLAGS 0
#define NL_RESTORER NULL

#else
#error "trunner-waiter: no raw system calls for this architecture (x86_64 and aarch64 only)"
#endif

#define nl_syscall3(n, a, b, c) nl_syscall((n), (long)(a), (long)(b), (long)(c), 0, 0)

static inline ssize_t nl_read(int fd, void *buf, size_t size)
{
    return nl_syscall3(NR_read, fd, buf, size);
}

static inline ssize_t nl_write(int fd, const void *buf, size_t size)
{
    return nl_syscall3(NR_write, fd, buf, size);
}

static inline int nl_close(int fd)
{
    return (int)nl_syscall3(NR_close, fd, 0, 0);
}

static inline int nl_openat(int dir, const char *path, int flags)
{
    return (int)nl_syscall(NR_openat, dir, (long)path, flags, 0, 0);
}

static inline int nl_pipe(int fds[2])
{
    return (int)nl_syscall3(NR_pipe2, fds, 0, 0);
}

static inline int nl_waitid(int idtype, int id, siginfo_t *info, int options)
{
    return (int)nl_syscall(NR_waitid, idtype, id, (long)info, options, 0);
}

static inline pid_t nl_wait4(pid_t pid, int *status, int options, struct rusage *ru)
{
    return (pid_t)nl_syscall(NR_wait4, pid, (long)status, options, (long)ru, 0);
}

static inline int nl_kill(pid_t pid, int sig)
{
    return (int)nl_syscall3(NR_kill, pid, sig, 0);
}

static inline pid_t nl_getpid(void)
{
    return (pid_t)nl_syscall3(NR_getpid, 0, 0, 0);
}

static inline void __attribute__((noreturn)) nl_exit(int code)
{
    for (;;)
        nl_syscall3(NR_exit_group, code, 0, 0);
}

/* glibc's signal(sig, SIG_DFL): BSD semantics (SA_RESTART, sig blocked in
 * its handler); refused (EINVAL, no system call) outside 1..64 and for the
 * two signals glibc keeps for itself. */
static inline int nl_signal_default(int sig)
{
    struct nl_sigaction act, old;
    if (sig < 1 || sig >= NL_NSIG || sig == NL_SIGCANCEL || sig == NL_SIGSETXID)
        return -22; /* EINVAL */
    act.sa_handler = SIG_DFL;
    act.sa_flags = SA_RESTART | NL_RESTORER_FLAGS;
    act.sa_restorer = NL_RESTORER;
    act.sa_mask = 1UL << (sig - 1);
    return (int)nl_syscall(NR_rt_sigaction, sig, (long)&act, (long)&old, sizeof act.sa_mask, 0);
}

/* What the compiler may call even when freestanding (struct copies and
 * initialisations), and what the waiter calls: no libc provides them. The
 * empty asm keeps gcc from turning the loops back into calls to themselves. */
__attribute__((used)) void *memset(void *dst, int c, size_t n)
{
    unsigned char *d = dst;
    while (n--) {
        *d++ = (unsigned char)c;
        __asm__("" : "+r"(d));
    }
    return dst;
}

__attribute__((used)) void *memcpy(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--) {
        *d++ = *s++;
        __asm__("" : "+r"(d));
    }
    return dst;
}

__attribute__((used)) void *memmove(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d <= s)
        return memcpy(dst, src, n);
    while (n--) {
        d[n] = s[n];
        __asm__("" : "+r"(d));
    }
    return dst;
}

__attribute__((used)) int memcmp(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++)
        if (*x != *y)
            return *x - *y;
    return 0;
}

static inline size_t nl_strlen(const char *s)
{
    const char *p = s;
    while (*p)
        p++;
    return (size_t)(p - s);
}

static inline int nl_strcmp(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return (unsigned char)*a - (unsigned char)*b;
}

static inline const char *nl_strchr(const char *s, char c)
{
    for (;; s++) {
        if (*s == c)
            return s;
        if (!*s)
            return NULL;
    }
}

static inline const char *nl_strstr(const char *hay, const char *needle)
{
    size_t n = nl_strlen(needle);
    for (; *hay; hay++)
        if (memcmp(hay, needle, n) == 0)
            return hay;
    return n == 0 ? hay : NULL;
}

int main(int argc, char **argv);

/* Called by _start; not static: the asm names it. */
__attribute__((used, noreturn)) void nl_start(long argc, char **argv)
{
    nl_exit(main((int)argc, argv));
}

#endif
