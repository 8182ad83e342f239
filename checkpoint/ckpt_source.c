/* Reading a checkpoint: open and validate its files, list its tensors as
 * full (PyTorch-shaped) entries, and read any element range of one, taking
 * the pieces from whichever rank files hold them. Loads, consolidation and
 * resharding all go through here, so they validate the same way. */
#include "ckpt_internal.h"

#include <errno.h>
#include <glob.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void entry_free(ckpt_entry *e)
{
    free(e->key);
    free(e->state);
    free(e->h5path);
}

void ckpt_src_close(ckpt_src *s)
{
    if (!s) return;
    for (int i = 0; i < s->nfiles && s->files; i++) {
        if (s->files[i].fid >= 0) H5Fclose(s->files[i].fid);
        free(s->files[i].path);
    }
    free(s->files);
    for (int i = 0; i < s->nentries; i++) entry_free(&s->entries[i]);
    free(s->entries);
    ckpt_units_free(s->units, s->nunits);
    memset(s, 0, sizeof *s);
}

static cx_dtype dtype_of_dataset(hid_t d, bool *ok)
{
    char name[32];
    *ok = true;
    if (ckpt_attr_read_str(d, "dtype", name, sizeof name) == 0)
        for (int t = 0; t < CX_DTYPE_COUNT; t++)
            if (!strcmp(name, cx_dtype_name((cx_dtype)t))) return (cx_dtype)t;
    /* a file written by another tool: go by the stored type */
    hid_t ft = H5Dget_type(d);
    cx_dtype dt = CX_F32;
    if (ft < 0) { *ok = false; return dt; }
    H5T_class_t c = H5Tget_class(ft);
    size_t sz = H5Tget_size(ft);
    if (c == H5T_FLOAT && sz == 4) dt = CX_F32;
    else if (c == H5T_INTEGER && sz == 8) dt = CX_I64;
    else if (c == H5T_INTEGER && sz == 4) dt = CX_I32;
    else if (c == H5T_INTEGER && sz == 1) dt = CX_U8;
    else *ok = false;
    H5Tclose(ft);
    return dt;
}

/* Shape of a dataset. @return 0 or -1. */
static int dataset_shape(hid_t d, int *ndim, int64_t *shape, int64_t *numel)
{
    hid_t sp = H5Dget_space(d);
    if (sp < 0) return -1;
    int nd = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[CX_MAX_DIMS];
    int rc = -1;
    if (nd >= 0 && nd <= CX_MAX_DIMS && H5Sget_simple_extent_dims(sp, dims, NULL) >= 0) {
        *ndim = nd;
        *numel = 1;
        for (int i = 0; i < nd; i++) {
            shape[i] = (int64_t)dims[i];
            *numel *= shape[i];
        }
        rc = 0;
    }
    H5Sclose(sp);
    return rc;
}

static cx_status add_entry(ckpt_src *s, int *cap, const char *key, const char *state, const char *h5path,
                           bool is_param, int ndim, const int64_t *shape, cx_dtype dt, int unit, int pidx,
                           bool replicated)
{
    if (s->nentries == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        ckpt_entry *ne = realloc(s->entries, (size_t)nc * sizeof *ne);
        if (!ne) goto oom;
        s->entries = ne;
        *cap = nc;
    }
    ckpt_entry *e = &s->entries[s->nentries];
    memset(e, 0, sizeof *e);
    e->key = strdup(key);
    e->state = state ? strdup(state) : NULL;
    e->h5path = strdup(h5path);
    if (!e->key || (state && !e->state) || !e->h5path) {
        entry_free(e);
        goto oom;
    }
    e->is_param = is_param;
    e->ndim = ndim;
    e->numel = 1;
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        e->numel *= shape[i];
    }
    e->dtype = dt;
    e->unit = unit;
    e->pidx = pidx;
    e->replicated = replicated;
    s->nentries++;
    return CX_OK;
oom:
    cx_set_last_error("checkpoint %s: out of memory listing tensors", s->prefix);
    return CX_ERR_OOM;
}

/* Link names of a group in creation order (falling back to name order for
 * files written without it). */
typedef struct {
    char **names;
    int n, cap;
    bool oom;
} name_list;

static herr_t collect(hid_t g, const char *name, const H5L_info_t *info, void *ctx)
{
    (void)g;
    (void)info;
    name_list *l = ctx;
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 32;
        char **nn = realloc(l->names, (size_t)nc * sizeof *nn);
        if (!nn) { l->oom = true; return -1; }
        l->names = nn;
        l->cap = nc;
    }
    if (!(l->names[l->n] = strdup(name))) { l->oom = true; return -1; }
    l->n++;
    return 0;
}

