/* Opening a checkpoint for reading: find its files, match them against the
 * commit marker (and check their checksums, now or on first read), open
 * each one and check what it says about itself (format, version, world,
 * rank, progress, shard metadata), then list its tensors with the lister
 * of its layout. Loads, consolidation and resharding all open checkpoints
 * here, so they validate the same way. The listers below it fill the entry
 * table; the readers above it call back only for the file checks, which
 * is why those live here with the marker they check against. */
#include "ckpt_internal.h"

#include <errno.h>
#include <glob.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void ckpt_src_close(ckpt_src *s)
{
    if (!s) return;
    for (int i = 0; i < s->nfiles && s->files; i++) {
        if (s->files[i].fid >= 0) H5Fclose(s->files[i].fid);
        free(s->files[i].path);
    }
    free(s->files);
    for (int i = 0; i < s->nentries; i++) ckpt_entry_free(&s->entries[i]);
    free(s->entries);
    ckpt_units_free(s->units, s->nunits);
    memset(s, 0, sizeof *s);
}

cx_status ckpt_src_verify(ckpt_src *s, int r)
{
    ckpt_file *f = &s->files[r];
    if (f->verified || !f->have_marker_hash) return CX_OK;
    if (s->per_dataset) {
        /* each tensor is checked as it is read; here only the size, which
         * catches a truncated file before anything is loaded */
        struct stat sb;
        if (stat(f->path, &sb) != 0 || (int64_t)sb.st_size != f->size) {
            cx_set_last_error("%s: size differs from the commit marker (the file is truncated or corrupt)", f->path);
            return CX_ERR_IO;
        }
        f->verified = true;
        return CX_OK;
    }
    uint64_t h;
    int64_t size;
    cx_status st = ckpt_hash_file(f->path, s->version, false, &h, &size);
    if (st != CX_OK) return st;
    if (h != f->marker_hash || size != f->size) {
        cx_set_last_error("%s: checksum mismatch with the commit marker (the file is corrupt)", f->path);
        return CX_ERR_IO;
    }
    f->verified = true;
    return CX_OK;
}

/* @return 0, or -1 when out of memory. */
static int add_file(ckpt_src *s, const char *path)
{
    ckpt_file *f = &s->files[s->nfiles];
    memset(f, 0, sizeof *f);
    f->fid = -1;
    f->rank = -1;
    f->path = strdup(path);
    if (!f->path) return -1;
    s->nfiles++;
    return 0;
}

