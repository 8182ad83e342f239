/* Shared by the harnesses: the input as a file (a memory file reached
 * through /proc/self/fd), since the parsers under test read paths. */
#ifndef CX_FUZZ_COMMON_H
#define CX_FUZZ_COMMON_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data[0..n) as the whole content of one memory file. @return its path. */
static inline const char *fuzz_as_file(const uint8_t *data, size_t n)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("cxla-fuzz", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (n && pwrite(fd, data, n, 0) != (ssize_t)n)) abort();
    return path;
}

#endif