static void names_free(name_list *l)
{
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

static int list_group(hid_t parent, const char *path, name_list *l)
{
    memset(l, 0, sizeof *l);
    if (H5Lexists(parent, path, H5P_DEFAULT) <= 0) return 0;   /* absent: empty */
    hid_t g = H5Gopen2(parent, path, H5P_DEFAULT);
    if (g < 0) return -1;
    hsize_t idx = 0;
    herr_t rc = H5Literate(g, H5_INDEX_CRT_ORDER, H5_ITER_INC, &idx, collect, l);
    if (rc < 0 && !l->oom) {
        names_free(l);
        idx = 0;
        H5Eclear2(H5E_DEFAULT);
        rc = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, l);
    }
    H5Gclose(g);
    return rc < 0 ? -1 : 0;
}

static cx_status bad(ckpt_src *s, cx_status st, const char *fmt, const char *a, const char *b)
{
    char msg[9000];
    snprintf(msg, sizeof msg, fmt, a, b);
    cx_set_last_error("%s", msg);
    ckpt_src_close(s);
    return st;
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
    cx_status st = ckpt_hash_file(f->path, false, &h, &size);
    if (st != CX_OK) return st;
    if (h != f->marker_hash || size != f->size) {
        cx_set_last_error("%s: checksum mismatch with the commit marker (the file is corrupt)", f->path);
        return CX_ERR_IO;
    }
    f->verified = true;
    return CX_OK;
}

/* Escapes glob metacharacters of a literal prefix. */
static void glob_escape(char *out, size_t cap, const char *in)
{
    size_t o = 0;
    for (; *in && o + 2 < cap; in++) {
        if (strchr("*?[]\\", *in)) out[o++] = '\\';
        out[o++] = *in;
    }
    out[o] = '\0';
}

static cx_status units_equal(const ckpt_unit *a, int na, const ckpt_unit *b, int nb, const char *path)
{
    char what[600];
    if (na != nb) {
        snprintf(what, sizeof what, "%d units where rank 0 has %d", nb, na);
        goto differ;
    }
    for (int i = 0; i < na; i++) {
        const ckpt_unit *x = &a[i], *y = &b[i];
        if (strcmp(x->path, y->path) || strcmp(x->flat_name, y->flat_name) || x->nparams != y->nparams ||
            x->flat_numel != y->flat_numel || x->padded_numel != y->padded_numel || x->shard_numel != y->shard_numel ||
            x->padding != y->padding || x->world != y->world) {
            snprintf(what, sizeof what, "unit %d (%s) has another layout than on rank 0", i, y->flat_name);
            goto differ;
        }
        for (int p = 0; p < x->nparams; p++) {
            const ckpt_pinfo *P = &x->params[p], *Q = &y->params[p];
            bool same = !strcmp(P->name, Q->name) && P->ndim == Q->ndim && P->numel == Q->numel && P->offset == Q->offset;
            for (int d = 0; same && d < P->ndim; d++) same = P->shape[d] == Q->shape[d];
            if (!same) {
                snprintf(what, sizeof what, "parameter %s has another shape or offset than on rank 0", Q->name);
                goto differ;
            }
        }
    }
    return CX_OK;
differ:
    cx_set_last_error("%s: inconsistent shard metadata: %s", path, what);
    return CX_ERR_IO;
}

static cx_status check_units(ckpt_src *s, const ckpt_unit *u, int n, int r, const char *path)
{
    for (int i = 0; i < n; i++) {
        const ckpt_unit *x = &u[i];
        int64_t sum = 0, end = 0;
        for (int p = 0; p < x->nparams; p++) {
            if (x->params[p].offset < end || x->params[p].numel < 0) end = -1;
            if (end < 0) break;
            end = x->params[p].offset + x->params[p].numel;
            sum += x->params[p].numel;
        }
        if (end < 0 || end > x->flat_numel || x->world != s->world || x->rank != r || x->shard_numel < 0 ||
            x->padded_numel != x->shard_numel * x->world || x->padded_numel < x->flat_numel ||
            x->padding != x->padded_numel - x->flat_numel || x->shard_offset != (int64_t)r * x->shard_numel) {
            cx_set_last_error("%s: shard metadata of unit %s is inconsistent (world %d, rank %d, offsets, sizes)", path,
                              x->flat_name, x->world, x->rank);
            return CX_ERR_IO;
        }
        (void)sum;
    }
    return CX_OK;
}

