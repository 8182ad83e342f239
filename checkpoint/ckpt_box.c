/* Boxes of tensors: reading a global box of any entry (SPMD pieces and
 * whole datasets by hyperslab, FSDP flat shards row by row), and element
 * ranges of an SPMD entry as the contiguous boxes they are made of. */
#include "ckpt_internal.h"

#include <string.h>

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

/* Elements [a, b) of an SPMD entry into buf, box by box. */
static cx_status spmd_read_range(ckpt_src *s, const ckpt_entry *e, int64_t a, int64_t b, void *buf)
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

/* A flat-shard entry (FSDP): the box as rows along its last dimension,
 * each an element range of the tensor. */
static cx_status read_rows(ckpt_src *s, const ckpt_entry *e, const int64_t *start, const int64_t *count, void *mem,
                           const int64_t *mem_shape, const int64_t *mem_off)
{
    int nd = e->ndim;
    int64_t idx[CX_MAX_DIMS] = { 0 }, rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= count[d];
    size_t es = cx_dtype_size(e->dtype);
    cx_status st = CX_OK;
    for (int64_t r = 0; r < rows && st == CX_OK; r++) {
        int64_t g = 0, m = 0;
        for (int d = 0; d < nd; d++) {
            int64_t i = d < nd - 1 ? idx[d] : 0;
            g = g * e->shape[d] + start[d] + i;
            m = m * mem_shape[d] + mem_off[d] + i;
        }
        st = ckpt_src_read(s, e, g, g + count[nd - 1], (char *)mem + (size_t)m * es);
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < count[d]) break;
            idx[d] = 0;
        }
    }
    return st;
}

cx_status ckpt_src_read_box(ckpt_src *s, const ckpt_entry *e, const int64_t *start, const int64_t *count, void *mem,
                            const int64_t *mem_shape, const int64_t *mem_off)
{
    int64_t n = 1;
    bool whole = true;
    for (int d = 0; d < e->ndim; d++) {
        n *= count[d];
        whole = whole && start[d] == 0 && count[d] == e->shape[d] && mem_shape[d] == e->shape[d] && mem_off[d] == 0;
    }
    if (n == 0) return CX_OK;
    if (whole) return ckpt_src_read(s, e, 0, e->numel, mem);   /* checked against its checksum where it has one */
    if (e->npieces) {
        cx_status st = CX_OK;
        for (int p = 0; p < e->npieces && st == CX_OK; p++)
            st = ckpt_spmd_read_piece(s, e, &e->pieces[p], start, count, mem, mem_shape, mem_off);
        return st;
    }
    if (!e->replicated) return read_rows(s, e, start, count, mem, mem_shape, mem_off);
    /* a whole dataset of the home file: one piece holding everything */
    cx_shard_box all;
    memset(&all, 0, sizeof all);
    memcpy(all.count, e->shape, sizeof all.count);
    ckpt_piece p = { .file = s->home, .h5path = e->h5path, .nboxes = 1, .boxes = &all };
    memcpy(p.local_shape, e->shape, sizeof p.local_shape);
    return ckpt_spmd_read_piece(s, e, &p, start, count, mem, mem_shape, mem_off);
}

cx_status ckpt_src_read_spmd(ckpt_src *s, const ckpt_entry *e, int64_t a, int64_t b, void *buf)
{
    return spmd_read_range(s, e, a, b, buf);
}
