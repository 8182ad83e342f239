/* Reading an SPMD checkpoint's pieces: the intersection of a wanted box
 * with each piece, read through HDF5 hyperslab selections so a rank reads
 * only what its shard needs, and any element range of an SPMD entry as the
 * contiguous boxes it is made of. It reads entries that ckpt_spmd_src.c
 * listed and checks files through ckpt_source.c; the generic readers
 * (ckpt_read.c, ckpt_box.c) call it, never the other way round. */
#include "ckpt_internal.h"

#include <string.h>

/* The intersection of the box [a, a + n) with box b: *lo and *cnt.
 * @return false when empty. */
static bool intersect(int nd, const int64_t *a, const int64_t *n, const cx_shard_box *b, int64_t *lo, int64_t *cnt)
{
    for (int d = 0; d < nd; d++) {
        int64_t s = a[d] > b->start[d] ? a[d] : b->start[d];
        int64_t e = a[d] + n[d] < b->start[d] + b->count[d] ? a[d] + n[d] : b->start[d] + b->count[d];
        if (e <= s) return false;
        lo[d] = s;
        cnt[d] = e - s;
    }
    return true;
}

bool ckpt_piece_hits(const ckpt_piece *p, int ndim, const int64_t *start, const int64_t *count)
{
    int64_t lo[CX_MAX_DIMS], cnt[CX_MAX_DIMS];
    for (int k = 0; k < p->nboxes; k++)
        if (intersect(ndim, start, count, &p->boxes[k], lo, cnt)) return true;
    return false;
}

/* One hyperslab read: cnt elements from the dataset at `from` into the
 * memory array of mem_shape at `to`. */
static int read_slab(hid_t d, hid_t fs, hid_t type, int nd, const int64_t *from, const int64_t *to,
                     const int64_t *cnt, void *mem, const int64_t *mem_shape)
{
    hsize_t f0[CX_MAX_DIMS], m0[CX_MAX_DIMS], c[CX_MAX_DIMS], mdims[CX_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        f0[i] = (hsize_t)from[i];
        m0[i] = (hsize_t)to[i];
        c[i] = (hsize_t)cnt[i];
        mdims[i] = (hsize_t)mem_shape[i];
    }
    hid_t ms = H5Screate_simple(nd, mdims, NULL);
    int rc = ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, f0, NULL, c, NULL) >= 0 &&
                     H5Sselect_hyperslab(ms, H5S_SELECT_SET, m0, NULL, c, NULL) >= 0 &&
                     H5Dread(d, type, ms, fs, H5P_DEFAULT, mem) >= 0
                 ? 0
                 : -1;
    if (ms >= 0) H5Sclose(ms);
    return rc;
}

cx_status ckpt_spmd_read_piece(ckpt_src *s, const ckpt_entry *e, const ckpt_piece *p, const int64_t *start,
                               const int64_t *count, void *mem, const int64_t *mem_shape, const int64_t *mem_off)
{
    if (e->ndim > 0 && !ckpt_piece_hits(p, e->ndim, start, count)) return CX_OK;
    cx_status st = ckpt_src_verify(s, p->file);
    if (st != CX_OK) return st;
    const ckpt_file *f = &s->files[p->file];
    hid_t d = H5Dopen2(f->fid, p->h5path, H5P_DEFAULT), fs = d >= 0 ? H5Dget_space(d) : -1;
    hid_t type = ckpt_h5_type(e->dtype);
    bool ok = fs >= 0;
    if (ok && e->ndim == 0) ok = H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, mem) >= 0;
    for (int k = 0; ok && e->ndim > 0 && k < p->nboxes; k++) {
        const cx_shard_box *b = &p->boxes[k];
        int64_t lo[CX_MAX_DIMS], cnt[CX_MAX_DIMS], from[CX_MAX_DIMS], to[CX_MAX_DIMS];
        if (!intersect(e->ndim, start, count, b, lo, cnt)) continue;
        for (int i = 0; i < e->ndim; i++) {
            from[i] = b->local_start[i] + lo[i] - b->start[i];
            to[i] = mem_off[i] + lo[i] - start[i];
        }
        ok = read_slab(d, fs, type, e->ndim, from, to, cnt, mem, mem_shape) == 0;
    }
    if (fs >= 0) H5Sclose(fs);
    if (d >= 0) H5Dclose(d);
    if (ok) return CX_OK;
    char what[1200];
    ckpt_label(what, sizeof what, e->key, e->state);
    return ckpt_fail(CX_ERR_IO, "%s: cannot read %s (%s): %s", f->path, what, p->h5path, ckpt_h5_msg());
}

/* The largest contiguous box at row-major position pos of `dims` inside
 * [pos, b): leading coordinates fixed, one dimension a range, the trailing
 * ones whole. @return its number of elements. */
static int64_t next_box(const int64_t *dims, int nd, int64_t pos, int64_t b, int64_t *start, int64_t *count)
{
    int64_t rem = pos;
    for (int d = nd - 1; d >= 0; d--) {
        start[d] = rem % dims[d];
        rem /= dims[d];
    }
    int k = nd - 1;
    int64_t inner = 1;   /* elements of one step along dimension k */
    for (int64_t in = 1; k >= 0;) {
        inner = in;
        if (start[k] != 0 || k == 0 || in * dims[k] > b - pos) break;
        in *= dims[k];
        k--;
    }
    for (int d = 0; d < nd; d++) count[d] = d < k ? 1 : dims[d];
    int64_t n = (b - pos) / inner;
    count[k] = dims[k] - start[k] < n ? dims[k] - start[k] : n;
    return count[k] * inner;
}

/* Box by box: each row-major run of the range is one box of the tensor. */
cx_status ckpt_src_read_spmd(ckpt_src *s, const ckpt_entry *e, int64_t a, int64_t b, void *buf)
{
    int64_t zero[CX_MAX_DIMS] = { 0 }, start[CX_MAX_DIMS], count[CX_MAX_DIMS];
    size_t es = cx_dtype_size(e->dtype);
    cx_status st = CX_OK;
    if (e->ndim == 0) {
        for (int p = 0; p < e->npieces && st == CX_OK && b > a; p++)
            st = ckpt_spmd_read_piece(s, e, &e->pieces[p], zero, zero, buf, zero, zero);
        return st;
    }
    for (int64_t pos = a; pos < b && st == CX_OK;) {
        int64_t n = next_box(e->shape, e->ndim, pos, b, start, count);
        char *mem = (char *)buf + (size_t)(pos - a) * es;
        for (int p = 0; p < e->npieces && st == CX_OK; p++)
            st = ckpt_spmd_read_piece(s, e, &e->pieces[p], start, count, mem, count, zero);
        pos += n;
    }
    return st;
}
