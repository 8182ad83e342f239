#include "cx_fs.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

static int make_one(const char *dir, char *failed, size_t cap)
{
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) return 0;
    int err = errno;
    if (failed && cap) snprintf(failed, cap, "%s", dir);
    return err;
}

int cx_mkdir_p(const char *path, char *failed, size_t cap)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        if (failed && cap) snprintf(failed, cap, "%.64s...", path);
        return ENAMETOOLONG;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int err = make_one(buf, failed, cap);
        if (err) return err;
        *p = '/';
    }
    return make_one(buf, failed, cap);
}
