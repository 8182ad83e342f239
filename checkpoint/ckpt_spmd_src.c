/* Listing an SPMD checkpoint: every rank file's datasets become pieces of
 * global tensors (the boxes each holds, from its attributes), checked to
 * cover each tensor exactly once. This file only builds the entry table
 * (ckpt_table.c); reading the pieces is ckpt_spmd_read.c's, which sits
 * above the opener (ckpt_source.c) that calls this lister, so listing and
 * reading never depend on each other both ways. */
#include "ckpt_internal.h"

#include <stdlib.h>
#include <string.h>

/* Boxes per dataset at most: the blocks' combinations of one shard. */
#define SPMD_MAX_BOXES 4096

/* A dataset as read from one file, before it joins its entry. */
typedef struct {
    const char *key, *state, *h5;
    const char *fpath;
    int nd;
    int64_t global[CX_MAX_DIMS];
    cx_dtype dt;
    bool is_param;
    ckpt_piece piece;
} spmd_dataset;

/* The boxes of a dataset: its attributes, or (a replicated tensor) the
 * whole dataset. Each box lies inside the global shape and the dataset. */
static cx_status read_boxes(hid_t d, spmd_dataset *x)
{
    ckpt_piece *p = &x->piece;
    int64_t n = 0;
    if (H5Aexists(d, "global_shape") <= 0) {
        memcpy(x->global, p->local_shape, sizeof x->global);
        p->nboxes = 1;
        if (!(p->boxes = calloc(1, sizeof *p->boxes))) return ckpt_fail(CX_ERR_OOM, "%s: out of memory", x->fpath);
        memcpy(p->boxes[0].count, p->local_shape, sizeof p->boxes[0].count);
        return CX_OK;
    }
    int64_t numel = 1;
    bool fits = ckpt_attr_read_i64s(d, "global_shape", x->global, CX_MAX_DIMS, &n) == 0 && n == x->nd;
    for (int i = 0; fits && i < x->nd; i++) fits = x->global[i] >= 0 && !__builtin_mul_overflow(numel, x->global[i], &numel);
    if (!fits)
        return ckpt_fail(CX_ERR_IO, "%s: %s: bad global_shape attribute (want %d sizes whose product fits in 64 bits)",
                         x->fpath, x->h5, x->nd);
    int64_t per = 3 * (int64_t)x->nd, cap = per * SPMD_MAX_BOXES;
    int64_t *flat = malloc(sizeof(int64_t) * (size_t)cap);
    if (!flat) return ckpt_fail(CX_ERR_OOM, "%s: out of memory", x->fpath);
    if (x->nd == 0 || ckpt_attr_read_i64s(d, "shard_boxes", flat, cap, &n) < 0 || n == 0 || n % per) {
        free(flat);
        return ckpt_fail(CX_ERR_IO, "%s: %s: bad shard_boxes attribute (want boxes of 3 x %d values)", x->fpath, x->h5,
                         x->nd);
    }
    p->nboxes = (int)(n / per);
    if (!(p->boxes = calloc((size_t)p->nboxes, sizeof *p->boxes))) {
        free(flat);
        return ckpt_fail(CX_ERR_OOM, "%s: out of memory", x->fpath);
    }
    bool ok = true;
    for (int k = 0; k < p->nboxes; k++)
        for (int i = 0; i < x->nd; i++) {
            cx_shard_box *b = &p->boxes[k];
            b->start[i] = flat[(3 * k + 0) * x->nd + i];
            b->count[i] = flat[(3 * k + 1) * x->nd + i];
            b->local_start[i] = flat[(3 * k + 2) * x->nd + i];
            ok = ok && b->start[i] >= 0 && b->count[i] >= 0 && b->local_start[i] >= 0 && x->global[i] >= 0 &&
                 b->start[i] <= x->global[i] - b->count[i] && b->local_start[i] <= p->local_shape[i] - b->count[i];
        }
    free(flat);
    return ok ? CX_OK
              : ckpt_fail(CX_ERR_IO, "%s: %s: a shard box lies outside the global shape or the dataset", x->fpath,
                          x->h5);
}

