/* An LD_PRELOAD shim that makes writes fail, for storage-fault tests (no
 * privileges needed). Files whose path contains $CX_FAULT_MATCH are
 * watched; once $CX_FAULT_AFTER bytes have been written to them, the next
 * write fails as $CX_FAULT_KIND says:
 *   ENOSPC, EIO   the call returns -1 with that errno (and every later one)
 *   SHORT         the call writes half of what it was given (then ENOSPC)
 * Unset CX_FAULT_MATCH: everything passes through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FD 4096

static bool g_watched[MAX_FD];
static long long g_written;
static bool g_failing;

static void watch(int fd, const char *path)
{
    const char *m = getenv("CX_FAULT_MATCH");
    if (fd >= 0 && fd < MAX_FD) g_watched[fd] = m && *m && path && strstr(path, m);
}

/* How many of n bytes may be written now; -1 with errno set: fail. */
static ssize_t allow(int fd, size_t n)
{
    if (fd < 0 || fd >= MAX_FD || !g_watched[fd]) return (ssize_t)n;
    const char *a = getenv("CX_FAULT_AFTER"), *k = getenv("CX_FAULT_KIND");
    long long after = a ? atoll(a) : 0;
    bool shortw = k && !strcmp(k, "SHORT");
    if (!g_failing && g_written + (long long)n <= after) {
        g_written += (long long)n;
        return (ssize_t)n;
    }
    if (!g_failing && shortw && n > 1) {
        g_failing = true;
        return (ssize_t)(n / 2);
    }
    g_failing = true;
    errno = k && !strcmp(k, "EIO") ? EIO : ENOSPC;
    return -1;
}

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off64_t);
typedef int (*close_fn)(int);
typedef int (*dup2_fn)(int, int);
typedef int (*dup3_fn)(int, int, int);

/* the next definition of `name` (libc's), looked up once */
#define REAL(name, type) static type real_##name; if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

int open(const char *path, int flags, ...)
{
    REAL(open, open_fn);
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }
    int fd = real_open(path, flags, mode);
    watch(fd, path);
    return fd;
}

int open64(const char *path, int flags, ...)
{
    REAL(open64, open_fn);
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }
    int fd = real_open64(path, flags, mode);
    watch(fd, path);
    return fd;
}

int openat(int dirfd, const char *path, int flags, ...)
{
    REAL(openat, openat_fn);
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }
    int fd = real_openat(dirfd, path, flags, mode);
    watch(fd, path);
    return fd;
}

ssize_t write(int fd, const void *buf, size_t n)
{
    REAL(write, write_fn);
    ssize_t k = allow(fd, n);
    return k < 0 ? -1 : real_write(fd, buf, (size_t)k);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    REAL(pwrite, pwrite_fn);
    ssize_t k = allow(fd, n);
    return k < 0 ? -1 : real_pwrite(fd, buf, (size_t)k, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    REAL(pwrite64, pwrite64_fn);
    ssize_t k = allow(fd, n);
    return k < 0 ? -1 : real_pwrite64(fd, buf, (size_t)k, off);
}

/* A descriptor's state follows the descriptor, not its number. */
int close(int fd)
{
    REAL(close, close_fn);
    if (fd >= 0 && fd < MAX_FD) g_watched[fd] = false;
    return real_close(fd);
}

int dup2(int old, int new)
{
    REAL(dup2, dup2_fn);
    int r = real_dup2(old, new);
    if (r >= 0 && new < MAX_FD) g_watched[new] = old >= 0 && old < MAX_FD && g_watched[old];
    return r;
}

int dup3(int old, int new, int flags)
{
    REAL(dup3, dup3_fn);
    int r = real_dup3(old, new, flags);
    if (r >= 0 && new < MAX_FD) g_watched[new] = old >= 0 && old < MAX_FD && g_watched[old];
    return r;
}