/* Every flat dataset (parameter and optimizer state) of file r has the
 * shard's size. */
static cx_status check_flat_datasets(ckpt_src *s, int r)
{
    hid_t fid = s->files[r].fid;
    for (int i = 0; i < s->nunits; i++) {
        const ckpt_unit *x = &s->units[i];
        char path[1200];
        snprintf(path, sizeof path, "/model/%s", x->flat_name);
        for (int pass = 0; pass < 2; pass++) {
            name_list states = { 0 };
            char opath[1200];
            snprintf(opath, sizeof opath, "/optimizer/%s", x->flat_name);
            if (pass == 1 && list_group(fid, opath, &states) < 0) {
                cx_set_last_error("%s: cannot list %s: %s", s->files[r].path, opath, ckpt_h5_msg());
                return CX_ERR_IO;
            }
            int count = pass == 0 ? 1 : states.n;
            for (int k = 0; k < count; k++) {
                char dpath[2400];
                if (pass == 0) snprintf(dpath, sizeof dpath, "%s", path);
                else snprintf(dpath, sizeof dpath, "%s/%s", opath, states.names[k]);
                hid_t d = H5Lexists(fid, pass == 0 ? "/model" : opath, H5P_DEFAULT) > 0 &&
                                  H5Lexists(fid, dpath, H5P_DEFAULT) > 0
                              ? H5Dopen2(fid, dpath, H5P_DEFAULT)
                              : -1;
                int nd = 0;
                int64_t shape[CX_MAX_DIMS], numel = 0;
                bool okdt = false;
                cx_dtype dt = CX_F32;
                if (d >= 0) {
                    if (dataset_shape(d, &nd, shape, &numel) < 0) nd = -1;
                    dt = dtype_of_dataset(d, &okdt);
                    H5Dclose(d);
                }
                bool scalar_state = pass == 1 && nd == 0;
                if (d < 0 || !okdt || dt != CX_F32 || (!scalar_state && (nd != 1 || numel != x->shard_numel))) {
                    names_free(&states);
                    char want[64];
                    snprintf(want, sizeof want, "(%lld) f32", (long long)x->shard_numel);
                    if (d < 0) cx_set_last_error("%s: missing dataset %s", s->files[r].path, dpath);
                    else
                        cx_set_last_error("%s: dataset %s has the wrong shape or dtype (%lld elements, %d dims; the "
                                          "shard metadata says %s)",
                                          s->files[r].path, dpath, (long long)numel, nd, want);
                    return CX_ERR_SHAPE;
                }
            }
            names_free(&states);
        }
    }
    return CX_OK;
}


/* Rank, shape, dtype (and optionally the "kind" attribute) of a tensor
 * dataset. @return CX_OK, or CX_ERR_IO naming the dataset. */
static cx_status probe_dataset(hid_t fid, const char *fpath, const char *h5, int *nd, int64_t *shape, cx_dtype *dt,
                               char *kind, size_t kind_cap)
{
    hid_t d = H5Dopen2(fid, h5, H5P_DEFAULT);
    int64_t numel;
    bool okdt = false;
    if (d >= 0) {
        if (dataset_shape(d, nd, shape, &numel) < 0) *nd = -1;
        *dt = dtype_of_dataset(d, &okdt);
        if (kind) ckpt_attr_read_str(d, "kind", kind, kind_cap);
        H5Dclose(d);
    }
    if (d < 0 || *nd < 0 || !okdt) {
        cx_set_last_error("%s: %s is not a readable tensor dataset", fpath, h5);
        return CX_ERR_IO;
    }
    return CX_OK;
}

