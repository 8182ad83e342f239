/* File-system helpers shared by the trace writer, the compile cache and
 * checkpoints. */
#ifndef CX_UTIL_FS_H
#define CX_UTIL_FS_H

#include <stddef.h>

/* Creates `path` and its missing parents (mode 0777 before the umask), like
 * `mkdir -p`. @return 0, or an errno value with the directory that could
 * not be made copied into failed[cap] (ENAMETOOLONG: path too long). */
int cx_mkdir_p(const char *path, char *failed, size_t cap);

#endif