static cx_status probe(hid_t fid, spmd_dataset *x)
{
    hid_t d = H5Dopen2(fid, x->h5, H5P_DEFAULT);
    int64_t numel;
    char kind[32] = "";
    bool ok = d >= 0 && ckpt_dataset_shape(d, &x->nd, x->piece.local_shape, &numel) == 0 &&
              ckpt_dataset_dtype(d, &x->dt) == 0 && ckpt_h5_type(x->dt) >= 0;
    if (ok) ckpt_attr_read_str(d, "kind", kind, sizeof kind);
    x->is_param = !x->state && strcmp(kind, "buffer") != 0;
    cx_status st = ok ? read_boxes(d, x)
                      : ckpt_fail(CX_ERR_IO, "%s: %s is not a readable tensor dataset", x->fpath, x->h5);
    if (d >= 0) H5Dclose(d);
    return st;
}

static ckpt_entry *find_entry(ckpt_src *s, const char *key, const char *state)
{
    return (ckpt_entry *)ckpt_src_find(s, key, state);
}

static cx_status new_entry(ckpt_src *s, const spmd_dataset *x)
{
    ckpt_entry_spec spec = { x->key, x->state, x->h5, x->is_param, x->nd, x->global, x->dt, -1, -1, false };
    return ckpt_src_add_entry(s, &spec);
}

/* Adds dataset x of file r to its entry (made on first sight), which must
 * agree on shape, dtype and kind. Takes x's piece. */
static cx_status add_piece(ckpt_src *s, int r, spmd_dataset *x)
{
    ckpt_entry *e = find_entry(s, x->key, x->state);
    cx_status st = e ? CX_OK : new_entry(s, x);
    if (st != CX_OK) return st;
    if (!e) e = &s->entries[s->nentries - 1];
    bool same = e->ndim == x->nd && e->dtype == x->dt && e->is_param == x->is_param;
    for (int i = 0; same && i < x->nd; i++) same = e->shape[i] == x->global[i];
    char what[1200];
    ckpt_label(what, sizeof what, x->key, x->state);
    if (!same) return ckpt_fail(CX_ERR_IO, "%s: %s has another global shape, dtype or kind than in the other files",
                                x->fpath, what);
    ckpt_piece *grown = realloc(e->pieces, sizeof *grown * (size_t)(e->npieces + 1));
    if (!grown) return ckpt_fail(CX_ERR_OOM, "%s: out of memory", s->prefix);
    e->pieces = grown;
    x->piece.file = r;
    if (!(x->piece.h5path = strdup(x->h5))) return ckpt_fail(CX_ERR_OOM, "%s: out of memory", s->prefix);
    e->pieces[e->npieces++] = x->piece;
    memset(&x->piece, 0, sizeof x->piece);
    return CX_OK;
}

/* The datasets of group `g` of file r: /model (state NULL) or one
 * /optimizer/<key> group, whose datasets are its states. */