static cx_status list_entries(ckpt_src *s)
{
    int cap = 0;
    hid_t fid = s->files[s->home].fid;
    const char *fpath = s->files[s->home].path;
    name_list model;
    if (list_group(fid, "/model", &model) < 0) {
        cx_set_last_error("%s: cannot list /model: %s", fpath, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    cx_status st = CX_OK;
    if (s->sharded) {
        for (int i = 0; i < s->nunits && st == CX_OK; i++) {
            char h5[1200];
            snprintf(h5, sizeof h5, "/model/%s", s->units[i].flat_name);
            for (int p = 0; p < s->units[i].nparams && st == CX_OK; p++) {
                const ckpt_pinfo *pi = &s->units[i].params[p];
                st = add_entry(s, &cap, pi->name, NULL, h5, true, pi->ndim, pi->shape, CX_F32, i, p, false);
            }
        }
    }
    for (int k = 0; k < model.n && st == CX_OK; k++) {
        char h5[1200], kind[32] = "param";
        snprintf(h5, sizeof h5, "/model/%s", model.names[k]);
        int nd = 0;
        int64_t shape[CX_MAX_DIMS];
        cx_dtype dt = CX_F32;
        if ((st = probe_dataset(fid, fpath, h5, &nd, shape, &dt, kind, sizeof kind)) != CX_OK) break;
        if (!strcmp(kind, "flat_param")) continue;      /* listed per parameter above */
        if (s->sharded && strcmp(kind, "buffer")) continue;
        st = add_entry(s, &cap, model.names[k], NULL, h5, strcmp(kind, "buffer") != 0, nd, shape, dt, -1, -1, true);
    }
    names_free(&model);
    if (st != CX_OK) return st;

    name_list groups;
    if (list_group(fid, "/optimizer", &groups) < 0) {
        cx_set_last_error("%s: cannot list /optimizer: %s", fpath, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    for (int g = 0; g < groups.n && st == CX_OK; g++) {
        char gpath[1200];
        snprintf(gpath, sizeof gpath, "/optimizer/%s", groups.names[g]);
        name_list states;
        if (list_group(fid, gpath, &states) < 0) {
            cx_set_last_error("%s: cannot list %s: %s", fpath, gpath, ckpt_h5_msg());
            st = CX_ERR_IO;
            break;
        }
        int unit = -1;
        for (int i = 0; s->sharded && i < s->nunits; i++)
            if (!strcmp(s->units[i].flat_name, groups.names[g])) unit = i;
        for (int k = 0; k < states.n && st == CX_OK; k++) {
            char h5[2400];
            snprintf(h5, sizeof h5, "%s/%s", gpath, states.names[k]);
            int nd = 0;
            int64_t shape[CX_MAX_DIMS];
            cx_dtype dt = CX_F32;
            if ((st = probe_dataset(fid, fpath, h5, &nd, shape, &dt, NULL, 0)) != CX_OK) break;
            if (!s->sharded) {
                st = add_entry(s, &cap, groups.names[g], states.names[k], h5, false, nd, shape, dt, -1, -1, true);
                continue;
            }
            if (unit < 0) {
                cx_set_last_error("%s: optimizer state %s belongs to no unit of the shard metadata", fpath, h5);
                st = CX_ERR_IO;
                break;
            }
            /* per-flat state: one entry per parameter of the unit, a slice
             * (same layout as the parameter) or the replicated 0-d value */
            const ckpt_unit *u = &s->units[unit];
            for (int p = 0; p < u->nparams && st == CX_OK; p++) {
                const ckpt_pinfo *pi = &u->params[p];
                if (nd == 0) st = add_entry(s, &cap, pi->name, states.names[k], h5, false, 0, shape, dt, unit, p, true);
                else st = add_entry(s, &cap, pi->name, states.names[k], h5, false, pi->ndim, pi->shape, dt, unit, p, false);
            }
        }
        names_free(&states);
    }
    names_free(&groups);
    return st;
}

static cx_status read_root_attrs(ckpt_file *f, int64_t *world, int64_t *rank)
{
    hid_t fid = f->fid;
    char fmt[64];
    int64_t version = 0;
    if (ckpt_attr_read_str(fid, "format", fmt, sizeof fmt) < 0 || strcmp(fmt, CKPT_FORMAT_NAME)) {
        cx_set_last_error("%s: not a cxla checkpoint (format attribute is not '%s')", f->path, CKPT_FORMAT_NAME);
        return CX_ERR_IO;
    }
    if (ckpt_attr_read_i64(fid, "format_version", &version) < 0 || version != CX_CKPT_FORMAT_VERSION) {
        cx_set_last_error("%s: unsupported checkpoint format version %lld (this library reads %d)", f->path,
                          (long long)version, CX_CKPT_FORMAT_VERSION);
        return CX_ERR_IO;
    }
    if (ckpt_attr_read_i64(fid, "world_size", world) < 0 || ckpt_attr_read_i64(fid, "rank", rank) < 0 || *world < 1 ||
        *rank < 0 || *rank >= *world) {
        cx_set_last_error("%s: missing or bad world_size/rank attributes", f->path);
        return CX_ERR_IO;
    }
    return CX_OK;
}

cx_status ckpt_src_open(ckpt_src *s, const char *prefix, const char *suffix, const char *single_file,
                        bool verify_all, int home_rank)
{
    memset(s, 0, sizeof *s);
    if (ckpt_h5_init() < 0) return CX_ERR_IO;
    snprintf(s->prefix, sizeof s->prefix, "%s", single_file ? single_file : prefix);
    ckpt_marker m = { 0 };
    glob_t gl = { 0 };
    cx_status st;
    if (single_file) {
        s->files = calloc(1, sizeof *s->files);
        if (!s->files) return bad(s, CX_ERR_OOM, "%s: out of memory%s", single_file, "");
        s->nfiles = 1;
        s->files[0].fid = -1;
        s->files[0].path = strdup(single_file);
        if (!s->files[0].path) return bad(s, CX_ERR_OOM, "%s: out of memory%s", single_file, "");
        struct stat sb;
        if (stat(single_file, &sb) != 0) return bad(s, CX_ERR_IO, "%s: %s", single_file, strerror(errno));
        s->files[0].size = sb.st_size;
    } else {
        char pattern[8300], esc[8200];
        glob_escape(esc, sizeof esc, prefix);
        snprintf(pattern, sizeof pattern, "%s%s", esc, suffix ? suffix : CX_CKPT_DEFAULT_SUFFIX);
        int g = glob(pattern, 0, NULL, &gl);
        if (g != 0 || gl.gl_pathc == 0) {
            globfree(&gl);
            return bad(s, CX_ERR_IO, "checkpoint %s is not committed: no files match its pattern %s", prefix,
                       suffix ? suffix : CX_CKPT_DEFAULT_SUFFIX);
        }
        s->nfiles = (int)gl.gl_pathc;
        s->files = calloc((size_t)s->nfiles, sizeof *s->files);
        if (!s->files) {
            globfree(&gl);
            return bad(s, CX_ERR_OOM, "%s: out of memory%s", prefix, "");
        }
        for (int i = 0; i < s->nfiles; i++) {
            s->files[i].fid = -1;
            s->files[i].rank = -1;
            s->files[i].path = strdup(gl.gl_pathv[i]);
            if (!s->files[i].path) {
                globfree(&gl);
                return bad(s, CX_ERR_OOM, "%s: out of memory%s", prefix, "");
            }
        }
        globfree(&gl);
        /* only committed checkpoints: the marker must list exactly these files,
         * with these sizes (a truncated or extra file is caught here) */
        if ((st = ckpt_marker_read(prefix, &m)) != CX_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cx_last_error());
            return bad(s, st, "%s%s", msg, "");
        }
        for (int i = 0; i < s->nfiles; i++) {
            ckpt_file *f = &s->files[i];
            int k = 0;
            while (k < m.nfiles && strcmp(m.files[k].name, base_name(f->path))) k++;
            if (k == m.nfiles) {
                ckpt_marker_release(&m);
                return bad(s, CX_ERR_IO, "%s: not listed in the commit marker %s.commit (stale or foreign file)",
                           f->path, prefix);
            }
            struct stat sb;
            if (stat(f->path, &sb) != 0) {
                ckpt_marker_release(&m);
                return bad(s, CX_ERR_IO, "%s: %s", f->path, strerror(errno));
            }
            f->size = sb.st_size;
            if (f->size != m.files[k].size) {
                char msg[256];
                snprintf(msg, sizeof msg, "has %lld bytes, the commit marker says %lld (truncated or modified)",
                         (long long)f->size, (long long)m.files[k].size);
                ckpt_marker_release(&m);
                return bad(s, CX_ERR_IO, "%s: %s", f->path, msg);
            }
            f->marker_hash = m.files[k].hash;
            f->have_marker_hash = true;
        }
        if (m.nfiles != s->nfiles) {
            char msg[600];
            for (int k = 0; k < m.nfiles; k++) {
                int i = 0;
                while (i < s->nfiles && strcmp(m.files[k].name, base_name(s->files[i].path))) i++;
                if (i == s->nfiles) {
                    snprintf(msg, sizeof msg, "%s listed in the commit marker is missing", m.files[k].name);
                    break;
                }
            }
            ckpt_marker_release(&m);
            return bad(s, CX_ERR_IO, "checkpoint %s: %s", prefix, msg);
        }
        ckpt_marker_release(&m);
    }

    /* the tool checks every byte before trusting any of it */
    if (verify_all)
        for (int r = 0; r < s->nfiles; r++)
            if ((st = ckpt_src_verify(s, r)) != CX_OK) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", cx_last_error());
                return bad(s, st, "%s%s", msg, "");
            }
    /* open every file and check what it says about itself */
    int64_t world0 = -1;
    for (int i = 0; i < s->nfiles; i++) {
        ckpt_file *f = &s->files[i];
        f->fid = H5Fopen(f->path, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (f->fid < 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s", ckpt_h5_msg());
            return bad(s, CX_ERR_IO, "%s: not a readable HDF5 file (%s)", f->path, msg);
        }
        int64_t w, r;
        if ((st = read_root_attrs(f, &w, &r)) != CX_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cx_last_error());
            return bad(s, st, "%s%s", msg, "");
        }
        if (world0 < 0) world0 = w;
        if (w != world0) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s says world size %lld, %s says %lld", base_name(s->files[0].path),
                     (long long)world0, base_name(f->path), (long long)w);
            return bad(s, CX_ERR_IO, "checkpoint %s: mixed world sizes: %s", s->prefix, msg);
        }
        f->rank = (int)r;
        int fr = -1, fw = -1;
        if (!single_file && sscanf(base_name(f->path) + strlen(base_name(prefix)), "_rank-%d-of-%d.h5", &fr, &fw) == 2 &&
            (fr != r || fw != w)) {
            char msg[200];
            snprintf(msg, sizeof msg, "rank %lld of %lld inside, rank %d of %d in its name", (long long)r, (long long)w, fr, fw);
            return bad(s, CX_ERR_IO, "%s: %s", f->path, msg);
        }
    }
    s->world = (int)world0;
    if (single_file && s->world != 1) {
        char msg[64];
        snprintf(msg, sizeof msg, "%d", s->world);
        return bad(s, CX_ERR_IO, "%s: a shard of a %s-rank checkpoint, not a full file (consolidate it first)",
                   single_file, msg);
    }
    if (s->nfiles != s->world) {
        char msg[300];
        snprintf(msg, sizeof msg, "found %d file(s) for world size %d", s->nfiles, s->world);
        for (int r = 0; r < s->world; r++) {
            int i = 0;
            while (i < s->nfiles && s->files[i].rank != r) i++;
            if (i == s->nfiles) {
                snprintf(msg + strlen(msg), sizeof msg - strlen(msg), ": rank %d is missing", r);
                break;
            }
        }
        return bad(s, CX_ERR_IO, "checkpoint %s: %s", s->prefix, msg);
    }
    /* order by rank; a duplicate rank leaves a hole */
    for (int r = 0; r < s->world; r++) {
        int i = r;
        while (i < s->nfiles && s->files[i].rank != r) i++;
        if (i == s->nfiles) {
            char msg[32];
            snprintf(msg, sizeof msg, "%d", r);
            return bad(s, CX_ERR_IO, "checkpoint %s: no file holds rank %s (duplicate ranks)", s->prefix, msg);
        }
        ckpt_file t = s->files[r];
        s->files[r] = s->files[i];
        s->files[i] = t;
    }
    s->home = home_rank >= 0 && home_rank < s->nfiles ? home_rank : 0;

    /* progress and strategy: rank 0's, the same on every file */
    hid_t f0 = s->files[0].fid;
    int64_t i64;
    if (ckpt_attr_read_str(f0, "strategy", s->strategy, sizeof s->strategy) < 0)
        return bad(s, CX_ERR_IO, "%s: missing strategy attribute%s", s->files[0].path, "");
    ckpt_attr_read_i64(f0, "step", &s->step);
    ckpt_attr_read_i64(f0, "epoch", &s->epoch);
    ckpt_attr_read_i64(f0, "sampler_position", &s->sampler_position);
    ckpt_attr_read_i64(f0, "optimizer_steps", &s->optimizer_steps);
    ckpt_attr_read_u64(f0, "rng_seed", &s->rng_seed);
    ckpt_attr_read_u64(f0, "rng_offset", &s->rng_offset);
    ckpt_attr_read_str(f0, "optimizer", s->optimizer, sizeof s->optimizer);
    for (int r = 1; r < s->nfiles; r++) {
        char strat[32];
        if (ckpt_attr_read_str(s->files[r].fid, "strategy", strat, sizeof strat) < 0 || strcmp(strat, s->strategy) ||
            ckpt_attr_read_i64(s->files[r].fid, "step", &i64) < 0 || i64 != s->step)
            return bad(s, CX_ERR_IO, "%s: strategy or step differs from %s", s->files[r].path, s->files[0].path);
    }
    s->sharded = H5Lexists(f0, "/shard_metadata", H5P_DEFAULT) > 0;
    if (s->sharded) {
        if ((st = ckpt_units_read(f0, s->files[0].path, &s->units, &s->nunits)) != CX_OK ||
            (st = check_units(s, s->units, s->nunits, 0, s->files[0].path)) != CX_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", cx_last_error());
            return bad(s, st, "%s%s", msg, "");
        }
        for (int r = 0; r < s->nfiles; r++) {
            ckpt_unit *u = NULL;
            int n = 0;
            if (r > 0) {
                st = ckpt_units_read(s->files[r].fid, s->files[r].path, &u, &n);
                if (st == CX_OK) st = check_units(s, u, n, r, s->files[r].path);
                if (st == CX_OK) st = units_equal(s->units, s->nunits, u, n, s->files[r].path);
                ckpt_units_free(u, n);
            }
            if (st == CX_OK) st = check_flat_datasets(s, r);
            if (st != CX_OK) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", cx_last_error());
                return bad(s, st, "%s%s", msg, "");
            }
        }
    } else if (s->world != 1) {
        return bad(s, CX_ERR_IO, "checkpoint %s: %s", s->prefix, "several files but no /shard_metadata");
    }
    if ((st = list_entries(s)) != CX_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        return bad(s, st, "%s%s", msg, "");
    }
    if (verify_all)
        for (int r = 0; r < s->nfiles; r++)
            if ((st = ckpt_src_verify(s, r)) != CX_OK) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", cx_last_error());
                return bad(s, st, "%s%s", msg, "");
            }
    return CX_OK;
}