static cx_status find_single(ckpt_src *s, const char *path)
{
    s->files = calloc(1, sizeof *s->files);
    if (!s->files || add_file(s, path) < 0) return ckpt_fail(CX_ERR_OOM, "%s: out of memory", path);
    struct stat sb;
    if (stat(path, &sb) != 0) return ckpt_fail(CX_ERR_IO, "no checkpoint file at %s (%s)", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return ckpt_fail(CX_ERR_IO, "no checkpoint file at %s: it is a directory, a full checkpoint is one .h5 file", path);
    s->files[0].size = sb.st_size;
    return CX_OK;
}

/* A user who names no checkpoint has usually given a directory, a full
 * file or a typo: say which of those it is, and what a prefix would need. */
static cx_status no_files_error(const char *prefix, const char *suffix)
{
    struct stat sb;
    char marker[4200];
    snprintf(marker, sizeof marker, "%s.commit", prefix);
    if (stat(prefix, &sb) == 0 && S_ISDIR(sb.st_mode))
        return ckpt_fail(CX_ERR_IO, "no checkpoint at %s: it is a directory, a checkpoint is a prefix naming files "
                         "PREFIX%s (e.g. %s/ckpt-step-<N>)", prefix, suffix, prefix);
    if (stat(prefix, &sb) == 0)
        return ckpt_fail(CX_ERR_IO, "no sharded checkpoint at %s: it is one file, and no files match %s%s "
                         "(a consolidated checkpoint loads as a full file)", prefix, prefix, suffix);
    if (stat(marker, &sb) == 0)
        return ckpt_fail(CX_ERR_IO, "checkpoint %s is committed (%s) but its files %s%s are gone", prefix, marker,
                         prefix, suffix);
    return ckpt_fail(CX_ERR_IO, "no checkpoint at %s (no file %s, and no sharded checkpoint %s%s)", prefix, prefix,
                     prefix, suffix);
}

static cx_status find_files(ckpt_src *s, const char *prefix, const char *suffix)
{
    char pattern[8300];
    ckpt_glob_pattern(pattern, sizeof pattern, prefix, suffix);
    glob_t gl = { 0 };
    if (glob(pattern, 0, NULL, &gl) != 0 || gl.gl_pathc == 0) {
        globfree(&gl);
        return no_files_error(prefix, suffix ? suffix : CX_CKPT_DEFAULT_SUFFIX);
    }
    s->files = calloc(gl.gl_pathc, sizeof *s->files);
    cx_status st = s->files ? CX_OK : CX_ERR_OOM;
    for (size_t i = 0; i < gl.gl_pathc && st == CX_OK; i++)
        if (add_file(s, gl.gl_pathv[i]) < 0) st = CX_ERR_OOM;
    globfree(&gl);
    return st == CX_OK ? st : ckpt_fail(st, "%s: out of memory", prefix);
}

/* File f is listed in the marker, with its size; it takes the marker's
 * checksum. */
static cx_status match_file(ckpt_file *f, const ckpt_marker *m, const char *prefix)
{
    int k = 0;
    while (k < m->nfiles && strcmp(m->files[k].name, ckpt_base_name(f->path))) k++;
    if (k == m->nfiles)
        return ckpt_fail(CX_ERR_IO, "%s: not listed in the commit marker %s.commit (stale or foreign file)", f->path,
                         prefix);
    struct stat sb;
    if (stat(f->path, &sb) != 0) return ckpt_fail(CX_ERR_IO, "%s: %s", f->path, strerror(errno));
    f->size = sb.st_size;
    if (f->size != m->files[k].size)
        return ckpt_fail(CX_ERR_IO, "%s: has %lld bytes, the commit marker says %lld (truncated or modified)", f->path,
                         (long long)f->size, (long long)m->files[k].size);
    f->marker_hash = m->files[k].hash;
    f->have_marker_hash = true;
    return CX_OK;
}

/* Only committed checkpoints: the marker must list exactly these files,
 * with these sizes (a truncated or extra file is caught here). */
static cx_status match_marker(ckpt_src *s, const char *prefix)
{
    ckpt_marker m;
    cx_status st = ckpt_marker_read(prefix, &m);
    if (st != CX_OK) return st;
    s->version = m.version;
    for (int i = 0; i < s->nfiles && st == CX_OK; i++) st = match_file(&s->files[i], &m, prefix);
    for (int k = 0; k < m.nfiles && st == CX_OK && m.nfiles != s->nfiles; k++) {
        int i = 0;
        while (i < s->nfiles && strcmp(m.files[k].name, ckpt_base_name(s->files[i].path))) i++;
        if (i == s->nfiles)
            st = ckpt_fail(CX_ERR_IO, "checkpoint %s: %s listed in the commit marker is missing", prefix,
                           m.files[k].name);
    }
    if (st == CX_OK && m.nfiles != s->nfiles)
        st = ckpt_fail(CX_ERR_IO, "checkpoint %s: the commit marker lists %d files, %d are there", prefix, m.nfiles,
                       s->nfiles);
    ckpt_marker_release(&m);
    return st;
}

/* Opens every file and reads its root attributes: one world size, one
 * format version (the marker's), and the rank its name says (name_prefix:
 * the checkpoint's prefix, NULL for a single file). */
static cx_status open_files(ckpt_src *s, const char *name_prefix)
{
    for (int i = 0; i < s->nfiles; i++) {
        ckpt_file *f = &s->files[i];
        f->fid = H5Fopen(f->path, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (f->fid < 0) return ckpt_fail(CX_ERR_IO, "%s: not a readable HDF5 file (%s)", f->path, ckpt_h5_msg());
        cx_status st = ckpt_root_read(f->fid, f->path, &f->root);
        if (st != CX_OK) return st;
        int64_t w = f->root.world_size, r = f->root.rank, w0 = s->files[0].root.world_size;
        if (w != w0)
            return ckpt_fail(CX_ERR_IO, "checkpoint %s: mixed world sizes: %s says world size %lld, %s says %lld",
                             s->prefix, ckpt_base_name(s->files[0].path), (long long)w0, ckpt_base_name(f->path),
                             (long long)w);
        if (!name_prefix) s->version = (int)f->root.format_version;
        if (f->root.format_version != s->version)
            return ckpt_fail(CX_ERR_IO, "%s: format version %lld, but its commit marker is of version %d", f->path,
                             (long long)f->root.format_version, s->version);
        f->rank = (int)r;
        int fr = -1, fw = -1;
        if (name_prefix &&
            sscanf(ckpt_base_name(f->path) + strlen(ckpt_base_name(name_prefix)), "_rank-%d-of-%d.h5", &fr, &fw) == 2 &&
            (fr != r || fw != w))
            return ckpt_fail(CX_ERR_IO, "%s: rank %lld of %lld inside, rank %d of %d in its name", f->path,
                             (long long)r, (long long)w, fr, fw);
    }
    return CX_OK;
}

/* The first rank in [0, world) no file holds, or -1. */
static int missing_rank(const ckpt_src *s)
{
    for (int r = 0; r < s->world; r++) {
        int i = 0;
        while (i < s->nfiles && s->files[i].rank != r) i++;
        if (i == s->nfiles) return r;
    }
    return -1;
}

/* One file per rank of the world, ordered by rank. */
static cx_status order_by_rank(ckpt_src *s, const char *single_file)
{
    s->world = (int)s->files[0].root.world_size;
    if (single_file && s->world != 1)
        return ckpt_fail(CX_ERR_IO, "%s: a shard of a %d-rank checkpoint, not a full file (consolidate it first)",
                         single_file, s->world);
    int missing = missing_rank(s);
    if (s->nfiles != s->world && missing >= 0)
        return ckpt_fail(CX_ERR_IO, "checkpoint %s: found %d file(s) for world size %d: rank %d is missing", s->prefix,
                         s->nfiles, s->world, missing);
    if (s->nfiles != s->world)
        return ckpt_fail(CX_ERR_IO, "checkpoint %s: found %d file(s) for world size %d", s->prefix, s->nfiles,
                         s->world);
    /* as many files as ranks: a missing rank means a duplicate one */
    if (missing >= 0)
        return ckpt_fail(CX_ERR_IO, "checkpoint %s: no file holds rank %d (duplicate ranks)", s->prefix, missing);
    for (int r = 0; r < s->world; r++) {
        int i = r;
        while (s->files[i].rank != r) i++;
        ckpt_file t = s->files[r];
        s->files[r] = s->files[i];
        s->files[i] = t;
    }
    return CX_OK;
}

/* Progress and strategy are rank 0's, the same on every file. */
static cx_status check_progress(ckpt_src *s)
{
    s->root = s->files[0].root;
    for (int r = 1; r < s->nfiles; r++) {
        const ckpt_root *x = &s->files[r].root;
        if (strcmp(x->strategy, s->root.strategy) || x->step != s->root.step)
            return ckpt_fail(CX_ERR_IO, "%s: strategy or step differs from %s", s->files[r].path, s->files[0].path);
    }
    return CX_OK;
}

static cx_status units_equal(const ckpt_unit *a, int na, const ckpt_unit *b, int nb, const char *path)
{
    if (na != nb) return ckpt_fail(CX_ERR_IO, "%s: inconsistent shard metadata: %d units where rank 0 has %d", path, nb,
                                   na);
    for (int i = 0; i < na; i++) {
        const ckpt_unit *x = &a[i], *y = &b[i];
        if (strcmp(x->path, y->path) || strcmp(x->flat_name, y->flat_name) || x->nparams != y->nparams ||
            x->flat_numel != y->flat_numel || x->padded_numel != y->padded_numel || x->shard_numel != y->shard_numel ||
            x->padding != y->padding || x->world != y->world)
            return ckpt_fail(CX_ERR_IO,
                             "%s: inconsistent shard metadata: unit %d (%s) has another layout than on rank 0", path, i,
                             y->flat_name);
        for (int p = 0; p < x->nparams; p++) {
            const ckpt_pinfo *P = &x->params[p], *Q = &y->params[p];
            bool same = !strcmp(P->name, Q->name) && P->ndim == Q->ndim && P->numel == Q->numel && P->offset == Q->offset;
            for (int d = 0; same && d < P->ndim; d++) same = P->shape[d] == Q->shape[d];
            if (!same)
                return ckpt_fail(CX_ERR_IO,
                                 "%s: inconsistent shard metadata: parameter %s has another shape or offset than on rank 0",
                                 path, Q->name);
        }
    }
    return CX_OK;
}

/* The units of file r describe rank r of this world, with parameters in
 * order inside the flat parameter and shards that add up. */
static cx_status check_units(const ckpt_src *s, const ckpt_unit *u, int n, int r, const char *path)
{
    for (int i = 0; i < n; i++) {
        const ckpt_unit *x = &u[i];
        int64_t end = 0;
        for (int p = 0; p < x->nparams && end >= 0; p++)
            end = x->params[p].offset < end || x->params[p].numel < 0 ? -1 : x->params[p].offset + x->params[p].numel;
        if (end < 0 || end > x->flat_numel || x->world != s->world || x->rank != r || x->shard_numel < 0 ||
            x->padded_numel != x->shard_numel * x->world || x->padded_numel < x->flat_numel ||
            x->padding != x->padded_numel - x->flat_numel || x->shard_offset != (int64_t)r * x->shard_numel)
            return ckpt_fail(CX_ERR_IO,
                             "%s: shard metadata of unit %s is inconsistent (world %d, rank %d, offsets, sizes)", path,
                             x->flat_name, x->world, x->rank);
    }
    return CX_OK;
}

/* Dataset group/name of file r is a flat shard of unit x: 1-D f32 of the
 * shard's size (or, for an optimizer state, a 0-d f32 value). */
static cx_status check_flat(const ckpt_src *s, int r, const ckpt_unit *x, const char *group, const char *name,
                            bool scalar_ok)
{
    hid_t fid = s->files[r].fid;
    char dpath[2400];
    snprintf(dpath, sizeof dpath, "%s/%s", group, name);
    hid_t d = H5Lexists(fid, group, H5P_DEFAULT) > 0 && H5Lexists(fid, dpath, H5P_DEFAULT) > 0
                  ? H5Dopen2(fid, dpath, H5P_DEFAULT)
                  : -1;
    if (d < 0) return ckpt_fail(CX_ERR_SHAPE, "%s: missing dataset %s", s->files[r].path, dpath);
    int nd = -1;
    int64_t shape[CX_MAX_DIMS], numel = 0;
    cx_dtype dt = CX_F32;
    bool ok = ckpt_dataset_shape(d, &nd, shape, &numel) == 0 && ckpt_dataset_dtype(d, &dt) == 0 && dt == CX_F32 &&
              ((scalar_ok && nd == 0) || (nd == 1 && numel == x->shard_numel));
    H5Dclose(d);
    if (ok) return CX_OK;
    return ckpt_fail(CX_ERR_SHAPE,
                     "%s: dataset %s has the wrong shape or dtype (%lld elements, %d dims; the shard metadata says (%lld) "
                     "f32)",
                     s->files[r].path, dpath, (long long)numel, nd, (long long)x->shard_numel);
}

/* Every flat dataset (parameter and optimizer state) of file r has the
 * shard's size. */
static cx_status check_flat_datasets(const ckpt_src *s, int r)
{
    for (int i = 0; i < s->nunits; i++) {
        const ckpt_unit *x = &s->units[i];
        cx_status st = check_flat(s, r, x, "/model", x->flat_name, false);
        if (st != CX_OK) return st;
        char opath[1200];
        snprintf(opath, sizeof opath, "/optimizer/%s", x->flat_name);
        ckpt_name_list states;
        if (ckpt_list_group(s->files[r].fid, opath, &states) < 0)
            return ckpt_fail(CX_ERR_IO, "%s: cannot list %s: %s", s->files[r].path, opath, ckpt_h5_msg());
        for (int k = 0; k < states.n && st == CX_OK; k++) st = check_flat(s, r, x, opath, states.names[k], true);
        ckpt_name_list_free(&states);
        if (st != CX_OK) return st;
    }
    return CX_OK;
}

/* An SPMD checkpoint: every file has /spmd_metadata naming its rank of
 * this world (its tensors are checked as they are listed). */
static cx_status check_spmd_meta(ckpt_src *s)
{
    for (int r = 0; r < s->nfiles; r++) {
        hid_t fid = s->files[r].fid;
        int64_t w = -1, rk = -1;
        hid_t g = H5Lexists(fid, "/spmd_metadata", H5P_DEFAULT) > 0 ? H5Gopen2(fid, "/spmd_metadata", H5P_DEFAULT) : -1;
        bool ok = g >= 0 && ckpt_attr_read_i64(g, "world_size", &w) == 0 && ckpt_attr_read_i64(g, "rank", &rk) == 0 &&
                  w == s->world && rk == r;
        if (g >= 0) H5Gclose(g);
        if (!ok)
            return ckpt_fail(CX_ERR_IO,
                             "%s: missing or inconsistent /spmd_metadata (rank %lld of %lld; the file is rank %d of %d)",
                             s->files[r].path, (long long)rk, (long long)w, r, s->world);
    }
    return CX_OK;
}

/* A sharded checkpoint's layout: rank 0's shard metadata, the same (for
 * its own rank) on every file, and every file's flat datasets of that
 * size; or SPMD shards. An unsharded one is a single file. */
static cx_status read_layout(ckpt_src *s)
{
    s->spmd = H5Lexists(s->files[0].fid, "/spmd_metadata", H5P_DEFAULT) > 0;
    if (s->spmd) return check_spmd_meta(s);
    s->sharded = H5Lexists(s->files[0].fid, "/shard_metadata", H5P_DEFAULT) > 0;
    if (!s->sharded)
        return s->world == 1 ? CX_OK
                             : ckpt_fail(CX_ERR_IO, "checkpoint %s: several files but no /shard_metadata", s->prefix);
    cx_status st = ckpt_units_read(s->files[0].fid, s->files[0].path, &s->units, &s->nunits);
    if (st == CX_OK) st = check_units(s, s->units, s->nunits, 0, s->files[0].path);
    for (int r = 0; r < s->nfiles && st == CX_OK; r++) {
        if (r > 0) {
            ckpt_unit *u = NULL;
            int n = 0;
            st = ckpt_units_read(s->files[r].fid, s->files[r].path, &u, &n);
            if (st == CX_OK) st = check_units(s, u, n, r, s->files[r].path);
            if (st == CX_OK) st = units_equal(s->units, s->nunits, u, n, s->files[r].path);
            ckpt_units_free(u, n);
        }
        if (st == CX_OK) st = check_flat_datasets(s, r);
    }
    return st;
}

cx_status ckpt_src_open(ckpt_src *s, const char *prefix, const char *suffix, const char *single_file,
                        bool verify_all, int home_rank)
{
    memset(s, 0, sizeof *s);
    if (ckpt_h5_init() < 0) return CX_ERR_IO;
    snprintf(s->prefix, sizeof s->prefix, "%s", single_file ? single_file : prefix);
    cx_status st = single_file ? find_single(s, single_file) : find_files(s, prefix, suffix);
    if (st == CX_OK && !single_file) st = match_marker(s, prefix);
    /* the tool checks every byte before trusting any of it */
    for (int r = 0; verify_all && r < s->nfiles && st == CX_OK; r++) st = ckpt_src_verify(s, r);
    if (st == CX_OK) st = open_files(s, single_file ? NULL : prefix);
    if (st == CX_OK) st = order_by_rank(s, single_file);
    if (st == CX_OK) st = check_progress(s);
    s->home = home_rank >= 0 && home_rank < s->nfiles ? home_rank : 0;
    if (st == CX_OK) st = read_layout(s);
    if (st == CX_OK) st = s->spmd ? ckpt_spmd_list(s) : ckpt_src_list(s);
    if (st != CX_OK) ckpt_src_close(s);
    return st;
}
