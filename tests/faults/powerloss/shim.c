/*
 * The power-loss shim of the fault matrix (tests/faults/powerloss.rs), loaded
 * into valkey-server with LD_PRELOAD.
 *
 * A SIGKILL keeps the page cache: every byte Valkey wrote survives it, fsynced
 * or not, so a SIGKILL cannot show what `appendfsync everysec` loses when the
 * power goes. This shim records, for every append-only file Valkey writes,
 * how many of its bytes are known to be on the disk: it logs one line per
 * event to the file named by POWERLOSS_LOG, and the harness, after it has
 * SIGKILLed Valkey, cuts each file back to its last logged length — the
 * state a power cut leaves behind.
 *
 *   O dev ino size ms   a tracked file opened for writing (what it holds
 *                       is on the disk: every earlier incarnation ended in
 *                       a cut)
 *   S dev ino size ms   fsync/fdatasync returned: `size`, read before the
 *                       call, is on the disk
 *   T dev ino size ms   the file was truncated to `size`
 *
 * (`ms`: the wall clock, in milliseconds, when the line was written.)
 *
 * With POWERLOSS_SLOW_FSYNC_MS set, every fsync/fdatasync of a tracked file
 * first sleeps that long: a slow disk. Under `appendfsync everysec` Valkey
 * then finds its background fsync still running whenever it flushes, and
 * postpones writing its AOF buffer (up to 2 s) while it replies anyway.
 *
 * Tracked: regular files under an `appendonlydir/` directory, and Valkey's
 * rewrite temporaries (`temp-rewriteaof-*`, renamed into it). Files are
 * known by inode, so a rename keeps what was fsynced under the old name.
 * Directory entries are taken as durable (Valkey fsyncs the directory after
 * every manifest rename): a file never fsynced keeps its name, with nothing
 * in it. sync_file_range is not counted: it promises no durability.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int log_fd = -1;
static long slow_fsync_ms = 0;

__attribute__((constructor)) static void powerloss_init(void) {
    const char *slow = getenv("POWERLOSS_SLOW_FSYNC_MS");
    if (slow != NULL) {
        slow_fsync_ms = strtol(slow, NULL, 10);
    }
    const char *path = getenv("POWERLOSS_LOG");
    if (path == NULL) {
        return;
    }
    /* The raw system call: open() is wrapped below. */
    log_fd = (int)syscall(SYS_openat, AT_FDCWD, path,
                          O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static void *next(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (f == NULL) {
        static const char msg[] = "powerloss shim: a libc function is missing\n";
        (void)!write(2, msg, sizeof msg - 1);
        abort();
    }
    return f;
}

static int tracked_path(const char *path) {
    if (strstr(path, "/appendonlydir/") != NULL) {
        return 1;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strncmp(base, "temp-rewriteaof", 15) == 0;
}

/* True for a regular file this shim tracks; fills `st`. */
static int tracked(int fd, struct stat *st) {
    if (log_fd < 0 || fd < 0 || fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        return 0;
    }
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) {
        return 0;
    }
    path[n] = '\0';
    return tracked_path(path);
}

static void record(char kind, const struct stat *st, long long size) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char line[128];
    int n = snprintf(line, sizeof line, "%c %llu %llu %lld %lld\n", kind,
                     (unsigned long long)st->st_dev,
                     (unsigned long long)st->st_ino, size,
                     (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
    /* One write on an O_APPEND descriptor: lines of threads and of the
       rewrite child never interleave. */
    (void)!write(log_fd, line, (size_t)n);
}

static void opened(int fd, int flags) {
    struct stat st;
    if ((flags & O_ACCMODE) != O_RDONLY && tracked(fd, &st)) {
        record('O', &st, (long long)st.st_size);
    }
}

/* open() reads a mode only with O_CREAT or O_TMPFILE (whose bits include
   O_DIRECTORY's: all of them, not any). */
static int mode_of(int flags, va_list ap) {
    int wants = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
    return wants ? va_arg(ap, int) : 0;
}

#define OPEN_WRAPPER(name)                                                  \
    int name(const char *path, int flags, ...) {                            \
        static int (*real)(const char *, int, ...);                         \
        if (!real) real = next(#name);                                      \
        va_list ap;                                                         \
        va_start(ap, flags);                                                \
        int mode = mode_of(flags, ap);                                      \
        va_end(ap);                                                         \
        int fd = real(path, flags, mode);                                   \
        opened(fd, flags);                                                  \
        return fd;                                                          \
    }
OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)

#define OPENAT_WRAPPER(name)                                                \
    int name(int dir, const char *path, int flags, ...) {                   \
        static int (*real)(int, const char *, int, ...);                    \
        if (!real) real = next(#name);                                      \
        va_list ap;                                                         \
        va_start(ap, flags);                                                \
        int mode = mode_of(flags, ap);                                      \
        va_end(ap);                                                         \
        int fd = real(dir, path, flags, mode);                              \
        opened(fd, flags);                                                  \
        return fd;                                                          \
    }
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

/* The fortified entry points (_FORTIFY_SOURCE builds call these). */
#define OPEN2_WRAPPER(name)                                                 \
    int name(const char *path, int flags) {                                 \
        static int (*real)(const char *, int);                              \
        if (!real) real = next(#name);                                      \
        int fd = real(path, flags);                                         \
        opened(fd, flags);                                                  \
        return fd;                                                          \
    }
OPEN2_WRAPPER(__open_2)
OPEN2_WRAPPER(__open64_2)

int creat(const char *path, mode_t mode) {
    return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode) {
    return open64(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

/* fopen opens through libc's internals, never through open() above. */
#define FOPEN_WRAPPER(name)                                                 \
    FILE *name(const char *path, const char *mode) {                        \
        static FILE *(*real)(const char *, const char *);                   \
        if (!real) real = next(#name);                                      \
        FILE *f = real(path, mode);                                         \
        if (f && strpbrk(mode, "wa+")) opened(fileno(f), O_WRONLY);         \
        return f;                                                           \
    }
FOPEN_WRAPPER(fopen)
FOPEN_WRAPPER(fopen64)

#define SYNC_WRAPPER(name)                                                  \
    int name(int fd) {                                                      \
        static int (*real)(int);                                            \
        if (!real) real = next(#name);                                      \
        struct stat st;                                                     \
        int track = tracked(fd, &st);                                       \
        if (track && slow_fsync_ms > 0) {                                   \
            struct timespec d = {slow_fsync_ms / 1000,                      \
                                 (slow_fsync_ms % 1000) * 1000000L};        \
            while (nanosleep(&d, &d) != 0) {                                \
            }                                                               \
        }                                                                   \
        int rc = real(fd);                                                  \
        if (rc == 0 && track) record('S', &st, (long long)st.st_size);      \
        return rc;                                                          \
    }
SYNC_WRAPPER(fsync)
SYNC_WRAPPER(fdatasync)

#define FTRUNCATE_WRAPPER(name)                                             \
    int name(int fd, off_t len) {                                           \
        static int (*real)(int, off_t);                                     \
        if (!real) real = next(#name);                                      \
        int rc = real(fd, len);                                             \
        struct stat st;                                                     \
        if (rc == 0 && tracked(fd, &st)) record('T', &st, (long long)len);  \
        return rc;                                                          \
    }
FTRUNCATE_WRAPPER(ftruncate)
FTRUNCATE_WRAPPER(ftruncate64)

#define TRUNCATE_WRAPPER(name)                                              \
    int name(const char *path, off_t len) {                                 \
        static int (*real)(const char *, off_t);                            \
        if (!real) real = next(#name);                                      \
        int rc = real(path, len);                                           \
        struct stat st;                                                     \
        if (rc == 0 && log_fd >= 0 && stat(path, &st) == 0 &&               \
            S_ISREG(st.st_mode)) {                                          \
            char abs[PATH_MAX];                                             \
            if (realpath(path, abs) && tracked_path(abs))                   \
                record('T', &st, (long long)len);                           \
        }                                                                   \
        return rc;                                                          \
    }
TRUNCATE_WRAPPER(truncate)
TRUNCATE_WRAPPER(truncate64)