const ckpt_entry *ckpt_src_find(const ckpt_src *s, const char *key, const char *state)
{
    for (int i = 0; i < s->nentries; i++) {
        const ckpt_entry *e = &s->entries[i];
        if (strcmp(e->key, key)) continue;
        if ((state == NULL) != (e->state == NULL)) continue;
        if (state && strcmp(state, e->state)) continue;
        return e;
    }
    return NULL;
}

/* Hashes the pieces of a dataset on a second thread while the next piece
 * is read, so the checksum costs no time beyond the read itself. Only the
 * reading thread calls HDF5. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const char *base;
    size_t total_bytes;
    size_t ready;          /* bytes read so far */
    bool stop;             /* the read failed: give up */
    ckpt_hash h;
} piece_hasher;

static void *hash_pieces(void *arg)
{
    piece_hasher *ph = arg;
    size_t done = 0;
    while (done < ph->total_bytes) {
        pthread_mutex_lock(&ph->mu);
        while (ph->ready <= done && !ph->stop) pthread_cond_wait(&ph->cv, &ph->mu);
        size_t ready = ph->ready;
        bool stop = ph->stop;
        pthread_mutex_unlock(&ph->mu);
        if (stop) break;
        ckpt_hash_update(&ph->h, ph->base + done, ready - done);
        done = ready;
    }
    return NULL;
}

