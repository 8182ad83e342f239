/* The commit protocol of a save (docs/checkpoint-format.md): uncommit the
 * prefix, write each rank's file under a temporary name and publish it,
 * agree over the ranks, then rank 0 writes the marker. A crash at any point
 * leaves no marker for the broken save. */
#include "ckpt_internal.h"

#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void (*ckpt_test_hook)(const char *phase);

void ckpt_hook(const char *phase)
{
    if (ckpt_test_hook) ckpt_test_hook(phase);
}

cx_status ckpt_uncommit(const char *prefix)
{
    char marker[4200];
    ckpt_marker_name(marker, sizeof marker, prefix);
    if (unlink(marker) == 0 || errno == ENOENT) return CX_OK;
    cx_set_last_error("%s: cannot remove the old commit marker: %s", marker, strerror(errno));
    return CX_ERR_IO;
}

void ckpt_remove_stale(const char *prefix, int nfiles)
{
    char pattern[8300], want[4200];
    ckpt_glob_pattern(pattern, sizeof pattern, prefix, NULL);
    glob_t gl;
    if (glob(pattern, 0, NULL, &gl) != 0) return;
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        bool keep = false;
        for (int r = 0; r < nfiles && !keep; r++) {
            ckpt_file_name(want, sizeof want, prefix, r, nfiles);
            keep = !strcmp(want, gl.gl_pathv[i]);
        }
        if (!keep) unlink(gl.gl_pathv[i]);
    }
    globfree(&gl);
}

cx_status ckpt_publish(const char *tmp, const char *final, uint64_t *hash, int64_t *size)
{
    uint64_t h;
    int64_t sz;
    cx_status st = ckpt_hash_file(tmp, CX_CKPT_FORMAT_VERSION, true, &h, &sz);
    if (st == CX_OK && rename(tmp, final) != 0) {
        cx_set_last_error("%s: cannot rename into place: %s", final, strerror(errno));
        st = CX_ERR_IO;
    }
    if (st == CX_OK && ckpt_fsync_dir(final) != 0) {
        cx_set_last_error("%s: cannot fsync its directory: %s", final, strerror(errno));
        unlink(final);
        st = CX_ERR_IO;
    }
    if (st != CX_OK) {
        unlink(tmp);
        return st;
    }
    if (hash) *hash = h;
    if (size) *size = sz;
    return CX_OK;
}

cx_status ckpt_commit(const char *prefix, int world, const char *strategy, int64_t step, const int64_t *sizes,
                      const uint64_t *hashes)
{
    ckpt_marker m = { .version = CX_CKPT_FORMAT_VERSION, .world = world, .step = step, .nfiles = world };
    ckpt_strlcpy(m.strategy, sizeof m.strategy, strategy);
    m.files = calloc((size_t)world, sizeof *m.files);
    if (!m.files) {
        cx_set_last_error("%s.commit: out of memory", prefix);
        return CX_ERR_OOM;
    }
    for (int r = 0; r < world; r++) {
        char name[4200];
        ckpt_file_name(name, sizeof name, prefix, r, world);
        ckpt_strlcpy(m.files[r].name, sizeof m.files[r].name, ckpt_base_name(name));
        m.files[r].size = sizes[r];
        m.files[r].hash = hashes[r];
    }
    cx_status st = ckpt_marker_write(prefix, &m);
    free(m.files);
    return st;
}

cx_status ckpt_agree(const char *tag, cx_status mine, ckpt_report *rep, ckpt_report **all_out)
{
    rep->status = (int32_t)mine;
    rep->rank = cx_global_ordinal();
    if (mine != CX_OK) snprintf(rep->msg, sizeof rep->msg, "%s", cx_last_error());
    void *all = NULL;
    cx_status st = cx_rendezvous(tag, rep, sizeof *rep, &all, NULL);
    if (st != CX_OK) return st;
    ckpt_report *r = all;
    int world = cx_world_size();
    for (int i = 0; i < world; i++)
        if (r[i].status != CX_OK) {
            if (world > 1) cx_set_last_error("rank %d: %s", (int)r[i].rank, r[i].msg);
            else cx_set_last_error("%s", r[i].msg);
            st = (cx_status)r[i].status;
            break;
        }
    if (all_out && st == CX_OK) *all_out = r;
    else free(r);
    return st;
}