static cx_status list_group(ckpt_src *s, int r, const char *g, const char *key)
{
    ckpt_name_list names;
    const ckpt_file *f = &s->files[r];
    if (ckpt_list_group(f->fid, g, &names) < 0)
        return ckpt_fail(CX_ERR_IO, "%s: cannot list %s: %s", f->path, g, ckpt_h5_msg());
    cx_status st = CX_OK;
    for (int k = 0; k < names.n && st == CX_OK; k++) {
        char h5[2400];
        snprintf(h5, sizeof h5, "%s/%s", g, names.names[k]);
        spmd_dataset x = { .key = key ? key : names.names[k], .state = key ? names.names[k] : NULL, .h5 = h5,
                           .fpath = f->path };
        st = probe(f->fid, &x);
        if (st == CX_OK) st = add_piece(s, r, &x);
        free(x.piece.boxes);
    }
    ckpt_name_list_free(&names);
    return st;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static _Thread_local int g_cell_nd;   /* the comparator's row length */

static int cmp_cells(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    for (int i = 0; i < g_cell_nd; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

/* The nonempty boxes of all pieces of e cover it exactly once: in each
 * dimension their intervals are one partition of it (the boxes lie on a
 * grid, as shards of a mesh do), no two boxes are the same cell, and their
 * volumes add up to the tensor's. */
static bool covers_exactly(const ckpt_entry *e)
{
    int nb = 0;
    for (int p = 0; p < e->npieces; p++) nb += e->pieces[p].nboxes;
    int64_t *iv = malloc(sizeof(int64_t) * 2 * (size_t)(nb ? nb : 1)), vol = 0;
    int64_t *cells = malloc(sizeof(int64_t) * (size_t)(nb ? nb : 1) * (size_t)(e->ndim + 1));
    bool ok = iv && cells;
    for (int d = 0; ok && d < e->ndim; d++) {
        int n = 0;
        for (int p = 0; p < e->npieces; p++)
            for (int k = 0; k < e->pieces[p].nboxes; k++) {
                const cx_shard_box *b = &e->pieces[p].boxes[k];
                bool empty = false;
                for (int x = 0; x < e->ndim; x++) empty = empty || b->count[x] == 0;
                if (empty) continue;
                iv[2 * n] = b->start[d];
                iv[2 * n + 1] = b->start[d] + b->count[d];
                n++;
            }
        qsort(iv, (size_t)n, 2 * sizeof(int64_t), cmp_i64);
        int64_t at = 0;
        for (int i = 0; ok && i < n; i++) {
            if (i > 0 && iv[2 * i] == iv[2 * i - 2]) ok = iv[2 * i + 1] == iv[2 * i - 1];   /* the same interval */
            else if (iv[2 * i] == at) at = iv[2 * i + 1];
            else ok = false;
        }
        ok = ok && at == (n ? e->shape[d] : at);
    }
    int n = 0;
    for (int p = 0; ok && p < e->npieces; p++)
        for (int k = 0; k < e->pieces[p].nboxes; k++) {
            const cx_shard_box *b = &e->pieces[p].boxes[k];
            int64_t v = 1;
            for (int x = 0; x < e->ndim; x++) v *= b->count[x];
            if (!v) continue;
            if (__builtin_add_overflow(vol, v, &vol)) ok = false;
            memcpy(&cells[(size_t)n * (size_t)e->ndim], b->start, sizeof(int64_t) * (size_t)e->ndim);
            n++;
        }
    g_cell_nd = e->ndim;   /* distinct cells: no two equal once sorted */
    if (ok && e->ndim > 0) qsort(cells, (size_t)n, sizeof(int64_t) * (size_t)e->ndim, cmp_cells);
    for (int i = 1; ok && i < n; i++) ok = cmp_cells(&cells[(size_t)(i - 1) * (size_t)e->ndim], &cells[(size_t)i * (size_t)e->ndim]) != 0;
    ok = ok && vol == e->numel && (e->ndim > 0 || n == 1);
    free(iv);
    free(cells);
    return ok;
}

cx_status ckpt_spmd_list(ckpt_src *s)
{
    cx_status st = CX_OK;
    for (int r = 0; r < s->nfiles && st == CX_OK; r++) st = list_group(s, r, "/model", NULL);
    for (int r = 0; r < s->nfiles && st == CX_OK; r++) {
        ckpt_name_list groups;
        if (ckpt_list_group(s->files[r].fid, "/optimizer", &groups) < 0)
            return ckpt_fail(CX_ERR_IO, "%s: cannot list /optimizer: %s", s->files[r].path, ckpt_h5_msg());
        for (int g = 0; g < groups.n && st == CX_OK; g++) {
            char path[1200];
            snprintf(path, sizeof path, "/optimizer/%s", groups.names[g]);
            st = list_group(s, r, path, groups.names[g]);
        }
        ckpt_name_list_free(&groups);
    }
    for (int i = 0; i < s->nentries && st == CX_OK; i++) {
        char what[1200];
        ckpt_label(what, sizeof what, s->entries[i].key, s->entries[i].state);
        if (!covers_exactly(&s->entries[i]))
            st = ckpt_fail(CX_ERR_IO,
                           "checkpoint %s: the shards of %s in its %d files do not cover the tensor exactly once (a file "
                           "lacks a shard or two overlap)",
                           s->prefix, what, s->nfiles);
    }
    return st;
}