static void hasher_publish(piece_hasher *ph, size_t ready, bool stop)
{
    pthread_mutex_lock(&ph->mu);
    ph->ready = ready;
    ph->stop = stop;
    pthread_cond_signal(&ph->cv);
    pthread_mutex_unlock(&ph->mu);
}

/* Reads elements [a, b) of the dataset `h5` (shape from the file) of file r. */
static cx_status read_range(ckpt_src *s, int r, const char *h5, cx_dtype dt, int64_t a, int64_t b, void *buf,
                            bool check_hash)
{
    cx_status st = ckpt_src_verify(s, r);
    if (st != CX_OK) return st;
    ckpt_file *f = &s->files[r];
    hid_t d = H5Dopen2(f->fid, h5, H5P_DEFAULT);
    if (d < 0) {
        cx_set_last_error("%s: cannot open %s: %s", f->path, h5, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    int nd = 0;
    int64_t shape[CX_MAX_DIMS], numel = 0;
    hsize_t dims[CX_MAX_DIMS];
    hid_t fs = -1, ms = -1;
    if (dataset_shape(d, &nd, shape, &numel) < 0 || a < 0 || b > numel) {
        cx_set_last_error("%s: %s: range [%lld, %lld) outside the dataset (%lld elements)", f->path, h5, (long long)a,
                          (long long)b, (long long)numel);
        H5Dclose(d);
        return CX_ERR_SHAPE;
    }
    if (b <= a) {
        H5Dclose(d);
        return CX_OK;
    }
    for (int i = 0; i < nd; i++) dims[i] = (hsize_t)shape[i];
    fs = H5Dget_space(d);
    uint64_t want = 0;
    bool hash = check_hash && a == 0 && b == numel && ckpt_attr_read_u64(d, "cxh64", &want) == 0;
    size_t es = cx_dtype_size(dt);
    /* with a checksum to check, read in pieces: each is hashed while it is
     * still in cache, on a second thread while the next one is read */
    int64_t piece = hash && nd ? (int64_t)((16u << 20) / es) : (b - a);
    if (piece < 1) piece = 1;
    piece_hasher ph = { .base = buf, .total_bytes = (size_t)(b - a) * es };
    ckpt_hash_init(&ph.h);
    pthread_t hasher;
    bool threaded = hash && b - a > piece && pthread_mutex_init(&ph.mu, NULL) == 0;
    if (threaded && pthread_cond_init(&ph.cv, NULL) != 0) {
        pthread_mutex_destroy(&ph.mu);
        threaded = false;
    }
    if (threaded && pthread_create(&hasher, NULL, hash_pieces, &ph) != 0) {
        pthread_cond_destroy(&ph.cv);
        pthread_mutex_destroy(&ph.mu);
        threaded = false;
    }
    st = fs >= 0 ? CX_OK : CX_ERR_IO;
    for (int64_t lo = a; st == CX_OK && lo < b; lo += piece) {
        int64_t hi = lo + piece < b ? lo + piece : b;
        hsize_t cnt = (hsize_t)(hi - lo);
        char *dst = (char *)buf + (size_t)(lo - a) * es;
        ms = H5Screate_simple(1, &cnt, NULL);
        if (ms < 0 || ckpt_select_range(fs, dims, nd, lo, hi) != 0 ||
            H5Dread(d, ckpt_h5_type(dt), nd ? ms : H5S_ALL, nd ? fs : H5S_ALL, H5P_DEFAULT, dst) < 0) {
            cx_set_last_error("%s: cannot read %s: %s", f->path, h5, ckpt_h5_msg());
            st = CX_ERR_IO;
        } else if (threaded) {
            hasher_publish(&ph, (size_t)(hi - a) * es, false);
        } else if (hash) {
            ckpt_hash_update(&ph.h, dst, (size_t)cnt * es);
        }
        if (ms >= 0) H5Sclose(ms);
        ms = -1;
    }
    if (threaded) {
        if (st != CX_OK) hasher_publish(&ph, 0, true);
        pthread_join(hasher, NULL);
        pthread_cond_destroy(&ph.cv);
        pthread_mutex_destroy(&ph.mu);
    }
    if (st == CX_OK && hash && ckpt_hash_final(&ph.h) != want) {
        cx_set_last_error("%s: %s: checksum mismatch (the file is corrupt)", f->path, h5);
        st = CX_ERR_IO;
    }
    if (fs >= 0) H5Sclose(fs);
    H5Dclose(d);
    return st;
}

cx_status ckpt_src_read(ckpt_src *s, const ckpt_entry *e, int64_t a, int64_t b, void *buf)
{
    if (a < 0 || b > e->numel || a > b) {
        cx_set_last_error("checkpoint %s: %s: bad range", s->prefix, e->key);
        return CX_ERR_ARG;
    }
    /* files without a whole-file checksum (a single consolidated file) are
     * checked per dataset */
    bool per_dataset = !s->files[s->home].have_marker_hash || s->per_dataset;
    if (e->replicated) return read_range(s, s->home, e->h5path, e->dtype, a, b, buf, per_dataset);
    const ckpt_unit *u = &s->units[e->unit];
    const ckpt_pinfo *p = &u->params[e->pidx];
    int64_t lo = p->offset + a, hi = p->offset + b, S = u->shard_numel;
    size_t es = cx_dtype_size(e->dtype);
    for (int64_t i = lo; i < hi;) {
        int r = (int)(i / S);
        int64_t end = ((int64_t)r + 1) * S < hi ? ((int64_t)r + 1) * S : hi;
        cx_status st = read_range(s, r, e->h5path, e->dtype, i - (int64_t)r * S, end - (int64_t)r * S,
                                  (char *)buf + (size_t)(i - lo) * es, false);
        if (st != CX_OK) return st;
        i = end;
    }
    return CX_OK;
}
