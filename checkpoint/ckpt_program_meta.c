/* Reading a checkpoint's program metadata (the root attribute program_meta)
 * without a model: a program that must build its model before it can load
 * into it (gpt: the model's shape) asks here first. The checkpoint is
 * opened as a load opens it, so a missing, uncommitted or broken one is
 * the same one-line error a load would give, before any model is built. */
#include "ckpt_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

char *cx_ckpt_read_meta(const char *path_or_prefix)
{
    if (!path_or_prefix || !*path_or_prefix) {
        cx_set_last_error("cx_ckpt_read_meta: want a checkpoint prefix or file");
        return NULL;
    }
    /* a prefix names no file itself (its files add _rank-<r>-of-<w>.h5) */
    struct stat sb;
    bool single = stat(path_or_prefix, &sb) == 0 && S_ISREG(sb.st_mode);
    ckpt_src s;
    cx_status st = ckpt_src_open(&s, path_or_prefix, NULL, single ? path_or_prefix : NULL, false, 0);
    if (st != CX_OK) return NULL;
    char *meta = strdup(s.root.program_meta);   /* rank 0's file: check_progress took its root */
    ckpt_src_close(&s);
    if (!meta) cx_set_last_error("cx_ckpt_read_meta: out of memory");
    return meta;
}
